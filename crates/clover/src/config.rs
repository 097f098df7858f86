//! Clover's section of a rack file, `[clover]`: the store and its YCSB-style
//! workload, and whether the switch runs the in-network resolver. The rack
//! crate keeps the table unparsed; this module reads it, with typed
//! errors, into a [`Run`] for the embedded rack.
//!
//! ```toml
//! [clover]
//! clients = 16            # logical clients, one queue pair each
//! keys = 1024
//! operations = 4000       # requests in all
//! read_proportion = 0.5
//! distribution = "zipf"   # or "uniform"
//! zipf_theta = 0.75
//! value_bytes = 16
//! region = "8MiB"         # the memory node's region of versions
//! resolver = true         # the switch resolves write conflicts in flight
//! cached_keys = 1024      # hottest keys the resolver tracks
//! check_history = true    # every key's history checked for linearizability
//! grace_ms = 400          # garbage collection's grace; requests must end in under half
//! ```
//!
//! The grace is real time here, not simulated: the embedded rack shares the
//! machine's cores with whatever else runs, and a request descheduled past
//! its deadline (half the grace less a collection period) fails the run (it could read a reclaimed version). So a
//! rack file's default grace is ten times the simulator's 40 ms.

use crate::harness::{Run, SwitchChoice};
use crate::layout::{MAX_VALUE_BYTES, MIN_VALUE_BYTES};
use remora_rack::config::parse_section;
use remora_rack::RackConfig;
use serde::Deserialize;

/// The section's name in a rack file.
pub const SECTION: &str = "clover";

/// Why a `[clover]` section was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CloverConfigError {
    #[error("[clover] {0}")]
    Syntax(String),
    #[error("[clover] {field} is {value}: {rule}")]
    Invalid {
        field: &'static str,
        value: String,
        rule: &'static str,
    },
    #[error("[clover] needs a compute node and a memory node")]
    NoHosts,
}

/// How requests pick their keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Distribution {
    Zipf,
    Uniform,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClover {
    #[serde(default = "default_clients")]
    clients: usize,
    #[serde(default = "default_keys")]
    keys: u64,
    #[serde(default = "default_operations")]
    operations: u64,
    #[serde(default = "default_read_proportion")]
    read_proportion: f64,
    #[serde(default = "default_distribution")]
    distribution: Distribution,
    #[serde(default = "default_zipf_theta")]
    zipf_theta: f64,
    #[serde(default = "default_value_bytes")]
    value_bytes: usize,
    #[serde(default = "default_region")]
    region: String,
    #[serde(default)]
    resolver: bool,
    cached_keys: Option<usize>,
    #[serde(default = "default_check_history")]
    check_history: bool,
    #[serde(default = "default_grace_ms")]
    grace_ms: u64,
}

fn default_clients() -> usize {
    16
}

fn default_keys() -> u64 {
    1024
}

fn default_operations() -> u64 {
    4000
}

fn default_read_proportion() -> f64 {
    0.5
}

fn default_distribution() -> Distribution {
    Distribution::Zipf
}

fn default_zipf_theta() -> f64 {
    0.75
}

fn default_value_bytes() -> usize {
    16
}

fn default_region() -> String {
    "8MiB".into()
}

fn default_check_history() -> bool {
    true
}

fn default_grace_ms() -> u64 {
    400
}

/// Bounds the section is held to: a rack file is user input, and the run
/// sizes its rings, regions and histories from it.
const MAX_CLIENTS: usize = 256;
const MAX_KEYS: u64 = 1 << 20;
const MAX_OPERATIONS: u64 = 10_000_000;
const MAX_REGION_BYTES: u64 = 1 << 30;
/// Checking a history keeps every event of the run and orders each key's
/// clusters pairwise: past this many operations it takes gigabytes and
/// hours, so a longer run turns the check off.
const MAX_CHECKED_OPERATIONS: u64 = 1 << 18;
/// The grace bounds: below 4 ms a request's deadline (under half the grace) is
/// shorter than a scheduler tick; above a minute the run's time limit
/// (operations × grace) stops meaning anything.
const GRACE_MILLISECONDS: std::ops::RangeInclusive<u64> = 4..=60_000;

/// The `[clover]` section, checked.
#[derive(Debug, Clone, Copy)]
pub struct CloverConfig {
    pub run: Run,
}

