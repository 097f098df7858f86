//! `remora bench kv`: the Cowbird paper's FASTER case study (§7, §8.2).
//!
//! A FASTER-style store keeps the paper's share of its log in local
//! memory (27.8% of the data at 64 B values, 20.8% at 512 B) and the rest
//! on a device. YCSB-A with zipf 0.99 (the mix the issue names for Fig. 9)
//! runs on one and two threads on every device: local memory (the upper
//! bound), an O_DIRECT file (the SSD baseline), one-sided RDMA
//! synchronous and asynchronous, Cowbird-Spot and Cowbird-P4. Each run
//! reports throughput, p50/p99 latency, the communication ratio (Fig. 10:
//! time inside device calls and `complete_pending` over execution time),
//! and application, NIC-emulation and engine CPU apart.
//!
//! The local-memory store is also measured against FASTER's own C++
//! benchmark numbers on YCSB-B and C (every record in memory, 8-byte
//! values, one thread).

mod resp;

use super::report::{median, median_of_ratios, Report};
use indicatif::{ProgressBar, ProgressStyle};
use remora_kv::device::{DeviceError, DeviceKind, FileSettings, OpenDevice};
use remora_kv::record::record_bytes;
use remora_kv::ycsb::{self, YcsbError, YcsbOutcome, YcsbRun};
use remora_kv::{KvError, Store, StoreConfig};
use remora_workloads::ycsb::{WorkloadError, WorkloadSpec};
use resp::{RespBenchError, RespPlan};
use std::time::Duration;

/// FASTER's own benchmark on this kind of machine (the figures,
/// operations per second, 16 M keys in memory, one thread).
const FASTER_YCSB_B_PER_SECOND: f64 = 2.65e6;
const FASTER_YCSB_C_PER_SECOND: f64 = 3.00e6;
/// The paper's share of the data in local memory (§8.2: 5 GB of 18 GB
/// at 64 B, of 24 GB at 512 B).
const LOCAL_SHARE_64B: f64 = 5.0 / 18.0;
const LOCAL_SHARE_512B: f64 = 5.0 / 24.0;
/// A far-memory device's pool is one region, and the soft RNIC registers
/// at most 1 GiB in one.
const MAX_DEVICE_BYTES: u64 = 1 << 30;
/// The index's load: records per bucket entry slot, FASTER's ½ to 1.
const RECORDS_PER_BUCKET: u64 = 4;

#[derive(Debug, thiserror::Error)]
pub enum KvBenchError {
    #[error("the file device's scratch directory in {path}: {error}")]
    Scratch {
        path: std::path::PathBuf,
        error: std::io::Error,
    },
    #[error("{device}: {source}")]
    Device {
        device: &'static str,
        source: DeviceError,
    },
    #[error("{device}: {source}")]
    Store {
        device: &'static str,
        source: KvError,
    },
    #[error("{device}: {source}")]
    Ycsb {
        device: &'static str,
        source: YcsbError,
    },
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error("progress bar: {0}")]
    Progress(String),
    #[error("RESP comparison: {0}")]
    Resp(#[from] RespBenchError),
    #[error("{0}: a run did no operation (its device had no room left)")]
    EmptyRun(String),
    /// Time in device calls is a share of each thread's run: more than
    /// all of it means some call was counted twice.
    #[error("{variant}: the communication ratio came out at {ratio:.3}, above 1")]
    ImpossibleRatio { variant: String, ratio: f64 },
}

struct Plan {
    resp: RespPlan,
    records_64b: u64,
    records_512b: u64,
    in_memory_records: u64,
    duration: Duration,
    repetitions: usize,
}

impl Plan {
    fn new(args: &KvArgs) -> Plan {
        let mut plan = Plan::defaults(args.common.quick);
        let (records, keyspace) = (args.records, args.keyspace);
        if let Some(seconds) = args.seconds {
            plan.duration = Duration::from_secs_f64(seconds);
        }
        if let Some(records) = records {
            plan.records_64b = records;
            plan.records_512b = (records / 5).max(1);
            plan.in_memory_records = records;
        }
        if let Some(keyspace) = keyspace {
            plan.resp = RespPlan {
                keyspace,
                preload: keyspace,
                pipelined_requests: keyspace * 2,
                plain_requests: (keyspace / 5).max(1000),
            };
        }
        plan
    }

