//! Nanoseconds per frame through the L2/L3 program with no carrier: the
//! pipeline's own cost, for A/B work on the switch's hot path. Prints the
//! best of seven runs.
//!
//! `cargo run --release -p remora-switch --example forward_cost [FRAMES]`
//! (two million frames a run unless given: fewer for callgrind).

use remora_base::Timestamp;
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::{PortId, Switch, SwitchConfig};
use remora_wire::frame::{emit_frame, FrameRepr, MAX_FRAME_LEN};
use remora_wire::{BthRepr, Ipv4Address, MacAddress, Opcode, Psn, Qpn};
use std::time::Instant;

fn main() {
    let mac = |index: u8| MacAddress([2, 0, 10, 0, 0, index]);
    let mut program = L2L3Forwarding::new(MacAddress([2, 0x5e, 0, 0, 0, 0xfe]), 16);
    for index in 1..=2u8 {
        let port = PortId(u16::from(index - 1));
        program
            .add_attached_host(mac(index), Ipv4Address::new(10, 0, 0, index), port)
            .unwrap();
    }
    let mut switch = Switch::new(SwitchConfig::new(2), program);
    let bth = BthRepr::new(Opcode::SendOnly, Qpn::new(0x100).unwrap(), Psn::new(1));
    let repr = FrameRepr::between(
        (mac(1), Ipv4Address::new(10, 0, 0, 1)),
        (mac(2), Ipv4Address::new(10, 0, 0, 2)),
        49152,
        bth,
    );
    let mut frame = vec![0u8; MAX_FRAME_LEN];
    let length = emit_frame(&repr, &[0x5a; 22], &mut frame).unwrap();
    frame.truncate(length);
    let frames: u64 = match std::env::args().nth(1) {
        Some(text) => text.parse().expect("FRAMES is a number"),
        None => 2_000_000,
    };
    let mut sink = 0usize;
    let queued = best_of_seven(|| {
        for _ in 0..frames / 32 {
            for _ in 0..32 {
                switch.handle_frame(Timestamp::ZERO, PortId(0), &frame);
            }
            while switch.poll_transmit_port(PortId(1), &mut |bytes| sink += bytes.len()) {}
        }
    }) / frames as f64;
    let cut_through = best_of_seven(|| {
        for _ in 0..frames {
            switch.handle_frame_with(Timestamp::ZERO, PortId(0), &frame, &mut |_, bytes| {
                sink += bytes.len();
                true
            });
        }
    }) / frames as f64;
    assert_eq!(
        sink as u64,
        14 * frames * length as u64,
        "every frame came out"
    );
    println!("{length}-byte frames through the L2/L3 program, best of 7:");
    println!("  via egress queues  {queued:.1} ns per frame");
    println!("  cut-through        {cut_through:.1} ns per frame");
}

fn best_of_seven(mut run: impl FnMut()) -> f64 {
    (0..7)
        .map(|_| {
            let started = Instant::now();
            run();
            started.elapsed().as_nanos() as f64
        })
        .fold(f64::MAX, f64::min)
}
