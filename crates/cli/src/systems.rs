//! The systems the command line knows, in one place: adding a system is
//! one entry here (its rack-file section, what `rack up` runs for it, its
//! step of the demo and its `remora bench` subcommand).

use crate::bench::Benchmark;
use crate::demo::SystemStep;
use crate::HistoryFile;
use remora_rack::RackConfig;

/// A system as the command line drives it.
pub trait System: Sync {
    /// Its name, which is also its rack-file section (`[cowbird]`).
    fn name(&self) -> &'static str;

    /// Its name in prose ("Cowbird").
    fn title(&self) -> &'static str;

    /// Checks the rack file's section for this system, if there is one;
    /// a system without a rack-file section refuses one.
    fn check_section(&self, rack: &RackConfig) -> Result<(), String>;

    /// Runs what the section asks for on the embedded rack after `rack
    /// up`'s own workload; None without a section. Failures are pushed
    /// onto `failures`. A system without a section runs nothing.
    fn rack_up(&self, rack: &RackConfig, failures: &mut Vec<String>) -> Option<serde_json::Value> {
        let _ = (rack, failures);
        None
    }

    /// The system's step of `remora demo`.
    fn demo_step(&self, history: Option<&mut HistoryFile>) -> Result<SystemStep, String>;

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
pub fn check_sections(rack: &RackConfig) -> Result<(), String> {
    rack.check_systems(&names())
        .map_err(|error| error.to_string())?;
    for system in SYSTEMS {
        system.check_section(rack)?;
    }
    Ok(())
}

/// A system without a rack-file section refuses one, saying where it runs.
fn refuse_section(rack: &RackConfig, name: &str, instead: &str) -> Result<(), String> {
    match rack.systems.contains_key(name) {
        true => Err(format!("[{name}] has no rack-file section yet: {instead}")),
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

    fn check_section(&self, rack: &RackConfig) -> Result<(), String> {
        remora_clover::config::CloverConfig::from_rack(rack)
            .map(|_| ())
            .map_err(|error| error.to_string())
    }

    fn rack_up(&self, rack: &RackConfig, failures: &mut Vec<String>) -> Option<serde_json::Value> {
        crate::rack::run_clover(rack, failures)
    }

    fn demo_step(&self, history: Option<&mut HistoryFile>) -> Result<SystemStep, String> {
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

    fn check_section(&self, rack: &RackConfig) -> Result<(), String> {
        remora_cowbird::config::CowbirdConfig::from_rack(rack)
            .map(|_| ())
            .map_err(|error| error.to_string())
    }

    fn rack_up(&self, rack: &RackConfig, failures: &mut Vec<String>) -> Option<serde_json::Value> {
        crate::rack::run_cowbird(rack, failures)
    }

    fn demo_step(&self, history: Option<&mut HistoryFile>) -> Result<SystemStep, String> {
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

    fn check_section(&self, rack: &RackConfig) -> Result<(), String> {
        refuse_section(
            rack,
            self.name(),
            "SODA runs through `remora soda run` and `remora bench soda`",
        )
    }

    fn demo_step(&self, _history: Option<&mut HistoryFile>) -> Result<SystemStep, String> {
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

    fn check_section(&self, rack: &RackConfig) -> Result<(), String> {
        refuse_section(
            rack,
            self.name(),
            "Bifröst's DSM and RPC runtime are libraries so far (see the demo)",
        )
    }

    fn demo_step(&self, _history: Option<&mut HistoryFile>) -> Result<SystemStep, String> {
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

    fn check_section(&self, rack: &RackConfig) -> Result<(), String> {
        refuse_section(
            rack,
            self.name(),
            "TIGA's virtual hardware is set with `remora bench tiga --config FILE` (see examples/tiga.toml)",
        )
    }

    fn demo_step(&self, _history: Option<&mut HistoryFile>) -> Result<SystemStep, String> {
        crate::demo::tiga_step()
    }

    fn benchmark(&self) -> Option<&'static dyn Benchmark> {
        Some(&crate::bench::tiga::BENCH)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