    fn defaults(quick: bool) -> Plan {
        if quick {
            Plan {
                resp: RespPlan {
                    keyspace: 10_000_000,
                    preload: 2_000_000,
                    pipelined_requests: 1_000_000,
                    plain_requests: 100_000,
                },
                records_64b: 600_000,
                records_512b: 120_000,
                in_memory_records: 2_000_000,
                duration: Duration::from_millis(400),
                repetitions: 3,
            }
        } else {
            Plan {
                // Every SET appends a 104-byte record when its key is not in
                // the mutable region, and the Cowbird device is one 1 GiB
                // region (the soft RNIC's limit): the preload and the runs'
                // SETs must fit it.
                resp: RespPlan {
                    keyspace: 10_000_000,
                    preload: 5_000_000,
                    pipelined_requests: 2_000_000,
                    plain_requests: 200_000,
                },
                records_64b: 4_000_000,
                records_512b: 800_000,
                in_memory_records: 16_000_000,
                duration: Duration::from_secs(3),
                repetitions: 3,
            }
        }
    }
}

/// One store's shape: its records, their value size, the share of its
/// log that stays in memory.
struct Shape {
    records: u64,
    value_bytes: usize,
    local_share: f64,
}

impl Shape {
    fn log_bytes(&self) -> u64 {
        // 8-byte keys; a loaded log plus room for the run's copies.
        let record = record_bytes(8, self.value_bytes);
        self.records * record * 2
    }

    fn config(&self, threads: usize) -> StoreConfig {
        let page_bits = 20;
        let memory_bytes = (self.log_bytes() as f64 / 2.0 * self.local_share) as u64;
        let memory_pages = (memory_bytes >> page_bits).max(8);
        let buckets = (self.records / RECORDS_PER_BUCKET).next_power_of_two();
        StoreConfig {
            index_buckets: buckets,
            overflow_buckets: (buckets / 8) as u32,
            page_bits,
            memory_pages,
            mutable_fraction: 0.9,
            first_read_bytes: record_bytes(8, self.value_bytes) as usize,
            sessions: threads + 2,
        }
    }

    /// The device holds the loaded log and the run's appended copies,
    /// up to the soft RNIC's largest region (every device gets the same
    /// size); a run that would fill it stops early (see `ycsb::run`).
    fn device_bytes(&self) -> u64 {
        (self.log_bytes() * 4).clamp(256 << 20, MAX_DEVICE_BYTES)
    }
}

fn ycsb_run(
    preset: &str,
    records: u64,
    value_bytes: usize,
    threads: usize,
    duration: Duration,
) -> Result<YcsbRun, KvBenchError> {
    let mut spec = WorkloadSpec::preset(preset)?;
    spec.record_count = records;
    Ok(YcsbRun {
        spec,
        value_bytes,
        threads,
        duration,
        seed: 7,
        record_history: false,
    })
}

struct Bench {
    plan: Plan,
    report: Report,
    progress: ProgressBar,
    file: FileSettings,
    /// YCSB-A ops/s at 64 B, one thread, by device, one per round in
    /// round order: for the ratios, each taken within a round.
    one_thread_64b: Vec<(DeviceKind, Vec<f64>)>,
    communication_ratio_spot: Option<f64>,
}

/// One configuration's runs so far, one per round.
#[derive(Default)]
struct Runs {
    outcomes: Vec<YcsbOutcome>,
    /// The device's rack: its fabric thread's and engine's CPU, over
    /// every round (loads included).
    fabric_cpu: Duration,
    engine_cpu: Duration,
}

impl Bench {
    /// YCSB-A on every device, one and two threads, in rounds: each
    /// round runs every configuration once, on a store loaded afresh, so
    /// that the ratios compare runs made minutes apart at most, not a
    /// device measured at the start against one measured at the end (this
    /// machine's speed drifts by tens of percent over a run).
    fn devices(&mut self, devices: &[DeviceKind], shape: &Shape) -> Result<(), KvBenchError> {
        let configurations: Vec<(DeviceKind, usize)> = devices
            .iter()
            .flat_map(|&kind| [(kind, 1), (kind, 2)])
            .collect();
        let mut runs: Vec<Runs> = configurations.iter().map(|_| Runs::default()).collect();
        for round in 0..self.plan.repetitions {
            for (&(kind, threads), runs) in configurations.iter().zip(&mut runs) {
                self.run_once(kind, shape, threads, round, runs)?;
                self.progress.inc(1);
            }
        }
        for ((kind, threads), runs) in configurations.into_iter().zip(runs) {
            self.record_runs(kind, shape, threads, runs)?;
        }
        Ok(())
    }

