//! A probability, validated once where it is made.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Why a number is not a probability.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("probability {value} is outside [0, 1]")]
pub struct ProbabilityError {
    pub value: f64,
}

/// A number in `[0, 1]` (never NaN). Fault profiles hold these, so a
/// profile read from a file is checked when it is read and the code that
/// draws from it cannot meet a bad value.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct Probability(f64);

impl Probability {
    pub const ZERO: Probability = Probability(0.0);
    pub const ONE: Probability = Probability(1.0);

    pub fn new(value: f64) -> Result<Probability, ProbabilityError> {
        // `contains` is false for NaN, so NaN is refused too.
        if (0.0..=1.0).contains(&value) {
            Ok(Probability(value))
        } else {
            Err(ProbabilityError { value })
        }
    }

    /// A probability written into the code. Evaluated in a constant, a
    /// bad literal fails the build; elsewhere it panics.
    ///
    /// # Panics
    /// If `value` is outside `[0, 1]` or NaN.
    pub const fn literal(value: f64) -> Probability {
        assert!(
            value >= 0.0 && value <= 1.0,
            "a probability is within [0, 1]"
        );
        Probability(value)
    }

    pub const fn get(self) -> f64 {
        self.0
    }

    /// `self × factor`, capped at one: half of a probability, say. Zero
    /// stays zero whatever the factor (0 × ∞ is NaN, which `min` took for
    /// certainty), and a NaN factor scales to zero.
    pub fn scaled(self, factor: f64) -> Probability {
        if self.0 == 0.0 || factor.is_nan() {
            return Probability::ZERO;
        }
        Probability((self.0 * factor.max(0.0)).min(1.0))
    }

    pub fn is_zero(self) -> bool {
        self.0 == 0.0
    }
}

impl TryFrom<f64> for Probability {
    type Error = ProbabilityError;

    fn try_from(value: f64) -> Result<Probability, ProbabilityError> {
        Probability::new(value)
    }
}

impl From<Probability> for f64 {
    fn from(probability: Probability) -> f64 {
        probability.0
    }
}

impl fmt::Display for Probability {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(formatter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_ends_are_probabilities_and_nan_is_not() {
        assert_eq!(Probability::new(0.0), Ok(Probability::ZERO));
        assert_eq!(Probability::new(1.0), Ok(Probability::ONE));
        assert!(Probability::new(f64::NAN).is_err());
        assert_eq!(Probability::new(1.5), Err(ProbabilityError { value: 1.5 }));
    }

    #[test]
    fn a_file_with_a_bad_probability_is_refused_when_read() {
        #[derive(Debug, Deserialize)]
        struct Profile {
            #[allow(dead_code)]
            loss: Probability,
        }
        let error = toml::from_str::<Profile>("loss = 2.0").unwrap_err();
        assert!(error.to_string().contains("outside [0, 1]"), "{error}");
        let good: Profile = toml::from_str("loss = 0.25").unwrap();
        assert_eq!(good.loss.get(), 0.25);
    }

    proptest! {
        #[test]
        fn scaling_stays_a_probability(value in 0.0f64..=1.0, factor in -2.0f64..4.0) {
            let scaled = Probability::new(value).unwrap().scaled(factor);
            prop_assert!(Probability::new(scaled.get()).is_ok());
        }

        #[test]
        fn serde_round_trips(value in 0.0f64..=1.0) {
            #[derive(Debug, PartialEq, Serialize, Deserialize)]
            struct Profile {
                loss: Probability,
            }
            let profile = Profile { loss: Probability::new(value).unwrap() };
            let text = toml::to_string(&profile).unwrap();
            prop_assert_eq!(toml::from_str::<Profile>(&text).unwrap(), profile);
        }
    }

    /// 0 × ∞ is NaN, and `NaN.min(1.0)` is 1: a zero probability scaled
    /// by infinity became certainty.
    #[test]
    fn zero_scaled_by_infinity_stays_zero() {
        assert_eq!(Probability::ZERO.scaled(f64::INFINITY), Probability::ZERO);
        assert_eq!(
            Probability::literal(0.5).scaled(f64::NAN),
            Probability::ZERO
        );
        assert_eq!(Probability::literal(0.5).scaled(4.0), Probability::ONE);
    }
}
