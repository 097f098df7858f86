//! The Gatekeeper's stage for RDMA to the DSM's memory nodes: every
//! request a client sends a memory node is checked against the ACL
//! ([`super::acl`]) before it may pass, and refused by default.
//!
//! - READ and WRITE carry their target in the RETH (virtual address,
//!   rkey, length); the address is turned into an offset of the node's
//!   pool. A WRITE's middle and last packets carry none, so the verdict on
//!   its first packet holds for the rest of the message, per connection.
//! - alloc, free, stat, snapshot and restore are SENDs to the node's
//!   daemon (`dsm::message`): free, snapshot and restore need control,
//!   stat a lease; an alloc passes if the ACL has room, and its reply
//!   (the daemon's SEND back) installs the requester's control. A free's
//!   reply deletes the allocation's rules: until then a copy of the free
//!   that RC sends again (the first lost on the way) still passes.
//! - A refused request is dropped, and the switch answers it in the
//!   memory node's name with an IB NAK (remote access error) for the
//!   request's PSN, so the client fails at once rather than retrying; its
//!   queue pair goes to the error state, as after any remote access error.
//!   The NAK needs the client's queue pair, which no request carries: the
//!   control plane installs each connection (the pair of queue pairs), as
//!   it would learn them from the connection manager's exchange. A request
//!   on a connection it does not know is dropped without a NAK.
//!
//! Memory stays unchanged: nothing refused reaches the node.
//!
//! A request must come from the client its connection was installed for,
//! and, where the control plane said which switch port that client is on,
//! through that port: RoCE carries no proof of who sent a packet, and
//! without the check a host could use another's address (and its rights).
//! Such a request is dropped with no NAK, which would break the real
//! client's connection.

use super::acl::{Acl, AclConfig, AclError, Operation};
use crate::dsm::message::{self, Operation as DsmOperation, Status, MESSAGE_LEN};
use remora_base::PortId;
use remora_base::Timestamp;
use remora_switch::packet::{Digest, Egress, Packet};
use remora_switch::resources::ResourceReport;
use remora_switch::table::{ExactTable, TableShape};
use remora_wire::frame::{emit_frame, FrameRepr};
use remora_wire::{
    AckSyndrome, AethRepr, AtomicEthHeader, AtomicEthRepr, BthRepr, Ipv4Address, Msn, NakCode,
    Opcode, Psn, Qpn, RethHeader, RethRepr, Rkey,
};
use std::collections::VecDeque;

/// Digests of the memory stage.
pub const DIGEST_ALLOC: u16 = 0xb1f4;
pub const DIGEST_FREE: u16 = 0xb1f5;
/// A request the ACL refused: values[0] the source, [1] the memory node.
pub const DIGEST_ACCESS_REFUSED: u16 = 0xb1f6;

/// A memory node of the DSM as the switch knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryNode {
    /// Its index among the DSM's nodes (a `GlobalPtr`'s node).
    pub index: u8,
    /// Where its pool starts in its registered memory, how long it is,
    /// and the key that reaches it.
    pub pool_base: u64,
    pub pool_bytes: u64,
    pub rkey: Rkey,
}

/// A client's queue pair connected to a memory node's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Connection {
    client: Ipv4Address,
    client_qpn: Qpn,
    /// The verdict on the WRITE whose first packet passed last, while its
    /// middle and last packets are still to come.
    open_write: Option<bool>,
    /// The PSN of the last packet of the newest allowed WRITE that ended.
    /// Go-back-N resends a WRITE from a lost middle packet, after its last
    /// passed: those packets are that allowed WRITE's, and must pass.
    allowed_write_end: Option<Psn>,
}

/// How far back a resent WRITE packet may be from the newest allowed
/// WRITE's end: far beyond any send window, well within the half of the
/// PSN space in which PSNs compare.
const RESENT_WRITE_REACH_PSNS: i32 = 1 << 20;

/// What the memory stage counted, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryCounters {
    pub reads_allowed: u64,
    pub writes_allowed: u64,
    pub reads_refused: u64,
    pub writes_refused: u64,
    /// DSM messages refused: free, snapshot or restore without control,
    /// stat without a lease, alloc with the ACL full, malformed.
    pub messages_refused: u64,
    /// Allocations whose control rule was installed, and frees whose
    /// daemon replied that they happened (their rules then went).
    pub allocations: u64,
    pub frees: u64,
    /// Requests on a connection the control plane never installed:
    /// dropped with no NAK (there is no queue pair to address).
    pub unknown_connections: u64,
    /// Packets of a refused WRITE after its first: dropped.
    pub refused_continuations: u64,
    /// Allocs refused because the ACL (with the allocs awaiting their
    /// replies) was full.
    pub acl_full: u64,
    /// NAKs the switch sent.
    pub naks_sent: u64,
    /// Requests from another source than their connection's client, or
    /// through another port than that client's: dropped, no NAK.
    pub spoofed: u64,
    /// Frames to a memory node's RoCE port whose transport headers do not
    /// parse: dropped.
    pub malformed: u64,
}

