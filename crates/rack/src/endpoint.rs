//! Runtimes that put sans-IO state machines on real carriers and a real
//! clock: [`NodeEndpoint`] (a soft RNIC on one port) and
//! [`SwitchEndpoint`] (the switch on one port per node). A [`Driver`]
//! pumps a set of them on one thread and sleeps through the carriers'
//! waiter when nothing moves.
//!
//! Endpoints are shared (`Arc<Mutex<_>>`): the driver thread pumps them,
//! while application and control threads lock them briefly to post work,
//! poll completions or set up queue pairs, then kick the driver.

use crate::RackError;
use remora_carrier::{
    CarrierError, Doorbell, IdleStrategy, Kicker, Port, PortDrops, SendStatus, WaitSource, Waiter,
};
use remora_host::{Ports, LOCAL_PORT};
use remora_rnic::{
    CompletionOpcode, CompletionQueue, CompletionStatus, DataPath, MemoryRegion, ProtectionDomain,
    QueuePair, QueuePairBuilder, ReceiveRequest, SendRequest, SharedReceiveQueue, SoftRnic,
    Timestamp, Verbs, VerbsError, WorkCompletion,
};
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::{Emitted, PortId, Program, Switch};
use remora_wire::frame::MAX_FRAME_LEN;
use remora_wire::MacAddress;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Frames taken from one port per pump, so one busy port cannot starve
/// the others.
const RECEIVE_BATCH_FRAMES: usize = 64;
/// Frames sent per pump.
const TRANSMIT_BATCH_FRAMES: usize = 64;

/// The real clock, as the nanoseconds the state machines take.
#[derive(Debug, Clone, Copy)]
pub struct RackClock {
    origin: Instant,
}

impl RackClock {
    pub fn new() -> RackClock {
        RackClock {
            origin: Instant::now(),
        }
    }

    pub fn now(&self) -> Timestamp {
        self.at(Instant::now())
    }

    /// `instant` on this clock: for a caller that already read the time.
    pub fn at(&self, instant: Instant) -> Timestamp {
        Timestamp::from_nanos(instant.saturating_duration_since(self.origin).as_nanos() as u64)
    }

    pub fn instant(&self, at: Timestamp) -> Instant {
        self.origin + Duration::from_nanos(at.as_nanos())
    }
}

impl Default for RackClock {
    fn default() -> Self {
        RackClock::new()
    }
}

/// The local ACK timeout of the rack's queue pairs. Real RNICs use a few
/// milliseconds to tens of them; a soft RNIC shares cores with everything
/// else on the host, and a thread descheduled for a few milliseconds must
/// not look like a dead link, so the rack allows 16 ms (IB's timeout code
/// 12) with the usual seven retries.
pub const RACK_ACK_TIMEOUT: Duration = Duration::from_millis(16);

/// A queue-pair builder with the rack's timeouts.
pub fn rack_queue_pair(
    protection_domain: ProtectionDomain,
    completion_queue: CompletionQueue,
) -> QueuePairBuilder {
    let mut builder = QueuePairBuilder::new(protection_domain, completion_queue, completion_queue);
    builder.timeout = RACK_ACK_TIMEOUT;
    builder
}

/// Where the rack's threads run when the machine has cores to spare: the
/// fabric threads on the last cores (the first on the last), application
/// threads on the others, as the design's embedded rack puts "the rest of
/// the rack" on a core of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadRole {
    /// The `n`th fabric thread.
    Fabric(usize),
    /// The `n`th application thread.
    Application(usize),
}

/// Pins the calling thread for its role. Best effort: with one core, or
/// if the kernel refuses, the thread stays where the scheduler puts it.
/// Returns the core it was pinned to.
pub fn pin_current_thread(role: ThreadRole) -> Option<usize> {
    let cores = std::thread::available_parallelism().map_or(1, |count| count.get());
    if cores < 2 {
        return None;
    }
    let core = match role {
        ThreadRole::Fabric(index) => cores - 1 - index % cores,
        ThreadRole::Application(index) => index % (cores - 1),
    };
    let mut set = rustix::thread::CpuSet::new();
    set.set(core);
    rustix::thread::sched_setaffinity(None, &set)
        .ok()
        .map(|_| core)
}

/// Something a [`Driver`] pumps.
pub trait Pump: Send {
    /// Moves whatever can move now. Returns whether anything did.
    fn pump(&mut self, clock: &RackClock) -> Result<bool, RackError>;
    /// The next timer, if any.
    /// The next timer (RNIC or switch), or a port's own next due time.
    fn deadline(&self, clock: &RackClock) -> Option<Instant>;
    /// Whether a port holds frames (checked after a sleep is announced).
    fn has_frames(&mut self) -> bool;
    fn wait_sources(&self) -> Vec<WaitSource>;
}

/// Receive buffers a memory node keeps posted on its shared receive
/// queue, so clients' SENDs always find one. Reposting a consumed buffer
/// is the memory agent's only work; it runs in the node's pump and is
/// counted as NIC-side work, never on a client's path.
#[derive(Debug, Clone, Copy)]
pub struct ReceivePool {
    pub queue: SharedReceiveQueue,
    pub completions: CompletionQueue,
    pub region: MemoryRegion,
    pub slot_bytes: u32,
}

impl ReceivePool {
    pub fn post(&self, rnic: &mut SoftRnic, slot: u64) -> Result<(), RackError> {
        let element = self
            .region
            .slice(slot * u64::from(self.slot_bytes), self.slot_bytes);
        let request = ReceiveRequest::new(slot, &[element])?;
        rnic.post_shared_receive(self.queue, request)?;
        Ok(())
    }

