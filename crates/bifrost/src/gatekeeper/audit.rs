//! Checks the Gatekeeper's ACL against a plain model, on random traffic
//! through a switch that runs it: allocs and their replies, calls that
//! lend a pointer and replies that end the lease, frees, and READs and
//! WRITEs from every client at every kind of address (inside an
//! allocation, across its end, between allocations, with a wrong key).
//!
//! The model knows one level of lending (only the owner calls, and only
//! with a pointer not lent already): a node may read an allocation it owns
//! or is lent, and write one it owns and has not lent. Every request the
//! switch forwards must be one the model allows, every one it refuses must
//! come back to its sender as a NAK (remote access error) for its PSN, and
//! none may do both. A request under another client's address, or on
//! another client's connection, must neither pass nor draw a NAK; a reply
//! forged by another client than the callee must not reach the caller;
//! and neither it nor a resend naming another pointer may change a rule.
//! A resend of a call already answered (the caller's timer fired as the
//! reply was on its way) reaches the callee and changes no rule either.
//! `remora sim bifrost` runs one audit per seed.

use super::memory::MemoryNode;
use super::{Gatekeeper, GatekeeperConfig, NodeKind};
use crate::dsm::message::{Operation as DsmOperation, Reply, Request, Status};
use crate::dsm::GlobalPtr;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use remora_base::Timestamp;
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::programs::overlay::Overlaid;
use remora_switch::{PortId, Switch, SwitchConfig};
use remora_wire::bifrost::{BifrostRepr, CallType, GlobalAddress, BIFROST_PORT, HEADER_LEN};
use remora_wire::datagram::{emit_datagram, DatagramEnd, DATAGRAM_HEADERS_LEN};
use remora_wire::frame::{emit_frame, parse_frame, FrameRepr};
use remora_wire::{
    AckSyndrome, BthRepr, Ipv4Address, MacAddress, NakCode, Opcode, Psn, Qpn, RethRepr, Rkey,
    VirtAddr,
};
use std::time::Duration;

/// What an audit saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct AclAudit {
    /// READs and WRITEs sent, and how many the switch let through.
    pub accesses: u64,
    pub allowed: u64,
    /// Every DSM message and RPC the audit sent besides.
    pub messages: u64,
    /// Requests sent under another client's address or on another
    /// client's connection: none may pass.
    pub spoofed: u64,
    /// Replies forged by another client than the callee, and resends that
    /// name another pointer: neither may change a rule.
    pub forged: u64,
    /// Resends of calls already answered: none may change a rule.
    pub late_resends: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AclViolation {
    #[error(
        "event {event}: client {client}'s {operation} of {length} B at {offset:#x} was {}, \
         but the model says it is {}",
        verdict(*forwarded), verdict(*expected)
    )]
    Verdict {
        event: usize,
        client: usize,
        operation: &'static str,
        offset: u64,
        length: u64,
        forwarded: bool,
        expected: bool,
    },
    #[error("event {event}: a refused request (PSN {psn}) got {naks} NAKs for it, not one")]
    Nak { event: usize, psn: u32, naks: usize },
    #[error(
        "event {event}: client {attacker}'s spoofed READ of client {victim}'s memory was \
         forwarded ({forwarded}) or drew {naks} NAKs"
    )]
    Spoofed {
        event: usize,
        attacker: usize,
        victim: usize,
        forwarded: bool,
        naks: usize,
    },
    #[error("event {event}: {what}")]
    Lost { event: usize, what: String },
}

fn verdict(forwarded: bool) -> &'static str {
    if forwarded {
        "allowed"
    } else {
        "refused"
    }
}

const CLIENTS: usize = 3;
const MEMORY_PORT: PortId = PortId(0);
const POOL_BASE: u64 = 0x10_0000;
const POOL_BYTES: u64 = 1 << 20;
const RKEY: Rkey = Rkey(0x00b1_f0de);
const ROUTER: MacAddress = MacAddress([2, 0, 0, 0, 0, 0xfe]);
const SERVICE: Ipv4Address = Ipv4Address::new(10, 0, 0, 200);
const CALLER_PORT: u16 = 40000;
/// Where callers send calls: the Gatekeeper routes them.
const SERVICE_END: DatagramEnd = DatagramEnd {
    mac: ROUTER,
    address: SERVICE,
    port: BIFROST_PORT,
};