impl MemoryCounters {
    /// Requests refused by the ACL: READs, WRITEs and DSM messages.
    pub fn refused(&self) -> u64 {
        self.reads_refused + self.writes_refused + self.messages_refused
    }
}

/// Allocs awaiting their replies: memory node, client, request id.
type PendingKey = (Ipv4Address, Ipv4Address, u32);

/// A request as RC carries it: its queue pair and PSN. A resend keeps
/// both; a new request under a reused id (a client's DSM restarted, or a
/// hostile one) has another PSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Carried {
    queue_pair: Qpn,
    psn: Psn,
}

/// A request that passed: since when, what its reply will do, and how it
/// was carried.
type Passed = (Timestamp, Awaiting, Carried);

/// What a request passed to a daemon waits for its reply to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Awaiting {
    /// Install the requester's control over `size` bytes at the offset the
    /// reply names.
    Allocate { size: u64 },
    /// Delete every rule of the allocation at `offset`.
    Free { offset: u64 },
}

pub struct MemoryStage {
    pub(super) acl: Acl,
    nodes: ExactTable<Ipv4Address, MemoryNode>,
    connections: ExactTable<(Ipv4Address, Qpn), Connection>,
    /// The switch port each client and memory node is attached to, where
    /// the control plane gave it.
    host_ports: ExactTable<Ipv4Address, PortId>,
    /// Allocs and frees awaiting their daemon's reply, since when.
    pending: ExactTable<PendingKey, Passed>,
    /// Allocs and frees whose reply passed, since when: RC sends a request
    /// again when its ACK was lost, even after the reply came, and the
    /// resend must pass (the memory node's RNIC acknowledges it as a
    /// duplicate without running it again).
    answered: ExactTable<PendingKey, Passed>,
    counters: MemoryCounters,
}

/// An alloc whose reply has not passed this long is forgotten (its node
/// died), so that it stops holding room in the ACL.
const PENDING_ALLOC_LEASE: std::time::Duration = std::time::Duration::from_secs(10);

/// Forgets the entries of `table` older than `PENDING_ALLOC_LEASE`: a
/// request whose reply never came (its node died), or an answered one no
/// resend can follow any more.
fn forget_older_than(table: &mut ExactTable<PendingKey, Passed>, now: Timestamp) {
    let stale: Vec<PendingKey> = table
        .iter()
        .filter(|(_, (since, _, _))| since.saturating_add(PENDING_ALLOC_LEASE) < now)
        .map(|(key, _)| *key)
        .collect();
    for key in stale {
        table.remove(&key);
    }
}

/// The memory stage's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStageConfig {
    pub acl: AclConfig,
    pub memory_nodes: usize,
    pub connections: usize,
    pub pending_allocs: usize,
}

impl Default for MemoryStageConfig {
    fn default() -> MemoryStageConfig {
        MemoryStageConfig {
            acl: AclConfig::default(),
            memory_nodes: 64,
            connections: 1024,
            pending_allocs: 256,
        }
    }
}

/// A request's target: the memory node's pool offset and length, and the
/// key it came with.
struct Target {
    virtual_address: u64,
    rkey: Rkey,
    length: u64,
}

impl MemoryStage {
    pub fn new(config: MemoryStageConfig) -> MemoryStage {
        let shape = |name, key_bits, action_data_bits, capacity| TableShape {
            name,
            stage: 1,
            key_bits,
            action_data_bits,
            capacity,
        };
        MemoryStage {
            acl: Acl::new(config.acl),
            nodes: ExactTable::new(shape(
                "gatekeeper_memory_nodes",
                32,
                168,
                config.memory_nodes,
            )),
            connections: ExactTable::new(shape(
                "gatekeeper_connections",
                56,
                58,
                config.connections,
            )),
            host_ports: ExactTable::new(shape("gatekeeper_host_ports", 32, 16, config.connections)),
            pending: ExactTable::new(shape(
                "gatekeeper_pending_allocs",
                96,
                128,
                config.pending_allocs,
            )),
            answered: ExactTable::new(shape(
                "gatekeeper_answered_requests",
                96,
                128,
                config.pending_allocs,
            )),
            counters: MemoryCounters::default(),
        }
    }

    pub fn counters(&self) -> MemoryCounters {
        self.counters
    }

