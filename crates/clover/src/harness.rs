//! What a Clover run is, whatever carries its frames: the configuration
//! ([`Run`]), the two hosts and their forwarding, the store's layout and
//! workload derived from it, and the application ([`Application`]) that
//! feeds the clients, moves them along and plays the metadata server.
//! The application runs as two agents ([`ClientsAgent`] on the compute
//! host, [`MetadataAgent`] on the memory host) in both modes, through
//! [`crate::scenario`].

use crate::deploy::{Deployment, Feeder, StoreSpec};
use crate::metadata::{MetadataConfig, MetadataError, MetadataStats, RnicRegion};
use crate::pool::{CloverError, PoolConfig, PoolStats};
use crate::resolver::{CloverResolver, ResolverCounters, ResolverMemory};
use remora_host::hardware::NicHardware;
use remora_host::{Agent, AgentError, Progress};
use remora_rack::topology::Topology;
use remora_rnic::{SoftRnic, Timestamp, Verbs};
use remora_sim::LinkFaults;
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::Program;
use remora_workloads::distribution::{DistributionError, KeyChooser};
use remora_workloads::history::{self, MalformedHistory, Verdict};
use remora_workloads::ycsb::{Generator, RequestDistribution, WorkloadError, WorkloadSpec};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Which part of a Clover run failed.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("workload: {0}")]
    Workload(#[from] WorkloadError),
    #[error("key distribution: {0}")]
    Distribution(#[from] DistributionError),
    #[error(transparent)]
    Clover(#[from] CloverError),
    #[error("metadata server: {0}")]
    Metadata(#[from] MetadataError),
    #[error(transparent)]
    Resolver(#[from] crate::resolver::ResolverError),
    #[error(transparent)]
    History(#[from] MalformedHistory),
    #[error("{0}")]
    Rack(#[from] remora_rack::RackError),
    #[error("{host} host: {error}")]
    Agent { host: String, error: AgentError },
    #[error("the run did not finish within {0:?}")]
    Unfinished(Duration),
    #[error("garbage collection every {period:?} leaves requests no time under a {grace:?} grace: collect more often than the grace")]
    GraceTooShort { grace: Duration, period: Duration },
}

/// The rack's two hosts: compute (the clients) and memory (the store).
pub fn topology() -> Topology {
    Topology::compute_and_memory()
}

/// The rack's forwarding between the two hosts.
pub fn forwarding() -> L2L3Forwarding {
    topology().forwarding()
}

/// A switch program a Clover run can put on the switch.
pub trait CloverSwitch: Program + Send + Sized + 'static {
    /// The program for `deployment`, caching `cached_keys` if it caches.
    fn build(
        deployment: &Deployment,
        compute: &SoftRnic,
        memory: &SoftRnic,
        cached_keys: &[u64],
    ) -> Result<Self, HarnessError>;

    /// The resolver's counters and memory, if this is the resolver.
    fn report(&self) -> Option<(ResolverCounters, ResolverMemory)>;
}

impl CloverSwitch for L2L3Forwarding {
    fn build(_: &Deployment, _: &SoftRnic, _: &SoftRnic, _: &[u64]) -> Result<Self, HarnessError> {
        Ok(forwarding())
    }

    fn report(&self) -> Option<(ResolverCounters, ResolverMemory)> {
        None
    }
}

impl CloverSwitch for CloverResolver {
    fn build(
        deployment: &Deployment,
        compute: &SoftRnic,
        memory: &SoftRnic,
        cached_keys: &[u64],
    ) -> Result<Self, HarnessError> {
        Ok(deployment.resolver(forwarding(), compute, memory, cached_keys)?)
    }

    fn report(&self) -> Option<(ResolverCounters, ResolverMemory)> {
        Some((self.counters(), self.memory()))
    }
}

/// Which program the switch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchChoice {
    /// Plain L2/L3 forwarding: Clover resolves its own conflicts.
    Plain,
    /// The resolver, caching the `cached_keys` hottest keys.
    Resolver { cached_keys: usize },
}

/// One run's configuration.
#[derive(Debug, Clone, Copy)]
pub struct Run {
    pub clients: usize,
    pub keys: u64,
    /// Operations measured.
    pub operations: u64,
    /// Operations run before the measured ones and left out of every
    /// figure: the clients start with empty location caches, so a short
    /// run measures cold caches more than Clover.
    pub warmup_operations: u64,
    pub read_proportion: f64,
    /// None for uniform keys, Some(θ) for zipfian.
    pub zipf_theta: Option<f64>,
    pub switch: SwitchChoice,
    /// Faults on every link (the simulator), or on the compute node's
    /// link (the embedded rack).
    pub faults: LinkFaults,
    pub region_bytes: u64,
    pub value_bytes: usize,
    pub garbage_every: Option<Duration>,
    /// The garbage collector's grace; the clients' cache lifetime and
    /// deadline follow from it.
    pub grace: Duration,
    pub check_history: bool,
    /// The simulated NICs' hardware (the embedded rack's NICs are what
    /// they are).
    pub hardware: NicHardware,
}

impl Run {
    /// YCSB-style defaults: 64 clients, 1024 keys, zipf 0.75, half reads.
    pub fn new(switch: SwitchChoice) -> Run {
        Run {
            clients: 64,
            keys: 1024,
            operations: 20_000,
            warmup_operations: 0,
            read_proportion: 0.5,
            zipf_theta: Some(0.75),
            switch,
            faults: LinkFaults::NONE,
            region_bytes: 8 << 20,
            value_bytes: 16,
            garbage_every: Some(Duration::from_millis(1)),
            grace: Duration::from_millis(40),
            check_history: false,
            hardware: NicHardware::Ideal,
        }
    }

    /// The store this run deploys, with queue pairs timing out after
    /// `ack_timeout`.
    pub fn store(&self, ack_timeout: Duration) -> StoreSpec {
        StoreSpec {
            key_count: self.keys,
            value_bytes: self.value_bytes,
            region_bytes: self.region_bytes,
            clients: self.clients,
            metadata: MetadataConfig {
                batch_slots: 8,
                keep_versions: 2,
                grace: self.grace,
            },
            pool: PoolConfig {
                cache_lifetime: self.grace / 4,
                operation_deadline: self.operation_deadline(),
                record_history: self.check_history,
                ..PoolConfig::DEFAULT
            },
            ack_timeout,
        }
    }

    /// How long a request may run. A retired slot is freed a grace after
    /// its retirement, at a collection pass. A writer whose operation
    /// began before the retirement can still land a shortcut naming the
    /// slot up to a deadline later; a reader can read that shortcut until
    /// the next pass moves it (a collection period on), and READ the slot
    /// a deadline after that. So two deadlines and a period fit in the
    /// grace. (At half the grace each, a shortcut overwritten by a newer
    /// write before that pass let a reader READ the slot after its
    /// reuse.) The cache lifetime, a quarter of the grace, and one
    /// deadline fit in it too.
    pub fn operation_deadline(&self) -> Duration {
        let period = self.garbage_every.unwrap_or(Duration::ZERO);
        self.grace.saturating_sub(period) / 2
    }

    /// Refuses a run whose collections come no more often than the grace:
    /// its requests would have no time at all.
    fn check(&self) -> Result<(), HarnessError> {
        match self.garbage_every {
            Some(period) if period >= self.grace => Err(HarnessError::GraceTooShort {
                grace: self.grace,
                period,
            }),
            _ => Ok(()),
        }
    }

    fn workload(&self) -> Result<WorkloadSpec, HarnessError> {
        let mut workload = WorkloadSpec::preset("a")?;
        workload.record_count = self.keys;
        match self.zipf_theta {
            Some(theta) => {
                workload.distribution = RequestDistribution::Zipfian;
                workload.zipfian_constant = theta;
            }
            None => workload.distribution = RequestDistribution::Uniform,
        }
        workload.mix.read = self.read_proportion;
        workload.mix.update = 1.0 - self.read_proportion;
        Ok(workload)
    }

    /// A bound on the whole run: every operation ends within the pool's
    /// deadline, and clients run side by side, so the run fits in
    /// operations × grace, plus time to start.
    pub fn time_limit(&self) -> Duration {
        let operations = self.operations.saturating_add(self.warmup_operations);
        Duration::from_secs(10) + self.grace * operations.min(1 << 20) as u32
    }

    /// The keys the resolver caches: the hottest of the workload.
    pub fn hottest(&self, count: usize) -> Result<Vec<u64>, HarnessError> {
        let count = count.min(self.keys as usize);
        match self.workload()?.key_chooser()? {
            KeyChooser::Zipfian(zipfian) => Ok(zipfian.hottest(count)),
            // With no skew, any keys are as hot as any others.
            _ => Ok((0..count as u64).collect()),
        }
    }
}

/// What the application loop ends with.
#[derive(Debug, Clone)]
pub struct Finish {
    /// The measured operations' stats (after the warm-up).
    pub stats: PoolStats,
    /// Operations completed in the whole run, warm-up included.
    pub operations_run: u64,
    pub metadata: MetadataStats,
    /// Versions found whole by the final audit.
    pub versions: u64,
    /// Writes that completed after the last collection: each added one
    /// version that no collection has trimmed yet.
    pub writes_since_collection: u64,
    pub verdict: Option<Verdict>,
    /// Every request's invocation and return, when the run checked its
    /// history.
    pub history: Vec<history::Event>,
}

/// The application side of a run: the deployed store and the workload
/// feeding it. The metadata server's turns are separate calls, so a
/// caller can account for them apart from the clients'.
pub struct Application {
    pub deployment: Deployment,
    feeder: Feeder,
    garbage_every: Option<Duration>,
    last_collection: Timestamp,
    /// Completed writes when the last collection ran.
    writes_at_collection: u64,
    check_history: bool,
    /// When the last request returned.
    finished_at: Option<Timestamp>,
    /// Operations to complete before measuring.
    warmup_operations: u64,
    /// When the warm-up ended, and the stats counted by then.
    warmed: Option<(Timestamp, PoolStats)>,
}

impl Application {
    pub fn new(deployment: Deployment, run: &Run, seed: u64) -> Result<Application, HarnessError> {
        run.check()?;
        let generator = Generator::new(run.workload()?, seed)?;
        Ok(Application {
            deployment,
            feeder: Feeder::new(
                generator,
                run.operations.saturating_add(run.warmup_operations),
                run.value_bytes,
            ),
            garbage_every: run.garbage_every,
            last_collection: Timestamp::ZERO,
            writes_at_collection: 0,
            check_history: run.check_history,
            finished_at: None,
            warmup_operations: run.warmup_operations,
            warmed: None,
        })
    }

    /// Gives idle clients their next request and moves every client
    /// along on the compute node's RNIC. Returns whether anything moved.
    pub fn turn_clients(
        &mut self,
        now: Timestamp,
        compute: &mut dyn Verbs,
    ) -> Result<bool, CloverError> {
        let pool = &mut self.deployment.pool;
        self.feeder.feed(pool)?;
        let moved = pool.poll(now, compute)?;
        let stats = pool.stats();
        if self.warmed.is_none() && stats.reads + stats.writes >= self.warmup_operations {
            self.warmed = Some((now, stats.clone()));
        }
        if self.finished_at.is_none() && self.every_request_returned() {
            self.finished_at = Some(now);
        }
        Ok(moved)
    }

    /// When the last request returned, once every one has.
    pub fn finished_at(&self) -> Option<Timestamp> {
        self.finished_at
    }

    /// When the measured operations began: once the warm-up completed
    /// (with none, at the clients' first turn).
    pub fn measured_from(&self) -> Option<Timestamp> {
        self.warmed.as_ref().map(|(at, _)| *at)
    }

    pub fn collection_due(&self, now: Timestamp) -> bool {
        self.garbage_every
            .is_some_and(|period| now.saturating_duration_since(self.last_collection) >= period)
    }

    /// The metadata server's turn, beside the memory node: answers the
    /// clients' requests and collects garbage when due.
    pub fn turn_metadata(
        &mut self,
        now: Timestamp,
        memory: &mut dyn Verbs,
    ) -> Result<(), CloverError> {
        let mut region = RnicRegion {
            rnic: memory,
            region: self.deployment.memory_region,
        };
        let collect = self.collection_due(now);
        let (pool, server) = (&mut self.deployment.pool, &mut self.deployment.metadata);
        if pool.wants_metadata() {
            pool.answer_metadata(now, server, &mut region)?;
        }
        if collect {
            server.collect(now, &mut region)?;
            self.last_collection = now;
            self.writes_at_collection = pool.stats().writes;
        }
        Ok(())
    }

    /// When the metadata server next has work without a client asking:
    /// the next collection.
    pub fn next_collection(&self) -> Option<Timestamp> {
        self.garbage_every
            .map(|period| self.last_collection.saturating_add(period))
    }

    /// Whether every request of the workload returned (shortcut WRITEs
    /// may still be on their way).
    fn every_request_returned(&self) -> bool {
        self.feeder.remaining == 0
            && (0..self.deployment.pool.client_count())
                .all(|client| self.deployment.pool.is_idle(client))
    }

    /// Whether the workload is done, every client idle and every
    /// shortcut WRITE landed.
    pub fn finished(&self) -> bool {
        self.every_request_returned() && self.deployment.pool.all_idle()
    }

    /// Audits every list and, if asked, checks the history.
    pub fn finish(&self, memory: &mut dyn Verbs) -> Result<Finish, HarnessError> {
        let mut region = RnicRegion {
            rnic: memory,
            region: self.deployment.memory_region,
        };
        let versions = self.deployment.metadata.audit(&mut region)?;
        let verdict = match self.check_history {
            true => Some(history::check(self.deployment.pool.history())?),
            false => None,
        };
        let stats = self.deployment.pool.stats();
        Ok(Finish {
            operations_run: stats.reads + stats.writes,
            stats: match &self.warmed {
                Some((_, warm)) => stats.since(warm),
                None => stats.clone(),
            },
            metadata: self.deployment.metadata.stats(),
            versions,
            writes_since_collection: self.deployment.pool.stats().writes
                - self.writes_at_collection,
            verdict,
            history: self.deployment.pool.history().to_vec(),
        })
    }
}

/// The application, shared by its two agents: the clients on the compute
/// host and the metadata server beside the memory node. The server is
/// called in-process (its answers reach the clients through this shared
/// state), off the data path, as the pool's `answer_metadata` describes.
pub type SharedApplication = Arc<Mutex<Application>>;

/// The application, unless the other agent holds it now. On the embedded
/// rack the two agents run on different threads (the clients on the
/// compute host's CPU, the server on the fabric thread), and an agent that
/// waited for the lock would count the wait as its busy time and hold up
/// its thread; it takes its turn later instead. In the simulator the lock
/// is never held across agents' turns.
fn try_lock(application: &SharedApplication) -> Option<std::sync::MutexGuard<'_, Application>> {
    match application.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::WouldBlock) => None,
        Err(std::sync::TryLockError::Poisoned(_)) => panic!("application lock poisoned"),
    }
}

/// How often the clients act with nothing arriving: their deadlines and
/// cache lifetimes need a clock.
pub const CLIENT_TURN: Duration = Duration::from_micros(1);

const CLIENTS: &str = "clover-clients";
const METADATA: &str = "clover-metadata";

/// The clients, an agent of the compute host.
pub struct ClientsAgent {
    application: SharedApplication,
    next_turn: Timestamp,
}

impl ClientsAgent {
    pub fn new(application: SharedApplication) -> ClientsAgent {
        ClientsAgent {
            application,
            next_turn: Timestamp::ZERO,
        }
    }
}

impl Agent for ClientsAgent {
    fn name(&self) -> &'static str {
        CLIENTS
    }

    fn poll(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        let Some(mut application) = try_lock(&self.application) else {
            return Ok(Progress::Idle);
        };
        if application.finished() {
            return Ok(Progress::Idle);
        }
        self.next_turn = now.saturating_add(CLIENT_TURN);
        application
            .turn_clients(now, nic)
            .map(Progress::from_moved)
            .map_err(|error| AgentError::system(CLIENTS, error))
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        match try_lock(&self.application) {
            Some(application) => (!application.finished()).then_some(self.next_turn),
            // Held by the server: look again at the next turn.
            None => Some(self.next_turn),
        }
    }

    fn crash(&mut self) {}

    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Err(AgentError::system(CLIENTS, NotRestartable))
    }
}

