//! `redis-benchmark` (Debian's `redis-tools`) against `remora kv serve`
//! on the Cowbird-Spot device and against Debian's `redis-server`, in the
//! same run: GET and SET with 64-byte values over a random keyspace far
//! larger than the store's local memory, pipelined (`-P 16`) and not.
//! The first keys of the keyspace, in redis-benchmark's own names, are
//! preloaded one by one (a preload by redis-benchmark draws keys with
//! replacement, and set only 63% of a keyspace it was sized to fill).

use crate::bench::child::KillOnDrop;
use crate::bench::report::median;
use remora_kv::device::{DeviceKind, FileSettings, OpenDevice};
use remora_kv::resp::{serve, ServerLimits};
use remora_kv::{Store, StoreConfig};
use std::io::{BufRead, Write};
use std::net::{TcpListener, TcpStream};
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
    #[error("{tool} did not finish within {limit:?}: the server stopped answering")]
    TimedOut { tool: &'static str, limit: Duration },
    #[error("the store: {0}")]
    Store(String),
}

#[derive(Debug, Clone, Copy)]
pub struct RespPlan {
    /// Keys redis-benchmark draws from (`-r`).
    pub keyspace: u64,
    /// Keys preloaded before measuring: the keyspace's first, one SET each.
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

/// The slowest request rate a run is given time for: far below either
/// server's, so only a server that stopped answering meets the limit.
const SLOWEST_REQUESTS_PER_SECOND: u64 = 2_000;

/// `command`'s output once it ends, killed past `limit`: waited on with
/// no limit, a server that accepted and never answered hung the whole
/// benchmark (and `bench all`).
fn output_within(
    command: &mut Command,
    tool: &'static str,
    limit: Duration,
) -> Result<std::process::Output, RespBenchError> {
    let child = KillOnDrop::spawn(command.stdout(Stdio::piped()).stderr(Stdio::piped()))
        .map_err(tool_error(tool))?;
    child
        .wait_within(limit)
        .map_err(tool_error(tool))?
        .ok_or(RespBenchError::TimedOut { tool, limit })
}

/// Runs redis-benchmark's GET and SET against `port` and parses its CSV.
fn benchmark(
    port: u16,
    requests: u64,
    keyspace: u64,
    pipeline: usize,
    tests: &str,
) -> Result<Rates, RespBenchError> {
    let tests_run = tests.split(',').count() as u64;
    let limit = Duration::from_secs(30 + requests * tests_run / SLOWEST_REQUESTS_PER_SECOND);
    let output = output_within(
        Command::new("redis-benchmark")
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
            .args(["-c", &CLIENTS.to_string()]),
        "redis-benchmark",
        limit,
    )?;
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

/// SETs sent before their replies are read.
const PRELOAD_BATCH: u64 = 1000;
/// How long the preload waits for a server's reply.
const PRELOAD_REPLY_WAIT: Duration = Duration::from_secs(30);

fn preload_error(error: std::io::Error) -> RespBenchError {
    RespBenchError::Tool {
        tool: "the preload",
        detail: error.to_string(),
    }
}

/// SETs keys `key:000000000000` up to `keys` (redis-benchmark's names
/// for the numbers `-r` draws), 64-byte values, pipelined in batches:
/// every one of them is there afterwards.
fn preload(port: u16, keys: u64) -> Result<(), RespBenchError> {
    let stream = TcpStream::connect(("127.0.0.1", port)).map_err(preload_error)?;
    // Both ways: a server that stops reading blocks a batch's write (a
    // batch is larger than the socket's buffers) as surely as one that
    // stops answering blocks the read.
    stream
        .set_read_timeout(Some(PRELOAD_REPLY_WAIT))
        .map_err(preload_error)?;
    stream
        .set_write_timeout(Some(PRELOAD_REPLY_WAIT))
        .map_err(preload_error)?;
    let mut replies = std::io::BufReader::new(stream.try_clone().map_err(preload_error)?);
    let mut writer = std::io::BufWriter::new(stream);
    let value = [b'x'; VALUE_BYTES];
    let mut line = String::new();
    // Bounded by the keys, a batch at a time.
    for start in (0..keys).step_by(PRELOAD_BATCH as usize) {
        let end = (start + PRELOAD_BATCH).min(keys);
        for key in start..end {
            write!(
                writer,
                "*3\r\n$3\r\nSET\r\n${KEY_BYTES}\r\nkey:{key:012}\r\n${VALUE_BYTES}\r\n"
            )
            .map_err(preload_error)?;
            writer.write_all(&value).map_err(preload_error)?;
            writer.write_all(b"\r\n").map_err(preload_error)?;
        }
        writer.flush().map_err(preload_error)?;
        for _ in start..end {
            line.clear();
            replies.read_line(&mut line).map_err(preload_error)?;
            if line != "+OK\r\n" {
                return Err(RespBenchError::Tool {
                    tool: "the preload",
                    detail: format!("a SET was answered {:?}", line.trim_end()),
                });
            }
        }
    }
    Ok(())
}

/// Preloads the keyspace's first keys, then measures GET and SET
/// pipelined (the median of [`PIPELINED_RUNS`] runs, as a single run on a
/// shared machine swings by a third) and not.
fn measure(port: u16, plan: &RespPlan) -> Result<Rates, RespBenchError> {
    preload(port, plan.preload.min(plan.keyspace))?;
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
        let ping = output_within(
            Command::new("redis-cli").args(["-p", &port.to_string(), "ping"]),
            "redis-cli",
            Duration::from_secs(5),
        )?;
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
    // The soft RNIC's largest region.
    with_remora_server(plan, DeviceKind::CowbirdSpot, 1 << 30, |port| {
        measure(port, plan)
    })
}

/// Runs `work` against `remora kv serve` in this process, on a `kind`
/// device of `device_bytes`, sized for `plan`; stops the server after.
fn with_remora_server<T>(
    plan: &RespPlan,
    kind: DeviceKind,
    device_bytes: u64,
    work: impl FnOnce(u16) -> Result<T, RespBenchError>,
) -> Result<T, RespBenchError> {
    let config = store_config(plan);
    let store_error = |error: &dyn std::fmt::Display| RespBenchError::Store(error.to_string());
    let opened = OpenDevice::open(
        kind,
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
    let rates = wait_ready(port, "remora kv serve").and_then(|()| work(port));
    stop.store(true, Ordering::Relaxed);
    let served = server
        .join()
        .map_err(|_| RespBenchError::Store("the server panicked".into()))?;
    served.map_err(|error| store_error(&error))?;
    opened.stop().map_err(|error| store_error(&error))?;
    rates
}

/// Debian's `redis-server`, without persistence, on a free port, once it
/// answers.
fn start_redis_server() -> Result<(KillOnDrop, u16), RespBenchError> {
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
    wait_ready(port, "redis-server")?;
    Ok((server, port))
}

/// Debian's `redis-server`'s rates.
pub fn redis_rates(plan: &RespPlan) -> Result<Rates, RespBenchError> {
    let (server, port) = start_redis_server()?;
    let rates = measure(port, plan);
    drop(server);
    rates
}

#[cfg(test)]
mod tests {
    use super::*;

    /// redis-benchmark's own preload (`-t set -n K -r K`) draws keys with
    /// replacement: about 63% of the keyspace it was sized to fill. Every
    /// key the preload names is there now.
    #[test]
    fn the_preload_sets_every_key_it_names() {
        let (server, port) = match start_redis_server() {
            Err(RespBenchError::Missing { .. })
                if std::env::var_os("REMORA_REQUIRE_REDIS").is_none() =>
            {
                eprintln!("skipped: redis-server is not installed");
                return;
            }
            started => started.unwrap(),
        };
        preload(port, 5000).unwrap();
        let size = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "dbsize"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&size.stdout).trim(), "5000");
        let named = Command::new("redis-cli")
            .args(["-p", &port.to_string(), "exists", "key:000000004999"])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&named.stdout).trim(), "1");
        drop(server);
    }

    /// Whether redis-cli is here to test with; where the run must have it
    /// (`REMORA_REQUIRE_REDIS`, as CI sets), its absence fails the test.
    fn redis_cli_installed() -> bool {
        if Command::new("redis-cli").arg("--version").output().is_ok() {
            return true;
        }
        assert!(
            std::env::var_os("REMORA_REQUIRE_REDIS").is_none(),
            "redis-cli is missing"
        );
        eprintln!("skipped: redis-cli is not installed");
        false
    }

    /// A server that accepts and never answers: redis-cli, waited on with
    /// no limit, hung the benchmark for ever. It is killed past its limit.
    #[test]
    fn a_server_that_never_answers_is_an_error_not_a_hang() {
        if !redis_cli_installed() {
            return;
        }
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let silent = std::thread::spawn(move || {
            let (connection, _) = listener.accept().unwrap();
            let _ = finished.recv_timeout(Duration::from_secs(30));
            drop(connection);
        });
        let started = Instant::now();
        let result = wait_ready(port, "a silent server");
        assert!(
            matches!(
                result,
                Err(RespBenchError::TimedOut {
                    tool: "redis-cli",
                    ..
                })
            ),
            "{result:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(20));
        done.send(()).unwrap();
        silent.join().unwrap();
    }

    /// The preload against Remora's own server, the one the benchmark
    /// measures: every SET is answered +OK, and the last key reads back.
    #[test]
    fn remoras_server_takes_the_preload() {
        if !redis_cli_installed() {
            return;
        }
        let plan = RespPlan {
            keyspace: 4000,
            preload: 4000,
            pipelined_requests: 0,
            plain_requests: 0,
        };
        let value = with_remora_server(&plan, DeviceKind::Memory, 64 << 20, |port| {
            preload(port, plan.preload)?;
            let read = Command::new("redis-cli")
                .args(["-p", &port.to_string(), "get", "key:000000003999"])
                .output()
                .map_err(tool_error("redis-cli"))?;
            Ok(String::from_utf8_lossy(&read.stdout).trim().to_string())
        })
        .unwrap();
        assert_eq!(value, "x".repeat(VALUE_BYTES));
    }
}