fn mac(host: usize) -> MacAddress {
    MacAddress([2, 0, 0, 0, 0, host as u8 + 1])
}

fn address(host: usize) -> Ipv4Address {
    Ipv4Address::new(10, 0, 0, host as u8 + 1)
}

/// Host 0 is the memory node; clients are hosts 1..=CLIENTS.
fn client_qpn(client: usize) -> Qpn {
    Qpn::new(0x100 + client as u32).expect("a small QPN")
}

fn memory_qpn(client: usize) -> Qpn {
    Qpn::new(0x200 + client as u32).expect("a small QPN")
}

/// An allocation as the model sees it.
#[derive(Debug, Clone, Copy)]
struct Allocation {
    offset: u64,
    size: u64,
    owner: usize,
    /// The callee it is lent to, and the call's RPC id.
    lent: Option<(usize, u64)>,
    /// The callee and RPC id of the last call with it that was answered.
    answered: Option<(usize, u64)>,
}

impl Allocation {
    fn allows(&self, client: usize, write: bool) -> bool {
        let owner = client == self.owner;
        let lessee = self.lent.is_some_and(|(callee, _)| callee == client);
        if write {
            owner && self.lent.is_none()
        } else {
            owner || lessee
        }
    }
}

struct Audit {
    switch: Switch<Overlaid<Gatekeeper>>,
    /// The seed's draws (the simulator's seeded generator).
    draws: ChaCha8Rng,
    allocations: Vec<Allocation>,
    next_offset: u64,
    next_psn: [u32; CLIENTS + 1],
    next_rpc_id: u64,
    now: Timestamp,
    event: usize,
    report: AclAudit,
}

/// Runs `events` random events from `seed` and checks each verdict.
pub fn acl_audit(seed: u64, events: usize) -> Result<AclAudit, AclViolation> {
    let mut audit = Audit::new(seed);
    for event in 0..events {
        audit.event = event;
        audit.now = Timestamp::ZERO.saturating_add(Duration::from_micros(event as u64));
        audit.step()?;
    }
    Ok(audit.report)
}

impl Audit {
    fn new(seed: u64) -> Audit {
        let hosts: Vec<(MacAddress, Ipv4Address)> = (0..=CLIENTS)
            .map(|host| (mac(host), address(host)))
            .collect();
        let forwarding =
            L2L3Forwarding::with_attached_hosts(ROUTER, &hosts).expect("four hosts fit");
        let mut gatekeeper = Gatekeeper::new(GatekeeperConfig::new(SERVICE));
        let memory = MemoryNode {
            index: 0,
            pool_base: POOL_BASE,
            pool_bytes: POOL_BYTES,
            rkey: RKEY,
        };
        gatekeeper
            .register_memory_node(address(0), memory)
            .expect("room for a memory node");
        gatekeeper
            .register_host_port(address(0), MEMORY_PORT)
            .expect("room for the ports");
        for client in 1..=CLIENTS {
            let node = address(client);
            gatekeeper
                .register_connection((node, client_qpn(client)), (address(0), memory_qpn(client)))
                .expect("room for the connections");
            gatekeeper
                .register_host_port(node, PortId(client as u16))
                .expect("room for the ports");
            gatekeeper
                .register_node(node, NodeKind::Compute, 0)
                .expect("room for the nodes");
            gatekeeper
                .route(&method_of(client), node)
                .expect("room for the routes");
        }
        let switch = Switch::new(
            SwitchConfig::new(hosts.len() as u16),
            Overlaid::new(forwarding, gatekeeper),
        );
        Audit {
            switch,
            draws: ChaCha8Rng::seed_from_u64(seed),
            allocations: Vec::new(),
            next_offset: 0,
            next_psn: [0; CLIENTS + 1],
            next_rpc_id: 1,
            now: Timestamp::ZERO,
            event: 0,
            report: AclAudit::default(),
        }
    }

    fn step(&mut self) -> Result<(), AclViolation> {
        match self.draws.gen_range(0..14) {
            0 | 1 => self.allocate(),
            2 => self.call(),
            3 => self.reply(),
            4 => self.free(),
            5 => self.spoof(),
            6 => self.forge_reply(),
            7 => self.resend_swapped(),
            8 => self.resend_answered(),
            _ => self.access(),
        }
    }

