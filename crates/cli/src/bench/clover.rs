//! `remora bench clover`: Clover with and without the resolver, in the
//! deterministic simulator (a 100 Gb/s rack link with 1 µs of propagation
//! each way; the soft RNICs' work is modelled as instantaneous), so the
//! figures are in simulated time: they count round trips, not this
//! machine's CPU. Every configuration runs on several seeds and reports
//! the median, each run measured after a warm-up ([`operations_of`]).
//!
//! - YCSB-A, zipf 0.75, 1024 keys, 1 to 64 clients: throughput and
//!   latency p50/p99, plain Clover against the resolver caching every key;
//! - a top-N sweep at 64 clients;
//! - YCSB-B and -C, zipf 0.99 and uniform keys, and 10k/100k keys;
//! - conflicts and hops per operation, and the resolver's memory.
//!
//! Then the headline configuration (YCSB-A, zipf 0.75, 64 clients) on the
//! embedded rack, in real time: a fabric thread running the switch and
//! both soft RNICs, an application thread running the clients and the
//! metadata server. Rounds alternate plain and resolver; the speedup is
//! taken within a round and the median over rounds reported, with CPU per
//! operation split into clients, metadata server and fabric (NIC
//! emulation and switch).

use super::report::{median, Report};
use indicatif::{ProgressBar, ProgressStyle};
use remora_clover::embedded;
use remora_clover::simulated::{run as simulate, Outcome, Run, SwitchChoice};
use remora_host::hardware::NicHardware;
use std::time::Duration;

struct Configuration {
    name: String,
    run: Run,
}

fn configuration(name: String, run: Run) -> Configuration {
    Configuration { name, run }
}

/// Operations each simulated run measures, and the ones it runs first
/// and leaves out. Clients start with empty location caches, and the
/// version lists and shortcuts take tens of thousands of operations to
/// settle: measured from the start, 4,000 operations (62 a client)
/// measured mostly first touches. The resolver's speedup at YCSB-A, zipf
/// 0.75, 64 clients, on simulated ConnectX-5s (three seeds, 20,000
/// operations measured after each warm-up; 2026-12-07): 1.25 with none,
/// 1.32 after 10,000, 1.32 after 20,000, 1.31 after 40,000 and 1.32
/// after 80,000; 1.31 over 300,000 operations from the start. The paper
/// measured a million requests, nearly all warm.
fn operations_of(quick: bool) -> (u64, u64) {
    match quick {
        true => (4_000, 10_000),
        false => (20_000, 40_000),
    }
}

