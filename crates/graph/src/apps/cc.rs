//! Connected components by label propagation (Ligra's Components): every
//! vertex starts with its own id and takes the smallest id it hears of.
//! A component's label is its smallest vertex, so the result does not
//! depend on thread timing. A directed graph's components are its weak
//! components: labels travel along edges both ways.

use crate::csr::{Direction, Graph};
use crate::engine::{edge_map, vertex_map, EdgeFunction};
use crate::frontier::Frontier;
use crate::Vertex;
use std::sync::atomic::{AtomicU32, Ordering};

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

struct TakeSmaller<'a> {
    labels: &'a [AtomicU32],
    previous: &'a [AtomicU32],
}

impl EdgeFunction for TakeSmaller<'_> {
    fn update(&self, source: Vertex, destination: Vertex) -> bool {
        let offered = self.labels[source as usize].load(Ordering::Relaxed);
        let label = &self.labels[destination as usize];
        let current = label.load(Ordering::Relaxed);
        if offered >= current {
            return false;
        }
        label.store(offered, Ordering::Relaxed);
        // Joins the next frontier once: when first lowered this round.
        current == self.previous[destination as usize].load(Ordering::Relaxed)
    }

    fn update_atomic(&self, source: Vertex, destination: Vertex) -> bool {
        let offered = self.labels[source as usize].load(Ordering::Relaxed);
        let before = self.labels[destination as usize].fetch_min(offered, Ordering::Relaxed);
        offered < before && before == self.previous[destination as usize].load(Ordering::Relaxed)
    }

    fn condition(&self, _destination: Vertex) -> bool {
        true
    }
}

pub fn cc(graph: &Graph) -> CcResult {
    let vertex_count = graph.vertex_count();
    let labels: Vec<AtomicU32> = (0..vertex_count as Vertex).map(AtomicU32::new).collect();
    let previous: Vec<AtomicU32> = (0..vertex_count as Vertex).map(AtomicU32::new).collect();
    let function = TakeSmaller {
        labels: &labels,
        previous: &previous,
    };
    let mut frontier = Frontier::all(vertex_count);
    // Labels only fall and each vertex's can fall at most n times; in
    // practice the loop runs about the graph's diameter of rounds.
    while !frontier.is_empty() {
        let forward = edge_map(graph, &frontier, &function, Direction::Forward);
        frontier = if graph.is_directed() {
            let backward = edge_map(graph, &frontier, &function, Direction::Reverse);
            union(forward, backward, vertex_count)
        } else {
            forward
        };
        vertex_map(&frontier, |vertex| {
            let vertex = vertex as usize;
            previous[vertex].store(labels[vertex].load(Ordering::Relaxed), Ordering::Relaxed);
        });
    }
    CcResult {
        labels: labels.into_iter().map(AtomicU32::into_inner).collect(),
    }
}

fn union(first: Frontier, second: Frontier, vertex_count: usize) -> Frontier {
    let mut members = first.to_members(vertex_count);
    for vertex in second.to_vertices() {
        members[vertex as usize] = true;
    }
    Frontier::from_members(members)
}
