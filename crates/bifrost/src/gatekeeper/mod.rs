//! Bifröst's Gatekeeper (the thesis's §4 and §6.3), as a switch overlay:
//! the switch parses the Bifröst header of every RPC datagram, routes
//! calls addressed to the Gatekeeper's service address to the node
//! registered for their method, keeps the graph of RPCs in flight, sends
//! digests to its control plane, and holds calls to a failed node until a
//! replacement takes its methods over.
//!
//! Built so far: registration (by the control plane, or by a node's own
//! heartbeat on boot), failure detection by missed heartbeats, service
//! routing, the RPC graph, digests, callee checkpoints (b2) taken off the
//! replies that carry them, calls to a failed node held in a bounded
//! queue, recovery that moves routes to a replacement and replays, as
//! packet-outs, the held calls and the calls that were in flight to the
//! failed node; every table and queue bounded with typed errors or
//! counted drops; and the ACL on RDMA to the DSM's memory nodes
//! ([`memory`], [`acl`]): default deny, control and lease rules from
//! alloc, free, CALL and REPLY, and a NAK in the memory node's name for
//! what it refuses.

pub mod acl;
pub mod audit;
pub mod memory;
mod recent;

use crate::dsm::GlobalPtr;
use crate::rpc::checkpoint::{split_reply, CHECKPOINT_FLAG, MAX_CHECKPOINT_BYTES};
use acl::AclError;
use memory::{MemoryCounters, MemoryNode, MemoryStage, MemoryStageConfig};
use recent::RecentCalls;
use remora_base::Timestamp;
use remora_switch::packet::{Digest, Egress, Packet, GENERATOR_PORT};
use remora_switch::programs::overlay::{Claim, Overlay};
use remora_switch::resources::ResourceReport;
use remora_switch::table::{ExactTable, TableError, TableShape};
pub use remora_wire::bifrost::NodeKind;
use remora_wire::bifrost::{
    BifrostHeader, BifrostRepr, CallType, ExportRepr, GlobalAddress, HeartbeatRepr, NodeMessage,
    BIFROST_PORT, CONTROL_PORT, HEADER_LEN, METHOD_NAME_LEN,
};
use remora_wire::datagram::{emit_datagram, DatagramEnd, DATAGRAM_HEADERS_LEN};
use remora_wire::ipv4::Ipv4Packet;
use remora_wire::Ipv4Address;
use std::collections::VecDeque;
use std::time::Duration;

/// Digest kinds the Gatekeeper sends its control plane.
pub const DIGEST_CALL: u16 = 0xb1f0;
pub const DIGEST_REPLY: u16 = 0xb1f1;
/// A call for a method no node is registered for, or to a failed node
/// that could not be held, or a full graph: an RPC failure.
pub const DIGEST_RPC_FAILURE: u16 = 0xb1f2;
/// A node missed its heartbeats: values[0] is its IPv4 address.
pub const DIGEST_NODE_FAILED: u16 = 0xb1f3;

/// A registered node's status (§6.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeStatus {
    Free,
    InUse,
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeInfo {
    pub kind: NodeKind,
    pub capacity_bytes: u64,
    pub status: NodeStatus,
}

/// An RPC in flight: an edge of the node-centric graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallEdge {
    pub caller: Ipv4Address,
    pub caller_port: u16,
    pub rpc_id: u64,
    pub callee: Ipv4Address,
    pub method: [u8; METHOD_NAME_LEN],
    pub pointer: GlobalAddress,
    /// When the call first passed.
    pub since: Timestamp,
    /// The call lent its DSM pointer to the callee: the reply ends the
    /// lease.
    pub lent: bool,
    /// The call shares its callee's fate (`rpc::SHARE_FATE_FLAG`): if the
    /// callee fails, the Gatekeeper answers the caller with a failure
    /// instead of holding or replaying the call.
    pub shares_fate: bool,
}

/// Why a control-plane request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GatekeeperError {
    #[error(transparent)]
    Table(#[from] TableError),
    #[error("node {0:?} is not registered")]
    UnknownNode(Ipv4Address),
    #[error("node {0:?} has failed: it serves no method")]
    NodeFailed(Ipv4Address),
    #[error("a method name of {0} bytes is longer than {METHOD_NAME_LEN}")]
    MethodTooLong(usize),
    #[error("node {0:?} stands in for a failed node already: it cannot take another's place")]
    AlreadyStandingIn(Ipv4Address),
    #[error("node {0:?} has not failed")]
    NotFailed(Ipv4Address),
    #[error(transparent)]
    Acl(#[from] AclError),
}

/// What the data plane counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GatekeeperCounters {
    /// Call frames routed, resends among them.
    pub calls_routed: u64,
    /// Of those, resends of a call in flight or answered (a caller's
    /// timer fired before its reply came): routed calls less these are
    /// the calls.
    pub resends_routed: u64,
    pub replies: u64,
    /// Calls for a method no node serves: dropped.
    pub unrouted: u64,
    /// Calls to a failed node, held until its replacement.
    pub held: u64,
    /// Resends of a call already held: its frame replaced, no place taken.
    pub held_resends: u64,
    /// Calls to a failed node the full hold queue could not take:
    /// dropped, with an RPC-failure digest (the caller's resend may
    /// still reach the replacement).
    pub held_dropped: u64,
    /// Held and in-flight calls sent to a replacement as packet-outs.
    pub replayed: u64,
    /// Exports that routed a method to their node, and exports refused
    /// (another live node serves the method, or the node is unknown or
    /// failed).
    pub exports: u64,
    pub exports_refused: u64,
    /// Heartbeats taken, nodes they announced, nodes found failed.
    pub heartbeats: u64,
    pub nodes_announced: u64,
    pub failures_detected: u64,
    /// Calls refused because the RPC graph was full.
    pub graph_full: u64,
    /// Resends of calls answered failed with their callee, answered so
    /// again rather than routed.
    pub failed_resends_answered: u64,
    /// Bifröst-port datagrams whose header did not parse.
    pub malformed: u64,
    /// Calls addressed to a node directly: forwarded without routing.
    pub direct: u64,
    /// Checkpoints taken off replies or commits and kept (older ones are
    /// dropped).
    pub checkpoints: u64,
    /// Commits (b1: a callee's checkpoint as a call arrived) taken.
    pub commits: u64,
    /// Callers' checkpoints taken off calls and kept.
    pub caller_checkpoints: u64,
    /// Callers' checkpoints dropped, least recently renewed first, to make
    /// room for a caller the full table had no place for.
    pub caller_checkpoints_evicted: u64,
    /// Checkpoints (either kind) a full table could not take: the older
    /// one stays, and the node's next checkpoint tries again.
    pub checkpoints_refused: u64,
    /// Calls whose reply never passed within the call lease: their edges
    /// (and kept frames) expired, so a caller that gave up cannot fill
    /// the graph.
    pub calls_expired: u64,
    /// Replies to calls whose edges had expired: the pointer they return
    /// is handed to the caller all the same (it was left with the callee,
    /// which counts it given, and nobody would ever free it).
    pub late_replies: u64,
    /// Resends of calls whose reply had passed already (the caller's timer
    /// fired before the reply reached it, or the reply was lost after the
    /// switch): routed to the callee, which answers from its replies, and
    /// lending nothing.
    pub answered_resends: u64,
    /// Calls that shared a failed callee's fate, answered with the failure
    /// by the Gatekeeper.
    pub fate_shared: u64,
    /// RPC datagrams readdressed for a node standing in for a failed one.
    pub stood_in: u64,
    /// Packets from a node marked failed (a late reply, a call, RDMA):
    /// dropped, as the paper's fate sharing drops all packets from the
    /// failure domain, until a new boot of the node announces itself.
    pub fenced: u64,
    /// Failed nodes left unfenced: the fence table was full of nodes
    /// still registered.
    pub fences_refused: u64,
    /// Replies to calls in the graph from another node than the callee:
    /// dropped.
    pub forged_replies: u64,
    /// Calls whose pointer could not be lent to the callee (the caller
    /// holds no rights on it, or it has no rules, or its grants are
    /// full): routed, and the callee's accesses are refused.
    pub leases_refused: u64,
    /// Answered calls forgotten before their call lease had passed, to
    /// make room in a full table (more replies than the graph holds within
    /// one lease): a resend of one goes by the route, which is its callee's
    /// unless the control plane moved it.
    pub answered_forgotten_early: u64,
    /// Expired calls forgotten within a lease of expiring: a late reply
    /// to one leaves its returned pointer with the callee.
    pub expired_forgotten_early: u64,
    /// Calls answered failed with their callee and forgotten within a
    /// lease: a resend of one may run on the replacement after its caller
    /// was told it failed. The one of the three that exactly-once hangs
    /// on; zero unless more calls than the graph holds fail so within a
    /// lease.
    pub failed_with_callee_forgotten_early: u64,
    /// What the memory stage (the ACL on RDMA) counted.
    pub memory: MemoryCounters,
}

/// Table sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatekeeperConfig {
    /// The address callers send calls to; the Gatekeeper routes them.
    pub service_address: Ipv4Address,
    pub nodes: usize,
    pub routes: usize,
    pub calls_in_flight: usize,
    /// Calls held for failed nodes until their replacement.
    pub held_calls: usize,
    /// A node that sent heartbeats and then none for this long has
    /// failed. None: only the control plane marks failures.
    pub heartbeat_timeout: Option<Duration>,
    /// A call whose reply has not passed this long after the call first
    /// did leaves the graph (its caller gave up, or its callee died with
    /// no replacement).
    pub call_lease: Duration,
    /// The ACL and the tables of the memory stage.
    pub memory: MemoryStageConfig,
}

impl GatekeeperConfig {
    pub fn new(service_address: Ipv4Address) -> GatekeeperConfig {
        GatekeeperConfig {
            service_address,
            nodes: 64,
            routes: 256,
            calls_in_flight: 4096,
            held_calls: 256,
            heartbeat_timeout: None,
            call_lease: Duration::from_secs(10),
            memory: MemoryStageConfig::default(),
        }
    }
}