impl CloverConfig {
    /// The rack file's `[clover]` table, if it has one, checked against the
    /// rack (Clover runs on its first compute and memory nodes).
    pub fn from_rack(rack: &RackConfig) -> Result<Option<CloverConfig>, CloverConfigError> {
        let Some(table) = rack.systems.get(SECTION) else {
            return Ok(None);
        };
        let config = CloverConfig::parse(table)?;
        if !rack.has_compute_and_memory() {
            return Err(CloverConfigError::NoHosts);
        }
        Ok(Some(config))
    }

    /// A `[clover]` table on its own.
    pub fn parse(table: &toml::Table) -> Result<CloverConfig, CloverConfigError> {
        let raw: RawClover = parse_section(table).map_err(CloverConfigError::Syntax)?;
        CloverConfig::validate(raw)
    }

    /// The region must hold what the store needs to make progress
    /// ([`crate::metadata::RegionPlan::bytes_to_run`]) at the section's
    /// value size: checked against one 64-byte version a key, 4 KiB values
    /// passed here and the load failed at deploy, and a region that held
    /// the first versions exactly left every put waiting for space.
    fn check_room(raw: &RawClover, region_bytes: u64, run: &Run) -> Result<(), CloverConfigError> {
        let metadata = run.store(std::time::Duration::ZERO).metadata;
        let needed = crate::metadata::RegionPlan::new(raw.keys, region_bytes)
            .and_then(|plan| plan.bytes_to_run(raw.value_bytes, raw.clients, &metadata))
            .ok()
            .filter(|needed| *needed <= region_bytes);
        if needed.is_none() {
            return Err(CloverConfigError::Invalid {
                field: "region",
                value: raw.region.clone(),
                rule: "room for every key's shortcut word, two versions of each in its value's \
                       size class, and a batch of slots for each client",
            });
        }
        Ok(())
    }

