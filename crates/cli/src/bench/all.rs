//! `remora bench all`: every benchmark in turn, each saved in the results
//! directory, then one report of the lot.

use super::entry::BenchError;
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

pub const NAME: &str = "all";

pub const ABOUT: &str = "Every benchmark in turn, then the HTML report of them all.";

pub const LONG_ABOUT: &str = "Every benchmark in turn, then the HTML report of them all.\n\nRuns each benchmark (with --quick, each one's short run) after a line that names it, each under its own progress bar, saves every run in the results directory as `remora bench NAME` does, goes on past a benchmark that fails, and writes the report of those that finished to --out. Exits 1 if any failed. A first Ctrl-C (or SIGTERM) lets the benchmark under way finish, writes the report of those done and exits 130; a second stops at once.";

#[derive(Args)]
pub struct AllArgs {
    /// Short runs: each benchmark's --quick.
    #[arg(long)]
    pub quick: bool,
    /// Where the report goes (index.html in this directory).
    #[arg(long, default_value = "remora-report")]
    pub out: PathBuf,
}

/// Runs every benchmark; one that fails is reported and the rest go on,
/// so a long run is not lost to one failure. The report covers those that
/// finished; the exit code says whether any failed.
pub fn run(args: &AllArgs) -> Result<ExitCode, BenchError> {
    crate::output::check_directory_path(&args.out)?;
    // Every run is saved there: a directory that cannot take them is
    // found before the first benchmark, not after the last.
    remora_report::results::ready_directory()?;
    // A first Ctrl-C (or SIGTERM) lets the benchmark under way finish and
    // then ends the run with the report of those done; a second ends it
    // at once.
    let _between_steps = crate::interrupt::stop_between_steps();
    let benchmarks: Vec<_> = super::benchmarks().collect();
    // A line per benchmark, not a bar of its own: each benchmark draws its
    // own bar and prints its table, and a second bar held over them drew
    // on their lines and garbled both.
    let started = Instant::now();
    let total = benchmarks.len();
    let mut results = Vec::new();
    let mut failures = Vec::new();
    for (index, benchmark) in benchmarks.into_iter().enumerate() {
        if crate::interrupt::interrupted() {
            println!("\ninterrupted: {} of {total} benchmarks run", index);
            break;
        }
        println!(
            "\n=== [{}/{total}] bench {} ({} elapsed) ===",
            index + 1,
            benchmark.name(),
            elapsed_text(started.elapsed())
        );
        match run_one(benchmark, args.quick) {
            Ok(saved) => results.push(saved),
            Err(error) => {
                println!("{}: FAILED: {error}", benchmark.name());
                failures.push(benchmark.name());
            }
        }
    }
    println!(
        "\n=== {total} benchmarks in {} ===",
        elapsed_text(started.elapsed())
    );
    let html = remora_report::page::benchmarks_page(&results, &remora_report::utc_now())
        .map_err(remora_report::ReportError::from)?;
    let page = remora_report::write_page(&args.out, &html)?;
    println!(
        "\nreport of {} benchmarks: {}",
        results.len(),
        page.display()
    );
    if crate::interrupt::interrupted() {
        return Ok(ExitCode::from(crate::interrupt::INTERRUPTED_EXIT));
    }
    if failures.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    println!("failed: {}", failures.join(", "));
    Ok(ExitCode::FAILURE)
}

fn run_one(
    benchmark: &'static dyn super::entry::Benchmark,
    quick: bool,
) -> Result<remora_report::results::BenchResult, BenchError> {
    let mut arguments = vec![benchmark.name()];
    if quick {
        arguments.push("--quick");
    }
    let matches = benchmark.command().try_get_matches_from(arguments)?;
    let (report, _) = benchmark.run(&matches)?;
    super::save(&report)
}

/// `h:mm:ss`.
fn elapsed_text(elapsed: Duration) -> String {
    let seconds = elapsed.as_secs();
    format!(
        "{}:{:02}:{:02}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}
