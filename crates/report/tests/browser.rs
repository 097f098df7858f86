//! The report page in a real headless browser (Debian's chromium): it
//! renders without a resource or script error, its DOM holds every
//! benchmark's section, and its screenshot is not blank.
//!
//! Without chromium the test says so and passes, unless
//! REMORA_REQUIRE_CHROMIUM=1 (as `.ci/run` sets), when it fails.

use std::path::{Path, PathBuf};
use std::process::Command;

const CHROMIUM: &str = "/usr/bin/chromium";

fn chromium_or_skip() -> bool {
    if Path::new(CHROMIUM).exists() {
        return true;
    }
    assert!(
        std::env::var_os("REMORA_REQUIRE_CHROMIUM").is_none(),
        "REMORA_REQUIRE_CHROMIUM is set but {CHROMIUM} is missing (apt-get install chromium)"
    );
    eprintln!("SKIPPED: {CHROMIUM} is not installed");
    false
}

/// Runs headless chromium on `page` with `mode` (--screenshot=..., or
/// --dump-dom), bounded in time, and returns its stdout and stderr.
fn chromium(profile: &Path, page: &Path, mode: &str) -> (String, String) {
    let output = Command::new("timeout")
        .args(["120", CHROMIUM])
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            // This machine's network is closed: without these, chromium
            // tries Google's hosts at every start.
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1200,2400",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(mode)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    assert!(output.status.success(), "chromium failed: {output:?}");
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn fixtures() -> Vec<PathBuf> {
    let directory = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut files: Vec<PathBuf> = std::fs::read_dir(directory)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.extension()
                .is_some_and(|extension| extension == "json")
        })
        .collect();
    files.sort();
    files
}

/// The share of pixels that are not the page's white, and how many
/// distinct colours the screenshot holds.
fn ink(png_path: &Path) -> (f64, usize) {
    let decoder = png::Decoder::new(std::fs::File::open(png_path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buffer = vec![0; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut buffer).unwrap();
    let channels = frame.color_type.samples();
    let pixels: Vec<&[u8]> = buffer[..frame.buffer_size()].chunks(channels).collect();
    let inked = pixels
        .iter()
        .filter(|pixel| pixel.iter().take(3).any(|&value| value < 240))
        .count();
    let colours: std::collections::HashSet<&[u8]> = pixels.iter().copied().collect();
    (inked as f64 / pixels.len() as f64, colours.len())
}

#[test]
fn the_report_renders_in_chromium_without_errors_and_is_not_blank() {
    if !chromium_or_skip() {
        return;
    }
    let directory = tempfile::tempdir().unwrap();
    let files = fixtures();
    let page = remora_report::benchmarks(&files, directory.path(), "now").unwrap();
    let profile = directory.path().join("profile");
    let (dom, _) = chromium(&profile, &page, "--dump-dom");
    for file in &files {
        let bench = file.file_stem().unwrap().to_str().unwrap();
        assert!(
            dom.contains(&format!("id=\"bench-{bench}\"")),
            "the rendered DOM has no {bench} section"
        );
    }
    let screenshot = directory.path().join("report.png");
    let (_, log) = chromium(
        &profile,
        &page,
        &format!("--screenshot={}", screenshot.display()),
    );
    for error in [
        "Failed to load resource",
        "Uncaught",
        "net::ERR_FILE",
        "Refused to",
    ] {
        assert!(!log.contains(error), "chromium logged {error}:\n{log}");
    }
    let (inked, colours) = ink(&screenshot);
    assert!(
        inked > 0.02 && colours >= 16,
        "a blank screenshot: {:.3} of pixels inked, {colours} colours",
        inked
    );
}
