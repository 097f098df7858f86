//! The switch itself: ports, the pipeline around a program, egress queues,
//! the packet generator and the digest queue. Sans-IO: the rack's drivers
//! and the simulator feed it frames and time.

use crate::generator::{GeneratorError, PacketGenerator, Template, TemplateId};
use crate::packet::{Egress, Packet, PortId, GENERATOR_PORT, RECIRCULATION_PORT};
use crate::parser::{self, Ipv4Fields, ParseStop, ParsedHeaders, RoceFields};
use crate::program::{Digest, Program};
use crate::resources::ResourceReport;
use remora_base::{copy_bytes, BufferPool, Timestamp};
use remora_wire::frame::MAX_FRAME_LEN;
use remora_wire::icrc;
use remora_wire::ipv4::PROTOCOL_UDP;
use remora_wire::ROCEV2_UDP_PORT;
use serde::Serialize;
use std::collections::VecDeque;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwitchConfig {
    pub port_count: u16,
    /// Frames each port's egress queue holds before tail-dropping.
    pub egress_queue_frames: usize,
    /// Passes beyond the first a packet may make.
    pub max_recirculations: u8,
    /// Digests waiting for the control plane before new ones are dropped.
    pub digest_queue: usize,
}

impl SwitchConfig {
    pub fn new(port_count: u16) -> SwitchConfig {
        SwitchConfig {
            port_count,
            egress_queue_frames: 1024,
            max_recirculations: 4,
            digest_queue: 1024,
        }
    }
}

/// What the switch did with frames, with drops by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SwitchCounters {
    pub received: u64,
    pub generated: u64,
    /// Packets the program took whole ([`Egress::Consumed`]): their
    /// purpose, not drops.
    pub consumed_by_program: u64,
    pub transmitted: u64,
    pub mirrored: u64,
    pub recirculated: u64,
    pub digests: u64,
    /// Frames too short to be Ethernet, as they arrived.
    pub dropped_runt: u64,
    pub dropped_unknown_port: u64,
    /// Frames the program gave no egress.
    pub dropped_no_egress: u64,
    /// Frames a program cut or broke below their headers (the deparser or
    /// a recirculation could not parse what it left).
    pub dropped_broken_by_program: u64,
    /// Frames a program sent to a port the switch does not have.
    pub dropped_unknown_egress_port: u64,
    pub dropped_by_program: u64,
    pub dropped_queue_full: u64,
    pub dropped_recirculation_limit: u64,
    pub dropped_digest_overflow: u64,
    /// Frames waiting in egress queues when the switch lost its power.
    pub dropped_cleared: u64,
    /// Frames longer than any frame a port carries (a program or a
    /// template that grew one), or than the buffer a caller polled with.
    pub dropped_too_large: u64,
    /// Frames handed to a port out of service or whose carrier failed the
    /// send: lost on their way out. (Counted as sent, they made a failed
    /// port look as if it carried them.)
    pub dropped_port_failed: u64,
    /// Frames flooding replaced by their copies.
    pub flooded: u64,
    /// Copies flooding made (one per other port).
    pub flood_copies: u64,
}

impl SwitchCounters {
    /// Frames the switch dropped, for any reason.
    pub fn dropped(&self) -> u64 {
        self.dropped_runt
            + self.dropped_unknown_port
            + self.dropped_no_egress
            + self.dropped_broken_by_program
            + self.dropped_unknown_egress_port
            + self.dropped_by_program
            + self.dropped_queue_full
            + self.dropped_recirculation_limit
            + self.dropped_cleared
            + self.dropped_too_large
            + self.dropped_port_failed
    }
}

/// The frame count does not balance: a frame was lost or made up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("frames in ({frames_in}: received, generated, mirror and flood copies) differ from frames out ({frames_out}: transmitted, dropped, consumed, queued, flooded away)")]
pub struct AccountingError {
    pub frames_in: u64,
    pub frames_out: u64,
}

