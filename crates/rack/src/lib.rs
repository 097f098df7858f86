//! The rack: soft-RNIC nodes behind a programmable top-of-rack switch.
//!
//! - [`assembly`]: the rack builder, the one place that makes carriers,
//!   NICs and the fabric thread from a topology;
//! - [`config`]: the rack TOML (nodes with role, address and memory; link
//!   faults; the switch program);
//! - [`endpoint`]: a node's runtime (its soft RNIC on a carrier port, driven
//!   by a real clock) and the switch's runtime (the pipeline on one port
//!   per node);
//! - [`host_cpu`]: a host's agents on a thread of their own, beside the
//!   fabric thread, so an application's CPU is measured apart;
//! - [`control`]: the control channel that exchanges queue-pair endpoints
//!   and memory-region keys over a Unix or TCP socket, so nothing about a
//!   connection is hard-coded;
//! - [`workload`]: what compute nodes run when a rack is brought up: a
//!   checked tour of READ, WRITE, SEND and atomics against every memory
//!   node;
//! - [`topology`]: one description of a rack (hosts, offload hosts beside
//!   them, links with bandwidth, delay and faults) that every mode builds;
//! - [`scenario`]: the `Rack` a system writes each scenario against once,
//!   run by the simulator and by the embedded rack;
//! - [`simulated`]: hosts and the switch as nodes of the deterministic
//!   simulator;
//! - [`launch`]: bringing a rack up embedded (one process, one fabric
//!   thread), as processes (one per node, shared memory or UDP), or in
//!   network namespaces (veths and AF_PACKET).

pub mod assembly;
pub mod attach;
pub mod channel;
pub mod config;
pub mod control;
pub mod endpoint;
pub mod host_cpu;
pub mod launch;
pub mod pool;
pub mod report;
pub mod scenario;
pub mod simulated;
pub mod topology;
pub mod workload;

pub use config::{RackConfig, Role};
pub use launch::{CarrierKind, LaunchOptions, Mode};
pub use report::RackReport;

/// Everything that can stop a rack from running.
#[derive(Debug, thiserror::Error)]
pub enum RackError {
    #[error("rack config: {0}")]
    Config(String),
    #[error("carrier: {0}")]
    Carrier(#[from] remora_carrier::CarrierError),
    #[error("verbs: {0}")]
    Verbs(#[from] remora_rnic::VerbsError),
    #[error("control channel: {0}")]
    Control(String),
    #[error("{0}")]
    Launch(String),
    #[error("workload check failed: {0}")]
    Workload(String),
    /// The rack was stopped (Ctrl-C, or a failure elsewhere raising the
    /// stop) before `0` finished: not a failed check.
    #[error("stopped before {0} finished")]
    Stopped(&'static str),
    #[error("host {host}: agent {error}")]
    Agent {
        /// The host the agent runs on.
        host: String,
        #[source]
        error: remora_host::AgentError,
    },
    #[error("the run did not finish within {0:?}")]
    TimedOut(std::time::Duration),
    #[error("the simulated rack is stuck at {at_ns} ns: {events} events went by without time moving (a timer due at the instant it is handled, for ever)")]
    Livelock { at_ns: u64, events: u64 },
}
