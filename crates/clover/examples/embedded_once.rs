//! One Clover run on the embedded rack, for profiling:
//! `cargo run --release -p remora-clover --example embedded_once -- [plain|resolver] [operations]`.

use remora_clover::embedded;
use remora_clover::harness::{Run, SwitchChoice};
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let switch = match arguments.first().map(String::as_str) {
        None | Some("resolver") => SwitchChoice::Resolver { cached_keys: 1024 },
        Some("plain") => SwitchChoice::Plain,
        Some(other) => return Err(format!("unknown switch {other}: plain or resolver").into()),
    };
    let operations = match arguments.get(1) {
        Some(text) => text
            .parse()
            .map_err(|_| format!("bad operation count {text}"))?,
        None => 20_000,
    };
    let run = Run {
        operations,
        grace: Duration::from_secs(8),
        region_bytes: 64 << 20,
        garbage_every: Some(Duration::from_millis(20)),
        ..Run::new(switch)
    };
    let outcome = embedded::run(1, &run)?;
    println!(
        "{:.0} ops/s, p50 {} µs, p99 {} µs, conflicts/op {:.2}, cpu {:?}, metadata {:?}",
        outcome.operations_per_second(),
        outcome.stats.latency.value_at_quantile(0.5) / 1000,
        outcome.stats.latency.value_at_quantile(0.99) / 1000,
        outcome.stats.conflicts as f64 / outcome.operations() as f64,
        outcome.cpu,
        outcome.metadata,
    );
    for (name, counters) in [
        ("compute", &outcome.compute_rnic),
        ("memory", &outcome.memory_rnic),
    ] {
        println!(
            "{name}: {} frames out, {} retransmitted, {} timeouts, {} sequence NAKs sent, drops {:?}",
            counters.frames_transmitted,
            counters.packets_retransmitted,
            counters.retransmit_timeouts,
            counters.sequence_naks_sent,
            counters.drops,
        );
    }
    Ok(())
}
