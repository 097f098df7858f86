//! `redis-benchmark` (Debian's `redis-tools`) against `remora kv serve`
//! on the Cowbird-Spot device and against Debian's `redis-server`, in the
//! same run: GET and SET with 64-byte values over a random keyspace far
//! larger than the store's local memory, preloaded, pipelined (`-P 16`)
//! and not.

use crate::bench::child::KillOnDrop;
use crate::bench::report::median;
use remora_kv::device::{DeviceKind, FileSettings, OpenDevice};
use remora_kv::resp::{serve, ServerLimits};
use remora_kv::{Store, StoreConfig};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// redis-benchmark's default connections.
const CLIENTS: usize = 50;
/// Pipelined depth of the comparison (the issue's `-P 16`).
const PIPELINE: usize = 16;
/// Pipelined runs per server, of which the median counts.
pub const PIPELINED_RUNS: usize = 3;
/// redis-benchmark names its keys `key:` and 12 digits.
const KEY_BYTES: usize = 16;
const VALUE_BYTES: usize = 64;
/// The paper's share of the data in local memory (§8.2, 64 B values).
const LOCAL_SHARE: f64 = 5.0 / 18.0;

#[derive(Debug, thiserror::Error)]
pub enum RespBenchError {
    #[error("{tool} is missing: install Debian's redis-tools and redis-server (`.ci/run` does)")]
    Missing { tool: &'static str },
    #[error("{tool} failed: {detail}")]
    Tool { tool: &'static str, detail: String },
    #[error("redis-benchmark printed no rate for {test}: {output}")]
    NoRate { test: String, output: String },
    #[error("{0} did not answer within 30 s")]
    NotReady(&'static str),
    #[error("the store: {0}")]
    Store(String),
}

#[derive(Debug, Clone, Copy)]
pub struct RespPlan {
    /// Keys redis-benchmark draws from (`-r`).
    pub keyspace: u64,
    /// SETs issued before measuring (`-n`, pipelined deep).
    pub preload: u64,
    pub pipelined_requests: u64,
    pub plain_requests: u64,
}

/// One server's rates: (test, pipelined?) → requests per second.
pub type Rates = Vec<(String, usize, f64)>;

fn tool_error(tool: &'static str) -> impl Fn(std::io::Error) -> RespBenchError {
    move |error| match error.kind() {
        std::io::ErrorKind::NotFound => RespBenchError::Missing { tool },
        _ => RespBenchError::Tool {
            tool,
            detail: error.to_string(),
        },
    }
}

/// Runs redis-benchmark's GET and SET against `port` and parses its CSV.
fn benchmark(
    port: u16,
    requests: u64,
    keyspace: u64,
    pipeline: usize,
    tests: &str,
) -> Result<Rates, RespBenchError> {
    let output = Command::new("redis-benchmark")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            tests,
            "--csv",
        ])
        .args(["-n", &requests.to_string(), "-r", &keyspace.to_string()])
        .args(["-d", &VALUE_BYTES.to_string(), "-P", &pipeline.to_string()])
        .args(["-c", &CLIENTS.to_string()])
        .output()
        .map_err(tool_error("redis-benchmark"))?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        let detail = format!(
            "{}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        return Err(RespBenchError::Tool {
            tool: "redis-benchmark",
            detail,
        });
    }
    let mut rates = Vec::new();
    for test in tests.split(',') {
        let name = test.to_uppercase();
        let rate = text
            .lines()
            .filter_map(|line| line.strip_prefix(&format!("\"{name}\",\"")))
            .find_map(|rest| rest.split('"').next()?.parse::<f64>().ok())
            .ok_or_else(|| RespBenchError::NoRate {
                test: name.clone(),
                output: text.clone(),
            })?;
        rates.push((name, pipeline, rate));
    }
    Ok(rates)
}

/// Preloads the keyspace, then measures GET and SET pipelined (the
/// median of [`PIPELINED_RUNS`] runs, as a single run on a shared machine
/// swings by a third) and not.
fn measure(port: u16, plan: &RespPlan) -> Result<Rates, RespBenchError> {
    benchmark(port, plan.preload, plan.keyspace, 64, "set")?;
    let mut runs = Vec::with_capacity(PIPELINED_RUNS);
    for _ in 0..PIPELINED_RUNS {
        runs.push(benchmark(
            port,
            plan.pipelined_requests,
            plan.keyspace,
            PIPELINE,
            "get,set",
        )?);
    }
    let mut rates = medians(&runs);
    rates.extend(benchmark(
        port,
        plan.plain_requests,
        plan.keyspace,
        1,
        "get,set",
    )?);
    Ok(rates)
}

