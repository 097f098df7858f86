//! The resolver: a switch program that resolves Clover's write conflicts
//! in flight (`papers/003`), on top of the rack's L2/L3 forwarding.
//!
//! It tells clients apart by queue pair. On a client's entry WRITE it
//! records key → the entry (the key sits in the payload right after the
//! next pointer). On that client's CAS for a cached key it rewrites the
//! CAS target to the key's true tail and recomputes the ICRC, so the CAS
//! links the entry at once instead of failing and sending the client
//! chasing pointers. CASes for keys outside the cache pass untouched.
//!
//! As the paper does, it chains: each CAS on a cached key is sent to the
//! entry of the CAS before it (the key's tail once that one lands), and
//! the tail moves to its own entry at once, so CASes in flight together
//! all link, in the order they passed. Over a lossy path the paper's
//! chaining breaks linearizability: if a rewritten CAS is lost between
//! switch and memory, the CAS chained onto its entry succeeds while that
//! entry is still unlinked, and its writer returns with its write
//! invisible. So this resolver holds successes back until they are
//! visible:
//!
//! - the chained CASes of a key are numbered; a success's atomic
//!   acknowledgement passes only when every chained CAS before it on the
//!   key has passed its own success (`released`), so the entry it linked
//!   onto is linked. One out of turn is dropped (`acks_held` counts every
//!   such drop, replays too), and the first copy is held in the control
//!   plane (at most one per client, as a client has one CAS in flight) and
//!   sent back into the pipeline (a packet-out, `acks_released`) when the
//!   one before it passes. On a clean path the memory node answers in the
//!   order the CASes passed, and nothing is held;
//! - a chained CAS that fails (a CAS the switch never saw took its
//!   tail), whose answer the switch will not see (its client moved on or
//!   its records aged out), or that keeps the turn for longer than
//!   [`CHAIN_STALL_LIMIT`] (its client died with it lost) breaks the
//!   chain there: the successes chained after it are never released
//!   (their entries may hang off one no reader reaches, so their writers
//!   time out rather than return a write no one can read), those before it
//!   still pass in turn, and the key is resolved no more: its CASes pass
//!   untouched from then on and, as in Clover, fail or succeed on their
//!   own. (Resuming would need a tail the switch knows is true, and CASes
//!   chained before the break can still land long after it.) On a clean or
//!   lossy path with live clients no chain breaks;
//! - a retransmitted CAS (same queue pair, same PSN) gets exactly the
//!   rewrite of the original.
//!
//! Every CAS on a cached key passes this switch and a chain starts at the
//! tail the control plane cached, so a chain links onto the list's real
//! tail, and no list is ever broken or made cyclic.

use crate::layout::NextPointer;
use remora_rnic::Timestamp;
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::programs::{Overlaid, Overlay};
use remora_switch::register::RegisterArray;
use remora_switch::table::{ExactTable, TableError, TableShape};

/// Why the resolver's control plane refused a setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolverError {
    #[error("resolver tables: {0}")]
    Table(#[from] TableError),
    #[error("key {0} is cached twice")]
    KeyCachedTwice(u64),
    #[error("key {key} is not in the store's {key_count} keys")]
    UnknownKey { key: u64, key_count: usize },
    /// The switch has no route to a host the resolver must know the port
    /// of.
    #[error("the switch has no route to {0}, so the resolver cannot tell its port")]
    Unrouted(Ipv4Address),
}
use remora_switch::packet::GENERATOR_PORT;
use remora_switch::{Egress, Packet, PortId, ResourceReport};
use remora_wire::{icrc, Ipv4Address, Opcode, Psn, Qpn, Rkey, VirtAddr};

/// The memory region the resolver watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchedRegion {
    pub memory_address: Ipv4Address,
    /// The switch port the memory node is attached to: its answers come
    /// in there, and an answer in its name from another port is forged.
    pub memory_port: PortId,
    pub base: VirtAddr,
    pub rkey: Rkey,
    /// Entries live at `base + slab_start ..  base + region_bytes`.
    pub slab_start: u64,
    pub region_bytes: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct KeyCell {
    /// The entry the next CAS is chained onto: the last chained CAS's (at
    /// first, the tail the control plane cached); 0 once the chain broke,
    /// when the key's CASes pass untouched for good.
    tail: u64,
    /// Chained CASes of the key so far, each numbered by the count with
    /// it (64 bits: never wraps).
    chained: u64,
    /// The last number whose success has passed: successes pass in turn.
    released: u64,
    /// The highest number that may ever pass: below the first chained
    /// CAS that failed or went unanswered; `u64::MAX` while whole.
    limit: u64,
    /// When the turn last moved, or a CAS began waiting for it.
    turn_since: Timestamp,
}

