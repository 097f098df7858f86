//! Cowbird-P4 (section 5): the offload engine as a switch program.
//!
//! The switch impersonates the peer of two queue pairs per instance: one
//! on the compute node (its block of host memory) and one on the memory
//! node (the pool). Nothing runs on either host's CPU. Every request is a
//! chain of recycled packets, each answer becoming the next request:
//!
//! ```text
//! generator ──► probe READ (client words) ──► compute
//! probe response ──► metadata READ (one entry)           [tail moved]
//! metadata response ──► read:  data READ ──► memory pool
//!                       write: payload READ ──► compute request data ring
//! READ RESPONSE ONLY/FIRST/MIDDLE/LAST ──► WRITE ONLY/FIRST/MIDDLE/LAST
//!     (read: into the response ring; write: into the pool)
//! final ACK ──► bookkeeping WRITE (engine words: head, read and write
//!     progress) ──► its ACK ──► the next metadata READ, if work waits
//! ```
//!
//! Registers hold, per instance, the ring cursors and progress, the
//! fetched entries (the stashed response addresses), and per impersonated
//! queue pair the PSNs and what each one carried
//! ([`impersonated::ImpersonatedQueuePair`]). A table maps the switch's
//! queue pair numbers to instances (section 5.4); the generator's packets
//! visit instances round-robin at the lowest priority.
//!
//! Consistency (5.3): entries start in ring order; a newly fetched read
//! waits while any write has fetched its payload but not yet sent it to the
//! pool (the switch cannot compare ranges). It is dropped and fetched again
//! by a later probe. Requests of one type move through the same queue
//! pairs in order, so they complete in order. A write also waits while
//! another write is unconfirmed: a go-back may run a write again after its
//! original reached the pool, which is harmless alone but would undo a
//! later write that landed in between (seed 188 of the simulator campaign
//! found exactly that). For the same reason a write waits while another
//! instance has a write to the same pool page started and not yet
//! confirmed, across go-backs: that one may land again, over bytes this one
//! wrote. Pages of the path MTU, not byte ranges: a write of at most one
//! MTU spans at most two, and a switch matches a page exactly where it
//! cannot compare ranges ([`WritePages`]). And a go-back that rewinds to an older request
//! skips the confirmed requests it fetches again: their ring space may
//! already hold new requests (seed 14).
//!
//! Fault tolerance (5.3, absent from the published code): answers are
//! accepted only in PSN order. A gap, a NAK, or a data-plane timeout
//! (checked whenever a generator packet visits the instance) starts a
//! go-back on both queue pairs: every unacknowledged PSN is sent again, or
//! replaced by a harmless filler, until the hosts have acknowledged all of
//! them; then the instance refetches from the oldest request it has not
//! confirmed. Progress is only ever reported for confirmed requests, and
//! confirmed requests are never redone.
//!
//! A write moves in one packet: writes are capped at the path MTU
//! ([`crate::client::Client::limit_write_bytes`]). A go-back cannot
//! regenerate a lost WRITE's payload; in the middle of a multi-packet
//! message the only well-formed stand-in writes zeros, which is harmless in
//! a response slot nobody reads before progress says so, but not in the
//! pool, where a read redone before the write would see them. Reads of any
//! length are fine: their multi-packet responses become multi-packet
//! WRITEs into the response ring.
//!
//! Deviations from a Tofino, on purpose: the engine checks the ICRC of the
//! answers it consumes and computes the ICRC of what it emits (Tofino
//! cannot; the paper disables the hosts' checks instead), and its
//! bookkeeping of acknowledged PSNs walks the PSNs one ACK covers (bounded
//! by the window), where hardware would keep a counter per request type.

pub mod impersonated;

use crate::layout::{
    Entry, Kind, RingSizes, CLIENT_WORDS_AT, CLIENT_WORDS_BYTES, ENGINE_WORDS_AT,
    ENGINE_WORDS_BYTES, ENTRY_BYTES,
};
use impersonated::{Answer, ImpersonatedQueuePair, Peer, Purpose, Sent, WINDOW_PACKETS};
use remora_rnic::{Mtu, RemoteAddress, Timestamp};
use remora_switch::generator::Template;
use remora_switch::packet::GENERATOR_PORT;
use remora_switch::programs::{Claim, L2L3Forwarding, Overlaid, Overlay};
use remora_switch::register::RegisterArray;
use remora_switch::table::{ExactTable, TableShape};
use remora_switch::{parser, Egress, Packet, PortId, ResourceReport};
use remora_wire::frame::FrameRepr;
use remora_wire::opcode::Segment;
use remora_wire::{BthRepr, Ipv4Address, MacAddress, Opcode, Psn, Qpn, RoceFrame};
use std::collections::VecDeque;
use std::time::Duration;

/// The most instances one switch serves.
pub const MAX_INSTANCES: usize = 64;
/// The first queue pair number the switch plays; instance `i` uses
/// `FIRST_QPN + 2i` towards its compute node and the next one towards
/// the memory node.
pub const FIRST_QPN: u32 = 0x00c0_0000;

#[derive(Debug, Clone, Copy)]
pub struct P4Config {
    /// The address the engine's queue pairs have on the wire.
    pub mac: MacAddress,
    pub address: Ipv4Address,
    /// Generator period: one packet visits one instance.
    pub probe_period: Duration,
    /// The data-plane timeout that starts a go-back.
    pub timeout: Duration,
    /// Requests an instance has fetched and not yet confirmed.
    pub max_entries_in_flight: u64,
    pub path_mtu: Mtu,
}

impl P4Config {
    /// The engine's address in code-built racks: beside the standard
    /// hosts (`remora_rack::topology::standard_host`), at 10.0.0.254.
    pub fn rack_default() -> P4Config {
        P4Config::new(
            MacAddress([0x02, 0xc0, 0xb1, 0, 0, 0xfe]),
            Ipv4Address::new(10, 0, 0, 254),
        )
    }

    pub fn new(mac: MacAddress, address: Ipv4Address) -> P4Config {
        P4Config {
            mac,
            address,
            probe_period: Duration::from_micros(2),
            timeout: Duration::from_micros(500),
            max_entries_in_flight: 32,
            path_mtu: Mtu::MTU_1024,
        }
    }
}

/// What the control plane learns from an instance's setup (Phase I).
#[derive(Debug, Clone)]
pub struct InstanceSpec {
    /// The compute node's queue pair, and the PSN its responder expects.
    pub compute: Peer,
    /// The memory node's queue pair.
    pub memory: Peer,
    /// The instance's block of compute host memory.
    pub block: RemoteAddress,
    pub sizes: RingSizes,
    /// The pool's regions, by region id.
    pub regions: Vec<RemoteAddress>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum P4Error {
    #[error("the switch serves at most {MAX_INSTANCES} instances")]
    TooManyInstances,
    #[error("an instance needs at least one pool region")]
    NoRegions,
    #[error("ring sizes {0:?} cannot hold one largest request")]
    BadRingSizes(RingSizes),
    #[error("{0} metadata entries in flight must be fewer than the ring's {1}")]
    TooManyInFlight(u64, u64),
}

/// What the engine did, summed over instances.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct P4Stats {
    pub probes: u64,
    /// Probe answers that found no new request.
    pub idle_probes: u64,
    pub metadata_reads: u64,
    pub reads_started: u64,
    pub writes_started: u64,
    /// Reads fetched while a write was unsent: dropped, fetched again.
    pub reads_paused: u64,
    /// Writes fetched while another write (of any instance) was
    /// unconfirmed: likewise.
    pub writes_paused: u64,
    /// Of those, writes held only by another instance's unconfirmed write
    /// to the same pool pages.
    pub writes_held_by_other_instances: u64,
    /// Entries a go-back fetched again that were already confirmed.
    pub skipped_confirmed: u64,
    pub reads_confirmed: u64,
    pub writes_confirmed: u64,
    pub bookkeeping_writes: u64,
    /// READ RESPONSE FIRST/MIDDLE/LAST packets turned into WRITEs of the
    /// same place in their message.
    pub multi_packet_responses: u64,
    /// Answers for PSNs already settled (late duplicates).
    pub duplicate_answers: u64,
    /// Go-backs started, and how many of them a timeout started.
    pub go_backs: u64,
    pub timeouts: u64,
    /// Packets sent again (or replaced by fillers) during go-backs.
    pub retransmitted: u64,
    /// Frames for the engine that failed the ICRC or other checks.
    pub malformed: u64,
    /// Frames to an engine queue pair from anyone but the host it is
    /// connected to (another address, or the right address on another
    /// port): dropped unread.
    pub foreign_answers: u64,
    /// Instances stopped for good (a host refused a request, or an entry
    /// made no sense).
    pub failed_instances: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Compute,
    Memory,
}

