//! Seeded synthetic graphs, as GAPBS makes them: Kronecker (R-MAT with
//! A = 0.57, B = C = 0.19) and uniform random, each with 2^scale vertices
//! and degree × 2^scale undirected edges. The same seed gives the same
//! graph whatever the thread count.

use crate::csr::{Graph, GraphError};
use crate::Vertex;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

/// GAPBS's Kronecker initiator probabilities (Graph500's).
pub const KRONECKER_A: f64 = 0.57;
pub const KRONECKER_B: f64 = 0.19;
pub const KRONECKER_C: f64 = 0.19;

/// Edges generated per random stream: the unit of parallel work.
const EDGES_PER_BLOCK: usize = 1 << 16;

/// The largest scale accepted: 2^30 vertices is past this machine's memory
/// at any useful degree.
pub const MAX_SCALE: u32 = 30;
/// The most edges a generated graph may have: 2^30, 8 GiB of edge list
/// and as much again of CSR (scale 26 at GAPBS's degree 16).
pub const MAX_GENERATED_EDGES: usize = 1 << 30;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GraphKind {
    Kronecker,
    Uniform,
}

impl GraphKind {
    /// The generator a graph spec names (`kron:SCALE[:DEGREE]` or
    /// `uniform:SCALE[:DEGREE]`) and the spec after its prefix; `None`
    /// for anything else, which names a file.
    pub fn from_spec(spec: &str) -> Option<(GraphKind, &str)> {
        [
            ("kron:", GraphKind::Kronecker),
            ("uniform:", GraphKind::Uniform),
        ]
        .into_iter()
        .find_map(|(prefix, kind)| spec.strip_prefix(prefix).map(|rest| (kind, rest)))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GeneratorSpec {
    pub kind: GraphKind,
    pub scale: u32,
    /// Undirected edges per vertex before duplicates are dropped.
    pub degree: u32,
    pub seed: u64,
}

/// Undirected edges per vertex when a spec names none.
pub const DEFAULT_DEGREE: u32 = 16;

impl GeneratorSpec {
    /// `kron:SCALE[:DEGREE]` or `uniform:SCALE[:DEGREE]`, checked as
    /// [`generate`] checks it; `None` for anything else (a file name).
    pub fn parse(spec: &str, seed: u64) -> Option<Result<GeneratorSpec, GenerateError>> {
        let (kind, rest) = GraphKind::from_spec(spec)?;
        let checked = match Self::parse_numbers(kind, rest, seed) {
            Some(generator) => generator.edge_count().map(|_| generator),
            None => Err(GenerateError::Spec(spec.to_string())),
        };
        Some(checked)
    }

    /// `SCALE[:DEGREE]` after the kind's prefix; `None` unless they are
    /// whole numbers and nothing follows.
    fn parse_numbers(kind: GraphKind, rest: &str, seed: u64) -> Option<GeneratorSpec> {
        let mut parts = rest.split(':');
        let scale = parts.next()?.parse().ok()?;
        let degree = match parts.next() {
            Some(text) => text.parse().ok()?,
            None => DEFAULT_DEGREE,
        };
        parts.next().is_none().then_some(GeneratorSpec {
            kind,
            scale,
            degree,
            seed,
        })
    }

    /// How many edges it draws: its scale and degree checked.
    fn edge_count(&self) -> Result<usize, GenerateError> {
        if !(1..=MAX_SCALE).contains(&self.scale) {
            return Err(GenerateError::Scale(self.scale));
        }
        if self.degree == 0 {
            return Err(GenerateError::Degree);
        }
        let vertex_count = 1usize << self.scale;
        vertex_count
            .checked_mul(self.degree as usize)
            .filter(|count| *count <= MAX_GENERATED_EDGES)
            .ok_or(GenerateError::TooManyEdges {
                scale: self.scale,
                degree: self.degree,
            })
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum GenerateError {
    #[error("{0:?} is not kron:SCALE[:DEGREE] or uniform:SCALE[:DEGREE] with whole numbers")]
    Spec(String),
    #[error("scale {0} is outside 1..={MAX_SCALE}")]
    Scale(u32),
    #[error("degree must be at least 1")]
    Degree,
    #[error("scale {scale} with degree {degree} is more than {MAX_GENERATED_EDGES} edges")]
    TooManyEdges { scale: u32, degree: u32 },
    #[error(transparent)]
    Graph(#[from] GraphError),
}

pub fn generate(spec: GeneratorSpec) -> Result<Graph, GenerateError> {
    // The edges first: they check the scale, which the shift below would
    // overflow (a panic in a debug build) past 63.
    let edges = generate_edges(spec)?;
    Graph::from_edges(1 << spec.scale, &edges, false).map_err(Into::into)
}

/// The edge list before the CSR is built (with duplicates and loops).
pub fn generate_edges(spec: GeneratorSpec) -> Result<Vec<(Vertex, Vertex)>, GenerateError> {
    let edge_count = spec.edge_count()?;
    let vertex_count = 1usize << spec.scale;
    let block_count = edge_count.div_ceil(EDGES_PER_BLOCK);
    let mut edges: Vec<(Vertex, Vertex)> = (0..block_count)
        .into_par_iter()
        .flat_map_iter(|block| {
            let mut random = ChaCha8Rng::seed_from_u64(spec.seed);
            random.set_stream(block as u64 + 1);
            let length = EDGES_PER_BLOCK.min(edge_count - block * EDGES_PER_BLOCK);
            (0..length)
                .map(|_| match spec.kind {
                    GraphKind::Kronecker => kronecker_edge(&mut random, spec.scale),
                    GraphKind::Uniform => (
                        random.gen_range(0..vertex_count) as Vertex,
                        random.gen_range(0..vertex_count) as Vertex,
                    ),
                })
                .collect::<Vec<_>>()
        })
        .collect();
    if spec.kind == GraphKind::Kronecker {
        // R-MAT puts the high-degree vertices at small ids; GAPBS
        // relabels them at random so that ids say nothing about degree.
        let mut permutation: Vec<Vertex> = (0..vertex_count as Vertex).collect();
        permutation.shuffle(&mut ChaCha8Rng::seed_from_u64(spec.seed));
        edges.par_iter_mut().for_each(|(source, destination)| {
            *source = permutation[*source as usize];
            *destination = permutation[*destination as usize];
        });
    }
    Ok(edges)
}

fn kronecker_edge(random: &mut ChaCha8Rng, scale: u32) -> (Vertex, Vertex) {
    let mut source: Vertex = 0;
    let mut destination: Vertex = 0;
    for bit in 0..scale {
        let point: f64 = random.gen();
        let quadrant = if point < KRONECKER_A {
            0
        } else if point < KRONECKER_A + KRONECKER_B {
            1
        } else if point < KRONECKER_A + KRONECKER_B + KRONECKER_C {
            2
        } else {
            3
        };
        if quadrant >= 2 {
            source |= 1 << bit;
        }
        if quadrant % 2 == 1 {
            destination |= 1 << bit;
        }
    }
    (source, destination)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::with_threads;

    #[test]
    fn a_generator_spec_is_parsed_and_checked_or_left_for_a_file() {
        let parsed = |spec: &str| GeneratorSpec::parse(spec, 3);
        assert_eq!(
            parsed("kron:5:4"),
            Some(Ok(GeneratorSpec {
                kind: GraphKind::Kronecker,
                scale: 5,
                degree: 4,
                seed: 3,
            }))
        );
        assert_eq!(
            parsed("uniform:6").map(|spec| spec.map(|spec| spec.degree)),
            Some(Ok(DEFAULT_DEGREE))
        );
        for (spec, error) in [
            ("kron:abc", GenerateError::Spec("kron:abc".into())),
            ("kron:", GenerateError::Spec("kron:".into())),
            ("kron:5:4:1", GenerateError::Spec("kron:5:4:1".into())),
            ("kron:99", GenerateError::Scale(99)),
            ("uniform:5:0", GenerateError::Degree),
        ] {
            assert_eq!(parsed(spec), Some(Err(error)), "{spec}");
        }
        assert_eq!(parsed("graph.el"), None);
    }

    /// kron:30 generated for minutes before the allocator gave up, and a
    /// huge degree aborted: both are refused before any work.
    #[test]
    fn a_graph_of_more_edges_than_the_limit_is_refused_at_once() {
        for (scale, degree) in [(30, 16), (20, u32::MAX)] {
            let spec = GeneratorSpec {
                kind: GraphKind::Uniform,
                scale,
                degree,
                seed: 1,
            };
            assert_eq!(
                generate_edges(spec),
                Err(GenerateError::TooManyEdges { scale, degree })
            );
        }
    }

    /// A scale past 63 overflowed the vertex count's shift (a panic in a
    /// debug build) before the scale was checked.
    #[test]
    fn a_scale_past_the_limit_is_refused_not_shifted() {
        for scale in [0, MAX_SCALE + 1, 64, u32::MAX] {
            let spec = GeneratorSpec {
                kind: GraphKind::Kronecker,
                scale,
                degree: 4,
                seed: 1,
            };
            assert!(
                matches!(generate(spec), Err(GenerateError::Scale(refused)) if refused == scale),
                "scale {scale}"
            );
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_graph_on_any_thread_count() {
        let spec = GeneratorSpec {
            kind: GraphKind::Kronecker,
            scale: 10,
            degree: 8,
            seed: 7,
        };
        let one = with_threads(1, || generate(spec).unwrap());
        let three = with_threads(3, || generate(spec).unwrap());
        assert_eq!(one.arrays(), three.arrays());
        let other = generate(GeneratorSpec { seed: 8, ..spec }).unwrap();
        assert_ne!(one.arrays(), other.arrays());
    }

    #[test]
    fn kronecker_degrees_are_skewed_and_uniform_ones_are_not() {
        let spec = GeneratorSpec {
            kind: GraphKind::Kronecker,
            scale: 12,
            degree: 16,
            seed: 1,
        };
        let maximum = |graph: &Graph| {
            (0..graph.vertex_count() as Vertex)
                .map(|vertex| graph.out_degree(vertex))
                .max()
                .unwrap()
        };
        let kronecker = generate(spec).unwrap();
        let uniform = generate(GeneratorSpec {
            kind: GraphKind::Uniform,
            ..spec
        })
        .unwrap();
        assert!(maximum(&kronecker) > 10 * maximum(&uniform));
        assert!(matches!(
            generate(GeneratorSpec { scale: 0, ..spec }),
            Err(GenerateError::Scale(0))
        ));
    }
}
