//! Graph radii estimation (Ligra's Radii): breadth-first searches from up
//! to 64 sampled sources at once, one bit per source per vertex. A
//! vertex's radius is the last round its set of reached sources grew: its
//! greatest distance from a sampled source that reaches it.

use crate::apps::read_words32;
use crate::csr::{Direction, Graph};
use crate::engine::{edge_map, vertex_map, EdgeFunction};
use crate::frontier::Frontier;
use crate::{PlacementError, Vertex};
use rand::seq::index::sample;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Sources per run: one bit each in a `u64`.
pub const MAX_SOURCES: usize = 64;

/// Radius of a vertex no sampled source reaches.
pub const UNREACHED: u32 = u32::MAX;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RadiiResult {
    pub sources: Vec<Vertex>,
    pub radii: Vec<u32>,
}

impl RadiiResult {
    /// The estimate of the graph's radius: the largest finite radius.
    pub fn estimate(&self) -> u32 {
        self.radii
            .iter()
            .copied()
            .filter(|&radius| radius != UNREACHED)
            .max()
            .unwrap_or(0)
    }
}

struct Spread<'a> {
    visited: &'a [AtomicU64],
    next_visited: &'a [AtomicU64],
    radii: &'a [AtomicU32],
    round: u32,
}

impl EdgeFunction for Spread<'_> {
    fn update(&self, source: Vertex, destination: Vertex) -> bool {
        let (source, destination) = (source as usize, destination as usize);
        let reached = self.visited[source].load(Ordering::Relaxed);
        let next = &self.next_visited[destination];
        let merged = next.load(Ordering::Relaxed) | reached;
        if merged == next.load(Ordering::Relaxed) {
            return false;
        }
        next.store(merged, Ordering::Relaxed);
        let first_this_round = self.radii[destination].load(Ordering::Relaxed) != self.round;
        self.radii[destination].store(self.round, Ordering::Relaxed);
        first_this_round
    }

    fn update_atomic(&self, source: Vertex, destination: Vertex) -> bool {
        let (source, destination) = (source as usize, destination as usize);
        let reached = self.visited[source].load(Ordering::Relaxed);
        let before = self.next_visited[destination].fetch_or(reached, Ordering::Relaxed);
        if before | reached == before {
            return false;
        }
        let radius = &self.radii[destination];
        let current = radius.load(Ordering::Relaxed);
        current != self.round
            && radius
                .compare_exchange(current, self.round, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    fn condition(&self, _destination: Vertex) -> bool {
        true
    }
}

/// Samples the sources with `seed`, so a run is reproducible.
pub fn radii(graph: &Graph, seed: u64) -> Result<RadiiResult, PlacementError> {
    let vertex_count = graph.vertex_count();
    let mut random = ChaCha8Rng::seed_from_u64(seed);
    let count = vertex_count.min(MAX_SOURCES);
    let mut sources: Vec<Vertex> = sample(&mut random, vertex_count, count)
        .into_iter()
        .map(|vertex| vertex as Vertex)
        .collect();
    sources.sort_unstable();
    let visited_values = graph.values64("radii visited", |_| 0)?;
    let next_visited_values = graph.values64("radii next visited", |_| 0)?;
    let radii_values = graph.values32("radii", |_| UNREACHED)?;
    // Plain slices, taken once: indexing an `Array` goes through its
    // storage every time.
    let (visited, next_visited, radii): (&[AtomicU64], &[AtomicU64], &[AtomicU32]) =
        (&visited_values, &next_visited_values, &radii_values);
    for (bit, &source) in sources.iter().enumerate() {
        visited[source as usize].store(1 << bit, Ordering::Relaxed);
        next_visited[source as usize].store(1 << bit, Ordering::Relaxed);
        radii[source as usize].store(0, Ordering::Relaxed);
    }
    let mut frontier = Frontier::Sparse(sources.clone());
    let mut round = 0;
    // A vertex joins a round's frontier only when its bit set grows, at
    // most 64 times, so the loop ends.
    while !frontier.is_empty() {
        round += 1;
        let spread = Spread {
            visited,
            next_visited,
            radii,
            round,
        };
        frontier = edge_map(graph, &frontier, &spread, Direction::Forward);
        vertex_map(&frontier, |vertex| {
            let vertex = vertex as usize;
            let grown = next_visited[vertex].load(Ordering::Relaxed);
            visited[vertex].store(grown, Ordering::Relaxed);
        });
    }
    Ok(RadiiResult {
        sources,
        radii: read_words32(radii),
    })
}
