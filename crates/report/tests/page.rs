//! The report drawn from fixed benchmark JSON (`tests/fixtures`, quick
//! runs of every benchmark): every figure draws Remora's points, the page
//! has a section per benchmark and no empty plot, and nothing in it
//! points at the network.

use remora_report::figures;
use remora_report::page::{benchmarks_page, drawn_series};
use remora_report::plot::Source;
use remora_report::results::{read, BenchResult};
use std::path::PathBuf;

fn fixture(bench: &str) -> BenchResult {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/{bench}.json"));
    read(&path).unwrap_or_else(|error| panic!("{error}"))
}

fn all_fixtures() -> Vec<BenchResult> {
    figures::all()
        .unwrap()
        .iter()
        .map(|(bench, _)| fixture(bench))
        .collect()
}

#[test]
fn every_figure_draws_remora_points_from_its_fixture() {
    for (bench, file) in figures::all().unwrap() {
        let result = fixture(bench);
        assert!(!file.figures.is_empty(), "{bench} has no figures");
        for figure in &file.figures {
            let series = drawn_series(figure, &result.json);
            let remora_points: usize = series
                .iter()
                .filter(|one| one.source == Source::Remora)
                .map(|one| one.samples.len())
                .sum();
            assert!(
                remora_points > 0,
                "{bench} {}: no Remora series matched the fixture",
                figure.id
            );
            let svg = remora_report::plot::draw(figure, &series).unwrap();
            assert!(svg.starts_with("<svg"), "{bench} {}", figure.id);
            assert!(data_marks(&svg) > 0, "{bench} {}: an empty plot", figure.id);
        }
    }
}

#[test]
fn every_paper_series_is_cited_and_marked_exact_or_approximate() {
    for (bench, file) in figures::all().unwrap() {
        let Some(paper) = &file.paper else { continue };
        assert_eq!(paper.bench, bench);
        assert!(
            !paper.differences.is_empty(),
            "{bench}: no setup differences"
        );
        let paper_series: Vec<_> = file
            .figures
            .iter()
            .flat_map(|figure| &figure.paper)
            .collect();
        assert!(!paper_series.is_empty(), "{bench}: no paper values at all");
        for series in paper_series {
            assert!(!series.cite.is_empty(), "{bench} {}", series.label);
            assert!(!series.points.is_empty(), "{bench} {}", series.label);
        }
    }
}

/// Points, bars and dashes of data in a plotters SVG: circles are the
/// line plots' markers, and filled rectangles other than the white
/// background and legend box are bars and legend swatches.
fn data_marks(svg: &str) -> usize {
    let circles = svg.matches("<circle").count();
    // Each rectangle's own attributes: the legend's border (no fill)
    // counted, so every plot seemed to hold data.
    let coloured_rectangles = svg
        .split("<rect")
        .skip(1)
        .map(|element| &element[..element.find('>').unwrap_or(element.len())])
        .filter(|attributes| {
            !attributes.contains("fill=\"#FFFFFF\"") && !attributes.contains("fill=\"none\"")
        })
        .count();
    circles + coloured_rectangles
}

/// A series whose every point falls off its log axis draws nothing: the
/// count of data marks says so (it counted the legend's border).
#[test]
fn a_plot_with_no_point_on_its_axis_has_no_data_marks() {
    use remora_report::figures::{Figure, X};
    use remora_report::plot::{draw, DrawnSeries};
    use remora_report::select::Sample;
    let figure = Figure {
        id: "empty".into(),
        cite: "Fig. 0".into(),
        title: "nothing on a log axis".into(),
        x_label: "x".into(),
        y_label: "y".into(),
        x_log: false,
        y_log: true,
        categorical: false,
        note: None,
        paper: Vec::new(),
        remora: Vec::new(),
    };
    let series = [DrawnSeries {
        label: "zeros".into(),
        samples: vec![Sample {
            x: X::Number(1.0),
            y: 0.0,
        }],
        source: Source::Remora,
    }];
    let svg = draw(&figure, &series).unwrap();
    assert_eq!(data_marks(&svg), 0);
}

/// Each `<svg>...</svg>` of a page.
fn plots(html: &str) -> Vec<&str> {
    html.split("<svg")
        .skip(1)
        .map(|rest| &rest[..rest.find("</svg>").expect("a closed svg")])
        .collect()
}

#[test]
fn the_page_has_a_section_per_benchmark_and_no_empty_plot() {
    let results = all_fixtures();
    let html = benchmarks_page(&results, "now").unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    for result in &results {
        let section = format!("<section class=\"bench\" id=\"bench-{}\">", result.bench);
        assert!(html.contains(&section), "no section for {}", result.bench);
    }
    assert!(html.contains("id=\"setup\""));
    let plots = plots(&html);
    assert!(plots.len() >= results.len(), "{} plots", plots.len());
    for plot in plots {
        assert!(
            data_marks(plot) > 0,
            "an empty plot: {}",
            &plot[..200.min(plot.len())]
        );
    }
    for verdict in ["class=\"met\"", "class=\"missed\"", "class=\"unjudged\""] {
        assert!(html.contains(verdict), "no ratio {verdict}");
    }
}