    pub fn add_resources(&self, report: &mut ResourceReport) {
        report.tables.push(self.acl.resources());
        report.tables.push(self.nodes.resources());
        report.tables.push(self.connections.resources());
        report.tables.push(self.host_ports.resources());
        report.tables.push(self.pending.resources());
        report.tables.push(self.answered.resources());
    }

    pub fn register_node(
        &mut self,
        address: Ipv4Address,
        node: MemoryNode,
    ) -> Result<(), AclError> {
        Ok(self.nodes.insert(address, node)?)
    }

    /// Installs a client's connection to a memory node.
    pub fn register_connection(
        &mut self,
        client: (Ipv4Address, Qpn),
        memory: (Ipv4Address, Qpn),
    ) -> Result<(), AclError> {
        let connection = Connection {
            client: client.0,
            client_qpn: client.1,
            open_write: None,
            allowed_write_end: None,
        };
        Ok(self.connections.insert(memory, connection)?)
    }

    /// The switch port a DSM host (client or memory node) is attached to:
    /// its frames must come through it.
    pub fn register_host_port(
        &mut self,
        client: Ipv4Address,
        port: PortId,
    ) -> Result<(), AclError> {
        Ok(self.host_ports.insert(client, port)?)
    }

    /// Whether a packet from `source` came in where the control plane
    /// said that host is attached (or no port was given for it).
    pub fn arrived_where_expected(&self, source: Ipv4Address, ingress: PortId) -> bool {
        self.host_ports
            .lookup(&source)
            .is_none_or(|port| *port == ingress)
    }

    /// [`MemoryStage::arrived_where_expected`], counting a packet that
    /// did not as spoofed (its caller drops it).
    pub fn check_arrival(&mut self, source: Ipv4Address, ingress: PortId) -> bool {
        let expected = self.arrived_where_expected(source, ingress);
        if !expected {
            self.counters.spoofed += 1;
        }
        expected
    }

    /// [`MemoryStage::check_arrival`] for a packet the switch may have
    /// made itself: what its generator sends (replays, NAKs and answers in
    /// a host's name) passes.
    pub fn check_packet_arrival(&mut self, source: Ipv4Address, packet: &Packet) -> bool {
        let ingress = packet.original_ingress_port;
        ingress == remora_switch::packet::GENERATOR_PORT || self.check_arrival(source, ingress)
    }

    /// The memory node at `address`'s index, if it is one.
    pub fn node_index(&self, address: Ipv4Address) -> Option<u8> {
        self.nodes.lookup(&address).map(|node| node.index)
    }

    /// Whether the stage judges `packet`: RoCE to or from a memory node
    /// (UDP to port 4791, whether or not its transport headers parse).
    pub fn concerns(&self, packet: &Packet) -> bool {
        let Some(ipv4) = packet.headers.ipv4 else {
            return false;
        };
        let to_roce_port = packet.headers.roce.is_some() || is_roce_port(packet, ipv4);
        to_roce_port
            && (self.nodes.lookup(&ipv4.destination).is_some()
                || self.nodes.lookup(&ipv4.source).is_some())
    }

    /// Judges a RoCE packet to or from a memory node: a request from a
    /// client passes only if the ACL allows it; a NAK for a refused one
    /// joins `packet_outs`.
    pub fn judge(
        &mut self,
        now: Timestamp,
        packet: &mut Packet,
        packet_outs: &mut VecDeque<Vec<u8>>,
    ) {
        let Some(ipv4) = packet.headers.ipv4 else {
            return;
        };
        if self.nodes.lookup(&ipv4.source).is_some() {
            // A memory node's frames pass unjudged: only through its own
            // port, where the control plane gave it (the switch's own
            // NAKs, in the node's name, come from its generator).
            if !self.check_packet_arrival(ipv4.source, packet) {
                packet.egress = Egress::Drop;
                return;
            }
            self.watch_reply(packet);
            return;
        }
        let memory = ipv4.destination;
        let Some(roce) = packet.headers.roce else {
            // Its transport headers do not parse: nothing to judge it by.
            self.counters.malformed += 1;
            packet.egress = Egress::Drop;
            return;
        };
        let Some(connection) = self
            .connections
            .lookup(&(memory, roce.destination_qp))
            .copied()
        else {
            self.counters.unknown_connections += 1;
            packet.egress = Egress::Drop;
            return;
        };
        if !self.sent_by_its_client(packet, &connection) {
            self.counters.spoofed += 1;
            packet.egress = Egress::Drop;
            return;
        }
        let allowed = self.allows(now, packet, connection);
        if let Some(allowed) = allowed {
            if !allowed {
                self.refuse(packet, connection, packet_outs);
            }
        } else {
            // A continuation of a refused WRITE.
            self.counters.refused_continuations += 1;
            packet.egress = Egress::Drop;
        }
    }

