//! The compute host crashes under a running store, and a new store
//! recovers from the checkpoint kept in far memory. Written once against
//! [`remora_rack::scenario::RackStage`]; the simulator runs it seed by
//! seed (`remora sim kv`).
//!
//! The log lives in a region of the memory host, reached by one-sided
//! verbs posted on the compute host's own NIC ([`crate::device::rack_nic`]).
//! One session runs random reads, upserts, deletes and read-modify-writes
//! over a small key space, every read and RMW checked against a map, with
//! a checkpoint every few operations. At a seed-chosen instant the compute
//! host loses its power: the store fails wherever it was (an operation
//! waiting for the device, a flush, a checkpoint record half written), the
//! host crashes, and the store and everything it held in memory are gone.
//! The memory host runs on. The compute host restarts with a fresh NIC,
//! connects to the region again and recovers.
//!
//! What must hold: the recovered checkpoint is the last one acknowledged,
//! or the one being taken at the crash if its record reached far memory;
//! every key reads back exactly as the map stood when that checkpoint
//! began (no acknowledged write before it lost, none after it seen); and
//! the recovered store works on, checked the same way, through a further
//! checkpoint.

use crate::checkpoint::CheckpointError;
use crate::device::far_memory::FarMemoryDevice;
use crate::device::rack_nic::{connect, register_pool, Pool, PowerCut};
use crate::log::{log_capacity_bytes, ring_offset, LogError};
use crate::LogAddress;
use crate::{DeviceError, KvError, Session, Status, Store, StoreConfig, Update};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use remora_base::Timestamp;
use remora_rack::scenario::{Network, Rack, RackStage, SimulatedStage, Violation};
use remora_rack::topology::{Topology, COMPUTE_HOST, MEMORY_HOST};
use remora_rack::RackError;
use remora_rnic::{Verbs, VerbsError};
use remora_switch::programs::L2L3Forwarding;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The shape of one run.
#[derive(Debug, Clone, Copy)]
pub struct CrashPlan {
    /// Keys `key-0` .. `key-{keys - 1}`.
    pub keys: u32,
    /// A checkpoint after every this many operations.
    pub checkpoint_every: u32,
    /// The power goes this long after the first checkpoint, at most
    /// (the seed picks the instant).
    pub crash_window: Duration,
    /// How long the compute host stays down.
    pub down_for: Duration,
    /// Operations on the recovered store.
    pub operations_after: u32,
    /// The far-memory region that holds the log.
    pub device_bytes: u64,
    pub control: Control,
}

impl CrashPlan {
    fn check(&self) -> Result<(), ScenarioError> {
        if self.keys == 0 {
            return Err(ScenarioError::Plan("a run needs at least one key"));
        }
        if self.checkpoint_every == 0 {
            return Err(ScenarioError::Plan("checkpoint_every must be at least 1"));
        }
        Ok(())
    }
}

/// A run that must fail, to show the checks can.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// The real run.
    None,
    /// Before recovering, the newest page the last acknowledged
    /// checkpoint covers is zeroed in far memory, as if its flush had
    /// never landed: a recovery or a key check must fail.
    LoseNewestPage,
}

impl CrashPlan {
    pub const DEFAULT: CrashPlan = CrashPlan {
        keys: 64,
        checkpoint_every: 24,
        crash_window: Duration::from_micros(1500),
        down_for: Duration::from_micros(200),
        operations_after: 200,
        device_bytes: 8 << 20,
        control: Control::None,
    };
}

