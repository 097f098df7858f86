//! Remora's points out of a benchmark's JSON, as a figure file's
//! selectors name them.

use crate::figures::{RemoraSeries, ResultsSource, SeriesSource, X};
use serde_json::Value;

/// A point of a drawn series.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub x: X,
    pub y: f64,
}

/// The points `series` selects from `bench_json`, scaled into the
/// figure's unit; x values are names when the figure is `categorical`.
/// A selector that matches nothing yields no points: the page then says
/// the series is missing from this run rather than drawing nothing.
pub fn select(series: &RemoraSeries, bench_json: &Value, categorical: bool) -> Vec<Sample> {
    let mut samples = if let Some(source) = &series.results {
        from_results(source, bench_json, categorical)
    } else if let Some(source) = &series.series {
        from_series(source, bench_json)
    } else {
        series
            .ratios
            .iter()
            .flatten()
            .filter_map(|point| {
                let y = bench_json["ratios"][&point.name].as_f64()?;
                Some(Sample {
                    x: point.x.clone(),
                    y,
                })
            })
            .collect()
    };
    samples.retain(|sample| sample.y.is_finite());
    for sample in &mut samples {
        sample.y *= series.scale;
    }
    if !categorical {
        samples.sort_by(|left, right| number(&left.x).total_cmp(&number(&right.x)));
    }
    samples
}

/// The number of a numeric x (0 for a name, which a numeric figure never
/// holds: [`crate::figures`] refuses it).
pub fn number(x: &X) -> f64 {
    match x {
        X::Number(number) => *number,
        X::Name(_) => 0.0,
    }
}

fn from_results(source: &ResultsSource, bench_json: &Value, categorical: bool) -> Vec<Sample> {
    let rows = bench_json["results"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let metric_rows = rows
        .iter()
        .filter(|row| row["metric"].as_str() == Some(source.metric.as_str()));
    let mut samples = Vec::new();
    for row in metric_rows {
        let (Some(variant), Some(y)) = (row["variant"].as_str(), row["value"].as_f64()) else {
            continue;
        };
        for x in xs_of(source, variant, categorical) {
            samples.push(Sample { x, y });
        }
    }
    samples
}

/// Where a row of `variant` is drawn under `source`: nowhere when it is
/// not selected, and at several x when a list names it more than once (a
/// flat reference line, say).
fn xs_of(source: &ResultsSource, variant: &str, categorical: bool) -> Vec<X> {
    match &source.variants {
        Some(list) => list
            .iter()
            .filter(|named| named.variant == variant)
            .map(|named| named.x.clone())
            .collect(),
        None => x_of_pattern(source, variant, categorical)
            .into_iter()
            .collect(),
    }
}

/// The x a row of `variant` sits at under `source`'s pattern, if any.
fn x_of_pattern(source: &ResultsSource, variant: &str, categorical: bool) -> Option<X> {
    let pattern = source.variant.as_deref()?;
    let Some((prefix, suffix)) = pattern.split_once("{x}") else {
        return (pattern == variant).then(|| source.x.clone()).flatten();
    };
    let captured = variant
        .strip_prefix(prefix)?
        .strip_suffix(suffix)
        .filter(|middle| !middle.is_empty())?;
    if categorical {
        Some(X::Name(captured.into()))
    } else {
        parse_number(captured).map(X::Number)
    }
}

/// A number as variant names write it: `16`, `0.75`, `64B`, `4KiB`,
/// `1MiB`.
pub fn parse_number(text: &str) -> Option<f64> {
    let units = [("KiB", 1024.0), ("MiB", 1024.0 * 1024.0), ("B", 1.0)];
    for (suffix, factor) in units {
        if let Some(digits) = text.strip_suffix(suffix) {
            return digits.parse::<f64>().ok().map(|value| value * factor);
        }
    }
    text.parse().ok()
}

fn from_series(source: &SeriesSource, bench_json: &Value) -> Vec<Sample> {
    let entries = bench_json["series"][&source.name]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    entries
        .iter()
        .filter_map(|entry| {
            let x = entry[&source.x].as_f64()?;
            let y = entry[&source.y].as_f64()?;
            Some(Sample { x: X::Number(x), y })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::figures::{NamedVariant, RatioPoint};
    use serde_json::json;

    fn remora(results: Option<ResultsSource>) -> RemoraSeries {
        RemoraSeries {
            label: "Remora".into(),
            scale: 1.0,
            results,
            series: None,
            ratios: None,
        }
    }

    fn bench() -> Value {
        json!({
            "results": [
                {"variant": "c16_plain", "metric": "throughput", "value": 2.0, "unit": "Mops"},
                {"variant": "c1_plain", "metric": "throughput", "value": 1.0, "unit": "Mops"},
                {"variant": "c1_plain", "metric": "p99", "value": 9.0, "unit": "us"},
                {"variant": "c4_resolver", "metric": "throughput", "value": 3.0, "unit": "Mops"},
                {"variant": "read_4KiB", "metric": "gbps", "value": 5.0, "unit": "Gb/s"}
            ],
            "series": {"sweep": [{"n": 2, "rate": 4.0}, {"n": 1, "rate": 3.0}, {"n": "bad"}]},
            "ratios": {"speedup": 1.4}
        })
    }

    #[test]
    fn a_pattern_captures_x_from_the_variant_and_sorts_by_it() {
        let series = remora(Some(ResultsSource {
            metric: "throughput".into(),
            variant: Some("c{x}_plain".into()),
            x: None,
            variants: None,
        }));
        let samples = select(&series, &bench(), false);
        let xs: Vec<_> = samples.iter().map(|sample| number(&sample.x)).collect();
        assert_eq!(xs, [1.0, 16.0]);
        assert_eq!(samples[1].y, 2.0);
    }

    #[test]
    fn sizes_in_variant_names_are_numbers_and_exact_variants_take_their_x() {
        let sized = remora(Some(ResultsSource {
            metric: "gbps".into(),
            variant: Some("read_{x}".into()),
            x: None,
            variants: None,
        }));
        assert_eq!(select(&sized, &bench(), false)[0].x, X::Number(4096.0));
        let listed = remora(Some(ResultsSource {
            metric: "throughput".into(),
            variant: None,
            x: None,
            variants: Some(vec![NamedVariant {
                variant: "c4_resolver".into(),
                x: X::Name("resolver".into()),
            }]),
        }));
        assert_eq!(
            select(&listed, &bench(), true),
            [Sample {
                x: X::Name("resolver".into()),
                y: 3.0
            }]
        );
    }

    #[test]
    fn series_and_ratios_select_their_fields_and_skip_what_is_not_a_number() {
        let mut from_series = remora(None);
        from_series.series = Some(SeriesSource {
            name: "sweep".into(),
            x: "n".into(),
            y: "rate".into(),
        });
        from_series.scale = 10.0;
        let samples = select(&from_series, &bench(), false);
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0].y, 30.0);
        let mut from_ratios = remora(None);
        from_ratios.ratios = Some(vec![
            RatioPoint {
                name: "speedup".into(),
                x: X::Number(64.0),
            },
            RatioPoint {
                name: "absent".into(),
                x: X::Number(1.0),
            },
        ]);
        assert_eq!(select(&from_ratios, &bench(), false).len(), 1);
    }
}
