//! The Spot engine as an agent of the memory node: what survives the
//! node's crash and what does not.
//!
//! The memory pool is host memory the system declares durable (persistent
//! memory, or DRAM that outlives the engine's process): a crash keeps its
//! bytes but not its registration. So is the engine's record of the writes
//! it landed and has not committed ([`LandedWrites`]). Everything else is
//! volatile: the NIC (queue pairs, keys, the staging region) and the
//! engine's batches. On
//! restart the agent registers the pool with the fresh NIC, makes new
//! queue pairs, has the compute node connect them ([`Connector`]), and
//! the engine resumes from the engine words in each compute block.

use crate::connection::Connector;
use crate::layout::RingSizes;
use crate::spot::{InstanceFailure, LandedWrites, SpotConfig, SpotEngine, SpotError, SpotStats};
use remora_base::Timestamp;
use remora_host::{Agent, AgentError, Progress};
use remora_rnic::{AccessFlags, HostMemory, QueuePairBuilder, RemoteAddress, Verbs};

const NAME: &str = "cowbird-spot";

/// What the memory node keeps across a crash, and what it needs to build
/// the engine again: the pool, where each instance's block is (connection
/// setup told it), and the engine's settings.
pub struct SpotDurable {
    pub config: SpotConfig,
    /// The pool's regions, by region id.
    pub pool: Vec<HostMemory>,
    pub blocks: Vec<(RemoteAddress, RingSizes)>,
    /// Queue-pair settings; the protection domain and completion queue
    /// are replaced with the new NIC's.
    pub queue_pair: QueuePairBuilder,
    pub completion_queue_depth: usize,
    pub connector: Connector,
    /// The writes each instance landed that its committed progress does
    /// not cover yet: the restarted engine does not land them again.
    pub landed: LandedWrites,
}

pub struct SpotAgent {
    durable: SpotDurable,
    engine: Option<SpotEngine>,
    /// Counters of earlier incarnations: a harness's view, kept outside
    /// the node as a metrics exporter would keep them.
    earlier: SpotStats,
    restarts: u64,
}

impl SpotAgent {
    pub fn new(durable: SpotDurable, engine: SpotEngine) -> SpotAgent {
        SpotAgent {
            durable,
            engine: Some(engine),
            earlier: SpotStats::default(),
            restarts: 0,
        }
    }

    /// Counters over every incarnation.
    pub fn stats(&self) -> SpotStats {
        let current = self
            .engine
            .as_ref()
            .map(SpotEngine::stats)
            .unwrap_or_default();
        add(self.earlier, current)
    }

    /// The instances the current incarnation stopped serving, and why.
    pub fn failures(&self) -> &[InstanceFailure] {
        self.engine.as_ref().map_or(&[], |engine| engine.failures())
    }

    /// The running engine (tests).
    #[cfg(test)]
    pub(crate) fn engine_mut(&mut self) -> Option<&mut SpotEngine> {
        self.engine.as_mut()
    }

    pub fn restarts(&self) -> u64 {
        self.restarts
    }

    /// The pool's bytes, which outlive the node's crashes.
    pub fn pool(&self) -> &[HostMemory] {
        &self.durable.pool
    }

    /// One turn of the engine; `Ok(false)` while the node is down.
    pub fn turn(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<bool, SpotError> {
        match &mut self.engine {
            Some(engine) => engine.turn(now, nic),
            None => Ok(false),
        }
    }

    fn rebuild(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<SpotEngine, SpotError> {
        let durable = &self.durable;
        let protection_domain = nic.alloc_protection_domain()?;
        let regions = durable
            .pool
            .iter()
            .map(|memory| {
                nic.register_host_memory(protection_domain, memory.clone(), AccessFlags::ALL)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let staging_bytes =
            durable.config.staging_bytes_per_instance() * durable.blocks.len().max(1) as u64;
        let staging = nic.register_memory(protection_domain, staging_bytes, AccessFlags::ALL)?;
        let completion_queue = nic.create_completion_queue(durable.completion_queue_depth)?;
        let builder = QueuePairBuilder {
            protection_domain,
            send_completion_queue: completion_queue,
            receive_completion_queue: completion_queue,
            ..durable.queue_pair
        };
        SpotEngine::reconnecting(
            now,
            nic,
            durable.config,
            &durable.blocks,
            regions,
            staging,
            builder,
            durable.connector.clone(),
            durable.landed.clone(),
        )
    }
}

fn add(a: SpotStats, b: SpotStats) -> SpotStats {
    SpotStats {
        probes: a.probes + b.probes,
        empty_probes: a.empty_probes + b.empty_probes,
        batches: a.batches + b.batches,
        reads: a.reads + b.reads,
        writes: a.writes + b.writes,
        bytes_read: a.bytes_read + b.bytes_read,
        bytes_written: a.bytes_written + b.bytes_written,
        response_writes: a.response_writes + b.response_writes,
        stalls: a.stalls + b.stalls,
        reconnects: a.reconnects + b.reconnects,
        writes_not_landed_again: a.writes_not_landed_again + b.writes_not_landed_again,
        failed_instances: a.failed_instances + b.failed_instances,
    }
}

impl Agent for SpotAgent {
    fn name(&self) -> &'static str {
        NAME
    }

    fn poll(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        self.turn(now, nic)
            .map(Progress::from_moved)
            .map_err(|error| AgentError::system(NAME, error))
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        self.engine.as_ref().and_then(SpotEngine::poll_timeout)
    }

    fn crash(&mut self) {
        if let Some(engine) = self.engine.take() {
            self.earlier = add(self.earlier, engine.stats());
        }
    }

    fn restart(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<(), AgentError> {
        let _span = tracing::info_span!("spot_restart").entered();
        let engine = self
            .rebuild(now, nic)
            .map_err(|error| AgentError::system(NAME, error))?;
        self.engine = Some(engine);
        self.restarts += 1;
        Ok(())
    }
}
