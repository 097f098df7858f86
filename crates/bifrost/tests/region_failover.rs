//! A callee whose state is a region of global memory fails on the
//! embedded rack, and a spare on another host takes over from its
//! checkpoint with the region's snapshot of the same version put back:
//! every call takes effect once, in the answers and in the region.

use remora_bifrost::dsm_failover::region_failover;

#[test]
fn a_callee_with_state_in_global_memory_fails_over_and_every_call_counts_once() {
    // Each call's answer and the region's final count are checked inside
    // `region_failover` (a miscount is its `WrongRegion` error); here, that
    // the failure struck mid-run, so the replacement had work to take over.
    let outcome = region_failover(400, 150).unwrap_or_else(|error| panic!("{error}"));
    assert!(
        0 < outcome.region_at_failure && outcome.region_at_failure < outcome.calls,
        "{outcome:?}"
    );
    assert!(
        outcome.checkpoint_version <= outcome.region_at_failure,
        "{outcome:?}"
    );
    assert!(
        outcome.commits > 0,
        "b1 commits reached the Gatekeeper: {outcome:?}"
    );
}
