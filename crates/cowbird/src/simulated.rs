//! Cowbird in the deterministic simulator: a compute host whose
//! application issues mixed async reads and writes through the client
//! library, the switch, and a memory host running the Spot engine, over
//! links that may lose, duplicate and reorder frames. Every program is an
//! agent of its host, so its timers are the simulator's events, and the
//! memory host can crash and restart mid-run ([`MemoryCrash`]).
//!
//! The engine is the Spot engine on the memory host or Cowbird-P4 in the
//! switch ([`Engine`]); the workload and its checks are
//! [`crate::history`]'s.

use crate::deploy::{deploy, deploy_p4, CowbirdSpec, DeployError, SwitchPorts};
pub use crate::history::{Engine, ReadCheck, Workload};
use crate::history::{HistoryApplication, HistoryError};
use crate::p4::{CowbirdP4, P4Config, P4Engine, P4Stats};
use crate::spot::SpotStats;
use crate::spot_agent::SpotAgent;
use remora_base::Timestamp;
use remora_host::Host;
use remora_rack::scenario::Rack;
use remora_rack::simulated::SimulatedRack;
use remora_rack::topology::{Topology, COMPUTE_HOST, MEMORY_HOST};
use remora_rack::RackError;
use remora_rnic::{HostMemory, RnicConfig};
use remora_sim::{Event, LinkConfig, LinkFaults, Probability};
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::{PortId, Program};
use std::time::Duration;

/// The agents' places on their hosts.
const APPLICATION_AGENT: usize = 0;
const ENGINE_AGENT: usize = 0;

/// The rack's two hosts and the switch between them.
pub fn topology() -> Topology {
    Topology::compute_and_memory()
}

/// The switch's forwarding between the two hosts.
pub fn forwarding() -> L2L3Forwarding {
    topology().forwarding()
}

#[derive(Debug, Clone)]
pub struct Outcome {
    pub simulated: Duration,
    pub completed: u64,
    pub reads_checked: u64,
    /// The Spot engine's counters over every incarnation (zero under
    /// Cowbird-P4).
    pub engine: SpotStats,
    /// Times the engine was rebuilt after its host restarted.
    pub engine_restarts: u64,
    /// Queue pairs the compute host connected anew for the engine.
    pub compute_reconnects: u64,
    /// Cowbird-P4's counters, when it was the engine.
    pub switch_engine: Option<P4Stats>,
    pub retransmissions: u64,
}

/// Which check of a simulated run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("seed {seed}: deploying: {error}")]
    Deploy { seed: u64, error: DeployError },
    #[error("seed {seed}: {error}")]
    Rack { seed: u64, error: RackError },
    #[error("seed {seed}: {error}")]
    History { seed: u64, error: HistoryError },
    #[error("seed {seed}: Cowbird-P4: {failure}; {stats:?}; {states}")]
    SwitchEngine {
        seed: u64,
        failure: String,
        stats: Box<P4Stats>,
        states: String,
    },
}

impl RunError {
    /// The history check that failed, if that is what failed.
    pub fn history(&self) -> Option<&HistoryError> {
        match self {
            RunError::History { error, .. } => Some(error),
            RunError::Rack {
                error: RackError::Agent { error, .. },
                ..
            } => error.downcast_ref::<HistoryError>(),
            _ => None,
        }
    }
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

/// Something that happens to the memory host mid-run.
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
    /// When the memory host is whole again.
    pub fn over_at(&self) -> Duration {
        match *self {
            Disruption::Crash { at, down_for } => at + down_for,
            Disruption::Partition { at, cut_for } => at + cut_for,
        }
    }

    fn schedule<P: Program>(&self, rack: &mut SimulatedRack<P>) {
        let instant = |duration| Timestamp::ZERO.saturating_add(duration);
        let (node, link) = (rack.hosts[MEMORY_HOST], rack.links[MEMORY_HOST]);
        let (start, end, stop) = match *self {
            Disruption::Crash { at, .. } => (Event::Crash(node), Event::Restart(node), at),
            Disruption::Partition { at, .. } => (Event::Partition(link), Event::Heal(link), at),
        };
        rack.simulation.schedule(instant(stop), start);
        rack.simulation.schedule(instant(self.over_at()), end);
    }
}

/// Runs the workload on one seed.
pub fn run(seed: u64, workload: &Workload) -> Result<Outcome, RunError> {
    run_with(seed, workload, None)
}

