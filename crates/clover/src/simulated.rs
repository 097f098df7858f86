//! Clover in the deterministic simulator: a compute node running a pool
//! of clients, the switch (plain L2/L3 forwarding or the resolver) and a
//! memory node, over simulated links that may lose, duplicate and reorder
//! frames. The tests prove correctness here; `remora bench clover` and the
//! demo measure here too, in simulated time.

use crate::deploy::deploy;
use crate::harness::{ip, mac, Application, CloverSwitch, COMPUTE, MEMORY};
pub use crate::harness::{Run, SwitchChoice};
use crate::history::Verdict;
use crate::metadata::MetadataStats;
use crate::pool::PoolStats;
use crate::resolver::{CloverResolver, ResolverCounters, ResolverMemory};
use remora_host::Host;
use remora_rack::simulated::SimulatedRack;
use remora_rnic::*;
use remora_sim::LinkConfig;
use remora_switch::programs::l2l3::L2L3Forwarding;
use std::time::Duration;

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub simulated: Duration,
    pub stats: PoolStats,
    pub resolver: Option<ResolverCounters>,
    pub resolver_memory: Option<ResolverMemory>,
    pub metadata: MetadataStats,
    /// Versions found whole by the final audit.
    pub versions: u64,
    pub verdict: Option<Verdict>,
}

impl Outcome {
    pub fn operations_per_second(&self) -> f64 {
        (self.stats.reads + self.stats.writes) as f64 / self.simulated.as_secs_f64()
    }
}

/// How often the harness lets the clients act, in simulated time.
const CLIENT_TICK: Duration = Duration::from_micros(1);
/// The simulated queue pairs' ACK timeout.
const ACK_TIMEOUT: Duration = Duration::from_micros(200);

/// Runs one configuration; errors name what went wrong.
pub fn run(seed: u64, run: &Run) -> Result<Outcome, String> {
    match run.switch {
        SwitchChoice::Plain => simulate::<L2L3Forwarding>(seed, run, &[]),
        SwitchChoice::Resolver { cached_keys } => {
            simulate::<CloverResolver>(seed, run, &run.hottest(cached_keys)?)
        }
    }
}

fn simulate<P: CloverSwitch>(seed: u64, run: &Run, cached_keys: &[u64]) -> Result<Outcome, String> {
    let text = |error: &dyn std::fmt::Display| format!("seed {seed}: {error}");
    let mut compute = Host::new("compute", RnicConfig::new(mac(COMPUTE), ip(COMPUTE), seed));
    let mut memory = Host::new(
        "memory",
        RnicConfig::new(mac(MEMORY), ip(MEMORY), seed ^ 0xabc),
    );
    let deployment = deploy(run.store(ACK_TIMEOUT), compute.nic_mut(), memory.nic_mut())
        .map_err(|e| text(&e))?;
    let program = P::build(&deployment, compute.nic(), memory.nic(), cached_keys)?;
    let mut link = LinkConfig::rack();
    link.faults = run.faults;
    let mut rack = SimulatedRack::new(seed, program, vec![compute, memory], link);
    let (compute, memory) = (0, 1);
    let mut application = Application::new(deployment, run, seed).map_err(|e| text(&e))?;
    // Bounded: every operation finishes within the pool's deadline, so
    // the run fits in operations × grace of simulated time.
    let limit = Timestamp::from_nanos(run.operations * run.grace.as_nanos() as u64 + 1_000_000_000);
    // The harness's clock: the simulator stops at its last event when
    // nothing is due, but the clients' time (and their deadlines) go on.
    let mut now = Timestamp::ZERO;
    loop {
        now = now.max(rack.simulation.now());
        if now >= limit {
            return Err(text(&"the run did not finish"));
        }
        application
            .turn_clients(now, rack.rnic(compute))
            .map_err(|e| text(&e))?;
        if application.metadata_due(now) {
            application
                .turn_metadata(now, rack.rnic(memory))
                .map_err(|e| text(&e))?;
        }
        if application.finished() {
            break;
        }
        now = now.saturating_add(CLIENT_TICK);
        rack.simulation.run_until(now, 1_000_000);
    }
    let finish = application
        .finish(rack.rnic(memory))
        .map_err(|e| text(&e))?;
    let resolver = rack.program().report();
    Ok(Outcome {
        simulated: now.saturating_duration_since(Timestamp::ZERO),
        stats: finish.stats,
        resolver: resolver.map(|(counters, _)| counters),
        resolver_memory: resolver.map(|(_, memory)| memory),
        metadata: finish.metadata,
        versions: finish.versions,
        verdict: finish.verdict,
    })
}
