//! `rack up` on the embedded rack, stopped part way.

use remora_rack::launch::{rack_up, LaunchOptions};
use remora_rack::{CarrierKind, Mode, RackConfig};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const RACK: &str = r#"
    [rack]
    name = "stopped"
    [switch]
    program = "l2l3"
    [[node]]
    name = "c"
    role = "compute"
    address = "10.0.0.1"
    memory = "1MiB"
    [node.workload]
    operations = 100000000
    [[node]]
    name = "m"
    role = "memory"
    address = "10.0.0.2"
    memory = "4MiB"
"#;

/// The rack on in-process rings: no node processes.
fn embedded_options() -> LaunchOptions {
    LaunchOptions {
        mode: Mode::Embedded,
        carrier: CarrierKind::Shm,
        capture: None,
        executable: "remora".into(),
    }
}

/// A workload stopped by Ctrl-C (or a failure elsewhere raising the stop)
/// was reported as "workload check failed", which reads as corruption.
/// It is reported as stopped.
#[test]
fn a_stopped_workload_is_not_a_failed_check() {
    let rack = RackConfig::parse(RACK).unwrap();
    let options = embedded_options();
    let stop = Arc::new(AtomicBool::new(false));
    let stopper = Arc::clone(&stop);
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        stopper.store(true, Ordering::Relaxed);
    });
    let report = rack_up(&rack, &options, stop).unwrap();
    let error = report.nodes[0]
        .error
        .as_deref()
        .expect("the stopped workload says why it ended");
    assert!(!error.contains("check failed"), "{error}");
    // Stopped in its operations, or (on a loaded machine) while it still
    // connected.
    assert!(error.starts_with("stopped before"), "{error}");
}

/// `RackConfig`'s fields are public, but its topology and the text its
/// node processes run were the parsed text's: a rack changed after
/// `parse` ran its nodes from the original text, its changes silently
/// lost (or, for its nodes, against a topology that no longer matched).
/// It is refused before anything starts.
#[test]
fn a_rack_changed_after_it_was_parsed_is_refused() {
    let mut rack = RackConfig::parse(RACK).unwrap();
    rack.nodes[0].workload.operations = 10;
    let options = embedded_options();
    let stop = Arc::new(AtomicBool::new(false));
    match rack_up(&rack, &options, stop) {
        Err(remora_rack::RackError::Config(message)) => {
            assert!(message.contains("changed after it was parsed"), "{message}")
        }
        other => panic!(
            "a changed rack ran: {:?}",
            other.map(|report| report.nodes.len())
        ),
    }
    // The rack as parsed still runs.
    assert!(RackConfig::parse(RACK).unwrap().check_unchanged().is_ok());
}
