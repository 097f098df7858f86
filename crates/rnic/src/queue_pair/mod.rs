//! Reliable Connected queue pairs.
//!
//! One queue pair is two state machines that share a connection: the
//! requester ([`requester`]) sends requests from its send queue and retires
//! them as responses arrive; the responder ([`responder`]) executes the
//! peer's requests in PSN order and answers them. Both run inside the
//! device; neither does I/O or reads a clock.

mod replay_cache;
mod requester;
mod responder;

pub use requester::rnr_timer_duration;

use crate::queues::BoundedQueue;
use crate::resources::Resources;
use crate::time::Timestamp;
use crate::verbs::{
    CompletionOpcode, CompletionStatus, QueuePairBuilder, QueuePairEndpoint, QueuePairState,
    QueuePairStatus, ReceiveRequest, WorkCompletion,
};
use crate::VerbsError;
use remora_wire::{
    BthRepr, EthernetRepr, ExtensionHeaders, FlowTemplate, Ipv4Address, Ipv4Repr, MacAddress,
    Opcode, Psn, Qpn, RoceFrame, UdpRepr, ETHERTYPE_IPV4, ROCEV2_UDP_PORT,
};
use requester::Requester;
use responder::Responder;

/// What a packet's BTH says beyond its path: its opcode, its PSN, and
/// the two flags a requester sets per packet.
#[derive(Debug, Clone, Copy)]
struct PacketHeader {
    opcode: Opcode,
    psn: Psn,
    ack_request: bool,
    solicited_event: bool,
}

impl PacketHeader {
    /// A header with neither flag: every answer a responder sends.
    fn new(opcode: Opcode, psn: Psn) -> PacketHeader {
        PacketHeader {
            opcode,
            psn,
            ack_request: false,
            solicited_event: false,
        }
    }
}

/// Addressing for every frame a queue pair sends, fixed at RTR.
#[derive(Debug, Clone, Copy)]
struct Path {
    template: FlowTemplate,
    destination_qp: Qpn,
}

impl Path {
    fn new(
        local_mac: MacAddress,
        local_ip: Ipv4Address,
        qpn: Qpn,
        remote: &QueuePairEndpoint,
    ) -> Path {
        let ethernet = EthernetRepr {
            source: local_mac,
            destination: remote.mac,
            ethertype: ETHERTYPE_IPV4,
        };
        let ipv4 = Ipv4Repr::rocev2(local_ip, remote.address);
        let udp = UdpRepr {
            // The source port is flow entropy for ECMP; derive it from the
            // QPN so each connection hashes consistently.
            source_port: 0xc000 | (qpn.value() as u16 & 0x3fff),
            destination_port: ROCEV2_UDP_PORT,
            payload_len: 0,
        };
        Path {
            template: FlowTemplate::new(&ethernet, &ipv4, &udp),
            destination_qp: remote.qpn,
        }
    }

    /// Emits one frame to the peer; `fill` writes the payload in place.
    fn emit(
        &self,
        header: PacketHeader,
        extension: &ExtensionHeaders,
        payload_len: usize,
        buffer: &mut [u8],
        fill: impl FnOnce(&mut [u8]),
    ) -> usize {
        let mut bth = BthRepr::new(header.opcode, self.destination_qp, header.psn);
        bth.ack_request = header.ack_request;
        bth.solicited_event = header.solicited_event;
        self.template
            .emit(&bth, extension, payload_len, buffer, fill)
            .expect("the device transmit buffer holds any frame")
    }
}

#[derive(Debug)]
pub(crate) struct QueuePairContext {
    qpn: Qpn,
    state: QueuePairState,
    attributes: QueuePairBuilder,
    local_mac: MacAddress,
    local_ip: Ipv4Address,
    initial_psn: Psn,
    remote: Option<QueuePairEndpoint>,
    path: Option<Path>,
    receive_queue: BoundedQueue<ReceiveRequest>,
    requester: Requester,
    responder: Responder,
}

impl QueuePairContext {
    /// Bytes the responder's replay slots hold for READ snapshots.
    pub(crate) fn replay_bytes_held(&self) -> usize {
        self.responder.replay_bytes_held()
    }

    pub(crate) fn new(
        qpn: Qpn,
        attributes: QueuePairBuilder,
        local_mac: MacAddress,
        local_ip: Ipv4Address,
        initial_psn: Psn,
    ) -> QueuePairContext {
        QueuePairContext {
            qpn,
            state: QueuePairState::Reset,
            attributes,
            local_mac,
            local_ip,
            initial_psn,
            remote: None,
            path: None,
            receive_queue: BoundedQueue::new("receive queue", attributes.receive_queue_depth),
            requester: Requester::new(&attributes, initial_psn),
            responder: Responder::new(&attributes),
        }
    }

