//! The systems the command line knows, in one place: adding a system is
//! one entry here (its rack-file section, what `rack up` runs for it, its
//! step of the demo and its `remora bench` subcommand).

use crate::bench::Benchmark;
use crate::demo::SystemStep;
use crate::error::{InSystem, NoSection, RackCommandError, SystemError};
use crate::HistoryFile;
use remora_rack::RackConfig;
use std::path::Path;

/// A system as the command line drives it.
pub trait System: Sync {
    /// Its name, which is also its rack-file section (`[cowbird]`).
    fn name(&self) -> &'static str;

    /// Its name in prose ("Cowbird").
    fn title(&self) -> &'static str;

    /// Checks the rack file's section for this system, if there is one;
    /// a system without a rack-file section refuses one.
    fn check_section(&self, rack: &RackConfig) -> Result<(), SystemError>;

    /// Runs what the section asks for on the embedded rack after `rack
    /// up`'s own workload; None without a section. Failures are pushed
    /// onto `failures`. A system without a section runs nothing.
    fn rack_up(&self, rack: &RackConfig, failures: &mut Vec<String>) -> Option<serde_json::Value> {
        let _ = (rack, failures);
        None
    }

    /// The system's step of `remora demo`.
    fn demo_step(&self, history: Option<&mut HistoryFile>) -> Result<SystemStep, SystemError>;

    /// Its `remora bench` subcommand, if it has one.
    fn benchmark(&self) -> Option<&'static dyn Benchmark> {
        None
    }
}

/// Every system, in the order the demo tours them.
pub const SYSTEMS: [&dyn System; 5] = [&Clover, &Cowbird, &Soda, &Bifrost, &Tiga];

pub fn names() -> Vec<&'static str> {
    SYSTEMS.iter().map(|system| system.name()).collect()
}

pub fn titles() -> Vec<&'static str> {
    SYSTEMS.iter().map(|system| system.title()).collect()
}

/// Checks every system table of a rack file: each must name a system,
/// and each system must accept its table.
pub fn check_sections(rack: &RackConfig, path: &Path) -> Result<(), RackCommandError> {
    rack.check_systems(&names())
        .map_err(|source| RackCommandError::Unclaimed {
            path: path.to_owned(),
            source,
        })?;
    for system in SYSTEMS {
        system
            .check_section(rack)
            .map_err(|source| RackCommandError::Section {
                path: path.to_owned(),
                source,
            })?;
    }
    Ok(())
}

/// A system without a rack-file section refuses one, saying where it runs.
fn refuse_section(
    rack: &RackConfig,
    name: &'static str,
    instead: &'static str,
) -> Result<(), SystemError> {
    let refused = NoSection {
        section: name.to_owned(),
        instead,
    };
    match rack.systems.contains_key(name) {
        true => Err(SystemError::new(name, refused)),
        false => Ok(()),
    }
}

struct Clover;

impl System for Clover {
    fn name(&self) -> &'static str {
        remora_clover::config::SECTION
    }

    fn title(&self) -> &'static str {
        "Clover"
    }

    fn check_section(&self, rack: &RackConfig) -> Result<(), SystemError> {
        remora_clover::config::CloverConfig::from_rack(rack)
            .map(|_| ())
            .in_system(self.name())
    }

    fn rack_up(&self, rack: &RackConfig, failures: &mut Vec<String>) -> Option<serde_json::Value> {
        crate::rack::run_clover(rack, failures)
    }

    fn demo_step(&self, history: Option<&mut HistoryFile>) -> Result<SystemStep, SystemError> {
        crate::demo::clover_step(history)
    }

    fn benchmark(&self) -> Option<&'static dyn Benchmark> {
        Some(&crate::bench::clover::BENCH)
    }
}

struct Cowbird;

impl System for Cowbird {
    fn name(&self) -> &'static str {
        remora_cowbird::config::SECTION
    }

    fn title(&self) -> &'static str {
        "Cowbird"
    }

    fn check_section(&self, rack: &RackConfig) -> Result<(), SystemError> {
        remora_cowbird::config::CowbirdConfig::from_rack(rack)
            .map(|_| ())
            .in_system(self.name())
    }

    fn rack_up(&self, rack: &RackConfig, failures: &mut Vec<String>) -> Option<serde_json::Value> {
        crate::rack::run_cowbird(rack, failures)
    }

    fn demo_step(&self, history: Option<&mut HistoryFile>) -> Result<SystemStep, SystemError> {
        crate::demo::cowbird_step(history)
    }

    fn benchmark(&self) -> Option<&'static dyn Benchmark> {
        Some(&crate::bench::cowbird::BENCH)
    }
}

