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
    let value_bytes: usize = arguments.get(4).map_or(Ok(64), |text| text.parse())?;
    let seconds: u64 = arguments.get(5).map_or(Ok(1), |text| text.parse())?;
    let config = StoreConfig {
        index_buckets: (records / 4).next_power_of_two(),
        overflow_buckets: ((records / 4).next_power_of_two() / 8) as u32,
        page_bits: 20,
        memory_pages,
        first_read_bytes: record::record_bytes(8, value_bytes) as usize,
        ..StoreConfig::default()
    };
    let store = Store::new(config, Arc::new(MemoryDevice::new(4 << 30)))?;
    let mut spec = WorkloadSpec::preset(preset)?;
    spec.record_count = records;
    let ycsb = YcsbRun {
        spec,
        value_bytes,
        threads: 1,
        duration: Duration::from_secs(seconds),
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
