//! Far memory as the device: a pool on the memory node of the embedded
//! rack, reached by each thread on its own path.
//!
//! - **One-sided, synchronous**: each read is a READ posted on the
//!   thread's queue pair and waited for (one at a time).
//! - **One-sided, asynchronous**: READs and WRITEs are posted as issued
//!   and the doorbell rung once per poll, so a batch of up to 100 shares
//!   one (doorbell batching).
//! - **Cowbird** (Spot on the memory node, or P4 in the switch): each
//!   thread's queue is a Cowbird instance. As §7 says, the queue calls
//!   `poll_create` once, `poll_add` after every `async_read`/`async_write`
//!   and `poll_wait` when the store polls. A full ring is handled as
//!   §4.3 says: a write retries at once, a read first drains the reads
//!   already issued.
//!
//! Queues go back to the device when dropped, so a store can open and
//! close sessions freely: the device holds a path per session plus one
//! for the log's flushes.

use super::{check_range, Completed, Device, DeviceError, DeviceQueue, Finished};
use remora_base::BufferPool;
use remora_cowbird::client::{Client, Completion, CowbirdError};
use remora_cowbird::deploy::{CowbirdSpec, Direct, DirectSpec};
use remora_cowbird::far_memory::{FarMemoryRack, Offload};
use remora_cowbird::layout::{RequestId, RingSizes, MAX_REQUEST_BYTES};
use remora_cowbird::spot::SpotConfig;
use remora_rack::attach::AttachedNode;
use remora_rack::endpoint::{AppQueues, DriverKicker, RACK_ACK_TIMEOUT};
use remora_rack::RackConfig;
use remora_rnic::{
    CompletionQueue, CompletionStatus, DataPath, MemoryRegion, QueuePair, ReceiveRequest,
    RemoteAddress, SendOperation, SendRequest, VerbsError, WorkCompletion,
};
use remora_wire::{Rkey, VirtAddr};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Requests one path keeps outstanding: the paper's batch of 100.
pub const WINDOW: usize = 100;
/// Bytes of one landing slot: a write longer than this goes as several.
pub const SLOT_BYTES: usize = 64 * 1024;
/// How long a queue waits for its NIC or engine before reporting it stuck.
const MAX_WAIT: Duration = Duration::from_secs(10);

/// Which far-memory path a device takes.
#[derive(Debug, Clone, Copy)]
pub enum FarMemoryPath {
    OneSidedSync,
    OneSidedAsync,
    CowbirdSpot,
    CowbirdP4(remora_cowbird::p4::P4Config),
}

impl FarMemoryPath {
    pub fn name(self) -> &'static str {
        match self {
            FarMemoryPath::OneSidedSync => "one-sided-sync",
            FarMemoryPath::OneSidedAsync => "one-sided-async",
            FarMemoryPath::CowbirdSpot => "cowbird-spot",
            FarMemoryPath::CowbirdP4(_) => "cowbird-p4",
        }
    }

    fn offload(self) -> Offload {
        match self {
            FarMemoryPath::OneSidedSync | FarMemoryPath::OneSidedAsync => Offload::None,
            FarMemoryPath::CowbirdSpot => Offload::Spot,
            FarMemoryPath::CowbirdP4(config) => Offload::P4(config),
        }
    }
}

/// A verb's failure: a NIC that is gone (its host crashed) is
/// [`DeviceError::Gone`], so the store's caller can tell it from a bug.
fn verbs_error(error: VerbsError) -> DeviceError {
    match error {
        VerbsError::DeviceGone => DeviceError::Gone,
        other => far_error(other),
    }
}

fn far_error(error: impl std::fmt::Display) -> DeviceError {
    DeviceError::FarMemory(error.to_string())
}

/// Whether the fabric a device's paths run on has stopped (failed, or
/// stopped with the device): work in flight then never completes. A queue
/// waiting on some says so at once; it waited out its 10 s.
#[derive(Clone, Default)]
struct FabricWatch(Option<Arc<AtomicBool>>);

impl FabricWatch {
    fn check(&self) -> Result<(), DeviceError> {
        match &self.0 {
            Some(stopped) if stopped.load(std::sync::atomic::Ordering::Relaxed) => Err(far_error(
                "the fabric thread has stopped: work in flight will not complete",
            )),
            _ => Ok(()),
        }
    }
}

/// Whether the engine serving a Cowbird instance has stopped serving it
/// (a Spot instance failure, a failed Cowbird-P4 instance) while the
/// fabric runs on: its work in flight then never completes. A queue
/// waiting on some says so, with the engine's reason; it waited out its
/// 10 s (the store its 30 s), and its drop 10 s more, naming nothing.
#[derive(Clone, Default)]
struct EngineWatch(Option<Arc<dyn Fn(usize) -> Option<String> + Send + Sync>>);

/// Quiet looks of a Cowbird queue between two questions to its engine:
/// asking takes the engine's lock, which the fabric thread takes each turn.
const ENGINE_LOOK_EVERY: u32 = 1024;

impl EngineWatch {
    /// The engine of `rack`'s Cowbird instances, if it has one.
    fn of(rack: &FarMemoryRack) -> EngineWatch {
        if let Some(agent) = rack.engine.clone() {
            return EngineWatch(Some(Arc::new(move |instance| {
                let agent = agent.lock().unwrap_or_else(|e| e.into_inner());
                agent
                    .failures()
                    .iter()
                    .find(|failure| failure.instance == instance)
                    .map(|failure| failure.error.to_string())
            })));
        }
        if let Some(switch) = rack.p4_switch.clone() {
            return EngineWatch(Some(Arc::new(move |instance| {
                let endpoint = switch.lock().unwrap_or_else(|e| e.into_inner());
                let engine = endpoint.switch.program().overlay();
                engine.failure(instance).map(str::to_string)
            })));
        }
        EngineWatch(None)
    }

    fn check(&self, instance: usize) -> Result<(), DeviceError> {
        match self.0.as_ref().and_then(|failure| failure(instance)) {
            Some(reason) => Err(far_error(format!(
                "the Cowbird engine stopped serving this queue's instance: {reason}"
            ))),
            None => Ok(()),
        }
    }
}

/// A path a queue takes and gives back.
enum Path {
    Verbs(Box<VerbsPath>),
    /// A client and its instance's number in the engine.
    Cowbird(Box<Client>, usize),
}

