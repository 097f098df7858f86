//! Clover in the deterministic simulator: a compute host whose clients
//! run as an agent, the switch (plain L2/L3 forwarding or the resolver)
//! and a memory host with the metadata server beside it, over simulated
//! links that may lose, duplicate and reorder frames. The agents' timers
//! are the simulator's events. The tests prove correctness here;
//! `remora bench clover` and the demo measure here too, in simulated time.

use crate::deploy::deploy;
use crate::harness::{
    topology, Application, ClientsAgent, CloverSwitch, HarnessError, MetadataAgent,
    SharedApplication,
};
pub use crate::harness::{Run, SwitchChoice};
use crate::history::Verdict;
use crate::metadata::MetadataStats;
use crate::pool::PoolStats;
use crate::resolver::{CloverResolver, ResolverCounters, ResolverMemory};
use remora_host::Host;
use remora_rack::simulated::SimulatedRack;
use remora_rack::topology::{COMPUTE_HOST, MEMORY_HOST};
use remora_rnic::*;
use remora_sim::LinkConfig;
use remora_switch::programs::l2l3::L2L3Forwarding;
use std::sync::{Arc, Mutex};
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
    /// Writes completed after the last collection.
    pub writes_since_collection: u64,
    pub verdict: Option<Verdict>,
    /// The checked history, when the run recorded one.
    pub history: Vec<crate::history::Event>,
}

impl Outcome {
    pub fn operations_per_second(&self) -> f64 {
        (self.stats.reads + self.stats.writes) as f64 / self.simulated.as_secs_f64()
    }
}

/// The simulated queue pairs' ACK timeout.
const ACK_TIMEOUT: Duration = Duration::from_micros(200);
/// Virtual time between the harness's looks at the run.
const LOOK_EVERY: Duration = Duration::from_millis(1);
/// Simulator steps per look, a bound on a runaway run.
const MAX_EVENTS_PER_LOOK: u64 = 10_000_000;

/// Runs one configuration; errors name what went wrong.
pub fn run(seed: u64, run: &Run) -> Result<Outcome, HarnessError> {
    let _span = tracing::info_span!("clover_simulated", seed, switch = ?run.switch).entered();
    match run.switch {
        SwitchChoice::Plain => simulate::<L2L3Forwarding>(seed, run, &[]),
        SwitchChoice::Resolver { cached_keys } => {
            simulate::<CloverResolver>(seed, run, &run.hottest(cached_keys)?)
        }
    }
}

fn simulate<P: CloverSwitch>(
    seed: u64,
    run: &Run,
    cached_keys: &[u64],
) -> Result<Outcome, HarnessError> {
    let topology = topology();
    let host = |index: usize, name: &str, nic_seed: u64| {
        let spec = topology.host(index);
        Host::new(name, RnicConfig::new(spec.mac, spec.address, nic_seed))
    };
    let mut compute = host(COMPUTE_HOST, "compute", seed);
    let mut memory = host(MEMORY_HOST, "memory", seed ^ 0xabc);
    let deployment = deploy(run.store(ACK_TIMEOUT), compute.nic_mut(), memory.nic_mut())?;
    let program = P::build(&deployment, compute.nic(), memory.nic(), cached_keys)?;
    let application: SharedApplication =
        Arc::new(Mutex::new(Application::new(deployment, run, seed)?));
    compute.add_agent(Box::new(ClientsAgent::new(application.clone())));
    memory.add_agent(Box::new(MetadataAgent::new(application.clone())));
    let mut link = LinkConfig::rack();
    link.faults = run.faults;
    let mut rack = SimulatedRack::new(seed, program, vec![compute, memory], link);
    // Bounded: every operation finishes within the pool's deadline, so
    // the run fits in operations × grace of simulated time.
    let limit =
        Duration::from_nanos(run.operations * run.grace.as_nanos() as u64) + Duration::from_secs(1);
    let finished = || application.lock().expect("application lock").finished();
    while !finished() {
        let now = rack.simulation.now();
        if now.saturating_duration_since(Timestamp::ZERO) >= limit {
            return Err(HarnessError::Unfinished(limit));
        }
        rack.simulation
            .run_until(now.saturating_add(LOOK_EVERY), MAX_EVENTS_PER_LOOK);
        for (index, name) in [(COMPUTE_HOST, "compute"), (MEMORY_HOST, "memory")] {
            if let Some(failure) = rack.host_mut(index).take_failures().into_iter().next() {
                return Err(HarnessError::Agent {
                    host: name,
                    error: failure.error,
                });
            }
        }
    }
    let simulated = rack
        .simulation
        .now()
        .saturating_duration_since(Timestamp::ZERO);
    let finish = application
        .lock()
        .expect("application lock")
        .finish(rack.rnic(MEMORY_HOST))?;
    let resolver = rack.program().report();
    Ok(Outcome {
        simulated,
        stats: finish.stats,
        resolver: resolver.map(|(counters, _)| counters),
        resolver_memory: resolver.map(|(_, memory)| memory),
        metadata: finish.metadata,
        versions: finish.versions,
        writes_since_collection: finish.writes_since_collection,
        verdict: finish.verdict,
        history: finish.history,
    })
}
