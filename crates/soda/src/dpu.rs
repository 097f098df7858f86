//! The DPU agent: a SmartNIC beside the compute node that takes the host's
//! two-sided requests (Table I, SEND_WITH_IMM into a shared receive
//! queue), forwards them to the memory node, and replies by SEND from its
//! own registered buffers, zero-copy.
//!
//! Two pipeline agents share the DPU's state, as in §IV: the receiver
//! takes requests, looks them up and issues them; the stager polls the
//! memory node and stages data back to the host. With aggregation, every
//! request received in a turn is issued in that turn (one doorbell for
//! the batch); without it, one per turn. With asynchronous forwarding,
//! many forwards are in flight; without it, one at a time (the "DPU
//! base" of §VI). Both agents run on the DPU host's CPU of the rack,
//! which reports their busy time apart from the compute node's.
//!
//! A write returns as soon as the DPU holds the data: the DPU acknowledges
//! it, then writes it to the memory node from the receive buffer. Every
//! reply carries, in its immediate data, how many of that queue pair's
//! writes have reached the memory node, so the host knows which writes a
//! DPU crash would lose.

use crate::cache::{
    CacheMode, CacheTable, DynamicCacheConfig, EntryKey, Lookup, RecentList, StaticSpace,
};
use remora_base::Timestamp;
use remora_host::{Agent, AgentError, Progress};
use remora_rnic::{
    CompletionOpcode, CompletionQueue, CompletionStatus, MemoryRegion, QueuePair, ReceiveRequest,
    ScatterGatherElement, SendOperation, SendRequest, SharedReceiveQueue, Verbs, WorkCompletion,
};
use remora_wire::soda::{RegionId, SodaRequestRepr};
use remora_wire::{Qpn, VirtAddr};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

/// The immediate data of a reply: this bit set is an error.
pub const REPLY_ERROR: u32 = 1 << 31;
/// Whether write number `index` (mod 2^31, as [`PERSISTED_MASK`] keeps
/// both) is covered by a reply's `persisted` count: within half the space
/// behind it. A plain `index <= persisted` took write 0 after the wrap for
/// persisted (as 2^31 - 1 is above it), while the DPU still held it.
pub fn is_persisted(index: u32, persisted: u32) -> bool {
    let behind = persisted.wrapping_sub(index) & PERSISTED_MASK;
    behind <= PERSISTED_MASK / 2
}

/// The low bits: the queue pair's writes persisted so far (mod 2^31).
pub const PERSISTED_MASK: u32 = REPLY_ERROR - 1;
/// Completions each agent takes per turn.
const COMPLETIONS_PER_TURN: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DpuConfig {
    pub aggregation: bool,
    pub async_forwarding: bool,
    /// Receive buffers in the shared receive queue: requests in flight.
    pub receive_slots: usize,
    /// Staging buffers for data coming back from the memory node.
    pub staging_slots: usize,
    pub chunk_bytes: usize,
    /// The dynamic cache for regions the host routes through the DPU.
    pub dynamic: Option<DynamicCacheConfig>,
    /// Bytes of the static cache (pinned objects).
    pub static_bytes: u64,
}

impl DpuConfig {
    /// Refuses a config no DPU can run: it took a dynamic cache of 0-byte
    /// entries, and divided by zero (a panic) as the DPU started.
    pub fn check(&self) -> Result<(), DpuError> {
        if self.receive_slots == 0 || self.staging_slots == 0 {
            return Err(DpuError::Config(
                "a DPU needs at least one receive slot and one staging slot",
            ));
        }
        if self.chunk_bytes == 0 {
            return Err(DpuError::Config("chunks are at least one byte"));
        }
        if let Some(dynamic) = self.dynamic {
            if dynamic.entry_bytes == 0 || dynamic.capacity_bytes < dynamic.entry_bytes as u64 {
                return Err(DpuError::Config(
                    "the dynamic cache holds at least one entry of at least one byte",
                ));
            }
        }
        Ok(())
    }

    /// §VI's "DPU base": every request forwarded alone, one at a time.
    pub fn base(chunk_bytes: usize) -> DpuConfig {
        DpuConfig {
            aggregation: false,
            async_forwarding: false,
            receive_slots: 16,
            staging_slots: 1,
            chunk_bytes,
            dynamic: None,
            static_bytes: 0,
        }
    }

    /// Aggregation and asynchronous forwarding.
    pub fn optimized(chunk_bytes: usize) -> DpuConfig {
        DpuConfig {
            aggregation: true,
            async_forwarding: true,
            receive_slots: 64,
            staging_slots: 16,
            chunk_bytes,
            dynamic: None,
            static_bytes: 0,
        }
    }

    /// Bytes of one receive buffer: a write request's header and a chunk.
    pub fn receive_slot_bytes(&self) -> usize {
        self.chunk_bytes + remora_rack::channel::HEADER_ROOM
    }
}

/// What deployment made on the DPU's NIC.
#[derive(Debug, Clone, Copy)]
pub struct DpuResources {
    pub host_completion_queue: CompletionQueue,
    pub memory_completion_queue: CompletionQueue,
    pub shared_receive_queue: SharedReceiveQueue,
    pub memory_queue_pair: QueuePair,
    pub receive_region: MemoryRegion,
    pub staging_region: MemoryRegion,
    /// The memory node's pool, as the DPU reaches it.
    pub pool: MemoryRegion,
    /// The dynamic cache's entries, when configured.
    pub cache_region: Option<MemoryRegion>,
    /// The static cache, which the host reads and writes one-sided.
    pub static_region: MemoryRegion,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DpuCounters {
    pub read_requests: u64,
    pub write_requests: u64,
    pub refused_requests: u64,
    /// Bytes fetched from the memory node for requests (the critical path).
    pub on_demand_bytes: u64,
    /// Bytes written to the memory node.
    pub written_bytes: u64,
    /// Largest number of forwards in flight at once.
    pub most_in_flight: u64,
    /// Dynamic cache lookups and hits (a hit is a request served from an
    /// entry, ready or being prefetched).
    pub lookups: u64,
    pub hits: u64,
    /// Reads that straddle two cache entries: served by the memory node.
    pub straddling_reads: u64,
    /// Bytes prefetched from the memory node (off the critical path).
    pub background_bytes: u64,
    /// Bytes loaded into and flushed from the static cache.
    pub static_bytes: u64,
    /// The dynamic cache was turned off by `auto` (hit rate under the
    /// Eq. 3 threshold).
    pub dynamic_disabled: bool,
}

#[derive(Debug, Clone, Copy)]
enum Request {
    Read {
        qpn: Qpn,
        slot: u32,
        at: u64,
        size: u32,
        region: RegionId,
        page_offset: u64,
    },
    Write {
        qpn: Qpn,
        slot: u32,
        at: u64,
        size: u32,
        region: RegionId,
    },
    Refused {
        qpn: Qpn,
        slot: u32,
    },
}

#[derive(Debug, Clone, Copy)]
enum Forward {
    Read {
        qpn: Qpn,
        slot: u32,
        staging: u32,
        size: u32,
    },
    Write {
        qpn: Qpn,
        slot: u32,
        size: u32,
    },
    Prefetch {
        entry: usize,
        bytes: u32,
    },
    Static {
        region: RegionId,
        static_at: u64,
        bytes: u32,
    },
}

/// A request waiting for an entry being prefetched.
#[derive(Debug, Clone, Copy)]
struct Waiter {
    qpn: Qpn,
    slot: u32,
    at: u64,
    size: u32,
    within: u64,
}

/// Static cache contents by region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StaticState {
    Loading { pieces_left: u32 },
    Ready,
    Flushing { pieces_left: u32 },
}

