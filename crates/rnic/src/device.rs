//! The soft RNIC: one device with its memory, queues and queue pairs.
//!
//! It follows quinn-proto's contract. Commands (the [`Verbs`]) mutate state;
//! [`SoftRnic::handle_frame`] takes a received frame; [`SoftRnic::poll_transmit`]
//! drains frames to send; [`SoftRnic::poll_timeout`] says when
//! [`SoftRnic::handle_timeout`] must next be called. Time is always an
//! argument, so the simulator and a real event loop drive the same code.

use crate::counters::{DropReason, RnicCounters};
use crate::datagram::Datagrams;
use crate::host_memory::HostMemory;
use crate::memory::MemoryTable;
use crate::queue_pair::QueuePairContext;
use crate::queues::{check_depth, check_room, BoundedQueue, CompletionRing, Retired};
use crate::resources::{Resources, SharedReceiveRing};
use crate::time::Timestamp;
use crate::verbs::*;
use crate::VerbsError;
use remora_wire::datagram::{udp_destination_port, DatagramEnd};
use remora_wire::frame::MAX_FRAME_LEN;
use remora_wire::{Ipv4Address, MacAddress, Opcode, Pkey, Psn, Qpn, RoceFrame, VirtAddr};

/// QPNs 0 and 1 are special in InfiniBand; data QPs start above them.
const FIRST_QPN: u32 = 0x100;
const MAX_READ_ATOMIC_LIMIT: usize = 128;

/// Device identity and limits.
#[derive(Debug, Clone)]
pub struct RnicConfig {
    pub mac: MacAddress,
    pub address: Ipv4Address,
    /// Seeds initial PSNs and key salts, so runs are reproducible.
    pub seed: u64,
    pub max_queue_pairs: usize,
    pub max_memory_regions: usize,
    pub max_region_bytes: u64,
    pub max_queue_depth: usize,
    pub max_completion_queues: usize,
    pub max_shared_receive_queues: usize,
    pub max_message_bytes: u32,
    /// READs and atomics a queue pair may have outstanding, as initiator
    /// and as target: the device's max_qp_rd_atom (a hardware profile may
    /// lower it).
    pub max_read_atomic: usize,
}

impl RnicConfig {
    /// The deepest queue (send, receive, completion) a default device
    /// makes.
    pub const DEFAULT_MAX_QUEUE_DEPTH: usize = 16_384;

    /// The largest memory region a device takes unless configured otherwise.
    pub const DEFAULT_MAX_REGION_BYTES: u64 = 1 << 30;

    pub fn new(mac: MacAddress, address: Ipv4Address, seed: u64) -> RnicConfig {
        RnicConfig {
            mac,
            address,
            seed,
            max_queue_pairs: 1024,
            max_memory_regions: 1024,
            max_region_bytes: RnicConfig::DEFAULT_MAX_REGION_BYTES,
            max_queue_depth: RnicConfig::DEFAULT_MAX_QUEUE_DEPTH,
            max_completion_queues: 1024,
            max_shared_receive_queues: 1024,
            max_message_bytes: 1 << 24,
            max_read_atomic: MAX_READ_ATOMIC_LIMIT,
        }
    }
}

