//! The store and its sessions: FASTER's operations over the index and the
//! hybrid log.
//!
//! Each thread opens a [`Session`]. An operation that finds its record in
//! memory completes at once; one whose record is on the device returns
//! [`Status::Pending`], and [`Session::complete_pending`] finishes it
//! when the device answers, handing back the operation's context.
//!
//! Updates happen in place only in the mutable region, and only to the
//! record the index entry points at, under the record's lock, after
//! checking (under the lock) that the entry still points there. A copy to
//! the tail holds the old record's lock across its compare-and-swap on
//! the entry whenever the old record may still be locked by others. So an
//! in-place update and a copy of the same record never both win, and no
//! read-modify-write is lost.

use crate::address::LogAddress;
use crate::checkpoint::{newest_record, scan_page, write_now, CheckpointError, CheckpointRecord};
use crate::config::{ConfigError, StoreConfig};
use crate::device::{call_time, Device, DeviceError, DeviceQueue, Finished};
use crate::epoch::{Epoch, EpochError, SlotIndex};
use crate::index::{HashIndex, IndexError, IndexUsage, Slot};
use crate::log::{Allocation, HybridLog, LogError, LogShape, Region};
use crate::record::{
    parse_stored, record_bytes, write_new, Header, MemoryRecord, Parsed, MAX_KEY_BYTES,
    MAX_VALUE_BYTES,
};
use crate::update::{Update, UpdateError};
use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod compaction;

pub use compaction::{Compaction, CompactionError, CompactionTotals};

/// How often a write waiting for room looks again.
const ROOM_POLL_INTERVAL: Duration = Duration::from_micros(200);

/// Operations between epoch refreshes: bounds how long a page waits to
/// become safe to flush or a frame to reuse.
const REFRESH_EVERY_OPERATIONS: u32 = 64;
/// How long an operation waits for a free frame before reporting the
/// store stalled (a flush that never completes).
const MAX_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KvError {
    #[error("a key of {length} bytes is longer than the {MAX_KEY_BYTES}-byte limit")]
    KeyTooLong { length: usize },
    #[error("a value of {length} bytes is longer than the {MAX_VALUE_BYTES}-byte limit")]
    ValueTooLong { length: usize },
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Epoch(#[from] EpochError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Update(#[from] UpdateError),
    #[error("the device returned a record that does not parse: {0}")]
    Corrupt(&'static str),
    #[error("waited {0:?} for the log to free a page: the device stopped completing flushes")]
    Stalled(Duration),
    #[error("the key's chain changed {0} times during one read")]
    LookupContended(u32),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Compaction(#[from] CompactionError),
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// A read or RMW found the key (an RMW's result is in the output).
    Found,
    /// A read found no live record (an RMW made one from nothing).
    NotFound,
    /// An upsert or delete is done.
    Done,
    /// The record is on the device: `complete_pending` will finish it.
    Pending,
}

/// The kind of operation a completion belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperationKind {
    Read,
    ReadModifyWrite,
}

/// A pending operation, finished.
#[derive(Debug)]
pub struct Completion<'a> {
    pub context: u64,
    pub kind: OperationKind,
    pub result: Result<Status, KvError>,
    /// A read's value, or an RMW's new value.
    pub value: &'a [u8],
}

/// Counters of what a session's operations did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionStats {
    pub operations: u64,
    pub in_place_updates: u64,
    pub copies_to_tail: u64,
    pub pending: u64,
    pub device_reads: u64,
    /// Time inside the device queue's read calls, as
    /// [`call_time::timed`] counts it: a read issued inside a timed
    /// `complete_pending` is in that call's time, not here.
    pub device_issue_nanos: u64,
    /// Device completions that belonged to no pending operation (left by
    /// a wait that failed), dropped.
    pub stray_completions: u64,
}

impl SessionStats {
    pub fn device_time(&self) -> Duration {
        Duration::from_nanos(self.device_issue_nanos)
    }
}

struct Shared {
    config: StoreConfig,
    /// The last checkpoint's sequence number (0: none yet).
    checkpoints: std::sync::Mutex<u64>,
    epoch: Arc<Epoch>,
    index: HashIndex,
    log: Arc<HybridLog>,
    device: Arc<dyn Device>,
    compactions: compaction::Counters,
    /// How long a write that finds the device full waits for room.
    room_wait_nanos: AtomicU64,
}

/// A FASTER-style store, shared by its sessions.
#[derive(Clone)]
pub struct Store {
    shared: Arc<Shared>,
}

impl Store {
    /// A new, empty store on `device`. Whatever checkpoint an earlier
    /// store left there is wiped first: both slots kept, a later
    /// recovery took the older run's newer record over this store's own
    /// first ones, and rebuilt its index from this store's pages under
    /// the old record's bounds (found by review). A crash between the two
    /// slots' wipes leaves the newer record, with the device as that
    /// record left it (see `wipe_records`).
    pub fn new(config: StoreConfig, device: Arc<dyn Device>) -> Result<Store, KvError> {
        let store = Store::on_device(config, device)?;
        let mut queue = store.shared.device.open_queue()?;
        crate::checkpoint::wipe_records(queue.as_mut())?;
        Ok(store)
    }

    /// A store's memory on `device`, the device's bytes untouched.
    fn on_device(config: StoreConfig, device: Arc<dyn Device>) -> Result<Store, KvError> {
        config.check(device.capacity_bytes())?;
        let page_bytes = 1u64 << config.page_bits;
        if page_bytes > device.max_request_bytes() {
            return Err(ConfigError::PageTooLongForDevice {
                page_bytes,
                device: device.name().into(),
                limit_bytes: device.max_request_bytes(),
            }
            .into());
        }
        let epoch = Arc::new(Epoch::new(config.sessions + 1));
        let shape = LogShape {
            page_bits: config.page_bits,
            frame_count: config.memory_pages,
            mutable_pages: config.mutable_pages(),
        };
        let log = Arc::new(HybridLog::new(shape, epoch.clone(), device.as_ref())?);
        let index = HashIndex::new(config.index_buckets, config.overflow_buckets)?;
        let shared = Shared {
            config,
            checkpoints: std::sync::Mutex::new(0),
            epoch,
            index,
            log,
            device,
            compactions: compaction::Counters::default(),
            room_wait_nanos: AtomicU64::new(0),
        };
        Ok(Store {
            shared: Arc::new(shared),
        })
    }

    pub fn session(&self) -> Result<Session, KvError> {
        let slot = self.shared.epoch.acquire()?;
        let queue = match self.shared.device.open_queue() {
            Ok(queue) => queue,
            Err(error) => {
                // Held by nothing, the slot was lost for good: enough
                // failed opens and every session was refused.
                self.shared.epoch.release(slot);
                return Err(error.into());
            }
        };
        Ok(Session {
            shared: self.shared.clone(),
            slot: Some(slot),
            queue,
            pending: Vec::new(),
            free_tokens: Vec::new(),
            arrived: Finished::default(),
            since_refresh: 0,
            waiting_since: None,
            scratch: Vec::new(),
            stats: SessionStats::default(),
            allocation: Allocation::Ordinary,
            full_since: None,
        })
    }

