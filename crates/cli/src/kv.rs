//! `remora kv`: the far-memory KV store as a Redis-compatible server, and
//! one YCSB run on a device of your choice.

use remora_kv::compactor::{CompactionPolicy, Compactor};
use remora_kv::device::{DeviceKind, FarMemoryDevice, FileSettings, OpenDevice};
use remora_kv::record::MAX_VALUE_BYTES;
use remora_kv::resp::{serve, ServeError, ServerLimits};
use remora_kv::ycsb::{self, YcsbError, YcsbRun};
use remora_kv::{ConfigError, DeviceError, KvError, Store, StoreConfig};
use remora_rack::{RackConfig, Role};
use remora_workloads::ycsb::{WorkloadError, WorkloadSpec};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum KvCommand {
    /// Serve the store over the Redis protocol (RESP2): GET, SET, DEL,
    /// INCR, DECR, INCRBY, MGET, MSET, EXISTS, PING, INFO, pipelined.
    /// `redis-cli -p PORT` and `redis-benchmark -p PORT` work against it.
    /// Stops on Ctrl-C.
    Serve(ServeArgs),
    /// Load a YCSB workload and run it on one device, every read checked.
    /// YCSB-E (range scans) is refused: a hash index cannot serve scans.
    Ycsb(YcsbArgs),
}

#[derive(clap::Args)]
pub struct StoreArgs {
    /// Where the log's cold part lives: memory, file, one-sided-sync,
    /// one-sided-async, cowbird-spot or cowbird-p4 (the far-memory ones
    /// start an embedded rack of their own).
    #[arg(long, default_value = "cowbird-spot", value_parser = parse_device)]
    pub device: DeviceKind,
    /// The device's size in MiB.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub device_mib: u64,
    /// Store settings in TOML (index size, page size, pages in memory,
    /// sessions); see `remora_kv::StoreConfig`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Directory of the file device's file (a disk, not tmpfs: O_DIRECT).
    #[arg(long, default_value = "/var/tmp")]
    pub file_directory: PathBuf,
    /// Join this rack file's rack as a node and use a memory node's
    /// region as the device (one-sided RDMA), instead of `--device`. The
    /// switch and the memory node run as processes of their own
    /// (`remora rack switch`, `remora node --udp`), so the far memory
    /// outlives this process.
    #[arg(long)]
    pub rack: Option<PathBuf>,
    /// The rack's node this process is (default: its first compute node).
    #[arg(long, requires = "rack")]
    pub node: Option<String>,
    /// The memory node whose region is the device (default: the first).
    #[arg(long, requires = "rack")]
    pub memory_node: Option<String>,
    /// Where memory nodes without a `control` address keep their sockets.
    #[arg(long, default_value = "/tmp", requires = "rack")]
    pub run_dir: PathBuf,
    /// Start from the device's last checkpoint (taken by SAVE, or by
    /// `Session::checkpoint`) instead of an empty store. Needs --rack: only
    /// a memory node's region outlives this process (the memory and file
    /// devices, and an embedded rack, end with it).
    #[arg(long, requires = "rack")]
    pub recover: bool,
}

fn parse_device(name: &str) -> Result<DeviceKind, String> {
    DeviceKind::from_name(name).ok_or_else(|| {
        let names: Vec<_> = DeviceKind::ALL.iter().map(|kind| kind.name()).collect();
        format!("no device {name:?}; there are {}", names.join(", "))
    })
}

#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:6379")]
    pub listen: String,
    /// Connections served at once; more are refused with a RESP error.
    #[arg(long, default_value_t = ServerLimits::default().max_connections)]
    pub max_connections: usize,
    /// Event-loop threads serving the connections, each with one of the
    /// store's sessions. One, as Redis has, suits a small machine: a
    /// second competes with the clients and the emulated NICs for cores.
    #[arg(long, default_value_t = ServerLimits::default().workers, value_parser = worker_count)]
    pub workers: usize,
    /// Compact the log in the background when the device's free room
    /// falls below this share of the log's capacity: every record below
    /// the head that is still its key's newest is copied to the tail and
    /// the rest given back. INFO's `# Log` section counts compactions.
    #[arg(long, default_value_t = 0.25, value_parser = room_fraction)]
    pub compact_below_room: f64,
    /// No background compaction: a store that keeps updating fills its
    /// device and then refuses writes.
    #[arg(long, conflicts_with = "compact_below_room")]
    pub no_compaction: bool,
}

