//! The soft RNIC's per-operation cost, one benchmark per kind of transfer:
//! two devices back to back in one thread, so every nanosecond is RoCEv2
//! work. `cargo bench -p remora-rnic`.

use criterion::{criterion_group, criterion_main, Criterion};
use remora_rnic::back_to_back::{BackToBack, Verdict};
use remora_rnic::*;

/// A connected pair with one region on each side, and the request a
/// benchmark posts again and again.
struct Pair {
    fabric: BackToBack,
    queue_pair: QueuePair,
    completions: CompletionQueue,
    request: SendRequest,
}

fn pair(read: bool, size_bytes: u32) -> Result<Pair, VerbsError> {
    let mut fabric = BackToBack::new(5);
    let left_pd = fabric.left.alloc_protection_domain()?;
    let right_pd = fabric.right.alloc_protection_domain()?;
    let local = fabric
        .left
        .register_memory(left_pd, u64::from(size_bytes), AccessFlags::ALL)?;
    let remote = fabric
        .right
        .register_memory(right_pd, u64::from(size_bytes), AccessFlags::ALL)?;
    let left_cq = fabric.left.create_completion_queue(16)?;
    let right_cq = fabric.right.create_completion_queue(16)?;
    let left = QueuePairBuilder::new(left_pd, left_cq, left_cq);
    let right = QueuePairBuilder::new(right_pd, right_cq, right_cq);
    let (queue_pair, _) = fabric.connect(&left, &right)?;
    let operation = if read {
        SendOperation::Read {
            remote: remote.remote(0),
        }
    } else {
        SendOperation::Write {
            remote: remote.remote(0),
            immediate: None,
        }
    };
    let request = SendRequest::new(0, operation, &[local.slice(0, size_bytes)])?;
    Ok(Pair {
        fabric,
        queue_pair,
        completions: left_cq,
        request,
    })
}

impl Pair {
    /// One transfer, posted and moved until it completes.
    fn transfer(&mut self) {
        self.fabric
            .left
            .post_send(self.queue_pair, self.request)
            .unwrap();
        loop {
            self.fabric.step(&mut |_, _| Verdict::Deliver);
            if let Some(completion) = self.fabric.left.poll_completion(self.completions).unwrap() {
                assert_eq!(completion.status, CompletionStatus::Success);
                return;
            }
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
        let mut pair = pair(read, size_bytes).unwrap();
        criterion.bench_function(name, |bench| bench.iter(|| pair.transfer()));
    }
}

criterion_group!(benches, transfers);
criterion_main!(benches);
