//! SODA's rack: a compute node, a memory node and, for the DPU backends, a
//! DPU beside the compute node, behind the switch of an embedded rack.
//! [`SodaRack`] is the compute node's [`ChunkStore`]: each object's chunks
//! go one-sided to the memory node ([`Route::Direct`], the MemServer path)
//! or two-sided through the DPU agent ([`Route::ThroughDpu`]).
//!
//! The rack's fabric thread runs the three NICs, the switch and the DPU's
//! agents; its CPU is emulated hardware and the DPU's, reported apart from
//! the application's.

use remora_rack::channel::{connect_channels, Channel, ChannelError, ChannelPool, Transfer};

/// Per DPU channel: writes sent through the DPU, which acknowledges
/// before it persists, counted mod 2^31 as its replies count them, and
/// those not yet reported persisted: (write number, object).
#[derive(Debug, Default)]
pub struct WriteTracking {
    writes_sent: u32,
    unconfirmed: std::collections::VecDeque<(u32, ObjectId)>,
}
use crate::dpu::{
    DpuConfig, DpuCounters, DpuPrefetcher, DpuReceiver, DpuResources, DpuStager, DpuState,
    SharedDpu, StaticState, PERSISTED_MASK, REPLY_ERROR,
};
use crate::pins::{PinTable, Standing, StillMoving};
use crate::store::{Advice, ChunkStore, ObjectId, StoreError};
use remora_carrier::wrappers::LinkShape;
use remora_rack::assembly::{EmbeddedRack, RackBuilder, StagedRack};
use remora_rack::endpoint::{rack_queue_pair, DriverKicker};
use remora_rack::host_cpu::BusyNanos;
use remora_rack::pool::{Pool, PoolError};
use remora_rack::topology::{
    standard_host, HostSpec, LinkSpec, Role, Topology, COMPUTE_HOST, MEMORY_HOST,
};
use remora_rack::RackError;
use remora_rnic::{AccessFlags, HostMemory, MemoryRegion, Verbs, VerbsError};
use remora_wire::soda::{ReadRequestRepr, RegionId, SodaRequestRepr, WriteRequestRepr};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The DPU's index in the rack.
pub const DPU_HOST: usize = 2;
/// Bytes each channel reads to measure a path's bandwidth at start-up.
const MEASURE_BYTES: usize = 1 << 20;
/// Slots in each of the rack's rings. SODA moves 64 KiB chunks, 16 frames
/// each, and every frame is copied into a ring slot and out of it twice
/// on its way through the switch. With the rack's default 512 slots, each
/// ring spans about 2 MiB, so every copy met a slot long gone from the
/// cache; 64 slots (four chunks in flight per ring, and a full ring holds
/// the sender back, it loses nothing) keep the slots warm: the unshaped
/// paths measured 25-30% faster (`examples/link_rate`).
const RING_SLOTS: u32 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// One-sided READ and WRITE to the memory node.
    Direct,
    /// Two-sided requests to the DPU agent.
    ThroughDpu,
}

/// The rack's links; `None` is as fast as the soft RNIC.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RackLinks {
    /// The compute node's link to the switch.
    pub compute: Option<LinkShape>,
    /// B_net: the memory node's link to the switch.
    pub memory: Option<LinkShape>,
    /// B_intra: the DPU's local link to the compute node (PCIe on a
    /// BlueField), which their frames take without crossing the switch.
    /// The DPU's own link to the switch is left as fast as the soft RNIC:
    /// the memory node's link bounds what crosses it.
    pub dpu: Option<LinkShape>,
}

#[derive(Debug, Clone)]
pub struct SodaRackConfig {
    pub pool_bytes: u64,
    /// Channels per path: one per fault thread, plus one for the evictor.
    pub channels: usize,
    pub chunk_bytes: usize,
    /// Application processes on the compute node, each with its own
    /// channels, sharing the memory node and the DPU (Fig. 8).
    pub processes: usize,
    pub dpu: Option<DpuConfig>,
    /// Where objects' chunks go.
    pub route: Route,
    /// The hosts from a rack file (compute, memory, and the DPU attached
    /// to the compute host), with their own links; `None` is the standard
    /// three on [`links`](Self::links).
    pub hosts: Option<Topology>,
    pub links: RackLinks,
}

