//! Cowbird-Spot (section 6): the offload engine on the memory node's
//! spare CPU, issuing ordinary verbs on the memory node's NIC. Sans-IO:
//! [`SpotEngine::turn`] takes the time and the NIC, so the simulator and
//! the rack drive the same code.
//!
//! Per instance (one compute thread's block), one batch at a time:
//!
//! 1. **Probe**: READ the client words (metadata tail). Nothing new: the
//!    next probe waits twice as long, up to `probe_interval_max`; any
//!    activity resets it to `probe_interval_min`.
//! 2. **Fetch**: READ up to `batch_entries` new metadata entries (two
//!    READs when the ring wraps).
//! 3. **Execute**, in entry order: a write's payload is READ from the
//!    compute node straight into the memory pool; a read is copied from
//!    the pool into the engine's staging buffer. An entry that overlaps a
//!    write still in flight (from any instance) makes this batch wait for
//!    that write: a read never sees a write issued after it and always
//!    sees one issued before it, and overlapping writes land in order
//!    (a retried READ may place its data again, so two overlapping
//!    payload READs in flight could land out of order).
//! 4. **Complete**: one WRITE per contiguous run of read responses into
//!    the compute node's response ring, then one WRITE of the engine
//!    words (metadata head, read and write progress). The queue pair is
//!    reliable and ordered, so progress never overtakes data.
//!
//! Instances take turns round-robin, so one busy thread cannot starve
//! another.
//!
//! **Reconnection.** When an instance's queue pair dies (retries
//! exhausted, or the memory node restarted with a fresh NIC), the engine
//! makes a new one, has the compute node connect to it through the
//! [`Connector`] (a control-plane step), reads the engine words back from
//! the compute block, and resumes from the last committed batch. The
//! interrupted batch runs again: writes land again (the same bytes in the
//! same place) and reads are served again, so a read of that batch may see
//! writes issued after it that had landed before the failure, which
//! linearizability allows for requests still outstanding. A write of that
//! batch whose payload had already landed is not landed again: since it
//! landed, another instance may have landed a newer write over the same
//! bytes, and a reader may have seen it. Which writes landed is kept in
//! [`LandedWrites`], memory that outlives the engine as the pool does, so
//! an engine restarted after its host crashed skips them too. Every
//! request completes once: progress words only move forward.

use crate::connection::{ConnectionError, Connector};
use crate::layout::{
    Entry, EntryError, Kind, RingSizes, CLIENT_WORDS_AT, CLIENT_WORDS_BYTES, ENGINE_WORDS_AT,
    ENGINE_WORDS_BYTES, ENTRY_BYTES, MAX_REQUEST_BYTES,
};
use remora_rnic::{
    CompletionQueue, CompletionStatus, HostMemory, MemoryRegion, PreparedQueuePair, QueuePair,
    QueuePairBuilder, QueuePairTransition, RemoteAddress, SendOperation, SendRequest, Timestamp,
    Verbs, VerbsError,
};
use remora_wire::VirtAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub struct SpotConfig {
    /// Entries fetched (and responses packed) per batch: the paper's
    /// BATCH_SIZE.
    pub batch_entries: u64,
    pub probe_interval_min: Duration,
    pub probe_interval_max: Duration,
}

impl SpotConfig {
    pub const DEFAULT: SpotConfig = SpotConfig {
        batch_entries: 64,
        probe_interval_min: Duration::from_micros(1),
        probe_interval_max: Duration::from_micros(20),
    };

    /// Staging bytes one instance needs: probe words, engine words,
    /// entries, packed responses.
    pub fn staging_bytes_per_instance(&self) -> u64 {
        STAGING_ENTRIES_AT + self.batch_entries * (ENTRY_BYTES + u64::from(MAX_REQUEST_BYTES))
    }

    /// Refuses a configuration an engine could not run: a batch of no
    /// entries posted no fetch and waited for its completion for ever.
    pub fn check(&self) -> Result<(), SpotError> {
        if self.batch_entries == 0 {
            return Err(SpotError::ZeroBatch);
        }
        Ok(())
    }
}

const STAGING_PROBE_AT: u64 = 0;
const STAGING_ENGINE_WORDS_AT: u64 = 64;
const STAGING_ENTRIES_AT: u64 = 128;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpotError {
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    #[error("instance {instance}: malformed entry: {error}")]
    Entry { instance: usize, error: EntryError },
    #[error("instance {instance}: entry names region {region}, which does not exist")]
    UnknownRegion { instance: usize, region: u16 },
    #[error("instance {instance}: entry reaches past region {region}")]
    OutOfBounds { instance: usize, region: u16 },
    #[error(
        "instance {instance}: entry's data at {address} (+{length} bytes) is outside its block"
    )]
    OutsideBlock {
        instance: usize,
        address: u64,
        length: u32,
    },
    #[error("instance {instance}: a verb completed with {status:?}")]
    Completion {
        instance: usize,
        status: CompletionStatus,
    },
    #[error(
        "instance {instance}: more landed writes than it fetched since its last committed head"
    )]
    LandedRecordFull { instance: usize },
    #[error("the landed-write record has room for {instances} instances of {capacity} writes, fewer than the engine needs")]
    LandedRecordTooSmall { instances: usize, capacity: usize },
    #[error("staging region of {have} bytes is smaller than the {need} bytes the instances need")]
    StagingTooSmall { have: u64, need: u64 },
    #[error("instance {instance}: reconnecting: {error}")]
    Reconnect {
        instance: usize,
        error: ConnectionError,
    },
    #[error("instance {instance}: {MAX_RECONNECTS_IN_A_ROW} reconnections in a row without finishing a batch")]
    ReconnectsExhausted { instance: usize },
    #[error("a batch of 0 entries fetches nothing and never completes: batch_entries must be at least 1")]
    ZeroBatch,
}

