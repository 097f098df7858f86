//! Clover in the deterministic simulator: a compute node with many
//! clients, the switch (plain forwarding, or the resolver), and a memory
//! node, over links that lose, duplicate and reorder frames. For every
//! seed and both switch programs: each key's history is linearizable
//! (stateright's checker), every version list is whole, and, on a clean
//! path, no rewritten CAS ever failed. A long write-heavy run with
//! garbage collection stays within a fixed region.

use remora_clover::simulated::{run, Run, SwitchChoice};
use remora_host::hardware::NicHardware;
use remora_sim::{LinkFaults, Probability};
use std::time::Duration;

fn lossy(loss: Probability) -> LinkFaults {
    LinkFaults {
        loss,
        duplicate: loss.scaled(0.5),
        reorder: loss,
        reorder_delay: Duration::from_micros(20),
        corrupt: Probability::literal(0.0),
    }
}

fn contended(switch: SwitchChoice, faults: LinkFaults) -> Run {
    Run {
        clients: 8,
        keys: 16,
        operations: 200,
        zipf_theta: Some(0.99),
        faults,
        region_bytes: 1 << 20,
        garbage_every: None,
        check_history: true,
        ..Run::new(switch)
    }
}

fn checked(seed: u64, configuration: &Run) -> remora_clover::simulated::Outcome {
    let outcome = run(seed, configuration).unwrap_or_else(|error| panic!("{error}"));
    let verdict = outcome.verdict.as_ref().expect("histories were recorded");
    assert!(
        verdict.violations.is_empty(),
        "seed {seed}: keys {:?} are not linearizable",
        verdict.violations
    );
    assert_eq!(verdict.operations as u64, configuration.operations);
    outcome
}

#[test]
fn plain_clover_is_linearizable_under_loss_across_seeds() {
    for seed in 0..6 {
        let outcome = checked(
            seed,
            &contended(SwitchChoice::Plain, lossy(Probability::literal(0.02))),
        );
        assert!(
            outcome.stats.conflicts > 0,
            "seed {seed}: no contention, no test"
        );
        assert!(outcome.versions > 16);
    }
}

#[test]
fn the_resolver_keeps_lists_whole_and_histories_linearizable_under_loss() {
    let mut rewritten = 0;
    let mut retransmissions = 0;
    let mut released = 0;
    for seed in 0..8 {
        let resolver = SwitchChoice::Resolver { cached_keys: 16 };
        let outcome = checked(
            seed,
            &contended(resolver, lossy(Probability::literal(0.03))),
        );
        let counters = outcome.resolver.unwrap();
        rewritten += counters.rewritten;
        retransmissions += counters.retransmissions_rewritten;
        released += counters.acks_released;
        // Live clients never leave a turn unanswered: a break would have
        // failed the run (its successes are never released).
        assert_eq!(counters.chains_broken, 0, "seed {seed}: {counters:?}");
    }
    assert!(
        rewritten > 100,
        "the resolver rewrote only {rewritten} CASes"
    );
    assert!(
        retransmissions > 0,
        "no retransmitted CAS was rewritten: the loss never hit one, so this proves nothing"
    );
    assert!(
        released > 0,
        "no success was held for an unlinked entry and released in its turn: the chaining's \
         hazard never arose"
    );
}

#[test]
fn the_resolver_removes_most_conflicts_on_a_clean_path() {
    let mut without = 0;
    let mut with = 0;
    for seed in 0..4 {
        without += checked(seed, &contended(SwitchChoice::Plain, LinkFaults::NONE))
            .stats
            .conflicts;
        let resolver = SwitchChoice::Resolver { cached_keys: 16 };
        let outcome = checked(seed, &contended(resolver, LinkFaults::NONE));
        let counters = outcome.resolver.unwrap();
        assert_eq!(counters.rewrites_failed, 0, "seed {seed}: {counters:?}");
        // The memory node answers in the order the chain passed: nothing
        // waits for a retransmission.
        assert_eq!(counters.acks_held, 0, "seed {seed}: {counters:?}");
        assert_eq!(counters.chains_broken, 0, "seed {seed}: {counters:?}");
        with += outcome.stats.conflicts;
    }
    assert!(
        with * 2 < without,
        "conflicts with the resolver {with}, without {without}"
    );
}

