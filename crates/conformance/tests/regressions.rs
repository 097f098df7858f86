//! Seeds that once failed, each with the bug it found. A seed's meaning is
//! tied to the scenario code, so these pin behaviour at the commit that
//! fixed them and keep exercising the same paths afterwards.

use remora_conformance::{run_seed, FaultProfile, ScenarioConfig};
use remora_sim::Probability;

fn assert_passes(seed: u64, faults: FaultProfile) {
    let report = run_seed(seed, &ScenarioConfig::new(faults));
    assert!(report.passed(), "seed {seed}: {:?}", report.failures);
}

/// An RNR NAK was followed by a sequence-error NAK for the same gap, each
/// costing a retry, so late receives exhausted `retry_count` with no loss.
#[test]
fn seed_4_rnr_does_not_spend_retries() {
    assert_passes(4, FaultProfile::NONE);
}

/// A remote access NAK was charged to the oldest request (a READ whose
/// answer was lost) instead of the request it named.
#[test]
fn seed_1002_nak_names_its_request() {
    assert_passes(1002, FaultProfile::lossy(Probability::literal(0.01)));
}

/// A READ answered while an earlier READ waited for a lost packet was never
/// retired, and its completion never came.
#[test]
fn seed_1006_answered_read_is_retired() {
    assert_passes(1006, FaultProfile::lossy(Probability::literal(0.01)));
}

/// Going back over a fully answered READ re-requested it past its end
/// (an arithmetic overflow in the requester).
#[test]
fn seed_1000_to_1010_answered_reads_are_not_re_requested() {
    for seed in 1000..1010 {
        assert_passes(seed, FaultProfile::lossy(Probability::literal(0.01)));
    }
}

/// A multi-packet WRITE cut off by its queue pair entering error left its
/// leading packets in memory: legal, and the checker now says so exactly.
#[test]
fn seed_1072_cut_off_write_is_a_packet_prefix() {
    assert_passes(1072, FaultProfile::lossy(Probability::literal(0.01)));
}