/// Which check failed, or what broke before a check could run.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error("the plan: {0}")]
    Plan(&'static str),
    #[error("the rack: {0}")]
    Rack(#[from] RackError),
    #[error("connecting the compute host to far memory: {0}")]
    Connect(#[from] VerbsError),
    #[error("the store failed before the power went: {0}")]
    Store(KvError),
    #[error("operation {operation}: {key} read {found:?} where the map holds {expected:?}")]
    WrongRead {
        operation: u64,
        key: String,
        expected: Option<Vec<u8>>,
        found: Option<Vec<u8>>,
    },
    #[error("{0} operations ran and the power never went")]
    NoCrash(u64),
    #[error("recovering: {0}")]
    Recover(KvError),
    #[error("recovered checkpoint {recovered}, but {acknowledged} was acknowledged and {started} was the last begun")]
    WrongCheckpoint {
        recovered: u64,
        acknowledged: u64,
        started: u64,
    },
    #[error("after recovering checkpoint {sequence}, {key} reads {found:?}; the checkpoint holds {expected:?}")]
    Lost {
        sequence: u64,
        key: String,
        expected: Option<Vec<u8>>,
        found: Option<Vec<u8>>,
    },
    #[error("the recovered store: {0}")]
    AfterRecovery(KvError),
}

/// What a run saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrashOutcome {
    /// Operations acknowledged before the power went.
    pub operations_before: u64,
    /// The last checkpoint acknowledged before the power went (the
    /// first, of the empty store, is 1).
    pub last_acknowledged_checkpoint: u64,
    /// What the store was doing when it went.
    pub crashed_during: Activity,
    /// Virtual time of the crash, from the start of the run.
    pub crash_at: Duration,
    /// The checkpoint recovered: the last acknowledged, or the one being
    /// taken when its record had reached far memory.
    pub recovered_sequence: u64,
    /// Whether it was the one being taken.
    pub recovered_unacknowledged: bool,
    pub keys_checked: u64,
    pub operations_after: u64,
    /// Packets the two NICs sent again (the fresh compute NIC's and the
    /// memory host's).
    pub retransmissions: u64,
}

/// Where the store was when the power went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    Operation,
    Checkpoint,
}

type Model = HashMap<Vec<u8>, Vec<u8>>;

/// The map as a checkpoint began, by its sequence number.
struct Snapshots {
    acknowledged: (u64, Model),
    /// Where the last acknowledged checkpoint's log ends.
    acknowledged_tail: LogAddress,
    started: Option<(u64, Model)>,
}

/// A running store with its model.
struct Workload {
    random: ChaCha8Rng,
    keys: u32,
    model: Model,
    operations: u64,
}

/// Contexts of the one operation a session has pending at a time.
const READ_CONTEXT: u64 = 1;
const RMW_CONTEXT: u64 = 2;

fn key_of(number: u32) -> Vec<u8> {
    format!("key-{number}").into_bytes()
}

impl Workload {
    /// One random operation, checked against the model.
    fn step(&mut self, session: &mut Session) -> Result<(), Failure> {
        let key = key_of(self.random.gen_range(0..self.keys));
        match self.random.gen_range(0..20) {
            0..=7 => {
                let length = self.random.gen_range(0..300);
                let value: Vec<u8> = (0..length).map(|_| self.random.gen()).collect();
                session.upsert(&key, &value)?;
                self.model.insert(key, value);
            }
            8..=14 => {
                let found = read_now(session, &key)?;
                self.expect(
                    &key,
                    self.model.get(&key).map(Vec::as_slice),
                    found.as_deref(),
                )?;
            }
            15..=16 => {
                session.delete(&key)?;
                self.model.remove(&key);
            }
            _ => {
                let delta = self.random.gen_range(1..1000);
                let found = rmw_now(session, &key, Update::AddToCounter(delta))?;
                let mut expected = Vec::new();
                Update::AddToCounter(delta)
                    .apply(self.model.get(&key).map(Vec::as_slice), &mut expected)
                    .expect("a counter update applies to any value");
                self.expect(&key, Some(&expected), Some(&found))?;
                self.model.insert(key, found);
            }
        }
        self.operations += 1;
        Ok(())
    }

