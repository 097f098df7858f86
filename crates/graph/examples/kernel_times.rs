//! Times each kernel on a generated graph, to compare with GAPBS:
//! `cargo run --release -p remora-graph --example kernel_times -- 20 2`
//! (scale, threads). Prints the median of three runs of each kernel.

use remora_graph::apps::{bc::bc, bfs::bfs, cc::cc, pagerank, radii::radii};
use remora_graph::engine::with_threads;
use remora_graph::generate::{generate, GeneratorSpec, GraphKind};
use std::time::Instant;

fn median_seconds(mut run: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..3)
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[1]
}

fn main() {
    let mut arguments = std::env::args().skip(1);
    let scale: u32 = arguments
        .next()
        .map_or(16, |text| text.parse().expect("a scale"));
    let threads: usize = arguments
        .next()
        .map_or(2, |text| text.parse().expect("a thread count"));
    with_threads(threads, || {
        let start = Instant::now();
        let spec = GeneratorSpec {
            kind: GraphKind::Kronecker,
            scale,
            degree: 16,
            seed: 1,
        };
        let graph = generate(spec).expect("a valid spec");
        println!(
            "generated scale {scale}: {} vertices, {} edges in {:.2} s",
            graph.vertex_count(),
            graph.edge_count(),
            start.elapsed().as_secs_f64()
        );
        let source = graph.first_vertex_with_out_edges().unwrap_or(0);
        println!(
            "bfs      {:.4} s",
            median_seconds(|| drop(bfs(&graph, source).expect("local values")))
        );
        let per_vertex = pagerank::PageRankOptions {
            contributions: pagerank::Contributions::PerVertex,
            ..Default::default()
        };
        println!(
            "pagerank {:.4} s (shares per edge, Ligra's)",
            median_seconds(|| drop(
                pagerank::pagerank(&graph, Default::default()).expect("local values")
            ))
        );
        println!(
            "pagerank {:.4} s (shares per vertex, GAPBS's)",
            median_seconds(|| drop(pagerank::pagerank(&graph, per_vertex).expect("local values")))
        );
        println!(
            "cc       {:.4} s",
            median_seconds(|| drop(cc(&graph).expect("local values")))
        );
        println!(
            "bc       {:.4} s",
            median_seconds(|| drop(bc(&graph, source).expect("local values")))
        );
        println!(
            "radii    {:.4} s",
            median_seconds(|| drop(radii(&graph, 1).expect("local values")))
        );
    });
}
