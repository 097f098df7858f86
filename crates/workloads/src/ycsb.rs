//! The YCSB core workload.
//!
//! A [`WorkloadSpec`] comes from a preset ([`WorkloadSpec::preset`], the
//! A–F of YCSB's `workloads/` directory) or from a YCSB property file
//! ([`WorkloadSpec::from_properties`]); the properties understood are
//! `recordcount`, `operationcount`, `readproportion`, `updateproportion`,
//! `insertproportion`, `scanproportion`, `readmodifywriteproportion`,
//! `requestdistribution` (`uniform`, `zipfian`, `latest`),
//! `zipfianconstant` (not in YCSB's core, which fixes 0.99; other
//! generators take it), `maxscanlength`, `fieldcount`, `fieldlength` and
//! `insertstart`. Other keys of real YCSB files (`workload`,
//! `readallfields`, ...) are kept but do not change the mix.
//!
//! A [`Generator`] turns a spec and a seed into operations, the same ones
//! for the same seed.

use crate::distribution::{DistributionError, KeyChooser, Zipfian};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkloadError {
    #[error("line {line}: {message}")]
    Syntax { line: usize, message: String },
    #[error("property {key}: {message}")]
    Value { key: String, message: String },
    #[error("the operation proportions sum to {0}, not 1")]
    Proportions(f64),
    #[error("no YCSB preset {0:?} (there are a, b, c, d, e and f)")]
    UnknownPreset(String),
    #[error(transparent)]
    Distribution(#[from] DistributionError),
    #[error("insert keys ran out: the next would pass 2^64")]
    KeysExhausted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RequestDistribution {
    Uniform,
    Zipfian,
    Latest,
}

/// The operation mix, as proportions that sum to one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Mix {
    pub read: f64,
    pub update: f64,
    pub insert: f64,
    pub scan: f64,
    pub read_modify_write: f64,
}

/// The kinds of operation, in the order of [`Mix::proportions`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OperationKind {
    Read,
    Update,
    Insert,
    Scan,
    ReadModifyWrite,
}

const OPERATION_KINDS: [OperationKind; 5] = [
    OperationKind::Read,
    OperationKind::Update,
    OperationKind::Insert,
    OperationKind::Scan,
    OperationKind::ReadModifyWrite,
];

impl Mix {
    /// The kind a draw in [0, 1) picks: the first whose cumulative
    /// proportion passes it. A draw past them all (a normalised mix may
    /// sum to 1 less about 1e-16) picks the last kind the mix has, never
    /// one it leaves out (it fell through to read-modify-write).
    fn kind_of_draw(&self, draw: f64) -> OperationKind {
        let proportions = self.proportions();
        let mut bound = 0.0;
        for (kind, proportion) in OPERATION_KINDS.iter().zip(proportions) {
            bound += proportion;
            if draw < bound {
                return *kind;
            }
        }
        let last = proportions
            .iter()
            .rposition(|proportion| *proportion > 0.0)
            .expect("a valid mix has a kind with a positive proportion");
        OPERATION_KINDS[last]
    }

    fn proportions(&self) -> [f64; 5] {
        [
            self.read,
            self.update,
            self.insert,
            self.scan,
            self.read_modify_write,
        ]
    }