    /// Reposts the buffers of completed receives. Returns how many.
    fn replenish(&self, rnic: &mut SoftRnic) -> Result<usize, RackError> {
        let mut reposted = 0;
        while let Some(completion) = rnic.poll_completion(self.completions)? {
            // A failed receive (a SEND too long for its buffer) used the
            // buffer up all the same; only a flush means the queue is gone.
            if completion.status != CompletionStatus::WorkRequestFlushError {
                self.post(rnic, completion.work_request_id)?;
                reposted += 1;
            }
        }
        Ok(reposted)
    }
}

/// A node: its soft RNIC on its uplink's carrier port, and on a local
/// link's if an offload host sits beside it (or it is that offload host).
pub struct NodeEndpoint {
    pub name: String,
    pub rnic: SoftRnic,
    pub receive_pool: Option<ReceivePool>,
    port: Box<dyn Port>,
    /// The local link's port, and which frames take it.
    local: Option<Box<dyn Port>>,
    ports: Ports,
    buffer: Box<[u8]>,
    /// The carrier was full when the RNIC may still have had frames: look
    /// again soon, since a consumer freeing slots rings nobody.
    blocked_since: Option<Timestamp>,
    /// The time of the pump that last flushed the ports (see
    /// [`blocked_due_retried`]).
    flushed_at: Option<Timestamp>,
    activity: Arc<AtomicU64>,
    /// Application threads' lock-free queues, served on every pump.
    queues: Vec<NicSide>,
    /// The host is down (crashed): frames arriving are lost, nothing
    /// leaves, no timer runs.
    down: bool,
    /// The host's uplink is cut: its NIC runs, the uplink's frames are
    /// lost both ways (a local link still carries its own).
    partitioned: bool,
    /// Frames the NIC sent that a carrier refused for want of room after
    /// saying it had some (a fault line's held frames took the last slot):
    /// they went uncounted, while the NIC counted them transmitted.
    frames_dropped_no_room: u64,
    /// Frames lost because the node was cut off or down: sent up a cut
    /// uplink or arrived on it, and arrived at a host that is down. The
    /// simulator counts the same (`partition_drops`); here they went
    /// uncounted.
    frames_lost_to_partition: u64,
    frames_lost_while_down: u64,
}

/// Work requests one pump takes from one application's queue.
const SUBMISSIONS_PER_PUMP: usize = 256;

/// An application thread's send queue and completion queue, shared with
/// the NIC's thread without a lock, as a real NIC's queues live in host
/// memory: the application pushes work requests and rings the doorbell
/// (kicks the driver); the NIC takes them on its next pump and pushes
/// back the completions of one completion queue. Posting and polling cost
/// the application a queue operation each, never the endpoint's lock.
pub struct AppQueues {
    submissions: mpsc::SyncSender<(QueuePair, WorkRequest)>,
    completions: mpsc::Receiver<WorkCompletion>,
    /// A completion taken while looking for one before a sleep.
    early: Option<WorkCompletion>,
    /// The one completion queue whose completions come back here.
    completion_queue: CompletionQueue,
    /// Rung by the NIC's side after it hands over completions: the
    /// completion channel a waiting thread sleeps on.
    completed: Arc<Doorbell>,
}

/// What an application hands its NIC.
#[derive(Debug, Clone, Copy)]
enum WorkRequest {
    Send(SendRequest),
    Receive(ReceiveRequest),
}

impl AppQueues {
    /// The completion queue whose completions come back here.
    pub fn completion_queue(&self) -> CompletionQueue {
        self.completion_queue
    }

    /// Sleeps until a completion is ready or `timeout` passes (a
    /// completion already waiting returns at once), as a thread blocks on
    /// `ibv_get_cq_event`: the NIC's side rings after handing completions
    /// over, so a waiting thread needs neither to spin nor to poll on a
    /// timer, and leaves the core to the fabric thread.
    pub fn sleep_until_completion(&mut self, timeout: Duration) {
        let (early, completions) = (&mut self.early, &self.completions);
        // A NIC gone (its host restarted) wakes the thread too: its next
        // poll says so.
        let mut gone = false;
        self.completed.sleep(timeout, &mut || {
            if early.is_none() {
                match completions.try_recv() {
                    Ok(completion) => *early = Some(completion),
                    Err(mpsc::TryRecvError::Disconnected) => gone = true,
                    Err(mpsc::TryRecvError::Empty) => {}
                }
            }
            early.is_some() || gone
        });
    }

    fn submit(&mut self, queue_pair: QueuePair, request: WorkRequest) -> Result<(), VerbsError> {
        match self.submissions.try_send((queue_pair, request)) {
            Ok(()) => Ok(()),
            Err(mpsc::TrySendError::Full(_)) => Err(VerbsError::QueueFull {
                queue: "the application's queue to its NIC",
            }),
            Err(mpsc::TrySendError::Disconnected(_)) => Err(VerbsError::DeviceGone),
        }
    }
}

/// The verbs' data path without the NIC's lock: a request waits in the
/// queue until the NIC's next pump posts it (a send queue the NIC finds
/// full holds it there), and completions arrive the pump after.
impl DataPath for AppQueues {
    fn post_send(&mut self, queue_pair: QueuePair, request: SendRequest) -> Result<(), VerbsError> {
        self.submit(queue_pair, WorkRequest::Send(request))
    }

    fn post_receive(
        &mut self,
        queue_pair: QueuePair,
        request: ReceiveRequest,
    ) -> Result<(), VerbsError> {
        self.submit(queue_pair, WorkRequest::Receive(request))
    }