/// One instance: an application thread's rings.
struct Instance {
    block: RemoteAddress,
    sizes: RingSizes,
    regions: Vec<RemoteAddress>,
    compute: ImpersonatedQueuePair,
    memory: ImpersonatedQueuePair,
    /// Fetched entries by ring position: where each request's bytes go.
    entries: RegisterArray<Option<Entry>>,
    known_tail: u64,
    /// The next entry to fetch, and the next entry allowed to start.
    fetch_cursor: u64,
    start_cursor: u64,
    /// Started and unconfirmed entries of each type, oldest first.
    started_reads: VecDeque<u64>,
    started_writes: VecDeque<u64>,
    /// Writes whose payload has not yet gone to the pool.
    unsent_writes: u32,
    /// The pool pages of the write started and not yet confirmed, kept
    /// across go-backs: its payload may have reached the pool and may
    /// reach them again.
    pending_write: Option<WritePages>,
    /// The other live instances' such pages; the engine refreshes them
    /// before it hands the instance a packet.
    others_pending: Vec<WritePages>,
    /// The requests an ACK confirmed, kept between ACKs so that confirming
    /// allocates nothing: a Vec per confirming ACK was one allocation per
    /// request on the switch's path (found by reading).
    confirmed: Vec<(Kind, u64)>,
    read_progress: u64,
    write_progress: u64,
    recovering: bool,
    /// Go-backs in a row that resent everything and heard nothing back
    /// within the timeout; reset when a go-back completes.
    stalled_recoveries: u32,
    bookkeeping_due: bool,
    failed: Option<String>,
    /// When the engine saw it fail: its last data WRITE may still be on
    /// the wire, so its pending pages stay held for one timeout after.
    failed_at: Option<Timestamp>,
    stats: P4Stats,
}

/// The pool pages a write covers, a page being the path MTU's bytes: a
/// write is one MTU at most, so it covers at most two. Pages of the
/// memory node's address space, not of an instance's region list, which
/// another deployment on the same switch may number otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct WritePages {
    node: Ipv4Address,
    first: u64,
    last: u64,
}

impl WritePages {
    fn of(node: Ipv4Address, start: u64, length: u32, page_bytes: u32) -> WritePages {
        let page_bytes = u64::from(page_bytes);
        let end = start.saturating_add(u64::from(length).max(1) - 1);
        WritePages {
            node,
            first: start / page_bytes,
            last: end / page_bytes,
        }
    }

    fn overlaps(&self, other: &WritePages) -> bool {
        self.node == other.node && self.first <= other.last && other.first <= self.last
    }
}

/// Stalled go-backs in a row after which an instance fails: a host that
/// answers nothing for this many timeouts (a restarted NIC that no longer
/// knows the queue pair) will not answer. Without a bound the instance
/// went back for ever and never said why its requests never finished.
pub const MAX_STALLED_RECOVERIES: u32 = 64;

/// Cowbird-P4 as the rack runs it: the engine's stages on top of L2/L3
/// forwarding.
pub type CowbirdP4 = Overlaid<P4Engine>;

/// The engine's stages (an [`Overlay`]): it takes the generator's packets
/// and the answers to the queue pairs it plays before forwarding sees
/// them; everything else is forwarded.
pub struct P4Engine {
    config: P4Config,
    queue_pairs: ExactTable<u32, (usize, Side)>,
    instances: Vec<Instance>,
    next_instance: usize,
    /// The frame being built; swapped with the packet's bytes.
    out: Vec<u8>,
    malformed: u64,
    foreign_answers: u64,
}

impl P4Engine {
    /// The engine on top of `forwarding`.
    pub fn with_forwarding(config: P4Config, forwarding: L2L3Forwarding) -> CowbirdP4 {
        Overlaid::new(forwarding, P4Engine::new(config))
    }

    pub fn new(config: P4Config) -> P4Engine {
        P4Engine {
            config,
            queue_pairs: ExactTable::new(TableShape {
                name: "cowbird_queue_pairs",
                stage: 0,
                key_bits: 24,
                action_data_bits: 8,
                capacity: 2 * MAX_INSTANCES,
            }),
            instances: Vec::new(),
            next_instance: 0,
            out: Vec::new(),
            malformed: 0,
            foreign_answers: 0,
        }
    }

    pub fn config(&self) -> &P4Config {
        &self.config
    }

    /// Phase I: registers an instance and returns the queue pair numbers
    /// the switch plays towards its compute and memory queue pairs.
    pub fn add_instance(&mut self, spec: InstanceSpec) -> Result<(Qpn, Qpn), P4Error> {
        let index = self.instances.len();
        if index >= MAX_INSTANCES {
            return Err(P4Error::TooManyInstances);
        }
        if spec.regions.is_empty() {
            return Err(P4Error::NoRegions);
        }
        if !spec.sizes.is_valid() {
            return Err(P4Error::BadRingSizes(spec.sizes));
        }
        let in_flight = self.config.max_entries_in_flight;
        if in_flight >= spec.sizes.metadata_entries {
            return Err(P4Error::TooManyInFlight(
                in_flight,
                spec.sizes.metadata_entries,
            ));
        }
        let compute_qpn = FIRST_QPN + 2 * index as u32;
        let memory_qpn = compute_qpn + 1;
        let table_full = |_| P4Error::TooManyInstances;
        self.queue_pairs
            .insert(compute_qpn, (index, Side::Compute))
            .map_err(table_full)?;
        self.queue_pairs
            .insert(memory_qpn, (index, Side::Memory))
            .map_err(table_full)?;
        let own = (self.config.mac, self.config.address);
        let mtu = self.config.path_mtu;
        let source_port = 0xc000 | index as u16;
        self.instances.push(Instance {
            block: spec.block,
            sizes: spec.sizes,
            regions: spec.regions,
            compute: ImpersonatedQueuePair::new(
                "compute_psns",
                2,
                own,
                source_port,
                spec.compute,
                mtu,
            ),
            memory: ImpersonatedQueuePair::new(
                "memory_psns",
                2,
                own,
                source_port,
                spec.memory,
                mtu,
            ),
            entries: RegisterArray::new("entries", 3, spec.sizes.metadata_entries as usize),
            known_tail: 0,
            fetch_cursor: 0,
            start_cursor: 0,
            started_reads: VecDeque::with_capacity(in_flight as usize),
            started_writes: VecDeque::with_capacity(in_flight as usize),
            unsent_writes: 0,
            pending_write: None,
            others_pending: Vec::with_capacity(MAX_INSTANCES),
            confirmed: Vec::new(),
            read_progress: 0,
            write_progress: 0,
            recovering: false,
            bookkeeping_due: false,
            stalled_recoveries: 0,
            failed: None,
            failed_at: None,
            stats: P4Stats::default(),
        });
        let qpn = |value| Qpn::new(value).expect("24-bit queue pair numbers");
        Ok((qpn(compute_qpn), qpn(memory_qpn)))
    }

    /// The generator template that drives probing and recovery: one
    /// packet per period at the lowest priority. Its bytes are a
    /// placeholder the program rewrites for the instance whose turn it is.
    pub fn probe_template(&self) -> Template {
        let bth = BthRepr::new(
            Opcode::Acknowledge,
            Qpn::new(FIRST_QPN).expect("24 bits"),
            Psn::new(0),
        );
        let mut repr = FrameRepr::between(
            (self.config.mac, self.config.address),
            (self.config.mac, self.config.address),
            0xc000,
            bth,
        );
        repr.extension.aeth = Some(remora_wire::AethRepr {
            syndrome: remora_wire::AckSyndrome::Ack { credit_count: 0 },
            msn: remora_wire::Msn::new(0),
        });
        let repr = repr.with_payload_len(0);
        let mut bytes = vec![0u8; repr.frame_len(0)];
        remora_wire::frame::emit_frame(&repr, &[], &mut bytes).expect("a small frame");
        Template {
            bytes,
            period: self.config.probe_period,
            priority: 0,
        }
    }