impl SpotError {
    /// The instance an error belongs to alone: its client wrote what no
    /// client library writes, or its link is gone. Such an error stops
    /// that instance; the others go on. `None` is the engine's own (its
    /// NIC, its staging), which stops the engine.
    pub fn instance(&self) -> Option<usize> {
        match *self {
            SpotError::Entry { instance, .. }
            | SpotError::UnknownRegion { instance, .. }
            | SpotError::OutOfBounds { instance, .. }
            | SpotError::OutsideBlock { instance, .. }
            | SpotError::Completion { instance, .. }
            | SpotError::Reconnect { instance, .. }
            | SpotError::ReconnectsExhausted { instance }
            | SpotError::LandedRecordFull { instance } => Some(instance),
            SpotError::Verbs(_)
            | SpotError::StagingTooSmall { .. }
            | SpotError::LandedRecordTooSmall { .. }
            | SpotError::ZeroBatch => None,
        }
    }
}

/// An instance the engine stopped serving, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceFailure {
    pub instance: usize,
    pub error: SpotError,
}

/// Reconnections an instance may make without finishing a batch between
/// them; past it the link is taken as gone for good.
pub const MAX_RECONNECTS_IN_A_ROW: u32 = 16;

/// One compute thread's block as the engine reaches it.
#[derive(Debug, Clone, Copy)]
pub struct InstanceWiring {
    /// The engine's end of the queue pair to the compute node.
    pub queue_pair: QueuePair,
    /// The compute block's base.
    pub block: RemoteAddress,
    pub sizes: RingSizes,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpotStats {
    pub probes: u64,
    pub empty_probes: u64,
    pub batches: u64,
    pub reads: u64,
    pub writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// RDMA WRITEs that carried read responses (fewer than reads: packing).
    pub response_writes: u64,
    /// Batches that waited for an overlapping write.
    pub stalls: u64,
    /// Queue pairs made anew after one died.
    pub reconnects: u64,
    /// Writes of a batch run again after a reconnection that had landed
    /// before it, and were not landed again.
    pub writes_not_landed_again: u64,
    /// Instances stopped for an error of their own (see
    /// [`SpotEngine::failures`]).
    pub failed_instances: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Idle,
    /// A new queue pair waits for the compute node to connect to it.
    Reconnecting,
    /// Reading the engine words back after a reconnection.
    Resuming,
    Probing,
    Fetching {
        reads_left: u8,
    },
    Executing,
    Completing,
    /// Stopped for an error of its own: never served again, its queue
    /// pair in ERR.
    Failed,
}

#[derive(Debug, Clone, Copy)]
struct Step {
    entry: Entry,
    /// A read's response offset in staging: responses are packed in entry
    /// order, so it is known when the batch is parsed.
    staging_at: u64,
    done: bool,
    /// A write whose payload READ is posted.
    posted: bool,
}

#[derive(Debug)]
struct Instance {
    wiring: InstanceWiring,
    staging_at: u64,
    phase: Phase,
    fetched: u64,
    read_progress: u64,
    write_progress: u64,
    next_probe: Timestamp,
    interval: Duration,
    batch: Vec<Step>,
    /// The next entry of the batch to execute.
    cursor: usize,
    writes_in_flight: usize,
    /// Entries in the fetch under way.
    fetch_count: u64,
    /// The connection's number: completions of an older queue pair (its
    /// flushed work) are recognised by it and ignored.
    epoch: u8,
    /// The new queue pair, while reconnecting.
    prepared: Option<PreparedQueuePair>,
    reconnects_in_a_row: u32,
    /// The first batch after a reconnection lands its writes before it
    /// serves its reads (see [`SpotEngine::fetched`]).
    writes_first: bool,
}

/// Per instance, the writes (by sequence) whose payload landed in the
/// pool while their batch's progress may not have reached the compute
/// node. A batch run again skips them: landed again, one could overwrite
/// a newer write another instance landed since, which a reader may have
/// seen. The record is host memory that outlives the engine, as the pool
/// does (the node declares both durable), so an engine restarted after
/// its host crashed knows them too; kept in the engine, it was lost with
/// the crash and the restarted engine landed them all again.
///
/// Per instance: a count word, then `capacity` sequence words. A write
/// is recorded once its payload landed and before anything that follows
/// from it; the count is stored after the sequences it covers, so a
/// record cut short by a crash holds whole entries.
#[derive(Debug, Clone)]
pub struct LandedWrites {
    memory: HostMemory,
    instances: usize,
    capacity: usize,
}

impl LandedWrites {
    /// Room for `instances` instances of engines run with `config`. The
    /// writes recorded are those fetched since the instance's last
    /// committed head, at most a batch; twice that leaves room to spare.
    pub fn new(instances: usize, config: &SpotConfig) -> LandedWrites {
        let capacity = 2 * config.batch_entries as usize;
        LandedWrites {
            memory: HostMemory::new(instances * (1 + capacity) * WORD_BYTES),
            instances,
            capacity,
        }
    }

    /// The byte offset of word `word` of instance `instance`'s record.
    fn word_at(&self, instance: usize, word: usize) -> usize {
        assert!(instance < self.instances && word <= self.capacity);
        (instance * (1 + self.capacity) + word) * WORD_BYTES
    }

    fn load(&self, instance: usize, word: usize) -> u64 {
        self.memory
            .load_u64(self.word_at(instance, word), Ordering::Acquire)
            .expect("the record's words lie inside its memory")
    }

    fn store(&self, instance: usize, word: usize, value: u64) {
        self.memory
            .store_u64(self.word_at(instance, word), value, Ordering::Release)
            .expect("the record's words lie inside its memory");
    }

    fn count(&self, instance: usize) -> usize {
        let count = self.load(instance, 0) as usize;
        assert!(
            count <= self.capacity,
            "a record holds at most its capacity"
        );
        count
    }

    /// The sequences recorded for `instance`, in the order they landed.
    fn sequences(&self, instance: usize) -> impl Iterator<Item = u64> + '_ {
        (0..self.count(instance)).map(move |slot| self.load(instance, 1 + slot))
    }

