//! The HTML page: one self-contained document, styles inline and plots
//! as inline SVG, so it opens anywhere with no network. Each benchmark
//! gets a section with its ratios against their targets, its figures
//! beside the paper's and the citation of every paper value, where its
//! setup differs from the paper's, and its configuration and host.

use crate::figures::{Figure, FigureFile, Paper};
use crate::plot::{self, DrawnSeries, Source};
use crate::results::BenchResult;
use crate::select::select;
use crate::targets::{Target, Targets, Verdict};
use serde_json::Value;
use std::fmt::Write;

/// What every benchmark's setup shares and no paper's does.
pub const SETUP_DIFFERENCES: [&str; 5] = [
    "The RDMA NIC is Remora's soft RNIC: RoCEv2 done in userspace software, so every verb costs host CPU time that a ConnectX NIC spends in silicon. That NIC-emulation CPU is reported apart from application CPU.",
    "The programmable switch is Remora's software switch, not a Tofino ASIC: its per-packet cost is CPU time, not a fixed pipeline latency.",
    "The benchmarks ran on the machine named in each section (2 logical CPUs here, shared and noisy) where the papers used multi-core servers and 25–100 Gb/s links; absolute figures differ, so the targets are ratios measured side by side in one run, and medians are quoted.",
    "SmartNIC and DPU cores (SODA's DPU, TIGA's SoC cores) are virtual: their speed is calibrated from real runs of the real code on this machine, and each benchmark's configuration carries that calibration.",
    "Simulated runs use the simulator's ideal NIC, which charges link time but no NIC processing, PCIe crossing or atomic serialization, except the variants marked ConnectX-5, whose NICs charge a hardware profile's costs, each cited from a published measurement (crates/host/profiles/cx5.toml).",
];

/// Why a page could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error(transparent)]
    Figures(#[from] crate::figures::FigureFileError),
    #[error(transparent)]
    Targets(#[from] crate::targets::TargetsError),
    #[error(transparent)]
    Plot(#[from] crate::plot::PlotError),
}

/// Text made safe for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for character in text.chars() {
        match character {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            _ => escaped.push(character),
        }
    }
    escaped
}