    /// Loads a store on `kind` and runs YCSB-A once, adding the outcome
    /// and the device's CPU to `runs`.
    fn run_once(
        &mut self,
        kind: DeviceKind,
        shape: &Shape,
        threads: usize,
        round: usize,
        runs: &mut Runs,
    ) -> Result<(), KvBenchError> {
        let name = kind.name();
        let device_error = |source| KvBenchError::Device {
            device: name,
            source,
        };
        let store_error = |source| KvBenchError::Store {
            device: name,
            source,
        };
        let ycsb_error = |source| KvBenchError::Ycsb {
            device: name,
            source,
        };
        let config = shape.config(2);
        let opened = OpenDevice::open(kind, shape.device_bytes(), config.sessions + 1, &self.file)
            .map_err(device_error)?;
        let store = Store::new(config, opened.device.clone()).map_err(store_error)?;
        let run = ycsb_run(
            "a",
            shape.records,
            shape.value_bytes,
            threads,
            self.plan.duration,
        )?;
        let value_bytes = shape.value_bytes;
        let rounds = self.plan.repetitions;
        self.progress.set_message(format!(
            "round {}/{rounds}, {name}: loading {} records of {value_bytes} B",
            round + 1,
            shape.records
        ));
        ycsb::load(&store, &run).map_err(ycsb_error)?;
        self.progress.set_message(format!(
            "round {}/{rounds}, {name}: YCSB-A, {value_bytes} B, {threads} thread(s)",
            round + 1
        ));
        runs.outcomes
            .push(ycsb::run(&store, &run).map_err(ycsb_error)?);
        drop(store);
        if let Some((fabric, engine)) = opened.stop().map_err(device_error)? {
            runs.fabric_cpu += fabric;
            runs.engine_cpu += engine;
        }
        Ok(())
    }

    /// Reports one configuration's median run and its rack's CPU apart.
    fn record_runs(
        &mut self,
        kind: DeviceKind,
        shape: &Shape,
        threads: usize,
        runs: Runs,
    ) -> Result<(), KvBenchError> {
        let variant = format!("{}/{}B/{threads}t", kind.name(), shape.value_bytes);
        if runs.outcomes.iter().any(|outcome| outcome.operations == 0) {
            return Err(KvBenchError::EmptyRun(variant));
        }
        let stopped_early = runs
            .outcomes
            .iter()
            .filter(|outcome| outcome.stopped_early)
            .count();
        self.report.add(
            &variant,
            "runs_stopped_early",
            stopped_early as f64,
            "count",
        );
        self.record(kind, shape, threads, runs.outcomes)?;
        if !runs.fabric_cpu.is_zero() {
            let (fabric, engine) = (runs.fabric_cpu, runs.engine_cpu);
            self.report
                .add(&variant, "fabric_cpu", fabric.as_secs_f64(), "s");
            self.report
                .add(&variant, "engine_cpu", engine.as_secs_f64(), "s");
            let nic = fabric.saturating_sub(engine);
            self.report
                .add(&variant, "nic_emulation_cpu", nic.as_secs_f64(), "s");
        }
        Ok(())
    }