    /// A read's or RMW's answer against what the model holds.
    fn expect(
        &self,
        key: &[u8],
        expected: Option<&[u8]>,
        found: Option<&[u8]>,
    ) -> Result<(), Failure> {
        if found == expected {
            return Ok(());
        }
        Err(Failure::Check(ScenarioError::WrongRead {
            operation: self.operations,
            key: String::from_utf8_lossy(key).into_owned(),
            expected: expected.map(<[u8]>::to_vec),
            found: found.map(<[u8]>::to_vec),
        }))
    }
}

/// Why a step stopped: the store failed, or a check did.
enum Failure {
    Store(KvError),
    Check(ScenarioError),
}

impl From<KvError> for Failure {
    fn from(error: KvError) -> Failure {
        Failure::Store(error)
    }
}

impl Failure {
    fn into_error(self, wrap: fn(KvError) -> ScenarioError) -> ScenarioError {
        match self {
            Failure::Store(error) => wrap(error),
            Failure::Check(error) => error,
        }
    }
}

/// A read, waiting for the device if it must.
fn read_now(session: &mut Session, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
    let mut out = Vec::new();
    match session.read(key, &mut out, READ_CONTEXT)? {
        Status::Found => Ok(Some(out)),
        Status::Pending => {
            let (status, value) = wait_for_one(session)?;
            Ok((status == Status::Found).then_some(value))
        }
        Status::NotFound | Status::Done => Ok(None),
    }
}

/// A read-modify-write, waiting for the device if it must: the new value.
fn rmw_now(session: &mut Session, key: &[u8], update: Update) -> Result<Vec<u8>, KvError> {
    let mut out = Vec::new();
    match session.rmw(key, update, &mut out, RMW_CONTEXT)? {
        Status::Pending => Ok(wait_for_one(session)?.1),
        _ => Ok(out),
    }
}

/// The one pending operation's outcome and value.
fn wait_for_one(session: &mut Session) -> Result<(Status, Vec<u8>), KvError> {
    let mut outcome = None;
    session.complete_pending(true, &mut |completion| {
        outcome = Some(
            completion
                .result
                .clone()
                .map(|status| (status, completion.value.to_vec())),
        );
    })?;
    outcome.expect("waiting returns once the operation completed")
}

/// Whether `error` is what a store sees when its device is gone.
fn is_device_gone(error: &KvError) -> bool {
    let device = match error {
        KvError::Device(device) => device,
        KvError::Checkpoint(CheckpointError::Device(device)) => device,
        KvError::Log(LogError::Flush(device)) => device,
        _ => return false,
    };
    *device == DeviceError::Gone
}

/// The compute host, its store and its connection to far memory.
struct Compute<R> {
    rack: Arc<Mutex<R>>,
    pool: Pool,
    config: StoreConfig,
    /// The stage's queue-pair timeout: short in virtual time, the rack's
    /// own on a real clock.
    timeout: Duration,
}

impl<R: Rack + Send + 'static> Compute<R> {
    /// A device on fresh queue pairs from the compute host's NIC.
    fn device(&self, power: Arc<PowerCut>) -> Result<Arc<FarMemoryDevice>, ScenarioError> {
        let paths = connect(
            &self.rack,
            (COMPUTE_HOST, MEMORY_HOST),
            self.pool,
            self.config.sessions + 1,
            (self.timeout, power),
        )?;
        Ok(Arc::new(FarMemoryDevice::on_paths(
            "rack-one-sided",
            &self.pool.region,
            paths,
        )))
    }

    fn now(&self) -> Timestamp {
        self.rack.lock().unwrap_or_else(|e| e.into_inner()).now()
    }

    /// The compute host goes down (its store is already gone), stays down
    /// for the plan's while, and comes back with a fresh NIC. Under the
    /// control, a page the checkpoint ending at `acknowledged_tail` holds
    /// is lost meanwhile.
    fn crash_and_restart(
        &self,
        plan: CrashPlan,
        acknowledged_tail: LogAddress,
    ) -> Result<(), ScenarioError> {
        let mut rack = self.rack.lock().unwrap_or_else(|e| e.into_inner());
        rack.crash(COMPUTE_HOST);
        rack.run_for(plan.down_for)?;
        rack.restart(COMPUTE_HOST)?;
        if plan.control == Control::LoseNewestPage {
            let page_bits = self.config.page_bits;
            lose_page(&mut *rack, &self.pool, acknowledged_tail, page_bits)?;
        }
        Ok(())
    }

    /// Packets both NICs sent again (the compute host's since its restart).
    fn retransmissions(&self) -> u64 {
        let mut rack = self.rack.lock().unwrap_or_else(|e| e.into_inner());
        [COMPUTE_HOST, MEMORY_HOST]
            .map(|host| rack.with_nic(host, |nic| nic.counters().packets_retransmitted))
            .iter()
            .sum()
    }
}

