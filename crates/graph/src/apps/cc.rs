//! Connected components by Afforest (Sutton et al., IPDPS'18, GAPBS's CC):
//! link each vertex to its first two neighbours, compress, find the
//! component most vertices already joined, and link only the remaining
//! vertices along their other edges. Links always point from the larger
//! vertex to the smaller, so a component's root, and label, is its
//! smallest vertex: the result does not depend on thread timing. A
//! directed graph's components are its weak components.

use crate::apps::read_words32;
use crate::csr::Graph;
use crate::{PlacementError, Vertex};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

/// Neighbours per vertex linked before sampling (GAPBS's default).
const NEIGHBOUR_ROUNDS: usize = 2;
/// Labels sampled to find the largest intermediate component.
const SAMPLES: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CcResult {
    /// Each vertex's component, named by its smallest vertex.
    pub labels: Vec<Vertex>,
}

impl CcResult {
    pub fn component_count(&self) -> usize {
        self.labels
            .iter()
            .enumerate()
            .filter(|&(vertex, &label)| vertex as Vertex == label)
            .count()
    }
}

pub fn cc(graph: &Graph) -> Result<CcResult, PlacementError> {
    let vertex_count = graph.vertex_count();
    let labels_values = graph.values32("cc labels", |vertex| vertex as Vertex)?;
    // A plain slice, taken once: indexing an `Array` goes through its
    // storage every time.
    let labels: &[AtomicU32] = &labels_values;
    for round in 0..NEIGHBOUR_ROUNDS {
        (0..vertex_count).into_par_iter().for_each(|vertex| {
            if let Some(&neighbour) = graph.out_neighbours(vertex as Vertex).get(round) {
                link(labels, vertex as Vertex, neighbour);
            }
        });
        compress(labels);
    }
    let largest = most_frequent_label(labels);
    (0..vertex_count)
        .into_par_iter()
        .with_min_len(64)
        .for_each(|vertex| {
            let vertex = vertex as Vertex;
            if labels[vertex as usize].load(Ordering::Relaxed) == largest {
                return;
            }
            let rest = graph.out_neighbours(vertex).iter().skip(NEIGHBOUR_ROUNDS);
            for &neighbour in rest {
                link(labels, vertex, neighbour);
            }
            if graph.is_directed() {
                for &neighbour in graph.in_neighbours(vertex) {
                    link(labels, vertex, neighbour);
                }
            }
        });
    compress(labels);
    Ok(CcResult {
        labels: read_words32(labels),
    })
}

/// Joins the trees of `first` and `second`, pointing the larger root at
/// the smaller.
fn link(labels: &[AtomicU32], first: Vertex, second: Vertex) {
    let label = |vertex: Vertex| labels[vertex as usize].load(Ordering::Relaxed);
    let mut one = label(first);
    let mut other = label(second);
    // Each pass either links or moves a root pointer strictly lower, so
    // it ends within the tree height.
    while one != other {
        let (high, low) = (one.max(other), one.min(other));
        let high_parent = label(high);
        if high_parent == low {
            return;
        }
        if high_parent == high
            && labels[high as usize]
                .compare_exchange(high, low, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return;
        }
        one = label(label(high));
        other = label(low);
    }
}

/// Points every vertex at its root.
fn compress(labels: &[AtomicU32]) {
    labels.par_iter().for_each(|slot| {
        let mut label = slot.load(Ordering::Relaxed);
        loop {
            let parent = labels[label as usize].load(Ordering::Relaxed);
            if parent == label {
                break;
            }
            label = parent;
        }
        slot.store(label, Ordering::Relaxed);
    });
}

fn most_frequent_label(labels: &[AtomicU32]) -> Vertex {
    if labels.is_empty() {
        return crate::NO_VERTEX;
    }
    let mut random = ChaCha8Rng::seed_from_u64(labels.len() as u64);
    let mut counts: HashMap<Vertex, usize> = HashMap::new();
    for _ in 0..SAMPLES {
        let vertex = random.gen_range(0..labels.len());
        *counts
            .entry(labels[vertex].load(Ordering::Relaxed))
            .or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|&(label, count)| (count, std::cmp::Reverse(label)))
        .map(|(label, _)| label)
        .expect("at least one sample")
}