    /// Records a landed write; false when the record is full. A client
    /// library never fills it (the writes fetched since the committed
    /// head are at most a batch), but a hostile one rewriting its ring
    /// between redos can: that is its instance's failure, not a panic of
    /// the engine that serves every instance.
    fn push(&self, instance: usize, sequence: u64) -> bool {
        let count = self.count(instance);
        if count >= self.capacity {
            return false;
        }
        self.store(instance, 1 + count, sequence);
        self.store(instance, 0, count as u64 + 1);
        true
    }

    fn contains(&self, instance: usize, sequence: u64) -> bool {
        self.sequences(instance).any(|landed| landed == sequence)
    }

    fn clear(&self, instance: usize) {
        self.store(instance, 0, 0);
    }

    /// Forgets the writes the compute node's progress covers.
    fn retain_after(&self, instance: usize, write_progress: u64) {
        let mut kept = 0;
        for slot in 0..self.count(instance) {
            let sequence = self.load(instance, 1 + slot);
            if sequence > write_progress {
                self.store(instance, 1 + kept, sequence);
                kept += 1;
            }
        }
        self.store(instance, 0, kept as u64);
    }
}

const WORD_BYTES: usize = 8;

/// A write whose payload is landing in the pool: reads overlapping it wait.
#[derive(Debug, Clone, Copy)]
struct InFlightWrite {
    instance: usize,
    region: u16,
    start: u64,
    end: u64,
    /// The write's sequence number in its instance's requests.
    sequence: u64,
    /// Its payload READ died with its queue pair: the bytes may be placed,
    /// in part (a torn payload) or whole (answered, then flushed with the
    /// rest). It stays guarded until the instance's redo posts it again
    /// or the compute node's progress shows it landed.
    orphan: bool,
}

pub struct SpotEngine {
    config: SpotConfig,
    instances: Vec<Instance>,
    /// The memory pool's regions, by region id (registered on this node).
    regions: Vec<MemoryRegion>,
    staging: MemoryRegion,
    completion_queue: CompletionQueue,
    in_flight: Vec<InFlightWrite>,
    next_instance: usize,
    stats: SpotStats,
    /// A reused buffer for entries and reads served locally.
    scratch: Vec<u8>,
    /// How new queue pairs are made, and the control channel to connect
    /// them.
    builder: QueuePairBuilder,
    connector: Connector,
    /// At most one per instance.
    failures: Vec<InstanceFailure>,
    /// Writes landed but not yet covered by committed progress, by
    /// instance: kept across the engine's crashes.
    landed: LandedWrites,
}

/// Work request ids: the connection's epoch in the top byte, then the
/// instance, the verb's detail (a batch step) and its tag.
const TAG_PROBE: u64 = 1;
const TAG_FETCH: u64 = 2;
const TAG_PAYLOAD: u64 = 3;
const TAG_RESPONSE: u64 = 4;
const TAG_PROGRESS: u64 = 5;
const TAG_RESUME: u64 = 6;
const TAG_BITS: u32 = 8;
const INSTANCE_SHIFT: u32 = 40;
const EPOCH_SHIFT: u32 = 56;

fn work_request(instance: usize, epoch: u8, tag: u64, detail: u64) -> u64 {
    u64::from(epoch) << EPOCH_SHIFT | (instance as u64) << INSTANCE_SHIFT | detail << TAG_BITS | tag
}

fn request_instance(id: u64) -> usize {
    ((id >> INSTANCE_SHIFT) & 0xffff) as usize
}

fn request_epoch(id: u64) -> u8 {
    (id >> EPOCH_SHIFT) as u8
}

/// Failures of the transport, not of a request: the queue pair is dead
/// (or flushed because it died), and a new one fixes it.
fn is_connection_failure(status: CompletionStatus) -> bool {
    matches!(
        status,
        CompletionStatus::RetryExceeded
            | CompletionStatus::ReceiverNotReadyRetryExceeded
            | CompletionStatus::WorkRequestFlushError
    )
}

/// The longest WRITE that carries merged read responses: far below any
/// NIC's message limit (the soft RNIC's is 16 MiB). Unbounded, a batch of
/// 4097 contiguous 4 KiB reads merged past it, and the refused post
/// stopped the engine for every instance.
const MAX_RESPONSE_WRITE_BYTES: u32 = 1 << 20;

/// Verbs one turn may post per instance, so a turn stays short.
const COMPLETIONS_PER_TURN: usize = 256;

impl SpotEngine {
    /// An engine whose instances' queue pairs are connected. `builder`
    /// makes queue pairs anew when one dies; `connector` reaches the
    /// compute node to connect them; `landed` records the writes landed
    /// and not yet committed, and is kept across the engine's crashes.
    pub fn new(
        config: SpotConfig,
        instances: Vec<InstanceWiring>,
        regions: Vec<MemoryRegion>,
        staging: MemoryRegion,
        builder: QueuePairBuilder,
        connector: Connector,
        landed: LandedWrites,
    ) -> Result<SpotEngine, SpotError> {
        config.check()?;
        if landed.instances < instances.len() || landed.capacity < 2 * config.batch_entries as usize
        {
            return Err(SpotError::LandedRecordTooSmall {
                instances: landed.instances,
                capacity: landed.capacity,
            });
        }
        let completion_queue = builder.send_completion_queue;
        let per_instance = config.staging_bytes_per_instance();
        let need = per_instance * instances.len() as u64;
        if staging.length_bytes < need {
            return Err(SpotError::StagingTooSmall {
                have: staging.length_bytes,
                need,
            });
        }
        let instances = instances
            .into_iter()
            .enumerate()
            .map(|(index, wiring)| Instance {
                wiring,
                staging_at: index as u64 * per_instance,
                phase: Phase::Idle,
                fetched: 0,
                read_progress: 0,
                write_progress: 0,
                next_probe: Timestamp::ZERO,
                interval: config.probe_interval_min,
                batch: Vec::with_capacity(config.batch_entries as usize),
                cursor: 0,
                writes_in_flight: 0,
                fetch_count: 0,
                epoch: 0,
                prepared: None,
                reconnects_in_a_row: 0,
                writes_first: false,
            })
            .collect();
        Ok(SpotEngine {
            config,
            instances,
            regions,
            staging,
            completion_queue,
            in_flight: Vec::new(),
            next_instance: 0,
            stats: SpotStats::default(),
            scratch: Vec::new(),
            builder,
            connector,
            failures: Vec::new(),
            landed,
        })
    }