#[test]
fn keys_outside_the_cache_pass_untouched_and_stay_correct() {
    for seed in 0..4 {
        let resolver = SwitchChoice::Resolver { cached_keys: 2 };
        let outcome = checked(
            seed,
            &contended(resolver, lossy(Probability::literal(0.01))),
        );
        let counters = outcome.resolver.unwrap();
        assert!(counters.passed_uncached > 0, "seed {seed}: {counters:?}");
    }
}

/// Every history-checked run collected no garbage, and the run that
/// collected checked no history: nothing showed that a slot handed out
/// again never breaks linearizability (a collector freeing a version a
/// late shortcut, a cached location or a chase still names). Here slots
/// are released and handed out again under loss, for both switch
/// programs, and every key's history is checked.
#[test]
fn collection_with_slot_reuse_stays_linearizable_under_loss() {
    for seed in 0..4 {
        for switch in [
            SwitchChoice::Plain,
            SwitchChoice::Resolver { cached_keys: 4 },
        ] {
            let configuration = Run {
                clients: 8,
                keys: 4,
                operations: 600,
                read_proportion: 0.5,
                region_bytes: 16 * 1024,
                garbage_every: Some(Duration::from_micros(200)),
                // The operation deadline is half the grace less a
                // collection period: 1.9 ms here. At 1% loss on
                // each of a verb's four link crossings, one verb in 25
                // waits out a 200 µs ACK timeout, and an operation of ten
                // verbs under contention meets five such waits a few
                // times in a run: with a 1 ms deadline, late duplicates'
                // shifted timing made one (seed 0, resolver) an error.
                grace: Duration::from_millis(4),
                check_history: true,
                faults: lossy(Probability::literal(0.01)),
                ..Run::new(switch)
            };
            let outcome = checked(seed, &configuration);
            let metadata = &outcome.metadata;
            assert!(metadata.slots_released > 0, "seed {seed}: {metadata:?}");
            // More slots handed out than the region carved: some were
            // handed out again after their release.
            let carved_slots = metadata.carved_bytes / 64;
            assert!(
                metadata.slots_handed_out > carved_slots,
                "seed {seed}: no slot reused: {metadata:?}"
            );
        }
    }
}

#[test]
fn a_long_write_heavy_run_stays_within_a_fixed_region() {
    // 4000 writes into 64-byte slots would need 256 KiB without
    // collection; the region has 96 KiB.
    let configuration = Run {
        clients: 8,
        keys: 8,
        operations: 4000,
        read_proportion: 0.1,
        region_bytes: 96 * 1024,
        garbage_every: Some(Duration::from_micros(200)),
        grace: Duration::from_millis(2),
        ..Run::new(SwitchChoice::Resolver { cached_keys: 8 })
    };
    let outcome = run(7, &configuration).unwrap();
    assert!(
        outcome.metadata.versions_retired > 3000,
        "{:?}",
        outcome.metadata
    );
    // Carving never passes the region (the server stops at its end), so
    // what shows the region sufficed is reuse: more slots handed out
    // than were ever carved, and slots released.
    let carved_slots = outcome.metadata.carved_bytes / 64;
    assert!(
        outcome.metadata.slots_handed_out > carved_slots && outcome.metadata.slots_released > 0,
        "{:?}",
        outcome.metadata
    );
    // Each collection trims every list to its newest two versions; every
    // write since the last one added exactly one. (This once read
    // `versions <= 8 * 2 + 8 * 8`, which held only while the harness let
    // the clients act once per microsecond tick: as agents they act on
    // every completion and write faster between collections.)
    assert!(
        outcome.versions <= 8 * 2 + outcome.writes_since_collection,
        "versions {}, writes since the last collection {}",
        outcome.versions,
        outcome.writes_since_collection
    );
    assert!(outcome.metadata.collections >= 2, "{:?}", outcome.metadata);
}

