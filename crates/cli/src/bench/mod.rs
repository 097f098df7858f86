//! `remora bench NAME`: benchmarks with a table on stdout and, with
//! `--json`, one document shaped
//! `{"bench", "config", "host", "results": [{variant, metric, value, unit}], "ratios"}`,
//! plus `"series"` where a benchmark has time series or sweeps to plot.

pub mod bifrost;
pub mod clover;
pub mod cowbird;
mod rnic;
pub mod soda;
mod switch;
pub mod tiga;

use clap::error::ErrorKind;
use clap::{ArgMatches, Args, Command, FromArgMatches, Subcommand};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;

/// A benchmark as `remora bench NAME` runs it. Every benchmark is one
/// entry of [`benchmarks`]: the substrate's here, each system's through its
/// entry in [`crate::systems::SYSTEMS`], so adding a system's benchmark
/// touches that one place.
pub trait Benchmark: Sync {
    fn name(&self) -> &'static str;

    /// Its subcommand: help and arguments.
    fn command(&self) -> Command;

    /// Runs it with the arguments clap parsed from [`command`](Self::command).
    fn run(&self, matches: &ArgMatches) -> Result<(Report, Option<PathBuf>), BenchError>;
}

/// A benchmark's arguments: its own, and the ones every benchmark takes.
pub trait BenchArgs: Args + FromArgMatches {
    fn common(&self) -> &CommonArgs;
}

/// A benchmark whose arguments are a clap `Args` struct.
pub struct Entry<A> {
    pub name: &'static str,
    /// The help: a first line, then what it measures.
    pub about: &'static str,
    pub run: fn(&A) -> Result<Report, BenchError>,
}

impl<A: BenchArgs> Benchmark for Entry<A> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn command(&self) -> Command {
        let (short, _) = self.about.split_once("\n\n").unwrap_or((self.about, ""));
        A::augment_args(Command::new(self.name).about(short).long_about(self.about))
    }

    fn run(&self, matches: &ArgMatches) -> Result<(Report, Option<PathBuf>), BenchError> {
        let args = A::from_arg_matches(matches)?;
        let report = (self.run)(&args)?;
        Ok((report, args.common().json.clone()))
    }
}

/// Every benchmark, in the order `remora bench --help` lists them.
pub fn benchmarks() -> impl Iterator<Item = &'static dyn Benchmark> {
    let substrate: [&'static dyn Benchmark; 2] = [&rnic::BENCH, &switch::BENCH];
    substrate.into_iter().chain(
        crate::systems::SYSTEMS
            .iter()
            .filter_map(|system| system.benchmark()),
    )
}

/// `remora bench NAME ...`: the benchmark named and its parsed arguments.
pub struct BenchCommand {
    benchmark: &'static dyn Benchmark,
    matches: ArgMatches,
}

impl FromArgMatches for BenchCommand {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let Some((name, matches)) = matches.subcommand() else {
            return Err(clap::Error::new(ErrorKind::MissingSubcommand));
        };
        let benchmark = benchmarks()
            .find(|benchmark| benchmark.name() == name)
            .ok_or_else(|| clap::Error::new(ErrorKind::InvalidSubcommand))?;
        Ok(BenchCommand {
            benchmark,
            matches: matches.clone(),
        })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = BenchCommand::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Subcommand for BenchCommand {
    fn augment_subcommands(command: Command) -> Command {
        benchmarks().fold(command.subcommand_required(true), |command, benchmark| {
            command.subcommand(benchmark.command())
        })
    }

    fn augment_subcommands_for_update(command: Command) -> Command {
        BenchCommand::augment_subcommands(command)
    }

    fn has_subcommand(name: &str) -> bool {
        benchmarks().any(|benchmark| benchmark.name() == name)
    }
}

/// Why a benchmark did not finish.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Arguments(#[from] clap::Error),
    #[error(transparent)]
    Tiga(#[from] tiga::TigaBenchError),
    #[error(transparent)]
    Soda(#[from] soda::SodaBenchError),
    #[error(transparent)]
    Bifrost(#[from] bifrost::BifrostBenchError),
    #[error(transparent)]
    Fabric(#[from] rnic::FabricBenchError),
    #[error(transparent)]
    Switch(#[from] switch::SwitchBenchError),
    #[error(transparent)]
    Clover(#[from] clover::CloverBenchError),
    #[error(transparent)]
    Cowbird(#[from] cowbird::CowbirdBenchError),
    #[error(transparent)]
    Output(#[from] crate::error::OutputError),
}

impl BenchArgs for CommonArgs {
    fn common(&self) -> &CommonArgs {
        self
    }
}

#[derive(Args)]
pub struct CommonArgs {
    /// Short run (under a minute on 2 cores) with fewer repetitions.
    #[arg(long)]
    pub quick: bool,
    /// Write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
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

pub fn run(command: BenchCommand) -> Result<ExitCode, BenchError> {
    let (report, json) = command.benchmark.run(&command.matches)?;
    if let Some(path) = &json {
        crate::write_json(path, &report)?;
        println!("\nwrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
