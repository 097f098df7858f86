//! The soft RNIC's per-operation cost, one benchmark per kind of transfer:
//! two devices back to back in one thread, so every nanosecond is RoCEv2
//! work. `cargo bench -p remora-rnic`.

use criterion::{criterion_group, criterion_main, Criterion};
use remora_rnic::back_to_back::{TransferRig, Verdict};
use remora_rnic::*;

/// One transfer, posted and moved until it completes.
fn transfer(rig: &mut TransferRig, request: SendRequest) {
    rig.fabric
        .left
        .post_send(rig.queue_pairs[0], request)
        .unwrap();
    loop {
        rig.fabric.step(&mut |_, _| Verdict::Deliver);
        if let Some(completion) = rig.fabric.left.poll_completion(rig.completions).unwrap() {
            assert_eq!(completion.status, CompletionStatus::Success);
            return;
        }
    }
}

fn transfers(criterion: &mut Criterion) {
    for (name, read, size_bytes) in [
        ("64 B READ", true, 64),
        ("64 B WRITE", false, 64),
        ("4 KiB READ", true, 4096),
        ("64 KiB WRITE", false, 65536),
    ] {
        let mut rig = TransferRig::new(size_bytes, 1, 1).unwrap();
        let request = rig.request(0, read);
        criterion.bench_function(name, |bench| bench.iter(|| transfer(&mut rig, request)));
    }
}

criterion_group!(benches, transfers);
criterion_main!(benches);
