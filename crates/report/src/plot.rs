//! A figure drawn to SVG with plotters: the paper's series dashed with
//! hollow markers, Remora's solid with filled ones, on the paper's axes.
//! Logarithmic axes are drawn as linear axes of log10 values, labelled
//! back in the original unit, so one code path serves every figure.

use crate::figures::{Figure, X};
use crate::select::{number, Sample};
use plotters::prelude::*;

/// The share of the y range left empty above the data, where the legend
/// sits.
const LEGEND_HEADROOM: f64 = 0.3;

/// Width and height of every plot, in SVG pixels.
pub const PLOT_SIZE: (u32, u32) = (720, 420);

/// A series as drawn: its label, points and whose it is.
#[derive(Debug, Clone)]
pub struct DrawnSeries {
    pub label: String,
    pub samples: Vec<Sample>,
    pub source: Source,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Stated in the paper's text or a table.
    PaperExact,
    /// Read off the paper's plot.
    PaperApproximate,
    Remora,
}

impl Source {
    fn is_paper(self) -> bool {
        self != Source::Remora
    }
}

/// Why a plot could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("figure {figure}: nothing to draw (no series has a point)")]
    Empty { figure: String },
    #[error("figure {figure}: {message}")]
    Drawing { figure: String, message: String },
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// Draws `figure` with `series` (paper and Remora alike) to an SVG
/// document.
pub fn draw(figure: &Figure, series: &[DrawnSeries]) -> Result<String, PlotError> {
    if series.iter().all(|one| one.samples.is_empty()) {
        return Err(PlotError::Empty {
            figure: figure.id.clone(),
        });
    }
    let mut svg = String::new();
    let drawn = if figure.categorical {
        draw_bars(&mut svg, figure, series)
    } else {
        draw_lines(&mut svg, figure, series)
    };
    drawn.map_err(|message| PlotError::Drawing {
        figure: figure.id.clone(),
        message,
    })?;
    Ok(scalable(&svg))
}

/// The SVG with a viewBox, so that the page can scale it to its column.
fn scalable(svg: &str) -> String {
    let (width, height) = PLOT_SIZE;
    let size = format!("width=\"{width}\" height=\"{height}\"");
    let with_view_box = format!("{size} viewBox=\"0 0 {width} {height}\"");
    svg.replacen(&size, &with_view_box, 1)
}

/// A value as an axis draws it: log10 on a logarithmic axis.
fn axis_value(value: f64, logarithmic: bool) -> Option<f64> {
    match logarithmic {
        true if value > 0.0 => Some(value.log10()),
        true => None,
        false => Some(value),
    }
}

/// The axis range covering `values`, with a margin below and room for the
/// legend above; a linear y axis starts at zero when every value is
/// positive.
fn range_of(
    values: impl Iterator<Item = f64>,
    from_zero: bool,
    headroom: f64,
) -> std::ops::Range<f64> {
    let (mut low, high) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(low, high), v| {
        (low.min(v), high.max(v))
    });
    if !low.is_finite() {
        return 0.0..1.0;
    }
    // A linear axis from zero holds zero (where bars start): all-negative
    // values included, as all-positive ones are.
    let mut high = high;
    if from_zero && low > 0.0 {
        low = 0.0;
    }
    if from_zero && high < 0.0 {
        high = 0.0;
    }
    let span = if high > low {
        high - low
    } else {
        high.abs().max(1.0)
    };
    let bottom = if from_zero && low == 0.0 {
        0.0
    } else {
        low - span * 0.08
    };
    let top = high + span * headroom;
    // Values near f64's limits overflow the span, and an infinite axis
    // never finishes placing its ticks: such an axis is drawn from the
    // values' own bounds, or a unit one if even those are infinite.
    match (bottom.is_finite(), top.is_finite()) {
        (true, true) => bottom..top,
        _ if low < high && (high - low).is_finite() => low..high,
        _ => 0.0..1.0,
    }
}

/// Where bars start: at zero on a linear axis (from the axis' bottom, a
/// negative bar looked like a short positive one, the worst figure like
/// the best), at the bottom of a logarithmic one, which has no zero.
fn bar_floor(y_range: &std::ops::Range<f64>, logarithmic: bool) -> f64 {
    match logarithmic {
        true => y_range.start,
        false => 0.0f64.clamp(y_range.start, y_range.end),
    }
}

/// "1.2k", "0.35", "4M": an axis label in the original unit.
fn label(value: f64, logarithmic: bool) -> String {
    let value = if logarithmic {
        10f64.powf(value)
    } else {
        value
    };
    let magnitude = value.abs();
    if magnitude >= 1e6 {
        format!("{}M", trim(value / 1e6))
    } else if magnitude >= 1e4 {
        format!("{}k", trim(value / 1e3))
    } else {
        trim(value)
    }
}

