//! Histories of mixed async reads and writes from several threads through
//! the Spot engine, in the simulator: every read returns its model's
//! bytes, every request completes once and in order within its type, and
//! the pool equals the models at the end; with and without loss.

use remora_cowbird::history::HistoryError;
use remora_cowbird::simulated::{
    heavy_faults, lossy, run, run_with, Disruption, ReadCheck, Workload,
};
use remora_sim::LinkFaults;
use remora_sim::Probability;
use std::time::Duration;

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

/// The memory host crashes mid-run and comes back with a fresh NIC: the
/// pool survives (declared durable), the engine and its queue pairs do
/// not. The engine makes new queue pairs, the compute host's connection
/// service connects them, the engine resumes from the compute blocks'
/// engine words, and the history still holds: every request completes
/// once, and the pool equals the models. Reads of the interrupted batches
/// are served again, so they are held to the may-be-redone rule.
#[test]
fn the_spot_engine_survives_a_crash_and_restart_of_its_host() {
    for seed in 0..4 {
        let workload = Workload {
            spot_reads: ReadCheck::MayBeRedone,
            ..Workload::new(lossy(Probability::literal(0.01)))
        };
        let crash = Disruption::Crash {
            at: Duration::from_micros(300 + 100 * seed),
            down_for: Duration::from_micros(500),
        };
        let outcome = run_with(seed, &workload, Some(crash)).unwrap();
        assert_eq!(outcome.completed, 1200, "seed {seed}");
        assert_eq!(outcome.engine_restarts, 1, "seed {seed}: {outcome:?}");
        assert_eq!(
            outcome.compute_reconnects, 3,
            "seed {seed}: one new queue pair per instance: {outcome:?}"
        );
        assert!(
            outcome.elapsed > crash.over_at(),
            "seed {seed}: the run outlived the crash"
        );
    }
}

/// A crash with the strict Spot rule fails with a typed error naming
/// the read, or passes: never a panic, never a silent wrong answer. The
/// crash really interrupts work (this seed's read sees a later write).
#[test]
fn a_crash_is_not_hidden_from_the_strict_read_check() {
    let mut mismatches = 0;
    for seed in 0..8 {
        let workload = Workload {
            window_bytes: 64,
            max_length: 32,
            ..Workload::new(LinkFaults::NONE)
        };
        let crash = Disruption::Crash {
            at: Duration::from_micros(200 + 37 * seed),
            down_for: Duration::from_micros(200),
        };
        match run_with(seed, &workload, Some(crash)) {
            Ok(outcome) => assert_eq!(outcome.completed, 1200),
            Err(error) => {
                assert!(
                    matches!(error.history(), Some(HistoryError::ReadMismatch { .. })),
                    "seed {seed}: {error}"
                );
                mismatches += 1;
            }
        }
    }
    assert!(mismatches > 0, "no strict run saw a redone read");
}

/// Seed 73 of the Spot campaign at 5% loss per link and 5% reordering
/// (`examples/spot_campaign.rs`) once stopped the engine: a metadata READ
/// was sent 8 times and every attempt lost the request or its answer, so
/// the queue pair went to RetryExceeded. Since the engine became an agent
/// on its host's timers the run takes another path and no longer meets
/// the limit; the test keeps the seed and its profile, and the next one
/// forces RetryExceeded.
#[test]
fn seed_73_at_five_percent_loss_and_reordering_completes() {
    let workload = Workload {
        spot_reads: ReadCheck::MayBeRedone,
        ..Workload::new(heavy_faults())
    };
    let outcome = run(73, &workload).unwrap();
    assert_eq!(outcome.completed, 1200);
    assert_eq!(outcome.compute_reconnects, outcome.engine.reconnects);
}