/// A call frame the Gatekeeper keeps to replay is at most this long (a
/// call's datagram fits one MTU); longer ones rely on the caller's resend.
const MAX_KEPT_FRAME_BYTES: usize = 2048;

/// A failed node's replacement, and whether it took the node's place in
/// the network ([`Gatekeeper::recover_in_place_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Replacement {
    node: Ipv4Address,
    in_place: bool,
}

type MethodKey = [u8; METHOD_NAME_LEN];
type CallKey = (Ipv4Address, u16, u64);

/// The overlay.
pub struct Gatekeeper {
    service_address: Ipv4Address,
    nodes: ExactTable<Ipv4Address, NodeInfo>,
    routes: ExactTable<MethodKey, Ipv4Address>,
    graph: ExactTable<CallKey, CallEdge>,
    /// Calls recently answered, with the callee that answered: a resend
    /// of one lends nothing, for its reply has ended its lease, and goes
    /// to that callee, which answers it from its replies.
    answered: RecentCalls<Ipv4Address>,
    /// Calls whose lease ran out unanswered: a late reply from their
    /// callee still hands over the pointer it returns.
    expired: RecentCalls<CallEdge>,
    /// Calls that shared a failed callee's fate and were answered failed
    /// in its stead: a resend of one that crossed the failure is answered
    /// failed again, not routed to the replacement, where it ran after its
    /// caller was told it had failed.
    failed_with_callee: RecentCalls<CallEdge>,
    /// The time of the last packet the data plane saw: the control
    /// plane's calls (a failure marked) are stamped with it.
    clock: Timestamp,
    /// Each node's newest checkpoint (b2), taken off its replies.
    checkpoints: ExactTable<Ipv4Address, (u64, Vec<u8>)>,
    /// Each caller's newest checkpoint (a1, a2), taken off its calls.
    caller_checkpoints: ExactTable<(Ipv4Address, u16), (u64, Vec<u8>)>,
    /// The callers of `caller_checkpoints`, least recently renewed first:
    /// callers come and go (a restarted one may call from a new port), and
    /// a full table makes room by the oldest rather than refuse new
    /// callers for good.
    caller_checkpoint_order: VecDeque<(Ipv4Address, u16)>,
    /// Each call in flight's frame as routed, to replay to a replacement.
    call_frames: ExactTable<CallKey, Vec<u8>>,
    /// When each node was last heard from, and its incarnation then.
    heard: ExactTable<Ipv4Address, (Timestamp, u32)>,
    heartbeat_timeout: Option<Duration>,
    next_liveness_check: Timestamp,
    call_lease: Duration,
    next_lease_check: Timestamp,
    /// Calls to failed nodes, as they arrived (to the service address):
    /// one frame per call, the newest of its resends.
    held: VecDeque<(CallKey, Vec<u8>)>,
    held_capacity: usize,
    /// Frames to send back into the pipeline (replays).
    packet_outs: VecDeque<Vec<u8>>,
    /// Nodes found failed, for the control plane.
    detected: VecDeque<Ipv4Address>,
    /// The ACL on RDMA to the DSM's memory nodes.
    memory: MemoryStage,
    /// Every failed node's replacement: its rights are the replacement's
    /// (calls it made before failing still end their leases and take their
    /// returned pointers in the replacement's name).
    replaced_by: ExactTable<Ipv4Address, Replacement>,
    /// The replacements that took their failed node's place, to the failed
    /// node: their RPC datagrams leave under its address.
    standing_for: ExactTable<Ipv4Address, Ipv4Address>,
    /// Nodes marked failed, with the incarnation they failed in (if they
    /// sent heartbeats): nothing they send passes until a heartbeat of
    /// another incarnation (a new boot) does.
    fenced: ExactTable<Ipv4Address, Option<u32>>,
    /// The switch's own MAC, told by the forwarding it overlays: the
    /// Gatekeeper's own answers are addressed to it, for routing. (Learnt
    /// from each call's destination MAC, one call to a broadcast or a
    /// host's MAC sent later answers astray.)
    router_mac: Option<remora_wire::MacAddress>,
    counters: GatekeeperCounters,
}

fn method_key(method: &[u8]) -> Result<MethodKey, GatekeeperError> {
    if method.len() > METHOD_NAME_LEN {
        return Err(GatekeeperError::MethodTooLong(method.len()));
    }
    let mut key = [0u8; METHOD_NAME_LEN];
    key[..method.len()].copy_from_slice(method);
    Ok(key)
}

/// Whether `packet` is a heartbeat of another incarnation than
/// `failed_in` (or any heartbeat, if the failed life sent none).
fn is_heartbeat_of_another_boot(packet: &Packet, failed_in: Option<u32>) -> bool {
    let Some((_, udp, CONTROL_PORT)) = bifrost_offsets(packet) else {
        return false;
    };
    match NodeMessage::parse(&packet.bytes[udp + 8..]) {
        Ok(NodeMessage::Heartbeat(heartbeat)) => failed_in != Some(heartbeat.incarnation),
        _ => false,
    }
}

/// Where a packet's IPv4 and UDP headers are, and its destination port,
/// if it is a UDP datagram to or from Bifröst's port (calls go to it,
/// replies come from it) or a heartbeat, with its whole UDP header there
/// (every later read of the payload starts after it).
fn bifrost_offsets(packet: &Packet) -> Option<(usize, usize, u16)> {
    let ipv4 = packet.headers.ipv4?;
    let bytes = &packet.bytes;
    if bytes.get(ipv4.offset + 9) != Some(&remora_wire::ipv4::PROTOCOL_UDP) {
        return None;
    }
    let udp = ipv4.offset + ipv4.header_len;
    if bytes.len() < udp + remora_wire::udp::UDP_HEADER_LEN {
        return None;
    }
    let source = u16::from_be_bytes([*bytes.get(udp)?, *bytes.get(udp + 1)?]);
    let destination = u16::from_be_bytes([*bytes.get(udp + 2)?, *bytes.get(udp + 3)?]);
    (source == BIFROST_PORT || destination == BIFROST_PORT || destination == CONTROL_PORT)
        .then_some((ipv4.offset, udp, destination))
}

/// What became of a checkpoint.
enum Kept {
    Newest,
    /// Not newer than the one kept (or too short to say): dropped.
    Older,
    /// Newer, but the table was full: the older ones stay.
    Refused,
}

/// Keeps `checkpoint` under `key` if its sequence (its first eight bytes)
/// is newer than the one kept.
fn keep_newest<K: std::hash::Hash + Eq>(
    table: &mut ExactTable<K, (u64, Vec<u8>)>,
    key: K,
    checkpoint: Vec<u8>,
) -> Kept {
    let Some(sequence) = checkpoint
        .get(..8)
        .map(|bytes| u64::from_be_bytes(bytes.try_into().expect("eight bytes")))
    else {
        return Kept::Older;
    };
    if table
        .lookup(&key)
        .is_some_and(|(kept, _)| *kept >= sequence)
    {
        return Kept::Older;
    }
    match table.insert(key, (sequence, checkpoint)) {
        Ok(()) => Kept::Newest,
        Err(_) => Kept::Refused,
    }
}

/// The caller of a call (its address and UDP port).
fn caller_of(packet: &Packet, udp: usize) -> (Ipv4Address, u16) {
    let caller = packet
        .headers
        .ipv4
        .map(|fields| fields.source)
        .unwrap_or_default();
    (
        caller,
        u16::from_be_bytes([packet.bytes[udp], packet.bytes[udp + 1]]),
    )
}

/// Rewrites the IPv4 destination (and checksum) of the frame whose IPv4
/// header starts at `ip` to `node`.
fn readdress(frame: &mut [u8], ip: usize, node: Ipv4Address) {
    frame[ip + 16..ip + 20].copy_from_slice(&node.0);
    Ipv4Packet::new_unchecked(&mut frame[ip..]).fill_checksum();
}

/// Rewrites the IPv4 source (and checksum) of the frame whose IPv4 header
/// starts at `ip` to `node`.
fn readdress_source(frame: &mut [u8], ip: usize, node: Ipv4Address) {
    frame[ip + 12..ip + 16].copy_from_slice(&node.0);
    Ipv4Packet::new_unchecked(&mut frame[ip..]).fill_checksum();
}

impl Gatekeeper {
    pub fn new(config: GatekeeperConfig) -> Gatekeeper {
        let shape = |name, stage, key_bits, action_data_bits, capacity| TableShape {
            name,
            stage,
            key_bits,
            action_data_bits,
            capacity,
        };
        Gatekeeper {
            service_address: config.service_address,
            nodes: ExactTable::new(shape("gatekeeper_nodes", 0, 32, 80, config.nodes)),
            routes: ExactTable::new(shape("gatekeeper_routes", 0, 128, 32, config.routes)),
            graph: ExactTable::new(shape(
                "gatekeeper_graph",
                1,
                112,
                304,
                config.calls_in_flight,
            )),
            answered: RecentCalls::new(
                shape("gatekeeper_answered", 1, 112, 32, config.calls_in_flight),
                config.call_lease,
            ),
            expired: RecentCalls::new(
                shape("gatekeeper_expired", 1, 112, 304, config.calls_in_flight),
                config.call_lease,
            ),
            failed_with_callee: RecentCalls::new(
                shape(
                    "gatekeeper_failed_with_callee",
                    1,
                    112,
                    304,
                    config.calls_in_flight,
                ),
                config.call_lease,
            ),
            clock: Timestamp::ZERO,
            checkpoints: ExactTable::new(shape(
                "gatekeeper_checkpoints",
                2,
                32,
                (MAX_CHECKPOINT_BYTES * 8) as u16,
                config.nodes,
            )),
            caller_checkpoint_order: VecDeque::new(),
            caller_checkpoints: ExactTable::new(shape(
                "gatekeeper_caller_checkpoints",
                2,
                48,
                (MAX_CHECKPOINT_BYTES * 8) as u16,
                config.nodes,
            )),
            call_frames: ExactTable::new(shape(
                "gatekeeper_call_frames",
                2,
                112,
                (MAX_KEPT_FRAME_BYTES * 8) as u16,
                config.calls_in_flight,
            )),
            heard: ExactTable::new(shape("gatekeeper_heard", 0, 32, 96, config.nodes)),
            heartbeat_timeout: config.heartbeat_timeout,
            next_liveness_check: Timestamp::ZERO,
            call_lease: config.call_lease,
            next_lease_check: Timestamp::ZERO,
            held: VecDeque::new(),
            held_capacity: config.held_calls,
            packet_outs: VecDeque::new(),
            detected: VecDeque::new(),
            memory: MemoryStage::new(config.memory),
            standing_for: ExactTable::new(shape(
                "gatekeeper_standing_for",
                0,
                32,
                32,
                config.nodes,
            )),
            replaced_by: ExactTable::new(shape("gatekeeper_replaced_by", 0, 32, 33, config.nodes)),
            fenced: ExactTable::new(shape("gatekeeper_fenced", 0, 32, 33, config.nodes)),
            router_mac: None,
            counters: GatekeeperCounters::default(),
        }
    }

