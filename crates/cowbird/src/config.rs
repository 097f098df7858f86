//! Cowbird's section of a rack file, `[cowbird]`: which engine, how many
//! application threads, the rings, and each engine's settings. The rack
//! crate keeps the table unparsed; this module reads it, with typed
//! errors, and [`crate::embedded::from_rack`] turns it into a workload on
//! the rack's first compute and memory nodes.
//!
//! ```toml
//! [cowbird]
//! engine = "spot"            # or "p4"
//! threads = 3
//! operations = 400
//! metadata_entries = 1024
//! request_data = "256KiB"
//! response_data = "256KiB"
//! [cowbird.spot]
//! batch_entries = 64
//! [cowbird.p4]
//! path_mtu = 1024
//! ```

use remora_rack::config::{parse_section, parse_size};
use remora_rack::RackConfig;
use serde::Deserialize;

/// Why a `[cowbird]` section was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CowbirdConfigError {
    #[error("[cowbird] {0}")]
    Syntax(String),
    #[error("[cowbird] {0}")]
    Invalid(String),
    #[error("[cowbird] needs a compute node and a memory node")]
    NoHosts,
}

impl CowbirdConfig {
    /// The rack file's `[cowbird]` table, if it has one, checked against
    /// the rack (Cowbird runs on its first compute and memory nodes).
    pub fn from_rack(rack: &RackConfig) -> Result<Option<CowbirdConfig>, CowbirdConfigError> {
        let Some(table) = rack.systems.get(SECTION) else {
            return Ok(None);
        };
        let config = CowbirdConfig::parse(table)?;
        if !rack.has_compute_and_memory() {
            return Err(CowbirdConfigError::NoHosts);
        }
        Ok(Some(config))
    }

    /// A `[cowbird]` table on its own.
    pub fn parse(table: &toml::Table) -> Result<CowbirdConfig, CowbirdConfigError> {
        let raw: RawCowbird = parse_section(table).map_err(CowbirdConfigError::Syntax)?;
        CowbirdConfig::validate(raw)
    }
}

/// The section's name in a rack file.
pub const SECTION: &str = "cowbird";

/// Which Cowbird offload engine moves the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineChoice {
    /// Cowbird-Spot: on the memory node's spare CPU.
    Spot,
    /// Cowbird-P4: a switch program.
    P4,
}

/// `[cowbird]`: Cowbird on the rack's first compute and memory nodes.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCowbird {
    engine: EngineChoice,
    #[serde(default = "default_cowbird_threads")]
    threads: usize,
    #[serde(default = "default_cowbird_operations")]
    operations: u64,
    #[serde(default = "default_metadata_entries")]
    metadata_entries: u64,
    #[serde(default = "default_ring")]
    request_data: String,
    #[serde(default = "default_ring")]
    response_data: String,
    #[serde(default)]
    spot: SpotSection,
    #[serde(default)]
    p4: P4Section,
}

fn default_cowbird_threads() -> usize {
    1
}

fn default_cowbird_operations() -> u64 {
    400
}

fn default_metadata_entries() -> u64 {
    1024
}

fn default_ring() -> String {
    "256KiB".into()
}

/// `[cowbird.spot]`: the Spot engine's batch and probe interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpotSection {
    /// Entries fetched and responses packed per batch (BATCH_SIZE).
    #[serde(default = "default_batch_entries")]
    pub batch_entries: u64,
    /// The probe interval while busy, and the most it backs off to.
    #[serde(default = "default_probe_min_us")]
    pub probe_interval_min_us: u64,
    #[serde(default = "default_probe_max_us")]
    pub probe_interval_max_us: u64,
}

fn default_batch_entries() -> u64 {
    64
}

fn default_probe_min_us() -> u64 {
    1
}

fn default_probe_max_us() -> u64 {
    20
}

impl Default for SpotSection {
    fn default() -> Self {
        SpotSection {
            batch_entries: default_batch_entries(),
            probe_interval_min_us: default_probe_min_us(),
            probe_interval_max_us: default_probe_max_us(),
        }
    }
}

/// `[cowbird.p4]`: the switch engine's generator period, data-plane
/// timeout, requests in flight per instance and path MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct P4Section {
    #[serde(default = "default_probe_period_us")]
    pub probe_period_us: u64,
    #[serde(default = "default_p4_timeout_us")]
    pub timeout_us: u64,
    #[serde(default = "default_in_flight")]
    pub max_entries_in_flight: u64,
    #[serde(default = "default_path_mtu")]
    pub path_mtu: u32,
}

fn default_probe_period_us() -> u64 {
    2
}