#[derive(Debug, Clone, Copy)]
struct StaticEntry {
    offset: u64,
    length: u64,
    state: StaticState,
}

/// A piece of static-cache work: load (memory → DPU) or flush.
#[derive(Debug, Clone, Copy)]
struct StaticJob {
    region: RegionId,
    memory_at: u64,
    static_at: u64,
    bytes: u32,
    flush: bool,
}

/// The dynamic cache's state.
struct DynamicCache {
    config: DynamicCacheConfig,
    table: CacheTable,
    recent: RecentList,
    seen: u64,
    waiters: HashMap<usize, Vec<Waiter>>,
    enabled: bool,
    /// Regions written since they were cached: never cached again.
    uncacheable: std::collections::HashSet<RegionId>,
    prefetches_in_flight: usize,
    /// B_net / B_intra, measured at start-up; `auto` needs it.
    threshold: Option<f64>,
}

/// Lookups before `auto` judges the hit rate.
const AUTO_WARM_UP_LOOKUPS: u64 = 2048;
/// Prefetches and static pieces in flight at once.
const BACKGROUND_IN_FLIGHT: usize = 8;
/// The largest static-cache transfer.
const STATIC_PIECE_BYTES: u64 = 1 << 20;

/// Work request ids: a kind in the high half, a slot in the low half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WorkKind {
    Receive = 1,
    MemoryRead = 2,
    MemoryWrite = 3,
    DataReply = 4,
    Acknowledgement = 5,
    CacheReply = 6,
    Background = 7,
}

fn work_id(kind: WorkKind, slot: u32) -> u64 {
    (kind as u64) << 32 | u64::from(slot)
}

fn work_kind(id: u64) -> (Option<WorkKind>, u32) {
    let kind = match id >> 32 {
        1 => Some(WorkKind::Receive),
        2 => Some(WorkKind::MemoryRead),
        3 => Some(WorkKind::MemoryWrite),
        4 => Some(WorkKind::DataReply),
        5 => Some(WorkKind::Acknowledgement),
        6 => Some(WorkKind::CacheReply),
        7 => Some(WorkKind::Background),
        _ => None,
    };
    (kind, id as u32)
}

#[derive(Debug, thiserror::Error)]
pub enum DpuError {
    #[error("a completion with unknown work request id {0:#x}")]
    UnknownWork(u64),
    #[error("the memory node failed a forward: {0:?}")]
    Memory(CompletionStatus),
    #[error("the static cache has {free} bytes free, {wanted} wanted")]
    StaticFull { wanted: u64, free: u64 },
    #[error("region {0:?} is not known to the DPU")]
    UnknownRegion(RegionId),
    #[error("DPU config: {0}")]
    Config(&'static str),
}

/// The DPU's state, shared by its two agents and its control plane.
pub struct DpuState {
    config: DpuConfig,
    resources: DpuResources,
    regions: HashMap<RegionId, (u64, u64)>,
    requests: VecDeque<Request>,
    free_staging: Vec<u32>,
    in_flight: HashMap<u64, Forward>,
    next_forward: u64,
    persisted: HashMap<Qpn, u32>,
    counters: DpuCounters,
    /// Receive buffers posted at start-up (again after a restart).
    receives_posted: bool,
    cache: Option<DynamicCache>,
    static_space: StaticSpace,
    statics: HashMap<RegionId, StaticEntry>,
    static_jobs: VecDeque<StaticJob>,
    background_in_flight: usize,
    /// Requests already looked up in the cache (a miss waiting for a
    /// staging buffer is not counted twice).
    looked_up: std::collections::HashSet<(Qpn, u32)>,
    /// Static copies taken out of the cache with pieces still in flight.
    retired_statics: Vec<(RegionId, StaticEntry)>,
    crashes: u64,
    /// Agent turns that failed, each taking the DPU down (`fail_stop`).
    failures: u64,
}

impl DpuState {
    pub fn new(config: DpuConfig, resources: DpuResources) -> DpuState {
        DpuState {
            config,
            resources,
            regions: HashMap::new(),
            requests: VecDeque::new(),
            free_staging: (0..config.staging_slots as u32).collect(),
            in_flight: HashMap::new(),
            next_forward: 0,
            persisted: HashMap::new(),
            counters: DpuCounters::default(),
            receives_posted: false,
            cache: config.dynamic.map(|dynamic| DynamicCache {
                config: dynamic,
                table: CacheTable::new(
                    (dynamic.capacity_bytes / dynamic.entry_bytes as u64) as usize,
                    0x50da,
                ),
                recent: RecentList::default(),
                seen: 0,
                waiters: HashMap::new(),
                enabled: dynamic.mode != CacheMode::Off,
                uncacheable: Default::default(),
                prefetches_in_flight: 0,
                threshold: None,
            }),
            static_space: StaticSpace::new(config.static_bytes),
            statics: HashMap::new(),
            static_jobs: VecDeque::new(),
            background_in_flight: 0,
            looked_up: Default::default(),
            retired_statics: Vec::new(),
            crashes: 0,
            failures: 0,
        }
    }

    /// Eq. 3's threshold, B_net / B_intra, measured by the host.
    pub fn set_threshold(&mut self, threshold: f64) {
        if let Some(cache) = &mut self.cache {
            cache.threshold = Some(threshold);
        }
    }