    pub(crate) fn state(&self) -> QueuePairState {
        self.state
    }

    pub(crate) fn set_remote_access(&mut self, access: crate::verbs::AccessFlags) {
        self.attributes.remote_access = access;
    }

    /// The completion queues its sends and its receives complete into.
    pub(crate) fn completion_queues(&self) -> [crate::verbs::CompletionQueue; 2] {
        [
            self.attributes.send_completion_queue,
            self.attributes.receive_completion_queue,
        ]
    }

    /// True if this queue pair completes work into `queue`.
    pub(crate) fn qpn(&self) -> Qpn {
        self.qpn
    }

    pub(crate) fn uses_shared_receive_queue(
        &self,
        queue: crate::verbs::SharedReceiveQueue,
    ) -> bool {
        self.attributes.shared_receive_queue == Some(queue)
    }

    pub(crate) fn uses_completion_queue(&self, queue: crate::verbs::CompletionQueue) -> bool {
        self.attributes.send_completion_queue == queue
            || self.attributes.receive_completion_queue == queue
    }

    pub(crate) fn endpoint(&self) -> QueuePairEndpoint {
        QueuePairEndpoint {
            qpn: self.qpn,
            address: self.local_ip,
            mac: self.local_mac,
            initial_psn: self.initial_psn,
        }
    }

    pub(crate) fn remote(&self) -> Option<&QueuePairEndpoint> {
        self.remote.as_ref()
    }

    /// Applies an `ibv_modify_qp`-style transition.
    pub(crate) fn transition(
        &mut self,
        to: QueuePairState,
        remote: Option<QueuePairEndpoint>,
        resources: &mut Resources,
    ) -> Result<(), VerbsError> {
        use QueuePairState::*;
        let allowed = matches!(
            (self.state, to),
            (Reset, Init)
                | (Init, ReadyToReceive)
                | (ReadyToReceive, ReadyToSend)
                // IB allows RTS → RTS to change attributes of a live queue
                // pair (timers, access flags); its state stays as it is.
                | (ReadyToSend, ReadyToSend)
                | (_, Error)
                | (_, Reset)
        );
        if !allowed {
            return Err(VerbsError::InvalidTransition {
                from: self.state,
                to,
            });
        }
        match to {
            ReadyToReceive => {
                let remote = remote.expect("RTR carries the remote endpoint");
                self.responder.start(remote.initial_psn);
                self.path = Some(Path::new(self.local_mac, self.local_ip, self.qpn, &remote));
                self.remote = Some(remote);
            }
            Error => self.enter_error(resources),
            Reset => self.reset(),
            Init | ReadyToSend => {}
        }
        self.state = to;
        Ok(())
    }

    /// See [`crate::SoftRnic::set_retransmission`].
    pub(crate) fn set_retransmission(
        &mut self,
        timeout: Option<std::time::Duration>,
        retry_count: Option<u8>,
    ) {
        if let Some(timeout) = timeout {
            self.attributes.timeout = timeout;
        }
        if let Some(retry_count) = retry_count {
            self.attributes.retry_count = retry_count;
            self.requester.retries_left = retry_count;
        }
    }

    /// See [`crate::SoftRnic::set_rnr_retry`].
    pub(crate) fn set_rnr_retry(&mut self, rnr_retry: u8) {
        self.attributes.rnr_retry = rnr_retry;
        self.requester.rnr_retries_left = rnr_retry;
    }

    pub(crate) fn path_attributes(&self) -> crate::verbs::PathAttributes {
        crate::verbs::PathAttributes {
            path_mtu: Some(self.attributes.path_mtu),
            max_read_atomic: Some(self.attributes.max_read_atomic),
            max_destination_read_atomic: Some(self.attributes.max_destination_read_atomic),
            min_rnr_timer: Some(self.attributes.min_rnr_timer),
        }
    }

    /// Sets its path and flow attributes (the device checked the limits).
    pub(crate) fn set_path_attributes(
        &mut self,
        attributes: crate::verbs::PathAttributes,
    ) -> Result<(), VerbsError> {
        let fixed = matches!(
            self.state,
            QueuePairState::ReadyToSend | QueuePairState::Error
        ) || self.responder.has_received();
        let fixed_attribute = if attributes.path_mtu.is_some() {
            Some("path_mtu")
        } else if attributes.max_destination_read_atomic.is_some() {
            Some("max_destination_read_atomic")
        } else {
            None
        };
        if let (true, Some(attribute)) = (fixed, fixed_attribute) {
            return Err(VerbsError::AttributeFixed { attribute });
        }
        if let Some(path_mtu) = attributes.path_mtu {
            self.attributes.path_mtu = path_mtu;
        }
        if let Some(limit) = attributes.max_read_atomic {
            // Lowered below what is outstanding, it holds back new READs
            // and atomics until enough are answered.
            self.attributes.max_read_atomic = limit;
        }
        if let Some(limit) = attributes.max_destination_read_atomic {
            self.attributes.max_destination_read_atomic = limit;
            self.responder.serve_read_atomic(limit);
        }
        if let Some(wait) = attributes.min_rnr_timer {
            self.attributes.min_rnr_timer = wait;
        }
        Ok(())
    }

