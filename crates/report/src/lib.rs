//! `remora report`: benchmark results as one self-contained HTML page,
//! each paper's figures drawn with the paper's reported values beside
//! Remora's, and every ratio against its target.
//!
//! - [`results`]: where `remora bench` saves runs, and the latest of each;
//! - [`figures`]: the figure files (the papers' values, cited, and
//!   selectors of Remora's measurements);
//! - [`targets`]: the ratios' targets, from the issues that set them;
//! - [`select`]: Remora's points out of a benchmark's JSON;
//! - [`plot`]: one figure as SVG (plotters);
//! - [`page`]: the HTML.

pub mod figures;
pub mod page;
pub mod plot;
pub mod results;
pub mod select;
pub mod targets;

use std::path::{Path, PathBuf};

/// Why a report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Results(#[from] results::ResultsError),
    #[error(transparent)]
    Page(#[from] page::PageError),
    #[error("cannot write {path}: {error}")]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

/// The page's name in its directory.
pub const PAGE_NAME: &str = "index.html";

/// Writes `html` as `directory/index.html`, returning its path.
pub fn write_page(directory: &Path, html: &str) -> Result<PathBuf, ReportError> {
    let path = directory.join(PAGE_NAME);
    let failed = |error| ReportError::Write {
        path: path.clone(),
        error,
    };
    std::fs::create_dir_all(directory).map_err(failed)?;
    remora_base::replace_file(&path, html.as_bytes()).map_err(failed)?;
    Ok(path)
}

/// The benchmark page of `files`, or of the latest run of each
/// benchmark in the results directory when no file is named, written to
/// `directory`.
pub fn benchmarks(
    files: &[PathBuf],
    directory: &Path,
    generated: &str,
) -> Result<PathBuf, ReportError> {
    let results = if files.is_empty() {
        results::latest(&results::directory()?)?
    } else {
        files
            .iter()
            .map(|file| results::read(file))
            .collect::<Result<Vec<_>, _>>()?
    };
    let html = page::benchmarks_page(&results, generated)?;
    write_page(directory, &html)
}

/// The time now in UTC, as a page states when it was made
/// ("2026-11-26 15:04 UTC").
pub fn utc_now() -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    utc_text(seconds)
}

/// `seconds` since the Unix epoch as a UTC date and time. The date is
/// the proleptic Gregorian calendar's, counted in 400-year eras of
/// 146097 days.
fn utc_text(seconds: u64) -> String {
    let days = (seconds / 86_400) as i64;
    let minute_of_day = (seconds % 86_400) / 60;
    let shifted = days + 719_468; // Days from 0000-03-01 to 1970-01-01.
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        minute_of_day / 60,
        minute_of_day % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates_fall_on_the_calendar() {
        assert_eq!(super::utc_text(0), "1970-01-01 00:00 UTC");
        assert_eq!(super::utc_text(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(super::utc_text(1_795_705_440), "2026-11-26 15:04 UTC");
    }
}
