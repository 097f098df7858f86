//! The RPC runtime in the simulator, over lossy, duplicating and
//! reordering links: every call runs exactly once and every caller gets
//! exactly one answer per call.

use remora_base::Probability;
use remora_bifrost::rpc::scenario::exactly_once;
use remora_sim::LinkFaults;
use std::time::Duration;

#[test]
fn every_call_runs_exactly_once_over_clean_links() {
    let outcome = exactly_once(1, LinkFaults::NONE, 200).unwrap();
    assert_eq!((outcome.executed, outcome.retransmissions), (200, 0));
}

/// 10% loss, 5% duplication, 5% reordering by 5 µs.
fn lossy() -> LinkFaults {
    LinkFaults {
        loss: Probability::literal(0.1),
        duplicate: Probability::literal(0.05),
        reorder: Probability::literal(0.05),
        reorder_delay: Duration::from_micros(5),
        ..LinkFaults::NONE
    }
}

#[test]
fn every_call_runs_exactly_once_over_lossy_links() {
    let faults = lossy();
    let mut duplicates = 0;
    for seed in 0..20 {
        let outcome =
            exactly_once(seed, faults, 200).unwrap_or_else(|error| panic!("seed {seed}: {error}"));
        assert!(
            outcome.retransmissions > 0,
            "seed {seed}: 10% loss must cost retransmissions"
        );
        duplicates += outcome.duplicates;
    }
    // The callee saw duplicates (retransmissions and duplicated frames)
    // and ran none of them.
    assert!(duplicates > 0);
}

/// A calls B calls C over lossy, duplicating, reordering links: each call
/// from the head takes effect once at the tail, though both hops resend.
#[test]
fn a_chain_of_three_services_runs_each_nested_call_once() {
    use remora_bifrost::rpc::scenario::chain;
    for seed in 0..10 {
        let outcome =
            chain(seed, lossy(), 300, None).unwrap_or_else(|error| panic!("seed {seed}: {error}"));
        assert_eq!(outcome.executed_at_tail, 300);
        assert!(
            outcome.head_retransmissions + outcome.middle_retransmissions > 0,
            "seed {seed}: the faults bit"
        );
    }
}

/// The middle of the chain crashes, losing its calls in progress, the
/// replies it remembered and its nested calls, and restarts in place. The
/// head resends; the restarted middle makes the nested calls again under
/// the same RPC ids, and the tail answers them from memory: still once.
#[test]
fn a_crash_in_the_middle_of_a_chain_replays_its_nested_calls_once() {
    use remora_bifrost::rpc::scenario::{chain, MiddleCrash};
    for seed in 0..10 {
        let crash = MiddleCrash {
            after_answers: 50 + seed * 20,
            down_for: Duration::from_millis(2),
        };
        let outcome = chain(seed, lossy(), 400, Some(crash))
            .unwrap_or_else(|error| panic!("seed {seed}: {error}"));
        assert_eq!(outcome.executed_at_tail, 400, "seed {seed}");
    }
}