    /// The mix with each weight over their sum; an error if they sum to
    /// zero, when no operation could be drawn.
    fn normalized(self) -> Result<Mix, WorkloadError> {
        let total: f64 = self.proportions().iter().sum();
        if !(total > 0.0 && total.is_finite()) {
            return Err(WorkloadError::Proportions(total));
        }
        Ok(Mix {
            read: self.read / total,
            update: self.update / total,
            insert: self.insert / total,
            scan: self.scan / total,
            read_modify_write: self.read_modify_write / total,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkloadSpec {
    pub record_count: u64,
    pub operation_count: u64,
    pub mix: Mix,
    pub distribution: RequestDistribution,
    pub zipfian_constant: f64,
    pub max_scan_length: u64,
    pub field_count: u64,
    pub field_length: u64,
    pub insert_start: u64,
    /// What the proportions as given summed to (1 when they are already
    /// proportions): YCSB sizes a zipfian chooser's key span from the
    /// insert proportion as given, `mix.insert` times this.
    pub given_weight_total: f64,
    /// Every property read, including ones that do not change the mix.
    pub properties: BTreeMap<String, String>,
}

/// The operation lines of YCSB's core workload files, as presets. Like
/// the files, they give every proportion: one left out would take YCSB's
/// default weight (updates 0.05) rather than zero.
const PRESETS: [(&str, &str); 6] = [
    ("a", "readproportion=0.5\nupdateproportion=0.5\nscanproportion=0\ninsertproportion=0\nrequestdistribution=zipfian"),
    ("b", "readproportion=0.95\nupdateproportion=0.05\nscanproportion=0\ninsertproportion=0\nrequestdistribution=zipfian"),
    ("c", "readproportion=1\nupdateproportion=0\nscanproportion=0\ninsertproportion=0\nrequestdistribution=zipfian"),
    ("d", "readproportion=0.95\nupdateproportion=0\nscanproportion=0\ninsertproportion=0.05\nrequestdistribution=latest"),
    ("e", "readproportion=0\nupdateproportion=0\nscanproportion=0.95\ninsertproportion=0.05\nrequestdistribution=zipfian\nmaxscanlength=100"),
    ("f", "readproportion=0.5\nupdateproportion=0\nscanproportion=0\ninsertproportion=0\nreadmodifywriteproportion=0.5\nrequestdistribution=zipfian"),
];

/// Parses Java-style properties: `key=value` or `key: value`, `#` and `!`
/// comments, blank lines; later keys win.
pub fn parse_properties(text: &str) -> Result<BTreeMap<String, String>, WorkloadError> {
    let mut properties = BTreeMap::new();
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        let Some(split) = line.find(['=', ':']) else {
            return Err(WorkloadError::Syntax {
                line: index + 1,
                message: format!("{line:?} is not key=value"),
            });
        };
        let (key, value) = (line[..split].trim(), line[split + 1..].trim());
        if key.is_empty() {
            return Err(WorkloadError::Syntax {
                line: index + 1,
                message: "empty key".into(),
            });
        }
        properties.insert(key.to_string(), value.to_string());
    }
    Ok(properties)
}

fn number<T: std::str::FromStr>(
    properties: &BTreeMap<String, String>,
    key: &str,
    default: T,
) -> Result<T, WorkloadError> {
    match properties.get(key) {
        None => Ok(default),
        Some(text) => text.parse().map_err(|_| WorkloadError::Value {
            key: key.into(),
            message: format!("{text:?} is not a number of the right kind"),
        }),
    }
}

fn proportion(
    properties: &BTreeMap<String, String>,
    key: &str,
    default: f64,
) -> Result<f64, WorkloadError> {
    let value: f64 = number(properties, key, default)?;
    // Weights, as YCSB draws them: any that is not negative.
    if !(value >= 0.0 && value.is_finite()) {
        return Err(WorkloadError::Value {
            key: key.into(),
            message: format!("{value} is negative or not a finite number"),
        });
    }
    Ok(value)
}

impl WorkloadSpec {
    /// YCSB's workload A–F (case-insensitive, with or without "workload").
    pub fn preset(name: &str) -> Result<WorkloadSpec, WorkloadError> {
        let short = name.to_ascii_lowercase();
        let short = short.trim_start_matches("workload");
        let (_, text) = PRESETS
            .iter()
            .find(|(preset, _)| *preset == short)
            .ok_or_else(|| WorkloadError::UnknownPreset(name.into()))?;
        WorkloadSpec::from_properties(text)
    }

    /// A spec from a YCSB property file's text. As YCSB's CoreWorkload
    /// does, each proportion not given takes its own default (reads 0.95,
    /// updates 0.05, the rest 0), and the five are weights: the mix is
    /// each over their sum. So a file giving only `readproportion=0.5`
    /// runs reads 0.5 / 0.55 and updates 0.05 / 0.55, as YCSB runs it.
    pub fn from_properties(text: &str) -> Result<WorkloadSpec, WorkloadError> {
        let properties = parse_properties(text)?;
        let weights = Mix {
            read: proportion(&properties, "readproportion", 0.95)?,
            update: proportion(&properties, "updateproportion", 0.05)?,
            insert: proportion(&properties, "insertproportion", 0.0)?,
            scan: proportion(&properties, "scanproportion", 0.0)?,
            read_modify_write: proportion(&properties, "readmodifywriteproportion", 0.0)?,
        };
        let given_weight_total = weights.proportions().iter().sum();
        let mix = weights.normalized()?;
        let distribution = match properties
            .get("requestdistribution")
            .map(String::as_str)
            .unwrap_or("uniform")
        {
            "uniform" => RequestDistribution::Uniform,
            "zipfian" => RequestDistribution::Zipfian,
            "latest" => RequestDistribution::Latest,
            other => {
                return Err(WorkloadError::Value {
                    key: "requestdistribution".into(),
                    message: format!("{other:?} is not uniform, zipfian or latest"),
                })
            }
        };
        let spec = WorkloadSpec {
            record_count: number(&properties, "recordcount", 1000)?,
            operation_count: number(&properties, "operationcount", 1000)?,
            mix,
            distribution,
            zipfian_constant: number(&properties, "zipfianconstant", 0.99)?,
            max_scan_length: number(&properties, "maxscanlength", 1000)?,
            field_count: number(&properties, "fieldcount", 10)?,
            field_length: number(&properties, "fieldlength", 100)?,
            insert_start: number(&properties, "insertstart", 0)?,
            given_weight_total,
            properties,
        };
        spec.key_chooser()?;
        Ok(spec)
    }

    /// Checks what a spec's fields must be, wherever they were set (they
    /// are public, and callers change a parsed spec): the proportions sum
    /// to 1, scans have a length, the keys fit 64 bits.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        let mix = self.mix;
        let proportions = mix.proportions();
        let total: f64 = proportions.iter().sum();
        let each_valid = proportions
            .iter()
            .all(|proportion| (0.0..=1.0).contains(proportion));
        if !each_valid || !total.is_finite() || (total - 1.0).abs() > 1e-9 {
            return Err(WorkloadError::Proportions(total));
        }
        if !(self.given_weight_total > 0.0 && self.given_weight_total.is_finite()) {
            return Err(WorkloadError::Proportions(self.given_weight_total));
        }
        if self.max_scan_length == 0 && mix.scan > 0.0 {
            return Err(WorkloadError::Value {
                key: "maxscanlength".into(),
                message: "scans need a positive length".into(),
            });
        }
        // Every distribution draws among the loaded records: with none,
        // a zipfian spec (whose span counts the inserts to come) passed
        // here and the first draw panicked.
        if self.record_count == 0 {
            return Err(WorkloadError::Value {
                key: "recordcount".into(),
                message: "an empty keyspace: operations draw their keys among the loaded \
                          records, so load at least one"
                    .into(),
            });
        }
        if self.insert_start.checked_add(self.key_span()).is_none() {
            return Err(WorkloadError::Value {
                key: "insertstart".into(),
                message: "insertstart plus the records and the inserts expected pass 2^64".into(),
            });
        }
        Ok(())
    }

    /// The keys a zipfian chooser spans: the loaded ones and twice the
    /// inserts the run expects, as YCSB's CoreWorkload sizes it: from
    /// `insertproportion` as given, not over the weights' sum (they differ
    /// only when the proportions do not sum to 1). Rebuilt from the
    /// normalised proportion, it can fall one insert short of YCSB's
    /// count where that product lands on a whole number.
    fn key_span(&self) -> u64 {
        let insert_as_given = self.mix.insert * self.given_weight_total;
        let expected_inserts = (self.operation_count as f64 * insert_as_given * 2.0) as u64;
        self.record_count.saturating_add(expected_inserts)
    }

    /// The key chooser this spec asks for, once the spec is valid.
    pub fn key_chooser(&self) -> Result<KeyChooser, WorkloadError> {
        self.validate()?;
        Ok(match self.distribution {
            RequestDistribution::Uniform => KeyChooser::uniform(self.record_count)?,
            RequestDistribution::Zipfian => {
                KeyChooser::Zipfian(Zipfian::new(self.key_span(), self.zipfian_constant, true)?)
            }
            RequestDistribution::Latest => KeyChooser::Latest(Zipfian::new(
                self.record_count,
                self.zipfian_constant,
                false,
            )?),
        })
    }
}

/// One operation of the workload. Keys are record numbers; stores map them
/// to their own key format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Operation {
    Read { key: u64 },
    Update { key: u64 },
    Insert { key: u64 },
    Scan { key: u64, length: u64 },
    ReadModifyWrite { key: u64 },
}

/// Turns a spec into operations, deterministically per seed.
pub struct Generator {
    spec: WorkloadSpec,
    chooser: KeyChooser,
    rng: ChaCha8Rng,
    /// Records that exist: the loaded ones plus those inserted so far.
    inserted: u64,
    /// The insert keys ran out: the iterator has ended.
    exhausted: bool,
}

impl Generator {
    pub fn new(spec: WorkloadSpec, seed: u64) -> Result<Generator, WorkloadError> {
        let chooser = spec.key_chooser()?;
        Ok(Generator {
            inserted: spec.insert_start + spec.record_count,
            exhausted: false,
            spec,
            chooser,
            rng: ChaCha8Rng::seed_from_u64(seed),
        })
    }

