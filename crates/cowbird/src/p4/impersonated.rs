//! The requester half of a queue pair the switch impersonates.
//!
//! A host's queue pair in a Cowbird-P4 deployment is connected to a peer
//! that does not exist: the switch plays it, sending requests with the
//! PSNs the host's responder expects and taking the answers. This is that
//! peer's state, in registers: the next PSN, the last PSN the host is
//! known to have executed, and, per PSN in flight, what was sent and why
//! (a register array indexed by PSN, which is where the stashed addresses
//! live). A response is accepted only in PSN order, as a real requester
//! does; anything else is a duplicate or a sign of loss.
//!
//! Go-Back-N: after a loss the switch walks the unacknowledged PSNs again,
//! one per generator packet. READs are regenerated exactly (same address,
//! same length, same PSN), so a host that already ran one answers from its
//! replay cache. A WRITE cannot be regenerated, because its payload came
//! from a response the switch no longer has, so it is replaced by a filler
//! of the same shape: zero-length when it was a single packet, zeros of the
//! same length in the middle of a multi-packet message (so the host's
//! responder sees a well-formed sequence, whatever it had received). Either
//! the original or the filler executes at that PSN, never both; the
//! request whose payload was lost is redone later at fresh PSNs.

use remora_rnic::{Mtu, Timestamp};
use remora_switch::register::RegisterArray;
use remora_switch::resources::RegisterResources;
use remora_switch::PortId;
use remora_wire::frame::{ExtensionHeaders, FlowTemplate};
use remora_wire::opcode::Segment;
use remora_wire::{
    AckSyndrome, BthRepr, EthernetRepr, Ipv4Address, Ipv4Repr, MacAddress, NakCode, Opcode, Psn,
    Qpn, RethRepr, Rkey, UdpRepr, VirtAddr,
};

/// PSNs one impersonated queue pair keeps in flight: the size of its
/// register array.
pub const WINDOW_PACKETS: u32 = 256;

/// Why a PSN was sent: what its answer means to the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Purpose {
    #[default]
    Unused,
    /// READ of the client words (Phase II).
    Probe,
    /// READ of one request metadata entry.
    Metadata { entry: u64 },
    /// READ of a write's payload from the compute node's request data ring.
    Payload { entry: u64 },
    /// READ of a read's bytes from the memory pool.
    DataRead { entry: u64 },
    /// WRITE of a read's bytes into the response ring; `last` on its
    /// final packet.
    ResponseWrite { entry: u64, last: bool },
    /// WRITE of a write's payload into the memory pool; `last` on its
    /// final packet.
    DataWrite { entry: u64, last: bool },
    /// WRITE of the engine words (Phase IV).
    Bookkeeping,
    /// A go-back's stand-in for a WRITE that cannot be regenerated.
    Filler,
}

/// The request a PSN carried, enough to send it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sent {
    pub purpose: Purpose,
    /// Read request, or the segment of a WRITE message.
    pub write_segment: Option<Segment>,
    /// For a READ, where this PSN's answer starts (a READ spanning several
    /// response packets records its resume point at each of its PSNs);
    /// for the first packet of a WRITE, its RETH.
    pub remote: VirtAddr,
    pub rkey: Rkey,
    pub length: u32,
    pub payload_bytes: u32,
}

/// The host side of an impersonated connection.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    pub port: PortId,
    pub mac: MacAddress,
    pub address: Ipv4Address,
    pub qpn: Qpn,
    /// The PSN the host's responder expects first.
    pub initial_psn: Psn,
}

/// What an answer did to the queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// An earlier PSN again, or one never sent: nothing to do.
    Duplicate,
    /// The next READ response in order: what its PSN was for.
    ReadResponse(Sent),
    /// An ACK covering PSNs up to this one, all WRITEs.
    Acknowledged,
    /// A READ response past WRITEs not yet acknowledged: in RC the host
    /// executes in order, so it executed them, through this PSN (an ACK
    /// of them lost or coalesced). Or a sequence NAK past WRITEs: the
    /// host executed everything before the PSN it names, READs whose
    /// answers are missing included. Account them with
    /// [`ImpersonatedQueuePair::take_acknowledged`], then hand the
    /// answer in again.
    WritesImplied { through: Psn },
    /// Something was lost or refused: go back. A sequence NAK says where
    /// the host's responder stands.
    Lost { resume: Option<Psn> },
    /// The host refused a request for good (its queue pair is in error).
    Refused(NakCode),
}