/// The rack's ACK timeout: a fabric thread descheduled for milliseconds
/// on a shared host is not a lost packet.
fn default_p4_timeout_us() -> u64 {
    16_000
}

fn default_in_flight() -> u64 {
    32
}

fn default_path_mtu() -> u32 {
    1024
}

impl Default for P4Section {
    fn default() -> Self {
        P4Section {
            probe_period_us: default_probe_period_us(),
            timeout_us: default_p4_timeout_us(),
            max_entries_in_flight: default_in_flight(),
            path_mtu: default_path_mtu(),
        }
    }
}

/// A validated `[cowbird]` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CowbirdConfig {
    pub engine: EngineChoice,
    /// Application threads, one Cowbird instance each.
    pub threads: usize,
    /// Checked requests per thread that `rack up` runs.
    pub operations: u64,
    pub metadata_entries: u64,
    pub request_data_bytes: u64,
    pub response_data_bytes: u64,
    pub spot: SpotSection,
    pub p4: P4Section,
}

/// The most Cowbird instances (threads) a rack file may ask for: the P4
/// engine's instance table.
pub const MAX_COWBIRD_THREADS: usize = 64;

impl CowbirdConfig {
    fn validate(raw: RawCowbird) -> Result<CowbirdConfig, CowbirdConfigError> {
        let context = |message: String| CowbirdConfigError::Invalid(message);
        if raw.threads == 0 || raw.threads > MAX_COWBIRD_THREADS {
            return Err(context(format!(
                "threads must be 1 to {MAX_COWBIRD_THREADS}, not {}",
                raw.threads
            )));
        }
        if raw.operations == 0 || raw.operations > 1 << 32 {
            return Err(context(format!(
                "operations must be 1 to 2^32, not {}",
                raw.operations
            )));
        }
        if !(2..=1 << 20).contains(&raw.metadata_entries) {
            return Err(context(format!(
                "metadata_entries must be 2 to 1048576, not {}",
                raw.metadata_entries
            )));
        }
        let ring = |name: &str, text: &str| -> Result<u64, CowbirdConfigError> {
            let bytes =
                parse_size(text).map_err(|message| context(format!("{name}: {message}")))?;
            if !(4096..=1 << 30).contains(&bytes) {
                return Err(context(format!(
                    "{name} must hold one 4 KiB request and at most 1 GiB, not {bytes} B"
                )));
            }
            Ok(bytes)
        };
        let request_data_bytes = ring("request_data", &raw.request_data)?;
        let response_data_bytes = ring("response_data", &raw.response_data)?;
        // An instance's rings are one registered region: checked here, not
        // when the deployment fails after the rack has run.
        let block_bytes = crate::layout::RingSizes {
            metadata_entries: raw.metadata_entries,
            request_data_bytes,
            response_data_bytes,
        }
        .block_bytes();
        let region_limit = remora_rnic::RnicConfig::DEFAULT_MAX_REGION_BYTES;
        if block_bytes > region_limit {
            return Err(context(format!(
                "the rings take {block_bytes} B, more than one registered region's {region_limit} B"
            )));
        }
        // Only the chosen engine's section is checked: the other one's
        // defaults need not fit rings sized for this one.
        match raw.engine {
            EngineChoice::Spot => Self::validate_spot(&raw)?,
            EngineChoice::P4 => Self::validate_p4(&raw)?,
        }
        Ok(CowbirdConfig {
            engine: raw.engine,
            threads: raw.threads,
            operations: raw.operations,
            metadata_entries: raw.metadata_entries,
            request_data_bytes,
            response_data_bytes,
            spot: raw.spot,
            p4: raw.p4,
        })
    }

    fn validate_spot(raw: &RawCowbird) -> Result<(), CowbirdConfigError> {
        let context = |message: String| CowbirdConfigError::Invalid(message);
        let spot = raw.spot;
        if spot.batch_entries == 0 || spot.batch_entries > raw.metadata_entries {
            return Err(context(format!(
                "spot.batch_entries must be 1 to metadata_entries ({}), not {}",
                raw.metadata_entries, spot.batch_entries
            )));
        }
        // The engine's completion queue takes every thread's send queue,
        // as `deploy` sizes it; past a device's deepest queue the section
        // passed and deploy failed.
        let engine_queue = crate::deploy::engine_send_queue_depth(spot.batch_entries)
            .saturating_mul(raw.threads.max(1));
        let deepest = remora_rnic::RnicConfig::DEFAULT_MAX_QUEUE_DEPTH;
        if engine_queue > deepest {
            return Err(context(format!(
                "threads ({}) × (2 × spot.batch_entries ({}) + 8) = {engine_queue} engine completions, past the {deepest} a queue holds",
                raw.threads, spot.batch_entries
            )));
        }
        if spot.probe_interval_min_us == 0
            || spot.probe_interval_min_us > spot.probe_interval_max_us
        {
            return Err(context(
                "spot probe intervals must satisfy 0 < probe_interval_min_us <= probe_interval_max_us".into(),
            ));
        }
        Ok(())
    }