    pub fn spec(&self) -> &WorkloadSpec {
        &self.spec
    }

    /// The keys loaded before the run: `insertstart .. insertstart + recordcount`.
    pub fn loaded_keys(&self) -> std::ops::Range<u64> {
        self.spec.insert_start..self.spec.insert_start + self.spec.record_count
    }

    /// The next operation; [`WorkloadError::KeysExhausted`] once an insert
    /// would need a key past 2^64 (a run longer than the spec's
    /// operation count can get there from an `insertstart` near it).
    pub fn next_operation(&mut self) -> Result<Operation, WorkloadError> {
        let draw: f64 = self.rng.gen();
        let existing = self.spec.insert_start
            + self
                .chooser
                .next_key(self.inserted - self.spec.insert_start, &mut self.rng);
        Ok(match self.spec.mix.kind_of_draw(draw) {
            OperationKind::Read => Operation::Read { key: existing },
            OperationKind::Update => Operation::Update { key: existing },
            OperationKind::Insert => {
                let key = self.inserted;
                self.inserted = key.checked_add(1).ok_or(WorkloadError::KeysExhausted)?;
                Operation::Insert { key }
            }
            OperationKind::Scan => Operation::Scan {
                key: existing,
                length: self.rng.gen_range(1..=self.spec.max_scan_length),
            },
            OperationKind::ReadModifyWrite => Operation::ReadModifyWrite { key: existing },
        })
    }
}

impl Iterator for Generator {
    type Item = Operation;