pub struct ImpersonatedQueuePair {
    flow: FlowTemplate,
    peer: Peer,
    mtu: Mtu,
    next: Psn,
    /// The last PSN the host is known to have executed.
    acked: Psn,
    sent: RegisterArray<Sent>,
    /// When the oldest unacknowledged PSN last moved, for the data-plane
    /// timeout.
    progress_at: Timestamp,
    /// During a go-back: the next PSN to send again.
    retransmit: Option<Psn>,
    /// Bytes of a multi-packet WRITE still to go: while any are, nothing
    /// else may go between its packets, or the host's responder refuses
    /// the sequence.
    message_bytes_left: u32,
}

impl ImpersonatedQueuePair {
    pub fn new(
        name: &'static str,
        stage: u8,
        own: (MacAddress, Ipv4Address),
        source_port: u16,
        peer: Peer,
        mtu: Mtu,
    ) -> ImpersonatedQueuePair {
        let ethernet = EthernetRepr {
            source: own.0,
            destination: peer.mac,
            ethertype: remora_wire::ETHERTYPE_IPV4,
        };
        let udp = UdpRepr {
            source_port,
            destination_port: remora_wire::ROCEV2_UDP_PORT,
            payload_len: 0,
        };
        ImpersonatedQueuePair {
            flow: FlowTemplate::new(&ethernet, &Ipv4Repr::rocev2(own.1, peer.address), &udp),
            peer,
            mtu,
            next: peer.initial_psn,
            acked: peer.initial_psn.sub(1),
            sent: RegisterArray::new(name, stage, WINDOW_PACKETS as usize),
            progress_at: Timestamp::ZERO,
            retransmit: None,
            message_bytes_left: 0,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "next {} acked {} retransmit {:?} message bytes left {} since {:?}",
            self.next.value(),
            self.acked.value(),
            self.retransmit.map(Psn::value),
            self.message_bytes_left,
            self.progress_at
        )
    }

    /// The host's address: whose memory this queue pair reaches.
    pub fn peer_address(&self) -> Ipv4Address {
        self.peer.address
    }

    pub fn port(&self) -> PortId {
        self.peer.port
    }

    /// The host this queue pair is connected to.
    pub fn peer(&self) -> Peer {
        self.peer
    }

    pub fn resources(&self) -> RegisterResources {
        self.sent.resources()
    }

    fn slot(psn: Psn) -> usize {
        (psn.value() % WINDOW_PACKETS) as usize
    }

    fn record(&self, psn: Psn) -> Sent {
        self.sent.read(Self::slot(psn)).expect("slot in range")
    }

    /// PSNs sent and not yet known executed.
    pub fn in_flight(&self) -> u32 {
        self.acked.add(1).distance_to(self.next) as u32
    }

    /// Whether `packets` more PSNs fit the window and nothing would split
    /// an open multi-packet WRITE.
    pub fn has_room(&self, packets: u32) -> bool {
        self.message_bytes_left == 0
            && self.retransmit.is_none()
            && self.in_flight() + packets < WINDOW_PACKETS
    }

    /// Whether a WRITE continuing the open message may go (it needs no
    /// room check of its own: its PSN was reserved by the first packet's
    /// caller through `has_room` on the whole message).
    pub fn can_continue_message(&self) -> bool {
        self.message_bytes_left > 0 && self.retransmit.is_none()
    }

    fn packets_of(&self, sent: &Sent) -> u32 {
        match sent.write_segment {
            None => self.mtu.packets_for(sent.length),
            Some(_) => 1,
        }
    }

    /// Assigns the next PSN(s) to `sent` and writes the frame into `out`;
    /// `payload` fills the payload bytes (`sent.payload_bytes` of them).
    pub fn send(
        &mut self,
        now: Timestamp,
        sent: Sent,
        out: &mut Vec<u8>,
        payload: impl FnOnce(&mut [u8]),
    ) -> Psn {
        let psn = self.next;
        let packets = self.packets_of(&sent);
        assert!(
            self.in_flight() + packets <= WINDOW_PACKETS,
            "caller checked room"
        );
        if self.in_flight() == 0 {
            self.progress_at = now;
        }
        self.remember(psn, sent);
        self.next = psn.add(packets);
        self.message_bytes_left = match sent.write_segment {
            Some(Segment::First) => sent.length.saturating_sub(sent.payload_bytes),
            Some(Segment::Middle) => self.message_bytes_left.saturating_sub(sent.payload_bytes),
            _ => 0,
        };
        self.emit(psn, &sent, out, payload);
        psn
    }

