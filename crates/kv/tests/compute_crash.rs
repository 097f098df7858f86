//! The compute host crashes under a running store in the simulator, and a
//! new store recovers from the checkpoint in far memory
//! (`remora_kv::scenario::compute_crash`), seed by seed; and the same
//! scenario on the embedded rack.

use remora_host::hardware::NicHardware;
use remora_kv::scenario::{
    compute_crash_campaign, simulated_compute_crash, Activity, CampaignReport, Control, CrashPlan,
    ScenarioError,
};
use remora_rack::scenario::Network;
use remora_sim::{LinkFaults, Probability};

fn lossy() -> LinkFaults {
    LinkFaults {
        loss: Probability::literal(0.01),
        duplicate: Probability::literal(0.01),
        ..LinkFaults::NONE
    }
}

fn campaign(seeds: u64, network: Network) -> CampaignReport {
    let report = compute_crash_campaign(0, seeds, network, CrashPlan::DEFAULT, |_, _| {});
    assert!(
        report.violations.is_empty(),
        "seeds that failed: {:?}",
        report.violations
    );
    assert_eq!(report.passed, seeds);
    report
}

/// Every seed recovers exactly the checkpoint's state, and some crashes
/// land mid-checkpoint, some of them after the record reached far memory
/// (so the checks cover both outcomes of a torn checkpoint).
#[test]
fn every_acknowledged_write_before_a_checkpoint_survives_a_compute_crash() {
    let report = campaign(120, Network::default());
    assert!(report.crashed_mid_checkpoint >= 10, "{report:?}");
    assert!(report.recovered_unacknowledged >= 2, "{report:?}");
    assert!(report.keys_checked >= 120 * 64);
}

#[test]
fn recovery_holds_under_loss_and_duplication() {
    let report = campaign(
        60,
        Network {
            faults: lossy(),
            hardware: NicHardware::Ideal,
        },
    );
    assert!(report.retransmissions > 0, "{report:?}");
}

#[test]
fn recovery_holds_on_connectx5_nics() {
    campaign(
        40,
        Network {
            faults: lossy(),
            hardware: NicHardware::Cx5,
        },
    );
}

/// The control: the newest page under the acknowledged checkpoint is
/// zeroed in far memory before recovery, and the checks must say so.
/// Only a crash before the second checkpoint has nothing to lose (the
/// first checkpoint is of the empty store).
#[test]
fn a_lost_page_under_the_checkpoint_is_caught() {
    let plan = CrashPlan {
        control: Control::LoseNewestPage,
        ..CrashPlan::DEFAULT
    };
    let mut caught = 0;
    for seed in 0..40 {
        match simulated_compute_crash(seed, Network::default(), plan) {
            Err(ScenarioError::Lost { .. } | ScenarioError::Recover(_)) => caught += 1,
            Ok(outcome) => assert_eq!(outcome.recovered_sequence, 1, "seed {seed}: {outcome:?}"),
            Err(other) => panic!("seed {seed}: {other}"),
        }
    }
    assert!(caught >= 30, "only {caught} of 40 caught");
}

#[test]
fn a_crash_mid_operation_and_mid_checkpoint_are_both_seen() {
    let activities: Vec<Activity> = (0..30)
        .map(|seed| {
            simulated_compute_crash(seed, Network::default(), CrashPlan::DEFAULT)
                .unwrap()
                .crashed_during
        })
        .collect();
    assert!(activities.contains(&Activity::Operation));
    assert!(activities.contains(&Activity::Checkpoint));
}

#[test]
fn a_plan_that_cannot_check_anything_is_refused() {
    let plan = CrashPlan {
        checkpoint_every: 0,
        ..CrashPlan::DEFAULT
    };
    assert!(matches!(
        simulated_compute_crash(1, Network::default(), plan),
        Err(ScenarioError::Plan(_))
    ));
}

/// The same scenario on the embedded rack: real threads, the real clock,
/// the power cut at a wall-clock instant.
#[test]
fn the_compute_host_crashes_under_the_store_on_the_embedded_rack() {
    let topology = remora_rack::topology::Topology::compute_and_memory();
    for seed in [3, 4] {
        let stage = remora_rack::assembly::RackBuilder::new(&topology)
            .thread_name("kv-crash")
            .nic_seed(seed)
            .build()
            .unwrap();
        let plan = CrashPlan {
            crash_window: std::time::Duration::from_millis(30),
            down_for: std::time::Duration::from_millis(5),
            ..CrashPlan::DEFAULT
        };
        let outcome = remora_kv::scenario::compute_crash(stage, seed, plan).unwrap();
        assert_eq!(outcome.keys_checked, 64);
        assert!(outcome.operations_after > 0);
    }
}