    /// Whether the request came from its connection's client, through the
    /// client's port if the control plane gave it.
    fn sent_by_its_client(&self, packet: &Packet, connection: &Connection) -> bool {
        let source = packet.headers.ipv4.map(|ipv4| ipv4.source);
        source == Some(connection.client)
            && self.arrived_where_expected(connection.client, packet.original_ingress_port)
    }

    /// Whether the request may pass; None for a packet that belongs to a
    /// WRITE refused already (dropped with no second NAK).
    fn allows(
        &mut self,
        now: Timestamp,
        packet: &mut Packet,
        connection: Connection,
    ) -> Option<bool> {
        let ipv4 = packet.headers.ipv4.expect("judged packets are IPv4");
        let roce = packet.headers.roce.expect("judged packets are RoCE");
        let (memory, source) = (ipv4.destination, ipv4.source);
        let node = *self.nodes.lookup(&memory).expect("a memory node");
        let key = (memory, roce.destination_qp);
        let verdict = match roce.opcode {
            // The client acknowledging the daemon's replies.
            Opcode::Acknowledge => true,
            Opcode::RdmaReadRequest => self.check_access(packet, &node, Operation::Read),
            Opcode::RdmaWriteFirst => {
                let allowed = self.check_access(packet, &node, Operation::Write);
                self.set_open_write(key, Some(allowed));
                allowed
            }
            Opcode::RdmaWriteOnly | Opcode::RdmaWriteOnlyWithImmediate => {
                self.check_access(packet, &node, Operation::Write)
            }
            Opcode::RdmaWriteMiddle
            | Opcode::RdmaWriteLast
            | Opcode::RdmaWriteLastWithImmediate => {
                let last = roce.opcode != Opcode::RdmaWriteMiddle;
                let open = connection.open_write;
                if last {
                    self.close_write(key, (open == Some(true)).then_some(roce.psn));
                }
                match open {
                    Some(true) => true,
                    Some(false) => return None,
                    // No first packet open: a resent packet of the newest
                    // allowed WRITE passes (the memory node takes it as a
                    // duplicate, or as the rest of that WRITE); any other
                    // is part of no allowed WRITE.
                    None => connection
                        .allowed_write_end
                        .is_some_and(|end| is_resent_within(roce.psn, end)),
                }
            }
            Opcode::CompareSwap | Opcode::FetchAdd => {
                self.check_access(packet, &node, Operation::Write)
            }
            Opcode::SendOnly | Opcode::SendOnlyWithImmediate => {
                self.check_message(now, packet, &node, source, memory)
            }
            _ => false,
        };
        Some(verdict)
    }

    fn set_open_write(&mut self, key: (Ipv4Address, Qpn), open: Option<bool>) {
        if let Some(connection) = self.connections.lookup_mut(&key) {
            connection.open_write = open;
        }
    }

    /// A WRITE's last packet passed: none is open now, and an allowed one
    /// ended at `allowed_end`.
    fn close_write(&mut self, key: (Ipv4Address, Qpn), allowed_end: Option<Psn>) {
        if let Some(connection) = self.connections.lookup_mut(&key) {
            connection.open_write = None;
            if allowed_end.is_some() {
                connection.allowed_write_end = allowed_end;
            }
        }
    }

    /// A READ, WRITE or atomic against the ACL, by its RETH or AtomicETH.
    fn check_access(&mut self, packet: &Packet, node: &MemoryNode, operation: Operation) -> bool {
        let source = packet.headers.ipv4.expect("IPv4").source;
        let allowed = target_of(packet).is_some_and(|target| {
            target.rkey == node.rkey
                && target
                    .virtual_address
                    .checked_sub(node.pool_base)
                    .filter(|offset| offset.saturating_add(target.length) <= node.pool_bytes)
                    .is_some_and(|offset| {
                        self.acl
                            .permits(node.index, offset, target.length, operation, source)
                    })
        });
        let counter = match (operation, allowed) {
            (Operation::Read, true) => &mut self.counters.reads_allowed,
            (Operation::Read, false) => &mut self.counters.reads_refused,
            (Operation::Write, true) => &mut self.counters.writes_allowed,
            (Operation::Write, false) => &mut self.counters.writes_refused,
        };
        *counter += 1;
        allowed
    }

