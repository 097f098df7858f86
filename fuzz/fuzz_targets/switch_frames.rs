//! Arbitrary frames into the switch running the L2/L3 program, on any
//! port, bridged or routed: the switch must never panic, and whatever it
//! forwards is the frame it got (bridged) or the same length (routed).
#![no_main]

use libfuzzer_sys::fuzz_target;
use remora_rnic::Timestamp;
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::{PortId, Switch, SwitchConfig};
use remora_wire::frame::MAX_FRAME_LEN;
use remora_wire::{Ipv4Address, MacAddress};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, frame)) = data.split_first() else {
        return;
    };
    let mut program = L2L3Forwarding::new(MacAddress([2, 0x5e, 0, 0, 0, 0xfe]), 8);
    for index in 0..3u8 {
        let mac = MacAddress([2, 0, 10, 0, 0, index + 1]);
        program.add_attached_host(mac, Ipv4Address::new(10, 0, 0, index + 1), PortId(u16::from(index))).unwrap();
    }
    program.set_flood_unknown(selector & 0x80 != 0);
    let mut switch = Switch::new(SwitchConfig::new(3), program);
    switch.handle_frame(Timestamp::ZERO, PortId(u16::from(selector % 4)), frame);
    while let Some(digest) = switch.poll_digest() {
        let _ = switch.program_mut().learn(&digest);
    }
    let routed = frame.len() >= 6 && frame[0..6] == [2, 0x5e, 0, 0, 0, 0xfe];
    let mut buffer = vec![0u8; MAX_FRAME_LEN.max(frame.len())];
    while let Some((port, length)) = switch.poll_transmit(Timestamp::ZERO, &mut buffer) {
        assert!(port.0 < 3);
        assert_eq!(length, frame.len());
        if routed {
            // Routing rewrites the MACs and the IPv4 TTL and checksum only.
            let ip_end = 14 + usize::from(frame[14] & 0x0f) * 4;
            assert_eq!(&buffer[ip_end..length], &frame[ip_end..]);
        } else {
            assert_eq!(&buffer[..length], frame, "bridging never changes a frame");
        }
    }
});
