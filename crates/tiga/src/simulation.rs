//! The virtual SmartNIC: SoC cores, processing agents, the DN's DMA, the
//! network link and the CN's cores, run in virtual time.
//!
//! Each request is one arrival in an open-loop Poisson stream. Its stages
//! are charged their calibrated cost ([`crate::calibration`]) on a virtual
//! core, scaled by the SoC slowdown, instead of being executed; one
//! request in `sample_every` also runs the real code on both paths and the
//! results are compared. The event loop is this module's own rather than
//! `remora-sim`'s generic one: a 10 M requests/s overload is tens of
//! millions of events per virtual second, and a specialised heap of plain
//! integers keeps that within the quick benchmark's budget. Runs are
//! deterministic for a seed, a configuration and a calibration.
//!
//! Schemes (§5.1): TIGA (partitioned, Eq. 4, co-processing), TIGA without
//! CPU, FairNIC (the even split, never changed), Floem (every core
//! time-shared, FCFS or DRR, paying a context switch whenever a core
//! changes engine), iPipe (time-shared DRR; under overload its slowest
//! actor migrates to the DN's host CPU when one is given), and CPU-only
//! (the CN fetches the data over the link and runs the CN version).

use crate::allocator::{Controller, ControllerMode, PeriodCounters};
use crate::apps::{App, MAX_PAYLOAD_BYTES, MIN_PAYLOAD_BYTES};
use crate::calibration::{Calibration, CostCurve};
use crate::config::{ConfigError, SocConfig};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// How the SmartNIC's cores are managed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scheme {
    Tiga,
    TigaWithoutCpu,
    FairNic,
    FloemFcfs,
    FloemDrr,
    IPipe,
    CpuOnly,
}

impl Scheme {
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Tiga => "tiga",
            Scheme::TigaWithoutCpu => "tiga_without_cpu",
            Scheme::FairNic => "fairnic",
            Scheme::FloemFcfs => "floem_fcfs",
            Scheme::FloemDrr => "floem_drr",
            Scheme::IPipe => "ipipe",
            Scheme::CpuOnly => "cpu_only",
        }
    }

    fn time_shared(self) -> Option<Dispatch> {
        match self {
            Scheme::FloemFcfs => Some(Dispatch::Fcfs),
            Scheme::FloemDrr | Scheme::IPipe => Some(Dispatch::Drr),
            _ => None,
        }
    }

    fn controller_mode(self) -> Option<ControllerMode> {
        match self {
            Scheme::Tiga => Some(ControllerMode {
                reallocate: true,
                coprocess: true,
            }),
            Scheme::TigaWithoutCpu => Some(ControllerMode {
                reallocate: true,
                coprocess: false,
            }),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dispatch {
    Fcfs,
    Drr,
}

/// Payload sizes over time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum PayloadSchedule {
    Fixed(usize),
    /// `sizes[k]` during the k-th interval, cycling.
    Alternating {
        sizes: Vec<usize>,
        interval_ns: u64,
    },
}

impl PayloadSchedule {
    fn bytes_at(&self, now_ns: u64) -> usize {
        match self {
            PayloadSchedule::Fixed(bytes) => *bytes,
            PayloadSchedule::Alternating { sizes, interval_ns } => {
                sizes[((now_ns / interval_ns.max(&1)) % sizes.len() as u64) as usize]
            }
        }
    }

    fn sizes(&self) -> Vec<usize> {
        match self {
            PayloadSchedule::Fixed(bytes) => vec![*bytes],
            PayloadSchedule::Alternating { sizes, .. } => sizes.clone(),
        }
    }
}

/// What is offered, for how long, and what is measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Workload {
    /// Applications sharing the NIC; requests are spread over them in
    /// turn, so each gets an equal share.
    pub apps: Vec<App>,
    pub offered_per_second: f64,
    pub payload: PayloadSchedule,
    pub duration_ns: u64,
    /// Throughput, latency and CPU are measured from here to the end.
    pub measure_from_ns: u64,
    /// With `scheme` IPipe: give it the DN's host CPU to migrate to (Fig.
    /// 7); without, the SmartNIC alone (Fig. 6).
    pub host_cpu_for_ipipe: bool,
    pub seed: u64,
}

/// Why a run could not be made or did not hold its invariants.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Allocation(#[from] crate::allocator::AllocationError),
    #[error("a workload needs at least one application")]
    NoApps,
    #[error("an alternating payload needs at least one size")]
    NoPayloadSizes,
    #[error("payload of {0} bytes is outside {MIN_PAYLOAD_BYTES}..={MAX_PAYLOAD_BYTES}")]
    PayloadSize(usize),
    #[error("offered load {0}/s is not positive and finite")]
    BadLoad(f64),
    #[error("the run would offer {0:.0} requests: at most {MAX_REQUESTS}")]
    TooManyRequests(f64),
    #[error("the run would detect {0} times (its duration over the detection period): at most {MAX_DETECTIONS}")]
    TooManyDetections(u64),
    #[error("a run of {0} ns is past the longest, {MAX_DURATION_NS} ns (an hour of virtual time)")]
    TooLong(u64),
    #[error("the calibration: {0}")]
    Calibration(#[from] crate::calibration::CalibrationError),
    #[error("the measurement window starts at {measure_from_ns} ns, after the run's end at {duration_ns} ns")]
    BadWindow {
        measure_from_ns: u64,
        duration_ns: u64,
    },
    #[error("request {id} completed twice (exactly-once violated)")]
    CompletedTwice { id: u64 },
    #[error("request {id} of {app:?}: the NIC path and the CN version disagree")]
    ResultsDiffer { id: u64, app: App },
    #[error("request {id} of {app:?} failed its real code: {error}")]
    Stage {
        id: u64,
        app: App,
        error: crate::apps::StageError,
    },
    #[error(
        "{in_flight} requests are in flight by their status, but queues and cores hold {held}"
    )]
    LostRequests { in_flight: u64, held: u64 },
    #[error("accounting: {offered} offered, but {completed} completed + {rejected} rejected + {in_flight} in flight")]
    Accounting {
        offered: u64,
        completed: u64,
        rejected: u64,
        in_flight: u64,
    },
}

/// One detection period, for the allocation-over-time plot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimelinePoint {
    pub time_s: f64,
    pub payload_bytes: usize,
    pub allocation: Vec<usize>,
    pub forwarding_ratio: f64,
    pub inbound_bytes_per_second: f64,
    pub outbound_bytes_per_second: f64,
    pub mismatch: bool,
}