    /// A message to a memory node's daemon.
    fn check_message(
        &mut self,
        now: Timestamp,
        packet: &mut Packet,
        node: &MemoryNode,
        source: Ipv4Address,
        memory: Ipv4Address,
    ) -> bool {
        let Some(request) =
            dsm_payload(packet).and_then(|bytes| message::Request::parse(bytes).ok())
        else {
            self.counters.messages_refused += 1;
            return false;
        };
        let key = (memory, source, request.request_id);
        let roce = packet.headers.roce.expect("judged packets are RoCE");
        let carried = Carried {
            queue_pair: roce.destination_qp,
            psn: roce.psn,
        };
        let allowed = match request.operation {
            _ if self.is_resend_of_answered(now, key, &request, carried) => true,
            DsmOperation::Allocate => {
                let awaiting = Awaiting::Allocate { size: request.size };
                self.await_reply(now, key, (now, awaiting, carried))
            }
            DsmOperation::Free => {
                // The rules go when the daemon replies that the free
                // happened. Deleted as the request passed, a Free lost on
                // the way was refused when RC sent it again, and its
                // memory stayed allocated with nobody allowed to free it.
                let controls =
                    self.acl
                        .controls(node.index, request.offset, request.generation, source);
                let awaiting = Awaiting::Free {
                    offset: request.offset,
                };
                controls && self.await_reply(now, key, (now, awaiting, carried))
            }
            DsmOperation::Snapshot | DsmOperation::Restore => {
                self.acl
                    .controls(node.index, request.offset, request.generation, source)
            }
            DsmOperation::Stat => {
                self.acl
                    .permits(node.index, request.offset, 0, Operation::Read, source)
            }
        };
        if !allowed {
            self.counters.messages_refused += 1;
        }
        allowed
    }

    /// Whether `request` is an alloc or a free whose reply already passed,
    /// sent again by RC because its ACK was lost. Refused, the resend
    /// failed a free that happened (its rules were gone), and the
    /// client's channel, resuming at the refused PSN, had its next request
    /// taken by the memory node for a duplicate of the free and never run.
    fn is_resend_of_answered(
        &mut self,
        now: Timestamp,
        key: PendingKey,
        request: &message::Request,
        carried: Carried,
    ) -> bool {
        let awaiting = match request.operation {
            DsmOperation::Allocate => Awaiting::Allocate { size: request.size },
            DsmOperation::Free => Awaiting::Free {
                offset: request.offset,
            },
            DsmOperation::Snapshot | DsmOperation::Restore | DsmOperation::Stat => return false,
        };
        forget_older_than(&mut self.answered, now);
        self.answered
            .lookup(&key)
            .is_some_and(|(_, answered, first)| (*answered, *first) == (awaiting, carried))
    }

    /// Remembers a request until its reply passes; an alloc also keeps
    /// room for its rule. Requests whose replies never came (their node
    /// died) are forgotten first. A request sent again (same key) waits on
    /// the first one's entry.
    fn await_reply(&mut self, now: Timestamp, key: PendingKey, passed: Passed) -> bool {
        forget_older_than(&mut self.pending, now);
        let (_, awaiting, carried) = passed;
        if let Some((_, pending, first)) = self.pending.lookup(&key) {
            // The same request sent again rides on the first's entry. A
            // different one under the same id is refused: taken, it
            // skipped every check, and its reply (the first having taken
            // the entry) changed no rules, so a freed allocation kept
            // its owner's control, and the next alloc there got none.
            // (Counted refused by the caller, once.)
            // A resend keeps its PSN too.
            return (*pending, *first) == (awaiting, carried);
        }
        let acl_room = match awaiting {
            Awaiting::Allocate { .. } => {
                self.acl.len() + self.pending.len() < self.acl.resources().capacity
            }
            Awaiting::Free { .. } => true,
        };
        if !acl_room || self.pending.insert(key, passed).is_err() {
            self.counters.acl_full += 1;
            return false;
        }
        true
    }

    /// Keeps an answered request for its resends; a full table forgets
    /// its oldest entry (whose resends, long overdue, are refused).
    fn remember_answered(&mut self, key: PendingKey, passed: Passed) {
        if self.answered.len() >= self.answered.resources().capacity {
            let oldest = self
                .answered
                .iter()
                .min_by_key(|(_, (since, _, _))| *since)
                .map(|(key, _)| *key);
            if let Some(oldest) = oldest {
                self.answered.remove(&oldest);
            }
        }
        // Room was made above, so the insert cannot fail for space.
        let _ = self.answered.insert(key, passed);
    }

