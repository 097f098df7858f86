//! Clover on the embedded rack: [`crate::scenario`] on real threads, the
//! real clock and the rack's in-process rings, with the run's faults on
//! the compute node's link. The fabric thread runs the switch (plain
//! L2/L3 forwarding or the resolver), both soft RNICs and the memory
//! host's metadata server; the compute host has a CPU of its own
//! ([`remora_rack::host_cpu`]) on which the clients busy-poll, as an
//! application runs on its host's cores beside its NIC. The CPU is split
//! four ways ([`CpuSplit`]).

use crate::harness::{topology, HarnessError, Run};
pub use crate::scenario::{CpuSplit, Outcome};
use remora_rack::assembly::RackBuilder;
use remora_rack::topology::{LinkSpec, COMPUTE_HOST};

const RING_DEPTH: u32 = 1024;

/// Runs one configuration; errors name what went wrong. The outcome's
/// `cpu` is always measured here.
pub fn run(seed: u64, run: &Run) -> Result<Outcome, HarnessError> {
    let _span = tracing::info_span!("clover_embedded", seed, switch = ?run.switch).entered();
    let mut topology = topology();
    topology.set_link(
        COMPUTE_HOST,
        LinkSpec {
            shape: None,
            faults: run.faults,
        },
    );
    let stage = RackBuilder::new(&topology)
        .thread_name("clover-fabric")
        .ring_depth(RING_DEPTH)
        .nic_seed(seed ^ 0xe5b)
        .own_cpu(COMPUTE_HOST)
        .build()?;
    crate::scenario::run(stage, seed, run)
}
