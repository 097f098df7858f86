//! Histories of concurrent YCSB runs on every device, checked
//! linearizable: two threads, many operations in flight each, a keyspace
//! small enough that keys are contended and a memory small enough that
//! most reads wait for the device.

use remora_kv::device::{DeviceKind, FileSettings, OpenDevice};
use remora_kv::ycsb::{load, run, YcsbRun};
use remora_kv::{Store, StoreConfig};
use remora_workloads::history::check;
use remora_workloads::ycsb::WorkloadSpec;
use std::time::Duration;

/// Runs a recorded YCSB run on `kind` and checks its history; returns it.
fn checked_history(kind: DeviceKind, preset: &str) -> Vec<remora_workloads::history::Event> {
    let config = StoreConfig {
        overflow_buckets: 1 << 8,
        first_read_bytes: 256,
        ..StoreConfig::smallest()
    };
    let opened = OpenDevice::open(
        kind,
        64 << 20,
        config.sessions + 1,
        &FileSettings::default(),
    )
    .unwrap();
    let store = Store::new(config, opened.device.clone()).unwrap();
    let mut spec = WorkloadSpec::preset(preset).unwrap();
    spec.record_count = 600;
    let ycsb = YcsbRun {
        spec,
        value_bytes: 200,
        threads: 2,
        duration: Duration::from_millis(250),
        seed: 11,
        record_history: true,
    };
    load(&store, &ycsb).unwrap();
    let outcome = run(&store, &ycsb).unwrap();
    drop(store);
    opened.stop().unwrap();
    let verdict = check(&outcome.history).unwrap();
    assert!(
        verdict.violations.is_empty(),
        "{}: keys {:?} not linearizable",
        kind.name(),
        verdict.violations
    );
    assert!(verdict.operations > 500, "{}: {verdict:?}", kind.name());
    assert!(
        outcome.pending > 50,
        "{}: reads must wait for the device",
        kind.name()
    );
    outcome.history
}

#[test]
fn histories_on_local_memory_are_linearizable() {
    let _ = checked_history(DeviceKind::Memory, "a");
    let _ = checked_history(DeviceKind::Memory, "f");
}

/// The check is live on these histories: one read made to return a
/// value nobody wrote is caught.
#[test]
fn a_read_of_a_value_never_written_is_caught() {
    use remora_workloads::history::EventKind;
    let mut history = checked_history(DeviceKind::Memory, "a");
    let read = history
        .iter_mut()
        .find(|event| matches!(event.kind, EventKind::ReadReturned(_)))
        .expect("the run read");
    read.kind = EventKind::ReadReturned(u64::MAX);
    let key = read.key;
    assert_eq!(check(&history).unwrap().violations, vec![key]);
}

#[test]
fn histories_on_a_direct_file_are_linearizable() {
    let _ = checked_history(DeviceKind::File, "a");
}

#[test]
fn histories_on_synchronous_one_sided_reads_are_linearizable() {
    let _ = checked_history(DeviceKind::OneSidedSync, "a");
}

#[test]
fn histories_on_asynchronous_one_sided_reads_are_linearizable() {
    let _ = checked_history(DeviceKind::OneSidedAsync, "a");
}

#[test]
fn histories_on_cowbird_spot_are_linearizable() {
    let _ = checked_history(DeviceKind::CowbirdSpot, "a");
}

#[test]
fn histories_on_cowbird_p4_are_linearizable() {
    let _ = checked_history(DeviceKind::CowbirdP4, "a");
}

#[test]
fn a_history_with_inserts_is_refused_rather_than_half_recorded() {
    let opened =
        OpenDevice::open(DeviceKind::Memory, 64 << 20, 4, &FileSettings::default()).unwrap();
    let store = Store::new(StoreConfig::default(), opened.device.clone()).unwrap();
    let mut spec = WorkloadSpec::preset("d").unwrap();
    spec.record_count = 100;
    let ycsb = YcsbRun {
        spec,
        value_bytes: 64,
        threads: 1,
        duration: Duration::from_millis(10),
        seed: 1,
        record_history: true,
    };
    assert!(matches!(
        run(&store, &ycsb),
        Err(remora_kv::ycsb::YcsbError::HistoryWithInserts)
    ));
}