/// On simulated ConnectX-5 NICs (frames held in the NIC's pipeline, CASes
/// behind PCIe and serialized on their word), both switch programs keep
/// every history linearizable under loss.
#[test]
fn on_connectx5_hardware_histories_stay_linearizable_under_loss() {
    for seed in 0..4 {
        for switch in [
            SwitchChoice::Plain,
            SwitchChoice::Resolver { cached_keys: 16 },
        ] {
            let configuration = Run {
                hardware: NicHardware::Cx5,
                ..contended(switch, lossy(Probability::literal(0.02)))
            };
            let outcome = checked(seed, &configuration);
            assert!(outcome.versions > 16, "seed {seed}: {switch:?}");
        }
    }
}

/// Links that flip bits: the resolver read fields of corrupted frames (an
/// ACK's original value, an entry WRITE's key) and rewrote corrupted CASes
/// with a fresh ICRC. It checks the ICRC first now, as a switch's MAC
/// checks the FCS, and passes a corrupt frame for its receiver to drop.
#[test]
fn the_resolver_stays_linearizable_when_links_corrupt_frames() {
    let mut corrupt_passed = 0;
    for seed in 0..6 {
        let resolver = SwitchChoice::Resolver { cached_keys: 16 };
        let faults = LinkFaults {
            corrupt: Probability::literal(0.02),
            ..lossy(Probability::literal(0.0))
        };
        let outcome = checked(seed, &contended(resolver, faults));
        corrupt_passed += outcome.resolver.unwrap().corrupt_passed;
    }
    assert!(
        corrupt_passed > 0,
        "no corrupt frame reached the resolver: this proves nothing"
    );
}

/// A PUT waiting for slots (the region full, collection on its way) holds
/// no remote pointer, yet its wait counted against the operation deadline
/// (half the grace), and the run failed with `Deadline` while freed slots
/// came back a grace after they were retired.
#[test]
fn a_put_waiting_for_slots_is_not_failed_by_the_deadline() {
    let configuration = Run {
        clients: 4,
        keys: 4,
        operations: 600,
        read_proportion: 0.0,
        region_bytes: 16 * 1024,
        garbage_every: Some(Duration::from_micros(500)),
        grace: Duration::from_millis(4),
        ..Run::new(SwitchChoice::Plain)
    };
    let outcome = run(3, &configuration).unwrap_or_else(|error| panic!("{error}"));
    assert!(
        outcome.stats.slot_waits > 0,
        "no PUT waited for slots: this proves nothing"
    );
}

/// A run's warm-up is left out of its figures: the operations, latencies
/// and time it reports are the measured ones', counted from the moment
/// the warm-up completed, and the history still covers every operation.
#[test]
fn a_warm_up_is_left_out_of_the_figures() {
    let measured_only = Run {
        operations: 300,
        ..contended(SwitchChoice::Plain, LinkFaults::NONE)
    };
    let warmed = Run {
        warmup_operations: 300,
        ..measured_only
    };
    let whole = run(
        1,
        &Run {
            operations: 600,
            ..measured_only
        },
    )
    .unwrap();
    let outcome = run(1, &warmed).unwrap();
    let measured = outcome.operations();
    // The warm-up ends at the first clients' turn that has completed
    // 300; clients in the middle of an operation then finish it inside
    // the measurement, one each at most.
    let clients = warmed.clients as u64;
    assert!(
        (300 - clients..=300).contains(&measured),
        "{measured} measured"
    );
    assert_eq!(outcome.stats.latency.len(), measured);
    assert!(outcome.elapsed < whole.elapsed, "{outcome:?} {whole:?}");
    assert_eq!(
        outcome.verdict.expect("a history").operations,
        600,
        "the history covers the warm-up"
    );
}
