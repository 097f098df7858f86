//! The systems the command line knows, in one place: adding a system is
//! one module here (its rack-file section, what `rack up` runs for it, its
//! step of the demo and its `remora bench` subcommand) and its entry in
//! [`SYSTEMS`].

mod bifrost;
mod clover;
mod cowbird;
mod kv;
mod soda;
pub mod system;
mod tiga;

use crate::error::RackCommandError;
use remora_rack::RackConfig;
use std::path::Path;
pub use system::System;

/// Every system, in the order the demo tours them.
pub const SYSTEMS: [&dyn System; 6] = [
    &clover::Clover,
    &cowbird::Cowbird,
    &soda::Soda,
    &bifrost::Bifrost,
    &tiga::Tiga,
    &kv::Kv,
];

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

#[cfg(test)]
mod tests {
    use super::*;

    fn rack_with(section: &str) -> RackConfig {
        let text = format!(
            "{}\n{section}\n",
            include_str!("../../../../examples/rack-two-nodes.toml")
        );
        RackConfig::parse(&text).expect("the example rack parses")
    }

    /// The system error `section` is refused with.
    fn refused(section: &str) -> crate::error::SystemError {
        match check_sections(&rack_with(section), Path::new("rack.toml")) {
            Err(RackCommandError::Section { source, .. }) => source,
            other => panic!("{section}: not refused by its system: {other:?}"),
        }
    }

    /// A section a system refuses keeps the system's own typed error, so
    /// a caller can tell which check failed.
    #[test]
    fn a_refused_section_keeps_the_systems_own_error() {
        let cowbird = refused("[cowbird]\nengine = \"warp\"");
        assert_eq!(cowbird.system, "cowbird");
        assert!(cowbird
            .source
            .downcast_ref::<remora_cowbird::config::CowbirdConfigError>()
            .is_some());
        // TIGA's section has no cores.
        assert!(refused("[tiga]\ncores = 8")
            .source
            .downcast_ref::<remora_tiga::config::TigaSectionError>()
            .is_some());
        // Bifröst's section has no nodes.
        assert!(refused("[bifrost]\nnodes = 3")
            .source
            .downcast_ref::<remora_bifrost::rack_section::BifrostSectionError>()
            .is_some());
        assert!(matches!(
            check_sections(&rack_with("[warp]\nspeed = 9"), Path::new("rack.toml")),
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
            ["fabric", "switch", "verbs", "clover", "cowbird", "soda", "bifrost", "tiga", "kv"]
        );
    }
}
