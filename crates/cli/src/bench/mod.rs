//! `remora bench NAME`: benchmarks with a table on stdout and, with
//! `--json`, one document shaped
//! `{"bench", "config", "host", "results": [{variant, metric, value, unit}], "ratios"}`,
//! plus `"series"` where a benchmark has time series or sweeps to plot.

pub mod all;
pub mod bifrost;
mod child;
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
use clap::{ArgMatches, Args, Command, FromArgMatches, Subcommand};
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

/// `remora bench NAME ...`: the benchmark named and its parsed arguments,
/// or `remora bench all`.
pub enum BenchCommand {
    One {
        benchmark: &'static dyn Benchmark,
        matches: ArgMatches,
    },
    All(all::AllArgs),
}

impl FromArgMatches for BenchCommand {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let Some((name, matches)) = matches.subcommand() else {
            return Err(clap::Error::new(ErrorKind::MissingSubcommand));
        };
        if name == all::NAME {
            return Ok(BenchCommand::All(all::AllArgs::from_arg_matches(matches)?));
        }
        let benchmark = benchmarks()
            .find(|benchmark| benchmark.name() == name)
            .ok_or_else(|| clap::Error::new(ErrorKind::InvalidSubcommand))?;
        Ok(BenchCommand::One {
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
        let command = command.subcommand_required(true);
        benchmarks()
            .fold(command, |command, benchmark| {
                command.subcommand(benchmark.command())
            })
            .subcommand(all::AllArgs::augment_args(
                Command::new(all::NAME)
                    .about(all::ABOUT)
                    .long_about(all::LONG_ABOUT),
            ))
    }

    fn augment_subcommands_for_update(command: Command) -> Command {
        BenchCommand::augment_subcommands(command)
    }

    fn has_subcommand(name: &str) -> bool {
        name == all::NAME || benchmarks().any(|benchmark| benchmark.name() == name)
    }
}

pub fn run(command: BenchCommand) -> Result<ExitCode, BenchError> {
    let (benchmark, matches) = match command {
        BenchCommand::One { benchmark, matches } => (benchmark, matches),
        BenchCommand::All(args) => return all::run(&args),
    };
    let json = matches
        .try_get_one::<std::path::PathBuf>("json")
        .ok()
        .flatten()
        .cloned();
    // Without --json the results directory is the run's only home: a
    // directory that cannot take it is found before the run, not after.
    if json.is_none() {
        remora_report::results::ready_directory()?;
    }
    let (report, json) = benchmark.run(&matches)?;
    // Saved first: a --json path that cannot be written loses nothing.
    match (save(&report), &json) {
        (Ok(saved), _) => println!("saved in the results directory as {}", saved.path.display()),
        // The run is not lost: --json writes it elsewhere.
        (Err(error), Some(_)) => eprintln!("warning: not saved in the results directory: {error}"),
        // The run had nowhere else to go.
        (Err(error), None) => return Err(error),
    }
    if let Some(path) = &json {
        crate::output::write_json(path, &report)?;
        println!("\nwrote {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Saves a run in the results directory, where `remora report` finds the
/// latest of each benchmark.
pub fn save(report: &report::Report) -> Result<remora_report::results::BenchResult, BenchError> {
    let json = serde_json::to_value(report).map_err(crate::output::OutputError::Encode)?;
    let directory = remora_report::results::directory()?;
    let path = remora_report::results::save(&directory, &report.bench, &json)?;
    Ok(remora_report::results::BenchResult {
        bench: report.bench.clone(),
        path,
        json,
    })
}
