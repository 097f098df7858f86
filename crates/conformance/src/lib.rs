//! RDMA conformance: soft RNICs in the simulator, exchanging random mixes
//! of every RC operation under faults, checked against a plain model.
//!
//! - [`operation`]: what a stream issues, and the window it works in.
//! - [`workload`]: the random operation streams.
//! - [`model`]: the reference memory each stream is checked against.
//! - [`node`]: the host program that posts receives late (an agent).
//! - [`scenario`]: one seed: build, run the safety and liveness phases, check.
//! - [`campaign`]: many seeds, with replay instructions for failures.

#![forbid(unsafe_code)]

pub mod campaign;
pub mod model;
pub mod node;
pub mod operation;
pub mod scenario;
pub mod workload;

pub use campaign::{run_campaign, CampaignReport};
pub use scenario::{run_seed, FaultProfile, ScenarioConfig, ScenarioConfigError, SeedReport};