/// Each (test, pipeline)'s median rate over `runs`, which measured the
/// same tests.
fn medians(runs: &[Rates]) -> Rates {
    let Some(first) = runs.first() else {
        return Rates::new();
    };
    first
        .iter()
        .map(|(test, pipeline, _)| {
            let mut rates: Vec<f64> = runs
                .iter()
                .flatten()
                .filter(|(t, p, _)| t == test && p == pipeline)
                .map(|(_, _, rate)| *rate)
                .collect();
            (test.clone(), *pipeline, median(&mut rates))
        })
        .collect()
}

fn free_port() -> Result<u16, RespBenchError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(tool_error("a local port"))?;
    let port = listener
        .local_addr()
        .map_err(tool_error("a local port"))?
        .port();
    Ok(port)
}

fn wait_ready(port: u16, who: &'static str) -> Result<(), RespBenchError> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        let ping = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "ping"])
            .stderr(Stdio::null())
            .output()
            .map_err(tool_error("redis-cli"))?;
        if String::from_utf8_lossy(&ping.stdout).trim() == "PONG" {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(RespBenchError::NotReady(who))
}

/// A store sized for the keyspace: the paper's share of the loaded data
/// in memory, the rest behind Cowbird-Spot.
fn store_config(plan: &RespPlan) -> StoreConfig {
    let record = remora_kv::record::record_bytes(KEY_BYTES, VALUE_BYTES);
    let loaded = plan.keyspace.min(plan.preload) * record;
    let page_bits = 20;
    StoreConfig {
        index_buckets: (plan.keyspace / 4).next_power_of_two(),
        overflow_buckets: (plan.keyspace / 32).max(1024) as u32,
        page_bits,
        memory_pages: (((loaded as f64 * LOCAL_SHARE) as u64) >> page_bits).max(8),
        mutable_fraction: 0.9,
        first_read_bytes: record as usize,
        // One per server worker: the clients' connections share them.
        // Each session is a queue the Cowbird engine polls, so there
        // are no spare ones.
        sessions: ServerLimits::default().workers,
    }
}

/// `remora kv serve` in this process, on the Cowbird-Spot device.
pub fn remora_rates(plan: &RespPlan) -> Result<Rates, RespBenchError> {
    let config = store_config(plan);
    let store_error = |error: &dyn std::fmt::Display| RespBenchError::Store(error.to_string());
    let device_bytes = 1 << 30; // the soft RNIC's largest region
    let opened = OpenDevice::open(
        DeviceKind::CowbirdSpot,
        device_bytes,
        config.sessions + 1,
        &FileSettings::default(),
    )
    .map_err(|error| store_error(&error))?;
    let store = Store::new(config, opened.device.clone()).map_err(|error| store_error(&error))?;
    let listener = TcpListener::bind("127.0.0.1:0").map_err(tool_error("a local port"))?;
    let port = listener
        .local_addr()
        .map_err(tool_error("a local port"))?
        .port();
    let stop = Arc::new(AtomicBool::new(false));
    let server = {
        let stop = stop.clone();
        let limits = ServerLimits {
            max_connections: CLIENTS + 2,
            ..ServerLimits::default()
        };
        std::thread::spawn(move || serve(store, listener, limits, stop))
    };
    let rates = wait_ready(port, "remora kv serve").and_then(|()| measure(port, plan));
    stop.store(true, Ordering::Relaxed);
    let served = server
        .join()
        .map_err(|_| RespBenchError::Store("the server panicked".into()))?;
    served.map_err(|error| store_error(&error))?;
    opened.stop().map_err(|error| store_error(&error))?;
    rates
}

/// Debian's `redis-server`, without persistence, on a free port.
pub fn redis_rates(plan: &RespPlan) -> Result<Rates, RespBenchError> {
    let port = free_port()?;
    let server = KillOnDrop::spawn(
        Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null()),
    )
    .map_err(tool_error("redis-server"))?;
    let rates = wait_ready(port, "redis-server").and_then(|()| measure(port, plan));
    drop(server);
    rates
}
