//! Programs on top of L2/L3 forwarding.
//!
//! Every system's switch program also forwards the rack's ordinary
//! traffic. Rather than each one owning a copy of the forwarding program
//! and merging its resources and control plane by hand, a system writes
//! an [`Overlay`] and [`Overlaid`] puts it on top of [`L2L3Forwarding`]:
//!
//! 1. the overlay sees each packet first and may take it whole (a packet
//!    it plays an endpoint for, a generator packet);
//! 2. otherwise forwarding chooses the egress;
//! 3. then, unless forwarding dropped the packet, the overlay sees it
//!    again with its egress set, to watch or rewrite it.
//!
//! The resource report is forwarding's plus the overlay's tables and
//! registers under the overlay's name, and digests go to both control
//! planes.

use crate::packet::{Egress, Packet};
use crate::program::{Digest, Program};
use crate::programs::l2l3::L2L3Forwarding;
use crate::resources::ResourceReport;
use remora_base::Timestamp;
use std::ops::{Deref, DerefMut};

/// What an overlay did with a packet before forwarding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// Forwarding runs on it.
    Pass,
    /// The overlay handled it whole (set its egress, or dropped it).
    Taken,
}

/// A system's stages around L2/L3 forwarding.
pub trait Overlay: Send {
    fn name(&self) -> &str;

    /// The switch's own MAC, the one routed frames are sent to: told once,
    /// as the overlay is put over the forwarding.
    fn attach(&mut self, _switch_mac: remora_wire::MacAddress) {}

    /// Before forwarding: take the packet, or let forwarding have it.
    fn before_forwarding(&mut self, _now: Timestamp, _packet: &mut Packet) -> Claim {
        Claim::Pass
    }

    /// After forwarding chose an egress (not for dropped packets).
    fn after_forwarding(&mut self, _now: Timestamp, _packet: &mut Packet) {}

    /// Adds the overlay's tables and registers to `report`, and says
    /// whether it rewrites ICRC-covered bytes.
    fn add_resources(&self, report: &mut ResourceReport);

    /// A digest, after forwarding's control plane saw it.
    fn control_plane(&mut self, _digest: &Digest) {}

    /// See [`Program::poll_packet_out`].
    fn poll_packet_out(&mut self) -> Option<Vec<u8>> {
        None
    }

    /// See [`Program::has_packet_out`].
    fn has_packet_out(&self) -> bool {
        false
    }
}

/// An overlay on top of L2/L3 forwarding: the program a system deploys.
/// It dereferences to the overlay, so the system's own control-plane
/// methods and counters are called on it directly.
pub struct Overlaid<O: Overlay> {
    forwarding: L2L3Forwarding,
    overlay: O,
}

impl<O: Overlay> Overlaid<O> {
    pub fn new(forwarding: L2L3Forwarding, mut overlay: O) -> Overlaid<O> {
        overlay.attach(forwarding.switch_mac());
        Overlaid {
            forwarding,
            overlay,
        }
    }

    pub fn forwarding(&self) -> &L2L3Forwarding {
        &self.forwarding
    }

    pub fn forwarding_mut(&mut self) -> &mut L2L3Forwarding {
        &mut self.forwarding
    }

    pub fn overlay(&self) -> &O {
        &self.overlay
    }

    pub fn overlay_mut(&mut self) -> &mut O {
        &mut self.overlay
    }
}

impl<O: Overlay> Deref for Overlaid<O> {
    type Target = O;

    fn deref(&self) -> &O {
        &self.overlay
    }
}

impl<O: Overlay> DerefMut for Overlaid<O> {
    fn deref_mut(&mut self) -> &mut O {
        &mut self.overlay
    }
}

impl<O: Overlay> Program for Overlaid<O> {
    fn name(&self) -> &str {
        self.overlay.name()
    }

    fn ingress(&mut self, now: Timestamp, packet: &mut Packet) {
        if self.overlay.before_forwarding(now, packet) == Claim::Taken {
            return;
        }
        self.forwarding.ingress(now, packet);
        if !matches!(
            packet.egress,
            Egress::Drop | Egress::Unset | Egress::Consumed
        ) {
            self.overlay.after_forwarding(now, packet);
        }
    }

    fn resources(&self) -> ResourceReport {
        let mut report = self.forwarding.resources();
        report.program = self.overlay.name().to_string();
        self.overlay.add_resources(&mut report);
        report
    }

    fn control_plane(&mut self, digest: &Digest) {
        self.forwarding.control_plane(digest);
        self.overlay.control_plane(digest);
    }

    fn poll_packet_out(&mut self) -> Option<Vec<u8>> {
        self.overlay.poll_packet_out()
    }