    /// A daemon's reply to an alloc installs the requester's control; to
    /// a free, deletes the allocation's rules.
    fn watch_reply(&mut self, packet: &mut Packet) {
        // The memory node's own frames pass, parsed or not: its NIC is
        // not the one the ACL guards against.
        let Some(roce) = packet.headers.roce else {
            return;
        };
        let ipv4 = packet.headers.ipv4.expect("IPv4");
        if !matches!(
            roce.opcode,
            Opcode::SendOnly | Opcode::SendOnlyWithImmediate
        ) {
            return;
        }
        let Some(reply) = dsm_payload(packet).and_then(|bytes| message::Reply::parse(bytes).ok())
        else {
            return;
        };
        let key = (ipv4.source, ipv4.destination, reply.request_id);
        let Some(passed) = self.pending.remove(&key) else {
            return;
        };
        self.remember_answered(key, passed);
        let (_, awaiting, _) = passed;
        if reply.status != Status::Ok {
            return;
        }
        let index = self
            .nodes
            .lookup(&ipv4.source)
            .expect("a memory node")
            .index;
        let client = ipv4.destination;
        let size = match awaiting {
            Awaiting::Allocate { size } => size,
            Awaiting::Free { offset } => {
                self.acl.free(index, offset);
                self.counters.frees += 1;
                packet.digest = Some(Digest {
                    kind: DIGEST_FREE,
                    values: [address_value(client), u64::from(index), offset, 0],
                });
                return;
            }
        };
        match self
            .acl
            .allocate(index, reply.offset, reply.generation, size, client)
        {
            Ok(()) => {
                self.counters.allocations += 1;
                packet.digest = Some(Digest {
                    kind: DIGEST_ALLOC,
                    values: [address_value(client), u64::from(index), reply.offset, size],
                });
            }
            // Room was kept for it; only a node answering an offset inside
            // a live allocation gets here, and its client's accesses are
            // then refused.
            Err(_) => self.counters.acl_full += 1,
        }
    }

    /// Drops a refused request and queues the NAK that answers it.
    fn refuse(
        &mut self,
        packet: &mut Packet,
        connection: Connection,
        packet_outs: &mut VecDeque<Vec<u8>>,
    ) {
        packet.egress = Egress::Drop;
        let ipv4 = packet.headers.ipv4.expect("IPv4");
        packet.digest = Some(Digest {
            kind: DIGEST_ACCESS_REFUSED,
            values: [
                address_value(ipv4.source),
                address_value(ipv4.destination),
                0,
                0,
            ],
        });
        packet_outs.push_back(access_nak(packet, connection));
        self.counters.naks_sent += 1;
    }
}

/// Whether `packet` is UDP to the RoCEv2 port.
fn is_roce_port(packet: &Packet, ipv4: remora_switch::parser::Ipv4Fields) -> bool {
    let udp = ipv4.offset + ipv4.header_len;
    packet.bytes.get(ipv4.offset + 9) == Some(&remora_wire::ipv4::PROTOCOL_UDP)
        && packet.bytes.get(udp + 2..udp + 4).is_some_and(|port| {
            u16::from_be_bytes([port[0], port[1]]) == remora_wire::ROCEV2_UDP_PORT
        })
}

fn address_value(address: Ipv4Address) -> u64 {
    u64::from(u32::from_be_bytes(address.0))
}

/// The target of a READ or WRITE (RETH) or an atomic (AtomicETH).
fn target_of(packet: &Packet) -> Option<Target> {
    let roce = packet.headers.roce?;
    let extension = packet.bytes.get(roce.extension_offset..)?;
    if roce.opcode.has_reth() {
        let reth = RethRepr::parse(&RethHeader::new_checked(extension).ok()?);
        return Some(Target {
            virtual_address: reth.virtual_address.0,
            rkey: reth.rkey,
            length: u64::from(reth.dma_length),
        });
    }
    if roce.opcode.has_atomic_eth() {
        let atomic = AtomicEthRepr::parse(&AtomicEthHeader::new_checked(extension).ok()?);
        return Some(Target {
            virtual_address: atomic.virtual_address.0,
            rkey: atomic.rkey,
            length: 8,
        });
    }
    None
}

/// A SEND's DSM message: its payload, after the immediate if any.
fn dsm_payload(packet: &Packet) -> Option<&[u8]> {
    let roce = packet.headers.roce?;
    let payload = packet.bytes.get(roce.payload_offset..roce.icrc_offset)?;
    // The payload is padded to four bytes; a DSM message is 24 (a multiple).
    payload
        .get(..MESSAGE_LEN)
        .filter(|_| payload.len() == MESSAGE_LEN)
}