    pub fn stats(&self) -> P4Stats {
        let mut total = P4Stats {
            malformed: self.malformed,
            foreign_answers: self.foreign_answers,
            ..P4Stats::default()
        };
        for instance in &self.instances {
            total.add(&instance.stats);
        }
        total
    }

    /// Instances deployed so far.
    pub fn instance_count(&self) -> usize {
        self.instances.len()
    }

    /// Instance `index`'s registers, in words, for diagnostics.
    pub fn describe(&self, index: usize) -> Option<String> {
        let instance = self.instances.get(index)?;
        Some(format!(
            "tail {} fetch {} start {} reads {:?} writes {:?} pages {:?} others' pages {:?} unsent {} progress {}/{} recovering {} bookkeeping {} compute [{}] memory [{}]",
            instance.known_tail, instance.fetch_cursor, instance.start_cursor,
            instance.started_reads, instance.started_writes, instance.pending_write,
            instance.others_pending, instance.unsent_writes,
            instance.read_progress, instance.write_progress, instance.recovering,
            instance.bookkeeping_due, instance.compute.describe(), instance.memory.describe(),
        ))
    }

    /// Why instance `index` stopped, if it did.
    pub fn failure(&self, index: usize) -> Option<&str> {
        self.instances.get(index)?.failed.as_deref()
    }

    /// Which instance and side a frame addressed to the engine is for.
    fn engine_queue_pair(&self, packet: &Packet) -> Option<Option<(usize, Side)>> {
        let ipv4 = packet.headers.ipv4?;
        if ipv4.destination != self.config.address {
            return None;
        }
        let roce = packet.headers.roce?;
        Some(
            self.queue_pairs
                .lookup(&roce.destination_qp.value())
                .copied(),
        )
    }

    /// Whether `packet` comes from the host whose queue pair `target`
    /// plays: from its address, on its port. Anyone on the rack can
    /// address the engine's queue pair numbers, and the engine believes
    /// what answers say: one forged NAK stopped an instance for good, and
    /// a forged sequence NAK confirmed writes still in flight. The port is
    /// checked too, as an address alone is easy to borrow.
    fn is_from_peer(&self, (index, side): (usize, Side), packet: &Packet) -> bool {
        let peer = self.instances[index].peer(side);
        packet
            .headers
            .ipv4
            .is_some_and(|ipv4| ipv4.source == peer.address)
            && packet.original_ingress_port == peer.port
    }

    fn on_generator(&mut self, now: Timestamp, packet: &mut Packet) {
        packet.egress = Egress::Consumed;
        let count = self.instances.len();
        for step in 0..count {
            let index = (self.next_instance + step) % count;
            if self.instances[index].failed.is_some() {
                continue;
            }
            self.next_instance = (index + 1) % count;
            self.share_pending_writes(now, index);
            let config = self.config;
            let sent = self.instances[index].on_generator(now, &config, &mut self.out);
            self.note_failure(now, index);
            if let Some(port) = sent {
                self.emit(packet, port);
            }
            return;
        }
    }

    fn on_answer(&mut self, now: Timestamp, target: Option<(usize, Side)>, packet: &mut Packet) {
        packet.egress = Egress::Drop;
        let Some((index, side)) = target else {
            self.malformed += 1;
            return;
        };
        let Ok(frame) = RoceFrame::new_checked(&packet.bytes) else {
            self.malformed += 1;
            return;
        };
        // Taken as the endpoint the engine plays, whatever it answers.
        packet.egress = Egress::Consumed;
        let config = self.config;
        self.share_pending_writes(now, index);
        let sent = self.instances[index].on_answer(now, &config, side, &frame, &mut self.out);
        self.note_failure(now, index);
        if let Some(port) = sent {
            self.emit(packet, port);
        }
    }

    /// Records when instance `index` failed, the first time it is seen.
    fn note_failure(&mut self, now: Timestamp, index: usize) {
        let instance = &mut self.instances[index];
        if instance.failed.is_some() && instance.failed_at.is_none() {
            instance.failed_at = Some(now);
        }
    }

    /// Gives instance `index` the pool pages the other instances'
    /// unconfirmed writes may still land on. In hardware, a register array
    /// indexed by page that names the instance writing it; here, the other
    /// instances' one pending write each. A failed instance redoes nothing,
    /// but its last data WRITE may still be on the wire (a reordering
    /// link): its pages are held one timeout past its failure.
    fn share_pending_writes(&mut self, now: Timestamp, index: usize) {
        let timeout = self.config.timeout;
        let mut others = std::mem::take(&mut self.instances[index].others_pending);
        others.clear();
        others.extend(
            self.instances
                .iter()
                .enumerate()
                .filter(|(other, instance)| {
                    *other != index
                        && instance
                            .failed_at
                            .is_none_or(|at| now.saturating_duration_since(at) <= timeout)
                })
                .filter_map(|(_, instance)| instance.pending_write),
        );
        self.instances[index].others_pending = others;
    }

    /// The built frame replaces the packet's bytes: the deparser's job,
    /// with the new headers valid and the old ones gone. Every frame the
    /// engine sends takes the background queue. The paper gives its
    /// probes the lowest priority (Phase II); the other requests share
    /// the probes' queue pairs, and split over two queues, a backed-up
    /// port sent a queue pair's PSNs out of order (a go-back each time).
    /// So all go at the lowest priority, behind every other flow on the
    /// port (none in the racks built here).
    fn emit(&mut self, packet: &mut Packet, port: PortId) {
        packet.background = true;
        std::mem::swap(&mut packet.bytes, &mut self.out);
        match parser::parse(&packet.bytes) {
            Ok(headers) => {
                packet.headers = headers;
                packet.egress = Egress::Port(port);
            }
            Err(_) => packet.egress = Egress::Drop,
        }
    }
}

impl Overlay for P4Engine {
    fn name(&self) -> &str {
        "cowbird-p4"
    }

    fn before_forwarding(&mut self, now: Timestamp, packet: &mut Packet) -> Claim {
        if packet.ingress_port == GENERATOR_PORT {
            self.on_generator(now, packet);
            return Claim::Taken;
        }
        if let Some(target) = self.engine_queue_pair(packet) {
            if target.is_some_and(|target| !self.is_from_peer(target, packet)) {
                self.foreign_answers += 1;
                packet.egress = Egress::Drop;
                return Claim::Taken;
            }
            self.on_answer(now, target, packet);
            return Claim::Taken;
        }
        Claim::Pass
    }

    fn add_resources(&self, report: &mut ResourceReport) {
        report.tables.push(self.queue_pairs.resources());
        let state_bytes = std::mem::size_of::<u64>() * 10;
        report
            .registers
            .push(remora_switch::resources::RegisterResources {
                name: "instance_state".into(),
                stage: 1,
                cells: self.instances.len(),
                cell_bytes: state_bytes,
            });
        // Each instance's unconfirmed write: its memory node and first and
        // last page, which every write the instances start is matched against.
        report
            .registers
            .push(remora_switch::resources::RegisterResources {
                name: "pending_write_pages".into(),
                stage: 1,
                cells: self.instances.len(),
                cell_bytes: std::mem::size_of::<Ipv4Address>() + 2 * std::mem::size_of::<u64>(),
            });
        for instance in &self.instances {
            report.registers.push(instance.compute.resources());
            report.registers.push(instance.memory.resources());
            report.registers.push(instance.entries.resources());
        }
        report.recomputes_icrc = true;
    }
}