    /// Nodes found failed by missed heartbeats since the last call, oldest
    /// first: the control plane starts their replacements.
    pub fn take_detected(&mut self) -> Vec<Ipv4Address> {
        self.detected.drain(..).collect()
    }

    /// Calls held for failed nodes.
    pub fn held_calls(&self) -> usize {
        self.held.len()
    }

    /// A node's message on the control port: a heartbeat, an export, or
    /// a commit (a callee's checkpoint taken as a call arrived, b1).
    fn take_node_message(&mut self, now: Timestamp, packet: &mut Packet, udp: usize) -> Claim {
        packet.egress = Egress::Drop;
        let node = packet
            .headers
            .ipv4
            .map(|fields| fields.source)
            .unwrap_or_default();
        // RoCE and UDP carry no proof of their sender: a node's messages
        // (heartbeats, exports, commits) must come in where it is attached,
        // or any host could commit checkpoints in its name.
        if !self
            .memory
            .check_arrival(node, packet.original_ingress_port)
        {
            return Claim::Taken;
        }
        let commit = match NodeMessage::parse(&packet.bytes[udp + 8..]) {
            Ok(NodeMessage::Heartbeat(heartbeat)) => {
                self.take_heartbeat(now, node, heartbeat, packet);
                None
            }
            Ok(NodeMessage::Export(export)) => {
                self.take_export(node, export);
                None
            }
            Ok(NodeMessage::Commit(checkpoint)) => Some(checkpoint.to_vec()),
            Err(_) => {
                self.counters.malformed += 1;
                None
            }
        };
        if let Some(checkpoint) = commit {
            if self.keep_checkpoint(node, checkpoint) {
                self.counters.commits += 1;
            }
        }
        Claim::Taken
    }

    /// Keeps `checkpoint` as `node`'s if it is its newest. Only a node
    /// that announced itself keeps checkpoints (false, counted malformed,
    /// for any other): the table is sized for the nodes, not for whoever
    /// sends.
    fn keep_checkpoint(&mut self, node: Ipv4Address, checkpoint: Vec<u8>) -> bool {
        if self.nodes.lookup(&node).is_none() {
            self.counters.malformed += 1;
            return false;
        }
        match keep_newest(&mut self.checkpoints, node, checkpoint) {
            Kept::Newest => self.counters.checkpoints += 1,
            Kept::Refused => self.counters.checkpoints_refused += 1,
            Kept::Older => {}
        }
        true
    }

    /// A node exports a method: calls of it go to the node, unless another
    /// live node serves it (a restarted node does not take back what its
    /// replacement took over) or the node is unknown or failed.
    fn take_export(&mut self, node: Ipv4Address, export: ExportRepr) {
        let Ok(key) = method_key(export.method()) else {
            self.counters.malformed += 1;
            return;
        };
        let served_by = self.routes.lookup(&key).copied();
        let taken_by_another = served_by.is_some_and(|other| other != node);
        let node_live = self
            .nodes
            .lookup(&node)
            .is_some_and(|info| info.status != NodeStatus::Failed);
        if taken_by_another || !node_live {
            self.counters.exports_refused += 1;
            return;
        }
        if served_by.is_none() {
            let Some(info) = self.nodes.lookup_mut(&node) else {
                return;
            };
            info.status = NodeStatus::InUse;
            match self.routes.insert(key, node) {
                Ok(()) => self.counters.exports += 1,
                Err(_) => self.counters.exports_refused += 1,
            }
        }
    }

    /// The node calls of `method` go to, if any.
    pub fn route_of(&self, method: &str) -> Option<Ipv4Address> {
        let key = method_key(method.as_bytes()).ok()?;
        self.routes.lookup(&key).copied()
    }

    /// A heartbeat: the first from a node announces it (registration on
    /// boot); every one says it is alive.
    fn take_heartbeat(
        &mut self,
        now: Timestamp,
        node: Ipv4Address,
        heartbeat: HeartbeatRepr,
        packet: &mut Packet,
    ) {
        self.counters.heartbeats += 1;
        let restarted = self
            .heard
            .lookup(&node)
            .is_some_and(|(_, incarnation)| *incarnation != heartbeat.incarnation);
        if restarted {
            // A node that came back faster than the heartbeat timeout has
            // lost its state all the same: it fails, and is recovered. Its
            // fence is for the life that failed, not this new boot.
            self.detect_failure(node, packet);
            if !self.is_stood_in_for(node) {
                self.fenced.remove(&node);
            }
        }
        if self.nodes.lookup(&node).is_none() {
            if self
                .register_node(node, heartbeat.kind, heartbeat.capacity_bytes)
                .is_err()
            {
                // A full node table: the node stays unknown, and counted.
                self.counters.malformed += 1;
                return;
            }
            self.counters.nodes_announced += 1;
            // A node that announces itself starts afresh: an earlier life
            // at this address, replaced, must not keep its newer
            // checkpoints out (kept by sequence) or send its rights to
            // that life's replacement.
            self.checkpoints.remove(&node);
            self.replaced_by.remove(&node);
            self.forget_answers_of(node);
        }
        if self
            .heard
            .insert(node, (now, heartbeat.incarnation))
            .is_err()
        {
            self.counters.malformed += 1;
        }
    }

    /// Removes the calls in flight longer than the call lease; looked at
    /// most four times a lease, on whatever packet passes.
    fn expire_calls(&mut self, now: Timestamp) {
        if now < self.next_lease_check {
            return;
        }
        self.next_lease_check = now.saturating_add(self.call_lease / 4);
        let lease = self.call_lease;
        let mut expired: Vec<CallKey> = self
            .graph
            .iter()
            .filter(|(_, edge)| edge.since.saturating_add(lease) < now)
            .map(|(key, _)| *key)
            .collect();
        // One order for every run of a seed, whatever the table's: the
        // order they are recorded in is the order they are forgotten in.
        expired.sort_unstable_by_key(|(caller, port, rpc_id)| (caller.0, *port, *rpc_id));
        for key in expired {
            if let Some(edge) = self.graph.remove(&key) {
                // The lease ends with the call, answered or not.
                self.end_call_lease(&edge);
                self.expired.record(now, key, edge);
            }
            self.call_frames.remove(&key);
            self.counters.calls_expired += 1;
        }
    }

    /// Marks failed every node heard from before and silent for longer
    /// than the timeout; checked at most four times a timeout, on whatever
    /// packet passes (live nodes' heartbeats keep packets passing).
    fn check_liveness(&mut self, now: Timestamp, packet: &mut Packet) {
        let Some(timeout) = self.heartbeat_timeout else {
            return;
        };
        if now < self.next_liveness_check {
            return;
        }
        self.next_liveness_check = now.saturating_add(timeout / 4);
        let mut silent: Vec<Ipv4Address> = self
            .heard
            .iter()
            .filter(|(_, (heard, _))| heard.saturating_add(timeout) < now)
            .map(|(node, _)| *node)
            .collect();
        // One order for every run of a seed, whatever the table's.
        silent.sort_unstable_by_key(|node| node.0);
        for node in silent {
            // Detected first: the fence keeps the incarnation that failed
            // (taken off `heard`, it kept none, and any heartbeat of the
            // failed life lifted it).
            self.detect_failure(node, packet);
            self.heard.remove(&node);
        }
    }

    /// `node` failed (silent, or back with a new incarnation): marked
    /// failed, queued for the control plane, and digested.
    fn detect_failure(&mut self, node: Ipv4Address, packet: &mut Packet) {
        if self.mark_failed(node).is_err() {
            return;
        }
        self.counters.failures_detected += 1;
        if self.detected.len() < self.nodes.capacity() {
            self.detected.push_back(node);
        }
        if packet.digest.is_none() {
            packet.digest = Some(Digest {
                kind: DIGEST_NODE_FAILED,
                values: [u64::from(u32::from_be_bytes(node.0)), 0, 0, 0],
            });
        }
    }

    pub fn counters(&self) -> GatekeeperCounters {
        GatekeeperCounters {
            memory: self.memory.counters(),
            answered_forgotten_early: self.answered.forgotten_early(),
            expired_forgotten_early: self.expired.forgotten_early(),
            failed_with_callee_forgotten_early: self.failed_with_callee.forgotten_early(),
            ..self.counters
        }
    }

    /// A memory node of the DSM: RDMA to it is judged by the ACL.
    pub fn register_memory_node(
        &mut self,
        address: Ipv4Address,
        node: MemoryNode,
    ) -> Result<(), GatekeeperError> {
        Ok(self.memory.register_node(address, node)?)
    }

    /// A client's queue pair connected to a memory node's: what the
    /// switch needs to answer a refused request with a NAK.
    pub fn register_connection(
        &mut self,
        client: (Ipv4Address, remora_wire::Qpn),
        memory: (Ipv4Address, remora_wire::Qpn),
    ) -> Result<(), GatekeeperError> {
        Ok(self.memory.register_connection(client, memory)?)
    }

    /// The switch port a DSM host (a client or a memory node) is attached
    /// to: its frames to or from memory nodes must come through it.
    pub fn register_host_port(
        &mut self,
        client: Ipv4Address,
        port: remora_base::PortId,
    ) -> Result<(), GatekeeperError> {
        Ok(self.memory.register_host_port(client, port)?)
    }