    /// Records `sent` at `psn` and, for a READ answered in several packets,
    /// its resume point at each later PSN.
    fn remember(&mut self, psn: Psn, sent: Sent) {
        let packets = self.packets_of(&sent);
        for index in 0..packets {
            let skipped = (index * self.mtu.bytes()).min(sent.length);
            // Saturating: a client's entry may name an address near the
            // top (the memory node refuses it with a NAK, which fails
            // that instance), and a switch must not panic on it.
            let resume = Sent {
                remote: VirtAddr(sent.remote.0.saturating_add(u64::from(skipped))),
                length: sent.length - skipped,
                ..sent
            };
            self.sent.update(Self::slot(psn.add(index)), |_| resume);
        }
    }

    fn emit(&self, psn: Psn, sent: &Sent, out: &mut Vec<u8>, payload: impl FnOnce(&mut [u8])) {
        let (opcode, has_reth) = match sent.write_segment {
            None => (Opcode::RdmaReadRequest, true),
            Some(Segment::Only) => (Opcode::RdmaWriteOnly, true),
            Some(Segment::First) => (Opcode::RdmaWriteFirst, true),
            Some(Segment::Middle) => (Opcode::RdmaWriteMiddle, false),
            Some(Segment::Last) => (Opcode::RdmaWriteLast, false),
        };
        let mut bth = BthRepr::new(opcode, self.peer.qpn, psn);
        bth.ack_request = matches!(sent.write_segment, Some(Segment::Only | Segment::Last));
        let extension = ExtensionHeaders {
            reth: has_reth.then_some(RethRepr {
                virtual_address: sent.remote,
                rkey: sent.rkey,
                dma_length: sent.length,
            }),
            ..ExtensionHeaders::default()
        };
        // Sized to the frame: zeroing a whole MAX_FRAME_LEN per frame
        // was a tenth of the fabric thread's time.
        out.resize(
            remora_wire::frame::frame_len(opcode, sent.payload_bytes as usize),
            0,
        );
        let length = self
            .flow
            .emit(&bth, &extension, sent.payload_bytes as usize, out, payload)
            .expect("the engine's headers fit a frame");
        out.truncate(length);
    }

    /// Takes an answer from the host, in normal operation.
    pub fn handle_answer(
        &mut self,
        now: Timestamp,
        opcode: Opcode,
        psn: Psn,
        aeth: Option<AckSyndrome>,
    ) -> Answer {
        if let Some(AckSyndrome::Nak(code)) = aeth {
            // A refusal names the request refused, which is in flight; a
            // NAK for any other PSN is a ghost, late or not
            // ours, and ignored rather than allowed to stop the instance.
            if code != NakCode::PsnSequenceError && !self.is_outstanding(psn) {
                return Answer::Duplicate;
            }
            if code == NakCode::PsnSequenceError {
                if let Some(through) = self.writes_executed_before(psn) {
                    return Answer::WritesImplied { through };
                }
            }
            return match code {
                // A NAK for a PSN the host has since been seen to execute:
                // late or duplicated on the way (a full go-back for it
                // resent the whole window).
                NakCode::PsnSequenceError if !self.is_outstanding(psn) && psn != self.next => {
                    Answer::Duplicate
                }
                NakCode::PsnSequenceError => Answer::Lost {
                    resume: self.is_outstanding(psn).then_some(psn),
                },
                refusal => Answer::Refused(refusal),
            };
        }
        if !self.is_outstanding(psn) {
            return Answer::Duplicate;
        }
        if !matches!(aeth, None | Some(AckSyndrome::Ack { .. })) {
            // Receiver-not-ready: the engine posts no SENDs, so it cannot
            // be for us; treat as loss.
            return Answer::Lost { resume: None };
        }
        if opcode == Opcode::Acknowledge {
            return self.acknowledge(psn);
        }
        if self.record(psn).write_segment.is_some() {
            return Answer::Lost { resume: None };
        }
        if psn != self.acked.add(1) {
            let through = psn.sub(1);
            // A response past a READ whose own response is missing means
            // that one was lost.
            return match self.acknowledge(through) {
                Answer::Acknowledged => Answer::WritesImplied { through },
                lost => lost,
            };
        }
        self.advance(now, psn);
        Answer::ReadResponse(self.record(psn))
    }