impl P4Stats {
    fn add(&mut self, other: &P4Stats) {
        self.probes += other.probes;
        self.idle_probes += other.idle_probes;
        self.metadata_reads += other.metadata_reads;
        self.reads_started += other.reads_started;
        self.writes_started += other.writes_started;
        self.reads_paused += other.reads_paused;
        self.writes_paused += other.writes_paused;
        self.writes_held_by_other_instances += other.writes_held_by_other_instances;
        self.skipped_confirmed += other.skipped_confirmed;
        self.reads_confirmed += other.reads_confirmed;
        self.writes_confirmed += other.writes_confirmed;
        self.bookkeeping_writes += other.bookkeeping_writes;
        self.multi_packet_responses += other.multi_packet_responses;
        self.duplicate_answers += other.duplicate_answers;
        self.go_backs += other.go_backs;
        self.timeouts += other.timeouts;
        self.retransmitted += other.retransmitted;
        self.malformed += other.malformed;
        self.foreign_answers += other.foreign_answers;
        self.failed_instances += other.failed_instances;
    }
}

/// PSNs kept free for the requests already under way, so probes and new
/// fetches never starve a chain of its next PSN.
fn reserved_packets(config: &P4Config) -> u32 {
    (entries_in_flight(config) as u32 * packets_per_entry(config)).min(WINDOW_PACKETS / 2)
}

/// PSNs one entry's data may take at the path MTU: a whole request's or
/// response's message. (Taken as 8, the reservation fell short at MTU
/// 256, where 4 KiB is 16 packets: a response then found no room on the
/// other queue pair, and the engine went back over the whole window.)
fn packets_per_entry(config: &P4Config) -> u32 {
    config
        .path_mtu
        .packets_for(crate::layout::MAX_REQUEST_BYTES)
        .max(1)
}

/// Entries started at once: the configured bound, and no more than the
/// reserved half of the window holds at the path MTU.
fn entries_in_flight(config: &P4Config) -> u64 {
    let fit = u64::from(WINDOW_PACKETS / 2 / packets_per_entry(config));
    config.max_entries_in_flight.min(fit).max(1)
}

impl Instance {
    /// The host on `side`.
    fn peer(&self, side: Side) -> Peer {
        match side {
            Side::Compute => self.compute.peer(),
            Side::Memory => self.memory.peer(),
        }
    }

    fn queue_pair(&mut self, side: Side) -> &mut ImpersonatedQueuePair {
        match side {
            Side::Compute => &mut self.compute,
            Side::Memory => &mut self.memory,
        }
    }

    fn fail(&mut self, reason: String) {
        if self.failed.is_none() {
            self.failed = Some(reason);
            self.stats.failed_instances += 1;
        }
    }

    fn on_generator(
        &mut self,
        now: Timestamp,
        config: &P4Config,
        out: &mut Vec<u8>,
    ) -> Option<PortId> {
        if self.recovering {
            return self.recover(now, config, out);
        }
        if self.compute.timed_out(now, config.timeout) || self.memory.timed_out(now, config.timeout)
        {
            self.stats.timeouts += 1;
            self.go_back(now, Side::Compute, None);
            return self.recover(now, config, out);
        }
        if self.bookkeeping_due {
            return self.send_bookkeeping(now, out);
        }
        if !self.compute.has_room(1 + reserved_packets(config)) {
            return None;
        }
        self.stats.probes += 1;
        let probe = self.read_of_block(Purpose::Probe, CLIENT_WORDS_AT, CLIENT_WORDS_BYTES);
        self.compute.send(now, probe, out, |_| {});
        Some(self.compute.port())
    }

    /// A READ of `length` bytes at `offset` of the compute block.
    fn read_of_block(&self, purpose: Purpose, offset: u64, length: u32) -> Sent {
        let target = self.block.offset(offset);
        Sent {
            purpose,
            write_segment: None,
            remote: target.address,
            rkey: target.rkey,
            length,
            payload_bytes: 0,
        }
    }

    /// One step of a go-back: the next packet to send again, or, once both
    /// hosts acknowledged everything, the end of it.
    fn recover(&mut self, now: Timestamp, config: &P4Config, out: &mut Vec<u8>) -> Option<PortId> {
        for side in [Side::Compute, Side::Memory] {
            if self.queue_pair(side).recovery_stalled(now, config.timeout) {
                self.queue_pair(side).go_back(now, None);
                self.stalled_recoveries += 1;
                if self.stalled_recoveries >= MAX_STALLED_RECOVERIES {
                    self.fail(format!(
                        "the {side:?} node answered nothing through {MAX_STALLED_RECOVERIES} go-backs in a row"
                    ));
                    return None;
                }
            }
            if self.queue_pair(side).poll_retransmit(out) {
                self.stats.retransmitted += 1;
                return Some(self.queue_pair(side).port());
            }
        }
        if !(self.compute.is_recovered() && self.memory.is_recovered()) {
            return None;
        }
        self.compute.finish_recovery();
        self.memory.finish_recovery();
        self.recovering = false;
        self.stalled_recoveries = 0;
        self.send_bookkeeping(now, out)
    }

    /// Starts a go-back: both queue pairs settle every unacknowledged PSN,
    /// and the instance will refetch from its oldest unconfirmed request.
    fn go_back(&mut self, now: Timestamp, side: Side, resume: Option<Psn>) {
        self.stats.go_backs += 1;
        self.recovering = true;
        self.compute
            .go_back(now, resume.filter(|_| side == Side::Compute));
        self.memory
            .go_back(now, resume.filter(|_| side == Side::Memory));
        let oldest = self.oldest_unconfirmed();
        self.fetch_cursor = oldest;
        self.start_cursor = oldest;
        self.started_reads.clear();
        self.started_writes.clear();
        self.unsent_writes = 0;
        // Whatever the hosts saw, the engine words are written afresh.
        self.bookkeeping_due = true;
    }

    fn oldest_unconfirmed(&self) -> u64 {
        let reads = self.started_reads.front().copied();
        let writes = self.started_writes.front().copied();
        [reads, writes]
            .into_iter()
            .flatten()
            .fold(self.start_cursor, u64::min)
    }

    fn on_answer(
        &mut self,
        now: Timestamp,
        config: &P4Config,
        side: Side,
        frame: &RoceFrame<'_>,
        out: &mut Vec<u8>,
    ) -> Option<PortId> {
        if self.failed.is_some() {
            return None;
        }
        let psn = frame.bth().psn;
        let syndrome = frame.aeth().map(|aeth| aeth.syndrome);
        if self.recovering {
            if let Some(refusal) = self
                .queue_pair(side)
                .handle_answer_recovering(now, psn, syndrome)
            {
                self.fail(format!("the {side:?} node refused a request: {refusal:?}"));
            }
            return None;
        }
        let mut answer = self
            .queue_pair(side)
            .handle_answer(now, frame.opcode(), psn, syndrome);
        if let Answer::WritesImplied { through } = answer {
            self.account_acknowledged(now, side, through)?;
            answer = self
                .queue_pair(side)
                .handle_answer(now, frame.opcode(), psn, syndrome);
        }
        match answer {
            Answer::Duplicate => {
                self.stats.duplicate_answers += 1;
                None
            }
            Answer::Lost { resume } => {
                self.go_back(now, side, resume);
                None
            }
            Answer::Refused(refusal) => {
                self.fail(format!("the {side:?} node refused a request: {refusal:?}"));
                None
            }
            Answer::Acknowledged => self.on_acknowledged(now, config, side, psn, out),
            Answer::ReadResponse(sent) => {
                if let Err(reason) = self.check_read_response(config, &sent, frame) {
                    self.fail(format!("the {side:?} node answered a READ {reason}"));
                    return None;
                }
                self.on_read_response(now, config, sent, frame.opcode(), frame.payload(), out)
            }
            Answer::WritesImplied { .. } => {
                unreachable!("the writes before the response were just accounted")
            }
        }
    }

