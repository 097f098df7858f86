//! The responder: executes the peer's requests exactly once, in PSN order.
//!
//! A request with the expected PSN executes. One with a later PSN means a
//! packet was lost: it is dropped and, once per gap, answered with a
//! PSN-sequence-error NAK so the requester goes back. One with an earlier
//! PSN is a duplicate: SEND and WRITE are re-acknowledged without running
//! again, READ and atomics are answered from the replay cache.
//!
//! Answers leave through a FIFO in PSN order. Consecutive ACKs merge in the
//! FIFO, which is how acknowledgements coalesce: every request handled
//! between two polls of the transmitter costs one ACK.

use super::replay_cache::{ReplayCache, ReplayKind};
use super::requester::rnr_timer_code;
use super::{PacketHeader, Path, QueuePairContext};
use crate::memory::RemoteAccessFault;
use crate::queues::reuse_first_slot_when_empty;
use crate::resources::Resources;
use crate::verbs::{
    AccessFlags, CompletionOpcode, CompletionStatus, QueuePairBuilder, ReceiveRequest,
    WorkCompletion,
};
use crate::DropReason;
use remora_base::copy_bytes;
use remora_wire::opcode::{OpcodeFamily, Segment};
use remora_wire::{
    AckSyndrome, AethRepr, AtomicAckEthRepr, ExtensionHeaders, Msn, NakCode, Opcode, Psn, RethRepr,
    Rkey, RoceFrame, VirtAddr,
};
use std::collections::VecDeque;

#[derive(Debug, Clone, Copy)]
enum Output {
    Acknowledge {
        psn: Psn,
        syndrome: AckSyndrome,
        msn: Msn,
    },
    /// The answer to a READ from a replay-cache entry: its packets from
    /// `next_packet` to the end. `start_packet` is where this answer began
    /// (0, or where a re-request resumed), which decides the First opcode.
    /// `replay`: an answer again, to a duplicate request.
    ReadResponse {
        slot: usize,
        next_packet: u32,
        start_packet: u32,
        replay: bool,
    },
    AtomicAcknowledge {
        slot: usize,
        replay: bool,
    },
}

impl Output {
    /// For an answer to a READ or atomic, its replay slot and whether it
    /// answers a duplicate.
    fn answer(&self) -> Option<(usize, bool)> {
        match *self {
            Output::ReadResponse { slot, replay, .. }
            | Output::AtomicAcknowledge { slot, replay } => Some((slot, replay)),
            Output::Acknowledge { .. } => None,
        }
    }
}

/// A message that spans several packets and is part-way through.
#[derive(Debug, Clone, Copy)]
enum InProgress {
    Send {
        receive: ReceiveRequest,
        offset_bytes: u64,
    },
    Write {
        rkey: Rkey,
        next_address: VirtAddr,
        remaining_bytes: u64,
        total_bytes: u32,
    },
}

/// What a receive completion tells of the message that consumed it.
#[derive(Debug, Clone, Copy)]
struct ReceivedMessage {
    opcode: CompletionOpcode,
    byte_len: u32,
    immediate: Option<u32>,
    /// The message's last packet carried the SE bit.
    solicited: bool,
}

impl ReceivedMessage {
    /// A receive a refused message consumed: nothing of it is reported.
    const FAILED: ReceivedMessage = ReceivedMessage {
        opcode: CompletionOpcode::Receive,
        byte_len: 0,
        immediate: None,
        solicited: false,
    };
}
/// A replay slot's buffer keeps up to this much capacity across READs of
/// any size; beyond it, a READ four times smaller takes the memory back.
const KEPT_REPLAY_BYTES: usize = 1 << 20;

impl Responder {
    /// Bytes the replay slots hold for READ snapshots (their capacity).
    pub(crate) fn replay_bytes_held(&self) -> usize {
        self.replay.bytes_held()
    }
}