    /// The ACL's rules.
    pub fn acl(&self) -> &acl::Acl {
        &self.memory.acl
    }

    pub fn node(&self, address: Ipv4Address) -> Option<NodeInfo> {
        self.nodes.lookup(&address).copied()
    }

    /// A node announces itself on boot.
    pub fn register_node(
        &mut self,
        address: Ipv4Address,
        kind: NodeKind,
        capacity_bytes: u64,
    ) -> Result<(), GatekeeperError> {
        let info = NodeInfo {
            kind,
            capacity_bytes,
            status: NodeStatus::Free,
        };
        self.nodes.insert(address, info)?;
        // The control plane registers a node afresh: a fence left by an
        // earlier life at the address goes (unless a stand-in sends under
        // it), or all it sends would be dropped for good.
        if !self.is_stood_in_for(address) {
            self.fenced.remove(&address);
        }
        Ok(())
    }

    /// Calls of `method` go to `node`, which is then in use.
    pub fn route(&mut self, method: &str, node: Ipv4Address) -> Result<(), GatekeeperError> {
        let key = method_key(method.as_bytes())?;
        let info = self
            .nodes
            .lookup_mut(&node)
            .ok_or(GatekeeperError::UnknownNode(node))?;
        if info.status == NodeStatus::Failed {
            return Err(GatekeeperError::NodeFailed(node));
        }
        info.status = NodeStatus::InUse;
        Ok(self.routes.insert(key, node)?)
    }

    /// The control plane saw `node` fail (a missed heartbeat): calls to it
    /// are held from now on, and those in flight to it that share its fate
    /// are answered with the failure at once. Returns the calls in flight
    /// to it that will be recovered.
    pub fn mark_failed(&mut self, node: Ipv4Address) -> Result<usize, GatekeeperError> {
        if self.nodes.lookup(&node).is_none() {
            return Err(GatekeeperError::UnknownNode(node));
        }
        self.fence(node);
        let info = self
            .nodes
            .lookup_mut(&node)
            .ok_or(GatekeeperError::UnknownNode(node))?;
        info.status = NodeStatus::Failed;
        let mut sharing: Vec<CallKey> = self
            .graph
            .iter()
            .filter(|(_, edge)| edge.callee == node && edge.shares_fate)
            .map(|(key, _)| *key)
            .collect();
        // One order for every run of a seed, whatever the table's.
        sharing.sort_unstable_by_key(|(caller, port, rpc_id)| (caller.0, *port, *rpc_id));
        for key in sharing {
            self.call_frames.remove(&key);
            if let Some(edge) = self.graph.remove(&key) {
                self.settle_pointers(&edge, GlobalAddress::NULL);
                self.fail_with_callee(edge);
            }
        }
        Ok(self.edges().filter(|edge| edge.callee == node).count())
    }

    /// Answers a call that shares its callee's fate failed, and keeps it
    /// so that a resend is answered so again, not run by a replacement.
    fn fail_with_callee(&mut self, edge: CallEdge) {
        self.answer_failed(&edge);
        let key = (edge.caller, edge.caller_port, edge.rpc_id);
        self.failed_with_callee.record(self.clock, key, edge);
    }

    /// Answers a call that shares its callee's fate, in the callee's
    /// stead: an EXCEPTION flagged `CALLEE_FAILED_FLAG`, from the service
    /// address, sent back into the pipeline (routing takes it to the
    /// caller).
    fn answer_failed(&mut self, edge: &CallEdge) {
        let Some(router) = self.router_mac else {
            return;
        };
        let name_length = edge
            .method
            .iter()
            .position(|&byte| byte == 0)
            .unwrap_or(METHOD_NAME_LEN);
        let method = std::str::from_utf8(&edge.method[..name_length]).unwrap_or("");
        let Ok(mut repr) = BifrostRepr::new(CallType::Exception, method, edge.rpc_id, edge.pointer)
        else {
            return;
        };
        repr.flags = crate::rpc::CALLEE_FAILED_FLAG;
        let body = format!("callee {:?} failed", edge.callee);
        let mut payload = vec![0u8; HEADER_LEN + body.len()];
        repr.emit(&mut payload).expect("the buffer holds a header");
        payload[HEADER_LEN..].copy_from_slice(body.as_bytes());
        let from = DatagramEnd {
            mac: router,
            address: self.service_address,
            port: BIFROST_PORT,
        };
        let to = DatagramEnd {
            mac: router,
            address: edge.caller,
            port: edge.caller_port,
        };
        let mut frame = vec![0u8; DATAGRAM_HEADERS_LEN + payload.len()];
        if let Ok(length) = emit_datagram(from, to, &payload, &mut frame) {
            frame.truncate(length);
            self.packet_outs.push_back(frame);
            self.counters.fate_shared += 1;
        }
    }

    /// [`Gatekeeper::recover`], and `replacement` takes the failed node's
    /// place in the network too: RPC datagrams to the failed node's
    /// address go to it, and its own leave under the failed node's
    /// address. A middle service restarted on another host then calls on
    /// as the caller its callees knew, and they answer the calls it makes
    /// again from memory. Returns the routes moved.
    pub fn recover_in_place_of(
        &mut self,
        failed: Ipv4Address,
        replacement: Ipv4Address,
    ) -> Result<usize, GatekeeperError> {
        // Room for the new stand-in's entry, checked before anything moves
        // (a failed stand-in's entry moves to its replacement instead).
        let standing = &self.standing_for;
        if standing.lookup(&failed).is_none() && standing.len() >= standing.capacity() {
            return Err(GatekeeperError::Table(TableError::Full {
                table: "gatekeeper_standing_for",
                capacity: standing.capacity(),
            }));
        }
        let moved = self.recover(failed, replacement)?;
        // A failed stand-in's replacement stands in for the same name
        // already (`recover`); otherwise it takes the failed node's.
        let name = self
            .standing_for
            .lookup(&replacement)
            .copied()
            .unwrap_or(failed);
        let in_place = Replacement {
            node: replacement,
            in_place: true,
        };
        self.replaced_by.insert(failed, in_place)?;
        self.replaced_by.insert(name, in_place)?;
        self.standing_for.insert(replacement, name)?;
        Ok(moved)
    }

    /// Fences `node` with the incarnation that failed: one fenced already
    /// keeps the one it has. A full table makes room by a fence of an
    /// address no node is registered at any more; failing that, the node
    /// goes unfenced (counted), as a failure must be marked whatever the
    /// table holds.
    fn fence(&mut self, node: Ipv4Address) {
        let kept = self.fenced.lookup(&node).copied().flatten();
        let heard = self
            .heard
            .lookup(&node)
            .map(|(_, incarnation)| *incarnation);
        let incarnation = kept.or(heard);
        if self.fenced.insert(node, incarnation).is_ok() {
            return;
        }
        let mut gone: Vec<Ipv4Address> = self
            .fenced
            .iter()
            .map(|(address, _)| *address)
            .filter(|address| self.nodes.lookup(address).is_none())
            .filter(|address| !self.is_stood_in_for(*address))
            .collect();
        // One order for every run of a seed, whatever the table's.
        gone.sort_unstable_by_key(|address| address.0);
        if let Some(victim) = gone.first() {
            self.fenced.remove(victim);
            if self.fenced.insert(node, incarnation).is_ok() {
                return;
            }
        }
        self.counters.fences_refused += 1;
    }

    /// Whether a stand-in sends under `node`'s address.
    fn is_stood_in_for(&self, node: Ipv4Address) -> bool {
        self.standing_for.values().any(|failed| *failed == node)
    }

    /// Whether `packet` comes from a node marked failed: its late replies
    /// would answer calls its replacement runs again (and hand over the
    /// pointers they return), its checkpoints would replace the one the
    /// replacement started from, its RDMA would land on regions handed
    /// over. A heartbeat of a new boot lifts the fence, unless a stand-in
    /// sends under the address. The switch's own packets pass.
    fn fenced_out(&mut self, packet: &Packet) -> bool {
        if packet.original_ingress_port == GENERATOR_PORT {
            return false;
        }
        let Some(source) = packet.headers.ipv4.map(|fields| fields.source) else {
            return false;
        };
        let Some(&failed_in) = self.fenced.lookup(&source) else {
            return false;
        };
        // A heartbeat in the node's name from elsewhere lifts nothing.
        let where_attached = self
            .memory
            .check_arrival(source, packet.original_ingress_port);
        if where_attached
            && is_heartbeat_of_another_boot(packet, failed_in)
            && !self.is_stood_in_for(source)
        {
            self.fenced.remove(&source);
            return false;
        }
        self.counters.fenced += 1;
        true
    }

    /// Rewrites an RPC datagram's addresses for the nodes standing in for
    /// failed ones (see [`Gatekeeper::recover_in_place_of`]).
    fn stand_in(&mut self, packet: &mut Packet, ip: usize) {
        let Some(fields) = packet.headers.ipv4 else {
            return;
        };
        if let Some(&failed) = self.standing_for.lookup(&fields.source) {
            readdress_source(&mut packet.bytes, ip, failed);
            if let Some(fields) = packet.headers.ipv4.as_mut() {
                fields.source = failed;
            }
            self.counters.stood_in += 1;
        }
        let stand_in = self
            .replaced_by
            .lookup(&fields.destination)
            .filter(|replaced| replaced.in_place)
            .map(|replaced| replaced.node);
        if let Some(replacement) = stand_in {
            readdress(&mut packet.bytes, ip, replacement);
            if let Some(fields) = packet.headers.ipv4.as_mut() {
                fields.destination = replacement;
            }
            self.counters.stood_in += 1;
        }
    }

    /// A failed node's rights on global memory pass to its replacement:
    /// done by [`Gatekeeper::recover`], and before it by a control plane
    /// whose replacement must restore the node's regions (their
    /// snapshots) before calls reach it. Returns the allocations whose
    /// rules changed.
    pub fn hand_over_memory(&mut self, failed: Ipv4Address, replacement: Ipv4Address) -> usize {
        self.memory.acl.hand_over(failed, replacement)
    }