/// The metadata server, an agent of the memory host.
pub struct MetadataAgent {
    application: SharedApplication,
    /// The server answers at most once per client turn: a request it
    /// cannot serve yet (no free slots until a collection) waits that
    /// long, rather than being asked again at the same instant.
    next_answer: Timestamp,
}

impl MetadataAgent {
    pub fn new(application: SharedApplication) -> MetadataAgent {
        MetadataAgent {
            application,
            next_answer: Timestamp::ZERO,
        }
    }
}

impl Agent for MetadataAgent {
    fn name(&self) -> &'static str {
        METADATA
    }

    fn poll(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        let Some(mut application) = try_lock(&self.application) else {
            return Ok(Progress::Idle);
        };
        let answer_due = application.deployment.pool.wants_metadata() && now >= self.next_answer;
        if !answer_due && !application.collection_due(now) {
            return Ok(Progress::Idle);
        }
        self.next_answer = now.saturating_add(CLIENT_TURN);
        application
            .turn_metadata(now, nic)
            .map(|()| Progress::Moved)
            .map_err(|error| AgentError::system(METADATA, error))
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        let Some(application) = try_lock(&self.application) else {
            // Held by the clients: look again when an answer could be due.
            return Some(self.next_answer);
        };
        if application.finished() {
            return None;
        }
        let answer = application
            .deployment
            .pool
            .wants_metadata()
            .then_some(self.next_answer);
        [answer, application.next_collection()]
            .into_iter()
            .flatten()
            .min()
    }

    fn crash(&mut self) {}

    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Err(AgentError::system(METADATA, NotRestartable))
    }
}

/// Clover's hosts do not survive restarts here: the clients' and the
/// server's state is not declared durable.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("Clover's clients and metadata server do not survive a restart of their host")]
pub struct NotRestartable;