    /// An engine on a NIC that just came up: every instance makes a new
    /// queue pair and asks the compute node to connect to it, then
    /// resumes from the engine words in its compute block.
    #[allow(clippy::too_many_arguments)]
    pub fn reconnecting(
        now: Timestamp,
        nic: &mut dyn Verbs,
        config: SpotConfig,
        blocks: &[(RemoteAddress, RingSizes)],
        regions: Vec<MemoryRegion>,
        staging: MemoryRegion,
        builder: QueuePairBuilder,
        connector: Connector,
        landed: LandedWrites,
    ) -> Result<SpotEngine, SpotError> {
        let mut prepared = Vec::with_capacity(blocks.len());
        let mut wiring = Vec::with_capacity(blocks.len());
        for (block, sizes) in blocks {
            let queue_pair = nic.create_queue_pair(&builder)?;
            prepared.push(queue_pair);
            wiring.push(InstanceWiring {
                // Not connected yet: the instance waits in Reconnecting
                // and never posts on it before the handshake.
                queue_pair: QueuePair(queue_pair.qpn),
                block: *block,
                sizes: *sizes,
            });
        }
        let mut engine =
            SpotEngine::new(config, wiring, regions, staging, builder, connector, landed)?;
        for (index, queue_pair) in prepared.into_iter().enumerate() {
            // A refusal (no connection service, a full mailbox) is that
            // instance's: it fails alone, as it would after any other
            // reconnection. Returned, it failed the whole restart.
            match engine.await_connection(now, index, queue_pair) {
                Err(error) if error.instance().is_some() => {
                    engine.fail_instance(nic, index, error)?
                }
                result => result?,
            }
        }
        Ok(engine)
    }

    pub fn stats(&self) -> SpotStats {
        self.stats
    }

    /// The instances stopped for errors of their own, in the order they
    /// stopped.
    pub fn failures(&self) -> &[InstanceFailure] {
        &self.failures
    }

    /// An instance as if it had reconnected `reconnects` times in a row
    /// and had a batch to redo (tests: the state a series of outages
    /// leaves, without staging them).
    #[cfg(test)]
    pub(crate) fn after_outages(&mut self, index: usize, reconnects: u32) {
        let instance = &mut self.instances[index];
        instance.reconnects_in_a_row = reconnects;
        instance.writes_first = true;
    }

    /// (reconnections in a row, writes first) of an instance (tests).
    #[cfg(test)]
    pub(crate) fn recovery_state(&self, index: usize) -> (u32, bool) {
        let instance = &self.instances[index];
        (instance.reconnects_in_a_row, instance.writes_first)
    }

