//! What the DPU rack's unshaped paths move, as `bench soda` measures at
//! start-up: every channel reads 1 MiB in chunks, from the memory node
//! (B_net) and then from the DPU (B_intra). Prints each start's figures.
//!
//! `cargo run --release -p remora-soda --example link_rate [STARTS] [CHANNELS] [ROUNDS]`
//!
//! ROUNDS (default 1) measures each started rack that many times more, so
//! a profiler sees the warm data path rather than the start-up.

use remora_soda::rack::{SodaRack, SodaRackConfig};

fn main() {
    let mut arguments = std::env::args().skip(1);
    let starts: usize = arguments
        .next()
        .map_or(5, |text| text.parse().expect("STARTS"));
    let channels: usize = arguments
        .next()
        .map_or(3, |text| text.parse().expect("CHANNELS"));
    let rounds: usize = arguments
        .next()
        .map_or(1, |text| text.parse().expect("ROUNDS"));
    let chunk_bytes = 64 << 10;
    for _ in 0..starts {
        let config = SodaRackConfig::unshaped_with_dpu(chunk_bytes, channels);
        let rack = SodaRack::start(&config).expect("the rack starts");
        let mut measured = rack.bandwidths().expect("a DPU rack measures its links");
        for round in 0..rounds {
            if round > 0 {
                measured = rack.measure_bandwidths().expect("the rack measures");
            }
            let (net, intra) = measured;
            println!(
                "memory node {:.2} GB/s   DPU {:.2} GB/s",
                net / 1e9,
                intra / 1e9
            );
        }
        rack.stop().expect("the rack stops");
    }
}