#[derive(Debug)]
pub(crate) struct Responder {
    expected_psn: Psn,
    /// PSNs taken since the queue pair started, never wrapping: the
    /// absolute PSN of `expected_psn`, which keys the replay cache.
    expected_absolute: u64,
    msn: Msn,
    /// A NAK (sequence error or RNR) already asked for `expected_psn`; one
    /// per gap is enough.
    nak_sent_for_expected: bool,
    in_progress: Option<InProgress>,
    outputs: VecDeque<Output>,
    output_capacity: usize,
    replay: ReplayCache,
    /// Whether the queue pair serves READs and atomics at all: a limit of
    /// 0 (`max_dest_rd_atomic`) refuses each with an invalid request NAK.
    serves_read_atomic: bool,
}

impl Responder {
    pub(crate) fn new(attributes: &QueuePairBuilder) -> Responder {
        let limit = attributes.max_destination_read_atomic;
        let output_capacity = output_capacity_for(limit);
        Responder {
            expected_psn: Psn::new(0),
            expected_absolute: 0,
            msn: Msn::new(0),
            nak_sent_for_expected: false,
            in_progress: None,
            outputs: VecDeque::with_capacity(output_capacity),
            output_capacity,
            replay: ReplayCache::new(limit.max(1)),
            serves_read_atomic: limit > 0,
        }
    }

    pub(crate) fn expected_psn(&self) -> Psn {
        self.expected_psn
    }

    /// The receive a multi-packet SEND has under way, taken: the queue
    /// pair is failing, and that receive is flushed with the rest.
    pub(crate) fn take_receive_in_progress(&mut self) -> Option<ReceiveRequest> {
        match self.in_progress.take() {
            Some(InProgress::Send { receive, .. }) => Some(receive),
            _ => None,
        }
    }

    /// Whether a request has been executed since the queue pair started.
    pub(crate) fn has_received(&self) -> bool {
        self.expected_absolute > 0 || self.in_progress.is_some()
    }

    /// Serves up to `limit` outstanding READs and atomics: a replay cache
    /// of that many slots. Only before any request (its slots are empty).
    pub(crate) fn serve_read_atomic(&mut self, limit: usize) {
        debug_assert!(!self.has_received() && self.outputs.is_empty());
        self.output_capacity = output_capacity_for(limit);
        self.outputs = VecDeque::with_capacity(self.output_capacity);
        self.replay = ReplayCache::new(limit.max(1));
        self.serves_read_atomic = limit > 0;
    }

    pub(crate) fn start(&mut self, expected_psn: Psn) {
        self.expected_psn = expected_psn;
        self.expected_absolute = 0;
    }

    /// Whether an answer in replay slot `slot` still waits to be sent:
    /// with `replays`, any; else only the first answer to its request.
    fn has_queued_answer(&self, slot: usize, replays: bool) -> bool {
        self.outputs.iter().any(|output| {
            output
                .answer()
                .is_some_and(|(queued, replay)| queued == slot && (replays || !replay))
        })
    }

    /// A new READ or atomic takes the oldest replay slot. If that slot's
    /// first answer has not been sent yet, the requester has more
    /// outstanding than this responder allows: IB answers with an Invalid
    /// Request NAK (reusing the slot threw the unsent answer away, and the
    /// request failed later for no reason the requester could see).
    ///
    /// A replay still queued for the slot is no such sign: it answers a
    /// duplicate of a request whose first answer was sent, and that the
    /// requester, within its limit, has retired. It is dropped (sent
    /// later, it would carry the new request's data under the old PSNs).
    fn take_read_atomic_room(&mut self, resources: &mut Resources) -> StepResult<()> {
        if !self.serves_read_atomic {
            return Err((NakCode::InvalidRequest, None));
        }
        let slot = self.replay.next_slot();
        if self.has_queued_answer(slot, false) {
            return Err((NakCode::InvalidRequest, None));
        }
        let before = self.outputs.len();
        self.outputs
            .retain(|output| output.answer() != Some((slot, true)));
        resources.counters.stale_replays_dropped += (before - self.outputs.len()) as u64;
        Ok(())
    }

