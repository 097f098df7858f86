//! A Ligra-style graph engine: compressed sparse rows, `edge_map` that
//! switches between sparse (push) and dense (pull) traversal, `vertex_map`,
//! and five applications (BFS, PageRank, Radii, single-source BC and CC).
//!
//! The arrays of a [`Graph`] are [`Array`]s: a local vector, or any memory
//! a [`Placement`] hands out. SODA places them in far-memory objects, so
//! the same kernels run on local memory and on memory that faults in from
//! a memory node, and their results can be compared exactly. The
//! applications' per-vertex values go where the placement says too
//! ([`ValuePlacement`]), as SODA's Ligra keeps them on the memory node.
//!
//! Loaders read GAPBS (`.el`, `.wel`, `.sg`), Ligra (`AdjacencyGraph`) and
//! SNAP edge lists; generators make seeded Kronecker (GAPBS parameters)
//! and uniform graphs.
#![forbid(unsafe_code)]

pub mod apps;
pub mod array;
pub mod csr;
pub mod engine;
pub mod frontier;
pub mod fuzzing;
pub mod generate;
pub mod load;
pub mod output;

pub use array::{Array, LocalPlacement, Placement, PlacementError, ValuePlacement};
pub use csr::{Direction, Graph};
pub use frontier::Frontier;

/// A vertex id. GAPBS and Ligra use 32-bit ids; so does the `.sg` format.
pub type Vertex = u32;

/// The parent or label of no vertex.
pub const NO_VERTEX: Vertex = Vertex::MAX;
