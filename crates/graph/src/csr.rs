//! Compressed sparse rows: per vertex, an offset into one neighbour array.
//!
//! A directed graph keeps its in-edges too (pull traversal and reverse
//! passes need them); an undirected graph stores each edge both ways and
//! its in-edges are its out-edges.

use crate::array::{Array, LocalPlacement, Placement, PlacementError, ValuePlacement};
use crate::Vertex;
use rayon::prelude::*;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// What every per-vertex value array's name starts with, so a placement
/// can tell them from the graph's own arrays.
pub const VALUES_PREFIX: &str = "values: ";

fn values_name(name: &str) -> String {
    format!("{VALUES_PREFIX}{name}")
}

/// Sets every value, in parallel: the initialisation Ligra's kernels do.
fn fill<W: Send + Sync>(values: &[W], set: impl Fn(&W, usize) + Sync) {
    values
        .par_iter()
        .enumerate()
        .for_each(|(vertex, value)| set(value, vertex));
}

/// Where a graph's applications keep their per-vertex values.
#[derive(Clone)]
struct ValuesHome(Arc<dyn ValuePlacement>);

impl std::fmt::Debug for ValuesHome {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("ValuesHome")
    }
}

impl Default for ValuesHome {
    fn default() -> ValuesHome {
        ValuesHome(Arc::new(LocalPlacement))
    }
}

/// Which edges a traversal follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From a vertex along its out-edges.
    Forward,
    /// From a vertex along its in-edges.
    Reverse,
}

/// One side's CSR: offsets and neighbours.
pub type CsrSlices<'a> = (&'a [u64], &'a [Vertex]);

#[derive(Debug, Clone)]
struct Adjacency {
    offsets: Array<u64>,
    neighbours: Array<Vertex>,
}

impl Adjacency {
    fn neighbours(&self, vertex: Vertex) -> &[Vertex] {
        let index = vertex as usize;
        let start = self.offsets[index] as usize;
        let end = self.offsets[index + 1] as usize;
        &self.neighbours[start..end]
    }

