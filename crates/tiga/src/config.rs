//! The virtual hardware's settings, each default with its source.
//!
//! The paper's SoC is eight 250 MHz five-stage RISC-V cores on an Alveo
//! U250 (§4.3), beside 2.2 GHz Xeon Gold 5117 hosts (§3, §5.1). This
//! machine has two real cores, so the SoC cores and the CN cores are
//! virtual: each stage's real code is timed here ([`crate::calibration`])
//! and charged, scaled, to virtual cores in virtual time.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Settings of one virtual-time run's hardware. Every field has a default
/// (`SocConfig::default()`), and a TOML table may set any of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SocConfig {
    /// SoC cores on the DN's SmartNIC. Default 8, as the prototype (§4.3).
    pub soc_cores: usize,
    /// CPU cores of the compute node that co-processing and the CPU-only
    /// baseline may use. Default 8 (the issue's choice; the paper's CN has
    /// 28-core Xeons but does not say how many served NDP).
    pub cn_cores: usize,
    /// How much slower a SoC core runs the same code than this machine's
    /// core. Default 8.8: the clock ratio of the paper's 2.2 GHz Xeon to its
    /// 250 MHz RISC-V core (§3, §4.3), taking equal work per cycle. That is
    /// a lower bound: an in-order core without SIMD, AES-NI or SHA
    /// extensions does less per cycle; the full benchmark sweeps it.
    pub slowdown: f64,
    /// A SoC context switch in ns, when set; else this machine's measured
    /// switch (lmbench's `lat_ctx` method, see `calibration`) times
    /// `slowdown`. Context switches are what time-sharing pays (Fig. 2).
    pub context_switch_ns: Option<f64>,
    /// Moving one core from a PA to another, in ns, when set; else two
    /// context switches: leave the old engine, load the new one (§4.1
    /// "forks the processes on the original core and pins them to the new
    /// core"). No published figure exists for the prototype.
    pub core_move_ns: Option<f64>,
    /// One detection (reading every core's counters and solving Eq. 4),
    /// in ns, when set; else the allocator's real code timed here times
    /// `slowdown`. Each detection stalls every SoC core for this long.
    pub detection_ns: Option<f64>,
    /// The detection period. Default 0.1 s, the paper's default (§4.1).
    pub detection_period_ns: u64,
    /// Each PA's dispatcher queue, in requests. A full ingress queue drops
    /// (and counts) the arriving request, as a NIC's full receive ring
    /// does; between stages a full queue holds the upstream core
    /// (backpressure), so no processed work is thrown away.
    pub queue_depth: usize,
    /// The CN's queue of forwarded or fetched requests.
    pub cn_queue_depth: usize,
    /// The DN-local DMA the SmartNIC reads data with: bytes per second.
    /// Default 12 GB/s: PCIe 3.0 x16 (the U250's slot) is 15.75 GB/s raw;
    /// Neugebauer et al. (SIGCOMM'18, §3) measure ~80% of that for DMA
    /// reads of 1 KiB and more.
    pub dma_bytes_per_second: f64,
    /// DMA read latency. Default 1 µs: Neugebauer et al. (SIGCOMM'18,
    /// Fig. 6) measure 0.5-1 µs for a DMA read over PCIe 3.
    pub dma_latency_ns: u64,
    /// The network link between the CN and the DN. Default 100 Gb/s, the
    /// paper's ConnectX-4 100 GbE (§3).
    pub network_bytes_per_second: f64,
    /// One-way network latency. Default 1 µs: half of the ~2 µs RDMA READ
    /// round trip Kalia et al. measure on ConnectX-3/4 (ATC'16, Fig. 2).
    pub network_one_way_ns: u64,
    /// Co-processing's forwarding step: 10% by default (§4.2).
    pub forwarding_step: f64,
    /// How far outbound may fall short of inbound before it counts as a
    /// mismatch: Poisson arrivals and requests in flight make the two
    /// differ by a little in every period.
    pub mismatch_tolerance: f64,
    /// One request in this many runs the real code and is checked against
    /// the CN version; the rest are charged their calibrated cost.
    pub sample_every: u64,
    /// DRR's quantum, in bytes, for the time-shared baselines. Default
    /// 1024 B, one default payload: Shreedhar and Varghese (SIGCOMM'95)
    /// take the quantum at least the largest packet.
    pub drr_quantum_bytes: u64,
}