    fn has_room(&self) -> bool {
        self.outputs.len() < self.output_capacity
    }

    /// Queues an ACK, merging it into a trailing ACK if there is one.
    fn push_ack(&mut self, psn: Psn, resources: &mut Resources) {
        let syndrome = AckSyndrome::Ack {
            credit_count: AckSyndrome::UNLIMITED_CREDIT,
        };
        if let Some(Output::Acknowledge {
            psn: last_psn,
            syndrome: AckSyndrome::Ack { .. },
            msn,
        }) = self.outputs.back_mut()
        {
            *last_psn = psn;
            *msn = self.msn;
            resources.counters.acks_coalesced += 1;
            return;
        }
        self.push(Output::Acknowledge {
            psn,
            syndrome,
            msn: self.msn,
        });
    }

    fn push(&mut self, output: Output) {
        assert!(
            self.outputs.len() < self.output_capacity,
            "caller checked has_room"
        );
        self.outputs.push_back(output);
    }

    /// Takes the answer at the front off the queue: it has been sent.
    fn finish_output(&mut self) {
        self.outputs.pop_front();
        reuse_first_slot_when_empty(&mut self.outputs);
    }
}

fn access_needed(opcode: Opcode) -> AccessFlags {
    match opcode.family() {
        OpcodeFamily::RdmaWrite => AccessFlags::REMOTE_WRITE,
        OpcodeFamily::RdmaReadRequest => AccessFlags::REMOTE_READ,
        _ => AccessFlags::REMOTE_ATOMIC,
    }
}

impl QueuePairContext {
    /// Whether the queue pair lets remote peers do `needed` at all. One
    /// that does not answers with an Invalid Request NAK, as the request
    /// is one this queue pair does not serve (the Linux soft-RoCE driver's
    /// `check_op_valid`, a class C error), not a fault of the region the
    /// request names: the requester sees `RemoteInvalidRequestError`,
    /// which names the right culprit. It answered a Remote Access Error.
    fn allows_remote(&self, needed: AccessFlags) -> StepResult<()> {
        if self.attributes.remote_access.contains(needed) {
            Ok(())
        } else {
            Err((NakCode::InvalidRequest, None))
        }
    }

    pub(super) fn handle_request(&mut self, frame: &RoceFrame<'_>, resources: &mut Resources) {
        let psn = frame.bth().psn;
        let distance = self.responder.expected_psn.distance_to(psn);
        if !self.responder.has_room() {
            resources.counters.count_drop(DropReason::ResponderBusy);
            return;
        }
        if distance > 0 {
            self.on_out_of_sequence(resources);
        } else if distance < 0 {
            self.on_duplicate(frame, resources);
        } else {
            self.on_expected_request(frame, resources);
        }
    }

    fn on_out_of_sequence(&mut self, resources: &mut Resources) {
        resources.counters.count_drop(DropReason::OutOfSequence);
        let responder = &mut self.responder;
        if responder.nak_sent_for_expected {
            return;
        }
        responder.nak_sent_for_expected = true;
        resources.counters.sequence_naks_sent += 1;
        let nak = Output::Acknowledge {
            psn: responder.expected_psn,
            syndrome: AckSyndrome::Nak(NakCode::PsnSequenceError),
            msn: responder.msn,
        };
        responder.push(nak);
    }

