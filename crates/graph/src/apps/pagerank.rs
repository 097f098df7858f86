//! PageRank by pulling along in-edges (Jacobi iteration), as Ligra's
//! PageRank: each edge adds its source's rank over its source's degree.
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
    /// Where each source's share comes from.
    pub contributions: Contributions,
}

/// Two ways to the same sums, bit for bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contributions {
    /// Per edge, the source's rank over its degree, read from the graph's
    /// vertex data, as Ligra's PR_F does: vertex data is touched at
    /// random, once per edge (what SODA's static cache serves).
    PerEdge,
    /// Per vertex, once per iteration, into a local array the edges then
    /// read, as GAPBS's reference PageRank does: vertex data is read in
    /// order, once per vertex.
    PerVertex,
}

impl Default for PageRankOptions {
    /// GAPBS's defaults: damping 0.85, tolerance 1e-4, at most 20 iterations.
    fn default() -> PageRankOptions {
        PageRankOptions {
            damping: 0.85,
            tolerance: Some(1e-4),
            max_iterations: 20,
            contributions: Contributions::PerEdge,
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
    let mut next = vec![0.0; vertex_count];
    // Plain slices, read once: the per-edge degree lookups below must not
    // go through the array's storage each time.
    let ((out_offsets, _), _) = graph.arrays();
    let out_degree =
        |vertex: Vertex| out_offsets[vertex as usize + 1] - out_offsets[vertex as usize];
    let mut shares = match options.contributions {
        Contributions::PerVertex => vec![0.0; vertex_count],
        Contributions::PerEdge => Vec::new(),
    };
    let mut iterations = 0;
    let mut last_change = f64::INFINITY;
    while iterations < options.max_iterations {
        if options.contributions == Contributions::PerVertex {
            shares
                .par_iter_mut()
                .enumerate()
                .for_each(|(vertex, share)| {
                    let degree = out_degree(vertex as Vertex);
                    *share = if degree == 0 {
                        0.0
                    } else {
                        ranks[vertex] / degree as f64
                    };
                });
        }
        // Summed in vertex order, so the stopping point is deterministic too.
        let changes: Vec<f64> = next
            .par_iter_mut()
            .enumerate()
            .with_min_len(256)
            .map(|(vertex, rank)| {
                // A source on an in-edge has an out-edge: its degree is
                // not 0.
                let sources = graph.in_neighbours(vertex as Vertex).iter();
                let incoming: f64 = match options.contributions {
                    Contributions::PerEdge => sources
                        .map(|&source| ranks[source as usize] / out_degree(source) as f64)
                        .sum(),
                    Contributions::PerVertex => {
                        sources.map(|&source| shares[source as usize]).sum()
                    }
                };
                *rank = base + options.damping * incoming;
                (*rank - ranks[vertex]).abs()
            })
            .collect();
        std::mem::swap(&mut ranks, &mut next);
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
