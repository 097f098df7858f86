//! How long one chunk takes to come from the memory node, straight
//! (MemServer) on unshaped links: the store's `fetch` alone, without
//! userfaultfd. THREADS threads each fetch chunks of one object in turn;
//! prints the p50 and p99 of every fetch.
//!
//! `cargo run --release -p remora-soda --example fetch_latency [THREADS] [FETCHES] [CHUNK_KIB]`

use std::time::Instant;

use remora_soda::rack::{Route, SodaRack, SodaRackConfig};
use remora_soda::store::{ChunkStore, ObjectId};

fn main() {
    let mut arguments = std::env::args().skip(1);
    let threads: usize = arguments
        .next()
        .map_or(1, |text| text.parse().expect("THREADS"));
    let fetches: usize = arguments
        .next()
        .map_or(2000, |text| text.parse().expect("FETCHES"));
    let chunk_bytes: usize = arguments
        .next()
        .map_or(64, |text: String| text.parse::<usize>().expect("CHUNK_KIB"))
        << 10;
    let object_bytes = 4usize << 20;
    let mut config = SodaRackConfig::unshaped_with_dpu(chunk_bytes, threads);
    config.dpu = None;
    config.route = Route::Direct;
    config.pool_bytes = (object_bytes * threads) as u64;
    let rack = SodaRack::start(&config).expect("the rack starts");
    for thread in 0..threads {
        rack.reserve(ObjectId(thread as u32), object_bytes as u64, None)
            .expect("reserve");
    }
    let mut latencies_nanos: Vec<u64> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                let rack = &rack;
                scope.spawn(move || {
                    let mut buffer = vec![0u8; chunk_bytes];
                    let chunks = object_bytes / chunk_bytes;
                    (0..fetches)
                        .map(|fetch| {
                            let offset = ((fetch % chunks) * chunk_bytes) as u64;
                            let started = Instant::now();
                            rack.fetch(ObjectId(thread as u32), offset, &mut buffer)
                                .expect("fetch");
                            started.elapsed().as_nanos() as u64
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|handle| handle.join().expect("fetcher"))
            .collect()
    });
    latencies_nanos.sort_unstable();
    let at = |quantile: f64| {
        latencies_nanos[((latencies_nanos.len() - 1) as f64 * quantile) as usize] as f64 / 1e3
    };
    println!(
        "{threads} threads, {} KiB chunks: p50 {:.1} µs, p99 {:.1} µs",
        chunk_bytes >> 10,
        at(0.5),
        at(0.99)
    );
    let cpu = rack.stop().expect("the rack stops");
    println!("fabric CPU {:.3} s", cpu.as_secs_f64());
}
