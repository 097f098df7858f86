//! Far-memory objects: `alloc` gives a contiguous range that faults in,
//! a chunk at a time, from a [`ChunkStore`], through one host buffer that
//! every object shares.
//!
//! Handler threads read userfaultfd events. A missing page fetches its
//! chunk and installs it write-protected; the first write then faults
//! once more and marks the chunk dirty. An evictor thread keeps the
//! buffer between its watermarks; a handler that finds the buffer full
//! evicts before it fetches. Evicting a dirty chunk write-protects it,
//! copies it out, writes it back and drops its pages, so a write that
//! races the eviction waits and then faults the written-back chunk in.
//!
//! A chunk whose fetch fails (its store lost the data, or went away) is
//! poisoned: touching it raises SIGBUS, never a hang and never stale data,
//! and [`FarObject::check`] says the object is lost.

use crate::buffer::{ChunkKey, ChunkState, HostBuffer};
use crate::mapping::{self, Mapping};
use crate::store::{ChunkStore, ObjectId, StoreError};
use crate::userfault::{Fault, Installed, Userfault, UserfaultError};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a handler waits for a fault before checking whether to stop.
const POLL_INTERVAL: Duration = Duration::from_millis(20);
/// How long an install the kernel refuses for lack of memory is tried
/// again before its object is given up as lost: under a memory cgroup at
/// its limit the copy-in fails with ENOMEM, a shortage that passes, while
/// the store still holds the data.
const SHORTAGE_PATIENCE: Duration = Duration::from_secs(1);
/// The wait between such tries when no clean chunk can be dropped.
const SHORTAGE_BACKOFF: Duration = Duration::from_millis(5);
/// The most chunks the evictor drops together. Dropping pages costs a
/// TLB shootdown, which batching shares (see [`mapping::drop_ranges`]);
/// 16 chunks are 1 MiB at the default chunk size, and the kernel's own
/// batch of flushes is of that order.
const EVICTION_BATCH: usize = 16;
/// The smallest chunk: a page.
pub const MIN_CHUNK_BYTES: usize = mapping::PAGE_BYTES;
pub const DEFAULT_CHUNK_BYTES: usize = 64 << 10;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FarMemoryConfig {
    /// The host buffer every object shares.
    pub buffer_bytes: u64,
    /// Proactive eviction starts above this fraction of the buffer...
    pub high_watermark: f64,
    /// ... and stops at this one.
    pub low_watermark: f64,
    pub fault_threads: usize,
}