    fn on_read_response(
        &mut self,
        now: Timestamp,
        config: &P4Config,
        sent: Sent,
        opcode: Opcode,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Option<PortId> {
        match sent.purpose {
            Purpose::Probe => {
                let tail = payload
                    .get(..8)
                    .map(|word| u64::from_le_bytes(word.try_into().expect("8 bytes")));
                let Some(tail) = tail else {
                    self.fail("a probe answer without the client words".into());
                    return None;
                };
                self.known_tail = self.known_tail.max(tail);
                let fetched = self.fetch(now, config, out);
                if fetched.is_none() {
                    self.stats.idle_probes += 1;
                }
                fetched
            }
            Purpose::Metadata { entry } => self.on_metadata(now, config, entry, payload, out),
            Purpose::Payload { entry } => {
                self.forward_data(now, config, Side::Memory, entry, opcode, payload, out)
            }
            Purpose::DataRead { entry } => {
                self.forward_data(now, config, Side::Compute, entry, opcode, payload, out)
            }
            _ => {
                // A WRITE's PSN never gets a READ response: the queue pair
                // refused it with `Lost` already; this is unreachable.
                self.go_back(now, Side::Compute, None);
                None
            }
        }
    }

    /// Recycles an answer into the next metadata READ, if a request waits
    /// and the in-flight bound allows.
    fn fetch(&mut self, now: Timestamp, config: &P4Config, out: &mut Vec<u8>) -> Option<PortId> {
        // A read fetched again after a pause may have let a later entry
        // start from a response already in flight.
        self.fetch_cursor = self.fetch_cursor.max(self.start_cursor);
        let waiting = self.fetch_cursor < self.known_tail;
        let under_bound = self.fetch_cursor - self.oldest_unconfirmed() < entries_in_flight(config);
        if !(waiting && under_bound && self.compute.has_room(1 + reserved_packets(config))) {
            return None;
        }
        let entry = self.fetch_cursor;
        self.fetch_cursor += 1;
        self.stats.metadata_reads += 1;
        let offset = self.sizes.entry_at(entry);
        let read = self.read_of_block(Purpose::Metadata { entry }, offset, ENTRY_BYTES as u32);
        self.compute.send(now, read, out, |_| {});
        Some(self.compute.port())
    }

    fn on_metadata(
        &mut self,
        now: Timestamp,
        config: &P4Config,
        index: u64,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Option<PortId> {
        if index != self.start_cursor {
            // Fetched behind a paused read: it will be fetched again.
            return self.fetch(now, config, out);
        }
        let entry = match payload.get(..ENTRY_BYTES as usize).map(Entry::parse) {
            Some(Ok(entry)) if usize::from(entry.region) < self.regions.len() => entry,
            other => {
                self.fail(format!("entry {index} makes no sense: {other:?}"));
                return None;
            }
        };
        let done = match entry.kind {
            Kind::Read => entry.sequence <= self.read_progress,
            Kind::Write => entry.sequence <= self.write_progress,
        };
        if done {
            // Confirmed before a go-back rewound to an older request of the
            // other type: running it again would touch ring space the
            // client has reused (simulator seed 14, multi-packet reads).
            self.stats.skipped_confirmed += 1;
            self.start_cursor += 1;
            return self.fetch(now, config, out);
        }
        match entry.kind {
            Kind::Read => self.start_read(now, config, index, entry, out),
            Kind::Write => self.start_write(now, config, index, entry, out),
        }
    }

    /// Phase III for a read: the metadata response becomes the data READ
    /// from the pool, unless a write has not yet sent its payload there.
    fn start_read(
        &mut self,
        now: Timestamp,
        config: &P4Config,
        index: u64,
        entry: Entry,
        out: &mut Vec<u8>,
    ) -> Option<PortId> {
        let packets = config.path_mtu.packets_for(entry.length);
        if self.unsent_writes > 0 || !self.memory.has_room(packets) {
            self.stats.reads_paused += 1;
            self.fetch_cursor = index;
            return None;
        }
        self.stash(index, entry);
        self.started_reads.push_back(index);
        self.stats.reads_started += 1;
        let target = self.regions[usize::from(entry.region)].offset(entry.request_address);
        let read = Sent {
            purpose: Purpose::DataRead { entry: index },
            write_segment: None,
            remote: target.address,
            rkey: target.rkey,
            length: entry.length,
            payload_bytes: 0,
        };
        self.memory.send(now, read, out, |_| {});
        Some(self.memory.port())
    }

    /// Phase III for a write: the metadata response becomes the READ of its
    /// payload from the compute node, one write at a time.
    fn start_write(
        &mut self,
        now: Timestamp,
        config: &P4Config,
        index: u64,
        entry: Entry,
        out: &mut Vec<u8>,
    ) -> Option<PortId> {
        let packets = config.path_mtu.packets_for(entry.length);
        if packets > 1 {
            self.fail(format!("write {index} is longer than the path MTU"));
            return None;
        }
        let held_by_other = self.overlaps_another_instance(&entry, config.path_mtu.bytes());
        if !self.started_writes.is_empty() || held_by_other || !self.compute.has_room(packets) {
            // One write at a time, across instances too: a go-back may run
            // a write again after its original landed, and with a later
            // write in between (this instance's or another's) the pool
            // would go back in time.
            self.stats.writes_paused += 1;
            if held_by_other && self.started_writes.is_empty() {
                self.stats.writes_held_by_other_instances += 1;
            }
            self.fetch_cursor = index;
            return None;
        }
        self.stash(index, entry);
        self.started_writes.push_back(index);
        self.pending_write = Some(self.pages_of(&entry, config.path_mtu.bytes()));
        self.unsent_writes += 1;
        self.stats.writes_started += 1;
        let read = self.read_of_block(
            Purpose::Payload { entry: index },
            entry.request_address,
            entry.length,
        );
        self.compute.send(now, read, out, |_| {});
        Some(self.compute.port())
    }

    /// Keeps a started entry where its answers will find it, and lets the
    /// next entry start.
    fn stash(&mut self, index: u64, entry: Entry) {
        assert_eq!(index, self.start_cursor, "entries start in ring order");
        let slot = self.slot_of(index);
        self.entries.update(slot, |_| Some(entry));
        self.start_cursor += 1;
    }

    /// Where the entry at ring position `index` is stashed.
    fn slot_of(&self, index: u64) -> usize {
        (index % self.sizes.metadata_entries) as usize
    }

    /// The entry stashed for ring position `index`, if one is.
    fn stashed(&self, index: u64) -> Option<Entry> {
        self.entries.read(self.slot_of(index)).flatten()
    }

    /// Recycles a READ response into the WRITE packet of the same place in
    /// its message: a read's bytes into the response ring (`to` compute),
    /// a write's payload into the pool (`to` memory).
    #[allow(clippy::too_many_arguments)]
    fn forward_data(
        &mut self,
        now: Timestamp,
        config: &P4Config,
        to: Side,
        index: u64,
        opcode: Opcode,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Option<PortId> {
        let entry = self.stashed(index).expect("started entries are stashed");
        let segment = opcode.segment();
        if segment != Segment::Only {
            self.stats.multi_packet_responses += 1;
        }
        let last = matches!(segment, Segment::Last | Segment::Only);
        let (purpose, target) = match to {
            Side::Compute => (
                Purpose::ResponseWrite { entry: index, last },
                self.block.offset(entry.response_address),
            ),
            Side::Memory => (
                Purpose::DataWrite { entry: index, last },
                self.regions[usize::from(entry.region)].offset(entry.response_address),
            ),
        };
        let starts = matches!(segment, Segment::First | Segment::Only);
        let packets = config.path_mtu.packets_for(entry.length);
        let queue_pair = self.queue_pair(to);
        let may_send = if starts {
            queue_pair.has_room(packets)
        } else {
            queue_pair.can_continue_message()
        };
        if !may_send {
            self.go_back(now, to, None);
            return None;
        }
        let write = Sent {
            purpose,
            write_segment: Some(segment),
            remote: target.address,
            rkey: target.rkey,
            length: entry.length,
            payload_bytes: payload.len() as u32,
        };
        queue_pair.send(now, write, out, |bytes| bytes.copy_from_slice(payload));
        if to == Side::Memory && last {
            self.unsent_writes -= 1;
        }
        Some(self.queue_pair(to).port())
    }

    /// An ACK in order: confirms the requests whose last WRITE it covers,
    /// then recycles into the bookkeeping WRITE, or else into the next
    /// metadata READ.
    /// Accounts the WRITEs the host executed through `psn`: the entries
    /// whose last WRITE they were are confirmed, and bookkeeping falls due.
    /// Whether any was; `None` after a go-back (a confirmation out of
    /// place).
    fn account_acknowledged(&mut self, now: Timestamp, side: Side, psn: Psn) -> Option<bool> {
        let mut confirmed = std::mem::take(&mut self.confirmed);
        confirmed.clear();
        self.queue_pair(side)
            .take_acknowledged(now, psn, |sent| match sent.purpose {
                Purpose::ResponseWrite { entry, last: true } => confirmed.push((Kind::Read, entry)),
                Purpose::DataWrite { entry, last: true } => confirmed.push((Kind::Write, entry)),
                _ => {}
            });
        let any = !confirmed.is_empty();
        let in_place = confirmed
            .iter()
            .all(|&(kind, index)| self.confirm(kind, index));
        self.confirmed = confirmed;
        if !in_place {
            self.go_back(now, side, None);
            return None;
        }
        if any {
            self.bookkeeping_due = true;
        }
        Some(any)
    }

    fn on_acknowledged(
        &mut self,
        now: Timestamp,
        config: &P4Config,
        side: Side,
        psn: Psn,
        out: &mut Vec<u8>,
    ) -> Option<PortId> {
        if self.account_acknowledged(now, side, psn)? {
            return self.send_bookkeeping(now, out);
        }
        if side == Side::Compute {
            return self.fetch(now, config, out);
        }
        None
    }

    /// The pool pages a write entry covers (its region was checked).
    fn pages_of(&self, entry: &Entry, page_bytes: u32) -> WritePages {
        let target = self.regions[usize::from(entry.region)].offset(entry.response_address);
        WritePages::of(
            self.memory.peer_address(),
            target.address.0,
            entry.length,
            page_bytes,
        )
    }

    /// Whether a write to `entry`'s bytes could be undone: another
    /// instance's unconfirmed write to the same pages may land again.
    fn overlaps_another_instance(&self, entry: &Entry, page_bytes: u32) -> bool {
        let pages = self.pages_of(entry, page_bytes);
        self.others_pending
            .iter()
            .any(|other| other.overlaps(&pages))
    }

    /// Whether a READ response packet is what its PSN was due, as a
    /// requester checks (the soft RNIC's does): the path MTU of bytes, the
    /// last packet what is left, and the segment of its place in the
    /// message. A shorter one (another MTU, a hostile host) went on as a
    /// WRITE packet of its length: the message took more PSNs than its
    /// reservation, and a go-back's fillers, counted in MTUs from the bytes
    /// left, more still. One of the wrong segment made the engine go back,
    /// for ever if the host kept answering so.
    fn check_read_response(
        &self,
        config: &P4Config,
        sent: &Sent,
        frame: &RoceFrame<'_>,
    ) -> Result<(), String> {
        let mtu = config.path_mtu.bytes();
        let due_bytes = sent.length.min(mtu) as usize;
        if frame.payload().len() != due_bytes {
            return Err(format!(
                "with {} bytes where {due_bytes} were due",
                frame.payload().len()
            ));
        }
        // Each PSN of a READ records what is left from it on: the first
        // has the whole message's length.
        let message_bytes = match sent.purpose {
            Purpose::Payload { entry } | Purpose::DataRead { entry } => self
                .stashed(entry)
                .map_or(sent.length, |stashed| stashed.length),
            _ => sent.length,
        };
        let due_segment = match (sent.length == message_bytes, sent.length <= mtu) {
            (true, true) => Segment::Only,
            (true, false) => Segment::First,
            (false, true) => Segment::Last,
            (false, false) => Segment::Middle,
        };
        let segment = frame.opcode().segment();
        if segment != due_segment {
            return Err(format!(
                "with a {segment:?} packet where a {due_segment:?} was due"
            ));
        }
        Ok(())
    }

    /// Records a request as complete; false if it is not the oldest of its
    /// type (which in-order queue pairs rule out).
    fn confirm(&mut self, kind: Kind, index: u64) -> bool {
        let started = match kind {
            Kind::Read => &mut self.started_reads,
            Kind::Write => &mut self.started_writes,
        };
        if started.front() != Some(&index) {
            return false;
        }
        started.pop_front();
        let sequence = self.stashed(index).expect("stashed").sequence;
        match kind {
            Kind::Read => {
                self.read_progress = sequence;
                self.stats.reads_confirmed += 1;
            }
            Kind::Write => {
                self.write_progress = sequence;
                self.pending_write = None;
                self.stats.writes_confirmed += 1;
            }
        }
        true
    }

    /// Phase IV: the engine words in one WRITE.
    fn send_bookkeeping(&mut self, now: Timestamp, out: &mut Vec<u8>) -> Option<PortId> {
        if !self.compute.has_room(1) {
            return None;
        }
        self.bookkeeping_due = false;
        self.stats.bookkeeping_writes += 1;
        let target = self.block.offset(ENGINE_WORDS_AT);
        let write = Sent {
            purpose: Purpose::Bookkeeping,
            write_segment: Some(Segment::Only),
            remote: target.address,
            rkey: target.rkey,
            length: ENGINE_WORDS_BYTES,
            payload_bytes: ENGINE_WORDS_BYTES,
        };
        let words = [self.start_cursor, self.read_progress, self.write_progress];
        self.compute.send(now, write, out, |bytes| {
            for (chunk, word) in bytes.chunks_exact_mut(8).zip(words) {
                chunk.copy_from_slice(&word.to_le_bytes());
            }
        });
        Some(self.compute.port())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_wire::frame::{emit_frame, MAX_FRAME_LEN};
    use remora_wire::{AckSyndrome, AethRepr, Msn, NakCode, Rkey, VirtAddr};

    const SIZES: RingSizes = RingSizes {
        metadata_entries: 64,
        request_data_bytes: 4096,
        response_data_bytes: 4096,
    };
    const ACK: AckSyndrome = AckSyndrome::Ack { credit_count: 31 };

    /// An engine with `instances` instances over one shared pool region,
    /// every queue pair starting at PSN 0.
    fn engine(instances: usize) -> P4Engine {
        let mut engine = P4Engine::new(P4Config::rack_default());
        let remote = |address| RemoteAddress {
            address: VirtAddr(address),
            rkey: Rkey(0x42),
        };
        let peer = |port, last| Peer {
            port: PortId(port),
            mac: MacAddress([2, 0, 0, 0, 0, last]),
            address: Ipv4Address::new(10, 0, 0, last),
            qpn: Qpn::new(0x11).expect("24 bits"),
            initial_psn: Psn::new(0),
        };
        for index in 0..instances {
            engine
                .add_instance(InstanceSpec {
                    compute: peer(0, 1),
                    memory: peer(1, 2),
                    block: remote(0x10_0000 * (index as u64 + 1)),
                    sizes: SIZES,
                    regions: vec![remote(0x1000)],
                })
                .expect("the instances fit");
        }
        engine
    }

    /// A host's answer: `opcode` at `psn` with `syndrome` and `payload`.
    fn answer(opcode: Opcode, psn: Psn, syndrome: AckSyndrome, payload: &[u8]) -> Vec<u8> {
        answer_from(1, opcode, psn, syndrome, payload)
    }

    /// The same from host `last` (10.0.0.`last`), to the compute side's
    /// queue pair.
    fn answer_from(
        last: u8,
        opcode: Opcode,
        psn: Psn,
        syndrome: AckSyndrome,
        payload: &[u8],
    ) -> Vec<u8> {
        let config = P4Config::rack_default();
        let host = (
            MacAddress([2, 0, 0, 0, 0, last]),
            Ipv4Address::new(10, 0, 0, last),
        );
        let bth = BthRepr::new(opcode, Qpn::new(FIRST_QPN).expect("24 bits"), psn);
        let mut repr = FrameRepr::between(host, (config.mac, config.address), 0xc000, bth);
        repr.extension.aeth = Some(AethRepr {
            syndrome,
            msn: Msn::new(0),
        });
        let mut bytes = vec![0u8; MAX_FRAME_LEN];
        let length = emit_frame(&repr.with_payload_len(payload.len()), payload, &mut bytes)
            .expect("a small frame");
        bytes.truncate(length);
        bytes
    }

    /// The host's answer to `request`, a frame the engine sent: `data` in
    /// a READ RESPONSE ONLY to a READ, an ACK to a WRITE.
    fn reply(request: &[u8], data: &[u8]) -> Vec<u8> {
        let frame = RoceFrame::new_checked(request).expect("the engine sends valid frames");
        match frame.opcode() {
            Opcode::RdmaReadRequest => {
                answer(Opcode::RdmaReadResponseOnly, frame.bth().psn, ACK, data)
            }
            _ => answer(Opcode::Acknowledge, frame.bth().psn, ACK, &[]),
        }
    }

    /// Instance `index` hears `bytes` from its `side` host; what the
    /// engine sent for it, if anything.
    fn hear(
        engine: &mut P4Engine,
        now: Timestamp,
        index: usize,
        side: Side,
        bytes: Vec<u8>,
    ) -> Option<Vec<u8>> {
        let headers = parser::parse(&bytes).expect("a valid frame");
        let mut packet = Packet::new(bytes, PortId(0), headers);
        engine.on_answer(now, Some((index, side)), &mut packet);
        matches!(packet.egress, Egress::Port(_)).then_some(packet.bytes)
    }

    /// Instance `index` probes, finds `tail` entries issued and fetches
    /// the next, which is `entry`: what the engine sent to start it (a
    /// data READ, a payload READ), if it started.
    fn fetch_entry(
        engine: &mut P4Engine,
        now: Timestamp,
        index: usize,
        tail: u64,
        entry: Entry,
    ) -> Option<Vec<u8>> {
        let config = engine.config;
        let mut probe = Vec::new();
        engine.instances[index]
            .on_generator(now, &config, &mut probe)
            .expect("a probe");
        let mut words = [0u8; CLIENT_WORDS_BYTES as usize];
        words[..8].copy_from_slice(&tail.to_le_bytes());
        let metadata = hear(engine, now, index, Side::Compute, reply(&probe, &words))
            .expect("a metadata READ");
        let mut raw = [0u8; ENTRY_BYTES as usize];
        entry.emit(&mut raw);
        hear(engine, now, index, Side::Compute, reply(&metadata, &raw))
    }

    /// Instance 0 starts [`write_at_zero`]: the data WRITE it sends the
    /// pool, which no ACK answers yet.
    fn start_unacknowledged_write(engine: &mut P4Engine, now: Timestamp) -> Vec<u8> {
        let payload = fetch_entry(engine, now, 0, 1, write_at_zero()).expect("a payload READ");
        hear(engine, now, 0, Side::Compute, reply(&payload, &[0xaa; 8])).expect("the data WRITE")
    }

    fn opcode_and_psn(frame: &[u8]) -> (Opcode, u32) {
        let frame = RoceFrame::new_checked(frame).expect("the engine sends valid frames");
        (frame.opcode(), frame.bth().psn.value())
    }

    /// 8 bytes at offset 0 of the pool, from the request data ring.
    fn write_at_zero() -> Entry {
        Entry {
            kind: Kind::Write,
            region: 0,
            length: 8,
            request_address: SIZES.request_data_at(),
            response_address: 0,
            sequence: 1,
        }
    }

    /// A sequence NAK from the memory node past a READ whose answer went
    /// missing and a WRITE after it: the host executed both, but only
    /// WRITEs before the first READ were confirmed, so the go-back
    /// fetched the write again and landed it a second time (over another
    /// instance's write to the same bytes, if one came in between).
    #[test]
    fn a_sequence_nak_past_a_read_confirms_the_write_after_it() {
        let mut engine = engine(1);
        let now = Timestamp::ZERO;
        let read = |sequence, slot: u64| Entry {
            kind: Kind::Read,
            region: 0,
            length: 8,
            request_address: 0,
            response_address: SIZES.response_data_at() + 8 * slot,
            sequence,
        };
        // Memory PSN 0: a read of the bytes the write then writes.
        let first = fetch_entry(&mut engine, now, 0, 4, read(1, 0)).expect("a data READ");
        assert_eq!(opcode_and_psn(&first), (Opcode::RdmaReadRequest, 0));
        // Memory PSN 1: the write's payload, into the pool.
        let payload = fetch_entry(&mut engine, now, 0, 4, write_at_zero()).expect("a payload READ");
        let data_write = hear(&mut engine, now, 0, Side::Compute, reply(&payload, &[7; 8]))
            .expect("the data WRITE");
        assert_eq!(opcode_and_psn(&data_write), (Opcode::RdmaWriteOnly, 1));
        // Memory PSNs 2 and 3: two more reads.
        fetch_entry(&mut engine, now, 0, 4, read(2, 1)).expect("a data READ");
        fetch_entry(&mut engine, now, 0, 4, read(3, 2)).expect("a data READ");
        // The answer to PSN 0 and PSN 2 itself are lost; PSN 3 arrives, so
        // the memory node, having executed 0 and 1, NAKs 2.
        let nak = AckSyndrome::Nak(NakCode::PsnSequenceError);
        let nak = answer(Opcode::Acknowledge, Psn::new(2), nak, &[]);
        assert_eq!(hear(&mut engine, now, 0, Side::Memory, nak), None);
        let instance = &engine.instances[0];
        assert!(instance.recovering);
        assert_eq!(
            (instance.write_progress, instance.stats.writes_confirmed),
            (1, 1),
            "{}",
            engine.describe(0).expect("one instance")
        );
        assert_eq!(instance.read_progress, 0, "the reads are redone");
    }

    /// Instance 0's write landed and its ACK was lost; the timeout's
    /// go-back will land it again at fresh PSNs. Instance 1's write to the
    /// same bytes started in between, landed and was confirmed, and the
    /// redo then put instance 0's older bytes back over it: a completed
    /// write lost, after a reader may have seen instance 0's bytes before
    /// it (Spot's overlap guard keeps such orphans; the switch cannot
    /// compare ranges, so it holds every other instance's writes).
    #[test]
    fn a_write_waits_while_another_instances_write_may_land_again() {
        let config = P4Config::rack_default();
        let mut engine = engine(2);
        let mut out = Vec::new();
        let now = Timestamp::ZERO;
        let data_write = start_unacknowledged_write(&mut engine, now);
        assert_eq!(opcode_and_psn(&data_write), (Opcode::RdmaWriteOnly, 0));
        // No ACK: the timeout starts a go-back (a filler at PSN 0).
        let later = now.saturating_add(config.timeout * 2);
        engine.instances[0]
            .on_generator(later, &config, &mut out)
            .expect("the go-back's filler");
        assert!(engine.instances[0].recovering);
        // Instance 1 writes the same 8 bytes: it must wait.
        let started = fetch_entry(&mut engine, later, 1, 1, write_at_zero());
        let stats = engine.instances[1].stats;
        assert!(started.is_none(), "instance 1's write started: {stats:?}");
        assert_eq!((stats.writes_started, stats.writes_paused), (0, 1));
        assert_eq!(stats.writes_held_by_other_instances, 1);
        // Instance 0 recovers and lands its write again, confirmed.
        let ack = answer(Opcode::Acknowledge, Psn::new(0), ACK, &[]);
        assert_eq!(hear(&mut engine, later, 0, Side::Memory, ack), None);
        engine.instances[0]
            .on_generator(later, &config, &mut out)
            .expect("the bookkeeping WRITE ending the go-back");
        let metadata = hear(&mut engine, later, 0, Side::Compute, reply(&out, &[]))
            .expect("the metadata READ again");
        let mut raw = [0u8; ENTRY_BYTES as usize];
        write_at_zero().emit(&mut raw);
        let payload = hear(&mut engine, later, 0, Side::Compute, reply(&metadata, &raw))
            .expect("the payload READ again");
        let data_write = hear(
            &mut engine,
            later,
            0,
            Side::Compute,
            reply(&payload, &[0xaa; 8]),
        )
        .expect("the data WRITE again");
        hear(&mut engine, later, 0, Side::Memory, reply(&data_write, &[]));
        assert_eq!(engine.instances[0].write_progress, 1);
        // Now instance 1's write goes.
        let started = fetch_entry(&mut engine, later, 1, 1, write_at_zero());
        assert!(started.is_some(), "{}", engine.describe(1).expect("two"));
    }

    /// An instance that failed with its data WRITE unacknowledged redoes
    /// nothing, but that WRITE may still be on the wire: released at once,
    /// its pages let another instance's write to them start, and the late
    /// WRITE could land over it. They are held one timeout past the failure.
    #[test]
    fn a_failed_instances_pages_are_held_while_its_last_write_may_land() {
        let config = P4Config::rack_default();
        let mut engine = engine(2);
        let now = Timestamp::ZERO;
        start_unacknowledged_write(&mut engine, now);
        // A probe answered with the wrong length fails instance 0.
        let mut probe = Vec::new();
        engine.instances[0]
            .on_generator(now, &config, &mut probe)
            .expect("a probe");
        assert_eq!(
            hear(&mut engine, now, 0, Side::Compute, reply(&probe, &[0; 3])),
            None
        );
        assert!(engine.failure(0).is_some(), "instance 0 failed");
        let held = fetch_entry(&mut engine, now, 1, 1, write_at_zero());
        assert!(
            held.is_none(),
            "instance 1's write started beside a WRITE on the wire"
        );
        let later = now.saturating_add(config.timeout * 2);
        let started = fetch_entry(&mut engine, later, 1, 1, write_at_zero());
        assert!(started.is_some(), "{}", engine.describe(1).expect("two"));
    }

    /// A READ of 2048 bytes at MTU 1024 answered at its first PSN by a
    /// READ RESPONSE ONLY of 1024 bytes: the right length, the wrong place
    /// in the message. It made the engine go back, and a host answering so
    /// each time kept it going back for ever; the instance fails, saying so.
    #[test]
    fn a_read_response_of_the_wrong_segment_fails_its_instance() {
        let mut engine = engine(1);
        let now = Timestamp::ZERO;
        let read = Entry {
            kind: Kind::Read,
            region: 0,
            length: 2048,
            request_address: 0,
            response_address: SIZES.response_data_at(),
            sequence: 1,
        };
        let data_read = fetch_entry(&mut engine, now, 0, 1, read).expect("a data READ");
        let psn = Psn::new(opcode_and_psn(&data_read).1);
        let only = answer(Opcode::RdmaReadResponseOnly, psn, ACK, &[5; 1024]);
        assert_eq!(hear(&mut engine, now, 0, Side::Memory, only), None);
        let failure = engine.failure(0).expect("the instance failed");
        assert!(failure.contains("Only packet where a First"), "{failure}");
    }

    /// Any host could address a frame to the engine's queue pairs, and the
    /// engine believed it: a refusal NAK from another address, or from the
    /// compute node's address on the memory node's port, stopped the
    /// instance for good. Only the compute node, on its port, is heard.
    #[test]
    fn an_answer_from_anyone_but_the_connected_host_is_dropped_unread() {
        let mut engine = engine(1);
        let config = engine.config;
        let now = Timestamp::ZERO;
        let mut probe = Vec::new();
        engine.instances[0]
            .on_generator(now, &config, &mut probe)
            .expect("a probe");
        let psn = Psn::new(opcode_and_psn(&probe).1);
        let refusal = AckSyndrome::Nak(NakCode::RemoteAccessError);
        let arrive = |engine: &mut P4Engine, last: u8, port: u16| {
            let bytes = answer_from(last, Opcode::Acknowledge, psn, refusal, &[]);
            let headers = parser::parse(&bytes).expect("a valid frame");
            let mut packet = Packet::new(bytes, PortId(port), headers);
            let claim = engine.before_forwarding(now, &mut packet);
            assert!(matches!(claim, Claim::Taken));
            packet.egress
        };
        // Another host on the compute node's port, and the compute node's
        // address on the memory node's port: dropped unread.
        assert_eq!(arrive(&mut engine, 9, 0), Egress::Drop);
        assert_eq!(arrive(&mut engine, 1, 1), Egress::Drop);
        assert_eq!(engine.failure(0), None);
        assert_eq!(engine.stats().foreign_answers, 2);
        // The compute node itself is believed, its answer taken.
        assert_eq!(arrive(&mut engine, 1, 0), Egress::Consumed);
        let failure = engine.failure(0).expect("a refusal from the host fails it");
        assert!(failure.contains("refused"), "{failure}");
        assert_eq!(engine.stats().foreign_answers, 2);
    }

    /// A probe (a generator packet's frame) waited in the compute port's
    /// background queue while a metadata READ that an answer started, at
    /// the next PSN of the same queue pair, went by the normal queue and
    /// left first: the host saw the PSNs out of order and NAKed, and the
    /// engine went back. Every engine frame now takes one queue.
    #[test]
    fn a_queue_pairs_frames_leave_a_backed_up_port_in_psn_order() {
        use remora_switch::{Emitted, Switch, SwitchConfig};
        let engine = engine(1);
        let period = engine.config.probe_period;
        let template = engine.probe_template();
        let forwarding = L2L3Forwarding::new(MacAddress([2, 0, 0, 0, 0, 0xfe]), 16);
        let mut switch = Switch::new(SwitchConfig::new(2), Overlaid::new(forwarding, engine));
        switch
            .add_template(template, Timestamp::ZERO)
            .expect("one template");
        let mut buffer = vec![0u8; MAX_FRAME_LEN];
        let mut transmit = |switch: &mut Switch<CowbirdP4>| {
            let (port, length) = switch.poll_transmit(Timestamp::ZERO, &mut buffer)?;
            Some((port, buffer[..length].to_vec()))
        };
        // The first probe (PSN 0) leaves; the second (PSN 1) waits, the
        // port backed up.
        switch.handle_timeout(Timestamp::ZERO);
        let (_, first) = transmit(&mut switch).expect("the first probe");
        let now = Timestamp::ZERO.saturating_add(period);
        switch.handle_timeout(now);
        // The answer to the first finds an entry: the metadata READ (PSN 2).
        let mut words = [0u8; CLIENT_WORDS_BYTES as usize];
        words[..8].copy_from_slice(&1u64.to_le_bytes());
        let answer = reply(&first, &words);
        switch.handle_frame_with(now, PortId(0), &answer, &mut |_, _| Emitted::Refused);
        let mut psns = Vec::new();
        while let Some((port, frame)) = transmit(&mut switch) {
            assert_eq!(port, PortId(0));
            psns.push(opcode_and_psn(&frame).1);
        }
        assert_eq!(psns, vec![1, 2]);
    }

    /// The guard holds writes to the pages another instance's unconfirmed
    /// write may land on, not every write: one to another page goes.
    #[test]
    fn a_write_to_other_pages_goes_beside_another_instances_unconfirmed_one() {
        let mut engine = engine(2);
        let now = Timestamp::ZERO;
        start_unacknowledged_write(&mut engine, now);
        let page_bytes = engine.config.path_mtu.bytes();
        let pages = |entry: &Entry| engine.instances[1].pages_of(entry, page_bytes);
        let next_page = Entry {
            response_address: u64::from(page_bytes),
            ..write_at_zero()
        };
        let last_byte_of_first_page = Entry {
            response_address: u64::from(page_bytes) - 1,
            length: 1,
            ..write_at_zero()
        };
        assert!(pages(&last_byte_of_first_page).overlaps(&pages(&write_at_zero())));
        assert!(!pages(&next_page).overlaps(&pages(&write_at_zero())));
        let started = fetch_entry(&mut engine, now, 1, 1, next_page);
        let stats = engine.instances[1].stats;
        assert!(started.is_some(), "held: {stats:?}");
        assert_eq!((stats.writes_started, stats.writes_paused), (1, 0));
    }

    /// At MTU 256 a 4 KiB entry is 16 packets: the reservation took 8 per
    /// entry, 32 entries (256 PSNs, capped at 128), and a response found
    /// no room on the other queue pair. Entries in flight now fit the
    /// reserved half-window at the path MTU.
    #[test]
    fn the_reservation_holds_every_entry_in_flight_at_the_path_mtu() {
        for (mtu, entries) in [(Mtu::MTU_256, 8), (Mtu::MTU_1024, 32), (Mtu::MTU_4096, 32)] {
            let config = P4Config {
                path_mtu: mtu,
                ..P4Config::rack_default()
            };
            assert_eq!(entries_in_flight(&config), entries, "{mtu:?}");
            let needed = entries_in_flight(&config) as u32 * packets_per_entry(&config);
            assert!(reserved_packets(&config) >= needed, "{mtu:?}");
            assert!(reserved_packets(&config) <= WINDOW_PACKETS / 2);
        }
    }
}