/// What a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub scheme: Scheme,
    pub offered: u64,
    pub completed: u64,
    pub completed_on_nic: u64,
    pub completed_on_cpu: u64,
    pub rejected: u64,
    pub in_flight_at_end: u64,
    /// Completions per second in the measurement window.
    pub throughput_per_second: f64,
    pub latency_p50_ns: u64,
    pub latency_p99_ns: u64,
    /// The CN cores' busy share in the window, in [0, 1] of all of them.
    pub cn_cpu_share: f64,
    /// The CN's busy cores in the window (share times cores).
    pub cn_cores_busy: f64,
    /// SoC core time in the window: stage code, context switches, and
    /// TIGA's detections and core moves.
    pub soc_compute_ns: f64,
    pub soc_context_switch_ns: f64,
    pub soc_overhead_ns: f64,
    /// SoC core-seconds available in the window.
    pub soc_core_ns: f64,
    pub final_allocation: Vec<usize>,
    pub migrated_stages: Vec<usize>,
    pub timeline: Vec<TimelinePoint>,
    pub sampled_checks: u64,
    /// The most items that waited at once in the DN host's queue (iPipe
    /// with the host; 0 otherwise).
    pub host_queue_peak: usize,
    /// The DN host's busy cores in the window (iPipe with the host; 0
    /// otherwise): a host CPU apart from the CN's, reported on its own
    /// rather than left out.
    pub dn_host_cores_busy: f64,
    /// Completions whose last stage ran on the DN host (counted in
    /// `completed_on_nic` too: the NIC sends them out).
    pub completed_on_dn_host: u64,
}

#[derive(Debug, Clone, Copy)]
struct Item {
    id: u64,
    pipeline: u16,
    bytes: u32,
    arrived_ns: u64,
    ready_ns: u64,
}

#[derive(Debug, Clone, Copy)]
enum CoreState {
    Idle,
    Busy { item: Item, stage: usize },
    Blocked { item: Item },
    Moving,
}

#[derive(Debug, Clone)]
struct Core {
    agent: usize,
    state: CoreState,
    last_stage: Option<usize>,
    moving_to: Option<usize>,
    debt_ns: u64,
    paused_until_ns: u64,
    bytes_since: u64,
    busy_ns_since: u64,
}

#[derive(Debug, Clone, Copy)]
enum CpuState {
    Idle,
    Busy { item: Item, stage: usize },
    Blocked { item: Item },
}

/// A pool of general-purpose cores: the CN's, or the DN host's for iPipe.
struct CpuPool {
    cores: Vec<CpuState>,
    queue: VecDeque<(Item, usize)>,
    depth: usize,
    /// SoC cores holding an item for a stage iPipe migrated here, waiting
    /// for room in the queue (backpressure, as for a stage's own queue).
    waiting: VecDeque<(Waiter, usize)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    SocDone(u32),
    MoveDone(u32),
    CnDone(u32),
    HostDone(u32),
    Detect,
}

/// Who waits for room in a full stage queue.
#[derive(Debug, Clone, Copy)]
enum Waiter {
    Soc(usize),
    Host(usize),
}

struct StageSlot {
    pipeline: usize,
    last: bool,
    soc: CostCurve,
    host: CostCurve,
}

struct Pipeline {
    app: App,
    first_stage: usize,
    cpu_version: CostCurve,
}

const IN_FLIGHT: u8 = 0;
const DONE: u8 = 1;
const REJECTED: u8 = 2;
/// Rounds of dispatching after one event: each round starts work on at
/// least one core or stops, so cores bound it.
const DISPATCH_ROUNDS_PER_CORE: usize = 4;
/// Time-shared dispatch: consecutive idle rounds before a drop of the
/// deficit; bounds DRR's scan over queues.
const DRR_SCAN_LIMIT: usize = 64;
/// iPipe: consecutive overloaded periods before it migrates an actor.
const IPIPE_OVERLOAD_PERIODS: u32 = 3;

struct Run<'a> {
    scheme: Scheme,
    workload: &'a Workload,
    config: &'a SocConfig,
    stages: Vec<StageSlot>,
    pipelines: Vec<Pipeline>,
    queues: Vec<VecDeque<Item>>,
    waiting: Vec<VecDeque<Waiter>>,
    cores: Vec<Core>,
    cn: CpuPool,
    host: Option<CpuPool>,
    migrated: Vec<bool>,
    controller: Option<Controller>,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    sequence: u64,
    status: Vec<u8>,
    random: rand_chacha::ChaCha8Rng,
    next_pipeline: usize,
    /// Co-processing's credit, one per pipeline: apps take arrivals in
    /// turn, so one credit over all of them forwarded one app's requests
    /// only (every other arrival at 50% with two apps).
    forwarding_credit: Vec<f64>,
    dma_free_ns: u64,
    link_free_ns: u64,
    drr_current: usize,
    drr_fresh: bool,
    drr_deficit: Vec<u64>,
    costs: VirtualCosts,
    measures: Measures,
    period_inbound_bytes: u64,
    period_outbound_bytes: u64,
    overloaded_periods: u32,
    timeline: Vec<TimelinePoint>,
}

struct VirtualCosts {
    context_switch_ns: u64,
    core_move_ns: u64,
    detection_ns: u64,
}

#[derive(Default)]
struct Measures {
    offered: u64,
    completed: u64,
    completed_on_nic: u64,
    completed_on_cpu: u64,
    rejected: u64,
    completed_in_window: u64,
    cn_busy_ns: f64,
    dn_host_busy_ns: f64,
    completed_on_dn_host: u64,
    soc_compute_ns: f64,
    soc_context_switch_ns: f64,
    soc_overhead_ns: f64,
    sampled_checks: u64,
    host_queue_peak: usize,
    latency: Option<Histogram<u64>>,
    error: Option<RunError>,
}

/// Runs `scheme` over `workload` on the virtual hardware.
pub fn run(
    scheme: Scheme,
    workload: &Workload,
    config: &SocConfig,
    calibration: &Calibration,
) -> Result<RunReport, RunError> {
    validate(workload, config)?;
    // Unchecked, a calibration missing an app panicked, and one with an
    // app of no stages ran the next app's stages in its place.
    calibration.check()?;
    let mut run = Run::new(scheme, workload, config, calibration)?;
    run.execute();
    run.finish()
}

/// A detection's virtual cost under `config`, in ns: the configured one,
/// or this machine's (the calibration's) slowed down.
pub fn detection_ns(config: &SocConfig, calibration: &Calibration) -> f64 {
    config
        .detection_ns
        .unwrap_or(calibration.detection_ns * config.slowdown)
}

/// Whether a detection under `config` is shorter than its period: one as
/// long as its period leaves every core stalled for good, whether
/// configured or calibrated and slowed down.
pub fn check_detection(config: &SocConfig, calibration: &Calibration) -> Result<(), ConfigError> {
    let detection_ns = detection_ns(config, calibration).round() as u64;
    if detection_ns >= config.detection_period_ns {
        return Err(ConfigError::DetectionPastPeriod {
            detection_ns: detection_ns as f64,
            period_ns: config.detection_period_ns,
        });
    }
    Ok(())
}

/// The most requests one run offers: each keeps a status byte, and a
/// valid but huge load once asked for more memory than there is.
pub const MAX_REQUESTS: u64 = 1 << 30;
/// The longest run, in virtual time: an hour. Unbounded, arrivals far
/// apart in a run of 2^64 ns overflowed virtual time (a panic in debug,
/// a wrapped clock that never ended in release).
pub const MAX_DURATION_NS: u64 = 3_600_000_000_000;
/// The most detection periods one run has: each keeps a timeline point
/// (a period of 1 ns over a second asked for 10^9 of them).
pub const MAX_DETECTIONS: u64 = 1 << 24;

