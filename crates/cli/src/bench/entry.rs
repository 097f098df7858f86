//! What a benchmark is to `remora bench`: its name, help and arguments
//! (clap), and a run that returns its [`Report`] or its own typed error.

use super::report::Report;
use clap::{ArgMatches, Args, Command, FromArgMatches};
use std::path::PathBuf;

/// A benchmark as `remora bench NAME` runs it. Every benchmark is one
/// entry of [`super::benchmarks`]: the substrate's there, each system's
/// through its entry in [`crate::systems::SYSTEMS`], so adding a system's
/// benchmark touches that one place.
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
pub struct Entry<A, E> {
    pub name: &'static str,
    /// The help: a first line, then what it measures.
    pub about: &'static str,
    pub run: fn(&A) -> Result<Report, E>,
}

impl<A: BenchArgs, E: std::error::Error + Send + Sync + 'static> Benchmark for Entry<A, E> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn command(&self) -> Command {
        let (short, _) = self.about.split_once("\n\n").unwrap_or((self.about, ""));
        A::augment_args(Command::new(self.name).about(short).long_about(self.about))
    }

    fn run(&self, matches: &ArgMatches) -> Result<(Report, Option<PathBuf>), BenchError> {
        let args = A::from_arg_matches(matches)?;
        crate::output::check_optional_file_path(args.common().json.as_deref())?;
        let report = (self.run)(&args).map_err(|error| BenchError::Failed {
            benchmark: self.name,
            source: Box::new(error),
        })?;
        Ok((report, args.common().json.clone()))
    }
}

/// Why a benchmark did not finish: its arguments, its own typed error
/// (`source.downcast_ref` recovers it: `CloverBenchError`,
/// `CowbirdBenchError`, ...), or its results file.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Arguments(#[from] clap::Error),
    #[error("{benchmark}: {source}")]
    Failed {
        benchmark: &'static str,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(transparent)]
    Output(#[from] crate::output::OutputError),
    #[error(transparent)]
    Results(#[from] remora_report::results::ResultsError),
    #[error(transparent)]
    Report(#[from] remora_report::ReportError),
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
