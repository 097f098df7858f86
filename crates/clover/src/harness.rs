//! What a Clover run is, whatever carries its frames: the configuration
//! ([`Run`]), the two hosts and their forwarding, the store's layout and
//! workload derived from it, and the application loop ([`Application`])
//! that feeds the clients, moves them along and plays the metadata
//! server. The simulated run ([`crate::simulated`]) and the run on the
//! embedded rack ([`crate::embedded`]) both drive this loop, so they
//! measure the same client code.

use crate::deploy::{Deployment, Feeder, StoreSpec};
use crate::history::{self, Verdict};
use crate::metadata::{MetadataConfig, MetadataStats, RnicRegion};
use crate::pool::{PoolConfig, PoolStats};
use crate::resolver::{CloverResolver, ResolverCounters, ResolverMemory};
use remora_rnic::{SoftRnic, Timestamp};
use remora_sim::LinkFaults;
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::Program;
use remora_wire::{Ipv4Address, MacAddress};
use remora_workloads::distribution::KeyChooser;
use remora_workloads::ycsb::{Generator, RequestDistribution, WorkloadSpec};
use std::time::Duration;

/// The compute node's index (switch port 0).
pub const COMPUTE: u8 = 1;
/// The memory node's index (switch port 1).
pub const MEMORY: u8 = 2;

pub fn mac(index: u8) -> MacAddress {
    MacAddress([0x02, 0, 0, 0, 0, index])
}

pub fn ip(index: u8) -> Ipv4Address {
    Ipv4Address::new(10, 0, 0, index)
}

/// The rack's forwarding between the two hosts.
pub fn forwarding() -> L2L3Forwarding {
    let hosts = [COMPUTE, MEMORY].map(|index| (mac(index), ip(index)));
    L2L3Forwarding::with_attached_hosts(MacAddress([0x02, 0x5e, 0, 0, 0, 0xfe]), &hosts)
        .expect("two hosts fit the tables")
}

/// A switch program a Clover run can put on the switch.
pub trait CloverSwitch: Program + Send + Sized + 'static {
    /// The program for `deployment`, caching `cached_keys` if it caches.
    fn build(
        deployment: &Deployment,
        compute: &SoftRnic,
        memory: &SoftRnic,
        cached_keys: &[u64],
    ) -> Result<Self, String>;

    /// The resolver's counters and memory, if this is the resolver.
    fn report(&self) -> Option<(ResolverCounters, ResolverMemory)>;
}

impl CloverSwitch for L2L3Forwarding {
    fn build(_: &Deployment, _: &SoftRnic, _: &SoftRnic, _: &[u64]) -> Result<Self, String> {
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
    ) -> Result<Self, String> {
        deployment
            .resolver(forwarding(), compute, memory, cached_keys)
            .map_err(|error| error.to_string())
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
    pub operations: u64,
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
                operation_deadline: self.grace / 2,
                record_history: self.check_history,
                ..PoolConfig::DEFAULT
            },
            ack_timeout,
        }
    }

    fn workload(&self) -> Result<WorkloadSpec, String> {
        let mut workload = WorkloadSpec::preset("a").map_err(|error| error.to_string())?;
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

    /// The keys the resolver caches: the hottest of the workload.
    pub fn hottest(&self, count: usize) -> Result<Vec<u64>, String> {
        let count = count.min(self.keys as usize);
        match self
            .workload()?
            .key_chooser()
            .map_err(|error| error.to_string())?
        {
            KeyChooser::Zipfian(zipfian) => Ok(zipfian.hottest(count)),
            // With no skew, any keys are as hot as any others.
            _ => Ok((0..count as u64).collect()),
        }
    }
}

/// What the application loop ends with.
#[derive(Debug, Clone)]
pub struct Finish {
    pub stats: PoolStats,
    pub metadata: MetadataStats,
    /// Versions found whole by the final audit.
    pub versions: u64,
    pub verdict: Option<Verdict>,
}

/// The application side of a run: the deployed store and the workload
/// feeding it. The metadata server's turns are separate calls, so a
/// caller can account for them apart from the clients'.
pub struct Application {
    pub deployment: Deployment,
    feeder: Feeder,
    garbage_every: Option<Duration>,
    last_collection: Timestamp,
    check_history: bool,
}

impl Application {
    pub fn new(deployment: Deployment, run: &Run, seed: u64) -> Result<Application, String> {
        let generator = Generator::new(run.workload()?, seed).map_err(|error| error.to_string())?;
        Ok(Application {
            deployment,
            feeder: Feeder::new(generator, run.operations, run.value_bytes),
            garbage_every: run.garbage_every,
            last_collection: Timestamp::ZERO,
            check_history: run.check_history,
        })
    }

    /// Gives idle clients their next request and moves every client
    /// along on the compute node's RNIC. Returns whether anything moved.
    pub fn turn_clients(&mut self, now: Timestamp, compute: &mut SoftRnic) -> Result<bool, String> {
        let pool = &mut self.deployment.pool;
        self.feeder.feed(pool).map_err(|error| error.to_string())?;
        pool.poll(now, compute).map_err(|error| error.to_string())
    }

    /// Whether the metadata server has work: a client's request, or a
    /// collection that is due.
    pub fn metadata_due(&self, now: Timestamp) -> bool {
        self.deployment.pool.wants_metadata() || self.collection_due(now)
    }

    fn collection_due(&self, now: Timestamp) -> bool {
        self.garbage_every
            .is_some_and(|period| now.saturating_duration_since(self.last_collection) >= period)
    }

    /// The metadata server's turn, beside the memory node: answers the
    /// clients' requests and collects garbage when due.
    pub fn turn_metadata(&mut self, now: Timestamp, memory: &mut SoftRnic) -> Result<(), String> {
        let text = |error: &dyn std::fmt::Display| error.to_string();
        let mut region = RnicRegion {
            rnic: memory,
            region: self.deployment.memory_region,
        };
        let collect = self.collection_due(now);
        let (pool, server) = (&mut self.deployment.pool, &mut self.deployment.metadata);
        if pool.wants_metadata() {
            pool.answer_metadata(now, server, &mut region)
                .map_err(|e| text(&e))?;
        }
        if collect {
            server.collect(now, &mut region).map_err(|e| text(&e))?;
            self.last_collection = now;
        }
        Ok(())
    }

    /// Whether the workload is done and every client idle.
    pub fn finished(&self) -> bool {
        self.feeder.remaining == 0 && self.deployment.pool.all_idle()
    }

    /// Audits every list and, if asked, checks the history.
    pub fn finish(&self, memory: &mut SoftRnic) -> Result<Finish, String> {
        let mut region = RnicRegion {
            rnic: memory,
            region: self.deployment.memory_region,
        };
        let versions = self
            .deployment
            .metadata
            .audit(&mut region)
            .map_err(|error| error.to_string())?;
        let verdict = match self.check_history {
            true => Some(history::check(self.deployment.pool.history())?),
            false => None,
        };
        Ok(Finish {
            stats: self.deployment.pool.stats().clone(),
            metadata: self.deployment.metadata.stats(),
            versions,
            verdict,
        })
    }
}