impl Default for SocConfig {
    fn default() -> SocConfig {
        SocConfig {
            soc_cores: 8,
            cn_cores: 8,
            slowdown: 2.2e9 / 250e6,
            context_switch_ns: None,
            core_move_ns: None,
            detection_ns: None,
            detection_period_ns: 100_000_000,
            queue_depth: 4096,
            cn_queue_depth: 65536,
            dma_bytes_per_second: 12e9,
            dma_latency_ns: 1_000,
            network_bytes_per_second: 100e9 / 8.0,
            network_one_way_ns: 1_000,
            forwarding_step: 0.1,
            mismatch_tolerance: 0.02,
            sample_every: 1000,
            drr_quantum_bytes: 1024,
        }
    }
}

/// A setting that cannot run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("soc_cores is {0}: TIGA needs at least one core per stage, so at least 2")]
    TooFewSocCores(usize),
    #[error("{field} is {value}: it must be positive and finite")]
    NotPositive { field: &'static str, value: f64 },
    #[error("forwarding_step is {0}: it must be in (0, 0.5], so that forwarding can stop short of everything")]
    BadForwardingStep(f64),
    #[error("mismatch_tolerance is {0}: it must be in [0, 1)")]
    BadTolerance(f64),
    #[error("{field} is 0: it must be at least 1")]
    Zero { field: &'static str },
    #[error("{field} is {cores}: it must be between 1 and {MAX_CORES}")]
    Cores { field: &'static str, cores: usize },
    #[error("{field} is {value}: at most {limit}")]
    TooLarge {
        field: &'static str,
        value: f64,
        limit: f64,
    },
    #[error("{field} is {value}: at least {limit}")]
    TooSmall {
        field: &'static str,
        value: f64,
        limit: f64,
    },
    #[error(
        "detection_ns is {detection_ns}: a detection must end within its period of {period_ns} ns"
    )]
    DetectionPastPeriod { detection_ns: f64, period_ns: u64 },
}

/// The largest SoC slowdown against the measuring CPU: far past any
/// SmartNIC's, and small enough that a stage's cost in nanoseconds stays
/// far from overflowing virtual time.
pub const MAX_SLOWDOWN: f64 = 1e4;
/// The largest fixed cost (a context switch, a core move, a detection).
pub const MAX_FIXED_COST_NS: f64 = 1e9;

/// The slowest DMA or network rate (1 MB/s): a transfer's time in
/// nanoseconds stays far from overflowing virtual time (at 10^-12 B/s
/// the first one did).
pub const MIN_BYTES_PER_SECOND: f64 = 1e6;

/// The most cores a simulated SoC or CN may have.
pub const MAX_CORES: usize = 1024;