    /// Control plane: load `region` into the static cache. Returns where.
    pub fn begin_pin(&mut self, region: RegionId) -> Result<u64, DpuError> {
        let &(memory_offset, length) = self
            .regions
            .get(&region)
            .ok_or(DpuError::UnknownRegion(region))?;
        if let Some(entry) = self.statics.get(&region) {
            return Ok(entry.offset);
        }
        let offset = self
            .static_space
            .allocate(length)
            .ok_or(DpuError::StaticFull {
                wanted: length,
                free: self.static_space.largest_free_bytes(),
            })?;
        let pieces = self.queue_static(region, memory_offset, offset, length, false);
        // An empty region has nothing to load: no piece would ever say so.
        let state = match pieces {
            0 => StaticState::Ready,
            _ => StaticState::Loading {
                pieces_left: pieces,
            },
        };
        self.statics.insert(
            region,
            StaticEntry {
                offset,
                length,
                state,
            },
        );
        Ok(offset)
    }

    /// Control plane: `region` starts its way out of the static cache, its
    /// copy written to the memory node first if `flush`; whether the cache
    /// held it. Its space comes back once it is out.
    pub fn begin_unpin(&mut self, region: RegionId, flush: bool) -> bool {
        let Some(entry) = self.statics.get(&region).copied() else {
            return false;
        };
        // Writes while pinned went to the static copy only: what the
        // dynamic cache held of the region from before is stale.
        if let Some(cache) = &mut self.cache {
            cache.table.forget_region(region);
        }
        let memory_offset = self.regions.get(&region).map(|&(offset, _)| offset);
        match (flush, memory_offset) {
            // An empty copy has nothing to flush: no piece would ever say
            // it was done, and the unpin waited out its deadline.
            (true, Some(memory_offset)) if entry.length > 0 => {
                let pieces =
                    self.queue_static(region, memory_offset, entry.offset, entry.length, true);
                let state = StaticState::Flushing {
                    pieces_left: pieces,
                };
                self.statics.insert(region, StaticEntry { state, ..entry });
            }
            _ => self.remove_static(region),
        }
        true
    }

    /// How many times the DPU crashed: what it held before a crash (its
    /// static copies among it) is gone.
    pub fn crashes(&self) -> u64 {
        self.crashes
    }

    /// Agent turns that failed and took the DPU down with them.
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// Whether flush pieces of `region`'s static copy, which write into its
    /// room on the memory node, are queued or in flight, its entry kept or
    /// retired. (A load's pieces only read the room.)
    pub fn has_flush_pieces_in_flight(&self, region: RegionId) -> bool {
        let busy = |state: &StaticState| matches!(state, StaticState::Flushing { pieces_left } if *pieces_left > 0);
        self.statics
            .get(&region)
            .is_some_and(|entry| busy(&entry.state))
            || self
                .retired_statics
                .iter()
                .any(|(retired, entry)| *retired == region && busy(&entry.state))
    }

    /// Pieces of `region`'s static copy posted to the memory node and not
    /// yet done (queued ones not counted).
    pub fn static_pieces_posted(&self, region: RegionId) -> u32 {
        let left = match self.statics.get(&region).map(|entry| entry.state) {
            Some(StaticState::Loading { pieces_left } | StaticState::Flushing { pieces_left }) => {
                pieces_left
            }
            _ => 0,
        };
        let queued = self
            .static_jobs
            .iter()
            .filter(|job| job.region == region)
            .count() as u32;
        left.saturating_sub(queued)
    }

    /// The static cache's state for `region`; `None` once gone.
    pub fn static_state(&self, region: RegionId) -> Option<StaticState> {
        self.statics.get(&region).map(|entry| entry.state)
    }

    fn queue_static(
        &mut self,
        region: RegionId,
        memory_at: u64,
        static_at: u64,
        length: u64,
        flush: bool,
    ) -> u32 {
        let mut pieces = 0;
        let mut done = 0;
        while done < length {
            let bytes = (length - done).min(STATIC_PIECE_BYTES) as u32;
            self.static_jobs.push_back(StaticJob {
                region,
                memory_at: memory_at + done,
                static_at: static_at + done,
                bytes,
                flush,
            });
            done += u64::from(bytes);
            pieces += 1;
        }
        pieces
    }

    /// Control plane: the host tells the DPU where a region lives on the
    /// memory node.
    pub fn register_region(&mut self, region: RegionId, memory_offset: u64, length: u64) {
        self.regions.insert(region, (memory_offset, length));
    }

    /// Control plane: the region is freed. Its id may name another object
    /// later, which starts cacheable: kept uncacheable, a read-mostly
    /// object given the id of one written through the DPU was never
    /// cached.
    pub fn forget_region(&mut self, region: RegionId) {
        self.regions.remove(&region);
        self.remove_static(region);
        if let Some(cache) = &mut self.cache {
            cache.table.forget_region(region);
            cache.uncacheable.remove(&region);
        }
    }

    pub fn has_dynamic_cache(&self) -> bool {
        self.cache.is_some()
    }

    pub fn static_region(&self) -> MemoryRegion {
        self.resources.static_region
    }

    pub fn counters(&self) -> DpuCounters {
        self.counters
    }

    fn post_receives(&mut self, nic: &mut dyn Verbs) -> Result<(), AgentError> {
        for slot in 0..self.config.receive_slots as u32 {
            self.repost(nic, slot)?;
        }
        self.receives_posted = true;
        Ok(())
    }

    fn repost(&mut self, nic: &mut dyn Verbs, slot: u32) -> Result<(), AgentError> {
        let bytes = self.config.receive_slot_bytes();
        let local = self
            .resources
            .receive_region
            .slice(u64::from(slot) * bytes as u64, bytes as u32);
        let request = ReceiveRequest::new(work_id(WorkKind::Receive, slot), &[local])?;
        nic.post_shared_receive(self.resources.shared_receive_queue, request)?;
        Ok(())
    }

    /// Where `size` bytes at `page_offset` of `region` live in the pool.
    fn locate(&self, region: RegionId, page_offset: u64, size: u32) -> Option<u64> {
        let &(start, length) = self.regions.get(&region)?;
        let end = page_offset.checked_add(u64::from(size))?;
        let fits = end <= length && size as usize <= self.config.chunk_bytes;
        fits.then_some(start + page_offset)
    }