    /// A client sends a READ of memory another client may read: under
    /// that client's address through its own port, or under its own
    /// address on the other's connection. Neither may pass, and neither
    /// may draw a NAK (which would break the real client's connection).
    fn spoof(&mut self) -> Result<(), AclViolation> {
        let Some(index) = self.pick() else {
            return Ok(());
        };
        let allocation = self.allocations[index];
        let victim = allocation.owner;
        let attacker = self.other_client(victim);
        let impersonating = self.draws.gen_range(0..2) == 0;
        let as_client = if impersonating { victim } else { attacker };
        let bth = BthRepr::new(
            Opcode::RdmaReadRequest,
            memory_qpn(victim),
            self.psn(victim),
        );
        let reth = RethRepr {
            virtual_address: VirtAddr(POOL_BASE + allocation.offset),
            rkey: RKEY,
            dma_length: allocation.size.min(1024) as u32,
        };
        let frame = request_frame(as_client, bth, Some(reth), &[]);
        let out = self.send(PortId(attacker as u16), &frame);
        self.report.spoofed += 1;
        let forwarded = out.iter().any(|(port, _)| *port == MEMORY_PORT);
        let naks = out
            .iter()
            .filter(|(_, frame)| {
                parse_frame(frame).is_ok_and(|parsed| parsed.repr.bth.opcode == Opcode::Acknowledge)
            })
            .count();
        if forwarded || naks > 0 {
            return Err(AclViolation::Spoofed {
                event: self.event,
                attacker,
                victim,
                forwarded,
                naks,
            });
        }
        Ok(())
    }

    /// Any client but `client`.
    fn other_client(&mut self, client: usize) -> usize {
        1 + (client + self.draws.gen_range(0..CLIENTS - 1)) % CLIENTS
    }

    fn client(&mut self) -> usize {
        self.draws.gen_range(1..=CLIENTS)
    }

    fn psn(&mut self, client: usize) -> Psn {
        let psn = self.next_psn[client];
        self.next_psn[client] = psn.wrapping_add(1) & 0x00ff_ffff;
        Psn::new(psn)
    }

    fn lost(&self, what: String) -> AclViolation {
        AclViolation::Lost {
            event: self.event,
            what,
        }
    }

    /// Sends a frame in at `port`; returns the frames that left, by port.
    fn send(&mut self, port: PortId, frame: &[u8]) -> Vec<(PortId, Vec<u8>)> {
        self.switch.handle_frame(self.now, port, frame);
        let mut out = Vec::new();
        let mut buffer = vec![0u8; 16 * 1024];
        while let Some((port, length)) = self.switch.poll_transmit(self.now, &mut buffer) {
            out.push((port, buffer[..length].to_vec()));
        }
        out
    }

    /// A request from `client` to the memory node: whether it was
    /// forwarded, after checking that a refusal got exactly one NAK.
    fn request(
        &mut self,
        client: usize,
        bth: BthRepr,
        reth: Option<RethRepr>,
        payload: &[u8],
    ) -> Result<bool, AclViolation> {
        let psn = bth.psn;
        let frame = request_frame(client, bth, reth, payload);
        let out = self.send(PortId(client as u16), &frame);
        let forwarded = out.iter().any(|(port, _)| *port == MEMORY_PORT);
        let naks = out
            .iter()
            .filter(|(port, _)| *port == PortId(client as u16))
            .filter(|(_, frame)| is_access_nak(frame, client, psn))
            .count();
        if naks != usize::from(!forwarded) {
            return Err(AclViolation::Nak {
                event: self.event,
                psn: psn.value(),
                naks,
            });
        }
        Ok(forwarded)
    }

    fn dsm_request(&mut self, client: usize, request: Request) -> Result<bool, AclViolation> {
        let psn = self.psn(client);
        self.dsm_request_at(client, request, psn)
    }

    /// A DSM request at `psn`: a new one's, or the one RC sends it again
    /// under.
    fn dsm_request_at(
        &mut self,
        client: usize,
        request: Request,
        psn: Psn,
    ) -> Result<bool, AclViolation> {
        self.report.messages += 1;
        let bth = BthRepr::new(Opcode::SendOnly, memory_qpn(client), psn);
        self.request(client, bth, None, &request.emit())
    }

