//! One process, one node: a soft RNIC, the carrier to its peer, and a
//! progress thread that keeps the protocol moving when the application is
//! not calling in.
//!
//! # Progress
//!
//! Progress is both inline and threaded:
//!
//! - **Inline.** Every call that posts work transmits what it produced
//!   before returning, and a `poll_cq` that finds nothing first takes in
//!   what arrived. A busy-polling application pays no thread hand-off.
//! - **A progress thread.** Programs also wait in ways no verb sees
//!   (perftest's latency tests spin on a byte of their own buffer until
//!   the peer's WRITE lands; a server may sleep in `ibv_get_cq_event`),
//!   so a thread takes in frames, fires timers and raises completion
//!   events on its own. It polls for `progress.spin_microseconds` after
//!   the last work, then sleeps until the carrier has frames, the next
//!   timer is due, or the application kicks it. A call kicks only when
//!   the thread is needed before it would wake by itself (the call set an
//!   earlier timer, or left frames the carrier had no room for): kicked
//!   after every post, the thread took the core from perftest's
//!   `ib_write_bw` once per WRITE, and its bandwidth rose from about
//!   1,700 to 2,500 MiB/s when that stopped. The spin is bounded so that two
//!   processes on a 2-core machine do not starve each other: a sleeping
//!   thread costs one wake-up (a futex on shared memory, `poll` on UDP)
//!   per burst of traffic, a spinning one costs a core.
//!
//!   Where it may (root, or `CAP_SYS_NICE`), the thread runs at the lowest
//!   real-time priority, so a wake-up preempts an application thread that
//!   spins on its own memory instead of waiting for the next scheduler
//!   tick. Measured with perftest's `ib_write_lat` over UDP on 2 cores:
//!   the 99th percentile fell from 1.8 ms to 56 µs. A real-time thread
//!   that spins also keeps the application off its core, so the default
//!   spin is short (5 µs; 20 µs doubled the typical latency).

use crate::config::{ipv4_of, CarrierConfig, VerbsConfig};
use crate::rendezvous::{Rendezvous, RendezvousError};
use remora_carrier::wrappers::{CaptureDirection, Captured, PcapSink};
use remora_carrier::{CarrierError, DatagramPort, Kicker, Port, Waiter};
use remora_rnic::{
    CompletionQueue, QueuePairState, RnicConfig, SharedReceiveQueue, SoftRnic, Timestamp,
};
use remora_wire::frame::MAX_FRAME_LEN;
use remora_wire::{Ipv4Address, MacAddress, Qpn};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Frames taken from the carrier, or sent to it, in one pass.
const BATCH_FRAMES: usize = 64;
/// The longest single sleep of the progress thread, so a stop is seen.
const MAX_SLEEP: Duration = Duration::from_millis(20);

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("UDP carrier {local} -> {peer}: {source}")]
    Udp {
        local: std::net::SocketAddr,
        peer: std::net::SocketAddr,
        #[source]
        source: CarrierError,
    },
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
    #[error("carrier: {0}")]
    Carrier(#[from] CarrierError),
    #[error("spawning the progress thread: {0}")]
    Spawn(std::io::Error),
}

/// The Ethernet address a node with IPv4 address `address` uses. Derived,
/// so a peer's MAC follows from its GID with no neighbour discovery, by
/// the rule rack files use (`02:00` and the address), so a rack switch
/// forwards to the node its rack file names.
pub fn mac_for(address: Ipv4Address) -> MacAddress {
    let [a, b, c, d] = address.0;
    MacAddress([0x02, 0x00, a, b, c, d])
}

/// Someone to tell when an armed completion queue has completions (a
/// completion channel).
pub type Notify = Arc<dyn Fn() + Send + Sync>;