impl Default for FarMemoryConfig {
    fn default() -> FarMemoryConfig {
        FarMemoryConfig {
            buffer_bytes: 64 << 20,
            high_watermark: 0.9,
            low_watermark: 0.8,
            fault_threads: 2,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SodaError {
    #[error(transparent)]
    Userfault(#[from] UserfaultError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("mapping {bytes} bytes: {errno}")]
    Map {
        bytes: usize,
        errno: rustix::io::Errno,
    },
    #[error("bad configuration: {0}")]
    Config(&'static str),
    #[error("chunk size {0} is not a multiple of the page size or is past the host buffer")]
    ChunkSize(usize),
    #[error("object {object:?} is lost: {reason}")]
    Lost { object: ObjectId, reason: String },
    #[error(transparent)]
    Placement(#[from] remora_graph::PlacementError),
    #[error(transparent)]
    App(#[from] remora_graph::apps::AppError),
    #[error("object of {bytes} bytes is not a whole number of {element}-byte elements")]
    Misaligned { bytes: usize, element: usize },
    #[error("the far memory is closed: no more objects can be allocated")]
    Closed,
    #[error("an object of {bytes} bytes in {chunk_bytes}-byte chunks has more than 2^32 chunks")]
    TooManyChunks { bytes: usize, chunk_bytes: usize },
    #[error("every object id is taken: 2^32 objects are live or still being released")]
    IdsExhausted,
}

/// What the far memory did, for reports. CPU times are thread CPU time
/// of the handler and evictor threads: the host's cost of faulting.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FarMemoryStats {
    pub missing_faults: u64,
    pub write_faults: u64,
    pub fetched_bytes: u64,
    pub written_back_bytes: u64,
    pub evictions: u64,
    pub failed_fetches: u64,
    /// Installs the kernel refused for lack of memory, tried again.
    pub install_shortages: u64,
    pub handler_cpu_nanos: u64,
    pub evictor_cpu_nanos: u64,
    /// Fetch-to-install latency of missing faults, p50 and p99.
    pub fault_p50_nanos: u64,
    pub fault_p99_nanos: u64,
}

#[derive(Default)]
struct Counters {
    missing_faults: AtomicU64,
    write_faults: AtomicU64,
    fetched_bytes: AtomicU64,
    written_back_bytes: AtomicU64,
    evictions: AtomicU64,
    failed_fetches: AtomicU64,
    install_shortages: AtomicU64,
    handler_cpu_nanos: AtomicU64,
    evictor_cpu_nanos: AtomicU64,
}

#[derive(Debug, Clone)]
struct ObjectInfo {
    id: ObjectId,
    address: usize,
    length: usize,
    chunk_bytes: usize,
    lost: Option<String>,
}

struct Inner {
    buffer: HostBuffer,
    /// Live objects by start address.
    objects: BTreeMap<usize, ObjectInfo>,
    addresses: HashMap<ObjectId, usize>,
    next_id: u32,
    /// Ids of freed objects, oldest first, named again once the store has
    /// let go of everything it held for them. Never reused, ids ran out:
    /// a process of the multi-process rack was refused its 4,096th
    /// allocation though it held one object.
    freed_ids: VecDeque<ObjectId>,
}

impl Inner {
    fn locate(&self, address: usize) -> Option<(ChunkKey, usize, usize)> {
        let (_, info) = self.objects.range(..=address).next_back()?;
        let offset = address
            .checked_sub(info.address)
            .filter(|&o| o < info.length)?;
        let index = offset / info.chunk_bytes;
        let key = ChunkKey {
            object: info.id,
            index: index as u32,
        };
        Some((
            key,
            info.address + index * info.chunk_bytes,
            info.chunk_bytes,
        ))
    }

    fn info(&self, object: ObjectId) -> Option<&ObjectInfo> {
        self.objects.get(self.addresses.get(&object)?)
    }

    fn info_mut(&mut self, object: ObjectId) -> Option<&mut ObjectInfo> {
        let address = *self.addresses.get(&object)?;
        self.objects.get_mut(&address)
    }
}

struct Shared {
    userfault: Userfault,
    store: Arc<dyn ChunkStore>,
    inner: Mutex<Inner>,
    changed: Condvar,
    stopping: AtomicBool,
    counters: Counters,
    latencies: Mutex<hdrhistogram::Histogram<u64>>,
}

/// A staging buffer per thread, page aligned for `O_DIRECT` stores.
struct Staging(Option<Mapping>);

impl Staging {
    fn get(&mut self, bytes: usize) -> Result<&mut [u8], SodaError> {
        if self.0.as_ref().is_none_or(|mapping| mapping.len() < bytes) {
            let mapping = Mapping::new(bytes).map_err(|errno| SodaError::Map { bytes, errno })?;
            self.0 = Some(mapping);
        }
        Ok(&mut self.0.as_mut().expect("just made").as_mut_slice()[..bytes])
    }
}

/// Runs a store call that moves a chunk. A panic in it (a bug in the
/// store) becomes that call's error, so the chunk is abandoned and its
/// object lost, as for any failed move, instead of staying "moving" for
/// ever with every thread that faults on it asleep.
fn guarded(
    call: &'static str,
    work: impl FnOnce() -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
        .unwrap_or(Err(StoreError::Panicked { call }))
}

fn thread_cpu_nanos() -> u64 {
    let time = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64
}

/// What a fetch left to do: nothing, or start over (it made room first).
enum Fetched {
    Done,
    Again,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().expect("far-memory state lock")
    }

    /// An id for a new object: the oldest freed one if the store has let
    /// it go (one look, so an allocation stays O(1); a freed id still held
    /// goes to the back), else a fresh one. The store is asked outside
    /// the lock, which the fault handlers need.
    fn take_id(&self) -> Result<ObjectId, SodaError> {
        let oldest = self.lock().freed_ids.pop_front();
        if let Some(id) = oldest {
            if self.store.is_released(id) {
                return Ok(id);
            }
            self.lock().freed_ids.push_back(id);
        }
        let mut inner = self.lock();
        let id = ObjectId(inner.next_id);
        inner.next_id = inner
            .next_id
            .checked_add(1)
            .ok_or(SodaError::IdsExhausted)?;
        Ok(id)
    }

    /// `id` names no object and the store was told to let it go.
    fn give_back_id(&self, id: ObjectId) {
        self.lock().freed_ids.push_back(id);
    }

    /// Releases a reserved `id` that never became an object; an id the
    /// store failed to release is not named again.
    fn release_id(&self, id: ObjectId) {
        match self.store.release(id) {
            Ok(()) => self.give_back_id(id),
            Err(error) => tracing::warn!(object = id.0, %error, "releasing an unused object id"),
        }
    }

    fn handle_fault(&self, fault: Fault, staging: &mut Staging) {
        // Each pass serves the fault or waits for a state change (or, with
        // the buffer full, a poll interval), and every state change ends in
        // finite time. Each pass locates the fault afresh: across a wait
        // its object may have been freed and its address given to another.
        loop {
            let inner = self.lock();
            let Some((key, address, length)) = inner.locate(fault.address) else {
                drop(inner);
                self.wake_stray(fault.address);
                return;
            };
            match inner.buffer.state(key) {
                None => match self.fetch(inner, key, address, length, fault, staging) {
                    Fetched::Done => return,
                    Fetched::Again => continue,
                },
                Some(ChunkState::Fetching | ChunkState::Evicting) => {
                    drop(self.changed.wait(inner).expect("far-memory state lock"));
                }
                Some(ChunkState::Resident { .. }) if fault.write_protected => {
                    let mut inner = inner;
                    inner.buffer.mark_dirty(key);
                    // Unprotected under the lock: an eviction that began
                    // between the two would write the chunk back while the
                    // writer, woken by the unprotect, still wrote to it,
                    // then drop the write; or a late unprotect would leave
                    // a refetched clean chunk writable, its writes unseen.
                    self.report(self.userfault.write_protect(address, length, false));
                    drop(inner);
                    self.counters.write_faults.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Some(ChunkState::Resident { .. }) => {
                    drop(inner);
                    self.report(self.userfault.wake(address, length));
                    return;
                }
            }
        }
    }

    /// A fault no object holds: a message that outlived its object (one
    /// copy-in wakes every thread waiting on a chunk, and their other
    /// messages are stale), or an object not yet in the table. It is only
    /// woken: a fault that matters comes back, to an object then.
    /// (Poisoned, a stale message's page could be a new object's, given
    /// the freed address, and its first touch died with SIGBUS.)
    fn wake_stray(&self, address: usize) {
        tracing::debug!(address, "a fault outside every far-memory object");
        let page = address & !(mapping::PAGE_BYTES - 1);
        let _ = self.userfault.wake(page, mapping::PAGE_BYTES);
    }

    fn fetch(
        &self,
        mut inner: MutexGuard<'_, Inner>,
        key: ChunkKey,
        address: usize,
        length: usize,
        fault: Fault,
        staging: &mut Staging,
    ) -> Fetched {
        let Some(info) = inner.info(key.object) else {
            // Freed meanwhile: nothing to fetch it into.
            drop(inner);
            self.wake_stray(fault.address);
            return Fetched::Done;
        };
        if let Some(reason) = info.lost.clone() {
            // Poisoned under the lock, so the range is still this object's.
            let poisoned = self.poison_chunk(address, length);
            drop(inner);
            tracing::warn!(object = key.object.0, %reason, "access to a lost object");
            self.report(poisoned);
            return Fetched::Done;
        }
        // Make room first; an eviction may let other faults change this
        // chunk's state, so start over from the top afterwards.
        if inner.buffer.is_full_for(length as u64) {
            let victim = inner.buffer.begin_evict();
            drop(inner);
            match victim {
                Some(victim) => self.evict(&[victim], staging),
                None => drop(self.changed.wait_timeout(self.lock(), POLL_INTERVAL)),
            }
            return Fetched::Again;
        }
        inner.buffer.begin_fetch(key, length as u64);
        let offset = u64::from(key.index) * length as u64;
        drop(inner);
        let started = Instant::now();
        let result = staging.get(length).and_then(|buffer| {
            guarded("fetch", || self.store.fetch(key.object, offset, buffer))?;
            // A write fault's chunk goes in writable and dirty; a read's
            // goes in write-protected, so its first write is seen.
            Ok(self.install_patiently(address, buffer, !fault.write)?)
        });
        let mut inner = self.lock();
        match result {
            Ok(_) => {
                inner.buffer.finish_fetch(key, fault.write);
                self.counters.missing_faults.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .fetched_bytes
                    .fetch_add(length as u64, Ordering::Relaxed);
                let nanos = started.elapsed().as_nanos() as u64;
                let _ = self
                    .latencies
                    .lock()
                    .expect("latency lock")
                    .record(nanos.max(1));
            }
            Err(error) => {
                inner.buffer.abandon_fetch(key);
                self.counters.failed_fetches.fetch_add(1, Ordering::Relaxed);
                if let Some(info) = inner.info_mut(key.object) {
                    info.lost = Some(error.to_string());
                }
                tracing::error!(object = key.object.0, %error, "fetch failed; the object is lost");
                self.report(self.poison_chunk(address, length));
            }
        }
        inner.buffer.debug_check_invariants();
        drop(inner);
        self.changed.notify_all();
        Fetched::Done
    }

    /// Installs a fetched chunk. One the kernel refuses for lack of
    /// memory is tried again, after dropping a clean chunk to make room
    /// (or a short wait when none is clean), for up to
    /// [`SHORTAGE_PATIENCE`]: given up at once, its object was marked lost
    /// though the store held the data, and every later touch was SIGBUS.
    /// The chunk stays `Fetching` meanwhile, so other faults on it wait and
    /// the evictor leaves it; pages a partial copy put in are found present
    /// by the next try, which protects and wakes the whole range.
    fn install_patiently(
        &self,
        address: usize,
        data: &[u8],
        write_protected: bool,
    ) -> Result<Installed, UserfaultError> {
        let started = Instant::now();
        // Bounded by the patience: each turn drops a chunk or sleeps.
        loop {
            match self.userfault.install(address, data, write_protected) {
                Err(UserfaultError::Call {
                    errno: rustix::io::Errno::NOMEM,
                    ..
                }) if started.elapsed() < SHORTAGE_PATIENCE => {
                    self.counters
                        .install_shortages
                        .fetch_add(1, Ordering::Relaxed);
                    if !self.drop_one_clean_chunk() {
                        std::thread::sleep(SHORTAGE_BACKOFF);
                    }
                }
                other => return other,
            }
        }
    }

    /// Drops the least recently faulted clean chunk, if one is resident:
    /// memory back without a write-back, which would need the staging
    /// buffer an install in progress holds. False if none is.
    fn drop_one_clean_chunk(&self) -> bool {
        let Some(key) = self.lock().buffer.begin_evict_clean() else {
            return false;
        };
        let victims = [(key, false)];
        let ranges = self.ranges_of(&victims);
        self.drop_evicted(&victims, &ranges);
        true
    }

    /// Where the chunks `begin_evict` handed out lie: address and length.
    fn ranges_of(&self, victims: &[(ChunkKey, bool)]) -> Vec<(usize, usize)> {
        let inner = self.lock();
        victims
            .iter()
            .map(|(key, _)| {
                let info = inner
                    .info(key.object)
                    .expect("an evicting chunk's object is live");
                (
                    info.address + key.index as usize * info.chunk_bytes,
                    info.chunk_bytes,
                )
            })
            .collect()
    }

    /// Writes back (if dirty) and drops chunks `begin_evict` handed out,
    /// their pages in one call (see [`mapping::drop_ranges`]).
    fn evict(&self, victims: &[(ChunkKey, bool)], staging: &mut Staging) {
        let ranges = self.ranges_of(victims);
        for (&(key, dirty), &(address, length)) in victims.iter().zip(&ranges) {
            if !dirty {
                continue;
            }
            if let Err(error) = self.write_back(key, address, length, staging) {
                tracing::error!(object = key.object.0, %error, "write-back failed; the object is lost");
                if let Some(info) = self.lock().info_mut(key.object) {
                    info.lost = Some(error.to_string());
                }
            }
        }
        self.drop_evicted(victims, &ranges);
    }

    /// Drops evicting chunks' pages (written back already, or clean) and
    /// ends their eviction.
    fn drop_evicted(&self, victims: &[(ChunkKey, bool)], ranges: &[(usize, usize)]) {
        // SAFETY: each chunk lies in a live object's mapping (an object
        // cannot be freed while one of its chunks is evicting).
        let dropped = unsafe { mapping::drop_ranges(ranges) };
        debug_assert!(dropped.is_ok(), "dropping our own pages failed");
        let mut inner = self.lock();
        for (key, _) in victims {
            inner.buffer.finish_evict(*key);
        }
        inner.buffer.debug_check_invariants();
        drop(inner);
        self.counters
            .evictions
            .fetch_add(victims.len() as u64, Ordering::Relaxed);
        self.changed.notify_all();
        // Writers that faulted while it was protected fault again now.
        for &(address, length) in ranges {
            self.report(self.userfault.wake(address, length));
        }
    }

    fn write_back(
        &self,
        key: ChunkKey,
        address: usize,
        length: usize,
        staging: &mut Staging,
    ) -> Result<(), SodaError> {
        self.userfault.write_protect(address, length, true)?;
        let buffer = staging.get(length)?;
        // SAFETY: the chunk is resident and now write-protected: writers
        // wait in the kernel until it is dropped, so nothing writes it.
        unsafe { mapping::copy_out(address, buffer) };
        let offset = u64::from(key.index) * length as u64;
        guarded("write-back", || {
            self.store.write_back(key.object, offset, buffer)
        })?;
        self.counters
            .written_back_bytes
            .fetch_add(length as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Poisons a chunk of a lost object, every page of it: its pages
    /// are dropped first. A copy cut short by a shortage had installed
    /// some, write-protected; poisoning skips pages already there, so a
    /// write to one faulted, was woken and faulted again for ever instead
    /// of dying of SIGBUS (found by reading). The caller holds the lock,
    /// so the range is still the object's.
    fn poison_chunk(&self, address: usize, length: usize) -> Result<(), UserfaultError> {
        // SAFETY: a chunk of a live object's private anonymous mapping
        // (freeing it takes the lock the caller holds); its data is lost
        // with the object.
        let dropped =
            unsafe { mapping::drop_range(address, length) }.map_err(|errno| UserfaultError::Call {
                call: "madvise(MADV_DONTNEED)",
                errno,
            });
        // Poisoned whatever the drop did: poisoning also wakes the
        // chunk's waiters, who otherwise slept for good.
        let poisoned = self.userfault.poison(address, length);
        dropped.and(poisoned)
    }

    fn report<T>(&self, result: Result<T, UserfaultError>) {
        if let Err(error) = result {
            tracing::error!(%error, "userfaultfd call failed");
        }
    }

    fn should_stop(&self) -> bool {
        self.stopping.load(Ordering::Relaxed) && self.lock().objects.is_empty()
    }
}

fn handler_loop(shared: Arc<Shared>) {
    let mut staging = Staging(None);
    while !shared.should_stop() {
        match shared.userfault.next_fault(POLL_INTERVAL) {
            Ok(Some(fault)) => {
                let started = thread_cpu_nanos();
                shared.handle_fault(fault, &mut staging);
                let spent = thread_cpu_nanos().saturating_sub(started);
                shared
                    .counters
                    .handler_cpu_nanos
                    .fetch_add(spent, Ordering::Relaxed);
            }
            Ok(None) => {}
            Err(error) => {
                tracing::error!(%error, "reading faults failed; handler stops");
                return;
            }
        }
    }
}

fn evictor_loop(shared: Arc<Shared>) {
    let mut staging = Staging(None);
    while !shared.should_stop() {
        let mut inner = shared.lock();
        if !inner.buffer.is_above_high_watermark() {
            drop(shared.changed.wait_timeout(inner, POLL_INTERVAL));
            continue;
        }
        let started = thread_cpu_nanos();
        let mut evicted = false;
        // Each pass evicts at least one chunk; resident chunks are finite.
        while inner.buffer.is_above_low_watermark() {
            let victims = inner.buffer.begin_evict_to_low_watermark(EVICTION_BATCH);
            if victims.is_empty() {
                break;
            }
            evicted = true;
            drop(inner);
            shared.evict(&victims, &mut staging);
            inner = shared.lock();
        }
        if !evicted {
            // Above the mark with nothing it may take (every chunk moving,
            // or the fault threads' own evictions under way): it waits
            // for a change, where it spun and fought them for the lock.
            drop(shared.changed.wait_timeout(inner, POLL_INTERVAL));
        } else {
            drop(inner);
        }
        let spent = thread_cpu_nanos().saturating_sub(started);
        shared
            .counters
            .evictor_cpu_nanos
            .fetch_add(spent, Ordering::Relaxed);
    }
}

/// The host side of SODA: allocates far-memory objects over one store.
pub struct FarMemory {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    config: FarMemoryConfig,
}

impl FarMemory {
    pub fn new(
        store: Arc<dyn ChunkStore>,
        config: FarMemoryConfig,
    ) -> Result<FarMemory, SodaError> {
        let watermarks_valid = 0.0 < config.low_watermark
            && config.low_watermark <= config.high_watermark
            && config.high_watermark <= 1.0;
        if !watermarks_valid {
            return Err(SodaError::Config(
                "watermarks must satisfy 0 < low <= high <= 1",
            ));
        }
        if config.fault_threads == 0 || config.fault_threads > 64 {
            return Err(SodaError::Config("fault_threads must be 1 to 64"));
        }
        let capacity = config.buffer_bytes;
        let buffer = HostBuffer::new(
            capacity,
            (capacity as f64 * config.high_watermark) as u64,
            (capacity as f64 * config.low_watermark) as u64,
        );
        let shared = Arc::new(Shared {
            userfault: Userfault::open()?,
            store,
            inner: Mutex::new(Inner {
                buffer,
                objects: BTreeMap::new(),
                addresses: HashMap::new(),
                next_id: 1,
                freed_ids: VecDeque::new(),
            }),
            changed: Condvar::new(),
            stopping: AtomicBool::new(false),
            counters: Counters::default(),
            latencies: Mutex::new(hdrhistogram::Histogram::new(3).expect("3 significant digits")),
        });
        let mut threads = Vec::new();
        for index in 0..config.fault_threads {
            let shared = Arc::clone(&shared);
            threads.push(spawn(format!("soda-fault-{index}"), move || {
                handler_loop(shared)
            }));
        }
        let evictor = Arc::clone(&shared);
        threads.push(spawn("soda-evictor".into(), move || evictor_loop(evictor)));
        Ok(FarMemory {
            shared,
            threads,
            config,
        })
    }

    pub fn store_name(&self) -> &'static str {
        self.shared.store.name()
    }

    /// An object of `bytes` with the default 64 KiB chunks, filled from
    /// `file` (loaded by the store) or zeroed.
    pub fn alloc(&self, bytes: usize, file: Option<&Path>) -> Result<FarObject, SodaError> {
        self.alloc_chunked(bytes, DEFAULT_CHUNK_BYTES, file)
    }

    pub fn alloc_chunked(
        &self,
        bytes: usize,
        chunk_bytes: usize,
        file: Option<&Path>,
    ) -> Result<FarObject, SodaError> {
        self.allocator().alloc_chunked(bytes, chunk_bytes, file)
    }

    /// A handle that allocates objects here from anywhere (the values of
    /// applications running on a placed graph); it refuses once this far
    /// memory is dropped.
    pub fn allocator(&self) -> FarAllocator {
        FarAllocator {
            shared: Arc::clone(&self.shared),
            buffer_bytes: self.config.buffer_bytes,
        }
    }

    pub fn stats(&self) -> FarMemoryStats {
        let counters = &self.shared.counters;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let latencies = self.shared.latencies.lock().expect("latency lock");
        FarMemoryStats {
            missing_faults: load(&counters.missing_faults),
            write_faults: load(&counters.write_faults),
            fetched_bytes: load(&counters.fetched_bytes),
            written_back_bytes: load(&counters.written_back_bytes),
            evictions: load(&counters.evictions),
            failed_fetches: load(&counters.failed_fetches),
            install_shortages: load(&counters.install_shortages),
            handler_cpu_nanos: load(&counters.handler_cpu_nanos),
            evictor_cpu_nanos: load(&counters.evictor_cpu_nanos),
            fault_p50_nanos: latencies.value_at_quantile(0.5),
            fault_p99_nanos: latencies.value_at_quantile(0.99),
        }
    }

    /// Bytes the host buffer holds now.
    pub fn buffer_occupied_bytes(&self) -> u64 {
        self.shared.lock().buffer.occupied_bytes()
    }
}

fn spawn(name: String, work: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name(name)
        .spawn(work)
        .expect("spawning a far-memory thread")
}

impl Drop for FarMemory {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        self.shared.changed.notify_all();
        // Objects that outlive this handle keep the threads serving them;
        // the threads end when the last object is freed.
        if self.shared.lock().objects.is_empty() {
            for thread in self.threads.drain(..) {
                let _ = thread.join();
            }
        }
    }
}

/// Allocates objects in a [`FarMemory`]: see [`FarMemory::allocator`].
#[derive(Clone)]
pub struct FarAllocator {
    shared: Arc<Shared>,
    buffer_bytes: u64,
}

impl FarAllocator {
    pub fn alloc_chunked(
        &self,
        bytes: usize,
        chunk_bytes: usize,
        file: Option<&Path>,
    ) -> Result<FarObject, SodaError> {
        if self.shared.stopping.load(Ordering::Relaxed) {
            return Err(SodaError::Closed);
        }
        let chunk_valid = chunk_bytes >= MIN_CHUNK_BYTES
            && chunk_bytes.is_multiple_of(mapping::PAGE_BYTES)
            && chunk_bytes as u64 <= self.buffer_bytes;
        if !chunk_valid {
            return Err(SodaError::ChunkSize(chunk_bytes));
        }
        // Chunks are numbered in 32 bits: chunk i and i + 2^32 would share
        // one key (one state, one fetch offset). A size whose rounding up
        // overflows is past that too (it panicked, or in release wrapped
        // to a small mapping the object's length overran; found by
        // reading).
        let length = bytes
            .max(1)
            .checked_next_multiple_of(chunk_bytes)
            .filter(|length| length / chunk_bytes <= u32::MAX as usize)
            .ok_or(SodaError::TooManyChunks { bytes, chunk_bytes })?;
        let mapping = Mapping::new(length).map_err(|errno| SodaError::Map {
            bytes: length,
            errno,
        })?;
        let id = self.shared.take_id()?;
        if let Err(error) = self.shared.store.reserve(id, length as u64, file) {
            // Refused, the store holds nothing of it; named again only if
            // the store could ever take it (not an id past its range).
            if self.shared.store.is_released(id) {
                self.shared.give_back_id(id);
            }
            return Err(error.into());
        }
        if let Err(error) = self.shared.userfault.register(mapping.address(), length) {
            self.shared.release_id(id);
            return Err(error.into());
        }
        let info = ObjectInfo {
            id,
            address: mapping.address(),
            length,
            chunk_bytes,
            lost: None,
        };
        let mut inner = self.shared.lock();
        // Checked again under the lock the far memory's drop takes to see
        // whether objects remain: its threads then either serve this
        // object or were never going to.
        if self.shared.stopping.load(Ordering::Relaxed) {
            drop(inner);
            let _ = self.shared.userfault.unregister(mapping.address(), length);
            self.shared.release_id(id);
            return Err(SodaError::Closed);
        }
        inner.addresses.insert(id, info.address);
        inner.objects.insert(info.address, info);
        Ok(FarObject {
            shared: Arc::clone(&self.shared),
            mapping: Some(mapping),
            id,
            bytes,
            chunk_bytes,
        })
    }
}

/// A far-memory object: plain memory to the application. Freed on drop;
/// ownership makes use after free impossible in safe code.
pub struct FarObject {
    shared: Arc<Shared>,
    mapping: Option<Mapping>,
    id: ObjectId,
    /// What was asked for; the mapping is rounded up to whole chunks.
    bytes: usize,
    chunk_bytes: usize,
}

impl FarObject {
    pub fn id(&self) -> ObjectId {
        self.id
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    pub fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    fn mapping(&self) -> &Mapping {
        self.mapping.as_ref().expect("live until freed")
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.mapping().as_slice()[..self.bytes]
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        let bytes = self.bytes;
        &mut self
            .mapping
            .as_mut()
            .expect("live until freed")
            .as_mut_slice()[..bytes]
    }

    /// The object seen only as atomic words from now on (its length
    /// rounded down to whole words), for values threads update in place.
    /// It takes the object, so no byte view of it can be alive beside the
    /// words: both through `&self`, as they once were, safe code could
    /// store through a word under a live `&[u8]` (found by reading).
    pub fn into_words<W: mapping::AtomicWord>(self) -> FarWords<W> {
        FarWords {
            object: self,
            word: std::marker::PhantomData,
        }
    }

    /// The object as `T`s.
    pub fn as_slice<T: bytemuck::Pod>(&self) -> Result<&[T], SodaError> {
        bytemuck::try_cast_slice(self.as_bytes()).map_err(|_| SodaError::Misaligned {
            bytes: self.bytes,
            element: std::mem::size_of::<T>(),
        })
    }

    pub fn as_mut_slice<T: bytemuck::Pod>(&mut self) -> Result<&mut [T], SodaError> {
        let bytes = self.bytes;
        bytemuck::try_cast_slice_mut(self.as_bytes_mut()).map_err(|_| SodaError::Misaligned {
            bytes,
            element: std::mem::size_of::<T>(),
        })
    }

    /// `Err(Lost)` once a chunk of this object could not be fetched or
    /// written back: its contents are gone, and touching the missing part
    /// raises SIGBUS.
    pub fn check(&self) -> Result<(), SodaError> {
        let inner = self.shared.lock();
        match inner.info(self.id).and_then(|info| info.lost.clone()) {
            Some(reason) => Err(SodaError::Lost {
                object: self.id,
                reason,
            }),
            None => Ok(()),
        }
    }

    /// Tells the store what the object is for (pin it in the DPU's static
    /// cache, or cache it dynamically).
    pub fn advise(&self, advice: crate::store::Advice) -> Result<(), SodaError> {
        Ok(self.shared.store.advise(self.id, advice)?)
    }

    /// Frees the object and its space in the store.
    pub fn free(mut self) -> Result<(), SodaError> {
        self.release()
    }

    fn release(&mut self) -> Result<(), SodaError> {
        let Some(mapping) = self.mapping.take() else {
            return Ok(());
        };
        let mut inner = self.shared.lock();
        // Moving chunks finish in finite time; then none can start, since
        // nothing can touch the object any more.
        while inner.buffer.is_busy(self.id) {
            inner = self
                .shared
                .changed
                .wait(inner)
                .expect("far-memory state lock");
        }
        inner.buffer.remove_object(self.id);
        inner.objects.remove(&mapping.address());
        inner.addresses.remove(&self.id);
        drop(inner);
        self.shared.changed.notify_all();
        let unregistered = self
            .shared
            .userfault
            .unregister(mapping.address(), mapping.len());
        // Unmapping ends the registration whatever UFFDIO_UNREGISTER said,
        // so the object's far storage and id go back even if it failed:
        // returning first kept them for good.
        drop(mapping);
        self.shared.store.release(self.id)?;
        self.shared.give_back_id(self.id);
        unregistered.map_err(SodaError::from)
    }
}

/// A far-memory object seen only as atomic words ([`FarObject::into_words`]).
pub struct FarWords<W> {
    object: FarObject,
    word: std::marker::PhantomData<W>,
}

impl<W: mapping::AtomicWord> FarWords<W> {
    pub fn words(&self) -> &[W] {
        let count = self.object.bytes / std::mem::size_of::<W>();
        // SAFETY: the object is reachable only through this handle, which
        // offers no view of its bytes as plain bytes.
        let words = unsafe { self.object.mapping().as_atomics::<W>() };
        &words[..count]
    }

    /// Whether the object is lost ([`FarObject::check`]).
    pub fn check(&self) -> Result<(), SodaError> {
        self.object.check()
    }

    /// Releases the object and its remote space ([`FarObject::free`]).
    pub fn free(self) -> Result<(), SodaError> {
        self.object.free()
    }
}

impl<W: mapping::AtomicWord> AsRef<[W]> for FarWords<W> {
    fn as_ref(&self) -> &[W] {
        self.words()
    }
}

impl Drop for FarObject {
    fn drop(&mut self) {
        if let Err(error) = self.release() {
            tracing::error!(object = self.id.0, %error, "freeing a far-memory object failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::InProcessStore;
    use crate::userfault::INJECTED_SHORTAGES;

    /// Set in a child process that runs one scenario (it may die of SIGBUS).
    const CHILD: &str = "REMORA_SODA_SHORTAGE_CHILD";
    const CHUNK_BYTES: usize = 64 << 10;
    const SIGBUS: i32 = 7;

    /// Writes a pattern over eight chunks through a buffer of four, so the
    /// first ones are written back and dropped; then arms `shortages`
    /// installs refused for lack of memory and reads the pattern back.
    fn read_back_under_shortage(shortages: u32) {
        let (memory, object) = evicted_pattern();
        let pattern = pattern_of(object.len());
        INJECTED_SHORTAGES.store(shortages, Ordering::Relaxed);
        assert!(object.as_bytes() == &pattern[..], "read back other bytes");
        object.check().unwrap();
        assert_eq!(memory.stats().install_shortages, u64::from(shortages));
    }

    fn pattern_of(length: usize) -> Vec<u8> {
        (0..length).map(|index| (index * 7 % 251) as u8).collect()
    }

    /// An object of eight chunks holding [`pattern_of`], written through a
    /// buffer of four: its first chunks are written back and dropped.
    fn evicted_pattern() -> (FarMemory, FarObject) {
        let config = FarMemoryConfig {
            buffer_bytes: 4 * CHUNK_BYTES as u64,
            high_watermark: 0.75,
            low_watermark: 0.5,
            fault_threads: 2,
        };
        let memory = FarMemory::new(Arc::new(InProcessStore::default()), config).unwrap();
        let length = 8 * CHUNK_BYTES;
        let mut object = memory.alloc_chunked(length, CHUNK_BYTES, None).unwrap();
        object.as_bytes_mut().copy_from_slice(&pattern_of(length));
        (memory, object)
    }

    /// Runs test `name` of this binary in a child with [`CHILD`] set.
    fn in_child(name: &str) -> crate::child_test::ChildRun {
        crate::child_test::run_test_in_child(name, CHILD, Duration::from_secs(30))
    }

    /// An install the kernel refused for lack of memory (a memory cgroup
    /// at its limit) marked its object lost, though the store held the
    /// data: the read died of SIGBUS. A shortage that passes is waited out.
    #[test]
    fn an_install_refused_for_lack_of_memory_is_tried_again_not_lost() {
        if std::env::var_os(CHILD).is_some() {
            read_back_under_shortage(3);
            return;
        }
        let run =
            in_child("far::tests::an_install_refused_for_lack_of_memory_is_tried_again_not_lost");
        assert!(run.status.success(), "the child failed: {run:?}");
    }

    /// A copy a shortage cut short had installed the chunk's first page,
    /// write-protected, when the object was lost; poisoning skipped that
    /// page, and a later write to it faulted, was woken and faulted again
    /// for ever (found by reading). The whole chunk is poisoned now: the
    /// write dies of SIGBUS.
    #[test]
    fn a_chunk_half_installed_when_its_object_is_lost_is_poisoned_whole() {
        if std::env::var_os(CHILD).is_some() {
            let (_memory, mut object) = evicted_pattern();
            // The later chunks touched last: the first is surely evicted.
            for chunk in 1..8 {
                std::hint::black_box(object.as_bytes()[chunk * CHUNK_BYTES]);
            }
            crate::userfault::INJECTED_PARTIAL_COPY.store(true, Ordering::Relaxed);
            INJECTED_SHORTAGES.store(u32::MAX, Ordering::Relaxed);
            // A read fault: the first page goes in write-protected (and
            // the kernel wakes the reader on it), then the shortage lasts
            // and the object is lost; then a write to that page.
            let first = object.as_bytes()[0];
            std::thread::sleep(SHORTAGE_PATIENCE + Duration::from_millis(500));
            object.as_bytes_mut()[0] = first ^ 1;
            return;
        }
        use std::os::unix::process::ExitStatusExt;
        let run = in_child(
            "far::tests::a_chunk_half_installed_when_its_object_is_lost_is_poisoned_whole",
        );
        assert_eq!(run.status.signal(), Some(SIGBUS), "{run:?}");
    }

    /// A shortage that does not pass is waited out for a bounded time
    /// only: then the object is lost (a SIGBUS), not a hang.
    #[test]
    fn a_shortage_that_lasts_loses_the_object_after_a_bounded_wait() {
        if std::env::var_os(CHILD).is_some() {
            read_back_under_shortage(u32::MAX);
            return;
        }
        use std::os::unix::process::ExitStatusExt;
        let started = Instant::now();
        let run =
            in_child("far::tests::a_shortage_that_lasts_loses_the_object_after_a_bounded_wait");
        assert_eq!(run.status.signal(), Some(SIGBUS), "{run:?}");
        assert!(started.elapsed() >= SHORTAGE_PATIENCE);
    }
}
