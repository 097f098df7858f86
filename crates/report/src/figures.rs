//! The figure files: for each benchmark, the figures its report draws.
//! A paper's file (`papers/<bench>.toml`) carries the paper's reported
//! values, each series cited, beside selectors of Remora's measurements;
//! a substrate benchmark's file (`figures/<bench>.toml`) has only
//! Remora's. The files are compiled in, so a report needs nothing beside
//! the binary.

use serde::Deserialize;

/// Every figure file, named by the benchmark it pairs with.
const FILES: [(&str, &str); 9] = [
    ("cowbird", include_str!("../papers/cowbird.toml")),
    ("clover", include_str!("../papers/clover.toml")),
    ("soda", include_str!("../papers/soda.toml")),
    ("bifrost", include_str!("../papers/bifrost.toml")),
    ("tiga", include_str!("../papers/tiga.toml")),
    ("fabric", include_str!("../figures/fabric.toml")),
    ("switch", include_str!("../figures/switch.toml")),
    ("verbs", include_str!("../figures/verbs.toml")),
    ("kv", include_str!("../figures/kv.toml")),
];

/// Why a figure file was refused.
#[derive(Debug, thiserror::Error)]
pub enum FigureFileError {
    #[error("figure file {bench}: {error}")]
    Syntax {
        bench: String,
        error: toml::de::Error,
    },
    #[error("figure file {bench}, figure {figure}: {rule}")]
    Invalid {
        bench: String,
        figure: String,
        rule: &'static str,
    },
}

/// One benchmark's figures, and the paper they come from if any.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FigureFile {
    pub paper: Option<Paper>,
    #[serde(default, rename = "figure")]
    pub figures: Vec<Figure>,
}

/// The paper whose figures a benchmark reproduces.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Paper {
    pub system: String,
    pub title: String,
    pub venue: String,
    pub bench: String,
    /// Where Remora's setup differs from the paper's, beyond what every
    /// benchmark shares (the page states that part once).
    #[serde(default)]
    pub differences: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Figure {
    pub id: String,
    /// The figure as its paper labels it ("Fig. 8"); for Remora's own
    /// figures, a short name.
    pub cite: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    #[serde(default)]
    pub x_log: bool,
    #[serde(default)]
    pub y_log: bool,
    /// Names on the x axis: bars instead of lines.
    #[serde(default)]
    pub categorical: bool,
    pub note: Option<String>,
    #[serde(default)]
    pub paper: Vec<PaperSeries>,
    #[serde(default)]
    pub remora: Vec<RemoraSeries>,
}

/// A series of the paper's figure, as the paper reports it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaperSeries {
    pub label: String,
    /// Read off a plot (true), or stated in the text or a table (false).
    pub approximate: bool,
    pub cite: String,
    pub points: Vec<Point>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Point {
    pub x: X,
    pub y: f64,
}

/// An x value: a number, or a name on a categorical axis.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum X {
    Number(f64),
    Name(String),
}

impl std::fmt::Display for X {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            X::Number(number) => write!(formatter, "{number}"),
            X::Name(name) => formatter.write_str(name),
        }
    }
}

/// A series of Remora's, picked out of the benchmark's JSON.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoraSeries {
    pub label: String,
    /// Multiplies the JSON's values into the figure's unit.
    #[serde(default = "unit_scale")]
    pub scale: f64,
    pub results: Option<ResultsSource>,
    pub series: Option<SeriesSource>,
    pub ratios: Option<Vec<RatioPoint>>,
}

fn unit_scale() -> f64 {
    1.0
}

/// Rows of the JSON's `results` with this metric: the variants matching
/// a pattern whose `{x}` captures the x value, one exact variant at `x`,
/// or a list of exact variants each at its own x.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultsSource {
    pub metric: String,
    pub variant: Option<String>,
    pub x: Option<X>,
    pub variants: Option<Vec<NamedVariant>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedVariant {
    pub variant: String,
    pub x: X,
}

/// `series[name]`, an array of objects, with two of their fields.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeriesSource {
    pub name: String,
    pub x: String,
    pub y: String,
}

/// One ratio of the JSON, drawn at `x`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RatioPoint {
    pub name: String,
    pub x: X,
}

impl FigureFile {
    /// Parses and checks one file.
    pub fn parse(bench: &str, text: &str) -> Result<FigureFile, FigureFileError> {
        let file: FigureFile = toml::from_str(text).map_err(|error| FigureFileError::Syntax {
            bench: bench.into(),
            error,
        })?;
        for figure in &file.figures {
            figure.check().map_err(|rule| FigureFileError::Invalid {
                bench: bench.into(),
                figure: figure.id.clone(),
                rule,
            })?;
        }
        Ok(file)
    }
}

impl Figure {
    fn check(&self) -> Result<(), &'static str> {
        if self.remora.is_empty() {
            return Err("a figure needs at least one series of Remora's");
        }
        let all_x = self
            .paper
            .iter()
            .flat_map(|series| series.points.iter().map(|point| &point.x));
        for x in all_x {
            if matches!(x, X::Name(_)) != self.categorical {
                return Err("x values are names exactly when the figure is categorical");
            }
        }
        for series in &self.remora {
            let sources = [
                series.results.is_some(),
                series.series.is_some(),
                series.ratios.is_some(),
            ];
            if sources.iter().filter(|&&set| set).count() != 1 {
                return Err("each Remora series takes exactly one of results, series or ratios");
            }
            if let Some(results) = &series.results {
                results.check()?;
            }
        }
        Ok(())
    }
}

impl ResultsSource {
    fn check(&self) -> Result<(), &'static str> {
        match (&self.variant, &self.x, &self.variants) {
            (Some(pattern), None, None) if pattern.contains("{x}") => Ok(()),
            (Some(pattern), Some(_), None) if !pattern.contains("{x}") => Ok(()),
            (None, None, Some(list)) if !list.is_empty() => Ok(()),
            _ => Err("results takes a variant pattern with {x}, a variant and its x, or a list of variants"),
        }
    }
}

/// Every figure file, checked.
pub fn all() -> Result<Vec<(&'static str, FigureFile)>, FigureFileError> {
    FILES
        .iter()
        .map(|(bench, text)| FigureFile::parse(bench, text).map(|file| (*bench, file)))
        .collect()
}

/// Where a benchmark comes in a report: the papers' first, in the order
/// of [`FILES`], then any other.
pub fn position(bench: &str) -> usize {
    FILES
        .iter()
        .position(|(name, _)| *name == bench)
        .unwrap_or(FILES.len())
}

/// The figure file of one benchmark, if it has one.
pub fn of(bench: &str) -> Result<Option<FigureFile>, FigureFileError> {
    FILES
        .iter()
        .find(|(name, _)| *name == bench)
        .map(|(name, text)| FigureFile::parse(name, text))
        .transpose()
}
