//! PageRank by pulling along in-edges (Jacobi iteration), as Ligra's
//! PageRank: each edge adds its source's rank over its source's degree.
//!
//! Each vertex sums its in-neighbours' contributions in neighbour order,
//! so the result is the same bit for bit whatever the thread count or the
//! memory the graph lives in: backends can be compared exactly.

use crate::apps::F64Word;
use crate::csr::Graph;
use crate::{PlacementError, Vertex};
use rayon::prelude::*;
use std::sync::atomic::AtomicU64;

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

pub fn pagerank(graph: &Graph, options: PageRankOptions) -> Result<PageRankResult, PlacementError> {
    let vertex_count = graph.vertex_count();
    if vertex_count == 0 {
        return Ok(PageRankResult {
            ranks: Vec::new(),
            iterations: 0,
            last_change: 0.0,
        });
    }
    let base = (1.0 - options.damping) / vertex_count as f64;
    let initial = (1.0 / vertex_count as f64).to_bits();
    let mut ranks = graph.values64("pr ranks", |_| initial)?;
    let mut next = graph.values64("pr next ranks", |_| 0)?;
    // Plain slices, read once: the per-edge degree lookups below must not
    // go through the array's storage each time.
    let ((out_offsets, _), _) = graph.arrays();
    let out_degree =
        |vertex: Vertex| out_offsets[vertex as usize + 1] - out_offsets[vertex as usize];
    let shares_values = match options.contributions {
        Contributions::PerVertex => Some(graph.values64("pr shares", |_| 0)?),
        Contributions::PerEdge => None,
    };
    // Plain slices, taken once (the ranks' each iteration, as the two
    // arrays swap): indexing an `Array` goes through its storage every
    // time, which doubled this kernel's time when it did.
    let shares: Option<&[AtomicU64]> = shares_values.as_deref();
    let mut iterations = 0;
    let mut last_change = f64::INFINITY;
    while iterations < options.max_iterations {
        let (current, following): (&[AtomicU64], &[AtomicU64]) = (&ranks, &next);
        if let Some(shares) = shares {
            shares.par_iter().enumerate().for_each(|(vertex, share)| {
                let degree = out_degree(vertex as Vertex);
                share.store_f64(if degree == 0 {
                    0.0
                } else {
                    current[vertex].load_f64() / degree as f64
                });
            });
        }
        // Summed in vertex order, so the stopping point is deterministic too.
        let changes: Vec<f64> = following
            .par_iter()
            .enumerate()
            .with_min_len(256)
            .map(|(vertex, rank)| {
                // A source on an in-edge has an out-edge: its degree is
                // not 0.
                let sources = graph.in_neighbours(vertex as Vertex).iter();
                let incoming: f64 = match shares {
                    None => sources
                        .map(|&source| {
                            current[source as usize].load_f64() / out_degree(source) as f64
                        })
                        .sum(),
                    Some(shares) => sources
                        .map(|&source| shares[source as usize].load_f64())
                        .sum(),
                };
                let updated = base + options.damping * incoming;
                rank.store_f64(updated);
                (updated - current[vertex].load_f64()).abs()
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
    Ok(PageRankResult {
        ranks: ranks.iter().map(F64Word::load_f64).collect(),
        iterations,
        last_change,
    })
}