    /// The earliest probe or reconnection answer due, for a driver that
    /// sleeps.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.instances
            .iter()
            .enumerate()
            .filter_map(|(index, instance)| match instance.phase {
                Phase::Idle => Some(instance.next_probe),
                Phase::Reconnecting => {
                    let engine = instance.prepared?.endpoint;
                    self.connector.answer_due(index, (instance.epoch, engine))
                }
                _ => None,
            })
            .min()
    }

    /// Takes completions, then gives each instance a turn, round-robin.
    /// Returns whether anything moved.
    pub fn turn(&mut self, now: Timestamp, rnic: &mut dyn Verbs) -> Result<bool, SpotError> {
        let mut moved = false;
        for _ in 0..COMPLETIONS_PER_TURN {
            let Some(completion) = rnic.poll_completion(self.completion_queue)? else {
                break;
            };
            moved = true;
            let id = completion.work_request_id;
            let instance = request_instance(id);
            if request_epoch(id) != self.instances[instance].epoch {
                continue; // Flushed work of a queue pair that died.
            }
            let result = if is_connection_failure(completion.status) {
                tracing::debug!(instance, status = ?completion.status, "engine queue pair died");
                self.reconnect(now, rnic, instance)
            } else if completion.status != CompletionStatus::Success {
                Err(SpotError::Completion {
                    instance,
                    status: completion.status,
                })
            } else {
                self.complete(now, rnic, instance, id)
            };
            self.contain(rnic, result)?;
        }
        for index in 0..self.instances.len() {
            let result = self.finish_reconnect(now, rnic, index);
            moved |= self.contain(rnic, result)?.unwrap_or(true);
        }
        let count = self.instances.len();
        for offset in 0..count {
            let index = (self.next_instance + offset) % count;
            let result = self.start_probe(now, rnic, index);
            moved |= self.contain(rnic, result)?.unwrap_or(true);
        }
        if count > 0 {
            self.next_instance = (self.next_instance + 1) % count;
        }
        Ok(moved)
    }

    /// `result`, with an error of one instance's own (see
    /// [`SpotError::instance`]) taken as that instance's failure: `None`.
    /// An error of the engine's own stays an error.
    fn contain<T>(
        &mut self,
        rnic: &mut dyn Verbs,
        result: Result<T, SpotError>,
    ) -> Result<Option<T>, SpotError> {
        match result {
            Ok(value) => Ok(Some(value)),
            Err(error) => match error.instance() {
                Some(index) => {
                    self.fail_instance(rnic, index, error)?;
                    Ok(None)
                }
                None => Err(error),
            },
        }
    }

    /// Stops serving instance `index`. Its queue pairs go to ERR, which
    /// flushes what it posted and drops what still arrives for them: none
    /// of its payload READs lands after this, so its writes leave the
    /// overlap guard, and reads of other instances that waited for them
    /// go on.
    fn fail_instance(
        &mut self,
        rnic: &mut dyn Verbs,
        index: usize,
        error: SpotError,
    ) -> Result<(), SpotError> {
        let instance = &mut self.instances[index];
        assert_ne!(instance.phase, Phase::Failed, "an instance fails once");
        instance.phase = Phase::Failed;
        // Completions of what it posted are ignored from now.
        instance.epoch = instance.epoch.wrapping_add(1);
        instance.batch.clear();
        instance.cursor = 0;
        instance.writes_in_flight = 0;
        // Its landed writes stay recorded: a restart serves every instance
        // again, and the redo must skip them then (forgotten here, it
        // landed them again over newer writes).
        let queue_pairs = [
            Some(instance.wiring.queue_pair.0),
            instance.prepared.take().map(|prepared| prepared.qpn),
        ];
        for qpn in queue_pairs.into_iter().flatten() {
            if let Err(refused) = rnic.modify_queue_pair(qpn, QueuePairTransition::Error) {
                // One already in ERR, or never connected: nothing of it lands.
                tracing::debug!(instance = index, %refused, "failed instance's queue pair");
            }
        }
        self.in_flight.retain(|write| write.instance != index);
        self.stats.failed_instances += 1;
        tracing::warn!(instance = index, %error, "offload instance stopped; the others go on");
        self.failures.push(InstanceFailure {
            instance: index,
            error,
        });
        debug_assert!(self.failures.len() <= self.instances.len());
        self.execute_waiting(rnic)
    }

    /// Drops instance `index`'s connection and its batch, makes a new
    /// queue pair and asks the compute node to connect to it.
    fn reconnect(
        &mut self,
        now: Timestamp,
        rnic: &mut dyn Verbs,
        index: usize,
    ) -> Result<(), SpotError> {
        let instance = &mut self.instances[index];
        if instance.reconnects_in_a_row >= MAX_RECONNECTS_IN_A_ROW {
            return Err(SpotError::ReconnectsExhausted { instance: index });
        }
        instance.reconnects_in_a_row += 1;
        instance.epoch = instance.epoch.wrapping_add(1);
        instance.batch.clear();
        instance.cursor = 0;
        instance.writes_in_flight = 0;
        // The dead queue pair goes (and one made for an earlier attempt
        // that never connected): kept, each reconnection took a place for
        // good, and at the device's limit every instance stopped.
        let dead = [
            Some(instance.wiring.queue_pair.0),
            instance.prepared.take().map(|prepared| prepared.qpn),
        ];
        for qpn in dead.into_iter().flatten() {
            if let Err(refused) = rnic.destroy_queue_pair(qpn) {
                tracing::debug!(instance = index, %refused, "destroying a dead queue pair");
            }
        }
        // Its writes stay guarded: a payload READ that died may have placed
        // some of its bytes, and another instance's overlapping write or
        // read must not pass before the redo lands it whole.
        for write in self.in_flight.iter_mut() {
            if write.instance == index {
                write.orphan = true;
            }
        }
        let prepared = rnic.create_queue_pair(&self.builder)?;
        self.stats.reconnects += 1;
        self.await_connection(now, index, prepared)
    }

    /// Instance `index` waits for the compute node to connect `prepared`.
    fn await_connection(
        &mut self,
        now: Timestamp,
        index: usize,
        prepared: PreparedQueuePair,
    ) -> Result<(), SpotError> {
        let instance = &mut self.instances[index];
        instance.prepared = Some(prepared);
        instance.phase = Phase::Reconnecting;
        self.connector
            .request(now, index, instance.epoch, prepared.endpoint)
            .map_err(|error| SpotError::Reconnect {
                instance: index,
                error,
            })
    }

    /// Connects a reconnecting instance once the compute node answered,
    /// and reads back the engine words it last committed.
    fn finish_reconnect(
        &mut self,
        now: Timestamp,
        rnic: &mut dyn Verbs,
        index: usize,
    ) -> Result<bool, SpotError> {
        let instance = &self.instances[index];
        if instance.phase != Phase::Reconnecting {
            return Ok(false);
        }
        let prepared = instance
            .prepared
            .expect("a reconnecting instance has a queue pair");
        let exchange = (instance.epoch, prepared.endpoint);
        let Some(remote) = self.connector.take_answer(now, index, exchange) else {
            return Ok(false);
        };
        let queue_pair = rnic.handshake(prepared, remote)?;
        let instance = &mut self.instances[index];
        instance.wiring.queue_pair = queue_pair;
        instance.prepared = None;
        instance.phase = Phase::Resuming;
        let (epoch, staging_at) = (instance.epoch, instance.staging_at);
        Self::post(
            rnic,
            queue_pair,
            work_request(index, epoch, TAG_RESUME, 0),
            SendOperation::Read {
                remote: instance.wiring.block.offset(ENGINE_WORDS_AT),
            },
            self.staging(staging_at + STAGING_ENGINE_WORDS_AT, ENGINE_WORDS_BYTES),
        )?;
        Ok(true)
    }

    /// The engine words are back: resume from the last committed batch.
    fn resumed(&mut self, now: Timestamp, rnic: &dyn Verbs, index: usize) -> Result<(), SpotError> {
        let words_at = self.instances[index].staging_at + STAGING_ENGINE_WORDS_AT;
        let head = self.read_staging_word(rnic, words_at)?;
        let read_progress = self.read_staging_word(rnic, words_at + 8)?;
        let write_progress = self.read_staging_word(rnic, words_at + 16)?;
        let instance = &mut self.instances[index];
        instance.fetched = head;
        instance.read_progress = read_progress;
        instance.write_progress = write_progress;
        // What the compute node's progress covers will not be fetched again.
        self.landed.retain_after(index, write_progress);
        // Nor will the writes it covers: their orphans are done.
        self.in_flight.retain(|write| {
            !(write.orphan && write.instance == index && write.sequence <= write_progress)
        });
        let instance = &mut self.instances[index];
        instance.phase = Phase::Idle;
        instance.interval = self.config.probe_interval_min;
        instance.next_probe = now;
        instance.writes_first = true;
        tracing::debug!(instance = index, head, "engine resumed");
        Ok(())
    }

    fn staging(&self, offset: u64, length: u32) -> remora_rnic::ScatterGatherElement {
        self.staging.slice(offset, length)
    }

    fn post(
        rnic: &mut dyn Verbs,
        queue_pair: QueuePair,
        id: u64,
        operation: SendOperation,
        local: remora_rnic::ScatterGatherElement,
    ) -> Result<(), SpotError> {
        let request = SendRequest::new(id, operation, &[local])?;
        rnic.post_send(queue_pair, request)?;
        Ok(())
    }

    fn start_probe(
        &mut self,
        now: Timestamp,
        rnic: &mut dyn Verbs,
        index: usize,
    ) -> Result<bool, SpotError> {
        let instance = &self.instances[index];
        if instance.phase != Phase::Idle || now < instance.next_probe {
            return Ok(false);
        }
        let remote = instance.wiring.block.offset(CLIENT_WORDS_AT);
        let local = self.staging(instance.staging_at + STAGING_PROBE_AT, CLIENT_WORDS_BYTES);
        Self::post(
            rnic,
            instance.wiring.queue_pair,
            work_request(index, instance.epoch, TAG_PROBE, 0),
            SendOperation::Read { remote },
            local,
        )?;
        self.instances[index].phase = Phase::Probing;
        self.stats.probes += 1;
        Ok(true)
    }

    fn complete(
        &mut self,
        now: Timestamp,
        rnic: &mut dyn Verbs,
        index: usize,
        id: u64,
    ) -> Result<(), SpotError> {
        match id & ((1 << TAG_BITS) - 1) {
            TAG_PROBE => self.probed(now, rnic, index),
            TAG_FETCH => {
                let instance = &mut self.instances[index];
                let Phase::Fetching { reads_left } = instance.phase else {
                    unreachable!("a fetch completes while fetching")
                };
                instance.phase = Phase::Fetching {
                    reads_left: reads_left - 1,
                };
                if reads_left == 1 {
                    self.fetched(rnic, index)?;
                }
                Ok(())
            }
            TAG_PAYLOAD => {
                let step = ((id >> TAG_BITS) & 0xffff_ffff) as usize;
                self.payload_landed(rnic, index, step)
            }
            TAG_RESPONSE => Ok(()),
            TAG_RESUME => self.resumed(now, rnic, index),
            TAG_PROGRESS => {
                // The compute node has the progress: no write of it is
                // fetched again.
                self.landed.clear(index);
                let instance = &mut self.instances[index];
                instance.reconnects_in_a_row = 0;
                instance.phase = Phase::Idle;
                instance.interval = self.config.probe_interval_min;
                instance.next_probe = now;
                Ok(())
            }
            tag => unreachable!("work request tag {tag} is the engine's own"),
        }
    }

    fn read_staging_word(&self, rnic: &dyn Verbs, offset: u64) -> Result<u64, SpotError> {
        let mut word = [0u8; 8];
        let at = VirtAddr(self.staging.address.0 + offset);
        rnic.read_local(self.staging.lkey, at, &mut word)?;
        Ok(u64::from_le_bytes(word))
    }

    fn probed(
        &mut self,
        now: Timestamp,
        rnic: &mut dyn Verbs,
        index: usize,
    ) -> Result<(), SpotError> {
        let staging_at = self.instances[index].staging_at;
        let tail = self.read_staging_word(rnic, staging_at + STAGING_PROBE_AT)?;
        let instance = &mut self.instances[index];
        let entries = instance.wiring.sizes.metadata_entries;
        // A tail that ran more than a ring ahead is a broken client: take
        // what the ring can hold.
        let available = tail.saturating_sub(instance.fetched).min(entries);
        if available == 0 {
            self.stats.empty_probes += 1;
            // Nothing past the committed head: no batch to redo, and the
            // next fresh one keeps its reads before its writes.
            instance.writes_first = false;
            // The link works and no batch is pending: the outages before
            // are over. Counted only by finished batches, an idle
            // instance's separate outages added up to the limit and failed
            // it for good. (Not at a resume: a batch that always fails
            // after one, on a link that drops only large frames, say,
            // would then reconnect for ever.)
            instance.reconnects_in_a_row = 0;
            instance.phase = Phase::Idle;
            instance.interval = (instance.interval * 2).min(self.config.probe_interval_max);
            instance.next_probe = now.saturating_add(instance.interval);
            return Ok(());
        }
        let count = available.min(self.config.batch_entries);
        let first = instance.fetched % entries;
        let before_wrap = count.min(entries - first);
        let wiring = instance.wiring;
        let wiring_epoch = instance.epoch;
        let mut reads = 0u8;
        for (start, length, skip) in [
            (first, before_wrap, 0),
            (0, count - before_wrap, before_wrap),
        ] {
            if length == 0 {
                continue;
            }
            let remote = wiring.block.offset(wiring.sizes.entry_at(start));
            let local = self.staging(
                staging_at + STAGING_ENTRIES_AT + skip * ENTRY_BYTES,
                (length * ENTRY_BYTES) as u32,
            );
            let id = work_request(index, wiring_epoch, TAG_FETCH, 0);
            Self::post(
                rnic,
                wiring.queue_pair,
                id,
                SendOperation::Read { remote },
                local,
            )?;
            reads += 1;
        }
        let instance = &mut self.instances[index];
        instance.fetched += count;
        instance.fetch_count = count;
        instance.batch.clear();
        instance.cursor = 0;
        instance.phase = Phase::Fetching { reads_left: reads };
        Ok(())
    }

    /// Parses the fetched entries and starts executing them.
    fn fetched(&mut self, rnic: &mut dyn Verbs, index: usize) -> Result<(), SpotError> {
        let instance = &self.instances[index];
        let count = instance.fetch_count;
        let mut bytes = std::mem::take(&mut self.scratch);
        bytes.resize((count * ENTRY_BYTES) as usize, 0);
        let at = VirtAddr(self.staging.address.0 + instance.staging_at + STAGING_ENTRIES_AT);
        rnic.read_local(self.staging.lkey, at, &mut bytes)?;
        let mut batch = std::mem::take(&mut self.instances[index].batch);
        batch.clear();
        let mut response_at = self.responses_at(index);
        for chunk in bytes.chunks_exact(ENTRY_BYTES as usize) {
            let entry = Entry::parse(chunk).map_err(|error| SpotError::Entry {
                instance: index,
                error,
            })?;
            self.check_entry(index, &entry)?;
            batch.push(Step {
                entry,
                staging_at: response_at,
                done: false,
                posted: false,
            });
            if entry.kind == Kind::Read {
                response_at += u64::from(entry.length);
            }
        }
        self.scratch = bytes;
        let instance = &mut self.instances[index];
        if std::mem::take(&mut instance.writes_first) {
            // The batch runs again from the last committed head, and its
            // writes may have landed before the failure, later ones over
            // earlier ones' reads. Landing every write again, in order,
            // before serving any read means a read sees the model at its
            // issue plus only writes issued after it and still
            // incomplete, never an older write landed again over a newer
            // one. This batch covers everything fetched before the
            // failure: that fetch started at the same head and took at
            // most a batch.
            batch.sort_by_key(|step| step.entry.kind != Kind::Write);
            // A write that already landed is not landed again: since it
            // landed, another instance may have landed a newer write over
            // the same bytes, and a reader may have seen that one.
            let mut skipped = 0;
            for step in &mut batch {
                if step.entry.kind == Kind::Write
                    && self.landed.contains(index, step.entry.sequence)
                {
                    step.posted = true;
                    step.done = true;
                    skipped += 1;
                }
            }
            self.stats.writes_not_landed_again += skipped;
        }
        instance.batch = batch;
        instance.cursor = 0;
        instance.phase = Phase::Executing;
        self.stats.batches += 1;
        self.execute(rnic, index)
    }

    /// An entry the client library would never write is refused before
    /// any byte moves.
    fn check_entry(&self, index: usize, entry: &Entry) -> Result<(), SpotError> {
        let region =
            self.regions
                .get(usize::from(entry.region))
                .ok_or(SpotError::UnknownRegion {
                    instance: index,
                    region: entry.region,
                })?;
        let pool_offset = match entry.kind {
            Kind::Read => entry.request_address,
            Kind::Write => entry.response_address,
        };
        let fits = pool_offset
            .checked_add(u64::from(entry.length))
            .is_some_and(|end| end <= region.length_bytes);
        if !fits {
            return Err(SpotError::OutOfBounds {
                instance: index,
                region: entry.region,
            });
        }
        // The compute side's bytes too: an address near 2^64 saturated the
        // remote address, and the post's refusal stopped every instance.
        let block_address = match entry.kind {
            Kind::Read => entry.response_address,
            Kind::Write => entry.request_address,
        };
        let block_bytes = self.instances[index].wiring.sizes.block_bytes();
        let in_block = block_address
            .checked_add(u64::from(entry.length))
            .is_some_and(|end| end <= block_bytes);
        if !in_block {
            return Err(SpotError::OutsideBlock {
                instance: index,
                address: block_address,
                length: entry.length,
            });
        }
        Ok(())
    }

    /// Whether the pool range an entry of instance `index` touches
    /// overlaps a write in flight. The instance's own orphans do not hold
    /// back its redo, which lands its writes again in order.
    fn overlaps_in_flight(&self, index: usize, entry: &Entry) -> bool {
        let start = match entry.kind {
            Kind::Read => entry.request_address,
            Kind::Write => entry.response_address,
        };
        let end = start + u64::from(entry.length);
        self.in_flight.iter().any(|write| {
            !(write.orphan && write.instance == index)
                && write.region == entry.region
                && write.start < end
                && start < write.end
        })
    }

    /// Walks the batch from the cursor: posts writes' payload READs and
    /// serves reads, stopping at a read that overlaps a write in flight.
    /// Finishes the batch when every entry is done.
    fn execute(&mut self, rnic: &mut dyn Verbs, index: usize) -> Result<(), SpotError> {
        let batch_len = self.instances[index].batch.len();
        // Bounded by the batch: the cursor only moves forward.
        while self.instances[index].cursor < batch_len {
            let cursor = self.instances[index].cursor;
            let step = self.instances[index].batch[cursor];
            if step.done {
                // A write that landed before a reconnection.
                self.instances[index].cursor += 1;
                continue;
            }
            // Overlapping writes must land in order, and a retried READ
            // may place its data again, so a write waits for an
            // overlapping write as a read does.
            if self.overlaps_in_flight(index, &step.entry) {
                self.stats.stalls += 1;
                return Ok(());
            }
            match step.entry.kind {
                Kind::Write => self.post_payload_read(rnic, index, cursor)?,
                Kind::Read => self.serve_read(rnic, index, cursor)?,
            }
            self.instances[index].cursor += 1;
        }
        if self.instances[index].writes_in_flight == 0 {
            self.finish_batch(rnic, index)?;
        }
        Ok(())
    }

    fn post_payload_read(
        &mut self,
        rnic: &mut dyn Verbs,
        index: usize,
        step: usize,
    ) -> Result<(), SpotError> {
        let instance = &self.instances[index];
        let entry = instance.batch[step].entry;
        let remote = instance.wiring.block.offset(entry.request_address);
        let local =
            self.regions[usize::from(entry.region)].slice(entry.response_address, entry.length);
        let id = work_request(index, instance.epoch, TAG_PAYLOAD, step as u64);
        Self::post(
            rnic,
            instance.wiring.queue_pair,
            id,
            SendOperation::Read { remote },
            local,
        )?;
        // The redo of an orphan takes its place.
        self.in_flight.retain(|write| {
            !(write.orphan && write.instance == index && write.sequence == entry.sequence)
        });
        self.in_flight.push(InFlightWrite {
            instance: index,
            region: entry.region,
            start: entry.response_address,
            end: entry.response_address + u64::from(entry.length),
            sequence: entry.sequence,
            orphan: false,
        });
        let instance = &mut self.instances[index];
        instance.batch[step].posted = true;
        instance.writes_in_flight += 1;
        self.stats.writes += 1;
        self.stats.bytes_written += u64::from(entry.length);
        Ok(())
    }

    /// Where an instance's packed responses start in staging.
    fn responses_at(&self, index: usize) -> u64 {
        self.instances[index].staging_at
            + STAGING_ENTRIES_AT
            + self.config.batch_entries * ENTRY_BYTES
    }

    fn serve_read(
        &mut self,
        rnic: &mut dyn Verbs,
        index: usize,
        step: usize,
    ) -> Result<(), SpotError> {
        let Step {
            entry, staging_at, ..
        } = self.instances[index].batch[step];
        let region = self.regions[usize::from(entry.region)];
        // One reused buffer: no allocation per read.
        let mut bytes = std::mem::take(&mut self.scratch);
        bytes.resize(entry.length as usize, 0);
        let from = VirtAddr(region.address.0 + entry.request_address);
        rnic.read_local(region.lkey, from, &mut bytes)?;
        let to = VirtAddr(self.staging.address.0 + staging_at);
        rnic.write_local(self.staging.lkey, to, &bytes)?;
        self.scratch = bytes;
        self.instances[index].batch[step].done = true;
        self.stats.reads += 1;
        self.stats.bytes_read += u64::from(entry.length);
        Ok(())
    }

    fn payload_landed(
        &mut self,
        rnic: &mut dyn Verbs,
        index: usize,
        step: usize,
    ) -> Result<(), SpotError> {
        let instance = &mut self.instances[index];
        let entry = instance.batch[step].entry;
        assert!(instance.batch[step].posted && !instance.batch[step].done);
        instance.batch[step].done = true;
        instance.writes_in_flight -= 1;
        // Before the guard lets anything pass it: from here on another
        // instance may land over these bytes.
        if !self.landed.push(index, entry.sequence) {
            return Err(SpotError::LandedRecordFull { instance: index });
        }
        let position = self
            .in_flight
            .iter()
            .position(|write| {
                !write.orphan
                    && write.instance == index
                    && write.region == entry.region
                    && write.start == entry.response_address
            })
            .expect("a landed write was in flight");
        self.in_flight.swap_remove(position);
        self.execute_waiting(rnic)
    }

    /// Executes every instance's batch further: called when writes left
    /// the overlap guard, which reads of any instance may have waited for.
    fn execute_waiting(&mut self, rnic: &mut dyn Verbs) -> Result<(), SpotError> {
        for index in 0..self.instances.len() {
            if self.instances[index].phase == Phase::Executing {
                self.execute(rnic, index)?;
            }
        }
        Ok(())
    }

    /// Responses to the compute node, one WRITE per contiguous run, then
    /// the engine words in one WRITE.
    fn finish_batch(&mut self, rnic: &mut dyn Verbs, index: usize) -> Result<(), SpotError> {
        let instance = &self.instances[index];
        let wiring = instance.wiring;
        let epoch = instance.epoch;
        let mut runs: Vec<(u64, u64, u32)> = Vec::new(); // (staging, remote offset, length)
        let mut read_progress = instance.read_progress;
        let mut write_progress = instance.write_progress;
        for item in &instance.batch {
            assert!(item.done);
            match item.entry.kind {
                Kind::Write => write_progress = write_progress.max(item.entry.sequence),
                Kind::Read => {
                    read_progress = read_progress.max(item.entry.sequence);
                    let staging_at = item.staging_at;
                    match runs.last_mut() {
                        Some((run_staging, remote, length))
                            if *run_staging + u64::from(*length) == staging_at
                                && remote.checked_add(u64::from(*length))
                                    == Some(item.entry.response_address)
                                && *length + item.entry.length <= MAX_RESPONSE_WRITE_BYTES =>
                        {
                            *length += item.entry.length
                        }
                        _ => {
                            runs.push((staging_at, item.entry.response_address, item.entry.length))
                        }
                    }
                }
            }
        }
        for (staging_at, remote_offset, length) in runs {
            let remote = wiring.block.offset(remote_offset);
            let id = work_request(index, epoch, TAG_RESPONSE, 0);
            let operation = SendOperation::Write {
                remote,
                immediate: None,
            };
            Self::post(
                rnic,
                wiring.queue_pair,
                id,
                operation,
                self.staging(staging_at, length),
            )?;
            self.stats.response_writes += 1;
        }
        let instance = &mut self.instances[index];
        instance.read_progress = read_progress;
        instance.write_progress = write_progress;
        let mut words = [0u8; ENGINE_WORDS_BYTES as usize];
        words[0..8].copy_from_slice(&instance.fetched.to_le_bytes());
        words[8..16].copy_from_slice(&read_progress.to_le_bytes());
        words[16..24].copy_from_slice(&write_progress.to_le_bytes());
        let words_at = instance.staging_at + STAGING_ENGINE_WORDS_AT;
        instance.phase = Phase::Completing;
        let at = VirtAddr(self.staging.address.0 + words_at);
        rnic.write_local(self.staging.lkey, at, &words)?;
        let operation = SendOperation::Write {
            remote: wiring.block.offset(ENGINE_WORDS_AT),
            immediate: None,
        };
        let local = self.staging(words_at, ENGINE_WORDS_BYTES);
        Self::post(
            rnic,
            wiring.queue_pair,
            work_request(index, epoch, TAG_PROGRESS, 0),
            operation,
            local,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> LandedWrites {
        LandedWrites::new(
            2,
            &SpotConfig {
                batch_entries: 2,
                ..SpotConfig::DEFAULT
            },
        )
    }

    #[test]
    fn the_landed_record_keeps_each_instances_writes_apart() {
        let landed = record();
        landed.push(0, 5);
        landed.push(0, 9);
        landed.push(1, 7);
        assert!(landed.contains(0, 5) && landed.contains(0, 9));
        assert!(!landed.contains(0, 7) && landed.contains(1, 7));
        landed.retain_after(0, 5);
        assert_eq!(landed.sequences(0).collect::<Vec<_>>(), [9]);
        landed.clear(1);
        assert_eq!(landed.sequences(1).count(), 0);
        // A clone is the same memory: what the restarted engine reads.
        assert!(landed.clone().contains(0, 9));
    }

    #[test]
    fn the_landed_record_refuses_more_than_its_capacity() {
        let landed = record();
        for sequence in 1..=4 {
            assert!(landed.push(0, sequence));
        }
        assert!(!landed.push(0, 5));
        assert!(landed.push(1, 5), "another instance's room is its own");
    }
}
