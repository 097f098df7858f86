//! Remora's verbs drop-in: `libibverbs.so.1` for unmodified RDMA programs.
//!
//! Build it (`cargo build --release -p remora-verbs`), put the directory
//! holding `libibverbs.so.1` first on `LD_LIBRARY_PATH` (`remora verbs
//! env` prints the line), name the peer in `REMORA_VERBS`, and a program
//! linked against rdma-core runs on a soft RNIC of its own:
//!
//! - [`config`]: `REMORA_VERBS` and `REMORA_VERBS_CONFIG`;
//! - [`libraries`]: the `lib*.so.1` links `LD_LIBRARY_PATH` names;
//! - [`node`]: the process's soft RNIC, carrier and progress thread,
//!   usable from Rust too (the benchmark's native side);
//! - [`rendezvous`]: two processes meeting on one shared-memory segment;
//! - `foreign_memory`: the program's registered memory, as the RNIC
//!   reaches it (all of the raw-memory `unsafe`);
//! - `provider`: the C ABI, over the bindings in [`abi`].

pub mod abi;
pub mod config;
mod foreign_memory;
pub mod libraries;
pub mod node;
mod provider;
pub mod rendezvous;

pub use config::{CarrierConfig, ConfigError, VerbsConfig};
pub use foreign_memory::ForeignMemory;
pub use node::{Node, NodeError};
