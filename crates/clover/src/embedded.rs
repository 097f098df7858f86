//! Clover on the embedded rack: real threads, the real clock and the
//! rack's in-process rings. A fabric thread runs the switch (plain L2/L3
//! forwarding or the resolver) and both soft RNICs, as `rack up
//! --mode embedded` does; an application thread runs the client pool and,
//! beside it, the metadata server. The application locks the compute
//! node's endpoint only to post and poll, as an application calls its
//! NIC's driver, and kicks the fabric thread after posting.
//!
//! CPU is split four ways, from each thread's CPU clock: the clients'
//! turns (application work, including posting verbs and taking
//! completions), the application's polling between turns, the metadata
//! server (off the data path, timed apart on the same thread), and the
//! fabric (NIC emulation and switch).

use crate::deploy::deploy;
use crate::harness::{topology, Application, CloverSwitch, HarnessError, Run, SwitchChoice};
use crate::history::Verdict;
use crate::metadata::MetadataStats;
use crate::pool::PoolStats;
use crate::resolver::{CloverResolver, ResolverCounters, ResolverMemory};
use remora_rack::assembly::{EmbeddedRack, RackBuilder};
use remora_rack::endpoint::{lock, thread_cpu_ns, RACK_ACK_TIMEOUT};
use remora_rack::topology::{LinkSpec, COMPUTE_HOST, MEMORY_HOST};
use remora_rnic::{RnicCounters, Timestamp};
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::{Switch, SwitchConfig};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const RING_DEPTH: u32 = 1024;
/// How often the clients take a turn with nothing completed: their
/// deadlines and cache lifetimes need a clock, not a tight loop.
const CLOCK_TURN: Duration = Duration::from_micros(100);

/// Where the CPU went, from each thread's CPU clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuSplit {
    /// The clients' turns on the application thread: feeding them, their
    /// state machines, posting verbs and taking completions.
    pub clients: Duration,
    /// The rest of the application thread: spinning on the compute
    /// node's activity counter between turns (a busy-polling
    /// application's idle time).
    pub polling: Duration,
    /// The metadata server's turns (slot batches, lookups, collection).
    pub metadata: Duration,
    /// The fabric thread: both soft RNICs and the switch, including the
    /// driver's short spin after work before it sleeps.
    pub fabric: Duration,
}

/// What a run on the embedded rack measured.
#[derive(Debug, Clone)]
pub struct EmbeddedOutcome {
    pub elapsed: Duration,
    pub stats: PoolStats,
    pub resolver: Option<ResolverCounters>,
    pub resolver_memory: Option<ResolverMemory>,
    pub metadata: MetadataStats,
    pub versions: u64,
    pub verdict: Option<Verdict>,
    pub cpu: CpuSplit,
    /// The compute node's and the memory node's RNIC counters.
    pub compute_rnic: RnicCounters,
    pub memory_rnic: RnicCounters,
}

impl EmbeddedOutcome {
    pub fn operations(&self) -> u64 {
        self.stats.reads + self.stats.writes
    }

    pub fn operations_per_second(&self) -> f64 {
        self.operations() as f64 / self.elapsed.as_secs_f64()
    }
}

/// Runs one configuration on its own application thread; errors name what
/// went wrong.
pub fn run(seed: u64, run: &Run) -> Result<EmbeddedOutcome, HarnessError> {
    let run = *run;
    let thread = std::thread::Builder::new()
        .name("clover-clients".into())
        .spawn(move || match run.switch {
            SwitchChoice::Plain => embedded::<L2L3Forwarding>(seed, &run, &[]),
            SwitchChoice::Resolver { cached_keys } => {
                embedded::<CloverResolver>(seed, &run, &run.hottest(cached_keys)?)
            }
        })
        .map_err(|error| HarnessError::Rack(remora_rack::RackError::Launch(error.to_string())))?;
    thread.join().map_err(|_| HarnessError::Panicked)?
}