/// A port's egress queue: normal traffic first, background (a packet's
/// class, [`Packet::background`]) only when no normal frame waits.
#[derive(Debug, Default)]
struct EgressQueue {
    normal: VecDeque<Vec<u8>>,
    background: VecDeque<Vec<u8>>,
}

impl EgressQueue {
    fn len(&self) -> usize {
        self.normal.len() + self.background.len()
    }

    /// The next frame, and whether it was background traffic.
    fn pop(&mut self) -> Option<(Vec<u8>, bool)> {
        match self.normal.pop_front() {
            Some(frame) => Some((frame, false)),
            None => self.background.pop_front().map(|frame| (frame, true)),
        }
    }

    /// Puts a frame [`EgressQueue::pop`] gave back at the head of its queue.
    fn put_back(&mut self, frame: Vec<u8>, background: bool) {
        match background {
            false => self.normal.push_front(frame),
            true => self.background.push_front(frame),
        }
    }
}

/// Hands a frame leaving by a port straight to its carrier; returns false
/// if the carrier has no room (the frame is then queued).
pub type Emit<'a> = dyn FnMut(PortId, &[u8]) -> Emitted + 'a;

/// The same for one port's carrier ([`Switch::poll_transmit_port`]).
pub type EmitToPort<'a> = dyn FnMut(&[u8]) -> Emitted + 'a;

/// What became of a frame offered to a port's carrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Emitted {
    /// The carrier took it.
    Sent,
    /// Not now (no room, or the port is busy): it waits in the egress
    /// queue.
    Refused,
    /// The port is out of service or its carrier failed the send: gone.
    Lost,
}

/// Buffers kept for reuse, so forwarding does not allocate per frame.
const MAX_POOLED_BUFFERS: usize = 4096;
/// Packet-outs a program may send per frame or timeout handled.
pub const MAX_PACKET_OUTS_PER_TURN: usize = 64;

pub struct Switch<P: Program> {
    config: SwitchConfig,
    program: P,
    generator: PacketGenerator,
    egress: Vec<EgressQueue>,
    digests: VecDeque<Digest>,
    counters: SwitchCounters,
    transmit_cursor: usize,
    pool: BufferPool,
}

impl<P: Program> Switch<P> {
    pub fn new(config: SwitchConfig, program: P) -> Switch<P> {
        assert!(config.port_count > 0 && config.port_count < RECIRCULATION_PORT.0);
        Switch {
            egress: (0..config.port_count)
                .map(|_| EgressQueue::default())
                .collect(),
            config,
            program,
            generator: PacketGenerator::default(),
            digests: VecDeque::new(),
            counters: SwitchCounters::default(),
            transmit_cursor: 0,
            pool: BufferPool::new(MAX_POOLED_BUFFERS),
        }
    }

    pub fn program(&self) -> &P {
        &self.program
    }

    /// The control plane's access to the program's tables.
    pub fn program_mut(&mut self) -> &mut P {
        &mut self.program
    }

    pub fn counters(&self) -> SwitchCounters {
        self.counters
    }

    pub fn config(&self) -> SwitchConfig {
        self.config
    }

    pub fn resources(&self) -> ResourceReport {
        self.program.resources()
    }

    pub fn add_template(
        &mut self,
        template: Template,
        first: Timestamp,
    ) -> Result<TemplateId, GeneratorError> {
        self.generator.add(template, first)
    }

    pub fn set_template_period(
        &mut self,
        id: TemplateId,
        period: std::time::Duration,
    ) -> Result<(), GeneratorError> {
        self.generator.set_period(id, period)
    }

    /// The next digest for the control plane.
    pub fn poll_digest(&mut self) -> Option<Digest> {
        self.digests.pop_front()
    }

    /// Hands every queued digest to the program's own control plane (L2/L3
    /// learning, an overlay's), as the switch's control CPU does between
    /// packets. Bounded by the digest queue.
    pub fn run_control_plane(&mut self) {
        while let Some(digest) = self.digests.pop_front() {
            self.program.control_plane(&digest);
        }
    }

