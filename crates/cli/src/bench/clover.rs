//! `remora bench clover`: Clover with and without the resolver, in the
//! deterministic simulator (a 100 Gb/s rack link with 1 µs of propagation
//! each way; the soft RNICs' work is modelled as instantaneous), so the
//! figures are in simulated time: they count round trips, not this
//! machine's CPU. Every configuration runs on several seeds and reports
//! the median.
//!
//! - YCSB-A, zipf 0.75, 1024 keys, 1 to 64 clients: throughput and
//!   latency p50/p99, plain Clover against the resolver caching every key;
//! - a top-N sweep at 64 clients;
//! - YCSB-B and -C, zipf 0.99 and uniform keys, and 10k/100k keys;
//! - conflicts and hops per operation, and the resolver's memory.

use super::{median, Host, Report};
use indicatif::{ProgressBar, ProgressStyle};
use remora_clover::simulated::{run as simulate, Outcome, Run, SwitchChoice};
use std::time::Duration;

struct Configuration {
    name: String,
    run: Run,
}

fn configuration(name: String, run: Run) -> Configuration {
    Configuration { name, run }
}

fn plan(quick: bool) -> Vec<Configuration> {
    let operations = if quick { 4_000 } else { 20_000 };
    let base = |switch| Run {
        operations,
        ..Run::new(switch)
    };
    let resolver_all = SwitchChoice::Resolver { cached_keys: 1024 };
    let mut plan = Vec::new();
    for clients in [1, 8, 16, 32, 64] {
        for (label, switch) in [("plain", SwitchChoice::Plain), ("resolver", resolver_all)] {
            plan.push(configuration(
                format!("ycsba_z075_c{clients}_{label}"),
                Run {
                    clients,
                    ..base(switch)
                },
            ));
        }
    }
    let mut cached = 1;
    while cached < 1024 {
        plan.push(configuration(
            format!("ycsba_z075_c64_top{cached}"),
            base(SwitchChoice::Resolver {
                cached_keys: cached,
            }),
        ));
        cached *= 2;
    }
    plan.push(configuration(
        "ycsba_z075_c64_top0".into(),
        base(SwitchChoice::Resolver { cached_keys: 0 }),
    ));
    for (label, switch) in [("plain", SwitchChoice::Plain), ("resolver", resolver_all)] {
        for (workload, reads) in [("ycsbb", 0.95), ("ycsbc", 1.0)] {
            plan.push(configuration(
                format!("{workload}_z075_c64_{label}"),
                Run {
                    read_proportion: reads,
                    ..base(switch)
                },
            ));
        }
        plan.push(configuration(
            format!("ycsba_z099_c64_{label}"),
            Run {
                zipf_theta: Some(0.99),
                ..base(switch)
            },
        ));
        plan.push(configuration(
            format!("ycsba_uniform_c64_{label}"),
            Run {
                zipf_theta: None,
                ..base(switch)
            },
        ));
    }
    let big_keys: &[u64] = if quick { &[10_000] } else { &[10_000, 100_000] };
    for keys in big_keys {
        for (label, cached) in [("plain", None), ("resolver", Some(*keys as usize))] {
            let switch = cached.map_or(SwitchChoice::Plain, |cached_keys| SwitchChoice::Resolver {
                cached_keys,
            });
            plan.push(configuration(
                format!("ycsba_z075_k{}_c64_{label}", keys / 1000 * 1000),
                Run {
                    keys: *keys,
                    region_bytes: 64 << 20,
                    // Collection walks every key: less often for more keys.
                    garbage_every: Some(Duration::from_millis(20)),
                    ..base(switch)
                },
            ));
        }
    }
    plan
}

/// Medians over seeds of one configuration.
struct Figures {
    throughput: f64,
    p50_us: f64,
    p99_us: f64,
    conflicts_per_op: f64,
    hops_per_op: f64,
    verbs_per_op: f64,
    resolver_bytes: Option<f64>,
    bytes_per_key: Option<f64>,
}

