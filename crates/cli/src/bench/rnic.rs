//! `remora bench fabric`: the protocol's own cost. Two soft RNICs in one
//! thread, frames handed straight from one to the other, so every
//! nanosecond is RoCEv2 work: building frames, ICRC both ways, parsing,
//! protection checks, copies, acknowledgements and completions. All of it is
//! NIC-emulation CPU; there is no application CPU in this benchmark.

use super::report::{median, size_label, thread_cpu_ns, Report};
use indicatif::{ProgressBar, ProgressStyle};
use remora_rnic::back_to_back::{TransferRig, Verdict, MAX_READ_WINDOW};
use remora_rnic::*;
use std::hint::black_box;
use std::time::{Duration, Instant};

const SIZES: [u32; 4] = [64, 1024, 4096, 65536];
/// Outstanding requests in the pipelined variant.
const PIPELINE_DEPTH: usize = 16;
/// Active queue pairs in the scaling figures.
const QUEUE_PAIR_COUNTS: [usize; 4] = [1, 16, 256, 1024];
/// Requests outstanding in every scaling run, spread evenly over its queue
/// pairs, so the one-queue-pair run is not starved by its own window.
const SCALING_IN_FLIGHT: usize = 1024;
/// Queue pairs connected and idle beside the one that works, in
/// `idle_qps_1023_vs_none`.
const IDLE_QUEUE_PAIRS: usize = 1023;
/// Message sizes of the throughput sweep, 64 B to 1 MiB.
const SWEEP_SIZES: [u32; 8] = [64, 256, 1024, 4096, 16384, 65536, 262_144, 1_048_576];
/// Requests outstanding in the sweep.
const SWEEP_IN_FLIGHT: usize = 8;

struct Plan {
    repetitions: usize,
    duration: Duration,
}

/// One timed run: operations completed, wall time and thread CPU time.
struct Sample {
    operations: u64,
    wall_ns: f64,
    cpu_ns: f64,
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Read,
    Write,
}

/// Why the fabric benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum FabricBenchError {
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    #[error("the fabric stalled with requests outstanding")]
    Stalled,
    #[error("a benchmark transfer completed with {0:?}")]
    TransferFailed(CompletionStatus),
}

/// One shape of traffic: an operation at a size, spread over queue pairs,
/// with a number of requests posted and not yet completed at all times.
#[derive(Clone, Copy)]
struct Transfer {
    kind: Kind,
    size: u32,
    /// Queue pairs carrying the traffic.
    queue_pairs: usize,
    /// Further queue pairs connected but never used.
    idle_queue_pairs: usize,
    in_flight: usize,
}

fn run_transfers(transfer: Transfer, duration: Duration) -> Result<Sample, FabricBenchError> {
    let Transfer {
        kind,
        size,
        queue_pairs,
        idle_queue_pairs,
        in_flight,
    } = transfer;
    assert!(queue_pairs > 0 && in_flight.is_multiple_of(queue_pairs));
    let per_queue_pair = in_flight / queue_pairs;
    let mut rig = TransferRig::new(size, queue_pairs + idle_queue_pairs, per_queue_pair)?;
    let read = kind == Kind::Read;
    // Fill every queue pair's share; each completion is replaced on the
    // queue pair it came from (the work request id names it).
    rig.post_on_each(queue_pairs, per_queue_pair, read)?;
    let mut completed = 0u64;
    let start_wall = Instant::now();
    let start_cpu = thread_cpu_ns();
    loop {
        if rig.fabric.step(&mut |_, _| Verdict::Deliver) == 0 {
            return Err(FabricBenchError::Stalled);
        }
        while let Some(completion) = rig.fabric.left.poll_completion(rig.completions)? {
            if completion.status != CompletionStatus::Success {
                return Err(FabricBenchError::TransferFailed(completion.status));
            }
            rig.post_again(completion.work_request_id, read)?;
            completed += 1;
        }
        if completed.is_multiple_of(64) && start_wall.elapsed() >= duration {
            break;
        }
    }
    Ok(Sample {
        operations: completed,
        wall_ns: start_wall.elapsed().as_nanos() as f64,
        cpu_ns: (thread_cpu_ns() - start_cpu) as f64,
    })
}

/// Where memcpy's buffers start within a cache line moves its speed: a
/// 1 KiB copy takes 8 ns with both on a line and 10 ns with one 16 bytes
/// off (the Xeon VM of 2026-11-27), and the heap's 16-byte alignment left
/// that to the build's luck. Both buffers start on a line, memcpy's fast
/// case, so the baseline is steady and never the slow one.
const CACHE_LINE_BYTES: usize = 64;