/// What an armed watch waits for. Each fires once, then is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Awaited {
    /// A completion on the queue (`ibv_req_notify_cq`); with
    /// `solicited_only`, a solicited receive or a failed request.
    Completion {
        queue: CompletionQueue,
        solicited_only: bool,
    },
    /// The queue overran, losing a completion (`IBV_EVENT_CQ_ERR`).
    Overrun(CompletionQueue),
    /// The shared receive queue's posted receives fell below `limit`
    /// (`ibv_modify_srq`'s `srq_limit`: `IBV_EVENT_SRQ_LIMIT_REACHED`).
    ReceivesBelow {
        queue: SharedReceiveQueue,
        limit: usize,
    },
    /// The queue pair is in error, by a failure or a modify
    /// (`IBV_EVENT_QP_LAST_WQE_REACHED` for one on a shared receive
    /// queue).
    InError(Qpn),
}

impl Awaited {
    /// Whether `other` watches the same thing (arming it again replaces
    /// the watch).
    fn same_watch(&self, other: &Awaited) -> bool {
        match (self, other) {
            (Awaited::Completion { queue: a, .. }, Awaited::Completion { queue: b, .. }) => a == b,
            (Awaited::Overrun(a), Awaited::Overrun(b)) => a == b,
            (Awaited::ReceivesBelow { queue: a, .. }, Awaited::ReceivesBelow { queue: b, .. }) => {
                a == b
            }
            (Awaited::InError(a), Awaited::InError(b)) => a == b,
            _ => false,
        }
    }

    /// Whether it happened: `None` when what it watches is gone (a
    /// destroyed queue), which ends the watch without firing.
    fn happened(&self, rnic: &SoftRnic) -> Option<bool> {
        match *self {
            Awaited::Completion {
                queue,
                solicited_only: true,
            } => rnic.solicited_or_failed_waiting(queue).ok(),
            Awaited::Completion { queue, .. } => rnic
                .completions_waiting(queue)
                .ok()
                .map(|waiting| waiting > 0),
            Awaited::Overrun(queue) => rnic.completion_queue_overran(queue).ok(),
            Awaited::ReceivesBelow { queue, limit } => rnic
                .shared_receives_posted(queue)
                .ok()
                .map(|posted| posted < limit),
            Awaited::InError(qpn) => rnic
                .queue_pair_state(qpn)
                .ok()
                .map(|state| state == QueuePairState::Error),
        }
    }
}

struct Armed {
    awaited: Awaited,
    notify: Notify,
}

/// What the node's lock guards.
pub struct NodeState {
    pub rnic: SoftRnic,
    port: Box<dyn Port>,
    buffer: Box<[u8]>,
    armed: Vec<Armed>,
    /// Carrier errors seen by the progress thread, reported once.
    carrier_failed: bool,
}

pub struct Node {
    state: Mutex<NodeState>,
    address: Ipv4Address,
    peer: Option<Ipv4Address>,
    epoch: Instant,
    sleeping: AtomicBool,
    /// When the sleeping progress thread wakes by itself, in nanoseconds
    /// of [`Node::now`]: a post that needs it sooner kicks it.
    sleep_deadline_nanos: AtomicU64,
    /// Application calls that found the progress thread asleep and had
    /// to wake it.
    application_wakeups: AtomicU64,
    /// Set by a poster that saw `sleeping` (see `wake_progress`).
    kicked: AtomicBool,
    stopping: AtomicBool,
    kicker: Kicker,
    /// The capture file, flushed whenever the node goes idle and when the
    /// program closes its device (a program's exit runs no destructors of
    /// the process-wide node).
    capture: Option<PcapSink>,
}

