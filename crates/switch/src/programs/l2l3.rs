//! L2/L3 forwarding, the rack's default program.
//!
//! - Stage 0, `routes` (LPM on the IPv4 destination): used when a frame is
//!   addressed to the switch's own MAC, i.e. routed through it. A hit
//!   rewrites both MACs, decrements the TTL (dropping at 1) and patches the
//!   IPv4 checksum incrementally (RFC 1624). TTL and checksum are masked
//!   out of the ICRC, so routing never needs the ICRC recomputed.
//! - Stage 1, `mac_table` (exact on the destination MAC): bridging.
//!   Broadcast floods; an unknown unicast destination floods only if
//!   configured (a rack knows all its hosts, so by default it drops).
//! - Stage 1, `known_sources` (exact on the source MAC): a miss, or a
//!   learned host seen on another port than it was learned on (it moved),
//!   sends a learning digest (MAC, port) to the control plane, which may
//!   add the pair to both tables. Hosts the control plane configured stay
//!   where it put them, as a switch's static MAC entries do: a frame
//!   with a configured host's MAC from elsewhere does not move it.
//! - Learned hosts age out under pressure: each frame from one marks it
//!   seen, as a table entry's idle-timeout bit does, and when a new host
//!   finds the tables full, the learned host unseen longest makes room
//!   for it if unseen for [`DEFAULT_LEARNED_IDLE_TIMEOUT`] (IEEE 802.1D's
//!   default aging time; [`L2L3Forwarding::set_learned_idle_timeout`]).
//!   Never aged, hosts that came and went filled the tables, and every
//!   new host was refused for good. Aged whenever idle, a quiet host that
//!   only answers (an RDMA responder) became unreachable, as unknown
//!   unicast is dropped here, not flooded as on an 802.1D bridge.

use crate::packet::{Egress, Packet, PortId};
use crate::program::{Digest, Program};
use crate::resources::ResourceReport;
use crate::table::{ExactTable, LpmTable, TableError, TableShape};
use remora_base::Timestamp;
use remora_wire::{Ipv4Address, MacAddress};
use std::time::Duration;

/// How long a learned host may go unseen before it is forgotten: IEEE
/// 802.1D's default aging time.
pub const DEFAULT_LEARNED_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Digest kind: `values[0]` is the source MAC, `values[1]` the port.
pub const LEARN_DIGEST: u16 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    pub port: PortId,
    pub next_hop: MacAddress,
}

pub struct L2L3Forwarding {
    switch_mac: MacAddress,
    routes: LpmTable<Route>,
    /// Keyed by the MAC as an integer: one multiply to hash.
    mac_table: ExactTable<u64, PortId>,
    known_sources: ExactTable<u64, Station>,
    flood_unknown: bool,
    /// Learnings the control plane refused because the tables were full:
    /// one per digest, and a host that stays unknown raises one with each
    /// frame it sends.
    learning_refused: u64,
    learned_idle_timeout: Duration,
    /// The time of the last frame: a learning digest (which carries none)
    /// counts its host seen then.
    clock: Timestamp,
    learned_aged_out: u64,
}

/// How the switch came to know a source MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Station {
    /// Placed by the control plane: it never moves.
    Configured,
    /// Learned from a frame on this port: it moves when the host does,
    /// and leaves once unseen for the idle timeout.
    Learned { port: PortId, seen_at: Timestamp },
}

pub fn mac_to_u64(mac: MacAddress) -> u64 {
    mac.0
        .iter()
        .fold(0, |value, byte| value << 8 | u64::from(*byte))
}

pub fn mac_from_u64(value: u64) -> MacAddress {
    let bytes = value.to_be_bytes();
    MacAddress(bytes[2..8].try_into().expect("6 bytes"))
}

impl L2L3Forwarding {
    /// The MAC hosts send routed frames to: the switch's own.
    pub fn switch_mac(&self) -> MacAddress {
        self.switch_mac
    }

    pub fn new(switch_mac: MacAddress, capacity: usize) -> L2L3Forwarding {
        L2L3Forwarding {
            switch_mac,
            routes: LpmTable::new(TableShape {
                name: "routes",
                stage: 0,
                key_bits: 32,
                action_data_bits: 16 + 48,
                capacity,
            }),
            mac_table: ExactTable::new(TableShape {
                name: "mac_table",
                stage: 1,
                key_bits: 48,
                action_data_bits: 16,
                capacity,
            }),
            known_sources: ExactTable::new(TableShape {
                name: "known_sources",
                stage: 1,
                key_bits: 48,
                // A learned host's port, and whether it was learned.
                action_data_bits: 17,
                capacity,
            }),
            flood_unknown: false,
            learning_refused: 0,
            learned_idle_timeout: DEFAULT_LEARNED_IDLE_TIMEOUT,
            clock: Timestamp::ZERO,
            learned_aged_out: 0,
        }
    }

