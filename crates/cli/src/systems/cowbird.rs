//! Cowbird in the command line: its `[cowbird]` section, the demo's
//! step and `bench cowbird`.

use super::system::{System, SystemStep};
use crate::bench::entry::Benchmark;
use crate::error::{InSystem, SystemError};
use crate::HistoryFile;
use remora_rack::RackConfig;
use remora_sim::Probability;

pub struct Cowbird;

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
        run_cowbird(rack, failures)
    }

    fn demo_step(&self, history: Option<&mut HistoryFile>) -> Result<SystemStep, SystemError> {
        cowbird_step(history)
    }

    fn benchmark(&self) -> Option<&'static dyn Benchmark> {
        Some(&crate::bench::cowbird::BENCH)
    }
}

/// Cowbird: checked histories through the Spot engine and through
/// Cowbird-P4 in the simulator at 1% loss, then the hash-table probe on
/// the embedded rack, batched one-sided READs against the client library
/// with the Spot engine and with Cowbird-P4, every record checked as it
/// arrives.
pub fn cowbird_step(_history: Option<&mut crate::HistoryFile>) -> Result<SystemStep, SystemError> {
    use remora_cowbird::embedded::{run_variant, ProbeBench, Variant};
    use remora_cowbird::hash_table::TableSpec;
    use remora_cowbird::simulated::{run, Engine, Workload};
    let mut step = SystemStep {
        variants: Vec::new(),
        failures: Vec::new(),
    };
    println!("\nCowbird in the simulator (3 threads, mixed async reads and writes, 1% loss):");
    let faults = remora_cowbird::simulated::lossy(Probability::literal(0.01));
    for engine in [Engine::Spot, Engine::P4] {
        let workload = Workload {
            engine,
            ..Workload::new(faults)
        };
        match run(1, &workload) {
            Ok(outcome) => {
                let recovery = match outcome.switch_engine {
                    Some(p4) => format!(
                        "{} go-backs, {} packets sent again",
                        p4.go_backs, p4.retransmitted
                    ),
                    None => format!(
                        "{} retransmissions, {} responses packed into {} WRITEs",
                        outcome.retransmissions,
                        outcome.engine.reads,
                        outcome.engine.response_writes
                    ),
                };
                println!(
                    "  {engine:?}: {} requests completed once and in order, {} reads allowed by the model, pool equal to the model: yes ({recovery})",
                    outcome.completed, outcome.reads_checked,
                );
                step.variants.push(serde_json::json!({
                    "variant": format!("simulated {engine:?}, 1% loss"),
                    "completed": outcome.completed,
                    "reads_checked": outcome.reads_checked,
                }));
            }
            Err(error) => step
                .failures
                .push(format!("Cowbird {engine:?} in the simulator: {error}")),
        }
    }
    crash_step(&mut step);
    println!("\nthe hash-table probe on the embedded rack (64 B records, 95% remote, 0.3 s each):");
    let bench = ProbeBench::new(TableSpec::DEFAULT, std::time::Duration::from_millis(300));
    for variant in [Variant::Async, Variant::Spot, Variant::P4] {
        match run_variant(&bench, variant, 1) {
            Ok(outcome) => {
                println!(
                    "  {:<6} {:>9.0} probes/s, {} remote records fetched and checked",
                    variant.name(),
                    outcome.operations_per_second(),
                    outcome.remote_operations,
                );
                step.variants.push(serde_json::json!({
                    "variant": variant.name(),
                    "operations_per_second": outcome.operations_per_second(),
                    "remote_operations": outcome.remote_operations,
                }));
            }
            Err(error) => step
                .failures
                .push(format!("Cowbird {}: {error}", variant.name())),
        }
    }
    Ok(step)
}

/// Cowbird's memory host crashes mid-run and comes back, through one
/// scenario run in the simulator and on the embedded rack.
fn crash_step(step: &mut SystemStep) {
    use remora_cowbird::scenario::{memory_crash, CrashOutcome, CrashPlan, ScenarioError};
    use remora_cowbird::simulated::{topology, Workload};
    use remora_rack::scenario::SimulatedStage;
    use std::time::Duration;
    println!("\nCowbird's memory host crashes after 400 requests and restarts (one scenario, both modes):");
    let workload = Workload {
        p4: remora_cowbird::embedded::embedded_p4_config(),
        ..Workload::new(remora_sim::LinkFaults::NONE)
    };
    let report = |mode: &str,
                  result: Result<CrashOutcome, ScenarioError>,
                  step: &mut SystemStep| {
        match result {
            Ok(outcome) => {
                println!(
                "  {mode:<9} {} requests completed once, pool equal to the models: yes (engine restarted {}, {} queue pairs reconnected)",
                outcome.completed, outcome.engine_restarts, outcome.compute_reconnects
            );
                step.variants.push(serde_json::json!({
                    "variant": format!("memory crash, {mode}"),
                    "completed": outcome.completed,
                    "compute_reconnects": outcome.compute_reconnects,
                }));
            }
            Err(error) => step
                .failures
                .push(format!("Cowbird memory crash, {mode}: {error}")),
        }
    };
    let plan = |down_for, limit, hold_issuing| CrashPlan {
        after_completed: 400,
        down_for,
        hold_issuing,
        limit,
    };
    let stage = SimulatedStage::new(1, &topology(), 0xc0b);
    let simulated = memory_crash(
        stage,
        1,
        &workload,
        plan(Duration::from_micros(500), Duration::from_secs(2), false),
    );
    report("simulated", simulated, step);
    let topology = topology();
    let embedded = remora_rack::assembly::RackBuilder::new(&topology)
        .thread_name("demo-crash")
        .build()
        .map_err(ScenarioError::from)
        .and_then(|stage| {
            memory_crash(
                stage,
                1,
                &workload,
                plan(Duration::from_millis(20), Duration::from_secs(60), true),
            )
        });
    report("embedded", embedded, step);
}

/// The rack file's `[cowbird]` section, run on the embedded rack: checked
/// histories through the engine it names. Failures join the rack's.
pub fn run_cowbird(rack: &RackConfig, failures: &mut Vec<String>) -> Option<serde_json::Value> {
    let (workload, placement) = match remora_cowbird::embedded::from_rack(rack) {
        Ok(found) => found?,
        Err(error) => {
            failures.push(error.to_string());
            return Some(serde_json::json!({ "error": error.to_string() }));
        }
    };
    let time_limit = std::time::Duration::from_secs(120);
    println!(
        "cowbird: {:?} engine, {} threads x {} checked requests",
        workload.engine, workload.threads, workload.operations_per_thread
    );
    match remora_cowbird::embedded::run_histories(1, &workload, &placement, time_limit) {
        Ok(outcome) => {
            println!(
                "  {} requests completed once and in order, {} reads allowed by the model, pool equal to the model: yes ({:.0} requests/s)",
                outcome.completed,
                outcome.reads_checked,
                outcome.completed as f64 / outcome.elapsed.as_secs_f64()
            );
            Some(serde_json::json!({
                "engine": format!("{:?}", workload.engine),
                "threads": workload.threads,
                "completed": outcome.completed,
                "reads_checked": outcome.reads_checked,
                "seconds": outcome.elapsed.as_secs_f64(),
                "p4_go_backs": outcome.switch_engine.map(|stats| stats.go_backs),
            }))
        }
        Err(error) => {
            failures.push(format!("cowbird: {error}"));
            Some(serde_json::json!({ "error": error.to_string() }))
        }
    }
}
