//! Histories of mixed async reads and writes from several threads through
//! Cowbird-P4 (the engine as a switch program), in the simulator: every
//! read returns what its model allows, every request completes once and in
//! order within its type, and the pool equals the models at the end; on a
//! clean path and under 1% and 5% loss, where only the switch's Go-Back-N
//! recovers (the hosts' queue pairs are pure responders).

use remora_cowbird::simulated::{lossy, run, Engine, Workload};
use remora_sim::LinkFaults;
use remora_sim::Probability;
use std::time::Duration;

fn p4(faults: LinkFaults) -> Workload {
    Workload {
        engine: Engine::P4,
        ..Workload::new(faults)
    }
}

#[test]
fn p4_histories_are_exact_on_a_clean_path() {
    for seed in 0..3 {
        let outcome = run(seed, &p4(LinkFaults::NONE)).unwrap();
        assert_eq!(outcome.completed, 1200);
        let stats = outcome.switch_engine.expect("the switch was the engine");
        assert_eq!(stats.go_backs, 0, "{stats:?}");
        assert_eq!(
            stats.reads_confirmed + stats.writes_confirmed,
            1200,
            "{stats:?}"
        );
        assert!(stats.reads_paused > 0, "reads waited for writes: {stats:?}");
    }
}

#[test]
fn p4_completes_every_request_under_one_percent_loss() {
    for seed in 10..13 {
        let outcome = run(seed, &p4(lossy(Probability::literal(0.01)))).unwrap();
        assert_eq!(outcome.completed, 1200);
        let stats = outcome.switch_engine.expect("the switch was the engine");
        assert!(stats.go_backs > 0 && stats.retransmitted > 0, "{stats:?}");
    }
}

#[test]
fn p4_completes_every_request_under_five_percent_loss() {
    for seed in 20..23 {
        let outcome = run(seed, &p4(lossy(Probability::literal(0.05)))).unwrap();
        assert_eq!(outcome.completed, 1200);
    }
}

/// Reads longer than the path MTU come back in several packets, which the
/// switch turns into WRITE FIRST/MIDDLE/LAST.
#[test]
fn p4_reads_span_several_packets() {
    let workload = Workload {
        window_bytes: 8192,
        max_length: 2500,
        max_write_length: 1024,
        ..p4(lossy(Probability::literal(0.01)))
    };
    for seed in 30..32 {
        let outcome = run(seed, &workload).unwrap();
        assert_eq!(outcome.completed, 1200);
        let stats = outcome.switch_engine.expect("the switch was the engine");
        assert!(stats.multi_packet_responses > 0, "{stats:?}");
    }
}

#[test]
#[ignore = "campaign: cargo test -p remora-cowbird --release -- --ignored"]
fn p4_campaign() {
    for seed in 0..200 {
        let workload = Workload {
            window_bytes: 96,
            max_length: 48,
            ..p4(lossy(Probability::literal(0.05)))
        };
        run(seed, &workload).unwrap();
    }
}

/// The fault profile of the `p4_campaign` example, which found the seeds
/// below.
fn campaign_faults(loss: Probability) -> LinkFaults {
    LinkFaults {
        reorder: Probability::literal(0.02),
        reorder_delay: Duration::from_micros(5),
        ..lossy(loss)
    }
}

/// Seed 188 read a state the pool never had in any order of the writes:
/// a write redone by one go-back landed, a second go-back came before the
/// later write's redo, and a read redone after it saw the older write on
/// top of the newer. A write now waits while another is unconfirmed.
#[test]
fn a_redone_write_never_lands_on_a_later_one() {
    let outcome = run(188, &p4(campaign_faults(Probability::literal(0.05)))).unwrap();
    assert_eq!(outcome.completed, 1200);
    let stats = outcome.switch_engine.expect("the switch was the engine");
    assert!(stats.writes_paused > 0 && stats.go_backs > 0, "{stats:?}");
}

/// Seed 14 redid a write that was already confirmed (a go-back rewound to
/// an older unconfirmed read), after the client had reused the write's
/// payload space: the pool got another write's bytes. Confirmed entries
/// fetched again are now skipped. Which seed meets such an entry moves
/// with the fault model's timing (since sequence NAKs confirm the writes
/// before the PSN they name, seed 14 met none and seed 22 did; since
/// duplicates land late, seed 14 does again and seed 22 does not), so
/// the test asks that one of them meets and skips one, and that both
/// complete every request whole.
#[test]
fn a_go_back_never_redoes_a_confirmed_request() {
    let workload = Workload {
        window_bytes: 8192,
        max_length: 3000,
        max_write_length: 1024,
        ..p4(campaign_faults(Probability::literal(0.03)))
    };
    let mut skipped = Vec::new();
    for seed in [14, 22] {
        let outcome = run(seed, &workload).unwrap();
        assert_eq!(outcome.completed, 1200);
        let stats = outcome.switch_engine.expect("the switch was the engine");
        skipped.push(stats.skipped_confirmed);
    }
    assert!(
        skipped.iter().any(|&count| count > 0),
        "neither seed met a confirmed entry: {skipped:?}"
    );
}

/// On simulated ConnectX-5 NICs, whose queue pairs remember only 16 READs
/// for replay, the switch's Go-Back-N still completes every request under
/// loss with every read exact.
#[test]
fn p4_completes_every_request_on_connectx5_hardware_under_loss() {
    for seed in 40..43 {
        let workload = Workload {
            hardware: remora_host::hardware::NicHardware::Cx5,
            ..p4(lossy(Probability::literal(0.01)))
        };
        let outcome = run(seed, &workload).unwrap();
        assert_eq!(outcome.completed, 1200);
    }
}