    fn take_request(
        &mut self,
        nic: &mut dyn Verbs,
        completion: &WorkCompletion,
    ) -> Result<(), AgentError> {
        let (_, slot) = work_kind(completion.work_request_id);
        let bytes = self.config.receive_slot_bytes();
        let mut payload = vec![0u8; (completion.byte_len as usize).min(bytes)];
        let address = self.resources.receive_region.address.0 + u64::from(slot) * bytes as u64;
        nic.read_local(
            self.resources.receive_region.lkey,
            VirtAddr(address),
            &mut payload,
        )?;
        let qpn = completion.qpn;
        let request = match completion
            .immediate
            .map(|immediate| SodaRequestRepr::parse(immediate, &payload))
        {
            Some(Ok(SodaRequestRepr::Read(read))) => {
                match self.locate(read.region, read.page_offset, read.size) {
                    Some(at) => Request::Read {
                        qpn,
                        slot,
                        at,
                        size: read.size,
                        region: read.region,
                        page_offset: read.page_offset,
                    },
                    None => Request::Refused { qpn, slot },
                }
            }
            Some(Ok(SodaRequestRepr::Write(write))) => {
                let size = write.data.len() as u32;
                match self.locate(write.region, write.page_offset, size) {
                    Some(at) => Request::Write {
                        qpn,
                        slot,
                        at,
                        size,
                        region: write.region,
                    },
                    None => Request::Refused { qpn, slot },
                }
            }
            // A malformed request is refused, never a panic.
            _ => Request::Refused { qpn, slot },
        };
        self.requests.push_back(request);
        Ok(())
    }

    fn reply_immediate(&self, qpn: Qpn, error: bool) -> u32 {
        let persisted = self.persisted.get(&qpn).copied().unwrap_or(0) & PERSISTED_MASK;
        if error {
            persisted | REPLY_ERROR
        } else {
            persisted
        }
    }

    fn send_reply(
        &mut self,
        nic: &mut dyn Verbs,
        qpn: Qpn,
        kind: WorkKind,
        slot: u32,
        data: Option<ScatterGatherElement>,
        error: bool,
    ) -> Result<(), AgentError> {
        let immediate = Some(self.reply_immediate(qpn, error));
        let local: Vec<_> = data.into_iter().collect();
        let request = SendRequest::new(
            work_id(kind, slot),
            SendOperation::Send { immediate },
            &local,
        )?;
        nic.post_send(QueuePair(qpn), request)?;
        Ok(())
    }

    fn staging(&self, staging: u32, size: u32) -> ScatterGatherElement {
        let offset = u64::from(staging) * self.config.chunk_bytes as u64;
        self.resources.staging_region.slice(offset, size)
    }

    /// Replies from a ready cache entry, zero-copy.
    fn reply_from_cache(
        &mut self,
        nic: &mut dyn Verbs,
        waiter: Waiter,
        entry: usize,
    ) -> Result<(), AgentError> {
        let (region, entry_bytes) = {
            let cache = self.cache.as_mut().expect("a cache reply has a cache");
            cache.table.acquire(entry);
            (
                self.resources.cache_region.expect("a cache has a region"),
                cache.config.entry_bytes as u64,
            )
        };
        let local = region.slice(entry as u64 * entry_bytes + waiter.within, waiter.size);
        self.repost(nic, waiter.slot)?;
        self.send_reply(
            nic,
            waiter.qpn,
            WorkKind::CacheReply,
            entry as u32,
            Some(local),
            false,
        )
    }

    /// A read of a region the host routes through the DPU: served from the
    /// dynamic cache when it holds (or is fetching) the entry. Returns
    /// false for a miss, which goes to the memory node on demand.
    fn try_cache(
        &mut self,
        nic: &mut dyn Verbs,
        waiter: Waiter,
        region: RegionId,
        page_offset: u64,
    ) -> Result<bool, AgentError> {
        let Some(cache) = self.cache.as_mut() else {
            return Ok(false);
        };
        if !cache.enabled || cache.uncacheable.contains(&region) {
            return Ok(false);
        }
        let entry_bytes = cache.config.entry_bytes as u64;
        let key = EntryKey {
            region,
            entry: page_offset / entry_bytes,
        };
        let waiter = Waiter {
            within: page_offset % entry_bytes,
            ..waiter
        };
        if waiter.within + u64::from(waiter.size) > entry_bytes {
            // Straddles two entries: one entry's slot cannot answer it (the
            // reply would run into the next slot, another key's bytes), so
            // the memory node does.
            self.counters.straddling_reads += 1;
            return Ok(false);
        }
        cache.recent.push(key);
        self.counters.lookups += 1;
        let lookup = cache.table.lookup(key);
        let hit = lookup != Lookup::Absent;
        if hit {
            self.counters.hits += 1;
        }
        match lookup {
            Lookup::Ready(entry) => self.reply_from_cache(nic, waiter, entry)?,
            Lookup::Filling(entry) => cache.waiters.entry(entry).or_default().push(waiter),
            Lookup::Absent => {}
        }
        self.judge_cache();
        Ok(hit)
    }

    /// `auto`: after a warm-up, caching that does not pay (h below
    /// B_net / B_intra, Eq. 3) is turned off.
    fn judge_cache(&mut self) {
        let Some(cache) = self.cache.as_mut() else {
            return;
        };
        let (Some(threshold), CacheMode::Auto) = (cache.threshold, cache.config.mode) else {
            return;
        };
        if cache.enabled && self.counters.lookups == AUTO_WARM_UP_LOOKUPS {
            let hit_rate = self.counters.hits as f64 / self.counters.lookups as f64;
            if hit_rate <= threshold {
                cache.enabled = false;
                self.counters.dynamic_disabled = true;
            }
        }
    }