    /// Frames waiting in egress queues.
    pub fn queued_frames(&self) -> usize {
        self.egress.iter().map(EgressQueue::len).sum()
    }

    fn buffer_from(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.pool.copy_of(bytes)
    }

    fn recycle(&mut self, buffer: Vec<u8>) {
        self.pool.give_back(buffer);
    }

    /// A frame arrived on `port`. What leaves waits in the egress queues
    /// for [`Switch::poll_transmit`].
    pub fn handle_frame(&mut self, now: Timestamp, port: PortId, bytes: &[u8]) {
        self.handle_frame_with(now, port, bytes, &mut |_, _| Emitted::Refused);
    }

    /// A frame arrived on `port`. What leaves is offered to `emit` first
    /// (cut-through to the egress carrier), and queued only if `emit`
    /// refuses it or the port already has frames queued, which keeps each
    /// port's order.
    pub fn handle_frame_with(
        &mut self,
        now: Timestamp,
        port: PortId,
        bytes: &[u8],
        emit: &mut Emit<'_>,
    ) {
        self.counters.received += 1;
        if port.0 >= self.config.port_count {
            self.counters.dropped_unknown_port += 1;
            return;
        }
        self.inject(now, port, bytes, false, emit);
        self.packets_out(now, emit);
        self.debug_check_invariants();
    }

    /// The program's packet-outs, into the pipeline from the generator
    /// port; at most [`MAX_PACKET_OUTS_PER_TURN`] a turn, so one frame's
    /// handling stays bounded (the rest go at the next frame or timeout).
    fn packets_out(&mut self, now: Timestamp, emit: &mut Emit<'_>) {
        for _ in 0..MAX_PACKET_OUTS_PER_TURN {
            let Some(frame) = self.program.poll_packet_out() else {
                return;
            };
            self.counters.generated += 1;
            self.inject(now, GENERATOR_PORT, &frame, false, emit);
        }
    }

    /// A frame into the pipeline from `port`, in the background class if
    /// `background` (a background template's packet; the program may
    /// change it).
    fn inject(
        &mut self,
        now: Timestamp,
        port: PortId,
        bytes: &[u8],
        background: bool,
        emit: &mut Emit<'_>,
    ) {
        // Copy first, then parse the copy: the bytes may sit in memory
        // another process writes, and the offsets must describe what the
        // pipeline actually holds.
        let buffer = self.buffer_from(bytes);
        let Ok(headers) = parser::parse(&buffer) else {
            self.counters.dropped_runt += 1;
            self.recycle(buffer);
            return;
        };
        let mut packet = Packet::new(buffer, port, headers);
        packet.background = background;
        self.run_pipeline(now, &mut packet, emit);
    }

    fn run_pipeline(&mut self, now: Timestamp, packet: &mut Packet, emit: &mut Emit<'_>) {
        // Bounded: each pass either ends or increments `recirculations`,
        // which is capped.
        loop {
            self.program.ingress(now, packet);
            if let Some(digest) = packet.digest.take() {
                self.deliver_digest(digest);
            }
            if !self.deparse(packet) {
                self.counters.dropped_broken_by_program += 1;
                self.recycle(std::mem::take(&mut packet.bytes));
                return;
            }
            if let Some(mirror) = packet.mirror.take() {
                self.counters.mirrored += 1;
                let copy = self.buffer_from(&packet.bytes);
                self.output(mirror, copy, packet.background, emit);
            }
            if !packet.recirculate {
                break;
            }
            if packet.recirculations >= self.config.max_recirculations {
                self.counters.dropped_recirculation_limit += 1;
                self.recycle(std::mem::take(&mut packet.bytes));
                return;
            }
            self.counters.recirculated += 1;
            if !Self::recirculate(packet) {
                self.counters.dropped_broken_by_program += 1;
                self.recycle(std::mem::take(&mut packet.bytes));
                return;
            }
        }
        let bytes = std::mem::take(&mut packet.bytes);
        match packet.egress {
            Egress::Port(port) => self.output(port, bytes, packet.background, emit),
            Egress::Flood => {
                self.flood(packet.original_ingress_port, bytes, packet.background, emit)
            }
            Egress::Consumed => {
                self.counters.consumed_by_program += 1;
                self.recycle(bytes);
            }
            Egress::Drop => {
                self.counters.dropped_by_program += 1;
                self.recycle(bytes);
            }
            Egress::Unset => {
                self.counters.dropped_no_egress += 1;
                self.recycle(bytes);
            }
        }
    }