    fn slices(&self) -> CsrSlices<'_> {
        (&self.offsets, &self.neighbours)
    }

    fn degree(&self, vertex: Vertex) -> usize {
        let index = vertex as usize;
        (self.offsets[index + 1] - self.offsets[index]) as usize
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GraphError {
    #[error("edge ({source_vertex}, {destination}) names a vertex at or past the vertex count {vertex_count}")]
    VertexOutOfRange {
        source_vertex: u64,
        destination: u64,
        vertex_count: u64,
    },
    #[error("{vertex_count} vertices do not fit 32-bit vertex ids")]
    TooManyVertices { vertex_count: u64 },
    #[error("offsets are not a valid CSR: {reason}")]
    BadOffsets { reason: String },
    #[error("the graph needs an array of {bytes} bytes, more than this machine can allocate")]
    TooLarge { bytes: u64 },
    #[error("an undirected graph must list each edge both ways, but vertex {vertex}'s neighbours differ from the vertices that list it")]
    NotSymmetric { vertex: u64 },
    #[error("a directed graph's in-edges must be its out-edges reversed, but vertex {vertex}'s in-neighbours differ from the vertices whose out-edges name it")]
    InEdgesNotTranspose { vertex: u64 },
}

#[derive(Debug, Clone)]
pub struct Graph {
    vertex_count: usize,
    directed: bool,
    outgoing: Adjacency,
    /// `None` for an undirected graph, whose in-edges are its out-edges.
    incoming: Option<Adjacency>,
    values: ValuesHome,
}

impl Graph {
    /// Builds from an edge list: self loops and duplicate edges dropped
    /// (as GAPBS's builder does), each neighbour list sorted. An
    /// undirected graph stores every edge in both directions.
    pub fn from_edges(
        vertex_count: usize,
        edges: &[(Vertex, Vertex)],
        directed: bool,
    ) -> Result<Graph, GraphError> {
        check_vertex_count(vertex_count as u64)?;
        if let Some(&(source, destination)) = edges
            .iter()
            .find(|(s, d)| *s as usize >= vertex_count || *d as usize >= vertex_count)
        {
            return Err(GraphError::VertexOutOfRange {
                source_vertex: source.into(),
                destination: destination.into(),
                vertex_count: vertex_count as u64,
            });
        }
        let outgoing = if directed {
            build_adjacency(vertex_count, edges.iter().copied())?
        } else {
            let both_ways = edges.iter().flat_map(|&(s, d)| [(s, d), (d, s)]);
            build_adjacency(vertex_count, both_ways)?
        };
        let incoming = directed
            .then(|| build_adjacency(vertex_count, edges.iter().map(|&(s, d)| (d, s))))
            .transpose()?;
        Ok(Graph {
            vertex_count,
            directed,
            outgoing: outgoing.into_arrays(),
            incoming: incoming.map(Built::into_arrays),
            values: ValuesHome::default(),
        })
    }

    /// Takes ready CSR arrays (a `.sg` file's), checking that the offsets
    /// start at 0, never decrease and end at the neighbour count, that
    /// every neighbour is a vertex, and that the in-edges (or, undirected,
    /// the out-edges themselves) are the out-edges reversed.
    pub fn from_csr(
        out_offsets: Vec<u64>,
        out_neighbours: Vec<Vertex>,
        incoming: Option<(Vec<u64>, Vec<Vertex>)>,
    ) -> Result<Graph, GraphError> {
        let vertex_count = out_offsets.len().saturating_sub(1);
        check_vertex_count(vertex_count as u64)?;
        check_csr(&out_offsets, &out_neighbours, vertex_count)?;
        if let Some((offsets, neighbours)) = &incoming {
            if offsets.len() != out_offsets.len() {
                return Err(bad_offsets("in-offsets and out-offsets differ in length"));
            }
            check_csr(offsets, neighbours, vertex_count)?;
        }
        // The kernels pull along in-edges and push along out-edges: two
        // sides that disagree give answers that hang on which way a step
        // went (and PageRank divides by an out-degree of 0).
        let out_lists = (&out_offsets[..], &out_neighbours[..]);
        let in_lists = incoming
            .as_ref()
            .map_or(out_lists, |(offsets, neighbours)| {
                (&offsets[..], &neighbours[..])
            });
        if let Some(vertex) = first_not_transpose(out_lists, in_lists, vertex_count) {
            let vertex = vertex as u64;
            return Err(match incoming {
                Some(_) => GraphError::InEdgesNotTranspose { vertex },
                None => GraphError::NotSymmetric { vertex },
            });
        }
        let directed = incoming.is_some();
        Ok(Graph {
            vertex_count,
            directed,
            outgoing: Adjacency {
                offsets: out_offsets.into(),
                neighbours: out_neighbours.into(),
            },
            incoming: incoming.map(|(offsets, neighbours)| Adjacency {
                offsets: offsets.into(),
                neighbours: neighbours.into(),
            }),
            values: ValuesHome::default(),
        })
    }

    /// Moves every array to where `placement` puts it.
    pub fn place(&self, placement: &dyn Placement) -> Result<Graph, PlacementError> {
        let place = |adjacency: &Adjacency, side: &str| -> Result<Adjacency, PlacementError> {
            Ok(Adjacency {
                offsets: placement
                    .place_offsets(&format!("{side} offsets"), adjacency.offsets.to_vec())?,
                neighbours: placement
                    .place_vertices(&format!("{side} neighbours"), adjacency.neighbours.to_vec())?,
            })
        };
        Ok(Graph {
            vertex_count: self.vertex_count,
            directed: self.directed,
            outgoing: place(&self.outgoing, "out")?,
            incoming: match &self.incoming {
                Some(incoming) => Some(place(incoming, "in")?),
                None => None,
            },
            values: placement.values().map(ValuesHome).unwrap_or_default(),
        })
    }

    /// A 32-bit value per vertex for an application, where the graph's
    /// placement keeps values, each set to `initial(vertex)`.
    pub fn values32(
        &self,
        name: &str,
        initial: impl Fn(usize) -> u32 + Sync,
    ) -> Result<Array<AtomicU32>, PlacementError> {
        let values = self
            .values
            .0
            .place_words32(&values_name(name), self.vertex_count)?;
        fill(&values, |value, vertex| {
            value.store(initial(vertex), Ordering::Relaxed)
        });
        Ok(values)
    }

    /// A 64-bit value per vertex, as [`Graph::values32`].
    pub fn values64(
        &self,
        name: &str,
        initial: impl Fn(usize) -> u64 + Sync,
    ) -> Result<Array<AtomicU64>, PlacementError> {
        let values = self
            .values
            .0
            .place_words64(&values_name(name), self.vertex_count)?;
        fill(&values, |value, vertex| {
            value.store(initial(vertex), Ordering::Relaxed)
        });
        Ok(values)
    }

    pub fn vertex_count(&self) -> usize {
        self.vertex_count
    }

    /// Stored edges: each undirected edge counts twice, as in Ligra.
    pub fn edge_count(&self) -> usize {
        self.outgoing.neighbours.len()
    }

    pub fn is_directed(&self) -> bool {
        self.directed
    }

    pub fn neighbours(&self, vertex: Vertex, direction: Direction) -> &[Vertex] {
        self.adjacency(direction).neighbours(vertex)
    }

    pub fn degree(&self, vertex: Vertex, direction: Direction) -> usize {
        self.adjacency(direction).degree(vertex)
    }

    pub fn out_neighbours(&self, vertex: Vertex) -> &[Vertex] {
        self.outgoing.neighbours(vertex)
    }

    pub fn in_neighbours(&self, vertex: Vertex) -> &[Vertex] {
        self.neighbours(vertex, Direction::Reverse)
    }

    pub fn out_degree(&self, vertex: Vertex) -> usize {
        self.outgoing.degree(vertex)
    }

    /// The first vertex with an out-edge: a source whose search goes
    /// somewhere. `None` for a graph without edges.
    pub fn first_vertex_with_out_edges(&self) -> Option<Vertex> {
        (0..self.vertex_count as Vertex).find(|&vertex| self.out_degree(vertex) > 0)
    }

    /// Bytes of the edge arrays and of the offset arrays: what SODA's
    /// benchmark sizes its buffers and caches against.
    pub fn footprint_bytes(&self) -> (u64, u64) {
        let sides = [Some(&self.outgoing), self.incoming.as_ref()];
        let mut edge_bytes = 0;
        let mut offset_bytes = 0;
        for adjacency in sides.into_iter().flatten() {
            edge_bytes += std::mem::size_of_val(&*adjacency.neighbours) as u64;
            offset_bytes += std::mem::size_of_val(&*adjacency.offsets) as u64;
        }
        (edge_bytes, offset_bytes)
    }

    /// The CSR arrays, out-edges first, then in-edges for a directed graph.
    pub fn arrays(&self) -> (CsrSlices<'_>, Option<CsrSlices<'_>>) {
        (
            self.outgoing.slices(),
            self.incoming.as_ref().map(Adjacency::slices),
        )
    }

    fn adjacency(&self, direction: Direction) -> &Adjacency {
        match (direction, &self.incoming) {
            (Direction::Reverse, Some(incoming)) => incoming,
            _ => &self.outgoing,
        }
    }
}

fn check_vertex_count(vertex_count: u64) -> Result<(), GraphError> {
    // NO_VERTEX (u32::MAX) marks "none", so it cannot be a vertex.
    if vertex_count >= u64::from(u32::MAX) {
        return Err(GraphError::TooManyVertices { vertex_count });
    }
    Ok(())
}

fn bad_offsets(reason: &str) -> GraphError {
    GraphError::BadOffsets {
        reason: reason.into(),
    }
}

fn check_csr(
    offsets: &[u64],
    neighbours: &[Vertex],
    vertex_count: usize,
) -> Result<(), GraphError> {
    if offsets.first() != Some(&0) {
        return Err(bad_offsets("the first offset must be 0"));
    }
    if offsets.windows(2).any(|pair| pair[0] > pair[1]) {
        return Err(bad_offsets("offsets decrease"));
    }
    if offsets.last().copied() != Some(neighbours.len() as u64) {
        return Err(bad_offsets("the last offset is not the neighbour count"));
    }
    if let Some(&bad) = neighbours.iter().find(|&&v| v as usize >= vertex_count) {
        return Err(GraphError::VertexOutOfRange {
            source_vertex: u64::MAX,
            destination: bad.into(),
            vertex_count: vertex_count as u64,
        });
    }
    Ok(())
}

/// An undirected graph's in-edges are its out-edges, so each vertex's list
/// must hold the same vertices, as often, as the lists that name it: the
/// transpose, built by counting (its lists come out sorted), against each
/// list sorted. A vertex-centric kernel that pulls would otherwise see
/// other edges than one that pushes.
/// One side of a graph's CSR: offsets and neighbours.
type Lists<'a> = (&'a [u64], &'a [Vertex]);

/// The first vertex whose `incoming` list is not, as a multiset, the
/// vertices whose `outgoing` lists name it: the in-edges must be the
/// out-edges' transpose (an undirected graph's lists are their own).
fn first_not_transpose(
    (out_offsets, out_neighbours): Lists<'_>,
    (in_offsets, in_neighbours): Lists<'_>,
    vertex_count: usize,
) -> Option<usize> {
    let list = |at: &[u64], vertex: usize| at[vertex] as usize..at[vertex + 1] as usize;
    let mut transpose_offsets = vec![0u64; vertex_count + 1];
    for &neighbour in out_neighbours {
        transpose_offsets[neighbour as usize + 1] += 1;
    }
    for vertex in 0..vertex_count {
        transpose_offsets[vertex + 1] += transpose_offsets[vertex];
    }
    let mut cursor: Vec<u64> = transpose_offsets[..vertex_count].to_vec();
    let mut transpose = vec![0 as Vertex; out_neighbours.len()];
    for vertex in 0..vertex_count {
        for &neighbour in &out_neighbours[list(out_offsets, vertex)] {
            let slot = &mut cursor[neighbour as usize];
            transpose[*slot as usize] = vertex as Vertex;
            *slot += 1;
        }
    }
    // Filled in vertex order, each transposed list is sorted.
    let mut sorted = Vec::new();
    (0..vertex_count).find(|&vertex| {
        sorted.clear();
        sorted.extend_from_slice(&in_neighbours[list(in_offsets, vertex)]);
        sorted.sort_unstable();
        sorted[..] != transpose[list(&transpose_offsets, vertex)]
    })
}

struct Built {
    offsets: Vec<u64>,
    neighbours: Vec<Vertex>,
}

impl Built {
    fn into_arrays(self) -> Adjacency {
        Adjacency {
            offsets: self.offsets.into(),
            neighbours: self.neighbours.into(),
        }
    }
}

/// A vector of `length` zeros, or `TooLarge` where the allocator refuses
/// the reservation: a sparse id or a big count can ask for more than the
/// address space, and that is an error to report, not an abort. (Linux
/// overcommits, so a large request it can map passes here, and filling
/// it may still run the machine out of memory: the loaders' vertex limit
/// is what bounds that.)
fn zeroed<T: Clone + Default>(length: usize) -> Result<Vec<T>, GraphError> {
    let mut vector = Vec::new();
    vector
        .try_reserve_exact(length)
        .map_err(|_| GraphError::TooLarge {
            bytes: (length as u64).saturating_mul(std::mem::size_of::<T>() as u64),
        })?;
    vector.resize(length, T::default());
    Ok(vector)
}

/// Counting sort by source, then each list sorted and deduplicated in
/// parallel, then compacted.
fn build_adjacency(
    vertex_count: usize,
    edges: impl Iterator<Item = (Vertex, Vertex)> + Clone,
) -> Result<Built, GraphError> {
    let mut counts: Vec<u64> = zeroed(vertex_count + 1)?;
    for (source, _) in edges.clone() {
        counts[source as usize + 1] += 1;
    }
    for index in 1..counts.len() {
        counts[index] += counts[index - 1];
    }
    let mut cursor = counts.clone();
    let mut neighbours: Vec<Vertex> = zeroed(counts[vertex_count] as usize)?;
    for (source, destination) in edges {
        let slot = &mut cursor[source as usize];
        neighbours[*slot as usize] = destination;
        *slot += 1;
    }
    let mut lists = split_lists(&mut neighbours, &counts);
    let kept: Vec<usize> = lists
        .par_iter_mut()
        .enumerate()
        .map(|(source, list)| {
            list.sort_unstable();
            let mut write = 0;
            for read in 0..list.len() {
                let value = list[read];
                let duplicate = write > 0 && list[write - 1] == value;
                if value as usize != source && !duplicate {
                    list[write] = value;
                    write += 1;
                }
            }
            write
        })
        .collect();
    drop(lists);
    Ok(compact(neighbours, &counts, &kept))
}

fn split_lists<'a>(neighbours: &'a mut [Vertex], offsets: &[u64]) -> Vec<&'a mut [Vertex]> {
    let mut lists = Vec::with_capacity(offsets.len() - 1);
    let mut rest = neighbours;
    for pair in offsets.windows(2) {
        let (list, tail) = rest.split_at_mut((pair[1] - pair[0]) as usize);
        lists.push(list);
        rest = tail;
    }
    lists
}

