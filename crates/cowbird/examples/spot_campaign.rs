//! Runs the Spot engine in the simulator over many seeds under heavy
//! faults (5% loss per link, half as much duplication, 5% reordering by up
//! to 5 µs) and prints each failure: `cargo run --release -p
//! remora-cowbird --example spot_campaign -- END [START]`.

#[path = "common/seeds.rs"]
mod seeds;

use remora_cowbird::simulated::{heavy_faults, run, ReadCheck, Workload};

fn main() {
    let (first, seeds) = seeds::seed_range();
    let faults = heavy_faults();
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