    /// Starts the packet's next pass: parsed afresh (the program may have
    /// changed headers), metadata reset, the pass counted, the original
    /// ingress port kept. False if the program cut the frame below a header.
    fn recirculate(packet: &mut Packet) -> bool {
        let Ok(headers) = parser::parse(&packet.bytes) else {
            return false;
        };
        let (recirculations, original) = (packet.recirculations + 1, packet.original_ingress_port);
        let background = packet.background;
        *packet = Packet::new(
            std::mem::take(&mut packet.bytes),
            RECIRCULATION_PORT,
            headers,
        );
        packet.recirculations = recirculations;
        packet.original_ingress_port = original;
        packet.background = background;
        true
    }

    /// The deparser: headers were edited in place, so only the ICRC may
    /// need refreshing; whether the frame is still whole. A program that
    /// changed what places the ICRC (the frame's length, the IPv4 header
    /// or total length, the protocol or the UDP port) left the pass's
    /// offsets stale: the ICRC went mid-frame or past its end, or the
    /// layout check under it panicked, or four bytes of a datagram that
    /// was no longer RoCE were overwritten. Such a frame is parsed
    /// afresh: one that is no longer RoCE but still an IPv4 packet goes
    /// as it is, and one cut or broken below its headers is not whole.
    /// Frames whose layout is unchanged, nearly all, keep the pass's
    /// offsets.
    fn deparse(&mut self, packet: &mut Packet) -> bool {
        if !std::mem::take(&mut packet.rewritten) {
            return true;
        }
        let (Some(ipv4), Some(roce)) = (packet.headers.ipv4, packet.headers.roce) else {
            return true;
        };
        let icrc_offset = if Self::layout_unchanged(&packet.bytes, ipv4, roce) {
            roce.icrc_offset
        } else {
            match parser::parse(&packet.bytes) {
                Ok(ParsedHeaders {
                    roce: Some(roce), ..
                }) => roce.icrc_offset,
                Ok(ParsedHeaders {
                    stop: Some(ParseStop::NotRoce),
                    ..
                }) => return true,
                _ => return false,
            }
        };
        let value = icrc::compute_in_place(&mut packet.bytes, icrc_offset);
        packet.bytes[icrc_offset..icrc_offset + icrc::ICRC_LEN]
            .copy_from_slice(&icrc::to_wire(value));
        true
    }

    /// Whether the bytes that place the ICRC are as the pass's parse found
    /// them: the IPv4 version and header length, total length, protocol
    /// and UDP destination port, and a frame long enough.
    fn layout_unchanged(bytes: &[u8], ipv4: Ipv4Fields, roce: RoceFields) -> bool {
        let icrc_end = roce.icrc_offset + icrc::ICRC_LEN;
        let udp = ipv4.offset + ipv4.header_len;
        let (Some(header), Some(port)) = (bytes.get(ipv4.offset..udp), bytes.get(udp + 2..udp + 4))
        else {
            return false;
        };
        let version_and_length = 0x40 | (ipv4.header_len / 4) as u8;
        let total_len = usize::from(u16::from_be_bytes([header[2], header[3]]));
        header[0] == version_and_length
            && total_len == icrc_end - ipv4.offset
            && header[9] == PROTOCOL_UDP
            && u16::from_be_bytes([port[0], port[1]]) == ROCEV2_UDP_PORT
            && icrc_end <= bytes.len()
    }

