//! Breadth-first search: a parent and a depth for every reached vertex.

use crate::apps::{check_source, read_words32, AppError};
use crate::csr::{Direction, Graph};
use crate::engine::{edge_map, vertex_map, EdgeFunction};
use crate::frontier::Frontier;
use crate::{Vertex, NO_VERTEX};
use std::sync::atomic::{AtomicU32, Ordering};

/// Depth of a vertex the search never reached.
pub const UNREACHED: u32 = u32::MAX;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BfsResult {
    /// The vertex it was reached from; the source is its own parent and
    /// an unreached vertex has [`NO_VERTEX`]. Parents depend on thread
    /// timing; depths do not.
    pub parents: Vec<Vertex>,
    pub depths: Vec<u32>,
}

struct ClaimParent<'a> {
    parents: &'a [AtomicU32],
}

impl EdgeFunction for ClaimParent<'_> {
    fn update(&self, source: Vertex, destination: Vertex) -> bool {
        self.parents[destination as usize].store(source, Ordering::Relaxed);
        true
    }

    fn update_atomic(&self, source: Vertex, destination: Vertex) -> bool {
        self.parents[destination as usize]
            .compare_exchange(NO_VERTEX, source, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    fn condition(&self, destination: Vertex) -> bool {
        self.parents[destination as usize].load(Ordering::Relaxed) == NO_VERTEX
    }
}

pub fn bfs(graph: &Graph, source: Vertex) -> Result<BfsResult, AppError> {
    let vertex_count = graph.vertex_count();
    check_source(source, vertex_count)?;
    let parents_values = graph.values32("bfs parents", |_| NO_VERTEX)?;
    let depths_values = graph.values32("bfs depths", |_| UNREACHED)?;
    // Plain slices, taken once: indexing an `Array` goes through its
    // storage every time.
    let (parents, depths): (&[AtomicU32], &[AtomicU32]) = (&parents_values, &depths_values);
    parents[source as usize].store(source, Ordering::Relaxed);
    depths[source as usize].store(0, Ordering::Relaxed);
    let function = ClaimParent { parents };
    let mut frontier = Frontier::single(source);
    let mut depth = 0u32;
    // Each round reaches at least one new vertex, so at most n rounds.
    while !frontier.is_empty() {
        depth += 1;
        frontier = edge_map(graph, &frontier, &function, Direction::Forward);
        vertex_map(&frontier, |vertex| {
            depths[vertex as usize].store(depth, Ordering::Relaxed)
        });
        debug_assert!(depth as usize <= vertex_count);
    }
    Ok(BfsResult {
        parents: read_words32(parents),
        depths: read_words32(depths),
    })
}