fn line_aligned(storage: &mut [u8], size: usize) -> &mut [u8] {
    let offset = storage.as_ptr().align_offset(CACHE_LINE_BYTES);
    &mut storage[offset..offset + size]
}

fn run_memcpy(size: u32, duration: Duration) -> Sample {
    let size = size as usize;
    let mut source_storage = vec![0x5au8; size + CACHE_LINE_BYTES];
    let mut destination_storage = vec![0u8; size + CACHE_LINE_BYTES];
    let source = line_aligned(&mut source_storage, size);
    let destination = line_aligned(&mut destination_storage, size);
    let mut operations = 0u64;
    let start_wall = Instant::now();
    let start_cpu = thread_cpu_ns();
    loop {
        for _ in 0..256 {
            destination.copy_from_slice(black_box(&*source));
            black_box(&mut *destination);
        }
        operations += 256;
        if start_wall.elapsed() >= duration {
            break;
        }
    }
    Sample {
        operations,
        wall_ns: start_wall.elapsed().as_nanos() as f64,
        cpu_ns: (thread_cpu_ns() - start_cpu) as f64,
    }
}

fn gigabytes_per_second(size: u32, ns_per_op: f64) -> f64 {
    f64::from(size) / ns_per_op
}

pub fn run(quick: bool) -> Result<Report, FabricBenchError> {
    let plan = if quick {
        Plan {
            repetitions: 3,
            duration: Duration::from_millis(150),
        }
    } else {
        Plan {
            repetitions: 7,
            duration: Duration::from_millis(600),
        }
    };
    let mut report = Report::new(
        "fabric",
        serde_json::json!({
            "quick": quick,
            "repetitions": plan.repetitions,
            "seconds_per_repetition": plan.duration.as_secs_f64(),
            "sizes_bytes": SIZES,
            "pipeline_depth": PIPELINE_DEPTH,
            "queue_pair_counts": QUEUE_PAIR_COUNTS,
            "scaling_requests_in_flight": SCALING_IN_FLIGHT,
            "scaling_read_window_per_queue_pair_max": MAX_READ_WINDOW,
            "sweep_sizes_bytes": SWEEP_SIZES,
            "sweep_requests_in_flight": SWEEP_IN_FLIGHT,
            "path_mtu_bytes": 4096,
            "carrier": "none: frames passed in memory between two devices in one thread",
            "cpu": "thread CPU time of the one thread that runs both devices (all NIC emulation)",
        }),
    );
    let total = (RUNS_PER_ROUND * plan.repetitions) as u64;
    let progress = ProgressBar::new(total);
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} runs {msg}").expect("static template"),
    );
    let mut rounds = Vec::with_capacity(plan.repetitions);
    for _ in 0..plan.repetitions {
        rounds.push(run_round(&plan, &progress)?);
    }
    progress.finish_and_clear();
    fill_report(&mut report, &rounds)?;
    Ok(report)
}

/// The transfer variants: (operation, requests outstanding).
const VARIANTS: [(Kind, usize); 4] = [
    (Kind::Read, 1),
    (Kind::Write, 1),
    (Kind::Read, PIPELINE_DEPTH),
    (Kind::Write, PIPELINE_DEPTH),
];

/// One repetition of everything: memcpy and every variant at every size,
/// back to back, so a ratio can be taken within the round, where drift on a
/// shared machine touches both sides alike.
struct Round {
    /// Indexed by size.
    memcpy: Vec<Sample>,
    /// Indexed by variant, then size.
    transfers: Vec<Vec<Sample>>,
    /// 64 B READs, indexed as `QUEUE_PAIR_COUNTS`.
    scaling: Vec<Sample>,
    /// READs then WRITEs, each indexed as `SWEEP_SIZES`.
    sweep: Vec<Sample>,
    /// Serial 64 B READs on one queue pair with `IDLE_QUEUE_PAIRS` others
    /// connected and idle.
    beside_idle: Sample,
}

/// The runs of one round, in [`run_round`]'s order: memcpy and each
/// variant per size, the queue-pair scaling, the one beside idle queue
/// pairs (left out, the bar ran past its end: 123/120), and the READ
/// and WRITE sweeps.
const RUNS_PER_ROUND: usize =
    SIZES.len() * (VARIANTS.len() + 1) + QUEUE_PAIR_COUNTS.len() + 1 + 2 * SWEEP_SIZES.len();

