//! Clover in the deterministic simulator: a compute node running a pool
//! of clients, the switch (plain L2/L3 forwarding or the resolver) and a
//! memory node, over simulated links that may lose, duplicate and reorder
//! frames. The tests prove correctness here; `remora bench clover` and the
//! demo measure here too, in simulated time.

use crate::deploy::{deploy, Deployment, Feeder, StoreSpec};
use crate::history::{self, Verdict};
use crate::metadata::{MetadataConfig, MetadataStats, RnicRegion};
use crate::pool::{PoolConfig, PoolStats};
use crate::resolver::{CloverResolver, ResolverCounters, ResolverMemory};
use remora_fabric::node::RnicNode;
use remora_rnic::*;
use remora_sim::{LinkConfig, LinkFaults, NodeId, PortId, Simulation};
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::simulated::RackNode;
use remora_switch::{Program, Switch, SwitchConfig};
use remora_wire::{Ipv4Address, MacAddress};
use remora_workloads::distribution::KeyChooser;
use remora_workloads::ycsb::{Generator, RequestDistribution, WorkloadSpec};
use std::time::Duration;

const COMPUTE: u8 = 1;
const MEMORY: u8 = 2;

fn mac(index: u8) -> MacAddress {
    MacAddress([0x02, 0, 0, 0, 0, index])
}

fn ip(index: u8) -> Ipv4Address {
    Ipv4Address::new(10, 0, 0, index)
}

/// The rack's forwarding between the two hosts.
pub fn forwarding() -> L2L3Forwarding {
    let mut program = L2L3Forwarding::new(MacAddress([0x02, 0x5e, 0, 0, 0, 0xfe]), 16);
    for index in [COMPUTE, MEMORY] {
        program
            .add_attached_host(mac(index), ip(index), PortId(u16::from(index - 1)))
            .expect("two hosts fit the table");
    }
    program
}

/// Which program the switch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchChoice {
    /// Plain L2/L3 forwarding: Clover resolves its own conflicts.
    Plain,
    /// The resolver, caching the `cached_keys` hottest keys.
    Resolver { cached_keys: usize },
}

/// One simulated run.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    pub clients: usize,
    pub keys: u64,
    pub operations: u64,
    pub read_proportion: f64,
    /// None for uniform keys, Some(θ) for zipfian.
    pub zipf_theta: Option<f64>,
    pub switch: SwitchChoice,
    pub faults: LinkFaults,
    pub region_bytes: u64,
    pub value_bytes: usize,
    pub garbage_every: Option<Duration>,
    /// The garbage collector's grace; the clients' cache lifetime and
    /// deadline follow from it.
    pub grace: Duration,
    pub check_history: bool,
}

impl Run {
    /// YCSB-style defaults: 64 clients, 1024 keys, zipf 0.75, half reads.
    pub fn new(switch: SwitchChoice) -> Run {
        Run {
            clients: 64,
            keys: 1024,
            operations: 20_000,
            read_proportion: 0.5,
            zipf_theta: Some(0.75),
            switch,
            faults: LinkFaults::NONE,
            region_bytes: 8 << 20,
            value_bytes: 16,
            garbage_every: Some(Duration::from_millis(1)),
            grace: Duration::from_millis(40),
            check_history: false,
        }
    }
}

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

fn spec(run: &Run) -> StoreSpec {
    StoreSpec {
        key_count: run.keys,
        value_bytes: run.value_bytes,
        region_bytes: run.region_bytes,
        clients: run.clients,
        metadata: MetadataConfig {
            batch_slots: 8,
            keep_versions: 2,
            grace: run.grace,
        },
        pool: PoolConfig {
            cache_lifetime: run.grace / 4,
            operation_deadline: run.grace / 2,
            record_history: run.check_history,
            ..PoolConfig::DEFAULT
        },
        ack_timeout: Duration::from_micros(200),
    }
}

fn workload(run: &Run) -> Result<WorkloadSpec, String> {
    let mut workload = WorkloadSpec::preset("a").map_err(|error| error.to_string())?;
    workload.record_count = run.keys;
    match run.zipf_theta {
        Some(theta) => {
            workload.distribution = RequestDistribution::Zipfian;
            workload.zipfian_constant = theta;
        }
        None => workload.distribution = RequestDistribution::Uniform,
    }
    workload.mix.read = run.read_proportion;
    workload.mix.update = 1.0 - run.read_proportion;
    Ok(workload)
}

/// The keys the resolver caches: the hottest of the workload.
fn hottest(run: &Run, count: usize) -> Result<Vec<u64>, String> {
    let count = count.min(run.keys as usize);
    match workload(run)?
        .key_chooser()
        .map_err(|error| error.to_string())?
    {
        KeyChooser::Zipfian(zipfian) => Ok(zipfian.hottest(count)),
        // With no skew, any keys are as hot as any others.
        _ => Ok((0..count as u64).collect()),
    }
}

