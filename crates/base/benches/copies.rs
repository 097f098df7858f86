//! `copy_bytes` against `copy_from_slice` for a frame (4160 B) and a
//! chunk (64 KiB), with the destination at offsets past the source,
//! modulo 4096, where glibc's `rep movsb` is slow on some machines (8–24)
//! and where it is not: `cargo bench -p remora-base`.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use remora_base::copy_bytes;

const SIZES_BYTES: [usize; 2] = [4160, 64 << 10];
const OFFSETS_BYTES: [usize; 6] = [0, 8, 16, 24, 32, 64];
/// The destination starts this far past the source, plus the offset: a
/// multiple of 4096, so the offset alone decides the case.
const DISTANCE_BYTES: usize = 128 << 10;

fn copies(criterion: &mut Criterion) {
    let mut block = vec![0u8; 1 << 20];
    let source_start = 4096 - block.as_ptr() as usize % 4096;
    for size in SIZES_BYTES {
        for offset in OFFSETS_BYTES {
            let destination_start = source_start + DISTANCE_BYTES + offset;
            let (low, high) = block.split_at_mut(destination_start);
            let source = &low[source_start..source_start + size];
            let destination = &mut high[..size];
            criterion.bench_function(&format!("copy_from_slice {size} B +{offset}"), |bench| {
                bench.iter(|| destination.copy_from_slice(black_box(source)))
            });
            criterion.bench_function(&format!("copy_bytes {size} B +{offset}"), |bench| {
                bench.iter(|| copy_bytes(destination, black_box(source)))
            });
        }
    }
}

criterion_group!(benches, copies);
criterion_main!(benches);
