//! Betweenness centrality from one source (Brandes, as Ligra runs it):
//! a forward breadth-first pass counts shortest paths level by level, and
//! a backward pass over the levels, along reversed edges, accumulates
//! dependencies.

use crate::apps::AtomicF64;
use crate::csr::{Direction, Graph};
use crate::engine::{edge_map, vertex_map, EdgeFunction};
use crate::frontier::Frontier;
use crate::Vertex;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug, Clone, PartialEq)]
pub struct BcResult {
    /// The dependency of the source on each vertex (0 for the source and
    /// for unreached vertices).
    pub scores: Vec<f64>,
}

struct CountPaths<'a> {
    paths: &'a [AtomicF64],
    visited: &'a [AtomicBool],
}

impl EdgeFunction for CountPaths<'_> {
    fn update(&self, source: Vertex, destination: Vertex) -> bool {
        let before = self.paths[destination as usize].load();
        let added = before + self.paths[source as usize].load();
        self.paths[destination as usize].store(added);
        before == 0.0
    }

    fn update_atomic(&self, source: Vertex, destination: Vertex) -> bool {
        let before = self.paths[destination as usize].fetch_add(self.paths[source as usize].load());
        before == 0.0
    }

    fn condition(&self, destination: Vertex) -> bool {
        !self.visited[destination as usize].load(Ordering::Relaxed)
    }
}

struct AddDependencies<'a> {
    dependencies: &'a [AtomicF64],
    visited: &'a [AtomicBool],
}

impl EdgeFunction for AddDependencies<'_> {
    fn update(&self, source: Vertex, destination: Vertex) -> bool {
        let sum = self.dependencies[destination as usize].load()
            + self.dependencies[source as usize].load();
        self.dependencies[destination as usize].store(sum);
        false
    }

    fn update_atomic(&self, source: Vertex, destination: Vertex) -> bool {
        self.dependencies[destination as usize]
            .fetch_add(self.dependencies[source as usize].load());
        false
    }

    fn condition(&self, destination: Vertex) -> bool {
        !self.visited[destination as usize].load(Ordering::Relaxed)
    }
}

pub fn bc(graph: &Graph, source: Vertex) -> BcResult {
    let vertex_count = graph.vertex_count();
    assert!((source as usize) < vertex_count, "source is a vertex");
    let paths: Vec<AtomicF64> = (0..vertex_count).map(|_| AtomicF64::new(0.0)).collect();
    let visited: Vec<AtomicBool> = (0..vertex_count).map(|_| AtomicBool::new(false)).collect();
    paths[source as usize].store(1.0);
    visited[source as usize].store(true, Ordering::Relaxed);
    let levels = count_paths(graph, source, &paths, &visited);

    // Backward: dependency'(v) = 1/σ(v) + Σ over children w of
    // dependency'(w); the score is σ(v)·dependency'(v) − 1.
    let inverse_paths: Vec<f64> = paths
        .iter()
        .map(|count| {
            let count = count.load();
            if count == 0.0 {
                0.0
            } else {
                1.0 / count
            }
        })
        .collect();
    let dependencies: Vec<AtomicF64> = (0..vertex_count).map(|_| AtomicF64::new(0.0)).collect();
    visited
        .iter()
        .for_each(|flag| flag.store(false, Ordering::Relaxed));
    let settle = |level: &Frontier| {
        vertex_map(level, |vertex| {
            let vertex = vertex as usize;
            visited[vertex].store(true, Ordering::Relaxed);
            dependencies[vertex].fetch_add(inverse_paths[vertex]);
        })
    };
    let function = AddDependencies {
        dependencies: &dependencies,
        visited: &visited,
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
            if vertex == source as usize || inverse_paths[vertex] == 0.0 {
                0.0
            } else {
                (dependencies[vertex].load() - inverse_paths[vertex]) / inverse_paths[vertex]
            }
        })
        .collect();
    BcResult { scores }
}

/// The forward pass; returns the frontier of every level, source first.
fn count_paths(
    graph: &Graph,
    source: Vertex,
    paths: &[AtomicF64],
    visited: &[AtomicBool],
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
        vertex_map(&next, |vertex| {
            visited[vertex as usize].store(true, Ordering::Relaxed)
        });
        levels.push(next);
        debug_assert!(levels.len() <= graph.vertex_count());
    }
}