/// Runs one configuration; errors name what went wrong.
pub fn run(seed: u64, run: &Run) -> Result<Outcome, String> {
    match run.switch {
        SwitchChoice::Plain => simulate(seed, run, |_, _, _| Ok(forwarding()), |_| None),
        SwitchChoice::Resolver { cached_keys } => {
            let cached = hottest(run, cached_keys)?;
            simulate(
                seed,
                run,
                |deployment, compute, memory| {
                    deployment
                        .resolver(forwarding(), compute, memory, &cached)
                        .map_err(|error| error.to_string())
                },
                |program: &CloverResolver| Some((program.counters(), program.memory())),
            )
        }
    }
}

type Built<P> = Result<P, String>;

fn simulate<P: Program>(
    seed: u64,
    run: &Run,
    make_switch: impl FnOnce(&Deployment, &SoftRnic, &SoftRnic) -> Built<P>,
    counters: impl Fn(&P) -> Option<(ResolverCounters, ResolverMemory)>,
) -> Result<Outcome, String> {
    let text = |error: &dyn std::fmt::Display| format!("seed {seed}: {error}");
    let mut compute = RnicNode::new(RnicConfig::new(mac(COMPUTE), ip(COMPUTE), seed));
    let mut memory = RnicNode::new(RnicConfig::new(mac(MEMORY), ip(MEMORY), seed ^ 0xabc));
    let mut deployment =
        deploy(spec(run), &mut compute.device, &mut memory.device).map_err(|e| text(&e))?;
    let program = make_switch(&deployment, &compute.device, &memory.device)?;
    let mut simulation: Simulation<RackNode<P>> = Simulation::new(seed);
    let switch = simulation.add_node(RackNode::Switch(Box::new(Switch::new(
        SwitchConfig::new(2),
        program,
    ))));
    let mut link = LinkConfig::rack();
    link.faults = run.faults;
    let mut attach = |node: RnicNode, index: u8| -> NodeId {
        let id = simulation.add_node(RackNode::Rnic(Box::new(node)));
        simulation.connect(
            (id, PortId(0)),
            (switch, PortId(u16::from(index - 1))),
            link,
        );
        id
    };
    let compute = attach(compute, COMPUTE);
    let memory = attach(memory, MEMORY);
    let generator = Generator::new(workload(run)?, seed).map_err(|e| text(&e))?;
    let mut feeder = Feeder::new(generator, run.operations, run.value_bytes);
    let region = deployment.memory_region;
    let mut last_collection = Timestamp::ZERO;
    // Bounded: every operation finishes within the pool's deadline, so
    // the run fits in operations × grace of simulated time.
    let limit = Timestamp::from_nanos(run.operations * run.grace.as_nanos() as u64 + 1_000_000_000);
    // The harness's clock: the simulator stops at its last event when
    // nothing is due, but the clients' time (and their deadlines) go on.
    let mut now = Timestamp::ZERO;
    loop {
        now = now.max(simulation.now());
        if now >= limit {
            return Err(text(&"the run did not finish"));
        }
        feeder.feed(&mut deployment.pool).map_err(|e| text(&e))?;
        let pool = &mut deployment.pool;
        pool.poll(now, simulation.node_mut(compute).rnic())
            .map_err(|e| text(&e))?;
        let mut memory_view = RnicRegion {
            rnic: simulation.node_mut(memory).rnic(),
            region,
        };
        if pool.wants_metadata() {
            pool.answer_metadata(now, &mut deployment.metadata, &mut memory_view)
                .map_err(|e| text(&e))?;
        }
        if let Some(period) = run.garbage_every {
            if now.saturating_duration_since(last_collection) >= period {
                deployment
                    .metadata
                    .collect(now, &mut memory_view)
                    .map_err(|e| text(&e))?;
                last_collection = now;
            }
        }
        if feeder.remaining == 0 && pool.all_idle() {
            break;
        }
        now = now.saturating_add(CLIENT_TICK);
        simulation.run_until(now, 1_000_000);
    }
    let mut memory_view = RnicRegion {
        rnic: simulation.node_mut(memory).rnic(),
        region,
    };
    let versions = deployment
        .metadata
        .audit(&mut memory_view)
        .map_err(|e| text(&e))?;
    let verdict = match run.check_history {
        true => Some(history::check(deployment.pool.history()).map_err(|e| text(&e))?),
        false => None,
    };
    let RackNode::Switch(switch_node) = simulation.node_mut(switch) else {
        unreachable!("node 0 is the switch")
    };
    let resolver = counters(switch_node.program());
    Ok(Outcome {
        simulated: now.saturating_duration_since(Timestamp::ZERO),
        stats: deployment.pool.stats().clone(),
        resolver: resolver.map(|(counters, _)| counters),
        resolver_memory: resolver.map(|(_, memory)| memory),
        metadata: deployment.metadata.stats(),
        versions,
        verdict,
    })
}
