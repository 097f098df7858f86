//! Cowbird (issue 4, `papers/000`): offloaded far-memory access. The
//! compute node only writes requests into rings in its own memory and
//! reads results from them; an offload engine moves the data.
//!
//! - [`config`]: the rack file's `[cowbird]` section.
//! - [`layout`]: the compute block (Figure 4), the request metadata entry
//!   (Table 3) and request ids.
//! - [`client`]: the client library and Table 2's API.
//! - [`spot`]: the Cowbird-Spot offload engine on the memory node.
//! - [`spot_agent`]: that engine as the memory node's agent, with what
//!   survives a crash.
//! - [`connection`]: reconnecting the engine's queue pairs, through the
//!   compute node's connection service.
//! - [`rpc`]: the two-sided baseline's server on the memory node.
//! - [`deploy`]: Cowbird set up on two soft RNICs.
//! - [`scenario`]: scenarios written once, run in the simulator and on
//!   the embedded rack (the memory host crashing under the Spot engine).
//! - [`simulated`]: checked histories in the deterministic simulator.
//! - [`hash_table`]: the hash-table probe microbenchmark's table and work.
//! - [`embedded`]: that benchmark on the embedded rack, every variant.

#![forbid(unsafe_code)]

pub mod client;
pub mod config;
pub mod connection;
pub mod deploy;
pub mod embedded;
pub mod far_memory;
pub mod fuzzing;
pub mod hash_table;
pub mod history;
pub mod layout;
pub mod p4;
pub mod rpc;
pub mod scenario;
pub mod simulated;
pub mod spot;
pub mod spot_agent;
