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
use crate::harness::{ip, mac, Application, CloverSwitch, Run, SwitchChoice, COMPUTE, MEMORY};
use crate::history::Verdict;
use crate::metadata::MetadataStats;
use crate::pool::PoolStats;
use crate::resolver::{CloverResolver, ResolverCounters, ResolverMemory};
use remora_carrier::wrappers::Faulty;
use remora_carrier::{Port, Segment, SegmentPlan};
use remora_rack::endpoint::{
    lock, thread_cpu_ns, Driver, FabricThread, NodeEndpoint, Pump, RackClock, Shared,
    SwitchEndpoint, RACK_ACK_TIMEOUT,
};
use remora_rnic::{RnicConfig, RnicCounters, SoftRnic, Timestamp};
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::{Switch, SwitchConfig};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const RING_DEPTH: u32 = 1024;
/// How often the clients take a turn with nothing completed: their
/// deadlines and cache lifetimes need a clock, not a tight loop.
const CLOCK_TURN: Duration = Duration::from_micros(100);

/// The switch's end and the node's end of one node's rings.
type HubAndSpoke = (Box<dyn Port>, Box<dyn Port>);

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
pub fn run(seed: u64, run: &Run) -> Result<EmbeddedOutcome, String> {
    let run = *run;
    let thread = std::thread::Builder::new()
        .name("clover-clients".into())
        .spawn(move || match run.switch {
            SwitchChoice::Plain => embedded::<L2L3Forwarding>(seed, &run, &[]),
            SwitchChoice::Resolver { cached_keys } => {
                embedded::<CloverResolver>(seed, &run, &run.hottest(cached_keys)?)
            }
        })
        .map_err(|error| format!("cannot start the application thread: {error}"))?;
    thread
        .join()
        .map_err(|_| "the application thread panicked".to_string())?
}

/// The compute node's port, with the run's faults on its way out.
fn compute_port(port: impl Port + 'static, run: &Run, seed: u64) -> Result<Box<dyn Port>, String> {
    if run.faults == remora_sim::LinkFaults::NONE {
        return Ok(Box::new(port));
    }
    Ok(Box::new(Faulty::new(port, run.faults, seed)))
}

fn embedded<P: CloverSwitch>(
    seed: u64,
    run: &Run,
    cached_keys: &[u64],
) -> Result<EmbeddedOutcome, String> {
    let text = |error: &dyn std::fmt::Display| error.to_string();
    let segment =
        Segment::anonymous(&SegmentPlan::star_one_waiter(2, RING_DEPTH)).map_err(|e| text(&e))?;
    let port = |index: u8| -> Result<HubAndSpoke, String> {
        let hub = segment.hub_port(u32::from(index)).map_err(|e| text(&e))?;
        let spoke = segment.spoke_port(u32::from(index)).map_err(|e| text(&e))?;
        Ok((Box::new(hub), Box::new(spoke)))
    };
    let (compute_hub, compute_spoke) = port(COMPUTE)?;
    let (memory_hub, memory_spoke) = port(MEMORY)?;
    let rnic = |index: u8| SoftRnic::new(RnicConfig::new(mac(index), ip(index), seed ^ 0xe5b));
    let mut compute = NodeEndpoint::new(
        "compute",
        rnic(COMPUTE),
        compute_port(compute_spoke, run, seed)?,
    );
    let mut memory = NodeEndpoint::new("memory", rnic(MEMORY), memory_spoke);
    let deployment = deploy(
        run.store(RACK_ACK_TIMEOUT),
        &mut compute.rnic,
        &mut memory.rnic,
    )
    .map_err(|e| text(&e))?;
    let program = P::build(&deployment, &compute.rnic, &memory.rnic, cached_keys)?;
    let switch = SwitchEndpoint::new(
        Switch::new(SwitchConfig::new(2), program),
        vec![compute_hub, memory_hub],
    );
    let (compute, memory, switch) = (shared(compute), shared(memory), shared(switch));
    let stop = Arc::new(AtomicBool::new(false));
    let pumps: Vec<Arc<Mutex<dyn Pump>>> = vec![switch.clone(), compute.clone(), memory.clone()];
    let driver = Driver::new(pumps, RackClock::new(), Arc::clone(&stop)).map_err(|e| text(&e))?;
    // Placement is left to the kernel: on a shared VM, a pinned thread
    // waits out its vCPU's steal instead of moving to the other vCPU.
    let fabric = FabricThread::start("clover-fabric", driver, stop, false).map_err(|e| text(&e))?;
    let mut application = Application::new(deployment, run, seed)?;
    let started = Instant::now();
    let cpu = drive(&mut application, run, &compute, &memory, &fabric)?;
    let elapsed = started.elapsed();
    let fabric_cpu = fabric.stop_and_join().map_err(|e| text(&e))?;
    let finish = application.finish(&mut lock(&memory).rnic)?;
    let report = lock(&switch).switch.program().report();
    let compute_rnic = lock(&compute).rnic.counters().clone();
    let memory_rnic = lock(&memory).rnic.counters().clone();
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

fn shared<T>(value: T) -> Shared<T> {
    Arc::new(Mutex::new(value))
}

/// The application loop until the workload is done: clients on the
/// compute node's RNIC, the metadata server on the memory node's region.
/// Returns the application thread's CPU, split.
fn drive(
    application: &mut Application,
    run: &Run,
    compute: &Shared<NodeEndpoint>,
    memory: &Shared<NodeEndpoint>,
    fabric: &FabricThread,
) -> Result<CpuSplit, String> {
    let clock = RackClock::new();
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
            return Err(format!("the run did not finish within {limit:?}"));
        }
        if fabric.is_finished() {
            return Err("the fabric thread stopped".into());
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