fn trim(value: f64) -> String {
    // A tick plotters reached by adding steps lands a hair off zero
    // (-2e-16), which read "-0.000000000000".
    let value = if value.abs() < 1e-12 { 0.0 } else { value };
    let text = if value.abs() >= 100.0 || value == value.round() {
        format!("{value:.0}")
    } else if value.abs() >= 1.0 {
        format!("{value:.1}")
    } else {
        // Two significant digits: at two decimals every tick below 0.005
        // read "0.00" (a log axis of latencies in seconds, all zeros).
        // Trailing zeros go: 0.0999... read "0.100" beside "0.20".
        let decimals = (1.0 - value.abs().log10().floor()).clamp(2.0, 12.0) as usize;
        let text = format!("{value:.decimals$}");
        return text.trim_end_matches('0').trim_end_matches('.').to_string();
    };
    text.trim_end_matches(".0").to_string()
}

fn colour(index: usize) -> RGBColor {
    PALETTE[index % PALETTE.len()]
}

fn legend_label(series: &DrawnSeries) -> String {
    match series.source {
        Source::PaperExact => format!("{} (paper)", series.label),
        Source::PaperApproximate => format!("{} (paper, approx.)", series.label),
        Source::Remora => series.label.clone(),
    }
}

fn error_text<E: std::fmt::Debug>(error: E) -> String {
    format!("{error:?}")
}

fn draw_lines(svg: &mut String, figure: &Figure, series: &[DrawnSeries]) -> Result<(), String> {
    let points: Vec<Vec<(f64, f64)>> = series
        .iter()
        .map(|one| {
            one.samples
                .iter()
                .filter_map(|sample| {
                    let x = axis_value(number(&sample.x), figure.x_log)?;
                    let y = axis_value(sample.y, figure.y_log)?;
                    Some((x, y))
                })
                .collect()
        })
        .collect();
    let x_range = range_of(points.iter().flatten().map(|point| point.0), false, 0.08);
    let y_range = range_of(
        points.iter().flatten().map(|point| point.1),
        !figure.y_log,
        LEGEND_HEADROOM,
    );
    let root = SVGBackend::with_string(svg, PLOT_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(error_text)?;
    let mut chart = ChartBuilder::on(&root)
        .margin(14)
        .x_label_area_size(50)
        .y_label_area_size(72)
        .build_cartesian_2d(x_range, y_range)
        .map_err(error_text)?;
    let (x_log, y_log) = (figure.x_log, figure.y_log);
    chart
        .configure_mesh()
        .x_desc(figure.x_label.as_str())
        .y_desc(figure.y_label.as_str())
        .x_label_formatter(&|value| label(*value, x_log))
        .y_label_formatter(&|value| label(*value, y_log))
        .light_line_style(RGBColor(235, 235, 235))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .draw()
        .map_err(error_text)?;
    for (index, (one, points)) in series.iter().zip(&points).enumerate() {
        let colour = colour(index);
        let paper = one.source.is_paper();
        if paper {
            chart
                .draw_series(DashedLineSeries::new(
                    points.iter().copied(),
                    6,
                    4,
                    colour.stroke_width(2),
                ))
                .map_err(error_text)?;
        } else {
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    colour.stroke_width(3),
                ))
                .map_err(error_text)?;
        }
        let marker_style = if paper {
            colour.stroke_width(2)
        } else {
            colour.filled()
        };
        chart
            .draw_series(
                points
                    .iter()
                    .map(|&point| Circle::new(point, 4, marker_style)),
            )
            .map_err(error_text)?
            .label(legend_label(one))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 22, y)], colour.stroke_width(3))
            });
    }
    draw_legend(&mut chart)?;
    root.present().map_err(error_text)
}

type Plane = plotters::coord::cartesian::Cartesian2d<
    plotters::coord::types::RangedCoordf64,
    plotters::coord::types::RangedCoordf64,
>;

fn draw_legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Plane>,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(180, 180, 180))
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(error_text)
}

