//! Clover, a passive disaggregated key-value store (issue 5), after
//! "Clover" as summarised in the in-network write-conflict resolution
//! paper (`papers/003`): every key is a linked list of versions in
//! memory-node regions that only RNICs touch; a write RDMA-WRITEs a new
//! entry and then CASes the old tail's next pointer from null to it.
//!
//! - [`layout`]: the bytes of an entry and of the next pointer.
//! - [`client`]: a write and a read as sans-IO state machines over verbs.
//! - [`metadata`]: the metadata server (slot batches, shortcuts, garbage
//!   collection with a grace period).
//! - [`pool`]: many logical clients, one queue pair each, multiplexed on
//!   one application thread over a soft RNIC.
//! - [`resolver`]: the switch program that rewrites stale CAS targets to
//!   the true tail in flight.
//! - [`deploy`]: the store set up on two soft RNICs, and the workload
//!   feeder.
//! - [`config`]: the rack file's `[clover]` section.
//! - [`harness`]: a run's configuration, the switch programs a run can
//!   use and the application as two agents (clients, metadata server).
//! - [`scenario`]: a run written once against the rack, run by
//!   [`simulated`] (the deterministic simulator, simulated time) and
//!   [`embedded`] (the embedded rack: real threads, rings and time).

#![forbid(unsafe_code)]

pub mod client;
pub mod config;
pub mod deploy;
pub mod embedded;
pub mod harness;
pub mod layout;
pub mod metadata;
pub mod pool;
pub mod resolver;
pub mod scenario;
pub mod simulated;