fn compact(mut neighbours: Vec<Vertex>, counts: &[u64], kept: &[usize]) -> Built {
    let mut offsets = Vec::with_capacity(counts.len());
    offsets.push(0u64);
    let mut write = 0usize;
    for (source, &length) in kept.iter().enumerate() {
        let start = counts[source] as usize;
        neighbours.copy_within(start..start + length, write);
        write += length;
        offsets.push(write as u64);
    }
    neighbours.truncate(write);
    neighbours.shrink_to_fit();
    Built {
        offsets,
        neighbours,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn undirected_edges_are_stored_both_ways_without_loops_or_duplicates() {
        let graph = Graph::from_edges(4, &[(0, 1), (1, 0), (2, 2), (1, 3), (0, 1)], false).unwrap();
        assert_eq!(graph.out_neighbours(0), &[1]);
        assert_eq!(graph.out_neighbours(1), &[0, 3]);
        assert_eq!(graph.out_neighbours(2), &[] as &[Vertex]);
        assert_eq!(graph.in_neighbours(3), &[1]);
        assert_eq!(graph.edge_count(), 4);
    }

    #[test]
    fn directed_graphs_keep_in_edges() {
        let graph = Graph::from_edges(3, &[(0, 1), (2, 1)], true).unwrap();
        assert_eq!(graph.out_neighbours(1), &[] as &[Vertex]);
        assert_eq!(graph.in_neighbours(1), &[0, 2]);
    }

    #[test]
    fn out_of_range_edges_and_bad_offsets_are_refused() {
        assert!(matches!(
            Graph::from_edges(2, &[(0, 2)], false),
            Err(GraphError::VertexOutOfRange { .. })
        ));
        assert!(matches!(
            Graph::from_csr(vec![0, 2, 1], vec![1, 0], None),
            Err(GraphError::BadOffsets { .. })
        ));
        assert!(matches!(
            Graph::from_csr(vec![0, 1, 2], vec![1, 5], None),
            Err(GraphError::VertexOutOfRange { .. })
        ));
    }

    /// A one-line edge list with a sparse id and a raised vertex limit
    /// asked for 34 GB of offsets and aborted the process. A request past
    /// the address space is refused; one the kernel would overcommit is
    /// not tested (it would take the machine's memory).
    #[test]
    fn offsets_past_what_the_machine_can_allocate_are_a_typed_error() {
        assert!(matches!(
            zeroed::<u64>(usize::MAX / 8),
            Err(GraphError::TooLarge { .. })
        ));
    }

    #[test]
    fn an_undirected_csr_must_list_each_edge_both_ways_as_often() {
        let both_ways = Graph::from_csr(vec![0, 2, 3, 4], vec![2, 1, 0, 0], None);
        assert!(both_ways.is_ok());
        assert!(matches!(
            Graph::from_csr(vec![0, 1, 1], vec![1], None),
            Err(GraphError::NotSymmetric { vertex: 0 })
        ));
        // The same vertices but a multi-edge counted once the other way.
        assert!(matches!(
            Graph::from_csr(vec![0, 2, 3], vec![1, 1, 0], None),
            Err(GraphError::NotSymmetric { vertex: 0 })
        ));
    }

    /// A directed CSR's in-edges were checked only as a CSR, not against
    /// the out-edges: out-edges saying 0 -> 1 with in-edges saying 1 -> 0
    /// loaded, and PageRank pulled along an in-edge from a vertex with no
    /// out-edges (a rank of infinity).
    #[test]
    fn a_directed_csrs_in_edges_must_be_its_out_edges_reversed() {
        let reversed = Graph::from_csr(vec![0, 1, 1], vec![1], Some((vec![0, 0, 1], vec![0])));
        assert!(reversed.is_ok());
        assert!(matches!(
            Graph::from_csr(vec![0, 1, 1], vec![1], Some((vec![0, 1, 1], vec![1]))),
            Err(GraphError::InEdgesNotTranspose { vertex: 0 })
        ));
        // An in-edge too few: vertex 1 hears of only one of its two.
        assert!(matches!(
            Graph::from_csr(
                vec![0, 1, 2, 2],
                vec![1, 1],
                Some((vec![0, 0, 1, 1], vec![0]))
            ),
            Err(GraphError::InEdgesNotTranspose { vertex: 1 })
        ));
    }
}
