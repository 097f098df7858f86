//! `remora report`: benchmark results as one self-contained HTML page.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ReportArgs {
    /// Benchmark JSON files (as `remora bench NAME --json FILE` writes).
    /// Without any, the latest run of each benchmark in the results
    /// directory: $REMORA_RESULTS, else $XDG_DATA_HOME/remora/results,
    /// else ~/.local/share/remora/results.
    pub files: Vec<PathBuf>,
    /// Where the report goes (index.html in this directory).
    #[arg(long, default_value = "remora-report")]
    pub out: PathBuf,
}

pub fn run(args: &ReportArgs) -> Result<ExitCode, remora_report::ReportError> {
    let page = remora_report::benchmarks(&args.files, &args.out, &remora_report::utc_now())?;
    println!("wrote {}", page.display());
    Ok(ExitCode::SUCCESS)
}