/// The memory host's link is cut for longer than the engine's seven
/// retries take (200 µs timeout): its queue pairs go to RetryExceeded.
/// Instead of stopping, the engine makes new ones once the link is back,
/// the compute host connects them, and every request still completes
/// once with the pool equal to the models.
#[test]
fn retry_exceeded_reconnects_instead_of_stopping() {
    for seed in 0..3 {
        let workload = Workload {
            spot_reads: ReadCheck::MayBeRedone,
            ..Workload::new(LinkFaults::NONE)
        };
        let cut = Disruption::Partition {
            at: Duration::from_micros(400 + 50 * seed),
            cut_for: Duration::from_millis(3),
        };
        let outcome = run_with(seed, &workload, Some(cut)).unwrap();
        assert_eq!(outcome.completed, 1200, "seed {seed}");
        // Writes that landed before the cut are not landed again (another
        // instance's newer write may lie over them); the pool still
        // matches the models.
        assert!(
            outcome.engine.writes_not_landed_again > 0,
            "seed {seed}: {outcome:?}"
        );
        assert!(outcome.engine.reconnects >= 1, "seed {seed}: {outcome:?}");
        assert_eq!(outcome.compute_reconnects, outcome.engine.reconnects);
        assert_eq!(outcome.engine_restarts, 0);
        // A reconnection replaces a queue pair on each side; kept, the
        // dead ones took the device's places for good.
        let before = run_with(seed, &workload, None).unwrap().live_queue_pairs;
        assert_eq!(outcome.live_queue_pairs, before, "seed {seed}");
    }
}

/// The embedded crash scenario once read bytes no order of the writes
/// explains: after the restart the interrupted batch ran again in entry
/// order, so an older write landed again over a newer one that had
/// landed before the crash, under a read being served again. The first
/// batch after a reconnection now lands all its writes before its reads.
/// `examples/crash_campaign.rs` failed 120 of 600 runs without it; these
/// are two of them.
#[test]
fn a_replayed_batch_lands_its_writes_before_its_reads() {
    let workload = Workload {
        window_bytes: 96,
        max_length: 48,
        spot_reads: ReadCheck::MayBeRedone,
        ..Workload::new(lossy(Probability::literal(0.01)))
    };
    for (seed, disruption) in [
        (
            222,
            Disruption::Crash {
                at: Duration::from_micros(100 + 13 * 222),
                down_for: Duration::from_micros(300),
            },
        ),
        (
            217,
            Disruption::Partition {
                at: Duration::from_micros(100 + 13 * 217),
                cut_for: Duration::from_millis(3),
            },
        ),
    ] {
        let outcome = run_with(seed, &workload, Some(disruption)).unwrap();
        assert_eq!(outcome.completed, 1200, "seed {seed}");
    }
}

/// On simulated ConnectX-5 NICs (frames held in the NIC's pipeline,
/// READs behind PCIe, 16 READs outstanding per queue pair), Spot's
/// histories stay exact under loss.
#[test]
fn spot_histories_are_exact_on_connectx5_hardware_under_loss() {
    for seed in 30..33 {
        let workload = Workload {
            hardware: remora_host::hardware::NicHardware::Cx5,
            ..Workload::new(lossy(Probability::literal(0.01)))
        };
        let outcome = run(seed, &workload).unwrap();
        assert_eq!(outcome.completed, 1200);
    }
}

/// One client's entry with an unknown request type stopped the whole
/// Spot engine, and every other client's requests with it: the engine now
/// stops serving that instance alone, puts its queue pair in ERR, and
/// the other threads' histories finish and hold.
#[test]
fn a_broken_clients_entry_stops_only_its_own_instance() {
    use remora_cowbird::layout::EntryError;
    use remora_cowbird::scenario::BROKEN_ENTRY_TYPE;
    use remora_cowbird::simulated::run_beside_broken_clients;
    use remora_cowbird::spot::{InstanceFailure, SpotError};
    for seed in 0..3 {
        let workload = Workload::new(lossy(Probability::literal(0.01)));
        let outcome = run_beside_broken_clients(seed, &workload, 1).unwrap();
        assert_eq!(outcome.completed, 1200, "seed {seed}");
        assert_eq!(outcome.engine.failed_instances, 1, "seed {seed}");
        assert_eq!(
            outcome.engine_failures,
            vec![InstanceFailure {
                instance: 0,
                error: SpotError::Entry {
                    instance: 0,
                    error: EntryError::Type(BROKEN_ENTRY_TYPE),
                },
            }]
        );
    }
}
