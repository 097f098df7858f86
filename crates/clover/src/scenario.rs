//! A Clover run written once against [`remora_rack::scenario::Rack`], run
//! by the simulator ([`crate::simulated`]) and by the embedded rack
//! ([`crate::embedded`]) alike: the store deployed on the compute and
//! memory hosts, the switch program (plain forwarding or the resolver),
//! the clients as an agent of the compute host and the metadata server as
//! an agent of the memory host; the run goes until every request
//! returned, then every list is audited and, if asked, the history
//! checked.

use crate::deploy::deploy;
use crate::harness::{
    Application, ClientsAgent, CloverSwitch, HarnessError, MetadataAgent, Run, SharedApplication,
    SwitchChoice,
};
use crate::metadata::MetadataStats;
use crate::pool::PoolStats;
use crate::resolver::{CloverResolver, ResolverCounters, ResolverMemory};
use remora_rack::assembly::CpuAccount;
use remora_rack::scenario::{Rack, RackStage};
use remora_rack::topology::{COMPUTE_HOST, MEMORY_HOST};
use remora_rack::RackError;
use remora_rnic::RnicCounters;
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_workloads::history::{Event, Verdict};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where the CPU went on the embedded rack, from each thread's CPU clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSplit {
    /// The clients' polls that moved, on the compute host's own CPU:
    /// feeding them, their state machines, posting verbs and taking
    /// completions.
    pub clients: Duration,
    /// The rest of the compute host's CPU: polling its NIC's activity
    /// between turns (a busy-polling application's idle time).
    pub polling: Duration,
    /// The metadata server's turns (slot batches, lookups, collection),
    /// on the memory host's CPU, which the fabric thread lends it.
    pub metadata: Duration,
    /// The fabric thread apart from the metadata server: both soft RNICs
    /// and the switch, including the driver's short spin before it sleeps.
    pub fabric: Duration,
}

impl CpuSplit {
    fn from_account(account: &CpuAccount) -> CpuSplit {
        let busy = |host: usize| -> Duration {
            account
                .agents
                .get(host)
                .and_then(|agents| agents.get(ONLY_AGENT))
                .copied()
                .unwrap_or_default()
        };
        let compute_cpu = account
            .host_cpus
            .get(COMPUTE_HOST)
            .copied()
            .flatten()
            .unwrap_or_default();
        CpuSplit {
            clients: busy(COMPUTE_HOST),
            polling: compute_cpu.saturating_sub(busy(COMPUTE_HOST)),
            metadata: busy(MEMORY_HOST),
            fabric: account.fabric,
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// From the start of the measured operations (after the run's
    /// warm-up) to the last request's return: virtual time in the
    /// simulator, the rack's clock on the embedded rack.
    pub elapsed: Duration,
    /// The measured operations' stats.
    pub stats: PoolStats,
    /// Operations completed in the whole run, warm-up included: what the
    /// CPU split, read once at the end, was spent on.
    pub operations_run: u64,
    pub resolver: Option<ResolverCounters>,
    pub resolver_memory: Option<ResolverMemory>,
    pub metadata: MetadataStats,
    /// Versions found whole by the final audit.
    pub versions: u64,
    /// Writes completed after the last collection.
    pub writes_since_collection: u64,
    pub verdict: Option<Verdict>,
    /// The checked history, when the run recorded one.
    pub history: Vec<Event>,
    /// The compute node's and the memory node's RNIC counters.
    pub compute_rnic: RnicCounters,
    pub memory_rnic: RnicCounters,
    /// Where the CPU went: measured on the embedded rack, `None` in the
    /// simulator.
    pub cpu: Option<CpuSplit>,
}

impl Outcome {
    pub fn operations(&self) -> u64 {
        self.stats.reads + self.stats.writes
    }

    pub fn operations_per_second(&self) -> f64 {
        self.operations() as f64 / self.elapsed.as_secs_f64()
    }
}

/// Each host runs one agent: the clients on the compute host, the
/// metadata server on the memory host.
const ONLY_AGENT: usize = 0;

/// Runs `run` on the two hosts of `stage` (simulated or embedded).
pub fn run<S: RackStage>(stage: S, seed: u64, run: &Run) -> Result<Outcome, HarnessError> {
    match run.switch {
        SwitchChoice::Plain => run_with::<S, L2L3Forwarding>(stage, seed, run, &[]),
        SwitchChoice::Resolver { cached_keys } => {
            run_with::<S, CloverResolver>(stage, seed, run, &run.hottest(cached_keys)?)
        }
    }
}

fn run_with<S: RackStage, P: CloverSwitch>(
    mut stage: S,
    seed: u64,
    run: &Run,
    cached_keys: &[u64],
) -> Result<Outcome, HarnessError> {
    let store = run.store(stage.queue_pair_timeout());
    let (compute, memory) = stage.nic_pair_mut(COMPUTE_HOST, MEMORY_HOST);
    let deployment = deploy(store, compute, memory)?;
    let (compute, memory) = stage.nic_pair_mut(COMPUTE_HOST, MEMORY_HOST);
    let program = P::build(&deployment, compute, memory, cached_keys)?;
    let application: SharedApplication =
        Arc::new(Mutex::new(Application::new(deployment, run, seed)?));
    stage.add_agent(
        COMPUTE_HOST,
        Box::new(ClientsAgent::new(Arc::clone(&application))),
    );
    stage.add_agent(
        MEMORY_HOST,
        Box::new(MetadataAgent::new(Arc::clone(&application))),
    );
    let mut rack = stage.start(program)?;
    let started = rack.now();
    let finished = || application.lock().expect("application lock").finished();
    match rack.run_until(&mut |_| finished(), run.time_limit()) {
        Ok(()) => {}
        Err(RackError::TimedOut(limit)) => return Err(HarnessError::Unfinished(limit)),
        Err(RackError::Agent { host, error }) => return Err(HarnessError::Agent { host, error }),
        Err(error) => return Err(error.into()),
    }
    let cpu = rack.stop()?.as_ref().map(CpuSplit::from_account);
    let application = application.lock().expect("application lock");
    let ended = application.finished_at().unwrap_or_else(|| rack.now());
    let started = application.measured_from().unwrap_or(started);
    let finish = rack.with_nic(MEMORY_HOST, |memory| application.finish(memory))?;
    let report = rack.with_program(|program| program.report());
    Ok(Outcome {
        elapsed: ended.saturating_duration_since(started),
        stats: finish.stats,
        operations_run: finish.operations_run,
        resolver: report.map(|(counters, _)| counters),
        resolver_memory: report.map(|(_, memory)| memory),
        metadata: finish.metadata,
        versions: finish.versions,
        writes_since_collection: finish.writes_since_collection,
        verdict: finish.verdict,
        history: finish.history,
        compute_rnic: rack.with_nic(COMPUTE_HOST, |nic| nic.counters().clone()),
        memory_rnic: rack.with_nic(MEMORY_HOST, |nic| nic.counters().clone()),
        cpu,
    })
}