    /// Opens a store on a device that holds a checkpoint: the log from
    /// the checkpoint's begin to its tail, and an index rebuilt by
    /// scanning it. Returns the store and the checkpoint recovered.
    pub fn recover(
        config: StoreConfig,
        device: Arc<dyn Device>,
    ) -> Result<(Store, CheckpointRecord), KvError> {
        let store = Store::on_device(config, device)?;
        let shared = &store.shared;
        let mut queue = shared.device.open_queue()?;
        let record = newest_record(queue.as_mut())?;
        let page_bits = shared.config.page_bits;
        if record.page_bits != page_bits {
            let found = record.page_bits;
            return Err(CheckpointError::PageSize {
                found,
                configured: page_bits,
            }
            .into());
        }
        // The CRC says the record is whole, not that it is sane: a log
        // that ends before it begins, or outgrows the device, would wrap
        // the room arithmetic or scan for ever. A checkpoint's begin is a
        // page start (truncation moves it by pages) and its tail a page
        // start past page 0 (a seal turns the page).
        let capacity_bytes = shared.log.device_capacity_bytes();
        let length = record.tail.value().checked_sub(record.begin.value());
        let at_page_starts = [record.begin, record.tail]
            .iter()
            .all(|address| address.offset_in_page(page_bits) == 0);
        let past_page_zero = record.tail >= LogAddress::page_start(1, page_bits);
        if length.is_none_or(|length| length > capacity_bytes) || !at_page_starts || !past_page_zero
        {
            return Err(CheckpointError::ImpossibleLog {
                begin: record.begin,
                tail: record.tail,
                capacity_bytes,
            }
            .into());
        }
        shared.log.restore(record.begin, record.tail);
        *shared.checkpoints.lock().unwrap_or_else(|e| e.into_inner()) = record.sequence;
        store.rebuild_index(queue.as_mut(), record)?;
        Ok((store, record))
    }

    /// Points each index entry at its newest record in the log.
    fn rebuild_index(
        &self,
        queue: &mut dyn DeviceQueue,
        record: CheckpointRecord,
    ) -> Result<(), KvError> {
        let page_bits = record.page_bits;
        let mut bytes = Vec::new();
        let first = record.begin.page(page_bits);
        for page in first..record.tail.page(page_bits) {
            let start = LogAddress::page_start(page, page_bits);
            let offset = self.shared.log.device_offset(start);
            crate::checkpoint::read_now(queue, offset, 1 << page_bits, &mut bytes)?;
            let mut failure = None;
            scan_page(start, &bytes, |address, stored| {
                if failure.is_some() || address < record.begin {
                    return;
                }
                match self.shared.index.find_or_create(hash_key(stored.key)) {
                    // Pages are scanned in address order: the last record
                    // seen for an entry is its newest.
                    Ok(mut slot) => while !slot.swap_address(address) {},
                    Err(error) => failure = Some(error),
                }
            })?;
            if let Some(error) = failure {
                return Err(error.into());
            }
        }
        Ok(())
    }

    pub fn config(&self) -> &StoreConfig {
        &self.shared.config
    }

    pub fn device_name(&self) -> &str {
        self.shared.device.name()
    }

    pub fn index_usage(&self) -> IndexUsage {
        self.shared.index.usage()
    }

    /// The log's boundaries now: begin, head, read-only, tail.
    pub fn boundaries(&self) -> [LogAddress; 4] {
        let log = &self.shared.log;
        [log.begin(), log.head(), log.read_only(), log.tail()]
    }

    /// Bytes the log can still grow before the device is full.
    pub fn device_room_bytes(&self) -> u64 {
        self.shared.log.device_room_bytes()
    }

    /// Whether truncated pages' device space waits for a new checkpoint
    /// (the kept one still needs it).
    pub fn checkpoint_holds_room(&self) -> bool {
        self.shared.log.checkpoint_holds_room()
    }

    /// The device's bytes the log can use in all.
    pub fn log_capacity_bytes(&self) -> u64 {
        self.shared.log.device_capacity_bytes()
    }

    /// Writes that find the device full wait up to `wait` for room before
    /// failing with `DeviceFull` (0, the default: fail at once). For a
    /// store that a compactor keeps ([`crate::compactor`]): writers that
    /// outrun it wait on it rather than fail.
    pub fn wait_for_room(&self, wait: Duration) {
        let nanos = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
        self.shared.room_wait_nanos.store(nanos, Ordering::Relaxed);
    }

    /// What every session's compactions did so far.
    pub fn compaction_totals(&self) -> CompactionTotals {
        self.shared.compactions.totals()
    }

    /// Time spent handing pages to the device, over every thread.
    pub fn flush_time(&self) -> Duration {
        self.shared.log.flush_time()
    }

    /// Drops every record below `address` (see [`HybridLog::truncate_until`]).
    pub fn truncate_until(&self, address: LogAddress) -> Result<(), KvError> {
        Ok(self.shared.log.truncate_until(address)?)
    }
}

/// The key's hash: FxHash, then a finalizer so that both the bucket (low
/// bits) and the tag (high bits) are well mixed.
pub fn hash_key(key: &[u8]) -> u64 {
    let mut hasher = rustc_hash::FxHasher::default();
    hasher.write(key);
    hasher.write_usize(key.len());
    let mut mixed = hasher.finish();
    mixed ^= mixed >> 33;
    mixed = mixed.wrapping_mul(0xff51_afd7_ed55_8ccd);
    mixed ^= mixed >> 33;
    mixed
}

fn check_key(key: &[u8]) -> Result<(), KvError> {
    if key.len() > MAX_KEY_BYTES {
        return Err(KvError::KeyTooLong { length: key.len() });
    }
    Ok(())
}

fn check_value(value: &[u8]) -> Result<(), KvError> {
    if value.len() > MAX_VALUE_BYTES {
        return Err(KvError::ValueTooLong {
            length: value.len(),
        });
    }
    Ok(())
}

/// An operation waiting for the device.
struct PendingOperation {
    context: u64,
    key: Vec<u8>,
    /// The record being read.
    address: LogAddress,
    /// The index entry's address when the operation started: an RMW
    /// publishes only if nothing newer arrived meanwhile.
    chain_head: LogAddress,
    update: Option<Update>,
    /// Times a read looked again from a moved head ([`moved_head`]).
    restarts: u32,
}

/// Where a key's newest record is.
enum Located<'a> {
    Memory(MemoryRecord<'a>, LogAddress, Region),
    Device(LogAddress),
    Absent,
}

/// Which part of a key's lookup [`Session::prefetch`] loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefetchStage {
    /// The key's first index bucket.
    Bucket,
    /// The record its index entry names, found through the (by now
    /// cached) bucket.
    Record,
}

