//! `remora bench cowbird`: the hash-table probe microbenchmark (the
//! paper's Figures 1, 8, 10 and 13) on the embedded rack, with the
//! application thread on one core and the fabric thread (switch, both
//! soft RNICs and the Spot engine, the memory node's spare CPU) on the
//! other.
//!
//! Variants: all-local, synchronous and batched asynchronous one-sided
//! READs, two-sided RPC (the memory node's CPU answers), Cowbird-Spot
//! batched and one at a time, and Cowbird-P4 (the engine in the switch,
//! its CPU inside the fabric thread's). Two cases, 64 B records, 95% remote: a pure probe (no work per record)
//! and a compute-bound probe (about 1 µs of real work per record). Every
//! variant runs in every round, back to back; ratios are taken within a
//! round and the median over rounds is reported.

use super::report::{median, Report};
use indicatif::{ProgressBar, ProgressStyle};
use remora_cowbird::embedded::{
    embedded_p4_config, from_rack, run_variant, ProbeBench, Variant, VariantOutcome,
};
use remora_cowbird::hash_table::TableSpec;
use remora_cowbird::layout::RingSizes;
use remora_cowbird::p4::P4Config;
use remora_cowbird::spot::SpotConfig;
use remora_host::hardware::NicHardware;
use remora_rack::RackConfig;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// A benchmark case: its name, work per record and record size.
struct Case {
    name: &'static str,
    work: Duration,
    record_bytes: usize,
}

/// The headline cases, then (in a full run) the pure probe at the other
/// record sizes of Figure 8.
fn cases(quick: bool) -> Vec<Case> {
    let mut cases = vec![
        Case {
            name: "probe",
            work: Duration::ZERO,
            record_bytes: 64,
        },
        Case {
            name: "compute_bound",
            work: Duration::from_nanos(1000),
            record_bytes: 64,
        },
    ];
    if !quick {
        for (name, record_bytes) in [("probe_8B", 8), ("probe_256B", 256), ("probe_512B", 512)] {
            cases.push(Case {
                name,
                work: Duration::ZERO,
                record_bytes,
            });
        }
    }
    cases
}

/// One variant's figures in one round.
#[derive(Clone, Copy)]
struct Figures {
    throughput: f64,
    vs_local: f64,
    app_ns_per_op: f64,
    issue_ns_per_op: f64,
    completion_ns_per_op: f64,
    communication_ratio: f64,
    p50_us: f64,
    p99_us: f64,
    bytes_per_op: f64,
    fabric_ns_per_op: f64,
    engine_ns_per_op: f64,
}

fn figures(outcome: &VariantOutcome, local_throughput: f64) -> Figures {
    let operations = outcome.operations.max(1) as f64;
    let remote = outcome.remote_operations.max(1) as f64;
    let per_remote = |duration: Duration| duration.as_nanos() as f64 / remote;
    Figures {
        throughput: outcome.operations_per_second(),
        vs_local: outcome.operations_per_second() / local_throughput,
        app_ns_per_op: outcome.app_ns_per_remote(),
        issue_ns_per_op: per_remote(outcome.issue),
        completion_ns_per_op: per_remote(outcome.completion),
        communication_ratio: outcome.communication_ratio(),
        p50_us: outcome.latency.value_at_quantile(0.5) as f64 / 1e3,
        p99_us: outcome.latency.value_at_quantile(0.99) as f64 / 1e3,
        bytes_per_op: outcome.network_bytes as f64 / remote,
        fabric_ns_per_op: outcome.fabric_cpu.as_nanos() as f64 / operations,
        engine_ns_per_op: outcome.engine.as_nanos() as f64 / operations,
    }
}

type Rounds = BTreeMap<String, Vec<Figures>>;