    /// `replacement` takes over every method of the failed node, whose
    /// routes and calls in flight move to it. Returns the routes moved.
    pub fn recover(
        &mut self,
        failed: Ipv4Address,
        replacement: Ipv4Address,
    ) -> Result<usize, GatekeeperError> {
        let info = self
            .nodes
            .lookup(&failed)
            .ok_or(GatekeeperError::UnknownNode(failed))?;
        if info.status != NodeStatus::Failed {
            return Err(GatekeeperError::NotFailed(failed));
        }
        let spare = self
            .nodes
            .lookup_mut(&replacement)
            .ok_or(GatekeeperError::UnknownNode(replacement))?;
        if spare.status == NodeStatus::Failed {
            return Err(GatekeeperError::NodeFailed(replacement));
        }
        // A stand-in sends under one failed node's address: taking on a
        // second, its datagrams for one would leave in the other's name
        // (the table kept only the newer, silently).
        if self.standing_for.lookup(&replacement).is_some() {
            return Err(GatekeeperError::AlreadyStandingIn(replacement));
        }

        // Refused before anything moves: a full table once failed here
        // after the routes, the calls and the memory had moved.
        let replaced = &self.replaced_by;
        if replaced.lookup(&failed).is_none() && replaced.len() >= replaced.capacity() {
            return Err(GatekeeperError::Table(TableError::Full {
                table: "gatekeeper_replaced_by",
                capacity: replaced.capacity(),
            }));
        }
        let spare = self
            .nodes
            .lookup_mut(&replacement)
            .ok_or(GatekeeperError::UnknownNode(replacement))?;
        spare.status = NodeStatus::InUse;
        let methods: Vec<MethodKey> = self
            .routes
            .iter()
            .filter(|(_, node)| **node == failed)
            .map(|(method, _)| *method)
            .collect();
        for method in &methods {
            self.routes.insert(*method, replacement)?;
        }
        let mut moved = Vec::new();
        for (key, edge) in self.graph.iter_mut() {
            if edge.callee == failed {
                edge.callee = replacement;
                moved.push(*key);
            }
        }
        moved.sort_unstable_by_key(|(caller, port, rpc_id)| (caller.0, *port, *rpc_id));
        // The calls in flight to the failed node go again to its
        // replacement, which drops those it answered before (its
        // checkpoint's replies), and the held calls are routed afresh.
        for key in moved {
            if let Some(mut frame) = self.call_frames.remove(&key) {
                // Kept frames are IPv4 behind an untagged Ethernet header
                // (the switch's parser knows no other).
                readdress(
                    &mut frame,
                    remora_wire::ethernet::ETHERNET_HEADER_LEN,
                    replacement,
                );
                self.packet_outs.push_back(frame);
                self.counters.replayed += 1;
            }
        }
        while let Some((_, frame)) = self.held.pop_front() {
            self.packet_outs.push_back(frame);
            self.counters.replayed += 1;
        }
        // Its pointers pass to its replacement, which restarts from its
        // checkpoint and so takes up what it controlled.
        self.hand_over_memory(failed, replacement);
        // Whatever the failed node held for others (it replaced an earlier
        // failure) passes on too: one lookup finds the live holder.
        let held_for: Vec<(Ipv4Address, Replacement)> = self
            .replaced_by
            .iter()
            .filter(|(_, replaced)| replaced.node == failed)
            .map(|(lost, replaced)| (*lost, *replaced))
            .collect();
        for (lost, replaced) in held_for {
            let moved_on = Replacement {
                node: replacement,
                ..replaced
            };
            self.replaced_by.insert(lost, moved_on)?;
        }
        let elsewhere = Replacement {
            node: replacement,
            in_place: false,
        };
        self.replaced_by.insert(failed, elsewhere)?;
        // A failed stand-in's replacement stands in for the same name: its
        // callees know the caller by that name, and run its calls again
        // under any other.
        if let Some(name) = self.standing_for.remove(&failed) {
            self.standing_for.insert(replacement, name)?;
        }
        // Forwarding to the failed node stops: it serves nothing now. Its
        // checkpoint went to its replacement (the control plane takes it
        // before recovering).
        self.nodes.remove(&failed);
        self.heard.remove(&failed);
        self.checkpoints.remove(&failed);
        Ok(methods.len())
    }

    /// The RPCs in flight.
    pub fn edges(&self) -> impl Iterator<Item = &CallEdge> {
        self.graph.values()
    }

    /// A node's newest checkpoint, to start its replacement from.
    pub fn checkpoint_of(&self, node: Ipv4Address) -> Option<&[u8]> {
        self.checkpoints
            .lookup(&node)
            .map(|(_, bytes)| bytes.as_slice())
    }

    /// Takes the checkpoint off a reply (b2) and keeps it if it is the
    /// node's newest.
    fn take_checkpoint(&mut self, packet: &mut Packet, ip: usize, udp: usize) {
        let source = packet
            .headers
            .ipv4
            .map(|fields| fields.source)
            .unwrap_or_default();
        // A stand-in's reply left here readdressed to the node it stands
        // for, which recovery removed: keyed there, its checkpoints were all
        // refused, and a second failure had none to restore. They are the
        // stand-in's own.
        let node = self
            .replaced_by
            .lookup(&source)
            .filter(|replaced| replaced.in_place)
            .map_or(source, |replaced| replaced.node);
        let Some(checkpoint) = self.strip_checkpoint(packet, ip, udp) else {
            return;
        };
        // As for a commit: a reply's checkpoint is kept in its node's name
        // only if it came in where that node is attached, from a node that
        // announced itself. Otherwise any host could send a "reply" to no
        // call, in a node's name, with a checkpoint its failover restores.
        if self
            .memory
            .check_arrival(node, packet.original_ingress_port)
        {
            self.keep_checkpoint(node, checkpoint);
        }
    }

    /// Takes the caller's checkpoint off a call (a1, a2) and keeps it if
    /// it is the caller's newest.
    fn take_caller_checkpoint(&mut self, packet: &mut Packet, ip: usize, udp: usize) {
        let caller = caller_of(packet, udp);
        let Some(checkpoint) = self.strip_checkpoint(packet, ip, udp) else {
            return;
        };
        // A caller's restart restores this: not from a host posing as it.
        if !self
            .memory
            .check_arrival(caller.0, packet.original_ingress_port)
        {
            return;
        }
        let table = &self.caller_checkpoints;
        let new_caller = table.lookup(&caller).is_none();
        let full = table.len() >= table.resources().capacity;
        // A checkpoint too short to carry its sequence is dropped anyway.
        if new_caller && full && checkpoint.len() >= 8 {
            if let Some(evicted) = self.caller_checkpoint_to_evict(caller.0) {
                self.caller_checkpoint_order
                    .retain(|known| *known != evicted);
                self.caller_checkpoints.remove(&evicted);
                self.counters.caller_checkpoints_evicted += 1;
            }
        }
        match keep_newest(&mut self.caller_checkpoints, caller, checkpoint) {
            Kept::Newest => {
                self.counters.caller_checkpoints += 1;
                self.caller_checkpoint_order
                    .retain(|known| *known != caller);
                self.caller_checkpoint_order.push_back(caller);
                debug_assert!(self.caller_checkpoint_order.len() <= self.caller_checkpoints.len());
            }
            Kept::Refused => self.counters.checkpoints_refused += 1,
            Kept::Older => {}
        }
    }

    /// The caller whose checkpoint makes room in a full table for one
    /// from `newcomer`: the least recently renewed of the address with the
    /// most callers kept, the newcomer's own among those tied. Taken from
    /// all callers alike, a host calling from many ports (each port a
    /// caller) evicted every other host's checkpoint, live callers' too,
    /// whose restart then found none; now it evicts its own first. Bounded
    /// by the table's capacity.
    fn caller_checkpoint_to_evict(&self, newcomer: Ipv4Address) -> Option<(Ipv4Address, u16)> {
        let mut kept_per_address: Vec<(Ipv4Address, usize)> = Vec::new();
        for (address, _) in &self.caller_checkpoint_order {
            match kept_per_address
                .iter_mut()
                .find(|(known, _)| known == address)
            {
                Some((_, count)) => *count += 1,
                None => kept_per_address.push((*address, 1)),
            }
        }
        let most = kept_per_address.iter().map(|(_, count)| *count).max()?;
        let newcomer_crowded = kept_per_address
            .iter()
            .any(|(known, count)| *known == newcomer && *count == most);
        let crowded = |address: &Ipv4Address| {
            if newcomer_crowded {
                return *address == newcomer;
            }
            kept_per_address
                .iter()
                .any(|(known, count)| known == address && *count == most)
        };
        // The order runs least recently renewed first.
        self.caller_checkpoint_order
            .iter()
            .find(|(address, _)| crowded(address))
            .copied()
    }

    /// Cuts the checkpoint out of a datagram that carries one: the rest
    /// goes on without it, its lengths and IPv4 checksum rewritten (the
    /// UDP checksum is not used: zero). None, counted, if it is malformed.
    fn strip_checkpoint(&mut self, packet: &mut Packet, ip: usize, udp: usize) -> Option<Vec<u8>> {
        let payload = udp + 8;
        let header = BifrostHeader::new_checked(&packet.bytes[payload..]).ok()?;
        let Some((body, checkpoint)) = split_reply(header.payload()) else {
            self.counters.malformed += 1;
            return None;
        };
        let checkpoint = checkpoint.to_vec();
        let repr = BifrostRepr {
            flags: header.flags() & !CHECKPOINT_FLAG,
            ..BifrostRepr::parse(&header)
        };
        let body_length = body.len();
        let end = payload + HEADER_LEN + body_length;
        repr.emit(&mut packet.bytes[payload..])
            .expect("a header fits where one was");
        packet.bytes.copy_within(
            payload + HEADER_LEN + 4..payload + HEADER_LEN + 4 + body_length,
            payload + HEADER_LEN,
        );
        packet.bytes.truncate(end);
        let udp_length = (end - udp) as u16;
        packet.bytes[udp + 4..udp + 6].copy_from_slice(&udp_length.to_be_bytes());
        packet.bytes[udp + 6..udp + 8].copy_from_slice(&[0, 0]);
        let ip_length = (end - ip) as u16;
        packet.bytes[ip + 2..ip + 4].copy_from_slice(&ip_length.to_be_bytes());
        Ipv4Packet::new_unchecked(&mut packet.bytes[ip..]).fill_checksum();
        Some(checkpoint)
    }