    /// A sequence NAK naming `psn` says the host executed every PSN
    /// before it: every unconfirmed WRITE among them is confirmed by it,
    /// those after a READ whose answer is missing too (left unconfirmed,
    /// the go-back fetched and landed them again, which could undo another
    /// instance's write to the same bytes in between). The PSN before
    /// `psn`, if any WRITE is among them: the READs it passes are redone
    /// by the go-back that the NAK, handed in again, starts.
    fn writes_executed_before(&self, psn: Psn) -> Option<Psn> {
        let named_in_window = self.is_outstanding(psn) || psn == self.next;
        if !named_in_window || psn == self.acked.add(1) {
            return None;
        }
        let executed = self.acked.distance_to(psn.sub(1)) as u32;
        let any_write =
            (1..=executed).any(|step| self.record(self.acked.add(step)).write_segment.is_some());
        any_write.then(|| psn.sub(1))
    }

    fn is_outstanding(&self, psn: Psn) -> bool {
        self.acked.precedes(psn) && psn.precedes(self.next)
    }

    /// An ACK up to `psn`: fine if every PSN it covers was a WRITE (a READ
    /// among them lost its response).
    fn acknowledge(&self, psn: Psn) -> Answer {
        let covered = self.acked.distance_to(psn) as u32;
        let all_writes =
            (1..=covered).all(|step| self.record(self.acked.add(step)).write_segment.is_some());
        if !all_writes {
            return Answer::Lost { resume: None };
        }
        Answer::Acknowledged
    }

    /// The PSNs an accepted ACK covers, oldest first, for the caller to
    /// account; then marks them executed.
    pub fn take_acknowledged(&mut self, now: Timestamp, psn: Psn, mut each: impl FnMut(Sent)) {
        let covered = self.acked.distance_to(psn) as u32;
        assert!(
            covered <= WINDOW_PACKETS,
            "an accepted ACK lies in the window"
        );
        for step in 1..=covered {
            each(self.record(self.acked.add(step)));
        }
        self.advance(now, psn);
    }

    fn advance(&mut self, now: Timestamp, psn: Psn) {
        self.acked = psn;
        self.progress_at = now;
    }

    /// Whether the oldest unacknowledged PSN has waited longer than
    /// `timeout`.
    pub fn timed_out(&self, now: Timestamp, timeout: std::time::Duration) -> bool {
        self.in_flight() > 0 && now.saturating_duration_since(self.progress_at) > timeout
    }

    /// Starts a go-back at `resume` (a sequence NAK's PSN) or at the first
    /// unacknowledged PSN.
    pub fn go_back(&mut self, now: Timestamp, resume: Option<Psn>) {
        if let Some(resume) =
            resume.filter(|psn| self.acked.precedes(*psn) && psn.precedes_or_equals(self.next))
        {
            self.acked = resume.sub(1);
        }
        self.close_open_message();
        self.retransmit = Some(self.acked.add(1));
        self.progress_at = now;
    }

    /// A go-back in the middle of a multi-packet WRITE: the rest of the
    /// message is recorded as fillers, so the PSNs sent again form whole
    /// messages whatever the host had received.
    fn close_open_message(&mut self) {
        let mtu = self.mtu.bytes();
        // Bounded: each step sends at least one byte of what is left, and
        // the message's PSNs were reserved when it began.
        while self.message_bytes_left > 0 {
            let payload_bytes = self.message_bytes_left.min(mtu);
            self.message_bytes_left -= payload_bytes;
            let segment = if self.message_bytes_left > 0 {
                Segment::Middle
            } else {
                Segment::Last
            };
            let filler = Sent {
                purpose: Purpose::Filler,
                write_segment: Some(segment),
                payload_bytes,
                ..Sent::default()
            };
            self.sent.update(Self::slot(self.next), |_| filler);
            self.next = self.next.add(1);
        }
    }

