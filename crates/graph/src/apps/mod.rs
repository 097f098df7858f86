//! The five applications of SODA's case study (and Ligra's paper).

pub mod bc;
pub mod bfs;
pub mod cc;
pub mod pagerank;
pub mod radii;

use crate::{PlacementError, Vertex};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum App {
    Bfs,
    PageRank,
    Radii,
    Bc,
    Cc,
}

impl App {
    pub const ALL: [App; 5] = [App::Bfs, App::PageRank, App::Radii, App::Bc, App::Cc];

    /// Bytes of per-vertex values the app places (what its
    /// `Graph::values32` and `values64` calls ask for), per vertex: BFS
    /// parents and depths; PageRank's two rank arrays (shares per edge);
    /// Radii's two visited sets and radii; BC's path counts, visited
    /// flags, inverse counts and dependencies; CC's labels.
    pub fn value_bytes_per_vertex(self) -> u64 {
        match self {
            App::Bfs => 4 + 4,
            App::PageRank => 8 + 8,
            App::Radii => 8 + 8 + 4,
            App::Bc => 8 + 4 + 8 + 8,
            App::Cc => 4,
        }
    }

    /// Arrays of values an app places at most (each rounded up to whole
    /// chunks where chunks are the unit).
    pub const MOST_VALUE_ARRAYS: u64 = 4;

    pub fn name(self) -> &'static str {
        match self {
            App::Bfs => "bfs",
            App::PageRank => "pr",
            App::Radii => "radii",
            App::Bc => "bc",
            App::Cc => "cc",
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown application {0:?}: expected bfs, pr, radii, bc or cc")]
pub struct UnknownApp(pub String);

impl FromStr for App {
    type Err = UnknownApp;
    fn from_str(text: &str) -> Result<App, UnknownApp> {
        App::ALL
            .into_iter()
            .find(|app| app.name() == text)
            .ok_or_else(|| UnknownApp(text.into()))
    }
}

/// An `f64` kept as its bits in an `AtomicU64`, updated by several threads
/// (BC's path counts and dependencies, PageRank's ranks): per-vertex values
/// are atomic words wherever they live.
pub(crate) trait F64Word {
    fn load_f64(&self) -> f64;
    fn store_f64(&self, value: f64);
    /// Adds `value`; returns what was there before.
    fn fetch_add_f64(&self, value: f64) -> f64;
}

impl F64Word for AtomicU64 {
    fn load_f64(&self) -> f64 {
        f64::from_bits(self.load(Ordering::Relaxed))
    }

    fn store_f64(&self, value: f64) {
        self.store(value.to_bits(), Ordering::Relaxed);
    }

    fn fetch_add_f64(&self, value: f64) -> f64 {
        let mut current = self.load(Ordering::Relaxed);
        loop {
            let next = (f64::from_bits(current) + value).to_bits();
            match self.compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(previous) => return f64::from_bits(previous),
                Err(actual) => current = actual,
            }
        }
    }
}

/// The values an application leaves, read out of wherever they lived.
pub(crate) fn read_words32(values: &[std::sync::atomic::AtomicU32]) -> Vec<u32> {
    values
        .iter()
        .map(|value| value.load(Ordering::Relaxed))
        .collect()
}

/// What an application computed, per vertex.
#[derive(Debug, Clone, PartialEq)]
pub enum AppResult {
    Bfs(bfs::BfsResult),
    PageRank(pagerank::PageRankResult),
    Radii(radii::RadiiResult),
    Bc(bc::BcResult),
    Cc(cc::CcResult),
}

/// Relative tolerance for PageRank between two runs (the 1e-6;
/// Jacobi iteration is in fact exact across backends).
pub const PAGERANK_TOLERANCE: f64 = 1e-6;
/// Relative tolerance for BC: its sums are added in thread order, so the
/// last bits differ between runs.
pub const BC_TOLERANCE: f64 = 1e-9;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ResultMismatch {
    #[error("results of different applications")]
    DifferentApps,
    #[error("results cover {0} and {1} vertices")]
    DifferentSizes(usize, usize),
    #[error("vertex {vertex}: {left} against {right}")]
    Vertex {
        vertex: usize,
        left: String,
        right: String,
    },
}

/// Why an application could not run.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Placement(#[from] PlacementError),
    #[error("source vertex {vertex} is not one of the graph's {vertex_count} vertices")]
    SourceOutsideGraph { vertex: Vertex, vertex_count: usize },
}

/// Checks that `source` is a vertex of a graph of `vertex_count`.
pub(crate) fn check_source(source: Vertex, vertex_count: usize) -> Result<(), AppError> {
    if (source as usize) < vertex_count {
        Ok(())
    } else {
        Err(AppError::SourceOutsideGraph {
            vertex: source,
            vertex_count,
        })
    }
}