    fn allocate(&mut self) -> Result<(), AclViolation> {
        let client = self.client();
        let size = 1 + self.draws.gen_range(0..8192);
        self.allocate_for(client, size)
    }

    fn allocate_for(&mut self, client: usize, size: u64) -> Result<(), AclViolation> {
        if self.next_offset + size > POOL_BYTES {
            return Ok(());
        }
        let request_id = self.event as u32;
        let request = Request {
            operation: DsmOperation::Allocate,
            generation: 0,
            request_id,
            offset: 0,
            size,
        };
        if !self.dsm_request(client, request)? {
            return Err(self.lost("an alloc was refused with room in the ACL".into()));
        }
        let reply = Reply {
            status: Status::Ok,
            generation: 0,
            request_id,
            offset: self.next_offset,
            size,
        };
        self.daemon_reply(client, reply)?;
        self.allocations.push(Allocation {
            offset: self.next_offset,
            size,
            owner: client,
            lent: None,
            answered: None,
        });
        // Allocations leave gaps, so some accesses fall between them.
        self.next_offset += size + self.draws.gen_range(0..3) * 512;
        Ok(())
    }

    /// The memory node's daemon answers `client`; the switch must pass it.
    fn daemon_reply(&mut self, client: usize, reply: Reply) -> Result<(), AclViolation> {
        let bth = BthRepr::new(Opcode::SendOnly, client_qpn(client), Psn::new(0));
        let repr = FrameRepr::between(
            (mac(0), address(0)),
            (mac(client), address(client)),
            49152,
            bth,
        )
        .with_payload_len(reply.emit().len());
        let mut frame = vec![0u8; repr.frame_len(reply.emit().len())];
        let length = emit_frame(&repr, &reply.emit(), &mut frame).expect("fits");
        let out = self.send(MEMORY_PORT, &frame[..length]);
        if !out.iter().any(|(port, _)| *port == PortId(client as u16)) {
            return Err(self.lost("the daemon's reply was not forwarded".into()));
        }
        Ok(())
    }

    fn pick(&mut self) -> Option<usize> {
        (!self.allocations.is_empty()).then(|| self.draws.gen_range(0..self.allocations.len()))
    }

    fn datagram(
        &mut self,
        from: DatagramEnd,
        to: DatagramEnd,
        repr: &BifrostRepr,
    ) -> Vec<(PortId, Vec<u8>)> {
        self.report.messages += 1;
        let mut payload = [0u8; HEADER_LEN];
        repr.emit(&mut payload).expect("a header fits");
        let mut frame = vec![0u8; DATAGRAM_HEADERS_LEN + HEADER_LEN];
        let length = emit_datagram(from, to, &payload, &mut frame).expect("fits");
        let port = PortId((u32::from_be_bytes(from.address.0) & 0xff) as u16 - 1);
        self.send(port, &frame[..length])
    }

    /// The owner of an allocation not lent calls another client with it.
    fn call(&mut self) -> Result<(), AclViolation> {
        let Some(index) = self.pick() else {
            return Ok(());
        };
        let allocation = self.allocations[index];
        if allocation.lent.is_some() {
            return Ok(());
        }
        let callee = self.other_client(allocation.owner);
        let rpc_id = self.next_rpc_id;
        self.next_rpc_id += 1;
        let pointer = pointer_at(allocation.offset);
        let repr = BifrostRepr::new(CallType::Call, &method_of(callee), rpc_id, pointer)
            .expect("a short name");
        let (from, to) = (caller_end(allocation.owner), SERVICE_END);
        let out = self.datagram(from, to, &repr);
        if !out.iter().any(|(port, _)| *port == PortId(callee as u16)) {
            return Err(self.lost(format!("the call to client {callee} was not routed to it")));
        }
        self.allocations[index].lent = Some((callee, rpc_id));
        Ok(())
    }