fn record(report: &mut Report, name: &str, variant: Variant, rounds: &[Figures]) {
    let take = |figure: &dyn Fn(&Figures) -> f64| {
        let mut values: Vec<f64> = rounds.iter().map(figure).collect();
        median(&mut values)
    };
    let mut rows = vec![
        ("throughput", take(&|f| f.throughput), "ops/s"),
        ("throughput_vs_local", take(&|f| f.vs_local), "ratio"),
    ];
    if variant != Variant::Local {
        rows.extend([
            ("app_time_per_remote_op", take(&|f| f.app_ns_per_op), "ns"),
            (
                "issue_time_per_remote_op",
                take(&|f| f.issue_ns_per_op),
                "ns",
            ),
            (
                "completion_time_per_remote_op",
                take(&|f| f.completion_ns_per_op),
                "ns",
            ),
            (
                "communication_ratio",
                take(&|f| f.communication_ratio),
                "ratio",
            ),
            ("latency_p50", take(&|f| f.p50_us), "us"),
            ("latency_p99", take(&|f| f.p99_us), "us"),
            (
                "network_bytes_per_remote_op",
                take(&|f| f.bytes_per_op),
                "bytes",
            ),
            ("fabric_cpu_per_op", take(&|f| f.fabric_ns_per_op), "ns"),
        ]);
    }
    // The memory node's CPU beside its NIC: the Spot engine, or the RPC
    // server for the two-sided variant.
    if matches!(variant, Variant::Spot | Variant::SpotSync | Variant::Rpc) {
        rows.push(("engine_cpu_per_op", take(&|f| f.engine_ns_per_op), "ns"));
    }
    for (metric, value, unit) in &rows {
        report.add(name, metric, *value, unit);
    }
    let get = |metric: &str| {
        rows.iter()
            .find(|(name, _, _)| *name == metric)
            .map_or(String::from("-"), |(_, value, _)| format!("{value:.0}"))
    };
    println!(
        "{name:<28} {:>10} ops/s  x local {:>5.2}  app {:>6} ns/op  p50 {:>6} µs  p99 {:>6} µs  fabric {:>6} ns/op  engine {:>5} ns/op  {:>4} B/op",
        get("throughput"),
        take(&|f| f.vs_local),
        get("app_time_per_remote_op"),
        get("latency_p50"),
        get("latency_p99"),
        get("fabric_cpu_per_op"),
        get("engine_cpu_per_op"),
        get("network_bytes_per_remote_op"),
    );
}

/// What `--threads` and `--config` change.
pub struct Settings {
    pub threads: usize,
    pub sizes: RingSizes,
    pub spot: SpotConfig,
    pub p4: P4Config,
    pub config_file: Option<String>,
}

impl Settings {
    pub fn from_args(
        threads: Option<u16>,
        config: Option<&Path>,
    ) -> Result<Settings, CowbirdBenchError> {
        let mut settings = Settings {
            threads: 1,
            sizes: RingSizes::DEFAULT,
            spot: SpotConfig::DEFAULT,
            p4: embedded_p4_config(),
            config_file: None,
        };
        if let Some(path) = config {
            let mut rack = RackConfig::load(path)?;
            // The section is checked with the threads it will run: some
            // of its checks depend on them (the engine's queue), and an
            // override applied after passed them, for deploy to fail.
            let section = rack.systems.get_mut(remora_cowbird::config::SECTION);
            if let (Some(threads), Some(table)) = (threads, section) {
                table.insert("threads".into(), toml::Value::Integer(threads.into()));
            }
            let (workload, _) = from_rack(&rack)
                .map_err(|error| CowbirdBenchError::Section {
                    path: path.to_path_buf(),
                    error,
                })?
                .ok_or_else(|| CowbirdBenchError::NoSection(path.to_path_buf()))?;
            settings.threads = workload.threads;
            settings.sizes = workload.sizes;
            settings.spot = workload.spot;
            settings.p4 = workload.p4;
            settings.config_file = Some(path.display().to_string());
        }
        if let Some(threads) = threads {
            settings.threads = usize::from(threads);
        }
        Ok(settings)
    }
}