    fn on_duplicate(&mut self, frame: &RoceFrame<'_>, resources: &mut Resources) {
        resources.counters.duplicate_requests += 1;
        let psn = frame.bth().psn;
        let responder = &mut self.responder;
        match frame.bth().opcode.family() {
            OpcodeFamily::RdmaReadRequest | OpcodeFamily::Atomic => {
                let behind = psn.distance_to(responder.expected_psn) as u64;
                let absolute = responder.expected_absolute.checked_sub(behind);
                let Some((slot, packet_offset)) =
                    absolute.and_then(|absolute| responder.replay.find(absolute))
                else {
                    resources
                        .counters
                        .count_drop(DropReason::DuplicateNotReplayable);
                    return;
                };
                match responder.replay.entry(slot).kind {
                    ReplayKind::Read => {
                        resources.counters.replayed_reads += 1;
                        responder.push(Output::ReadResponse {
                            slot,
                            next_packet: packet_offset,
                            start_packet: packet_offset,
                            replay: true,
                        });
                    }
                    ReplayKind::Atomic { .. } => {
                        resources.counters.replayed_atomics += 1;
                        responder.push(Output::AtomicAcknowledge { slot, replay: true });
                    }
                }
            }
            _ => {
                let last_done = responder.expected_psn.sub(1);
                responder.push_ack(last_done, resources);
            }
        }
    }

    fn on_expected_request(&mut self, frame: &RoceFrame<'_>, resources: &mut Resources) {
        self.responder.nak_sent_for_expected = false;
        let opcode = frame.bth().opcode;
        let continues = matches!(opcode.segment(), Segment::Middle | Segment::Last);
        let sequence_ok = match (self.responder.in_progress, opcode.family()) {
            (Some(InProgress::Send { .. }), OpcodeFamily::Send) => continues,
            (Some(InProgress::Write { .. }), OpcodeFamily::RdmaWrite) => continues,
            (Some(_), _) => false,
            (None, _) => !continues,
        };
        if !sequence_ok || opcode.has_invalidate() {
            self.refuse(frame.bth().psn, NakCode::InvalidRequest, None, resources);
            return;
        }
        let outcome = match opcode.family() {
            OpcodeFamily::Send => self.execute_send(frame, resources),
            OpcodeFamily::RdmaWrite => self.execute_write(frame, resources),
            OpcodeFamily::RdmaReadRequest => self.execute_read(frame, resources),
            OpcodeFamily::Atomic => self.execute_atomic(frame, resources),
            _ => unreachable!("is_request() covers exactly these families"),
        };
        match outcome {
            Ok(Step::Done { psn_count }) => {
                let responder = &mut self.responder;
                responder.expected_psn = responder.expected_psn.add(psn_count);
                responder.expected_absolute += u64::from(psn_count);
                // READ and atomic answers acknowledge implicitly.
                let answered = matches!(
                    opcode.family(),
                    OpcodeFamily::RdmaReadRequest | OpcodeFamily::Atomic
                );
                if frame.bth().ack_request && !answered {
                    let last = responder.expected_psn.sub(1);
                    responder.push_ack(last, resources);
                }
            }
            Ok(Step::ReceiverNotReady) => {
                resources.counters.receiver_not_ready_naks_sent += 1;
                let responder = &mut self.responder;
                // The requester goes back to this PSN anyway: packets behind
                // it must not draw a second, sequence-error NAK that would
                // cost the requester a retry.
                responder.nak_sent_for_expected = true;
                let timer = rnr_timer_code(self.attributes.min_rnr_timer);
                let nak = Output::Acknowledge {
                    psn: responder.expected_psn,
                    syndrome: AckSyndrome::ReceiverNotReady { timer },
                    msn: responder.msn,
                };
                responder.push(nak);
            }
            Err((refusal, consumed_receive)) => {
                self.refuse(frame.bth().psn, refusal, consumed_receive, resources)
            }
        }
    }

    /// NAKs a request for good and puts the queue pair in error. A receive
    /// the request consumed completes with the matching local error.
    fn refuse(
        &mut self,
        psn: Psn,
        refusal: NakCode,
        consumed_receive: Option<(ReceiveRequest, CompletionStatus)>,
        resources: &mut Resources,
    ) {
        resources.counters.error_naks_sent += 1;
        if let Some((receive, status)) = consumed_receive {
            // Reported here: `enter_error` must not flush it again.
            self.responder.in_progress = None;
            self.complete_receive(&receive, status, ReceivedMessage::FAILED, resources);
        }
        let responder = &mut self.responder;
        let nak = Output::Acknowledge {
            psn,
            syndrome: AckSyndrome::Nak(refusal),
            msn: responder.msn,
        };
        responder.push(nak);
        self.enter_error(resources);
    }