impl Node {
    /// Opens the carrier and starts the progress thread.
    pub fn start(config: &VerbsConfig) -> Result<Arc<Node>, NodeError> {
        // Before the carrier: a shared-memory rendezvous, once created,
        // serves its segment to the peer even if this start then fails,
        // and the peer connected to a ring nobody served.
        let capture = config
            .capture
            .as_deref()
            .map(PcapSink::create)
            .transpose()?;
        let (port, address, peer): (Box<dyn Port>, Ipv4Address, Ipv4Address) = match &config.carrier
        {
            CarrierConfig::Udp { local, peer } => {
                let port = DatagramPort::udp(*local, *peer).map_err(|source| NodeError::Udp {
                    local: *local,
                    peer: *peer,
                    source,
                })?;
                (Box::new(port), ipv4_of(*local), ipv4_of(*peer))
            }
            CarrierConfig::SharedMemory { rendezvous } => {
                let joined = Rendezvous::join_or_create(rendezvous)?;
                (Box::new(joined.port), joined.address, joined.peer)
            }
        };
        // Behind a rack switch the node has the rack's address, and its
        // tunnel's other end is the switch, not a peer.
        let (address, peer) = match config.address {
            Some(own) => (Ipv4Address(own.octets()), None),
            None => (address, Some(peer)),
        };
        let port = match &capture {
            Some(sink) => {
                let captured = Captured::new(port, sink.clone(), CaptureDirection::Both);
                Box::new(captured) as Box<dyn Port>
            }
            None => port,
        };
        let waiter = Waiter::new(&[port.wait_source()])?;
        let seed = u64::from(std::process::id()) ^ u64::from(u32::from_be_bytes(address.0));
        let node = Arc::new(Node {
            state: Mutex::new(NodeState {
                rnic: SoftRnic::new(RnicConfig::new(mac_for(address), address, seed)),
                port,
                buffer: vec![0u8; MAX_FRAME_LEN].into_boxed_slice(),
                armed: Vec::new(),
                carrier_failed: false,
            }),
            address,
            peer,
            epoch: Instant::now(),
            sleeping: AtomicBool::new(false),
            sleep_deadline_nanos: AtomicU64::new(0),
            application_wakeups: AtomicU64::new(0),
            kicked: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            kicker: waiter.kicker(),
            capture,
        });
        let spin = Duration::from_micros(config.progress.spin_microseconds);
        let progress = Arc::clone(&node);
        std::thread::Builder::new()
            .name("remora-verbs-progress".into())
            .spawn(move || progress.run_progress(&waiter, spin))
            .map_err(NodeError::Spawn)?;
        Ok(node)
    }

    /// The node's IPv4 address: its GID, and its frames' source address.
    pub fn address(&self) -> Ipv4Address {
        self.address
    }

    /// The other end of a point-to-point carrier: the peer of a queue pair
    /// whose program connects by LID alone, with no GID. None behind a
    /// switch, where only a GID names the peer.
    pub fn peer_address(&self) -> Option<Ipv4Address> {
        self.peer
    }

    pub fn now(&self) -> Timestamp {
        Timestamp::from_nanos(self.epoch.elapsed().as_nanos() as u64)
    }

    fn lock(&self) -> MutexGuard<'_, NodeState> {
        // A panic elsewhere never leaves the device half-updated in a way
        // the next caller cannot see: keep serving.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `action` on the device, then sends what it produced: every verb
    /// that posts work goes through here.
    pub fn with_device<R>(&self, action: impl FnOnce(&mut SoftRnic) -> R) -> R {
        let (result, due) = {
            let mut state = self.lock();
            let result = action(&mut state.rnic);
            let now = self.now();
            state.transmit(now);
            // A verb can complete work itself (a post to a queue pair in
            // error, a move to error that flushes): an armed queue's
            // waiter hears of it now, not at the next frame.
            state.notify_armed();
            (result, self.due_if_sleeping(&state))
        };
        self.wake_if_due(due);
        result
    }

    /// How many application calls found the progress thread asleep and
    /// woke it: each costs the application a system call, and the thread
    /// a scheduling.
    pub fn application_wakeups(&self) -> u64 {
        self.application_wakeups.load(Ordering::Relaxed)
    }