    /// Reports the median repetition (by throughput) of one configuration.
    fn record(
        &mut self,
        kind: DeviceKind,
        shape: &Shape,
        threads: usize,
        mut outcomes: Vec<YcsbOutcome>,
    ) -> Result<(), KvBenchError> {
        let rates_by_round: Vec<f64> = outcomes
            .iter()
            .map(YcsbOutcome::operations_per_second)
            .collect();
        outcomes.sort_by(|a, b| {
            a.operations_per_second()
                .total_cmp(&b.operations_per_second())
        });
        let outcome = &outcomes[outcomes.len() / 2];
        let variant = format!("{}/{}B/{threads}t", kind.name(), shape.value_bytes);
        let per_second = outcome.operations_per_second();
        self.report.add(&variant, "throughput", per_second, "ops/s");
        let quantile = |q| outcome.latency.value_at_quantile(q) as f64 / 1000.0;
        self.report
            .add(&variant, "latency_p50", quantile(0.5), "us");
        self.report
            .add(&variant, "latency_p99", quantile(0.99), "us");
        let ratio = outcome.communication_ratio(threads);
        if ratio > 1.0 {
            return Err(KvBenchError::ImpossibleRatio { variant, ratio });
        }
        self.report
            .add(&variant, "communication_ratio", ratio, "fraction");
        self.report.add(
            &variant,
            "application_cpu",
            outcome.application_cpu.as_secs_f64(),
            "s",
        );
        self.report.add(
            &variant,
            "pending_operations",
            outcome.pending as f64,
            "count",
        );
        if shape.value_bytes == 64 && threads == 1 {
            self.one_thread_64b.push((kind, rates_by_round));
            if kind == DeviceKind::CowbirdSpot {
                self.communication_ratio_spot = Some(ratio);
            }
        }
        Ok(())
    }

    /// The local-memory store with every record in memory, against
    /// FASTER's own numbers on YCSB-B and C.
    fn against_faster(&mut self) -> Result<(), KvBenchError> {
        let shape = Shape {
            records: self.plan.in_memory_records,
            value_bytes: 8,
            local_share: 2.5,
        };
        let error = |source| KvBenchError::Store {
            device: "memory",
            source,
        };
        // Every record stays in memory; the device only has to be as
        // large as the memory, which the store's config requires.
        let config = shape.config(1);
        // Room to append beyond it too: a run stops early rather than
        // fill the device, and this one must not stop at all.
        let device_bytes =
            2 * config.memory_bytes() + (64 << 20) + remora_kv::log::CHECKPOINT_AREA_BYTES;
        let opened = OpenDevice::open(DeviceKind::Memory, device_bytes, 4, &self.file).map_err(
            |source| KvBenchError::Device {
                device: "memory",
                source,
            },
        )?;
        let store = Store::new(config, opened.device.clone()).map_err(error)?;
        let ycsb_error = |source| KvBenchError::Ycsb {
            device: "memory",
            source,
        };
        self.progress
            .set_message(format!("in memory: loading {} records", shape.records));
        let load = ycsb_run("b", shape.records, 8, 2, self.plan.duration)?;
        ycsb::load(&store, &load).map_err(ycsb_error)?;
        for (preset, faster) in [
            ("b", FASTER_YCSB_B_PER_SECOND),
            ("c", FASTER_YCSB_C_PER_SECOND),
        ] {
            self.progress
                .set_message(format!("in memory: YCSB-{}", preset.to_uppercase()));
            let run = ycsb_run(preset, shape.records, 8, 1, self.plan.duration)?;
            let mut rates = Vec::new();
            for _ in 0..self.plan.repetitions {
                let outcome = ycsb::run(&store, &run).map_err(ycsb_error)?;
                if outcome.operations == 0 || outcome.stopped_early {
                    return Err(KvBenchError::EmptyRun(format!("in-memory/ycsb-{preset}")));
                }
                rates.push(outcome.operations_per_second());
            }
            let rate = median(&mut rates);
            let variant = format!("in-memory/ycsb-{preset}/8B/1t");
            self.report.add(&variant, "throughput", rate, "ops/s");
            self.report
                .add(&variant, "faster_cpp_reference", faster, "ops/s");
            self.report.ratios.insert(
                format!("local_vs_faster_ycsb_{preset}"),
                serde_json::json!(rate / faster),
            );
            self.progress.inc(1);
        }
        Ok(())
    }

