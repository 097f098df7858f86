//! Clover in the command line: its `[clover]` section, the demo's step
//! and `bench clover`.

use super::system::{System, SystemStep};
use crate::bench::entry::Benchmark;
use crate::error::{InSystem, SystemError};
use crate::HistoryFile;
use remora_rack::RackConfig;
use remora_sim::Probability;

pub struct Clover;

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
        run_clover(rack, failures)
    }

    fn demo_step(&self, history: Option<&mut HistoryFile>) -> Result<SystemStep, SystemError> {
        clover_step(history)
    }

    fn benchmark(&self) -> Option<&'static dyn Benchmark> {
        Some(&crate::bench::clover::BENCH)
    }
}

/// Clover in the simulator, over links losing 2% of frames: 8 clients on
/// 16 hot keys, plain and with the resolver. Every key's history goes
/// through stateright's linearizability checker, and every version list
/// is audited whole.
pub fn clover_step(history: Option<&mut crate::HistoryFile>) -> Result<SystemStep, SystemError> {
    clover_step_with(history, remora_clover::simulated::run)
}

/// [`clover_step`], each variant run by `run`.
fn clover_step_with<E: std::error::Error + Send + Sync + 'static>(
    mut history: Option<&mut crate::HistoryFile>,
    run: impl Fn(u64, &remora_clover::simulated::Run) -> Result<remora_clover::simulated::Outcome, E>,
) -> Result<SystemStep, SystemError> {
    use remora_clover::simulated::{Run, SwitchChoice};
    println!("\nClover in the simulator (8 clients, 16 keys, YCSB-A zipf 0.99, 2% loss):");
    let mut step = SystemStep {
        variants: Vec::new(),
        failures: Vec::new(),
    };
    for (name, switch) in [
        ("plain Clover", SwitchChoice::Plain),
        (
            "with the resolver",
            SwitchChoice::Resolver { cached_keys: 16 },
        ),
    ] {
        let configuration = Run {
            clients: 8,
            keys: 16,
            operations: 400,
            zipf_theta: Some(0.99),
            faults: remora_sim::LinkFaults {
                loss: Probability::literal(0.02),
                duplicate: Probability::literal(0.01),
                reorder: Probability::literal(0.02),
                reorder_delay: std::time::Duration::from_micros(20),
                corrupt: Probability::literal(0.0),
            },
            check_history: true,
            ..Run::new(switch)
        };
        let outcome = run(1, &configuration).in_system("clover")?;
        if let Some(file) = history.as_deref_mut() {
            // A history that is not linearizable is this step's failure
            // (below), as without --history: the demo runs on, writes its
            // JSON and exits 1. Only a file that cannot be written is an
            // error.
            match file.write(&format!("demo/{name}"), &outcome) {
                Ok(()) | Err(crate::HistoryFileError::NotLinearizable { .. }) => {}
                Err(error) => return Err(error).in_system("clover"),
            }
        }
        let verdict = outcome
            .verdict
            .clone()
            .ok_or_else(|| crate::HistoryFileError::NoHistory(format!("demo/{name}")))
            .in_system("clover")?;
        let operations = (outcome.stats.reads + outcome.stats.writes) as f64;
        println!(
            "  {name:<18} {:>8.0} ops/s (simulated)  conflicts/op {:.2}  {} operations linearizable on {} keys: {}  versions audited whole: {}",
            outcome.operations_per_second(),
            outcome.stats.conflicts as f64 / operations,
            verdict.operations,
            verdict.keys,
            if verdict.violations.is_empty() { "yes" } else { "NO" },
            outcome.versions,
        );
        if !verdict.violations.is_empty() {
            step.failures.push(format!(
                "Clover {name}: keys {:?} not linearizable",
                verdict.violations
            ));
        }
        step.variants.push(serde_json::json!({
            "variant": name,
            "operations_per_second_simulated": outcome.operations_per_second(),
            "conflicts": outcome.stats.conflicts,
            "operations": verdict.operations,
            "violations": verdict.violations,
            "versions": outcome.versions,
            "resolver": outcome.resolver,
        }));
    }
    Ok(step)
}

