//! `remora bench NAME`: benchmarks with a table on stdout and, with
//! `--json`, one document shaped
//! `{"bench", "config", "host", "results": [{variant, metric, value, unit}], "ratios"}`,
//! plus `"series"` where a benchmark has time series or sweeps to plot.

pub mod bifrost;
pub mod clover;
pub mod cowbird;
pub mod entry;
pub mod kv;
pub mod report;
mod rnic;
pub mod soda;
mod switch;
pub mod tiga;
mod verbs;

use clap::error::ErrorKind;
use clap::{ArgMatches, Command, FromArgMatches, Subcommand};
pub use entry::BenchError;
use entry::Benchmark;
use std::process::ExitCode;

/// Every benchmark, in the order `remora bench --help` lists them.
pub fn benchmarks() -> impl Iterator<Item = &'static dyn Benchmark> {
    let substrate: [&'static dyn Benchmark; 3] = [&rnic::BENCH, &switch::BENCH, &verbs::BENCH];
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

pub fn run(command: BenchCommand) -> Result<ExitCode, BenchError> {
    let (report, json) = command.benchmark.run(&command.matches)?;
    if let Some(path) = &json {
        crate::output::write_json(path, &report)?;
        println!("\nwrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