/// How a queue's verbs reach its NIC: a data path and a doorbell.
pub trait VerbsPort: DataPath + Send {
    /// Tells the NIC that work was posted since the last ring.
    fn ring_doorbell(&mut self);
}

/// The embedded rack's lock-free application queues, whose doorbell
/// kicks the rack's driver.
struct KickedQueues {
    queues: AppQueues,
    kicker: DriverKicker,
}

impl DataPath for KickedQueues {
    fn post_send(&mut self, queue_pair: QueuePair, request: SendRequest) -> Result<(), VerbsError> {
        self.queues.post_send(queue_pair, request)
    }

    fn post_receive(
        &mut self,
        queue_pair: QueuePair,
        request: ReceiveRequest,
    ) -> Result<(), VerbsError> {
        self.queues.post_receive(queue_pair, request)
    }

    fn poll_completion(
        &mut self,
        queue: CompletionQueue,
    ) -> Result<Option<WorkCompletion>, VerbsError> {
        self.queues.poll_completion(queue)
    }
}

impl VerbsPort for KickedQueues {
    fn ring_doorbell(&mut self) {
        self.kicker.kick();
    }
}

/// A queue pair to the pool, the host memory its verbs land in, and the
/// port its verbs go through.
pub struct VerbsPath {
    pub direct: Direct,
    pub port: Box<dyn VerbsPort>,
}

impl VerbsPath {
    fn kicked(direct: Direct, queues: AppQueues, kicker: DriverKicker) -> Box<VerbsPath> {
        Box::new(VerbsPath {
            direct,
            port: Box::new(KickedQueues { queues, kicker }),
        })
    }
}

/// The memory node's region, as the compute side addresses it.
#[derive(Debug, Clone, Copy)]
struct RemotePool {
    address: u64,
    rkey: Rkey,
}

impl RemotePool {
    fn remote(&self, offset: u64) -> RemoteAddress {
        RemoteAddress {
            address: VirtAddr(self.address + offset),
            rkey: self.rkey,
        }
    }
}

/// What the device's paths run on.
enum Backing {
    /// An embedded rack of the device's own (this process).
    Embedded(FarMemoryRack),
    /// This process as a node of a rack whose switch and memory node are
    /// processes of their own.
    Attached(AttachedNode),
}

/// A far-memory device: a pool on a memory node, a path to it per queue.
pub struct FarMemoryDevice {
    name: &'static str,
    path: FarMemoryPath,
    capacity_bytes: u64,
    pool: RemotePool,
    paths: Arc<Mutex<Vec<Path>>>,
    backing: Mutex<Option<Backing>>,
    fabric: FabricWatch,
    engine: EngineWatch,
}

impl FarMemoryDevice {
    /// Starts a rack whose pool holds `capacity_bytes`, with `queues`
    /// paths (sessions at once, plus one for the log's flushes).
    pub fn start(
        path: FarMemoryPath,
        capacity_bytes: u64,
        queues: usize,
    ) -> Result<FarMemoryDevice, DeviceError> {
        // Checked before the rack allocates the memory node's pool: past
        // the limit the deployment fails only after that allocation,
        // which for a large request aborts the process.
        let limit_bytes = remora_rnic::RnicConfig::DEFAULT_MAX_REGION_BYTES;
        if capacity_bytes > limit_bytes {
            return Err(DeviceError::TooLarge {
                capacity_bytes,
                limit_bytes,
            });
        }
        let verbs = matches!(
            path,
            FarMemoryPath::OneSidedSync | FarMemoryPath::OneSidedAsync
        );
        let spec = CowbirdSpec {
            // Deploys a Cowbird instance and a direct queue pair per
            // queue; the device hands out only the ones its path uses.
            threads: queues,
            sizes: RingSizes::DEFAULT,
            pool_regions: vec![capacity_bytes],
            spot: SpotConfig::DEFAULT,
            ack_timeout: RACK_ACK_TIMEOUT,
            direct: verbs.then_some(DirectSpec {
                depth: WINDOW,
                landing_bytes: WINDOW * SLOT_BYTES,
            }),
            rpc: None,
        };
        let fill = |_, _: &mut _| Ok(());
        let mut rack =
            FarMemoryRack::start(spec, path.offload(), Box::new(fill)).map_err(far_error)?;
        let kicker = rack.kicker();
        let paths: Vec<Path> = if verbs {
            let direct = rack.direct.drain(..);
            direct
                .map(|(direct, queues)| {
                    Path::Verbs(VerbsPath::kicked(direct, queues, kicker.clone()))
                })
                .collect()
        } else {
            let clients = rack.clients.drain(..);
            clients
                .enumerate()
                .map(|(instance, client)| Path::Cowbird(Box::new(client), instance))
                .collect()
        };
        Ok(FarMemoryDevice {
            name: path.name(),
            path,
            capacity_bytes,
            pool: RemotePool {
                address: rack.pool.address.0,
                rkey: rack.pool.rkey,
            },
            paths: Arc::new(Mutex::new(paths)),
            fabric: FabricWatch(Some(rack.rack.fabric().stopped_flag())),
            engine: EngineWatch::of(&rack),
            backing: Mutex::new(Some(Backing::Embedded(rack))),
        })
    }

    /// Joins `rack` as its node `node` and takes memory node `memory`'s
    /// region as the device (one-sided, asynchronous): the region outlives
    /// this process, so a store here can be recovered by the next.
    /// `queues` queue pairs are connected (sessions plus one for flushes).
    pub fn on_rack(
        rack: &RackConfig,
        node: &str,
        memory: &str,
        run_directory: &std::path::Path,
        queues: usize,
        stop: &AtomicBool,
    ) -> Result<FarMemoryDevice, DeviceError> {
        let attached = AttachedNode::attach(rack, node).map_err(far_error)?;
        let mut paths = Vec::with_capacity(queues);
        let mut region = None;
        for _ in 0..queues {
            let remote = attached
                .connect(
                    rack,
                    memory,
                    run_directory,
                    WINDOW,
                    WINDOW * SLOT_BYTES,
                    stop,
                )
                .map_err(far_error)?;
            region = Some(remote.region);
            let direct = Direct {
                queue_pair: remote.queue_pair,
                completion_queue: remote.completion_queue,
                landing: remote.landing,
                landing_region: remote.landing_region,
            };
            paths.push(Path::Verbs(VerbsPath::kicked(
                direct,
                remote.queues,
                attached.kicker(),
            )));
        }
        let region = region.ok_or_else(|| far_error("a device needs at least one queue"))?;
        Ok(FarMemoryDevice {
            name: "rack-one-sided-async",
            path: FarMemoryPath::OneSidedAsync,
            capacity_bytes: region.length_bytes,
            pool: RemotePool {
                address: region.address,
                rkey: Rkey(region.rkey),
            },
            paths: Arc::new(Mutex::new(paths)),
            fabric: FabricWatch(attached.fabric_stopped_flag()),
            engine: EngineWatch::default(),
            backing: Mutex::new(Some(Backing::Attached(attached))),
        })
    }