    /// During a go-back: an answer only tells how far the host got.
    pub fn handle_answer_recovering(
        &mut self,
        now: Timestamp,
        psn: Psn,
        aeth: Option<AckSyndrome>,
    ) -> Option<NakCode> {
        match aeth {
            Some(AckSyndrome::Nak(NakCode::PsnSequenceError)) => {
                if self.acked.precedes(psn) && psn.precedes_or_equals(self.next) {
                    self.acked = psn.sub(1);
                    self.retransmit = Some(psn);
                    self.progress_at = now;
                }
                None
            }
            // As in normal operation: only a request in flight is refused.
            Some(AckSyndrome::Nak(code)) => self.is_outstanding(psn).then_some(code),
            _ => {
                if self.is_outstanding(psn) {
                    self.advance(now, psn);
                }
                None
            }
        }
    }

    /// During a go-back: writes the next stand-in into `out`, if any PSN
    /// is left to send again.
    pub fn poll_retransmit(&mut self, out: &mut Vec<u8>) -> bool {
        let Some(psn) = self.retransmit else {
            return false;
        };
        // Answers to originals may have settled PSNs since the go-back began.
        let psn = if self.acked.precedes(psn) {
            psn
        } else {
            self.acked.add(1)
        };
        self.retransmit = Some(psn);
        if !psn.precedes(self.next) {
            return false;
        }
        let original = self.record(psn);
        let stand_in = Self::stand_in(original);
        self.emit(psn, &stand_in, out, |bytes| bytes.fill(0));
        self.sent
            .update(Self::slot(psn), |_| stand_in_record(original, stand_in));
        self.retransmit = Some(psn.add(self.packets_of(&stand_in)));
        true
    }

    /// What goes out again at an original's PSN.
    fn stand_in(original: Sent) -> Sent {
        match original.write_segment {
            None => original,
            Some(Segment::Only) => Sent {
                purpose: Purpose::Filler,
                length: 0,
                payload_bytes: 0,
                ..original
            },
            Some(_) => Sent {
                purpose: Purpose::Filler,
                ..original
            },
        }
    }

    /// Whether a go-back has sent everything and the host acknowledged it.
    pub fn is_recovered(&self) -> bool {
        self.retransmit.is_some_and(|psn| !psn.precedes(self.next)) && self.in_flight() == 0
    }

    /// Whether a go-back has sent everything but answers are missing for
    /// longer than `timeout`: go back again.
    pub fn recovery_stalled(&self, now: Timestamp, timeout: std::time::Duration) -> bool {
        self.retransmit.is_some_and(|psn| !psn.precedes(self.next)) && self.timed_out(now, timeout)
    }

    pub fn finish_recovery(&mut self) {
        assert!(self.is_recovered());
        self.retransmit = None;
    }
}