    /// A callee answers the call that lent it an allocation.
    fn reply(&mut self) -> Result<(), AclViolation> {
        let Some(index) = self.pick() else {
            return Ok(());
        };
        let allocation = self.allocations[index];
        let Some((callee, rpc_id)) = allocation.lent else {
            return Ok(());
        };
        let pointer = pointer_at(allocation.offset);
        let repr = BifrostRepr::new(CallType::Reply, &method_of(callee), rpc_id, pointer)
            .expect("a short name");
        let from = DatagramEnd {
            mac: mac(callee),
            address: address(callee),
            port: BIFROST_PORT,
        };
        let to = caller_end(allocation.owner);
        let out = self.datagram(from, to, &repr);
        if !out
            .iter()
            .any(|(port, _)| *port == PortId(allocation.owner as u16))
        {
            return Err(self.lost("a reply was not forwarded".into()));
        }
        self.allocations[index].answered = allocation.lent;
        self.allocations[index].lent = None;
        Ok(())
    }

    /// The owner sends an answered call again, as a caller whose timer
    /// fired while the reply was on its way does: the callee gets it (to
    /// answer from its replies), and no rule changes (later accesses and
    /// frees check), even with the allocation lent again by a newer call.
    fn resend_answered(&mut self) -> Result<(), AclViolation> {
        let answered: Vec<Allocation> = self
            .allocations
            .iter()
            .filter(|allocation| allocation.answered.is_some())
            .copied()
            .collect();
        if answered.is_empty() {
            return Ok(());
        }
        let allocation = answered[self.draws.gen_range(0..answered.len())];
        let Some((callee, rpc_id)) = allocation.answered else {
            unreachable!("only answered allocations were kept");
        };
        let pointer = pointer_at(allocation.offset);
        let repr = BifrostRepr::new(CallType::Call, &method_of(callee), rpc_id, pointer)
            .expect("a short name");
        let out = self.datagram(caller_end(allocation.owner), SERVICE_END, &repr);
        self.report.late_resends += 1;
        if !out.iter().any(|(port, _)| *port == PortId(callee as u16)) {
            return Err(self.lost(format!(
                "the resend of answered call {rpc_id} did not reach client {callee}"
            )));
        }
        Ok(())
    }

    /// An allocation lent by a call (its callee and RPC id), and the
    /// pointer of any allocation: what a forger would swap in.
    fn lent_and_another(&mut self) -> Option<(Allocation, (usize, u64), GlobalAddress)> {
        let (index, target) = (self.pick()?, self.pick()?);
        let allocation = self.allocations[index];
        let lent = allocation.lent?;
        Some((
            allocation,
            lent,
            pointer_at(self.allocations[target].offset),
        ))
    }

    /// A client other than the callee answers a call that lent a pointer,
    /// naming an allocation it would take: the switch drops it (the
    /// caller never sees it), and nothing changes (later accesses check).
    fn forge_reply(&mut self) -> Result<(), AclViolation> {
        let Some((allocation, (callee, rpc_id), pointer)) = self.lent_and_another() else {
            return Ok(());
        };
        let forger = self.other_client(callee);
        let repr = BifrostRepr::new(CallType::Reply, &method_of(callee), rpc_id, pointer)
            .expect("a short name");
        let from = DatagramEnd {
            mac: mac(forger),
            address: address(forger),
            port: BIFROST_PORT,
        };
        let to = caller_end(allocation.owner);
        self.report.forged += 1;
        let out = self.datagram(from, to, &repr);
        if out
            .iter()
            .any(|(port, _)| *port == PortId(allocation.owner as u16))
        {
            return Err(self.lost(format!(
                "client {forger}'s forged reply to call {rpc_id} reached its caller"
            )));
        }
        Ok(())
    }

    /// The owner of a lent allocation sends its call again, naming another
    /// allocation: the resend is the call as it first passed, and nothing
    /// changes on the other allocation (later accesses check).
    fn resend_swapped(&mut self) -> Result<(), AclViolation> {
        let Some((allocation, (callee, rpc_id), pointer)) = self.lent_and_another() else {
            return Ok(());
        };
        let repr = BifrostRepr::new(CallType::Call, &method_of(callee), rpc_id, pointer)
            .expect("a short name");
        let (from, to) = (caller_end(allocation.owner), SERVICE_END);
        self.report.forged += 1;
        self.datagram(from, to, &repr);
        Ok(())
    }