    /// How long a learned host must go unseen before a new host may take
    /// its place in full tables.
    pub fn set_learned_idle_timeout(&mut self, timeout: Duration) {
        self.learned_idle_timeout = timeout;
    }

    /// Learned hosts forgotten to make room, unseen past the idle timeout.
    pub fn learned_aged_out(&self) -> u64 {
        self.learned_aged_out
    }

    /// Learnings refused for a full table, one per digest (a host that
    /// stays unknown is refused again at each frame it sends, and its
    /// unicast is dropped).
    pub fn learning_refused(&self) -> u64 {
        self.learning_refused
    }

    /// Forwarding for a rack whose host `i` sits directly on port `i`.
    pub fn with_attached_hosts(
        router_mac: MacAddress,
        hosts: &[(MacAddress, Ipv4Address)],
    ) -> Result<L2L3Forwarding, TableError> {
        let mut program = L2L3Forwarding::new(router_mac, hosts.len().max(16));
        for (index, (mac, address)) in hosts.iter().enumerate() {
            program.add_attached_host(*mac, *address, PortId(index as u16))?;
        }
        Ok(program)
    }

    pub fn set_flood_unknown(&mut self, flood: bool) {
        self.flood_unknown = flood;
    }

    /// Control plane: a host with this MAC sits behind `port`, for good.
    pub fn add_host(&mut self, mac: MacAddress, port: PortId) -> Result<(), TableError> {
        self.place(mac, port, Station::Configured)
    }

    fn place(&mut self, mac: MacAddress, port: PortId, station: Station) -> Result<(), TableError> {
        self.mac_table.insert(mac_to_u64(mac), port)?;
        self.known_sources.insert(mac_to_u64(mac), station)
    }

    /// Control plane: a host directly on `port`, both bridged (by MAC) and
    /// routed (a /32 to its address), as a rack's switch knows its nodes.
    pub fn add_attached_host(
        &mut self,
        mac: MacAddress,
        address: Ipv4Address,
        port: PortId,
    ) -> Result<(), TableError> {
        self.add_host(mac, port)?;
        self.add_route(
            address,
            32,
            Route {
                port,
                next_hop: mac,
            },
        )
    }

    /// Control plane: route `prefix/length` out of `port` to `next_hop`.
    pub fn add_route(
        &mut self,
        prefix: Ipv4Address,
        length: u8,
        route: Route,
    ) -> Result<(), TableError> {
        self.routes
            .insert(u32::from_be_bytes(prefix.0), length, route)
    }

    /// The port a packet to `address` is routed out of, if any route
    /// covers it: where a control plane finds the port a host is attached
    /// to.
    pub fn port_to(&self, address: Ipv4Address) -> Option<PortId> {
        self.routes
            .lookup(u32::from_be_bytes(address.0))
            .map(|route| route.port)
    }

    /// Control plane: handle a learning digest: a new host, or a learned
    /// one that moved. A configured host is left where it is.
    pub fn learn(&mut self, digest: &Digest) -> Result<(), TableError> {
        let mac = mac_from_u64(digest.values[0]);
        // Never a group address (the data plane sends none; a control
        // plane's own digest might).
        if digest.kind != LEARN_DIGEST || mac.0[0] & 1 == 1 {
            return Ok(());
        }
        let key = mac_to_u64(mac);
        if self.known_sources.lookup(&key) == Some(&Station::Configured) {
            return Ok(());
        }
        let port = PortId(digest.values[1] as u16);
        let full = self.known_sources.len() >= self.known_sources.capacity();
        if full && self.known_sources.lookup(&key).is_none() {
            self.age_out_one();
        }
        let seen_at = self.clock;
        self.place(mac, port, Station::Learned { port, seen_at })
    }

    /// Whether a frame from `source` on `port` is news to the control
    /// plane: a host never seen, or a learned one on a new port. A learned
    /// one on its port is marked seen.
    fn see_source(&mut self, now: Timestamp, source: u64, port: PortId) -> bool {
        match self.known_sources.lookup_mut(&source) {
            None => true,
            Some(Station::Learned {
                port: learned,
                seen_at,
            }) => {
                if *learned != port {
                    return true;
                }
                *seen_at = (*seen_at).max(now);
                false
            }
            Some(Station::Configured) => false,
        }
    }

    /// Makes room by the learned host unseen longest, if unseen past the
    /// idle timeout. Bounded by the table's capacity; ties go to the lowest
    /// MAC, so every run forgets the same host.
    fn age_out_one(&mut self) {
        let timeout = self.learned_idle_timeout;
        let idlest = self
            .known_sources
            .iter()
            .filter_map(|(source, station)| match station {
                Station::Learned { seen_at, .. } => Some((*seen_at, *source)),
                Station::Configured => None,
            })
            .min();
        let Some((seen_at, source)) = idlest else {
            return;
        };
        if seen_at.saturating_add(timeout) >= self.clock {
            return;
        }
        self.known_sources.remove(&source);
        self.mac_table.remove(&source);
        self.learned_aged_out += 1;
    }

