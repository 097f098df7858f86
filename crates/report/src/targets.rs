//! The targets of the benchmarks' ratios, from the issues that set them
//! (`data/targets.toml`): a report colours each ratio by whether it met
//! its target.

use serde::Deserialize;
use std::collections::BTreeMap;

const TARGETS: &str = include_str!("../data/targets.toml");

/// One ratio's target: at least or at most a value, or none when the
/// ratio is there to be read, not judged.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    pub at_least: Option<f64>,
    pub at_most: Option<f64>,
    /// The issue that set it.
    pub issue: Option<u32>,
    /// What the ratio means.
    pub text: String,
}

/// How a measured ratio stands against its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Missed,
    /// A target, and no number to judge (absent, null, or not finite):
    /// not met, since the run never showed it.
    NotMeasured,
    /// No target.
    Unjudged,
}

impl Target {
    pub fn judge(&self, value: Option<f64>) -> Verdict {
        if !self.has_bound() {
            return Verdict::Unjudged;
        }
        let Some(value) = value.filter(|value| value.is_finite()) else {
            return Verdict::NotMeasured;
        };
        let verdicts = [
            self.at_least.map(|bound| value >= bound),
            self.at_most.map(|bound| value <= bound),
        ];
        match verdicts {
            [None, None] => Verdict::Unjudged,
            _ if verdicts.iter().flatten().all(|&met| met) => Verdict::Met,
            _ => Verdict::Missed,
        }
    }

    /// Whether the ratio is judged (it has a bound), not only described.
    pub fn has_bound(&self) -> bool {
        self.at_least.is_some() || self.at_most.is_some()
    }

    /// "≥ 1.42", "≤ 0.15", "none".
    pub fn describe(&self) -> String {
        match (self.at_least, self.at_most) {
            (Some(low), Some(high)) => format!("{low} to {high}"),
            (Some(low), None) => format!("≥ {low}"),
            (None, Some(high)) => format!("≤ {high}"),
            (None, None) => "none".into(),
        }
    }

    /// How far the value is along the way to its target: 1 at the target,
    /// more when it beats it, whichever way the target points.
    pub fn attainment(&self, value: f64) -> Option<f64> {
        match (self.at_least, self.at_most) {
            (Some(low), None) if low > 0.0 => Some(value / low),
            (None, Some(high)) if value > 0.0 => Some(high / value),
            _ => None,
        }
    }
}

/// Why the targets file was refused.
#[derive(Debug, thiserror::Error)]
#[error("data/targets.toml: {0}")]
pub struct TargetsError(#[from] toml::de::Error);

/// Every benchmark's targets, by benchmark then ratio.
pub type Targets = BTreeMap<String, BTreeMap<String, Target>>;

pub fn all() -> Result<Targets, TargetsError> {
    Ok(toml::from_str(TARGETS)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(at_least: Option<f64>, at_most: Option<f64>) -> Target {
        Target {
            at_least,
            at_most,
            issue: None,
            text: String::new(),
        }
    }

    #[test]
    fn a_ratio_meets_or_misses_its_bound_either_way() {
        assert_eq!(target(Some(1.42), None).judge(Some(1.5)), Verdict::Met);
        assert_eq!(target(Some(1.42), None).judge(Some(1.3)), Verdict::Missed);
        assert_eq!(target(None, Some(0.15)).judge(Some(0.1)), Verdict::Met);
        assert_eq!(target(None, Some(0.15)).judge(Some(0.2)), Verdict::Missed);
        assert_eq!(target(None, None).judge(Some(3.0)), Verdict::Unjudged);
        assert_eq!(target(Some(1.0), None).judge(None), Verdict::NotMeasured);
        assert_eq!(
            target(Some(1.0), None).judge(Some(f64::NAN)),
            Verdict::NotMeasured
        );
        assert_eq!(target(None, None).judge(None), Verdict::Unjudged);
        assert_eq!(target(Some(2.0), None).attainment(1.0), Some(0.5));
        assert_eq!(target(None, Some(1.5)).attainment(3.0), Some(0.5));
    }

    #[test]
    fn the_targets_file_parses_and_every_target_says_what_it_measures() {
        let targets = all().unwrap();
        assert!(targets.len() >= 9, "{:?}", targets.keys());
        for (bench, ratios) in &targets {
            for (name, target) in ratios {
                assert!(!target.text.is_empty(), "{bench}.{name} has no text");
            }
        }
    }
}