    /// A device on paths made elsewhere (a running rack's own NICs, as
    /// [`super::rack_nic::connect`] makes them) to `region` on the memory
    /// node, one-sided and asynchronous. Nothing of its own to stop.
    pub fn on_paths(
        name: &'static str,
        region: &MemoryRegion,
        paths: Vec<VerbsPath>,
    ) -> FarMemoryDevice {
        let paths = paths
            .into_iter()
            .map(|path| Path::Verbs(Box::new(path)))
            .collect();
        FarMemoryDevice {
            name,
            path: FarMemoryPath::OneSidedAsync,
            capacity_bytes: region.length_bytes,
            pool: RemotePool {
                address: region.address.0,
                rkey: region.rkey,
            },
            paths: Arc::new(Mutex::new(paths)),
            backing: Mutex::new(None),
            fabric: FabricWatch::default(),
            engine: EngineWatch::default(),
        }
    }

    /// Stops the rack and returns the fabric thread's CPU time (NIC
    /// emulation, switch, and the Spot engine when it runs there).
    pub fn stop(&self) -> Result<Duration, DeviceError> {
        let backing = self
            .backing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match backing {
            Some(Backing::Embedded(mut rack)) => rack.rack.stop_and_join().map_err(far_error),
            Some(Backing::Attached(mut node)) => node.stop().map_err(far_error),
            None => Ok(Duration::ZERO),
        }
    }

    /// The memory node's engine's busy time so far (Spot), if it has one.
    pub fn engine_busy(&self) -> Duration {
        let backing = self.backing.lock().unwrap_or_else(|e| e.into_inner());
        let nanos = match backing.as_ref() {
            Some(Backing::Embedded(rack)) => rack
                .engine_busy
                .iter()
                .map(|busy| busy.load(std::sync::atomic::Ordering::Relaxed))
                .sum(),
            _ => 0,
        };
        Duration::from_nanos(nanos)
    }
}

impl Device for FarMemoryDevice {
    fn name(&self) -> &str {
        self.name
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn open_queue(&self) -> Result<Box<dyn DeviceQueue>, DeviceError> {
        let path = self
            .paths
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .ok_or_else(|| {
                far_error("every path to the pool is taken: start the device with more queues")
            })?;
        let returns = self.paths.clone();
        Ok(match path {
            Path::Verbs(path) => Box::new(VerbsQueue::new(
                path,
                (returns, self.fabric.clone()),
                self.pool,
                self.capacity_bytes,
                matches!(self.path, FarMemoryPath::OneSidedSync),
            )),
            Path::Cowbird(client, instance) => Box::new(CowbirdQueue::new(
                (client, instance),
                (returns, self.fabric.clone(), self.engine.clone()),
                self.capacity_bytes,
            )?),
        })
    }
}

/// What a landing slot is doing.
#[derive(Clone, Copy)]
enum SlotUse {
    /// The piece at `at` of a read (a whole read of at most a slot is its
    /// only piece).
    ReadPiece {
        request: RequestNumber,
        at: usize,
        length: usize,
    },
    WritePiece {
        request: RequestNumber,
    },
}

impl SlotUse {
    fn request(self) -> RequestNumber {
        match self {
            SlotUse::ReadPiece { request, .. } | SlotUse::WritePiece { request } => request,
        }
    }
}

/// One thread's queue pair to the pool.
struct VerbsQueue {
    path: Option<Box<VerbsPath>>,
    returns: Arc<Mutex<Vec<Path>>>,
    fabric: FabricWatch,
    pool: RemotePool,
    capacity_bytes: u64,
    synchronous: bool,
    free_slots: Vec<usize>,
    slots: Vec<Option<SlotUse>>,
    /// Reads and writes, gathered from their slots' pieces.
    pieces: PieceTracker,
    posted_since_kick: bool,
    finished: Finished,
    /// Why the queue pair failed, once a verb completed in error: the
    /// queue pair is then in the error state and flushes all it is given,
    /// so new work is refused and the path is not given back.
    broken: Option<String>,
}

impl VerbsQueue {
    fn new(
        path: Box<VerbsPath>,
        (returns, fabric): (Arc<Mutex<Vec<Path>>>, FabricWatch),
        pool: RemotePool,
        capacity_bytes: u64,
        synchronous: bool,
    ) -> VerbsQueue {
        VerbsQueue {
            path: Some(path),
            returns,
            fabric,
            pool,
            capacity_bytes,
            synchronous,
            free_slots: (0..WINDOW).rev().collect(),
            slots: vec![None; WINDOW],
            pieces: PieceTracker::default(),
            posted_since_kick: false,
            finished: Finished::default(),
            broken: None,
        }
    }

    fn check_unbroken(&self) -> Result<(), DeviceError> {
        match &self.broken {
            Some(reason) => Err(far_error(format!("the queue pair failed: {reason}"))),
            None => Ok(()),
        }
    }

    fn path(&mut self) -> &mut VerbsPath {
        self.path.as_mut().expect("held until drop")
    }

    /// A free slot, waiting for completions if every one is in flight.
    fn take_slot(&mut self) -> Result<usize, DeviceError> {
        collect_until(
            self,
            VerbsQueue::collect,
            |queue| !queue.free_slots.is_empty(),
            "no READ or WRITE completed within 10 s",
        )?;
        Ok(self.free_slots.pop().expect("a slot is free"))
    }

