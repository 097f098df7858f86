//! Clover in the deterministic simulator: a compute node with many
//! clients, the switch (plain forwarding, or the resolver), and a memory
//! node, over links that lose, duplicate and reorder frames. For every
//! seed and both switch programs: each key's history is linearizable
//! (stateright's checker), every version list is whole, and, with the
//! resolver, no rewritten CAS ever failed. A long write-heavy run with
//! garbage collection stays within a fixed region.

use remora_clover::deploy::{deploy, Deployment, Feeder, StoreSpec};
use remora_clover::history;
use remora_clover::metadata::{MetadataConfig, RnicRegion};
use remora_clover::pool::PoolConfig;
use remora_clover::resolver::{CloverResolver, ResolverCounters};
use remora_fabric::node::RnicNode;
use remora_rnic::*;
use remora_sim::{LinkConfig, LinkFaults, Node, NodeId, PortId, Simulation};
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::{Program, Switch, SwitchConfig};
use remora_wire::{Ipv4Address, MacAddress};
use remora_workloads::ycsb::{Generator, RequestDistribution, WorkloadSpec};
use std::time::Duration;

enum Racked<P: Program> {
    Rnic(Box<RnicNode>),
    Switch(Box<Switch<P>>),
}

impl<P: Program> Racked<P> {
    fn rnic(&mut self) -> &mut SoftRnic {
        match self {
            Racked::Rnic(node) => &mut node.device,
            Racked::Switch(_) => panic!("not an RNIC"),
        }
    }
}

impl<P: Program> Node for Racked<P> {
    fn handle_frame(&mut self, now: Timestamp, port: PortId, frame: &[u8]) {
        match self {
            Racked::Rnic(node) => node.handle_frame(now, port, frame),
            Racked::Switch(switch) => switch.handle_frame(now, port, frame),
        }
    }

    fn poll_transmit(&mut self, now: Timestamp, buffer: &mut [u8]) -> Option<(PortId, usize)> {
        match self {
            Racked::Rnic(node) => node.poll_transmit(now, buffer),
            Racked::Switch(switch) => switch.poll_transmit(now, buffer),
        }
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        match self {
            Racked::Rnic(node) => node.poll_timeout(),
            Racked::Switch(switch) => switch.poll_timeout(),
        }
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        match self {
            Racked::Rnic(node) => node.handle_timeout(now),
            Racked::Switch(switch) => switch.handle_timeout(now),
        }
    }

    fn crash(&mut self, now: Timestamp) {
        match self {
            Racked::Rnic(node) => node.crash(now),
            Racked::Switch(switch) => Node::crash(switch.as_mut(), now),
        }
    }

    fn restart(&mut self, now: Timestamp) {
        match self {
            Racked::Rnic(node) => node.restart(now),
            Racked::Switch(switch) => Node::restart(switch.as_mut(), now),
        }
    }
}

const COMPUTE: u8 = 1;
const MEMORY: u8 = 2;
/// How often the harness lets the clients act, in simulated time.
const CLIENT_TICK: Duration = Duration::from_micros(2);

fn mac(index: u8) -> MacAddress {
    MacAddress([0x02, 0, 0, 0, 0, index])
}

fn ip(index: u8) -> Ipv4Address {
    Ipv4Address::new(10, 0, 0, index)
}

fn forwarding() -> L2L3Forwarding {
    let mut program = L2L3Forwarding::new(MacAddress([0x02, 0x5e, 0, 0, 0, 0xfe]), 16);
    for index in [COMPUTE, MEMORY] {
        program
            .add_attached_host(mac(index), ip(index), PortId(u16::from(index - 1)))
            .unwrap();
    }
    program
}

struct Run {
    clients: usize,
    keys: u64,
    operations: u64,
    read_proportion: f64,
    /// None: plain forwarding. Some(n): the resolver caching the n hottest.
    cached_keys: Option<usize>,
    faults: LinkFaults,
    region_bytes: u64,
    garbage_every: Option<Duration>,
    /// The garbage collector's grace; the clients' cache lifetime and
    /// deadline follow from it.
    grace: Duration,
    check_history: bool,
}

struct Outcome {
    resolver: Option<ResolverCounters>,
    conflicts: u64,
    versions: u64,
    carved_bytes: u64,
    retired: u64,
}