/// The store's settings for the scenario: one session, the smallest pages
/// and memory, so that records reach the device.
fn store_config() -> StoreConfig {
    StoreConfig {
        sessions: 1,
        ..StoreConfig::smallest()
    }
}

/// One run: the store works until the power goes at a seed-chosen
/// instant, then recovers and works on.
pub fn compute_crash<S>(stage: S, seed: u64, plan: CrashPlan) -> Result<CrashOutcome, ScenarioError>
where
    S: RackStage,
    S::Running<L2L3Forwarding>: Send + 'static,
{
    let _span = tracing::info_span!("kv_compute_crash", seed).entered();
    plan.check()?;
    let forwarding = stage.topology().forwarding();
    let timeout = stage.queue_pair_timeout();
    let mut rack = stage.start(forwarding)?;
    let pool = register_pool(&mut rack, MEMORY_HOST, plan.device_bytes)?;
    let started = rack.now();
    let compute = Compute {
        rack: Arc::new(Mutex::new(rack)),
        pool,
        config: store_config(),
        timeout,
    };
    let mut random = ChaCha8Rng::seed_from_u64(seed);
    let window_nanos = plan.crash_window.as_nanos() as u64;
    let crash_offset = Duration::from_nanos(random.gen_range(0..=window_nanos));
    let mut workload = Workload {
        random,
        keys: plan.keys,
        model: Model::new(),
        operations: 0,
    };
    let power = PowerCut::never();
    let before = run_until_power_cut(&compute, &mut workload, plan, (crash_offset, power))?;
    let crash_at = compute.now().saturating_duration_since(started);
    compute.crash_and_restart(plan, before.snapshots.acknowledged_tail)?;
    let (store, record) =
        Store::recover(compute.config.clone(), compute.device(PowerCut::never())?)
            .map_err(ScenarioError::Recover)?;
    let last_acknowledged_checkpoint = before.snapshots.acknowledged.0;
    let (recovered_unacknowledged, model) = before.snapshots.recovered(record.sequence)?;
    let keys_checked = check_recovered(&store, record.sequence, &model, plan.keys)?;
    workload.model = model;
    let operations_after = work_on(&store, &mut workload, plan)?;
    Ok(CrashOutcome {
        operations_before: before.operations,
        last_acknowledged_checkpoint,
        crashed_during: before.activity,
        crash_at,
        recovered_sequence: record.sequence,
        recovered_unacknowledged,
        keys_checked,
        operations_after,
        retransmissions: compute.retransmissions(),
    })
}

/// One seed in the simulator: the compute and memory hosts of
/// [`Topology::compute_and_memory`] on `network`.
pub fn simulated_compute_crash(
    seed: u64,
    network: Network,
    plan: CrashPlan,
) -> Result<CrashOutcome, ScenarioError> {
    let stage = SimulatedStage::on_network(seed, &Topology::compute_and_memory(), network);
    compute_crash(stage, seed, plan)
}