impl SocConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.soc_cores < 2 {
            return Err(ConfigError::TooFewSocCores(self.soc_cores));
        }
        // Each core is simulated, one state and one loop turn apiece.
        for (field, cores) in [("soc_cores", self.soc_cores), ("cn_cores", self.cn_cores)] {
            if !(1..=MAX_CORES).contains(&cores) {
                return Err(ConfigError::Cores { field, cores });
            }
        }
        let positive = [
            ("slowdown", self.slowdown),
            ("dma_bytes_per_second", self.dma_bytes_per_second),
            ("network_bytes_per_second", self.network_bytes_per_second),
        ];
        let optional = [
            ("context_switch_ns", self.context_switch_ns),
            ("core_move_ns", self.core_move_ns),
            ("detection_ns", self.detection_ns),
        ];
        for (field, value) in positive
            .into_iter()
            .chain(optional.into_iter().filter_map(|(f, v)| v.map(|v| (f, v))))
        {
            if !(value.is_finite() && value >= 0.0) || (value == 0.0 && !field.ends_with("_ns")) {
                return Err(ConfigError::NotPositive { field, value });
            }
        }
        // Virtual time is u64 nanoseconds: costs past these bounds once
        // overflowed it (a panic, or time running backwards).
        // The latencies too: a request's time adds two network one-ways.
        let latencies = [
            ("dma_latency_ns", self.dma_latency_ns as f64),
            ("network_one_way_ns", self.network_one_way_ns as f64),
        ];
        let bounded = [("slowdown", self.slowdown, MAX_SLOWDOWN)]
            .into_iter()
            .chain(
                optional
                    .into_iter()
                    .filter_map(|(field, value)| value.map(|value| (field, value)))
                    .chain(latencies)
                    .map(|(field, value)| (field, value, MAX_FIXED_COST_NS)),
            );
        for (field, value, limit) in bounded {
            if value > limit {
                return Err(ConfigError::TooLarge {
                    field,
                    value,
                    limit,
                });
            }
        }
        for (field, value) in [
            ("dma_bytes_per_second", self.dma_bytes_per_second),
            ("network_bytes_per_second", self.network_bytes_per_second),
        ] {
            if value < MIN_BYTES_PER_SECOND {
                return Err(ConfigError::TooSmall {
                    field,
                    value,
                    limit: MIN_BYTES_PER_SECOND,
                });
            }
        }
        // Every core stalls for a detection: one as long as its period
        // left them stalled for good.
        if let Some(detection_ns) = self.detection_ns {
            if detection_ns >= self.detection_period_ns as f64 {
                return Err(ConfigError::DetectionPastPeriod {
                    detection_ns,
                    period_ns: self.detection_period_ns,
                });
            }
        }
        if !crate::allocator::is_forwarding_step(self.forwarding_step) {
            return Err(ConfigError::BadForwardingStep(self.forwarding_step));
        }
        if !crate::allocator::is_mismatch_tolerance(self.mismatch_tolerance) {
            return Err(ConfigError::BadTolerance(self.mismatch_tolerance));
        }
        for (field, value) in [
            ("queue_depth", self.queue_depth as u64),
            ("cn_queue_depth", self.cn_queue_depth as u64),
            ("detection_period_ns", self.detection_period_ns),
            ("sample_every", self.sample_every),
            ("drr_quantum_bytes", self.drr_quantum_bytes),
        ] {
            if value == 0 {
                return Err(ConfigError::Zero { field });
            }
        }
        Ok(())
    }

    pub fn detection_period(&self) -> Duration {
        Duration::from_nanos(self.detection_period_ns)
    }
}

/// TIGA's section of a rack file, `[tiga]`: the NDP path on the rack's
/// first compute node and first memory node (its SmartNIC runs the
/// engine), every record of the named applications called and checked
/// against the CN version.
///
/// ```toml
/// [tiga]
/// apps = ["mvs", "spark", "ipsec"]
/// records = 64          # per application
/// record_bytes = 1024
/// forward_every = 8     # the SmartNIC forwards one request in this many to the CN
/// cpu_only = true       # also call every record CPU-only (the CN fetches the data)
/// seed = 3
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TigaSection {
    pub apps: Vec<crate::apps::App>,
    pub records: u64,
    pub record_bytes: usize,
    pub forward_every: u64,
    pub cpu_only: bool,
    pub seed: u64,
}

/// The section's name in a rack file.
pub const SECTION: &str = "tiga";