    /// A caller's newest checkpoint, to restart it from.
    pub fn caller_checkpoint_of(&self, caller: (Ipv4Address, u16)) -> Option<&[u8]> {
        self.caller_checkpoints
            .lookup(&caller)
            .map(|(_, bytes)| bytes.as_slice())
    }

    fn fail(&mut self, packet: &mut Packet, value: u64) -> Claim {
        packet.egress = Egress::Drop;
        packet.digest = Some(Digest {
            kind: DIGEST_RPC_FAILURE,
            values: [value, 0, 0, 0],
        });
        Claim::Taken
    }

    /// A call to the service address: route it by method, or hold it.
    fn route_call(&mut self, now: Timestamp, packet: &mut Packet, ip: usize, udp: usize) -> Claim {
        let checkpointed = BifrostHeader::new_checked(&packet.bytes[udp + 8..])
            .is_ok_and(|header| header.flags() & CHECKPOINT_FLAG != 0);
        if checkpointed {
            self.take_caller_checkpoint(packet, ip, udp);
        }
        let payload = &packet.bytes[udp + 8..];
        let Ok(header) = BifrostHeader::new_checked(payload) else {
            self.counters.malformed += 1;
            packet.egress = Egress::Drop;
            return Claim::Taken;
        };
        // Only calls go to the service address. A reply or an exception
        // sent there was routed as a call: it held a place in the graph
        // and a lease for the whole call lease, and a host sending them
        // kept the graph full for every other caller.
        if !matches!(header.call_type(), CallType::Call | CallType::Oneway) {
            self.counters.malformed += 1;
            packet.egress = Egress::Drop;
            return Claim::Taken;
        }
        let Ok(key) = method_key(header.method_name()) else {
            self.counters.malformed += 1;
            packet.egress = Egress::Drop;
            return Claim::Taken;
        };
        let Some(&routed) = self.routes.lookup(&key) else {
            self.counters.unrouted += 1;
            return self.fail(packet, 1);
        };
        // A resend goes where its call went (recovery moves calls in
        // flight and routes together): to the node of its edge, or, for
        // an answered call, to the one that answered it, which answers
        // it again from its replies. Sent where the route points now,
        // after the control plane moved it, it ran a second time.
        let (caller, caller_port) = caller_of(packet, udp);
        let call = (caller, caller_port, header.rpc_id());
        let node = self
            .graph
            .lookup(&call)
            .map(|edge| edge.callee)
            .or_else(|| self.answered_by(&call).map(|callee| self.holder(callee)))
            .unwrap_or(routed);
        if let Some(edge) = self.failed_with_its_callee(&call) {
            self.counters.failed_resends_answered += 1;
            self.answer_failed(&edge);
            packet.egress = Egress::Drop;
            return Claim::Taken;
        }
        let shares_fate = header.flags() & crate::rpc::SHARE_FATE_FLAG != 0;
        let node_failed = self
            .nodes
            .lookup(&node)
            .is_none_or(|info| info.status == NodeStatus::Failed);
        if node_failed && shares_fate {
            let edge = CallEdge {
                caller,
                caller_port,
                rpc_id: header.rpc_id(),
                callee: node,
                method: key,
                pointer: GlobalAddress::NULL,
                since: now,
                lent: false,
                shares_fate,
            };
            self.fail_with_callee(edge);
            packet.egress = Egress::Drop;
            return Claim::Taken;
        }
        if node_failed {
            let key = call;
            packet.egress = Egress::Drop;
            // A resend of a call already held replaces its frame: held
            // again, every resend took a place of its own, a few callers
            // resending through a long recovery filled the queue, and
            // new calls were refused (found by reading).
            if let Some((_, frame)) = self.held.iter_mut().find(|(held, _)| *held == key) {
                self.counters.held_resends += 1;
                frame.clone_from(&packet.bytes);
                return Claim::Taken;
            }
            if self.held.len() >= self.held_capacity {
                self.counters.held_dropped += 1;
                return self.fail(packet, 3);
            }
            self.counters.held += 1;
            self.held.push_back((key, packet.bytes.clone()));
            return Claim::Taken;
        }
        let edge = CallEdge {
            caller,
            caller_port,
            rpc_id: header.rpc_id(),
            callee: node,
            method: key,
            pointer: header.global_address(),
            since: now,
            lent: false,
            shares_fate,
        };
        let oneway = header.call_type() == CallType::Oneway;
        let key = (caller, caller_port, edge.rpc_id);
        let kept = self.graph.lookup(&key).copied();
        let answered = kept.is_none() && self.answered_by(&key).is_some();
        if answered {
            self.counters.answered_resends += 1;
        }
        let mut edge = match kept {
            // A resend keeps the call as it first passed: its time, its
            // pointer, its lease (a resend naming another pointer gets no
            // lease on it) and its callee (recovery moves that to a
            // replacement). Sent where the method's route pointed now, a
            // resend after the route moved ran the call twice, and the
            // first callee's reply was dropped as forged, so its lease on
            // the pointer never ended.
            Some(kept) => CallEdge {
                since: kept.since,
                pointer: kept.pointer,
                lent: kept.lent,
                callee: kept.callee,
                ..edge
            },
            None => edge,
        };
        // A ONEWAY has no reply to end a lease: it lends nothing. A resend
        // of an answered call is not in flight again: the callee answers it
        // from its replies, and no reply is owed a lease's end.
        let in_flight = !oneway && !answered;
        if in_flight && self.graph.insert(key, edge).is_err() {
            self.counters.graph_full += 1;
            return self.fail(packet, 2);
        }
        if in_flight && kept.is_none() {
            edge.lent = self.lend(&edge);
            if edge.lent {
                let updated = self.graph.insert(key, edge);
                debug_assert!(updated.is_ok(), "the edge is in the graph already");
            }
        }
        // Rewrite the destination to the callee; forwarding routes it there.
        readdress(&mut packet.bytes, ip, edge.callee);
        if let Some(fields) = packet.headers.ipv4.as_mut() {
            fields.destination = edge.callee;
        }
        if in_flight && packet.bytes.len() <= MAX_KEPT_FRAME_BYTES {
            // Same capacity as the graph, which just took this call.
            let kept = self.call_frames.insert(key, packet.bytes.clone());
            debug_assert!(kept.is_ok(), "the call frames fill with the graph");
        }
        self.counters.calls_routed += 1;
        if kept.is_some() || answered {
            self.counters.resends_routed += 1;
        }
        packet.digest = Some(Digest {
            kind: DIGEST_CALL,
            values: [
                u64::from(u32::from_be_bytes(caller.0)),
                edge.rpc_id,
                u64::from(u32::from_be_bytes(edge.callee.0)),
                0,
            ],
        });
        Claim::Pass
    }

    /// The node whose rights an address holds: a failed node's
    /// replacement holds them in its own name.
    fn holder(&self, address: Ipv4Address) -> Ipv4Address {
        self.replaced_by
            .lookup(&address)
            .map_or(address, |replaced| replaced.node)
    }

    /// A call's DSM pointer is lent to its callee to read (before the call
    /// goes on, so the callee can read it as soon as it has the call), and
    /// the caller's write is taken away. Whether it was lent.
    fn lend(&mut self, edge: &CallEdge) -> bool {
        let Some(ptr) = GlobalPtr::from_address(&edge.pointer) else {
            return false;
        };
        let (caller, callee) = (self.holder(edge.caller), self.holder(edge.callee));
        let lent = self.memory.acl.lend(ptr.node, ptr.offset, caller, callee);
        if lent.is_err() {
            self.counters.leases_refused += 1;
        }
        lent.is_ok()
    }

    /// A reply ends its call's lease and hands the pointer it returns, if
    /// any, from the callee to the caller.
    fn settle_pointers(&mut self, edge: &CallEdge, reply_pointer: GlobalAddress) {
        self.end_call_lease(edge);
        self.hand_returned_pointer(edge, reply_pointer);
    }

    /// The callee's lease on the call's pointer ends (its reply passed, or
    /// the call lease ran out).
    fn end_call_lease(&mut self, edge: &CallEdge) {
        if let (true, Some(ptr)) = (edge.lent, GlobalPtr::from_address(&edge.pointer)) {
            let callee = self.holder(edge.callee);
            self.memory.acl.end_lease(ptr.node, ptr.offset, callee);
        }
    }

    /// Control of the pointer a reply returns moves from the callee to
    /// the caller.
    fn hand_returned_pointer(&mut self, edge: &CallEdge, reply_pointer: GlobalAddress) {
        let (caller, callee) = (self.holder(edge.caller), self.holder(edge.callee));
        // A reply echoes its call's header: the argument comes back, and
        // only another pointer is one the callee returns.
        if reply_pointer == edge.pointer {
            return;
        }
        if let Some(ptr) = GlobalPtr::from_address(&reply_pointer) {
            let moved = self
                .memory
                .acl
                .transfer(ptr.node, ptr.offset, callee, caller);
            if moved.is_err() {
                self.counters.leases_refused += 1;
            }
        }
    }

    /// The call a reply answers: under the address it was made from (a
    /// reply to a node a stand-in replaced was readdressed to the
    /// stand-in), its port and RPC id.
    fn answered_call(&self, packet: &Packet, udp: usize, rpc_id: u64) -> CallKey {
        let destination = packet
            .headers
            .ipv4
            .map(|fields| fields.destination)
            .unwrap_or_default();
        let caller = self
            .standing_for
            .lookup(&destination)
            .copied()
            .unwrap_or(destination);
        let caller_port = u16::from_be_bytes([packet.bytes[udp + 2], packet.bytes[udp + 3]]);
        (caller, caller_port, rpc_id)
    }