/// One thread's handle on a store.
pub struct Session {
    shared: Arc<Shared>,
    /// Always `Some` until drop.
    slot: Option<SlotIndex>,
    queue: Box<dyn DeviceQueue>,
    pending: Vec<Option<PendingOperation>>,
    free_tokens: Vec<usize>,
    arrived: Finished,
    since_refresh: u32,
    /// When the current wait for a free page began.
    waiting_since: Option<Instant>,
    scratch: Vec<u8>,
    stats: SessionStats,
    /// What this session's appends are: compaction's copies while it
    /// compacts (they may take the reserve), ordinary records otherwise.
    allocation: Allocation,
    /// When a write of this session first found the device full.
    full_since: Option<Instant>,
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.shared.epoch.release(slot);
        }
    }
}

impl Session {
    fn slot(&self) -> &SlotIndex {
        self.slot.as_ref().expect("the slot is held until drop")
    }

    pub fn stats(&self) -> SessionStats {
        self.stats
    }

    /// Operations started and not yet completed.
    pub fn pending_count(&self) -> usize {
        self.pending.len() - self.free_tokens.len()
    }

    /// Takes a checkpoint: every write acknowledged before the call is on
    /// the device when it returns, with a record that [`Store::recover`]
    /// finds. Other sessions keep working meanwhile; checkpoints run one
    /// at a time. The newest checkpoint's pages keep their device space
    /// until a newer one supersedes it, though compaction truncates them
    /// ([`crate::compactor`] checkpoints after it truncates, so the space
    /// comes back).
    pub fn checkpoint(&mut self) -> Result<CheckpointRecord, KvError> {
        if self.pending_count() > 0 {
            return Err(CheckpointError::PendingOperations(self.pending_count()).into());
        }
        self.enter_for_completion()?;
        let shared = self.shared.clone();
        // One checkpoint at a time, so each keeps its pages until it is
        // durable; a second waits, refreshing, rather than block the log.
        let mut sequence = loop {
            match shared.checkpoints.try_lock() {
                Ok(sequence) => break sequence,
                Err(std::sync::TryLockError::Poisoned(poisoned)) => break poisoned.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => self.wait_a_little()?,
            }
        };
        // The begin is read before the seal: a compaction that truncates
        // after this read copied its live records either below the tail
        // sealed next (inside the checkpoint) or from pages at or above
        // this begin (inside it too). Read after, it could name a begin
        // past records whose copies lie beyond the sealed tail.
        let begin = shared.log.keep_checkpoint_from_begin();
        let tail = loop {
            if let Some(tail) = shared.log.seal()? {
                break tail;
            }
            self.wait_a_little()?;
        };
        while shared.log.flushed_until() < tail {
            self.wait_a_little()?;
        }
        let record = CheckpointRecord {
            sequence: *sequence + 1,
            page_bits: shared.config.page_bits,
            begin,
            tail,
        };
        write_now(self.queue.as_mut(), record.slot_offset(), &record.encode())?;
        *sequence = record.sequence;
        shared.log.checkpoint_durable_from(begin);
        self.waiting_since = None;
        Ok(record)
    }

    /// A wait's clocks belong to the operation that waited. Some ways out
    /// of a wait left them set (an RMW whose retry took a path that does
    /// not allocate, a checkpoint that failed part way), and the session's
    /// next wait, minutes later, reported a stall at its first look and
    /// killed the compactor (found by reading).
    fn start_wait_clocks(&mut self) {
        self.waiting_since = None;
        self.full_since = None;
    }

    /// Refreshes and yields while the log moves; errs if it stalls.
    fn wait_a_little(&mut self) -> Result<(), KvError> {
        let started = *self.waiting_since.get_or_insert_with(Instant::now);
        if started.elapsed() > MAX_WAIT {
            return Err(KvError::Stalled(MAX_WAIT));
        }
        self.refresh()?;
        std::thread::yield_now();
        Ok(())
    }

    /// Leaves epoch protection while idle, so that an idle session never
    /// holds up the log. The next operation re-enters.
    pub fn suspend(&mut self) {
        self.shared.epoch.unprotect(self.slot());
    }

    /// Enters protection, and refreshes every few operations.
    fn enter(&mut self) -> Result<(), KvError> {
        self.stats.operations += 1;
        self.start_wait_clocks();
        let epoch = &self.shared.epoch;
        if !epoch.is_protected(self.slot()) {
            epoch.protect(self.slot());
            return Ok(());
        }
        self.since_refresh += 1;
        if self.since_refresh >= REFRESH_EVERY_OPERATIONS {
            self.refresh()?;
        }
        Ok(())
    }

    /// Moves to the current epoch and collects finished flushes.
    fn refresh(&mut self) -> Result<(), KvError> {
        self.since_refresh = 0;
        self.shared.epoch.refresh(self.slot());
        self.shared.log.poll_flushes()?;
        if cfg!(debug_assertions) {
            self.shared.log.debug_check_invariants();
        }
        Ok(())
    }

    /// Reserves `bytes` at the tail, refreshing while the log frees a page.
    /// Only for callers that hold no memory record: a refresh may let
    /// the record's frame go.
    fn allocate(&mut self, bytes: u64) -> Result<LogAddress, KvError> {
        loop {
            if let Some(address) = self.try_allocate(bytes)? {
                return Ok(address);
            }
        }
    }

    /// One try at reserving `bytes`; on `None` the session has refreshed
    /// (so any memory record it held must be located again).
    fn try_allocate(&mut self, bytes: u64) -> Result<Option<LogAddress>, KvError> {
        match self.shared.log.allocate(bytes, self.allocation) {
            Ok(Some(address)) => {
                self.waiting_since = None;
                self.full_since = None;
                return Ok(Some(address));
            }
            Ok(None) => {}
            Err(LogError::DeviceFull { .. }) if self.may_wait_for_room() => {
                std::thread::sleep(ROOM_POLL_INTERVAL);
            }
            Err(error) => {
                // The wait is over: a start kept from it made a later
                // wait, 30 s on, report a stall at its first look.
                self.full_since = None;
                self.waiting_since = None;
                return Err(error.into());
            }
        }
        self.wait_a_little()?;
        Ok(None)
    }

    /// Whether a write that found the device full may wait on for a
    /// compaction to make room ([`Store::wait_for_room`]).
    fn may_wait_for_room(&mut self) -> bool {
        let wait = Duration::from_nanos(self.shared.room_wait_nanos.load(Ordering::Relaxed));
        let since = *self.full_since.get_or_insert_with(Instant::now);
        let waiting = since.elapsed() < wait;
        if !waiting {
            self.full_since = None;
        }
        waiting
    }
}

/// Lookups a read starts again because the key's chain changed under it.
const MAX_LOOKUP_RESTARTS: u32 = 64;