struct Soda;

impl System for Soda {
    fn name(&self) -> &'static str {
        "soda"
    }

    fn title(&self) -> &'static str {
        "SODA"
    }

    fn check_section(&self, rack: &RackConfig) -> Result<(), SystemError> {
        refuse_section(
            rack,
            self.name(),
            "SODA runs through `remora soda run` and `remora bench soda`",
        )
    }

    fn demo_step(&self, _history: Option<&mut HistoryFile>) -> Result<SystemStep, SystemError> {
        crate::demo::soda_step()
    }

    fn benchmark(&self) -> Option<&'static dyn Benchmark> {
        Some(&crate::bench::soda::BENCH)
    }
}

struct Bifrost;

impl System for Bifrost {
    fn name(&self) -> &'static str {
        "bifrost"
    }

    fn title(&self) -> &'static str {
        "Bifröst"
    }

    fn check_section(&self, rack: &RackConfig) -> Result<(), SystemError> {
        refuse_section(
            rack,
            self.name(),
            "Bifröst's DSM and RPC runtime are libraries so far (see the demo)",
        )
    }

    fn demo_step(&self, _history: Option<&mut HistoryFile>) -> Result<SystemStep, SystemError> {
        crate::demo::bifrost_step()
    }

    fn benchmark(&self) -> Option<&'static dyn Benchmark> {
        Some(&crate::bench::bifrost::BENCH)
    }
}

struct Tiga;

impl System for Tiga {
    fn name(&self) -> &'static str {
        "tiga"
    }

    fn title(&self) -> &'static str {
        "TIGA"
    }

    fn check_section(&self, rack: &RackConfig) -> Result<(), SystemError> {
        refuse_section(
            rack,
            self.name(),
            "TIGA's virtual hardware is set with `remora bench tiga --config FILE` (see examples/tiga.toml)",
        )
    }

    fn demo_step(&self, _history: Option<&mut HistoryFile>) -> Result<SystemStep, SystemError> {
        crate::demo::tiga_step()
    }

    fn benchmark(&self) -> Option<&'static dyn Benchmark> {
        Some(&crate::bench::tiga::BENCH)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rack_with(section: &str) -> RackConfig {
        let text = format!(
            "{}\n{section}\n",
            include_str!("../../../examples/rack-two-nodes.toml")
        );
        RackConfig::parse(&text).expect("the example rack parses")
    }

    /// A section a system refuses keeps the system's own typed error, so
    /// a caller can tell which check failed.
    #[test]
    fn a_refused_section_keeps_the_systems_own_error() {
        let path = Path::new("rack.toml");
        let error = check_sections(&rack_with("[cowbird]\nengine = \"warp\""), path)
            .expect_err("an unknown engine is refused");
        let RackCommandError::Section { source, .. } = &error else {
            panic!("not a section error: {error}");
        };
        assert_eq!(source.system, "cowbird");
        assert!(source
            .source
            .downcast_ref::<remora_cowbird::config::CowbirdConfigError>()
            .is_some());
        let error = check_sections(&rack_with("[tiga]\ncores = 8"), path)
            .expect_err("TIGA has no section yet");
        let RackCommandError::Section { source, .. } = &error else {
            panic!("not a section error: {error}");
        };
        assert!(source.source.downcast_ref::<NoSection>().is_some());
        assert!(matches!(
            check_sections(&rack_with("[warp]\nspeed = 9"), path),
            Err(RackCommandError::Unclaimed { .. })
        ));
    }

    /// `remora bench` lists each benchmark once: the substrate's and every
    /// system's, by the system's own name.
    #[test]
    fn every_system_benchmark_is_a_bench_subcommand_under_its_name() {
        let names: Vec<&str> = crate::bench::benchmarks()
            .map(|benchmark| benchmark.name())
            .collect();
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        for system in SYSTEMS {
            if let Some(benchmark) = system.benchmark() {
                assert_eq!(benchmark.name(), system.name());
            }
        }
        assert_eq!(
            names,
            ["fabric", "switch", "clover", "cowbird", "soda", "bifrost", "tiga"]
        );
    }
}