    fn complete_receive(
        &mut self,
        receive: &ReceiveRequest,
        status: CompletionStatus,
        message: ReceivedMessage,
        resources: &mut Resources,
    ) {
        let completion = WorkCompletion {
            work_request_id: receive.work_request_id,
            status,
            opcode: message.opcode,
            qpn: self.qpn,
            byte_len: message.byte_len,
            immediate: message.immediate,
            solicited: message.solicited,
        };
        resources.complete(self.attributes.receive_completion_queue, completion);
    }

    fn take_receive(&mut self, resources: &mut Resources) -> Option<ReceiveRequest> {
        match self.attributes.shared_receive_queue {
            Some(queue) => resources.shared_receive_queue(queue).pop(),
            None => self.receive_queue.pop(),
        }
    }

    fn has_receive(&self, resources: &mut Resources) -> bool {
        match self.attributes.shared_receive_queue {
            Some(queue) => !resources.shared_receive_queue(queue).is_empty(),
            None => !self.receive_queue.is_empty(),
        }
    }

    /// Checks a payload's length against its place in a message.
    fn payload_fits(&self, opcode: Opcode, payload_len: usize) -> bool {
        let mtu = self.attributes.path_mtu.bytes() as usize;
        match opcode.segment() {
            Segment::First | Segment::Middle => payload_len == mtu,
            Segment::Last => payload_len > 0 && payload_len <= mtu,
            Segment::Only => payload_len <= mtu,
        }
    }

    fn execute_send(&mut self, frame: &RoceFrame<'_>, resources: &mut Resources) -> StepResult {
        let opcode = frame.bth().opcode;
        if !self.payload_fits(opcode, frame.payload().len()) {
            return Err((NakCode::InvalidRequest, None));
        }
        let (receive, offset_bytes) = match self.responder.in_progress {
            Some(InProgress::Send {
                receive,
                offset_bytes,
            }) => (receive, offset_bytes),
            _ => match self.take_receive(resources) {
                Some(receive) => (receive, 0),
                None => return Ok(Step::ReceiverNotReady),
            },
        };
        let end = offset_bytes + frame.payload().len() as u64;
        // A message longer than this device takes (its maximum message
        // size) is refused as one longer than its receive is, even when the
        // receive is larger: it was accepted, and one of 4 GiB or more
        // completed with its length cut to 32 bits.
        let limit_bytes = receive
            .local
            .total_length_bytes()
            .min(u64::from(resources.max_message_bytes));
        if end > limit_bytes {
            let status = CompletionStatus::LocalLengthError;
            return Err((NakCode::InvalidRequest, Some((receive, status))));
        }
        if resources
            .memory
            .scatter(&receive.local, offset_bytes, frame.payload())
            .is_err()
        {
            let status = CompletionStatus::LocalProtectionError;
            return Err((NakCode::RemoteOperationalError, Some((receive, status))));
        }
        if matches!(opcode.segment(), Segment::Last | Segment::Only) {
            self.responder.in_progress = None;
            self.responder.msn = self.responder.msn.next();
            let message = ReceivedMessage {
                opcode: CompletionOpcode::Receive,
                byte_len: end as u32,
                immediate: frame.immediate().map(|header| header.immediate),
                solicited: frame.bth().solicited_event,
            };
            self.complete_receive(&receive, CompletionStatus::Success, message, resources);
        } else {
            self.responder.in_progress = Some(InProgress::Send {
                receive,
                offset_bytes: end,
            });
        }
        Ok(Step::Done { psn_count: 1 })
    }