    /// While the progress thread sleeps, when the device next needs it
    /// (see [`NodeState::progress_due`]); None while it is awake. Read
    /// under the lock, which the thread takes for its last look at the
    /// device after it announced its sleep: a caller that finds it awake
    /// here left work that look will see.
    fn due_if_sleeping(&self, state: &NodeState) -> Option<u64> {
        self.sleeping
            .load(Ordering::SeqCst)
            .then(|| state.progress_due())
    }

    /// Wakes the sleeping progress thread if the device needs it before
    /// it would wake by itself: a call set an earlier timer, or left
    /// frames the carrier had no room for. Kicked after every post, it
    /// took the core from a posting application (perftest's
    /// `ib_write_bw`) once per WRITE.
    fn wake_if_due(&self, due: Option<u64>) {
        if due.is_some_and(|due| due < self.sleep_deadline_nanos.load(Ordering::SeqCst)) {
            self.application_wakeups.fetch_add(1, Ordering::Relaxed);
            self.wake_progress();
        }
    }

    /// Reads the device without sending anything.
    pub fn inspect<R>(&self, action: impl FnOnce(&SoftRnic) -> R) -> R {
        action(&self.lock().rnic)
    }

    /// Takes completions from `queue` into `sink` (at most `max`), taking in
    /// what arrived first when none wait: `poll_cq`'s inline progress.
    pub fn poll_completions(
        &self,
        queue: CompletionQueue,
        max: usize,
        sink: &mut dyn FnMut(remora_rnic::WorkCompletion),
    ) -> Result<usize, remora_rnic::VerbsError> {
        use remora_rnic::DataPath;
        let mut state = self.lock();
        let mut due = None;
        if state.rnic.completions_waiting(queue)? == 0 {
            let now = self.now();
            state.pump(now);
            // The pump took frames the sleeping thread would have woken
            // on, and what they started (an RNR wait's timer, frames past
            // one batch) is left to it.
            due = self.due_if_sleeping(&state);
        }
        let mut taken = 0;
        while taken < max {
            match state.rnic.poll_completion(queue) {
                Ok(Some(completion)) => sink(completion),
                Ok(None) => break,
                // An overrun after completions taken: they are the
                // caller's (an error now lost them); the overrun is
                // reported at the next poll, which finds none before it.
                Err(_) if taken > 0 => break,
                Err(error) => return Err(error),
            }
            taken += 1;
        }
        drop(state);
        self.wake_if_due(due);
        Ok(taken)
    }

    /// Calls `notify` once, when what `awaited` names happens (at once if
    /// it has): a completion (`ibv_req_notify_cq`), an overrun, a shared
    /// receive queue below its limit. It replaces a watch of the same.
    pub fn arm(&self, awaited: Awaited, notify: Notify) {
        let mut state = self.lock();
        state
            .armed
            .retain(|armed| !armed.awaited.same_watch(&awaited));
        state.armed.push(Armed { awaited, notify });
        state.notify_armed();
    }

    /// Forgets the watch of the same thing as `awaited`, if any
    /// (`ibv_modify_srq` with a limit of 0).
    pub fn unwatch(&self, awaited: Awaited) {
        self.lock()
            .armed
            .retain(|armed| !armed.awaited.same_watch(&awaited));
    }

    /// Forgets every watch of a completion queue (it is being destroyed).
    pub fn disarm(&self, queue: CompletionQueue) {
        self.lock().armed.retain(|armed| match armed.awaited {
            Awaited::Completion { queue: watched, .. } | Awaited::Overrun(watched) => {
                watched != queue
            }
            Awaited::ReceivesBelow { .. } | Awaited::InError(_) => true,
        });
    }