    /// redis-benchmark against `remora kv serve` (Cowbird-Spot) and
    /// `redis-server`, side by side.
    fn resp(&mut self) -> Result<(), KvBenchError> {
        self.progress
            .set_message("redis-benchmark against remora kv serve (cowbird-spot)");
        let remora = resp::remora_rates(&self.plan.resp)?;
        self.progress.inc(1);
        self.progress
            .set_message("redis-benchmark against redis-server");
        let redis = resp::redis_rates(&self.plan.resp)?;
        self.progress.inc(1);
        for (server, rates) in [
            ("remora-kv-cowbird-spot", &remora),
            ("redis-server", &redis),
        ] {
            for (test, pipeline, rate) in rates {
                let variant = format!("resp/{server}/{}/P{pipeline}", test.to_lowercase());
                self.report.add(&variant, "throughput", *rate, "requests/s");
            }
        }
        let rate = |rates: &resp::Rates, test: &str, pipeline: usize| {
            rates
                .iter()
                .find(|(t, p, _)| t == test && *p == pipeline)
                .map(|(_, _, r)| *r)
        };
        for (name, test, pipeline) in [
            ("resp_get_vs_redis_pipelined", "GET", 16),
            ("resp_set_vs_redis_pipelined", "SET", 16),
            ("resp_get_vs_redis", "GET", 1),
        ] {
            if let (Some(ours), Some(theirs)) =
                (rate(&remora, test, pipeline), rate(&redis, test, pipeline))
            {
                self.report
                    .ratios
                    .insert(name.into(), serde_json::json!(ours / theirs));
            }
        }
        Ok(())
    }

    fn ratio_against(&self, baseline: DeviceKind) -> Option<f64> {
        let rates = |kind| {
            self.one_thread_64b
                .iter()
                .find(|(k, _)| *k == kind)
                .map(|(_, rates)| &rates[..])
        };
        median_of_ratios(rates(DeviceKind::CowbirdSpot)?, rates(baseline)?)
    }

    fn finish_ratios(&mut self) {
        let ratios = [
            (
                "cowbird_vs_local_ycsb_z099_64b",
                self.ratio_against(DeviceKind::Memory),
            ),
            (
                "cowbird_vs_file_ycsb_z099_64b",
                self.ratio_against(DeviceKind::File),
            ),
            (
                "cowbird_vs_async_one_sided_ycsb_z099_64b",
                self.ratio_against(DeviceKind::OneSidedAsync),
            ),
            ("comm_ratio_cowbird", self.communication_ratio_spot),
        ];
        for (name, value) in ratios {
            if let Some(value) = value {
                self.report
                    .ratios
                    .insert(name.into(), serde_json::json!(value));
            }
        }
    }
}