/// What a campaign of [`simulated_compute_crash`] seeds found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CampaignReport {
    pub first_seed: u64,
    pub seeds: u64,
    pub passed: u64,
    /// Operations acknowledged before the crashes, and run on the
    /// recovered stores, each checked against the map.
    pub operations_before: u64,
    pub operations_after: u64,
    /// Keys read back after recovery against the checkpoint's map.
    pub keys_checked: u64,
    /// Crashes that came while a checkpoint was being taken.
    pub crashed_mid_checkpoint: u64,
    /// Of those, recoveries that found the checkpoint being taken (its
    /// record had reached far memory, its acknowledgement had not).
    pub recovered_unacknowledged: u64,
    pub retransmissions: u64,
    /// The crash instants' median and latest, from the start (virtual µs).
    pub crash_at_p50_us: f64,
    pub crash_at_max_us: f64,
    pub violations: Vec<Violation>,
}

/// `count` seeds from `first_seed`; `each(seed, passed)` after each.
pub fn compute_crash_campaign(
    first_seed: u64,
    count: u64,
    network: Network,
    plan: CrashPlan,
    mut each: impl FnMut(u64, bool),
) -> CampaignReport {
    let mut report = CampaignReport {
        first_seed,
        seeds: count,
        ..CampaignReport::default()
    };
    let mut crash_instants_us = Vec::new();
    for seed in first_seed..first_seed.saturating_add(count) {
        let outcome = simulated_compute_crash(seed, network, plan);
        each(seed, outcome.is_ok());
        match outcome {
            Ok(outcome) => {
                report.add(&outcome);
                crash_instants_us.push(outcome.crash_at.as_secs_f64() * 1e6);
            }
            Err(error) => report.violations.push(Violation {
                seed,
                error: error.to_string(),
            }),
        }
    }
    crash_instants_us.sort_by(f64::total_cmp);
    report.crash_at_p50_us = crash_instants_us
        .get(crash_instants_us.len() / 2)
        .copied()
        .unwrap_or(0.0);
    report.crash_at_max_us = crash_instants_us.last().copied().unwrap_or(0.0);
    report
}

impl CampaignReport {
    fn add(&mut self, outcome: &CrashOutcome) {
        self.passed += 1;
        self.operations_before += outcome.operations_before;
        self.operations_after += outcome.operations_after;
        self.keys_checked += outcome.keys_checked;
        self.crashed_mid_checkpoint += u64::from(outcome.crashed_during == Activity::Checkpoint);
        self.recovered_unacknowledged += u64::from(outcome.recovered_unacknowledged);
        self.retransmissions += outcome.retransmissions;
    }
}

/// What the first store did before the power went.
struct BeforeCrash {
    operations: u64,
    snapshots: Snapshots,
    activity: Activity,
}

impl Snapshots {
    /// The map the recovered checkpoint `sequence` must hold, and whether
    /// that checkpoint was still unacknowledged at the crash.
    fn recovered(self, sequence: u64) -> Result<(bool, Model), ScenarioError> {
        let started = self.started.as_ref().map_or(0, |(sequence, _)| *sequence);
        if sequence == self.acknowledged.0 {
            return Ok((false, self.acknowledged.1));
        }
        match self.started {
            Some((begun, model)) if begun == sequence => Ok((true, model)),
            _ => Err(ScenarioError::WrongCheckpoint {
                recovered: sequence,
                acknowledged: self.acknowledged.0,
                started,
            }),
        }
    }
}

/// Upper bound on operations before the power goes: far more than the
/// crash window can hold.
const MAX_OPERATIONS_BEFORE: u64 = 1_000_000;

