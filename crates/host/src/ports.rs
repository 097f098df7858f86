//! A host's ports: its uplink to the switch, and for a host with an
//! offload host beside it (or for that offload host), a local link to the
//! other, which frames between the two take without crossing the switch.

use remora_base::PortId;
use remora_wire::MacAddress;

/// The port every host's uplink to the switch is on.
pub const UPLINK_PORT: PortId = PortId(0);
/// The port of the local link between a host and the offload host beside
/// it (PCIe between a host and its DPU).
pub const LOCAL_PORT: PortId = PortId(1);

/// Which port a host's frames leave by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ports {
    /// The MAC at the far end of the local link, if the host has one.
    local_peer: Option<MacAddress>,
}

impl Ports {
    /// A host with an uplink only.
    pub const UPLINK_ONLY: Ports = Ports { local_peer: None };

    /// A host whose local link reaches `peer`.
    pub fn with_local_peer(peer: MacAddress) -> Ports {
        Ports {
            local_peer: Some(peer),
        }
    }

    pub fn local_peer(&self) -> Option<MacAddress> {
        self.local_peer
    }

    /// The port `frame` leaves by: the local link when it is addressed to
    /// the local peer's MAC, else the uplink (a runt, which no NIC
    /// emits, goes up too, where the switch counts it).
    pub fn port_for(&self, frame: &[u8]) -> PortId {
        match (self.local_peer, frame.get(..6)) {
            (Some(peer), Some(destination)) if destination == peer.0 => LOCAL_PORT,
            _ => UPLINK_PORT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_to_the_local_peer_take_the_local_link_and_the_rest_go_up() {
        let peer = MacAddress([2, 0, 10, 0, 0, 3]);
        let ports = Ports::with_local_peer(peer);
        let mut frame = [0u8; 64];
        frame[..6].copy_from_slice(&peer.0);
        assert_eq!(ports.port_for(&frame), LOCAL_PORT);
        frame[5] = 4;
        assert_eq!(ports.port_for(&frame), UPLINK_PORT);
        assert_eq!(ports.port_for(&frame[..3]), UPLINK_PORT);
        frame[5] = 3;
        assert_eq!(Ports::UPLINK_ONLY.port_for(&frame), UPLINK_PORT);
    }
}