    fn poll_completion(
        &mut self,
        queue: CompletionQueue,
    ) -> Result<Option<WorkCompletion>, VerbsError> {
        if queue != self.completion_queue {
            return Err(VerbsError::UnknownCompletionQueue);
        }
        if let Some(completion) = self.early.take() {
            return Ok(Some(completion));
        }
        match self.completions.try_recv() {
            Ok(completion) => Ok(Some(completion)),
            Err(mpsc::TryRecvError::Empty) => Ok(None),
            Err(mpsc::TryRecvError::Disconnected) => Err(VerbsError::DeviceGone),
        }
    }
}

/// The NIC's end of an [`AppQueues`].
struct NicSide {
    submissions: mpsc::Receiver<(QueuePair, WorkRequest)>,
    /// A request the NIC's queue had no room for yet.
    held: Option<(QueuePair, WorkRequest)>,
    completion_queue: CompletionQueue,
    completions: mpsc::SyncSender<WorkCompletion>,
    /// Completions to hand over before the NIC's next: one the
    /// application's queue had no room for yet, and the failed completions
    /// of requests the NIC refused.
    unsent: VecDeque<WorkCompletion>,
    /// The application's completion channel.
    completed: Arc<Doorbell>,
}

/// The failed completion of a work request the NIC refused: the
/// application was told its post went in, so it learns of the refusal as
/// a NIC reports a bad request it took, and the rack runs on.
fn refusal(queue_pair: QueuePair, request: &WorkRequest, error: &VerbsError) -> WorkCompletion {
    let status = match error {
        VerbsError::LocalAccessOutOfBounds { .. }
        | VerbsError::UnknownLocalKey(_)
        | VerbsError::WrongProtectionDomain
        | VerbsError::LocalWriteNotPermitted
        | VerbsError::AtomicBufferInvalid => CompletionStatus::LocalProtectionError,
        VerbsError::MessageTooLong { .. } | VerbsError::TooManyScatterGatherElements { .. } => {
            CompletionStatus::LocalLengthError
        }
        _ => CompletionStatus::LocalQueuePairOperationError,
    };
    let (work_request_id, opcode) = match request {
        WorkRequest::Send(send) => (send.work_request_id, send.operation.completion_opcode()),
        WorkRequest::Receive(receive) => (receive.work_request_id, CompletionOpcode::Receive),
    };
    WorkCompletion {
        work_request_id,
        status,
        opcode,
        qpn: queue_pair.0,
        byte_len: 0,
        immediate: None,
        solicited: false,
    }
}

impl NicSide {
    /// Posts what the application queued, in order, until the NIC's send
    /// queue is full. Bounded per pump.
    fn take_submissions(&mut self, rnic: &mut SoftRnic) -> Result<bool, RackError> {
        let mut worked = false;
        for _ in 0..SUBMISSIONS_PER_PUMP {
            if self.unsent.len() >= SUBMISSIONS_PER_PUMP {
                // The application has not taken its refusals: it waits.
                break;
            }
            let Some((queue_pair, request)) = self
                .held
                .take()
                .or_else(|| self.submissions.try_recv().ok())
            else {
                break;
            };
            let posted = match request {
                WorkRequest::Send(send) => rnic.post_send(queue_pair, send),
                WorkRequest::Receive(receive) => rnic.post_receive(queue_pair, receive),
            };
            match posted {
                Ok(()) => worked = true,
                Err(VerbsError::QueueFull { .. }) => {
                    self.held = Some((queue_pair, request));
                    break;
                }
                Err(error) => {
                    tracing::warn!(%error, "the NIC refused an application's work request");
                    self.unsent.push_back(refusal(queue_pair, &request, &error));
                    worked = true;
                }
            }
        }
        Ok(worked)
    }

    /// Hands the completion queue's completions to the application, then
    /// wakes it if it sleeps on them.
    fn give_completions(&mut self, rnic: &mut SoftRnic) -> Result<bool, RackError> {
        let given = self.hand_over(rnic)?;
        if given {
            self.completed.ring();
        }
        Ok(given)
    }

    /// Hands completions to the application, until its queue is full.
    fn hand_over(&mut self, rnic: &mut SoftRnic) -> Result<bool, RackError> {
        let mut worked = false;
        // Bounded: each turn hands one completion over or returns.
        loop {
            let completion = match self.unsent.pop_front() {
                Some(completion) => completion,
                None => match rnic.poll_completion(self.completion_queue)? {
                    Some(completion) => completion,
                    None => return Ok(worked),
                },
            };
            match self.completions.try_send(completion) {
                Ok(()) => worked = true,
                Err(mpsc::TrySendError::Full(completion)) => {
                    self.unsent.push_front(completion);
                    return Ok(worked);
                }
                // The application is gone: nobody wants its completions.
                Err(mpsc::TrySendError::Disconnected(_)) => return Ok(worked),
            }
        }
    }
}

/// How soon an endpoint blocked on a full carrier looks again.
const FULL_CARRIER_RETRY: Duration = Duration::from_micros(50);

/// A carrier's next due frame, as a deadline. A frame due by the time of
/// the pump that last flushed the endpoint's ports (`flushed_at`, the
/// pump's own clock reading) could not leave then (the carrier behind the
/// delay line is full): looking again at once spun the fabric thread, so
/// it looks again after [`FULL_CARRIER_RETRY`], as for any full carrier.
/// A frame that fell due since is due as it is (judged against the time
/// of asking, it waited 50 µs more); one that fell due during that pump
/// costs at most one more pump before it counts as blocked.
fn blocked_due_retried(due: Instant, flushed_at: Option<Timestamp>, clock: &RackClock) -> Instant {
    match flushed_at.map(|at| clock.instant(at)) {
        Some(flushed_at) if due <= flushed_at => flushed_at + FULL_CARRIER_RETRY,
        _ => due,
    }
}