/// Runs `app` from `source` (BFS and BC) with `seed` (Radii's sampling).
/// Fails if `source` is not a vertex (BFS and BC) or the graph's
/// placement cannot hold the app's values.
pub fn run(
    app: App,
    graph: &crate::Graph,
    source: crate::Vertex,
    seed: u64,
) -> Result<AppResult, AppError> {
    Ok(match app {
        App::Bfs => AppResult::Bfs(bfs::bfs(graph, source)?),
        App::PageRank => AppResult::PageRank(pagerank::pagerank(graph, Default::default())?),
        App::Radii => AppResult::Radii(radii::radii(graph, seed)?),
        App::Bc => AppResult::Bc(bc::bc(graph, source)?),
        App::Cc => AppResult::Cc(cc::cc(graph)?),
    })
}

fn first_difference<T: PartialEq + std::fmt::Display>(
    left: &[T],
    right: &[T],
    equal: impl Fn(&T, &T) -> bool,
) -> Result<(), ResultMismatch> {
    if left.len() != right.len() {
        return Err(ResultMismatch::DifferentSizes(left.len(), right.len()));
    }
    match left.iter().zip(right).position(|(a, b)| !equal(a, b)) {
        None => Ok(()),
        Some(vertex) => Err(ResultMismatch::Vertex {
            vertex,
            left: left[vertex].to_string(),
            right: right[vertex].to_string(),
        }),
    }
}

fn close(a: f64, b: f64, relative: f64) -> bool {
    (a - b).abs() <= relative * a.abs().max(b.abs()).max(f64::MIN_POSITIVE)
}

impl AppResult {
    pub fn app(&self) -> App {
        match self {
            AppResult::Bfs(_) => App::Bfs,
            AppResult::PageRank(_) => App::PageRank,
            AppResult::Radii(_) => App::Radii,
            AppResult::Bc(_) => App::Bc,
            AppResult::Cc(_) => App::Cc,
        }
    }

    /// Whether two runs agree: BFS depths equal (parents may differ), CC
    /// the same partition, PageRank and BC within their tolerances, Radii
    /// equal.
    pub fn compare(&self, other: &AppResult) -> Result<(), ResultMismatch> {
        match (self, other) {
            (AppResult::Bfs(a), AppResult::Bfs(b)) => {
                first_difference(&a.depths, &b.depths, |x, y| x == y)
            }
            (AppResult::Cc(a), AppResult::Cc(b)) => {
                first_difference(&a.labels, &b.labels, |x, y| x == y)
            }
            (AppResult::Radii(a), AppResult::Radii(b)) => {
                first_difference(&a.radii, &b.radii, |x, y| x == y)
            }
            (AppResult::PageRank(a), AppResult::PageRank(b)) => {
                first_difference(&a.ranks, &b.ranks, |x, y| close(*x, *y, PAGERANK_TOLERANCE))
            }
            (AppResult::Bc(a), AppResult::Bc(b)) => {
                first_difference(&a.scores, &b.scores, |x, y| close(*x, *y, BC_TOLERANCE))
            }
            _ => Err(ResultMismatch::DifferentApps),
        }
    }

    /// One line about the result, for people.
    pub fn summary(&self) -> String {
        match self {
            AppResult::Bfs(result) => {
                let reached: Vec<u32> = result
                    .depths
                    .iter()
                    .copied()
                    .filter(|&d| d != bfs::UNREACHED)
                    .collect();
                let deepest = reached.iter().max().copied().unwrap_or(0);
                format!(
                    "reached {} vertices, deepest level {deepest}",
                    reached.len()
                )
            }
            AppResult::PageRank(result) => format!(
                "{} iterations, last L1 change {:.3e}",
                result.iterations, result.last_change
            ),
            AppResult::Radii(result) => format!(
                "radius estimate {} from {} sources",
                result.estimate(),
                result.sources.len()
            ),
            AppResult::Bc(result) => {
                let top = result.scores.iter().copied().fold(0.0, f64::max);
                format!("largest dependency {top:.3}")
            }
            AppResult::Cc(result) => format!("{} components", result.component_count()),
        }
    }

    /// Writes one "vertex value" line per vertex (BFS: depth).
    pub fn write_vertex_values(&self, path: &std::path::Path) -> std::io::Result<()> {
        use crate::output::write_vertex_values;
        match self {
            AppResult::Bfs(result) => write_vertex_values(path, &result.depths),
            AppResult::PageRank(result) => write_vertex_values(path, &result.ranks),
            AppResult::Radii(result) => write_vertex_values(path, &result.radii),
            AppResult::Bc(result) => write_vertex_values(path, &result.scores),
            AppResult::Cc(result) => write_vertex_values(path, &result.labels),
        }
    }
}