fn run_round(plan: &Plan, progress: &ProgressBar) -> Result<Round, FabricBenchError> {
    let measure = |message: String, transfer: Transfer| {
        progress.set_message(message);
        let sample = run_transfers(transfer, plan.duration);
        progress.inc(1);
        sample
    };
    let mut memcpy = Vec::new();
    let mut transfers: Vec<Vec<Sample>> = VARIANTS.iter().map(|_| Vec::new()).collect();
    for size in SIZES {
        progress.set_message(format!("memcpy {}", size_label(size)));
        memcpy.push(run_memcpy(size, plan.duration));
        progress.inc(1);
        for (index, (kind, depth)) in VARIANTS.iter().enumerate() {
            let transfer = Transfer {
                kind: *kind,
                size,
                queue_pairs: 1,
                idle_queue_pairs: 0,
                in_flight: *depth,
            };
            let message = variant_name(*kind, *depth, size);
            transfers[index].push(measure(message, transfer)?);
        }
    }
    let mut scaling = Vec::new();
    for queue_pairs in QUEUE_PAIR_COUNTS {
        let transfer = Transfer {
            kind: Kind::Read,
            size: 64,
            queue_pairs,
            idle_queue_pairs: 0,
            in_flight: SCALING_IN_FLIGHT,
        };
        let message = format!("64B READs over {queue_pairs} queue pairs");
        scaling.push(measure(message, transfer)?);
    }
    let beside_idle = Transfer {
        kind: Kind::Read,
        size: 64,
        queue_pairs: 1,
        idle_queue_pairs: IDLE_QUEUE_PAIRS,
        in_flight: 1,
    };
    let beside_idle = measure(
        format!("64B READs on 1 queue pair beside {IDLE_QUEUE_PAIRS} idle ones"),
        beside_idle,
    )?;
    let mut sweep = Vec::new();
    for kind in [Kind::Read, Kind::Write] {
        for size in SWEEP_SIZES {
            let transfer = Transfer {
                kind,
                size,
                queue_pairs: 1,
                idle_queue_pairs: 0,
                in_flight: SWEEP_IN_FLIGHT,
            };
            let message = format!("{} sweep", variant_name(kind, 1, size));
            sweep.push(measure(message, transfer)?);
        }
    }
    Ok(Round {
        memcpy,
        transfers,
        scaling,
        sweep,
        beside_idle,
    })
}

impl Sample {
    fn cpu_ns_per_op(&self) -> f64 {
        self.cpu_ns / self.operations as f64
    }

    fn wall_ns_per_op(&self) -> f64 {
        self.wall_ns / self.operations as f64
    }
}

impl Round {
    /// NIC CPU per operation of a variant at a size.
    fn cost(&self, kind: Kind, depth: usize, size: u32) -> f64 {
        self.transfers[variant_index(kind, depth)][size_index(size)].cpu_ns_per_op()
    }

    fn memcpy_cost(&self, size: u32) -> f64 {
        self.memcpy[size_index(size)].cpu_ns_per_op()
    }
}

fn size_index(size: u32) -> usize {
    SIZES
        .iter()
        .position(|s| *s == size)
        .expect("a measured size")
}

fn variant_index(kind: Kind, depth: usize) -> usize {
    VARIANTS
        .iter()
        .position(|v| *v == (kind, depth))
        .expect("a measured variant")
}

/// A ratio computed from the figures of one round.
type RatioOfRound = fn(&Round) -> f64;

/// Median over rounds of one figure of each round.
fn median_over(rounds: &[Round], figure: impl Fn(&Round) -> f64) -> f64 {
    let mut values: Vec<f64> = rounds.iter().map(figure).collect();
    median(&mut values)
}

fn variant_name(kind: Kind, depth: usize, size: u32) -> String {
    let operation = if kind == Kind::Read { "read" } else { "write" };
    let mode = if depth == 1 { "serial" } else { "pipelined" };
    format!("{operation} {} {mode}", size_label(size))
}