impl NodeEndpoint {
    pub fn new(name: &str, rnic: SoftRnic, port: Box<dyn Port>) -> NodeEndpoint {
        NodeEndpoint {
            name: name.to_string(),
            rnic,
            receive_pool: None,
            blocked_since: None,
            flushed_at: None,
            port,
            local: None,
            ports: Ports::UPLINK_ONLY,
            buffer: vec![0u8; MAX_FRAME_LEN].into_boxed_slice(),
            activity: Arc::new(AtomicU64::new(0)),
            queues: Vec::new(),
            down: false,
            partitioned: false,
            frames_dropped_no_room: 0,
            frames_lost_to_partition: 0,
            frames_lost_while_down: 0,
        }
    }

    /// Frames lost to a cut uplink, both ways.
    pub fn frames_lost_to_partition(&self) -> u64 {
        self.frames_lost_to_partition
    }

    /// Frames that arrived while the host was down.
    pub fn frames_lost_while_down(&self) -> u64 {
        self.frames_lost_while_down
    }

    /// Frames a carrier refused for want of room (RC retransmits them).
    pub fn frames_dropped_no_room(&self) -> u64 {
        self.frames_dropped_no_room
    }

    /// What the node's carriers and link wrappers lost, by where.
    pub fn carrier_drops(&self) -> PortDrops {
        let mut drops = PortDrops::default();
        for port in self.ports() {
            drops.add(&port.drops());
        }
        drops
    }

    /// Gives the node a local link to `peer` (the host beside it, or its
    /// offload host): frames addressed to `peer` leave by `port`.
    pub fn set_local_link(&mut self, peer: MacAddress, port: Box<dyn Port>) {
        self.local = Some(port);
        self.ports = Ports::with_local_peer(peer);
    }

    /// The uplink and, if there is one, the local link's port.
    fn ports(&self) -> impl Iterator<Item = &Box<dyn Port>> {
        std::iter::once(&self.port).chain(self.local.as_ref())
    }

    /// The same, mutably.
    fn ports_mut(&mut self) -> impl Iterator<Item = &mut Box<dyn Port>> {
        std::iter::once(&mut self.port).chain(self.local.as_mut())
    }

    pub fn is_down(&self) -> bool {
        self.down
    }

    /// The host crashes: its NIC stops, and what arrives is lost.
    pub fn crash(&mut self) {
        self.down = true;
    }

    /// The host's uplink is cut (or mended): its NIC runs on, and every
    /// frame it sends up it or that arrives over it is lost, as the
    /// simulator's partition of the host's link does.
    pub fn set_partitioned(&mut self, partitioned: bool) {
        self.partitioned = partitioned;
    }

    /// The host comes back with a fresh NIC (no queue pairs, no regions,
    /// keys and PSNs seeded anew by `incarnation`).
    pub fn restart(&mut self, incarnation: u64) {
        let mut config = self.rnic.config().clone();
        config.seed = config.seed.wrapping_add(incarnation << 32);
        self.rnic = SoftRnic::new(config);
        // The old NIC's queue pairs and completion queues are gone: the
        // applications on them see `DeviceGone` (woken, if they sleep),
        // and a pump no longer polls a completion queue the new NIC lacks.
        let doorbells: Vec<Arc<Doorbell>> =
            self.queues.drain(..).map(|side| side.completed).collect();
        for doorbell in doorbells {
            doorbell.ring();
        }
        self.receive_pool = None;
        self.blocked_since = None;
        self.down = false;
    }

    /// Lock-free queues for an application thread whose completions
    /// arrive on `completion_queue`: up to `depth` requests waiting to be
    /// posted and `depth` completions waiting to be taken.
    pub fn attach_queues(&mut self, completion_queue: CompletionQueue, depth: usize) -> AppQueues {
        let (submit, submissions) = mpsc::sync_channel(depth);
        let (complete, completions) = mpsc::sync_channel(depth);
        let completed = Arc::new(Doorbell::new());
        self.queues.push(NicSide {
            submissions,
            held: None,
            completion_queue,
            completions: complete,
            unsent: VecDeque::new(),
            completed: Arc::clone(&completed),
        });
        AppQueues {
            submissions: submit,
            completions,
            early: None,
            completion_queue,
            completed,
        }
    }

    /// A counter the pump bumps after feeding the RNIC frames or timers,
    /// which is when completions can appear. An application thread
    /// watches it and takes the endpoint's lock to poll only when it
    /// moved, as a real application polls a completion queue in its own
    /// memory without stopping the NIC; polling under the lock in a tight
    /// loop would starve the driver of the lock.
    pub fn activity(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.activity)
    }
}

impl Pump for NodeEndpoint {
    fn pump(&mut self, clock: &RackClock) -> Result<bool, RackError> {
        let now = clock.now();
        if self.down {
            // What arrives is lost, as at a crashed host. What was on the
            // wire already (a shaping or fault delay line) still leaves:
            // never flushed, it kept the deadline below in the past, and
            // the fabric thread spun until the host came back.
            let mut received = 0;
            for port in self.ports_mut() {
                received += port.receive(RECEIVE_BATCH_FRAMES, &mut |_| {})?;
                port.flush()?;
            }
            self.flushed_at = Some(now);
            self.frames_lost_while_down += received as u64;
            return Ok(received > 0);
        }
        let mut worked = self.receive(now)?;
        for queues in &mut self.queues {
            worked |= queues.take_submissions(&mut self.rnic)?;
        }
        if let Some(pool) = self.receive_pool {
            worked |= pool.replenish(&mut self.rnic)? > 0;
        }
        if self
            .rnic
            .poll_timeout()
            .is_some_and(|deadline| deadline <= now)
        {
            self.rnic.handle_timeout(now);
            worked = true;
        }
        for queues in &mut self.queues {
            worked |= queues.give_completions(&mut self.rnic)?;
        }
        if worked {
            self.activity.fetch_add(1, Ordering::Release);
        }
        let sent = self.transmit(now)?;
        Ok(worked || sent > 0)
    }