    fn next(&mut self) -> Option<Operation> {
        // Ends when the insert keys run out, for good: reads and updates
        // drawn after that would not be the run the spec describes.
        if self.exhausted {
            return None;
        }
        let operation = self.next_operation().ok();
        self.exhausted = operation.is_none();
        operation
    }
}

impl std::iter::FusedIterator for Generator {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A normalised mix can sum to 1 less a rounding error; a draw past
    /// its sum fell through to read-modify-write, which this mix has not.
    #[test]
    fn a_draw_past_a_mix_that_sums_short_of_one_picks_a_kind_the_mix_has() {
        let mix = Mix {
            read: 0.5,
            update: 0.5 - f64::EPSILON,
            insert: 0.0,
            scan: 0.0,
            read_modify_write: 0.0,
        };
        let largest_draw = 1.0 - f64::EPSILON / 2.0;
        assert!(largest_draw < 1.0 && largest_draw >= mix.read + mix.update);
        assert_eq!(mix.kind_of_draw(largest_draw), OperationKind::Update);
        assert_eq!(mix.kind_of_draw(0.25), OperationKind::Read);
    }

    /// YCSB sizes a zipfian chooser from `insertproportion` as given:
    /// weights of 1 and 1 span 100 records and 2 × 1000 × 1 inserts, not
    /// 2 × 1000 × 0.5 (the normalised proportion, used before).
    #[test]
    fn the_zipfian_span_counts_inserts_by_the_proportion_as_given() {
        let text = "recordcount=100\noperationcount=1000\nreadproportion=1\nupdateproportion=0\ninsertproportion=1\nrequestdistribution=zipfian";
        let spec = WorkloadSpec::from_properties(text).unwrap();
        assert_eq!(spec.mix.insert, 0.5);
        assert_eq!(spec.key_span(), 100 + 2000);
        // Proportions that already sum to 1 are their own weights
        // (workload E: zipfian, inserts 0.05).
        let preset = WorkloadSpec::preset("e").unwrap();
        assert_eq!(preset.given_weight_total, 1.0);
        assert_eq!(preset.key_span(), 1000 + 100);
    }
}
