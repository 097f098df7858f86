//! Betweenness centrality from one source (Brandes, as Ligra runs it):
//! a forward breadth-first pass counts shortest paths level by level, and
//! a backward pass over the levels, along reversed edges, accumulates
//! dependencies.

use crate::apps::F64Word;
use crate::apps::{check_source, AppError};
use crate::csr::{Direction, Graph};
use crate::engine::{edge_map, vertex_map, EdgeFunction};
use crate::frontier::Frontier;
use crate::Vertex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

#[derive(Debug, Clone, PartialEq)]
pub struct BcResult {
    /// The dependency of the source on each vertex (0 for the source and
    /// for unreached vertices).
    pub scores: Vec<f64>,
}

/// A vertex's visited flag: a 32-bit value, as every per-vertex value is
/// an atomic word.
fn is_visited(flags: &[AtomicU32], vertex: usize) -> bool {
    flags[vertex].load(Ordering::Relaxed) != 0
}

fn set_visited(flags: &[AtomicU32], vertex: usize, visited: bool) {
    flags[vertex].store(u32::from(visited), Ordering::Relaxed);
}

struct CountPaths<'a> {
    paths: &'a [AtomicU64],
    visited: &'a [AtomicU32],
}

impl EdgeFunction for CountPaths<'_> {
    fn update(&self, source: Vertex, destination: Vertex) -> bool {
        let before = self.paths[destination as usize].load_f64();
        let added = before + self.paths[source as usize].load_f64();
        self.paths[destination as usize].store_f64(added);
        before == 0.0
    }

    fn update_atomic(&self, source: Vertex, destination: Vertex) -> bool {
        let before =
            self.paths[destination as usize].fetch_add_f64(self.paths[source as usize].load_f64());
        before == 0.0
    }

    fn condition(&self, destination: Vertex) -> bool {
        !is_visited(self.visited, destination as usize)
    }
}

/// Along a reversed edge from a child `source` to its parent
/// `destination`: the parent's dependency' gains 1/σ(child) plus the
/// child's dependency'.
struct AddDependencies<'a> {
    dependencies: &'a [AtomicU64],
    inverse_paths: &'a [AtomicU64],
    visited: &'a [AtomicU32],
}

impl AddDependencies<'_> {
    fn share_of(&self, child: Vertex) -> f64 {
        self.inverse_paths[child as usize].load_f64() + self.dependencies[child as usize].load_f64()
    }
}

impl EdgeFunction for AddDependencies<'_> {
    fn update(&self, source: Vertex, destination: Vertex) -> bool {
        let sum = self.dependencies[destination as usize].load_f64() + self.share_of(source);
        self.dependencies[destination as usize].store_f64(sum);
        false
    }

    fn update_atomic(&self, source: Vertex, destination: Vertex) -> bool {
        self.dependencies[destination as usize].fetch_add_f64(self.share_of(source));
        false
    }

    fn condition(&self, destination: Vertex) -> bool {
        !is_visited(self.visited, destination as usize)
    }
}

pub fn bc(graph: &Graph, source: Vertex) -> Result<BcResult, AppError> {
    let vertex_count = graph.vertex_count();
    check_source(source, vertex_count)?;
    let paths_values = graph.values64("bc paths", |_| 0.0f64.to_bits())?;
    let visited_values = graph.values32("bc visited", |_| 0)?;
    // Plain slices, taken once: indexing an `Array` goes through its
    // storage every time.
    let (paths, visited): (&[AtomicU64], &[AtomicU32]) = (&paths_values, &visited_values);
    paths[source as usize].store_f64(1.0);
    set_visited(visited, source as usize, true);
    let levels = count_paths(graph, source, paths, visited);

    // Backward: dependency'(v) = Σ over children w of (1/σ(w) +
    // dependency'(w)), and the score is σ(v)·dependency'(v). (Ligra adds
    // 1/σ(v) into v's own sum and takes it off again at the end: a sum far
    // smaller than 1/σ(v) lost its low bits to that subtraction.)
    let inverse_values = graph.values64("bc inverse paths", |vertex| {
        let count = paths[vertex].load_f64();
        let inverse = if count == 0.0 { 0.0 } else { 1.0 / count };
        inverse.to_bits()
    })?;
    let dependencies_values = graph.values64("bc dependencies", |_| 0.0f64.to_bits())?;
    let (inverse_paths, dependencies): (&[AtomicU64], &[AtomicU64]) =
        (&inverse_values, &dependencies_values);
    let inverse = |vertex: usize| inverse_paths[vertex].load_f64();
    visited
        .iter()
        .for_each(|flag| flag.store(0, Ordering::Relaxed));
    let settle =
        |level: &Frontier| vertex_map(level, |vertex| set_visited(visited, vertex as usize, true));
    let function = AddDependencies {
        dependencies,
        inverse_paths,
        visited,
    };
    let mut levels = levels.into_iter().rev();
    if let Some(deepest) = levels.next() {
        settle(&deepest);
        let mut below = deepest;
        for level in levels {
            edge_map(graph, &below, &function, Direction::Reverse);
            settle(&level);
            below = level;
        }
    }
    let scores = (0..vertex_count)
        .map(|vertex| {
            if vertex == source as usize || inverse(vertex) == 0.0 {
                0.0
            } else {
                dependencies[vertex].load_f64() * paths[vertex].load_f64()
            }
        })
        .collect();
    Ok(BcResult { scores })
}

/// The forward pass; returns the frontier of every level, source first.
fn count_paths(
    graph: &Graph,
    source: Vertex,
    paths: &[AtomicU64],
    visited: &[AtomicU32],
) -> Vec<Frontier> {
    let function = CountPaths { paths, visited };
    let mut levels = vec![Frontier::single(source)];
    // Each level holds vertices not seen before, so at most n levels.
    loop {
        let next = edge_map(
            graph,
            levels.last().expect("the source level"),
            &function,
            Direction::Forward,
        );
        if next.is_empty() {
            return levels;
        }
        vertex_map(&next, |vertex| set_visited(visited, vertex as usize, true));
        levels.push(next);
        debug_assert!(levels.len() <= graph.vertex_count());
    }
}