    /// Stops the progress thread (tests and benchmarks that start many
    /// nodes in one process).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.wake_progress();
    }

    /// The flag closes the race in which the kick lands after the progress
    /// thread announced its sleep but before its doorbell did, which a
    /// doorbell ignores: the thread checks the flag once its doorbell
    /// announced the sleep.
    fn wake_progress(&self) {
        self.kicked.store(true, Ordering::SeqCst);
        self.kicker.kick();
    }

    fn run_progress(&self, waiter: &Waiter, spin: Duration) {
        raise_to_realtime();
        let mut idle_since = Instant::now();
        while !self.stopping.load(Ordering::SeqCst) {
            let worked = {
                let mut state = self.lock();
                let now = self.now();
                state.pump(now)
            };
            if worked {
                idle_since = Instant::now();
                continue;
            }
            if idle_since.elapsed() < spin {
                std::hint::spin_loop();
                continue;
            }
            self.sleep(waiter);
            idle_since = Instant::now();
        }
    }

    /// Writes out what the capture file buffered.
    pub fn flush_capture(&self) {
        if let Some(sink) = &self.capture {
            if let Err(error) = sink.flush() {
                eprintln!("remora-verbs: capture: {error}");
            }
        }
    }

    fn sleep(&self, waiter: &Waiter) {
        self.flush_capture();
        // Announce the sleep before the last look, so a poster either is
        // seen here or sees the flag and kicks.
        self.kicked.store(false, Ordering::SeqCst);
        self.sleeping.store(true, Ordering::SeqCst);
        let timeout = {
            let mut state = self.lock();
            let now = self.now();
            let has_work =
                state.port.has_frames() || (state.rnic.may_transmit() && state.port.has_room());
            let timeout = match state.rnic.poll_timeout() {
                _ if has_work => Duration::ZERO,
                Some(deadline) => deadline.saturating_duration_since(now).min(MAX_SLEEP),
                None => MAX_SLEEP,
            };
            // Under the lock, so a poster that sees `sleeping` after its
            // own turn with the device sees this sleep's deadline.
            let deadline = now.as_nanos().saturating_add(timeout.as_nanos() as u64);
            self.sleep_deadline_nanos.store(deadline, Ordering::SeqCst);
            timeout
        };
        if !timeout.is_zero() {
            waiter.block(timeout, &mut || {
                self.kicked.load(Ordering::SeqCst) || self.lock().port.has_frames()
            });
        }
        self.sleeping.store(false, Ordering::SeqCst);
    }
}

impl NodeState {
    /// Takes in frames, fires due timers, sends, and raises completion
    /// events. Returns whether anything moved.
    fn pump(&mut self, now: Timestamp) -> bool {
        let rnic = &mut self.rnic;
        let received = match self.port.receive(BATCH_FRAMES, &mut |frame| {
            rnic.handle_frame(now, frame);
        }) {
            Ok(count) => count,
            Err(error) => {
                self.report_carrier_error(&error);
                0
            }
        };
        let mut fired = false;
        if self
            .rnic
            .poll_timeout()
            .is_some_and(|deadline| deadline <= now)
        {
            self.rnic.handle_timeout(now);
            fired = true;
        }
        let sent = self.transmit(now);
        let moved = received > 0 || fired || sent > 0;
        if moved {
            self.notify_armed();
        }
        moved
    }

    /// When, in nanoseconds of the node's clock, the device next needs the
    /// progress thread: now if it has frames left to send, else at its
    /// next timer.
    fn progress_due(&self) -> u64 {
        if self.rnic.may_transmit() {
            return 0;
        }
        self.rnic
            .poll_timeout()
            .map_or(u64::MAX, |deadline| deadline.as_nanos())
    }

    /// Sends what the device has, while the carrier has room.
    fn transmit(&mut self, now: Timestamp) -> usize {
        let mut sent = 0;
        while sent < BATCH_FRAMES && self.port.has_room() {
            let Some(length) = self.rnic.poll_transmit(now, &mut self.buffer) else {
                break;
            };
            if let Err(error) = self.port.send(&self.buffer[..length]) {
                self.report_carrier_error(&error);
            }
            sent += 1;
        }
        if sent > 0 {
            if let Err(error) = self.port.flush() {
                self.report_carrier_error(&error);
            }
        }
        sent
    }