/// The categories of a bar figure, in the order they first appear.
fn categories(series: &[DrawnSeries]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for sample in series.iter().flat_map(|one| &one.samples) {
        let name = sample.x.to_string();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

fn draw_bars(svg: &mut String, figure: &Figure, series: &[DrawnSeries]) -> Result<(), String> {
    let names = categories(series);
    let drawn: Vec<&DrawnSeries> = series
        .iter()
        .filter(|one| !one.samples.is_empty())
        .collect();
    let width = 0.8 / drawn.len() as f64;
    let y_range = range_of(
        drawn.iter().flat_map(|one| {
            one.samples
                .iter()
                .filter_map(|s| axis_value(s.y, figure.y_log))
        }),
        !figure.y_log,
        LEGEND_HEADROOM,
    );
    let floor = bar_floor(&y_range, figure.y_log);
    let root = SVGBackend::with_string(svg, PLOT_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(error_text)?;
    let count = names.len();
    let mut chart = ChartBuilder::on(&root)
        .margin(14)
        .x_label_area_size(50)
        .y_label_area_size(72)
        .build_cartesian_2d(-0.5..count as f64 - 0.5, y_range)
        .map_err(error_text)?;
    let category_at = |value: &f64| {
        let index = value.round();
        let on_a_bar = (value - index).abs() < 1e-6 && index >= 0.0;
        names
            .get(index as usize)
            .filter(|_| on_a_bar)
            .cloned()
            .unwrap_or_default()
    };
    let y_log = figure.y_log;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(count)
        .x_desc(figure.x_label.as_str())
        .y_desc(figure.y_label.as_str())
        .x_label_formatter(&category_at)
        .y_label_formatter(&|value| label(*value, y_log))
        .light_line_style(RGBColor(235, 235, 235))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .draw()
        .map_err(error_text)?;
    for (slot, one) in drawn.iter().enumerate() {
        let colour = colour(slot);
        let style = if one.source.is_paper() {
            colour.mix(0.35).filled()
        } else {
            colour.filled()
        };
        let bars = one.samples.iter().filter_map(|sample| {
            let index = names
                .iter()
                .position(|name| *name == sample.x.to_string())?;
            let left = index as f64 - 0.4 + slot as f64 * width;
            let top = axis_value(sample.y, figure.y_log)?;
            Some(Rectangle::new(
                [(left, floor), (left + width * 0.92, top)],
                style,
            ))
        });
        chart
            .draw_series(bars)
            .map_err(error_text)?
            .label(legend_label(one))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 16, y + 5)], style));
    }
    draw_legend(&mut chart)?;
    root.present().map_err(error_text)
}

/// The x values of a figure's series, as the page lists them beside the
/// plot.
pub fn describe_x(x: &X) -> String {
    match x {
        X::Number(value) => trim(*value),
        X::Name(name) => name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values of ±1e308 made an infinite axis, whose tick loop never
    /// ended: `remora report` hung on such a result file.
    #[test]
    fn an_axis_over_values_near_the_limits_of_f64_is_finite() {
        for values in [vec![1e308, -1e308], vec![f64::MAX], vec![-f64::MAX, 0.0]] {
            for from_zero in [false, true] {
                let range = range_of(values.iter().copied(), from_zero, 0.1);
                assert!(
                    range.start.is_finite() && range.end.is_finite() && range.start < range.end,
                    "{values:?}: {range:?}"
                );
                assert!(
                    (range.end - range.start).is_finite(),
                    "{values:?}: {range:?}"
                );
            }
        }
    }

    #[test]
    fn labels_read_in_the_original_unit_on_either_axis() {
        assert_eq!(label(3.0, true), "1000");
        assert_eq!(label(4.0, true), "10k");
        assert_eq!(label(0.5, false), "0.5");
        assert_eq!(label(2_500_000.0, false), "2.5M");
        assert_eq!(range_of([2.0, 4.0].into_iter(), true, 0.3), 0.0..5.2);
        assert_eq!(range_of(std::iter::empty(), true, 0.3), 0.0..1.0);
    }

    /// Ticks below 0.005 all read "0.00" (a log axis of small latencies).
    #[test]
    fn small_values_keep_two_significant_digits() {
        assert_ne!(label(-4.0, true), label(-3.0, true));
        assert_eq!(label(-4.0, true), "0.0001");
        assert_eq!(label(-4.5, true), "0.000032");
        assert_eq!(label(0.0, false), "0");
        assert_eq!(label(-2e-16, false), "0");
        assert_eq!(label(0.099_999_999_999_999_99, false), "0.1");
    }

    /// A mix of signs, or negatives alone: bars grow from zero, inside an
    /// axis that holds it.
    #[test]
    fn bars_of_either_sign_grow_from_zero() {
        let mixed = range_of([10.0, -100.0].into_iter(), true, 0.3);
        assert!(mixed.start < -100.0 && mixed.end > 10.0);
        assert_eq!(bar_floor(&mixed, false), 0.0);
        let negative = range_of([-5.0, -100.0].into_iter(), true, 0.3);
        assert!(negative.end >= 0.0, "{negative:?}");
        assert_eq!(bar_floor(&negative, false), 0.0);
        assert_eq!(bar_floor(&(1.0..3.0), true), 1.0);
    }
}