    fn deliver_digest(&mut self, digest: Digest) {
        if self.digests.len() >= self.config.digest_queue {
            self.counters.dropped_digest_overflow += 1;
            return;
        }
        self.counters.digests += 1;
        self.digests.push_back(digest);
    }

    fn flood(
        &mut self,
        ingress_port: PortId,
        bytes: Vec<u8>,
        background: bool,
        emit: &mut Emit<'_>,
    ) {
        self.counters.flooded += 1;
        for port in 0..self.config.port_count {
            if PortId(port) != ingress_port {
                self.counters.flood_copies += 1;
                let copy = self.buffer_from(&bytes);
                self.output(PortId(port), copy, background, emit);
            }
        }
        self.recycle(bytes);
    }

    /// Every frame is accounted for: received + generated + copies made
    /// (mirroring, flooding) = transmitted + dropped + consumed by the
    /// program + queued + frames flooding replaced by copies. A recirculated frame is the same frame
    /// passing again, so recirculation adds to neither side.
    pub fn check_frame_accounting(&self) -> Result<(), AccountingError> {
        let counters = &self.counters;
        let frames_in =
            counters.received + counters.generated + counters.mirrored + counters.flood_copies;
        let frames_out = counters.transmitted
            + counters.dropped()
            + counters.consumed_by_program
            + self.queued_frames() as u64
            + counters.flooded;
        if frames_in == frames_out {
            Ok(())
        } else {
            Err(AccountingError {
                frames_in,
                frames_out,
            })
        }
    }

    fn debug_check_invariants(&self) {
        if cfg!(debug_assertions) {
            if let Err(error) = self.check_frame_accounting() {
                panic!("switch frame accounting: {error}");
            }
        }
    }

    /// Cut-through when the port's queue is empty and the carrier takes
    /// the frame, background frames too (nothing waits for them to yield
    /// to); otherwise the egress queue of the frame's class.
    fn output(&mut self, port: PortId, bytes: Vec<u8>, background: bool, emit: &mut Emit<'_>) {
        if bytes.len() > MAX_FRAME_LEN {
            self.counters.dropped_too_large += 1;
            self.recycle(bytes);
            return;
        }
        let queue_empty = self
            .egress
            .get(usize::from(port.0))
            .is_some_and(|queue| queue.len() == 0);
        if queue_empty {
            match emit(port, &bytes) {
                Emitted::Sent => self.counters.transmitted += 1,
                Emitted::Lost => self.counters.dropped_port_failed += 1,
                Emitted::Refused => return self.enqueue(port, bytes, background),
            }
            self.recycle(bytes);
            return;
        }
        self.enqueue(port, bytes, background);
    }

    fn enqueue(&mut self, port: PortId, bytes: Vec<u8>, background: bool) {
        let Some(queue) = self.egress.get_mut(usize::from(port.0)) else {
            self.counters.dropped_unknown_egress_port += 1;
            self.recycle(bytes);
            return;
        };
        if queue.len() >= self.config.egress_queue_frames {
            // Background frames yield their place to normal ones, or a busy
            // port would fill with probes that never leave. The newest
            // yields: a flow in the background class (Cowbird-P4's queue
            // pairs) then loses its tail, not a frame from the middle of a
            // run, which its receiver would refuse all the rest of.
            let evicted = if background {
                None
            } else {
                queue.background.pop_back()
            };
            self.counters.dropped_queue_full += 1;
            match evicted {
                Some(old) => self.recycle(old),
                None => {
                    self.recycle(bytes);
                    return;
                }
            }
        }
        let queue = &mut self.egress[usize::from(port.0)];
        if background {
            queue.background.push_back(bytes);
        } else {
            queue.normal.push_back(bytes);
        }
    }