/// The head the index names for `hash` now, if it is not `chain_head`. A
/// chain walk that ran below the log's begin may have raced a compaction
/// that copied the key's record to the tail and pointed the index at the
/// copy: the key was there all along, and the read must look again from
/// the new head, or it answers NotFound (and a DEL does nothing).
fn moved_head(shared: &Shared, hash: u64, chain_head: LogAddress) -> Option<LogAddress> {
    let head = shared.index.find(hash)?.entry.address();
    (head != chain_head).then_some(head)
}

/// Copies a live record's value into `out`: Found, or NotFound for a
/// tombstone.
fn copy_live_value(record: &MemoryRecord<'_>, region: Region, out: &mut Vec<u8>) -> Status {
    let locked = matches!(region, Region::Mutable | Region::Fuzzy);
    if locked {
        record.lock();
    }
    let tombstone = record.header().is_tombstone();
    if !tombstone {
        // SAFETY: locked where others may write; below the safe read-only
        // boundary nobody writes.
        unsafe { record.copy_value(out) };
    }
    if locked {
        record.unlock();
    }
    if tombstone {
        Status::NotFound
    } else {
        Status::Found
    }
}

/// The address before the record at `address` on its key's chain. A chain
/// only runs down the log: a previous address at or above its own record's
/// (a flipped bit, a bad far-memory write) reissued the same read for ever,
/// or read a device page that only exists in memory.
fn previous_on_chain(address: LogAddress, header: Header) -> Result<LogAddress, KvError> {
    let previous = header.previous();
    if previous >= address {
        return Err(KvError::Corrupt(
            "a record's previous address is not below its own",
        ));
    }
    Ok(previous)
}

/// Follows the chain from `address` to `key`'s newest record. The caller
/// is a protected session.
fn locate<'a>(log: &'a HybridLog, key: &[u8], mut address: LogAddress) -> Located<'a> {
    loop {
        match log.region(address) {
            Region::Truncated => return Located::Absent,
            Region::OnDevice => return Located::Device(address),
            region => {
                // SAFETY: this session is protected and saw `address` at
                // or above the head (its region is in memory); it came
                // from the index or a published record's chain.
                let record = unsafe { MemoryRecord::new(&log.frames, address) };
                if record.key() == key {
                    return Located::Memory(record, address, region);
                }
                address = record.header().previous();
            }
        }
    }
}

impl Session {
    /// A hint that `key` is wanted a few operations from now: loads its
    /// index bucket (`PrefetchStage::Bucket`), or, once that is cached,
    /// its newest record if it is in memory (`PrefetchStage::Record`).
    /// A caller that knows its next keys (a batch, a pipeline) issues the
    /// bucket stage some operations ahead and the record stage halfway,
    /// so that each operation finds both in the cache instead of waiting
    /// on memory twice. It changes nothing and needs no protection: a
    /// stale address only loads a useless line.
    pub fn prefetch(&self, key: &[u8], stage: PrefetchStage) {
        let hash = hash_key(key);
        let shared = &*self.shared;
        match stage {
            PrefetchStage::Bucket => shared.index.prefetch(hash),
            PrefetchStage::Record => {
                let Some(slot) = shared.index.find(hash) else {
                    return;
                };
                let address = slot.entry.address();
                if matches!(
                    shared.log.region(address),
                    Region::Mutable | Region::Fuzzy | Region::Immutable
                ) {
                    shared.log.frames.prefetch(address);
                }
            }
        }
    }

    /// Reads `key` into `out`.
    pub fn read(&mut self, key: &[u8], out: &mut Vec<u8>, context: u64) -> Result<Status, KvError> {
        check_key(key)?;
        self.enter()?;
        let shared = self.shared.clone();
        let hash = hash_key(key);
        let Some(slot) = shared.index.find(hash) else {
            return Ok(Status::NotFound);
        };
        let mut chain_head = slot.entry.address();
        for _ in 0..MAX_LOOKUP_RESTARTS {
            match locate(&shared.log, key, chain_head) {
                Located::Absent => match moved_head(&shared, hash, chain_head) {
                    Some(head) => chain_head = head,
                    None => return Ok(Status::NotFound),
                },
                Located::Device(address) => {
                    return self.start_pending(key, address, chain_head, None, context)
                }
                Located::Memory(record, _, region) => {
                    return Ok(copy_live_value(&record, region, out))
                }
            }
        }
        Err(KvError::LookupContended(MAX_LOOKUP_RESTARTS))
    }

    /// Sets `key` to `value`.
    pub fn upsert(&mut self, key: &[u8], value: &[u8]) -> Result<Status, KvError> {
        check_key(key)?;
        check_value(value)?;
        self.enter()?;
        self.write(key, value, false)
    }

    /// Deletes `key` (a tombstone; FASTER's delete does not say whether
    /// the key existed).
    pub fn delete(&mut self, key: &[u8]) -> Result<Status, KvError> {
        check_key(key)?;
        self.enter()?;
        self.write(key, &[], true)
    }

    /// An upsert or a delete: in place if the newest record is the entry's
    /// own and mutable, else a new record at the tail.
    fn write(&mut self, key: &[u8], value: &[u8], tombstone: bool) -> Result<Status, KvError> {
        let hash = hash_key(key);
        let shared = self.shared.clone();
        loop {
            let slot = shared.index.find_or_create(hash)?;
            if let Some(done) = self.write_in_place(&slot, key, value, tombstone) {
                if done {
                    self.stats.in_place_updates += 1;
                    return Ok(Status::Done);
                }
                continue;
            }
            let capacity = value.len();
            if self.append(slot, key, value, capacity, tombstone)? {
                self.stats.copies_to_tail += 1;
                return Ok(Status::Done);
            }
        }
    }

    /// `None`: not possible in place. `Some(false)`: the entry moved; retry.
    fn write_in_place(
        &self,
        slot: &Slot<'_>,
        key: &[u8],
        value: &[u8],
        tombstone: bool,
    ) -> Option<bool> {
        let address = slot.entry.address();
        let Located::Memory(record, found, Region::Mutable) =
            locate(&self.shared.log, key, address)
        else {
            return None;
        };
        if found != address || value.len() > record.value_capacity() {
            return None;
        }
        record.lock();
        let still = self.shared.index.find(hash_key(key)).map(|now| now.entry) == Some(slot.entry);
        if still {
            if !tombstone {
                // SAFETY: the lock is held and the record is mutable.
                unsafe { record.set_value(value) };
            }
            record.mark_tombstone(tombstone);
        }
        record.unlock();
        Some(still)
    }