/// Why a `[tiga]` section was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TigaSectionError {
    #[error("[tiga] {0}")]
    Syntax(String),
    #[error("[tiga] {field} is {value}: {rule}")]
    Invalid {
        field: &'static str,
        value: String,
        rule: &'static str,
    },
    #[error("[tiga] needs a compute node and a memory node")]
    NoHosts,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSection {
    #[serde(default = "all_apps")]
    apps: Vec<String>,
    #[serde(default = "default_records")]
    records: u64,
    #[serde(default = "default_record_bytes")]
    record_bytes: usize,
    #[serde(default = "default_forward_every")]
    forward_every: u64,
    #[serde(default = "default_cpu_only")]
    cpu_only: bool,
    #[serde(default = "default_seed")]
    seed: u64,
}

fn all_apps() -> Vec<String> {
    crate::apps::App::ALL
        .iter()
        .map(|app| app.name().to_owned())
        .collect()
}

fn default_records() -> u64 {
    64
}

fn default_record_bytes() -> usize {
    1024
}

fn default_forward_every() -> u64 {
    8
}

fn default_cpu_only() -> bool {
    true
}

fn default_seed() -> u64 {
    3
}

/// Records per application a rack file may ask for.
const MAX_RECORDS: u64 = 100_000;

impl TigaSection {
    /// The rack file's `[tiga]` table, if it has one, and its two hosts
    /// (the first compute node as host 0, the first memory node as host
    /// 1, with their links).
    pub fn from_rack(
        rack: &remora_rack::RackConfig,
    ) -> Result<Option<(TigaSection, remora_rack::topology::Topology)>, TigaSectionError> {
        use remora_rack::Role;
        let Some(table) = rack.systems.get(SECTION) else {
            return Ok(None);
        };
        let section = TigaSection::parse(table)?;
        let topology = rack.topology();
        let (Some(compute), Some(memory)) =
            (topology.first(Role::Compute), topology.first(Role::Memory))
        else {
            return Err(TigaSectionError::NoHosts);
        };
        // The records live in the memory node's memory: checked against it,
        // 100,000 records of 4 KiB for three apps passed a 64 MiB node and
        // took 1.2 GB.
        let records_bytes =
            section.apps.len() as u64 * section.records * section.record_bytes as u64;
        if records_bytes > topology.hosts()[memory].memory_bytes {
            return Err(TigaSectionError::Invalid {
                field: "records",
                value: section.records.to_string(),
                rule: "apps × records × record_bytes must fit the first memory node's memory",
            });
        }
        let pair = topology
            .subset(&[compute, memory])
            .expect("a rack's compute and memory nodes make a rack");
        Ok(Some((section, pair)))
    }