    fn execute_write(&mut self, frame: &RoceFrame<'_>, resources: &mut Resources) -> StepResult {
        let opcode = frame.bth().opcode;
        let refuse_invalid = Err((NakCode::InvalidRequest, None));
        if !self.payload_fits(opcode, frame.payload().len()) {
            return refuse_invalid;
        }
        // A queue pair that takes no WRITEs refuses this one before the
        // receive is looked for: an RNR NAK first sent the requester into
        // retries (for ever, with an infinite RNR retry count) that a
        // posted receive would only end in the refusal.
        self.allows_remote(AccessFlags::REMOTE_WRITE)?;
        // WRITE-with-immediate consumes a receive; make sure one is there
        // before touching memory, so an RNR retry writes nothing twice.
        if opcode.has_immediate() && !self.has_receive(resources) {
            return Ok(Step::ReceiverNotReady);
        }
        let (rkey, address, remaining_bytes, total_bytes) =
            match (self.responder.in_progress, frame.reth()) {
                (
                    Some(InProgress::Write {
                        rkey,
                        next_address,
                        remaining_bytes,
                        total_bytes,
                    }),
                    None,
                ) => (rkey, next_address, remaining_bytes, total_bytes),
                (None, Some(reth)) => (
                    reth.rkey,
                    reth.virtual_address,
                    u64::from(reth.dma_length),
                    reth.dma_length,
                ),
                _ => return refuse_invalid,
            };
        let payload_len = frame.payload().len() as u64;
        let is_end = matches!(opcode.segment(), Segment::Last | Segment::Only);
        if payload_len > remaining_bytes || (is_end && payload_len != remaining_bytes) {
            return refuse_invalid;
        }
        let pd = self.attributes.protection_domain;
        let check = |length| {
            resources
                .memory
                .check_remote(pd, rkey, address, length, AccessFlags::REMOTE_WRITE)
                .map_err(|fault| (access_refusal(fault), None))
        };
        // The first packet checks the whole message's range, so a WRITE
        // that runs past its region writes nothing (checked packet by
        // packet, its first packets landed before the NAK).
        if frame.reth().is_some() && remaining_bytes > payload_len {
            check(remaining_bytes)?;
        }
        // A zero-length WRITE validates neither R_Key nor address (IB
        // C9-88, as rxe does): the doorbell idiom, a WRITE with immediate
        // of nothing, names neither.
        if payload_len > 0 {
            let (slot, range) = check(payload_len)?;
            resources.memory.slot_write(slot, range, frame.payload());
        }
        if is_end {
            self.responder.in_progress = None;
            self.responder.msn = self.responder.msn.next();
            if let Some(header) = frame.immediate() {
                let receive = self.take_receive(resources).expect("checked above");
                let message = ReceivedMessage {
                    opcode: CompletionOpcode::ReceiveRdmaWithImmediate,
                    byte_len: total_bytes,
                    immediate: Some(header.immediate),
                    solicited: frame.bth().solicited_event,
                };
                self.complete_receive(&receive, CompletionStatus::Success, message, resources);
            }
        } else {
            self.responder.in_progress = Some(InProgress::Write {
                rkey,
                next_address: VirtAddr(address.0 + payload_len),
                remaining_bytes: remaining_bytes - payload_len,
                total_bytes,
            });
        }
        Ok(Step::Done { psn_count: 1 })
    }

