//! Clover in the deterministic simulator: [`crate::scenario`] on
//! simulated hosts, over links that may lose, duplicate and reorder
//! frames (the run's faults on every link). The agents' timers are the
//! simulator's events. The tests prove correctness here; `remora bench
//! clover` and the demo measure here too, in simulated time.

use crate::harness::{topology, HarnessError};
pub use crate::harness::{Run, SwitchChoice};
pub use crate::scenario::Outcome;
use remora_rack::scenario::{Network, SimulatedStage};

/// Runs one configuration; errors name what went wrong.
pub fn run(seed: u64, run: &Run) -> Result<Outcome, HarnessError> {
    let _span = tracing::info_span!("clover_simulated", seed, switch = ?run.switch).entered();
    let network = Network {
        faults: run.faults,
        hardware: run.hardware,
    };
    let stage = SimulatedStage::on_network(seed, &topology(), network);
    crate::scenario::run(stage, seed, run)
}
