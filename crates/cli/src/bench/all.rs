//! `remora bench all`: every benchmark in turn, each saved in the results
//! directory, then one report of the lot.

use super::entry::BenchError;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::PathBuf;
use std::process::ExitCode;

pub const NAME: &str = "all";

pub const ABOUT: &str = "Every benchmark in turn, then the HTML report of them all.";

pub const LONG_ABOUT: &str = "Every benchmark in turn, then the HTML report of them all.\n\nRuns each benchmark (with --quick, each one's short run) under a progress bar, saves every run in the results directory as `remora bench NAME` does, goes on past a benchmark that fails, and writes the report of those that finished to --out. Exits 1 if any failed.";

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
    let benchmarks: Vec<_> = super::benchmarks().collect();
    let progress = ProgressBar::new(benchmarks.len() as u64);
    progress.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} benchmarks: {msg}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    let mut results = Vec::new();
    let mut failures = Vec::new();
    for benchmark in benchmarks {
        progress.set_message(benchmark.name());
        match run_one(benchmark, args.quick) {
            Ok(saved) => results.push(saved),
            Err(error) => {
                progress.println(format!("{}: FAILED: {error}", benchmark.name()));
                failures.push(benchmark.name());
            }
        }
        progress.inc(1);
    }
    progress.finish_with_message("done");
    let html = remora_report::page::benchmarks_page(&results, &remora_report::utc_now())
        .map_err(remora_report::ReportError::from)?;
    let page = remora_report::write_page(&args.out, &html)?;
    println!(
        "\nreport of {} benchmarks: {}",
        results.len(),
        page.display()
    );
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
