//! `memcpy` (`copy_from_slice`) against [`copy_bytes`] at controlled
//! offsets of the destination past the source, modulo 4096: the offsets
//! where glibc's `rep movsb` is slow on some machines (see
//! `remora_base::copy_bytes`) and some where it is not. Prints the best of
//! three runs per case, in nanoseconds per copy.
//!
//! `cargo run --release -p remora-base --example copy_rates`

use remora_base::copy_bytes;
use std::hint::black_box;
use std::time::Instant;

const SIZES_BYTES: [usize; 3] = [4096, 4160, 65536];
const OFFSETS_BYTES: [usize; 6] = [0, 8, 16, 24, 32, 64];
const BYTES_PER_CASE: usize = 100 << 20;

fn best_nanos(copies: usize, mut copy: impl FnMut()) -> f64 {
    (0..3)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..copies {
                copy();
            }
            started.elapsed().as_nanos() as f64 / copies as f64
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    let mut block = vec![0u8; 1 << 20];
    let page_start = 4096 - block.as_ptr() as usize % 4096;
    let source_start = page_start + 64;
    println!("bytes  offset  memcpy_ns  copy_bytes_ns");
    for size in SIZES_BYTES {
        for offset in OFFSETS_BYTES {
            let destination_start = source_start + (128 << 10) + offset;
            let (low, high) = block.split_at_mut(destination_start);
            let source = &low[source_start..source_start + size];
            let destination = &mut high[..size];
            let copies = BYTES_PER_CASE / size;
            let memcpy = best_nanos(copies, || {
                destination.copy_from_slice(black_box(source));
                black_box(&mut *destination);
            });
            let pieces = best_nanos(copies, || {
                copy_bytes(destination, black_box(source));
                black_box(&mut *destination);
            });
            println!("{size:5}  {offset:6}  {memcpy:9.0}  {pieces:13.0}");
        }
    }
}
