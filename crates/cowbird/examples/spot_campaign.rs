//! Runs the Spot engine in the simulator over many seeds under heavy
//! faults (5% loss per link, half as much duplication, 5% reordering by up
//! to 5 µs) and prints each failure: `cargo run --release -p
//! remora-cowbird --example spot_campaign -- END [START]`.

use remora_cowbird::simulated::{run, ReadCheck, Workload};
use remora_sim::{LinkFaults, Probability};
use std::time::Duration;

fn main() {
    let argument = |index: usize, default: u64| -> u64 {
        std::env::args()
            .nth(index)
            .and_then(|text| text.parse().ok())
            .unwrap_or(default)
    };
    let (seeds, first) = (argument(1, 100), argument(2, 0));
    let faults = LinkFaults {
        loss: Probability::literal(0.05),
        duplicate: Probability::literal(0.025),
        reorder: Probability::literal(0.05),
        reorder_delay: Duration::from_micros(5),
        ..LinkFaults::NONE
    };
    // A reconnection serves the interrupted batch again.
    let workload = Workload {
        spot_reads: ReadCheck::MayBeRedone,
        ..Workload::new(faults)
    };
    let (mut failed, mut reconnects) = (0, 0);
    for seed in first..seeds {
        match run(seed, &workload) {
            Ok(outcome) if outcome.engine.reconnects > 0 => {
                println!("seed {seed}: {} reconnections", outcome.engine.reconnects);
                reconnects += outcome.engine.reconnects;
            }
            Ok(_) => {}
            Err(error) => {
                println!("seed {seed}: {error}");
                failed += 1;
            }
        }
    }
    println!("seeds {first}..{seeds}: {failed} failed, {reconnects} reconnections");
}