    fn execute_read(&mut self, frame: &RoceFrame<'_>, resources: &mut Resources) -> StepResult {
        let reth: RethRepr = frame.reth().expect("opcode implies RETH");
        // The answer is snapshotted whole into the replay cache: a peer
        // asking for a region's worth per READ, a window of them, would
        // have the device hold that many copies.
        if reth.dma_length > resources.max_message_bytes {
            return Err((NakCode::InvalidRequest, None));
        }
        self.responder.take_read_atomic_room(resources)?;
        let length = u64::from(reth.dma_length);
        self.allows_remote(AccessFlags::REMOTE_READ)?;
        let pd = self.attributes.protection_domain;
        // A zero-length READ validates neither R_Key nor address (IB
        // C9-88, as rxe does): it reads nothing.
        let snapshot = match length {
            0 => None,
            _ => Some(
                resources
                    .memory
                    .check_remote(
                        pd,
                        reth.rkey,
                        reth.virtual_address,
                        length,
                        access_needed(Opcode::RdmaReadRequest),
                    )
                    .map_err(|fault| (access_refusal(fault), None))?,
            ),
        };
        let packet_count = self.attributes.path_mtu.packets_for(reth.dma_length);
        let responder = &mut self.responder;
        responder.msn = responder.msn.next();
        let slot = responder.replay.insert(
            (frame.bth().psn, responder.expected_absolute),
            packet_count,
            ReplayKind::Read,
            responder.msn,
        );
        // `take_read_atomic_room` refused the request if its first answer
        // still waited in this slot, and dropped its replays: nothing
        // queued refers to it.
        debug_assert!(!responder.has_queued_answer(slot, true));
        // Snapshot now: a later WRITE on this queue pair must not change
        // what this READ returns, even if its answer is still queued.
        let data = &mut responder.replay.entry_mut(slot).data;
        // A slot that held a large READ gives its memory back when reused
        // for a much smaller one: kept, a peer's sixteen 16 MiB READs held
        // 256 MiB per queue pair for good (found by reading). Capacity up
        // to KEPT_REPLAY_BYTES stays, so READs of a steady size allocate
        // nothing.
        let length_bytes = length as usize;
        if data.capacity() > KEPT_REPLAY_BYTES.max(4 * length_bytes) {
            data.clear();
            data.shrink_to(length_bytes);
        }
        // Only a longer READ than the slot's last zeroes anything: its tail.
        data.resize(length_bytes, 0);
        if let Some((region_slot, range)) = snapshot {
            resources.memory.slot_read(region_slot, range, data);
        }
        responder.push(Output::ReadResponse {
            slot,
            next_packet: 0,
            start_packet: 0,
            replay: false,
        });
        Ok(Step::Done {
            psn_count: packet_count,
        })
    }

    fn execute_atomic(&mut self, frame: &RoceFrame<'_>, resources: &mut Resources) -> StepResult {
        let atomic = frame.atomic_eth().expect("opcode implies AtomicETH");
        if !atomic.virtual_address.0.is_multiple_of(8) {
            return Err((NakCode::InvalidRequest, None));
        }
        self.responder.take_read_atomic_room(resources)?;
        self.allows_remote(AccessFlags::REMOTE_ATOMIC)?;
        let pd = self.attributes.protection_domain;
        let checked = resources.memory.check_remote(
            pd,
            atomic.rkey,
            atomic.virtual_address,
            8,
            AccessFlags::REMOTE_ATOMIC,
        );
        let (region_slot, range) = checked.map_err(|fault| (access_refusal(fault), None))?;
        let opcode = frame.bth().opcode;
        let original =
            resources
                .memory
                .slot_update_word(region_slot, range, |original| match opcode {
                    Opcode::CompareSwap if original == atomic.compare => atomic.swap_or_add,
                    Opcode::CompareSwap => original,
                    _ => original.wrapping_add(atomic.swap_or_add),
                });
        let responder = &mut self.responder;
        responder.msn = responder.msn.next();
        let slot = responder.replay.insert(
            (frame.bth().psn, responder.expected_absolute),
            1,
            ReplayKind::Atomic { original },
            responder.msn,
        );
        // As for a READ: nothing queued refers to the slot.
        debug_assert!(!responder.has_queued_answer(slot, true));
        responder.push(Output::AtomicAcknowledge {
            slot,
            replay: false,
        });
        Ok(Step::Done { psn_count: 1 })
    }