    /// Issues one request; false when it must wait (no staging buffer, or
    /// a forward in flight without asynchronous forwarding).
    fn issue(&mut self, nic: &mut dyn Verbs, request: Request) -> Result<bool, AgentError> {
        if let Request::Read {
            qpn,
            slot,
            at,
            size,
            region,
            page_offset,
        } = request
        {
            let waiter = Waiter {
                qpn,
                slot,
                at,
                size,
                within: 0,
            };
            // Looked up once: a miss waiting for a staging buffer is not a
            // second lookup.
            if self.looked_up.insert((qpn, slot))
                && self.try_cache(nic, waiter, region, page_offset)?
            {
                self.looked_up.remove(&(qpn, slot));
                return Ok(true);
            }
        }
        if !self.config.async_forwarding && !self.in_flight.is_empty() {
            return Ok(false);
        }
        match request {
            Request::Refused { qpn, slot } => {
                self.counters.refused_requests += 1;
                self.send_reply(nic, qpn, WorkKind::Acknowledgement, slot, None, true)?;
                self.repost(nic, slot)?;
            }
            Request::Read {
                qpn,
                slot,
                at,
                size,
                ..
            } => {
                let Some(staging) = self.free_staging.pop() else {
                    return Ok(false);
                };
                self.looked_up.remove(&(qpn, slot));
                self.counters.read_requests += 1;
                let local = self.staging(staging, size);
                let forward = Forward::Read {
                    qpn,
                    slot,
                    staging,
                    size,
                };
                let operation = SendOperation::Read {
                    remote: self.resources.pool.remote(at),
                };
                self.forward(nic, forward, operation, local, WorkKind::MemoryRead)?;
            }
            Request::Write {
                qpn,
                slot,
                at,
                size,
                region,
            } => {
                self.counters.write_requests += 1;
                if let Some(cache) = &mut self.cache {
                    // Cached copies of a written region would go stale.
                    cache.uncacheable.insert(region);
                    cache.table.forget_region(region);
                }
                // The DPU holds the data: acknowledge now, persist next.
                self.send_reply(nic, qpn, WorkKind::Acknowledgement, slot, None, false)?;
                let header = remora_wire::soda::WriteRequest::<&[u8]>::HEADER_LEN as u64;
                let offset = u64::from(slot) * self.config.receive_slot_bytes() as u64 + header;
                let local = self.resources.receive_region.slice(offset, size);
                let operation = SendOperation::Write {
                    remote: self.resources.pool.remote(at),
                    immediate: None,
                };
                let forward = Forward::Write { qpn, slot, size };
                self.forward(nic, forward, operation, local, WorkKind::MemoryWrite)?;
            }
        }
        Ok(true)
    }

    fn forward(
        &mut self,
        nic: &mut dyn Verbs,
        forward: Forward,
        operation: SendOperation,
        local: remora_rnic::ScatterGatherElement,
        kind: WorkKind,
    ) -> Result<(), AgentError> {
        self.next_forward = (self.next_forward + 1) & 0xffff_ffff;
        let id = work_id(kind, self.next_forward as u32);
        nic.post_send(
            self.resources.memory_queue_pair,
            SendRequest::new(id, operation, &[local])?,
        )?;
        self.in_flight.insert(id, forward);
        self.counters.most_in_flight = self
            .counters
            .most_in_flight
            .max(self.in_flight.len() as u64);
        Ok(())
    }

    /// The receiver's turn: take requests, then issue what can go.
    fn receive_turn(&mut self, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        if !self.receives_posted {
            self.post_receives(nic)?;
        }
        let mut moved = false;
        for _ in 0..COMPLETIONS_PER_TURN {
            let Some(completion) = nic.poll_completion(self.resources.host_completion_queue)?
            else {
                break;
            };
            moved = true;
            self.host_completion(nic, &completion)?;
        }
        let budget = if self.config.aggregation {
            self.requests.len()
        } else {
            1
        };
        for _ in 0..budget {
            let Some(request) = self.requests.pop_front() else {
                break;
            };
            if !self.issue(nic, request)? {
                self.requests.push_front(request);
                break;
            }
            moved = true;
        }
        Ok(Progress::from_moved(moved))
    }

    fn host_completion(
        &mut self,
        nic: &mut dyn Verbs,
        completion: &WorkCompletion,
    ) -> Result<(), AgentError> {
        let (kind, slot) = work_kind(completion.work_request_id);
        let succeeded = completion.status == CompletionStatus::Success;
        match (kind, completion.opcode) {
            (Some(WorkKind::DataReply), _) => self.free_staging.push(slot),
            (Some(WorkKind::CacheReply), _) => {
                if let Some(cache) = &mut self.cache {
                    cache.table.release(slot as usize);
                }
            }
            (Some(WorkKind::Acknowledgement), _) => {}
            (Some(WorkKind::Receive), _) if !succeeded => {
                // A host queue pair went down (its process ended, or a
                // reply ran out of retries) with a request half received:
                // the buffer goes back to the shared queue. A flushed one
                // was kept back, and each such end took a buffer from
                // every host for good, until none answered.
                self.repost(nic, slot)?;
            }
            (Some(WorkKind::Receive), CompletionOpcode::Receive) => {
                self.take_request(nic, completion)?
            }
            // Requests come by SEND with immediate (Table I). An RDMA
            // WRITE with immediate writes nothing into the buffer: read
            // as a request, the slot's last request was run again.
            (Some(WorkKind::Receive), CompletionOpcode::ReceiveRdmaWithImmediate) => {
                let qpn = completion.qpn;
                self.requests.push_back(Request::Refused { qpn, slot });
            }
            _ => {
                return Err(AgentError::system(
                    "soda-dpu",
                    DpuError::UnknownWork(completion.work_request_id),
                ))
            }
        }
        Ok(())
    }

    /// The stager's turn: forwards that finished go back to the host;
    /// prefetched entries serve the requests waiting on them.
    fn stage_turn(&mut self, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        let mut moved = false;
        for _ in 0..COMPLETIONS_PER_TURN {
            let Some(completion) = nic.poll_completion(self.resources.memory_completion_queue)?
            else {
                break;
            };
            moved = true;
            let forward = self
                .in_flight
                .remove(&completion.work_request_id)
                .ok_or_else(|| {
                    AgentError::system(
                        "soda-dpu",
                        DpuError::UnknownWork(completion.work_request_id),
                    )
                })?;
            let failed = completion.status != CompletionStatus::Success;
            if failed && matches!(forward, Forward::Write { .. } | Forward::Static { .. }) {
                // Data the DPU acknowledged (or holds for the host) that
                // cannot reach the memory node is lost: the DPU stops, and
                // the host marks what it held.
                return Err(AgentError::system(
                    "soda-dpu",
                    DpuError::Memory(completion.status),
                ));
            }
            match forward {
                Forward::Read {
                    qpn,
                    slot,
                    staging,
                    size,
                } => {
                    self.repost(nic, slot)?;
                    if failed {
                        // A read the memory node refused is refused to the host.
                        self.counters.refused_requests += 1;
                        self.free_staging.push(staging);
                        self.send_reply(nic, qpn, WorkKind::Acknowledgement, slot, None, true)?;
                    } else {
                        self.counters.on_demand_bytes += u64::from(size);
                        let local = self.staging(staging, size);
                        self.send_reply(
                            nic,
                            qpn,
                            WorkKind::DataReply,
                            staging,
                            Some(local),
                            false,
                        )?;
                    }
                }
                Forward::Write { qpn, slot, size } => {
                    self.counters.written_bytes += u64::from(size);
                    let persisted = self.persisted.entry(qpn).or_insert(0);
                    // Counted mod 2^31, as the reply carries it: a plain
                    // add overflowed (a panic in a debug build).
                    *persisted = persisted.wrapping_add(1) & PERSISTED_MASK;
                    self.repost(nic, slot)?;
                }
                Forward::Prefetch { entry, bytes } => self.prefetched(nic, entry, bytes, failed)?,
                Forward::Static {
                    region,
                    static_at,
                    bytes,
                } => self.static_piece_done(region, static_at, bytes),
            }
        }
        Ok(Progress::from_moved(moved))
    }