    /// Writes a new record at the tail pointing back at the entry's chain
    /// and swaps the entry to it. `false`: the entry moved; retry.
    fn append(
        &mut self,
        mut slot: Slot<'_>,
        key: &[u8],
        value: &[u8],
        capacity: usize,
        tombstone: bool,
    ) -> Result<bool, KvError> {
        let chain_head = slot.entry.address();
        let address = self.allocate(record_bytes(key.len(), capacity))?;
        let log = &self.shared.log;
        // SAFETY: just allocated by this session and not yet published.
        unsafe {
            write_new(
                &log.frames,
                address,
                Header::new(chain_head, tombstone),
                key,
                value,
                capacity,
            )
        };
        if slot.swap_address(address) {
            return Ok(true);
        }
        // SAFETY: the record was allocated in this protected section.
        unsafe { MemoryRecord::new(&log.frames, address) }.mark_invalid();
        Ok(false)
    }

    /// Applies `update` to `key`'s value; the new value lands in `out`.
    pub fn rmw(
        &mut self,
        key: &[u8],
        update: Update,
        out: &mut Vec<u8>,
        context: u64,
    ) -> Result<Status, KvError> {
        check_key(key)?;
        self.enter()?;
        self.rmw_from_scratch(key, update, out, context)
    }

    fn rmw_from_scratch(
        &mut self,
        key: &[u8],
        update: Update,
        out: &mut Vec<u8>,
        context: u64,
    ) -> Result<Status, KvError> {
        let hash = hash_key(key);
        let shared = self.shared.clone();
        loop {
            let slot = shared.index.find_or_create(hash)?;
            let chain_head = slot.entry.address();
            let outcome = match locate(&shared.log, key, chain_head) {
                Located::Device(address) => {
                    return self.start_pending(key, address, chain_head, Some(update), context)
                }
                Located::Absent => self.rmw_append(slot, key, update, None, out)?,
                Located::Memory(record, address, region) => {
                    self.rmw_in_memory(slot, key, update, record, address, region, out)?
                }
            };
            if let Some(status) = outcome {
                return Ok(status);
            }
        }
    }