    /// Collects until every piece of `request` is back, for at most 10 s.
    fn await_request(&mut self, request: RequestNumber) -> Result<(), DeviceError> {
        collect_until(
            self,
            VerbsQueue::collect,
            |queue| !queue.pieces.requests.contains_key(&request),
            "a synchronous READ did not complete within 10 s",
        )
    }

    /// Takes a slot for a piece and posts it; a post refused gives the
    /// slot back, so that the piece counts as never issued.
    fn post_piece(
        &mut self,
        slot_use: SlotUse,
        operation: SendOperation,
        length: usize,
        stage: impl FnOnce(&VerbsPath, usize) -> Result<(), DeviceError>,
    ) -> Result<(), DeviceError> {
        let slot = self.take_slot()?;
        let posted = stage(self.path(), slot).and_then(|()| self.post(slot, operation, length));
        match posted {
            Ok(()) => self.slots[slot] = Some(slot_use),
            Err(_) => self.free_slots.push(slot),
        }
        posted
    }

    fn post(
        &mut self,
        slot: usize,
        operation: SendOperation,
        length: usize,
    ) -> Result<(), DeviceError> {
        let path = self.path();
        let local = path
            .direct
            .landing_region
            .slice((slot * SLOT_BYTES) as u64, length as u32);
        let request = SendRequest::new(slot as u64, operation, &[local]).map_err(far_error)?;
        let queue_pair = path.direct.queue_pair;
        // A window of slots never overfills a queue of the window's depth.
        path.port
            .post_send(queue_pair, request)
            .map_err(verbs_error)?;
        self.posted_since_kick = true;
        Ok(())
    }

    fn kick(&mut self) {
        if std::mem::take(&mut self.posted_since_kick) {
            self.path().port.ring_doorbell();
        }
    }

    /// Rings the doorbell if needed and takes every completion there is.
    fn collect(&mut self) -> Result<(), DeviceError> {
        self.kick();
        loop {
            let path = self.path.as_mut().expect("held until drop");
            let completion_queue = path.direct.completion_queue;
            let Some(completion) = path
                .port
                .poll_completion(completion_queue)
                .map_err(verbs_error)?
            else {
                if self.free_slots.len() < WINDOW {
                    self.fabric.check()?;
                }
                return Ok(());
            };
            let slot = completion.work_request_id as usize;
            let slot_use = self.slots[slot]
                .take()
                .expect("completions name posted slots");
            self.free_slots.push(slot);
            // A failed verb fails its request by its token, and leaves
            // the queue pair in the error state: the queue is broken. The
            // slot is free again either way.
            if completion.status != CompletionStatus::Success {
                let reason = format!("a verb completed with {:?}", completion.status);
                self.broken.get_or_insert_with(|| reason.clone());
                self.pieces.failed_piece(slot_use.request(), reason);
                continue;
            }
            match slot_use {
                SlotUse::ReadPiece {
                    request,
                    at,
                    length,
                } => {
                    let landing = &path.direct.landing;
                    self.pieces
                        .piece((request, at, length), &mut self.finished, |into| {
                            landing.read(slot * SLOT_BYTES, into).map_err(far_error)
                        });
                }
                SlotUse::WritePiece { request } => {
                    self.pieces.write_piece(request, &mut self.finished)
                }
            }
        }
    }
}

impl DeviceQueue for VerbsQueue {
    fn read(&mut self, offset: u64, length: usize, token: u64) -> Result<(), DeviceError> {
        check_range(offset, length as u64, self.capacity_bytes)?;
        self.check_unbroken()?;
        // A READ per slot's worth (an empty read is one empty piece).
        let pieces = length.div_ceil(SLOT_BYTES).max(1);
        let request = self
            .pieces
            .start_read(token, length, pieces, &mut self.finished);
        issue_pieces(
            self,
            |queue| &mut queue.pieces,
            (request, pieces),
            |queue, piece| {
                let at = piece * SLOT_BYTES;
                let piece_length = SLOT_BYTES.min(length - at);
                let slot_use = SlotUse::ReadPiece {
                    request,
                    at,
                    length: piece_length,
                };
                let remote = queue.pool.remote(offset + at as u64);
                let operation = SendOperation::Read { remote };
                queue.post_piece(slot_use, operation, piece_length, |_, _| Ok(()))
            },
        )?;
        if self.synchronous {
            // Until every piece is back (done or failed). A wait that ends
            // in an error leaves the request abandoned: the store frees its
            // token, and the read arriving late must not complete the next.
            let waited = self.await_request(request);
            if waited.is_err() {
                self.pieces.abandon(request, pieces, pieces);
            }
            waited?;
        }
        Ok(())
    }

    fn write(&mut self, offset: u64, data: &[u8], token: u64) -> Result<(), DeviceError> {
        check_range(offset, data.len() as u64, self.capacity_bytes)?;
        self.check_unbroken()?;
        let pieces = data.chunks(SLOT_BYTES).count();
        let request = self.pieces.start_write(token, pieces, &mut self.finished);
        let chunks: Vec<&[u8]> = data.chunks(SLOT_BYTES).collect();
        issue_pieces(
            self,
            |queue| &mut queue.pieces,
            (request, pieces),
            |queue, number| {
                let piece = chunks[number];
                let remote = queue.pool.remote(offset + (number * SLOT_BYTES) as u64);
                let operation = SendOperation::Write {
                    remote,
                    immediate: None,
                };
                let stage = |path: &VerbsPath, slot: usize| {
                    let landing = &path.direct.landing;
                    landing.write(slot * SLOT_BYTES, piece).map_err(far_error)
                };
                let slot_use = SlotUse::WritePiece { request };
                queue.post_piece(slot_use, operation, piece.len(), stage)
            },
        )
    }