    fn route(&self, packet: &mut Packet) -> bool {
        let Some(ipv4) = packet.headers.ipv4 else {
            return false;
        };
        let Some(route) = self
            .routes
            .lookup(u32::from_be_bytes(ipv4.destination.0))
            .copied()
        else {
            return false;
        };
        if ipv4.time_to_live <= 1 {
            packet.egress = Egress::Drop;
            return true;
        }
        let bytes = &mut packet.bytes;
        bytes[0..6].copy_from_slice(&route.next_hop.0);
        bytes[6..12].copy_from_slice(&self.switch_mac.0);
        decrement_ttl(&mut bytes[ipv4.offset..ipv4.offset + ipv4.header_len]);
        packet.egress = Egress::Port(route.port);
        true
    }
}

/// TTL minus one with the checksum patched as RFC 1624 says:
/// HC' = ~(~HC + ~m + m'), over the 16-bit word holding TTL and protocol.
fn decrement_ttl(header: &mut [u8]) {
    let old_word = u16::from_be_bytes([header[8], header[9]]);
    header[8] -= 1;
    let new_word = u16::from_be_bytes([header[8], header[9]]);
    let checksum = u16::from_be_bytes([header[10], header[11]]);
    let mut sum = u32::from(!checksum) + u32::from(!old_word) + u32::from(new_word);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    header[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
}

impl Program for L2L3Forwarding {
    fn name(&self) -> &str {
        "l2l3"
    }

    fn ingress(&mut self, now: Timestamp, packet: &mut Packet) {
        self.clock = self.clock.max(now);
        // A group address is never a frame's source (802.1D): such a
        // frame (a spoof, a flipped bit) is dropped. Learned, it sent
        // every later broadcast to its one port.
        if packet.headers.source_mac.0[0] & 1 == 1 {
            packet.egress = Egress::Drop;
            return;
        }
        // Only the fields matched on, not a copy of every parsed header.
        let source = mac_to_u64(packet.headers.source_mac);
        let destination_mac = packet.headers.destination_mac;
        let destination = mac_to_u64(destination_mac);
        // A packet carries one digest, as on a Tofino. An overlay's, set
        // before forwarding, is kept: it was replaced by this one, and lost.
        // Learning waits for the host's next frame without one. (A host
        // whose every frame carries an overlay's digest is never learned;
        // racks configure their hosts, which need no learning.)
        // Every frame from a host marks it seen, one with a digest too.
        let news = packet.ingress_port.0 < crate::packet::RECIRCULATION_PORT.0
            && self.see_source(now, source, packet.ingress_port);
        if news && packet.digest.is_none() {
            packet.digest = Some(Digest {
                kind: LEARN_DIGEST,
                values: [source, u64::from(packet.ingress_port.0), 0, 0],
            });
        }
        if destination_mac == self.switch_mac && self.route(packet) {
            return;
        }
        packet.egress = match self.mac_table.lookup(&destination) {
            Some(port) if *port == packet.original_ingress_port => Egress::Drop,
            Some(port) => Egress::Port(*port),
            None if destination_mac.0[0] & 1 == 1 => Egress::Flood,
            None if self.flood_unknown => Egress::Flood,
            None => Egress::Drop,
        };
    }

    fn resources(&self) -> ResourceReport {
        let mut report = ResourceReport::new(self.name());
        report.tables = vec![
            self.routes.resources(),
            self.mac_table.resources(),
            self.known_sources.resources(),
        ];
        report
    }

    fn control_plane(&mut self, digest: &Digest) {
        // A full table means the host stays unknown, counted (the count
        // was promised here and never kept).
        if self.learn(digest).is_err() {
            self.learning_refused += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_wire::ipv4::internet_checksum;

    #[test]
    fn the_incremental_checksum_matches_a_full_recomputation() {
        for ttl in 2..=255u8 {
            let mut header = [
                0x45, 0, 0, 60, 0x12, 0x34, 0x40, 0, ttl, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
            ];
            let checksum = internet_checksum(&header);
            header[10..12].copy_from_slice(&checksum.to_be_bytes());
            decrement_ttl(&mut header);
            assert_eq!(header[8], ttl - 1);
            assert_eq!(
                internet_checksum(&header),
                0,
                "a header with a right checksum sums to zero"
            );
        }
    }

    #[test]
    fn mac_addresses_survive_the_digest_encoding() {
        let mac = MacAddress([0x02, 0xab, 0xcd, 0xef, 0x01, 0x23]);
        assert_eq!(mac_from_u64(mac_to_u64(mac)), mac);
    }
}
