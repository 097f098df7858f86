//! `remora bench NAME`: benchmarks with a table on stdout and, with
//! `--json`, one document shaped
//! `{"bench", "config", "host", "results": [{variant, metric, value, unit}], "ratios"}`,
//! plus `"series"` where a benchmark has time series or sweeps to plot.

mod bifrost;
mod clover;
mod cowbird;
mod rnic;
mod soda;
mod switch;
mod tiga;

use clap::{Args, Subcommand};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// The soft RNIC's own cost: READ and WRITE of 64 B to 64 KiB between two
    /// devices in one thread with no carrier, against memcpy in the same run.
    #[command(name = "fabric")]
    Rnic(CommonArgs),
    /// The switch and the carriers: L2/L3 forwarding rate against
    /// ring-to-ring, and READ latency and throughput through the switch over
    /// in-process, shared-memory and UDP carriers against a raw UDP
    /// ping-pong.
    Switch(CommonArgs),
    /// Clover with and without the in-network resolver, in the
    /// deterministic simulator: YCSB A/B/C, zipf 0.75/0.99 and uniform,
    /// 1 to 64 clients, a top-N cache sweep, conflicts and resolver memory.
    Clover(CloverArgs),
    /// Cowbird's hash-table probe on the embedded rack: all-local,
    /// synchronous and batched asynchronous one-sided READs, two-sided
    /// RPC, and the client library with the Spot offload engine and with
    /// Cowbird-P4 in the switch; pure probe and compute-bound; application
    /// time per remote request split into issue and completion, latency,
    /// bytes per request, and fabric and engine CPU reported apart.
    Cowbird(CowbirdArgs),
    /// SODA: five graph applications (BFS, PageRank, Radii, BC, CC) on a
    /// Kronecker graph through far memory: all-local, an O_DIRECT file,
    /// the memory node direct, and the DPU base, with aggregation, with
    /// asynchronous forwarding, and with static or dynamic caching, on
    /// links shaped as the paper's testbed (B_intra = 2 B_net); runtime,
    /// memory-link bytes on demand and in the background, hit rates,
    /// fault latency, and host, DPU and fabric CPU apart.
    Soda(SodaArgs),
    /// Bifröst: the thesis's ping through a generated Thrift client and
    /// processor over Bifröst on the embedded rack, through the Gatekeeper
    /// in the switch and bypassing it, against the same Thrift service over
    /// loopback TCP and UDP and raw UDP and TCP request/response; add_arrays
    /// by reference (arrays in global memory) against by value over Thrift
    /// TCP, with the crossover size; recovery time after a crash (in the
    /// simulator); mean, p50 and p99.
    Bifrost(CommonArgs),
    /// TIGA in virtual time on virtual SoC and CN cores, calibrated from
    /// the real stage code: MVS, Spark-style analysis and IPSec under
    /// TIGA, FairNIC, Floem (FCFS, DRR), iPipe and CPU-only; the paper's
    /// Figs. 2, 3, 5, 6, 7 and 8, latency, and the allocation and
    /// forwarding ratio over a payload shift.
    Tiga(TigaArgs),
}

#[derive(Args)]
pub struct TigaArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// A TOML file of virtual-hardware settings (any of soc_cores,
    /// cn_cores, slowdown, context_switch_ns, core_move_ns, detection_ns,
    /// detection_period_ns, queue_depth, dma_bytes_per_second, ...; see
    /// examples/tiga.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The seed of the arrival streams.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Args)]
pub struct SodaArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Kronecker scale (default 16 with --quick, 20 otherwise; 22 is the
    /// large run).
    #[arg(long, value_parser = clap::value_parser!(u32).range(10..=24))]
    scale: Option<u32>,
    /// A graph file to run on instead (.el, .wel, .sg, .adj or SNAP .txt;
    /// taken as undirected).
    #[arg(long, conflicts_with = "scale")]
    graph: Option<String>,
}