fn validate(workload: &Workload, config: &SocConfig) -> Result<(), RunError> {
    config.validate()?;
    if workload.apps.is_empty() {
        return Err(RunError::NoApps);
    }
    let sizes = workload.payload.sizes();
    if sizes.is_empty() {
        return Err(RunError::NoPayloadSizes);
    }
    if let Some(&bad) = sizes
        .iter()
        .find(|&&bytes| !(MIN_PAYLOAD_BYTES..=MAX_PAYLOAD_BYTES).contains(&bytes))
    {
        return Err(RunError::PayloadSize(bad));
    }
    if !(workload.offered_per_second.is_finite() && workload.offered_per_second > 0.0) {
        return Err(RunError::BadLoad(workload.offered_per_second));
    }
    if workload.duration_ns > MAX_DURATION_NS {
        return Err(RunError::TooLong(workload.duration_ns));
    }
    let requests = workload.offered_per_second * workload.duration_ns as f64 / 1e9;
    if requests > MAX_REQUESTS as f64 {
        return Err(RunError::TooManyRequests(requests));
    }
    let detections = workload.duration_ns / config.detection_period_ns;
    if detections > MAX_DETECTIONS {
        return Err(RunError::TooManyDetections(detections));
    }
    if workload.measure_from_ns >= workload.duration_ns {
        return Err(RunError::BadWindow {
            measure_from_ns: workload.measure_from_ns,
            duration_ns: workload.duration_ns,
        });
    }
    Ok(())
}