/// How long the CAS whose success is next in turn may keep the turn
/// (while it or CASes behind it are unanswered) before the chain is broken
/// there. Far beyond a live client's retransmissions (its RNIC gives up
/// after its retry budget, about 128 ms on the embedded rack, and fails
/// the client): only a client that died with its CAS lost keeps the turn
/// this long.
pub const CHAIN_STALL_LIMIT: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct OutstandingCell {
    key: u64,
    /// The address of the entry the client last wrote; 0 for none.
    entry: u64,
    /// That WRITE's PSN, so a late duplicate of an older one is ignored.
    psn: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct CasCell {
    target: u64,
    entry: u64,
    key_slot: u32,
    psn: u32,
    /// Whether this client ever sent a CAS (so `psn` means something).
    seen: bool,
    /// Whether its acknowledgement has not passed yet.
    active: bool,
    rewritten: bool,
    /// Its number in its key's chain; 0 for one passed untouched.
    chain_number: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ResolverCounters {
    pub entry_writes_seen: u64,
    pub cas_seen: u64,
    /// CASes sent to the true tail instead of the stale one they named.
    pub rewritten: u64,
    /// Retransmitted CASes given the original's rewrite again.
    pub retransmissions_rewritten: u64,
    /// CASes for cached keys passed untouched because the key's chain
    /// broke.
    pub passed_unresolved: u64,
    /// CASes chained onto the entry of the CAS before them on their key.
    pub chained: u64,
    /// Success acknowledgements dropped because a CAS chained before them
    /// had not had its own success pass (held, or past a break).
    pub acks_held: u64,
    /// Held acknowledgements sent back into the pipeline in their turn.
    pub acks_released: u64,
    /// Chains broken (each key's once) by a chained CAS that failed, went
    /// unanswered, or kept the turn past [`CHAIN_STALL_LIMIT`].
    pub chains_broken: u64,
    /// CASes for keys outside the cache.
    pub passed_uncached: u64,
    /// Chained successes passed in their turn.
    pub successes_released: u64,
    /// Late duplicates of entry WRITEs and CASes already superseded,
    /// passed untouched.
    pub stale_duplicates: u64,
    /// Rewritten CASes that failed. While a chain is whole this never
    /// happens: a failure means a CAS the switch never saw took the tail,
    /// and it breaks the chain.
    pub rewrites_failed: u64,
    /// Frames it would have read or rewritten whose ICRC did not match:
    /// corrupted on a link, they pass untouched for the receiver to drop.
    pub corrupt_passed: u64,
    /// Frames naming a client's queue pair from a host that is not its
    /// peer, or flooded to no known host: passed untouched, unread.
    pub foreign_ignored: u64,
}

/// The resolver's memory, as the paper's Figure "memory vs keyspace".
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ResolverMemory {
    pub cached_keys: usize,
    pub clients: usize,
    pub bytes_per_key: usize,
    pub bytes_per_client: usize,
    pub total_bytes: usize,
}

/// Clover's resolver: the program a rack runs, the resolver's stages on
/// top of L2/L3 forwarding.
pub type CloverResolver = Overlaid<Resolver>;

/// The resolver's stages (an [`Overlay`]): it watches and rewrites
/// Clover's traffic after forwarding chose its egress.
pub struct Resolver {
    region: WatchedRegion,
    /// (memory address, memory-side QPN) → the client, and the compute
    /// address its requests come from.
    requests: ExactTable<u64, RequestOwner>,
    /// (compute address, compute-side QPN) → client index.
    replies: ExactTable<u64, u32>,
    /// Cached key → its cell index.
    keys: ExactTable<u64, u32>,
    key_cells: RegisterArray<KeyCell>,
    outstanding: RegisterArray<OutstandingCell>,
    cas: RegisterArray<CasCell>,
    client_count: usize,
    counters: ResolverCounters,
    /// Success acknowledgements held out of turn, by client: its key's
    /// cell, its number in the chain, the frame.
    held: Vec<Option<HeldAnswer>>,
    /// Held answers whose turn came, for the pipeline again: at most one
    /// per client.
    released_answers: std::collections::VecDeque<Vec<u8>>,
}

/// A chained CAS's success, held until the CAS before it has passed.
#[derive(Debug, Clone)]
struct HeldAnswer {
    key_slot: u32,
    chain_number: u64,
    frame: Vec<u8>,
}

/// A client's request queue pair, as the requests table knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RequestOwner {
    client: u32,
    /// The compute address the client's requests come from, and the
    /// switch port they come in by: a request that names the client's
    /// queue pair from any other address or port is not its.
    source: Ipv4Address,
    port: PortId,
}

/// How far (in PSNs) a client's requests run past its records before
/// they are forgotten: a quarter of the 24-bit space, half the reach of
/// a PSN comparison, and far beyond any retransmission's.
const RECORD_REACH_PSNS: i32 = 1 << 22;

fn queue_pair_key(address: Ipv4Address, qpn: Qpn) -> u64 {
    u64::from(u32::from_be_bytes(address.0)) << 24 | u64::from(qpn.value())
}

fn be_word(bytes: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

impl Resolver {
    /// The resolver on top of `forwarding`.
    pub fn with_forwarding(
        forwarding: L2L3Forwarding,
        region: WatchedRegion,
        max_keys: usize,
        max_clients: usize,
    ) -> CloverResolver {
        Overlaid::new(forwarding, Resolver::new(region, max_keys, max_clients))
    }

    pub fn new(region: WatchedRegion, max_keys: usize, max_clients: usize) -> Resolver {
        // A request's action data adds the source address it must come
        // from (32 bits) to the client index.
        let qp_table = |name, action_data_bits| TableShape {
            name,
            stage: 0,
            key_bits: 32 + 24,
            action_data_bits,
            capacity: max_clients,
        };
        Resolver {
            region,
            requests: ExactTable::new(qp_table("clover_clients", 16 + 32)),
            replies: ExactTable::new(qp_table("clover_replies", 16)),
            keys: ExactTable::new(TableShape {
                name: "clover_keys",
                stage: 1,
                key_bits: 64,
                action_data_bits: 32,
                capacity: max_keys,
            }),
            key_cells: RegisterArray::new("clover_tails", 2, max_keys),
            outstanding: RegisterArray::new("clover_outstanding", 1, max_clients),
            cas: RegisterArray::new("clover_cas", 1, max_clients),
            client_count: 0,
            counters: ResolverCounters::default(),
            held: vec![None; max_clients],
            released_answers: std::collections::VecDeque::new(),
        }
    }

    pub fn counters(&self) -> ResolverCounters {
        self.counters
    }

    /// Control plane: a client's queue pair, seen from both ends, and the
    /// switch port its compute node is attached to.
    pub fn add_client(
        &mut self,
        memory_side: (Ipv4Address, Qpn),
        compute_side: (Ipv4Address, Qpn),
        compute_port: PortId,
    ) -> Result<(), TableError> {
        if self.client_count >= self.cas.len() {
            return Err(TableError::Full {
                table: "clover_clients",
                capacity: self.cas.len(),
            });
        }
        let index = self.client_count as u32;
        let owner = RequestOwner {
            client: index,
            source: compute_side.0,
            port: compute_port,
        };
        self.requests
            .insert(queue_pair_key(memory_side.0, memory_side.1), owner)?;
        self.replies
            .insert(queue_pair_key(compute_side.0, compute_side.1), index)?;
        self.client_count += 1;
        Ok(())
    }

    /// Control plane: cache `key`, whose tail is now `tail`. A key
    /// cached twice is refused: the table kept one entry for it and the
    /// second cell went to the next key too, so two keys shared one tail
    /// and a write to one was linked into the other's list.
    pub fn cache_key(&mut self, key: u64, tail: NextPointer) -> Result<(), ResolverError> {
        if self.keys.lookup(&key).is_some() {
            return Err(ResolverError::KeyCachedTwice(key));
        }
        let slot = self.keys.len();
        if slot >= self.key_cells.len() {
            return Err(TableError::Full {
                table: "clover_keys",
                capacity: self.key_cells.len(),
            }
            .into());
        }
        self.keys.insert(key, slot as u32)?;
        let tail = self.region.base.0 + tail.offset();
        self.key_cells.update(slot, |_| KeyCell {
            tail,
            limit: u64::MAX,
            ..KeyCell::default()
        });
        Ok(())
    }

    pub fn memory(&self) -> ResolverMemory {
        let key_table_bytes = 8 + 4;
        // Keys of 7 bytes; action data of 6 (requests) and 2 (replies).
        let qp_table_bytes = (7 + 6) + (7 + 2);
        let bytes_per_key = key_table_bytes + std::mem::size_of::<KeyCell>();
        let bytes_per_client = qp_table_bytes
            + std::mem::size_of::<OutstandingCell>()
            + std::mem::size_of::<CasCell>();
        let cached_keys = self.keys.len();
        ResolverMemory {
            cached_keys,
            clients: self.client_count,
            bytes_per_key,
            bytes_per_client,
            total_bytes: cached_keys * bytes_per_key + self.client_count * bytes_per_client,
        }
    }

    fn in_slabs(&self, address: u64) -> bool {
        let base = self.region.base.0;
        address >= base + self.region.slab_start && address < base + self.region.region_bytes
    }

    /// The client whose request this is: to its queue pair on the memory
    /// node, from its own compute address, on its compute node's port.
    /// Any host can name a client's queue pair, and one whose frames moved
    /// the resolver's state could confirm tails no list holds; the
    /// endpoints drop such frames (a NIC takes frames from its peer
    /// alone), and so does the resolver. The port is checked as well as
    /// the address, which any host can borrow: a CAS in a client's name
    /// broke its key's chain for good.
    fn client_of_request(&mut self, packet: &Packet) -> Option<usize> {
        let ipv4 = packet.headers.ipv4?;
        let roce = packet.headers.roce?;
        if ipv4.destination != self.region.memory_address {
            return None;
        }
        let key = queue_pair_key(ipv4.destination, roce.destination_qp);
        let owner = *self.requests.lookup(&key)?;
        let from_owner = owner.source == ipv4.source && packet.original_ingress_port == owner.port;
        if !from_owner || packet.egress == Egress::Flood {
            self.counters.foreign_ignored += 1;
            return None;
        }
        Some(owner.client as usize)
    }

    /// An entry WRITE (first or only packet): remember key → entry.
    fn watch_write(&mut self, client: usize, packet: &Packet) {
        let roce = packet.headers.roce.expect("a RoCE packet");
        let reth = roce.extension_offset;
        let bytes = &packet.bytes;
        let address = be_word(bytes, reth);
        let rkey = u32::from_be_bytes(bytes[reth + 8..reth + 12].try_into().expect("4 bytes"));
        let payload = &bytes[roce.payload_offset..roce.icrc_offset];
        if rkey != self.region.rkey.0 || !self.in_slabs(address) || payload.len() < 16 {
            return;
        }
        let key = u64::from_le_bytes(payload[8..16].try_into().expect("8 bytes"));
        let psn = roce.psn.value();
        let last = self.outstanding.read(client).expect("client cells exist");
        if last.entry != 0 && Psn::new(psn).precedes(Psn::new(last.psn)) {
            self.counters.stale_duplicates += 1;
            return;
        }
        self.counters.entry_writes_seen += 1;
        self.outstanding.update(client, |_| OutstandingCell {
            key,
            entry: address,
            psn,
        });
    }

    /// Forgets a client's entry WRITE and CAS records once its requests
    /// ran [`RECORD_REACH_PSNS`] past them. PSNs compare within half their
    /// 24-bit space: a client that sent 2^23 packets (reads, say) after its
    /// last entry WRITE had its next WRITE and CAS look older than the
    /// records, ignored as late duplicates, and its key unresolved from
    /// then on. A record forgotten while its CAS is unanswered abandons
    /// that key's tail, as a new CAS would.
    fn age_records(&mut self, client: usize, psn: Psn) {
        let reached = |recorded: u32| Psn::new(recorded).distance_to(psn) >= RECORD_REACH_PSNS;
        let outstanding = self.outstanding.read(client).expect("client cells exist");
        if outstanding.entry != 0 && reached(outstanding.psn) {
            self.outstanding
                .update(client, |_| OutstandingCell::default());
        }
        let record = self.cas.read(client).expect("client cells exist");
        if record.seen && reached(record.psn) {
            if record.active {
                self.abandon(record);
            }
            self.cas.update(client, |_| CasCell::default());
            self.held[client] = None;
        }
    }

    /// Whether the frame's ICRC matches it. A switch's MAC drops a frame
    /// whose FCS fails before its pipeline sees it; links here corrupt
    /// bits under the ICRC instead, so the resolver checks it before it
    /// believes a field. A corrupt ACK's original value left a wrong tail
    /// confirmed for good, a corrupt entry WRITE recorded the wrong key,
    /// and a corrupt CAS rewritten got a fresh ICRC and was executed.
    fn intact(&mut self, packet: &Packet, icrc_offset: usize) -> bool {
        let intact = icrc::matches(&packet.bytes, icrc_offset);
        if !intact {
            self.counters.corrupt_passed += 1;
        }
        intact
    }

    fn rewrite_target(packet: &mut Packet, target: u64) {
        let at = packet.headers.roce.expect("a RoCE packet").extension_offset;
        packet.bytes[at..at + 8].copy_from_slice(&target.to_be_bytes());
        packet.rewritten = true;
    }

    fn watch_cas(&mut self, now: Timestamp, client: usize, packet: &mut Packet) {
        let roce = packet.headers.roce.expect("a RoCE packet");
        let at = roce.extension_offset;
        let target = be_word(&packet.bytes, at);
        let swap = be_word(&packet.bytes, at + 12);
        let compare = be_word(&packet.bytes, at + 20);
        let psn = roce.psn.value();
        self.counters.cas_seen += 1;
        let record = self.cas.read(client).expect("client cells exist");
        if record.seen && record.psn == psn {
            // A retransmission (or a duplicate): the original's rewrite.
            if record.target != target {
                Self::rewrite_target(packet, record.target);
                self.counters.retransmissions_rewritten += 1;
            }
            return;
        }
        if record.seen && Psn::new(psn).precedes(Psn::new(record.psn)) {
            // A late duplicate of an older CAS: the memory node answers it
            // from its replay cache without executing it, so it changes
            // nothing and must not be counted.
            self.counters.stale_duplicates += 1;
            return;
        }
        if record.active {
            // The switch never saw the answer to this client's last CAS
            // (it cannot have been answered without passing here): break
            // its chain rather than guess, once (its record closes).
            self.abandon(record);
            self.close_record(client);
        }
        let outstanding = self.outstanding.read(client).expect("client cells exist");
        let entry = self.region.base.0 + NextPointer::from_word(swap).offset();
        if compare != 0 || outstanding.entry == 0 || outstanding.entry != entry {
            return;
        }
        let Some(slot) = self.keys.lookup(&outstanding.key).copied() else {
            self.counters.passed_uncached += 1;
            return;
        };
        self.break_if_stalled(slot as usize, now);
        let cell = self.key_cells.read(slot as usize).expect("key cells exist");
        let chain = cell.tail != 0;
        let sent_to = if chain { cell.tail } else { target };
        if sent_to != target {
            Self::rewrite_target(packet, sent_to);
            self.counters.rewritten += 1;
        }
        let chain_number = match chain {
            true => cell.chained + 1,
            false => 0,
        };
        if chain {
            self.counters.chained += 1;
            // The first CAS waiting for the turn starts its clock.
            let turn_since = match cell.chained == cell.released {
                true => now,
                false => cell.turn_since,
            };
            self.key_cells.update(slot as usize, |cell| KeyCell {
                tail: entry,
                chained: chain_number,
                turn_since,
                ..cell
            });
        } else {
            self.counters.passed_unresolved += 1;
        }
        self.cas.update(client, |_| CasCell {
            target: sent_to,
            entry,
            key_slot: slot,
            psn,
            seen: true,
            active: true,
            rewritten: sent_to != target,
            chain_number,
        });
    }

    /// A CAS whose answer the switch will not see: a chained one not yet
    /// passed breaks its chain. (Its caller closes or replaces the record,
    /// so the client's later frames do not abandon it again.)
    fn abandon(&mut self, record: CasCell) {
        let slot = record.key_slot as usize;
        let cell = self.key_cells.read(slot).expect("key cells exist");
        if record.chain_number > cell.released {
            self.break_chain(slot, record.chain_number);
        }
    }

    /// Breaks the key's chain at `first_lost`: no success numbered from
    /// it on passes, those before it still pass in turn, and the key's
    /// CASes pass untouched from now on.
    fn break_chain(&mut self, slot: usize, first_lost: u64) {
        debug_assert!(first_lost > 0, "chain numbers start at 1");
        let before = self.key_cells.read(slot).expect("key cells exist");
        if before.tail != 0 {
            self.counters.chains_broken += 1;
        }
        let cell = self
            .key_cells
            .update(slot, |cell| KeyCell {
                tail: 0,
                limit: cell.limit.min(first_lost.saturating_sub(1)),
                ..cell
            })
            .expect("key cells exist");
        // Never released now: their clients time out.
        for held in &mut self.held {
            let past = held.as_ref().is_some_and(|held| {
                held.key_slot as usize == slot && held.chain_number > cell.limit
            });
            if past {
                *held = None;
            }
        }
    }

    /// Breaks the key's chain at its turn if the turn has not moved for
    /// [`CHAIN_STALL_LIMIT`] while a chained CAS is unanswered (the turn's
    /// own, alone, too: a lone lost CAS must break before the next is
    /// chained onto its entry).
    fn break_if_stalled(&mut self, slot: usize, now: Timestamp) {
        let cell = self.key_cells.read(slot).expect("key cells exist");
        let waiting = cell.chained > cell.released && cell.released < cell.limit;
        if waiting && now.saturating_duration_since(cell.turn_since) > CHAIN_STALL_LIMIT {
            self.break_chain(slot, cell.released + 1);
        }
    }

    /// A chained CAS's acknowledgement: a success passes in its turn (and
    /// is held out of it, to go back into the pipeline when its turn
    /// comes); a failure passes and breaks the chain.
    fn answer_chained(
        &mut self,
        now: Timestamp,
        client: usize,
        record: CasCell,
        original: u64,
        packet: &mut Packet,
    ) {
        let slot = record.key_slot as usize;
        if original != 0 {
            if record.rewritten {
                self.counters.rewrites_failed += 1;
            }
            self.close_record(client);
            let cell = self.key_cells.read(slot).expect("key cells exist");
            if record.chain_number > cell.released {
                self.break_chain(slot, record.chain_number);
            }
            return;
        }
        self.break_if_stalled(slot, now);
        let cell = self.key_cells.read(slot).expect("key cells exist");
        let passable = record.chain_number <= cell.limit;
        if record.chain_number != cell.released + 1 || !passable {
            // Out of turn, or past a break: the entry it linked onto may
            // be unlinked. Its record stays open, for the held frame or a
            // replay of the answer.
            packet.egress = Egress::Drop;
            self.counters.acks_held += 1;
            if passable && record.chain_number > cell.released {
                self.held[client] = Some(HeldAnswer {
                    key_slot: record.key_slot,
                    chain_number: record.chain_number,
                    frame: packet.bytes.to_vec(),
                });
            }
            return;
        }
        self.close_record(client);
        self.counters.successes_released += 1;
        self.key_cells.update(slot, |cell| KeyCell {
            released: record.chain_number,
            turn_since: now,
            ..cell
        });
        self.release_next(record.key_slot, record.chain_number + 1);
    }

    /// The client's CAS is answered (or given up on): its record closes,
    /// and an answer held for it goes too (a held answer always belongs
    /// to an open record).
    fn close_record(&mut self, client: usize) {
        self.held[client] = None;
        self.cas.update(client, |cell| CasCell {
            active: false,
            ..cell
        });
    }

    /// The held answer numbered `chain_number` on the key, if one is
    /// held: back into the pipeline, where it passes in its turn.
    fn release_next(&mut self, key_slot: u32, chain_number: u64) {
        let next = self.held.iter_mut().find(|held| {
            held.as_ref()
                .is_some_and(|held| held.key_slot == key_slot && held.chain_number == chain_number)
        });
        if let Some(held) = next.and_then(Option::take) {
            self.counters.acks_released += 1;
            self.released_answers.push_back(held.frame);
        }
    }

    /// An atomic acknowledgement on its way to a client: confirm. Only
    /// the memory node answers a client's CAS, and a flooded frame (to no
    /// known host) reaches no client NIC: a forged ACK from elsewhere
    /// closed the CAS's record with an original value of the forger's
    /// choosing, confirmed a tail no list held, and the next CAS of the
    /// key, rewritten onto it, linked a write no reader could reach.
    fn watch_ack(&mut self, now: Timestamp, packet: &mut Packet) {
        let (Some(ipv4), Some(roce)) = (packet.headers.ipv4, packet.headers.roce) else {
            return;
        };
        let key = queue_pair_key(ipv4.destination, roce.destination_qp);
        let Some(client) = self.replies.lookup(&key).map(|index| *index as usize) else {
            return;
        };
        // The answers this program released pass again, from the
        // generator port.
        let ingress = packet.original_ingress_port;
        let from_memory = ipv4.source == self.region.memory_address
            && (ingress == self.region.memory_port || ingress == GENERATOR_PORT);
        if !from_memory || packet.egress == Egress::Flood {
            self.counters.foreign_ignored += 1;
            return;
        }
        let record = self.cas.read(client).expect("client cells exist");
        if !record.active || record.psn != roce.psn.value() {
            return;
        }
        // AETH (4 bytes), then the original value.
        let original = be_word(&packet.bytes, roce.extension_offset + 4);
        if record.chain_number != 0 {
            return self.answer_chained(now, client, record, original, packet);
        }
        // Untouched (the key's chain broke): nothing to confirm.
        self.close_record(client);
    }
}

impl Overlay for Resolver {
    fn name(&self) -> &str {
        "clover-resolver"
    }

    fn after_forwarding(&mut self, now: Timestamp, packet: &mut Packet) {
        let Some(roce) = packet.headers.roce else {
            return;
        };
        if roce.opcode == Opcode::AtomicAcknowledge {
            if !self.intact(packet, roce.icrc_offset) {
                return;
            }
            return self.watch_ack(now, packet);
        }
        if !roce.opcode.is_request() {
            return;
        }
        let Some(client) = self.client_of_request(packet) else {
            return;
        };
        if !self.intact(packet, roce.icrc_offset) {
            return;
        }
        self.age_records(client, roce.psn);
        match roce.opcode {
            Opcode::RdmaWriteFirst | Opcode::RdmaWriteOnly => self.watch_write(client, packet),
            Opcode::CompareSwap => self.watch_cas(now, client, packet),
            _ => {}
        }
    }

    fn poll_packet_out(&mut self) -> Option<Vec<u8>> {
        self.released_answers.pop_front()
    }

    fn has_packet_out(&self) -> bool {
        !self.released_answers.is_empty()
    }

    fn add_resources(&self, report: &mut ResourceReport) {
        report.tables.extend([
            self.requests.resources(),
            self.replies.resources(),
            self.keys.resources(),
        ]);
        report.registers.extend([
            self.key_cells.resources(),
            self.outstanding.resources(),
            self.cas.resources(),
        ]);
        report.recomputes_icrc = true;
        // One success answer held out of turn per client.
        report.control_plane_held_frames = self.held.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_wire::frame::{emit_frame, FrameRepr, MAX_FRAME_LEN};
    use remora_wire::{
        AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, MacAddress, Msn, RethRepr,
    };

    const COMPUTE: (MacAddress, Ipv4Address) =
        (MacAddress([2, 0, 0, 0, 0, 1]), Ipv4Address([10, 0, 0, 1]));
    const MEMORY: (MacAddress, Ipv4Address) =
        (MacAddress([2, 0, 0, 0, 0, 2]), Ipv4Address([10, 0, 0, 2]));
    const COMPUTE_PORT: PortId = PortId(0);
    const REGION: WatchedRegion = WatchedRegion {
        memory_address: MEMORY.1,
        memory_port: PortId(1),
        base: VirtAddr(0x10_0000),
        rkey: Rkey(0x42),
        slab_start: 0x1000,
        region_bytes: 0x10_0000,
    };
    const KEY: u64 = 7;
    const MEMORY_QPN: u32 = 0x21;
    const COMPUTE_QPN: u32 = 0x11;

    fn qpn(value: u32) -> Qpn {
        Qpn::new(value).expect("24 bits")
    }

    /// One client, with [`KEY`] cached at a tail in the slabs.
    fn resolver() -> Resolver {
        let mut resolver = Resolver::new(REGION, 4, 2);
        resolver
            .add_client(
                (MEMORY.1, qpn(MEMORY_QPN)),
                (COMPUTE.1, qpn(COMPUTE_QPN)),
                COMPUTE_PORT,
            )
            .unwrap();
        let tail = NextPointer::new(0x2000, 1, true).unwrap();
        resolver.cache_key(KEY, tail).unwrap();
        resolver
    }

    /// One success answer per client may wait in the control plane for
    /// its turn: the resource report counts them.
    #[test]
    fn the_resource_report_counts_one_held_answer_per_client() {
        let resolver = Resolver::new(REGION, 4, 3);
        let mut report = ResourceReport::new("resolver");
        resolver.add_resources(&mut report);
        assert_eq!(report.control_plane_held_frames, 3);
    }

    /// Caching a key twice gave the next key the same cell: two keys
    /// shared one tail, and a CAS for one was aimed at the other's list.
    #[test]
    fn caching_a_key_twice_is_refused() {
        let mut resolver = resolver();
        let tail = NextPointer::new(0x3000, 1, true).unwrap();
        assert_eq!(
            resolver.cache_key(KEY, tail),
            Err(ResolverError::KeyCachedTwice(KEY))
        );
        resolver.cache_key(KEY + 1, tail).unwrap();
        assert_eq!(resolver.memory().cached_keys, 2);
    }

    /// A frame through the resolver, client to memory node (`to_memory`)
    /// or back; `fill` sets its extension headers.
    fn pass(
        resolver: &mut Resolver,
        to_memory: bool,
        opcode: Opcode,
        psn: u32,
        payload: &[u8],
        fill: impl FnOnce(&mut remora_wire::frame::ExtensionHeaders),
    ) {
        let frame = (to_memory, opcode, psn);
        pass_changed(resolver, frame, payload, fill, |_, _| {});
    }

    /// The ends of a frame of client `client` (its queue pairs are the
    /// first client's plus `client`), to the memory node or back.
    type Ends = ((MacAddress, Ipv4Address), (MacAddress, Ipv4Address), u32);
    fn ends_of(client: u32, to_memory: bool) -> Ends {
        match to_memory {
            true => (COMPUTE, MEMORY, MEMORY_QPN + client),
            false => (MEMORY, COMPUTE, COMPUTE_QPN + client),
        }
    }

    /// As [`pass`], with `change` applied to the frame's bytes (given the
    /// parsed headers) after its ICRC was computed, as a link corrupts.
    fn pass_changed(
        resolver: &mut Resolver,
        (to_memory, opcode, psn): (bool, Opcode, u32),
        payload: &[u8],
        fill: impl FnOnce(&mut remora_wire::frame::ExtensionHeaders),
        change: impl FnOnce(&mut [u8], &remora_switch::parser::ParsedHeaders),
    ) {
        pass_between(
            resolver,
            ends_of(0, to_memory),
            (opcode, psn),
            payload,
            fill,
            change,
        );
    }

    /// A frame from `from` to `to`'s queue pair `destination_qpn`, with a
    /// valid ICRC, then `change`d, through the resolver.
    fn pass_between(
        resolver: &mut Resolver,
        ends: Ends,
        frame: (Opcode, u32),
        payload: &[u8],
        fill: impl FnOnce(&mut remora_wire::frame::ExtensionHeaders),
        change: impl FnOnce(&mut [u8], &remora_switch::parser::ParsedHeaders),
    ) -> Packet {
        pass_at(
            resolver,
            Timestamp::ZERO,
            ends,
            frame,
            payload,
            fill,
            change,
        )
    }

    /// As [`pass_between`], at `now`. The frame comes in by the memory
    /// node's port if it is from the memory node's address, else by the
    /// compute node's.
    fn pass_at(
        resolver: &mut Resolver,
        now: Timestamp,
        ends: Ends,
        frame: (Opcode, u32),
        payload: &[u8],
        fill: impl FnOnce(&mut remora_wire::frame::ExtensionHeaders),
        change: impl FnOnce(&mut [u8], &remora_switch::parser::ParsedHeaders),
    ) -> Packet {
        let port = match ends.0 == MEMORY {
            true => REGION.memory_port,
            false => COMPUTE_PORT,
        };
        let packet = frame_between(ends, frame, payload, fill, change);
        through(resolver, now, port, packet)
    }

    /// `packet` through the resolver, come in by `port`.
    fn through(resolver: &mut Resolver, now: Timestamp, port: PortId, packet: Packet) -> Packet {
        let mut packet = Packet::new(packet.bytes, port, packet.headers);
        resolver.after_forwarding(now, &mut packet);
        packet
    }

    /// A frame from `from` to `to`'s queue pair `destination_qpn`, with a
    /// valid ICRC, then `change`d.
    fn frame_between(
        (from, to, destination_qpn): Ends,
        (opcode, psn): (Opcode, u32),
        payload: &[u8],
        fill: impl FnOnce(&mut remora_wire::frame::ExtensionHeaders),
        change: impl FnOnce(&mut [u8], &remora_switch::parser::ParsedHeaders),
    ) -> Packet {
        let bth = BthRepr::new(opcode, qpn(destination_qpn), Psn::new(psn));
        let mut repr = FrameRepr::between(from, to, 0xc000, bth);
        fill(&mut repr.extension);
        let mut bytes = vec![0u8; MAX_FRAME_LEN];
        let length =
            emit_frame(&repr.with_payload_len(payload.len()), payload, &mut bytes).unwrap();
        bytes.truncate(length);
        let headers = remora_switch::parser::parse(&bytes).unwrap();
        change(&mut bytes, &headers);
        Packet::new(bytes, PortId(0), headers)
    }

    /// An entry's 32 bytes, naming [`KEY`].
    fn entry_of_key() -> [u8; 32] {
        let mut payload = [0u8; 32];
        payload[8..16].copy_from_slice(&KEY.to_le_bytes());
        payload
    }

    /// The RETH of an entry WRITE at `entry` (an offset in the region).
    fn reth_of_entry(entry: u64) -> impl FnOnce(&mut remora_wire::frame::ExtensionHeaders) {
        move |headers| {
            headers.reth = Some(RethRepr {
                virtual_address: VirtAddr(REGION.base.0 + entry),
                rkey: REGION.rkey,
                dma_length: 32,
            });
        }
    }

    /// The entry WRITE of [`KEY`] at `entry` (an offset in the region).
    fn entry_write(resolver: &mut Resolver, psn: u32, entry: u64) {
        let payload = entry_of_key();
        let write = Opcode::RdmaWriteOnly;
        pass(resolver, true, write, psn, &payload, reth_of_entry(entry));
    }

    /// The CAS linking the entry at `entry` after the tail at `target`.
    fn link(resolver: &mut Resolver, psn: u32, target: u64, entry: u64) {
        let cas = Opcode::CompareSwap;
        pass(resolver, true, cas, psn, &[], cas_linking(target, entry));
    }

    /// The AtomicETH of a CAS linking the entry at `entry` after the tail
    /// at `target` (offsets in the region).
    fn cas_linking(
        target: u64,
        entry: u64,
    ) -> impl FnOnce(&mut remora_wire::frame::ExtensionHeaders) {
        let swap = NextPointer::new(entry, 1, false).unwrap().word();
        move |headers| {
            headers.atomic_eth = Some(AtomicEthRepr {
                virtual_address: VirtAddr(REGION.base.0 + target),
                rkey: REGION.rkey,
                swap_or_add: swap,
                compare: 0,
            });
        }
    }

    fn read(resolver: &mut Resolver, psn: u32) {
        pass(
            resolver,
            true,
            Opcode::RdmaReadRequest,
            psn,
            &[],
            |headers| {
                headers.reth = Some(RethRepr {
                    virtual_address: VirtAddr(REGION.base.0 + 0x2000),
                    rkey: REGION.rkey,
                    dma_length: 64,
                });
            },
        );
    }

    /// A client that sent 2^23 packets (reads) after its last entry WRITE
    /// and CAS had its next ones look older than those records: ignored
    /// as late duplicates, and its key never resolved again. Records are
    /// now forgotten once the client's requests run 2^22 past them.
    #[test]
    fn a_clients_records_do_not_outlive_half_the_psn_space() {
        let mut resolver = resolver();
        entry_write(&mut resolver, 10, 0x3000);
        link(&mut resolver, 11, 0x2000, 0x3000);
        // The CAS's acknowledgement is lost; the client reads and reads.
        let mut psn = 12;
        for _ in 0..4 {
            psn += 1 << 21;
            read(&mut resolver, psn);
        }
        let later = 11 + (1 << 23) + 9;
        entry_write(&mut resolver, later, 0x4000);
        link(&mut resolver, later + 1, 0x3000, 0x4000);
        let counters = resolver.counters();
        assert_eq!(counters.stale_duplicates, 0, "{counters:?}");
        assert_eq!(counters.entry_writes_seen, 2);
        // The forgotten CAS broke the key's chain: the new one passes.
        assert_eq!(counters.passed_unresolved, 1, "{counters:?}");
        assert_eq!(counters.chains_broken, 1, "{counters:?}");
        ack(&mut resolver, later + 1, 0, false);
        let record = resolver.cas.read(0).unwrap();
        assert!(!record.active, "answered: {record:?}");
    }

    /// Fills an atomic ACK's headers: an ACK, and `original` read.
    fn atomic_ack(original: u64) -> impl FnOnce(&mut remora_wire::frame::ExtensionHeaders) {
        move |headers| {
            headers.aeth = Some(AethRepr {
                syndrome: remora_wire::AckSyndrome::Ack { credit_count: 0 },
                msn: Msn::new(0),
            });
            headers.atomic_ack_eth = Some(AtomicAckEthRepr {
                original_data: original,
            });
        }
    }

    /// The atomic ACK of the CAS at `psn`, with the original value read.
    fn ack(resolver: &mut Resolver, psn: u32, original: u64, corrupt: bool) {
        let fill = atomic_ack(original);
        let frame = (false, Opcode::AtomicAcknowledge, psn);
        pass_changed(resolver, frame, &[], fill, |bytes, headers| {
            if corrupt {
                // The original value's last byte, after the AETH.
                let roce = headers.roce.unwrap();
                bytes[roce.extension_offset + 4 + 7] ^= 1;
            }
        });
    }

    /// The resolver read a corrupted ACK (a success whose original value
    /// read 1) as a failure: the CAS's record closed, the client's clean
    /// retransmission was ignored, and the key's old tail stayed
    /// confirmed, so the next CAS was rewritten back onto it, for good.
    /// A frame whose ICRC fails is passed untouched now.
    #[test]
    fn a_corrupt_ack_leaves_no_wrong_tail_confirmed() {
        let mut resolver = resolver();
        entry_write(&mut resolver, 10, 0x3000);
        link(&mut resolver, 11, 0x2000, 0x3000);
        ack(&mut resolver, 11, 0, true);
        // The client dropped it and asked again: the answer, replayed.
        ack(&mut resolver, 11, 0, false);
        entry_write(&mut resolver, 12, 0x4000);
        link(&mut resolver, 13, 0x3000, 0x4000);
        let counters = resolver.counters();
        assert_eq!(counters.corrupt_passed, 1, "{counters:?}");
        assert_eq!(counters.successes_released, 1, "{counters:?}");
        assert_eq!(counters.rewritten, 0, "{counters:?}");
    }

    /// Any host could close a client's CAS record: an ACK naming the
    /// client's queue pair and the CAS's PSN, with a valid ICRC, from
    /// anywhere, confirmed the tail of the forger's choosing, and the
    /// genuine answer was then ignored. Only the memory node's ACKs count,
    /// and only the client's own requests.
    #[test]
    fn frames_from_a_host_that_is_no_clients_peer_move_nothing() {
        const FORGER: (MacAddress, Ipv4Address) =
            (MacAddress([2, 0, 0, 0, 0, 9]), Ipv4Address([10, 0, 0, 9]));
        let mut resolver = resolver();
        entry_write(&mut resolver, 10, 0x3000);
        link(&mut resolver, 11, 0x1800, 0x3000);
        let forged_ack = atomic_ack(0x5000);
        let to_client = (FORGER, COMPUTE, COMPUTE_QPN);
        let ack_of_cas = (Opcode::AtomicAcknowledge, 11);
        pass_between(
            &mut resolver,
            to_client,
            ack_of_cas,
            &[],
            forged_ack,
            |_, _| {},
        );
        // A forged entry WRITE in the client's name, too.
        let payload = entry_of_key();
        let forged_write = reth_of_entry(0x6000);
        let to_memory = (FORGER, MEMORY, MEMORY_QPN);
        let write = (Opcode::RdmaWriteOnly, 12);
        pass_between(
            &mut resolver,
            to_memory,
            write,
            &payload,
            forged_write,
            |_, _| {},
        );
        let counters = resolver.counters();
        assert_eq!(counters.foreign_ignored, 2, "{counters:?}");
        assert_eq!(counters.rewrites_failed, 0, "{counters:?}");
        assert_eq!(counters.entry_writes_seen, 1, "{counters:?}");
        // The genuine answer: the rewritten CAS succeeded, its tail holds.
        ack(&mut resolver, 11, 0, false);
        let counters = resolver.counters();
        assert_eq!(counters.successes_released, 1, "{counters:?}");
        let slot = *resolver.keys.lookup(&KEY).unwrap() as usize;
        let cell = resolver.key_cells.read(slot).unwrap();
        assert_eq!(cell.tail, REGION.base.0 + 0x3000, "{cell:?}");
    }

    /// A host that borrowed a client's address (or the memory node's)
    /// moved the resolver as the client would: a CAS in the client's name
    /// was chained and rewritten, and its failure broke the key's chain
    /// for good. Frames in their names from another port move nothing.
    #[test]
    fn frames_with_a_peers_address_from_another_port_move_nothing() {
        const STRANGER_PORT: PortId = PortId(2);
        let mut resolver = resolver();
        let payload = entry_of_key();
        let reth = reth_of_entry(0x6000);
        let atomic = cas_linking(0x1800, 0x6000);
        let to_memory = ends_of(0, true);
        let write = frame_between(
            to_memory,
            (Opcode::RdmaWriteOnly, 10),
            &payload,
            reth,
            |_, _| {},
        );
        through(&mut resolver, Timestamp::ZERO, STRANGER_PORT, write);
        let cas = frame_between(to_memory, (Opcode::CompareSwap, 11), &[], atomic, |_, _| {});
        let sent = cas.bytes.clone();
        let passed = through(&mut resolver, Timestamp::ZERO, STRANGER_PORT, cas);
        assert_eq!(passed.bytes, sent, "the CAS passes unrewritten");
        // An answer in the memory node's name, from the compute node's port.
        let answer = frame_between(
            ends_of(0, false),
            (Opcode::AtomicAcknowledge, 11),
            &[],
            atomic_ack(0),
            |_, _| {},
        );
        through(&mut resolver, Timestamp::ZERO, COMPUTE_PORT, answer);
        let counters = resolver.counters();
        assert_eq!(counters.foreign_ignored, 3, "{counters:?}");
        assert_eq!(counters.entry_writes_seen, 0, "{counters:?}");
        assert_eq!(counters.rewritten, 0, "{counters:?}");
        // The client's own CAS is chained onto the cached tail, untouched
        // by the stranger's.
        assert_eq!(write_by(&mut resolver, 0, 20, 0x1800, 0x3000), 0x2000);
    }

    /// A rewritten CAS that failed left the tail it was rewritten to as
    /// the confirmed one, and every later CAS of the key was drawn back
    /// onto it. A failed rewrite forgets the tail now.
    #[test]
    fn a_failed_rewrite_forgets_the_tail() {
        let mut resolver = resolver();
        entry_write(&mut resolver, 10, 0x3000);
        // Named 0x1800, rewritten to the cached 0x2000, and failed there.
        link(&mut resolver, 11, 0x1800, 0x3000);
        ack(&mut resolver, 11, 0x5000, false);
        assert_eq!(resolver.counters().rewrites_failed, 1);
        entry_write(&mut resolver, 12, 0x4000);
        link(&mut resolver, 13, 0x5000, 0x4000);
        let counters = resolver.counters();
        assert_eq!(counters.rewritten, 1, "only the first: {counters:?}");
    }

    /// A corrupted CAS was rewritten and given a fresh ICRC: the memory
    /// node executed whatever the flipped bit made of it. It passes
    /// untouched now, for the memory node to drop.
    #[test]
    fn a_corrupt_cas_is_not_given_a_fresh_icrc() {
        let mut resolver = resolver();
        entry_write(&mut resolver, 10, 0x3000);
        // A stale tail: a clean one is rewritten to 0x2000.
        let fill = cas_linking(0x1800, 0x3000);
        let mut seen = None;
        let frame = (true, Opcode::CompareSwap, 11);
        pass_changed(&mut resolver, frame, &[], fill, |bytes, headers| {
            let roce = headers.roce.unwrap();
            // A bit of the rkey.
            bytes[roce.extension_offset + 8] ^= 0x10;
            seen = Some(roce.icrc_offset);
        });
        let counters = resolver.counters();
        assert!(seen.is_some());
        assert_eq!(counters.corrupt_passed, 1, "{counters:?}");
        assert_eq!(counters.rewritten, 0, "{counters:?}");
    }

    /// A retransmission or late duplicate comes within a few PSNs: still
    /// recognised with the records kept.
    #[test]
    fn a_late_duplicate_within_reach_is_still_ignored() {
        let mut resolver = resolver();
        entry_write(&mut resolver, 100, 0x3000);
        entry_write(&mut resolver, 200, 0x4000);
        entry_write(&mut resolver, 100, 0x3000);
        let counters = resolver.counters();
        assert_eq!(counters.stale_duplicates, 1, "{counters:?}");
        assert_eq!(counters.entry_writes_seen, 2);
    }

    /// Client `client`'s entry WRITE of [`KEY`] at `entry`, then its CAS
    /// naming `target`: where the CAS was sent.
    fn write_by(resolver: &mut Resolver, client: u32, psn: u32, target: u64, entry: u64) -> u64 {
        write_at(resolver, Timestamp::ZERO, client, (psn, target, entry))
    }

    /// As [`write_by`], at `now`.
    fn write_at(
        resolver: &mut Resolver,
        now: Timestamp,
        client: u32,
        (psn, target, entry): (u32, u64, u64),
    ) -> u64 {
        let payload = entry_of_key();
        let reth = reth_of_entry(entry);
        let to_memory = ends_of(client, true);
        let write = (Opcode::RdmaWriteOnly, psn);
        pass_at(resolver, now, to_memory, write, &payload, reth, |_, _| {});
        let atomic = cas_linking(target, entry);
        let cas = (Opcode::CompareSwap, psn + 1);
        let packet = pass_at(resolver, now, to_memory, cas, &[], atomic, |_, _| {});
        let at = packet.headers.roce.unwrap().extension_offset;
        be_word(&packet.bytes, at) - REGION.base.0
    }

    /// The memory node's answer to client `client`'s CAS at `psn`:
    /// whether the switch let it pass.
    fn answer_to(resolver: &mut Resolver, client: u32, psn: u32, original: u64) -> bool {
        let answer = (Opcode::AtomicAcknowledge, psn);
        let ends = ends_of(client, false);
        let packet = pass_between(resolver, ends, answer, &[], atomic_ack(original), |_, _| {});
        packet.egress != Egress::Drop
    }

    fn two_clients() -> Resolver {
        let mut resolver = resolver();
        resolver
            .add_client(
                (MEMORY.1, qpn(MEMORY_QPN + 1)),
                (COMPUTE.1, qpn(COMPUTE_QPN + 1)),
                COMPUTE_PORT,
            )
            .unwrap();
        resolver
    }

    /// Two clients' CASes in flight together on [`KEY`]: the first's (PSN
    /// 11) to the cached tail 0x2000 linking 0x3000, the second's (PSN 21)
    /// chained onto 0x3000 linking 0x4000; neither answered.
    fn two_chained() -> Resolver {
        let mut resolver = two_clients();
        write_by(&mut resolver, 0, 10, 0x2000, 0x3000);
        write_by(&mut resolver, 1, 20, 0x2000, 0x4000);
        resolver
    }

    /// As the paper's resolver does, CASes in flight together on one key
    /// are chained: the second goes to the first's entry, so both link
    /// (the earlier resolver let the second pass to the stale tail it
    /// named, to fail and chase).
    #[test]
    fn cases_in_flight_together_are_chained_onto_each_other() {
        let mut resolver = two_clients();
        assert_eq!(write_by(&mut resolver, 0, 10, 0x1800, 0x3000), 0x2000);
        assert_eq!(write_by(&mut resolver, 1, 20, 0x1800, 0x4000), 0x3000);
        assert!(answer_to(&mut resolver, 0, 11, 0));
        assert!(answer_to(&mut resolver, 1, 21, 0));
        let counters = resolver.counters();
        assert_eq!(
            (counters.chained, counters.acks_held),
            (2, 0),
            "{counters:?}"
        );
        // The next is chained onto the second.
        assert_eq!(write_by(&mut resolver, 0, 12, 0x3000, 0x5000), 0x4000);
    }

    /// The paper's chaining, over a lossy path: the first CAS is lost
    /// after the switch, the second (chained onto its entry) succeeds
    /// while that entry is unlinked. Its success is held back until the
    /// first's passed, so its writer never returns a write no reader
    /// could see; then it goes back into the pipeline and passes.
    #[test]
    fn a_success_chained_onto_an_unlinked_entry_waits_for_it() {
        let mut resolver = two_chained();
        assert!(
            !answer_to(&mut resolver, 1, 21, 0),
            "held: 0x3000 is unlinked"
        );
        assert_eq!(resolver.counters().acks_held, 1);
        // The first client's CAS again, rewritten as before, and landed.
        let again = |headers: &mut remora_wire::frame::ExtensionHeaders| {
            headers.atomic_eth = Some(AtomicEthRepr {
                virtual_address: VirtAddr(REGION.base.0 + 0x2000),
                rkey: REGION.rkey,
                swap_or_add: NextPointer::new(0x3000, 1, false).unwrap().word(),
                compare: 0,
            });
        };
        let cas = (Opcode::CompareSwap, 11);
        pass_between(&mut resolver, ends_of(0, true), cas, &[], again, |_, _| {});
        assert!(!resolver.has_packet_out(), "nothing released yet");
        assert!(answer_to(&mut resolver, 0, 11, 0));
        let frame = resolver
            .poll_packet_out()
            .expect("the held answer, released");
        let headers = remora_switch::parser::parse(&frame).unwrap();
        let mut packet = Packet::new(frame, remora_switch::packet::GENERATOR_PORT, headers);
        resolver.after_forwarding(Timestamp::ZERO, &mut packet);
        assert_ne!(packet.egress, Egress::Drop, "in its turn now");
        assert!(resolver.poll_packet_out().is_none());
        // A replay of the answer (the client asked again meanwhile) is a
        // duplicate for its client to drop.
        assert!(answer_to(&mut resolver, 1, 21, 0));
    }

    /// A chained CAS that fails (its tail taken by a CAS the switch never
    /// saw) breaks the chain: the success chained onto its unlinked entry
    /// never passes, and the key's CASes pass untouched for good (CASes
    /// chained before the break could still land after a tail found
    /// later, so chaining does not resume).
    #[test]
    fn a_failed_chained_cas_breaks_the_chain_for_good() {
        let mut resolver = two_chained();
        assert!(!answer_to(&mut resolver, 1, 21, 0), "held");
        assert!(answer_to(&mut resolver, 0, 11, 0x9000), "a failure passes");
        assert!(
            !resolver.has_packet_out(),
            "the held answer is not released"
        );
        for _ in 0..3 {
            assert!(!answer_to(&mut resolver, 1, 21, 0), "never released");
        }
        let counters = resolver.counters();
        assert_eq!(counters.chains_broken, 1, "{counters:?}");
        for psn in [12, 14] {
            let target = 0x9000 + u64::from(psn) * 0x100;
            assert_eq!(write_by(&mut resolver, 0, psn, target, 0x5000), target);
            assert!(answer_to(&mut resolver, 0, psn + 1, 0));
        }
        assert_eq!(resolver.counters().passed_unresolved, 2);
    }

    /// A break keeps what came before it: successes numbered below the
    /// failed CAS linked onto linked entries, and still pass in turn.
    #[test]
    fn a_break_still_releases_the_successes_before_it() {
        let mut resolver = two_chained();
        // The second fails (a CAS the switch never saw took 0x3000's next
        // pointer) while the first is still on its way.
        assert!(answer_to(&mut resolver, 1, 21, 0x9000));
        assert!(answer_to(&mut resolver, 0, 11, 0), "the first, in its turn");
        let counters = resolver.counters();
        assert_eq!(
            (counters.chains_broken, counters.successes_released),
            (1, 1),
            "{counters:?}"
        );
    }

    /// A client that died with its chained CAS lost kept the turn for
    /// good, and every later writer of the key waited behind it. Past
    /// [`CHAIN_STALL_LIMIT`] the chain breaks at the turn: the successes
    /// behind it are never released, the key's CASes pass untouched.
    #[test]
    fn a_turn_kept_past_the_stall_limit_breaks_the_chain_there() {
        let mut resolver = two_chained();
        assert!(!answer_to(&mut resolver, 1, 21, 0), "held behind the first");
        let late = Timestamp::ZERO.saturating_add(CHAIN_STALL_LIMIT * 2);
        let answer = (Opcode::AtomicAcknowledge, 21);
        let ends = ends_of(1, false);
        let mut packet = pass_between(&mut resolver, ends, answer, &[], atomic_ack(0), |_, _| {});
        packet.egress = Egress::Unset;
        resolver.after_forwarding(late, &mut packet);
        assert_eq!(packet.egress, Egress::Drop, "never released");
        let counters = resolver.counters();
        assert_eq!(counters.chains_broken, 1, "{counters:?}");
        assert!(!resolver.has_packet_out());
    }

    /// The break that fires for a dead client: its chained CAS lost, and
    /// no answer behind it (the waiting writers' RNICs gave up). The key's
    /// next CAS, past the stall limit, finds the turn stalled, breaks the
    /// chain there and passes untouched, not chained onto the lost entry.
    #[test]
    fn a_cas_after_a_stalled_turn_breaks_the_chain_and_passes_untouched() {
        let mut resolver = Resolver::new(REGION, 4, 3);
        for client in 0..3 {
            let memory_side = (MEMORY.1, qpn(MEMORY_QPN + client));
            let compute_side = (COMPUTE.1, qpn(COMPUTE_QPN + client));
            resolver
                .add_client(memory_side, compute_side, COMPUTE_PORT)
                .unwrap();
        }
        let tail = NextPointer::new(0x2000, 1, true).unwrap();
        resolver.cache_key(KEY, tail).unwrap();
        write_by(&mut resolver, 0, 10, 0x2000, 0x3000);
        let soon = Timestamp::ZERO.saturating_add(CHAIN_STALL_LIMIT / 2);
        let chained = write_at(&mut resolver, soon, 1, (20, 0x2000, 0x4000));
        assert_eq!(chained, 0x3000, "within the limit: chained");
        let late = Timestamp::ZERO.saturating_add(CHAIN_STALL_LIMIT * 2);
        let untouched = write_at(&mut resolver, late, 2, (30, 0x2000, 0x5000));
        assert_eq!(untouched, 0x2000, "past it: untouched");
        let counters = resolver.counters();
        assert_eq!(
            (counters.chains_broken, counters.passed_unresolved),
            (1, 1),
            "{counters:?}"
        );
    }
}