fn plan(quick: bool) -> Vec<Configuration> {
    let (operations, warmup_operations) = operations_of(quick);
    let base = |switch| Run {
        operations,
        warmup_operations,
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
    // The client sweep and the top-N sweep again on simulated ConnectX-5
    // NICs (issue 20): side by side with the ideal NIC's.
    let on_hardware: Vec<Configuration> = plan
        .iter()
        .filter(|ideal| ideal.name.starts_with("ycsba_z075_c"))
        .map(|ideal| {
            configuration(
                format!("{}_{}", ideal.name, NicHardware::Cx5.name()),
                Run {
                    hardware: NicHardware::Cx5,
                    ..ideal.run
                },
            )
        })
        .collect();
    plan.extend(on_hardware);
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

/// Why the Clover benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum CloverBenchError {
    #[error(transparent)]
    Harness(#[from] remora_clover::harness::HarnessError),
    #[error(transparent)]
    History(#[from] crate::HistoryFileError),
    #[error("progress bar template: {0}")]
    Progress(#[from] indicatif::style::TemplateError),
    #[error("{0} was not measured")]
    NotMeasured(&'static str),
    #[error("validating the hardware profile: {0}")]
    Validation(#[from] remora_host::validation::ValidationError),
}

pub fn run(quick: bool, history: Option<&std::path::Path>) -> Result<Report, CloverBenchError> {
    let mut history = history.map(crate::HistoryFile::create).transpose()?;
    let seeds: u64 = if quick { 3 } else { 5 };
    let plan = plan(quick);
    let progress = ProgressBar::new(plan.len() as u64 * seeds);
    progress.set_style(ProgressStyle::with_template(
        "{bar:40} {pos}/{len} runs {msg}",
    )?);
    let mut report = Report::new(
        "clover",
        serde_json::json!({
            "quick": quick,
            "seeds": seeds,
            "clock": "simulated: 100 Gb/s links, 1 us propagation; RNIC work instantaneous (ideal), or charged as a ConnectX-5's (variants ending _cx5, crates/host/profiles/cx5.toml)",
            "hardware_profiles": NicHardware::ALL.map(|hardware| hardware.profile().description),
            "value_bytes": 16,
            "keys": 1024,
            "operations_per_run": plan[0].run.operations,
            "warmup_operations_per_run": plan[0].run.warmup_operations,
            "embedded_operations_per_round": embedded_run(SwitchChoice::Plain, quick).operations,
            "embedded_warmup_operations_per_round": embedded_run(SwitchChoice::Plain, quick).warmup_operations,
            "embedded_cpu_per_operation": "each thread's CPU clock over a whole round, divided by every operation it completed, its warm-up's too",
        }),
    );
    let mut measured = std::collections::HashMap::new();
    for configuration in &plan {
        progress.set_message(configuration.name.clone());
        let mut outcomes = Vec::new();
        for seed in 0..seeds {
            let run = Run {
                check_history: history.is_some(),
                ..configuration.run
            };
            let outcome = simulate(seed, &run)?;
            if let Some(file) = &mut history {
                file.write(&format!("{}/seed{seed}", configuration.name), &outcome)?;
            }
            outcomes.push(outcome);
            progress.inc(1);
        }
        progress.suspend(|| {
            let figures = figures(&outcomes);
            record(&mut report, &configuration.name, &figures);
            measured.insert(configuration.name.clone(), figures);
        });
    }
    progress.finish_and_clear();
    let get = |name: &'static str| {
        measured
            .get(name)
            .ok_or(CloverBenchError::NotMeasured(name))
    };
    let plain = get("ycsba_z075_c64_plain")?;
    let resolver = get("ycsba_z075_c64_resolver")?;
    let top8 = get("ycsba_z075_c64_top8")?;
    let plain_cx5 = get("ycsba_z075_c64_plain_cx5")?;
    let resolver_cx5 = get("ycsba_z075_c64_resolver_cx5")?;
    let top8_cx5 = get("ycsba_z075_c64_top8_cx5")?;
    let cx5_error = validate_hardware(NicHardware::Cx5, &mut report)?;
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
        (
            "resolver_speedup_ycsba_z075_c64_cx5",
            resolver_cx5.throughput / plain_cx5.throughput,
        ),
        (
            "top8_speedup_ycsba_z075_c64_cx5",
            top8_cx5.throughput / plain_cx5.throughput,
        ),
        ("cx5_profile_max_error", cx5_error),
    ];
    println!();
    for (name, value) in ratios {
        println!("{name:<40} {value:.3}");
        report.ratios.insert(name.into(), serde_json::json!(value));
    }
    println!();
    if let Some(file) = history {
        println!("{}\n", file.finish()?);
    }
    on_the_embedded_rack(quick, &mut report)?;
    Ok(report)
}

/// Checks a hardware profile against the published figures it cites,
/// recording each beside its published value (results
/// `NAME_validation/MEASURE`, and the whole check with its sources in
/// `series.NAME_validation`), and returns the largest relative error.
fn validate_hardware(hardware: NicHardware, report: &mut Report) -> Result<f64, CloverBenchError> {
    let checked = remora_host::validation::validate(&hardware.profile())?;
    let variant = format!("{}_validation", hardware.name());
    println!(
        "\n{} profile against its published figures:",
        hardware.name()
    );
    for check in &checked {
        println!(
            "  {:<32} simulated {:>8.3} published {:>8.3} {:<5} error {:>5.1}%",
            check.measure,
            check.simulated,
            check.published,
            check.unit,
            check.relative_error * 100.0
        );
        let row = format!("{variant}/{}", check.measure);
        report.add(&row, "simulated", check.simulated, &check.unit);
        report.add(&row, "published", check.published, &check.unit);
        let ratio = check.simulated / check.published;
        report.add(&row, "simulated_over_published", ratio, "ratio");
    }
    report.series.insert(variant, serde_json::json!(checked));
    Ok(remora_host::validation::max_relative_error(&checked))
}

/// The headline configuration on the embedded rack: real threads, real
/// time. Generous deadlines, since a thread of a shared machine can be
/// descheduled for milliseconds.
fn embedded_run(switch: SwitchChoice, quick: bool) -> Run {
    Run {
        operations: if quick { 20_000 } else { 100_000 },
        // As the simulated runs ([`operations_of`]).
        warmup_operations: if quick { 20_000 } else { 100_000 },
        grace: Duration::from_secs(8),
        region_bytes: 64 << 20,
        garbage_every: Some(Duration::from_millis(20)),
        ..Run::new(switch)
    }
}

/// One variant's figures from one round.
struct RealFigures {
    throughput: f64,
    p50_us: f64,
    p99_us: f64,
    conflicts_per_op: f64,
    clients_cpu_us_per_op: f64,
    polling_cpu_us_per_op: f64,
    metadata_cpu_us_per_op: f64,
    fabric_cpu_us_per_op: f64,
}

fn real_figures(outcome: &Outcome) -> Result<RealFigures, CloverBenchError> {
    let operations = outcome.operations() as f64;
    let cpu = outcome
        .cpu
        .ok_or(CloverBenchError::NotMeasured("the embedded rack's CPU"))?;
    // The threads' CPU clocks are read once, at the end: over every
    // operation the run completed, its warm-up's too.
    let operations_run = outcome.operations_run.max(1) as f64;
    let per_op = |cpu: Duration| cpu.as_secs_f64() * 1e6 / operations_run;
    Ok(RealFigures {
        throughput: outcome.operations_per_second(),
        p50_us: outcome.stats.latency.value_at_quantile(0.5) as f64 / 1e3,
        p99_us: outcome.stats.latency.value_at_quantile(0.99) as f64 / 1e3,
        conflicts_per_op: outcome.stats.conflicts as f64 / operations,
        clients_cpu_us_per_op: per_op(cpu.clients),
        polling_cpu_us_per_op: per_op(cpu.polling),
        metadata_cpu_us_per_op: per_op(cpu.metadata),
        fabric_cpu_us_per_op: per_op(cpu.fabric),
    })
}

fn record_real(report: &mut Report, name: &str, rounds: &[RealFigures]) {
    let take = |figure: &dyn Fn(&RealFigures) -> f64| {
        let mut values: Vec<f64> = rounds.iter().map(figure).collect();
        median(&mut values)
    };
    let figures = RealFigures {
        throughput: take(&|round| round.throughput),
        p50_us: take(&|round| round.p50_us),
        p99_us: take(&|round| round.p99_us),
        conflicts_per_op: take(&|round| round.conflicts_per_op),
        clients_cpu_us_per_op: take(&|round| round.clients_cpu_us_per_op),
        polling_cpu_us_per_op: take(&|round| round.polling_cpu_us_per_op),
        metadata_cpu_us_per_op: take(&|round| round.metadata_cpu_us_per_op),
        fabric_cpu_us_per_op: take(&|round| round.fabric_cpu_us_per_op),
    };
    report.add(name, "throughput", figures.throughput, "ops/s");
    report.add(name, "latency_p50", figures.p50_us, "us");
    report.add(name, "latency_p99", figures.p99_us, "us");
    report.add(
        name,
        "conflicts_per_op",
        figures.conflicts_per_op,
        "CAS retries",
    );
    let cpu = [
        ("clients_cpu_per_op", figures.clients_cpu_us_per_op),
        ("polling_cpu_per_op", figures.polling_cpu_us_per_op),
        ("metadata_cpu_per_op", figures.metadata_cpu_us_per_op),
        ("fabric_cpu_per_op", figures.fabric_cpu_us_per_op),
    ];
    for (metric, value) in cpu {
        report.add(name, metric, value, "us of CPU");
    }
    println!(
        "{name:<34} {:>11.0} ops/s  p50 {:>7.1} µs  p99 {:>8.1} µs  conflicts/op {:>5.2}  CPU/op: clients {:.2} µs, polling {:.2} µs, metadata {:.2} µs, fabric {:.2} µs",
        figures.throughput,
        figures.p50_us,
        figures.p99_us,
        figures.conflicts_per_op,
        figures.clients_cpu_us_per_op,
        figures.polling_cpu_us_per_op,
        figures.metadata_cpu_us_per_op,
        figures.fabric_cpu_us_per_op,
    );
}

fn on_the_embedded_rack(quick: bool, report: &mut Report) -> Result<(), CloverBenchError> {
    let rounds = if quick { 5 } else { 7 };
    let resolver_all = SwitchChoice::Resolver { cached_keys: 1024 };
    let progress = ProgressBar::new(rounds * 2);
    progress.set_style(ProgressStyle::with_template(
        "{bar:40} {pos}/{len} embedded-rack runs",
    )?);
    let (mut plain, mut resolver, mut speedups) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate which goes first, so drift on the host favours neither.
        let mut order = [SwitchChoice::Plain, resolver_all];
        if round % 2 == 1 {
            order.reverse();
        }
        for switch in order {
            let outcome = embedded::run(round, &embedded_run(switch, quick))?;
            let figures = real_figures(&outcome)?;
            match switch {
                SwitchChoice::Plain => plain.push(figures),
                SwitchChoice::Resolver { .. } => resolver.push(figures),
            }
            progress.inc(1);
        }
        let last = round as usize;
        speedups.push(resolver[last].throughput / plain[last].throughput);
    }
    progress.finish_and_clear();
    println!("on the embedded rack (real time, medians of {rounds} rounds):");
    record_real(report, "embedded_ycsba_z075_c64_plain", &plain);
    record_real(report, "embedded_ycsba_z075_c64_resolver", &resolver);
    let speedup = median(&mut speedups);
    println!(
        "{:<40} {speedup:.3}",
        "embedded_resolver_speedup_ycsba_z075_c64"
    );
    report.ratios.insert(
        "embedded_resolver_speedup_ycsba_z075_c64".into(),
        serde_json::json!(speedup),
    );
    Ok(())
}

#[derive(clap::Args)]
pub struct CloverArgs {
    #[command(flatten)]
    pub common: super::entry::CommonArgs,
    /// Record, check and write every simulated run's KV history to this
    /// file as JSON lines, one request each: {"history", "client", "op",
    /// "key", "value", "output", "call", "ret"} (times in simulated ns; no
    /// "ret" for a request that never returned), for an outside
    /// linearizability checker.
    #[arg(long)]
    pub history: Option<std::path::PathBuf>,
}

impl super::entry::BenchArgs for CloverArgs {
    fn common(&self) -> &super::entry::CommonArgs {
        &self.common
    }
}

/// `remora bench clover`.
pub static BENCH: super::entry::Entry<CloverArgs, CloverBenchError> = super::entry::Entry {
    name: "clover",
    about: "Clover with and without the in-network resolver, in the deterministic simulator.\n\nYCSB A/B/C, zipf 0.75/0.99 and uniform, 1 to 64 clients, a top-N cache sweep, conflicts and resolver memory; and on the embedded rack.",
    run: |args| {
        run(args.common.quick, args.history.as_deref())
    },
};