    /// Whether a reply is forged, to be dropped, the call staying: it
    /// answers a call in the graph from another node than its callee, or
    /// a call no node may answer now.
    fn is_forged_reply(&self, packet: &Packet, udp: usize, rpc_id: u64) -> bool {
        let source = packet
            .headers
            .ipv4
            .map(|fields| fields.source)
            .unwrap_or_default();
        let key = self.answered_call(packet, udp, rpc_id);
        if let Some(edge) = self.graph.lookup(&key) {
            return self.holder(source) != self.holder(edge.callee);
        }
        // A late reply from the callee of a call whose lease ran out is
        // the call's outcome, though a resend of it may be held (its route
        // moved to a node that then failed): dropped, its pointer stayed
        // with the callee and the held resend ran a second time.
        let late = self
            .expired
            .get(&key)
            .is_some_and(|edge| self.holder(source) == self.holder(edge.callee));
        if late {
            return false;
        }
        // A held call's callee failed and is fenced, and no replacement
        // has had the call yet; a call failed with its callee runs
        // nowhere, answered by the Gatekeeper itself (its packet-outs).
        // A reply to either passed to the caller, which took it as the
        // call's outcome, and then the replacement ran the held call.
        let own = packet.original_ingress_port == GENERATOR_PORT;
        let answerable_by_none = self.held.iter().any(|(held, _)| *held == key)
            || self.failed_with_callee.get(&key).is_some();
        !own && answerable_by_none
    }

    /// The call, if it shared its callee's fate and was answered failed.
    fn failed_with_its_callee(&self, key: &CallKey) -> Option<CallEdge> {
        self.failed_with_callee.get(key).copied()
    }

    /// The call whose lease ran out that a late reply from `source`
    /// answers, taken from `expired`; none if it is not remembered, or
    /// the reply is not from the call's callee.
    fn take_expired(&mut self, key: &CallKey, source: Ipv4Address) -> Option<CallEdge> {
        let edge = self.expired.get(key)?;
        if self.holder(source) != self.holder(edge.callee) {
            return None;
        }
        self.expired.take(key)
    }

    /// The callee that answered `key`, if it was answered lately.
    fn answered_by(&self, key: &CallKey) -> Option<Ipv4Address> {
        self.answered.get(key).copied()
    }

    /// Forgets the answered calls whose callee was `node`: a node that
    /// announces itself at an address is a new life, which never ran
    /// them, and a resend of one goes by the route again. Bounded by the
    /// table's capacity, once per announcement.
    fn forget_answers_of(&mut self, node: Ipv4Address) {
        self.answered.forget_where(|callee| *callee == node);
    }

    /// A reply on its way to its caller: the call leaves the graph.
    fn see_reply(&mut self, packet: &mut Packet, udp: usize, header: (u64, GlobalAddress)) {
        let (rpc_id, reply_pointer) = header;
        let key = self.answered_call(packet, udp, rpc_id);
        let caller = key.0;
        self.call_frames.remove(&key);
        let source = packet
            .headers
            .ipv4
            .map(|fields| fields.source)
            .unwrap_or_default();
        // The graph first: a call resent after its lease ran out is in it
        // again, with a lease of its own to end.
        let expired = self.take_expired(&key, source);
        let callee = if let Some(edge) = self.graph.remove(&key) {
            self.settle_pointers(&edge, reply_pointer);
            edge.callee
        } else if let Some(edge) = expired {
            // Its lease ended when it expired.
            self.hand_returned_pointer(&edge, reply_pointer);
            self.counters.late_replies += 1;
            edge.callee
        } else {
            return;
        };
        self.answered.record(self.clock, key, callee);
        self.counters.replies += 1;
        packet.digest = Some(Digest {
            kind: DIGEST_REPLY,
            values: [u64::from(u32::from_be_bytes(caller.0)), rpc_id, 0, 0],
        });
    }
}

impl Overlay for Gatekeeper {
    fn name(&self) -> &str {
        "bifrost-gatekeeper"
    }

    fn attach(&mut self, switch_mac: remora_wire::MacAddress) {
        self.router_mac = Some(switch_mac);
    }

    fn before_forwarding(&mut self, now: Timestamp, packet: &mut Packet) -> Claim {
        self.clock = self.clock.max(now);
        self.check_liveness(now, packet);
        self.expire_calls(now);
        if self.fenced_out(packet) {
            packet.egress = Egress::Drop;
            return Claim::Taken;
        }
        if self.memory.concerns(packet) {
            self.memory.judge(now, packet, &mut self.packet_outs);
            return if packet.egress == Egress::Drop {
                Claim::Taken
            } else {
                Claim::Pass
            };
        }
        let Some((ip, udp, destination_port)) = bifrost_offsets(packet) else {
            return Claim::Pass;
        };
        // Heartbeats and exports keep their own addresses: a stand-in is
        // a node of its own to the control plane.
        if destination_port != CONTROL_PORT {
            // A call or reply must come in where its sender is attached,
            // as a node's messages must (checked before a stand-in's
            // source is readdressed): sent in another host's name, a
            // call lent the sender that host's pointer, and a reply in a
            // callee's name handed its allocation over. The switch's own
            // replays and answers come from its generator.
            let source = packet.headers.ipv4.map(|fields| fields.source);
            if source.is_some_and(|source| !self.memory.check_packet_arrival(source, packet)) {
                packet.egress = Egress::Drop;
                return Claim::Taken;
            }
            self.stand_in(packet, ip);
        }
        let destination = packet.headers.ipv4.map(|fields| fields.destination);
        if destination == Some(self.service_address) {
            if destination_port == CONTROL_PORT {
                return self.take_node_message(now, packet, udp);
            }
            return self.route_call(now, packet, ip, udp);
        }
        if destination_port == CONTROL_PORT {
            // A heartbeat to someone else is not the Gatekeeper's.
            return Claim::Pass;
        }
        let Ok(header) = BifrostHeader::new_checked(&packet.bytes[udp + 8..]) else {
            // Not the Gatekeeper's to judge: forwarded as any datagram.
            self.counters.malformed += 1;
            return Claim::Pass;
        };
        match header.call_type() {
            CallType::Reply | CallType::Exception => {
                let answered = (header.rpc_id(), header.global_address());
                let checkpointed = header.flags() & CHECKPOINT_FLAG != 0;
                if self.is_forged_reply(packet, udp, answered.0) {
                    self.counters.forged_replies += 1;
                    packet.egress = Egress::Drop;
                    return Claim::Taken;
                }
                if checkpointed {
                    self.take_checkpoint(packet, ip, udp);
                }
                self.see_reply(packet, udp, answered);
            }
            CallType::Call | CallType::Oneway => self.counters.direct += 1,
        }
        Claim::Pass
    }

    fn add_resources(&self, report: &mut ResourceReport) {
        report.tables.push(self.nodes.resources());
        report.tables.push(self.routes.resources());
        report.tables.push(self.graph.resources());
        report.tables.push(self.checkpoints.resources());
        report.tables.push(self.caller_checkpoints.resources());
        report.tables.push(self.call_frames.resources());
        report.tables.push(self.answered.resources());
        report.tables.push(self.expired.resources());
        report.tables.push(self.failed_with_callee.resources());
        report.tables.push(self.heard.resources());
        report.tables.push(self.standing_for.resources());
        report.tables.push(self.replaced_by.resources());
        report.tables.push(self.fenced.resources());
        self.memory.add_resources(report);
        // Calls held for a failed node until its replacement takes them.
        report.control_plane_held_frames = self.held_capacity;
    }

    fn poll_packet_out(&mut self) -> Option<Vec<u8>> {
        self.packet_outs.pop_front()
    }

    fn has_packet_out(&self) -> bool {
        !self.packet_outs.is_empty()
    }
}

/// The switch's MAC, a caller on port 0, a node on port 1, and the
/// Gatekeeper's service address, for [`two_hosts`].
const TWO_HOSTS_ROUTER: remora_wire::MacAddress = remora_wire::MacAddress([2, 0, 0, 0, 0, 0xfe]);
const TWO_HOSTS_CALLER: DatagramEnd = DatagramEnd {
    mac: remora_wire::MacAddress([2, 0, 0, 0, 0, 1]),
    address: Ipv4Address::new(10, 0, 0, 1),
    port: 40000,
};
const TWO_HOSTS_NODE: DatagramEnd = DatagramEnd {
    mac: remora_wire::MacAddress([2, 0, 0, 0, 0, 2]),
    address: Ipv4Address::new(10, 0, 0, 2),
    port: BIFROST_PORT,
};
const TWO_HOSTS_SERVICE: Ipv4Address = Ipv4Address::new(10, 0, 0, 200);

/// The Gatekeeper (with `config`) in an L2/L3 switch between
/// [`TWO_HOSTS_CALLER`] and [`TWO_HOSTS_NODE`], which serves `method`.
fn two_hosts(
    config: GatekeeperConfig,
    method: &str,
) -> remora_switch::Switch<remora_switch::programs::overlay::Overlaid<Gatekeeper>> {
    use remora_switch::programs::l2l3::L2L3Forwarding;
    use remora_switch::programs::overlay::Overlaid;
    use remora_switch::{Switch, SwitchConfig};
    let (caller, node) = (TWO_HOSTS_CALLER, TWO_HOSTS_NODE);
    let hosts = [(caller.mac, caller.address), (node.mac, node.address)];
    let forwarding =
        L2L3Forwarding::with_attached_hosts(TWO_HOSTS_ROUTER, &hosts).expect("two hosts fit");
    let mut gatekeeper = Gatekeeper::new(config);
    gatekeeper
        .register_node(node.address, NodeKind::Compute, 1)
        .expect("room for one node");
    gatekeeper
        .route(method, node.address)
        .expect("room for one route");
    Switch::new(SwitchConfig::new(2), Overlaid::new(forwarding, gatekeeper))
}

