//! Cowbird scenarios written once against [`remora_rack::scenario::Rack`],
//! run by the simulator and by the embedded rack alike.
//!
//! [`histories`]: the checked read/write histories through either engine
//! (Spot on the memory host, or Cowbird-P4 in the switch), with the memory
//! host crashed or its link cut mid-run if asked ([`Disruption`]). The
//! simulator's runs ([`crate::simulated`]) and the embedded rack's
//! ([`crate::embedded::run_histories`]) are this one function on two
//! stages.
//!
//! [`memory_crash`]: the checked histories through the Spot engine while
//! the memory host crashes and comes back once a number of requests
//! completed. The pool survives (declared durable); the engine's NIC,
//! queue pairs and batches do not. The engine reconnects through the
//! compute host's connection service and resumes from the compute blocks'
//! engine words, and the history must still hold: every request
//! completes once and in order, every read is one the model allows (a
//! redone read may see later, still incomplete writes), and the pool
//! equals the models at the end.

use crate::client::Client;
use crate::connection::ConnectionService;
use crate::deploy::{deploy, deploy_p4, CowbirdSpec, DeployError, SwitchPorts};
use crate::history::{Engine, HistoryApplication, HistoryError, ReadCheck, Workload};
use crate::layout::{ENTRY_BYTES, METADATA_TAIL_AT};
use crate::p4::{CowbirdP4, P4Engine, P4Stats};
use crate::spot::{InstanceFailure, SpotStats};
use crate::spot_agent::SpotAgent;
use remora_rack::scenario::{Rack, RackStage};
use remora_rack::topology::{COMPUTE_HOST, MEMORY_HOST};
use remora_rack::RackError;
use remora_rnic::HostMemory;
use remora_switch::PortId;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Which part of a scenario failed.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("deploying: {0}")]
    Deploy(#[from] DeployError),
    #[error(transparent)]
    History(#[from] HistoryError),
    #[error("the rack: {0}")]
    Rack(#[from] RackError),
    #[error("an agent the scenario placed is not where it put it")]
    AgentMissing,
    #[error("Cowbird-P4: {failure}; {stats:?}; {states}")]
    SwitchEngine {
        failure: String,
        stats: Box<P4Stats>,
        states: String,
    },
    #[error("writing a broken client's entry: {0}")]
    BrokenClient(remora_rnic::HostMemoryOutOfBounds),
    #[error("the switch's generator: {0}")]
    Generator(#[from] remora_switch::generator::GeneratorError),
    #[error("{error}; {context}")]
    WithCounters {
        error: Box<ScenarioError>,
        /// What the NICs and the switch saw.
        context: String,
    },
}

impl ScenarioError {
    /// The history check that failed, if that is what failed.
    pub fn history(&self) -> Option<&HistoryError> {
        match self {
            ScenarioError::History(error) => Some(error),
            ScenarioError::Rack(RackError::Agent { error, .. }) => {
                error.downcast_ref::<HistoryError>()
            }
            ScenarioError::WithCounters { error, .. } => error.history(),
            _ => None,
        }
    }
}

/// Something that happens to the memory host mid-run, its times counted
/// from the start of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disruption {
    /// The host goes down `at` into the run and comes back `down_for`
    /// later, with a fresh NIC; its pool survives.
    Crash { at: Duration, down_for: Duration },
    /// The host's link is cut `at` into the run for `cut_for`: long
    /// enough, the engine's queue pairs run out of retries.
    Partition { at: Duration, cut_for: Duration },
}

impl Disruption {
    /// When the disruption starts.
    pub fn at(&self) -> Duration {
        match *self {
            Disruption::Crash { at, .. } | Disruption::Partition { at, .. } => at,
        }
    }

    /// When the memory host is whole again.
    pub fn over_at(&self) -> Duration {
        match *self {
            Disruption::Crash { at, down_for } => at + down_for,
            Disruption::Partition { at, cut_for } => at + cut_for,
        }
    }

    fn start(&self, rack: &mut impl Rack) {
        match self {
            Disruption::Crash { .. } => rack.crash(MEMORY_HOST),
            Disruption::Partition { .. } => rack.partition(MEMORY_HOST),
        }
    }

    fn end(&self, rack: &mut impl Rack) -> Result<(), RackError> {
        match self {
            Disruption::Crash { .. } => rack.restart(MEMORY_HOST),
            Disruption::Partition { .. } => {
                rack.heal(MEMORY_HOST);
                Ok(())
            }
        }
    }
}

/// What a histories run measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// From the start to the end of the run: virtual time in the
    /// simulator, the rack's clock on the embedded rack.
    pub elapsed: Duration,
    pub completed: u64,
    pub reads_checked: u64,
    /// The Spot engine's counters over every incarnation (zero under
    /// Cowbird-P4).
    pub engine: SpotStats,
    /// Times the engine was rebuilt after its host restarted.
    pub engine_restarts: u64,
    /// Queue pairs the compute host connected anew for the engine.
    pub compute_reconnects: u64,
    /// Queue pairs live at the end on the compute and memory hosts' NICs:
    /// reconnections must not add to them.
    pub live_queue_pairs: (usize, usize),
    /// Cowbird-P4's counters, when it was the engine.
    pub switch_engine: Option<P4Stats>,
    /// Packets the memory host's NIC sent again.
    pub retransmissions: u64,
    /// The instances the Spot engine stopped serving, and why.
    pub engine_failures: Vec<InstanceFailure>,
}

/// When the memory host goes down and for how long.
#[derive(Debug, Clone, Copy)]
pub struct CrashPlan {
    /// The crash comes once this many requests completed.
    pub after_completed: u64,
    pub down_for: Duration,
    /// The application stops issuing at `after_completed` and resumes
    /// right after the crash, so its requests wait out the outage. For a
    /// rack that cannot stop time at the count: on the embedded rack the
    /// whole rest of the run can finish between two looks (a CI run saw
    /// the crash come after all 1200 requests). Requests in flight at the
    /// count drain before the crash; the simulator, which runs no further
    /// than its look, needs no hold and crashes with batches in flight.
    pub hold_issuing: bool,
    /// A bound on each phase of the run.
    pub limit: Duration,
}

/// What the scenario saw.
#[derive(Debug, Clone)]
pub struct CrashOutcome {
    pub completed: u64,
    pub reads_checked: u64,
    /// Requests completed when the host went down.
    pub completed_at_crash: u64,
    pub engine: SpotStats,
    pub engine_restarts: u64,
    pub compute_reconnects: u64,
}

/// Agents' places on their hosts, in the order the scenario adds them.
const APPLICATION: usize = 0;
const CONNECTION_SERVICE: usize = 1;
const ENGINE: usize = 0;

/// The Spot engine's memory host crashes mid-run and restarts; `stage`
/// holds the two hosts of [`crate::simulated::topology`] (simulated or
/// embedded).
pub fn memory_crash<S: RackStage>(
    mut stage: S,
    seed: u64,
    workload: &Workload,
    plan: CrashPlan,
) -> Result<CrashOutcome, ScenarioError> {
    let _span = tracing::info_span!("cowbird_memory_crash", seed).entered();
    let workload = Workload {
        spot_reads: ReadCheck::MayBeRedone,
        ..*workload
    };
    let spec = stage_spec(&stage, &workload);
    let (compute, memory) = stage.nic_pair_mut(COMPUTE_HOST, MEMORY_HOST);
    let deployment = deploy(spec, compute, memory)?;
    let pool = deployment.pool_memory[0].clone();
    let mut application = HistoryApplication::new(seed, workload, deployment.clients)?;
    if plan.hold_issuing {
        application.hold_issuing_at(plan.after_completed);
    }
    stage.add_agent(COMPUTE_HOST, Box::new(application));
    stage.add_agent(COMPUTE_HOST, Box::new(deployment.connection_service));
    stage.add_agent(MEMORY_HOST, Box::new(deployment.engine));
    let forwarding = stage.topology().forwarding();
    let mut rack = stage.start(forwarding)?;
    let completed = |rack: &mut S::Running<_>| {
        rack.with_agent(
            COMPUTE_HOST,
            APPLICATION,
            |application: &mut HistoryApplication| application.histories().completed,
        )
        .unwrap_or(0)
    };
    rack.run_until(
        &mut |rack| completed(rack) >= plan.after_completed,
        plan.limit,
    )?;
    let completed_at_crash = completed(&mut rack);
    rack.crash(MEMORY_HOST);
    rack.with_agent(
        COMPUTE_HOST,
        APPLICATION,
        |application: &mut HistoryApplication| application.release(),
    )
    .ok_or(ScenarioError::AgentMissing)?;
    rack.run_for(plan.down_for)?;
    rack.restart(MEMORY_HOST)?;
    run_to_done(&mut rack, plan.limit, &|_| Ok(()), true)?;
    let outcome = finish(&mut rack, &workload, &pool, Duration::ZERO)?;
    let outcome = spot_report(&mut rack, outcome)?;
    Ok(CrashOutcome {
        completed: outcome.completed,
        reads_checked: outcome.reads_checked,
        completed_at_crash,
        engine: outcome.engine,
        engine_restarts: outcome.engine_restarts,
        compute_reconnects: outcome.compute_reconnects,
    })
}

/// The checked histories through `workload.engine` on the two hosts of
/// `stage` (simulated or embedded), disrupting the memory host if asked;
/// each phase of the run is bounded by `limit`.
pub fn histories<S: RackStage>(
    stage: S,
    seed: u64,
    workload: &Workload,
    disruption: Option<Disruption>,
    limit: Duration,
) -> Result<Outcome, ScenarioError> {
    let _span = tracing::info_span!("cowbird_histories", seed, engine = ?workload.engine).entered();
    match workload.engine {
        Engine::Spot => spot_histories(stage, seed, workload, disruption, limit, 0),
        Engine::P4 => p4_histories(stage, seed, workload, disruption, limit),
    }
}

/// The checked histories through the Spot engine beside `broken`
/// clients that each put one entry no client library writes (an unknown
/// request type) in their ring: the engine must stop serving those
/// instances alone, and the workload's threads must all finish.
pub fn histories_beside_broken_clients<S: RackStage>(
    stage: S,
    seed: u64,
    workload: &Workload,
    broken: usize,
    limit: Duration,
) -> Result<Outcome, ScenarioError> {
    let _span = tracing::info_span!("cowbird_broken_clients", seed, broken).entered();
    spot_histories(stage, seed, workload, None, limit, broken)
}

/// The unknown request type a broken client writes.
pub const BROKEN_ENTRY_TYPE: u16 = 7;

/// Puts one entry of [`BROKEN_ENTRY_TYPE`] in `client`'s ring, behind the
/// library's back, and publishes it.
fn break_client(client: &Client) -> Result<(), ScenarioError> {
    let block = client.block();
    let mut entry = [0u8; ENTRY_BYTES as usize];
    entry[0..2].copy_from_slice(&BROKEN_ENTRY_TYPE.to_le_bytes());
    entry[4..8].copy_from_slice(&64u32.to_le_bytes());
    let at = client.sizes().entry_at(0) as usize;
    block
        .write(at, &entry)
        .map_err(ScenarioError::BrokenClient)?;
    block
        .store_u64(METADATA_TAIL_AT as usize, 1, Ordering::Release)
        .map_err(ScenarioError::BrokenClient)?;
    Ok(())
}

fn spot_histories<S: RackStage>(
    mut stage: S,
    seed: u64,
    workload: &Workload,
    disruption: Option<Disruption>,
    limit: Duration,
    broken: usize,
) -> Result<Outcome, ScenarioError> {
    let mut spec = stage_spec(&stage, workload);
    spec.threads += broken;
    let (compute, memory) = stage.nic_pair_mut(COMPUTE_HOST, MEMORY_HOST);
    let mut deployment = deploy(spec, compute, memory)?;
    let pool = deployment.pool_memory[0].clone();
    // Kept for the run: the engine reads their blocks.
    let broken_clients: Vec<Client> = deployment.clients.drain(..broken).collect();
    for client in &broken_clients {
        break_client(client)?;
    }
    let application = HistoryApplication::new(seed, *workload, deployment.clients)?;
    stage.add_agent(COMPUTE_HOST, Box::new(application));
    stage.add_agent(COMPUTE_HOST, Box::new(deployment.connection_service));
    stage.add_agent(MEMORY_HOST, Box::new(deployment.engine));
    let forwarding = stage.topology().forwarding();
    let mut rack = stage.start(forwarding)?;
    let elapsed = run_disrupted(&mut rack, disruption, limit, |_| Ok(()))
        .map_err(|error| with_counters(&mut rack, error))?;
    let outcome = finish(&mut rack, workload, &pool, elapsed)?;
    drop(broken_clients);
    spot_report(&mut rack, outcome)
}

fn p4_histories<S: RackStage>(
    mut stage: S,
    seed: u64,
    workload: &Workload,
    disruption: Option<Disruption>,
    limit: Duration,
) -> Result<Outcome, ScenarioError> {
    let spec = stage_spec(&stage, workload);
    let mut program = P4Engine::with_forwarding(workload.p4, stage.topology().forwarding());
    let (compute, memory) = stage.nic_pair_mut(COMPUTE_HOST, MEMORY_HOST);
    let deployment = deploy_p4(&spec, compute, memory, &mut program, switch_ports())?;
    let application = HistoryApplication::new(seed, *workload, deployment.clients)?;
    stage.add_agent(COMPUTE_HOST, Box::new(application));
    let template = program.probe_template();
    let mut rack = stage.start(program)?;
    let now = rack.now();
    rack.with_switch(|switch| switch.add_template(template, now))?;
    let elapsed = run_disrupted(&mut rack, disruption, limit, p4_failure)
        .map_err(|error| with_counters(&mut rack, error))?;
    let mut outcome = finish(&mut rack, workload, &deployment.pool_memory[0], elapsed)?;
    outcome.switch_engine = Some(rack.with_program(|program| program.stats()));
    Ok(outcome)
}

/// `outcome` with what the Spot engine and the compute host's connection
/// service counted.
fn spot_report(rack: &mut impl Rack, mut outcome: Outcome) -> Result<Outcome, ScenarioError> {
    (
        outcome.engine,
        outcome.engine_restarts,
        outcome.engine_failures,
    ) = rack
        .with_agent(MEMORY_HOST, ENGINE, |engine: &mut SpotAgent| {
            (
                engine.stats(),
                engine.restarts(),
                engine.failures().to_vec(),
            )
        })
        .ok_or(ScenarioError::AgentMissing)?;
    outcome.compute_reconnects = rack
        .with_agent(
            COMPUTE_HOST,
            CONNECTION_SERVICE,
            |service: &mut ConnectionService| service.reconnects(),
        )
        .ok_or(ScenarioError::AgentMissing)?;
    outcome.live_queue_pairs = (
        rack.with_nic(COMPUTE_HOST, |nic| nic.live_queue_pairs()),
        rack.with_nic(MEMORY_HOST, |nic| nic.live_queue_pairs()),
    );
    Ok(outcome)
}

/// The deployment of `workload`, its queue pairs timing out as the stage
/// wants.
fn stage_spec(stage: &impl RackStage, workload: &Workload) -> CowbirdSpec {
    CowbirdSpec {
        ack_timeout: stage.queue_pair_timeout(),
        ..spec(workload)
    }
}

/// Runs until the application is done, through `disruption` if given;
/// `look` is asked between steps for a failure the agents cannot report
/// (Cowbird-P4's, in the switch). Returns how long the run took.
fn run_disrupted<R: Rack>(
    rack: &mut R,
    disruption: Option<Disruption>,
    limit: Duration,
    look: impl Fn(&mut R) -> Result<(), ScenarioError>,
) -> Result<Duration, ScenarioError> {
    let started = rack.now();
    let elapsed = |rack: &R| rack.now().saturating_duration_since(started);
    if let Some(disruption) = disruption {
        let until = disruption.at();
        if !run_to_done(rack, until, &look, false)? {
            disruption.start(rack);
            let over = disruption.over_at().saturating_sub(elapsed(rack));
            run_to_done(rack, over, &|_: &mut R| Ok(()), false)?;
            disruption.end(rack)?;
        }
    }
    run_to_done(rack, limit, &look, true)?;
    Ok(elapsed(rack))
}

/// Runs until the application is done (true) or `limit` passes (false,
/// or the unfinished requests as the error if `must_finish`).
fn run_to_done<R: Rack>(
    rack: &mut R,
    limit: Duration,
    look: &dyn Fn(&mut R) -> Result<(), ScenarioError>,
    must_finish: bool,
) -> Result<bool, ScenarioError> {
    let mut seen: Option<ScenarioError> = None;
    let mut done = |rack: &mut R| match look(rack) {
        Err(error) => {
            seen = Some(error);
            true
        }
        Ok(()) => application_is_done(rack),
    };
    let outcome = rack.run_until(&mut done, limit);
    if let Some(error) = seen {
        return Err(error);
    }
    match outcome {
        Ok(()) => Ok(true),
        Err(RackError::TimedOut(_)) if !must_finish => Ok(false),
        Err(RackError::TimedOut(_)) => Err(rack
            .with_agent(
                COMPUTE_HOST,
                APPLICATION,
                |application: &mut HistoryApplication| application.histories().unfinished(),
            )
            .ok_or(ScenarioError::AgentMissing)?
            .into()),
        Err(error) => Err(error.into()),
    }
}

fn application_is_done(rack: &mut impl Rack) -> bool {
    rack.with_agent(
        COMPUTE_HOST,
        APPLICATION,
        |application: &mut HistoryApplication| application.is_done(),
    )
    .unwrap_or(false)
}

/// Cowbird-P4's first failure, with every instance's state.
fn p4_failure(rack: &mut impl Rack<Program = CowbirdP4>) -> Result<(), ScenarioError> {
    rack.with_program(|program| {
        let threads = program.instance_count();
        let Some(failure) = (0..threads).find_map(|index| program.failure(index)) else {
            return Ok(());
        };
        let states: Vec<String> = (0..threads)
            .filter_map(|index| program.describe(index))
            .collect();
        Err(ScenarioError::SwitchEngine {
            failure: failure.to_string(),
            stats: Box::new(program.stats()),
            states: states.join("; "),
        })
    })
}

/// `error`, with what the NICs and the switch saw.
fn with_counters<R: Rack>(rack: &mut R, error: ScenarioError) -> ScenarioError {
    let describe = |counters: &remora_rnic::RnicCounters| {
        format!(
            "frames out/in {}/{}, retransmitted {}, timeouts {}, drops {:?}",
            counters.frames_transmitted,
            counters.frames_received,
            counters.packets_retransmitted,
            counters.retransmit_timeouts,
            counters.drops_by_name()
        )
    };
    let compute = rack.with_nic(COMPUTE_HOST, |nic| describe(nic.counters()));
    let memory = rack.with_nic(MEMORY_HOST, |nic| describe(nic.counters()));
    let switch = rack.with_switch(|switch| format!("{:?}", switch.counters()));
    ScenarioError::WithCounters {
        error: Box::new(error),
        context: format!("compute NIC: {compute}; memory NIC: {memory}; switch: {switch}"),
    }
}

/// The pool equals the models, and what the run measured.
fn finish<R: Rack>(
    rack: &mut R,
    workload: &Workload,
    pool: &HostMemory,
    elapsed: Duration,
) -> Result<Outcome, ScenarioError> {
    rack.stop()?;
    let (completed, reads_checked) = rack
        .with_agent(
            COMPUTE_HOST,
            APPLICATION,
            |application: &mut HistoryApplication| {
                let histories = application.histories();
                histories.check_pool(pool, workload)?;
                Ok::<_, HistoryError>((histories.completed, histories.reads_checked))
            },
        )
        .ok_or(ScenarioError::AgentMissing)??;
    Ok(Outcome {
        elapsed,
        completed,
        reads_checked,
        engine: SpotStats::default(),
        engine_restarts: 0,
        compute_reconnects: 0,
        live_queue_pairs: (0, 0),
        switch_engine: None,
        engine_failures: Vec::new(),
        retransmissions: rack.with_nic(MEMORY_HOST, |nic| nic.counters().packets_retransmitted),
    })
}

/// The deployment a checked workload runs on.
pub fn spec(workload: &Workload) -> CowbirdSpec {
    CowbirdSpec {
        threads: workload.threads,
        sizes: workload.sizes,
        pool_regions: vec![workload.window_bytes * workload.threads as u64],
        spot: workload.spot,
        ack_timeout: Duration::from_micros(200),
        direct: None,
        rpc: None,
    }
}

/// The switch ports of the two hosts, for Cowbird-P4.
pub fn switch_ports() -> SwitchPorts {
    SwitchPorts {
        compute: PortId(COMPUTE_HOST as u16),
        memory: PortId(MEMORY_HOST as u16),
    }
}
