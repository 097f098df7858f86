//! What a system is to the command line: its name, its rack-file section,
//! what `rack up` runs for it, its step of the demo and its benchmark.

use crate::bench::entry::Benchmark;
use crate::error::SystemError;
use crate::HistoryFile;
use remora_rack::RackConfig;

/// A system as the command line drives it.
pub trait System: Sync {
    /// Its name, which is also its rack-file section (`[cowbird]`).
    fn name(&self) -> &'static str;

    /// Its name in prose ("Cowbird").
    fn title(&self) -> &'static str;

    /// Checks the rack file's section for this system, if there is one;
    /// a system without a rack-file section refuses one.
    fn check_section(&self, rack: &RackConfig) -> Result<(), SystemError>;

    /// Runs what the section asks for on the embedded rack after `rack
    /// up`'s own workload; None without a section. Failures are pushed
    /// onto `failures`. A system without a section runs nothing.
    fn rack_up(&self, rack: &RackConfig, failures: &mut Vec<String>) -> Option<serde_json::Value> {
        let _ = (rack, failures);
        None
    }

    /// The system's step of `remora demo`.
    fn demo_step(&self, history: Option<&mut HistoryFile>) -> Result<SystemStep, SystemError>;

    /// Its `remora bench` subcommand, if it has one.
    fn benchmark(&self) -> Option<&'static dyn Benchmark> {
        None
    }
}

/// One system's step of the demo: what ran, and what failed its check.
#[derive(serde::Serialize)]
pub struct SystemStep {
    pub variants: Vec<serde_json::Value>,
    pub failures: Vec<String>,
}