fn embedded<P: CloverSwitch>(
    seed: u64,
    run: &Run,
    cached_keys: &[u64],
) -> Result<EmbeddedOutcome, HarnessError> {
    // The run's faults on the compute node's link.
    let mut topology = topology();
    topology.set_link(
        COMPUTE_HOST,
        LinkSpec {
            shape: None,
            faults: run.faults,
        },
    );
    let mut staged = RackBuilder::new(&topology)
        .thread_name("clover-fabric")
        .ring_depth(RING_DEPTH)
        .nic_seed(seed ^ 0xe5b)
        .build()?;
    let (compute, memory) = staged.nic_pair_mut(COMPUTE_HOST, MEMORY_HOST);
    let deployment = deploy(run.store(RACK_ACK_TIMEOUT), compute, memory)?;
    let (compute, memory) = staged.nic_pair_mut(COMPUTE_HOST, MEMORY_HOST);
    let program = P::build(&deployment, compute, memory, cached_keys)?;
    let switch = Switch::new(SwitchConfig::new(2), program);
    let (mut rack, switch) = staged.start(switch)?;
    let mut application = Application::new(deployment, run, seed)?;
    let started = Instant::now();
    let cpu = drive(&mut application, run, &rack)?;
    let elapsed = started.elapsed();
    let fabric_cpu = rack.stop_and_join()?;
    let finish = application.finish(&mut lock(rack.host(MEMORY_HOST)).rnic)?;
    let report = lock(&switch).switch.program().report();
    let compute_rnic = lock(rack.host(COMPUTE_HOST)).rnic.counters().clone();
    let memory_rnic = lock(rack.host(MEMORY_HOST)).rnic.counters().clone();
    Ok(EmbeddedOutcome {
        elapsed,
        stats: finish.stats,
        resolver: report.map(|(counters, _)| counters),
        resolver_memory: report.map(|(_, memory)| memory),
        metadata: finish.metadata,
        versions: finish.versions,
        verdict: finish.verdict,
        cpu: CpuSplit {
            fabric: fabric_cpu,
            ..cpu
        },
        compute_rnic,
        memory_rnic,
    })
}

/// The application loop until the workload is done: clients on the
/// compute node's RNIC, the metadata server on the memory node's region.
/// Returns the application thread's CPU, split.
fn drive(
    application: &mut Application,
    run: &Run,
    rack: &EmbeddedRack,
) -> Result<CpuSplit, HarnessError> {
    let (compute, memory) = (rack.host(COMPUTE_HOST), rack.host(MEMORY_HOST));
    let fabric = rack.fabric();
    let clock = remora_rack::endpoint::RackClock::new();
    // Every operation ends within the pool's deadline, and clients run
    // side by side, so the whole run fits in operations × deadline.
    let limit = Duration::from_secs(10) + run.grace * run.operations.min(1 << 20) as u32;
    let kicker = fabric.kicker();
    let activity = lock(compute).activity();
    let mut seen_activity = u64::MAX;
    let mut last_turn = Timestamp::ZERO;
    let started_cpu = thread_cpu_ns();
    let (mut metadata_ns, mut clients_ns) = (0, 0);
    while !application.finished() {
        let now = clock.now();
        if now.saturating_duration_since(Timestamp::ZERO) > limit {
            return Err(HarnessError::Unfinished(limit));
        }
        if fabric.is_finished() {
            return Err(HarnessError::Rack(remora_rack::RackError::Launch(
                "the fabric thread stopped".into(),
            )));
        }
        // Take the compute node's lock only when its RNIC may have
        // completed something, or now and then for the clients' clocks.
        let current = activity.load(Ordering::Acquire);
        if current != seen_activity || now.saturating_duration_since(last_turn) >= CLOCK_TURN {
            seen_activity = current;
            last_turn = now;
            let before = thread_cpu_ns();
            if application.turn_clients(now, &mut lock(compute).rnic)? {
                kicker.kick();
            }
            clients_ns += thread_cpu_ns() - before;
        }
        if application.metadata_due(now) {
            let before = thread_cpu_ns();
            application.turn_metadata(now, &mut lock(memory).rnic)?;
            kicker.kick();
            metadata_ns += thread_cpu_ns() - before;
        }
        std::hint::spin_loop();
    }
    let total_ns = thread_cpu_ns() - started_cpu;
    Ok(CpuSplit {
        clients: Duration::from_nanos(clients_ns),
        polling: Duration::from_nanos(total_ns.saturating_sub(clients_ns + metadata_ns)),
        metadata: Duration::from_nanos(metadata_ns),
        fabric: Duration::ZERO,
    })
}