    /// Any client frees any allocation: only its owner, with it not lent,
    /// may.
    fn free(&mut self) -> Result<(), AclViolation> {
        let Some(index) = self.pick() else {
            return Ok(());
        };
        let allocation = self.allocations[index];
        let client = self.client();
        let request = Request {
            operation: DsmOperation::Free,
            generation: 0,
            request_id: self.event as u32,
            offset: allocation.offset,
            size: 0,
        };
        let forwarded = self.dsm_request(client, request)?;
        let expected = allocation.allows(client, true);
        if forwarded != expected {
            return Err(AclViolation::Verdict {
                event: self.event,
                client,
                operation: "free",
                offset: allocation.offset,
                length: 0,
                forwarded,
                expected,
            });
        }
        if forwarded {
            // The rules go with the daemon's reply, not the request.
            let reply = Reply {
                status: Status::Ok,
                generation: 0,
                request_id: request.request_id,
                offset: allocation.offset,
                size: 0,
            };
            self.daemon_reply(client, reply)?;
            self.allocations.swap_remove(index);
        }
        Ok(())
    }

    /// A READ or WRITE from any client, somewhere near an allocation.
    fn access(&mut self) -> Result<(), AclViolation> {
        let client = self.client();
        let write = self.draws.gen_range(0..2) == 0;
        let (offset, length) = match self.pick() {
            Some(index) => {
                let allocation = self.allocations[index];
                let offset = allocation.offset + self.draws.gen_range(0..allocation.size + 64);
                (offset, 1 + self.draws.gen_range(0..1024))
            }
            None => (
                self.draws.gen_range(0..POOL_BYTES),
                1 + self.draws.gen_range(0..1024),
            ),
        };
        let wrong_key = self.draws.gen_range(0..20) == 0;
        let expected = !wrong_key
            && self.allocations.iter().any(|allocation| {
                allocation.offset <= offset
                    && offset + length <= allocation.offset + allocation.size
                    && allocation.allows(client, write)
            });
        let reth = RethRepr {
            virtual_address: VirtAddr(POOL_BASE + offset),
            rkey: if wrong_key { Rkey(RKEY.0 ^ 1) } else { RKEY },
            dma_length: length as u32,
        };
        let (opcode, payload) = if write {
            (Opcode::RdmaWriteOnly, vec![0xa5; length as usize])
        } else {
            (Opcode::RdmaReadRequest, Vec::new())
        };
        let bth = BthRepr::new(opcode, memory_qpn(client), self.psn(client));
        let forwarded = self.request(client, bth, Some(reth), &payload)?;
        self.report.accesses += 1;
        self.report.allowed += u64::from(forwarded);
        if forwarded != expected {
            return Err(AclViolation::Verdict {
                event: self.event,
                client,
                operation: if write { "WRITE" } else { "READ" },
                offset,
                length,
                forwarded,
                expected,
            });
        }
        Ok(())
    }
}

/// A request frame from `client`'s address to the memory node.
fn request_frame(client: usize, bth: BthRepr, reth: Option<RethRepr>, payload: &[u8]) -> Vec<u8> {
    let mut repr = FrameRepr::between(
        (mac(client), address(client)),
        (mac(0), address(0)),
        49152,
        bth,
    );
    repr.extension.reth = reth;
    let repr = repr.with_payload_len(payload.len());
    let mut frame = vec![0u8; repr.frame_len(payload.len())];
    let length = emit_frame(&repr, payload, &mut frame).expect("the frame fits");
    frame.truncate(length);
    frame
}

/// Where `client` calls from, and its replies go.
fn caller_end(client: usize) -> DatagramEnd {
    DatagramEnd {
        mac: mac(client),
        address: address(client),
        port: CALLER_PORT,
    }
}

fn method_of(client: usize) -> String {
    format!("serve{client}")
}

fn pointer_at(offset: u64) -> GlobalAddress {
    GlobalPtr {
        node: 0,
        generation: 0,
        offset,
    }
    .to_address()
}

/// Whether `frame` is the switch's NAK (remote access error) to
/// `client`'s queue pair for `psn`.
fn is_access_nak(frame: &[u8], client: usize, psn: Psn) -> bool {
    parse_frame(frame).is_ok_and(|parsed| {
        let repr = parsed.repr;
        repr.bth.opcode == Opcode::Acknowledge
            && repr.bth.destination_qp == client_qpn(client)
            && repr.bth.psn == psn
            && repr
                .extension
                .aeth
                .is_some_and(|aeth| aeth.syndrome == AckSyndrome::Nak(NakCode::RemoteAccessError))
    })
}

