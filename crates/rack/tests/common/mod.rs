//! What the rack's tests share: a queue pair between two staged hosts.

use remora_rack::endpoint::rack_queue_pair;
use remora_rack::scenario::RackStage;
use remora_rnic::*;
use std::time::Duration;

/// A queue pair from one host to another, each side with a region of its
/// own; the first host's completions arrive on `completion_queue`.
pub struct Connection {
    pub queue_pair: QueuePair,
    pub completion_queue: CompletionQueue,
    pub local: MemoryRegion,
    pub remote: MemoryRegion,
}

/// Connects host `from` to host `to` on a staged rack (simulated or
/// embedded), with regions of `region_bytes` on both and `ack_timeout`
/// before a request is sent again.
pub fn connect(
    stage: &mut impl RackStage,
    (from, to): (usize, usize),
    region_bytes: u64,
    ack_timeout: Duration,
) -> Connection {
    let mut sides = Vec::new();
    for host in [from, to] {
        let nic = stage.nic_mut(host);
        let pd = nic.alloc_protection_domain().unwrap();
        let region = nic
            .register_memory(pd, region_bytes, AccessFlags::ALL)
            .unwrap();
        let cq = nic.create_completion_queue(1024).unwrap();
        let mut builder = rack_queue_pair(pd, cq);
        builder.timeout = ack_timeout;
        let prepared = nic.create_queue_pair(&builder).unwrap();
        sides.push((region, cq, prepared));
    }
    let (first, second) = stage.nic_pair_mut(from, to);
    let queue_pair = first.handshake(sides[0].2, sides[1].2.endpoint).unwrap();
    second.handshake(sides[1].2, sides[0].2.endpoint).unwrap();
    Connection {
        queue_pair,
        completion_queue: sides[0].1,
        local: sides[0].0,
        remote: sides[1].0,
    }
}
