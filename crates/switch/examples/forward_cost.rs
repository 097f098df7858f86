//! Nanoseconds per frame through the L2/L3 program with no carrier: the
//! pipeline's own cost, for A/B work on the switch's hot path. Prints the
//! best of seven runs.
//!
//! `cargo run --release -p remora-switch --example forward_cost [FRAMES]`
//! (two million frames a run unless given: fewer for callgrind).

use remora_switch::two_hosts;

use remora_base::Timestamp;
use remora_switch::{Emitted, PortId};
use std::time::Instant;

fn main() {
    let mut switch = two_hosts::two_host_switch();
    let frame = two_hosts::send_frame(two_hosts::SMALL_PAYLOAD_BYTES, 1);
    let length = frame.len();
    let frames: u64 = match std::env::args().nth(1) {
        Some(text) => text.parse().expect("FRAMES is a number"),
        None => 2_000_000,
    };
    let mut sink = 0usize;
    // Whole bursts of 32 through the queues.
    let queued_frames = frames / 32 * 32;
    let queued = best_of_seven(|| {
        for _ in 0..queued_frames / 32 {
            for _ in 0..32 {
                switch.handle_frame(Timestamp::ZERO, PortId(0), &frame);
            }
            while switch.poll_transmit_port(PortId(1), &mut |bytes| {
                sink += bytes.len();
                Emitted::Sent
            }) {}
        }
    }) / queued_frames as f64;
    let cut_through = best_of_seven(|| {
        for _ in 0..frames {
            switch.handle_frame_with(Timestamp::ZERO, PortId(0), &frame, &mut |_, bytes| {
                sink += bytes.len();
                Emitted::Sent
            });
        }
    }) / frames as f64;
    // Seven runs of each.
    assert_eq!(
        sink as u64,
        7 * (queued_frames + frames) * length as u64,
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
