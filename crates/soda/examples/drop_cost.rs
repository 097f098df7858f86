//! What dropping a chunk's pages costs, alone and in a batch: the
//! evictor's last step. Another thread keeps reading the mapping from the
//! other CPU, as the application's threads do, so each drop has to shoot
//! down that CPU's TLB.
//!
//! `cargo run --release -p remora-soda --example drop_cost [ROUNDS]`

use remora_soda::mapping::{drop_ranges, Mapping};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const CHUNK_BYTES: usize = 64 << 10;
const BATCHES: [usize; 4] = [1, 4, 8, 16];

fn main() {
    let rounds: u32 = std::env::args()
        .nth(1)
        .map_or(2_000, |text| text.parse().expect("ROUNDS"));
    let most = *BATCHES.iter().max().expect("batches");
    let mapping = Mapping::new(2 * most * CHUNK_BYTES).expect("a mapping");
    let address = mapping.address();
    // The reader's byte: in an odd chunk, which the batches never touch.
    let read_at = address + CHUNK_BYTES;
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                // SAFETY: the mapping stays mapped until the scope ends,
                // and nothing writes this byte.
                std::hint::black_box(unsafe { std::ptr::read_volatile(read_at as *const u8) });
            }
        });
        for batch in BATCHES {
            // Every other chunk, so no two ranges merge into one.
            let ranges: Vec<(usize, usize)> = (0..batch)
                .map(|index| (address + 2 * index * CHUNK_BYTES, CHUNK_BYTES))
                .collect();
            let mut spent = Duration::ZERO;
            for _ in 0..rounds {
                for &(start, length) in &ranges {
                    // SAFETY: the range lies in `mapping`, and only this
                    // thread touches it.
                    unsafe { std::ptr::write_bytes(start as *mut u8, 1, length) };
                }
                let started = Instant::now();
                // SAFETY: the ranges lie in `mapping`, which stays mapped.
                unsafe { drop_ranges(&ranges) }.expect("dropping our own pages");
                spent += started.elapsed();
            }
            let per_chunk = spent / (rounds * batch as u32);
            println!("{batch:>2} chunks of 64 KiB at a time: {per_chunk:?} each");
        }
        stop.store(true, Ordering::Relaxed);
    });
}