/// The NAK (remote access error) for the request in `packet`, in the
/// memory node's name, to the client's queue pair.
fn access_nak(packet: &Packet, connection: Connection) -> Vec<u8> {
    let headers = &packet.headers;
    let ipv4 = headers.ipv4.expect("IPv4");
    let roce = headers.roce.expect("RoCE");
    let bth = BthRepr::new(Opcode::Acknowledge, connection.client_qpn, roce.psn);
    let mut repr = FrameRepr::between(
        (headers.destination_mac, ipv4.destination),
        (headers.source_mac, connection.client),
        NAK_SOURCE_PORT,
        bth,
    );
    repr.extension.aeth = Some(AethRepr {
        syndrome: AckSyndrome::Nak(NakCode::RemoteAccessError),
        msn: Msn::new(0),
    });
    let repr = repr.with_payload_len(0);
    let mut frame = vec![0u8; repr.frame_len(0)];
    let length = emit_frame(&repr, &[], &mut frame).expect("a NAK fits its own length");
    frame.truncate(length);
    frame
}

/// The UDP source port of the switch's NAKs (any port is a flow's
/// entropy; this one marks them in a capture).
const NAK_SOURCE_PORT: u16 = 0xb1f6;

/// Whether `psn` is at or before `end`, by at most
/// [`RESENT_WRITE_REACH_PSNS`].
fn is_resent_within(psn: Psn, end: Psn) -> bool {
    (0..RESENT_WRITE_REACH_PSNS).contains(&psn.distance_to(end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_wire::frame::MAX_FRAME_LEN;
    use remora_wire::MacAddress;

    const CLIENT: (MacAddress, Ipv4Address) =
        (MacAddress([2, 0, 0, 0, 0, 1]), Ipv4Address([10, 0, 0, 1]));
    const MEMORY: (MacAddress, Ipv4Address) =
        (MacAddress([2, 0, 0, 0, 0, 2]), Ipv4Address([10, 0, 0, 2]));
    const RKEY: Rkey = Rkey(0x42);
    const POOL_BASE: u64 = 0x10_0000;

    fn qpn(value: u32) -> Qpn {
        Qpn::new(value).expect("24 bits")
    }

    /// A stage with one memory node, one connection, and the client in
    /// control of the pool's first 64 KiB.
    fn stage() -> MemoryStage {
        let mut stage = MemoryStage::new(MemoryStageConfig::default());
        let node = MemoryNode {
            index: 0,
            pool_base: POOL_BASE,
            pool_bytes: 1 << 20,
            rkey: RKEY,
        };
        stage.register_node(MEMORY.1, node).unwrap();
        stage
            .register_connection((CLIENT.1, qpn(0x11)), (MEMORY.1, qpn(0x21)))
            .unwrap();
        stage.acl.allocate(0, 0, 0, 64 << 10, CLIENT.1).unwrap();
        stage
    }

    /// One WRITE packet from the client; whether the stage let it pass.
    fn passes(stage: &mut MemoryStage, opcode: Opcode, psn: u32) -> bool {
        let bth = BthRepr::new(opcode, qpn(0x21), Psn::new(psn));
        let mut repr = FrameRepr::between(CLIENT, MEMORY, 0xc000, bth);
        if opcode == Opcode::RdmaWriteFirst {
            repr.extension.reth = Some(RethRepr {
                virtual_address: remora_wire::VirtAddr(POOL_BASE),
                rkey: RKEY,
                dma_length: 3 * 1024,
            });
        }
        let payload = [0u8; 1024];
        let mut bytes = vec![0u8; MAX_FRAME_LEN];
        let length = emit_frame(&repr.with_payload_len(payload.len()), &payload, &mut bytes)
            .expect("a WRITE packet fits");
        bytes.truncate(length);
        let headers = remora_switch::parser::parse(&bytes).expect("it parses");
        let mut packet = Packet::new(bytes, PortId(0), headers);
        stage.judge(Timestamp::ZERO, &mut packet, &mut VecDeque::new());
        packet.egress != Egress::Drop
    }

    /// A DSM SEND (a request from the client, or a reply from the memory
    /// node) through the stage; whether it passed.
    fn dsm_passes(stage: &mut MemoryStage, from_client: bool, message: [u8; 24], psn: u32) -> bool {
        let (from, to, queue_pair) = match from_client {
            true => (CLIENT, MEMORY, 0x21),
            false => (MEMORY, CLIENT, 0x11),
        };
        let bth = BthRepr::new(Opcode::SendOnly, qpn(queue_pair), Psn::new(psn));
        let repr = FrameRepr::between(from, to, 0xc000, bth).with_payload_len(message.len());
        let mut bytes = vec![0u8; MAX_FRAME_LEN];
        let length = emit_frame(&repr, &message, &mut bytes).expect("a SEND fits");
        bytes.truncate(length);
        let headers = remora_switch::parser::parse(&bytes).expect("it parses");
        let mut packet = Packet::new(bytes, PortId(0), headers);
        stage.judge(Timestamp::ZERO, &mut packet, &mut VecDeque::new());
        packet.egress != Egress::Drop
    }

    /// A free ran and its reply passed, deleting the rules, but the
    /// memory node's ACK of the free was lost, so RC sent the free again.
    /// The stage refused the resend with a NAK: the client saw a free
    /// that happened fail, and its channel, resuming at that PSN, had its
    /// next request taken for a duplicate and never run.
    #[test]
    fn a_free_sent_again_after_its_reply_passed_still_passes() {
        let mut stage = stage();
        let free = message::Request {
            operation: DsmOperation::Free,
            generation: 0,
            request_id: 9,
            offset: 0,
            size: 0,
        }
        .emit();
        let done = message::Reply {
            status: Status::Ok,
            generation: 0,
            request_id: 9,
            offset: 0,
            size: 0,
        }
        .emit();
        assert!(dsm_passes(&mut stage, true, free, 5));
        assert!(dsm_passes(&mut stage, false, done, 7));
        assert_eq!(stage.counters().frees, 1);
        assert!(dsm_passes(&mut stage, true, free, 5), "the resend passes");
        assert_eq!(stage.counters().refused(), 0);
        // Only the same request rides on the answered one: another free
        // of the freed allocation is refused, under another id or under
        // the same id at another PSN (a new request reusing the id), and
        // no rules came back.
        let other = message::Request {
            request_id: 10,
            ..message::Request::parse(&free).unwrap()
        }
        .emit();
        assert!(!dsm_passes(&mut stage, true, other, 6));
        assert!(!dsm_passes(&mut stage, true, free, 6), "a reused id");
        assert!(!passes(&mut stage, Opcode::RdmaWriteFirst, 20));
    }

    /// Two frees under one request id: the second rode on the first's
    /// pending entry without its checks, and the first reply took the
    /// entry, so the second allocation's rules were never deleted. A
    /// different request under a pending id is refused; the same one sent
    /// again still rides on it.
    #[test]
    fn a_second_request_under_a_pending_id_is_refused_and_a_resend_is_not() {
        let mut stage = stage();
        let key = (MEMORY.1, CLIENT.1, 7);
        let now = Timestamp::ZERO;
        let carried = |psn| Carried {
            queue_pair: qpn(0x21),
            psn: Psn::new(psn),
        };
        let free = |offset, psn| (now, Awaiting::Free { offset }, carried(psn));
        assert!(stage.await_reply(now, key, free(0, 1)));
        assert!(stage.await_reply(now, key, free(0, 1)));
        assert!(!stage.await_reply(now, key, free(0, 2)), "another PSN");
        assert!(!stage.await_reply(now, key, free(4096, 1)));
        let allocate = (now, Awaiting::Allocate { size: 64 }, carried(1));
        assert!(!stage.await_reply(now, key, allocate));
    }

    /// A middle packet of an allowed WRITE was lost after the switch; its
    /// last passed and closed the WRITE, and the go-back-N resend from the
    /// lost middle was refused with a NAK: a permitted WRITE failed and the
    /// queue pair went to error. The resend passes now.
    #[test]
    fn a_go_back_n_resend_of_an_allowed_write_passes() {
        let mut stage = stage();
        assert!(passes(&mut stage, Opcode::RdmaWriteFirst, 10));
        assert!(passes(&mut stage, Opcode::RdmaWriteMiddle, 11));
        assert!(passes(&mut stage, Opcode::RdmaWriteLast, 12));
        // The memory node saw no PSN 11 and asked for it again.
        assert!(passes(&mut stage, Opcode::RdmaWriteMiddle, 11));
        assert!(passes(&mut stage, Opcode::RdmaWriteLast, 12));
        assert_eq!(stage.counters().refused(), 0);
    }

    /// A middle or last packet with no allowed WRITE behind it is still
    /// refused: one beyond the newest allowed WRITE's end, or any before
    /// a first packet ever passed.
    #[test]
    fn a_continuation_of_no_allowed_write_is_refused() {
        let mut fresh = stage();
        assert!(!passes(&mut fresh, Opcode::RdmaWriteMiddle, 5));
        let mut stage = stage();
        assert!(passes(&mut stage, Opcode::RdmaWriteFirst, 10));
        assert!(passes(&mut stage, Opcode::RdmaWriteLast, 11));
        assert!(!passes(&mut stage, Opcode::RdmaWriteMiddle, 12));
        assert!(!passes(&mut stage, Opcode::RdmaWriteLast, 13));
    }
}
