//! What the DPU rack's unshaped paths move, as `bench soda` measures at
//! start-up: every channel reads 1 MiB in chunks, from the memory node
//! (B_net) and then from the DPU (B_intra). Prints each start's figures.
//!
//! `cargo run --release -p remora-soda --example link_rate [STARTS] [CHANNELS]`

use remora_soda::dpu::DpuConfig;
use remora_soda::rack::{RackLinks, Route, SodaRack, SodaRackConfig};

fn main() {
    let mut arguments = std::env::args().skip(1);
    let starts: usize = arguments
        .next()
        .map_or(5, |text| text.parse().expect("STARTS"));
    let channels: usize = arguments
        .next()
        .map_or(3, |text| text.parse().expect("CHANNELS"));
    let chunk_bytes = 64 << 10;
    for _ in 0..starts {
        let config = SodaRackConfig {
            pool_bytes: 4 << 20,
            processes: 1,
            channels,
            chunk_bytes,
            dpu: Some(DpuConfig::optimized(chunk_bytes)),
            route: Route::Direct,
            links: RackLinks::default(),
            hosts: None,
        };
        let rack = SodaRack::start(&config).expect("the rack starts");
        let (net, intra) = rack.bandwidths().expect("a DPU rack measures its links");
        println!(
            "memory node {:.2} GB/s   DPU {:.2} GB/s",
            net / 1e9,
            intra / 1e9
        );
        rack.stop().expect("the rack stops");
    }
}
