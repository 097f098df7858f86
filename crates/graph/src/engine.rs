//! Ligra's two operators.
//!
//! [`edge_map`] applies an [`EdgeFunction`] to the edges leaving a
//! frontier and returns the vertices it changed. It pushes from the
//! frontier's vertices when the frontier and its edges are few (sparse),
//! and otherwise pulls into every vertex that still wants updates
//! (dense), which reads each edge once and needs no atomics on the
//! destination. [`vertex_map`] applies a function to a frontier's vertices.

use crate::csr::{Direction, Graph};
use crate::frontier::Frontier;
use crate::Vertex;
use rayon::prelude::*;

/// Ligra's switch point: go dense when the frontier's vertices plus their
/// edges pass this fraction of all edges.
pub const DENSE_THRESHOLD_DIVISOR: usize = 20;

/// What `edge_map` does on each edge (source → destination).
pub trait EdgeFunction: Sync {
    /// Pull step: only the thread that owns `destination` calls this, so
    /// it need not be atomic against other updates of `destination`.
    fn update(&self, source: Vertex, destination: Vertex) -> bool;
    /// Push step: several threads may update `destination` at once.
    fn update_atomic(&self, source: Vertex, destination: Vertex) -> bool;
    /// Whether `destination` still wants updates; a pull stops early when
    /// it turns false.
    fn condition(&self, destination: Vertex) -> bool;
}

impl Direction {
    pub fn reversed(self) -> Direction {
        match self {
            Direction::Forward => Direction::Reverse,
            Direction::Reverse => Direction::Forward,
        }
    }
}

/// Applies `function` along `direction` from `frontier`; returns the
/// destinations for which an update returned true.
pub fn edge_map<F: EdgeFunction>(
    graph: &Graph,
    frontier: &Frontier,
    function: &F,
    direction: Direction,
) -> Frontier {
    if frontier.is_empty() {
        return Frontier::empty();
    }
    if is_dense_worth_it(graph, frontier, direction) {
        let members = frontier.to_members(graph.vertex_count());
        edge_map_dense(graph, &members, function, direction)
    } else {
        edge_map_sparse(graph, &frontier.to_vertices(), function, direction)
    }
}

fn is_dense_worth_it(graph: &Graph, frontier: &Frontier, direction: Direction) -> bool {
    let threshold = graph.edge_count() / DENSE_THRESHOLD_DIVISOR;
    match frontier {
        Frontier::Dense { count, .. } if *count > threshold => true,
        Frontier::Dense { members, count } => {
            let degrees: usize = members
                .par_iter()
                .enumerate()
                .filter(|(_, &member)| member)
                .map(|(vertex, _)| graph.degree(vertex as Vertex, direction))
                .sum();
            count + degrees > threshold
        }
        Frontier::Sparse(vertices) => {
            let degrees: usize = vertices
                .par_iter()
                .map(|&vertex| graph.degree(vertex, direction))
                .sum();
            vertices.len() + degrees > threshold
        }
    }
}

fn edge_map_sparse<F: EdgeFunction>(
    graph: &Graph,
    vertices: &[Vertex],
    function: &F,
    direction: Direction,
) -> Frontier {
    let next: Vec<Vertex> = vertices
        .par_iter()
        .flat_map_iter(|&source| {
            graph
                .neighbours(source, direction)
                .iter()
                .copied()
                .filter(move |&destination| {
                    function.condition(destination) && function.update_atomic(source, destination)
                })
        })
        .collect();
    Frontier::Sparse(next)
}

fn edge_map_dense<F: EdgeFunction>(
    graph: &Graph,
    members: &[bool],
    function: &F,
    direction: Direction,
) -> Frontier {
    // A destination's sources along `direction` are its neighbours the
    // other way.
    let pull = direction.reversed();
    let next: Vec<bool> = (0..graph.vertex_count())
        .into_par_iter()
        .with_min_len(256)
        .map(|destination| {
            let destination = destination as Vertex;
            let mut changed = false;
            for &source in graph.neighbours(destination, pull) {
                if !function.condition(destination) {
                    break;
                }
                if members[source as usize] && function.update(source, destination) {
                    changed = true;
                }
            }
            changed
        })
        .collect();
    Frontier::from_members(next)
}

/// Calls `function` on every vertex of `frontier`, in parallel.
pub fn vertex_map(frontier: &Frontier, function: impl Fn(Vertex) + Sync) {
    match frontier {
        Frontier::Sparse(vertices) => vertices.par_iter().for_each(|&vertex| function(vertex)),
        Frontier::Dense { members, .. } => members
            .par_iter()
            .enumerate()
            .filter(|(_, &member)| member)
            .for_each(|(vertex, _)| function(vertex as Vertex)),
    }
}

/// Runs `work` on a pool of `threads` threads (every kernel inside uses
/// it), so a benchmark's thread count is the kernels' thread count.
pub fn with_threads<R: Send>(threads: usize, work: impl FnOnce() -> R + Send) -> R {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .thread_name(|index| format!("graph-{index}"))
        .build()
        .expect("a thread pool of a few threads can be built");
    pool.install(work)
}