    fn has_packet_out(&self) -> bool {
        self.overlay.has_packet_out()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::TableResources;
    use remora_wire::{Ipv4Address, MacAddress};

    /// Counts what it sees, takes packets from port 3, and reports one
    /// table.
    #[derive(Default)]
    struct Watcher {
        before: usize,
        after: usize,
        digests: usize,
        /// Leave a digest of this kind on every packet before forwarding.
        digest_before: Option<u16>,
    }

    impl Overlay for Watcher {
        fn name(&self) -> &str {
            "watcher"
        }

        fn before_forwarding(&mut self, _now: Timestamp, packet: &mut Packet) -> Claim {
            self.before += 1;
            if let Some(kind) = self.digest_before {
                packet.digest = Some(Digest {
                    kind,
                    values: [0; 4],
                });
            }
            if packet.ingress_port == crate::PortId(3) {
                packet.egress = Egress::Drop;
                return Claim::Taken;
            }
            Claim::Pass
        }

        fn after_forwarding(&mut self, _now: Timestamp, _packet: &mut Packet) {
            self.after += 1;
        }

        fn add_resources(&self, report: &mut ResourceReport) {
            report.tables.push(TableResources {
                name: "watched".into(),
                stage: 2,
                kind: crate::resources::TableKind::Exact,
                key_bits: 8,
                action_data_bits: 0,
                entries: 0,
                capacity: 1,
            });
        }

        fn control_plane(&mut self, _digest: &Digest) {
            self.digests += 1;
        }
    }

    /// A frame to `destination` from an unknown source, arriving on `port`.
    fn packet(port: u16, destination: MacAddress) -> Packet {
        let mut bytes = vec![0u8; 60];
        bytes[..6].copy_from_slice(&destination.0);
        bytes[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
        bytes[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        let headers = crate::parser::parse(&bytes).expect("an Ethernet frame");
        Packet::new(bytes, crate::PortId(port), headers)
    }

    #[test]
    fn the_overlay_sees_packets_around_forwarding_and_its_resources_add_up() {
        let hosts = [
            (
                MacAddress([2, 0, 0, 0, 0, 1]),
                Ipv4Address::new(10, 0, 0, 1),
            ),
            (
                MacAddress([2, 0, 0, 0, 0, 2]),
                Ipv4Address::new(10, 0, 0, 2),
            ),
        ];
        let forwarding =
            L2L3Forwarding::with_attached_hosts(MacAddress([2, 0x5e, 0, 0, 0, 0xfe]), &hosts)
                .unwrap();
        let forwarding_tables = forwarding.resources().tables.len();
        let mut program = Overlaid::new(forwarding, Watcher::default());
        let now = Timestamp::ZERO;
        // Known destination: forwarded, seen before and after.
        let mut forwarded = packet(0, hosts[1].0);
        program.ingress(now, &mut forwarded);
        assert_eq!(forwarded.egress, Egress::Port(crate::PortId(1)));
        // Unknown destination: forwarding drops it; no after-look.
        let mut unknown = packet(0, MacAddress([2, 0, 0, 0, 0, 7]));
        program.ingress(now, &mut unknown);
        // Port 3: taken before forwarding.
        let mut packet = packet(3, hosts[1].0);
        program.ingress(now, &mut packet);
        assert_eq!(packet.egress, Egress::Drop);
        assert_eq!((program.before, program.after), (3, 1));
        let report = program.resources();
        assert_eq!(report.program, "watcher");
        assert_eq!(report.tables.len(), forwarding_tables + 1);
        program.control_plane(&Digest {
            kind: 0,
            values: [0; 4],
        });
        assert_eq!(program.digests, 1);
    }

    /// A packet carries one digest: forwarding's learning digest for an
    /// unknown source replaced the one the overlay left before forwarding,
    /// which was lost. The overlay's stays; the host's next frame, with
    /// none, is learned.
    #[test]
    fn an_overlays_digest_before_forwarding_is_not_replaced_by_learning() {
        let host = (
            MacAddress([2, 0, 0, 0, 0, 1]),
            Ipv4Address::new(10, 0, 0, 1),
        );
        let forwarding =
            L2L3Forwarding::with_attached_hosts(MacAddress([2, 0x5e, 0, 0, 0, 0xfe]), &[host])
                .unwrap();
        let watcher = Watcher {
            digest_before: Some(77),
            ..Watcher::default()
        };
        let mut program = Overlaid::new(forwarding, watcher);
        let mut marked = packet(1, host.0);
        program.ingress(Timestamp::ZERO, &mut marked);
        assert_eq!(marked.digest.map(|digest| digest.kind), Some(77));
        program.overlay_mut().digest_before = None;
        let mut plain = packet(1, host.0);
        program.ingress(Timestamp::ZERO, &mut plain);
        assert_eq!(
            plain.digest.map(|digest| digest.kind),
            Some(crate::programs::l2l3::LEARN_DIGEST)
        );
    }
}