/// Runs the workload on one seed, disrupting the memory host if asked.
pub fn run_with(
    seed: u64,
    workload: &Workload,
    disruption: Option<Disruption>,
) -> Result<Outcome, RunError> {
    let _span = tracing::info_span!("cowbird_simulated", seed, engine = ?workload.engine).entered();
    let topology = topology();
    let host = |index: usize, name: &str, nic_seed: u64| {
        let spec = topology.host(index);
        Host::new(name, RnicConfig::new(spec.mac, spec.address, nic_seed))
    };
    let mut compute = host(COMPUTE_HOST, "compute", seed);
    let mut memory = host(MEMORY_HOST, "memory", seed ^ 0xc0b);
    let mut link = LinkConfig::rack();
    link.faults = workload.faults;
    let spec = spec(workload);
    let deploy_error = |error| RunError::Deploy { seed, error };
    let history_error = |error| RunError::History { seed, error };
    match workload.engine {
        Engine::Spot => {
            let deployment =
                deploy(spec, compute.nic_mut(), memory.nic_mut()).map_err(deploy_error)?;
            let application = HistoryApplication::new(seed, *workload, deployment.clients)
                .map_err(history_error)?;
            compute.add_agent(Box::new(application));
            compute.add_agent(Box::new(deployment.connection_service));
            memory.add_agent(Box::new(deployment.engine));
            let mut rack =
                SimulatedRack::new(seed, topology.forwarding(), vec![compute, memory], link);
            if let Some(disruption) = disruption {
                disruption.schedule(&mut rack);
            }
            drive(seed, workload, &mut rack, |_| Ok(()))?;
            let engine = rack
                .host(MEMORY_HOST)
                .agent_as::<SpotAgent>(ENGINE_AGENT)
                .expect("the memory host runs the engine");
            let (stats, restarts) = (engine.stats(), engine.restarts());
            let pool = engine.pool()[0].clone();
            let mut outcome = finish(seed, workload, &mut rack, &pool)?;
            outcome.engine = stats;
            outcome.engine_restarts = restarts;
            outcome.compute_reconnects = rack
                .host(COMPUTE_HOST)
                .agent_as::<crate::connection::ConnectionService>(1)
                .expect("the compute host runs the connection service")
                .reconnects();
            Ok(outcome)
        }
        Engine::P4 => {
            let mut program = P4Engine::with_forwarding(workload.p4, topology.forwarding());
            let ports = SwitchPorts {
                compute: topology.port(COMPUTE_HOST),
                memory: topology.port(MEMORY_HOST),
            };
            let deployment = deploy_p4(
                &spec,
                compute.nic_mut(),
                memory.nic_mut(),
                &mut program,
                ports,
            )
            .map_err(deploy_error)?;
            let application = HistoryApplication::new(seed, *workload, deployment.clients)
                .map_err(history_error)?;
            compute.add_agent(Box::new(application));
            let template = program.probe_template();
            let mut rack = SimulatedRack::new(seed, program, vec![compute, memory], link);
            rack.switch_mut()
                .add_template(template, Timestamp::ZERO)
                .expect("a fresh generator takes the probe template");
            drive(seed, workload, &mut rack, |rack| {
                p4_failure(seed, workload, rack)
            })?;
            let mut outcome = finish(seed, workload, &mut rack, &deployment.pool_memory[0])?;
            outcome.switch_engine = Some(rack.program().stats());
            Ok(outcome)
        }
    }
}

fn p4_failure(
    seed: u64,
    workload: &Workload,
    rack: &mut SimulatedRack<CowbirdP4>,
) -> Result<(), RunError> {
    let program = rack.program();
    let Some(failure) = (0..workload.threads).find_map(|index| program.failure(index)) else {
        return Ok(());
    };
    let states: Vec<String> = (0..workload.threads)
        .filter_map(|index| program.describe(index))
        .collect();
    Err(RunError::SwitchEngine {
        seed,
        failure: failure.to_string(),
        stats: Box::new(program.stats()),
        states: states.join("; "),
    })
}

fn application(rack: &SimulatedRack<impl Program>) -> &HistoryApplication {
    rack.host(COMPUTE_HOST)
        .agent_as::<HistoryApplication>(APPLICATION_AGENT)
        .expect("the compute host runs the application")
}

/// Runs the simulation until the application is done (through the
/// rack's own `run_until`, which also stops at an agent's failure), with
/// `look` asked between steps for a failure the agents cannot report
/// (Cowbird-P4's, in the switch).
fn drive<P: Program>(
    seed: u64,
    workload: &Workload,
    rack: &mut SimulatedRack<P>,
    mut look: impl FnMut(&mut SimulatedRack<P>) -> Result<(), RunError>,
) -> Result<(), RunError> {
    let total = workload.operations_per_thread * workload.threads as u64;
    let limit = Duration::from_nanos(total * 20_000_000 + 1_000_000_000);
    let mut seen: Option<RunError> = None;
    let mut done = |rack: &mut SimulatedRack<P>| match look(rack) {
        Err(error) => {
            seen = Some(error);
            true
        }
        Ok(()) => application(rack).is_done(),
    };
    let outcome = rack.run_until(&mut done, limit);
    if let Some(error) = seen {
        return Err(error);
    }
    match outcome {
        Ok(()) => Ok(()),
        Err(RackError::TimedOut(_)) => Err(RunError::History {
            seed,
            error: application(rack).histories().unfinished(),
        }),
        Err(error) => Err(RunError::Rack { seed, error }),
    }
}

/// The pool equals the models, and what the run measured.
fn finish<P: Program>(
    seed: u64,
    workload: &Workload,
    rack: &mut SimulatedRack<P>,
    pool: &HostMemory,
) -> Result<Outcome, RunError> {
    let histories = application(rack).histories();
    histories
        .check_pool(pool, workload)
        .map_err(|error| RunError::History { seed, error })?;
    let (completed, reads_checked) = (histories.completed, histories.reads_checked);
    Ok(Outcome {
        simulated: rack
            .simulation
            .now()
            .saturating_duration_since(Timestamp::ZERO),
        completed,
        reads_checked,
        engine: SpotStats::default(),
        engine_restarts: 0,
        compute_reconnects: 0,
        switch_engine: None,
        retransmissions: rack.rnic(MEMORY_HOST).counters().packets_retransmitted,
    })
}

/// The switch ports of the two hosts, for Cowbird-P4.
pub fn switch_ports() -> SwitchPorts {
    SwitchPorts {
        compute: PortId(COMPUTE_HOST as u16),
        memory: PortId(MEMORY_HOST as u16),
    }
}