/// The harness of the `bifrost_acl` fuzz target, kept here so that its
/// seeds replay as tests. `data`'s first byte picks the sender: even,
/// client 1 to the memory node; odd, the memory node to client 1. The
/// rest is the RoCE transport (BTH, extension headers, payload, ICRC) of a
/// UDP datagram to port 4791, in a switch whose Gatekeeper knows client
/// 1's connection and holds client 1's 4 KiB at the pool's start. The switch must
/// never panic and must account for every frame; a NAK it sends must be
/// well formed. Returns whether anything reached the memory node.
pub fn any_memory_frame(data: &[u8]) -> bool {
    let Some((&selector, transport)) = data.split_first() else {
        return false;
    };
    let mut audit = Audit::new(0);
    // Client 1 holds 4 KiB at the pool's start.
    if audit.allocate_for(1, 4096).is_err() {
        return false;
    }
    let client = DatagramEnd {
        mac: mac(1),
        address: address(1),
        port: 49152,
    };
    let memory = DatagramEnd {
        mac: mac(0),
        address: address(0),
        port: remora_wire::ROCEV2_UDP_PORT,
    };
    let (from, to, port) = if selector % 2 == 0 {
        (client, memory, PortId(1))
    } else {
        let reply_to = DatagramEnd {
            port: remora_wire::ROCEV2_UDP_PORT,
            ..client
        };
        (memory, reply_to, MEMORY_PORT)
    };
    let mut frame = vec![0u8; DATAGRAM_HEADERS_LEN + transport.len()];
    let Ok(length) = emit_datagram(from, to, transport, &mut frame) else {
        return false;
    };
    let out = audit.send(port, &frame[..length]);
    for (to_port, sent) in &out {
        if *to_port == PortId(1) && from.address == address(1) {
            assert!(
                parse_frame(sent).is_ok(),
                "the switch's NAK is malformed: {sent:02x?}"
            );
        }
    }
    audit
        .switch
        .check_frame_accounting()
        .expect("every frame accounted for");
    out.iter().any(|(to_port, _)| *to_port == MEMORY_PORT)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Free lost between the switch and the memory node is sent again
    /// by RC. The switch deleted the rules as the first copy passed, so
    /// the second was refused, and the memory stayed allocated with no
    /// one allowed to free it. The rules now go with the daemon's reply.
    #[test]
    fn a_free_sent_again_passes_until_its_reply_deletes_the_rules() {
        let mut audit = Audit::new(0);
        audit.allocate_for(1, 4096).unwrap();
        let offset = audit.allocations[0].offset;
        let free = |request_id| Request {
            operation: DsmOperation::Free,
            generation: 0,
            request_id,
            offset,
            size: 0,
        };
        let psn = audit.psn(1);
        assert!(
            audit.dsm_request_at(1, free(77), psn).unwrap(),
            "the first copy"
        );
        assert!(
            audit.dsm_request_at(1, free(77), psn).unwrap(),
            "the copy sent again"
        );
        let reply = Reply {
            status: Status::Ok,
            generation: 0,
            request_id: 77,
            offset,
            size: 0,
        };
        audit.daemon_reply(1, reply).unwrap();
        assert!(
            !audit.dsm_request(1, free(78)).unwrap(),
            "freed: no rules left"
        );
        let counters = audit.switch.program().overlay().counters().memory;
        assert_eq!(counters.frees, 1);
    }

    #[test]
    fn the_acl_agrees_with_the_model_on_twenty_seeds() {
        for seed in 0..20 {
            let audit = acl_audit(seed, 400).unwrap_or_else(|error| panic!("seed {seed}: {error}"));
            assert!(audit.accesses > 100, "seed {seed}: {audit:?}");
            assert!(audit.spoofed > 0, "seed {seed}: {audit:?}");
            assert!(audit.forged > 0, "seed {seed}: {audit:?}");
            assert!(audit.late_resends > 0, "seed {seed}: {audit:?}");
            assert!(audit.allowed > 0, "seed {seed}: {audit:?}");
            assert!(audit.allowed < audit.accesses, "seed {seed}: {audit:?}");
        }
    }
}
