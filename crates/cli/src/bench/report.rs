//! A benchmark's results as `--json` writes them, the machine they ran on,
//! and the helpers every benchmark uses (medians, size labels).

use serde::Serialize;

#[derive(Serialize)]
pub struct Measurement {
    pub variant: String,
    pub metric: String,
    pub value: f64,
    pub unit: String,
}

#[derive(Serialize)]
pub struct Report {
    pub bench: String,
    pub config: serde_json::Value,
    pub host: Host,
    pub results: Vec<Measurement>,
    pub ratios: serde_json::Map<String, serde_json::Value>,
    /// Time series and sweeps that plots draw (for example TIGA's
    /// allocation over time); absent when a benchmark has none.
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub series: serde_json::Map<String, serde_json::Value>,
    /// The absolute figures of the baselines the ratios divide by (memcpy,
    /// ring-to-ring, a raw UDP ping-pong), so that a ratio cannot improve
    /// by its baseline slowing down unnoticed.
    #[serde(skip_serializing_if = "serde_json::Map::is_empty")]
    pub baselines: serde_json::Map<String, serde_json::Value>,
}

impl Report {
    /// An empty report of the benchmark `bench`, run with `config`, on
    /// this machine.
    pub fn new(bench: &str, config: serde_json::Value) -> Report {
        Report {
            bench: bench.into(),
            config,
            host: Host::probe(),
            results: Vec::new(),
            ratios: serde_json::Map::new(),
            series: serde_json::Map::new(),
            baselines: serde_json::Map::new(),
        }
    }

    /// Records a baseline's absolute figure, named with its unit last
    /// (`memcpy_1kib_ns`).
    pub fn baseline(&mut self, name: &str, value: f64) {
        self.baselines.insert(name.into(), serde_json::json!(value));
    }

    pub fn add(&mut self, variant: &str, metric: &str, value: f64, unit: &str) {
        self.results.push(Measurement {
            variant: variant.into(),
            metric: metric.into(),
            value,
            unit: unit.into(),
        });
    }
}

#[derive(Serialize)]
pub struct Host {
    pub cpu: String,
    pub logical_cpus: usize,
    pub kernel: String,
    pub remora_version: String,
}

impl Host {
    pub fn probe() -> Host {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find(|line| line.starts_with("model name"))
                    .map(|line| line.split(':').nth(1).unwrap_or("").trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let uname = rustix::system::uname();
        Host {
            cpu,
            logical_cpus: std::thread::available_parallelism().map_or(1, |count| count.get()),
            kernel: format!(
                "{} {}",
                uname.sysname().to_string_lossy(),
                uname.release().to_string_lossy()
            ),
            remora_version: env!("CARGO_PKG_VERSION").into(),
        }
    }
}

pub use remora_rack::endpoint::thread_cpu_ns;

/// "64B", "4KiB": sizes as variant names show them.
pub fn size_label(size: u32) -> String {
    if size >= 1024 {
        format!("{}KiB", size / 1024)
    } else {
        format!("{size}B")
    }
}

/// The median, which shared and noisy machines call for.
/// The median over rounds of `numerator / denominator`, each ratio taken
/// within one round (the slices are in round order), so that it compares
/// runs made side by side, not the best round of one against the worst of
/// the other. `None` without a round that measured both.
pub fn median_of_ratios(numerator: &[f64], denominator: &[f64]) -> Option<f64> {
    let mut ratios: Vec<f64> = numerator
        .iter()
        .zip(denominator)
        .map(|(top, bottom)| top / bottom)
        .filter(|ratio| ratio.is_finite())
        .collect();
    (!ratios.is_empty()).then(|| median(&mut ratios))
}

/// `numerator / denominator`, or NaN (not measured) when the denominator
/// measured nothing: an infinite ratio would read as a target met.
pub fn measured_ratio(numerator: f64, denominator: f64) -> f64 {
    let ratio = numerator / denominator;
    if ratio.is_finite() {
        ratio
    } else {
        f64::NAN
    }
}

/// The smaller of a running minimum and a new figure, where a figure not
/// measured (NaN or infinite) makes the minimum not measured for good:
/// `f64::min` passes NaN over, so a later measured figure hid it.
pub fn minimum_keeping_unmeasured(minimum: f64, figure: f64) -> f64 {
    if minimum.is_nan() || !figure.is_finite() {
        f64::NAN
    } else {
        minimum.min(figure)
    }
}

pub fn median(values: &mut [f64]) -> f64 {
    assert!(!values.is_empty());
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if values.len() % 2 == 1 {
        values[middle]
    } else {
        (values[middle - 1] + values[middle]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `f64::min` drops NaN, so a minimum over [NaN, 0.3, 0.4] read 0.3
    /// and a target could print as met with an app unmeasured; an
    /// infinite ratio (nothing served by the baseline) read as met too.
    #[test]
    fn a_figure_not_measured_keeps_the_minimum_not_measured() {
        let fold = |figures: &[f64]| {
            figures.iter().fold(f64::INFINITY, |minimum, figure| {
                minimum_keeping_unmeasured(minimum, *figure)
            })
        };
        assert!(fold(&[f64::NAN, 0.3, 0.4]).is_nan());
        assert!(fold(&[0.3, f64::NAN, 0.4]).is_nan());
        assert!(fold(&[0.3, f64::INFINITY]).is_nan());
        assert_eq!(fold(&[0.5, 0.3, 0.4]), 0.3);
        assert!(measured_ratio(1.0, 0.0).is_nan());
        assert!(measured_ratio(0.0, 0.0).is_nan());
        assert_eq!(measured_ratio(3.0, 2.0), 1.5);
    }

    /// The kv and verbs benchmarks divided each side's median round,
    /// which could come from different rounds: with the machine's drift,
    /// one device's best round against another's worst.
    #[test]
    fn ratios_are_taken_within_rounds_then_their_median() {
        let cowbird = [1.0, 2.0, 3.0];
        let local = [3.0, 1.0, 2.0];
        // Within rounds: 1/3, 2, 1.5; their median is 1.5. The medians'
        // ratio (2 / 2) would say 1.0.
        assert_eq!(median_of_ratios(&cowbird, &local), Some(1.5));
        assert_eq!(median_of_ratios(&[1.0], &[0.0]), None, "no finite ratio");
        assert_eq!(median_of_ratios(&[], &[]), None);
    }
}
