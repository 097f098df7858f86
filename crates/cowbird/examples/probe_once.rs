//! Every variant of the hash-table probe once, or only the one named, for
//! profiling:
//! `cargo run --release -p remora-cowbird --example probe_once -- [work_ns] [seconds] [variant]`.

use remora_cowbird::embedded::{run_variant, ProbeBench, Variant};
use remora_cowbird::hash_table::TableSpec;
use std::time::Duration;

fn main() -> Result<(), String> {
    let words: Vec<String> = std::env::args().skip(1).collect();
    let only = words.get(2).cloned();
    let arguments: Vec<u64> = words
        .iter()
        .take(2)
        .map(|text| text.parse().map_err(|_| format!("not a number: {text}")))
        .collect::<Result<_, _>>()?;
    let work = Duration::from_nanos(arguments.first().copied().unwrap_or(0));
    let seconds = arguments.get(1).copied().unwrap_or(1);
    let table = TableSpec {
        work_per_record: work,
        ..TableSpec::DEFAULT
    };
    let bench = ProbeBench::new(table, Duration::from_secs(seconds));
    let variants = Variant::ALL
        .into_iter()
        .filter(|variant| only.as_deref().is_none_or(|name| name == variant.name()));
    for variant in variants {
        let outcome = run_variant(&bench, variant, 1).map_err(|error| error.to_string())?;
        println!(
            "{:<6} {:>10.0} ops/s  app {:>7.0} ns/remote op (issue {:?}, completion {:?})  comm ratio {:.2}  p50 {} µs p99 {} µs  fabric {:?} engine {:?}  {:.0} B/op",
            variant.name(),
            outcome.operations_per_second(),
            outcome.app_ns_per_remote(),
            outcome.issue,
            outcome.completion,
            outcome.communication_ratio(),
            outcome.latency.value_at_quantile(0.5) / 1000,
            outcome.latency.value_at_quantile(0.99) / 1000,
            outcome.fabric_cpu,
            outcome.engine,
            outcome.network_bytes as f64 / outcome.remote_operations.max(1) as f64,
        );
        let counters = &outcome.memory_rnic;
        println!(
            "       memory NIC: {} frames out, {} retransmitted, {} timeouts, {} sequence NAKs received, engine {:?}",
            counters.frames_transmitted,
            counters.packets_retransmitted,
            counters.retransmit_timeouts,
            counters.sequence_naks_received,
            outcome.engine_stats,
        );
    }
    Ok(())
}