    fn poll(&mut self, done: &mut dyn FnMut(u64, Completed<'_>)) -> Result<usize, DeviceError> {
        let collected = self.collect();
        report_finished(collected, &mut self.finished, &mut self.pieces, done)
    }

    fn in_flight(&self) -> usize {
        WINDOW - self.free_slots.len() + self.finished.len() + self.pieces.failed.len()
    }
}

impl Drop for VerbsQueue {
    fn drop(&mut self) {
        // What is in flight finishes before the path goes back for the next
        // session: its completions come on the path's completion queue,
        // and the next queue on it took them for its own slots' (a READ
        // then returned another request's bytes, or a panic). A path whose
        // work fails or does not finish in time is not given back, nor one
        // whose queue pair failed (it flushes everything from then on).
        let finished = collect_until(
            self,
            VerbsQueue::collect,
            |queue| queue.free_slots.len() == WINDOW,
            "a far-memory path's work did not finish",
        );
        if finished.is_err() {
            tracing::warn!("a far-memory path's work did not finish; the path is dropped");
            return;
        }
        if let Some(reason) = &self.broken {
            tracing::warn!(%reason, "a far-memory path's queue pair failed; the path is dropped");
            return;
        }
        if let Some(path) = self.path.take() {
            let mut paths = self.returns.lock().unwrap_or_else(|e| e.into_inner());
            paths.push(Path::Verbs(path));
        }
    }
}

/// A device request's number, the queue's own: the store's token names a
/// request only until it completes or fails, and the store reuses a
/// failed request's token at once. A piece of the failed request still in
/// flight carries its request's number, so it cannot land in the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct RequestNumber(u64);

/// One request issued as several pieces (a READ or WRITE each).
struct Assembly {
    /// The store's token.
    token: u64,
    /// A read's bytes, gathered piece by piece; `None` for a write.
    bytes: Option<Vec<u8>>,
    /// Pieces still to arrive.
    left: usize,
    /// The request failed: its pieces still in flight are counted off as
    /// they arrive, and nothing completes.
    abandoned: bool,
}

/// Reads and writes issued as several pieces, each gathered until its last
/// piece arrives; and the requests that failed, for `poll` to report by
/// token (as the file device does), one at a time.
struct PieceTracker {
    next_request: u64,
    requests: FxHashMap<RequestNumber, Assembly>,
    /// Requests a piece of which failed, with their tokens: at most one
    /// entry per request.
    failed: VecDeque<(RequestNumber, u64, String)>,
    /// Finished reads' buffers, for the next to reuse (at most
    /// [`MAX_SPARE_BUFFERS`]): a queue has up to a batch of reads in
    /// flight, and each would otherwise allocate its own.
    spare: BufferPool,
}

/// Buffers a [`PieceTracker`] keeps for reuse: the device's batch of 100
/// reads in flight, and some.
const MAX_SPARE_BUFFERS: usize = 128;

impl Default for PieceTracker {
    fn default() -> PieceTracker {
        PieceTracker {
            next_request: 0,
            requests: FxHashMap::default(),
            failed: VecDeque::new(),
            spare: BufferPool::new(MAX_SPARE_BUFFERS),
        }
    }
}

impl PieceTracker {
    /// A read of `length` bytes in `pieces` pieces begins. One of none (an
    /// empty read) is done at once: no piece would ever complete it.
    fn start_read(
        &mut self,
        token: u64,
        length: usize,
        pieces: usize,
        finished: &mut Finished,
    ) -> RequestNumber {
        if pieces == 0 {
            finished.push_read(token, &[]);
            return self.start(token, None, 0);
        }
        let mut bytes = self.spare.take();
        bytes.resize(length, 0);
        self.start(token, Some(bytes), pieces)
    }

    /// A write of `pieces` pieces begins; one of none is done at once, as
    /// the memory and file devices complete one.
    fn start_write(&mut self, token: u64, pieces: usize, finished: &mut Finished) -> RequestNumber {
        if pieces == 0 {
            finished.push_write(token);
        }
        self.start(token, None, pieces)
    }

    fn start(&mut self, token: u64, bytes: Option<Vec<u8>>, left: usize) -> RequestNumber {
        let request = RequestNumber(self.next_request);
        self.next_request += 1;
        if left > 0 {
            let assembly = Assembly {
                token,
                bytes,
                left,
                abandoned: false,
            };
            self.requests.insert(request, assembly);
        }
        request
    }

    /// A piece of `request` arrived: `fill` copies a read's piece into
    /// place at `at`. The last piece hands the whole request to
    /// `finished`. A piece that could not be copied fails its request.
    fn piece(
        &mut self,
        (request, at, length): (RequestNumber, usize, usize),
        finished: &mut Finished,
        fill: impl FnOnce(&mut [u8]) -> Result<(), DeviceError>,
    ) {
        let assembly = self
            .requests
            .get_mut(&request)
            .expect("pieces in flight are counted");
        let filled = match (&mut assembly.bytes, assembly.abandoned) {
            (Some(bytes), false) => match bytes.get_mut(at..at + length) {
                Some(place) => fill(place),
                None => Err(far_error(format!(
                    "a piece of {length} bytes at {at} is outside its read of {}",
                    bytes.len()
                ))),
            },
            _ => Ok(()),
        };
        match filled {
            Ok(()) => self.arrived(request, finished),
            Err(error) => self.failed_piece(request, error.to_string()),
        }
    }

    /// A piece of a write arrived.
    fn write_piece(&mut self, request: RequestNumber, finished: &mut Finished) {
        self.piece((request, 0, 0), finished, |_| Ok(()));
    }

    /// A piece of `request` arrived whole.
    fn arrived(&mut self, request: RequestNumber, finished: &mut Finished) {
        let assembly = self.requests.get_mut(&request).expect("just found");
        assembly.left -= 1;
        if assembly.left > 0 {
            return;
        }
        let assembly = self.requests.remove(&request).expect("just found");
        if !assembly.abandoned {
            match &assembly.bytes {
                Some(bytes) => finished.push_read(assembly.token, bytes),
                None => finished.push_write(assembly.token),
            }
        }
        if let Some(bytes) = assembly.bytes {
            self.spare.give_back(bytes);
        }
    }

    /// A piece of `request` arrived failed (an error completion, bytes
    /// that could not be copied): the request fails, once, by its token.
    fn failed_piece(&mut self, request: RequestNumber, reason: String) {
        let assembly = self
            .requests
            .get_mut(&request)
            .expect("pieces in flight are counted");
        if !std::mem::replace(&mut assembly.abandoned, true) {
            self.failed.push_back((request, assembly.token, reason));
        }
        self.arrived(request, &mut Finished::default());
    }

    /// The next failed request, as the error `poll` reports it by.
    fn take_failure(&mut self) -> Option<DeviceError> {
        let (_, token, reason) = self.failed.pop_front()?;
        Some(DeviceError::RequestFailed { token, reason })
    }