/// The most event-loop threads `--workers` takes: far more than cores on
/// any machine this runs on.
const MOST_WORKERS: usize = 256;

fn worker_count(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(count) if (1..=MOST_WORKERS).contains(&count) => Ok(count),
        _ => Err(format!(
            "{text:?} is not a number of workers from 1 to {MOST_WORKERS}"
        )),
    }
}

fn room_fraction(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(fraction) if fraction > 0.0 && fraction < 1.0 => Ok(fraction),
        _ => Err(format!(
            "{text:?} is not a share of the log's capacity in (0, 1)"
        )),
    }
}

#[derive(clap::Args)]
pub struct YcsbArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// A YCSB preset: a, b, c, d or f.
    #[arg(long, default_value = "a")]
    pub workload: String,
    /// Records loaded before the run; the workload's keys are drawn from
    /// them.
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// Bytes of each value (at most 4096).
    #[arg(long, default_value_t = 64)]
    pub value_bytes: usize,
    /// Client threads, a session each (1 to 1023).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// How long the run lasts, after loading.
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Also write the outcome as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Record every operation, check the history linearizable, and write
    /// it to this file as JSON lines, one request each: {"history",
    /// "client", "op", "key", "value", "output", "call", "ret"} (times in
    /// ns since the run began; values are write ids). The run stops after
    /// 10 000 operations per thread, since the check grows with the square
    /// of a hot key's operations.
    #[arg(long)]
    pub history: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum KvCliError {
    #[error("reading {path}: {error}")]
    ConfigFile { path: PathBuf, error: String },
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Store(#[from] KvError),
    #[error(transparent)]
    Ycsb(#[from] YcsbError),
    #[error(transparent)]
    Compactor(#[from] remora_kv::compactor::CompactorError),
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error("listening on {address}: {error}")]
    Listen {
        address: String,
        error: std::io::Error,
    },
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("the config's {sessions} sessions are fewer than the {needed} the server needs: one per --workers, and one for the compactor")]
    TooFewSessions { sessions: usize, needed: usize },
    #[error("--threads {0}: it must be from 1 to {MAX_YCSB_THREADS}")]
    Threads(usize),
    #[error("--value-bytes {0}: a value is at most {MAX_VALUE_BYTES} bytes")]
    ValueBytes(usize),
    #[error("{0} seconds is not a run length")]
    Seconds(f64),
    #[error("making a scratch directory in {path}: {error}")]
    Scratch {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("{0}: the rack needs a compute node (this process) and a memory node (the device)")]
    RackNodes(PathBuf),
    #[error(transparent)]
    Rack(#[from] remora_rack::RackError),
    #[error(transparent)]
    Output(#[from] crate::output::OutputError),
    #[error(transparent)]
    History(#[from] crate::HistoryFileError),
    #[error(transparent)]
    MalformedHistory(#[from] remora_workloads::history::MalformedHistory),
}

/// Writes a run's history and refuses one that is not linearizable (the
/// file still holds it, for a second opinion).
fn write_history(
    path: &Path,
    workload: &str,
    history: &[remora_workloads::history::Event],
) -> Result<(), KvCliError> {
    let name = format!("kv-ycsb-{workload}");
    let io = |error| crate::HistoryFileError::Io {
        path: path.to_owned(),
        error,
    };
    let file = std::fs::File::create(path).map_err(io)?;
    let mut out = std::io::BufWriter::new(file);
    let lines =
        remora_workloads::history::write_json_lines(&name, history, &mut out).map_err(io)?;
    std::io::Write::flush(&mut out).map_err(io)?;
    let verdict = remora_workloads::history::check(history)?;
    if !verdict.violations.is_empty() {
        return Err(crate::HistoryFileError::NotLinearizable {
            name,
            keys: verdict.violations,
            path: path.to_owned(),
        }
        .into());
    }
    println!(
        "history: {lines} requests on {} keys, linearizable, written to {}",
        verdict.keys,
        path.display()
    );
    Ok(())
}

fn store_config(path: Option<&Path>) -> Result<StoreConfig, KvCliError> {
    let Some(path) = path else {
        return Ok(StoreConfig::default());
    };
    let text = std::fs::read_to_string(path).map_err(|error| KvCliError::ConfigFile {
        path: path.to_owned(),
        error: error.to_string(),
    })?;
    StoreConfig::from_toml(&text).map_err(|error| KvCliError::ConfigFile {
        path: path.to_owned(),
        error: error.to_string(),
    })
}

/// Threads of `kv ycsb`: a session each, and one more for loading, within
/// a store's 1024 sessions.
const MAX_YCSB_THREADS: usize = 1023;

/// Opens the store on `args`' device; a file device's file goes in
/// `file_directory`.
fn open_store(
    args: &StoreArgs,
    config: StoreConfig,
    file_directory: &Path,
) -> Result<(Store, OpenDevice), KvCliError> {
    // The settings are checked before the device is opened: a far-memory
    // device opens a queue per session, and a bad session count would
    // fail there, in the device's words.
    if args.rack.is_none() {
        config.check(args.device_mib << 20)?;
    }
    let queues = config.sessions + 1;
    let opened = match &args.rack {
        Some(path) => open_on_rack(args, path, queues)?,
        None => {
            let file = FileSettings {
                directory: file_directory.to_owned(),
                ..FileSettings::default()
            };
            OpenDevice::open(args.device, args.device_mib << 20, queues, &file)?
        }
    };
    let store = if args.recover {
        let (store, record) = Store::recover(config, opened.device.clone())?;
        println!(
            "recovered checkpoint {} (log {}..{})",
            record.sequence, record.begin, record.tail
        );
        store
    } else {
        Store::new(config, opened.device.clone())?
    };
    Ok((store, opened))
}

/// The device on a rack file's memory node, this process its node.
fn open_on_rack(args: &StoreArgs, path: &Path, queues: usize) -> Result<OpenDevice, KvCliError> {
    let rack = RackConfig::load(path)?;
    let first = |role| rack.first_node(role).map(|node| node.name.clone());
    let node = args.node.clone().or_else(|| first(Role::Compute));
    let memory = args.memory_node.clone().or_else(|| first(Role::Memory));
    let (Some(node), Some(memory)) = (node, memory) else {
        return Err(KvCliError::RackNodes(path.to_owned()));
    };
    let stop = AtomicBool::new(false);
    let device = FarMemoryDevice::on_rack(&rack, &node, &memory, &args.run_dir, queues, &stop)?;
    Ok(OpenDevice::far_memory(Arc::new(device)))
}

pub fn run(command: KvCommand) -> Result<ExitCode, KvCliError> {
    match command {
        KvCommand::Serve(args) => run_serve(&args),
        KvCommand::Ycsb(args) => run_ycsb(&args),
    }
}

fn run_serve(args: &ServeArgs) -> Result<ExitCode, KvCliError> {
    let mut config = store_config(args.store.config.as_deref())?;
    // The workers' sessions and the compactor's, no more: a device opens a
    // queue per session, and Cowbird's engine polls each one.
    let needed = args.workers + usize::from(!args.no_compaction);
    if args.store.config.is_none() {
        config.sessions = args.workers + 1;
    } else if config.sessions < needed {
        // Refused before the device opens and the server says it serves.
        return Err(KvCliError::TooFewSessions {
            sessions: config.sessions,
            needed,
        });
    }
    let (store, opened) = open_store(&args.store, config, &args.store.file_directory)?;
    let listener = TcpListener::bind(&args.listen).map_err(|error| KvCliError::Listen {
        address: args.listen.clone(),
        error,
    })?;
    let address = listener.local_addr().map_err(|error| KvCliError::Listen {
        address: args.listen.clone(),
        error,
    })?;
    println!(
        "remora kv: serving RESP on {address} over the {} device (Ctrl-C stops)",
        opened.device.name()
    );
    let stop = Arc::new(AtomicBool::new(false));
    let handler = stop.clone();
    let _ = ctrlc::set_handler(move || handler.store(true, Ordering::Relaxed));
    let limits = ServerLimits {
        max_connections: args.max_connections,
        workers: args.workers,
    };
    let compactor = if args.no_compaction {
        None
    } else {
        let policy = CompactionPolicy {
            below_room_fraction: args.compact_below_room,
            ..CompactionPolicy::default()
        };
        Some(Compactor::start(store.clone(), policy)?)
    };
    let served = serve(store, listener, limits, stop);
    if let Some(compactor) = compactor {
        compactor.stop()?;
    }
    served?;
    opened.stop()?;
    Ok(ExitCode::SUCCESS)
}

fn run_ycsb(args: &YcsbArgs) -> Result<ExitCode, KvCliError> {
    // Nothing here stops cleanly: an interrupt ends the run at once.
    crate::interrupt::exit_at_first_interrupt();
    crate::output::check_optional_file_path(args.json.as_deref())?;
    crate::output::check_optional_file_path(args.history.as_deref())?;
    // Positive, and a length a Duration can hold (1e20 s cannot).
    let duration = Duration::try_from_secs_f64(args.seconds)
        .ok()
        .filter(|duration| !duration.is_zero())
        .ok_or(KvCliError::Seconds(args.seconds))?;
    if !(1..=MAX_YCSB_THREADS).contains(&args.threads) {
        return Err(KvCliError::Threads(args.threads));
    }
    if args.value_bytes > MAX_VALUE_BYTES {
        return Err(KvCliError::ValueBytes(args.value_bytes));
    }
    let mut config = store_config(args.store.config.as_deref())?;
    config.sessions = config.sessions.max(args.threads + 1);
    // A file device's directory goes inside a scratch directory that an
    // interrupt removes, registered before the device makes anything.
    let scratch = if args.store.device == DeviceKind::File && args.store.rack.is_none() {
        let directory = tempfile::Builder::new()
            .prefix("remora-kv-ycsb-")
            .tempdir_in(&args.store.file_directory)
            .map_err(|error| KvCliError::Scratch {
                path: args.store.file_directory.clone(),
                error,
            })?;
        Some(crate::interrupt::remove_on_interrupt(directory))
    } else {
        None
    };
    let file_directory = scratch
        .as_ref()
        .map_or(args.store.file_directory.as_path(), |scratch| {
            scratch.path()
        });
    let (store, opened) = open_store(&args.store, config, file_directory)?;
    let mut spec = WorkloadSpec::preset(&args.workload)?;
    spec.record_count = args.records;
    let run = YcsbRun {
        spec,
        value_bytes: args.value_bytes,
        threads: args.threads,
        duration,
        seed: 1,
        record_history: args.history.is_some(),
    };
    let loaded = ycsb::load(&store, &run)?;
    let outcome = ycsb::run(&store, &run)?;
    drop(store);
    let cpu = opened.stop()?;
    // The device the run used: with --rack, a memory node's region, not
    // the --device flag's (its default named a device never opened).
    let device = opened.device.name();
    let quantile = |q| outcome.latency.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "YCSB-{} on {}: loaded {} records in {:.2} s; {:.0} ops/s, p50 {:.1} µs, p99 {:.1} µs, communication ratio {:.2}, {} operations waited for the device{}",
        args.workload.to_uppercase(),
        device,
        args.records,
        loaded.as_secs_f64(),
        outcome.operations_per_second(),
        quantile(0.5),
        quantile(0.99),
        outcome.communication_ratio(args.threads),
        outcome.pending,
        if outcome.stopped_early { " (stopped early: the device is nearly full)" } else { "" },
    );
    if let Some(path) = &args.json {
        let json = serde_json::json!({
            "workload": args.workload,
            "device": device,
            "records": args.records,
            "value_bytes": args.value_bytes,
            "threads": args.threads,
            "operations": outcome.operations,
            "operations_per_second": outcome.operations_per_second(),
            "latency_p50_us": quantile(0.5),
            "latency_p99_us": quantile(0.99),
            "communication_ratio": outcome.communication_ratio(args.threads),
            "pending": outcome.pending,
            "stopped_early": outcome.stopped_early,
            "application_cpu_s": outcome.application_cpu.as_secs_f64(),
            "fabric_cpu_s": cpu.map(|(fabric, _)| fabric.as_secs_f64()),
            "engine_cpu_s": cpu.map(|(_, engine)| engine.as_secs_f64()),
        });
        crate::output::write_json(path, &json)?;
    }
    // After the figures are saved: a history that fails its check loses
    // none of them.
    if let Some(path) = &args.history {
        write_history(path, &args.workload, &outcome.history)?;
    }
    Ok(ExitCode::SUCCESS)
}
