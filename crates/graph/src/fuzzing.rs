//! The harness of the `graph_files` fuzz target, kept in the crate so
//! that its seeds and findings replay as ordinary tests: any bytes, read
//! as any graph format, give a graph or an error, never a panic, and a
//! graph that loads is a valid CSR.

use crate::load::{parse, GraphFormat, LoadOptions};
use crate::Vertex;

const FORMATS: [GraphFormat; 5] = [
    GraphFormat::EdgeList,
    GraphFormat::WeightedEdgeList,
    GraphFormat::Serialized,
    GraphFormat::Adjacency,
    GraphFormat::Snap,
];

/// The most vertices a fuzzed edge list may ask for.
pub const FUZZ_MAX_VERTICES: usize = 1 << 16;

/// The first byte picks the format and whether to symmetrize. Returns
/// whether the bytes loaded.
pub fn any_graph_file(data: &[u8]) -> bool {
    let Some((&selector, rest)) = data.split_first() else {
        return false;
    };
    let format = FORMATS[usize::from(selector) % FORMATS.len()];
    // A small limit: the fuzzer's memory is not the graph's to take.
    let options = LoadOptions {
        symmetrize: selector >= 128,
        max_vertex_count: Some(FUZZ_MAX_VERTICES),
    };
    let Ok(graph) = parse(format, rest, options) else {
        return false;
    };
    let vertex_count = graph.vertex_count();
    let ((offsets, neighbours), _) = graph.arrays();
    assert_eq!(offsets.len(), vertex_count + 1);
    assert_eq!(offsets[vertex_count] as usize, neighbours.len());
    assert!(neighbours.iter().all(|&v| (v as usize) < vertex_count));
    for vertex in 0..vertex_count as Vertex {
        let _ = graph.in_neighbours(vertex);
    }
    true
}