    fn deadline(&self, clock: &RackClock) -> Option<Instant> {
        let carriers = self
            .ports()
            .filter_map(|port| port.next_due())
            .map(|due| blocked_due_retried(due, self.flushed_at, clock));
        if self.down {
            return carriers.min();
        }
        let retry = self
            .blocked_since
            .map(|since| since.saturating_add(FULL_CARRIER_RETRY));
        let timers = [self.rnic.poll_timeout(), retry]
            .into_iter()
            .flatten()
            .map(|at| clock.instant(at));
        timers.chain(carriers).min()
    }

    fn has_frames(&mut self) -> bool {
        self.ports_mut().any(|port| port.has_frames())
    }

    fn wait_sources(&self) -> Vec<WaitSource> {
        self.ports().map(|port| port.wait_source()).collect()
    }
}

impl NodeEndpoint {
    /// Feeds the RNIC what arrived on every port (nothing from the
    /// uplink while it is cut); returns whether anything arrived.
    fn receive(&mut self, now: Timestamp) -> Result<bool, RackError> {
        let rnic = &mut self.rnic;
        let uplink_cut = self.partitioned;
        let mut received = self.port.receive(RECEIVE_BATCH_FRAMES, &mut |frame| {
            if !uplink_cut {
                rnic.handle_frame(now, frame);
            }
        })?;
        if uplink_cut {
            self.frames_lost_to_partition += received as u64;
        }
        if let Some(local) = &mut self.local {
            received += local.receive(RECEIVE_BATCH_FRAMES, &mut |frame| {
                rnic.handle_frame(now, frame);
            })?;
        }
        Ok(received > 0)
    }

    /// Sends what the RNIC has, each frame by the port its destination
    /// takes, while every port has room; returns the frames sent.
    fn transmit(&mut self, now: Timestamp) -> Result<usize, RackError> {
        let mut sent = 0;
        self.blocked_since = None;
        while sent < TRANSMIT_BATCH_FRAMES {
            // The next frame's port is known only once it is built: wait
            // for room on every port.
            if !self.ports_mut().all(|port| port.has_room()) {
                self.blocked_since = Some(now);
                break;
            }
            let Some(length) = self.rnic.poll_transmit(now, &mut self.buffer) else {
                break;
            };
            let frame = &self.buffer[..length];
            let status = match (self.ports.port_for(frame), self.local.as_mut()) {
                (LOCAL_PORT, Some(local)) => local.send(frame)?,
                // A cut uplink loses what the NIC sends up it.
                _ if self.partitioned => {
                    self.frames_lost_to_partition += 1;
                    SendStatus::Queued
                }
                _ => self.port.send(frame)?,
            };
            if status == SendStatus::DroppedNoRoom {
                self.frames_dropped_no_room += 1;
            }
            sent += 1;
        }
        for port in self.ports_mut() {
            port.flush()?;
        }
        self.flushed_at = Some(now);
        Ok(sent)
    }
}

/// The switch on one port per node; its control plane applies learning
/// digests between pumps.
pub struct SwitchEndpoint<P: Program = L2L3Forwarding> {
    pub switch: Switch<P>,
    /// RefCells because a frame received on one port is handed straight to
    /// another port's carrier (cut-through); a frame for its own ingress
    /// port finds it borrowed and waits in the egress queue instead.
    ports: Vec<RefCell<Box<dyn Port>>>,
    health: PortHealth,
    /// When egress frames last waited on a full carrier. A ring that
    /// drains rings nobody's doorbell, so the switch looks again after
    /// [`FULL_CARRIER_RETRY`], as a node blocked on its carrier does:
    /// with the reader on another fabric thread, nothing else would wake
    /// it before its longest sleep.
    blocked_since: Option<Timestamp>,
    /// The time of the pump that last flushed the ports (see
    /// [`blocked_due_retried`]).
    flushed_at: Option<Timestamp>,
}

/// What went wrong on the switch's carriers. One bad port (a corrupt ring
/// from a broken peer process, a socket error) is taken out of service and
/// reported; it never stops the switch for the other ports.
#[derive(Debug, Clone, Default)]
pub struct PortHealth {
    /// Frames a carrier refused outright (too large for it).
    pub frames_refused: u64,
    /// Frames that arrived on, or were bound for, a port out of service.
    pub frames_discarded: u64,
    /// Ports taken out of service, with the reason.
    pub failed: Vec<Option<String>>,
}

impl PortHealth {
    fn record(&mut self, port: usize, error: CarrierError) {
        if matches!(error, CarrierError::FrameTooLarge { .. }) {
            self.frames_refused += 1;
        } else if self.failed[port].is_none() {
            self.failed[port] = Some(error.to_string());
        }
    }

    /// A send of one frame failed: the frame is counted, refused (too
    /// large for the carrier) or discarded (lost with a failing port; it
    /// went uncounted), and the port's failure kept.
    fn record_send(&mut self, port: usize, error: CarrierError) {
        if !matches!(error, CarrierError::FrameTooLarge { .. }) {
            self.frames_discarded += 1;
        }
        self.record(port, error);
    }

