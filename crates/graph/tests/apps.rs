//! Every application against a brute-force reference on small random
//! graphs, directed and undirected, on one thread and on three.

use proptest::prelude::*;
use remora_graph::apps::bc::bc;
use remora_graph::apps::bfs::{bfs, UNREACHED};
use remora_graph::apps::cc::cc;
use remora_graph::apps::pagerank::{pagerank, Contributions, PageRankOptions};
use remora_graph::apps::radii::{self, radii};
use remora_graph::apps::{run, App, AppError};
use remora_graph::engine::with_threads;
use remora_graph::{Graph, Vertex, NO_VERTEX};
use std::collections::VecDeque;

/// Distances along out-edges by a plain queue.
fn distances(graph: &Graph, source: Vertex) -> Vec<u32> {
    let mut distance = vec![UNREACHED; graph.vertex_count()];
    distance[source as usize] = 0;
    let mut queue = VecDeque::from([source]);
    while let Some(vertex) = queue.pop_front() {
        for &next in graph.out_neighbours(vertex) {
            if distance[next as usize] == UNREACHED {
                distance[next as usize] = distance[vertex as usize] + 1;
                queue.push_back(next);
            }
        }
    }
    distance
}

fn find(parents: &mut [usize], vertex: usize) -> usize {
    let mut root = vertex;
    while parents[root] != root {
        root = parents[root];
    }
    parents[vertex] = root;
    root
}

/// Weak components by union-find, each named by its smallest vertex.
fn components(graph: &Graph) -> Vec<Vertex> {
    let count = graph.vertex_count();
    let mut parents: Vec<usize> = (0..count).collect();
    for source in 0..count {
        for &destination in graph.out_neighbours(source as Vertex) {
            let (a, b) = (
                find(&mut parents, source),
                find(&mut parents, destination as usize),
            );
            parents[a.max(b)] = a.min(b);
        }
    }
    (0..count)
        .map(|vertex| find(&mut parents, vertex) as Vertex)
        .collect()
}

/// PageRank by a dense matrix product, with the same stopping rule.
fn dense_pagerank(graph: &Graph, options: PageRankOptions) -> Vec<f64> {
    let count = graph.vertex_count();
    let mut matrix = vec![vec![0.0; count]; count];
    for source in 0..count as Vertex {
        let neighbours = graph.out_neighbours(source);
        for &destination in neighbours {
            matrix[destination as usize][source as usize] = 1.0 / neighbours.len() as f64;
        }
    }
    let mut ranks = vec![1.0 / count as f64; count];
    for _ in 0..options.max_iterations {
        let next: Vec<f64> = (0..count)
            .map(|row| {
                let product: f64 = (0..count)
                    .map(|column| matrix[row][column] * ranks[column])
                    .sum();
                (1.0 - options.damping) / count as f64 + options.damping * product
            })
            .collect();
        let change: f64 = next.iter().zip(&ranks).map(|(a, b)| (a - b).abs()).sum();
        ranks = next;
        if options
            .tolerance
            .is_some_and(|tolerance| change < tolerance)
        {
            break;
        }
    }
    ranks
}

/// Brandes' algorithm, sequential, from the textbook.
fn brandes(graph: &Graph, source: Vertex) -> Vec<f64> {
    let count = graph.vertex_count();
    let mut paths = vec![0.0; count];
    let mut distance = vec![i64::MAX; count];
    let mut predecessors = vec![Vec::new(); count];
    let mut order = Vec::new();
    paths[source as usize] = 1.0;
    distance[source as usize] = 0;
    let mut queue = VecDeque::from([source as usize]);
    while let Some(vertex) = queue.pop_front() {
        order.push(vertex);
        for &next in graph.out_neighbours(vertex as Vertex) {
            let next = next as usize;
            if distance[next] == i64::MAX {
                distance[next] = distance[vertex] + 1;
                queue.push_back(next);
            }
            if distance[next] == distance[vertex] + 1 {
                paths[next] += paths[vertex];
                predecessors[next].push(vertex);
            }
        }
    }
    let mut dependency = vec![0.0; count];
    for &vertex in order.iter().rev() {
        for &predecessor in &predecessors[vertex] {
            dependency[predecessor] +=
                paths[predecessor] / paths[vertex] * (1.0 + dependency[vertex]);
        }
    }
    dependency[source as usize] = 0.0;
    dependency
}