#[derive(Args)]
pub struct CowbirdArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Application threads, each with its own queue pair, RPC server or
    /// Cowbird instance (default: the rack file's `threads`, else 1).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=16))]
    threads: Option<u16>,
    /// A rack file whose `[cowbird]` section sets the rings and the Spot
    /// and P4 engines' settings (see examples/rack-cowbird.toml).
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Args)]
pub struct CloverArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// Record, check and write every simulated run's KV history to this
    /// file as JSON lines, one request each: {"history", "client", "op",
    /// "key", "value", "output", "call", "ret"} (times in simulated ns; no
    /// "ret" for a request that never returned), for an outside
    /// linearizability checker.
    #[arg(long)]
    history: Option<PathBuf>,
}

#[derive(Args)]
pub struct CommonArgs {
    /// Short run (under a minute on 2 cores) with fewer repetitions.
    #[arg(long)]
    quick: bool,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Serialize)]
pub struct Measurement {
    pub variant: String,
    pub metric: String,
    pub value: f64,
    pub unit: String,
}

#[derive(Serialize)]
pub struct Report {
    pub bench: String,
    pub config: serde_json::Value,
    pub host: Host,
    pub results: Vec<Measurement>,
    pub ratios: serde_json::Map<String, serde_json::Value>,
    /// Time series and sweeps that plots draw (for example TIGA's
    /// allocation over time); absent when a benchmark has none.
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub series: serde_json::Map<String, serde_json::Value>,
}

impl Report {
    pub fn add(&mut self, variant: &str, metric: &str, value: f64, unit: &str) {
        self.results.push(Measurement {
            variant: variant.into(),
            metric: metric.into(),
            value,
            unit: unit.into(),
        });
    }
}

#[derive(Serialize)]
pub struct Host {
    pub cpu: String,
    pub logical_cpus: usize,
    pub kernel: String,
    pub remora_version: String,
}

impl Host {
    pub fn probe() -> Host {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find(|line| line.starts_with("model name"))
                    .map(|line| line.split(':').nth(1).unwrap_or("").trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let uname = rustix::system::uname();
        Host {
            cpu,
            logical_cpus: std::thread::available_parallelism().map_or(1, |count| count.get()),
            kernel: format!(
                "{} {}",
                uname.sysname().to_string_lossy(),
                uname.release().to_string_lossy()
            ),
            remora_version: env!("CARGO_PKG_VERSION").into(),
        }
    }
}

pub use remora_rack::endpoint::thread_cpu_ns;

/// "64B", "4KiB": sizes as variant names show them.
pub fn size_label(size: u32) -> String {
    if size >= 1024 {
        format!("{}KiB", size / 1024)
    } else {
        format!("{size}B")
    }
}

/// The median, which shared and noisy machines call for.
pub fn median(values: &mut [f64]) -> f64 {
    assert!(!values.is_empty());
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len() % 2 == 1 {
        values[middle]
    } else {
        (values[middle - 1] + values[middle]) / 2.0
    }
}

pub fn run(command: BenchCommand) -> Result<ExitCode, String> {
    let (report, args) = match command {
        BenchCommand::Rnic(args) => (rnic::run(args.quick)?, args),
        BenchCommand::Switch(args) => (switch::run(args.quick)?, args),
        BenchCommand::Clover(args) => (
            clover::run(args.common.quick, args.history.as_deref())?,
            args.common,
        ),
        BenchCommand::Soda(args) => (
            soda::run(args.common.quick, args.scale, args.graph.as_deref())?,
            args.common,
        ),
        BenchCommand::Bifrost(args) => (bifrost::run(args.quick)?, args),
        BenchCommand::Tiga(args) => (
            tiga::run(args.common.quick, args.config.as_deref(), args.seed)?,
            args.common,
        ),
        BenchCommand::Cowbird(args) => {
            let settings = cowbird::Settings::from_args(args.threads, args.config.as_deref())?;
            (cowbird::run(args.common.quick, &settings)?, args.common)
        }
    };
    if let Some(path) = &args.json {
        crate::write_json(path, &report)?;
        println!("\nwrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