impl<'a> Run<'a> {
    fn new(
        scheme: Scheme,
        workload: &'a Workload,
        config: &'a SocConfig,
        calibration: &Calibration,
    ) -> Result<Run<'a>, RunError> {
        let mut stages = Vec::new();
        let mut pipelines = Vec::new();
        for (index, &app) in workload.apps.iter().enumerate() {
            let measured = calibration.app(app);
            pipelines.push(Pipeline {
                app,
                first_stage: stages.len(),
                cpu_version: measured.cpu_version.clone(),
            });
            for (position, stage) in measured.stages.iter().enumerate() {
                stages.push(StageSlot {
                    pipeline: index,
                    last: position + 1 == measured.stages.len(),
                    soc: stage.portable_cost.scaled(config.slowdown),
                    host: stage.cost.clone(),
                });
            }
        }
        let agents = stages.len();
        if config.soc_cores < agents && scheme.time_shared().is_none() && scheme != Scheme::CpuOnly
        {
            return Err(crate::allocator::AllocationError::TooFewCores {
                cores: config.soc_cores,
                agents,
            }
            .into());
        }
        let even = crate::allocator::proportional_allocation(
            &vec![1.0; agents],
            config.soc_cores.max(agents),
        )?;
        let controller = match scheme.controller_mode() {
            Some(mode) => Some(Controller::new(
                mode,
                agents,
                config.soc_cores,
                config.forwarding_step,
                config.mismatch_tolerance,
            )?),
            None => None,
        };
        let cores = even
            .iter()
            .enumerate()
            .flat_map(|(agent, &count)| std::iter::repeat_n(agent, count))
            .take(config.soc_cores)
            .map(|agent| Core {
                agent,
                state: CoreState::Idle,
                last_stage: None,
                moving_to: None,
                debt_ns: 0,
                paused_until_ns: 0,
                bytes_since: 0,
                busy_ns_since: 0,
            })
            .collect();
        let pool = |cores: usize| CpuPool {
            cores: vec![CpuState::Idle; cores],
            queue: VecDeque::new(),
            depth: config.cn_queue_depth,
            waiting: VecDeque::new(),
        };
        let host =
            (scheme == Scheme::IPipe && workload.host_cpu_for_ipipe).then(|| pool(config.cn_cores));
        let context_switch_ns = config
            .context_switch_ns
            .unwrap_or(calibration.context_switch_ns * config.slowdown);
        let costs = VirtualCosts {
            context_switch_ns: context_switch_ns.round() as u64,
            core_move_ns: config
                .core_move_ns
                .unwrap_or(2.0 * context_switch_ns)
                .round() as u64,
            detection_ns: detection_ns(config, calibration).round() as u64,
        };
        check_detection(config, calibration)?;
        let expected =
            (workload.offered_per_second * workload.duration_ns as f64 / 1e9 * 1.1) as usize + 1024;
        Ok(Run {
            scheme,
            workload,
            config,
            queues: vec![VecDeque::new(); agents],
            waiting: vec![VecDeque::new(); agents],
            migrated: vec![false; agents],
            drr_deficit: vec![0; agents],
            stages,
            pipelines,
            cores,
            cn: pool(config.cn_cores),
            host,
            controller,
            events: BinaryHeap::new(),
            sequence: 0,
            status: Vec::with_capacity(expected),
            random: rand_chacha::ChaCha8Rng::seed_from_u64(workload.seed),
            next_pipeline: 0,
            forwarding_credit: vec![0.0; workload.apps.len()],
            dma_free_ns: 0,
            link_free_ns: 0,
            drr_current: 0,
            drr_fresh: true,
            costs,
            measures: Measures {
                latency: Some(
                    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds"),
                ),
                ..Measures::default()
            },
            period_inbound_bytes: 0,
            period_outbound_bytes: 0,
            overloaded_periods: 0,
            timeline: Vec::new(),
        })
    }

    fn schedule(&mut self, at_ns: u64, event: Event) {
        self.sequence += 1;
        self.events.push(Reverse((at_ns, self.sequence, event)));
    }

    fn execute(&mut self) {
        let end = self.workload.duration_ns;
        let watches = self.controller.is_some() || self.scheme == Scheme::IPipe;
        if watches {
            self.schedule(self.config.detection_period_ns, Event::Detect);
            self.timeline.push(TimelinePoint {
                time_s: 0.0,
                payload_bytes: self.workload.payload.bytes_at(0),
                allocation: self.allocation(),
                forwarding_ratio: 0.0,
                inbound_bytes_per_second: 0.0,
                outbound_bytes_per_second: 0.0,
                mismatch: false,
            });
        }
        let mean_gap_ns = 1e9 / self.workload.offered_per_second;
        let mut next_arrival = self.gap(mean_gap_ns);
        loop {
            let next_event = self
                .events
                .peek()
                .map_or(u64::MAX, |Reverse((at, _, _))| *at);
            if next_arrival <= next_event && next_arrival < end {
                let now = next_arrival;
                self.arrive(now);
                next_arrival = next_arrival.saturating_add(self.gap(mean_gap_ns));
                self.dispatch(now);
            } else if next_event < end {
                let Reverse((now, _, event)) = self.events.pop().expect("peeked");
                self.handle(now, event);
                self.dispatch(now);
            } else {
                break;
            }
            if self.measures.error.is_some() {
                return;
            }
        }
    }

    /// An exponential gap, at least 1 ns.
    fn gap(&mut self, mean_ns: f64) -> u64 {
        let uniform: f64 = self.random.gen_range(f64::EPSILON..1.0);
        ((-uniform.ln() * mean_ns) as u64).max(1)
    }

    fn in_window(&self, at_ns: u64) -> bool {
        at_ns >= self.workload.measure_from_ns && at_ns < self.workload.duration_ns
    }

    /// The part of [begin, end) inside the measurement window.
    fn window_overlap(&self, begin_ns: u64, end_ns: u64) -> f64 {
        let from = begin_ns.max(self.workload.measure_from_ns);
        let to = end_ns.min(self.workload.duration_ns);
        to.saturating_sub(from) as f64
    }

    fn arrive(&mut self, now: u64) {
        let id = self.status.len() as u64;
        self.status.push(IN_FLIGHT);
        self.measures.offered += 1;
        let pipeline = self.next_pipeline;
        self.next_pipeline = (self.next_pipeline + 1) % self.pipelines.len();
        let bytes = self.workload.payload.bytes_at(now) as u32;
        let item = Item {
            id,
            pipeline: pipeline as u16,
            bytes,
            arrived_ns: now,
            ready_ns: now,
        };
        if self.scheme == Scheme::CpuOnly {
            self.fetch_to_cn(item, now);
        } else if self.forward_this_one(pipeline) {
            self.forward_to_cn(item, now);
        } else {
            self.admit_to_nic(item, now);
        }
    }

    /// Co-processing's deterministic spread over each pipeline's own
    /// arrivals: with ratio r, its credit grows by r per request and each
    /// whole unit forwards one (one in ten at 10%).
    fn forward_this_one(&mut self, pipeline: usize) -> bool {
        let ratio = self
            .controller
            .as_ref()
            .map_or(0.0, Controller::forwarding_ratio);
        if ratio <= 0.0 {
            return false;
        }
        let credit = &mut self.forwarding_credit[pipeline];
        *credit += ratio;
        if *credit >= 1.0 - 1e-9 {
            *credit -= 1.0;
            return true;
        }
        false
    }

    fn reject(&mut self, item: Item) {
        self.status[item.id as usize] = REJECTED;
        self.measures.rejected += 1;
    }

    fn admit_to_nic(&mut self, item: Item, now: u64) {
        let first = self.pipelines[item.pipeline as usize].first_stage;
        self.period_inbound_bytes += u64::from(item.bytes);
        if self.migrated[first] {
            // iPipe moved the first actor to the DN's host, which reads the
            // data from its own memory.
            let host = self.host.as_mut().expect("only iPipe with a host migrates");
            if host.queue.len() >= host.depth {
                return self.reject(item);
            }
            host.queue.push_back((item, first));
            // Measured here too: with the first stage migrated every item
            // comes in this way, and the peak read 0 beside a full queue.
            self.measures.host_queue_peak = self.measures.host_queue_peak.max(host.queue.len());
            return;
        }
        if self.queues[first].len() >= self.config.queue_depth {
            return self.reject(item);
        }
        // The SmartNIC reads the data over the DN's local DMA.
        let item = Item {
            ready_ns: self.over_the_dma(item.bytes, now),
            ..item
        };
        self.queues[first].push_back(item);
    }

    /// Moves `bytes` of the DN's memory to its NIC over the local DMA;
    /// when they are in the NIC.
    fn over_the_dma(&mut self, bytes: u32, from_ns: u64) -> u64 {
        let transfer_ns = (f64::from(bytes) / self.config.dma_bytes_per_second * 1e9) as u64;
        self.dma_free_ns = self.dma_free_ns.max(from_ns) + transfer_ns;
        self.dma_free_ns + self.config.dma_latency_ns
    }

    /// Moves `item`'s data over the DN→CN link; when it lands.
    fn over_the_link(&mut self, bytes: u32, leaves_ns: u64) -> u64 {
        let transfer_ns = (f64::from(bytes) / self.config.network_bytes_per_second * 1e9) as u64;
        self.link_free_ns = self.link_free_ns.max(leaves_ns) + transfer_ns;
        self.link_free_ns + self.config.network_one_way_ns
    }

    /// Sends `item` with its data to the CN: the NIC reads the data over
    /// the DN's DMA first, as the rack's engine does. (Without it,
    /// forwarded requests and CPU-only fetches left the DMA free for the
    /// rest, and a slow DMA did not slow CPU-only at all.)
    fn forward_to_cn(&mut self, item: Item, now: u64) {
        if self.cn.queue.len() >= self.cn.depth {
            return self.reject(item);
        }
        let in_the_nic_ns = self.over_the_dma(item.bytes, now);
        let ready_ns = self.over_the_link(item.bytes, in_the_nic_ns);
        let first = self.pipelines[item.pipeline as usize].first_stage;
        self.cn.queue.push_back((Item { ready_ns, ..item }, first));
    }

    /// CPU-only: the CN's read reached the DN at `now`; the data comes back
    /// over the link.
    fn fetch_to_cn(&mut self, item: Item, now: u64) {
        self.forward_to_cn(item, now);
    }

    fn handle(&mut self, now: u64, event: Event) {
        match event {
            Event::SocDone(core) => self.soc_done(core as usize, now),
            Event::MoveDone(core) => {
                let core = &mut self.cores[core as usize];
                core.agent = core
                    .moving_to
                    .take()
                    .expect("a moving core has a destination");
                core.state = CoreState::Idle;
                core.bytes_since = 0;
                core.busy_ns_since = 0;
            }
            Event::CnDone(core) => self.cn_done(core as usize, now),
            Event::HostDone(core) => self.host_done(core as usize, now),
            Event::Detect => self.detect(now),
        }
    }

    fn soc_done(&mut self, index: usize, now: u64) {
        let CoreState::Busy { item, stage } = self.cores[index].state else {
            unreachable!("a SoC completion for a core that is not busy");
        };
        self.cores[index].state = CoreState::Idle;
        let next = stage + 1;
        if self.stages[stage].last {
            self.complete(item, now, true);
        } else if self.scheme.time_shared().is_some()
            && !self.migrated[next]
            && self.queues[next].len() >= self.config.queue_depth
        {
            // A time-shared core is its own consumer: waiting for room it
            // alone could make would deadlock, so it runs the next stage.
            self.begin(index, item, next, now);
            return;
        } else if !self.pass_on(item, next, Waiter::Soc(index), now) {
            self.cores[index].state = CoreState::Blocked { item };
            return;
        }
        self.after_release(index, now);
    }

    /// A SoC core just gave up its item: it moves, if it was chosen to.
    fn after_release(&mut self, index: usize, now: u64) {
        if self.cores[index].moving_to.is_some() {
            self.cores[index].state = CoreState::Moving;
            let move_ns = self.costs.core_move_ns;
            self.measures.soc_overhead_ns += self.window_overlap(now, now + move_ns);
            self.schedule(now + move_ns, Event::MoveDone(index as u32));
        }
    }

    /// Hands `item` to `stage`: to the DN host when iPipe migrated it, else
    /// to the stage's queue. False when the queue is full: the caller
    /// holds the item and waits (backpressure).
    fn pass_on(&mut self, item: Item, stage: usize, waiter: Waiter, now: u64) -> bool {
        if self.migrated[stage] {
            let latency = self.config.dma_latency_ns;
            let host = self.host.as_mut().expect("only iPipe with a host migrates");
            // SoC cores wait for room. A host core is the queue's own
            // consumer (it took an item out before putting this one in),
            // so it never waits: waiting for room only it could make would
            // deadlock, and the queue stays within its depth plus one item
            // per host core.
            if matches!(waiter, Waiter::Soc(_)) && host.queue.len() >= host.depth {
                host.waiting.push_back((waiter, stage));
                return false;
            }
            host.queue.push_back((
                Item {
                    ready_ns: now + latency,
                    ..item
                },
                stage,
            ));
            self.measures.host_queue_peak = self.measures.host_queue_peak.max(host.queue.len());
            return true;
        }
        if self.queues[stage].len() >= self.config.queue_depth {
            self.waiting[stage].push_back(waiter);
            return false;
        }
        self.queues[stage].push_back(Item {
            ready_ns: now,
            ..item
        });
        true
    }

    fn take(&mut self, stage: usize, now: u64) -> Option<Item> {
        let item = self.queues[stage].pop_front()?;
        // Room now: the oldest waiter's item goes in, and the waiter is free.
        if let Some(waiter) = self.waiting[stage].pop_front() {
            let held = self.release(waiter);
            self.queues[stage].push_back(Item {
                ready_ns: now,
                ..held
            });
            if let Waiter::Soc(core) = waiter {
                self.after_release(core, now);
            }
        }
        Some(item)
    }

    /// Frees a waiting core: the item it held, and the core is idle.
    fn release(&mut self, waiter: Waiter) -> Item {
        match waiter {
            Waiter::Soc(core) => {
                match std::mem::replace(&mut self.cores[core].state, CoreState::Idle) {
                    CoreState::Blocked { item } => item,
                    _ => unreachable!("a waiting core holds an item"),
                }
            }
            Waiter::Host(core) => {
                let host = self
                    .host
                    .as_mut()
                    .expect("host waiters exist only with a host");
                match std::mem::replace(&mut host.cores[core], CpuState::Idle) {
                    CpuState::Blocked { item } => item,
                    _ => unreachable!("a waiting host core holds an item"),
                }
            }
        }
    }

    /// Room in the DN host's queue: the oldest SoC core waiting on it puts
    /// its item in and is free.
    fn admit_host_waiter(&mut self, now: u64) {
        let Some((waiter, stage)) = self.host.as_mut().and_then(|host| host.waiting.pop_front())
        else {
            return;
        };
        let held = self.release(waiter);
        let ready_ns = now + self.config.dma_latency_ns;
        let host = self.host.as_mut().expect("a host waiter has a host");
        host.queue.push_back((Item { ready_ns, ..held }, stage));
        if let Waiter::Soc(core) = waiter {
            self.after_release(core, now);
        }
    }

    fn complete(&mut self, item: Item, now: u64, on_nic: bool) {
        let slot = &mut self.status[item.id as usize];
        if *slot != IN_FLIGHT {
            self.measures.error = Some(RunError::CompletedTwice { id: item.id });
            return;
        }
        *slot = DONE;
        self.measures.completed += 1;
        if on_nic {
            self.measures.completed_on_nic += 1;
            self.period_outbound_bytes += u64::from(item.bytes);
        } else {
            self.measures.completed_on_cpu += 1;
        }
        if self.in_window(now) {
            self.measures.completed_in_window += 1;
            // The request left the CN one way before it reached the DN; a
            // NIC result travels one way back.
            let one_way = self.config.network_one_way_ns;
            let back = if on_nic { one_way } else { 0 };
            let latency = now + back + one_way - item.arrived_ns;
            if let Some(histogram) = self.measures.latency.as_mut() {
                histogram.saturating_record(latency.max(1));
            }
        }
        if item.id.is_multiple_of(self.config.sample_every) {
            self.check_sample(item);
        }
    }

    /// Runs a sampled request's real code on both paths and compares.
    fn check_sample(&mut self, item: Item) {
        let app = self.pipelines[item.pipeline as usize].app;
        let outcome = app
            .make_payload(self.workload.seed, item.id, item.bytes as usize)
            .map_err(|error| RunError::PayloadSize(error.0))
            .and_then(|payload| {
                let on_nic = app.run_pipeline(&payload);
                let on_cpu = app.run_on_cpu(&payload);
                match (on_nic, on_cpu) {
                    (Ok(nic), Ok(cpu)) if nic == cpu => Ok(()),
                    (Ok(_), Ok(_)) => Err(RunError::ResultsDiffer { id: item.id, app }),
                    (Err(error), _) | (_, Err(error)) => Err(RunError::Stage {
                        id: item.id,
                        app,
                        error,
                    }),
                }
            });
        match outcome {
            Ok(()) => self.measures.sampled_checks += 1,
            Err(error) => self.measures.error = Some(error),
        }
    }

    fn cn_done(&mut self, index: usize, now: u64) {
        let CpuState::Busy { item, .. } = self.cn.cores[index] else {
            unreachable!("a CN completion for a core that is not busy");
        };
        self.cn.cores[index] = CpuState::Idle;
        self.complete(item, now, false);
    }

    fn host_done(&mut self, index: usize, now: u64) {
        let host = self
            .host
            .as_mut()
            .expect("host events exist only with a host");
        let CpuState::Busy { item, stage } = host.cores[index] else {
            unreachable!("a host completion for a core that is not busy");
        };
        host.cores[index] = CpuState::Idle;
        if self.stages[stage].last {
            // The DN finished it (on its host CPU): outbound for the NIC.
            self.measures.completed_on_dn_host += 1;
            self.complete(item, now, true);
        } else if !self.pass_on(item, stage + 1, Waiter::Host(index), now) {
            let host = self.host.as_mut().expect("checked above");
            host.cores[index] = CpuState::Blocked { item };
        }
    }

    /// Starts work on every idle core that can get some.
    fn dispatch(&mut self, now: u64) {
        let host_cores = self.host.as_ref().map_or(0, |host| host.cores.len());
        let rounds =
            (self.cores.len() + self.cn.cores.len() + host_cores) * DISPATCH_ROUNDS_PER_CORE;
        for _ in 0..rounds {
            let mut started = false;
            for index in 0..self.cores.len() {
                started |= self.start_soc(index, now);
            }
            for index in 0..self.cn.cores.len() {
                started |= self.start_cpu(index, now, false);
            }
            for index in 0..host_cores {
                started |= self.start_cpu(index, now, true);
            }
            if !started {
                return;
            }
        }
    }

    fn start_soc(&mut self, index: usize, now: u64) -> bool {
        let core = &self.cores[index];
        if !matches!(core.state, CoreState::Idle) || core.moving_to.is_some() {
            return false;
        }
        let time_shared = self.scheme.time_shared();
        let picked = match time_shared {
            None => {
                let agent = core.agent;
                self.take(agent, now).map(|item| (item, agent))
            }
            Some(Dispatch::Fcfs) => self.pick_fcfs(now),
            Some(Dispatch::Drr) => self.pick_drr(now),
        };
        let Some((item, stage)) = picked else {
            return false;
        };
        self.begin(index, item, stage, now);
        true
    }

    /// Runs `stage` of `item` on SoC core `index`: a context switch first
    /// when a time-shared core changes engine, any stall it owes, and the
    /// data's DMA if it has not landed.
    fn begin(&mut self, index: usize, item: Item, stage: usize, now: u64) {
        let switch_ns = match self.scheme.time_shared() {
            Some(_) if self.cores[index].last_stage != Some(stage) => self.costs.context_switch_ns,
            _ => 0,
        };
        let compute_ns = (self.stages[stage].soc.at(u64::from(item.bytes)).round() as u64).max(1);
        let core = &self.cores[index];
        let begin = (now + core.debt_ns)
            .max(core.paused_until_ns)
            .max(item.ready_ns);
        let debt_ns = core.debt_ns;
        let done = begin + switch_ns + compute_ns;
        self.measures.soc_overhead_ns += self.window_overlap(now, now + debt_ns);
        self.measures.soc_context_switch_ns += self.window_overlap(begin, begin + switch_ns);
        self.measures.soc_compute_ns += self.window_overlap(begin + switch_ns, done);
        let core = &mut self.cores[index];
        core.debt_ns = 0;
        core.last_stage = Some(stage);
        core.bytes_since += u64::from(item.bytes);
        core.busy_ns_since += compute_ns + switch_ns;
        core.state = CoreState::Busy { item, stage };
        self.schedule(done, Event::SocDone(index as u32));
    }

    /// FCFS over every stage's queue: the oldest request first, a later
    /// stage first on ties (finish what was started).
    fn pick_fcfs(&mut self, now: u64) -> Option<(Item, usize)> {
        let stage = (0..self.queues.len())
            .rev()
            .filter_map(|stage| {
                self.queues[stage]
                    .front()
                    .map(|item| (item.arrived_ns, stage))
            })
            .min_by_key(|&(arrived, _)| arrived)?
            .1;
        self.take(stage, now).map(|item| (item, stage))
    }

    /// Deficit round robin over the stages' queues (Shreedhar and
    /// Varghese): each visit adds a quantum, and a queue is served while
    /// its deficit covers its head.
    fn pick_drr(&mut self, now: u64) -> Option<(Item, usize)> {
        let count = self.queues.len();
        if self.queues.iter().all(VecDeque::is_empty) {
            return None;
        }
        for _ in 0..DRR_SCAN_LIMIT * count {
            let stage = self.drr_current;
            let Some(head) = self.queues[stage].front() else {
                self.drr_deficit[stage] = 0;
                self.drr_current = (stage + 1) % count;
                self.drr_fresh = true;
                continue;
            };
            if self.drr_fresh {
                self.drr_deficit[stage] += self.config.drr_quantum_bytes;
                self.drr_fresh = false;
            }
            let bytes = u64::from(head.bytes);
            if self.drr_deficit[stage] >= bytes {
                self.drr_deficit[stage] -= bytes;
                return self.take(stage, now).map(|item| (item, stage));
            }
            self.drr_current = (stage + 1) % count;
            self.drr_fresh = true;
        }
        None
    }

    /// Starts a CN core (or, with `on_host`, a DN host core for iPipe).
    fn start_cpu(&mut self, index: usize, now: u64, on_host: bool) -> bool {
        let pool = if on_host {
            self.host.as_mut().expect("host cores exist")
        } else {
            &mut self.cn
        };
        if !matches!(pool.cores[index], CpuState::Idle) {
            return false;
        }
        let Some((item, stage)) = pool.queue.pop_front() else {
            return false;
        };
        if on_host {
            self.admit_host_waiter(now);
        }
        let pipeline = &self.pipelines[item.pipeline as usize];
        let bytes = u64::from(item.bytes);
        let cost_ns = if on_host {
            self.stages[stage].host.at(bytes)
        } else if stage == pipeline.first_stage {
            pipeline.cpu_version.at(bytes)
        } else {
            let last = (stage..self.stages.len())
                .find(|&index| self.stages[index].last)
                .expect("every pipeline has a last stage");
            (stage..=last)
                .map(|index| self.stages[index].host.at(bytes))
                .sum()
        };
        let begin = now.max(item.ready_ns);
        let done = begin + (cost_ns.round() as u64).max(1);
        let pool = if on_host {
            self.host.as_mut().expect("host cores exist")
        } else {
            &mut self.cn
        };
        pool.cores[index] = CpuState::Busy { item, stage };
        if on_host {
            self.measures.dn_host_busy_ns += self.window_overlap(begin, done);
            self.schedule(done, Event::HostDone(index as u32));
        } else {
            self.measures.cn_busy_ns += self.window_overlap(begin, done);
            self.schedule(done, Event::CnDone(index as u32));
        }
        true
    }

    /// Each PA's per-core capacity since the last reallocation.
    fn capacities(&self) -> Vec<Option<f64>> {
        (0..self.stages.len())
            .map(|agent| {
                let (bytes, busy) = self
                    .cores
                    .iter()
                    .filter(|core| core.agent == agent && core.moving_to.is_none())
                    .fold((0u64, 0u64), |(bytes, busy), core| {
                        (bytes + core.bytes_since, busy + core.busy_ns_since)
                    });
                (busy > 0).then(|| bytes as f64 * 1e9 / busy as f64)
            })
            .collect()
    }

    fn detect(&mut self, now: u64) {
        let period_s = self.config.detection_period_ns as f64 / 1e9;
        let counters = PeriodCounters {
            inbound_bytes: std::mem::take(&mut self.period_inbound_bytes),
            outbound_bytes: std::mem::take(&mut self.period_outbound_bytes),
            capacities: self.capacities(),
        };
        let mismatch = if let Some(controller) = self.controller.as_mut() {
            let decision = controller.on_period(&counters);
            if let Some(target) = decision.reallocation {
                self.reallocate(&target, now);
            }
            decision.mismatch
        } else {
            let mismatch = (counters.outbound_bytes as f64)
                < counters.inbound_bytes as f64 * (1.0 - self.config.mismatch_tolerance);
            self.ipipe_watch(now, mismatch);
            mismatch
        };
        // Reading the counters stalls every core for a detection. A core
        // at work owes the stall, and `begin` counts it when the core pays
        // it (counting it here too counted it twice). A core that is not
        // working (idle, blocked on a full queue, moving) pauses now, and
        // its stall is counted here: the stall overlaps the wait, so
        // however many detections pass during one wait, the core starts
        // at most one detection late. (Owed as debts, a core blocked
        // through several detections paid them all after the wait.)
        let detection_ns = self.costs.detection_ns;
        let mut paused_cores = 0usize;
        for index in 0..self.cores.len() {
            let core = &mut self.cores[index];
            match core.state {
                CoreState::Busy { .. } => core.debt_ns += detection_ns,
                CoreState::Idle | CoreState::Blocked { .. } => {
                    core.paused_until_ns = core.paused_until_ns.max(now + detection_ns);
                    paused_cores += 1;
                }
                // Its move is charged as overhead already, and the stall
                // falls within it: paused, but not counted twice.
                CoreState::Moving => {
                    core.paused_until_ns = core.paused_until_ns.max(now + detection_ns);
                }
            }
        }
        self.measures.soc_overhead_ns +=
            self.window_overlap(now, now + detection_ns) * paused_cores as f64;
        self.timeline.push(TimelinePoint {
            time_s: now as f64 / 1e9,
            payload_bytes: self.workload.payload.bytes_at(now),
            allocation: self.allocation(),
            forwarding_ratio: self
                .controller
                .as_ref()
                .map_or(0.0, Controller::forwarding_ratio),
            inbound_bytes_per_second: counters.inbound_bytes as f64 / period_s,
            outbound_bytes_per_second: counters.outbound_bytes as f64 / period_s,
            mismatch,
        });
        self.schedule(now + self.config.detection_period_ns, Event::Detect);
    }

    /// iPipe: after a run of overloaded periods, the slowest actor of each
    /// pipeline, at the payload of the moment, moves to the DN's host CPU,
    /// once. (Ranked at 1 KiB whatever the workload, it moved a cheap
    /// stage at 64 B and left the bottleneck on the SoC.)
    fn ipipe_watch(&mut self, now: u64, mismatch: bool) {
        self.overloaded_periods = if mismatch {
            self.overloaded_periods + 1
        } else {
            0
        };
        if self.host.is_none()
            || self.overloaded_periods < IPIPE_OVERLOAD_PERIODS
            || self.migrated.contains(&true)
        {
            return;
        }
        let payload_bytes = self.workload.payload.bytes_at(now) as u64;
        for pipeline in 0..self.pipelines.len() {
            let slowest = (0..self.stages.len())
                .filter(|&stage| self.stages[stage].pipeline == pipeline)
                .max_by(|&a, &b| {
                    let cost = |stage: usize| self.stages[stage].soc.at(payload_bytes);
                    cost(a).total_cmp(&cost(b))
                })
                .expect("every pipeline has a stage");
            self.migrated[slowest] = true;
        }
    }

    /// Cores per PA, counting a moving core where it is going.
    fn allocation(&self) -> Vec<usize> {
        let mut counts = vec![0; self.stages.len()];
        for core in &self.cores {
            counts[core.moving_to.unwrap_or(core.agent)] += 1;
        }
        counts
    }

    /// Takes surplus cores off over-allocated PAs (idle ones first; busy
    /// ones finish their task first) and sends them where cores are short.
    /// Other PAs keep running.
    fn reallocate(&mut self, target: &[usize], now: u64) {
        let current = self.allocation();
        let mut destinations: Vec<usize> = (0..target.len())
            .flat_map(|agent| {
                std::iter::repeat_n(agent, target[agent].saturating_sub(current[agent]))
            })
            .collect();
        for agent in 0..target.len() {
            let surplus = current[agent].saturating_sub(target[agent]);
            let mut candidates: Vec<usize> = (0..self.cores.len())
                .filter(|&index| {
                    let core = &self.cores[index];
                    core.moving_to.unwrap_or(core.agent) == agent
                })
                .collect();
            candidates.sort_by_key(|&index| match self.cores[index].state {
                CoreState::Idle => 0,
                CoreState::Blocked { .. } => 1,
                CoreState::Busy { .. } => 2,
                CoreState::Moving => 3,
            });
            for index in candidates.into_iter().take(surplus) {
                let destination = destinations.pop().expect("surplus and shortage balance");
                self.cores[index].moving_to = Some(destination);
                if matches!(self.cores[index].state, CoreState::Idle) {
                    self.after_release(index, now);
                }
            }
        }
        debug_assert!(destinations.is_empty());
        for core in &mut self.cores {
            core.bytes_since = 0;
            core.busy_ns_since = 0;
        }
    }

    /// The in-flight requests some queue or core holds, each checked to
    /// be in flight.
    fn requests_held(&self) -> u64 {
        let soc = self.cores.iter().filter_map(|core| match core.state {
            CoreState::Busy { item, .. } | CoreState::Blocked { item } => Some(item),
            CoreState::Idle | CoreState::Moving => None,
        });
        let pools = std::iter::once(&self.cn).chain(self.host.as_ref());
        let pooled = pools.flat_map(|pool| {
            let running = pool.cores.iter().filter_map(|core| match core {
                CpuState::Busy { item, .. } | CpuState::Blocked { item } => Some(*item),
                CpuState::Idle => None,
            });
            running.chain(pool.queue.iter().map(|(item, _)| *item))
        });
        let queued = self.queues.iter().flatten().copied();
        let held = soc.chain(pooled).chain(queued);
        held.filter(|item| self.status[item.id as usize] == IN_FLIGHT)
            .count() as u64
    }

    fn finish(mut self) -> Result<RunReport, RunError> {
        if let Some(error) = self.measures.error.take() {
            return Err(error);
        }
        let in_flight = self
            .status
            .iter()
            .filter(|&&status| status == IN_FLIGHT)
            .count() as u64;
        let measures = &self.measures;
        if measures.offered != measures.completed + measures.rejected + in_flight {
            return Err(RunError::Accounting {
                offered: measures.offered,
                completed: measures.completed,
                rejected: measures.rejected,
                in_flight,
            });
        }
        // The books above move together with the status bytes, so they
        // cannot see a request dropped from every queue and core: count
        // the requests actually held.
        let held = self.requests_held();
        if held != in_flight {
            return Err(RunError::LostRequests { in_flight, held });
        }
        let window_ns = (self.workload.duration_ns - self.workload.measure_from_ns) as f64;
        let latency = measures.latency.as_ref().expect("made in new");
        let cn_cores = self.cn.cores.len().max(1) as f64;
        Ok(RunReport {
            scheme: self.scheme,
            offered: measures.offered,
            completed: measures.completed,
            completed_on_nic: measures.completed_on_nic,
            completed_on_cpu: measures.completed_on_cpu,
            rejected: measures.rejected,
            in_flight_at_end: in_flight,
            throughput_per_second: measures.completed_in_window as f64 / (window_ns / 1e9),
            latency_p50_ns: latency.value_at_quantile(0.5),
            latency_p99_ns: latency.value_at_quantile(0.99),
            cn_cpu_share: measures.cn_busy_ns / (window_ns * cn_cores),
            cn_cores_busy: measures.cn_busy_ns / window_ns,
            soc_compute_ns: measures.soc_compute_ns,
            soc_context_switch_ns: measures.soc_context_switch_ns,
            soc_overhead_ns: measures.soc_overhead_ns,
            soc_core_ns: window_ns * self.cores.len() as f64,
            final_allocation: self.allocation(),
            migrated_stages: (0..self.migrated.len())
                .filter(|&stage| self.migrated[stage])
                .collect(),
            timeline: std::mem::take(&mut self.timeline),
            sampled_checks: measures.sampled_checks,
            host_queue_peak: measures.host_queue_peak,
            dn_host_cores_busy: measures.dn_host_busy_ns / window_ns,
            completed_on_dn_host: measures.completed_on_dn_host,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of_one_request<'a>(
        workload: &'a Workload,
        config: &'a SocConfig,
        calibration: &Calibration,
    ) -> (Run<'a>, Item) {
        let mut run = Run::new(Scheme::Tiga, workload, config, calibration).unwrap();
        run.status.push(IN_FLIGHT);
        run.measures.offered += 1;
        let item = Item {
            id: 0,
            pipeline: 0,
            bytes: 1024,
            arrived_ns: 0,
            ready_ns: 0,
        };
        (run, item)
    }

    fn workload() -> Workload {
        Workload {
            apps: vec![App::Mvs],
            offered_per_second: 1000.0,
            payload: PayloadSchedule::Fixed(1024),
            duration_ns: 1_000_000,
            measure_from_ns: 0,
            host_cpu_for_ipipe: false,
            seed: 1,
        }
    }

    /// A valid but huge load sized the run's books for more requests than
    /// memory holds, and the process aborted: a typed error now.
    #[test]
    fn a_load_past_the_run_limit_is_refused() {
        let workload = Workload {
            offered_per_second: 1e12,
            duration_ns: 1_000_000_000,
            ..workload()
        };
        let calibration = Calibration::fixed_for_tests();
        let result = run(Scheme::Tiga, &workload, &SocConfig::default(), &calibration);
        assert!(matches!(result, Err(RunError::TooManyRequests(_))));
    }

    /// A run of 2^64 ns with arrivals 10^18 ns apart overflowed virtual
    /// time after its last arrival: a panic in debug, a wrapped clock that
    /// never ended in release. Runs are at most an hour.
    #[test]
    fn a_run_past_an_hour_of_virtual_time_is_refused() {
        let workload = Workload {
            offered_per_second: 1e-9,
            duration_ns: u64::MAX,
            measure_from_ns: 0,
            ..workload()
        };
        let calibration = Calibration::fixed_for_tests();
        let result = run(
            Scheme::FairNic,
            &workload,
            &SocConfig::default(),
            &calibration,
        );
        assert!(
            matches!(result, Err(RunError::TooLong(u64::MAX))),
            "{result:?}"
        );
    }

    /// An unchecked calibration ran: one missing an app panicked, and one
    /// with an app of no stages ran the next app's stages in its place.
    #[test]
    fn a_run_refuses_a_calibration_that_does_not_check() {
        let mut calibration = Calibration::fixed_for_tests();
        calibration.apps[0].stages.clear();
        let workload = Workload {
            apps: vec![App::Spark, App::Mvs],
            ..workload()
        };
        let result = run(Scheme::Tiga, &workload, &SocConfig::default(), &calibration);
        assert!(
            matches!(result, Err(RunError::Calibration(_))),
            "{result:?}"
        );
    }

    /// An alternating payload with no sizes divided by zero at the first
    /// arrival; it is a typed error before the run.
    #[test]
    fn an_alternating_payload_without_sizes_is_refused() {
        let workload = Workload {
            payload: PayloadSchedule::Alternating {
                sizes: Vec::new(),
                interval_ns: 1,
            },
            ..workload()
        };
        let calibration = Calibration::fixed_for_tests();
        let result = run(Scheme::Tiga, &workload, &SocConfig::default(), &calibration);
        assert!(matches!(result, Err(RunError::NoPayloadSizes)));
    }

    /// Two apps take arrivals in turn, and one forwarding credit over all
    /// arrivals picked every tenth at 10%: always the same app's, so the
    /// overloaded one got no relief. Each app's requests are forwarded in
    /// its own share now.
    #[test]
    fn two_apps_at_ten_percent_forward_requests_of_both_apps() {
        let workload = Workload {
            apps: vec![App::Mvs, App::Ipsec],
            ..workload()
        };
        let (config, calibration) = (SocConfig::default(), Calibration::fixed_for_tests());
        let mut run = Run::new(Scheme::Tiga, &workload, &config, &calibration).unwrap();
        let controller = run.controller.as_mut().expect("TIGA has a controller");
        let overloaded = PeriodCounters {
            inbound_bytes: 1_000_000,
            outbound_bytes: 1_000,
            capacities: vec![Some(1e9); 4],
        };
        // Bounded: co-processing starts within a few mismatched periods.
        for _ in 0..16 {
            if controller.forwarding_ratio() > 0.0 {
                break;
            }
            controller.on_period(&overloaded);
        }
        let ratio = controller.forwarding_ratio();
        assert!(ratio > 0.0 && ratio <= 0.5, "forwarding at {ratio}");
        for arrival in 0..1000 {
            run.arrive(arrival);
        }
        let forwarded = |pipeline: u16| {
            run.cn
                .queue
                .iter()
                .filter(|(item, _)| item.pipeline == pipeline)
                .count()
        };
        let expected = (500.0 * ratio).round() as usize;
        assert_eq!((forwarded(0), forwarded(1)), (expected, expected));
    }

    /// A core blocked on a full queue through three detections owed all
    /// three stalls, and paid them one after another once it could go on.
    /// The stalls overlap its wait: it starts one detection late at most.
    #[test]
    fn a_core_blocked_through_detections_starts_at_most_one_detection_late() {
        let (workload, config) = (workload(), SocConfig::default());
        let calibration = Calibration::fixed_for_tests();
        let (mut run, item) = run_of_one_request(&workload, &config, &calibration);
        run.cores[0].state = CoreState::Blocked { item };
        let detection_ns = run.costs.detection_ns;
        let period_ns = config.detection_period_ns;
        for at in 1..=3 {
            run.detect(at * period_ns);
        }
        let core = &run.cores[0];
        assert_eq!(core.debt_ns, 0);
        assert_eq!(core.paused_until_ns, 3 * period_ns + detection_ns);
    }

    /// The exactly-once check the benchmark's runs rely on catches a
    /// request served by the NIC and then by the CN.
    #[test]
    fn a_request_completed_twice_fails_the_run() {
        let (workload, config) = (workload(), SocConfig::default());
        let calibration = Calibration::fixed_for_tests();
        let (mut run, item) = run_of_one_request(&workload, &config, &calibration);
        run.complete(item, 10, true);
        run.complete(item, 20, false);
        assert!(matches!(
            run.finish(),
            Err(RunError::CompletedTwice { id: 0 })
        ));
    }

    /// A request dropped from every queue and core still read as in flight
    /// by its status, and the books (which move with the status) held: the
    /// run passed. The requests held are counted now.
    #[test]
    fn a_request_dropped_from_every_queue_fails_the_run() {
        let (workload, config) = (workload(), SocConfig::default());
        let calibration = Calibration::fixed_for_tests();
        let mut run = Run::new(Scheme::Tiga, &workload, &config, &calibration).unwrap();
        run.arrive(0);
        run.queues.iter_mut().for_each(VecDeque::clear);
        assert!(matches!(
            run.finish(),
            Err(RunError::LostRequests {
                in_flight: 1,
                held: 0
            })
        ));
    }

    /// A request neither completed, refused nor in flight breaks the books.
    #[test]
    fn a_request_lost_from_the_books_fails_the_run() {
        let (workload, config) = (workload(), SocConfig::default());
        let calibration = Calibration::fixed_for_tests();
        let (mut run, item) = run_of_one_request(&workload, &config, &calibration);
        run.complete(item, 10, true);
        run.measures.offered += 1;
        assert!(matches!(
            run.finish(),
            Err(RunError::Accounting { offered: 2, .. })
        ));
        let (mut run, item) = run_of_one_request(&workload, &config, &calibration);
        run.complete(item, 10, true);
        assert_eq!(run.finish().unwrap().completed, 1);
    }
}
