//! `remora`: the command-line entry to the rack.

mod bench;
mod capture;
mod demo;
mod rack;
mod sim;

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
    /// Tour the fabric: two soft RNICs run every RC operation, a refused
    /// access and a lossy transfer, each checked, then print a summary.
    Demo {
        /// Also write the summary as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write every frame of the tour to this pcap file (opens in Wireshark).
        #[arg(long)]
        pcap: Option<PathBuf>,
    },
    /// Run deterministic simulation campaigns.
    #[command(subcommand)]
    Sim(sim::SimCommand),
    /// Run a benchmark and print a table (and JSON with --json).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Launch a rack of nodes behind the programmable switch.
    #[command(subcommand)]
    Rack(rack::RackCommand),
    /// Run one node of a rack (started by `rack up`, or by hand on each
    /// host of a rack spanning hosts).
    Node(rack::NodeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo { json, pcap } => demo::run(json.as_deref(), pcap.as_deref()),
        Command::Sim(command) => sim::run(command),
        Command::Bench(command) => bench::run(command),
        Command::Rack(command) => rack::run(command),
        Command::Node(args) => rack::run_node(args),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

/// Writes `value` as pretty JSON to `path`.
fn write_json(path: &std::path::Path, value: &impl serde::Serialize) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|error| error.to_string())?;
    std::fs::write(path, text + "\n")
        .map_err(|error| format!("cannot write {}: {error}", path.display()))
}