    fn validate_p4(raw: &RawCowbird) -> Result<(), CowbirdConfigError> {
        let context = |message: String| CowbirdConfigError::Invalid(message);
        let p4 = raw.p4;
        if p4.probe_period_us == 0 || p4.timeout_us == 0 {
            return Err(context(
                "p4.probe_period_us and p4.timeout_us must be positive".into(),
            ));
        }
        if p4.max_entries_in_flight == 0 || p4.max_entries_in_flight >= raw.metadata_entries {
            return Err(context(format!(
                "p4.max_entries_in_flight must be 1 to metadata_entries - 1 ({}), not {}",
                raw.metadata_entries - 1,
                p4.max_entries_in_flight
            )));
        }
        if ![256, 512, 1024, 2048, 4096].contains(&p4.path_mtu) {
            return Err(context(format!(
                "p4.path_mtu must be 256, 512, 1024, 2048 or 4096, not {}",
                p4.path_mtu
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A compute node and a memory node, with no system section.
    const GOOD: &str = include_str!("../../../examples/rack-two-nodes.toml");

    fn read(text: &str) -> Result<Option<CowbirdConfig>, CowbirdConfigError> {
        CowbirdConfig::from_rack(&RackConfig::parse(text).unwrap())
    }

    #[test]
    fn a_cowbird_section_parses_with_defaults() {
        let text = format!(
            "{GOOD}\n[cowbird]\nengine = \"p4\"\nthreads = 3\n[cowbird.p4]\npath_mtu = 512\n"
        );
        let cowbird = read(&text).unwrap().unwrap();
        assert_eq!(cowbird.engine, EngineChoice::P4);
        assert_eq!(cowbird.threads, 3);
        assert_eq!(cowbird.request_data_bytes, 256 << 10);
        assert_eq!(cowbird.p4.path_mtu, 512);
        assert_eq!(cowbird.spot, SpotSection::default());
        assert!(read(GOOD).unwrap().is_none());
    }

    #[test]
    fn bad_cowbird_sections_are_refused_with_the_field_named() {
        for (section, expected) in [
            ("engine = \"fpga\"", "unknown variant"),
            ("engine = \"spot\"\nthreads = 0", "threads must be"),
            (
                "engine = \"spot\"\nrequest_data = \"1KiB\"",
                "request_data must hold",
            ),
            (
                "engine = \"spot\"\nmetadata_entries = 8\n[cowbird.spot]\nbatch_entries = 9",
                "batch_entries",
            ),
            (
                "engine = \"spot\"\n[cowbird.spot]\nprobe_interval_min_us = 30",
                "probe intervals",
            ),
            ("engine = \"p4\"\n[cowbird.p4]\npath_mtu = 1500", "path_mtu"),
            (
                "engine = \"p4\"\nmetadata_entries = 32\n[cowbird.p4]\nmax_entries_in_flight = 32",
                "max_entries_in_flight",
            ),
            ("engine = \"p4\"\nspeed = 3", "unknown field"),
            // The engine's completion queue would be past a device's
            // deepest: the section passed and deploy failed.
            (
                "engine = \"spot\"\nthreads = 64\nmetadata_entries = 128\n[cowbird.spot]\nbatch_entries = 128",
                "engine completions",
            ),
            // Each ring fits, but not with the others in one region: this
            // failed only after the rack had run.
            (
                "engine = \"spot\"\nrequest_data = \"1GiB\"",
                "more than one registered region",
            ),
        ] {
            let text = format!("{GOOD}\n[cowbird]\n{section}\n");
            let error = read(&text).unwrap_err().to_string();
            assert!(error.contains(expected), "{section}: {error}");
        }
    }

    #[test]
    fn cowbird_needs_a_compute_and_a_memory_node() {
        let only_compute = GOOD
            .split("[[node]]")
            .take(2)
            .collect::<Vec<_>>()
            .join("[[node]]");
        let text = format!("{only_compute}\n[cowbird]\nengine = \"spot\"\n");
        assert_eq!(read(&text), Err(CowbirdConfigError::NoHosts));
    }
}