    /// The next frame to send and its port; ports take turns.
    pub fn poll_transmit(&mut self, _now: Timestamp, buffer: &mut [u8]) -> Option<(PortId, usize)> {
        let ports = self.egress.len();
        for step in 0..ports {
            let port = (self.transmit_cursor + step) % ports;
            // Bounded by the port's queue.
            while let Some((frame, _)) = self.egress[port].pop() {
                let length = frame.len();
                if length > buffer.len() {
                    // Copied, it panicked past the caller's buffer.
                    self.counters.dropped_too_large += 1;
                    self.recycle(frame);
                    continue;
                }
                self.transmit_cursor = (port + 1) % ports;
                copy_bytes(&mut buffer[..length], &frame);
                self.recycle(frame);
                self.counters.transmitted += 1;
                return Some((PortId(port as u16), length));
            }
        }
        None
    }

    /// Offers the next frame for one port to `emit`, for drivers that serve
    /// each port's carrier separately: sent, lost (a port out of service,
    /// a failed send), or refused (no room after all), when it stays at
    /// the head of its queue. Returns whether a frame left the queue. (A
    /// carrier that took the room check and then dropped the frame for
    /// room was counted transmitted, where the cut-through path kept it.)
    pub fn poll_transmit_port(&mut self, port: PortId, emit: &mut EmitToPort<'_>) -> bool {
        let Some(queue) = self.egress.get_mut(usize::from(port.0)) else {
            return false;
        };
        let Some((frame, background)) = queue.pop() else {
            return false;
        };
        match emit(&frame) {
            Emitted::Sent => self.counters.transmitted += 1,
            Emitted::Lost => self.counters.dropped_port_failed += 1,
            Emitted::Refused => {
                queue.put_back(frame, background);
                return false;
            }
        }
        self.recycle(frame);
        true
    }

    pub fn poll_timeout(&self) -> Option<Timestamp> {
        if self.program.has_packet_out() {
            return Some(Timestamp::ZERO);
        }
        self.generator.next_due()
    }

    /// Fires due generator templates into the pipeline.
    pub fn handle_timeout(&mut self, now: Timestamp) {
        let mut due = Vec::new();
        self.generator.fire_due(now, &mut |template| {
            due.push((template.bytes.clone(), template.priority))
        });
        for (bytes, priority) in due {
            self.counters.generated += 1;
            let background = priority == 0;
            self.inject(now, GENERATOR_PORT, &bytes, background, &mut |_, _| {
                Emitted::Refused
            });
        }
        self.packets_out(now, &mut |_, _| Emitted::Refused);
        self.debug_check_invariants();
    }

    /// Empties the queues, as a power cycle would; the program's tables are
    /// control-plane state and stay.
    pub fn clear_queues(&mut self) {
        // Counted as dropped: uncounted, the frame accounting no longer
        // balanced, and a debug switch panicked at its next frame.
        for queue in &mut self.egress {
            self.counters.dropped_cleared += queue.len() as u64;
            queue.normal.clear();
            queue.background.clear();
        }
        self.digests.clear();
    }
}

/// In the simulator the control plane runs after every frame and timeout:
/// without it nothing was ever learned there, unlike on the rack, and
/// digests piled up to the queue's bound and were then dropped.
impl<P: Program> remora_sim::Node for Switch<P> {
    fn handle_frame(&mut self, now: Timestamp, port: PortId, frame: &[u8]) {
        Switch::handle_frame(self, now, port, frame);
        self.run_control_plane();
    }

    fn poll_transmit(&mut self, now: Timestamp, buffer: &mut [u8]) -> Option<(PortId, usize)> {
        Switch::poll_transmit(self, now, buffer)
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        Switch::poll_timeout(self)
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        Switch::handle_timeout(self, now);
        self.run_control_plane();
    }

    fn crash(&mut self, _now: Timestamp) {
        self.clear_queues();
    }

    fn restart(&mut self, _now: Timestamp) {}
}