    fn in_service(&self, port: usize) -> bool {
        self.failed[port].is_none()
    }
}

impl<P: Program> SwitchEndpoint<P> {
    pub fn new(switch: Switch<P>, ports: Vec<Box<dyn Port>>) -> SwitchEndpoint<P> {
        assert_eq!(usize::from(switch.config().port_count), ports.len());
        SwitchEndpoint {
            switch,
            health: PortHealth {
                frames_refused: 0,
                frames_discarded: 0,
                failed: vec![None; ports.len()],
            },
            ports: ports.into_iter().map(RefCell::new).collect(),
            blocked_since: None,
            flushed_at: None,
        }
    }

    pub fn health(&self) -> &PortHealth {
        &self.health
    }

    /// What each port's carrier and link wrappers lost, by where.
    pub fn port_drops(&self) -> Vec<PortDrops> {
        self.ports
            .iter()
            .map(|port| port.borrow().drops())
            .collect()
    }

    /// Receives from every port, forwarding cut-through where the egress
    /// carrier has room.
    fn forward_received(&mut self, now: Timestamp) -> bool {
        let mut worked = false;
        let (switch, ports, health) = (&mut self.switch, &self.ports, &mut self.health);
        for (index, ingress) in ports.iter().enumerate() {
            if !health.in_service(index) {
                // Still drained, its frames discarded: a socket left
                // unread stays readable, and its wake-ups kept the thread
                // from ever sleeping. Its errors were reported already.
                let drained = ingress
                    .borrow_mut()
                    .receive(RECEIVE_BATCH_FRAMES, &mut |_| {})
                    .unwrap_or(0);
                health.frames_discarded += drained as u64;
                continue;
            }
            let id = PortId(index as u16);
            let mut send_errors = Vec::new();
            let received = ingress
                .borrow_mut()
                .receive(RECEIVE_BATCH_FRAMES, &mut |frame| {
                    switch.handle_frame_with(now, id, frame, &mut |egress, bytes| {
                        let egress = usize::from(egress.0);
                        // A port out of service, or one whose send fails
                        // now, discards the frame and counts it: handed to
                        // its carrier, it went uncounted; the switch
                        // counts it lost, not sent.
                        if !health.in_service(egress) {
                            health.frames_discarded += 1;
                            return Emitted::Lost;
                        }
                        let Ok(mut port) = ports[egress].try_borrow_mut() else {
                            return Emitted::Refused;
                        };
                        if !port.has_room() {
                            return Emitted::Refused;
                        }
                        match port.send(bytes) {
                            Ok(SendStatus::Queued) => Emitted::Sent,
                            Ok(_) => Emitted::Refused,
                            Err(error) => {
                                send_errors.push((egress, error));
                                Emitted::Lost
                            }
                        }
                    });
                });
            for (port, error) in send_errors {
                health.record_send(port, error);
            }
            match received {
                Ok(count) => worked |= count > 0,
                Err(error) => health.record(index, error),
            }
        }
        worked
    }

    /// Sends what waits in the egress queues (frames a full carrier
    /// refused, hairpins, generated packets) and flushes every port.
    fn drain_queues(&mut self, now: Timestamp) -> bool {
        let mut worked = false;
        for (index, port) in self.ports.iter().enumerate() {
            if !self.health.in_service(index) {
                // Discarded: waiting for ever, they kept the switch
                // retrying every 50 µs. Bounded by the egress queue.
                let discarded = &mut self.health.frames_discarded;
                while self
                    .switch
                    .poll_transmit_port(PortId(index as u16), &mut |_| {
                        *discarded += 1;
                        Emitted::Lost
                    })
                {}
                continue;
            }
            let mut port = port.borrow_mut();
            let mut send_errors = Vec::new();
            let mut sent = 0;
            while sent < TRANSMIT_BATCH_FRAMES && port.has_room() {
                let more = self
                    .switch
                    .poll_transmit_port(PortId(index as u16), &mut |frame| {
                        // Taken; refused for room (it waits at the head of
                        // its queue); or lost to a failed send.
                        match port.send(frame) {
                            Ok(SendStatus::Queued) => Emitted::Sent,
                            Ok(SendStatus::DroppedNoRoom) => Emitted::Refused,
                            Err(error) => {
                                send_errors.push(error);
                                Emitted::Lost
                            }
                        }
                    });
                if !more {
                    break;
                }
                sent += 1;
            }
            for error in send_errors {
                self.health.record_send(index, error);
            }
            if let Err(error) = port.flush() {
                self.health.record(index, error);
            }
            worked |= sent > 0;
        }
        self.flushed_at = Some(now);
        worked
    }
}

impl<P: Program> Pump for SwitchEndpoint<P> {
    fn pump(&mut self, clock: &RackClock) -> Result<bool, RackError> {
        let now = clock.now();
        let mut worked = self.forward_received(now);
        if self
            .switch
            .poll_timeout()
            .is_some_and(|deadline| deadline <= now)
        {
            self.switch.handle_timeout(now);
            worked = true;
        }
        // The control plane: learn hosts the tables did not know.
        self.switch.run_control_plane();
        let drained = self.drain_queues(now);
        self.blocked_since = (self.switch.queued_frames() > 0).then_some(now);
        Ok(drained || worked)
    }

