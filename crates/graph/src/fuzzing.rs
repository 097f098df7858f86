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
    let (outgoing, incoming) = graph.arrays();
    for (offsets, neighbours) in std::iter::once(outgoing).chain(incoming) {
        assert_valid_adjacency(offsets, neighbours, vertex_count);
    }
    // The in-edges are the out-edges reversed, each as often. (An
    // undirected graph's in-edges are its out-edges: it is symmetric.)
    let mut forward: Vec<(Vertex, Vertex)> = Vec::new();
    let mut reversed: Vec<(Vertex, Vertex)> = Vec::new();
    for vertex in 0..vertex_count as Vertex {
        forward.extend(graph.out_neighbours(vertex).iter().map(|&to| (vertex, to)));
        reversed.extend(
            graph
                .in_neighbours(vertex)
                .iter()
                .map(|&from| (from, vertex)),
        );
    }
    forward.sort_unstable();
    reversed.sort_unstable();
    assert_eq!(
        forward, reversed,
        "the in-edges are not the out-edges reversed"
    );
    true
}

/// One direction of a CSR: offsets from 0, never falling, ending at the
/// neighbours' count, and every neighbour a vertex.
fn assert_valid_adjacency(offsets: &[u64], neighbours: &[Vertex], vertex_count: usize) {
    assert_eq!(offsets.len(), vertex_count + 1);
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|pair| pair[0] <= pair[1]));
    assert_eq!(offsets[vertex_count] as usize, neighbours.len());
    assert!(neighbours.iter().all(|&v| (v as usize) < vertex_count));
}
