//! The requester: turns send-queue work requests into request packets and
//! retires them as acknowledgements and responses come back.
//!
//! PSNs are assigned when a request is posted, so the send queue is one
//! contiguous PSN range. Go-back-N needs only a cursor into that range:
//! on a sequence NAK, an RNR NAK or a timeout the cursor rewinds to the
//! first unacknowledged PSN and everything from there is sent again. The
//! responder discards or re-acknowledges what it has already executed, and
//! answers duplicate READs and atomics from its replay cache.

use super::{PacketHeader, Path, QueuePairContext};
use crate::queues::BoundedQueue;
use crate::resources::Resources;
use crate::time::Timestamp;
use crate::verbs::{
    CompletionStatus, LocalFaults, Mtu, QueuePairBuilder, SendOperation, SendRequest,
    WorkCompletion,
};
use crate::{DropReason, VerbsError};
use remora_wire::{
    AckSyndrome, AtomicEthRepr, ExtensionHeaders, ImmDtRepr, NakCode, Opcode, Psn, Qpn, RethRepr,
    RoceFrame,
};
use std::time::Duration;

/// Most unacknowledged packets in flight per queue pair.
pub(crate) const WINDOW_PACKETS: i32 = 256;
/// Ask for an acknowledgement at least this often within long messages.
const ACK_REQUEST_INTERVAL_PACKETS: u32 = 16;
/// `rnr_retry` of 7 means retry forever, as in the IB specification.
const RNR_RETRY_FOREVER: u8 = 7;

#[derive(Debug)]
struct SendWqe {
    request: SendRequest,
    length_bytes: u32,
    first_psn: Psn,
    packet_count: u32,
    /// SEND/WRITE: packets acknowledged. READ: response packets placed.
    /// Atomic: 1 once the original value arrived.
    packets_done: u32,
    /// Counted against `max_read_atomic` since its first transmission.
    counted_outstanding: bool,
    /// Why its local buffers failed their checks at post, when the queue
    /// pair reports that in the request's completion
    /// ([`LocalFaults::Completed`]): it is never sent.
    local_fault: Option<CompletionStatus>,
}

impl SendWqe {
    fn last_psn(&self) -> Psn {
        self.first_psn.add(self.packet_count - 1)
    }

    fn contains(&self, psn: Psn) -> bool {
        let offset = self.first_psn.distance_to(psn);
        offset >= 0 && (offset as u32) < self.packet_count
    }

    /// The first PSN of this request the responder has not answered.
    fn resume_psn(&self) -> Psn {
        self.first_psn.add(self.packets_done)
    }

    fn is_done(&self) -> bool {
        self.packets_done == self.packet_count
    }
}

/// The NAKs that spend a retry and rewind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RetryNak {
    NotReady,
    Sequence,
}

#[derive(Debug)]
pub(crate) struct Requester {
    queue: BoundedQueue<SendWqe>,
    /// First PSN of the next request to be posted.
    next_psn: Psn,
    /// The go-back-N cursor: next PSN to (re)transmit and its queue index.
    transmit_psn: Psn,
    transmit_index: usize,
    /// Highest PSN ever sent, plus one: anything before it is a retransmission.
    sent_high_psn: Psn,
    outstanding_read_atomic: usize,
    pub(super) retries_left: u8,
    pub(super) rnr_retries_left: u8,
    retransmit_deadline: Option<Timestamp>,
    rnr_resume_at: Option<Timestamp>,
    /// While an implicit NAK's go-back is under way: the highest PSN sent
    /// before it, all of which the go-back sends again. Answers and ACKs
    /// for PSNs up to it may be the originals still in flight (reordered
    /// behind the first), so they go back no further; evidence beyond it
    /// comes from a request first sent after the go-back, and ends it, as
    /// do a sequence NAK and the retransmission timer.
    implicit_nak_until: Option<Psn>,
    /// The last RNR or sequence NAK acted on, while a copy of it would be
    /// no news (a duplicating link), and spend no retry: a sequence NAK
    /// until its PSN is acknowledged (the responder NAKs a gap once until
    /// the packet it waits for comes), an RNR NAK until its PSN is sent
    /// again (the resend may meet RNR again).
    last_retry_nak: Option<(Psn, RetryNak)>,
    /// The PSN last sent again after an RNR NAK named it: an RNR NAK for
    /// it may be the resend's answer or a late copy of the first (a
    /// duplicating link), which no byte tells apart.
    rnr_resent: Option<Psn>,
    /// An RNR NAK that found the budget spent but may have been such a
    /// copy: the request fails at the retransmission timer unless the
    /// resend's answer comes first (failed at once, a SEND the resend
    /// delivered was reported failed).
    rnr_exhausted_at: Option<Psn>,
    /// The highest PSN the responder is known to have executed. It can run
    /// ahead of the oldest unanswered request (a READ or atomic whose answer
    /// was lost), and its advance is what counts as progress.
    acknowledged_psn: Psn,
}

/// The most PSNs posted work may span: half the 24-bit space, within which
/// PSNs compare.
const MAX_POSTED_PSNS: u32 = 1 << 23;

