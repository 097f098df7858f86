//! A loop of one kind of transfer between two back-to-back soft RNICs, for
//! profiling: `cargo run --release -p remora-rnic --example transfer_loop --
//! read 64 1 5` runs serial 64 B READs for five seconds, under `perf record`
//! or any sampling profiler (README, "Profiling"). A last argument of
//! `100000ops` runs that many transfers instead, for instruction counts
//! under `valgrind --tool=callgrind`, which a noisy machine cannot skew.
//! A fifth argument spreads the work over that many queue pairs, DEPTH on
//! each, as `bench fabric`'s queue-pair scaling does: `read 64 1 5 1024`.

use remora_rnic::back_to_back::{TransferRig, Verdict};
use remora_rnic::*;
use std::time::{Duration, Instant};

const USAGE: &str =
    "usage: transfer_loop read|write SIZE_BYTES DEPTH SECONDS|COUNTops [QUEUE_PAIRS]";

fn refuse(what: &str) -> ! {
    eprintln!("{USAGE}{what}");
    std::process::exit(2)
}

fn number(text: &str) -> u64 {
    text.parse()
        .unwrap_or_else(|_| refuse(&format!(": {text:?} is not a number")))
}

fn main() -> Result<(), VerbsError> {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let (kind, size, depth, length, queue_pair_count) = match arguments.as_slice() {
        [kind, size, depth, length] => (kind, size, depth, length, 1),
        [kind, size, depth, length, count] => (kind, size, depth, length, number(count).max(1)),
        _ => refuse(""),
    };
    let read = match kind.as_str() {
        "read" => true,
        "write" => false,
        _ => refuse(""),
    };
    let size_bytes = u32::try_from(number(size)).unwrap_or_else(|_| refuse(": size too large"));
    let depth = number(depth).max(1) as usize;
    let (duration, max_transfers) = match length.strip_suffix("ops") {
        Some(count) => (Duration::MAX, number(count)),
        None => (Duration::from_secs(number(length)), u64::MAX),
    };
    let queue_pair_count = queue_pair_count as usize;
    let mut rig = TransferRig::new(size_bytes, queue_pair_count, depth)?;
    // Each queue pair keeps DEPTH requests posted; a completion is
    // replaced on the queue pair it came from.
    rig.post_on_each(queue_pair_count, depth, read)?;
    let start = Instant::now();
    let mut completed = 0u64;
    // Each second's rate too: it tells a process that runs slow from the
    // start (where its memory landed) from a machine that slows down.
    let mut second = (start, 0u64);
    while start.elapsed() < duration && completed < max_transfers {
        if second.0.elapsed() >= Duration::from_secs(1) {
            let nanoseconds = second.0.elapsed().as_nanos() as f64;
            eprintln!(
                "  {:.1} ns each",
                nanoseconds / (completed - second.1) as f64
            );
            second = (Instant::now(), completed);
        }
        for _ in 0..1024 {
            rig.fabric.step(&mut |_, _| Verdict::Deliver);
            while let Some(completion) = rig.fabric.left.poll_completion(rig.completions)? {
                assert_eq!(completion.status, CompletionStatus::Success);
                rig.post_again(completion.work_request_id, read)?;
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
