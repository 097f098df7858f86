//! The setup the forwarding measurements share (`bench switch`, the
//! `forward_cost` and rack `forward_loop` examples, the `forwarding`
//! criterion benchmark): the L2/L3 program with hosts 1 and 2 on ports 0
//! and 1, and SENDs from host 1 to host 2.

use crate::programs::l2l3::L2L3Forwarding;
use crate::{PortId, Switch, SwitchConfig};
use remora_wire::frame::{emit_frame, FrameRepr, MAX_FRAME_LEN};
use remora_wire::{BthRepr, Ipv4Address, MacAddress, Opcode, Psn, Qpn};

/// The payload that makes an 82-byte frame.
pub const SMALL_PAYLOAD_BYTES: usize = 22;

/// Host `index`'s MAC address (hosts 1 and 2 are attached).
pub fn host_mac(index: u8) -> MacAddress {
    MacAddress([2, 0, 10, 0, 0, index])
}

/// Host `index`'s IPv4 address, 10.0.0.`index`.
pub fn host_address(index: u8) -> Ipv4Address {
    Ipv4Address::new(10, 0, 0, index)
}

/// The L2/L3 program with hosts 1 and 2 on ports 0 and 1.
pub fn two_host_switch() -> Switch<L2L3Forwarding> {
    let mut program = L2L3Forwarding::new(MacAddress([2, 0x5e, 0, 0, 0, 0xfe]), 16);
    for index in 1..=2u8 {
        let port = PortId(u16::from(index - 1));
        program
            .add_attached_host(host_mac(index), host_address(index), port)
            .expect("room for two hosts");
    }
    Switch::new(SwitchConfig::new(2), program)
}

/// A SEND of `payload_bytes` from host 1 to host 2 with PSN `sequence`.
pub fn send_frame(payload_bytes: usize, sequence: u32) -> Vec<u8> {
    let bth = BthRepr::new(
        Opcode::SendOnly,
        Qpn::new(0x100).expect("valid"),
        Psn::new(sequence),
    );
    let repr = FrameRepr::between(
        (host_mac(1), host_address(1)),
        (host_mac(2), host_address(2)),
        49152,
        bth,
    );
    let mut frame = vec![0u8; MAX_FRAME_LEN];
    let length = emit_frame(&repr, &vec![0x5a; payload_bytes], &mut frame).expect("the frame fits");
    frame.truncate(length);
    frame
}
