//! Histories of mixed async reads and writes from several threads through
//! the Spot engine, in the simulator: every read returns its model's
//! bytes, every request completes once and in order within its type, and
//! the pool equals the models at the end; with and without loss.

use remora_cowbird::simulated::{lossy, run, Workload};
use remora_sim::LinkFaults;
use remora_sim::Probability;

#[test]
fn spot_histories_are_exact_on_a_clean_path() {
    for seed in 0..4 {
        let outcome = run(seed, &Workload::new(LinkFaults::NONE)).unwrap();
        assert_eq!(outcome.completed, 1200);
        assert!(outcome.reads_checked > 500, "{outcome:?}");
        assert!(
            outcome.engine.response_writes < outcome.engine.reads,
            "responses are packed"
        );
    }
}

#[test]
fn spot_histories_are_exact_under_one_percent_loss() {
    for seed in 10..14 {
        let outcome = run(seed, &Workload::new(lossy(Probability::literal(0.01)))).unwrap();
        assert_eq!(outcome.completed, 1200);
        assert!(outcome.retransmissions > 0, "the loss was felt");
    }
}

#[test]
fn spot_histories_are_exact_under_five_percent_loss() {
    for seed in 20..23 {
        let outcome = run(seed, &Workload::new(lossy(Probability::literal(0.05)))).unwrap();
        assert_eq!(outcome.completed, 1200);
    }
}

/// Seed 5 once returned a read that saw an older overlapping write land
/// after a newer one (a retried payload READ placed its data again):
/// overlapping writes now wait for each other too.
#[test]
fn reads_overlapping_writes_in_flight_wait_for_them() {
    // A tiny window makes nearly every read overlap a recent write.
    let workload = Workload {
        window_bytes: 64,
        max_length: 32,
        ..Workload::new(lossy(Probability::literal(0.01)))
    };
    let outcome = run(5, &workload).unwrap();
    assert_eq!(outcome.completed, 1200);
    assert!(outcome.engine.stalls > 0, "{outcome:?}");
}

/// Many seeds at 5% loss with small windows, where overlaps are common.
#[test]
#[ignore = "campaign: cargo test -p remora-cowbird --release -- --ignored"]
fn campaign() {
    for seed in 0..300 {
        let workload = Workload {
            window_bytes: 96,
            max_length: 48,
            ..Workload::new(lossy(Probability::literal(0.05)))
        };
        run(seed, &workload).unwrap();
    }
}