fn spec(run: &Run) -> StoreSpec {
    StoreSpec {
        key_count: run.keys,
        value_bytes: 16,
        region_bytes: run.region_bytes,
        clients: run.clients,
        metadata: MetadataConfig {
            batch_slots: 4,
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

fn generator(run: &Run, seed: u64) -> Generator {
    let mut workload = WorkloadSpec::preset("a").unwrap();
    workload.record_count = run.keys;
    workload.distribution = RequestDistribution::Zipfian;
    workload.zipfian_constant = 0.99;
    workload.mix.read = run.read_proportion;
    workload.mix.update = 1.0 - run.read_proportion;
    Generator::new(workload, seed).unwrap()
}

fn simulate<P: Program>(
    seed: u64,
    run: &Run,
    make_switch: impl FnOnce(&Deployment, &SoftRnic, &SoftRnic) -> P,
    counters: impl Fn(&P) -> Option<ResolverCounters>,
) -> Outcome {
    let mut compute = RnicNode::new(RnicConfig::new(mac(COMPUTE), ip(COMPUTE), seed));
    let mut memory = RnicNode::new(RnicConfig::new(mac(MEMORY), ip(MEMORY), seed ^ 0xabc));
    let mut deployment = deploy(spec(run), &mut compute.device, &mut memory.device).unwrap();
    let program = make_switch(&deployment, &compute.device, &memory.device);
    let mut simulation: Simulation<Racked<P>> = Simulation::new(seed);
    let switch = simulation.add_node(Racked::Switch(Box::new(Switch::new(
        SwitchConfig::new(2),
        program,
    ))));
    let mut link = LinkConfig::rack();
    link.faults = run.faults;
    let mut attach = |node: RnicNode, index: u8| -> NodeId {
        let id = simulation.add_node(Racked::Rnic(Box::new(node)));
        simulation.connect((id, PortId(0)), (switch, PortId(u16::from(index - 1))), link);
        id
    };
    let compute = attach(compute, COMPUTE);
    let memory = attach(memory, MEMORY);
    let mut feeder = Feeder::new(generator(run, seed), run.operations, 16);
    let region = deployment.memory_region;
    let mut last_collection = Timestamp::ZERO;
    // Bounded: every operation must finish within the pool's deadline, so
    // the whole run fits in operations × deadline of simulated time.
    let limit = Timestamp::from_nanos(run.operations * run.grace.as_nanos() as u64 + 1_000_000_000);
    // The harness's clock: the simulator stops at its last event when
    // nothing is due, but the clients' time (and their deadlines) go on.
    let mut now = Timestamp::ZERO;
    loop {
        now = now.max(simulation.now());
        assert!(now < limit, "seed {seed}: the run did not finish");
        feeder.feed(&mut deployment.pool).unwrap();
        let pool = &mut deployment.pool;
        pool.poll(now, simulation.node_mut(compute).rnic())
            .unwrap_or_else(|error| panic!("seed {seed}: {error}"));
        let mut memory_view = RnicRegion {
            rnic: simulation.node_mut(memory).rnic(),
            region,
        };
        if pool.wants_metadata() {
            pool.answer_metadata(now, &mut deployment.metadata, &mut memory_view)
                .unwrap();
        }
        if let Some(period) = run.garbage_every {
            if now.saturating_duration_since(last_collection) >= period {
                deployment.metadata.collect(now, &mut memory_view).unwrap();
                last_collection = now;
            }
        }
        if feeder.remaining == 0 && pool.all_idle() {
            break;
        }
        now = now.saturating_add(CLIENT_TICK);
        simulation.run_until(now, 100_000);
    }
    let mut memory_view = RnicRegion {
        rnic: simulation.node_mut(memory).rnic(),
        region,
    };
    let versions = deployment
        .metadata
        .audit(&mut memory_view)
        .unwrap_or_else(|error| panic!("seed {seed}: {error}"));
    if run.check_history {
        let verdict = history::check(deployment.pool.history()).unwrap();
        assert!(
            verdict.violations.is_empty(),
            "seed {seed}: keys {:?} are not linearizable",
            verdict.violations
        );
        assert_eq!(verdict.operations as u64, run.operations);

    }
    let Racked::Switch(switch_node) = simulation.node_mut(switch) else {
        unreachable!()
    };
    let stats = deployment.metadata.stats();
    Outcome {
        resolver: counters(switch_node.program()),
        conflicts: deployment.pool.stats().conflicts,
        versions,
        carved_bytes: stats.carved_bytes,
        retired: stats.versions_retired,
    }
}

fn plain(seed: u64, run: &Run) -> Outcome {
    simulate(seed, run, |_, _, _| forwarding(), |_| None)
}

fn resolved(seed: u64, run: &Run) -> Outcome {
    let hottest = generator(run, seed).spec().key_chooser().unwrap();
    let cached: Vec<u64> = match hottest {
        remora_workloads::distribution::KeyChooser::Zipfian(zipfian) => {
            zipfian.hottest(run.cached_keys.unwrap())
        }
        _ => unreachable!("the runs are zipfian"),
    };
    simulate(
        seed,
        run,
        |deployment, compute, memory| {
            deployment
                .resolver(forwarding(), compute, memory, &cached)
                .unwrap()
        },
        |program: &CloverResolver| Some(program.counters()),
    )
}

fn lossy(loss: f64) -> LinkFaults {
    LinkFaults {
        loss,
        duplicate: loss / 2.0,
        reorder: loss,
        reorder_delay: Duration::from_micros(20),
        corrupt: 0.0,
    }
}

fn contended(cached_keys: Option<usize>, faults: LinkFaults) -> Run {
    Run {
        clients: 8,
        keys: 16,
        operations: 200,
        read_proportion: 0.5,
        cached_keys,
        faults,
        region_bytes: 1 << 20,
        garbage_every: None,
        grace: Duration::from_millis(40),
        check_history: true,
    }
}

#[test]
fn plain_clover_is_linearizable_under_loss_across_seeds() {
    for seed in 0..6 {
        let outcome = plain(seed, &contended(None, lossy(0.02)));
        assert!(outcome.conflicts > 0, "seed {seed}: no contention, no test");
        assert!(outcome.versions > 16);
    }
}

#[test]
fn the_resolver_keeps_lists_whole_and_histories_linearizable_under_loss() {
    let mut rewritten = 0;
    let mut retransmissions = 0;
    for seed in 0..8 {
        let outcome = resolved(seed, &contended(Some(16), lossy(0.03)));
        let counters = outcome.resolver.unwrap();
        rewritten += counters.rewritten;
        retransmissions += counters.retransmissions_rewritten;
    }
    assert!(rewritten > 100, "the resolver rewrote only {rewritten} CASes");
    assert!(
        retransmissions > 0,
        "no retransmitted CAS was rewritten: the loss never hit one, so this proves nothing"
    );
}

#[test]
fn the_resolver_removes_most_conflicts_on_a_clean_path() {
    let run = contended(Some(16), LinkFaults::NONE);
    let mut without = 0;
    let mut with = 0;
    for seed in 0..4 {
        without += plain(seed, &Run { cached_keys: None, ..contended(None, LinkFaults::NONE) }).conflicts;
        let outcome = resolved(seed, &run);
        let counters = outcome.resolver.unwrap();
        assert_eq!(counters.rewrites_failed, 0, "seed {seed}: {counters:?}");
        with += outcome.conflicts;
    }
    assert!(
        with * 2 < without,
        "conflicts with the resolver {with}, without {without}"
    );
}

#[test]
fn keys_outside_the_cache_pass_untouched_and_stay_correct() {
    for seed in 0..4 {
        let outcome = resolved(seed, &contended(Some(2), lossy(0.01)));
        let counters = outcome.resolver.unwrap();
        assert!(counters.passed_uncached > 0, "seed {seed}: {counters:?}");
    }
}

#[test]
fn a_long_write_heavy_run_stays_within_a_fixed_region() {
    // 4000 writes of 64-byte slots would need 256 KiB without collection;
    // the region has 96 KiB.
    let run = Run {
        clients: 8,
        keys: 8,
        operations: 4000,
        read_proportion: 0.1,
        cached_keys: Some(8),
        faults: LinkFaults::NONE,
        region_bytes: 96 * 1024,
        garbage_every: Some(Duration::from_micros(200)),
        grace: Duration::from_millis(2),
        check_history: false,
    };
    let outcome = resolved(7, &run);
    assert!(outcome.retired > 3000, "retired {}", outcome.retired);
    assert!(outcome.carved_bytes <= 96 * 1024);
    assert!(outcome.versions <= 8 * 2 + 8 * 4, "versions {}", outcome.versions);
}
