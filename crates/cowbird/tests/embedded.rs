//! Checked histories of mixed async reads and writes from several threads
//! on the embedded rack (real threads, the real clock, in-process rings),
//! through the Spot engine and through Cowbird-P4: every read returns what
//! its model allows, every request completes once and in order within its
//! type, and the pool equals the models at the end.

use remora_cowbird::embedded::run_histories;
use remora_cowbird::simulated::{Engine, Workload};
use remora_sim::LinkFaults;
use std::time::Duration;

fn workload(engine: Engine) -> Workload {
    Workload {
        engine,
        ..Workload::new(LinkFaults::NONE)
    }
}

/// Generous: the rack shares two vCPUs with the rest of the test suite.
const TIME_LIMIT: Duration = Duration::from_secs(60);

#[test]
fn spot_histories_hold_on_the_embedded_rack() {
    let outcome = run_histories(1, &workload(Engine::Spot), TIME_LIMIT).unwrap();
    assert_eq!(outcome.completed, 1200);
    assert!(outcome.reads_checked > 500, "{outcome:?}");
    let spot = outcome.spot.expect("the Spot engine ran");
    assert!(spot.reads > 0, "{spot:?}");
}

#[test]
fn p4_histories_hold_on_the_embedded_rack() {
    let outcome = run_histories(2, &workload(Engine::P4), TIME_LIMIT).unwrap();
    assert_eq!(outcome.completed, 1200);
    assert!(outcome.reads_checked > 500, "{outcome:?}");
    let p4 = outcome.p4.expect("the switch was the engine");
    assert_eq!(p4.reads_confirmed + p4.writes_confirmed, 1200, "{p4:?}");
}
