//! One scenario, two execution modes: the Spot engine's memory host
//! crashes mid-run and restarts, or loses its link past the retry limit,
//! in the deterministic simulator and on the embedded rack (real threads,
//! real clock), through the same code (`remora_cowbird::scenario`).

use remora_cowbird::embedded::embedded_p4_config;
use remora_cowbird::scenario::{histories, memory_crash, CrashOutcome, CrashPlan, Disruption};
use remora_cowbird::simulated::{topology, ReadCheck, Workload};
use remora_rack::assembly::RackBuilder;
use remora_rack::scenario::SimulatedStage;
use remora_sim::LinkFaults;
use std::time::Duration;

fn check(outcome: &CrashOutcome) {
    assert_eq!(outcome.completed, 1200, "{outcome:?}");
    assert!(
        outcome.completed_at_crash >= 300 && outcome.completed_at_crash < 1200,
        "the crash came mid-run: {outcome:?}"
    );
    assert_eq!(outcome.engine_restarts, 1, "{outcome:?}");
    // One new queue pair per instance (three threads), plus any made
    // because a queue pair ran out of retries.
    assert!(outcome.compute_reconnects >= 3, "{outcome:?}");
    assert_eq!(
        outcome.compute_reconnects,
        3 + outcome.engine.reconnects,
        "{outcome:?}"
    );
}

#[test]
fn the_memory_host_crashes_and_restarts_in_the_simulator() {
    for seed in 0..3 {
        let stage = SimulatedStage::new(seed, &topology(), seed ^ 0xc0b);
        let plan = CrashPlan {
            after_completed: 300 + 100 * seed,
            down_for: Duration::from_micros(500),
            hold_issuing: false,
            limit: Duration::from_secs(2),
        };
        let outcome = memory_crash(stage, seed, &Workload::new(LinkFaults::NONE), plan).unwrap();
        check(&outcome);
    }
}

#[test]
fn the_memory_host_crashes_and_restarts_on_the_embedded_rack() {
    let topology = topology();
    let stage = RackBuilder::new(&topology)
        .thread_name("crash-scenario")
        .nic_seed(0xc0b)
        .build()
        .unwrap();
    let workload = Workload {
        p4: embedded_p4_config(),
        ..Workload::new(LinkFaults::NONE)
    };
    let plan = CrashPlan {
        after_completed: 400,
        down_for: Duration::from_millis(20),
        hold_issuing: true,
        // Generous: the rack shares two vCPUs with the rest of the suite.
        limit: Duration::from_secs(60),
    };
    let outcome = memory_crash(stage, 5, &workload, plan).unwrap();
    check(&outcome);
}

/// The memory host's link is cut from the start for longer than the
/// engine's queue pairs retry (16 ms × 8 on the rack's clock): they reach
/// RetryExceeded, and once the link is back the engine reconnects through
/// the compute host and every request still completes once.
#[test]
fn a_cut_link_on_the_embedded_rack_ends_in_a_reconnection() {
    let topology = topology();
    let stage = RackBuilder::new(&topology)
        .thread_name("partition-scenario")
        .nic_seed(0xc0b)
        .own_cpu(remora_rack::topology::COMPUTE_HOST)
        .build()
        .unwrap();
    let workload = Workload {
        spot_reads: ReadCheck::MayBeRedone,
        ..Workload::new(LinkFaults::NONE)
    };
    let cut = Disruption::Partition {
        at: Duration::ZERO,
        cut_for: Duration::from_millis(400),
    };
    let outcome = histories(stage, 7, &workload, Some(cut), Duration::from_secs(60)).unwrap();
    assert_eq!(outcome.completed, 1200, "{outcome:?}");
    assert!(outcome.engine.reconnects >= 1, "{outcome:?}");
    assert_eq!(outcome.compute_reconnects, outcome.engine.reconnects);
    assert_eq!(outcome.engine_restarts, 0, "{outcome:?}");
    assert!(outcome.elapsed >= cut.over_at(), "{outcome:?}");
}
