//! Cowbird scenarios written once against [`remora_rack::scenario::Rack`],
//! run by the simulator and by the embedded rack alike.
//!
//! [`memory_crash`]: the checked histories through the Spot engine while
//! the memory host crashes and comes back. The pool survives (declared
//! durable); the engine's NIC, queue pairs and batches do not. The engine
//! reconnects through the compute host's connection service and resumes
//! from the compute blocks' engine words, and the history must still
//! hold: every request completes once and in order, every read is one the
//! model allows (a redone read may see later, still incomplete writes),
//! and the pool equals the models at the end.

use crate::connection::ConnectionService;
use crate::deploy::{deploy, CowbirdSpec, DeployError};
use crate::history::{HistoryApplication, HistoryError, ReadCheck, Workload};
use crate::simulated::{spec, topology};
use crate::spot::SpotStats;
use crate::spot_agent::SpotAgent;
use remora_rack::scenario::{Rack, RackStage};
use remora_rack::topology::{COMPUTE_HOST, MEMORY_HOST};
use remora_rack::RackError;
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
/// holds the two hosts of [`topology`] (simulated or embedded).
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
    let spec = CowbirdSpec {
        ack_timeout: stage.queue_pair_timeout(),
        ..spec(&workload)
    };
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
    let mut rack = stage.start(topology().forwarding())?;
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
    let done = |rack: &mut S::Running<_>| {
        rack.with_agent(
            COMPUTE_HOST,
            APPLICATION,
            |application: &mut HistoryApplication| application.is_done(),
        )
        .unwrap_or(false)
    };
    rack.run_until(&mut |rack| done(rack), plan.limit)?;
    let (completed, reads_checked) = rack
        .with_agent(
            COMPUTE_HOST,
            APPLICATION,
            |application: &mut HistoryApplication| {
                application.histories().check_pool(&pool, &workload)?;
                let histories = application.histories();
                Ok::<_, HistoryError>((histories.completed, histories.reads_checked))
            },
        )
        .ok_or(ScenarioError::AgentMissing)??;
    let (engine, engine_restarts) = rack
        .with_agent(MEMORY_HOST, ENGINE, |engine: &mut SpotAgent| {
            (engine.stats(), engine.restarts())
        })
        .ok_or(ScenarioError::AgentMissing)?;
    let compute_reconnects = rack
        .with_agent(
            COMPUTE_HOST,
            CONNECTION_SERVICE,
            |service: &mut ConnectionService| service.reconnects(),
        )
        .ok_or(ScenarioError::AgentMissing)?;
    Ok(CrashOutcome {
        completed,
        reads_checked,
        completed_at_crash,
        engine,
        engine_restarts,
        compute_reconnects,
    })
}