    /// `request` failed after `issued` of its pieces went out (its caller
    /// hears it from the submit): the rest will never arrive, and those
    /// that do complete nothing. A failure of one of its pieces queued for
    /// `poll` is dropped: reported again after the store freed the token,
    /// it would fail whatever operation took the token next.
    fn abandon(&mut self, request: RequestNumber, total: usize, issued: usize) {
        self.failed.retain(|(failed, ..)| *failed != request);
        let Some(assembly) = self.requests.get_mut(&request) else {
            return;
        };
        assembly.abandoned = true;
        assembly.left -= total - issued;
        if assembly.left == 0 {
            let assembly = self.requests.remove(&request).expect("just found");
            if let Some(bytes) = assembly.bytes {
                self.spare.give_back(bytes);
            }
        }
    }
}

/// Hands every finished request to `done`, then reports the queue's
/// error from `collected`, or else one failed request, if any, by its
/// token (the device contract: a request that fails comes back from
/// `poll` by name). Finished requests go out first whatever failed.
fn report_finished(
    collected: Result<(), DeviceError>,
    finished: &mut Finished,
    pieces: &mut PieceTracker,
    done: &mut dyn FnMut(u64, Completed<'_>),
) -> Result<usize, DeviceError> {
    let count = finished.drain(done);
    collected?;
    match pieces.take_failure() {
        Some(failure) => Err(failure),
        None => Ok(count),
    }
}

/// Collects on `queue` until `done` holds, for at most [`MAX_WAIT`];
/// `timed_out` says what did not finish if it does not.
fn collect_until<Q>(
    queue: &mut Q,
    collect: fn(&mut Q) -> Result<(), DeviceError>,
    done: impl Fn(&Q) -> bool,
    timed_out: &str,
) -> Result<(), DeviceError> {
    let started = Instant::now();
    while !done(queue) {
        collect(queue)?;
        if started.elapsed() > MAX_WAIT {
            return Err(far_error(timed_out));
        }
        std::hint::spin_loop();
    }
    Ok(())
}

/// Issues `count` pieces of `request` with `issue`; if one cannot be
/// issued, the request is abandoned (its pieces already out are counted
/// off as they come) and the error returned.
fn issue_pieces<Q>(
    queue: &mut Q,
    tracker: fn(&mut Q) -> &mut PieceTracker,
    (request, count): (RequestNumber, usize),
    mut issue: impl FnMut(&mut Q, usize) -> Result<(), DeviceError>,
) -> Result<(), DeviceError> {
    for piece in 0..count {
        if let Err(error) = issue(queue, piece) {
            tracker(queue).abandon(request, count, piece);
            return Err(error);
        }
    }
    Ok(())
}

/// One thread's Cowbird instance.
struct CowbirdQueue {
    client: Option<Box<Client>>,
    /// The client's instance in the engine.
    instance: usize,
    returns: Arc<Mutex<Vec<Path>>>,
    fabric: FabricWatch,
    engine: EngineWatch,
    /// Looks that found nothing with work in flight, since the last
    /// completion.
    quiet_looks: u32,
    capacity_bytes: u64,
    group: usize,
    /// The device request each Cowbird request is a piece of and, for a
    /// read's pieces, where the piece goes in the whole and its length.
    requests: FxHashMap<RequestId, (RequestNumber, usize, usize)>,
    /// Reads and writes, gathered from their Cowbird requests.
    pieces: PieceTracker,
    reads_in_flight: usize,
    responses: Vec<Completion>,
    finished: Finished,
    max_piece_bytes: usize,
}

impl CowbirdQueue {
    fn new(
        (mut client, instance): (Box<Client>, usize),
        (returns, fabric, engine): (Arc<Mutex<Vec<Path>>>, FabricWatch, EngineWatch),
        capacity_bytes: u64,
    ) -> Result<CowbirdQueue, DeviceError> {
        let group = client.poll_create().map_err(far_error)?;
        // A quarter of the request data ring, so that several pieces of a
        // flushed page are in flight at once.
        let ring_share = client.sizes().request_data_bytes / 4;
        let max_piece_bytes = ring_share.min(u64::from(client.max_write_bytes())).max(64) as usize;
        Ok(CowbirdQueue {
            client: Some(client),
            instance,
            returns,
            fabric,
            engine,
            quiet_looks: 0,
            capacity_bytes,
            group,
            requests: FxHashMap::default(),
            pieces: PieceTracker::default(),
            reads_in_flight: 0,
            responses: Vec::new(),
            finished: Finished::default(),
            max_piece_bytes,
        })
    }

    fn client(&mut self) -> &mut Client {
        self.client.as_mut().expect("held until drop")
    }

    /// Takes every completed request (a `poll_wait` with no timeout).
    fn collect(&mut self) -> Result<(), DeviceError> {
        let mut responses = std::mem::take(&mut self.responses);
        responses.clear();
        let group = self.group;
        self.client()
            .poll_wait(group, &mut responses, usize::MAX, Duration::ZERO)
            .map_err(far_error)?;
        if responses.is_empty() && !self.requests.is_empty() {
            self.responses = responses;
            self.fabric.check()?;
            self.quiet_looks = self.quiet_looks.wrapping_add(1);
            if self.quiet_looks.is_multiple_of(ENGINE_LOOK_EVERY) {
                self.engine.check(self.instance)?;
            }
            return Ok(());
        }
        self.quiet_looks = 0;
        // Every completion is taken before anything can fail: one left
        // unhandled would hold its request in flight for good.
        for completion in &responses {
            let (request, at, length) = self
                .requests
                .remove(&completion.id)
                .expect("every Cowbird request is a piece of one of ours");
            match completion.response {
                Some((_, answered)) => {
                    self.on_read_piece(completion, (request, at, length), answered as usize)
                }
                None => self.pieces.write_piece(request, &mut self.finished),
            }
        }
        self.responses = responses;
        Ok(())
    }

    /// A piece of a read arrived: the read is done when its last does.
    /// The answer's length is the client's own record of the request, so
    /// a mismatch is a bookkeeping bug; it fails the read, not the
    /// process.
    fn on_read_piece(
        &mut self,
        completion: &Completion,
        piece: (RequestNumber, usize, usize),
        answered_bytes: usize,
    ) {
        self.reads_in_flight -= 1;
        let client = self.client.as_ref().expect("held until drop");
        self.pieces.piece(piece, &mut self.finished, |into| {
            if answered_bytes != into.len() {
                return Err(far_error(format!(
                    "the engine answered {answered_bytes} bytes for a piece of {}",
                    into.len()
                )));
            }
            client.response(completion, into).map_err(far_error)
        });
    }

    /// Issues one request, retrying on a full ring as §4.3 says.
    fn issue(
        &mut self,
        (request, at, length): (RequestNumber, usize, usize),
        is_read: bool,
        mut attempt: impl FnMut(&mut Client) -> Result<RequestId, CowbirdError>,
    ) -> Result<(), DeviceError> {
        // The clock starts at the first full ring: most requests go in
        // at once, and a clock read would cost them as much as the rest.
        let mut started = None;
        loop {
            match attempt(self.client()) {
                Ok(id) => {
                    let group = self.group;
                    self.client().poll_add(group, id).map_err(far_error)?;
                    self.requests.insert(id, (request, at, length));
                    return Ok(());
                }
                Err(CowbirdError::RetryLater(_)) => {
                    // A read drains the reads already issued (they hold
                    // the response ring); a write retries at once, and
                    // completions make room as the engine moves.
                    if is_read || self.reads_in_flight > 0 {
                        self.collect()?;
                    } else {
                        self.collect()?;
                        std::hint::spin_loop();
                    }
                }
                Err(error) => return Err(far_error(error)),
            }
            if started.get_or_insert_with(Instant::now).elapsed() > MAX_WAIT {
                return Err(far_error("the Cowbird ring stayed full for 10 s"));
            }
        }
    }
}

impl DeviceQueue for CowbirdQueue {
    fn read(&mut self, offset: u64, length: usize, token: u64) -> Result<(), DeviceError> {
        check_range(offset, length as u64, self.capacity_bytes)?;
        let piece_bytes = MAX_REQUEST_BYTES as usize;
        let pieces = length.div_ceil(piece_bytes);
        let request = self
            .pieces
            .start_read(token, length, pieces, &mut self.finished);
        issue_pieces(
            self,
            |queue| &mut queue.pieces,
            (request, pieces),
            |queue, piece| {
                let at = piece * piece_bytes;
                let piece_length = piece_bytes.min(length - at);
                let from = offset + at as u64;
                queue.issue((request, at, piece_length), true, |client| {
                    client.async_read(0, from, piece_length)
                })?;
                queue.reads_in_flight += 1;
                Ok(())
            },
        )
    }

    fn write(&mut self, offset: u64, data: &[u8], token: u64) -> Result<(), DeviceError> {
        check_range(offset, data.len() as u64, self.capacity_bytes)?;
        let piece_bytes = self.max_piece_bytes;
        let pieces = data.chunks(piece_bytes).count();
        let request = self.pieces.start_write(token, pieces, &mut self.finished);
        let chunks: Vec<&[u8]> = data.chunks(piece_bytes).collect();
        issue_pieces(
            self,
            |queue| &mut queue.pieces,
            (request, pieces),
            |queue, number| {
                let piece = chunks[number];
                let at = offset + (number * piece_bytes) as u64;
                queue.issue((request, 0, 0), false, |client| {
                    client.async_write(0, at, piece)
                })
            },
        )
    }

    fn poll(&mut self, done: &mut dyn FnMut(u64, Completed<'_>)) -> Result<usize, DeviceError> {
        let collected = self.collect();
        report_finished(collected, &mut self.finished, &mut self.pieces, done)
    }

    fn in_flight(&self) -> usize {
        self.requests.len() + self.finished.len() + self.pieces.failed.len()
    }
}

impl Drop for CowbirdQueue {
    fn drop(&mut self) {
        // What is in flight finishes first, as a verbs queue's does: a
        // write the engine had not yet landed could otherwise be
        // overtaken by the next session's read of the same bytes on
        // another instance. A client whose work fails or does not finish
        // in time is not given back.
        let finished = collect_until(
            self,
            CowbirdQueue::collect,
            |queue| queue.requests.is_empty(),
            "a Cowbird instance's work did not finish",
        );
        if let Err(error) = finished {
            tracing::warn!(%error, "a Cowbird instance's work did not finish; the instance is dropped");
            return;
        }
        if let Some(mut client) = self.client.take() {
            let _ = client.poll_destroy(self.group);
            let mut paths = self.returns.lock().unwrap_or_else(|e| e.into_inner());
            paths.push(Path::Cowbird(client, self.instance));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Everything `finished` holds, as (token, bytes of a read).
    fn drained(finished: &mut Finished) -> Vec<(u64, Option<Vec<u8>>)> {
        let mut out = Vec::new();
        finished.drain(&mut |token, bytes| out.push((token, bytes.map(<[u8]>::to_vec))));
        out
    }

    fn fill_with(byte: u8) -> impl FnOnce(&mut [u8]) -> Result<(), DeviceError> {
        move |into| {
            into.fill(byte);
            Ok(())
        }
    }

    /// A Cowbird queue whose engine stopped serving its instance (a Spot
    /// instance failure, a failed P4 instance), on a fabric that ran on,
    /// waited out its 10 s before it said anything (a store above it its
    /// 30 s), and its drop waited 10 s more. It fails at once now, with
    /// the engine's reason, and is not given back.
    #[test]
    fn a_queue_whose_engine_stopped_serving_it_fails_with_the_reason_at_once() {
        use remora_rnic::HostMemory;
        let sizes = RingSizes::DEFAULT;
        // No engine serves this client: its requests never complete.
        let client = Client::new(
            HostMemory::new(sizes.block_bytes() as usize),
            sizes,
            vec![1 << 20],
        )
        .unwrap();
        let stopped = EngineWatch(Some(Arc::new(|instance: usize| {
            (instance == 3).then(|| "the memory node refused a request".to_string())
        })));
        let returns = Arc::new(Mutex::new(Vec::new()));
        let mut queue = CowbirdQueue::new(
            (Box::new(client), 3),
            (returns.clone(), FabricWatch::default(), stopped),
            1 << 20,
        )
        .unwrap();
        queue.read(0, 64, 1).unwrap();
        let started = Instant::now();
        let failed = loop {
            if let Err(error) = queue.poll(&mut |token, _| panic!("request {token} completed")) {
                break error;
            }
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "no word of the engine in 3 s"
            );
        };
        assert!(
            matches!(&failed, DeviceError::FarMemory(reason) if reason.contains("refused a request")),
            "{failed:?}"
        );
        drop(queue);
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "the drop waited for the dead instance"
        );
        assert!(
            returns.lock().unwrap().is_empty(),
            "the dead instance was given back"
        );
    }

    /// A read of three pieces failed after issuing one; the store reused
    /// its token at once. The old piece, arriving late, used to land in the
    /// new read (and count toward it): the new read completed with the
    /// failed read's bytes.
    #[test]
    fn a_late_piece_of_a_failed_read_does_not_land_in_the_next_under_its_token() {
        let mut tracker = PieceTracker::default();
        let mut finished = Finished::default();
        let failed = tracker.start_read(5, 12, 3, &mut finished);
        tracker.abandon(failed, 3, 1);
        let next = tracker.start_read(5, 4, 1, &mut finished);
        tracker.piece((failed, 0, 4), &mut finished, fill_with(0xee));
        assert!(
            finished.is_empty(),
            "the failed read's piece completed a read"
        );
        tracker.piece((next, 0, 4), &mut finished, fill_with(0x11));
        assert_eq!(drained(&mut finished), vec![(5, Some(vec![0x11; 4]))]);
        assert!(tracker.requests.is_empty(), "every piece is counted off");
        assert!(tracker.take_failure().is_none(), "the submit reported it");
    }

    /// The same for a write: a late piece of a failed write used to count
    /// down the next write under its token, which was then reported done
    /// before its own pieces had landed.
    #[test]
    fn a_late_piece_of_a_failed_write_does_not_finish_the_next_under_its_token() {
        let mut tracker = PieceTracker::default();
        let mut finished = Finished::default();
        let failed = tracker.start_write(9, 4, &mut finished);
        tracker.abandon(failed, 4, 2);
        let next = tracker.start_write(9, 2, &mut finished);
        for _ in 0..2 {
            tracker.write_piece(failed, &mut finished);
        }
        assert!(
            finished.is_empty(),
            "the failed write's pieces finished the next"
        );
        for _ in 0..2 {
            tracker.write_piece(next, &mut finished);
        }
        assert_eq!(drained(&mut finished), vec![(9, None)]);
        assert!(tracker.requests.is_empty());
    }

    /// A request that failed before any piece went out, and one whose
    /// pieces had all arrived before the failure, leave nothing behind.
    #[test]
    fn abandoning_with_nothing_in_flight_forgets_the_request() {
        let mut tracker = PieceTracker::default();
        let mut finished = Finished::default();
        let never_issued = tracker.start_read(1, 8, 2, &mut finished);
        tracker.abandon(never_issued, 2, 0);
        assert!(tracker.requests.is_empty());
        let empty = tracker.start_write(2, 0, &mut finished);
        tracker.abandon(empty, 0, 0);
        assert_eq!(drained(&mut finished), vec![(2, None)]);
    }

    /// A piece that could not be copied out failed its queue with an
    /// error no request owned, and the store's operation waited for good.
    /// Its read fails by its token now, once, and never completes with a
    /// hole; the queue goes on.
    #[test]
    fn a_piece_that_could_not_be_copied_fails_its_read_by_token() {
        let mut tracker = PieceTracker::default();
        let mut finished = Finished::default();
        let read = tracker.start_read(3, 8, 2, &mut finished);
        tracker.piece((read, 0, 4), &mut finished, |_| {
            Err(far_error("the landing slot is gone"))
        });
        tracker.piece((read, 4, 4), &mut finished, fill_with(1));
        assert!(finished.is_empty(), "a read with a hole completed");
        assert!(tracker.requests.is_empty());
        assert!(matches!(
            tracker.take_failure(),
            Some(DeviceError::RequestFailed { token: 3, .. })
        ));
        assert!(tracker.take_failure().is_none(), "one failure per request");
    }

    /// A request whose piece failed while later pieces were being issued,
    /// and whose submit then failed too, was reported twice: by the
    /// submit, and by `poll` after the store had freed (and reused) its
    /// token, failing whatever operation held it next.
    #[test]
    fn a_request_its_submit_failed_is_not_failed_again_by_poll() {
        let mut tracker = PieceTracker::default();
        let mut finished = Finished::default();
        let read = tracker.start_read(8, 12, 3, &mut finished);
        tracker.failed_piece(read, "a verb completed with RetryExceeded".into());
        tracker.abandon(read, 3, 1);
        assert!(tracker.take_failure().is_none(), "the submit reported it");
        assert!(tracker.requests.is_empty());
    }

    /// A piece whose answer does not fit where it goes (a bookkeeping bug)
    /// sliced past the read: a panic. It fails the read.
    #[test]
    fn a_piece_outside_its_read_fails_the_read_not_the_process() {
        let mut tracker = PieceTracker::default();
        let mut finished = Finished::default();
        let read = tracker.start_read(4, 8, 1, &mut finished);
        tracker.piece((read, 4, 8), &mut finished, fill_with(2));
        assert!(finished.is_empty());
        assert!(matches!(
            tracker.take_failure(),
            Some(DeviceError::RequestFailed { token: 4, .. })
        ));
    }

    /// Failed requests are reported after what finished, one per poll.
    #[test]
    fn a_poll_hands_out_what_finished_then_one_failure() {
        let mut tracker = PieceTracker::default();
        let mut finished = Finished::default();
        let good = tracker.start_write(6, 1, &mut finished);
        let bad = tracker.start_write(7, 1, &mut finished);
        tracker.write_piece(good, &mut finished);
        tracker.failed_piece(bad, "a verb completed with RemoteAccessError".into());
        let mut seen = Vec::new();
        let polled = report_finished(Ok(()), &mut finished, &mut tracker, &mut |token, _| {
            seen.push(token)
        });
        assert_eq!(seen, vec![6]);
        assert!(matches!(
            polled,
            Err(DeviceError::RequestFailed { token: 7, .. })
        ));
        assert!(matches!(
            report_finished(Ok(()), &mut finished, &mut tracker, &mut |_, _| {}),
            Ok(0)
        ));
    }
}