/// Graphs of up to 150 vertices: past 64, Radii samples its sources, and
/// a vertex no sampled source reaches has no radius.
fn graphs() -> impl Strategy<Value = Graph> {
    (1usize..150, any::<bool>()).prop_flat_map(|(count, directed)| {
        let vertex = 0..count as Vertex;
        proptest::collection::vec((vertex.clone(), vertex), 0..count * 3).prop_map(move |edges| {
            Graph::from_edges(count, &edges, directed).expect("edges are in range")
        })
    })
}

/// A graph and a source anywhere in it, not only vertex 0.
fn graphs_with_a_source() -> impl Strategy<Value = (Graph, Vertex)> {
    graphs().prop_flat_map(|graph| {
        let count = graph.vertex_count() as Vertex;
        (Just(graph), 0..count)
    })
}

fn close(a: f64, b: f64, relative: f64) -> bool {
    (a - b).abs() <= relative * a.abs().max(b.abs()).max(1e-12)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn bfs_depths_are_shortest_distances_and_parents_are_one_closer((graph, source) in graphs_with_a_source(), threads in 1usize..4) {
        let result = with_threads(threads, || bfs(&graph, source)).unwrap();
        prop_assert_eq!(&result.depths, &distances(&graph, source));
        for (vertex, &parent) in result.parents.iter().enumerate() {
            if vertex == source as usize || result.depths[vertex] == UNREACHED {
                prop_assert!(parent == vertex as Vertex || parent == NO_VERTEX);
                continue;
            }
            prop_assert!(graph.out_neighbours(parent).contains(&(vertex as Vertex)));
            prop_assert_eq!(result.depths[parent as usize] + 1, result.depths[vertex]);
        }
    }

    #[test]
    fn cc_labels_equal_union_find(graph in graphs(), threads in 1usize..4) {
        let result = with_threads(threads, || cc(&graph)).unwrap();
        prop_assert_eq!(result.labels, components(&graph));
    }

    #[test]
    fn pagerank_matches_the_matrix_product(graph in graphs(), threads in 1usize..4) {
        let options = PageRankOptions { tolerance: None, max_iterations: 15, ..PageRankOptions::default() };
        let result = with_threads(threads, || pagerank(&graph, options)).unwrap();
        let reference = dense_pagerank(&graph, options);
        for (got, wanted) in result.ranks.iter().zip(&reference) {
            prop_assert!(close(*got, *wanted, 1e-9), "{} against {}", got, wanted);
        }
    }

    #[test]
    fn bc_matches_brandes((graph, source) in graphs_with_a_source(), threads in 1usize..4) {
        let result = with_threads(threads, || bc(&graph, source)).unwrap();
        for (got, wanted) in result.scores.iter().zip(brandes(&graph, source)) {
            prop_assert!(close(*got, wanted, 1e-9), "{} against {}", got, wanted);
        }
    }

    #[test]
    fn radii_are_the_farthest_sampled_source(graph in graphs(), threads in 1usize..4, seed in 0u64..1000) {
        let result = with_threads(threads, || radii(&graph, seed)).unwrap();
        let from_sources: Vec<Vec<u32>> = result.sources.iter().map(|&s| distances(&graph, s)).collect();
        for vertex in 0..graph.vertex_count() {
            let farthest = from_sources
                .iter()
                .map(|distance| distance[vertex])
                .filter(|&d| d != UNREACHED)
                .max()
                .unwrap_or(radii::UNREACHED);
            prop_assert_eq!(result.radii[vertex], farthest);
        }
    }
}