    /// Writes the next queued answer, if any.
    pub(super) fn poll_response(
        &mut self,
        path: &Path,
        resources: &mut Resources,
        buffer: &mut [u8],
    ) -> Option<usize> {
        let output = *self.responder.outputs.front()?;
        let mtu = self.attributes.path_mtu.bytes() as usize;
        let mut extension = ExtensionHeaders::default();
        let responder = &mut self.responder;
        let frame_len = match output {
            Output::Acknowledge { psn, syndrome, msn } => {
                responder.finish_output();
                if matches!(syndrome, AckSyndrome::Ack { .. }) {
                    resources.counters.acks_sent += 1;
                }
                extension.aeth = Some(AethRepr { syndrome, msn });
                let header = PacketHeader::new(Opcode::Acknowledge, psn);
                path.emit(header, &extension, 0, buffer, |_| {})
            }
            Output::AtomicAcknowledge { slot, .. } => {
                responder.finish_output();
                let entry = responder.replay.entry(slot);
                let ReplayKind::Atomic { original } = entry.kind else {
                    unreachable!("atomic outputs point at atomic entries");
                };
                extension.aeth = Some(ack_aeth(entry.msn));
                extension.atomic_ack_eth = Some(AtomicAckEthRepr {
                    original_data: original,
                });
                let header = PacketHeader::new(Opcode::AtomicAcknowledge, entry.first_psn);
                path.emit(header, &extension, 0, buffer, |_| {})
            }
            Output::ReadResponse {
                slot,
                next_packet,
                start_packet,
                ..
            } => {
                let entry = responder.replay.entry(slot);
                let is_first = next_packet == start_packet;
                let is_last = next_packet + 1 == entry.packet_count;
                let opcode = match (is_first, is_last) {
                    (true, true) => Opcode::RdmaReadResponseOnly,
                    (true, false) => Opcode::RdmaReadResponseFirst,
                    (false, false) => Opcode::RdmaReadResponseMiddle,
                    (false, true) => Opcode::RdmaReadResponseLast,
                };
                if opcode.has_aeth() {
                    extension.aeth = Some(ack_aeth(entry.msn));
                }
                let start = next_packet as usize * mtu;
                let end = (start + mtu).min(entry.data.len());
                let payload = &entry.data[start..end];
                let header = PacketHeader::new(opcode, entry.first_psn.add(next_packet));
                let written = path.emit(header, &extension, payload.len(), buffer, |space| {
                    copy_bytes(space, payload)
                });
                if is_last {
                    responder.finish_output();
                } else if let Some(Output::ReadResponse { next_packet, .. }) =
                    responder.outputs.front_mut()
                {
                    *next_packet += 1;
                }
                written
            }
        };
        Some(frame_len)
    }
}

/// The answers a responder serving `read_atomic_limit` READs and atomics
/// may have queued: every cached one's, plus one ACK or NAK between each
/// pair of them.
fn output_capacity_for(read_atomic_limit: usize) -> usize {
    2 * read_atomic_limit + 2
}

fn ack_aeth(msn: Msn) -> AethRepr {
    AethRepr {
        syndrome: AckSyndrome::Ack {
            credit_count: AckSyndrome::UNLIMITED_CREDIT,
        },
        msn,
    }
}

fn access_refusal(_fault: RemoteAccessFault) -> NakCode {
    // Every flavour of access violation is one NAK on the wire; the device
    // counters keep nothing finer, as real RNICs report only the syndrome.
    NakCode::RemoteAccessError
}

enum Step {
    /// Executed; the expected PSN advances by this many.
    Done { psn_count: u32 },
    /// No receive buffer: RNR NAK and wait for the retry.
    ReceiverNotReady,
}

/// A refusal is the NAK to send and, if the request consumed a receive, the
/// status that receive completes with.
type StepResult<T = Step> = Result<T, (NakCode, Option<(ReceiveRequest, CompletionStatus)>)>;
