//! `remora`: the command-line entry to the rack.

mod bench;
mod capture;
mod demo;
mod error;
mod interrupt;
mod kv;
mod output;
mod rack;
mod report;
mod sim;
mod soda;
mod systems;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Remora: a software disaggregated-memory rack on commodity Linux.
///
/// Every node speaks real RoCEv2 frames through a userspace soft RNIC.
#[derive(Parser)]
#[command(name = "remora", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Tour the rack and every system on it: two soft RNICs run every RC
    /// operation, a refused access and a lossy transfer; then the embedded
    /// rack runs a checked workload, and Clover, Cowbird, SODA, Bifröst,
    /// TIGA and the KV store each take a checked step. Prints a summary and
    /// exits non-zero if any check failed.
    Demo {
        /// Also write the summary as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write every frame of the tour to this pcap file (opens in Wireshark).
        #[arg(long)]
        pcap: Option<PathBuf>,
        /// Write Clover's checked KV histories to this file as JSON lines,
        /// one request each: {"history", "client", "op", "key", "value",
        /// "output", "call", "ret"} (times in simulated ns; no "ret" for a
        /// request that never returned), for an outside linearizability
        /// checker.
        #[arg(long)]
        history: Option<PathBuf>,
        /// Also write an HTML report of the demo's checks and figures
        /// (index.html in this directory).
        #[arg(long)]
        report: Option<PathBuf>,
    },
    /// Run deterministic simulation campaigns.
    #[command(subcommand)]
    Sim(sim::SimCommand),
    /// Run a benchmark and print a table (and JSON with --json); every run
    /// is also saved in the results directory ($REMORA_RESULTS, else
    /// $XDG_DATA_HOME/remora/results, else ~/.local/share/remora/results).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Draw benchmark results as one self-contained HTML page: each
    /// paper's figures with the paper's values beside Remora's, and every
    /// ratio against its target.
    Report(report::ReportArgs),
    /// SODA: graph applications on far-memory objects.
    #[command(subcommand)]
    Soda(soda::SodaCommand),
    /// The far-memory KV store: a Redis-compatible server, or one YCSB run.
    #[command(subcommand)]
    Kv(kv::KvCommand),
    /// Launch a rack of nodes behind the programmable switch.
    #[command(subcommand)]
    Rack(rack::RackCommand),
    /// Run one node of a rack (started by `rack up`, or by hand on each
    /// host of a rack spanning hosts).
    Node(rack::NodeArgs),
}

/// `REMORA_LOG=info|debug|trace` prints the rack's and the systems'
/// events to stderr (crashes, restarts, reconnections, scenario runs), so
/// a replayed seed can be followed.
fn install_log() -> Result<(), CliError> {
    let Ok(level) = std::env::var("REMORA_LOG") else {
        return Ok(());
    };
    let level: tracing::Level = level.parse().map_err(|_| CliError::LogLevel(level))?;
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode, CliError> {
    install_log()?;
    Ok(match cli.command {
        Command::Demo {
            json,
            pcap,
            history,
            report,
        } => demo::run(&demo::Outputs {
            json: json.as_deref(),
            pcap: pcap.as_deref(),
            history: history.as_deref(),
            report: report.as_deref(),
        })?,
        Command::Sim(command) => sim::run(command)?,
        Command::Bench(command) => bench::run(command)?,
        Command::Report(args) => report::run(&args)?,
        Command::Soda(command) => soda::run(command)?,
        Command::Kv(command) => kv::run(command)?,
        Command::Rack(command) => rack::run(command)?,
        Command::Node(args) => rack::run_node(args)?,
    })
}

/// Why a `remora` command could not run.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("REMORA_LOG={0:?}: use error, warn, info, debug or trace")]
    LogLevel(String),
    #[error(transparent)]
    Demo(#[from] error::DemoError),
    #[error(transparent)]
    Sim(#[from] error::SimError),
    #[error(transparent)]
    Bench(#[from] bench::BenchError),
    #[error(transparent)]
    Soda(#[from] soda::SodaCliError),
    #[error(transparent)]
    Kv(#[from] kv::KvCliError),
    #[error(transparent)]
    Rack(#[from] error::RackCommandError),
    #[error(transparent)]
    Report(#[from] remora_report::ReportError),
}

/// Why a `--history` file could not be written, or what it holds failed.
#[derive(Debug, thiserror::Error)]
pub enum HistoryFileError {
    #[error("cannot write {path}: {error}")]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{0}: the run recorded no history")]
    NoHistory(String),
    #[error("{name}: keys {keys:?} are not linearizable (history in {path})")]
    NotLinearizable {
        name: String,
        keys: Vec<u64>,
        path: PathBuf,
    },
}

/// A file of checked KV histories as JSON lines (`--history`).
pub struct HistoryFile {
    path: PathBuf,
    out: std::io::BufWriter<std::fs::File>,
    histories: usize,
    lines: usize,
}

impl HistoryFile {
    pub fn create(path: &std::path::Path) -> Result<HistoryFile, HistoryFileError> {
        let file = std::fs::File::create(path).map_err(|error| HistoryFileError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        Ok(HistoryFile {
            path: path.to_path_buf(),
            out: std::io::BufWriter::new(file),
            histories: 0,
            lines: 0,
        })
    }

    fn io_error(&self, error: std::io::Error) -> HistoryFileError {
        HistoryFileError::Io {
            path: self.path.clone(),
            error,
        }
    }

    /// Writes one run's history, refusing one its check found not
    /// linearizable (the file then still holds it, for a second opinion).
    pub fn write(
        &mut self,
        name: &str,
        outcome: &remora_clover::simulated::Outcome,
    ) -> Result<(), HistoryFileError> {
        let verdict = outcome
            .verdict
            .as_ref()
            .ok_or_else(|| HistoryFileError::NoHistory(name.to_string()))?;
        self.lines +=
            remora_workloads::history::write_json_lines(name, &outcome.history, &mut self.out)
                .map_err(|error| self.io_error(error))?;
        self.histories += 1;
        if !verdict.violations.is_empty() {
            return Err(HistoryFileError::NotLinearizable {
                name: name.to_string(),
                keys: verdict.violations.clone(),
                path: self.path.clone(),
            });
        }
        Ok(())
    }

    /// Flushes; says what was written.
    pub fn finish(mut self) -> Result<String, HistoryFileError> {
        use std::io::Write;
        self.out.flush().map_err(|error| self.io_error(error))?;
        Ok(format!(
            "wrote {} requests of {} checked histories to {}",
            self.lines,
            self.histories,
            self.path.display()
        ))
    }
}
