//! YCSB's phases on the store: every read checks its record, on a memory
//! small enough that most of the data lives on the device.

use remora_kv::ycsb::{load, run, YcsbError, YcsbRun};
use remora_kv::*;
use remora_workloads::ycsb::WorkloadSpec;
use std::sync::Arc;
use std::time::Duration;

fn store() -> Store {
    let config = StoreConfig {
        index_buckets: 1 << 12,
        page_bits: 16,
        memory_pages: 8,
        ..StoreConfig::default()
    };
    Store::new(config, Arc::new(MemoryDevice::new(64 << 20))).unwrap()
}

fn ycsb(preset: &str, threads: usize) -> YcsbRun {
    let mut spec = WorkloadSpec::preset(preset).unwrap();
    spec.record_count = 20_000;
    YcsbRun {
        spec,
        value_bytes: 64,
        threads,
        duration: Duration::from_millis(200),
        seed: 1,
        record_history: false,
    }
}

#[test]
fn every_workload_but_e_runs_with_checked_reads_on_two_threads() {
    for preset in ["a", "b", "c", "d", "f"] {
        let store = store();
        let run_spec = ycsb(preset, 2);
        load(&store, &run_spec).unwrap();
        let outcome = run(&store, &run_spec).unwrap();
        assert!(outcome.operations > 1000, "{preset}: {outcome:?}");
        assert!(
            outcome.pending > 0,
            "{preset}: the device must serve some reads"
        );
        assert!(!outcome.latency.is_empty());
        let ratio = outcome.communication_ratio(2);
        assert!(ratio > 0.0 && ratio < 1.0, "{preset}: ratio {ratio}");
    }
}

#[test]
fn workload_e_is_refused_because_a_hash_index_cannot_scan() {
    let store = store();
    let run_spec = ycsb("e", 1);
    assert!(matches!(
        run(&store, &run_spec),
        Err(YcsbError::ScansUnsupported)
    ));
}