fn fill_report(report: &mut Report, rounds: &[Round]) -> Result<(), FabricBenchError> {
    println!(
        "{:<26} {:>12} {:>12} {:>10} {:>10} {:>14}",
        "variant", "cpu ns/op", "wall ns/op", "Mops/s", "GB/s", "x memcpy time"
    );
    for size in SIZES {
        let at = size_index(size);
        let cpu = median_over(rounds, |round| round.memcpy[at].cpu_ns_per_op());
        let wall = median_over(rounds, |round| round.memcpy[at].wall_ns_per_op());
        print_row(
            report,
            &format!("memcpy {}", size_label(size)),
            size,
            cpu,
            wall,
            1.0,
        );
    }
    for (variant, (kind, depth)) in VARIANTS.iter().enumerate() {
        for size in SIZES {
            let at = size_index(size);
            let cpu = median_over(rounds, |round| round.transfers[variant][at].cpu_ns_per_op());
            let wall = median_over(rounds, |round| {
                round.transfers[variant][at].wall_ns_per_op()
            });
            let versus = median_over(rounds, |round| {
                round.transfers[variant][at].cpu_ns_per_op() / round.memcpy[at].cpu_ns_per_op()
            });
            print_row(
                report,
                &variant_name(*kind, *depth, size),
                size,
                cpu,
                wall,
                versus,
            );
        }
    }
    // Each ratio is taken within a round, then the median over rounds.
    // Bandwidth ratios of equal sizes are inverse time ratios.
    let ratios: [(&str, RatioOfRound); 5] = [
        ("read64_vs_memcpy1k", |r| {
            r.cost(Kind::Read, 1, 64) / r.memcpy_cost(1024)
        }),
        ("read64_pipelined_vs_memcpy1k", |r| {
            r.cost(Kind::Read, PIPELINE_DEPTH, 64) / r.memcpy_cost(1024)
        }),
        ("write64k_vs_memcpy_bw", |r| {
            r.memcpy_cost(65536) / r.cost(Kind::Write, PIPELINE_DEPTH, 65536)
        }),
        ("write64k_serial_vs_memcpy_bw", |r| {
            r.memcpy_cost(65536) / r.cost(Kind::Write, 1, 65536)
        }),
        ("read64k_vs_memcpy_bw", |r| {
            r.memcpy_cost(65536) / r.cost(Kind::Read, PIPELINE_DEPTH, 65536)
        }),
    ];
    println!();
    for (key, ratio_of) in ratios {
        let per_round: Vec<f64> = rounds.iter().map(ratio_of).collect();
        let value = median(&mut per_round.clone());
        let low = per_round.iter().copied().fold(f64::INFINITY, f64::min);
        let high = per_round.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        println!("{key:<32} {value:8.3}   (rounds: {low:.3} .. {high:.3})");
        report.ratios.insert(key.into(), serde_json::json!(value));
        report.add(key, "ratio_lowest_round", low, "ratio");
        report.add(key, "ratio_highest_round", high, "ratio");
    }
    fill_scaling(report, rounds)?;
    fill_sweep(report, rounds);
    for size in SIZES {
        let at = size_index(size);
        let cpu = median_over(rounds, |round| round.memcpy[at].cpu_ns_per_op());
        report.baseline(
            &format!("memcpy_{}_ns", size_label(size).to_lowercase()),
            cpu,
        );
    }
    println!(
        "targets: read64_vs_memcpy1k <= 15, write64k_vs_memcpy_bw >= 0.25, qp_scaling_1024_vs_1 >= 0.8"
    );
    Ok(())
}

/// 64 B READ throughput and NIC CPU per operation against the number of
/// active queue pairs, and `qp_scaling_1024_vs_1`.
fn fill_scaling(report: &mut Report, rounds: &[Round]) -> Result<(), FabricBenchError> {
    println!();
    println!(
        "{:<26} {:>12} {:>12} {:>10}",
        "queue pairs (64B READ)", "cpu ns/op", "wall ns/op", "Mops/s"
    );
    for (at, queue_pairs) in QUEUE_PAIR_COUNTS.iter().enumerate() {
        let cpu = median_over(rounds, |round| round.scaling[at].cpu_ns_per_op());
        let wall = median_over(rounds, |round| round.scaling[at].wall_ns_per_op());
        let name = format!("read 64B over {queue_pairs} queue pairs");
        println!("{name:<26} {cpu:>12.1} {wall:>12.1} {:>10.3}", 1e3 / wall);
        report.add(&name, "nic_cpu_ns_per_op", cpu, "ns");
        report.add(&name, "operations_per_second", 1e9 / wall, "ops/s");
    }
    let last = QUEUE_PAIR_COUNTS.len() - 1;
    let value = median_over(rounds, |round| {
        round.scaling[0].wall_ns_per_op() / round.scaling[last].wall_ns_per_op()
    });
    println!("{:<32} {value:8.3}", "qp_scaling_1024_vs_1");
    report
        .ratios
        .insert("qp_scaling_1024_vs_1".into(), serde_json::json!(value));
    // Idle queue pairs must cost nothing per operation: serial 64 B READs
    // beside 1023 idle queue pairs against the same with none.
    let value = median_over(rounds, |round| {
        let alone = round.transfers[variant_index(Kind::Read, 1)][size_index(64)].wall_ns_per_op();
        alone / round.beside_idle.wall_ns_per_op()
    });
    let cpu = median_over(rounds, |round| round.beside_idle.cpu_ns_per_op());
    let name = &format!("read 64B beside {IDLE_QUEUE_PAIRS} idle queue pairs");
    println!("{name:<26} {cpu:>12.1}");
    report.add(name, "nic_cpu_ns_per_op", cpu, "ns");
    println!("{:<32} {value:8.3}", "idle_qps_1023_vs_none");
    report
        .ratios
        .insert("idle_qps_1023_vs_none".into(), serde_json::json!(value));
    let bytes = resident_bytes_per_queue_pair()?;
    println!("resident memory per queue pair: {bytes:.0} B");
    report.add(
        "queue pair",
        "resident_bytes_per_queue_pair",
        bytes,
        "bytes",
    );
    Ok(())
}