/// Runs the first store: a checkpoint of the empty store, then random
/// operations and checkpoints until the power goes `crash_offset` later.
fn run_until_power_cut<R: Rack + Send + 'static>(
    compute: &Compute<R>,
    workload: &mut Workload,
    plan: CrashPlan,
    (crash_offset, power): (Duration, Arc<PowerCut>),
) -> Result<BeforeCrash, ScenarioError> {
    let store = Store::new(compute.config.clone(), compute.device(power.clone())?)
        .map_err(ScenarioError::Store)?;
    let mut session = store.session().map_err(ScenarioError::Store)?;
    let first = session.checkpoint().map_err(ScenarioError::Store)?;
    let mut snapshots = Snapshots {
        acknowledged: (first.sequence, Model::new()),
        acknowledged_tail: first.tail,
        started: None,
    };
    power.cut_at(compute.now().saturating_add(crash_offset));
    let mut activity = Activity::Operation;
    let failure = loop {
        if workload.operations >= MAX_OPERATIONS_BEFORE {
            return Err(ScenarioError::NoCrash(workload.operations));
        }
        if let Err(failure) = workload.step(&mut session) {
            break failure;
        }
        if workload
            .operations
            .is_multiple_of(u64::from(plan.checkpoint_every))
        {
            activity = Activity::Checkpoint;
            let sequence = snapshots.acknowledged.0 + 1;
            snapshots.started = Some((sequence, workload.model.clone()));
            match session.checkpoint() {
                Ok(record) => {
                    debug_assert_eq!(record.sequence, sequence);
                    snapshots.acknowledged = snapshots.started.take().expect("just begun");
                    snapshots.acknowledged_tail = record.tail;
                }
                Err(error) => break Failure::Store(error),
            }
            activity = Activity::Operation;
        }
    };
    match failure {
        Failure::Store(error) if is_device_gone(&error) && power.is_cut(compute.now()) => {
            Ok(BeforeCrash {
                operations: workload.operations,
                snapshots,
                activity,
            })
        }
        failure => Err(failure.into_error(ScenarioError::Store)),
    }
}

/// Zeroes, in far memory, the page that holds the byte before `tail`.
fn lose_page<R: Rack>(
    rack: &mut R,
    pool: &Pool,
    tail: LogAddress,
    page_bits: u32,
) -> Result<(), ScenarioError> {
    let page = LogAddress::new(tail.value() - 1).page(page_bits);
    let start = LogAddress::page_start(page, page_bits);
    let capacity = log_capacity_bytes(pool.region.length_bytes, page_bits);
    let offset = ring_offset(start, capacity);
    let zeros = vec![0u8; 1 << page_bits];
    let address = remora_wire::VirtAddr(pool.region.address.0 + offset);
    rack.with_nic(MEMORY_HOST, |nic| {
        nic.write_local(pool.region.lkey, address, &zeros)
    })?;
    Ok(())
}

/// Reads every key of the recovered store against the checkpoint's map.
fn check_recovered(
    store: &Store,
    sequence: u64,
    model: &Model,
    keys: u32,
) -> Result<u64, ScenarioError> {
    let mut session = store.session().map_err(ScenarioError::AfterRecovery)?;
    for number in 0..keys {
        let key = key_of(number);
        let found = read_now(&mut session, &key).map_err(ScenarioError::AfterRecovery)?;
        let expected = model.get(&key).cloned();
        if found != expected {
            return Err(ScenarioError::Lost {
                sequence,
                key: String::from_utf8_lossy(&key).into_owned(),
                expected,
                found,
            });
        }
    }
    Ok(u64::from(keys))
}

/// Random checked operations on the recovered store, and a checkpoint.
fn work_on(store: &Store, workload: &mut Workload, plan: CrashPlan) -> Result<u64, ScenarioError> {
    let mut session = store.session().map_err(ScenarioError::AfterRecovery)?;
    let start = workload.operations;
    for _ in 0..plan.operations_after {
        workload
            .step(&mut session)
            .map_err(|failure| failure.into_error(ScenarioError::AfterRecovery))?;
    }
    session.checkpoint().map_err(ScenarioError::AfterRecovery)?;
    Ok(workload.operations - start)
}