pub fn run(args: &KvArgs) -> Result<Report, KvBenchError> {
    let plan = Plan::new(args);
    let devices = &DeviceKind::ALL;
    let shapes = [
        Shape {
            records: plan.records_64b,
            value_bytes: 64,
            local_share: LOCAL_SHARE_64B,
        },
        Shape {
            records: plan.records_512b,
            value_bytes: 512,
            local_share: LOCAL_SHARE_512B,
        },
    ];
    let steps = devices.len() * shapes.len() * 2 * plan.repetitions + 4;
    let progress = ProgressBar::new(steps as u64);
    progress.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}")
            .map_err(|error| KvBenchError::Progress(error.to_string()))?,
    );
    let config = serde_json::json!({
        "workload": "YCSB-A (zipf 0.99) for the devices; YCSB-B and C for the in-memory store",
        "records_64b": plan.records_64b,
        "records_512b": plan.records_512b,
        "in_memory_records": plan.in_memory_records,
        "local_share_64b": LOCAL_SHARE_64B,
        "local_share_512b": LOCAL_SHARE_512B,
        "run_seconds": plan.duration.as_secs_f64(),
        "operations": format!("each thread draws its run's operations before the clock starts (at most {}, cycled), as FASTER's benchmark loads YCSB's keys first; each operation prefetches the index bucket of the operation 16 ahead and the record of the one 8 ahead", remora_kv::ycsb::MAX_TRACE_OPERATIONS),
        "repetitions": plan.repetitions,
        "page_bytes": 1 << 20,
        "devices": devices.iter().map(|kind| kind.name()).collect::<Vec<_>>(),
        "batch": remora_kv::device::far_memory::WINDOW,
        "file": "O_DIRECT under /var/tmp, 4 I/O threads, up to 100 requests in flight per queue",
        "resp": {
            "keyspace": plan.resp.keyspace,
            "preload": plan.resp.preload,
            "preloaded_keys": "the keyspace's first keys, in redis-benchmark's names, one SET each; each run's SETs (redis-benchmark runs them before its GETs) add random keys, so GETs hit more often than the preloaded share",
            "preloaded_share": plan.resp.preload.min(plan.resp.keyspace) as f64 / plan.resp.keyspace as f64,
            "pipelined_requests": plan.resp.pipelined_requests,
            "pipelined_runs": resp::PIPELINED_RUNS,
            "pipelined_figure": "the median of the pipelined runs, each server started and preloaded once",
            "plain_requests": plan.resp.plain_requests,
            "clients": 50,
            "value_bytes": 64,
            "pipeline": 16,
        },
        "caveat": "soft RNIC and engine share this machine's 2 cores with the application; the fabric thread's CPU is reported apart",
    });
    // The file device's files go in a scratch directory that Ctrl-C
    // removes too (it ends the run at once: nothing here stops cleanly);
    // made in /var/tmp, they were left there, up to a GiB each.
    let _ending_at_first_interrupt = crate::interrupt::exit_at_first_interrupt_for_now();
    let defaults = FileSettings::default();
    let scratch = tempfile::Builder::new()
        .prefix("remora-bench-kv-")
        .tempdir_in(&defaults.directory)
        .map_err(|error| KvBenchError::Scratch {
            path: defaults.directory.clone(),
            error,
        })?;
    let scratch = crate::interrupt::remove_on_interrupt(scratch);
    let mut bench = Bench {
        plan,
        report: Report::new("kv", config),
        progress,
        file: FileSettings {
            directory: scratch.path().to_owned(),
            ..defaults
        },
        one_thread_64b: Vec::new(),
        communication_ratio_spot: None,
    };
    for shape in &shapes {
        bench.devices(devices, shape)?;
    }
    bench.against_faster()?;
    bench.resp()?;
    bench.finish_ratios();
    bench.progress.finish_and_clear();
    Ok(bench.report)
}

#[derive(clap::Args)]
pub struct KvArgs {
    #[command(flatten)]
    pub common: super::entry::CommonArgs,
    /// Records of 64 B values (a fifth as many of 512 B, as many in
    /// memory for the FASTER comparison); default 600 000 with --quick,
    /// 4 000 000 otherwise.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1000..))]
    pub records: Option<u64>,
    /// Keys redis-benchmark draws from (default 10 million); with it,
    /// every key is preloaded, and the runs issue twice as many pipelined
    /// requests and a fifth as many unpipelined.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1000..))]
    pub keyspace: Option<u64>,
    /// Length of each YCSB run (default 0.4 s with --quick, 3 s otherwise).
    #[arg(long, value_parser = parse_seconds)]
    pub seconds: Option<f64>,
}

fn parse_seconds(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(seconds) if seconds > 0.0 && seconds <= 600.0 => Ok(seconds),
        _ => Err(format!("{text:?} is not a run length in (0, 600] seconds")),
    }
}

impl super::entry::BenchArgs for KvArgs {
    fn common(&self) -> &super::entry::CommonArgs {
        &self.common
    }
}

/// `remora bench kv`.
pub static BENCH: super::entry::Entry<KvArgs, KvBenchError> = super::entry::Entry {
    name: "kv",
    about: "The far-memory KV store: YCSB on every device (Cowbird's §8.2).\n\nA FASTER-style hybrid log keeps the paper's share of the data in local memory (27.8% at 64 B values, 20.8% at 512 B) and the rest on a device: local memory, an O_DIRECT file, one-sided RDMA (synchronous and in batches of 100), Cowbird-Spot and Cowbird-P4. YCSB-A at zipf 0.99 on 1 and 2 threads: throughput, p50/p99 latency, the communication ratio (Fig. 10), and application, NIC-emulation and engine CPU apart; then YCSB-B and C with every record in memory against FASTER's C++ numbers; then redis-benchmark GET/SET (64 B values, a 10-million-key random keyspace whose first 2 million keys (5 million without --quick) are preloaded; -P 16 and not) against `remora kv serve` on Cowbird-Spot and against redis-server. YCSB-E (range scans) is not run: a hash index cannot serve scans.",
    run,
};
