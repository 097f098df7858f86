//! Shaped links on the embedded rack, built by the rack builder from a
//! topology: a 1 Gb/s link carries within 10% of 1 Gb/s, and a link's
//! propagation delay shows in a READ's round trip.

use remora_carrier::wrappers::LinkShape;
use remora_rack::assembly::{EmbeddedRack, RackBuilder};
use remora_rack::endpoint::{lock, rack_queue_pair};
use remora_rack::topology::{LinkSpec, Topology};
use remora_rnic::*;
use remora_sim::LinkFaults;
use remora_wire::{Ipv4Address, MacAddress};
use std::time::{Duration, Instant};

const COMPUTE: usize = 0;
const MEMORY: usize = 1;
const MESSAGE_BYTES: u32 = 64 * 1024;
/// Writes in flight: 512 KiB, inside the link's 1 MiB queue, so the
/// shaper paces rather than drops.
const IN_FLIGHT: u64 = 8;

fn topology(shape: LinkShape) -> Topology {
    let mut topology = Topology::pair(
        (
            MacAddress([2, 0, 0, 0, 0, 1]),
            Ipv4Address::new(10, 0, 0, 1),
        ),
        (
            MacAddress([2, 0, 0, 0, 0, 2]),
            Ipv4Address::new(10, 0, 0, 2),
        ),
    );
    topology.set_link(
        COMPUTE,
        LinkSpec {
            shape: Some(shape),
            faults: LinkFaults::NONE,
        },
    );
    topology
}

struct Connected {
    rack: EmbeddedRack,
    queue_pair: QueuePair,
    completion_queue: CompletionQueue,
    local: MemoryRegion,
    remote: MemoryRegion,
}

/// One queue pair from the compute host to a region on the memory host.
fn connect(topology: &Topology) -> Connected {
    let mut staged = RackBuilder::new(topology)
        .thread_name("shaping")
        .build()
        .unwrap();
    let mut sides = Vec::new();
    for host in [COMPUTE, MEMORY] {
        let nic = staged.nic_mut(host);
        let pd = nic.alloc_protection_domain().unwrap();
        let region = nic.register_memory(pd, 4 << 20, AccessFlags::ALL).unwrap();
        let cq = nic.create_completion_queue(1024).unwrap();
        let prepared = nic.create_queue_pair(&rack_queue_pair(pd, cq)).unwrap();
        sides.push((region, cq, prepared));
    }
    let (compute, memory) = staged.nic_pair_mut(COMPUTE, MEMORY);
    let queue_pair = compute.handshake(sides[0].2, sides[1].2.endpoint).unwrap();
    memory.handshake(sides[1].2, sides[0].2.endpoint).unwrap();
    let switch = staged.l2l3_switch();
    let (rack, _switch) = staged.start(switch).unwrap();
    Connected {
        rack,
        queue_pair,
        completion_queue: sides[0].1,
        local: sides[0].0,
        remote: sides[1].0,
    }
}

impl Connected {
    fn post(&self, id: u64, operation: SendOperation, bytes: u32) {
        let request = SendRequest::new(id, operation, &[self.local.slice(0, bytes)]).unwrap();
        lock(self.rack.host(COMPUTE))
            .rnic
            .post_send(self.queue_pair, request)
            .unwrap();
        self.rack.kick();
    }

    fn completions(&self) -> u64 {
        let mut endpoint = lock(self.rack.host(COMPUTE));
        let mut count = 0;
        while let Some(completion) = endpoint
            .rnic
            .poll_completion(self.completion_queue)
            .unwrap()
        {
            assert_eq!(completion.status, CompletionStatus::Success);
            count += 1;
        }
        count
    }
}

#[test]
fn a_one_gigabit_link_carries_within_ten_percent_of_one_gigabit() {
    let shape = LinkShape {
        bandwidth_bits_per_second: 1_000_000_000,
        propagation_delay: Duration::ZERO,
        queue_limit_bytes: 1 << 20,
    };
    let mut connected = connect(&topology(shape));
    let write = SendOperation::Write {
        remote: connected.remote.remote(0),
        immediate: None,
    };
    // Fill the pipe, then measure a window in steady state.
    let (mut posted, mut done) = (0u64, 0u64);
    let warm_up = 16;
    let measured = 320;
    let mut window_start: Option<(Instant, u64)> = None;
    let limit = Instant::now() + Duration::from_secs(30);
    while done < warm_up + measured {
        assert!(Instant::now() < limit, "{done} writes in 30 s");
        while posted < done + IN_FLIGHT {
            connected.post(posted, write, MESSAGE_BYTES);
            posted += 1;
        }
        done += connected.completions();
        if window_start.is_none() && done >= warm_up {
            let bytes = connected.rack.switch_report().ports[COMPUTE].bytes_received;
            window_start = Some((Instant::now(), bytes));
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    let (started, bytes_before) = window_start.unwrap();
    let bytes = connected.rack.switch_report().ports[COMPUTE].bytes_received - bytes_before;
    let bits_per_second = bytes as f64 * 8.0 / started.elapsed().as_secs_f64();
    connected.rack.stop_and_join().unwrap();
    let error = (bits_per_second - 1e9).abs() / 1e9;
    eprintln!(
        "shaped 1 Gb/s link: {:.3} Gb/s over {bytes} bytes",
        bits_per_second / 1e9
    );
    assert!(
        error <= 0.10,
        "a 1 Gb/s link carried {:.3} Gb/s ({:.1}% off)",
        bits_per_second / 1e9,
        error * 100.0
    );
}

#[test]
fn a_link_delay_shows_in_the_round_trip() {
    let delay = Duration::from_millis(3);
    let shape = LinkShape {
        bandwidth_bits_per_second: 10_000_000_000,
        propagation_delay: delay,
        queue_limit_bytes: 1 << 20,
    };
    let mut connected = connect(&topology(shape));
    let read = SendOperation::Read {
        remote: connected.remote.remote(0),
    };
    let mut round_trips = Vec::new();
    for id in 0..5 {
        let started = Instant::now();
        connected.post(id, read, 64);
        while connected.completions() == 0 {
            assert!(started.elapsed() < Duration::from_secs(5));
            std::thread::sleep(Duration::from_micros(50));
        }
        round_trips.push(started.elapsed());
    }
    connected.rack.stop_and_join().unwrap();
    round_trips.sort();
    // The request crosses the compute link once each way: two delays.
    let median = round_trips[2];
    assert!(median >= 2 * delay, "median round trip {median:?}");
    assert!(
        median < 2 * delay + Duration::from_millis(50),
        "median round trip {median:?}"
    );
}