    fn deadline(&self, clock: &RackClock) -> Option<Instant> {
        // Not a port out of service: never flushed, the frames held in its
        // delay line stay due in the past, and the thread never slept.
        let ports = self
            .ports
            .iter()
            .enumerate()
            .filter(|(index, _)| self.health.in_service(*index))
            .filter_map(|(_, port)| port.borrow().next_due())
            .map(|due| blocked_due_retried(due, self.flushed_at, clock));
        let retry = self
            .blocked_since
            .map(|since| since.saturating_add(FULL_CARRIER_RETRY));
        [self.switch.poll_timeout(), retry]
            .into_iter()
            .flatten()
            .map(|at| clock.instant(at))
            .chain(ports)
            .min()
    }

    fn has_frames(&mut self) -> bool {
        // A port out of service (a corrupt ring says it holds frames for
        // ever) must not keep the thread from sleeping.
        self.ports
            .iter()
            .enumerate()
            .any(|(index, port)| self.health.in_service(index) && port.borrow_mut().has_frames())
    }

    fn wait_sources(&self) -> Vec<WaitSource> {
        self.ports
            .iter()
            .map(|port| port.borrow().wait_source())
            .collect()
    }
}

/// A pumpable shared between the driver and other threads.
pub type Shared<T> = Arc<Mutex<T>>;

pub fn lock<T: ?Sized>(shared: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock already failed the rack loudly; the
    // state is still the best record of what happened.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Wakes a [`Driver`] after another thread posted work. The flag closes
/// the race in which a kick lands just before the driver announces its
/// sleep: the driver checks the flag after the announcement.
#[derive(Clone)]
pub struct DriverKicker {
    /// Each driver's flag and doorbell: a rack spread over several fabric
    /// threads wakes them all, since the work posted may be any of theirs.
    drivers: Vec<(Arc<AtomicBool>, Kicker)>,
}

impl DriverKicker {
    pub fn kick(&self) {
        for (kicked, kicker) in &self.drivers {
            kicked.store(true, Ordering::SeqCst);
            kicker.kick();
        }
    }
}

/// Pumps endpoints on one thread until told to stop.
pub struct Driver {
    pumps: Vec<Arc<Mutex<dyn Pump>>>,
    waiter: Waiter,
    kicked: Arc<AtomicBool>,
    clock: RackClock,
    stop: Arc<AtomicBool>,
    idle: IdleStrategy,
}

impl Driver {
    pub fn new(
        pumps: Vec<Arc<Mutex<dyn Pump>>>,
        clock: RackClock,
        stop: Arc<AtomicBool>,
    ) -> Result<Driver, RackError> {
        let sources: Vec<WaitSource> = pumps
            .iter()
            .flat_map(|pump| lock(pump).wait_sources())
            .collect();
        Ok(Driver {
            pumps,
            waiter: Waiter::new(&sources)?,
            kicked: Arc::new(AtomicBool::new(false)),
            clock,
            stop,
            idle: IdleStrategy::DEFAULT,
        })
    }

    /// Wakes the driver from another thread (after posting work).
    pub fn kicker(&self) -> DriverKicker {
        DriverKicker {
            drivers: vec![(Arc::clone(&self.kicked), self.waiter.kicker())],
        }
    }

    /// Runs until the stop flag is set or an endpoint fails.
    pub fn run(self) -> Result<(), RackError> {
        let mut idle_since = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            let mut worked = self.kicked.swap(false, Ordering::SeqCst);
            for pump in &self.pumps {
                worked |= lock(pump).pump(&self.clock)?;
            }
            if worked {
                idle_since = Instant::now();
                continue;
            }
            let deadline = self
                .pumps
                .iter()
                .filter_map(|pump| lock(pump).deadline(&self.clock))
                .min();
            let (pumps, kicked) = (&self.pumps, &self.kicked);
            self.idle.idle(&self.waiter, idle_since, deadline, &mut || {
                kicked.load(Ordering::SeqCst) || pumps.iter().any(|pump| lock(pump).has_frames())
            });
        }
        Ok(())
    }
}

/// A rack thread whose body returns the CPU time it used: started by
/// name, joined by its owner once told to stop; a panic becomes an error
/// naming what the thread was.
pub(crate) struct RackThread {
    what: &'static str,
    handle: Option<std::thread::JoinHandle<Result<Duration, RackError>>>,
}

impl RackThread {
    pub(crate) fn spawn(
        name: &str,
        what: &'static str,
        body: impl FnOnce() -> Result<Duration, RackError> + Send + 'static,
    ) -> Result<RackThread, RackError> {
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(body)
            .map_err(|error| {
                RackError::Launch(format!("cannot start the {name} thread: {error}"))
            })?;
        Ok(RackThread {
            what,
            handle: Some(handle),
        })
    }

    /// Whether the body returned (or panicked).
    pub(crate) fn is_finished(&self) -> bool {
        self.handle
            .as_ref()
            .is_none_or(|handle| handle.is_finished())
    }

    /// Waits for the body; its CPU time, or its error. Joined already:
    /// no time.
    pub(crate) fn join(&mut self) -> Result<Duration, RackError> {
        match self.handle.take().map(std::thread::JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(RackError::Launch(format!("{} panicked", self.what))),
            None => Ok(Duration::ZERO),
        }
    }
}

/// What a fabric thread does as it ends, told to, failed or panicked (a
/// guard, dropped as the thread's closure unwinds too): it stops the
/// fabric's other threads (one fabric thread's failure is the fabric's)
/// and sets the rack's stop flag. Signalled after `run` returned, a panic
/// went past it: the flag stayed down, the other fabric threads ran on,
/// and each workload waited out its own 10 s timeout (found by reading).
struct FabricEnding {
    driver_stop: Arc<AtomicBool>,
    rack_stop: Arc<Mutex<RackStop>>,
    kicker: DriverKicker,
}

