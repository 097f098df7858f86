//! PageRank by pulling along in-edges (Jacobi iteration).
//!
//! Each vertex sums its in-neighbours' contributions in neighbour order,
//! so the result is the same bit for bit whatever the thread count or the
//! memory the graph lives in: backends can be compared exactly.

use crate::csr::Graph;
use crate::Vertex;
use rayon::prelude::*;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PageRankOptions {
    pub damping: f64,
    /// Stop when the L1 change of an iteration falls below this.
    pub tolerance: Option<f64>,
    pub max_iterations: u32,
}

impl Default for PageRankOptions {
    /// GAPBS's defaults: damping 0.85, tolerance 1e-4, at most 20 iterations.
    fn default() -> PageRankOptions {
        PageRankOptions {
            damping: 0.85,
            tolerance: Some(1e-4),
            max_iterations: 20,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PageRankResult {
    pub ranks: Vec<f64>,
    pub iterations: u32,
    /// The L1 change of the last iteration.
    pub last_change: f64,
}

pub fn pagerank(graph: &Graph, options: PageRankOptions) -> PageRankResult {
    let vertex_count = graph.vertex_count();
    if vertex_count == 0 {
        return PageRankResult {
            ranks: Vec::new(),
            iterations: 0,
            last_change: 0.0,
        };
    }
    let base = (1.0 - options.damping) / vertex_count as f64;
    let mut ranks = vec![1.0 / vertex_count as f64; vertex_count];
    let mut contributions = vec![0.0; vertex_count];
    let mut iterations = 0;
    let mut last_change = f64::INFINITY;
    while iterations < options.max_iterations {
        contributions
            .par_iter_mut()
            .enumerate()
            .for_each(|(vertex, contribution)| {
                let degree = graph.out_degree(vertex as Vertex);
                *contribution = if degree == 0 {
                    0.0
                } else {
                    ranks[vertex] / degree as f64
                };
            });
        // Summed in vertex order, so the stopping point is deterministic too.
        let changes: Vec<f64> = ranks
            .par_iter_mut()
            .enumerate()
            .with_min_len(256)
            .map(|(vertex, rank)| {
                let incoming: f64 = graph
                    .in_neighbours(vertex as Vertex)
                    .iter()
                    .map(|&source| contributions[source as usize])
                    .sum();
                let next = base + options.damping * incoming;
                let change = (next - *rank).abs();
                *rank = next;
                change
            })
            .collect();
        last_change = changes.iter().sum();
        iterations += 1;
        if options
            .tolerance
            .is_some_and(|tolerance| last_change < tolerance)
        {
            break;
        }
    }
    PageRankResult {
        ranks,
        iterations,
        last_change,
    }
}