impl Requester {
    pub(crate) fn new(attributes: &QueuePairBuilder, initial_psn: Psn) -> Requester {
        Requester {
            queue: BoundedQueue::new("send queue", attributes.send_queue_depth),
            next_psn: initial_psn,
            transmit_psn: initial_psn,
            transmit_index: 0,
            sent_high_psn: initial_psn,
            outstanding_read_atomic: 0,
            retries_left: attributes.retry_count,
            rnr_retries_left: attributes.rnr_retry,
            retransmit_deadline: None,
            rnr_resume_at: None,
            implicit_nak_until: None,
            last_retry_nak: None,
            rnr_resent: None,
            rnr_exhausted_at: None,
            acknowledged_psn: initial_psn.sub(1),
        }
    }

    /// The oldest PSN the responder is not known to have executed: where
    /// a resumed connection starts sending.
    pub(crate) fn resume_psn(&self) -> Psn {
        self.acknowledged_psn.add(1)
    }

    /// The oldest PSN the responder has not answered.
    fn unacked_psn(&self) -> Psn {
        self.queue
            .front()
            .map_or(self.next_psn, SendWqe::resume_psn)
    }

    fn has_outstanding(&self) -> bool {
        self.unacked_psn().precedes(self.transmit_psn)
    }

    pub(crate) fn poll_timeout(&self) -> Option<Timestamp> {
        match (self.retransmit_deadline, self.rnr_resume_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Steps the cursor over READs and atomics that are fully answered. One
    /// can be answered while an earlier READ still waits for a lost packet;
    /// the responder executed it, so going back must not ask again.
    fn skip_answered(&mut self) {
        for _ in 0..self.queue.len() {
            let Some(wqe) = self.queue.get(self.transmit_index) else {
                return;
            };
            if !(wqe.request.operation.is_read_or_atomic() && wqe.is_done()) {
                return;
            }
            self.transmit_psn = wqe.first_psn.add(wqe.packet_count);
            self.transmit_index += 1;
        }
    }

    /// Whether a READ or atomic posted before the request at `index`
    /// still waits for its answer: a fenced request waits for them all.
    /// Linear in the queue depth, and only for fenced requests.
    fn read_or_atomic_unanswered_before(&self, index: usize) -> bool {
        (0..index)
            .filter_map(|earlier| self.queue.get(earlier))
            .any(|wqe| wqe.request.operation.is_read_or_atomic() && !wqe.is_done())
    }

    /// Checks the requester's invariants (debug builds; the tests and the
    /// simulator run with them on). Linear in the queue depth.
    fn debug_check_invariants(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        let unacked = self.unacked_psn();
        debug_assert!(
            unacked.precedes_or_equals(self.transmit_psn),
            "cursor behind the oldest unanswered PSN"
        );
        debug_assert!(
            self.transmit_psn.precedes_or_equals(self.next_psn),
            "cursor beyond the posted PSNs"
        );
        debug_assert!(
            self.acknowledged_psn.precedes(self.sent_high_psn),
            "acknowledged beyond what was sent"
        );
        if let Some(until) = self.implicit_nak_until {
            debug_assert!(
                self.acknowledged_psn.precedes_or_equals(until)
                    && until.precedes(self.sent_high_psn),
                "the implicit NAK's guard outside what is acknowledged and sent"
            );
        }
        let mut expected_first = self.queue.front().map(|wqe| wqe.first_psn);
        for wqe in self.queue.iter() {
            debug_assert_eq!(
                Some(wqe.first_psn),
                expected_first,
                "the send queue is one PSN range"
            );
            debug_assert!(wqe.packets_done <= wqe.packet_count);
            expected_first = Some(wqe.first_psn.add(wqe.packet_count));
        }
        debug_assert!(expected_first.is_none_or(|end| end == self.next_psn));
        match self.queue.get(self.transmit_index) {
            Some(wqe) => debug_assert!(
                wqe.contains(self.transmit_psn),
                "cursor index and PSN disagree"
            ),
            None => debug_assert_eq!(self.transmit_psn, self.next_psn, "cursor past the queue"),
        }
        let counted = self
            .queue
            .iter()
            .filter(|wqe| wqe.counted_outstanding)
            .count();
        debug_assert_eq!(
            counted, self.outstanding_read_atomic,
            "READ/atomic credit count"
        );
    }

    /// The queue index of the request holding `psn`.
    fn index_of(&self, psn: Psn) -> Option<usize> {
        self.queue.iter().position(|wqe| wqe.contains(psn))
    }

    /// Puts the go-back-N cursor at `psn`, in either direction.
    fn move_cursor(&mut self, psn: Psn) {
        let index = self.index_of(psn).unwrap_or(self.queue.len());
        self.transmit_index = index;
        self.transmit_psn = psn;
    }

    /// Goes back to `psn` unless the cursor is already there or earlier.
    /// A go-back never moves forward: a NAK for a later PSN must not skip
    /// the re-request of an earlier READ still waiting for its answer.
    fn rewind_to(&mut self, psn: Psn) {
        if psn.precedes(self.transmit_psn) {
            self.move_cursor(psn);
        }
    }

    /// Completes every request with a flush error.
    pub(crate) fn flush(
        &mut self,
        qpn: Qpn,
        attributes: &QueuePairBuilder,
        resources: &mut Resources,
    ) {
        while let Some(wqe) = self.queue.pop() {
            complete(
                qpn,
                attributes,
                &wqe,
                CompletionStatus::WorkRequestFlushError,
                resources,
            );
        }
        self.transmit_index = 0;
        self.transmit_psn = self.next_psn;
        self.outstanding_read_atomic = 0;
        self.retransmit_deadline = None;
        self.rnr_resume_at = None;
        self.last_retry_nak = None;
        self.rnr_resent = None;
        self.rnr_exhausted_at = None;
        self.implicit_nak_until = None;
    }
}

fn complete(
    qpn: Qpn,
    attributes: &QueuePairBuilder,
    wqe: &SendWqe,
    status: CompletionStatus,
    resources: &mut Resources,
) {
    if status == CompletionStatus::Success && !wqe.request.signaled {
        return;
    }
    let completion = WorkCompletion {
        work_request_id: wqe.request.work_request_id,
        status,
        opcode: wqe.request.operation.completion_opcode(),
        qpn,
        byte_len: wqe.length_bytes,
        immediate: None,
        solicited: false,
    };
    resources.complete(attributes.send_completion_queue, completion);
}

/// The IB RNR timer encoding: code → minimum wait.
const RNR_TIMER_MICROS: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// The wait IB's 5-bit RNR timer code stands for (`min_rnr_timer`; its 0
/// is the longest, 655.36 ms). Bits above the five are ignored.
pub fn rnr_timer_duration(code: u8) -> Duration {
    Duration::from_micros(u64::from(RNR_TIMER_MICROS[usize::from(code & 0x1f)]))
}

/// The smallest RNR timer code that waits at least `wait`.
pub(crate) fn rnr_timer_code(wait: Duration) -> u8 {
    let micros = wait.as_micros();
    (1..32u8)
        .find(|code| u128::from(RNR_TIMER_MICROS[usize::from(*code)]) >= micros)
        .unwrap_or(0)
}

fn validate_request(request: &SendRequest, max_message_bytes: u32) -> Result<u32, VerbsError> {
    let length_bytes = request.local.total_length_bytes();
    if length_bytes > u64::from(max_message_bytes) {
        return Err(VerbsError::MessageTooLong {
            length_bytes,
            max_bytes: u64::from(max_message_bytes),
        });
    }
    if let Some(remote) = request.operation.remote() {
        if remote.address.checked_add(length_bytes).is_none() {
            return Err(VerbsError::RemoteRangeOverflow {
                address: remote.address,
                length_bytes,
            });
        }
    }
    if let SendOperation::CompareSwap { remote, .. } | SendOperation::FetchAdd { remote, .. } =
        request.operation
    {
        if remote.address.0 % 8 != 0 {
            return Err(VerbsError::MisalignedAtomic(remote.address));
        }
        if length_bytes != 8 {
            return Err(VerbsError::AtomicBufferInvalid);
        }
    }
    Ok(length_bytes as u32)
}

/// The request's local buffers checked against the queue pair's
/// protection domain: a fault refuses the post, or, as the queue pair's
/// [`LocalFaults`] say, is kept for the request's completion.
fn local_fault(
    request: &SendRequest,
    attributes: &QueuePairBuilder,
    resources: &Resources,
) -> Result<Option<CompletionStatus>, VerbsError> {
    let writes_locally = request.operation.is_read_or_atomic();
    let checked = resources.memory.check_local_list(
        attributes.protection_domain,
        &request.local,
        writes_locally,
    );
    match (checked, attributes.local_faults) {
        (Ok(()), _) => Ok(None),
        (Err(_), LocalFaults::Completed) => Ok(Some(CompletionStatus::LocalProtectionError)),
        (Err(error), LocalFaults::RefusedAtPost) => Err(error),
    }
}

/// A request checked for posting: its length, packets and local fault.
struct Checked {
    request: SendRequest,
    length_bytes: u32,
    packet_count: u32,
    local_fault: Option<CompletionStatus>,
}

impl QueuePairContext {
    pub(crate) fn post_send(
        &mut self,
        request: SendRequest,
        resources: &mut Resources,
        max_message_bytes: u32,
    ) -> Result<(), VerbsError> {
        self.check_posting_state()?;
        let checked = self.check_request(request, resources, max_message_bytes)?;
        self.check_psn_span(i64::from(checked.packet_count))?;
        self.enqueue(checked, resources)
    }

    fn check_request(
        &self,
        request: SendRequest,
        resources: &Resources,
        max_message_bytes: u32,
    ) -> Result<Checked, VerbsError> {
        let length_bytes = validate_request(&request, max_message_bytes)?;
        let local_fault = local_fault(&request, &self.attributes, resources)?;
        // A request with a local fault is never sent: it completes in its
        // turn and takes the queue pair to error, so it holds one PSN, not
        // the span its length would cover (a huge one was refused
        // `QueueFull` by the span check).
        let packet_count = match local_fault {
            Some(_) => 1,
            None => self.packets_of(&request, length_bytes),
        };
        Ok(Checked {
            request,
            length_bytes,
            packet_count,
            local_fault,
        })
    }

    /// Posts every request or none (`ibv_wr_complete`): each is checked,
    /// and the send queue's room and the PSN span for them all, before the
    /// first is queued. Posted one by one, a refusal of the third left the
    /// first two to run while the program, told the batch failed, posted
    /// them again.
    pub(crate) fn post_send_all(
        &mut self,
        requests: Vec<SendRequest>,
        resources: &mut Resources,
        max_message_bytes: u32,
    ) -> Result<(), VerbsError> {
        self.check_posting_state()?;
        let mut checked = Vec::with_capacity(requests.len());
        let mut packets_total = 0i64;
        for request in requests {
            let request = self.check_request(request, resources, max_message_bytes)?;
            packets_total += i64::from(request.packet_count);
            checked.push(request);
        }
        if checked.len() > self.requester.queue.room() {
            return Err(VerbsError::QueueFull {
                queue: "send queue",
            });
        }
        self.check_psn_span(packets_total)?;
        for request in checked {
            self.enqueue(request, resources)?;
        }
        Ok(())
    }

    fn check_posting_state(&self) -> Result<(), VerbsError> {
        use crate::verbs::QueuePairState;
        if matches!(
            self.state,
            QueuePairState::ReadyToSend | QueuePairState::Error
        ) {
            return Ok(());
        }
        Err(VerbsError::InvalidState {
            operation: "post_send",
            state: self.state,
        })
    }

    fn packets_of(&self, request: &SendRequest, length_bytes: u32) -> u32 {
        if request.operation.is_atomic() {
            1
        } else {
            self.attributes.path_mtu.packets_for(length_bytes)
        }
    }

    /// PSNs are compared within half their space: work posted past it
    /// (129 WRITEs of 16 MiB at MTU 256, say) would make the newest PSN
    /// read as older than the oldest. It waits for room instead.
    fn check_psn_span(&self, new_packets: i64) -> Result<(), VerbsError> {
        let requester = &self.requester;
        let posted_span = i64::from(requester.unacked_psn().distance_to(requester.next_psn));
        if posted_span + new_packets >= i64::from(MAX_POSTED_PSNS) {
            return Err(VerbsError::QueueFull {
                queue: "the send queue's PSN span (half the 24-bit space)",
            });
        }
        Ok(())
    }

    /// Queues a checked request at the next PSNs.
    fn enqueue(&mut self, checked: Checked, resources: &mut Resources) -> Result<(), VerbsError> {
        use crate::verbs::QueuePairState;
        let requester = &mut self.requester;
        let first_psn = requester.next_psn;
        let packet_count = checked.packet_count;
        requester.queue.push(SendWqe {
            request: checked.request,
            length_bytes: checked.length_bytes,
            first_psn,
            packet_count,
            packets_done: 0,
            counted_outstanding: false,
            local_fault: checked.local_fault,
        })?;
        requester.next_psn = first_psn.add(packet_count);
        if self.state == QueuePairState::Error {
            // Work posted to a queue pair in error completes at once, flushed.
            self.requester.flush(self.qpn, &self.attributes, resources);
        }
        Ok(())
    }

    /// Writes the next request packet, if the window and the read/atomic
    /// credit allow one.
    pub(super) fn poll_request(
        &mut self,
        now: Timestamp,
        path: &Path,
        resources: &mut Resources,
        buffer: &mut [u8],
    ) -> Option<usize> {
        let requester = &mut self.requester;
        if let Some(resume_at) = requester.rnr_resume_at {
            if now < resume_at {
                return None;
            }
            requester.rnr_resume_at = None;
        }
        requester.skip_answered();
        let index = requester.transmit_index;
        let wqe = requester.queue.get(index)?;
        if let Some(status) = wqe.local_fault {
            // Completed in its turn: once every request before it has
            // completed, so their completions come first, as on mlx5.
            if index == 0 {
                self.fail_request(index, status, resources);
            }
            return None;
        }
        if wqe.request.fence && requester.read_or_atomic_unanswered_before(index) {
            return None;
        }
        if requester.unacked_psn().distance_to(requester.transmit_psn) >= WINDOW_PACKETS {
            return None;
        }
        let needs_credit = wqe.request.operation.is_read_or_atomic() && !wqe.counted_outstanding;
        if needs_credit && requester.outstanding_read_atomic >= self.attributes.max_read_atomic {
            return None;
        }
        let mtu = self.attributes.path_mtu;
        match build_request_packet(wqe, requester.transmit_psn, mtu, path, resources, buffer) {
            Ok((frame_len, psn_after)) => {
                let requester = &mut self.requester;
                if requester.last_retry_nak == Some((requester.transmit_psn, RetryNak::NotReady)) {
                    requester.last_retry_nak = None;
                    requester.rnr_resent = Some(requester.transmit_psn);
                }
                if needs_credit {
                    requester.outstanding_read_atomic += 1;
                    requester
                        .queue
                        .get_mut(index)
                        .expect("index checked")
                        .counted_outstanding = true;
                }
                if requester.transmit_psn.precedes(requester.sent_high_psn) {
                    resources.counters.packets_retransmitted += 1;
                }
                if requester.sent_high_psn.precedes(psn_after) {
                    requester.sent_high_psn = psn_after;
                }
                let wqe_end = {
                    let wqe = requester.queue.get(index).expect("index checked");
                    wqe.first_psn.add(wqe.packet_count)
                };
                requester.transmit_psn = psn_after;
                if psn_after == wqe_end {
                    requester.transmit_index += 1;
                }
                if requester.retransmit_deadline.is_none() {
                    requester.retransmit_deadline =
                        Some(now.saturating_add(self.attributes.timeout));
                }
                requester.debug_check_invariants();
                Some(frame_len)
            }
            Err(status) => {
                // A local buffer vanished between post and transmission.
                self.fail_request(index, status, resources);
                None
            }
        }
    }

    /// Completes the request at `index` with `status`, flushes the rest and
    /// puts the queue pair in error.
    fn fail_request(&mut self, index: usize, status: CompletionStatus, resources: &mut Resources) {
        for position in 0..=index {
            let Some(wqe) = self.requester.queue.pop() else {
                break;
            };
            let this_status = if position == index {
                status
            } else {
                CompletionStatus::WorkRequestFlushError
            };
            complete(self.qpn, &self.attributes, &wqe, this_status, resources);
        }
        self.enter_error(resources);
    }

    pub(super) fn handle_response(
        &mut self,
        now: Timestamp,
        frame: &RoceFrame<'_>,
        resources: &mut Resources,
    ) {
        let psn = frame.bth().psn;
        let accepted = match frame.bth().opcode {
            Opcode::Acknowledge => {
                let syndrome = frame.aeth().expect("opcode implies AETH").syndrome;
                self.on_acknowledge(now, psn, syndrome, resources)
            }
            Opcode::AtomicAcknowledge => {
                let original = frame.atomic_ack_eth().expect("opcode implies AtomicAckETH");
                self.on_atomic_acknowledge(now, psn, original.original_data, resources)
            }
            _ => self.on_read_response(now, psn, frame.payload(), resources),
        };
        if !accepted {
            resources
                .counters
                .count_drop(DropReason::UnexpectedResponse);
        }
    }

    /// The queue index of the in-flight request holding `psn`.
    fn in_flight_index(&self, psn: Psn) -> Option<usize> {
        self.is_in_flight(psn)
            .then(|| self.requester.index_of(psn))
            .flatten()
    }

    /// True when `psn` names a request that is in flight.
    fn is_in_flight(&self, psn: Psn) -> bool {
        let requester = &self.requester;
        requester.unacked_psn().precedes_or_equals(psn) && psn.precedes(requester.sent_high_psn)
    }

    fn on_acknowledge(
        &mut self,
        now: Timestamp,
        psn: Psn,
        syndrome: AckSyndrome,
        resources: &mut Resources,
    ) -> bool {
        if !self.is_in_flight(psn) {
            return false;
        }
        // An ACK covers its PSN; a NAK covers everything before the PSN it
        // names.
        let acknowledged = match syndrome {
            AckSyndrome::Ack { .. } => psn,
            _ => psn.sub(1),
        };
        self.acknowledge_through(now, acknowledged, resources);
        let retry_nak = match syndrome {
            AckSyndrome::ReceiverNotReady { .. } => Some(RetryNak::NotReady),
            AckSyndrome::Nak(NakCode::PsnSequenceError) => Some(RetryNak::Sequence),
            _ => None,
        };
        if let Some(kind) = retry_nak {
            if self.requester.last_retry_nak == Some((psn, kind)) {
                resources.counters.stale_naks_ignored += 1;
                return true;
            }
            self.requester.last_retry_nak = Some((psn, kind));
        }
        match syndrome {
            AckSyndrome::Ack { .. } => {}
            AckSyndrome::ReceiverNotReady { timer } => {
                resources.counters.receiver_not_ready_naks_received += 1;
                self.on_receiver_not_ready(now, psn, timer, resources);
            }
            AckSyndrome::Nak(NakCode::PsnSequenceError) => {
                resources.counters.sequence_naks_received += 1;
                if self.consume_retry(resources) {
                    // Nothing is in flight behind this rewind: a lost READ
                    // answer may be reissued again.
                    self.requester.implicit_nak_until = None;
                    self.requester.rewind_to(psn);
                }
            }
            AckSyndrome::Nak(code) => {
                resources.counters.error_naks_received += 1;
                // The NAK names the refused request. Anything before it still
                // unanswered (a READ whose response was lost) is flushed: the
                // responder is in error and will never answer it.
                let index = self.requester.index_of(psn).unwrap_or(0);
                self.fail_request(index, nak_status(code), resources);
            }
        }
        true
    }

    fn on_receiver_not_ready(
        &mut self,
        now: Timestamp,
        psn: Psn,
        timer: u8,
        resources: &mut Resources,
    ) {
        let requester = &mut self.requester;
        if self.attributes.rnr_retry != RNR_RETRY_FOREVER {
            if requester.rnr_retries_left == 0 && requester.rnr_resent == Some(psn) {
                // Perhaps a copy of the NAK the resend answered: the
                // resend's own answer, or the timer, decides.
                requester.rnr_exhausted_at = Some(psn);
                requester
                    .retransmit_deadline
                    .get_or_insert(now.saturating_add(self.attributes.timeout));
                return;
            }
            if requester.rnr_retries_left == 0 {
                // The request the receiver was not ready for fails; those
                // before it still unanswered are flushed.
                let index = requester.index_of(psn).unwrap_or(0);
                self.fail_request(
                    index,
                    CompletionStatus::ReceiverNotReadyRetryExceeded,
                    resources,
                );
                return;
            }
            requester.rnr_retries_left -= 1;
        }
        requester.rnr_resume_at = Some(now.saturating_add(rnr_timer_duration(timer)));
        requester.retransmit_deadline = None;
        requester.rewind_to(psn);
    }

    /// Spends one retry; on the last one fails the oldest request.
    fn consume_retry(&mut self, resources: &mut Resources) -> bool {
        if self.requester.retries_left == 0 {
            self.fail_request(0, CompletionStatus::RetryExceeded, resources);
            return false;
        }
        self.requester.retries_left -= 1;
        true
    }

    pub(crate) fn handle_timeout(&mut self, now: Timestamp, resources: &mut Resources) {
        let requester = &mut self.requester;
        // A passed RNR wait is over even if nothing can be sent yet; keeping
        // it would make poll_timeout report a deadline already gone.
        if requester
            .rnr_resume_at
            .is_some_and(|resume_at| resume_at <= now)
        {
            requester.rnr_resume_at = None;
        }
        let Some(deadline) = requester.retransmit_deadline else {
            return;
        };
        if now < deadline {
            return;
        }
        requester.retransmit_deadline = None;
        if !requester.has_outstanding() {
            return;
        }
        resources.counters.retransmit_timeouts += 1;
        if let Some(psn) = self.requester.rnr_exhausted_at.take() {
            // No answer to the resend came: the RNR NAK was the resend's.
            let index = self.requester.index_of(psn).unwrap_or(0);
            self.fail_request(
                index,
                CompletionStatus::ReceiverNotReadyRetryExceeded,
                resources,
            );
            return;
        }
        if self.consume_retry(resources) {
            let unacked = self.requester.unacked_psn();
            // As for a sequence NAK: the link is quiet, so a READ whose
            // reissue was lost again may be reissued again.
            self.requester.implicit_nak_until = None;
            self.requester.rewind_to(unacked);
            self.requester.debug_check_invariants();
        }
    }

    /// Retires everything up to and including `last_psn`, and anything an
    /// earlier acknowledgement covered but an unanswered READ or atomic
    /// held back: an ACK acknowledges every request up to its PSN.
    fn acknowledge_through(&mut self, now: Timestamp, last_psn: Psn, resources: &mut Resources) {
        let before = self.requester.unacked_psn();
        let mut progressed = false;
        if self.requester.acknowledged_psn.precedes(last_psn) {
            self.requester.acknowledged_psn = last_psn;
            progressed = true;
        }
        // A NAK's PSN acknowledged is over: kept, a real NAK for the same
        // PSN a lap of the 24-bit space later was taken for a copy.
        if let Some((nak_psn, _)) = self.requester.last_retry_nak {
            if nak_psn.precedes_or_equals(self.requester.acknowledged_psn) {
                self.requester.last_retry_nak = None;
            }
        }
        // What retires is bounded by the highest PSN acknowledged so far,
        // not this packet's: an ACK for WRITEs that overtook the last
        // answer of a READ before them acknowledged them already.
        let acknowledged = self.requester.acknowledged_psn;
        if self
            .requester
            .implicit_nak_until
            .is_some_and(|until| until.precedes(acknowledged))
        {
            self.requester.implicit_nak_until = None;
        }
        if self
            .requester
            .rnr_resent
            .is_some_and(|resent| resent.precedes_or_equals(acknowledged))
        {
            self.requester.rnr_resent = None;
        }
        let bound = self.requester.queue.len();
        for _ in 0..bound {
            let requester = &mut self.requester;
            let Some(front) = requester.queue.front_mut() else {
                break;
            };
            // A READ or atomic answered while an earlier one waited is done
            // whatever PSN this acknowledgement names.
            let answered = front.request.operation.is_read_or_atomic() && front.is_done();
            if !answered && !front.first_psn.precedes_or_equals(acknowledged) {
                break;
            }
            let fully_covered = front.last_psn().precedes_or_equals(acknowledged);
            if front.request.operation.is_read_or_atomic() {
                if !front.is_done() {
                    // Only this packet is news of a loss: an answer of the
                    // READ itself, under an older ACK, is not.
                    if front.last_psn().precedes_or_equals(last_psn) {
                        // The responder answered later requests, so this
                        // response was lost: an implicit NAK. Once per
                        // go-back: it re-requests everything sent so far,
                        // so the answers and ACKs still in flight behind
                        // the first, even those that advance this READ,
                        // are no news (re-armed at each advance, a READ
                        // whose answers were reordered behind an ACK went
                        // back once per packet). A loss among the resent
                        // answers meets the retransmission timer, or the
                        // ACK of a request sent after the go-back.
                        let resume = front.resume_psn();
                        if requester.implicit_nak_until.is_none() {
                            requester.implicit_nak_until = Some(requester.sent_high_psn.sub(1));
                            requester.rewind_to(resume);
                        }
                    }
                    break;
                }
            } else if !fully_covered {
                front.packets_done = front
                    .packets_done
                    .max(front.first_psn.distance_to(acknowledged) as u32 + 1);
                break;
            }
            self.retire_front(resources);
        }
        let requester = &mut self.requester;
        let unacked = requester.unacked_psn();
        if requester.transmit_psn.precedes(unacked) {
            requester.move_cursor(unacked);
        }
        if progressed || before != unacked {
            self.on_progress(now);
        }
        self.requester.debug_check_invariants();
    }

    fn retire_front(&mut self, resources: &mut Resources) {
        let requester = &mut self.requester;
        let wqe = requester.queue.pop().expect("caller saw a front");
        if wqe.counted_outstanding {
            requester.outstanding_read_atomic -= 1;
        }
        if requester.transmit_index > 0 {
            requester.transmit_index -= 1;
        } else {
            let resume = requester.unacked_psn();
            requester.transmit_psn = resume;
        }
        complete(
            self.qpn,
            &self.attributes,
            &wqe,
            CompletionStatus::Success,
            resources,
        );
    }

    fn on_progress(&mut self, now: Timestamp) {
        let requester = &mut self.requester;
        requester.retries_left = self.attributes.retry_count;
        requester.rnr_retries_left = self.attributes.rnr_retry;
        requester.rnr_exhausted_at = None;
        requester.retransmit_deadline = requester
            .has_outstanding()
            .then(|| now.saturating_add(self.attributes.timeout));
    }

    fn on_read_response(
        &mut self,
        now: Timestamp,
        psn: Psn,
        payload: &[u8],
        resources: &mut Resources,
    ) -> bool {
        let mtu = u64::from(self.attributes.path_mtu.bytes());
        let Some(index) = self.in_flight_index(psn) else {
            return false;
        };
        let wqe = self
            .requester
            .queue
            .get(index)
            .expect("in_flight_index found it");
        if !matches!(wqe.request.operation, SendOperation::Read { .. }) || psn != wqe.resume_psn() {
            // A gap or a duplicate: go-back-N waits for the packet it expects.
            return false;
        }
        let offset_bytes = u64::from(wqe.packets_done) * mtu;
        let expected_len = (u64::from(wqe.length_bytes) - offset_bytes).min(mtu);
        if payload.len() as u64 != expected_len {
            // The responder answered a different READ than we asked: no
            // retransmission can fix that.
            self.fail_answered(now, index, CompletionStatus::BadResponseError, resources);
            return true;
        }
        if !self.place_answer(now, index, offset_bytes, payload, resources) {
            return true;
        }
        self.requester
            .queue
            .get_mut(index)
            .expect("in_flight_index found it")
            .packets_done += 1;
        self.acknowledge_through(now, psn, resources);
        // A new in-order answer is progress even when an ACK that overtook
        // it (one for a later request, the implicit NAK) already moved
        // `acknowledged_psn` past its PSN: without this, a READ resumed
        // packet by packet under reordering spends a retry per round and
        // fails though every round advanced it.
        self.on_progress(now);
        true
    }

    /// Writes answer bytes into the local buffers of request `index`. If a
    /// region vanished since the post, fails the request and returns false.
    fn place_answer(
        &mut self,
        now: Timestamp,
        index: usize,
        offset_bytes: u64,
        bytes: &[u8],
        resources: &mut Resources,
    ) -> bool {
        let wqe = self.requester.queue.get(index).expect("caller found it");
        if resources
            .memory
            .scatter(&wqe.request.local, offset_bytes, bytes)
            .is_err()
        {
            self.fail_answered(
                now,
                index,
                CompletionStatus::LocalProtectionError,
                resources,
            );
            return false;
        }
        true
    }

    /// Fails request `index`, a READ or atomic whose answer came, after
    /// retiring what the answer acknowledged: every request before it,
    /// which the responder executed. Failed first, they were flushed, and
    /// a program that retries what was flushed ran them twice (found by
    /// reading). A READ before it still unanswered is flushed, as the
    /// queue pair goes to error.
    fn fail_answered(
        &mut self,
        now: Timestamp,
        index: usize,
        status: CompletionStatus,
        resources: &mut Resources,
    ) {
        let first_psn = self
            .requester
            .queue
            .get(index)
            .expect("caller found it")
            .first_psn;
        self.acknowledge_through(now, first_psn.sub(1), resources);
        let index = self.requester.index_of(first_psn).unwrap_or(0);
        self.fail_request(index, status, resources);
    }

    fn on_atomic_acknowledge(
        &mut self,
        now: Timestamp,
        psn: Psn,
        original: u64,
        resources: &mut Resources,
    ) -> bool {
        let Some(index) = self.in_flight_index(psn) else {
            return false;
        };
        let wqe = self
            .requester
            .queue
            .get(index)
            .expect("in_flight_index found it");
        if !wqe.request.operation.is_atomic() || wqe.is_done() {
            return false;
        }
        // Host memory is little-endian, as on the x86 and Arm hosts RDMA serves.
        if !self.place_answer(now, index, 0, &original.to_le_bytes(), resources) {
            return true;
        }
        self.requester
            .queue
            .get_mut(index)
            .expect("in_flight_index found it")
            .packets_done = 1;
        self.acknowledge_through(now, psn, resources);
        true
    }
}

fn nak_status(code: NakCode) -> CompletionStatus {
    match code {
        NakCode::RemoteAccessError => CompletionStatus::RemoteAccessError,
        NakCode::RemoteOperationalError => CompletionStatus::RemoteOperationError,
        NakCode::InvalidRequest | NakCode::InvalidRdRequest | NakCode::PsnSequenceError => {
            CompletionStatus::RemoteInvalidRequestError
        }
    }
}

/// Emits the packet of `wqe` at `psn`. Returns the frame length and the PSN
/// the cursor moves to, or the status to fail the request with.
fn build_request_packet(
    wqe: &SendWqe,
    psn: Psn,
    mtu: Mtu,
    path: &Path,
    resources: &Resources,
    buffer: &mut [u8],
) -> Result<(usize, Psn), CompletionStatus> {
    let mut extension = ExtensionHeaders::default();
    let emit = |header, extension, payload_len, offset_bytes, buffer: &mut [u8]| {
        let mut gather_result = Ok(());
        let frame_len = path.emit(header, &extension, payload_len, buffer, |space| {
            gather_result = resources
                .memory
                .gather(&wqe.request.local, offset_bytes, space);
        });
        gather_result
            .map(|()| frame_len)
            .map_err(|_| CompletionStatus::LocalProtectionError)
    };
    let wqe_end = wqe.first_psn.add(wqe.packet_count);
    match wqe.request.operation {
        SendOperation::Read { remote } => {
            // Re-requests after a loss ask only for what has not arrived.
            let offset_bytes = u64::from(wqe.packets_done) * u64::from(mtu.bytes());
            extension.reth = Some(RethRepr {
                virtual_address: remote
                    .address
                    .checked_add(offset_bytes)
                    .expect("validated at post"),
                rkey: remote.rkey,
                dma_length: wqe.length_bytes - offset_bytes as u32,
            });
            let header = PacketHeader {
                ack_request: true,
                ..PacketHeader::new(Opcode::RdmaReadRequest, wqe.resume_psn())
            };
            let frame_len = emit(header, extension, 0, 0, buffer)?;
            Ok((frame_len, wqe_end))
        }
        SendOperation::CompareSwap {
            remote,
            compare,
            swap,
        } => {
            extension.atomic_eth = Some(AtomicEthRepr {
                virtual_address: remote.address,
                rkey: remote.rkey,
                swap_or_add: swap,
                compare,
            });
            let header = PacketHeader {
                ack_request: true,
                ..PacketHeader::new(Opcode::CompareSwap, psn)
            };
            let frame_len = emit(header, extension, 0, 0, buffer)?;
            Ok((frame_len, wqe_end))
        }
        SendOperation::FetchAdd { remote, add } => {
            extension.atomic_eth = Some(AtomicEthRepr {
                virtual_address: remote.address,
                rkey: remote.rkey,
                swap_or_add: add,
                compare: 0,
            });
            let header = PacketHeader {
                ack_request: true,
                ..PacketHeader::new(Opcode::FetchAdd, psn)
            };
            let frame_len = emit(header, extension, 0, 0, buffer)?;
            Ok((frame_len, wqe_end))
        }
        SendOperation::Send { immediate } | SendOperation::Write { immediate, .. } => {
            let packet_index = wqe.first_psn.distance_to(psn) as u32;
            debug_assert!(packet_index < wqe.packet_count);
            let is_first = packet_index == 0;
            let is_last = packet_index + 1 == wqe.packet_count;
            let offset_bytes = u64::from(packet_index) * u64::from(mtu.bytes());
            let payload_len =
                (u64::from(wqe.length_bytes) - offset_bytes).min(u64::from(mtu.bytes()));
            let opcode = segment_opcode(
                &wqe.request.operation,
                is_first,
                is_last,
                immediate.is_some(),
            );
            if opcode.has_reth() {
                if let SendOperation::Write { remote, .. } = wqe.request.operation {
                    extension.reth = Some(RethRepr {
                        virtual_address: remote.address,
                        rkey: remote.rkey,
                        dma_length: wqe.length_bytes,
                    });
                }
            }
            if opcode.has_immediate() {
                extension.immediate = immediate.map(|immediate| ImmDtRepr { immediate });
            }
            let header = PacketHeader {
                opcode,
                psn,
                ack_request: is_last
                    || packet_index % ACK_REQUEST_INTERVAL_PACKETS
                        == ACK_REQUEST_INTERVAL_PACKETS - 1,
                // The SE bit rides on the packet that completes the
                // receive; a plain WRITE completes none.
                solicited_event: is_last && wqe.request.solicited && opcode.completes_receive(),
            };
            let frame_len = emit(
                header,
                extension,
                payload_len as usize,
                offset_bytes,
                buffer,
            )?;
            Ok((frame_len, psn.add(1)))
        }
    }
}

fn segment_opcode(
    operation: &SendOperation,
    is_first: bool,
    is_last: bool,
    immediate: bool,
) -> Opcode {
    use Opcode::*;
    let is_send = matches!(operation, SendOperation::Send { .. });
    match (is_send, is_first, is_last, immediate) {
        (true, true, true, false) => SendOnly,
        (true, true, true, true) => SendOnlyWithImmediate,
        (true, true, false, _) => SendFirst,
        (true, false, false, _) => SendMiddle,
        (true, false, true, false) => SendLast,
        (true, false, true, true) => SendLastWithImmediate,
        (false, true, true, false) => RdmaWriteOnly,
        (false, true, true, true) => RdmaWriteOnlyWithImmediate,
        (false, true, false, _) => RdmaWriteFirst,
        (false, false, false, _) => RdmaWriteMiddle,
        (false, false, true, false) => RdmaWriteLast,
        (false, false, true, true) => RdmaWriteLastWithImmediate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rnr_timer_codes_round_up() {
        assert_eq!(rnr_timer_code(Duration::from_micros(10)), 1);
        assert_eq!(rnr_timer_code(Duration::from_micros(11)), 2);
        assert_eq!(
            rnr_timer_duration(rnr_timer_code(Duration::from_micros(100))),
            Duration::from_micros(120)
        );
        assert_eq!(rnr_timer_duration(0), Duration::from_micros(655_360));
    }
}