    fn validate(raw: RawClover) -> Result<CloverConfig, CloverConfigError> {
        let invalid =
            |field, value: String, rule| CloverConfigError::Invalid { field, value, rule };
        if !(1..=MAX_CLIENTS).contains(&raw.clients) {
            return Err(invalid("clients", raw.clients.to_string(), "from 1 to 256"));
        }
        if !(1..=MAX_KEYS).contains(&raw.keys) {
            return Err(invalid("keys", raw.keys.to_string(), "from 1 to 1048576"));
        }
        if !(1..=MAX_OPERATIONS).contains(&raw.operations) {
            return Err(invalid(
                "operations",
                raw.operations.to_string(),
                "from 1 to 10000000",
            ));
        }
        if raw.check_history && raw.operations > MAX_CHECKED_OPERATIONS {
            return Err(invalid(
                "check_history",
                "true".into(),
                "a checked history holds at most 262144 operations: set check_history = false",
            ));
        }
        if !(0.0..=1.0).contains(&raw.read_proportion) {
            return Err(invalid(
                "read_proportion",
                raw.read_proportion.to_string(),
                "from 0 to 1",
            ));
        }
        // YCSB's generator needs θ in (0, 1).
        if !(raw.zipf_theta > 0.0 && raw.zipf_theta < 1.0) {
            return Err(invalid(
                "zipf_theta",
                raw.zipf_theta.to_string(),
                "above 0 and below 1",
            ));
        }
        // What Clover stores (`layout`): below 8 bytes the section passed
        // and the run failed at deploy with a layout error.
        if !(MIN_VALUE_BYTES..=MAX_VALUE_BYTES).contains(&raw.value_bytes) {
            return Err(invalid(
                "value_bytes",
                raw.value_bytes.to_string(),
                "from 8 to 4096",
            ));
        }
        if !GRACE_MILLISECONDS.contains(&raw.grace_ms) {
            return Err(invalid(
                "grace_ms",
                raw.grace_ms.to_string(),
                "from 4 to 60000",
            ));
        }
        let region_bytes = remora_rack::config::parse_size(&raw.region)
            .ok()
            .filter(|bytes| (1 << 20..=MAX_REGION_BYTES).contains(bytes))
            .ok_or_else(|| invalid("region", raw.region.clone(), "a size from 1MiB to 1GiB"))?;
        // The keys' shortcut words and first versions must fit the region:
        // found at deploy, the run failed after the rack's own workload,
        // naming neither the section nor a field.
        if crate::metadata::RegionPlan::new(raw.keys, region_bytes).is_err() {
            return Err(invalid(
                "region",
                raw.region.clone(),
                "room for every key's shortcut word and a first version of each (72 B a key and more)",
            ));
        }
        let switch = match (raw.resolver, raw.cached_keys) {
            (false, None) => SwitchChoice::Plain,
            (false, Some(_)) => {
                return Err(invalid(
                    "cached_keys",
                    "set".into(),
                    "only the resolver caches keys: set resolver = true",
                ))
            }
            (true, cached_keys) => {
                let cached_keys = cached_keys.unwrap_or(raw.keys as usize);
                if cached_keys == 0 || cached_keys as u64 > raw.keys {
                    return Err(invalid(
                        "cached_keys",
                        cached_keys.to_string(),
                        "from 1 to the number of keys",
                    ));
                }
                SwitchChoice::Resolver { cached_keys }
            }
        };
        let mut run = Run::new(switch);
        Self::check_room(&raw, region_bytes, &run)?;
        run.clients = raw.clients;
        run.keys = raw.keys;
        run.operations = raw.operations;
        run.read_proportion = raw.read_proportion;
        run.zipf_theta = match raw.distribution {
            Distribution::Zipf => Some(raw.zipf_theta),
            Distribution::Uniform => None,
        };
        run.value_bytes = raw.value_bytes;
        run.region_bytes = region_bytes;
        run.check_history = raw.check_history;
        run.grace = std::time::Duration::from_millis(raw.grace_ms);
        Ok(CloverConfig { run })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<CloverConfig, CloverConfigError> {
        CloverConfig::parse(&text.parse::<toml::Table>().unwrap())
    }

    #[test]
    fn a_section_sets_the_run_and_defaults_fill_the_rest() {
        let config = parse("clients = 4\nresolver = true\ncached_keys = 8\n").unwrap();
        assert_eq!(config.run.clients, 4);
        assert_eq!(config.run.keys, 1024);
        assert!(matches!(
            config.run.switch,
            SwitchChoice::Resolver { cached_keys: 8 }
        ));
        assert!(config.run.check_history);
        assert_eq!(config.run.grace, std::time::Duration::from_millis(400));
        let short = parse("grace_ms = 40").unwrap();
        assert_eq!(short.run.grace, std::time::Duration::from_millis(40));
        let uniform = parse("distribution = \"uniform\"").unwrap();
        assert_eq!(uniform.run.zipf_theta, None);
        assert!(matches!(uniform.run.switch, SwitchChoice::Plain));
        let all = parse("resolver = true\nkeys = 64").unwrap();
        assert!(matches!(
            all.run.switch,
            SwitchChoice::Resolver { cached_keys: 64 }
        ));
    }

    #[test]
    fn bad_settings_name_their_field() {
        let field = |text: &str| match parse(text) {
            Err(CloverConfigError::Invalid { field, .. }) => field,
            other => panic!("{text}: {other:?}"),
        };
        assert_eq!(field("clients = 0"), "clients");
        assert_eq!(field("keys = 0"), "keys");
        assert_eq!(field("operations = 0"), "operations");
        assert_eq!(field("read_proportion = 1.5"), "read_proportion");
        assert_eq!(field("zipf_theta = 1.0"), "zipf_theta");
        assert_eq!(field("value_bytes = 0"), "value_bytes");
        assert_eq!(field("value_bytes = 4"), "value_bytes");
        // 200 000 keys' shortcuts and first versions overflow 8 MiB.
        assert_eq!(field("keys = 200000"), "region");
        // 1,024 keys of 4 KiB values need 8 MiB for their first versions
        // alone (loading failed at deploy); 14,562 keys of 16 bytes fill
        // 1 MiB with first versions and leave no room to write.
        assert_eq!(
            field("value_bytes = 4096\nkeys = 1024\nregion = \"1MiB\""),
            "region"
        );
        assert_eq!(field("keys = 14562\nregion = \"1MiB\""), "region");
        assert_eq!(field("region = \"4KiB\""), "region");
        assert_eq!(field("region = \"lots\""), "region");
        assert_eq!(field("cached_keys = 4"), "cached_keys");
        assert_eq!(field("grace_ms = 3"), "grace_ms");
        // Every event kept and each key's clusters ordered pairwise: 10 M
        // operations took gigabytes and hours. Unchecked, they run.
        assert_eq!(field("operations = 10000000"), "check_history");
        assert!(parse("operations = 10000000\ncheck_history = false").is_ok());
        assert_eq!(field("grace_ms = 60001"), "grace_ms");
        assert_eq!(
            field("resolver = true\nkeys = 8\ncached_keys = 9"),
            "cached_keys"
        );
        assert!(matches!(
            parse("clients = \"many\""),
            Err(CloverConfigError::Syntax(_))
        ));
        assert!(matches!(
            parse("engine = \"p4\""),
            Err(CloverConfigError::Syntax(_))
        ));
    }
}
