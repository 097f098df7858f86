//! The fabric campaign in the normal test run: at least 200 seeds across
//! 0 %, 1 % and 10 % loss, with duplication, reordering, corruption,
//! partitions, crashes and access violations. `remora sim fabric` runs more.

use remora_conformance::{run_campaign, CampaignReport, FaultProfile, ScenarioConfig};
use remora_host::hardware::NicHardware;
use remora_sim::Probability;

fn campaign(first_seed: u64, seeds: u64, faults: FaultProfile) {
    campaign_on(first_seed, seeds, ScenarioConfig::new(faults));
}

fn campaign_on(first_seed: u64, seeds: u64, config: ScenarioConfig) {
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
    assert_faults_happened(&config.faults, &report);
}

/// Every fault the profile asks for happened at least once: a profile
/// that stopped reaching the links (or faults stopped early) passed every
/// seed with nothing tested.
fn assert_faults_happened(faults: &FaultProfile, report: &CampaignReport) {
    let link = &report.link;
    for (name, probability, happened) in [
        ("loss", faults.loss, link.lost),
        ("duplication", faults.duplicate, link.duplicated),
        ("reordering", faults.reorder, link.reordered),
        ("corruption", faults.corrupt, link.corrupted),
        ("a partition", faults.partition, report.seeds_with_partition),
        ("a crash", faults.crash, report.seeds_with_crash),
    ] {
        assert!(
            probability.is_zero() || happened > 0,
            "{name} was asked for and never happened: {report:?}"
        );
    }
    // A crash once threw away every check of what its victim completed
    // before it.
    assert!(
        report.seeds_with_crash == 0 || report.checked_before_crash > 0,
        "crashes happened and nothing their victims completed was checked: {report:?}"
    );
    // Nor what they had done as responders.
    assert!(
        report.seeds_with_crash == 0 || report.windows_checked_before_crash > 0,
        "crashes happened and no window their victims served was checked: {report:?}"
    );
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

/// Lengths at the packet edges of each stream's own MTU (512 and 2048
/// included, which the fixed boundaries never aim at), with 1% loss.
#[test]
fn one_percent_loss_at_each_streams_mtu_edges() {
    let mut config = ScenarioConfig::new(FaultProfile::lossy(Probability::literal(0.01)));
    config.length_boundaries = remora_conformance::workload::LengthBoundaries::StreamMtu;
    campaign_on(4_000, 80, config);
}

/// The same faults on NICs that charge a ConnectX-5's costs: frames held
/// in the hardware pipeline, READs and atomics behind PCIe, atomics
/// serialized, at most 16 READs or atomics outstanding per queue pair.
#[test]
fn one_percent_loss_on_connectx5_hardware() {
    let mut config = ScenarioConfig::new(FaultProfile::lossy(Probability::literal(0.01)));
    config.hardware = NicHardware::Cx5;
    campaign_on(3_000, 60, config);
}

/// With no faults the hardware's costs alone never time a request out.
#[test]
fn no_faults_on_connectx5_hardware_every_operation_succeeds() {
    let mut config = ScenarioConfig::new(FaultProfile::NONE);
    config.hardware = NicHardware::Cx5;
    let report = run_campaign(0, 20, &config, |_| {});
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    assert_eq!(report.succeeded, report.operations);
    assert_eq!(report.retransmit_timeouts, 0);
    // The pipeline's counts reach the report: the scenario's atomics share
    // words, and nothing overflowed a pipeline.
    assert!(report.atomics_serialized > 0, "{report:?}");
    assert_eq!(report.pipeline_frames_dropped, 0);
}

/// Access violations on clean links: every NAK arrives, so no requester
/// may give up, and every violation is refused. (Giving up after a
/// violation is excused only by frames a run actually lost: excused by
/// the profile's loss, as it was, a lossy profile's run that lost nothing
/// let a responder that never sent the NAK pass.)
#[test]
fn violations_on_clean_links_are_refused_by_a_nak() {
    let faults = FaultProfile {
        violation: Probability::literal(0.5),
        ..FaultProfile::NONE
    };
    let config = ScenarioConfig::new(faults);
    let report = run_campaign(3_000, 40, &config, |_| {});
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    assert_eq!(report.link.lost + report.link.corrupted, 0);
    assert!(
        report.succeeded < report.operations,
        "violations were refused"
    );
}