    fn prefetched(
        &mut self,
        nic: &mut dyn Verbs,
        entry: usize,
        bytes: u32,
        failed: bool,
    ) -> Result<(), AgentError> {
        self.background_in_flight -= 1;
        let cache = self.cache.as_mut().expect("a prefetch has a cache");
        cache.prefetches_in_flight -= 1;
        let waiters = cache.waiters.remove(&entry).unwrap_or_default();
        if failed {
            // The waiters go to the memory node on demand.
            cache.table.abandon(entry);
            for waiter in waiters.into_iter().rev() {
                // Already looked up: straight to the memory node.
                self.looked_up.insert((waiter.qpn, waiter.slot));
                self.requests.push_front(Request::Read {
                    qpn: waiter.qpn,
                    slot: waiter.slot,
                    at: waiter.at,
                    size: waiter.size,
                    region: RegionId(u16::MAX),
                    page_offset: 0,
                });
            }
            return Ok(());
        }
        cache.table.filled(entry);
        self.counters.background_bytes += u64::from(bytes);
        for waiter in waiters {
            self.reply_from_cache(nic, waiter, entry)?;
        }
        // Its region forgotten while it filled, and nobody reading it, it
        // goes back now.
        self.cache_mut().table.settle(entry);
        Ok(())
    }

    fn static_piece_done(&mut self, region: RegionId, static_at: u64, bytes: u32) {
        self.background_in_flight -= 1;
        self.counters.static_bytes += u64::from(bytes);
        let holds = |entry: &StaticEntry| {
            (entry.offset..entry.offset + entry.length.max(1)).contains(&static_at)
        };
        if let Some(at) = self
            .retired_statics
            .iter()
            .position(|(retired, entry)| *retired == region && holds(entry))
        {
            // A piece of a copy already out of the cache: its space comes
            // back with its last piece.
            let (_, entry) = &mut self.retired_statics[at];
            if let StaticState::Loading { pieces_left } | StaticState::Flushing { pieces_left } =
                &mut entry.state
            {
                *pieces_left -= 1;
                if *pieces_left == 0 {
                    let (_, entry) = self.retired_statics.swap_remove(at);
                    self.static_space.release(entry.offset, entry.length);
                }
            }
            return;
        }
        let Some(entry) = self.statics.get_mut(&region) else {
            return;
        };
        match &mut entry.state {
            StaticState::Loading { pieces_left } | StaticState::Flushing { pieces_left } => {
                *pieces_left -= 1;
            }
            StaticState::Ready => {}
        }
        match entry.state {
            StaticState::Loading { pieces_left: 0 } => entry.state = StaticState::Ready,
            StaticState::Flushing { pieces_left: 0 } => self.remove_static(region),
            _ => {}
        }
    }

    /// Takes `region` out of the static cache: its queued loads and
    /// flushes are dropped (posted later, they would move bytes of space
    /// or memory given to others), and its space comes back once no piece
    /// of it is in flight.
    fn remove_static(&mut self, region: RegionId) {
        let Some(mut entry) = self.statics.remove(&region) else {
            return;
        };
        let queued_before = self.static_jobs.len();
        self.static_jobs.retain(|job| job.region != region);
        let dropped = (queued_before - self.static_jobs.len()) as u32;
        match &mut entry.state {
            StaticState::Loading { pieces_left } | StaticState::Flushing { pieces_left }
                if *pieces_left > dropped =>
            {
                *pieces_left -= dropped;
                // Bounded by the pieces in flight, each of which ends.
                self.retired_statics.push((region, entry));
            }
            _ => self.static_space.release(entry.offset, entry.length),
        }
    }

    /// The prefetcher's turn: static-cache loads and flushes, then the
    /// entries after those recently requested. Bounded in flight.
    fn prefetch_turn(&mut self, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        let mut moved = false;
        while self.background_in_flight < BACKGROUND_IN_FLIGHT {
            let Some(job) = self.static_jobs.pop_front() else {
                break;
            };
            self.post_static(nic, job)?;
            moved = true;
        }
        let Some(cache) = self.cache.as_mut() else {
            return Ok(Progress::from_moved(moved));
        };
        if !cache.enabled {
            return Ok(Progress::from_moved(moved));
        }
        let recent = cache.recent.since(cache.seen);
        let depth = cache.config.prefetch_depth;
        for (sequence, key) in recent {
            for ahead in 0..=depth {
                let next = match key.entry.checked_add(ahead) {
                    Some(entry) if self.entry_in_region(EntryKey { entry, ..key }) => {
                        EntryKey { entry, ..key }
                    }
                    // Past the region's end: nothing further to fetch.
                    _ => break,
                };
                if self.background_in_flight >= BACKGROUND_IN_FLIGHT {
                    // This request and the ones after it wait for the next
                    // turn. (Marking them all seen here dropped their
                    // prefetches whenever the cap was reached, and the host
                    // then missed on entries nobody had fetched.)
                    self.cache_mut().seen = sequence;
                    return Ok(Progress::from_moved(moved));
                }
                moved |= self.prefetch(nic, next)?;
            }
            self.cache_mut().seen = sequence + 1;
        }
        Ok(Progress::from_moved(moved))
    }

    fn cache_mut(&mut self) -> &mut DynamicCache {
        self.cache.as_mut().expect("prefetching needs a cache")
    }

    /// Whether entry `key` starts inside its region.
    fn entry_in_region(&self, key: EntryKey) -> bool {
        let (Some(&(_, length)), Some(cache)) = (self.regions.get(&key.region), &self.cache) else {
            return false;
        };
        key.entry
            .checked_mul(cache.config.entry_bytes as u64)
            .is_some_and(|offset| offset < length)
    }

