//! The fabric campaign in the normal test run: at least 200 seeds across
//! 0 %, 1 % and 10 % loss, with duplication, reordering, corruption,
//! partitions, crashes and access violations. `remora sim fabric` runs more.

use remora_conformance::{run_campaign, FaultProfile, ScenarioConfig};
use remora_sim::Probability;

fn campaign(first_seed: u64, seeds: u64, faults: FaultProfile) {
    let config = ScenarioConfig::new(faults);
    let report = run_campaign(first_seed, seeds, &config, |_| {});
    let failures: Vec<String> = report
        .failures
        .iter()
        .map(|seed| format!("seed {}: {}", seed.seed, seed.failures.join("; ")))
        .collect();
    assert!(
        failures.is_empty(),
        "{} failing seeds:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(report.succeeded > 0);
}

#[test]
fn no_faults_every_operation_succeeds() {
    let config = ScenarioConfig::new(FaultProfile::NONE);
    let report = run_campaign(0, 40, &config, |_| {});
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    assert_eq!(
        report.succeeded, report.operations,
        "with no faults nothing may fail"
    );
    // Late receives cause RNR go-backs, but nothing may ever time out.
    assert_eq!(report.retransmit_timeouts, 0);
}

#[test]
fn one_percent_loss() {
    campaign(1_000, 80, FaultProfile::lossy(Probability::literal(0.01)));
}

#[test]
fn ten_percent_loss() {
    campaign(2_000, 100, FaultProfile::lossy(Probability::literal(0.10)));
}