impl SodaRackConfig {
    /// A DPU rack on unshaped links with `channels` channels, for
    /// measuring what the soft RNIC itself sustains at `chunk_bytes`.
    pub fn unshaped_with_dpu(chunk_bytes: usize, channels: usize) -> SodaRackConfig {
        SodaRackConfig {
            pool_bytes: 4 << 20,
            processes: 1,
            channels,
            chunk_bytes,
            dpu: Some(DpuConfig::optimized(chunk_bytes)),
            route: Route::Direct,
            links: RackLinks::default(),
            hosts: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SodaRackError {
    #[error(transparent)]
    Rack(#[from] RackError),
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    #[error(transparent)]
    Channel(#[from] ChannelError),
    #[error("the DPU refused a request for object {0:?} (unknown region or out of range)")]
    Refused(ObjectId),
    #[error("{0} processes: a rack serves 1 to {MAX_PROCESSES}")]
    Processes(usize),
    #[error("object {0:?}: a process has at most {OBJECTS_PER_PROCESS} objects")]
    TooManyObjects(ObjectId),
    #[error("route through the DPU asked of a rack without one")]
    NoDpu,
    #[error("the hosts given are not a compute host, a memory host and, for a DPU, the DPU attached to the compute host, in that order")]
    Hosts,
    #[error("object {0:?}: SODA's region ids are 16 bits")]
    RegionId(ObjectId),
    #[error(transparent)]
    Dpu(#[from] crate::dpu::DpuError),
    #[error("object {0:?}: the DPU died holding the only copy of its writes (pinned in its static cache)")]
    StaticCopyLost(ObjectId),
    #[error("the DPU's static cache did not settle region {0:?} in time")]
    StaticTimedOut(RegionId),
    #[error("the DPU is dead: its static cache cannot take region {0:?}")]
    DpuDead(RegionId),
    #[error(transparent)]
    StillMoving(#[from] StillMoving),
    #[error("the DPU replied {got} bytes where {wanted} were asked")]
    ShortReply { got: u32, wanted: usize },
}

impl From<SodaRackError> for StoreError {
    fn from(error: SodaRackError) -> StoreError {
        StoreError::Remote(Box::new(error))
    }
}

/// Bytes that crossed the compute node's paths.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Compute ↔ memory, one-sided.
    pub direct_read_bytes: u64,
    pub direct_written_bytes: u64,
    /// Compute ↔ DPU, two-sided.
    pub dpu_read_bytes: u64,
    pub dpu_written_bytes: u64,
}

/// One application process's queue pairs: to the memory node, and to
/// the DPU when there is one.
struct ProcessPaths {
    direct: ChannelPool,
    dpu: Option<ChannelPool<WriteTracking>>,
}

/// Object ids each process may use: its objects are numbered apart.
pub const OBJECTS_PER_PROCESS: u32 = 1 << 12;
/// How long a reserve that found the pool full waits for the DPU to
/// confirm the writes that hold released objects' rooms, and how often it
/// asks meanwhile.
const CONFIRMATION_WAIT: Duration = Duration::from_secs(1);
const CONFIRMATION_POLL: Duration = Duration::from_millis(2);
/// The most processes: region ids are 16 bits.
pub const MAX_PROCESSES: usize = 16;

struct DpuPath {
    state: SharedDpu,
    busy: Vec<BusyNanos>,
    /// Writes the DPU acknowledged and has not yet reported persisted, by
    /// object: what a DPU crash would lose.
    unconfirmed: Mutex<HashMap<ObjectId, u32>>,
    /// Objects released while the DPU still held writes to them: their
    /// room on the memory node is freed when those writes are confirmed
    /// (or the DPU dies). Freed at once, a late write landed in the room
    /// of the next object given it. Locked inside `unconfirmed`.
    releasing: Mutex<std::collections::HashSet<ObjectId>>,
    /// Released objects whose flush pieces were still in flight: each
    /// holds one count in `unconfirmed`, taken back once its pieces have
    /// landed ([`SodaRack::settle_flushes`]).
    flush_holds: Mutex<std::collections::HashSet<ObjectId>>,
    /// Held while asking every channel for confirmations
    /// ([`SodaRack::ask_for_confirmations`]): two askers at once could
    /// each take part of a pool and wait for the rest.
    asking: Mutex<()>,
    /// Whether what the dead DPU held has been settled
    /// ([`SodaRack::after_the_dpu_died`]): once, the first time its
    /// death is seen, under this lock, which every later transfer waits
    /// on (a flag set before the settling let another thread read an
    /// object the DPU held writes of from the memory node before it was
    /// marked lost).
    death_settled: Mutex<bool>,
}

impl DpuPath {
    /// Whether the DPU has crashed. The rack never restarts a crashed
    /// host, so a DPU that crashed is dead for good: nothing it held, and
    /// nothing sent to it since, lands on the memory node.
    fn is_dead(&self) -> bool {
        self.state.lock().expect("DPU state lock").crashes() > 0
    }
}

pub struct SodaRack {
    rack: Mutex<EmbeddedRack>,
    kicker: DriverKicker,
    pool: MemoryRegion,
    /// The memory node's pool: its agent reserves, loads and frees
    /// extents (direct calls standing in for a control channel).
    memory: Mutex<Pool<ObjectId>>,
    processes: Vec<ProcessPaths>,
    dpu: Option<DpuPath>,
    route: Route,
    /// Objects in the DPU's static cache, and the gate that holds an
    /// object's transfers while it moves in or out.
    pins: PinTable,
    /// Objects routed through the DPU's dynamic cache.
    dynamic: Mutex<std::collections::HashSet<ObjectId>>,
    /// (B_net, B_intra) in bytes per second, measured at start-up.
    bandwidths: Option<(f64, f64)>,
    lost: Mutex<HashMap<ObjectId, String>>,
    direct_read_bytes: AtomicU64,
    direct_written_bytes: AtomicU64,
    dpu_read_bytes: AtomicU64,
    dpu_written_bytes: AtomicU64,
}

fn topology(config: &SodaRackConfig) -> Result<Topology, SodaRackError> {
    if let Some(hosts) = &config.hosts {
        let dpu_beside_compute = hosts.hosts().len() > DPU_HOST
            && hosts.host(DPU_HOST).attached_to == Some(COMPUTE_HOST);
        let fits = hosts.hosts().len() >= 2 && (config.dpu.is_none() || dpu_beside_compute);
        return match fits {
            true => Ok(hosts.clone()),
            false => Err(SodaRackError::Hosts),
        };
    }
    let mut topology = Topology::compute_and_memory();
    if config.dpu.is_some() {
        let (mac, address) = standard_host(DPU_HOST);
        let mut dpu = HostSpec::new("dpu", Role::Offload, mac, address);
        dpu.attached_to = Some(COMPUTE_HOST);
        topology.add_host(dpu).expect("a third distinct host fits");
    }
    let shaped = |shape| LinkSpec {
        shape: Some(shape),
        ..LinkSpec::CLEAN
    };
    for (index, shape) in [
        (COMPUTE_HOST, config.links.compute),
        (MEMORY_HOST, config.links.memory),
    ] {
        if let Some(shape) = shape {
            topology.set_link(index, shaped(shape));
        }
    }
    if let (Some(shape), Some(_)) = (config.links.dpu, config.dpu) {
        topology.set_local_link(DPU_HOST, shaped(shape));
    }
    Ok(topology)
}

/// The DPU's queues and buffers, its queue pair to the memory node.
fn deploy_dpu(
    staged: &mut StagedRack,
    config: DpuConfig,
    pool: MemoryRegion,
    memory_domain: remora_rnic::ProtectionDomain,
) -> Result<(DpuResources, remora_rnic::ProtectionDomain), SodaRackError> {
    let (dpu, memory) = staged.nic_pair_mut(DPU_HOST, MEMORY_HOST);
    let domain = dpu.alloc_protection_domain()?;
    let host_completion_queue = dpu.create_completion_queue(4096)?;
    let memory_completion_queue = dpu.create_completion_queue(4096)?;
    let shared_receive_queue = dpu.create_shared_receive_queue(domain, config.receive_slots)?;
    let receive_region = dpu.register_memory(
        domain,
        (config.receive_slots * config.receive_slot_bytes()) as u64,
        AccessFlags::LOCAL_WRITE,
    )?;
    let staging_region = dpu.register_memory(
        domain,
        (config.staging_slots * config.chunk_bytes) as u64,
        AccessFlags::LOCAL_WRITE,
    )?;
    let cache_region = match config.dynamic {
        Some(dynamic) => {
            Some(dpu.register_memory(domain, dynamic.capacity_bytes, AccessFlags::LOCAL_WRITE)?)
        }
        None => None,
    };
    // The host reads and writes the static cache one-sided; it is at
    // least big enough to measure B_intra against.
    let static_region = dpu.register_memory(
        domain,
        config.static_bytes.max(MEASURE_BYTES as u64),
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
    )?;
    let mut builder = rack_queue_pair(domain, memory_completion_queue);
    builder.send_queue_depth = 4 * config.receive_slots;
    let near = dpu.create_queue_pair(&builder)?;
    // The pool's protection domain: a queue pair of another could not
    // touch it.
    let memory_queue = memory.create_completion_queue(64)?;
    let far = memory.create_queue_pair(&rack_queue_pair(memory_domain, memory_queue))?;
    let (near_endpoint, far_endpoint) = (near.endpoint, far.endpoint);
    memory.handshake(far, near_endpoint)?;
    let (dpu, _) = staged.nic_pair_mut(DPU_HOST, MEMORY_HOST);
    let memory_queue_pair = dpu.handshake(near, far_endpoint)?;
    let resources = DpuResources {
        host_completion_queue,
        memory_completion_queue,
        shared_receive_queue,
        memory_queue_pair,
        receive_region,
        staging_region,
        pool,
        cache_region,
        static_region,
    };
    Ok((resources, domain))
}

impl SodaRack {
    pub fn start(config: &SodaRackConfig) -> Result<SodaRack, SodaRackError> {
        if config.route == Route::ThroughDpu && config.dpu.is_none() {
            return Err(SodaRackError::NoDpu);
        }
        if let Some(dpu) = &config.dpu {
            dpu.check()?;
        }
        let topology = topology(config)?;
        let mut staged = RackBuilder::new(&topology)
            .thread_name("soda-fabric")
            .ring_depth(RING_SLOTS)
            .build()?;
        let memory = staged.nic_mut(MEMORY_HOST);
        let memory_domain = memory.alloc_protection_domain()?;
        let pool_memory = HostMemory::new(config.pool_bytes as usize);
        let pool = memory.register_host_memory(
            memory_domain,
            pool_memory.clone(),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        )?;
        if !(1..=MAX_PROCESSES).contains(&config.processes) {
            return Err(SodaRackError::Processes(config.processes));
        }
        let memory_queue =
            memory.create_completion_queue(config.channels * config.processes * 4)?;
        let mut dpu = None;
        let mut dpu_queues = None;
        if let Some(dpu_config) = config.dpu {
            let (resources, domain) = deploy_dpu(&mut staged, dpu_config, pool, memory_domain)?;
            dpu_queues = Some((resources, domain));
            let state: SharedDpu = Arc::new(Mutex::new(DpuState::new(dpu_config, resources)));
            let agents: [Arc<Mutex<dyn remora_host::Agent>>; 3] = [
                Arc::new(Mutex::new(DpuReceiver(Arc::clone(&state)))),
                Arc::new(Mutex::new(DpuStager(Arc::clone(&state)))),
                Arc::new(Mutex::new(DpuPrefetcher(Arc::clone(&state)))),
            ];
            let busy = agents
                .into_iter()
                .map(|agent| staged.add_agent(DPU_HOST, agent))
                .collect();
            dpu = Some(DpuPath {
                state,
                busy,
                unconfirmed: Mutex::new(HashMap::new()),
                releasing: Mutex::new(Default::default()),
                asking: Mutex::new(()),
                flush_holds: Mutex::new(Default::default()),
                death_settled: Default::default(),
            });
        }
        let mut processes = Vec::with_capacity(config.processes);
        for _ in 0..config.processes {
            let direct = connect_channels(
                &mut staged,
                COMPUTE_HOST,
                MEMORY_HOST,
                config.channels,
                config.chunk_bytes,
                || rack_queue_pair(memory_domain, memory_queue),
            )?;
            let through_dpu = match dpu_queues {
                None => None,
                Some((resources, domain)) => Some(connect_channels(
                    &mut staged,
                    COMPUTE_HOST,
                    DPU_HOST,
                    config.channels,
                    config.chunk_bytes,
                    || {
                        let mut builder = rack_queue_pair(domain, resources.host_completion_queue);
                        builder.shared_receive_queue = Some(resources.shared_receive_queue);
                        builder
                    },
                )?),
            };
            processes.push(ProcessPaths {
                direct,
                dpu: through_dpu,
            });
        }
        let switch = staged.l2l3_switch();
        let (rack, _switch) = staged.start(switch)?;
        let kicker = rack.fabric().kicker();
        let mut soda = SodaRack {
            rack: Mutex::new(rack),
            kicker,
            pool,
            memory: Mutex::new(Pool::new(pool_memory)),
            processes,
            dpu,
            route: config.route,
            pins: PinTable::default(),
            dynamic: Mutex::new(Default::default()),
            bandwidths: None,
            lost: Mutex::new(HashMap::new()),
            direct_read_bytes: AtomicU64::new(0),
            direct_written_bytes: AtomicU64::new(0),
            dpu_read_bytes: AtomicU64::new(0),
            dpu_written_bytes: AtomicU64::new(0),
        };
        if let Some(dpu) = &soda.dpu {
            // A fresh rack's first pass over its paths pays for first
            // touches (the rings' slots, the landing buffers, the switch's
            // buffer pool, the NICs' replay slots) as page faults, and
            // measured a third to a half of what the same paths sustain
            // from the second pass on; the application's transfers come
            // later, on warm paths. So the first pass is discarded.
            soda.measure_bandwidths()?;
            let bandwidths = soda.measure_bandwidths()?;
            dpu.state
                .lock()
                .expect("DPU state lock")
                .set_threshold(bandwidths.0 / bandwidths.1);
            soda.bandwidths = Some(bandwidths);
        }
        Ok(soda)
    }

    /// (B_net, B_intra): every channel at once reads `MEASURE_BYTES` from
    /// the memory node, then from the DPU, on the links as shaped.
    pub fn measure_bandwidths(&self) -> Result<(f64, f64), SodaRackError> {
        let dpu = self.dpu()?;
        let static_region = dpu.state.lock().expect("DPU state lock").static_region();
        let paths = &self.processes[0];
        let net = self.measure(&paths.direct, self.pool)?;
        let intra = self.measure(Self::dpu_channels(paths)?, static_region)?;
        Ok((net, intra))
    }

    fn measure<S: Send>(
        &self,
        pool: &ChannelPool<S>,
        region: MemoryRegion,
    ) -> Result<f64, SodaRackError> {
        let started = std::time::Instant::now();
        let threads = pool.len();
        let results: Vec<Result<(), SodaRackError>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    scope.spawn(|| {
                        pool.with(|channel| {
                            let pieces = MEASURE_BYTES / channel.chunk_bytes;
                            for _ in 0..pieces.max(1) {
                                let length = channel.chunk_bytes.min(MEASURE_BYTES);
                                channel.one_sided(&self.kicker, region.remote(0), length, true)?;
                            }
                            Ok(())
                        })
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|worker| worker.join().expect("a measuring thread"))
                .collect()
        });
        results.into_iter().collect::<Result<Vec<()>, _>>()?;
        Ok((threads * MEASURE_BYTES) as f64 / started.elapsed().as_secs_f64())
    }

    /// (B_net, B_intra) in bytes per second, when the rack has a DPU.
    pub fn bandwidths(&self) -> Option<(f64, f64)> {
        self.bandwidths
    }

    pub fn traffic(&self) -> Traffic {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        Traffic {
            direct_read_bytes: load(&self.direct_read_bytes),
            direct_written_bytes: load(&self.direct_written_bytes),
            dpu_read_bytes: load(&self.dpu_read_bytes),
            dpu_written_bytes: load(&self.dpu_written_bytes),
        }
    }

    /// The DPU's counters and its agents' busy time (its CPU).
    pub fn dpu_report(&self) -> Option<(DpuCounters, Duration)> {
        let dpu = self.dpu.as_ref()?;
        let counters = dpu.state.lock().expect("DPU state lock").counters();
        let busy = dpu
            .busy
            .iter()
            .map(|busy| busy.load(Ordering::Relaxed))
            .sum();
        Some((counters, Duration::from_nanos(busy)))
    }

    /// Stops the rack; returns the fabric thread's CPU time (emulated NICs,
    /// switch and DPU agents), apart from the application's.
    pub fn stop(&self) -> Result<Duration, SodaRackError> {
        Ok(self.rack.lock().expect("rack lock").stop_and_join()?)
    }

    /// A host of the rack crashes (for tests of what the application sees).
    pub fn crash(&self, host: usize) {
        self.rack.lock().expect("rack lock").crash(host);
    }

    /// Why `object` is lost, if it is (what a transfer of it would say),
    /// with what a dead DPU held settled first.
    pub fn lost_reason(&self, object: ObjectId) -> Option<String> {
        self.after_the_dpu_died();
        self.lost.lock().expect("lost lock").get(&object).cloned()
    }

    fn region(object: ObjectId) -> Result<RegionId, SodaRackError> {
        u16::try_from(object.0)
            .map(RegionId)
            .map_err(|_| SodaRackError::RegionId(object))
    }

    fn dpu_channels(paths: &ProcessPaths) -> Result<&ChannelPool<WriteTracking>, SodaRackError> {
        paths.dpu.as_ref().ok_or(SodaRackError::NoDpu)
    }

    fn dpu(&self) -> Result<&DpuPath, SodaRackError> {
        self.dpu.as_ref().ok_or(SodaRackError::NoDpu)
    }

    /// One-sided to the memory node's pool.
    fn direct_transfer(
        &self,
        paths: &ProcessPaths,
        start: u64,
        transfer: Transfer<'_>,
    ) -> Result<(), SodaRackError> {
        let (bytes, counter) = match &transfer {
            Transfer::Into(into) => (into.len(), &self.direct_read_bytes),
            Transfer::From(from) => (from.len(), &self.direct_written_bytes),
        };
        paths
            .direct
            .with(|channel| channel.transfer(&self.kicker, self.pool, start, transfer))?;
        counter.fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Drops the unconfirmed writes a reply reports persisted, and frees
    /// the room of released objects that held the last of them.
    fn confirm(&self, dpu: &DpuPath, channel: &mut Channel<WriteTracking>, immediate: u32) {
        let persisted = immediate & PERSISTED_MASK;
        let mut settled = Vec::new();
        {
            let mut unconfirmed = dpu.unconfirmed.lock().expect("unconfirmed lock");
            let mut releasing = dpu.releasing.lock().expect("releasing lock");
            // Bounded by the channel's unconfirmed writes.
            while let Some(&(index, object)) = channel.state.unconfirmed.front() {
                if !crate::dpu::is_persisted(index, persisted) {
                    break;
                }
                channel.state.unconfirmed.pop_front();
                if uncount(&mut unconfirmed, &mut releasing, object) {
                    settled.push(object);
                }
            }
        }
        self.free_rooms(settled);
    }

    /// Asks the DPU, on every channel with writes it has not confirmed,
    /// how many it has persisted, until no released object's room waits
    /// on it or [`CONFIRMATION_WAIT`] passes. The DPU reports persisted
    /// writes only in its replies, so a channel the application stopped
    /// using kept its last writes unconfirmed, and the rooms of objects
    /// released with them stayed held: a later reserve found the pool
    /// full for good.
    fn ask_for_confirmations(&self, dpu: &DpuPath) {
        let _asking = dpu.asking.lock().expect("asking lock");
        let deadline = Instant::now() + CONFIRMATION_WAIT;
        // Bounded by the deadline.
        loop {
            // A flush that landed frees its hold here, as at a reserve.
            self.settle_flushes(dpu);
            // A dead DPU answers nothing and holds nothing: what it held
            // is settled here, not only at a later failure on its path
            // (an allocation that needed a released object's room failed
            // as full until one came).
            if dpu.is_dead() {
                self.settle_what_the_dpu_held(dpu);
                return;
            }
            if dpu.releasing.lock().expect("releasing lock").is_empty() {
                return;
            }
            let mut asked = false;
            for paths in &self.processes {
                if let Some(pool) = &paths.dpu {
                    pool.with_every(|channel| asked |= self.ask_for_confirmation(dpu, channel));
                }
            }
            // No channel that answers holds an unconfirmed write: what
            // still holds a room (a flush in flight, a write whose reply
            // never came) is not answered by asking.
            if !asked || Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(CONFIRMATION_POLL);
        }
    }

    /// One question on `channel`, if it has unconfirmed writes: a read of
    /// no bytes from the region of the oldest. Its reply, served or
    /// refused (a released region is unknown to the DPU), carries the
    /// channel's persisted count. A failure here is left to the data
    /// path, which sees the same channel next. Returns whether the DPU
    /// answered: a retired channel (one whose reply never came) answers
    /// nothing, and asking it again would only wait out the deadline.
    fn ask_for_confirmation(&self, dpu: &DpuPath, channel: &mut Channel<WriteTracking>) -> bool {
        let Some(&(_, object)) = channel.state.unconfirmed.front() else {
            return false;
        };
        let Ok(region) = Self::region(object) else {
            return false;
        };
        let question = SodaRequestRepr::Read(ReadRequestRepr {
            region,
            page_offset: 0,
            destination_address: channel.region.address,
            size: 0,
            destination_rkey: channel.region.rkey,
        });
        let mut bytes = vec![0u8; question.buffer_len()];
        question
            .emit(&mut bytes)
            .expect("the buffer is the request's length");
        let Ok(reply) = channel.two_sided(&self.kicker, question.immediate(), &bytes) else {
            return false;
        };
        if let Some(immediate) = reply.immediate {
            self.confirm(dpu, channel, immediate);
        }
        true
    }

    /// Whether the DPU still writes a flush of `object`'s static copy into
    /// its room (a dirty unpin that did not finish in time, or one racing
    /// the release): released, the region's copy is retired, not gone,
    /// until its pieces land.
    fn still_flushing(&self, dpu: &DpuPath, object: ObjectId) -> bool {
        Self::region(object).is_ok_and(|region| {
            dpu.state
                .lock()
                .expect("DPU state lock")
                .has_flush_pieces_in_flight(region)
        })
    }

    /// Takes back the holds of released objects whose flush pieces have
    /// landed since, freeing their rooms if nothing else holds them.
    fn settle_flushes(&self, dpu: &DpuPath) {
        let landed: Vec<ObjectId> = {
            let mut holds = dpu.flush_holds.lock().expect("flush holds lock");
            let state = dpu.state.lock().expect("DPU state lock");
            let landed: Vec<ObjectId> = holds
                .iter()
                .filter(|object| {
                    Self::region(**object)
                        .map_or(true, |region| !state.has_flush_pieces_in_flight(region))
                })
                .copied()
                .collect();
            for object in &landed {
                holds.remove(object);
            }
            landed
        };
        for object in landed {
            self.take_back_count(dpu, object);
        }
    }

    /// Counts a write the DPU may hold for `object`, from the moment it is
    /// sent: a write whose reply never came (a timeout) may still be
    /// queued at a live DPU with the object's absolute place on the memory
    /// node, so the object's room must not be freed for another until the
    /// DPU confirms it or is known dead.
    fn count_sent(&self, dpu: &DpuPath, object: ObjectId) {
        *dpu.unconfirmed
            .lock()
            .expect("unconfirmed lock")
            .entry(object)
            .or_insert(0) += 1;
    }

    /// Takes back a count [`Self::count_sent`] made for a write the DPU
    /// never took ([`nothing_sent`]), or for a flush that has landed.
    fn take_back_count(&self, dpu: &DpuPath, object: ObjectId) {
        let settled = {
            let mut unconfirmed = dpu.unconfirmed.lock().expect("unconfirmed lock");
            let mut releasing = dpu.releasing.lock().expect("releasing lock");
            uncount(&mut unconfirmed, &mut releasing, object)
        };
        if settled {
            self.free_rooms(vec![object]);
        }
    }

    /// Gives the memory node back the rooms of released objects.
    fn free_rooms(&self, objects: Vec<ObjectId>) {
        let mut memory = self.memory.lock().expect("memory agent lock");
        for object in objects {
            if let Err(error) = memory.release(object) {
                tracing::warn!(object = object.0, %error, "freeing a released object's room");
            }
        }
    }

    fn fetch_through_dpu(
        &self,
        paths: &ProcessPaths,
        object: ObjectId,
        offset: u64,
        into: &mut [u8],
    ) -> Result<(), SodaRackError> {
        let dpu = self.dpu()?;
        let region = Self::region(object)?;
        Self::dpu_channels(paths)?.with(|channel| {
            let chunk = channel.chunk_bytes;
            for (index, piece) in into.chunks_mut(chunk).enumerate() {
                let request = SodaRequestRepr::Read(ReadRequestRepr {
                    region,
                    page_offset: offset + (index * chunk) as u64,
                    destination_address: channel.region.address,
                    size: piece.len() as u32,
                    destination_rkey: channel.region.rkey,
                });
                let (reply, immediate) = self.ask(channel, &request, object)?;
                if reply.byte_len as usize != piece.len() {
                    return Err(SodaRackError::ShortReply {
                        got: reply.byte_len,
                        wanted: piece.len(),
                    });
                }
                channel
                    .landing()
                    .read(0, piece)
                    .map_err(ChannelError::from)?;
                self.confirm(dpu, channel, immediate);
            }
            Ok(())
        })?;
        self.dpu_read_bytes
            .fetch_add(into.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn write_through_dpu(
        &self,
        paths: &ProcessPaths,
        object: ObjectId,
        offset: u64,
        data: &[u8],
    ) -> Result<(), SodaRackError> {
        let dpu = self.dpu()?;
        let region = Self::region(object)?;
        Self::dpu_channels(paths)?.with(|channel| {
            let chunk = channel.chunk_bytes;
            for (index, piece) in data.chunks(chunk).enumerate() {
                let request = SodaRequestRepr::Write(WriteRequestRepr {
                    region,
                    page_offset: offset + (index * chunk) as u64,
                    data: piece,
                });
                self.count_sent(dpu, object);
                let immediate = match self.ask(channel, &request, object) {
                    Ok((_, immediate)) => immediate,
                    Err(error) => {
                        if nothing_sent(&error) {
                            self.take_back_count(dpu, object);
                        }
                        // Otherwise the DPU may hold it or not: the count
                        // stays (a room held too long, never one reused
                        // under a late write).
                        return Err(error);
                    }
                };
                // Held by the DPU, not yet by the memory node.
                channel.state.writes_sent =
                    channel.state.writes_sent.wrapping_add(1) & PERSISTED_MASK;
                channel
                    .state
                    .unconfirmed
                    .push_back((channel.state.writes_sent, object));
                self.confirm(dpu, channel, immediate);
            }
            Ok::<(), SodaRackError>(())
        })?;
        self.dpu_written_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Sends `request` to the DPU and waits for its reply; a reply with
    /// the error bit is `Refused`. Returns the reply and its immediate.
    fn ask(
        &self,
        channel: &mut Channel<WriteTracking>,
        request: &SodaRequestRepr<'_>,
        object: ObjectId,
    ) -> Result<(remora_rack::channel::Reply, u32), SodaRackError> {
        let mut bytes = vec![0u8; request.buffer_len()];
        request
            .emit(&mut bytes)
            .expect("the buffer is the request's length");
        let reply = channel.two_sided(&self.kicker, request.immediate(), &bytes)?;
        let immediate = reply.immediate.unwrap_or(REPLY_ERROR);
        if immediate & REPLY_ERROR != 0 {
            return Err(SodaRackError::Refused(object));
        }
        Ok((reply, immediate))
    }

    /// A failure on the DPU path loses the DPU's unpersisted writes: their
    /// objects are marked lost (those written two-sided and unconfirmed,
    /// and the pinned ones written in its static cache since they were
    /// pinned), and so is the object that failed.
    /// After a transfer of `object` failed on the DPU's path: whether the
    /// memory node's copy of it is whole, so the transfer may go there
    /// instead. It is when the DPU is dead and held none of the object's
    /// writes (nothing it held lands, and nothing of it is newer than the
    /// memory node's); otherwise the object is lost. A live DPU's failure
    /// (a timeout) may still land what it held, later than a direct write
    /// would.
    fn dpu_failed(&self, object: ObjectId, error: &SodaRackError) -> bool {
        if let Some(dpu) = &self.dpu {
            self.settle_what_the_dpu_held(dpu);
            if dpu.is_dead() && self.check_lost(object).is_ok() {
                return true;
            }
        }
        self.lost
            .lock()
            .expect("lost lock")
            .entry(object)
            .or_insert_with(|| error.to_string());
        false
    }

    /// Whether the DPU is dead; the first time that is seen, what it held
    /// is settled (its unconfirmed writes' objects and dirty pinned ones
    /// are lost), before any transfer goes past it to the memory node.
    fn after_the_dpu_died(&self) -> bool {
        let Some(dpu) = &self.dpu else {
            return false;
        };
        if !dpu.is_dead() {
            return false;
        }
        let mut settled = dpu.death_settled.lock().expect("death lock");
        if !*settled {
            self.settle_what_the_dpu_held(dpu);
            *settled = true;
        }
        true
    }

    /// After a failure on the DPU path: every object whose writes the DPU
    /// may hold unconfirmed is lost; and a DPU known dead holds nothing,
    /// so the rooms of released objects it held writes for are free.
    fn settle_what_the_dpu_held(&self, dpu: &DpuPath) {
        let mut lost = self.lost.lock().expect("lost lock");
        let held = "the DPU failed holding writes the memory node never got";
        let mut unconfirmed = dpu.unconfirmed.lock().expect("unconfirmed lock");
        let mut releasing = dpu.releasing.lock().expect("releasing lock");
        for other in unconfirmed
            .keys()
            .filter(|other| !releasing.contains(other))
        {
            lost.entry(*other).or_insert_with(|| held.into());
        }
        // An error on the path is not the DPU's death (a timeout of a
        // slow DPU, a retired channel). While it may live, every count
        // stays, so that an object's room is freed only once its
        // writes are confirmed: a live DPU's queued write landed in the
        // next object given the room (of an object released before
        // the error, and, when the counts were dropped here, of one
        // released after it).
        let released: Vec<ObjectId> = match dpu.is_dead() {
            true => {
                unconfirmed.clear();
                dpu.flush_holds.lock().expect("flush holds lock").clear();
                releasing.drain().collect()
            }
            false => Vec::new(),
        };
        drop(releasing);
        drop(unconfirmed);
        // What the dead DPU held never lands: their rooms are free.
        self.free_rooms(released);
        for other in self.pins.dirty_objects() {
            lost.entry(other).or_insert_with(|| held.into());
        }
    }

    fn check_lost(&self, object: ObjectId) -> Result<(), StoreError> {
        match self.lost.lock().expect("lost lock").get(&object) {
            Some(reason) => Err(StoreError::Lost {
                object,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }
}

/// The store's error for a pool's, naming the object.
pub(crate) fn pool_error(object: ObjectId) -> impl Fn(PoolError) -> StoreError {
    move |error| match error {
        PoolError::Full { wanted, free } => StoreError::Full { wanted, free },
        PoolError::Unknown => StoreError::UnknownObject(object),
        PoolError::OutOfRange {
            offset,
            end,
            length,
        } => StoreError::OutOfRange {
            object,
            offset,
            end,
            length,
        },
        error @ (PoolError::Memory(_) | PoolError::AlreadyHeld) => {
            StoreError::Remote(Box::new(error))
        }
    }
}

/// Where one object's chunks go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// One-sided to the DPU's static cache, at this offset.
    Static(u64),
    ThroughDpu,
    Direct,
}

/// How long pinning or unpinning may take before it is an error.
const STATIC_DEADLINE: Duration = Duration::from_secs(60);

impl SodaRack {
    /// The path of a transfer of `object`, given its static offset if
    /// it is pinned.
    fn path(&self, object: ObjectId, static_offset: Option<u64>) -> Path {
        if let Some(offset) = static_offset {
            return Path::Static(offset);
        }
        if self.dynamic.lock().expect("dynamic lock").contains(&object) {
            return Path::ThroughDpu;
        }
        match self.route {
            Route::Direct => Path::Direct,
            Route::ThroughDpu => Path::ThroughDpu,
        }
    }

    /// One-sided to the DPU's static cache.
    fn static_transfer(
        &self,
        paths: &ProcessPaths,
        at: u64,
        transfer: Transfer<'_>,
    ) -> Result<(), SodaRackError> {
        let region = self
            .dpu()?
            .state
            .lock()
            .expect("DPU state lock")
            .static_region();
        Ok(Self::dpu_channels(paths)?
            .with(|channel| channel.transfer(&self.kicker, region, at, transfer))?)
    }

    /// Waits until the DPU's static cache reaches `done` for `region`.
    fn wait_static(
        &self,
        region: RegionId,
        done: impl Fn(Option<StaticState>) -> bool,
    ) -> Result<(), SodaRackError> {
        let dpu = self.dpu()?;
        let deadline = Self::static_deadline();
        // Bounded by the deadline.
        loop {
            if done(
                dpu.state
                    .lock()
                    .expect("DPU state lock")
                    .static_state(region),
            ) {
                return Ok(());
            }
            // A dead DPU's static cache holds nothing and takes nothing: a
            // pin's load it died in, or one begun after, waited out the
            // whole deadline with the object's gate held, and every fault
            // on the object parked its fault thread meanwhile.
            if dpu.is_dead() {
                return Err(SodaRackError::DpuDead(region));
            }
            if Instant::now() > deadline || self.rack.lock().expect("rack lock").is_finished() {
                return Err(SodaRackError::StaticTimedOut(region));
            }
            self.kicker.kick();
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Routes `object`'s transfers through the DPU's dynamic cache, once
    /// those under way have finished (as a pin waits for them). A
    /// write-back that had taken the direct route went on after the advice
    /// returned: the DPU cached its entry before the write landed and
    /// served the old bytes from then on (found by reading). The DPU holds
    /// nothing of an object routed direct until now, so nothing it holds
    /// is stale.
    fn cache_dynamically(&self, object: ObjectId) -> Result<(), SodaRackError> {
        let already = self.dynamic.lock().expect("dynamic lock").contains(&object);
        if already || self.route == Route::ThroughDpu {
            // Its transfers go through the DPU already: nothing changes.
            self.dynamic.lock().expect("dynamic lock").insert(object);
            return Ok(());
        }
        let before = self.pins.begin_move(object, Self::static_deadline())?;
        self.dynamic.lock().expect("dynamic lock").insert(object);
        self.pins.end_move(object, before);
        Ok(())
    }

    fn pin(&self, object: ObjectId) -> Result<(), SodaRackError> {
        let dpu = self.dpu()?;
        let region = Self::region(object)?;
        if dpu.is_dead() {
            return Err(SodaRackError::DpuDead(region));
        }
        let before = self.pins.begin_move(object, Self::static_deadline())?;
        let recorded = matches!(before, Some(Standing::Pinned { .. }));
        let begun = {
            let mut state = dpu.state.lock().expect("DPU state lock");
            if !recorded {
                // A static copy the host does not record (left by a pin
                // that failed, the object written to the memory node
                // since) is stale: a pin took it as loaded and served it.
                state.begin_unpin(region, false);
            }
            // Looked at again under the lock the pin begins under: died
            // since the first look, the DPU took a load it never ran.
            match state.crashes() > 0 {
                true => Err(SodaRackError::DpuDead(region)),
                false => state.begin_pin(region).map_err(SodaRackError::from),
            }
        };
        let loaded = begun.and_then(|offset| {
            self.wait_static(region, |state| state == Some(StaticState::Ready))?;
            Ok(offset)
        });
        // Pinned again, it keeps its mark: a fresh clean one made an unpin
        // drop writes the memory node never got.
        let dirty = before.is_some_and(Standing::dirty);
        match loaded {
            Ok(offset) => {
                self.pins
                    .end_move(object, Some(Standing::Pinned { offset, dirty }));
                Ok(())
            }
            Err(error) => {
                if !recorded {
                    // Routed direct again: the copy is stale from the first
                    // write, and its space is another pin's.
                    dpu.state
                        .lock()
                        .expect("DPU state lock")
                        .begin_unpin(region, false);
                }
                self.pins.end_move(object, before);
                Err(error)
            }
        }
    }

    fn unpin(&self, object: ObjectId) -> Result<(), SodaRackError> {
        let before = self.pins.begin_move(object, Self::static_deadline())?;
        let Some(Standing::Pinned { dirty, .. }) = before else {
            self.pins.end_move(object, before);
            return Ok(());
        };
        let flushed = self.flush_static(object, dirty);
        if let Err(error) = &flushed {
            if dirty {
                // The memory node may never get the static copy's writes:
                // reading its copy from now on could return stale bytes.
                self.lost
                    .lock()
                    .expect("lost lock")
                    .insert(object, error.to_string());
            }
        }
        // Out of the static cache either way: the DPU frees the space once
        // the flush is done, so routing there again could read another
        // object's bytes.
        self.pins.end_move(object, None);
        flushed
    }

    /// Writes the DPU's static copy of `object` to the memory node, if
    /// `dirty`, and waits until the DPU has let it go.
    fn flush_static(&self, object: ObjectId, dirty: bool) -> Result<(), SodaRackError> {
        let region = Self::region(object)?;
        let dpu = self.dpu()?;
        let (held, crashes) = {
            let mut state = dpu.state.lock().expect("DPU state lock");
            (state.begin_unpin(region, dirty), state.crashes())
        };
        self.wait_static(region, |state| state.is_none())?;
        let crashed = dpu.state.lock().expect("DPU state lock").crashes() != crashes;
        if dirty && (!held || crashed) {
            // The DPU died with the only copy of the object's writes: an
            // unpin that returned would let the next fetch read the memory
            // node's stale copy.
            return Err(SodaRackError::StaticCopyLost(object));
        }
        Ok(())
    }

    fn static_deadline() -> Instant {
        Instant::now() + STATIC_DEADLINE
    }
}

impl SodaRack {
    /// Moves a chunk of `object` for process `process`, along the object's
    /// path; a failure on a DPU path marks what the DPU held as lost.
    fn move_for(
        &self,
        process: usize,
        object: ObjectId,
        offset: u64,
        transfer: Transfer<'_>,
    ) -> Result<(), StoreError> {
        let paths = &self.processes[process];
        // A dead DPU holds nothing: what it held settled, every transfer
        // goes to the memory node, whose copy of an object the DPU held no
        // writes of is whole (a clean object was lost with a cache).
        // Settled before the gate: a write marks its pinned object dirty
        // there, which the settling would take for a write the DPU held.
        let dpu_dead = self.after_the_dpu_died();
        // Past a dead DPU no write goes to a static copy: none dirties one
        // (an unpin would then take the object for lost). Decided once
        // through the gate, which a pin's load may hold for a long while
        // the DPU dies.
        let writes = matches!(transfer, Transfer::From(_));
        let dpu_alive = || self.dpu.as_ref().is_some_and(|dpu| !dpu.is_dead());
        let passage = self
            .pins
            .enter_deciding(object, || writes && dpu_alive(), Self::static_deadline())
            .map_err(SodaRackError::from)?;
        // Died while this waited at the gate: settled now, before the
        // object is checked.
        let dpu_dead = dpu_dead || self.after_the_dpu_died();
        // Checked once through the gate: a move may have lost the object.
        self.check_lost(object)?;
        let start = self
            .memory
            .lock()
            .expect("memory agent lock")
            .locate(object, offset, transfer.len())
            .map_err(pool_error(object))?;
        let path = match dpu_dead {
            true => Path::Direct,
            false => self.path(object, passage.static_offset),
        };
        let mut transfer = transfer;
        let result = match (path, transfer.reborrow()) {
            (Path::Direct, transfer) => self.direct_transfer(paths, start, transfer),
            (Path::ThroughDpu, Transfer::Into(into)) => {
                self.fetch_through_dpu(paths, object, offset, into)
            }
            (Path::ThroughDpu, Transfer::From(data)) => {
                self.write_through_dpu(paths, object, offset, data)
            }
            // A write makes the DPU's copy newer than the memory node's
            // (the gate marked it): it goes there when the object is
            // unpinned.
            (Path::Static(at), transfer) => self.static_transfer(paths, at + offset, transfer),
        };
        if let Err(error) = &result {
            // A refusal is the DPU answering: it is alive, and holds what
            // it held. Taken for its failure, it marked every object with
            // writes not yet confirmed as lost.
            let refused = matches!(error, SodaRackError::Refused(_));
            if path != Path::Direct && !refused && self.dpu_failed(object, error) {
                return Ok(self.direct_transfer(paths, start, transfer)?);
            }
        }
        Ok(result?)
    }
}

impl ChunkStore for SodaRack {
    fn name(&self) -> &'static str {
        match (self.route, self.dpu.is_some()) {
            (Route::Direct, false) => "memserver",
            _ => "dpu",
        }
    }

    fn reserve(
        &self,
        object: ObjectId,
        bytes: u64,
        initial: Option<&std::path::Path>,
    ) -> Result<(), StoreError> {
        if let Some(dpu) = &self.dpu {
            Self::region(object)?;
            // A room a landed flush held is free for this reserve.
            self.settle_flushes(dpu);
        }
        // A reused id starts clean: a DPU failure seen between its old
        // object's release and the DPU's confirmation marked it lost
        // again, and the new object inherited the mark (SIGBUS on first
        // touch).
        self.lost.lock().expect("lost lock").remove(&object);
        self.pins.forget(object);
        self.dynamic.lock().expect("dynamic lock").remove(&object);
        let mut memory = self.memory.lock().expect("memory agent lock");
        let mut reserved = memory.reserve(object, bytes);
        if let (Err(PoolError::Full { .. }), Some(dpu)) = (&reserved, &self.dpu) {
            // Released objects' rooms may wait only on confirmations the
            // DPU gives in replies that nobody asked for.
            drop(memory);
            self.ask_for_confirmations(dpu);
            memory = self.memory.lock().expect("memory agent lock");
            reserved = memory.reserve(object, bytes);
        }
        let start = reserved.map_err(pool_error(object))?;
        let data = crate::store::initial_data(initial, bytes);
        let loaded = data.and_then(|data| memory.write(start, &data).map_err(pool_error(object)));
        if let Err(error) = loaded {
            let _ = memory.release(object);
            return Err(error);
        }
        drop(memory);
        if let Some(dpu) = &self.dpu {
            let region = Self::region(object)?;
            dpu.state
                .lock()
                .expect("DPU state lock")
                .register_region(region, start, bytes);
        }
        Ok(())
    }

    fn fetch(&self, object: ObjectId, offset: u64, into: &mut [u8]) -> Result<(), StoreError> {
        self.move_for(0, object, offset, Transfer::Into(into))
    }

    fn write_back(&self, object: ObjectId, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        self.move_for(0, object, offset, Transfer::From(data))
    }

    fn release(&self, object: ObjectId) -> Result<(), StoreError> {
        self.pins.forget(object);
        self.dynamic.lock().expect("dynamic lock").remove(&object);
        if let (Some(dpu), Ok(region)) = (&self.dpu, Self::region(object)) {
            dpu.state
                .lock()
                .expect("DPU state lock")
                .forget_region(region);
        }
        self.lost.lock().expect("lost lock").remove(&object);
        if let Some(dpu) = &self.dpu {
            self.settle_flushes(dpu);
            if self.still_flushing(dpu, object) {
                // Its pieces still in flight: held as an unconfirmed write
                // is, until they land or the DPU is known dead.
                self.count_sent(dpu, object);
                dpu.flush_holds
                    .lock()
                    .expect("flush holds lock")
                    .insert(object);
            }
            let mut unconfirmed = dpu.unconfirmed.lock().expect("unconfirmed lock");
            if dpu.is_dead() {
                // Nothing it held lands now.
                unconfirmed.remove(&object);
            } else if unconfirmed.contains_key(&object) {
                // Freed when the DPU confirms its writes (see `releasing`).
                dpu.releasing.lock().expect("releasing lock").insert(object);
                return Ok(());
            }
        }
        self.memory
            .lock()
            .expect("memory agent lock")
            .release(object)
            .map(drop)
            .map_err(pool_error(object))
    }

    fn is_released(&self, object: ObjectId) -> bool {
        if let Some(dpu) = &self.dpu {
            // An id the DPU's 16-bit regions cannot name is never
            // reserved here: not released, so never named again.
            if Self::region(object).is_err() {
                return false;
            }
            let releasing = dpu.releasing.lock().expect("releasing lock");
            let flushing = dpu.flush_holds.lock().expect("flush holds lock");
            if releasing.contains(&object) || flushing.contains(&object) {
                return false;
            }
        }
        let memory = self.memory.lock().expect("memory agent lock");
        memory.held(object).is_none()
    }

    fn advise(&self, object: ObjectId, advice: Advice) -> Result<(), StoreError> {
        let unsupported = StoreError::Unsupported {
            store: self.name(),
            advice,
        };
        let Some(dpu) = &self.dpu else {
            return Err(unsupported);
        };
        match advice {
            Advice::Pin => Ok(self.pin(object)?),
            Advice::Unpin => Ok(self.unpin(object)?),
            Advice::CacheDynamically => {
                if !dpu
                    .state
                    .lock()
                    .expect("DPU state lock")
                    .has_dynamic_cache()
                {
                    return Err(unsupported);
                }
                Ok(self.cache_dynamically(object)?)
            }
        }
    }
}

impl Drop for SodaRack {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            tracing::error!(%error, "stopping the SODA rack failed");
        }
    }
}

/// One application process's view of a shared [`SodaRack`]: its own
/// channels, its objects numbered apart from the other processes', the
/// same memory node and DPU (and the DPU's caches).
pub struct ProcessStore {
    rack: Arc<SodaRack>,
    process: usize,
}

impl SodaRack {
    /// Process `process` (0 is the rack's own `ChunkStore`).
    pub fn process(rack: &Arc<SodaRack>, process: usize) -> Result<ProcessStore, SodaRackError> {
        if process >= rack.processes.len() {
            return Err(SodaRackError::Processes(process + 1));
        }
        Ok(ProcessStore {
            rack: Arc::clone(rack),
            process,
        })
    }
}

impl ProcessStore {
    fn global(&self, object: ObjectId) -> Result<ObjectId, StoreError> {
        if object.0 >= OBJECTS_PER_PROCESS {
            return Err(SodaRackError::TooManyObjects(object).into());
        }
        Ok(ObjectId(
            object.0 + self.process as u32 * OBJECTS_PER_PROCESS,
        ))
    }
}

impl ChunkStore for ProcessStore {
    fn name(&self) -> &'static str {
        self.rack.name()
    }

    fn reserve(
        &self,
        object: ObjectId,
        bytes: u64,
        initial: Option<&std::path::Path>,
    ) -> Result<(), StoreError> {
        self.rack.reserve(self.global(object)?, bytes, initial)
    }

    fn fetch(&self, object: ObjectId, offset: u64, into: &mut [u8]) -> Result<(), StoreError> {
        self.rack.move_for(
            self.process,
            self.global(object)?,
            offset,
            Transfer::Into(into),
        )
    }

    fn write_back(&self, object: ObjectId, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        self.rack.move_for(
            self.process,
            self.global(object)?,
            offset,
            Transfer::From(data),
        )
    }

    fn release(&self, object: ObjectId) -> Result<(), StoreError> {
        self.rack.release(self.global(object)?)
    }

    /// An id past the process's range can never be reserved here: not
    /// released, so it is never named again (given back, each refused id
    /// queued before the ids that would work).
    fn is_released(&self, object: ObjectId) -> bool {
        self.global(object)
            .is_ok_and(|global| self.rack.is_released(global))
    }

    fn advise(&self, object: ObjectId, advice: Advice) -> Result<(), StoreError> {
        self.rack.advise(self.global(object)?, advice)
    }
}

/// Whether a write's failure proves the DPU never got it: it refused it,
/// or the host never sent it (a retired channel, a buffer it could not
/// fill). A timeout or a failed completion proves nothing: the SEND may
/// have reached the DPU.
fn nothing_sent(error: &SodaRackError) -> bool {
    matches!(
        error,
        SodaRackError::Refused(_)
            | SodaRackError::Channel(ChannelError::Retired | ChannelError::Buffer(_))
    )
}

/// Takes one unconfirmed write of `object` off its count; true when that
/// was its last and the object had been released, so its room is free.
fn uncount(
    unconfirmed: &mut HashMap<ObjectId, u32>,
    releasing: &mut std::collections::HashSet<ObjectId>,
    object: ObjectId,
) -> bool {
    let Some(count) = unconfirmed.get_mut(&object) else {
        return false;
    };
    *count -= 1;
    if *count > 0 {
        return false;
    }
    unconfirmed.remove(&object);
    releasing.remove(&object)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK_BYTES: usize = 64 << 10;

    /// One process's rack with a DPU whose link to the memory node runs at
    /// 200 Mb/s (a chunk takes 2.6 ms), so writes wait in its queue.
    fn slow_dpu_rack(route: Route, static_bytes: u64) -> SodaRack {
        let config = SodaRackConfig {
            pool_bytes: 8 << 20,
            processes: 1,
            channels: 3,
            chunk_bytes: CHUNK_BYTES,
            dpu: Some(DpuConfig {
                static_bytes,
                ..DpuConfig::optimized(CHUNK_BYTES)
            }),
            route,
            links: RackLinks {
                memory: Some(LinkShape {
                    bandwidth_bits_per_second: 200_000_000,
                    propagation_delay: Duration::ZERO,
                    queue_limit_bytes: 1 << 20,
                }),
                ..Default::default()
            },
            hosts: None,
        };
        SodaRack::start(&config).unwrap()
    }

    /// Waits (at most 10 s, else fails saying `what` never happened)
    /// until `done`.
    fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "{what} never happened");
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Waits until the DPU has written a chunk to the memory node, then
    /// checks that `object`, reserved meanwhile, still reads zeros.
    fn assert_untouched_after_the_dpu_wrote(store: &SodaRack, object: ObjectId) {
        wait_until("the DPU's write", || {
            store.dpu_report().unwrap().0.written_bytes >= CHUNK_BYTES as u64
        });
        std::thread::sleep(Duration::from_millis(100));
        let mut chunk = vec![1u8; CHUNK_BYTES];
        store.fetch(object, 0, &mut chunk).unwrap();
        assert!(
            chunk.iter().all(|&byte| byte == 0),
            "the new object is untouched"
        );
    }

    /// A write of a chunk through the slow DPU, an error on the DPU path
    /// for another object while the DPU lives on, the written object's
    /// release (before the error or after it), and a new object reserved:
    /// the DPU's queued write must not land in the new one.
    fn a_live_dpu_write_after_an_error(release_before_the_error: bool) {
        let store = slow_dpu_rack(Route::ThroughDpu, 0);
        let (first, second) = (ObjectId(1), ObjectId(2));
        store.reserve(first, CHUNK_BYTES as u64, None).unwrap();
        store.write_back(first, 0, &[7u8; CHUNK_BYTES]).unwrap();
        if release_before_the_error {
            store.release(first).unwrap();
        }
        store.dpu_failed(ObjectId(3), &SodaRackError::Refused(ObjectId(3)));
        if !release_before_the_error {
            assert!(store.check_lost(first).is_err(), "its write may never land");
            store.release(first).unwrap();
        }
        store.reserve(second, CHUNK_BYTES as u64, None).unwrap();
        assert_untouched_after_the_dpu_wrote(&store, second);
        store.stop().unwrap();
    }

    /// A dead DPU holds nothing, but the rooms of objects released while
    /// it held their writes were freed only at a later failure on its
    /// path: an allocation that needed one asked the dead DPU for
    /// confirmations, got none, and failed as full.
    #[test]
    fn an_allocation_after_the_dpu_died_gets_the_rooms_it_held() {
        const OBJECT_BYTES: u64 = 5 << 20;
        let store = slow_dpu_rack(Route::ThroughDpu, 0);
        let (first, second) = (ObjectId(1), ObjectId(2));
        store.reserve(first, OBJECT_BYTES, None).unwrap();
        store.write_back(first, 0, &[7u8; CHUNK_BYTES]).unwrap();
        store.release(first).unwrap();
        let dpu = store.dpu().unwrap();
        assert!(
            !dpu.releasing.lock().unwrap().is_empty(),
            "the released object's room waits for its write's confirmation"
        );
        store.crash(DPU_HOST);
        store
            .reserve(second, OBJECT_BYTES, None)
            .expect("the dead DPU's room is free");
        store.reserve(first, CHUNK_BYTES as u64, None).unwrap();
        store.stop().unwrap();
    }

    /// A DPU config with a dynamic cache of 0-byte entries started a
    /// rack and divided by zero (a panic) as the DPU started.
    #[test]
    fn a_dpu_config_no_dpu_can_run_is_a_typed_error() {
        let mut config = SodaRackConfig::unshaped_with_dpu(CHUNK_BYTES, 1);
        let dpu = config.dpu.as_mut().unwrap();
        dpu.dynamic = Some(crate::cache::DynamicCacheConfig {
            capacity_bytes: 1 << 20,
            entry_bytes: 0,
            prefetch_depth: 0,
            mode: crate::cache::CacheMode::On,
        });
        assert!(matches!(
            SodaRack::start(&config),
            Err(SodaRackError::Dpu(crate::dpu::DpuError::Config(_)))
        ));
        config.dpu.as_mut().unwrap().dynamic = None;
        config.dpu.as_mut().unwrap().staging_slots = 0;
        assert!(matches!(
            SodaRack::start(&config),
            Err(SodaRackError::Dpu(crate::dpu::DpuError::Config(_)))
        ));
    }

    /// An error on the DPU path (a slow DPU's timeout, a retired channel)
    /// was taken for the DPU's death: the rooms of objects released while
    /// it still held writes to them were freed, the next object took one,
    /// and the live DPU's queued write landed in it. Freed only for a DPU
    /// known dead now.
    #[test]
    fn an_error_on_the_dpu_path_frees_no_room_a_live_dpu_still_writes() {
        a_live_dpu_write_after_an_error(true);
    }

    /// The same error, but the object released after it: the error dropped
    /// the counts of objects not yet released, so the release found none
    /// and freed the room at once, and the live DPU's queued write landed
    /// in the next object given it.
    #[test]
    fn a_release_after_a_dpu_path_error_frees_no_room_a_live_dpu_still_writes() {
        a_live_dpu_write_after_an_error(false);
    }

    /// Counting a write from the moment it is sent left a count for every
    /// write that failed after the DPU crashed (the first failure settled
    /// the crash, and later ones read as a live DPU's): the released
    /// object's room was never given back, and its id could not be
    /// reserved again. A crashed DPU is dead for good: nothing sent to it
    /// lands, and its counts hold nothing. (Writes after the crash now go
    /// to the memory node, past the dead DPU, and land.)
    #[test]
    fn writes_after_the_dpu_crashed_hold_no_room() {
        let store = slow_dpu_rack(Route::ThroughDpu, 0);
        let (first, second) = (ObjectId(1), ObjectId(2));
        for object in [first, second] {
            store.reserve(object, CHUNK_BYTES as u64, None).unwrap();
        }
        store.crash(DPU_HOST);
        store.write_back(first, 0, &[7u8; CHUNK_BYTES]).unwrap();
        store.write_back(second, 0, &[7u8; CHUNK_BYTES]).unwrap();
        store.release(second).unwrap();
        store.reserve(second, CHUNK_BYTES as u64, None).unwrap();
        let mut into = vec![0u8; CHUNK_BYTES];
        store.fetch(first, 0, &mut into).unwrap();
        assert!(into.iter().all(|&byte| byte == 7), "the write landed");
        store.stop().unwrap();
    }

    /// A pin whose load the DPU died in waited out the static cache's
    /// whole deadline (a minute) with the object's gate held, and so did
    /// every pin after the death. Both fail at once now.
    #[test]
    fn a_pin_on_a_dying_or_dead_dpu_fails_at_once() {
        const OBJECT_BYTES: u64 = 64 * CHUNK_BYTES as u64;
        let store = slow_dpu_rack(Route::Direct, OBJECT_BYTES);
        let object = ObjectId(1);
        store.reserve(object, OBJECT_BYTES, None).unwrap();
        let started = Instant::now();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                // The load takes about 170 ms over the 200 Mb/s link.
                std::thread::sleep(Duration::from_millis(30));
                store.crash(DPU_HOST);
            });
            assert!(store.advise(object, Advice::Pin).is_err());
        });
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the pin waited"
        );
        let started = Instant::now();
        assert!(matches!(store.pin(object), Err(SodaRackError::DpuDead(_))));
        assert!(started.elapsed() < Duration::from_secs(1));
        // The object is still whole, on the memory node.
        let mut chunk = vec![1u8; CHUNK_BYTES];
        store.fetch(object, 0, &mut chunk).unwrap();
        assert!(chunk.iter().all(|&byte| byte == 0));
        store.stop().unwrap();
    }

    /// A dirty unpin whose flush did not finish in time held its object's
    /// room once the object was released, and nothing took the hold back
    /// when the flush landed: a live DPU's room leaked, and the id could
    /// not be reserved again.
    #[test]
    fn a_released_objects_room_is_freed_once_its_late_flush_lands() {
        const OBJECT_BYTES: usize = 16 * CHUNK_BYTES;
        let store = slow_dpu_rack(Route::Direct, OBJECT_BYTES as u64);
        let object = ObjectId(1);
        store.reserve(object, OBJECT_BYTES as u64, None).unwrap();
        store.advise(object, Advice::Pin).unwrap();
        store.write_back(object, 0, &[7u8; CHUNK_BYTES]).unwrap();
        // What an unpin past its deadline leaves: a flush in flight (1 MiB
        // at 200 Mb/s takes 42 ms).
        let region = SodaRack::region(object).unwrap();
        let dpu = store.dpu().unwrap();
        dpu.state
            .lock()
            .expect("DPU state lock")
            .begin_unpin(region, true);
        let state = || dpu.state.lock().expect("DPU state lock");
        // Released once pieces are on their way (queued ones are dropped
        // by the release, and never land).
        wait_until("the flush's start", || {
            state().static_pieces_posted(region) > 0
        });
        store.release(object).unwrap();
        assert!(
            !dpu.flush_holds.lock().expect("flush holds lock").is_empty(),
            "released with its flush in flight"
        );
        wait_until("the flush's landing", || {
            !state().has_flush_pieces_in_flight(region)
        });
        store.reserve(object, OBJECT_BYTES as u64, None).unwrap();
        store.stop().unwrap();
    }

    /// A pinned object of no bytes, written (and so dirty), was flushed in
    /// no pieces: none ever said it was done, and the unpin waited out its
    /// 60 s deadline and reported the object lost.
    #[test]
    fn unpinning_an_empty_dirty_object_returns_at_once() {
        let store = slow_dpu_rack(Route::Direct, CHUNK_BYTES as u64);
        let object = ObjectId(1);
        store.reserve(object, 0, None).unwrap();
        store.advise(object, Advice::Pin).unwrap();
        store.write_back(object, 0, &[]).unwrap();
        let started = Instant::now();
        store.advise(object, Advice::Unpin).unwrap();
        assert!(started.elapsed() < Duration::from_secs(5));
        store.release(object).unwrap();
        store.reserve(object, 0, None).unwrap();
        store.stop().unwrap();
    }

    /// A pin that failed (its load past the deadline) left the DPU's copy
    /// behind while the host routed the object to the memory node again.
    /// Pinned once more, the object was served from that copy, older than
    /// the writes made in between.
    #[test]
    fn a_pin_that_failed_leaves_no_stale_static_copy_behind() {
        let store = slow_dpu_rack(Route::Direct, CHUNK_BYTES as u64);
        let object = ObjectId(1);
        store.reserve(object, CHUNK_BYTES as u64, None).unwrap();
        let region = SodaRack::region(object).unwrap();
        // What a failed pin leaves: a loaded copy the host does not record.
        let dpu = store.dpu().unwrap();
        dpu.state
            .lock()
            .expect("DPU state lock")
            .begin_pin(region)
            .unwrap();
        store
            .wait_static(region, |state| state == Some(StaticState::Ready))
            .unwrap();
        store.write_back(object, 0, &[7u8; CHUNK_BYTES]).unwrap();

        store.advise(object, Advice::Pin).unwrap();

        let mut chunk = vec![0u8; CHUNK_BYTES];
        store.fetch(object, 0, &mut chunk).unwrap();
        assert!(chunk.iter().all(|&byte| byte == 7), "the newest bytes");
        store.stop().unwrap();
    }
}
