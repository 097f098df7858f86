//! The setup the forwarding measurements share (the `forward_cost` example
//! and the `forwarding` benchmark): the L2/L3 program with hosts 1 and 2
//! on ports 0 and 1, and an 82-byte SEND from host 1 to host 2.

use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::{PortId, Switch, SwitchConfig};
use remora_wire::frame::{emit_frame, FrameRepr, MAX_FRAME_LEN};
use remora_wire::{BthRepr, Ipv4Address, MacAddress, Opcode, Psn, Qpn};

fn mac(index: u8) -> MacAddress {
    MacAddress([2, 0, 10, 0, 0, index])
}

/// The L2/L3 program with hosts 1 and 2 on ports 0 and 1.
pub fn two_host_switch() -> Switch<L2L3Forwarding> {
    let mut program = L2L3Forwarding::new(MacAddress([2, 0x5e, 0, 0, 0, 0xfe]), 16);
    for index in 1..=2u8 {
        let port = PortId(u16::from(index - 1));
        program
            .add_attached_host(mac(index), Ipv4Address::new(10, 0, 0, index), port)
            .expect("room for two hosts");
    }
    Switch::new(SwitchConfig::new(2), program)
}

/// A SEND of 22 bytes from host 1 to host 2 (an 82-byte frame).
pub fn send_frame() -> Vec<u8> {
    let bth = BthRepr::new(
        Opcode::SendOnly,
        Qpn::new(0x100).expect("valid"),
        Psn::new(1),
    );
    let repr = FrameRepr::between(
        (mac(1), Ipv4Address::new(10, 0, 0, 1)),
        (mac(2), Ipv4Address::new(10, 0, 0, 2)),
        49152,
        bth,
    );
    let mut frame = vec![0u8; MAX_FRAME_LEN];
    let length = emit_frame(&repr, &[0x5a; 22], &mut frame).expect("the frame fits");
    frame.truncate(length);
    frame
}
