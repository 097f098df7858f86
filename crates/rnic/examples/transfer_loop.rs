//! A loop of one kind of transfer between two back-to-back soft RNICs, for
//! profiling: `cargo run --release -p remora-rnic --example transfer_loop --
//! read 64 1 5` runs serial 64 B READs for five seconds, under `perf record`
//! or any sampling profiler (README, "Profiling"). A last argument of
//! `100000ops` runs that many transfers instead, for instruction counts
//! under `valgrind --tool=callgrind`, which a noisy machine cannot skew.

use remora_rnic::back_to_back::{BackToBack, Verdict};
use remora_rnic::*;
use std::time::{Duration, Instant};

fn main() -> Result<(), VerbsError> {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: transfer_loop read|write SIZE_BYTES DEPTH SECONDS|COUNTops";
    let [kind, size, depth, seconds] = arguments.as_slice() else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let is_read = match kind.as_str() {
        "read" => true,
        "write" => false,
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let parse = |text: &str| -> u64 {
        text.parse().unwrap_or_else(|_| {
            eprintln!("{usage}: {text:?} is not a number");
            std::process::exit(2)
        })
    };
    let size_bytes = parse(size);
    let depth = parse(depth) as usize;
    let (duration, max_transfers) = match seconds.strip_suffix("ops") {
        Some(count) => (Duration::MAX, parse(count)),
        None => (Duration::from_secs(parse(seconds)), u64::MAX),
    };

    let mut fabric = BackToBack::new(7);
    let left_pd = fabric.left.alloc_protection_domain()?;
    let right_pd = fabric.right.alloc_protection_domain()?;
    let local = fabric
        .left
        .register_memory(left_pd, size_bytes, AccessFlags::ALL)?;
    let remote = fabric
        .right
        .register_memory(right_pd, size_bytes, AccessFlags::ALL)?;
    let left_cq = fabric.left.create_completion_queue(depth * 2)?;
    let right_cq = fabric.right.create_completion_queue(depth * 2)?;
    let mut left_builder = QueuePairBuilder::new(left_pd, left_cq, left_cq);
    left_builder.max_read_atomic = depth;
    left_builder.send_queue_depth = depth * 2;
    let right_builder = QueuePairBuilder::new(right_pd, right_cq, right_cq);
    let (qp, _) = fabric.connect(&left_builder, &right_builder)?;
    let operation = if is_read {
        SendOperation::Read {
            remote: remote.remote(0),
        }
    } else {
        SendOperation::Write {
            remote: remote.remote(0),
            immediate: None,
        }
    };
    let request =
        SendRequest::new(0, operation, &[local.slice(0, size_bytes as u32)]).expect("one element");
    let start = Instant::now();
    let mut outstanding = 0;
    let mut completed = 0u64;
    while start.elapsed() < duration && completed < max_transfers {
        for _ in 0..1024 {
            while outstanding < depth {
                fabric.left.post_send(qp, request)?;
                outstanding += 1;
            }
            fabric.step(&mut |_, _| Verdict::Deliver);
            while let Some(completion) = fabric.left.poll_completion(left_cq)? {
                assert_eq!(completion.status, CompletionStatus::Success);
                outstanding -= 1;
                completed += 1;
            }
        }
    }
    let elapsed = start.elapsed();
    println!(
        "{completed} transfers in {:.2} s: {:.1} ns each",
        elapsed.as_secs_f64(),
        elapsed.as_nanos() as f64 / completed as f64
    );
    Ok(())
}
