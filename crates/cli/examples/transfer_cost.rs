//! One transfer between two back-to-back devices, repeated: the fastest of
//! seven runs in ns per operation, for A/B comparisons of the hot path and
//! for profiling (`perf record ./target/release/examples/transfer_cost 64`).
//!
//! Usage: `transfer_cost SIZE_BYTES [read|write]`.

use remora_rnic::back_to_back::{BackToBack, Verdict};
use remora_rnic::*;
use std::time::Instant;

fn main() {
    let size: u32 = std::env::args()
        .nth(1)
        .map_or(64, |s| s.parse().expect("SIZE_BYTES"));
    let write = std::env::args().nth(2).as_deref() == Some("write");
    let mut fabric = BackToBack::new(1);
    let left_pd = fabric.left.alloc_protection_domain().unwrap();
    let right_pd = fabric.right.alloc_protection_domain().unwrap();
    let local = fabric
        .left
        .register_memory(left_pd, u64::from(size.max(8)), AccessFlags::ALL)
        .unwrap();
    let remote = fabric
        .right
        .register_memory(right_pd, u64::from(size.max(8)), AccessFlags::ALL)
        .unwrap();
    let left_cq = fabric.left.create_completion_queue(64).unwrap();
    let right_cq = fabric.right.create_completion_queue(64).unwrap();
    let left = QueuePairBuilder::new(left_pd, left_cq, left_cq);
    let right = QueuePairBuilder::new(right_pd, right_cq, right_cq);
    let (qp, _) = fabric.connect(&left, &right).unwrap();
    let operation = if write {
        SendOperation::Write {
            remote: remote.remote(0),
            immediate: None,
        }
    } else {
        SendOperation::Read {
            remote: remote.remote(0),
        }
    };
    let request = SendRequest::new(1, operation, &[local.slice(0, size)]).unwrap();
    let iterations = (400_000_000 / (u64::from(size) * 4 + 4096)).max(100);
    let best = (0..7)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iterations {
                fabric.left.post_send(qp, request).unwrap();
                while fabric.left.poll_completion(left_cq).unwrap().is_none() {
                    fabric.step(&mut |_, _| Verdict::Deliver);
                }
            }
            start.elapsed().as_nanos() as f64 / iterations as f64
        })
        .fold(f64::INFINITY, f64::min);
    println!(
        "{} {size} B: {best:.1} ns per operation",
        if write { "WRITE" } else { "READ" }
    );
}