#[test]
fn nothing_on_the_page_loads_from_the_network() {
    let html = benchmarks_page(&all_fixtures(), "now").unwrap();
    for attribute in ["src=", "href="] {
        for (at, _) in html.match_indices(attribute) {
            let value = html[at + attribute.len()..].trim_start_matches(['"', '\'']);
            assert!(
                !value.starts_with("http://")
                    && !value.starts_with("https://")
                    && !value.starts_with("//"),
                "{}",
                &html[at..(at + 80).min(html.len())]
            );
        }
    }
    assert!(!html.contains("@import"));
    assert!(!html.contains("url("));
}

/// The table row of `ratio` on `html`.
fn ratio_row<'a>(html: &'a str, ratio: &str) -> Option<&'a str> {
    let cell = format!("<td>{ratio}</td>");
    let at = html.find(&cell)?;
    let start = html[..at].rfind("<tr")?;
    let end = at + html[at..].find("</tr>")?;
    Some(&html[start..end])
}

/// A targeted ratio that a run wrote as null (a NaN), or did not write at
/// all (a figure it could not measure), showed grey as "no target", or not
/// at all: a target could not fail by going unmeasured. Both now show
/// missed.
#[test]
fn a_targeted_ratio_the_run_did_not_measure_shows_missed() {
    let mut result = fixture("clover");
    result.json["ratios"] = serde_json::json!({"resolver_speedup_ycsba_z075_c64": null});
    let html = benchmarks_page(&[result], "now").unwrap();
    for ratio in [
        "resolver_speedup_ycsba_z075_c64",
        "top8_speedup_ycsba_z075_c64",
    ] {
        let row = ratio_row(&html, ratio).unwrap_or_else(|| panic!("no row for {ratio}"));
        assert!(row.contains("class=\"missed\""), "{row}");
        assert!(row.contains("not measured"), "{row}");
    }
}

#[test]
fn text_from_results_is_escaped() {
    let mut result = fixture("fabric");
    result.json["config"] = serde_json::json!({"note": "<script>alert(1)</script>"});
    let html = benchmarks_page(&[result], "now").unwrap();
    assert!(!html.contains("<script>"));
    assert!(html.contains("&lt;script&gt;"));
}

#[test]
fn a_demo_summary_becomes_a_page_of_its_checks() {
    let summary = serde_json::json!({
        "rows": [
            {"operation": "WRITE", "bytes": 64, "status": "Success", "frames": 2, "wire_bytes": 180, "checked": "bytes match", "ok": true},
            {"operation": "READ past the end", "bytes": 8, "status": "RemoteAccessError", "frames": 2, "wire_bytes": 150, "checked": "NAK", "ok": false}
        ],
        "failed": 1,
        "clover": {"variants": [{"name": "plain", "operations_per_second": 1000.0}], "failures": []}
    });
    let html = remora_report::page::demo_page(&summary, "now").unwrap();
    assert!(html.contains("1 checks FAILED"));
    assert!(html.contains("id=\"demo-clover\""));
    assert!(html.contains("READ past the end"));
    assert_eq!(plots(&html).len(), 1);
}

/// A summary with no `failed` count said "Every check passed." beside a
/// failed row; and one with neither said it too.
#[test]
fn a_demo_summary_without_a_failed_count_claims_no_success() {
    let failing = serde_json::json!({
        "rows": [{"operation": "READ", "bytes": 8, "status": "Success", "frames": 2, "wire_bytes": 150, "checked": "bytes differ", "ok": false}]
    });
    let html = remora_report::page::demo_page(&failing, "now").unwrap();
    assert!(html.contains("1 checks FAILED"), "{html}");
    // One with no rows has nothing to plot: an error, never a success.
    assert!(!matches!(
        remora_report::page::demo_page(&serde_json::json!({}), "now"),
        Ok(html) if html.contains("Every check passed")
    ));
}

/// An interrupted demo's page says which steps did not run: its passed
/// checks say nothing of them.
#[test]
fn an_interrupted_demos_page_names_the_steps_not_run() {
    let summary = serde_json::json!({
        "rows": [{"operation": "WRITE", "bytes": 64, "status": "Success", "frames": 2, "wire_bytes": 180, "checked": "bytes match", "ok": true}],
        "failed": 0,
        "interrupted": true,
        "not_run": ["soda", "bifrost"]
    });
    let html = remora_report::page::demo_page(&summary, "now").unwrap();
    assert!(
        html.contains("Interrupted: not run: soda, bifrost."),
        "{html}"
    );
}
