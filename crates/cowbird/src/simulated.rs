//! Cowbird in the deterministic simulator: [`crate::scenario::histories`]
//! on simulated hosts, over links that may lose, duplicate and reorder
//! frames. A compute host's application issues mixed async reads and
//! writes through the client library; the engine is the Spot engine on
//! the memory host or Cowbird-P4 in the switch ([`Engine`]). Every
//! program is an agent of its host, so its timers are the simulator's
//! events, and the memory host can crash or lose its link mid-run
//! ([`Disruption`]). The workload and its checks are
//! [`crate::history`]'s.

use crate::history::HistoryError;
pub use crate::history::{Engine, ReadCheck, Workload};
use crate::p4::P4Config;
use crate::scenario::{histories, histories_beside_broken_clients, ScenarioError};
pub use crate::scenario::{Disruption, Outcome};
use remora_rack::scenario::{Network, SimulatedStage};
use remora_rack::topology::Topology;
use remora_sim::{LinkFaults, Probability};
use remora_switch::programs::l2l3::L2L3Forwarding;
use std::time::Duration;

/// The rack's two hosts and the switch between them.
pub fn topology() -> Topology {
    Topology::compute_and_memory()
}

/// The switch's forwarding between the two hosts.
pub fn forwarding() -> L2L3Forwarding {
    topology().forwarding()
}

/// A simulated run that failed, and its seed.
#[derive(Debug, thiserror::Error)]
#[error("seed {seed}: {error}")]
pub struct RunError {
    pub seed: u64,
    #[source]
    pub error: ScenarioError,
}

impl RunError {
    /// The history check that failed, if that is what failed.
    pub fn history(&self) -> Option<&HistoryError> {
        self.error.history()
    }
}

/// The tests' and the demo's fault profile: `loss` on every link, half
/// as much duplication, and 1% of frames reordered by up to 3 µs.
pub fn lossy(loss: Probability) -> LinkFaults {
    LinkFaults {
        loss,
        duplicate: loss.scaled(0.5),
        reorder: Probability::literal(0.01),
        reorder_delay: Duration::from_micros(3),
        ..LinkFaults::NONE
    }
}

/// The Spot campaign's heavier profile: 5% loss on every link, half as
/// much duplication, and 5% of frames reordered by up to 5 µs.
pub fn heavy_faults() -> LinkFaults {
    LinkFaults {
        reorder: Probability::literal(0.05),
        reorder_delay: Duration::from_micros(5),
        ..lossy(Probability::literal(0.05))
    }
}

/// Cowbird-P4's address on the wire.
pub fn p4_config() -> P4Config {
    P4Config::rack_default()
}

/// Runs the workload on one seed.
pub fn run(seed: u64, workload: &Workload) -> Result<Outcome, RunError> {
    run_with(seed, workload, None)
}

/// Runs the workload on one seed, disrupting the memory host if asked,
/// with the workload's faults on every link.
pub fn run_with(
    seed: u64,
    workload: &Workload,
    disruption: Option<Disruption>,
) -> Result<Outcome, RunError> {
    let _span = tracing::info_span!("cowbird_simulated", seed, engine = ?workload.engine).entered();
    let (stage, limit) = stage_for(seed, workload);
    histories(stage, seed, workload, disruption, limit).map_err(|error| RunError { seed, error })
}

/// Runs the Spot workload on one seed beside `broken` clients whose
/// rings hold an entry no client library writes
/// ([`crate::scenario::histories_beside_broken_clients`]).
pub fn run_beside_broken_clients(
    seed: u64,
    workload: &Workload,
    broken: usize,
) -> Result<Outcome, RunError> {
    let (stage, limit) = stage_for(seed, workload);
    histories_beside_broken_clients(stage, seed, workload, broken, limit)
        .map_err(|error| RunError { seed, error })
}

/// The simulated rack for `workload` on `seed`, and the bound on each
/// phase of a run: 20 ms of virtual time per request, and a second more.
fn stage_for(seed: u64, workload: &Workload) -> (SimulatedStage, Duration) {
    let network = Network {
        faults: workload.faults,
        hardware: workload.hardware,
    };
    let total = workload.operations_per_thread * workload.threads as u64;
    let limit = Duration::from_nanos(total * 20_000_000 + 1_000_000_000);
    (
        SimulatedStage::on_network(seed, &topology(), network),
        limit,
    )
}