/// Runs the rack file's `[clover]` section on the embedded rack: its
/// store and workload on a compute and a memory node behind the switch,
/// with the resolver if the section asks for it, every key's history
/// checked for linearizability if it asks for that.
pub fn run_clover(rack: &RackConfig, failures: &mut Vec<String>) -> Option<serde_json::Value> {
    let config = match remora_clover::config::CloverConfig::from_rack(rack) {
        Ok(found) => found?,
        Err(error) => {
            failures.push(error.to_string());
            return Some(serde_json::json!({ "error": error.to_string() }));
        }
    };
    let run = config.run;
    let switch = match run.switch {
        remora_clover::harness::SwitchChoice::Plain => "plain forwarding".to_string(),
        remora_clover::harness::SwitchChoice::Resolver { cached_keys } => {
            format!("the resolver tracking {cached_keys} keys")
        }
    };
    println!(
        "clover: {} clients, {} requests on {} keys, through {switch}",
        run.clients, run.operations, run.keys
    );
    match remora_clover::embedded::run(1, &run) {
        Ok(outcome) => {
            let violations = outcome
                .verdict
                .as_ref()
                .map(|verdict| verdict.violations.clone());
            let checked = match &outcome.verdict {
                Some(verdict) if verdict.violations.is_empty() => format!(
                    "{} keys' histories ({} requests) linearizable",
                    verdict.keys, verdict.operations
                ),
                Some(verdict) => {
                    failures.push(format!(
                        "clover: keys {:?} are not linearizable",
                        verdict.violations
                    ));
                    format!("keys {:?} NOT linearizable", verdict.violations)
                }
                None => "histories not checked".into(),
            };
            println!(
                "  {} requests ({:.0}/s), {} write conflicts; {checked}",
                outcome.operations(),
                outcome.operations_per_second(),
                outcome.stats.conflicts
            );
            Some(serde_json::json!({
                "clients": run.clients,
                "keys": run.keys,
                "resolver": !matches!(run.switch, remora_clover::harness::SwitchChoice::Plain),
                "operations": outcome.operations(),
                "operations_per_second": outcome.operations_per_second(),
                "conflicts": outcome.stats.conflicts,
                "not_linearizable_keys": violations,
                "fabric_cpu_seconds": outcome.cpu.map(|cpu| cpu.fabric.as_secs_f64()),
                "client_cpu_seconds": outcome.cpu.map(|cpu| cpu.clients.as_secs_f64()),
            }))
        }
        Err(error) => {
            failures.push(format!("clover: {error}"));
            Some(serde_json::json!({ "error": error.to_string() }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With --history, a Clover history that was not linearizable ended
    /// the demo with an error (exit 2): the steps after it did not run,
    /// and neither its JSON nor its report was written. Without it, the
    /// same run is a failed check the demo reports at its end (exit 1).
    /// The file still holds the history.
    #[test]
    fn a_history_that_is_not_linearizable_is_a_failed_check_not_an_error() {
        let path = std::env::temp_dir().join(format!(
            "remora-demo-violation-{}.jsonl",
            std::process::id()
        ));
        let mut file = crate::HistoryFile::create(&path).unwrap();
        let step = clover_step_with(Some(&mut file), |seed, run| {
            remora_clover::simulated::run(seed, run).map(|mut outcome| {
                // As if the checker had found key 3 not linearizable.
                if let Some(verdict) = outcome.verdict.as_mut() {
                    verdict.violations = vec![3];
                }
                outcome
            })
        });
        let step = step.expect("a violation is a failed check, not an error");
        assert_eq!(step.failures.len(), 2, "{:?}", step.failures);
        assert!(step.failures[0].contains("not linearizable"));
        let written = file.finish().unwrap();
        std::fs::remove_file(&path).ok();
        assert!(written.contains("of 2 checked histories"), "{written}");
    }
}