    /// A `[tiga]` table on its own.
    pub fn parse(table: &toml::Table) -> Result<TigaSection, TigaSectionError> {
        let raw: RawSection =
            remora_rack::config::parse_section(table).map_err(TigaSectionError::Syntax)?;
        let invalid = |field, value: String, rule| TigaSectionError::Invalid { field, value, rule };
        let mut apps = Vec::with_capacity(raw.apps.len());
        for name in &raw.apps {
            let app = crate::apps::App::ALL
                .into_iter()
                .find(|app| app.name() == name)
                .ok_or_else(|| invalid("apps", name.clone(), "mvs, spark or ipsec"))?;
            if !apps.contains(&app) {
                apps.push(app);
            }
        }
        if apps.is_empty() {
            return Err(invalid(
                "apps",
                "empty".into(),
                "at least one of mvs, spark, ipsec",
            ));
        }
        if !(1..=MAX_RECORDS).contains(&raw.records) {
            return Err(invalid(
                "records",
                raw.records.to_string(),
                "from 1 to 100000",
            ));
        }
        // A record's answer must fit one datagram on the rack.
        const _: () = assert!(crate::apps::MIN_PAYLOAD_BYTES == 64);
        const _: () = assert!(crate::rack::MAX_RECORD_BYTES == 4032);
        let payload = crate::apps::MIN_PAYLOAD_BYTES..=crate::rack::MAX_RECORD_BYTES;
        if !payload.contains(&raw.record_bytes) {
            return Err(invalid(
                "record_bytes",
                raw.record_bytes.to_string(),
                "from 64 to 4032",
            ));
        }
        if raw.forward_every == 0 {
            return Err(invalid("forward_every", "0".into(), "at least 1"));
        }
        Ok(TigaSection {
            apps,
            records: raw.records,
            record_bytes: raw.record_bytes,
            forward_every: raw.forward_every,
            cpu_only: raw.cpu_only,
            seed: raw.seed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rates and detection costs that passed as positive: 10^-12 B/s of
    /// DMA overflowed virtual time at the first transfer, and a detection
    /// as long as its period stalled every core for good.
    #[test]
    fn a_rate_too_slow_or_a_detection_past_its_period_is_refused() {
        let slow = SocConfig {
            dma_bytes_per_second: 1e-12,
            ..SocConfig::default()
        };
        assert!(matches!(
            slow.validate(),
            Err(ConfigError::TooSmall {
                field: "dma_bytes_per_second",
                ..
            })
        ));
        let slow_network = SocConfig {
            network_bytes_per_second: 1e3,
            ..SocConfig::default()
        };
        assert!(matches!(
            slow_network.validate(),
            Err(ConfigError::TooSmall { .. })
        ));
        let long = SocConfig {
            detection_ns: Some(2e8),
            detection_period_ns: 100_000_000,
            ..SocConfig::default()
        };
        assert!(matches!(
            long.validate(),
            Err(ConfigError::DetectionPastPeriod { .. })
        ));
        assert!(SocConfig::default().validate().is_ok());
    }

    /// The rack file of examples/rack-tiga.toml with its `[tiga]` table
    /// replaced by `tiga`.
    fn rack_with(tiga: &str) -> remora_rack::RackConfig {
        let example = include_str!("../../../examples/rack-tiga.toml");
        let before_tiga = &example[..example.find("[tiga]").expect("a [tiga] table")];
        remora_rack::RackConfig::parse(&format!("{before_tiga}[tiga]\n{tiga}\n")).unwrap()
    }

    /// The records live in the memory node's memory: 100,000 records of
    /// 4 KiB for three apps passed a 64 MiB node and took 1.2 GB.
    #[test]
    fn records_past_the_memory_nodes_memory_are_refused() {
        let small = rack_with("records = 32\nrecord_bytes = 1024");
        assert!(TigaSection::from_rack(&small).unwrap().is_some());
        let large = rack_with("records = 100000\nrecord_bytes = 4032");
        assert!(matches!(
            TigaSection::from_rack(&large),
            Err(TigaSectionError::Invalid {
                field: "records",
                ..
            })
        ));
    }

    fn section(text: &str) -> Result<TigaSection, TigaSectionError> {
        TigaSection::parse(&text.parse::<toml::Table>().unwrap())
    }

    #[test]
    fn a_tiga_section_sets_the_run_and_bad_settings_name_their_field() {
        let defaults = section("").unwrap();
        assert_eq!(defaults.apps, crate::apps::App::ALL.to_vec());
        assert_eq!((defaults.records, defaults.forward_every), (64, 8));
        let one = section("apps = [\"ipsec\", \"ipsec\"]\nrecords = 5").unwrap();
        assert_eq!(one.apps, vec![crate::apps::App::Ipsec]);
        let field = |text: &str| match section(text) {
            Err(TigaSectionError::Invalid { field, .. }) => field,
            other => panic!("{text}: {other:?}"),
        };
        assert_eq!(field("apps = [\"grep\"]"), "apps");
        assert_eq!(field("apps = []"), "apps");
        assert_eq!(field("records = 0"), "records");
        assert_eq!(field("record_bytes = 8"), "record_bytes");
        // An answer above a datagram could never come back.
        assert_eq!(field("record_bytes = 8192"), "record_bytes");
        assert_eq!(field("forward_every = 0"), "forward_every");
        assert!(matches!(
            section("cores = 8"),
            Err(TigaSectionError::Syntax(_))
        ));
    }

    /// A context switch of 1e20 ns (or a slowdown of 1e17) overflowed
    /// virtual time: a panic in debug builds, time running backwards in
    /// release. They are typed errors now.
    #[test]
    fn costs_that_would_overflow_virtual_time_are_refused() {
        let huge_switch = SocConfig {
            context_switch_ns: Some(1e20),
            ..SocConfig::default()
        };
        assert!(matches!(
            huge_switch.validate(),
            Err(ConfigError::TooLarge {
                field: "context_switch_ns",
                ..
            })
        ));
        let huge_slowdown = SocConfig {
            slowdown: 1e17,
            ..SocConfig::default()
        };
        assert!(matches!(
            huge_slowdown.validate(),
            Err(ConfigError::TooLarge {
                field: "slowdown",
                ..
            })
        ));
        // A request's time adds two network one-ways: near u64::MAX, they
        // overflowed it as the costs did.
        let huge_latency = SocConfig {
            network_one_way_ns: u64::MAX / 2,
            ..SocConfig::default()
        };
        assert!(matches!(
            huge_latency.validate(),
            Err(ConfigError::TooLarge {
                field: "network_one_way_ns",
                ..
            })
        ));
    }

    #[test]
    fn the_defaults_are_valid_and_the_slowdown_is_the_clock_ratio() {
        let config = SocConfig::default();
        config.validate().unwrap();
        assert!((config.slowdown - 8.8).abs() < 1e-9);
    }

    #[test]
    fn bad_settings_get_typed_errors() {
        let config = SocConfig {
            soc_cores: 1,
            ..SocConfig::default()
        };
        assert_eq!(config.validate(), Err(ConfigError::TooFewSocCores(1)));
        let config = SocConfig {
            slowdown: 0.0,
            ..SocConfig::default()
        };
        assert!(matches!(
            config.validate(),
            Err(ConfigError::NotPositive {
                field: "slowdown",
                ..
            })
        ));
        let config = SocConfig {
            forwarding_step: 0.0,
            ..SocConfig::default()
        };
        assert_eq!(config.validate(), Err(ConfigError::BadForwardingStep(0.0)));
        let config = SocConfig {
            queue_depth: 0,
            ..SocConfig::default()
        };
        assert_eq!(
            config.validate(),
            Err(ConfigError::Zero {
                field: "queue_depth"
            })
        );
    }

    /// Each core is simulated: 2^60 CN cores was a capacity-overflow
    /// panic, 10^11 an allocation abort, and 0 a failure minutes later.
    #[test]
    fn core_counts_past_the_bound_or_zero_are_refused() {
        for cn_cores in [0, MAX_CORES + 1, 1 << 60] {
            let config = SocConfig {
                cn_cores,
                ..SocConfig::default()
            };
            assert_eq!(
                config.validate(),
                Err(ConfigError::Cores {
                    field: "cn_cores",
                    cores: cn_cores
                })
            );
        }
        let config = SocConfig {
            soc_cores: 100_000_000_000,
            ..SocConfig::default()
        };
        assert!(matches!(
            config.validate(),
            Err(ConfigError::Cores {
                field: "soc_cores",
                ..
            })
        ));
    }

    #[test]
    fn a_toml_table_sets_any_field_and_refuses_unknown_ones() {
        let config: SocConfig = toml::from_str("soc_cores = 16\nslowdown = 4.0").unwrap();
        assert_eq!(config.soc_cores, 16);
        assert_eq!(config.cn_cores, 8);
        assert!(toml::from_str::<SocConfig>("cores = 3").is_err());
    }
}