impl Drop for FabricEnding {
    fn drop(&mut self) {
        self.signal();
    }
}

impl FabricEnding {
    fn signal(&self) {
        let mut rack_stop = lock(&self.rack_stop);
        rack_stop.ended = true;
        rack_stop.raise();
        drop(rack_stop);
        self.driver_stop.store(true, Ordering::Relaxed);
        self.kicker.kick();
    }
}

/// Drivers on threads of their own, one thread each: the rack's fabric.
/// Stopping is one call, and dropping it on an error path stops it too, so
/// no early return leaves a thread running (it also sets the rack's stop
/// flag, which ends compute and control threads started before the
/// failure).
pub struct FabricThread {
    threads: Vec<RackThread>,
    driver_stop: Arc<AtomicBool>,
    /// The rack's stop flag, once given: set by whichever thread ends
    /// first, so workloads beside a failed fabric end at once instead of
    /// waiting out their own timeouts.
    rack_stop: Arc<Mutex<RackStop>>,
    kicker: DriverKicker,
}

/// The rack's stop flag, once given, and whether a fabric thread ended
/// (under one lock, so a thread that ends as the flag is given sets it).
#[derive(Default)]
struct RackStop {
    flag: Option<Arc<AtomicBool>>,
    ended: bool,
}

impl RackStop {
    fn raise(&self) {
        if let Some(flag) = &self.flag {
            flag.store(true, Ordering::Relaxed);
        }
    }
}

impl FabricThread {
    /// Starts one thread per driver; every driver must stop on
    /// `driver_stop`. One driver's thread is called `name`; several are
    /// `name-0`, `name-1`, and so on.
    pub fn start(
        name: &str,
        drivers: Vec<Driver>,
        driver_stop: Arc<AtomicBool>,
        pin: bool,
    ) -> Result<FabricThread, RackError> {
        assert!(!drivers.is_empty(), "a fabric has at least one thread");
        let kicker = DriverKicker {
            drivers: drivers
                .iter()
                .flat_map(|driver| driver.kicker().drivers)
                .collect(),
        };
        let count = drivers.len();
        let mut fabric = FabricThread {
            threads: Vec::with_capacity(count),
            driver_stop,
            rack_stop: Arc::default(),
            kicker,
        };
        for (index, driver) in drivers.into_iter().enumerate() {
            let thread_name = if count == 1 {
                name.to_string()
            } else {
                format!("{name}-{index}")
            };
            let ending = FabricEnding {
                driver_stop: Arc::clone(&fabric.driver_stop),
                rack_stop: Arc::clone(&fabric.rack_stop),
                kicker: fabric.kicker.clone(),
            };
            // On failure `fabric` drops here, which stops and joins the
            // threads already started.
            fabric.threads.push(RackThread::spawn(
                &thread_name,
                "a fabric thread",
                move || {
                    if pin {
                        pin_current_thread(ThreadRole::Fabric(index));
                    }
                    let started_ns = thread_cpu_ns();
                    let ran = driver.run();
                    drop(ending);
                    ran?;
                    Ok(Duration::from_nanos(thread_cpu_ns() - started_ns))
                },
            )?);
        }
        Ok(fabric)
    }

    /// Also sets the rack's stop flag when this fabric stops, fails or
    /// is dropped.
    pub fn stopping_rack(self, stop: &Arc<AtomicBool>) -> FabricThread {
        let mut rack_stop = lock(&self.rack_stop);
        rack_stop.flag = Some(Arc::clone(stop));
        if rack_stop.ended {
            // A thread ended before the flag was given.
            rack_stop.raise();
        }
        drop(rack_stop);
        self
    }

    pub fn kicker(&self) -> DriverKicker {
        self.kicker.clone()
    }

    /// Raised when any of the fabric's threads ends, told to or not:
    /// work in flight through it then never completes, which a waiting
    /// application can see at once.
    pub fn stopped_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.driver_stop)
    }

    /// How many threads the fabric runs on.
    pub fn thread_count(&self) -> usize {
        self.threads.len()
    }

    /// Whether any of its threads ended (a failure, unless it was told to
    /// stop).
    pub fn is_finished(&self) -> bool {
        self.threads.iter().any(RackThread::is_finished)
    }

    /// Stops the drivers and returns the CPU time their threads used
    /// together: the NIC emulation and switch cost, apart from the
    /// application's. The first failure is returned, after every thread
    /// is joined.
    pub fn stop_and_join(mut self) -> Result<Duration, RackError> {
        self.stop();
        self.join_all()
    }

    fn join_all(&mut self) -> Result<Duration, RackError> {
        let mut total = Duration::ZERO;
        let mut failure = None;
        for thread in &mut self.threads {
            match thread.join() {
                Ok(cpu) => total += cpu,
                Err(error) => {
                    failure.get_or_insert(error);
                }
            }
        }
        failure.map_or(Ok(total), Err)
    }

    pub fn stop(&self) {
        lock(&self.rack_stop).raise();
        self.driver_stop.store(true, Ordering::Relaxed);
        self.kicker.kick();
    }
}

impl Drop for FabricThread {
    fn drop(&mut self) {
        self.stop();
        let _ = self.join_all();
    }
}

/// CPU time this thread has used, apart from time it spent descheduled on
/// a shared machine: how the rack splits NIC emulation from application
/// work.
pub fn thread_cpu_ns() -> u64 {
    let time = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    time.tv_sec as u64 * 1_000_000_000 + time.tv_nsec as u64
}