fn figures(outcomes: &[Outcome]) -> Figures {
    let take = |figure: &dyn Fn(&Outcome) -> f64| {
        let mut values: Vec<f64> = outcomes.iter().map(figure).collect();
        median(&mut values)
    };
    let operations = |outcome: &Outcome| (outcome.stats.reads + outcome.stats.writes) as f64;
    let memory = outcomes[0].resolver_memory;
    Figures {
        throughput: take(&|outcome| outcome.operations_per_second()),
        p50_us: take(&|outcome| outcome.stats.latency.value_at_quantile(0.5) as f64 / 1e3),
        p99_us: take(&|outcome| outcome.stats.latency.value_at_quantile(0.99) as f64 / 1e3),
        conflicts_per_op: take(&|outcome| outcome.stats.conflicts as f64 / operations(outcome)),
        hops_per_op: take(&|outcome| outcome.stats.hops as f64 / operations(outcome)),
        verbs_per_op: take(&|outcome| outcome.stats.verbs as f64 / operations(outcome)),
        resolver_bytes: memory.map(|memory| memory.total_bytes as f64),
        bytes_per_key: memory.map(|memory| memory.bytes_per_key as f64),
    }
}

fn record(report: &mut Report, name: &str, figures: &Figures) {
    report.add(name, "throughput", figures.throughput, "ops/s (simulated)");
    report.add(name, "latency_p50", figures.p50_us, "us (simulated)");
    report.add(name, "latency_p99", figures.p99_us, "us (simulated)");
    report.add(
        name,
        "conflicts_per_op",
        figures.conflicts_per_op,
        "CAS retries",
    );
    report.add(name, "hops_per_op", figures.hops_per_op, "entry READs");
    report.add(name, "verbs_per_op", figures.verbs_per_op, "verbs");
    if let Some(bytes) = figures.resolver_bytes {
        report.add(name, "resolver_memory", bytes, "bytes");
    }
    if let Some(bytes) = figures.bytes_per_key {
        report.add(name, "resolver_bytes_per_key", bytes, "bytes");
    }
    println!(
        "{name:<34} {:>11.0} ops/s  p50 {:>7.1} µs  p99 {:>8.1} µs  conflicts/op {:>5.2}  hops/op {:>5.2}{}",
        figures.throughput,
        figures.p50_us,
        figures.p99_us,
        figures.conflicts_per_op,
        figures.hops_per_op,
        figures
            .resolver_bytes
            .map_or(String::new(), |bytes| format!("  resolver {bytes:.0} B")),
    );
}

pub fn run(quick: bool) -> Result<Report, String> {
    let seeds: u64 = if quick { 3 } else { 5 };
    let plan = plan(quick);
    let progress = ProgressBar::new(plan.len() as u64 * seeds);
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} runs {msg}")
            .map_err(|error| error.to_string())?,
    );
    let mut report = Report {
        bench: "clover".into(),
        config: serde_json::json!({
            "quick": quick,
            "seeds": seeds,
            "clock": "simulated: 100 Gb/s links, 1 us propagation, RNIC work instantaneous",
            "value_bytes": 16,
            "keys": 1024,
            "operations_per_run": plan[0].run.operations,
        }),
        host: Host::probe(),
        results: Vec::new(),
        ratios: serde_json::Map::new(),
    };
    let mut measured = std::collections::HashMap::new();
    for configuration in &plan {
        progress.set_message(configuration.name.clone());
        let mut outcomes = Vec::new();
        for seed in 0..seeds {
            outcomes.push(simulate(seed, &configuration.run)?);
            progress.inc(1);
        }
        progress.suspend(|| {
            let figures = figures(&outcomes);
            record(&mut report, &configuration.name, &figures);
            measured.insert(configuration.name.clone(), figures);
        });
    }
    progress.finish_and_clear();
    let get = |name: &str| measured.get(name).ok_or(format!("{name} was not measured"));
    let plain = get("ycsba_z075_c64_plain")?;
    let resolver = get("ycsba_z075_c64_resolver")?;
    let top8 = get("ycsba_z075_c64_top8")?;
    let ratios = [
        (
            "resolver_speedup_ycsba_z075_c64",
            resolver.throughput / plain.throughput,
        ),
        (
            "top8_speedup_ycsba_z075_c64",
            top8.throughput / plain.throughput,
        ),
        (
            "resolver_p99_ratio_ycsba_z075_c64",
            resolver.p99_us / plain.p99_us,
        ),
    ];
    println!();
    for (name, value) in ratios {
        println!("{name:<40} {value:.3}");
        report.ratios.insert(name.into(), serde_json::json!(value));
    }
    Ok(report)
}
