//! Crashes the Spot engine's memory host at varied times over many seeds,
//! with small windows so reads and writes overlap, and checks every
//! history: `cargo run --release -p remora-cowbird --example
//! crash_campaign -- END [START]`.

#[path = "common/seeds.rs"]
mod seeds;

use remora_cowbird::simulated::{lossy, run_with, Disruption, ReadCheck, Workload};
use remora_sim::{LinkFaults, Probability};
use std::time::Duration;

fn main() {
    let (first, seeds) = seeds::seed_range();
    let mut failed = 0;
    for seed in first..seeds {
        for (name, faults) in [
            ("clean", LinkFaults::NONE),
            ("1% loss", lossy(Probability::literal(0.01))),
        ] {
            let workload = Workload {
                window_bytes: 96,
                max_length: 48,
                spot_reads: ReadCheck::MayBeRedone,
                ..Workload::new(faults)
            };
            let disruption = if seed % 2 == 0 {
                Disruption::Crash {
                    at: Duration::from_micros(100 + 13 * seed),
                    down_for: Duration::from_micros(300),
                }
            } else {
                Disruption::Partition {
                    at: Duration::from_micros(100 + 13 * seed),
                    cut_for: Duration::from_millis(3),
                }
            };
            if let Err(error) = run_with(seed, &workload, Some(disruption)) {
                println!("seed {seed} ({name}, {disruption:?}): {error}");
                failed += 1;
            }
        }
    }
    println!("seeds {first}..{seeds}: {failed} failed");
}