    /// Starts fetching entry `key` into the cache, if it is not there, it
    /// lies inside its region, and a slot is free.
    fn prefetch(&mut self, nic: &mut dyn Verbs, key: EntryKey) -> Result<bool, AgentError> {
        if !self.entry_in_region(key) {
            return Ok(false);
        }
        let Some(&(start, length)) = self.regions.get(&key.region) else {
            return Ok(false);
        };
        // A pinned object is served from its static copy, which its writes
        // reach and the memory node does not until the unpin.
        if self.statics.contains_key(&key.region) {
            return Ok(false);
        }
        let cache = self.cache_mut();
        let entry_bytes = cache.config.entry_bytes as u64;
        let offset = key.entry * entry_bytes;
        if cache.table.lookup(key) != Lookup::Absent || cache.uncacheable.contains(&key.region) {
            return Ok(false);
        }
        let Some(entry) = cache.table.reserve(key) else {
            return Ok(false);
        };
        cache.prefetches_in_flight += 1;
        self.background_in_flight += 1;
        let bytes = (length - offset).min(entry_bytes) as u32;
        let region = self.resources.cache_region.expect("a cache has a region");
        let local = region.slice(entry as u64 * entry_bytes, bytes);
        let operation = SendOperation::Read {
            remote: self.resources.pool.remote(start + offset),
        };
        let forward = Forward::Prefetch { entry, bytes };
        self.forward(nic, forward, operation, local, WorkKind::Background)?;
        Ok(true)
    }

    fn post_static(&mut self, nic: &mut dyn Verbs, job: StaticJob) -> Result<(), AgentError> {
        self.background_in_flight += 1;
        let local = self.resources.static_region.slice(job.static_at, job.bytes);
        let remote = self.resources.pool.remote(job.memory_at);
        let operation = if job.flush {
            SendOperation::Write {
                remote,
                immediate: None,
            }
        } else {
            SendOperation::Read { remote }
        };
        let forward = Forward::Static {
            region: job.region,
            static_at: job.static_at,
            bytes: job.bytes,
        };
        self.forward(nic, forward, operation, local, WorkKind::Background)
    }

    fn crash(&mut self) {
        // What the DPU held is gone: queued requests, forwards, and the
        // writes it acknowledged but had not persisted.
        self.crashes += 1;
        self.requests.clear();
        self.in_flight.clear();
        self.free_staging = (0..self.config.staging_slots as u32).collect();
        self.persisted.clear();
        self.receives_posted = false;
        self.looked_up.clear();
        self.static_jobs.clear();
        self.statics.clear();
        self.retired_statics.clear();
        self.static_space = StaticSpace::new(self.config.static_bytes);
        self.background_in_flight = 0;
        if let Some(cache) = &mut self.cache {
            let entries = cache.table.entries();
            cache.table = CacheTable::new(entries, 0x50da);
            cache.waiters.clear();
            cache.prefetches_in_flight = 0;
        }
    }
}

pub type SharedDpu = Arc<Mutex<DpuState>>;

fn lock(state: &SharedDpu) -> MutexGuard<'_, DpuState> {
    state.lock().expect("DPU state lock")
}

/// Runs one agent's turn. An agent that fails takes the DPU down with it,
/// as a crash does: it cannot confirm or serve what it holds, so its
/// state goes, and the host sees it dead, settles what it held and goes
/// past it to the memory node. The failure is logged, not returned: an
/// error from a turn ended the rack's fabric thread, and the whole rack
/// with it, memory node and all (found by review). A dead DPU's agents do
/// nothing from then on (its shared receive queue still holds the
/// receives its cleared state forgot, and its forwards' completions name
/// work it no longer knows).
fn fail_stop(
    state: &SharedDpu,
    turn: impl FnOnce(&mut DpuState) -> Result<Progress, AgentError>,
) -> Result<Progress, AgentError> {
    let mut state = lock(state);
    if state.crashes() > 0 {
        return Ok(Progress::Idle);
    }
    match turn(&mut state) {
        Ok(progress) => Ok(progress),
        Err(error) => {
            tracing::warn!(%error, "a DPU agent failed: the DPU stops, as if it crashed");
            state.crash();
            state.failures += 1;
            Ok(Progress::Idle)
        }
    }
}

/// Takes requests, looks them up and issues them.
pub struct DpuReceiver(pub SharedDpu);

/// Polls the memory node and stages data back to the host.
pub struct DpuStager(pub SharedDpu);

/// Loads the static cache and prefetches after recent requests.
pub struct DpuPrefetcher(pub SharedDpu);

impl Agent for DpuPrefetcher {
    fn name(&self) -> &'static str {
        "soda-dpu-prefetcher"
    }
    fn poll(&mut self, _now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        fail_stop(&self.0, |state| state.prefetch_turn(nic))
    }
    fn poll_timeout(&self) -> Option<Timestamp> {
        None
    }
    fn crash(&mut self) {}
    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Ok(())
    }
}

impl Agent for DpuReceiver {
    fn name(&self) -> &'static str {
        "soda-dpu-receiver"
    }
    fn poll(&mut self, _now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        fail_stop(&self.0, |state| state.receive_turn(nic))
    }
    fn poll_timeout(&self) -> Option<Timestamp> {
        None
    }
    fn crash(&mut self) {
        lock(&self.0).crash();
    }
    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        // The host reconnects; nothing survives a DPU crash but the
        // region map, which the control plane gave and keeps.
        Ok(())
    }
}