/// Throughput against message size, READ and WRITE, as a series.
fn fill_sweep(report: &mut Report, rounds: &[Round]) {
    println!();
    println!("{:<26} {:>12} {:>10}", "size sweep", "wall ns/op", "GB/s");
    let mut series = Vec::new();
    for (kind_index, kind) in [Kind::Read, Kind::Write].into_iter().enumerate() {
        for (at, size) in SWEEP_SIZES.iter().enumerate() {
            let index = kind_index * SWEEP_SIZES.len() + at;
            let wall = median_over(rounds, |round| round.sweep[index].wall_ns_per_op());
            let gbps = gigabytes_per_second(*size, wall);
            let operation = if kind == Kind::Read { "read" } else { "write" };
            let name = format!("{operation} {} sweep", size_label(*size));
            println!("{name:<26} {wall:>12.1} {gbps:>10.2}");
            report.add(&name, "throughput", gbps, "GB/s");
            series.push(serde_json::json!({
                "operation": operation,
                "size_bytes": size,
                "gigabytes_per_second": gbps,
            }));
        }
    }
    report
        .series
        .insert("throughput_by_size".into(), serde_json::json!(series));
}

/// Resident memory a queue pair costs: the growth of this process's
/// resident set over creating and connecting 1024 pairs (2048 queue pairs,
/// both ends counted), divided by 2048. Queue capacity reserved but never
/// touched is not resident, as on a real host.
fn resident_bytes_per_queue_pair() -> Result<f64, FabricBenchError> {
    const CONNECTIONS: usize = 1024;
    let before = resident_bytes();
    // A window of 8: send queues of 16, the builder's default depth.
    let rig = TransferRig::new(64, CONNECTIONS, 8);
    let after = resident_bytes();
    rig?;
    Ok(after.saturating_sub(before) as f64 / (2 * CONNECTIONS) as f64)
}

/// This process's resident set, from `/proc/self/statm` (0 where absent).
fn resident_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|text| text.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    pages * rustix::param::page_size() as u64
}

fn print_row(report: &mut Report, name: &str, size: u32, cpu_ns: f64, wall_ns: f64, versus: f64) {
    // Throughput is bytes over wall time everywhere, as the size sweep
    // reports it: the report plots memcpy's beside the sweep's, and from
    // CPU time here it was another measure on the same axes.
    let gbps = gigabytes_per_second(size, wall_ns);
    println!(
        "{name:<26} {cpu_ns:>12.1} {wall_ns:>12.1} {:>10.3} {gbps:>10.2} {versus:>14.1}",
        1e3 / wall_ns
    );
    let metric = if name.starts_with("memcpy") {
        "cpu_ns_per_op"
    } else {
        "nic_cpu_ns_per_op"
    };
    report.add(name, metric, cpu_ns, "ns");
    report.add(name, "wall_ns_per_op", wall_ns, "ns");
    report.add(name, "operations_per_second", 1e9 / wall_ns, "ops/s");
    report.add(name, "throughput", gbps, "GB/s");
    report.add(name, "cost_vs_memcpy_same_size", versus, "ratio");
}

/// `remora bench fabric`.
pub static BENCH: super::entry::Entry<super::entry::CommonArgs, FabricBenchError> = super::entry::Entry {
    name: "fabric",
    about: "The soft RNIC's own cost.\n\nREAD and WRITE of 64 B to 64 KiB between two devices in one thread with no carrier, against memcpy in the same run.",
    run: |args| run(args.quick),
};

#[cfg(test)]
mod tests {
    use super::*;

    /// The bar's length counted 40 runs a round and the round made 41.
    #[test]
    fn a_round_makes_as_many_runs_as_the_bar_counts() {
        let plan = Plan {
            repetitions: 1,
            duration: Duration::from_millis(1),
        };
        let progress = ProgressBar::hidden();
        run_round(&plan, &progress).unwrap();
        assert_eq!(progress.position(), RUNS_PER_ROUND as u64);
    }
}