#[test]
fn pagerank_stops_at_its_tolerance() {
    let graph = Graph::from_edges(4, &[(0, 1), (1, 2), (2, 3), (3, 0), (0, 2)], false).unwrap();
    let result = pagerank(&graph, PageRankOptions::default()).unwrap();
    assert!(result.iterations < 20);
    assert!(result.last_change < 1e-4);
    let sum: f64 = result.ranks.iter().sum();
    assert!(close(sum, 1.0, 1e-9));
}

#[test]
fn both_ways_to_pagerank_give_the_same_bits() {
    let graph = remora_graph::generate::generate(remora_graph::generate::GeneratorSpec {
        kind: remora_graph::generate::GraphKind::Kronecker,
        scale: 10,
        degree: 8,
        seed: 4,
    })
    .unwrap();
    let per_edge = pagerank(&graph, PageRankOptions::default()).unwrap();
    let per_vertex = pagerank(
        &graph,
        PageRankOptions {
            contributions: Contributions::PerVertex,
            ..PageRankOptions::default()
        },
    )
    .unwrap();
    assert_eq!(per_edge, per_vertex);
}

/// A placement that keeps everything local but records what values each
/// application places, and can refuse them.
#[derive(Default)]
struct CountingValues {
    placed: std::sync::Mutex<Vec<(String, u64)>>,
    refuse: bool,
}

impl CountingValues {
    fn record(&self, name: &str, bytes: u64) -> Result<(), remora_graph::PlacementError> {
        if self.refuse {
            return Err(remora_graph::PlacementError {
                name: name.into(),
                bytes,
                reason: "refused by the test".into(),
            });
        }
        self.placed.lock().unwrap().push((name.into(), bytes));
        Ok(())
    }
}

impl remora_graph::ValuePlacement for CountingValues {
    fn place_words32(
        &self,
        name: &str,
        count: usize,
    ) -> Result<remora_graph::Array<std::sync::atomic::AtomicU32>, remora_graph::PlacementError>
    {
        self.record(name, count as u64 * 4)?;
        remora_graph::LocalPlacement.place_words32(name, count)
    }

    fn place_words64(
        &self,
        name: &str,
        count: usize,
    ) -> Result<remora_graph::Array<std::sync::atomic::AtomicU64>, remora_graph::PlacementError>
    {
        self.record(name, count as u64 * 8)?;
        remora_graph::LocalPlacement.place_words64(name, count)
    }
}

struct CountingPlacement(std::sync::Arc<CountingValues>);

impl remora_graph::Placement for CountingPlacement {
    fn place_offsets(
        &self,
        name: &str,
        data: Vec<u64>,
    ) -> Result<remora_graph::Array<u64>, remora_graph::PlacementError> {
        remora_graph::LocalPlacement.place_offsets(name, data)
    }

    fn place_vertices(
        &self,
        name: &str,
        data: Vec<u32>,
    ) -> Result<remora_graph::Array<u32>, remora_graph::PlacementError> {
        remora_graph::LocalPlacement.place_vertices(name, data)
    }

    fn values(&self) -> Option<std::sync::Arc<dyn remora_graph::ValuePlacement>> {
        Some(self.0.clone())
    }
}

