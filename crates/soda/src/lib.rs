//! SODA (Su et al., "SODA: a SmartNIC-offloaded far-memory object
//! system", paper 002) on Remora.
//!
//! An application calls [`FarMemory::alloc`] and gets memory that faults
//! in from a [`ChunkStore`], chunk by chunk, through one LRU host buffer
//! with dirty tracking and watermark eviction. It never sees the network.

pub mod backend;
pub mod buffer;
pub mod cache;
pub mod child_test;
pub mod config;
pub mod dpu;
pub mod far;
pub mod mapping;
pub mod pins;
pub mod placement;
pub mod rack;
pub mod store;
pub mod userfault;

pub use far::{FarMemory, FarMemoryConfig, FarMemoryStats, FarObject, SodaError};
pub use store::{Advice, ChunkStore, FileStore, InProcessStore, ObjectId, StoreError};