    fn notify_armed(&mut self) {
        let rnic = &self.rnic;
        self.armed
            .retain(|armed| match armed.awaited.happened(rnic) {
                Some(true) => {
                    (armed.notify)();
                    false
                }
                Some(false) => true,
                None => false,
            });
    }

    fn report_carrier_error(&mut self, error: &CarrierError) {
        // The RNIC's retransmission recovers lost frames; say it once.
        if !self.carrier_failed {
            self.carrier_failed = true;
            eprintln!("remora-verbs: carrier: {error}");
        }
    }
}

/// Asks for the lowest real-time priority (`SCHED_FIFO` 1), so that a
/// woken progress thread runs at once rather than at the next scheduler
/// tick behind an application thread spinning on its own memory: a NIC's
/// engine does not wait for the host's CPU. It sleeps whenever it is idle,
/// so it cannot monopolise a core; without the privilege, it stays an
/// ordinary thread.
fn raise_to_realtime() {
    let parameters = libc::sched_param { sched_priority: 1 };
    // SAFETY: plain system call on the calling thread with a valid
    // parameter block; failure (EPERM) leaves the thread as it was.
    let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &parameters) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProgressConfig;
    use remora_rnic::{
        AccessFlags, DataPath, HostMemory, MemoryRegion, QueuePair, QueuePairBuilder,
        QueuePairEndpoint, SendOperation, SendRequest, Verbs,
    };
    use remora_wire::{Psn, Qpn};
    use std::net::UdpSocket;

    /// A node whose UDP peer is a plain socket that never answers, with
    /// connected queue pairs whose retransmission timeout is `timeout`:
    /// one for each WRITE, since the first to fail puts its queue pair in
    /// error.
    struct SilentPeer {
        node: Arc<Node>,
        peer: UdpSocket,
        queue_pairs: Vec<QueuePair>,
        region: MemoryRegion,
    }

    impl SilentPeer {
        fn start(timeout: Duration, writes: u32) -> SilentPeer {
            // Both ends on ports the kernel picks, so no run collides with
            // another.
            let peer = UdpSocket::bind("127.0.0.2:0").unwrap();
            peer.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
            let peer_address = peer.local_addr().unwrap();
            let config = VerbsConfig {
                address: None,
                carrier: CarrierConfig::Udp {
                    local: "127.0.0.1:0".parse().unwrap(),
                    peer: peer_address,
                },
                progress: ProgressConfig::default(),
                capture: None,
            };
            let node = Node::start(&config).unwrap();
            let (queue_pairs, region) = node.with_device(|rnic| {
                let pd = rnic.alloc_protection_domain().unwrap();
                let region = rnic
                    .register_host_memory(pd, HostMemory::new(4096), AccessFlags::ALL)
                    .unwrap();
                let completions = rnic.create_completion_queue(64).unwrap();
                let builder = QueuePairBuilder::new(pd, completions, completions);
                let connect = |qpn: u32| {
                    let prepared = rnic.create_queue_pair(&builder).unwrap();
                    let remote = QueuePairEndpoint {
                        qpn: Qpn::new(qpn).expect("24 bits"),
                        address: ipv4_of(peer_address),
                        mac: mac_for(ipv4_of(peer_address)),
                        initial_psn: Psn::new(0),
                    };
                    let queue_pair = rnic.handshake(prepared, remote).unwrap();
                    rnic.set_retransmission(queue_pair.0, Some(timeout), Some(7))
                        .unwrap();
                    queue_pair
                };
                ((0..writes).map(connect).collect::<Vec<_>>(), region)
            });
            SilentPeer {
                node,
                peer,
                queue_pairs,
                region,
            }
        }

        /// Waits until the progress thread sleeps with more than `margin`
        /// left before it wakes by itself.
        fn await_sleep(&self, margin: Duration) {
            let limit = Instant::now() + Duration::from_secs(5);
            loop {
                let deadline = self.node.sleep_deadline_nanos.load(Ordering::SeqCst);
                let wakes_in = deadline.saturating_sub(self.node.now().as_nanos());
                if self.node.sleeping.load(Ordering::SeqCst) && wakes_in > margin.as_nanos() as u64
                {
                    return;
                }
                assert!(Instant::now() < limit, "the progress thread never slept");
                std::thread::sleep(Duration::from_micros(200));
            }
        }

        /// Posts a WRITE on the `index`th queue pair.
        fn post_write(&self, index: usize) {
            let operation = SendOperation::Write {
                remote: self.region.remote(0),
                immediate: None,
            };
            let request =
                SendRequest::new(index as u64, operation, &[self.region.slice(0, 64)]).unwrap();
            self.node
                .with_device(|rnic| rnic.post_send(self.queue_pairs[index], request))
                .unwrap();
        }

        /// Takes what reaches the peer until it has been quiet for 50 ms
        /// (a WRITE's retransmissions, until it fails).
        fn drain(&self) {
            self.peer
                .set_read_timeout(Some(Duration::from_millis(50)))
                .unwrap();
            while self.peer.recv(&mut [0u8; 2048]).is_ok() {}
            self.peer
                .set_read_timeout(Some(Duration::from_secs(1)))
                .unwrap();
        }

        /// When the next frame reaches the peer.
        fn next_arrival(&self) -> Instant {
            let mut buffer = [0u8; 2048];
            self.peer
                .recv(&mut buffer)
                .expect("a frame within a second");
            Instant::now()
        }
    }

    impl Drop for SilentPeer {
        fn drop(&mut self) {
            self.node.stop();
        }
    }

    /// A start that failed on its capture file had already created the
    /// shared-memory rendezvous, which went on serving its segment: the
    /// peer joined a ring nobody ran. The capture is opened first now.
    #[test]
    fn a_start_that_fails_on_its_capture_leaves_no_rendezvous() {
        let directory = tempfile::tempdir().unwrap();
        let rendezvous = directory.path().join("rendezvous");
        let config = VerbsConfig {
            address: None,
            carrier: CarrierConfig::SharedMemory {
                rendezvous: rendezvous.clone(),
            },
            progress: ProgressConfig::default(),
            capture: Some(directory.path().join("no-such-directory/capture.pcap")),
        };
        assert!(Node::start(&config).is_err());
        assert!(!rendezvous.exists(), "a rendezvous was left serving");
    }

    #[test]
    fn a_post_that_arms_a_timer_before_the_sleep_ends_wakes_the_progress_thread() {
        // The timer (2 ms) falls before the asleep thread's own wake-up
        // (over 15 ms away): unwoken, it sent the first retransmission
        // that much late.
        let silent = SilentPeer::start(Duration::from_millis(2), 3);
        for index in 0..3 {
            silent.await_sleep(Duration::from_millis(15));
            silent.post_write(index);
            let first = silent.next_arrival();
            let gap = silent.next_arrival() - first;
            assert!(
                gap < Duration::from_millis(10),
                "the first retransmission came {gap:?} after the WRITE, its timer being 2 ms"
            );
            silent.drain();
        }
        assert!(silent.node.application_wakeups() >= 3);
    }

    #[test]
    fn a_post_whose_timer_falls_after_the_sleep_leaves_the_progress_thread_asleep() {
        // perftest asks for a 67 ms timeout: past the thread's longest
        // sleep, so the thread finds the timer by itself. Woken anyway, it
        // took the core from the posting application.
        let silent = SilentPeer::start(Duration::from_millis(200), 10);
        for index in 0..10 {
            silent.await_sleep(Duration::ZERO);
            silent.post_write(index);
            silent.next_arrival();
        }
        assert_eq!(silent.node.application_wakeups(), 0);
    }
}