/// Each app places exactly the values `App::value_bytes_per_vertex` says
/// (the SODA benchmark sizes its buffers and the DPU's static cache by
/// it), in at most `App::MOST_VALUE_ARRAYS` arrays, every one named as
/// values; and a placement that refuses them fails the app with its error.
#[test]
fn apps_place_the_values_they_declare_and_fail_when_refused() {
    let graph = small_kronecker();
    for app in App::ALL {
        let values = std::sync::Arc::new(CountingValues::default());
        let placed = graph.place(&CountingPlacement(values.clone())).unwrap();
        let result = run(app, &placed, 0, 1).unwrap();
        result.compare(&run(app, &graph, 0, 1).unwrap()).unwrap();
        let arrays = values.placed.lock().unwrap().clone();
        let bytes: u64 = arrays.iter().map(|(_, bytes)| bytes).sum();
        assert_eq!(
            bytes,
            app.value_bytes_per_vertex() * graph.vertex_count() as u64,
            "{app:?}: {arrays:?}"
        );
        assert!(arrays.len() as u64 <= App::MOST_VALUE_ARRAYS, "{arrays:?}");
        assert!(arrays
            .iter()
            .all(|(name, _)| name.starts_with(remora_graph::csr::VALUES_PREFIX)));
        let refusing = std::sync::Arc::new(CountingValues {
            refuse: true,
            ..CountingValues::default()
        });
        let placed = graph.place(&CountingPlacement(refusing)).unwrap();
        let error = run(app, &placed, 0, 1).unwrap_err();
        assert!(
            matches!(&error, AppError::Placement(refused) if refused.reason == "refused by the test"),
            "{app:?}: {error}"
        );
    }
}

/// BFS and BC asserted that their source was a vertex: an empty graph, or
/// a source past the last vertex, panicked. Both are typed errors now.
#[test]
fn a_source_outside_the_graph_is_a_typed_error() {
    let empty = Graph::from_edges(0, &[], false).unwrap();
    let three = Graph::from_edges(3, &[(0, 1), (1, 2)], false).unwrap();
    for (graph, source) in [(&empty, 0), (&three, 3), (&three, Vertex::MAX)] {
        for app in [App::Bfs, App::Bc] {
            let error = run(app, graph, source, 1).unwrap_err();
            assert!(
                matches!(error, AppError::SourceOutsideGraph { vertex, vertex_count }
                    if vertex == source && vertex_count == graph.vertex_count()),
                "{app:?} from {source}: {error}"
            );
        }
    }
}

fn small_kronecker() -> Graph {
    remora_graph::generate::generate(remora_graph::generate::GeneratorSpec {
        kind: remora_graph::generate::GraphKind::Kronecker,
        scale: 9,
        degree: 8,
        seed: 11,
    })
    .unwrap()
}

/// A vertex whose dependency is tiny beside 1/σ of itself: c20, at the
/// end of a lone chain (σ = 1), shares a child with twenty layers of three
/// (σ = 3^20 + 1 at the child), so δ(c20) = 1/(3^20 + 1), about 2.9e-10.
/// Its score came from (1 + 2.9e-10) − 1, wrong from the seventh digit.
#[test]
fn bc_keeps_a_dependency_far_below_one_over_the_path_count() {
    let chain: Vec<Vertex> = (1..=20).collect();
    let layer = |k: u32| (0..3).map(move |i| 21 + 3 * (k - 1) + i);
    let child: Vertex = 81;
    let mut edges = vec![(0, chain[0])];
    edges.extend(chain.windows(2).map(|pair| (pair[0], pair[1])));
    edges.push((chain[19], child));
    edges.extend(layer(1).map(|member| (0, member)));
    for k in 1..20 {
        for from in layer(k) {
            edges.extend(layer(k + 1).map(|to| (from, to)));
        }
    }
    edges.extend(layer(20).map(|member| (member, child)));
    let graph = Graph::from_edges(82, &edges, true).unwrap();
    let wanted = brandes(&graph, 0);
    assert!(wanted[20] > 0.0 && wanted[20] < 1e-9, "{}", wanted[20]);
    let result = bc(&graph, 0).unwrap();
    for (vertex, (got, wanted)) in result.scores.iter().zip(&wanted).enumerate() {
        assert!(
            close(*got, *wanted, 1e-9),
            "vertex {vertex}: {got} against {wanted}"
        );
    }
}