const STYLE: &str = "
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.4}
h1{margin-bottom:.2em} h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0} td,th{border:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f4f4f4} td.number{text-align:right;font-variant-numeric:tabular-nums}
tr.met td.verdict{background:#d8f0d8;color:#145214} tr.missed td.verdict{background:#f8d7d7;color:#7a1010}
tr.unjudged td.verdict{background:#eee;color:#555}
figure{margin:1.2em 0;padding:.6em;border:1px solid #e4e4e4;border-radius:4px} figure svg{width:100%;max-width:860px;height:auto;display:block}
figcaption{font-size:.92em} .citation{color:#555} .missing{color:#7a1010}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.85em}
nav a{margin-right:1em}
";

/// A page of benchmark results: one section per result, the papers'
/// benchmarks first.
pub fn benchmarks_page(results: &[BenchResult], generated: &str) -> Result<String, PageError> {
    let targets = crate::targets::all()?;
    let mut ordered: Vec<&BenchResult> = results.iter().collect();
    ordered.sort_by_key(|result| crate::figures::position(&result.bench));
    let results = ordered;
    let mut html = header("Remora benchmark report");
    let _ = write!(
        html,
        "<h1>Remora benchmark report</h1><p>{} benchmarks, generated {}. Each section draws Remora's figures beside the paper's where a paper gives them; the paper's values are cited, and those read off a plot or worked out from the text are marked approximate.</p>",
        results.len(),
        escape(generated)
    );
    html.push_str("<nav>");
    for result in &results {
        let _ = write!(
            html,
            "<a href=\"#bench-{0}\">{0}</a>",
            escape(&result.bench)
        );
    }
    html.push_str("</nav><section id=\"setup\"><h2>Remora's setup against the papers'</h2><ul>");
    for difference in SETUP_DIFFERENCES {
        let _ = write!(html, "<li>{}</li>", escape(difference));
    }
    html.push_str("</ul></section>");
    for result in &results {
        html.push_str(&bench_section(result, &targets)?);
    }
    html.push_str("</body></html>\n");
    Ok(html)
}

fn header(title: &str) -> String {
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head><body>",
        escape(title)
    )
}

fn bench_section(result: &BenchResult, targets: &Targets) -> Result<String, PageError> {
    let bench = result.bench.as_str();
    let file = crate::figures::of(bench)?;
    let paper = file.as_ref().and_then(|file| file.paper.as_ref());
    let mut html = format!("<section class=\"bench\" id=\"bench-{}\">", escape(bench));
    let _ = write!(html, "<h2>{}</h2>", escape(&section_title(bench, paper)));
    let _ = write!(
        html,
        "<p class=\"citation\">from {}</p>",
        escape(&result.path.display().to_string())
    );
    html.push_str(&ratios_table(&result.json, targets.get(bench)));
    match &file {
        Some(file) => html.push_str(&figures(file, &result.json)?),
        None => html.push_str("<p>No figure file describes this benchmark's plots.</p>"),
    }
    if let Some(paper) = paper.filter(|paper| !paper.differences.is_empty()) {
        html.push_str("<h3>Where this setup differs from the paper's</h3><ul>");
        for difference in &paper.differences {
            let _ = write!(html, "<li>{}</li>", escape(difference));
        }
        html.push_str("</ul>");
    }
    html.push_str(&configuration_and_host(&result.json));
    html.push_str("</section>");
    Ok(html)
}

fn section_title(bench: &str, paper: Option<&Paper>) -> String {
    match paper {
        Some(paper) => format!(
            "{bench}: {} ({}, {})",
            paper.system, paper.title, paper.venue
        ),
        None => format!("{bench}: Remora's substrate"),
    }
}

/// A figure as the page shows it: three significant digits (at three
/// decimals, 2.09e-4 read "0.000").
fn figure_text(value: f64) -> String {
    figure_text_with(value, 0)
}

/// As [`figure_text`], with `more` decimals.
fn figure_text_with(value: f64, more: usize) -> String {
    let decimals = if value.abs() >= 100.0 {
        0
    } else if value.abs() >= 10.0 {
        1
    } else if value.abs() >= 1.0 || value == 0.0 || !value.is_finite() {
        3
    } else {
        (2.0 - value.abs().log10().floor()).clamp(3.0, 15.0) as usize
    };
    let decimals = decimals + more;
    format!("{value:.decimals$}")
}

/// A measured ratio with as many digits as keep it on its own side of
/// its target: 1.4196 shown as "1.420" beside "≥ 1.42, missed" read as a
/// contradiction.
fn measured_text(value: f64, target: Option<&Target>) -> String {
    let Some(target) = target else {
        return figure_text(value);
    };
    let verdict = target.judge(Some(value));
    // Bounded; past it, Rust's shortest text that reads back as the value
    // itself, so as the same verdict.
    (0..12)
        .map(|more| figure_text_with(value, more))
        .find(|text| text.parse().ok().map(|shown| target.judge(Some(shown))) == Some(verdict))
        .unwrap_or_else(|| format!("{value}"))
}

fn ratios_table(
    json: &Value,
    targets: Option<&std::collections::BTreeMap<String, Target>>,
) -> String {
    let written = json["ratios"].as_object();
    // Every ratio the run wrote, and every ratio with a bound it did not:
    // a target the run never measured is shown missed, not left out.
    let mut names: std::collections::BTreeSet<&str> = written
        .into_iter()
        .flat_map(|ratios| ratios.keys().map(String::as_str))
        .collect();
    names.extend(targets.into_iter().flat_map(|targets| {
        targets
            .iter()
            .filter(|(_, target)| target.has_bound())
            .map(|(name, _)| name.as_str())
    }));
    if names.is_empty() {
        return "<p>This run wrote no ratios.</p>".into();
    }
    let mut html = String::from(
        "<h3>Ratios against their targets</h3><table class=\"ratios\"><tr><th>ratio</th><th>measured</th><th>target</th><th>verdict</th><th>what it measures</th></tr>",
    );
    for name in names {
        let value = written
            .and_then(|ratios| ratios.get(name))
            .and_then(Value::as_f64);
        let target = targets.and_then(|targets| targets.get(name));
        let verdict = target.map_or(Verdict::Unjudged, |target| target.judge(value));
        let (class, word) = match verdict {
            Verdict::Met => ("met", "met"),
            Verdict::Missed => ("missed", "missed"),
            Verdict::NotMeasured => ("missed", "missed: not measured"),
            Verdict::Unjudged => ("unjudged", "no target"),
        };
        let measured = value.map_or("not measured".into(), |value| measured_text(value, target));
        let meaning = target.map_or(String::new(), |target| match target.issue {
            Some(issue) => format!("{} (issue {issue})", target.text),
            None => target.text.clone(),
        });
        let _ = write!(
            html,
            "<tr class=\"{class}\"><td>{}</td><td class=\"number\">{}</td><td>{}</td><td class=\"verdict\">{word}</td><td>{}</td></tr>",
            escape(name),
            escape(&measured),
            escape(&target.map_or("none".into(), Target::describe)),
            escape(&meaning)
        );
    }
    html.push_str("</table>");
    html
}

fn figures(file: &FigureFile, json: &Value) -> Result<String, PageError> {
    let mut html = String::from("<h3>Figures</h3>");
    for figure in &file.figures {
        html.push_str(&figure_block(figure, json)?);
    }
    Ok(html)
}

/// The series a figure draws: the paper's, then Remora's from this run.
pub fn drawn_series(figure: &Figure, json: &Value) -> Vec<DrawnSeries> {
    let paper = figure.paper.iter().map(|series| DrawnSeries {
        label: series.label.clone(),
        samples: series
            .points
            .iter()
            .map(|point| crate::select::Sample {
                x: point.x.clone(),
                y: point.y,
            })
            .collect(),
        source: if series.approximate {
            Source::PaperApproximate
        } else {
            Source::PaperExact
        },
    });
    let remora = figure.remora.iter().map(|series| DrawnSeries {
        label: series.label.clone(),
        samples: select(series, json, figure.categorical),
        source: Source::Remora,
    });
    paper.chain(remora).collect()
}

fn figure_block(figure: &Figure, json: &Value) -> Result<String, PageError> {
    let series = drawn_series(figure, json);
    let measured = series
        .iter()
        .any(|one| one.source == Source::Remora && !one.samples.is_empty());
    let mut html = format!(
        "<figure id=\"figure-{}\"><figcaption><b>{}</b>: {}</figcaption>",
        escape(&figure.id),
        escape(&figure.cite),
        escape(&figure.title)
    );
    if !measured {
        html.push_str(
            "<p class=\"missing\">This run did not measure this figure (a quick run, or a run without it); the paper's series alone are drawn.</p>",
        );
    }
    if series.iter().any(|one| !one.samples.is_empty()) {
        html.push_str(&plot::draw(figure, &series)?);
    }
    html.push_str("<figcaption><ul>");
    for (paper, one) in figure.paper.iter().zip(&series) {
        let how = if paper.approximate {
            "approximate (read off the paper's plot, or worked out from its text)"
        } else {
            "exact, stated in the paper"
        };
        let _ = write!(
            html,
            "<li class=\"citation\">{} (paper): {}, {how}; {}</li>",
            escape(&paper.label),
            escape(&paper.cite),
            points_text(one)
        );
    }
    for one in series.iter().filter(|one| one.source == Source::Remora) {
        let points = if one.samples.is_empty() {
            "not in this run".to_string()
        } else {
            points_text(one)
        };
        let _ = write!(html, "<li>{}: {}</li>", escape(&one.label), points);
    }
    html.push_str("</ul>");
    if let Some(note) = &figure.note {
        let _ = write!(html, "<p>{}</p>", escape(note));
    }
    html.push_str("</figcaption></figure>");
    Ok(html)
}

fn points_text(series: &DrawnSeries) -> String {
    let points: Vec<String> = series
        .samples
        .iter()
        .map(|sample| format!("{}: {}", plot::describe_x(&sample.x), figure_text(sample.y)))
        .collect();
    escape(&points.join(", "))
}

/// A JSON object's fields as table rows, strings bare and other values
/// as JSON (nothing for a value that is not an object).
fn push_rows(html: &mut String, object: &Value) {
    for (key, value) in object.as_object().into_iter().flatten() {
        let text = value.as_str().map_or(value.to_string(), str::to_string);
        let _ = write!(
            html,
            "<tr><th>{}</th><td>{}</td></tr>",
            escape(key),
            escape(&text)
        );
    }
}

fn configuration_and_host(json: &Value) -> String {
    let mut html = String::from("<h3>Configuration and host</h3><table class=\"host\">");
    push_rows(&mut html, &json["host"]);
    let config = serde_json::to_string_pretty(&json["config"]).unwrap_or_default();
    let _ = write!(
        html,
        "</table><pre class=\"config\">{}</pre>",
        escape(&config)
    );
    html
}

/// A page of `remora demo`'s checks and figures, from the summary its
/// `--json` writes.
pub fn demo_page(summary: &Value, generated: &str) -> Result<String, PageError> {
    let mut html = header("Remora demo report");
    // The verdict from the summary's count and its rows both: read from
    // the count alone, a summary without one (another version's, or a
    // file written elsewhere) said every check passed beside failed rows.
    let rows = summary["rows"].as_array().map_or(&[][..], Vec::as_slice);
    let failed_rows = rows
        .iter()
        .filter(|row| row["ok"].as_bool() != Some(true))
        .count() as u64;
    let verdict = match summary["failed"].as_u64() {
        Some(0) if failed_rows == 0 => "Every check passed.".to_string(),
        Some(failed) => format!("{} checks FAILED.", failed.max(failed_rows)),
        None if failed_rows > 0 => format!("{failed_rows} checks FAILED."),
        None => "The summary gives no count of failed checks.".to_string(),
    };
    // An interrupted demo ran only some steps: its checks passing says
    // nothing of the others.
    let not_run: Vec<&str> = summary["not_run"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let verdict = match not_run.is_empty() {
        true => verdict,
        false => format!(
            "{verdict} Interrupted: not run: {}.",
            escape(&not_run.join(", "))
        ),
    };
    let _ = write!(
        html,
        "<h1>Remora demo report</h1><p>Generated {}. {}</p>",
        escape(generated),
        verdict
    );
    html.push_str(&demo_tour(summary)?);
    for (name, step) in summary.as_object().into_iter().flatten() {
        if step.get("variants").is_some() {
            html.push_str(&demo_system(name, step));
        }
    }
    html.push_str("</body></html>\n");
    Ok(html)
}

fn demo_tour(summary: &Value) -> Result<String, PageError> {
    let rows = summary["rows"].as_array().map_or(&[][..], Vec::as_slice);
    let mut html = String::from(
        "<section class=\"bench\" id=\"demo-tour\"><h2>The fabric tour: every RC operation, checked</h2><table class=\"ratios\"><tr><th>operation</th><th>bytes</th><th>status</th><th>frames</th><th>wire bytes</th><th>check</th><th>verdict</th></tr>",
    );
    for row in rows {
        let ok = row["ok"].as_bool() == Some(true);
        let text = |key: &str| {
            escape(
                &row[key]
                    .as_str()
                    .map_or(row[key].to_string(), str::to_string),
            )
        };
        let _ = write!(
            html,
            "<tr class=\"{}\"><td>{}</td><td class=\"number\">{}</td><td>{}</td><td class=\"number\">{}</td><td class=\"number\">{}</td><td>{}</td><td class=\"verdict\">{}</td></tr>",
            if ok { "met" } else { "missed" },
            text("operation"),
            text("bytes"),
            text("status"),
            text("frames"),
            text("wire_bytes"),
            text("checked"),
            if ok { "ok" } else { "FAILED" }
        );
    }
    html.push_str("</table>");
    let figure = Figure {
        id: "demo-wire".into(),
        cite: "Tour".into(),
        title: "Bytes on the wire per operation, both directions".into(),
        x_label: "operation".into(),
        y_label: "wire bytes".into(),
        x_log: false,
        y_log: true,
        categorical: true,
        note: None,
        paper: Vec::new(),
        remora: Vec::new(),
    };
    let samples = rows
        .iter()
        .filter_map(|row| {
            Some(crate::select::Sample {
                x: crate::figures::X::Name(row["operation"].as_str()?.into()),
                y: row["wire_bytes"].as_f64()?,
            })
        })
        .collect();
    let series = [DrawnSeries {
        label: "Remora".into(),
        samples,
        source: Source::Remora,
    }];
    let _ = write!(
        html,
        "<figure id=\"figure-demo-wire\"><figcaption><b>{}</b>: {}</figcaption>{}</figure></section>",
        escape(&figure.cite),
        escape(&figure.title),
        plot::draw(&figure, &series)?
    );
    Ok(html)
}

fn demo_system(name: &str, step: &Value) -> String {
    let mut html = format!(
        "<section class=\"bench\" id=\"demo-{0}\"><h2>{0}</h2>",
        escape(name)
    );
    let failures = step["failures"].as_array().map_or(&[][..], Vec::as_slice);
    if failures.is_empty() {
        html.push_str("<p>Every check passed.</p>");
    } else {
        html.push_str("<ul class=\"missing\">");
        for failure in failures {
            let _ = write!(html, "<li>{}</li>", escape(&failure.to_string()));
        }
        html.push_str("</ul>");
    }
    for variant in step["variants"].as_array().into_iter().flatten() {
        html.push_str("<table class=\"host\">");
        push_rows(&mut html, variant);
        html.push_str("</table>");
    }
    html.push_str("</section>");
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_figures_keep_three_significant_digits() {
        assert_eq!(figure_text(2.09e-4), "0.000209");
        assert_eq!(figure_text(0.5), "0.500");
        assert_eq!(figure_text(1.5), "1.500");
        assert_eq!(figure_text(0.0), "0.000");
    }

    /// 1.4196 against "≥ 1.42" read "1.420 | ≥ 1.42 | missed".
    #[test]
    fn a_measured_ratio_is_shown_on_its_own_side_of_its_target() {
        let target = Target {
            at_least: Some(1.42),
            at_most: None,
            issue: None,
            text: String::new(),
        };
        let shown = measured_text(1.4196, Some(&target));
        assert!(shown.parse::<f64>().unwrap() < 1.42, "{shown}");
        assert_eq!(measured_text(1.5, Some(&target)), "1.500");
    }
}