/// The harness of the `bifrost_gatekeeper` fuzz target, kept here so that
/// its seeds replay as tests. `data`'s first byte says which way the
/// datagram goes: even, a call from a caller to the Gatekeeper's service
/// address; odd, a reply from the serving node to the caller. The rest is
/// the payload of a UDP datagram on Bifröst's port. (The first byte is a
/// selector of its own so that well-formed headers reach both ways.) The switch must never panic, must account for every
/// frame, and must forward only well-formed frames. Returns whether the
/// frame left the switch.
pub fn any_datagram(data: &[u8]) -> bool {
    use remora_switch::PortId;
    use remora_wire::datagram::parse_datagram;
    let (router, caller, node, service) = (
        TWO_HOSTS_ROUTER,
        TWO_HOSTS_CALLER,
        TWO_HOSTS_NODE,
        TWO_HOSTS_SERVICE,
    );
    let mut switch = two_hosts(GatekeeperConfig::new(service), "increment");
    let Some((&direction, data)) = data.split_first() else {
        return false;
    };
    let reply = direction % 2 == 1;
    let (from, to, port) = if reply {
        (
            node,
            DatagramEnd {
                mac: router,
                ..caller
            },
            PortId(1),
        )
    } else {
        (
            caller,
            DatagramEnd {
                mac: router,
                address: service,
                port: BIFROST_PORT,
            },
            PortId(0),
        )
    };
    let mut frame = vec![0u8; remora_wire::datagram::DATAGRAM_HEADERS_LEN + data.len()];
    let Ok(length) = emit_datagram(from, to, data, &mut frame) else {
        return false;
    };
    switch.handle_frame(Timestamp::ZERO, port, &frame[..length]);
    let mut left = false;
    let mut buffer = vec![0u8; 16 * 1024];
    while let Some((_, length)) = switch.poll_transmit(Timestamp::ZERO, &mut buffer) {
        // What the Gatekeeper forwards (a routed call, a reply it took a
        // checkpoint off) is still a well-formed datagram.
        let parsed = parse_datagram(&buffer[..length]);
        assert!(
            parsed.is_ok(),
            "the Gatekeeper forwarded a malformed frame: {parsed:?}"
        );
        left = true;
    }
    switch
        .check_frame_accounting()
        .expect("every frame accounted for");
    left
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_switch::PortId;
    use remora_wire::bifrost::{BifrostRepr, HEADER_LEN};

    fn frame(from: DatagramEnd, to: DatagramEnd, repr: BifrostRepr) -> Vec<u8> {
        let mut header = [0u8; HEADER_LEN];
        repr.emit(&mut header).unwrap();
        let mut frame = vec![0u8; DATAGRAM_HEADERS_LEN + HEADER_LEN];
        let length = emit_datagram(from, to, &header, &mut frame).unwrap();
        frame.truncate(length);
        frame
    }

    /// A call in flight was resent after the control plane moved its
    /// method's route: the resend went to the new node, which ran the call
    /// a second time, and the first callee's reply was dropped as forged.
    /// A resend keeps its callee.
    #[test]
    fn a_resend_goes_to_its_callee_after_the_route_moved() {
        let caller = TWO_HOSTS_CALLER;
        let mut switch = two_hosts(GatekeeperConfig::new(TWO_HOSTS_SERVICE), "make");
        let moved_to = Ipv4Address::new(10, 0, 0, 3);
        let gatekeeper = switch.program_mut();
        gatekeeper
            .register_node(moved_to, NodeKind::Compute, 1)
            .unwrap();
        let service = DatagramEnd {
            mac: TWO_HOSTS_ROUTER,
            address: TWO_HOSTS_SERVICE,
            port: BIFROST_PORT,
        };
        let call = BifrostRepr::new(CallType::Call, "make", 7, GlobalAddress::NULL).unwrap();
        let call = frame(caller, service, call);
        switch.handle_frame(Timestamp::ZERO, PortId(0), &call);
        switch.program_mut().route("make", moved_to).unwrap();
        switch.handle_frame(Timestamp::ZERO, PortId(0), &call);
        let callees: Vec<Ipv4Address> = switch.program().edges().map(|edge| edge.callee).collect();
        assert_eq!(callees, [TWO_HOSTS_NODE.address]);
        // Both passes went to the first callee, on its port.
        let mut sent_to = Vec::new();
        let mut buffer = vec![0u8; remora_wire::frame::MAX_FRAME_LEN];
        while let Some((port, length)) = switch.poll_transmit(Timestamp::ZERO, &mut buffer) {
            let (datagram, _) = remora_wire::datagram::parse_datagram(&buffer[..length]).unwrap();
            sent_to.push((port, datagram.destination.address));
        }
        assert_eq!(sent_to, [(PortId(1), TWO_HOSTS_NODE.address); 2]);
        // Answered, the call sent again still goes to the node that
        // answered it (which answers from its replies), not the new one.
        let reply = BifrostRepr::new(CallType::Reply, "make", 7, GlobalAddress::NULL).unwrap();
        let to_caller = DatagramEnd {
            mac: TWO_HOSTS_ROUTER,
            ..caller
        };
        switch.handle_frame(
            Timestamp::ZERO,
            PortId(1),
            &frame(TWO_HOSTS_NODE, to_caller, reply),
        );
        assert_eq!(switch.program().edges().count(), 0);
        switch.handle_frame(Timestamp::ZERO, PortId(0), &call);
        assert_eq!(switch.program().counters().answered_resends, 1);
        let mut resent_to = Vec::new();
        while let Some((port, length)) = switch.poll_transmit(Timestamp::ZERO, &mut buffer) {
            let (datagram, _) = remora_wire::datagram::parse_datagram(&buffer[..length]).unwrap();
            resent_to.push((port, datagram.destination.address));
        }
        assert_eq!(
            resent_to,
            [
                (PortId(0), caller.address),
                (PortId(1), TWO_HOSTS_NODE.address)
            ]
        );
        // A new call takes the new route.
        let next = BifrostRepr::new(CallType::Call, "make", 8, GlobalAddress::NULL).unwrap();
        switch.handle_frame(Timestamp::ZERO, PortId(0), &frame(caller, service, next));
        assert!(switch.program().edges().any(|edge| edge.callee == moved_to));
        // A new life announcing itself at the answering node's address
        // never ran the call: the answer is forgotten, and a resend goes
        // by the route.
        let answered = (caller.address, caller.port, 7);
        assert_eq!(
            switch.program().answered_by(&answered),
            Some(TWO_HOSTS_NODE.address)
        );
        switch
            .program_mut()
            .forget_answers_of(TWO_HOSTS_NODE.address);
        assert_eq!(switch.program().answered_by(&answered), None);
    }

    /// A reply or an exception sent to the service address was routed as
    /// a call, with an edge and a lease that lasted the call lease.
    #[test]
    fn only_calls_are_routed_from_the_service_address() {
        let mut switch = two_hosts(GatekeeperConfig::new(TWO_HOSTS_SERVICE), "make");
        let service = DatagramEnd {
            mac: TWO_HOSTS_ROUTER,
            address: TWO_HOSTS_SERVICE,
            port: BIFROST_PORT,
        };
        for (rpc_id, call_type) in [(1, CallType::Reply), (2, CallType::Exception)] {
            let repr = BifrostRepr::new(call_type, "make", rpc_id, GlobalAddress::NULL).unwrap();
            let frame = frame(TWO_HOSTS_CALLER, service, repr);
            switch.handle_frame(Timestamp::ZERO, PortId(0), &frame);
        }
        assert_eq!(switch.program().edges().count(), 0);
        assert_eq!(switch.program().counters().malformed, 2);
        assert_eq!(switch.queued_frames(), 0);
        let call = BifrostRepr::new(CallType::Call, "make", 3, GlobalAddress::NULL).unwrap();
        switch.handle_frame(
            Timestamp::ZERO,
            PortId(0),
            &frame(TWO_HOSTS_CALLER, service, call),
        );
        assert_eq!(switch.program().edges().count(), 1);
    }

    /// The calls it may hold for a failed node sit in the control plane,
    /// not the pipeline: the report says how many, and its text says where.
    #[test]
    fn the_resource_report_counts_the_calls_the_control_plane_may_hold() {
        let config = GatekeeperConfig {
            held_calls: 12,
            ..GatekeeperConfig::new(TWO_HOSTS_SERVICE)
        };
        let report = two_hosts(config, "make").resources();
        assert_eq!(report.control_plane_held_frames, 12);
        assert!(report
            .to_string()
            .contains("control plane holds up to 12 frames"));
    }

    /// A reply that came after its call's lease ran out found no edge, so
    /// the pointer it returns stayed the callee's: the callee counted it
    /// given, the caller could not use or free it, and it leaked. It is
    /// handed over now, from the expired call's record.
    #[test]
    fn a_reply_after_its_lease_ran_out_still_hands_over_its_pointer() {
        let (caller, callee) = (TWO_HOSTS_CALLER, TWO_HOSTS_NODE);
        let config = GatekeeperConfig {
            call_lease: Duration::from_millis(10),
            ..GatekeeperConfig::new(TWO_HOSTS_SERVICE)
        };
        let mut switch = two_hosts(config, "make");
        let made = GlobalPtr {
            node: 0,
            generation: 1,
            offset: 4096,
        };
        switch
            .program_mut()
            .memory
            .acl
            .allocate(made.node, made.offset, made.generation, 64, callee.address)
            .unwrap();
        let at = |millis: u64| Timestamp::ZERO.saturating_add(Duration::from_millis(millis));
        let service = DatagramEnd {
            mac: TWO_HOSTS_ROUTER,
            address: TWO_HOSTS_SERVICE,
            port: BIFROST_PORT,
        };
        let call = |rpc_id| BifrostRepr::new(CallType::Call, "make", rpc_id, GlobalAddress::NULL);
        switch.handle_frame(at(1), PortId(0), &frame(caller, service, call(7).unwrap()));
        // Another call, past the first's lease, expires it.
        switch.handle_frame(at(14), PortId(0), &frame(caller, service, call(8).unwrap()));
        assert_eq!(switch.program().counters().calls_expired, 1);

        let reply = BifrostRepr::new(CallType::Reply, "make", 7, made.to_address()).unwrap();
        let to_caller = DatagramEnd {
            mac: TWO_HOSTS_ROUTER,
            ..caller
        };
        switch.handle_frame(at(15), PortId(1), &frame(callee, to_caller, reply));

        let grants = switch
            .program()
            .acl()
            .grants(made.node, made.offset)
            .unwrap();
        assert_eq!(grants.rights_of(caller.address), Some(acl::Rights::Control));
        assert_eq!(grants.rights_of(callee.address), None);
        assert_eq!(switch.program().counters().late_replies, 1);
    }
}
