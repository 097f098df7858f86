//! Clover on the embedded rack (real threads, the real clock, in-process
//! rings): every history linearizable and every list whole, plain and
//! with the resolver, on a clean path and with loss on the compute node's
//! link.

use remora_clover::embedded::{run, Outcome};
use remora_clover::harness::{Run, SwitchChoice};
use remora_sim::LinkFaults;
use remora_sim::Probability;
use std::time::Duration;

/// Small enough for the linearizability checker, contended enough to
/// conflict: 8 clients on 16 keys.
fn checked_run(switch: SwitchChoice, faults: LinkFaults) -> Run {
    Run {
        clients: 8,
        keys: 16,
        operations: 400,
        faults,
        // Real time on a shared machine: generous deadlines, so a
        // descheduled thread or a retransmission never fails a request.
        grace: Duration::from_secs(2),
        region_bytes: 4 << 20,
        check_history: true,
        ..Run::new(switch)
    }
}

fn check(outcome: &Outcome, operations: u64) {
    assert_eq!(outcome.operations(), operations, "every request completed");
    let verdict = outcome.verdict.as_ref().expect("history checked");
    assert_eq!(verdict.operations as u64, operations);
    assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
    assert!(outcome.versions >= 16, "every key's list audited whole");
    let cpu = outcome.cpu.expect("the embedded rack measures its CPU");
    assert!(cpu.fabric > Duration::ZERO, "the fabric thread worked");
    assert!(cpu.clients > Duration::ZERO, "the clients worked");
    assert!(cpu.metadata > Duration::ZERO, "the metadata server worked");
}

#[test]
fn plain_clover_on_the_embedded_rack_is_linearizable() {
    let outcome = run(1, &checked_run(SwitchChoice::Plain, LinkFaults::NONE)).unwrap();
    check(&outcome, 400);
    assert!(outcome.resolver.is_none());
}

#[test]
fn resolved_clover_on_the_embedded_rack_is_linearizable() {
    let configuration = checked_run(SwitchChoice::Resolver { cached_keys: 16 }, LinkFaults::NONE);
    let outcome = run(2, &configuration).unwrap();
    check(&outcome, 400);
    let counters = outcome.resolver.expect("the resolver reports");
    assert!(
        counters.entry_writes_seen > 0,
        "the resolver saw the entry WRITEs"
    );
}

#[test]
fn resolved_clover_over_a_lossy_link_is_linearizable() {
    let faults = LinkFaults {
        loss: Probability::literal(0.01),
        duplicate: Probability::literal(0.005),
        ..LinkFaults::NONE
    };
    let configuration = checked_run(SwitchChoice::Resolver { cached_keys: 16 }, faults);
    let outcome = run(3, &configuration).unwrap();
    check(&outcome, 400);
}
