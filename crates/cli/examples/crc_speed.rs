fn main() {
    for size in [64usize, 128, 1024, 4096, 65536] {
        let data = vec![0xa5u8; size];
        let iterations = (1 << 28) / size;
        let start = std::time::Instant::now();
        let mut acc = 0u32;
        for _ in 0..iterations {
            let mut h = crc32fast::Hasher::new();
            h.update(std::hint::black_box(&data));
            acc ^= h.finalize();
        }
        let ns = start.elapsed().as_nanos() as f64 / iterations as f64;
        println!(
            "{size:>6} B: {ns:8.1} ns  {:6.2} GB/s  {acc}",
            size as f64 / ns
        );
    }
}