/// A small, well-mixed hash for deriving per-object values from the seed.
fn splitmix64(mut state: u64) -> u64 {
    state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    state = (state ^ (state >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    state = (state ^ (state >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    state ^ (state >> 31)
}

#[derive(Debug)]
pub struct SoftRnic {
    config: RnicConfig,
    resources: Resources,
    protection_domains: u32,
    queue_pairs: Vec<QueuePairContext>,
    /// Slots of destroyed queue pairs: the next queue pairs take them,
    /// under numbers of a new generation, so that a late frame for the old
    /// queue pair finds no queue pair rather than the new one.
    retired_queue_pairs: Retired,
    /// Queue pairs that may have a frame to send, each once, in the order
    /// they take turns: `poll_transmit` costs the busy queue pairs, not
    /// every one connected (with 1023 idle ones, scanning them all made a
    /// 64 B READ 35 times slower). A queue pair joins whenever anything
    /// happens to it (a post, a frame, a due timer, a transition) and
    /// leaves when it is polled and has nothing to send.
    transmit_queue: std::collections::VecDeque<usize>,
    /// Indexed by slot: whether the queue pair is in `transmit_queue`.
    transmit_queued: Vec<bool>,
    /// Queue pairs that may have a timer running: every queue pair that
    /// does, and maybe others. `poll_timeout` and `handle_timeout` look at
    /// these only. A queue pair joins when it is woken (only what wakes one
    /// can arm its timers) and leaves when it leaves the transmit queue
    /// with no timer running.
    timed: Vec<usize>,
    /// Indexed by slot: where the queue pair is in `timed`, if it is.
    timed_position: Vec<Option<usize>>,
    datagrams: Datagrams,
}

/// A device limit [`SoftRnic::try_new`] cannot honour.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("RNIC config: {limit} = {value} is outside {allowed}")]
pub struct RnicConfigError {
    pub limit: &'static str,
    pub value: u64,
    pub allowed: &'static str,
}

impl RnicConfig {
    /// Whether a device can be built with these limits: every memory
    /// region slot needs two key indexes of the 2^24 a key has.
    pub fn validate(&self) -> Result<(), RnicConfigError> {
        let regions = self.max_memory_regions;
        if regions == 0 || regions > crate::memory::MAX_REGIONS_LIMIT {
            return Err(RnicConfigError {
                limit: "max_memory_regions",
                value: regions as u64,
                allowed: "1..=8388607",
            });
        }
        Ok(())
    }
}

impl SoftRnic {
    /// A device with `config`'s limits.
    ///
    /// # Panics
    ///
    /// If the config is invalid ([`RnicConfig::validate`]); configs built
    /// from input go through [`SoftRnic::try_new`].
    pub fn new(config: RnicConfig) -> SoftRnic {
        match SoftRnic::try_new(config) {
            Ok(device) => device,
            Err(error) => panic!("{error}"),
        }
    }

    /// A device with `config`'s limits, or why they cannot be honoured.
    pub fn try_new(config: RnicConfig) -> Result<SoftRnic, RnicConfigError> {
        config.validate()?;
        let rkey_salt = (splitmix64(config.seed) as u32) & 0xffff_ff00;
        let memory = MemoryTable::new(
            config.max_memory_regions,
            config.max_region_bytes,
            rkey_salt,
        );
        Ok(SoftRnic {
            resources: Resources {
                memory,
                completion_queues: Vec::new(),
                retired_completion_queues: Retired::default(),
                shared_receive_queues: Vec::new(),
                retired_shared_receive_queues: Retired::default(),
                counters: RnicCounters::default(),
                newly_overrun: Vec::new(),
                max_message_bytes: config.max_message_bytes,
            },
            protection_domains: 0,
            queue_pairs: Vec::new(),
            retired_queue_pairs: Retired::default(),
            datagrams: Datagrams::default(),
            transmit_queue: std::collections::VecDeque::new(),
            transmit_queued: Vec::new(),
            timed: Vec::new(),
            timed_position: Vec::new(),
            config,
        })
    }

    pub fn config(&self) -> &RnicConfig {
        &self.config
    }

    pub fn counters(&self) -> &RnicCounters {
        &self.resources.counters
    }

    /// Changes how long `qpn` waits for an acknowledgement before sending
    /// again, and how many times it sends again before failing with
    /// `RetryExceeded` (`ibv_modify_qp`'s `timeout` and `retry_cnt`); `None`
    /// keeps what it has. The retry budget starts over.
    pub fn set_retransmission(
        &mut self,
        qpn: Qpn,
        timeout: Option<std::time::Duration>,
        retry_count: Option<u8>,
    ) -> Result<(), VerbsError> {
        if let Some(retry_count) = retry_count {
            check_depth("retry_count", usize::from(retry_count) + 1, 8)?;
        }
        let (_, queue_pair, _) = self.queue_pair_mut(qpn)?;
        queue_pair.set_retransmission(timeout, retry_count);
        Ok(())
    }

    /// Sets queue pair `qpn`'s path and flow attributes (see
    /// [`PathAttributes`]): each limit within the device's, and the path
    /// MTU and the READs and atomics it serves only before it has carried
    /// a request.
    pub fn set_path_attributes(
        &mut self,
        qpn: Qpn,
        attributes: PathAttributes,
    ) -> Result<(), VerbsError> {
        self.check_read_atomic_limits(
            attributes.max_read_atomic,
            attributes.max_destination_read_atomic,
        )?;
        let (_, queue_pair, _) = self.queue_pair_mut(qpn)?;
        queue_pair.set_path_attributes(attributes)
    }

    /// The READs and atomics a queue pair may issue and serve, as given,
    /// each within the device's limit.
    fn check_read_atomic_limits(
        &self,
        issued: Option<usize>,
        served: Option<usize>,
    ) -> Result<(), VerbsError> {
        let max_read_atomic = self.config.max_read_atomic.min(MAX_READ_ATOMIC_LIMIT);
        if let Some(limit) = issued {
            check_depth("max_read_atomic", limit, max_read_atomic)?;
        }
        // A queue pair may serve none (its READs and atomics refused).
        if let Some(limit) = served.filter(|limit| *limit > 0) {
            check_depth("max_destination_read_atomic", limit, max_read_atomic)?;
        }
        Ok(())
    }

    /// Queue pair `qpn`'s path and flow attributes as they are now.
    pub fn path_attributes(&self, qpn: Qpn) -> Result<PathAttributes, VerbsError> {
        Ok(self.queue_pair(qpn)?.path_attributes())
    }

    /// How many times queue pair `qpn` sends again after an RNR NAK before
    /// failing with `ReceiverNotReadyRetryExceeded` (`ibv_modify_qp`'s
    /// `rnr_retry`; 7 is for ever, as in IB). The budget starts over.
    pub fn set_rnr_retry(&mut self, qpn: Qpn, rnr_retry: u8) -> Result<(), VerbsError> {
        check_depth("rnr_retry", usize::from(rnr_retry) + 1, 8)?;
        let (_, queue_pair, _) = self.queue_pair_mut(qpn)?;
        queue_pair.set_rnr_retry(rnr_retry);
        Ok(())
    }

    /// What remote peers may do through queue pair `qpn` (`ibv_modify_qp`'s
    /// `qp_access_flags`; see [`QueuePairBuilder::remote_access`]).
    pub fn set_remote_access(&mut self, qpn: Qpn, access: AccessFlags) -> Result<(), VerbsError> {
        let (_, queue_pair, _) = self.queue_pair_mut(qpn)?;
        queue_pair.set_remote_access(access);
        Ok(())
    }

    /// Queue pairs made and not destroyed.
    pub fn live_queue_pairs(&self) -> usize {
        self.retired_queue_pairs.live(&self.queue_pairs)
    }

    pub fn queue_pair_state(&self, qpn: Qpn) -> Result<QueuePairState, VerbsError> {
        Ok(self.queue_pair(qpn)?.state())
    }

    /// Bytes queue pair `qpn` holds to answer READs again (its replay
    /// slots' snapshots).
    pub fn replay_bytes_held(&self, qpn: Qpn) -> Result<usize, VerbsError> {
        Ok(self.queue_pair(qpn)?.replay_bytes_held())
    }

    /// Posts `requests` on `queue_pair` all or none: one that would be
    /// refused (a bad key, no room left for the whole batch) refuses them
    /// all, and none is queued (`ibv_wr_complete`).
    pub fn post_send_all(
        &mut self,
        queue_pair: QueuePair,
        requests: Vec<SendRequest>,
    ) -> Result<(), VerbsError> {
        self.posting(queue_pair, |context, resources, max_message_bytes| {
            context.post_send_all(requests, resources, max_message_bytes)
        })
    }

    /// Runs `post` on the queue pair (with the largest message the device
    /// takes), then wakes it and fails the queue pairs of any queue the
    /// posting overran: every way work is posted.
    #[inline]
    fn posting(
        &mut self,
        queue_pair: QueuePair,
        post: impl FnOnce(&mut QueuePairContext, &mut Resources, u32) -> Result<(), VerbsError>,
    ) -> Result<(), VerbsError> {
        let max_message_bytes = self.config.max_message_bytes;
        let (slot, context, resources) = self.queue_pair_mut(queue_pair.0)?;
        let posted = post(context, resources, max_message_bytes);
        self.wake(slot);
        self.fail_queue_pairs_of_overrun_queues();
        posted
    }

    /// `ibv_destroy_qp`'s part on the device: the queue pair drops its work
    /// with no completions (RESET), and its completions still waiting in
    /// its completion queues go too, as a real device cleans a destroyed
    /// queue pair's entries from its CQs. Flushed instead, they reached
    /// live queues with work request ids the program had freed (and could
    /// overrun a queue shared with live queue pairs).
    pub fn retire_queue_pair(&mut self, qpn: Qpn) -> Result<(), VerbsError> {
        let (slot, context, resources) = self.queue_pair_mut(qpn)?;
        context.transition(QueuePairState::Reset, None, resources)?;
        for queue in context.completion_queues() {
            resources.completion_queues[queue.0 as usize].discard_of(qpn);
        }
        self.retired_queue_pairs.retire(slot);
        self.wake(slot);
        Ok(())
    }

    /// Destroys a completion queue no queue pair uses (`QueueInUse`
    /// otherwise); a later one takes its number.
    pub fn destroy_completion_queue(&mut self, queue: CompletionQueue) -> Result<(), VerbsError> {
        self.check_completion_queue(queue)?;
        self.refuse_if_used("completion queue", |context| {
            context.uses_completion_queue(queue)
        })?;
        // Its memory goes now; the number waits for reuse.
        self.resources.completion_queues[queue.0 as usize] = CompletionRing::new(1);
        self.resources
            .retired_completion_queues
            .retire(queue.0 as usize);
        Ok(())
    }

    /// Destroys a shared receive queue no queue pair uses, as
    /// [`SoftRnic::destroy_completion_queue`].
    pub fn destroy_shared_receive_queue(
        &mut self,
        queue: SharedReceiveQueue,
    ) -> Result<(), VerbsError> {
        self.check_shared_receive_queue(queue)?;
        self.refuse_if_used("shared receive queue", |context| {
            context.uses_shared_receive_queue(queue)
        })?;
        let ring = &mut self.resources.shared_receive_queues[queue.0 as usize];
        ring.queue = BoundedQueue::new("shared receive queue", 1);
        self.resources
            .retired_shared_receive_queues
            .retire(queue.0 as usize);
        Ok(())
    }

    /// `QueueInUse` if a queue pair not destroyed `uses` the `kind` of
    /// queue being destroyed.
    fn refuse_if_used(
        &self,
        kind: &'static str,
        uses: impl Fn(&QueuePairContext) -> bool,
    ) -> Result<(), VerbsError> {
        let used = self
            .queue_pairs
            .iter()
            .enumerate()
            .any(|(slot, context)| !self.retired_queue_pairs.is_retired(slot) && uses(context));
        match used {
            true => Err(VerbsError::QueueInUse { kind }),
            false => Ok(()),
        }
    }

    /// Registers memory the application owns outside Rust's heap, at the
    /// address it names: what `ibv_reg_mr` does for a C program's buffer.
    pub fn register_external_memory(
        &mut self,
        protection_domain: ProtectionDomain,
        memory: Box<dyn crate::host_memory::ExternalMemory>,
        address: VirtAddr,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        self.check_protection_domain(protection_domain)?;
        self.resources
            .memory
            .register_external(protection_domain, memory, address, access)
    }

    /// How many completions `queue` holds, without taking them: what a
    /// completion channel's event is raised on.
    pub fn completions_waiting(&self, queue: CompletionQueue) -> Result<usize, VerbsError> {
        self.check_completion_queue(queue)?;
        Ok(self.resources.completion_queues[queue.0 as usize].waiting())
    }

    /// Whether `queue` overran: it lost a completion
    /// (`IBV_EVENT_CQ_ERR`).
    pub fn completion_queue_overran(&self, queue: CompletionQueue) -> Result<bool, VerbsError> {
        self.check_completion_queue(queue)?;
        Ok(self.resources.completion_queues[queue.0 as usize].overran())
    }

    /// Receives posted to shared receive queue `queue` and not yet taken
    /// (what `ibv_modify_srq`'s `srq_limit` is compared with).
    pub fn shared_receives_posted(&self, queue: SharedReceiveQueue) -> Result<usize, VerbsError> {
        self.check_shared_receive_queue(queue)?;
        Ok(self.resources.shared_receive_queues[queue.0 as usize]
            .queue
            .len())
    }

    /// Whether `queue` holds a completion that wakes a waiter armed for
    /// solicited completions only (`ibv_req_notify_cq` with
    /// `solicited_only`): a receive whose sender set the SE bit, a failed
    /// request, or the queue's overrun.
    pub fn solicited_or_failed_waiting(&self, queue: CompletionQueue) -> Result<bool, VerbsError> {
        self.check_completion_queue(queue)?;
        Ok(self.resources.completion_queues[queue.0 as usize].solicited_or_failed_waiting())
    }

    pub fn memory_region(&self, lkey: Lkey) -> Result<MemoryRegion, VerbsError> {
        self.resources.memory.handle(lkey)
    }

    /// Where `qpn` sits in `queue_pairs`, if it names one of this device's
    /// queue pairs.
    /// A queue pair number's slot: its offset from the first number,
    /// modulo the most queue pairs (a slot's generation is the quotient),
    /// if the slot holds that very queue pair.
    fn slot_of(&self, qpn: Qpn) -> Result<usize, VerbsError> {
        let stride = self.config.max_queue_pairs.max(1);
        qpn.value()
            .checked_sub(FIRST_QPN)
            .map(|offset| offset as usize)
            // Most numbers are of the first generation: no division.
            .map(|offset| {
                if offset < stride {
                    offset
                } else {
                    offset % stride
                }
            })
            // A retired queue pair is gone, though its context waits in
            // the slot for the next one: found, a destroyed queue pair was
            // destroyed again, brought back through INIT, posted to and
            // queried, and its late frames counted as for a queue pair not
            // ready (found by reading).
            .filter(|slot| {
                !self.retired_queue_pairs.is_retired(*slot)
                    && self
                        .queue_pairs
                        .get(*slot)
                        .is_some_and(|context| context.qpn() == qpn)
            })
            .ok_or(VerbsError::UnknownQueuePair(qpn))
    }

    /// The number a new queue pair in `slot` takes: the next generation's
    /// for a slot reused, past the old queue pair's (back to the first
    /// generation once the numbers would pass 24 bits).
    fn number_for(&self, slot: usize) -> Qpn {
        let stride = self.config.max_queue_pairs.max(1) as u32;
        let generation = self
            .queue_pairs
            .get(slot)
            .map_or(0, |old| (old.qpn().value() - FIRST_QPN) / stride + 1);
        let first_generation = FIRST_QPN + slot as u32;
        Qpn::new(first_generation + generation * stride)
            .or(Qpn::new(first_generation))
            .expect("bounded by max_queue_pairs")
    }

    fn queue_pair(&self, qpn: Qpn) -> Result<&QueuePairContext, VerbsError> {
        Ok(&self.queue_pairs[self.slot_of(qpn)?])
    }

    /// A queue pair's slot, and the queue pair together with the resources
    /// it works on: two disjoint borrows of the device.
    fn queue_pair_mut(
        &mut self,
        qpn: Qpn,
    ) -> Result<(usize, &mut QueuePairContext, &mut Resources), VerbsError> {
        let slot = self.slot_of(qpn)?;
        Ok((slot, &mut self.queue_pairs[slot], &mut self.resources))
    }

    /// Queue pair `slot` may have a frame to send: it takes its turn.
    fn wake(&mut self, slot: usize) {
        if !self.transmit_queued[slot] {
            self.transmit_queued[slot] = true;
            self.transmit_queue.push_back(slot);
        }
        if self.timed_position[slot].is_none() {
            self.timed_position[slot] = Some(self.timed.len());
            self.timed.push(slot);
        }
    }

    /// Queue pair `slot` left the transmit queue: with no timer running it
    /// stops being watched (constant time: the last one takes its place).
    fn unwatch_if_untimed(&mut self, slot: usize) {
        if self.queue_pairs[slot].poll_timeout().is_some() {
            return;
        }
        let Some(position) = self.timed_position[slot].take() else {
            return;
        };
        self.timed.swap_remove(position);
        if let Some(moved) = self.timed.get(position) {
            self.timed_position[*moved] = Some(position);
        }
    }

    /// Moves the queue pairs bound to a newly overrun completion queue to
    /// ERR. It runs after every step of the device, and a queue almost
    /// never overruns: the check is inlined, the work is not.
    #[inline]
    fn fail_queue_pairs_of_overrun_queues(&mut self) {
        if !self.resources.newly_overrun.is_empty() {
            self.fail_queue_pairs_of_newly_overrun_queues();
        }
    }

    /// Flushing a queue pair loses completions on its queues, so this runs
    /// until no queue lost one. A queue comes back only after a pass that
    /// failed a queue pair, whose flush lost completions on it: the passes
    /// are bounded by the queues and the queue pairs.
    #[cold]
    fn fail_queue_pairs_of_newly_overrun_queues(&mut self) {
        let bound = self.resources.completion_queues.len() + self.queue_pairs.len();
        for _ in 0..=bound {
            let Some(queue) = self.resources.newly_overrun.pop() else {
                return;
            };
            for slot in 0..self.queue_pairs.len() {
                if self.retired_queue_pairs.is_retired(slot) {
                    continue;
                }
                let queue_pair = &mut self.queue_pairs[slot];
                let live = queue_pair.state() != QueuePairState::Error;
                if live && queue_pair.uses_completion_queue(queue) {
                    queue_pair.enter_error(&mut self.resources);
                    self.wake(slot);
                }
            }
        }
        debug_assert!(self.resources.newly_overrun.is_empty());
    }

    /// Takes one received frame. Malformed or misdirected frames are dropped
    /// and counted; nothing a peer sends can make this panic.
    pub fn handle_frame(&mut self, now: Timestamp, bytes: &[u8]) {
        let counters = &mut self.resources.counters;
        counters.frames_received += 1;
        counters.bytes_received += bytes.len() as u64;
        // Only a device with open datagram ports looks past RoCE: the
        // queue pairs' path pays nothing for the feature otherwise.
        let port = self
            .datagrams
            .any_open()
            .then(|| udp_destination_port(bytes))
            .flatten();
        if let Some(port) = port {
            if self.datagrams.is_open(port) {
                let (mac, address) = (self.config.mac, self.config.address);
                if let Err(reason) = self.datagrams.handle(mac, address, bytes) {
                    self.resources.counters.count_drop(reason);
                }
                return;
            }
            // Neither RoCE nor an open port: said as such, not counted as
            // a RoCE frame that failed to parse.
            if port != remora_wire::udp::ROCEV2_UDP_PORT {
                return self
                    .resources
                    .counters
                    .count_drop(DropReason::NoDatagramPort);
            }
        }
        let counters = &mut self.resources.counters;
        let frame = match RoceFrame::new_checked(bytes) {
            Ok(frame) => frame,
            Err(error) => return counters.count_drop(DropReason::Malformed(error)),
        };
        if frame.destination_mac() != self.config.mac {
            return counters.count_drop(DropReason::WrongDestinationMac);
        }
        if frame.destination_address() != self.config.address {
            return counters.count_drop(DropReason::NotForThisDevice);
        }
        // Every queue pair is in the default partition (its only P_Key).
        if !Pkey::DEFAULT.admits(frame.bth().partition_key) {
            return counters.count_drop(DropReason::BadPartitionKey);
        }
        if frame.bth().opcode == Opcode::CongestionNotification {
            return counters.count_drop(DropReason::CongestionNotification);
        }
        let Ok((slot, queue_pair, resources)) = self.queue_pair_mut(frame.bth().destination_qp)
        else {
            return self
                .resources
                .counters
                .count_drop(DropReason::UnknownQueuePair);
        };
        let from_peer = queue_pair
            .remote()
            .is_some_and(|remote| remote.address == frame.source_address());
        if !from_peer {
            return resources.counters.count_drop(DropReason::WrongPeer);
        }
        queue_pair.handle_frame(now, &frame, resources);
        self.wake(slot);
        self.fail_queue_pairs_of_overrun_queues();
    }

    /// Writes the next frame to send into `buffer` and returns its length.
    /// Queue pairs take turns, so one busy connection cannot starve another.
    ///
    /// # Panics
    /// If `buffer` is shorter than [`MAX_FRAME_LEN`].
    pub fn poll_transmit(&mut self, now: Timestamp, buffer: &mut [u8]) -> Option<usize> {
        assert!(
            buffer.len() >= MAX_FRAME_LEN,
            "transmit buffer must hold any frame"
        );
        if let Some(len) = self.datagrams.poll_transmit(buffer) {
            let counters = &mut self.resources.counters;
            counters.frames_transmitted += 1;
            counters.bytes_transmitted += len as u64;
            return Some(len);
        }
        debug_assert_eq!(
            self.transmit_queue.len(),
            self.transmit_queued
                .iter()
                .filter(|queued| **queued)
                .count(),
            "each queue pair is in the transmit queue once, exactly when flagged"
        );
        // Bounded: each turn either returns or takes a queue pair out.
        for _ in 0..self.transmit_queue.len() {
            let Some(slot) = self.transmit_queue.pop_front() else {
                break;
            };
            let queue_pair = &mut self.queue_pairs[slot];
            if let Some(len) = queue_pair.poll_transmit(now, &mut self.resources, buffer) {
                // It may have more: back of the line, as a turn ends.
                self.transmit_queue.push_back(slot);
                let counters = &mut self.resources.counters;
                counters.frames_transmitted += 1;
                counters.bytes_transmitted += len as u64;
                self.fail_queue_pairs_of_overrun_queues();
                return Some(len);
            }
            self.transmit_queued[slot] = false;
            self.unwatch_if_untimed(slot);
        }
        // A request can fail while transmitting (its local buffer vanished).
        self.fail_queue_pairs_of_overrun_queues();
        None
    }

    /// Whether [`SoftRnic::poll_transmit`] may have a frame: false only when
    /// it surely has none (a queue pair waiting its turn may have nothing
    /// left, so true can be a false alarm).
    pub fn may_transmit(&self) -> bool {
        self.datagrams.has_outgoing() || !self.transmit_queue.is_empty()
    }

    /// The earliest time `handle_timeout` has work to do.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        debug_assert!(
            (0..self.queue_pairs.len()).all(|slot| self.timed_position[slot].is_some()
                || self.queue_pairs[slot].poll_timeout().is_none()),
            "every queue pair with a timer is watched"
        );
        debug_assert!(
            self.timed
                .iter()
                .enumerate()
                .all(|(position, slot)| self.timed_position[*slot] == Some(position)),
            "the watched queue pairs know their places"
        );
        self.timed
            .iter()
            .filter_map(|slot| self.queue_pairs[*slot].poll_timeout())
            .min()
    }

    pub fn handle_timeout(&mut self, now: Timestamp) {
        // Only watched queue pairs have timers. Waking one below leaves
        // `timed` as it is: the queue pair is in it already.
        for index in 0..self.timed.len() {
            let slot = self.timed[index];
            let queue_pair = &mut self.queue_pairs[slot];
            // A due timer is how a queue pair with nothing new to do comes
            // to retransmit: it takes a turn.
            let due = queue_pair.poll_timeout().is_some_and(|at| at <= now);
            queue_pair.handle_timeout(now, &mut self.resources);
            if due {
                self.wake(slot);
            }
        }
        self.fail_queue_pairs_of_overrun_queues();
    }

    fn check_protection_domain(&self, pd: ProtectionDomain) -> Result<(), VerbsError> {
        if pd.0 >= self.protection_domains {
            return Err(VerbsError::UnknownProtectionDomain);
        }
        Ok(())
    }

    fn check_completion_queue(&self, queue: CompletionQueue) -> Result<(), VerbsError> {
        let resources = &self.resources;
        match resources
            .retired_completion_queues
            .holds(&resources.completion_queues, queue.0 as usize)
        {
            true => Ok(()),
            false => Err(VerbsError::UnknownCompletionQueue),
        }
    }

    fn check_shared_receive_queue(&self, queue: SharedReceiveQueue) -> Result<(), VerbsError> {
        let resources = &self.resources;
        match resources
            .retired_shared_receive_queues
            .holds(&resources.shared_receive_queues, queue.0 as usize)
        {
            true => Ok(()),
            false => Err(VerbsError::UnknownSharedReceiveQueue),
        }
    }

    fn check_builder(&self, builder: &QueuePairBuilder) -> Result<(), VerbsError> {
        self.check_protection_domain(builder.protection_domain)?;
        self.check_completion_queue(builder.send_completion_queue)?;
        self.check_completion_queue(builder.receive_completion_queue)?;
        if let Some(queue) = builder.shared_receive_queue {
            self.check_shared_receive_queue(queue)?;
            let ring = &self.resources.shared_receive_queues[queue.0 as usize];
            // IB requires a queue pair and its SRQ to share a protection domain.
            if ring.protection_domain != builder.protection_domain {
                return Err(VerbsError::WrongProtectionDomain);
            }
        }
        let max_depth = self.config.max_queue_depth;
        check_depth("send queue", builder.send_queue_depth, max_depth)?;
        check_depth("receive queue", builder.receive_queue_depth, max_depth)?;
        self.check_read_atomic_limits(
            Some(builder.max_read_atomic),
            Some(builder.max_destination_read_atomic),
        )?;
        check_depth("retry_count", usize::from(builder.retry_count) + 1, 8)?;
        check_depth("rnr_retry", usize::from(builder.rnr_retry) + 1, 8)?;
        Ok(())
    }
}

impl DataPath for SoftRnic {
    fn post_send(&mut self, queue_pair: QueuePair, request: SendRequest) -> Result<(), VerbsError> {
        self.posting(queue_pair, |context, resources, max_message_bytes| {
            context.post_send(request, resources, max_message_bytes)
        })
    }

    fn post_receive(
        &mut self,
        queue_pair: QueuePair,
        request: ReceiveRequest,
    ) -> Result<(), VerbsError> {
        self.posting(queue_pair, |context, resources, _| {
            context.post_receive(request, resources)
        })
    }

    fn poll_completion(
        &mut self,
        queue: CompletionQueue,
    ) -> Result<Option<WorkCompletion>, VerbsError> {
        self.check_completion_queue(queue)?;
        self.resources.completion_queues[queue.0 as usize].pop()
    }
}

impl Verbs for SoftRnic {
    fn alloc_protection_domain(&mut self) -> Result<ProtectionDomain, VerbsError> {
        let pd = ProtectionDomain(self.protection_domains);
        self.protection_domains += 1;
        Ok(pd)
    }

    fn register_memory(
        &mut self,
        protection_domain: ProtectionDomain,
        length_bytes: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        self.check_protection_domain(protection_domain)?;
        self.resources
            .memory
            .register(protection_domain, length_bytes, access)
    }

    fn register_host_memory(
        &mut self,
        protection_domain: ProtectionDomain,
        memory: HostMemory,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError> {
        self.check_protection_domain(protection_domain)?;
        self.resources
            .memory
            .register_host(protection_domain, memory, access)
    }

    fn deregister_memory(&mut self, lkey: Lkey) -> Result<(), VerbsError> {
        self.resources.memory.deregister(lkey)
    }

    fn create_completion_queue(&mut self, depth: usize) -> Result<CompletionQueue, VerbsError> {
        check_depth("completion queue", depth, self.config.max_queue_depth)?;
        let (queues, retired) = (
            &mut self.resources.completion_queues,
            &mut self.resources.retired_completion_queues,
        );
        let max = self.config.max_completion_queues;
        check_room("completion queues", retired.live(queues), max)?;
        let index = retired.place(queues, CompletionRing::new(depth));
        Ok(CompletionQueue(index as u32))
    }

    fn create_shared_receive_queue(
        &mut self,
        protection_domain: ProtectionDomain,
        depth: usize,
    ) -> Result<SharedReceiveQueue, VerbsError> {
        self.check_protection_domain(protection_domain)?;
        check_depth("shared receive queue", depth, self.config.max_queue_depth)?;
        let (queues, retired) = (
            &mut self.resources.shared_receive_queues,
            &mut self.resources.retired_shared_receive_queues,
        );
        let max = self.config.max_shared_receive_queues;
        check_room("shared receive queues", retired.live(queues), max)?;
        let ring = SharedReceiveRing {
            protection_domain,
            queue: BoundedQueue::new("shared receive queue", depth),
        };
        let index = retired.place(queues, ring);
        Ok(SharedReceiveQueue(index as u32))
    }

    fn create_queue_pair(
        &mut self,
        builder: &QueuePairBuilder,
    ) -> Result<PreparedQueuePair, VerbsError> {
        self.check_builder(builder)?;
        check_room(
            "queue pairs",
            self.retired_queue_pairs.live(&self.queue_pairs),
            self.config.max_queue_pairs,
        )?;
        let reused = self.retired_queue_pairs.reuse();
        let slot = reused.unwrap_or(self.queue_pairs.len());
        let qpn = self.number_for(slot);
        let value = qpn.value();
        let initial_psn = builder
            .initial_psn
            .unwrap_or_else(|| Psn::new(splitmix64(self.config.seed ^ u64::from(value)) as u32));
        let context = QueuePairContext::new(
            qpn,
            *builder,
            self.config.mac,
            self.config.address,
            initial_psn,
        );
        let endpoint = context.endpoint();
        match reused {
            // Its place in the transmit and timer lists, if it has one,
            // serves the new queue pair.
            Some(slot) => self.queue_pairs[slot] = context,
            None => {
                self.queue_pairs.push(context);
                self.transmit_queued.push(false);
                self.timed_position.push(None);
            }
        }
        Ok(PreparedQueuePair { qpn, endpoint })
    }

    fn destroy_queue_pair(&mut self, qpn: Qpn) -> Result<(), VerbsError> {
        self.retire_queue_pair(qpn)
    }

    fn modify_queue_pair(
        &mut self,
        qpn: Qpn,
        transition: QueuePairTransition,
    ) -> Result<QueuePairState, VerbsError> {
        let (to, remote) = match transition {
            QueuePairTransition::Init => (QueuePairState::Init, None),
            QueuePairTransition::ReadyToReceive { remote } => {
                (QueuePairState::ReadyToReceive, Some(remote))
            }
            QueuePairTransition::ReadyToSend | QueuePairTransition::ReadyToSendFrom { .. } => {
                (QueuePairState::ReadyToSend, None)
            }
            QueuePairTransition::Error => (QueuePairState::Error, None),
            QueuePairTransition::Reset => (QueuePairState::Reset, None),
        };
        let (slot, context, resources) = self.queue_pair_mut(qpn)?;
        if let QueuePairTransition::ReadyToSendFrom { send_psn } = transition {
            context.send_from(send_psn)?;
        }
        context.transition(to, remote, resources)?;
        self.wake(slot);
        self.fail_queue_pairs_of_overrun_queues();
        Ok(to)
    }

    fn query_queue_pair(&self, queue_pair: QueuePair) -> Result<QueuePairStatus, VerbsError> {
        Ok(self.queue_pair(queue_pair.0)?.status())
    }

    fn post_shared_receive(
        &mut self,
        queue: SharedReceiveQueue,
        request: ReceiveRequest,
    ) -> Result<(), VerbsError> {
        self.check_shared_receive_queue(queue)?;
        let protection_domain =
            self.resources.shared_receive_queues[queue.0 as usize].protection_domain;
        self.resources
            .memory
            .check_local_list(protection_domain, &request.local, true)?;
        self.resources.shared_receive_queue(queue).push(request)
    }

    fn read_local(&self, lkey: Lkey, address: VirtAddr, into: &mut [u8]) -> Result<(), VerbsError> {
        self.resources.memory.read_local(lkey, address, into)
    }

    fn write_local(
        &mut self,
        lkey: Lkey,
        address: VirtAddr,
        from: &[u8],
    ) -> Result<(), VerbsError> {
        self.resources.memory.write_local(lkey, address, from)
    }

    fn open_datagram_port(
        &mut self,
        udp_port: u16,
        depth: usize,
    ) -> Result<DatagramPort, VerbsError> {
        self.datagrams.open(udp_port, depth)
    }

    fn send_datagram(
        &mut self,
        port: DatagramPort,
        to: DatagramEnd,
        payload: &[u8],
    ) -> Result<(), VerbsError> {
        let source = (self.config.mac, self.config.address);
        self.datagrams.send(source, port, to, payload)
    }

    fn receive_datagram(
        &mut self,
        port: DatagramPort,
        into: &mut [u8],
    ) -> Result<Option<ReceivedDatagram>, VerbsError> {
        self.datagrams.receive(port, into)
    }
}