/// Why the Cowbird benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum CowbirdBenchError {
    #[error(transparent)]
    RackFile(#[from] remora_rack::RackError),
    #[error("{}: {error}", path.display())]
    Section {
        path: std::path::PathBuf,
        error: remora_cowbird::config::CowbirdConfigError,
    },
    #[error("{} has no [cowbird] section", .0.display())]
    NoSection(std::path::PathBuf),
    #[error(transparent)]
    Run(#[from] remora_cowbird::embedded::EmbeddedError),
    #[error("progress bar template: {0}")]
    Progress(#[from] indicatif::style::TemplateError),
    #[error("the simulated runs: {0}")]
    Simulated(#[from] remora_cowbird::simulated::RunError),
}

/// Cowbird's checked mixed workload in the simulator, on ideal and on
/// ConnectX-5 NICs side by side, both engines (issue 20). Rates are
/// requests per second of simulated time, medians over seeds.
fn simulated_runs(quick: bool, report: &mut Report) -> Result<(), CowbirdBenchError> {
    use remora_cowbird::simulated::{run, Engine, Workload};
    let seeds: u64 = if quick { 3 } else { 5 };
    // The simulated stage reports elapsed time in steps of 100 µs: runs
    // of several milliseconds keep that under a few percent.
    let operations_per_thread = if quick { 3_000 } else { 10_000 };
    println!("\nin the simulator (simulated time, medians of {seeds} seeds):");
    for hardware in NicHardware::ALL {
        let mut rates = BTreeMap::new();
        for (name, engine) in [("spot", Engine::Spot), ("p4", Engine::P4)] {
            let workload = Workload {
                engine,
                hardware,
                operations_per_thread,
                ..Workload::new(remora_sim::LinkFaults::NONE)
            };
            let mut per_seed = Vec::new();
            for seed in 0..seeds {
                let outcome = run(seed, &workload)?;
                per_seed.push(outcome.completed as f64 / outcome.elapsed.as_secs_f64());
            }
            let rate = median(&mut per_seed);
            let variant = format!("simulated_{name}_{}", hardware.name());
            println!("  {variant:<24} {rate:>12.0} requests/s");
            report.add(&variant, "requests_per_second", rate, "requests/s");
            rates.insert(name, rate);
        }
        report.ratios.insert(
            format!("simulated_p4_vs_spot_{}", hardware.name()),
            serde_json::json!(rates["p4"] / rates["spot"]),
        );
    }
    Ok(())
}

pub fn run(quick: bool, settings: &Settings) -> Result<Report, CowbirdBenchError> {
    // This machine is shared and its vCPUs are stolen for milliseconds at
    // a time: runs long enough to average that out, medians over rounds.
    let rounds = if quick { 5 } else { 7 };
    let duration = Duration::from_millis(if quick { 500 } else { 2000 });
    let cases = cases(quick);
    let progress = ProgressBar::new(rounds * (cases.len() * Variant::ALL.len()) as u64);
    progress.set_style(ProgressStyle::with_template(
        "{bar:40} {pos}/{len} runs {msg}",
    )?);
    let mut measured: Rounds = BTreeMap::new();
    let mut ratios: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let mut p4_resources = None;
    let mut p4_go_backs = 0u64;
    let mut local_probe_rates = Vec::new();
    // The work per record is calibrated once, so every variant and round
    // does the same work.
    let benches: Vec<(&str, ProbeBench)> = cases
        .iter()
        .map(|case| {
            let table = TableSpec {
                work_per_record: case.work,
                record_bytes: case.record_bytes,
                ..TableSpec::DEFAULT
            };
            let mut bench = ProbeBench::new(table, duration);
            bench.threads = settings.threads;
            bench.sizes = settings.sizes;
            bench.spot = settings.spot;
            bench.p4 = settings.p4;
            (case.name, bench)
        })
        .collect();
    for round in 0..rounds {
        for (case, bench) in &benches {
            let (case, bench) = (*case, *bench);
            let mut outcomes = BTreeMap::new();
            for variant in Variant::ALL {
                progress.set_message(format!("{case} {}", variant.name()));
                outcomes.insert(variant.name(), run_variant(&bench, variant, round)?);
                progress.inc(1);
            }
            let local = outcomes["local"].operations_per_second();
            if case == "probe" {
                local_probe_rates.push(local);
            }
            if let Some((stats, resources)) = &outcomes["p4"].p4 {
                p4_resources.get_or_insert_with(|| resources.clone());
                p4_go_backs += stats.go_backs;
            }
            for variant in Variant::ALL {
                let name = format!("{case}_{}", variant.name());
                let figures = figures(&outcomes[variant.name()], local);
                measured.entry(name).or_default().push(figures);
            }
            let spot = &outcomes["spot"];
            let asynchronous = &outcomes["async"];
            match case {
                "probe" => {
                    ratios
                        .entry("spot_vs_async_probe")
                        .or_default()
                        .push(spot.operations_per_second() / asynchronous.operations_per_second());
                    ratios
                        .entry("app_cpu_per_op_spot_vs_async")
                        .or_default()
                        .push(spot.app_ns_per_remote() / asynchronous.app_ns_per_remote());
                    // The P4 chain is about ten frames through the fabric
                    // thread per request: this ratio shows the fabric's
                    // cost most.
                    ratios.entry("p4_vs_spot_probe").or_default().push(
                        outcomes["p4"].operations_per_second() / spot.operations_per_second(),
                    );
                }
                "compute_bound" => {
                    ratios
                        .entry("spot_vs_local_compute_bound")
                        .or_default()
                        .push(spot.operations_per_second() / local);
                    ratios
                        .entry("p4_vs_local_compute_bound")
                        .or_default()
                        .push(outcomes["p4"].operations_per_second() / local);
                }
                _ => {}
            }
        }
    }
    progress.finish_and_clear();
    let mut report = Report::new(
        "cowbird",
        serde_json::json!({
            "quick": quick,
            "rounds": rounds,
            "seconds_per_variant": duration.as_secs_f64(),
            "records": TableSpec::DEFAULT.records,
            "record_bytes": cases.iter().map(|case| case.record_bytes).collect::<Vec<_>>(),
            "local_fraction": TableSpec::DEFAULT.local_fraction,
            "batch": 100,
            "threads": settings.threads,
            "config_file": settings.config_file,
            "spot": {
                "batch_entries": settings.spot.batch_entries,
                "probe_interval_min_us": settings.spot.probe_interval_min.as_micros() as u64,
                "probe_interval_max_us": settings.spot.probe_interval_max.as_micros() as u64,
            },
            "p4": {
                "probe_period_us": settings.p4.probe_period.as_micros() as u64,
                "timeout_us": settings.p4.timeout.as_micros() as u64,
                "max_entries_in_flight": settings.p4.max_entries_in_flight,
                "path_mtu": settings.p4.path_mtu.bytes(),
            },
            "metadata_entries": settings.sizes.metadata_entries,
            "work_rounds_compute_bound": benches[1].1.work_rounds,
            "clock": "real time on the embedded rack; application time per pass from the TSC clock",
            "p4_go_backs_all_rounds": p4_go_backs,
            "p4_resources": p4_resources,
        }),
    );
    println!(
        "hash-table probe, 95% remote, {} application thread(s) (medians of {rounds} rounds):",
        settings.threads
    );
    for case in &cases {
        for variant in Variant::ALL {
            let name = format!("{}_{}", case.name, variant.name());
            record(&mut report, &name, variant, &measured[&name]);
        }
    }
    if let Some(resources) = &p4_resources {
        println!("\nCowbird-P4 switch resources (as the paper's Table 5):\n{resources}");
    }
    println!("Cowbird-P4 go-backs over all rounds: {p4_go_backs}");
    println!();
    for (name, mut values) in ratios {
        let value = median(&mut values);
        println!("{name:<40} {value:.3}");
        report.ratios.insert(name.into(), serde_json::json!(value));
    }
    report.baseline(
        "local_probe_operations_per_second",
        median(&mut local_probe_rates),
    );
    simulated_runs(quick, &mut report)?;
    Ok(report)
}

#[derive(clap::Args)]
pub struct CowbirdArgs {
    #[command(flatten)]
    pub common: super::entry::CommonArgs,
    /// Application threads, each with its own queue pair, RPC server or
    /// Cowbird instance (default: the rack file's `threads`, else 1).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub threads: Option<u16>,
    /// A rack file whose `[cowbird]` section sets the rings and the Spot
    /// and P4 engines' settings (see examples/rack-cowbird.toml).
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
}

impl super::entry::BenchArgs for CowbirdArgs {
    fn common(&self) -> &super::entry::CommonArgs {
        &self.common
    }
}

/// `remora bench cowbird`.
pub static BENCH: super::entry::Entry<CowbirdArgs, CowbirdBenchError> = super::entry::Entry {
    name: "cowbird",
    about: "Cowbird's hash-table probe on the embedded rack.\n\nAll-local, synchronous and batched asynchronous one-sided READs, two-sided RPC, and the client library with the Spot offload engine and with Cowbird-P4 in the switch; pure probe and compute-bound; application time per remote request split into issue and completion, latency, bytes per request, and fabric and engine CPU reported apart.",
    run: |args| {
        let settings = Settings::from_args(args.threads, args.config.as_deref())
?;
        run(args.common.quick, &settings)
    },
};

#[cfg(test)]
mod tests {
    use super::*;

    /// `--threads` replaced the section's threads after the section's
    /// checks had passed with the file's: 16 threads of 1024-entry
    /// batches need more engine completions than a queue holds, and
    /// deploy failed after the first variants had run.
    #[test]
    fn threads_given_on_the_command_line_are_checked_with_the_section() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("rack.toml");
        let rack = "[rack]\nname = \"threads\"\n\n[switch]\nprogram = \"l2l3\"\n\n\
                    [[node]]\nname = \"compute0\"\nrole = \"compute\"\n\
                    address = \"10.0.0.1\"\nmemory = \"1MiB\"\n\n\
                    [[node]]\nname = \"memory0\"\nrole = \"memory\"\n\
                    address = \"10.0.0.2\"\nmemory = \"64MiB\"\n\n\
                    [cowbird]\nengine = \"spot\"\nthreads = 1\nmetadata_entries = 1024\n\n\
                    [cowbird.spot]\nbatch_entries = 1024\n";
        std::fs::write(&path, rack).unwrap();
        let accepted = Settings::from_args(None, Some(&path));
        assert!(accepted.is_ok(), "{:?}", accepted.err());
        let refused = Settings::from_args(Some(16), Some(&path));
        assert!(
            matches!(&refused, Err(CowbirdBenchError::Section { error, .. })
                if error.to_string().contains("threads (16)")),
            "{:?}",
            refused.err()
        );
    }
}
