//! One YCSB run on the memory device, printing the log's boundaries and
//! the session counters: for looking at what the store does.

use remora_kv::ycsb::{load, run, YcsbRun};
use remora_kv::*;
use remora_workloads::ycsb::WorkloadSpec;
use std::sync::Arc;
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arguments: Vec<String> = std::env::args().collect();
    let preset = arguments.get(1).map_or("a", String::as_str);
    let records: u64 = arguments.get(2).map_or(Ok(600_000), |text| text.parse())?;
    let memory_pages: u64 = arguments.get(3).map_or(Ok(16), |text| text.parse())?;
    let config = StoreConfig {
        index_buckets: (records / 4).next_power_of_two(),
        overflow_buckets: 1 << 16,
        page_bits: 20,
        memory_pages,
        first_read_bytes: 96,
        ..StoreConfig::default()
    };
    let store = Store::new(config, Arc::new(MemoryDevice::new(4 << 30)))?;
    let mut spec = WorkloadSpec::preset(preset)?;
    spec.record_count = records;
    let ycsb = YcsbRun {
        spec,
        value_bytes: 64,
        threads: 1,
        duration: Duration::from_secs(1),
        seed: 7,
        record_history: false,
    };
    let loaded = load(&store, &ycsb)?;
    println!("loaded in {loaded:?}: boundaries {:?}", store.boundaries());
    let outcome = run(&store, &ycsb)?;
    println!(
        "{:.0} ops/s, pending {}, boundaries {:?}, p50 {} ns",
        outcome.operations_per_second(),
        outcome.pending,
        store.boundaries(),
        outcome.latency.value_at_quantile(0.5)
    );
    Ok(())
}
