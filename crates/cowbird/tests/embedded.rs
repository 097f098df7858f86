//! Checked histories of mixed async reads and writes from several threads
//! on the embedded rack (real threads, the real clock, in-process rings),
//! through the Spot engine and through Cowbird-P4: every read returns what
//! its model allows, every request completes once and in order within its
//! type, and the pool equals the models at the end.

use remora_cowbird::embedded::{embedded_p4_config, run_histories};
use remora_cowbird::simulated::{topology, Engine, Workload};
use remora_sim::LinkFaults;
use std::time::Duration;

fn workload(engine: Engine) -> Workload {
    Workload {
        engine,
        p4: embedded_p4_config(),
        ..Workload::new(LinkFaults::NONE)
    }
}

/// Generous: the rack shares two vCPUs with the rest of the test suite.
const TIME_LIMIT: Duration = Duration::from_secs(60);

#[test]
fn spot_histories_hold_on_the_embedded_rack() {
    let outcome = run_histories(1, &workload(Engine::Spot), &topology(), TIME_LIMIT).unwrap();
    assert_eq!(outcome.completed, 1200);
    assert!(outcome.reads_checked > 500, "{outcome:?}");
    let spot = outcome.engine;
    assert!(spot.reads > 0, "{spot:?}");
}

#[test]
fn p4_histories_hold_on_the_embedded_rack() {
    let outcome = run_histories(2, &workload(Engine::P4), &topology(), TIME_LIMIT).unwrap();
    assert_eq!(outcome.completed, 1200);
    assert!(outcome.reads_checked > 500, "{outcome:?}");
    let p4 = outcome.switch_engine.expect("the switch was the engine");
    assert_eq!(p4.reads_confirmed + p4.writes_confirmed, 1200, "{p4:?}");
}

/// The rack file's `[cowbird]` section decides the engine, threads, rings
/// and engine settings, and the hosts sit where the rack file puts them.
#[test]
fn the_rack_files_cowbird_section_runs_both_engines() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/rack-cowbird.toml"
    );
    // Addresses of its own, to see that the hosts sit where the file says.
    let text = std::fs::read_to_string(path)
        .unwrap()
        .replace("10.0.0.", "10.0.3.");
    let mut rack = remora_rack::RackConfig::parse(&text).unwrap();
    for engine in ["spot", "p4"] {
        let section = rack.systems.get_mut("cowbird").unwrap();
        section.insert("engine".into(), engine.into());
        let (workload, hosts) = remora_cowbird::embedded::from_rack(&rack).unwrap().unwrap();
        assert_eq!(workload.sizes.metadata_entries, 1024);
        assert_eq!(
            hosts.host(0).address,
            remora_wire::Ipv4Address::new(10, 0, 3, 1)
        );
        assert_eq!(
            hosts.host(1).address,
            remora_wire::Ipv4Address::new(10, 0, 3, 2)
        );
        let outcome = run_histories(3, &workload, &hosts, TIME_LIMIT).unwrap();
        assert_eq!(outcome.completed, 1200, "{engine:?}");
    }
}
