//! The switch's forwarding loop as `remora bench switch` measures it: 82-byte
//! frames from a source ring, through the L2/L3 switch on its own rings, to
//! a sink ring, all on this thread. For `perf record` (README,
//! "Profiling"): `cargo run --release -p remora-rack --example forward_loop
//! -- SECONDS`.

use remora_carrier::{Port, Segment, SegmentPlan};
use remora_rack::endpoint::{Pump, RackClock, SwitchEndpoint};
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::{PortId, Switch, SwitchConfig};
use remora_wire::frame::{emit_frame, FrameRepr, MAX_FRAME_LEN};
use remora_wire::{BthRepr, Ipv4Address, MacAddress, Opcode, Psn, Qpn};
use std::time::{Duration, Instant};

const BATCH_FRAMES: usize = 32;
const RING_DEPTH: u32 = 1024;

fn mac(index: u8) -> MacAddress {
    MacAddress([0x02, 0, 10, 0, 0, index])
}

fn address(index: u8) -> Ipv4Address {
    Ipv4Address::new(10, 0, 0, index)
}

fn frame(sequence: u32) -> Vec<u8> {
    let bth = BthRepr::new(
        Opcode::SendOnly,
        Qpn::new(0x100).expect("valid QPN"),
        Psn::new(sequence),
    );
    let repr = FrameRepr::between((mac(1), address(1)), (mac(2), address(2)), 49152, bth);
    let mut buffer = vec![0u8; MAX_FRAME_LEN];
    let length = emit_frame(&repr, &[0x5a; 22], &mut buffer).expect("the frame fits");
    buffer.truncate(length);
    buffer
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seconds: u64 = match std::env::args().nth(1) {
        Some(text) => text.parse()?,
        None => 5,
    };
    let mut program = L2L3Forwarding::new(MacAddress([0x02, 0x5e, 0, 0, 0, 0xfe]), 16);
    for index in 1..=2u8 {
        program.add_attached_host(mac(index), address(index), PortId(u16::from(index - 1)))?;
    }
    let plan = SegmentPlan::star_one_waiter(2, RING_DEPTH);
    let segment = Segment::anonymous(&plan)?;
    let mut source = segment.spoke_port(1)?;
    let mut sink = segment.spoke_port(2)?;
    let switch_ports: Vec<Box<dyn Port>> = vec![
        Box::new(segment.hub_port(1)?),
        Box::new(segment.hub_port(2)?),
    ];
    let mut switch = SwitchEndpoint::new(Switch::new(SwitchConfig::new(2), program), switch_ports);
    let frames: Vec<Vec<u8>> = (0..64).map(frame).collect();
    let clock = RackClock::new();
    let started = Instant::now();
    let mut delivered = 0u64;
    let mut next = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        for _ in 0..BATCH_FRAMES {
            source.send(&frames[next % frames.len()])?;
            next += 1;
        }
        source.flush()?;
        switch.pump(&clock)?;
        delivered += sink.receive(BATCH_FRAMES * 2, &mut |_| {})? as u64;
    }
    let elapsed = started.elapsed().as_nanos() as f64;
    println!(
        "{delivered} frames forwarded: {:.1} ns each",
        elapsed / delivered as f64
    );
    Ok(())
}