    /// An RMW on a record in memory: in place if it may, else a copy.
    /// `None`: the entry moved; retry.
    #[allow(clippy::too_many_arguments)]
    fn rmw_in_memory(
        &mut self,
        slot: Slot<'_>,
        key: &[u8],
        update: Update,
        record: MemoryRecord<'_>,
        address: LogAddress,
        region: Region,
        out: &mut Vec<u8>,
    ) -> Result<Option<Status>, KvError> {
        let current = slot.entry;
        let capacity = update.capacity_for(record.value_capacity());
        let in_place = region == Region::Mutable && address == current.address();
        let locked = matches!(region, Region::Mutable | Region::Fuzzy);
        // Allocate before locking: waiting for a page with a record locked
        // could hold up the very thread whose refresh frees the page.
        let fresh = if in_place && capacity <= record.value_capacity() {
            None
        } else {
            match self.try_allocate(record_bytes(key.len(), capacity))? {
                Some(address) => Some(address),
                None => return Ok(None),
            }
        };
        if locked {
            record.lock();
        }
        let result = self.rmw_locked(slot, key, update, &record, fresh, capacity, out);
        if locked {
            record.unlock();
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn rmw_locked(
        &mut self,
        mut slot: Slot<'_>,
        key: &[u8],
        update: Update,
        record: &MemoryRecord<'_>,
        fresh: Option<LogAddress>,
        capacity: usize,
        out: &mut Vec<u8>,
    ) -> Result<Option<Status>, KvError> {
        let log = self.shared.log.clone();
        let now = self.shared.index.find(hash_key(key)).map(|now| now.entry);
        let tombstone = record.header().is_tombstone();
        let mut old = std::mem::take(&mut self.scratch);
        // SAFETY: locked where others may write; below the safe read-only
        // boundary nobody writes.
        unsafe { record.copy_value(&mut old) };
        let result = self.rmw_publish(
            &mut slot, now, key, update, tombstone, &old, record, fresh, capacity, out,
        );
        self.scratch = old;
        if let (Ok(None) | Err(_), Some(address)) = (&result, fresh) {
            // The update refused the value (INCR of a word), or the entry
            // moved, perhaps before the record was written: either way the
            // space must still read as a record, or scans stop at it.
            // SAFETY: allocated in this protected section, never published.
            unsafe {
                write_new(
                    &log.frames,
                    address,
                    Header::new(LogAddress::NONE, false),
                    key,
                    &[],
                    capacity,
                );
                MemoryRecord::new(&log.frames, address).mark_invalid();
            }
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn rmw_publish(
        &mut self,
        slot: &mut Slot<'_>,
        now: Option<crate::index::Entry>,
        key: &[u8],
        update: Update,
        tombstone: bool,
        old: &[u8],
        record: &MemoryRecord<'_>,
        fresh: Option<LogAddress>,
        capacity: usize,
        out: &mut Vec<u8>,
    ) -> Result<Option<Status>, KvError> {
        if now != Some(slot.entry) {
            return Ok(None);
        }
        let found = !tombstone;
        update.apply(found.then_some(old), out)?;
        let status = if found {
            Status::Found
        } else {
            Status::NotFound
        };
        let Some(address) = fresh else {
            // SAFETY: in place only under the lock in the mutable region.
            unsafe { record.set_value(out) };
            record.mark_tombstone(false);
            self.stats.in_place_updates += 1;
            return Ok(Some(status));
        };
        let log = &self.shared.log;
        let header = Header::new(slot.entry.address(), false);
        // SAFETY: allocated by this session and not yet published.
        unsafe { write_new(&log.frames, address, header, key, out, capacity) };
        if !slot.swap_address(address) {
            return Ok(None);
        }
        self.stats.copies_to_tail += 1;
        Ok(Some(status))
    }

    /// An RMW of a key with no live record (or whose old value is `old`,
    /// read from the device): a new record at the tail. `None`: retry.
    fn rmw_append(
        &mut self,
        slot: Slot<'_>,
        key: &[u8],
        update: Update,
        old: Option<&[u8]>,
        out: &mut Vec<u8>,
    ) -> Result<Option<Status>, KvError> {
        update.apply(old, out)?;
        let capacity = update.capacity_for(out.len()).max(out.len());
        let value = std::mem::take(out);
        let appended = self.append(slot, key, &value, capacity, false);
        *out = value;
        let status = if old.is_some() {
            Status::Found
        } else {
            Status::NotFound
        };
        Ok(appended?.then_some(status))
    }

    fn start_pending(
        &mut self,
        key: &[u8],
        address: LogAddress,
        chain_head: LogAddress,
        update: Option<Update>,
        context: u64,
    ) -> Result<Status, KvError> {
        let operation = PendingOperation {
            context,
            key: key.to_vec(),
            address,
            chain_head,
            update,
            restarts: 0,
        };
        let token = match self.free_tokens.pop() {
            Some(token) => {
                self.pending[token] = Some(operation);
                token
            }
            None => {
                self.pending.push(Some(operation));
                self.pending.len() - 1
            }
        };
        self.stats.pending += 1;
        if let Err(error) = self.issue_read(token, self.shared.config.first_read_bytes) {
            // Never issued: the caller hears it now, and the token is
            // free. Left pending, it was waited for by every later call
            // (each stalled for 30 s) and SAVE refused for good.
            self.pending[token] = None;
            self.free_tokens.push(token);
            return Err(error);
        }
        Ok(Status::Pending)
    }

    /// Whether `length` bytes from the pending operation's record stay in its page.
    fn fits_its_page(&self, token: usize, length: usize) -> bool {
        let address = self.pending[token].as_ref().expect("a live token").address;
        length as u64 <= address.bytes_to_page_end(self.shared.config.page_bits)
    }

    /// Reads `length` bytes of the pending operation's record, cut at its page's end.
    fn issue_read(&mut self, token: usize, length: usize) -> Result<(), KvError> {
        let address = self.pending[token].as_ref().expect("a live token").address;
        let room = address.bytes_to_page_end(self.shared.config.page_bits);
        let length = (length as u64).min(room) as usize;
        let offset = self.shared.log.device_offset(address);
        self.stats.device_reads += 1;
        let queue = &mut self.queue;
        let (issued, spent) = call_time::timed(|| queue.read(offset, length, token as u64));
        self.stats.device_issue_nanos += spent.as_nanos() as u64;
        Ok(issued?)
    }

    /// Finishes pending operations as the device answers, handing each to
    /// `done`. With `wait`, returns only when none is left.
    pub fn complete_pending(
        &mut self,
        wait: bool,
        done: &mut dyn FnMut(Completion<'_>),
    ) -> Result<usize, KvError> {
        let mut completed = 0;
        // The clock starts when the call first has to wait: a look that
        // does not wait (most of them) reads none.
        let mut started = None;
        loop {
            self.enter_for_completion()?;
            let arrived = &mut self.arrived;
            let polled = self.queue.poll(&mut |token, bytes| {
                arrived.push_read(token, bytes.unwrap_or(&[]));
            });
            match polled {
                // One read failed: its operation fails, the others go on.
                Err(DeviceError::RequestFailed { token, reason }) => {
                    let error = KvError::Device(DeviceError::RequestFailed { token, reason });
                    completed += usize::from(self.fail_pending(token as usize, error, done));
                }
                polled => {
                    polled?;
                }
            }
            let mut arrived = std::mem::take(&mut self.arrived);
            arrived.drain(&mut |token, bytes| {
                let token = token as usize;
                let finished = match self.on_arrival(token, bytes.unwrap_or(&[]), done) {
                    Ok(finished) => finished,
                    Err(error) => self.fail_pending(token, error, done),
                };
                completed += usize::from(finished);
            });
            self.arrived = arrived;
            if !wait || self.pending_count() == 0 {
                return Ok(completed);
            }
            if started.get_or_insert_with(Instant::now).elapsed() > MAX_WAIT {
                return Err(KvError::Stalled(MAX_WAIT));
            }
            std::thread::yield_now();
        }
    }

    /// A pending operation whose record could not be read (a corrupt
    /// record, a device that failed) completes with the error: its caller
    /// hears why and its token is free. The first such failure used to
    /// end the call, and the operations drained after it stayed pending
    /// for good: every later wait stalled for 30 s.
    fn fail_pending(
        &mut self,
        token: usize,
        error: KvError,
        done: &mut dyn FnMut(Completion<'_>),
    ) -> bool {
        let Some(operation) = self.pending.get_mut(token).and_then(Option::take) else {
            return false;
        };
        self.free_tokens.push(token);
        let kind = match operation.update {
            Some(_) => OperationKind::ReadModifyWrite,
            None => OperationKind::Read,
        };
        done(Completion {
            context: operation.context,
            kind,
            result: Err(error),
            value: &[],
        });
        true
    }

    fn enter_for_completion(&mut self) -> Result<(), KvError> {
        self.start_wait_clocks();
        if !self.shared.epoch.is_protected(self.slot()) {
            self.shared.epoch.protect(self.slot());
        }
        self.refresh()
    }

    /// A device read for a pending operation arrived. `true`: it finished.
    fn on_arrival(
        &mut self,
        token: usize,
        bytes: &[u8],
        done: &mut dyn FnMut(Completion<'_>),
    ) -> Result<bool, KvError> {
        // A page truncated while its read was in flight may already hold
        // newer pages' bytes (the device is a ring): they are not the
        // record's. Checked after the bytes came, this is enough, since
        // the begin only moves up and space is reused only below it.
        //
        // A completion for no live operation is one a wait that gave up
        // left behind: `read_now`'s or `write_now`'s (tokens from 2^63)
        // after a failed poll, which the device still
        // delivered. Indexed, it panicked the session's thread.
        let Some(Some(operation)) = self.pending.get(token) else {
            self.stats.stray_completions += 1;
            return Ok(false);
        };
        let address = operation.address;
        if self.shared.log.region(address) == Region::Truncated {
            return self.finish_below_begin(token, done);
        }
        let record = match parse_stored(bytes) {
            Parsed::Corrupt(why) => return Err(KvError::Corrupt(why)),
            // A record longer than what is left of its page was never
            // written by this log: reading again would bring the same bytes.
            Parsed::Needs(length)
                if length <= bytes.len() || !self.fits_its_page(token, length) =>
            {
                return Err(KvError::Corrupt("a record runs past its page's end"));
            }
            Parsed::Needs(length) => {
                self.issue_read(token, length)?;
                return Ok(false);
            }
            Parsed::Whole(record) => record,
        };
        let operation = self.pending[token].as_mut().expect("a live token");
        let old = if record.key == operation.key.as_slice() {
            (!record.header.is_tombstone()).then_some(record.value)
        } else if self.shared.log.region(record.header.previous()) == Region::Truncated {
            return self.finish_below_begin(token, done);
        } else {
            // Another key's record: read the one before it.
            operation.address = previous_on_chain(operation.address, record.header)?;
            self.issue_read(token, self.shared.config.first_read_bytes)?;
            return Ok(false);
        };
        let operation = self.pending[token].take().expect("a live token");
        self.free_tokens.push(token);
        self.finish(operation, old, done)?;
        Ok(true)
    }

    /// A pending operation whose chain ran below the log's begin: a read
    /// looks again from the index if the head moved, and otherwise its key
    /// is absent, as every truncated record is. An RMW finishes as absent,
    /// and starts over there if the head moved.
    fn finish_below_begin(
        &mut self,
        token: usize,
        done: &mut dyn FnMut(Completion<'_>),
    ) -> Result<bool, KvError> {
        let operation = self.pending[token].as_ref().expect("a live token");
        if operation.update.is_none() {
            if let Some(finished) = self.restart_read(token, done)? {
                return Ok(finished);
            }
        }
        let operation = self.pending[token].take().expect("a live token");
        self.free_tokens.push(token);
        self.finish(operation, None, done)?;
        Ok(true)
    }

    /// A pending read whose chain ran below the log's begin looks again
    /// from the index's head if it moved (see [`moved_head`]): `None` if it
    /// did not (the key is absent), else whether the read finished.
    fn restart_read(
        &mut self,
        token: usize,
        done: &mut dyn FnMut(Completion<'_>),
    ) -> Result<Option<bool>, KvError> {
        let shared = self.shared.clone();
        let operation = self.pending[token].as_mut().expect("a live token");
        let hash = hash_key(&operation.key);
        let Some(head) = moved_head(&shared, hash, operation.chain_head) else {
            return Ok(None);
        };
        operation.restarts += 1;
        if operation.restarts > MAX_LOOKUP_RESTARTS {
            let operation = self.pending[token].take().expect("a live token");
            self.free_tokens.push(token);
            done(Completion {
                context: operation.context,
                kind: OperationKind::Read,
                result: Err(KvError::LookupContended(MAX_LOOKUP_RESTARTS)),
                value: &[],
            });
            return Ok(Some(true));
        }
        operation.chain_head = head;
        match locate(&shared.log, &operation.key, head) {
            Located::Device(address) => {
                operation.address = address;
                self.issue_read(token, shared.config.first_read_bytes)?;
                Ok(Some(false))
            }
            Located::Memory(record, _, region) => {
                let mut value = Vec::new();
                let status = copy_live_value(&record, region, &mut value);
                let operation = self.pending[token].take().expect("a live token");
                self.free_tokens.push(token);
                let old = (status == Status::Found).then_some(value.as_slice());
                self.finish(operation, old, done)?;
                Ok(Some(true))
            }
            // Gone from the new head too: absent, unless it moved again.
            Located::Absent => self.restart_read(token, done),
        }
    }

    /// Completes an operation whose record (or absence) is known.
    fn finish(
        &mut self,
        operation: PendingOperation,
        old: Option<&[u8]>,
        done: &mut dyn FnMut(Completion<'_>),
    ) -> Result<(), KvError> {
        let found = if old.is_some() {
            Status::Found
        } else {
            Status::NotFound
        };
        let Some(update) = operation.update else {
            done(Completion {
                context: operation.context,
                kind: OperationKind::Read,
                result: Ok(found),
                value: old.unwrap_or(&[]),
            });
            return Ok(());
        };
        let mut out = Vec::new();
        let result = self.finish_rmw(&operation, update, old, &mut out);
        if !matches!(result, Ok(Status::Pending)) {
            done(Completion {
                context: operation.context,
                kind: OperationKind::ReadModifyWrite,
                result,
                value: &out,
            });
        }
        Ok(())
    }

    /// An RMW whose old value came from the device: publish the new
    /// record if the entry has not moved, else start over.
    fn finish_rmw(
        &mut self,
        operation: &PendingOperation,
        update: Update,
        old: Option<&[u8]>,
        out: &mut Vec<u8>,
    ) -> Result<Status, KvError> {
        let hash = hash_key(&operation.key);
        let shared = self.shared.clone();
        let slot = shared.index.find_or_create(hash)?;
        if slot.entry.address() == operation.chain_head {
            if let Some(status) = self.rmw_append(slot, &operation.key, update, old, out)? {
                return Ok(status);
            }
        }
        self.rmw_from_scratch(&operation.key, update, out, operation.context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::fails_once::FailsOnce;
    use crate::device::MemoryDevice;

    /// A checkpoint whose write's poll failed returned the error, and the
    /// device delivered the write's completion later, to the session's
    /// next wait: `on_arrival` indexed its pending operations with the
    /// checkpoint's token (one of `write_now`'s) and panicked (found by
    /// reading). It is dropped and counted now, and the read waited for
    /// finishes.
    #[test]
    fn a_completion_left_by_a_failed_checkpoint_write_is_dropped() {
        // `write_now`'s, which the checkpoint's record is written with.
        let device = Arc::new(FailsOnce::on_token(
            MemoryDevice::new(16 << 20),
            crate::checkpoint::is_wait_token,
        ));
        let store = Store::new(StoreConfig::smallest(), device.clone()).unwrap();
        device.arm();
        let mut session = store.session().unwrap();
        session.upsert(b"first", b"one").unwrap();
        for number in 0..200u32 {
            session
                .upsert(&number.to_le_bytes(), &[b'f'; 1000])
                .unwrap();
        }
        let checkpoint = session.checkpoint();
        assert!(
            matches!(checkpoint, Err(KvError::Device(DeviceError::Io(_)))),
            "the injected failure: {checkpoint:?}"
        );
        let mut value = Vec::new();
        assert_eq!(
            session.read(b"first", &mut value, 7).unwrap(),
            Status::Pending
        );
        let mut completions = Vec::new();
        session
            .complete_pending(true, &mut |completion| {
                completions.push((
                    completion.context,
                    completion.result.clone(),
                    completion.value.to_vec(),
                ));
            })
            .unwrap();
        assert_eq!(completions, vec![(7, Ok(Status::Found), b"one".to_vec())]);
        assert_eq!(session.stats().stray_completions, 1);
    }

    /// A write that waited for room and then failed with DeviceFull kept
    /// the time its wait started: more than 30 s later, the session's
    /// first wait of any kind reported a stall at once (and the background
    /// compactor, which tolerates DeviceFull, died on it).
    #[test]
    fn a_failed_write_leaves_no_wait_behind() {
        let store = Store::new(
            StoreConfig::smallest(),
            Arc::new(MemoryDevice::new(1 << 20)),
        )
        .unwrap();
        store.wait_for_room(Duration::from_millis(1));
        let mut session = store.session().unwrap();
        let failed = (0u64..100_000)
            .map(|number| session.upsert(&number.to_le_bytes(), &[5; 1000]))
            .find(|result| result.is_err());
        assert!(
            matches!(failed, Some(Err(KvError::Log(LogError::DeviceFull { .. })))),
            "{failed:?}"
        );
        assert_eq!(session.waiting_since, None);
    }

    /// A wait's start left behind by an earlier operation (simulated here:
    /// the ways out that left it were an RMW's retry and a failed
    /// checkpoint) made the next wait report a stall at once.
    #[test]
    fn a_wait_left_behind_by_an_earlier_operation_is_not_a_stall() {
        let store = Store::new(
            StoreConfig::smallest(),
            Arc::new(MemoryDevice::new(16 << 20)),
        )
        .unwrap();
        let mut session = store.session().unwrap();
        for number in 0..50u32 {
            session
                .upsert(&number.to_le_bytes(), &[b'f'; 1000])
                .unwrap();
        }
        session.waiting_since = Instant::now().checked_sub(MAX_WAIT + Duration::from_secs(1));
        assert!(session.waiting_since.is_some());
        // The checkpoint waits for the log's flush.
        session.checkpoint().unwrap();
    }

    /// A memory device that refuses to open queues while `refusing`.
    struct RefusesQueues {
        device: MemoryDevice,
        refusing: std::sync::atomic::AtomicBool,
    }

    impl Device for RefusesQueues {
        fn name(&self) -> &str {
            "refuses-queues"
        }
        fn capacity_bytes(&self) -> u64 {
            self.device.capacity_bytes()
        }
        fn open_queue(&self) -> Result<Box<dyn DeviceQueue>, DeviceError> {
            if self.refusing.load(Ordering::Relaxed) {
                return Err(DeviceError::Io("no queue for the test".into()));
            }
            self.device.open_queue()
        }
    }

    /// A session whose device queue could not be opened kept its epoch
    /// slot: after as many failed opens as the store has sessions, every
    /// session was refused for want of a slot, the device well again.
    #[test]
    fn a_session_whose_queue_could_not_open_gives_its_slot_back() {
        let device = Arc::new(RefusesQueues {
            device: MemoryDevice::new(1 << 20),
            refusing: std::sync::atomic::AtomicBool::new(false),
        });
        let sessions = StoreConfig::smallest().sessions;
        let store = Store::new(StoreConfig::smallest(), device.clone()).unwrap();
        device.refusing.store(true, Ordering::Relaxed);
        for _ in 0..=sessions {
            assert!(matches!(store.session(), Err(KvError::Device(_))));
        }
        device.refusing.store(false, Ordering::Relaxed);
        let opened: Vec<Session> = (0..sessions).map(|_| store.session().unwrap()).collect();
        assert_eq!(opened.len(), sessions);
    }

    /// A memory device whose queues fail the first write they are given,
    /// by its token, as a far-memory queue reports a failed piece.
    struct FailsFirstWrite(MemoryDevice);

    struct FailsFirstWriteQueue {
        inner: Box<dyn DeviceQueue>,
        doomed: Option<u64>,
        written: bool,
    }

    impl Device for FailsFirstWrite {
        fn name(&self) -> &str {
            "fails-first-write"
        }
        fn capacity_bytes(&self) -> u64 {
            self.0.capacity_bytes()
        }
        fn open_queue(&self) -> Result<Box<dyn DeviceQueue>, DeviceError> {
            Ok(Box::new(FailsFirstWriteQueue {
                inner: self.0.open_queue()?,
                doomed: None,
                written: false,
            }))
        }
    }

    impl DeviceQueue for FailsFirstWriteQueue {
        fn read(&mut self, offset: u64, length: usize, token: u64) -> Result<(), DeviceError> {
            self.inner.read(offset, length, token)
        }
        fn write(&mut self, offset: u64, data: &[u8], token: u64) -> Result<(), DeviceError> {
            if !std::mem::replace(&mut self.written, true) {
                self.doomed = Some(token);
                return Ok(());
            }
            self.inner.write(offset, data, token)
        }
        fn poll(
            &mut self,
            done: &mut dyn FnMut(u64, crate::device::Completed<'_>),
        ) -> Result<usize, DeviceError> {
            let count = self.inner.poll(done)?;
            match self.doomed.take() {
                Some(token) => Err(DeviceError::RequestFailed {
                    token,
                    reason: "injected".into(),
                }),
                None => Ok(count),
            }
        }
        fn in_flight(&self) -> usize {
            self.inner.in_flight() + usize::from(self.doomed.is_some())
        }
    }

    /// A log page whose write failed by its token was told to whichever
    /// session polled, then forgotten: the head could never pass it, and
    /// every session ended stalled 30 s later. The log stops at once now,
    /// and says why to every session.
    #[test]
    fn a_flush_that_failed_by_its_token_stops_the_log_with_the_reason() {
        let store = Store::new(
            StoreConfig::smallest(),
            Arc::new(FailsFirstWrite(MemoryDevice::new(1 << 20))),
        )
        .unwrap();
        let mut session = store.session().unwrap();
        let started = Instant::now();
        let failed = (0u64..100_000)
            .map(|number| session.upsert(&number.to_le_bytes(), &[5; 200]))
            .find(|result| result.is_err());
        assert!(
            matches!(
                failed,
                Some(Err(KvError::Log(LogError::Flush(
                    DeviceError::RequestFailed { .. }
                ))))
            ),
            "{failed:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "it stalled first"
        );
        let mut other = store.session().unwrap();
        assert!(
            matches!(
                other.upsert(b"later", b"write"),
                Err(KvError::Log(LogError::Flush(
                    DeviceError::RequestFailed { .. }
                )))
            ),
            "another session hears the reason too"
        );
    }

    /// A compaction that truncated between a first checkpoint's read of
    /// the begin and its keep gave the pages between the two begins back
    /// to the tail, and the checkpoint named them. The begin is read
    /// again after the keep now; and the retry keeps from the newer begin,
    /// not the older.
    /// A store on a 1 MiB memory device, written to until its first
    /// pages are on the device; its log.
    fn store_with_pages_on_the_device() -> (Store, Arc<HybridLog>) {
        let store = Store::new(
            StoreConfig::smallest(),
            Arc::new(MemoryDevice::new(1 << 20)),
        )
        .unwrap();
        let mut session = store.session().unwrap();
        let log = store.shared.log.clone();
        for number in 0u64..5_000 {
            session.upsert(&number.to_le_bytes(), &[5; 200]).unwrap();
            if log.head().value() > 0 {
                break;
            }
        }
        assert!(
            log.head().value() > 0,
            "the test must push pages to the device"
        );
        (store, log)
    }

    #[test]
    fn a_truncation_during_a_checkpoints_keep_moves_the_checkpoints_begin() {
        let (store, log) = store_with_pages_on_the_device();
        let head = log.head();
        let mut compacted = false;
        let begin = log.keep_checkpoint_from_begin_with(|| {
            if !std::mem::replace(&mut compacted, true) {
                store.truncate_until(head).unwrap();
            }
        });
        assert_eq!(begin, head, "the checkpoint starts where the log now does");
        assert_eq!(log.needed_from(), head, "no room is held below the begin");
    }

    /// The other side of the same race: a writer checking for room loaded
    /// the kept address (none yet), then a first checkpoint kept from the
    /// begin and a compaction truncated past it, and then the writer loaded
    /// the new begin. It counted the checkpoint's pages as free.
    #[test]
    fn a_checkpoint_and_a_truncation_between_a_room_checks_loads_keep_the_checkpoints_pages() {
        let (store, log) = store_with_pages_on_the_device();
        let (head, begin) = (log.head(), log.begin());
        assert!(head > begin);
        let mut kept = None;
        let needed = log.needed_from_with(|| {
            kept = Some(log.keep_checkpoint_from_begin());
            store.truncate_until(head).unwrap();
        });
        assert_eq!(kept, Some(begin), "the checkpoint kept from the old begin");
        assert_eq!(log.begin(), head, "and the log was truncated past it");
        assert_eq!(needed, begin, "the checkpoint's pages are still needed");
    }
}