impl Agent for DpuStager {
    fn name(&self) -> &'static str {
        "soda-dpu-stager"
    }
    fn poll(&mut self, _now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        fail_stop(&self.0, |state| state.stage_turn(nic))
    }
    fn poll_timeout(&self) -> Option<Timestamp> {
        None
    }
    fn crash(&mut self) {}
    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_rnic::{AccessFlags, RnicConfig, SoftRnic};
    use remora_wire::{Ipv4Address, MacAddress};

    /// A DPU on a NIC of its own, its shared receive queue holding every
    /// receive but `taken` (received into, as if by a host).
    fn dpu_with_receives_taken(taken: usize) -> (SoftRnic, DpuState) {
        dpu_with(DpuConfig::base(4096), taken)
    }

    fn dpu_with(config: DpuConfig, taken: usize) -> (SoftRnic, DpuState) {
        let mut nic = SoftRnic::new(RnicConfig::new(
            MacAddress([2, 0, 0, 0, 0, 9]),
            Ipv4Address::new(10, 0, 0, 9),
            9,
        ));
        let domain = nic.alloc_protection_domain().unwrap();
        let host_completion_queue = nic.create_completion_queue(64).unwrap();
        let memory_completion_queue = nic.create_completion_queue(64).unwrap();
        let shared_receive_queue = nic
            .create_shared_receive_queue(domain, config.receive_slots)
            .unwrap();
        let region = |nic: &mut SoftRnic, bytes: usize| {
            nic.register_memory(domain, bytes as u64, AccessFlags::LOCAL_WRITE)
                .unwrap()
        };
        let receive_region = region(&mut nic, config.receive_slots * config.receive_slot_bytes());
        let staging_region = region(&mut nic, config.staging_slots * config.chunk_bytes);
        let pool = region(&mut nic, 1 << 16);
        let static_region = region(&mut nic, 4096);
        let builder = remora_rack::endpoint::rack_queue_pair(domain, memory_completion_queue);
        let memory_queue_pair = QueuePair(nic.create_queue_pair(&builder).unwrap().qpn);
        let resources = DpuResources {
            host_completion_queue,
            memory_completion_queue,
            shared_receive_queue,
            memory_queue_pair,
            receive_region,
            staging_region,
            pool,
            cache_region: None,
            static_region,
        };
        let mut dpu = DpuState::new(config, resources);
        for slot in taken..config.receive_slots {
            dpu.repost(&mut nic, slot as u32).unwrap();
        }
        (nic, dpu)
    }

    fn receive_completion(status: CompletionStatus, opcode: CompletionOpcode) -> WorkCompletion {
        WorkCompletion {
            work_request_id: work_id(WorkKind::Receive, 0),
            status,
            opcode,
            qpn: Qpn::new(0x120).unwrap(),
            byte_len: 64,
            immediate: Some(2),
            solicited: false,
        }
    }

    /// A receive flushed when a host queue pair went into error (a reply
    /// out of retries, a host that ended mid-request) was never posted
    /// again: each such end took a buffer from every host for good.
    #[test]
    fn a_flushed_receive_goes_back_to_the_shared_queue() {
        let (mut nic, mut dpu) = dpu_with_receives_taken(1);
        let flushed = receive_completion(
            CompletionStatus::WorkRequestFlushError,
            CompletionOpcode::Receive,
        );
        dpu.host_completion(&mut nic, &flushed).unwrap();
        // The queue is whole again: one more receive finds it full.
        let queue = dpu.resources.shared_receive_queue;
        let local = dpu.resources.receive_region.slice(0, 64);
        let extra = ReceiveRequest::new(99, &[local]).unwrap();
        assert!(matches!(
            nic.post_shared_receive(queue, extra),
            Err(remora_rnic::VerbsError::QueueFull { .. })
        ));
    }

    /// An RDMA WRITE with immediate consumes a receive but writes nothing
    /// into it: read as a request, the slot's last request ran again (an
    /// old write landed over newer data). It is refused.
    #[test]
    fn a_write_with_immediate_is_refused_not_read_as_a_request() {
        let (mut nic, mut dpu) = dpu_with_receives_taken(1);
        // The slot still holds an earlier write request, of 64 bytes.
        dpu.register_region(RegionId(1), 0, 4096);
        let earlier = SodaRequestRepr::Write(remora_wire::soda::WriteRequestRepr {
            region: RegionId(1),
            page_offset: 0,
            data: &[7u8; 52],
        });
        let mut bytes = [0u8; 64];
        assert_eq!(earlier.emit(&mut bytes).unwrap(), 64);
        let receive = dpu.resources.receive_region;
        nic.write_local(receive.lkey, receive.address, &bytes)
            .unwrap();
        let write = receive_completion(
            CompletionStatus::Success,
            CompletionOpcode::ReceiveRdmaWithImmediate,
        );
        dpu.host_completion(&mut nic, &write).unwrap();
        assert!(matches!(
            dpu.requests.front(),
            Some(Request::Refused { slot: 0, .. })
        ));
    }

    /// A region written through the DPU is never cached again; its id,
    /// freed and given to another object, stayed uncacheable, and the new
    /// object's reads all missed the dynamic cache.
    #[test]
    fn a_freed_regions_id_is_cacheable_again() {
        let config = DpuConfig {
            dynamic: Some(crate::cache::DynamicCacheConfig {
                capacity_bytes: 1 << 16,
                entry_bytes: 4096,
                prefetch_depth: 0,
                mode: crate::cache::CacheMode::On,
            }),
            ..DpuConfig::base(4096)
        };
        let (_nic, mut dpu) = dpu_with(config, 0);
        let region = RegionId(3);
        dpu.register_region(region, 0, 4096);
        let uncacheable =
            |dpu: &DpuState| dpu.cache.as_ref().unwrap().uncacheable.contains(&region);
        dpu.cache.as_mut().unwrap().uncacheable.insert(region);
        assert!(uncacheable(&dpu));
        dpu.forget_region(region);
        dpu.register_region(region, 0, 4096);
        assert!(!uncacheable(&dpu));
    }

    /// An agent that failed returned its error, which ended the rack's
    /// fabric thread (the whole rack stopped), and the DPU never counted
    /// as dead. Its failure now takes the DPU's state as a crash does.
    #[test]
    fn a_failed_agent_turn_leaves_the_dpu_dead() {
        let (_nic, dpu) = dpu_with(DpuConfig::base(4096), 0);
        let shared: SharedDpu = Arc::new(Mutex::new(dpu));
        let fine = fail_stop(&shared, |_| Ok(Progress::Idle));
        assert!(fine.is_ok());
        assert_eq!(lock(&shared).crashes(), 0);
        let failed = fail_stop(&shared, |_| {
            Err(AgentError::system(
                "soda-dpu",
                DpuError::Memory(CompletionStatus::RemoteAccessError),
            ))
        });
        // Not returned: an error ended the rack's fabric thread.
        assert!(matches!(failed, Ok(Progress::Idle)));
        assert_eq!(lock(&shared).crashes(), 1);
        assert_eq!(lock(&shared).failures(), 1);
        // A dead DPU's agents do nothing.
        let mut ran = false;
        let after = fail_stop(&shared, |_| {
            ran = true;
            Ok(Progress::Idle)
        });
        assert!(after.is_ok() && !ran);
    }

    /// Writes are numbered mod 2^31. Compared plainly, write 0 after the
    /// wrap read as persisted by a count of 2^31 - 1 (so a DPU crash would
    /// not have reported it lost), and the DPU's count overflowed.
    #[test]
    fn write_numbers_compare_across_the_wrap() {
        assert!(!is_persisted(1, 0), "nothing persisted yet");
        assert!(is_persisted(1, 1) && is_persisted(1, 5));
        assert!(!is_persisted(6, 5));
        assert!(!is_persisted(0, PERSISTED_MASK), "write 0 after the wrap");
        assert!(is_persisted(PERSISTED_MASK, 0), "the count wrapped past it");
        assert!(is_persisted(0, 3) && is_persisted(PERSISTED_MASK - 2, 3));
    }
}
