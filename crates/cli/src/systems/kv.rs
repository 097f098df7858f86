//! The far-memory KV store in the command line: the demo's step and
//! `bench kv`. It has no rack-file section: `remora kv` takes its
//! settings as flags, and its devices stand up their own rack.

use super::system::{System, SystemStep};
use crate::bench::entry::Benchmark;
use crate::error::{InSystem, SystemError};
use crate::HistoryFile;
use remora_kv::device::{DeviceKind, FileSettings, OpenDevice};
use remora_kv::ycsb::{self, YcsbRun};
use remora_kv::{Store, StoreConfig};
use remora_rack::RackConfig;
use remora_workloads::ycsb::WorkloadSpec;
use std::time::Duration;

pub struct Kv;

#[derive(Debug, thiserror::Error)]
#[error("the KV store has no rack-file section: `remora kv serve` and `remora bench kv` take its settings as flags")]
pub struct NoKvSection;

impl System for Kv {
    fn name(&self) -> &'static str {
        "kv"
    }

    fn title(&self) -> &'static str {
        "the far-memory KV store"
    }

    fn check_section(&self, rack: &RackConfig) -> Result<(), SystemError> {
        if rack.systems.contains_key(self.name()) {
            return Err(NoKvSection).in_system(self.name());
        }
        Ok(())
    }

    fn demo_step(&self, _history: Option<&mut HistoryFile>) -> Result<SystemStep, SystemError> {
        kv_step().in_system(self.name())
    }

    fn benchmark(&self) -> Option<&'static dyn Benchmark> {
        Some(&crate::bench::kv::BENCH)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KvStepError {
    #[error(transparent)]
    Device(#[from] remora_kv::DeviceError),
    #[error(transparent)]
    Store(#[from] remora_kv::KvError),
    #[error(transparent)]
    Ycsb(#[from] remora_kv::ycsb::YcsbError),
    #[error(transparent)]
    Workload(#[from] remora_workloads::ycsb::WorkloadError),
    #[error("the RESP server: {0}")]
    Serve(#[from] remora_kv::resp::ServeError),
    #[error("talking RESP to the server: {0}")]
    RespClient(#[from] std::io::Error),
    #[error("the RESP server's thread panicked")]
    ServerPanicked,
}

/// YCSB-A on a store whose memory holds a quarter of its records, the
/// rest in far memory behind Cowbird-Spot, then the same on local
/// memory: every read checks it got its own record. The Cowbird-Spot
/// store then answers one pipelined exchange over RESP.
fn kv_step() -> Result<SystemStep, KvStepError> {
    let mut step = SystemStep {
        variants: Vec::new(),
        failures: Vec::new(),
    };
    println!("\nThe far-memory KV store (FASTER-style hybrid log), YCSB-A zipf 0.99, 2 threads, 64 B values, a quarter of the log in memory:");
    let config = StoreConfig {
        index_buckets: 1 << 14,
        page_bits: 16,
        memory_pages: 32,
        sessions: 4,
        ..StoreConfig::default()
    };
    let mut spec = WorkloadSpec::preset("a")?;
    spec.record_count = 40_000;
    let run = YcsbRun {
        spec,
        value_bytes: 64,
        threads: 2,
        duration: Duration::from_millis(300),
        seed: 3,
        record_history: false,
    };
    for kind in [DeviceKind::Memory, DeviceKind::CowbirdSpot] {
        let opened = OpenDevice::open(
            kind,
            64 << 20,
            config.sessions + 1,
            &FileSettings::default(),
        )?;
        let store = Store::new(config.clone(), opened.device.clone())?;
        ycsb::load(&store, &run)?;
        let outcome = ycsb::run(&store, &run)?;
        let resp = (kind == DeviceKind::CowbirdSpot)
            .then(|| resp_round_trip(&store))
            .transpose()?;
        drop(store);
        let _ = opened.stop()?;
        println!(
            "  {:<13} {:>9.0} ops/s, {} operations waited for the device, every read checked",
            kind.name(),
            outcome.operations_per_second(),
            outcome.pending,
        );
        if outcome.pending == 0 {
            step.failures
                .push(format!("kv on {}: no read reached the device", kind.name()));
        }
        match resp.as_deref() {
            Some(RESP_EXPECTED) => println!(
                "  RESP over TCP on {}: a pipelined SET, GET and two INCRs answered as Redis answers them (`remora kv serve` takes redis-cli and redis-benchmark)",
                kind.name()
            ),
            Some(other) => step.failures.push(format!(
                "kv serve on {}: answered {other:?}, not {RESP_EXPECTED:?}",
                kind.name()
            )),
            None => {}
        }
        step.variants.push(serde_json::json!({
            "variant": format!("kv on {}", kind.name()),
            "operations_per_second": outcome.operations_per_second(),
            "pending": outcome.pending,
        }));
    }
    Ok(step)
}

/// What a Redis server answers to [`RESP_REQUESTS`].
const RESP_EXPECTED: &str = "+OK\r\n$5\r\nhello\r\n:1\r\n:2\r\n";
const RESP_REQUESTS: &[u8] =
    b"SET greeting hello\r\nGET greeting\r\nINCR visits\r\nINCR visits\r\n";

/// Serves `store` over RESP on a loopback port for one pipelined
/// exchange, as `remora kv serve` does; returns the replies.
fn resp_round_trip(store: &Store) -> Result<String, KvStepError> {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let server = {
        let (store, stop) = (store.clone(), stop.clone());
        let limits = remora_kv::resp::ServerLimits::default();
        std::thread::spawn(move || remora_kv::resp::serve(store, listener, limits, stop))
    };
    let exchange = || -> std::io::Result<String> {
        let mut client = std::net::TcpStream::connect(address)?;
        client.set_read_timeout(Some(Duration::from_secs(10)))?;
        client.write_all(RESP_REQUESTS)?;
        let mut replies = vec![0; RESP_EXPECTED.len()];
        client.read_exact(&mut replies)?;
        Ok(String::from_utf8_lossy(&replies).into_owned())
    };
    let replies = exchange();
    stop.store(true, Ordering::SeqCst);
    server.join().map_err(|_| KvStepError::ServerPanicked)??;
    Ok(replies?)
}
