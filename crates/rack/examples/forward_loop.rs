//! The switch's forwarding loop as `remora bench switch` measures it: 82-byte
//! frames from a source ring, through the L2/L3 switch on its own rings, to
//! a sink ring, all on this thread (the bench reaches the source and sink
//! through `dyn Port`, this loop directly). For `perf record` (README,
//! "Profiling"): `cargo run --release -p remora-rack --example forward_loop
//! -- SECONDS`.

use remora_carrier::{Port, Segment, SegmentPlan};
use remora_rack::endpoint::{Pump, RackClock, SwitchEndpoint};
use remora_switch::two_hosts;
use std::time::{Duration, Instant};

const BATCH_FRAMES: usize = 32;
const RING_DEPTH: u32 = 1024;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seconds: u64 = match std::env::args().nth(1) {
        Some(text) => text.parse()?,
        None => 5,
    };
    let plan = SegmentPlan::star_one_waiter(2, RING_DEPTH);
    let segment = Segment::anonymous(&plan)?;
    let mut source = segment.spoke_port(1)?;
    let mut sink = segment.spoke_port(2)?;
    let switch_ports: Vec<Box<dyn Port>> = vec![
        Box::new(segment.hub_port(1)?),
        Box::new(segment.hub_port(2)?),
    ];
    let mut switch = SwitchEndpoint::new(two_hosts::two_host_switch(), switch_ports);
    let frames: Vec<Vec<u8>> = (0..64)
        .map(|sequence| two_hosts::send_frame(two_hosts::SMALL_PAYLOAD_BYTES, sequence))
        .collect();
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
    let lost = switch.switch.counters().dropped_queue_full;
    if lost > 0 || delivered == 0 {
        return Err(format!("{delivered} frames delivered, {lost} lost at full queues").into());
    }
    let elapsed = started.elapsed().as_nanos() as f64;
    println!(
        "{delivered} frames forwarded: {:.1} ns each",
        elapsed / delivered as f64
    );
    Ok(())
}
