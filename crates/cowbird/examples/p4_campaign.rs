//! Runs Cowbird-P4 in the simulator over many seeds and workloads and
//! prints the first failure: `cargo run --release -p remora-cowbird
//! --example p4_campaign -- END [START]` runs seeds START..END (START
//! defaults to 0).

#[path = "common/seeds.rs"]
mod seeds;

use remora_cowbird::simulated::{run, Engine, Workload};
use remora_sim::{LinkFaults, Probability};
use std::time::Duration;

fn main() {
    let (first, seeds) = seeds::seed_range();
    let faults = |loss: f64| LinkFaults {
        loss: Probability::literal(loss),
        duplicate: Probability::literal(loss / 2.0),
        reorder: Probability::literal(0.02),
        reorder_delay: Duration::from_micros(5),
        ..LinkFaults::NONE
    };
    let base = |loss| Workload {
        engine: Engine::P4,
        ..Workload::new(faults(loss))
    };
    let workloads = [
        ("default 5%", base(0.05)),
        (
            "small windows 5%",
            Workload {
                window_bytes: 64,
                max_length: 32,
                ..base(0.05)
            },
        ),
        (
            "multi-packet reads 3%",
            Workload {
                window_bytes: 8192,
                max_length: 3000,
                max_write_length: 1024,
                ..base(0.03)
            },
        ),
    ];
    for (name, workload) in workloads {
        let mut go_backs = 0;
        for seed in first..seeds {
            match run(seed, &workload) {
                Ok(outcome) => go_backs += outcome.switch_engine.map_or(0, |stats| stats.go_backs),
                Err(error) => {
                    println!("{name}: {error}");
                    std::process::exit(1);
                }
            }
        }
        println!("{name}: seeds {first}..{seeds} passed, {go_backs} go-backs");
    }
}