    /// Sets the send PSN on the way from RTR to RTS (`IBV_QP_SQ_PSN`).
    pub(crate) fn send_from(&mut self, send_psn: Psn) -> Result<(), VerbsError> {
        if self.state != QueuePairState::ReadyToReceive {
            return Err(VerbsError::InvalidTransition {
                from: self.state,
                to: QueuePairState::ReadyToSend,
            });
        }
        self.requester = Requester::new(&self.attributes, send_psn);
        Ok(())
    }

    pub(crate) fn status(&self) -> QueuePairStatus {
        QueuePairStatus {
            state: self.state,
            remote: self.remote,
            resume_psn: self.requester.resume_psn(),
            expected_psn: self.responder.expected_psn(),
        }
    }

    fn reset(&mut self) {
        let fresh = QueuePairContext::new(
            self.qpn,
            self.attributes,
            self.local_mac,
            self.local_ip,
            self.initial_psn,
        );
        *self = fresh;
    }

    /// Moves to ERR and flushes every outstanding work request. Queued
    /// responder output (a NAK explaining the error) still goes out.
    pub(crate) fn enter_error(&mut self, resources: &mut Resources) {
        self.state = QueuePairState::Error;
        self.requester.flush(self.qpn, &self.attributes, resources);
        // A SEND under way holds the oldest receive: it is flushed first.
        let in_progress = self.responder.take_receive_in_progress();
        let queued = std::iter::from_fn(|| self.receive_queue.pop());
        for request in in_progress.into_iter().chain(queued) {
            let completion = WorkCompletion {
                work_request_id: request.work_request_id,
                status: CompletionStatus::WorkRequestFlushError,
                opcode: CompletionOpcode::Receive,
                qpn: self.qpn,
                byte_len: 0,
                immediate: None,
                solicited: false,
            };
            resources.complete(self.attributes.receive_completion_queue, completion);
        }
    }

    pub(crate) fn post_receive(
        &mut self,
        request: ReceiveRequest,
        resources: &mut Resources,
    ) -> Result<(), VerbsError> {
        if self.attributes.shared_receive_queue.is_some() {
            return Err(VerbsError::InvalidState {
                operation: "post_receive on a queue pair bound to an SRQ",
                state: self.state,
            });
        }
        if self.state == QueuePairState::Reset {
            return Err(VerbsError::InvalidState {
                operation: "post_receive",
                state: self.state,
            });
        }
        resources.memory.check_local_list(
            self.attributes.protection_domain,
            &request.local,
            true,
        )?;
        self.receive_queue.push(request)?;
        if self.state == QueuePairState::Error {
            // Work posted to a queue pair in error completes at once, flushed.
            self.enter_error(resources);
        }
        Ok(())
    }

    pub(crate) fn handle_frame(
        &mut self,
        now: Timestamp,
        frame: &RoceFrame<'_>,
        resources: &mut Resources,
    ) {
        let ready = matches!(
            self.state,
            QueuePairState::ReadyToReceive | QueuePairState::ReadyToSend
        );
        if !ready {
            resources
                .counters
                .count_drop(crate::DropReason::QueuePairNotReady);
            return;
        }
        if frame.bth().opcode.is_request() {
            self.handle_request(frame, resources);
        } else {
            self.handle_response(now, frame, resources);
        }
    }

    /// Writes the next frame this queue pair wants to send, if any:
    /// responses first, so a busy requester never starves its peer.
    pub(crate) fn poll_transmit(
        &mut self,
        now: Timestamp,
        resources: &mut Resources,
        buffer: &mut [u8],
    ) -> Option<usize> {
        let path = self.path?;
        if let Some(len) = self.poll_response(&path, resources, buffer) {
            return Some(len);
        }
        if self.state != QueuePairState::ReadyToSend {
            return None;
        }
        self.poll_request(now, &path, resources, buffer)
    }

    pub(crate) fn poll_timeout(&self) -> Option<Timestamp> {
        if self.state != QueuePairState::ReadyToSend {
            return None;
        }
        self.requester.poll_timeout()
    }
}