/// A READ keeps its purpose (its answer is ignored during the go-back
/// anyway); a WRITE's record becomes the filler's.
fn stand_in_record(original: Sent, stand_in: Sent) -> Sent {
    match original.write_segment {
        None => original,
        Some(_) => stand_in,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_wire::RoceFrame;

    fn queue_pair() -> ImpersonatedQueuePair {
        let peer = Peer {
            port: PortId(0),
            mac: MacAddress([2, 0, 0, 0, 0, 1]),
            address: Ipv4Address::new(10, 0, 0, 1),
            qpn: Qpn::new(0x11).expect("24 bits"),
            initial_psn: Psn::new(100),
        };
        let own = (
            MacAddress([2, 0, 0, 0, 0, 0xfe]),
            Ipv4Address::new(10, 0, 0, 254),
        );
        ImpersonatedQueuePair::new("psns", 2, own, 0xc000, peer, Mtu::MTU_1024)
    }

    fn read(entry: u64, length: u32) -> Sent {
        Sent {
            purpose: Purpose::DataRead { entry },
            write_segment: None,
            remote: VirtAddr(0x1000),
            rkey: Rkey(7),
            length,
            payload_bytes: 0,
        }
    }

    fn write(segment: Segment, payload_bytes: u32, length: u32) -> Sent {
        Sent {
            purpose: Purpose::ResponseWrite {
                entry: 1,
                last: matches!(segment, Segment::Only | Segment::Last),
            },
            write_segment: Some(segment),
            remote: VirtAddr(0x2000),
            rkey: Rkey(9),
            length,
            payload_bytes,
        }
    }

    const ACK: Option<AckSyndrome> = Some(AckSyndrome::Ack { credit_count: 31 });

    /// A sequence NAK names the PSN the host waits for: it executed every
    /// one before. A WRITE among them whose ACK was lost stayed
    /// unconfirmed, and the go-back landed it again, which could undo
    /// another instance's write to the same bytes in between. The NAK
    /// confirms it first.
    #[test]
    fn a_sequence_nak_past_unacknowledged_writes_acknowledges_them() {
        let mut queue_pair = queue_pair();
        let mut out = Vec::new();
        let now = Timestamp::ZERO;
        let write_psn = queue_pair.send(now, write(Segment::Only, 8, 8), &mut out, |bytes| {
            bytes.fill(1)
        });
        assert_eq!(write_psn, Psn::new(100));
        // The READ at 101 is lost; the host NAKs the gap it opened.
        queue_pair.send(now, read(1, 64), &mut out, |_| {});
        let nak = Some(AckSyndrome::Nak(NakCode::PsnSequenceError));
        assert_eq!(
            queue_pair.handle_answer(now, Opcode::Acknowledge, Psn::new(101), nak),
            Answer::WritesImplied {
                through: Psn::new(100)
            }
        );
        queue_pair.take_acknowledged(now, Psn::new(100), |_| {});
        assert_eq!(
            queue_pair.handle_answer(now, Opcode::Acknowledge, Psn::new(101), nak),
            Answer::Lost {
                resume: Some(Psn::new(101))
            }
        );
    }

    /// A READ among the PSNs a sequence NAK covers (its answer lost, the
    /// usual case) kept every WRITE before it unconfirmed: only a NAK
    /// past WRITEs alone confirmed them. Then only the WRITEs up to the
    /// first READ were, and the one after it (executed: the host waits
    /// for 104) was landed again by the go-back. Every WRITE before the
    /// named PSN is confirmed; the READ is left to the go-back.
    #[test]
    fn a_sequence_nak_confirms_the_writes_after_a_read_too() {
        let mut queue_pair = queue_pair();
        let mut out = Vec::new();
        let now = Timestamp::ZERO;
        for _ in 0..2 {
            queue_pair.send(now, write(Segment::Only, 8, 8), &mut out, |bytes| {
                bytes.fill(1)
            });
        }
        queue_pair.send(now, read(1, 64), &mut out, |_| {});
        queue_pair.send(now, write(Segment::Only, 8, 8), &mut out, |bytes| {
            bytes.fill(2)
        });
        // The host waits for 104: it executed 100 to 103, the READ at 102
        // included (its answer lost).
        let nak = Some(AckSyndrome::Nak(NakCode::PsnSequenceError));
        assert_eq!(
            queue_pair.handle_answer(now, Opcode::Acknowledge, Psn::new(104), nak),
            Answer::WritesImplied {
                through: Psn::new(103)
            }
        );
        let mut seen = Vec::new();
        queue_pair.take_acknowledged(now, Psn::new(103), |sent| seen.push(sent.write_segment));
        let only = Some(Segment::Only);
        assert_eq!(seen, [only, only, None, only]);
        // Handed in again, the NAK is a loss: the READ is redone.
        assert_eq!(
            queue_pair.handle_answer(now, Opcode::Acknowledge, Psn::new(104), nak),
            Answer::Lost { resume: None }
        );
    }

    #[test]
    fn a_read_takes_a_psn_per_response_packet_and_answers_count_in_order() {
        let mut queue_pair = queue_pair();
        let mut out = Vec::new();
        let psn = queue_pair.send(Timestamp::ZERO, read(1, 2500), &mut out, |_| {});
        assert_eq!(psn, Psn::new(100));
        assert_eq!(queue_pair.in_flight(), 3);
        let frame = RoceFrame::new_checked(&out).expect("a valid READ");
        assert_eq!(frame.reth().expect("RETH").dma_length, 2500);
        let now = Timestamp::ZERO;
        let first = Opcode::RdmaReadResponseFirst;
        match queue_pair.handle_answer(now, first, Psn::new(100), ACK) {
            Answer::ReadResponse(sent) => assert_eq!(sent.remote, VirtAddr(0x1000)),
            other => panic!("{other:?}"),
        }
        // The last packet before the middle one: the middle was lost.
        let last = Opcode::RdmaReadResponseLast;
        assert_eq!(
            queue_pair.handle_answer(now, last, Psn::new(102), ACK),
            Answer::Lost { resume: None }
        );
        let middle = Opcode::RdmaReadResponseMiddle;
        match queue_pair.handle_answer(now, middle, Psn::new(101), None) {
            Answer::ReadResponse(sent) => {
                assert_eq!((sent.remote, sent.length), (VirtAddr(0x1400), 2500 - 1024))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            queue_pair.handle_answer(now, middle, Psn::new(101), None),
            Answer::Duplicate
        );
    }

    #[test]
    fn an_ack_covers_writes_only_and_names_them_oldest_first() {
        let mut queue_pair = queue_pair();
        let mut out = Vec::new();
        let now = Timestamp::ZERO;
        queue_pair.send(now, write(Segment::Only, 8, 8), &mut out, |bytes| {
            bytes.fill(1)
        });
        queue_pair.send(now, write(Segment::Only, 8, 8), &mut out, |bytes| {
            bytes.fill(2)
        });
        let ack = Opcode::Acknowledge;
        assert_eq!(
            queue_pair.handle_answer(now, ack, Psn::new(101), ACK),
            Answer::Acknowledged
        );
        let mut seen = Vec::new();
        queue_pair.take_acknowledged(now, Psn::new(101), |sent| seen.push(sent.write_segment));
        assert_eq!(seen, [Some(Segment::Only); 2]);
        assert_eq!(queue_pair.in_flight(), 0);
        // An ACK past a READ means the READ's answer went missing.
        queue_pair.send(now, read(2, 64), &mut out, |_| {});
        queue_pair.send(now, write(Segment::Only, 8, 8), &mut out, |_| {});
        assert_eq!(
            queue_pair.handle_answer(now, ack, Psn::new(103), ACK),
            Answer::Lost { resume: None }
        );
        let nak = Some(AckSyndrome::Nak(NakCode::PsnSequenceError));
        assert_eq!(
            queue_pair.handle_answer(now, ack, Psn::new(102), nak),
            Answer::Lost {
                resume: Some(Psn::new(102))
            }
        );
    }

    /// A READ response after WRITEs whose ACK was lost was taken for a
    /// loss: a go-back of the whole window on both queue pairs. In RC the
    /// response says the WRITEs before it were executed.
    #[test]
    fn a_read_response_past_unacknowledged_writes_acknowledges_them() {
        let mut queue_pair = queue_pair();
        let mut out = Vec::new();
        let now = Timestamp::ZERO;
        queue_pair.send(now, write(Segment::Only, 8, 8), &mut out, |b| b.fill(1));
        queue_pair.send(now, read(1, 64), &mut out, |_| {});
        let only = Opcode::RdmaReadResponseOnly;
        assert_eq!(
            queue_pair.handle_answer(now, only, Psn::new(101), ACK),
            Answer::WritesImplied {
                through: Psn::new(100)
            }
        );
        let mut seen = Vec::new();
        queue_pair.take_acknowledged(now, Psn::new(100), |sent| seen.push(sent.write_segment));
        assert_eq!(seen, [Some(Segment::Only)]);
        assert!(matches!(
            queue_pair.handle_answer(now, only, Psn::new(101), ACK),
            Answer::ReadResponse(_)
        ));
        assert_eq!(queue_pair.in_flight(), 0);
        // Past a READ whose response is missing, it is still a loss.
        queue_pair.send(now, read(2, 64), &mut out, |_| {});
        queue_pair.send(now, read(3, 64), &mut out, |_| {});
        assert_eq!(
            queue_pair.handle_answer(now, only, Psn::new(103), ACK),
            Answer::Lost { resume: None }
        );
    }

    /// WRITEs at PSNs 100 and 101, the first acknowledged.
    fn two_writes_the_first_acknowledged() -> (ImpersonatedQueuePair, Timestamp) {
        let mut queue_pair = queue_pair();
        let mut out = Vec::new();
        let now = Timestamp::ZERO;
        queue_pair.send(now, write(Segment::Only, 8, 8), &mut out, |b| b.fill(1));
        queue_pair.send(now, write(Segment::Only, 8, 8), &mut out, |b| b.fill(2));
        let ack = Opcode::Acknowledge;
        assert_eq!(
            queue_pair.handle_answer(now, ack, Psn::new(100), ACK),
            Answer::Acknowledged
        );
        queue_pair.take_acknowledged(now, Psn::new(100), |_| {});
        (queue_pair, now)
    }

    /// A sequence NAK for a PSN already acknowledged (late, or duplicated
    /// by a reordering link) started a full go-back.
    #[test]
    fn a_stale_sequence_nak_is_a_duplicate() {
        let (mut queue_pair, now) = two_writes_the_first_acknowledged();
        let ack = Opcode::Acknowledge;
        let nak = Some(AckSyndrome::Nak(NakCode::PsnSequenceError));
        assert_eq!(
            queue_pair.handle_answer(now, ack, Psn::new(100), nak),
            Answer::Duplicate
        );
        assert_eq!(
            queue_pair.handle_answer(now, ack, Psn::new(101), nak),
            Answer::Lost {
                resume: Some(Psn::new(101))
            }
        );
    }

    /// A refusal NAK for a PSN not in flight (one already acknowledged,
    /// or never sent) stopped the instance for good, in normal operation
    /// and during a go-back alike: one stray or forged frame was enough.
    /// Only a request in flight can be refused.
    #[test]
    fn a_refusal_of_a_psn_not_in_flight_is_ignored() {
        let (mut queue_pair, now) = two_writes_the_first_acknowledged();
        let ack = Opcode::Acknowledge;
        let refusal = Some(AckSyndrome::Nak(NakCode::RemoteAccessError));
        for ghost in [Psn::new(100), Psn::new(102), Psn::new(5000)] {
            assert_eq!(
                queue_pair.handle_answer(now, ack, ghost, refusal),
                Answer::Duplicate,
                "{ghost:?}"
            );
            assert_eq!(
                queue_pair.handle_answer_recovering(now, ghost, refusal),
                None
            );
        }
        assert_eq!(
            queue_pair.handle_answer(now, ack, Psn::new(101), refusal),
            Answer::Refused(NakCode::RemoteAccessError)
        );
        assert_eq!(
            queue_pair.handle_answer_recovering(now, Psn::new(101), refusal),
            Some(NakCode::RemoteAccessError)
        );
    }

    #[test]
    fn a_go_back_resends_reads_exactly_and_writes_as_harmless_fillers() {
        let mut queue_pair = queue_pair();
        let mut out = Vec::new();
        let now = Timestamp::ZERO;
        queue_pair.send(now, read(1, 64), &mut out, |_| {});
        queue_pair.send(now, write(Segment::Only, 64, 64), &mut out, |b| b.fill(5));
        // A multi-packet WRITE cut off after its first packet.
        queue_pair.send(now, write(Segment::First, 1024, 1500), &mut out, |b| {
            b.fill(6)
        });
        assert!(!queue_pair.has_room(1) && queue_pair.can_continue_message());
        queue_pair.go_back(now, None);
        let mut resent = Vec::new();
        while queue_pair.poll_retransmit(&mut out) {
            let frame = RoceFrame::new_checked(&out).expect("stand-ins are valid frames");
            let payload_is_zero = frame.payload().iter().all(|byte| *byte == 0);
            let reth = frame
                .reth()
                .map(|reth| (reth.virtual_address.0, reth.dma_length));
            resent.push((
                frame.bth().psn.value(),
                frame.opcode(),
                reth,
                frame.payload().len(),
                payload_is_zero,
            ));
        }
        let read = Opcode::RdmaReadRequest;
        assert_eq!(
            resent,
            [
                (100, read, Some((0x1000, 64)), 0, true),
                (101, Opcode::RdmaWriteOnly, Some((0x2000, 0)), 0, true),
                (
                    102,
                    Opcode::RdmaWriteFirst,
                    Some((0x2000, 1500)),
                    1024,
                    true
                ),
                (103, Opcode::RdmaWriteLast, None, 476, true),
            ]
        );
        assert!(!queue_pair.is_recovered());
        let read_answer = queue_pair.handle_answer_recovering(now, Psn::new(100), ACK);
        assert_eq!(read_answer, None);
        let ack = queue_pair.handle_answer_recovering(now, Psn::new(103), ACK);
        assert_eq!(ack, None);
        assert!(queue_pair.is_recovered());
        queue_pair.finish_recovery();
        assert!(queue_pair.has_room(1));
    }
}
