//! `remora bench fabric`: the protocol's own cost. Two soft RNICs in one
//! thread, frames handed straight from one to the other, so every
//! nanosecond is RoCEv2 work: building frames, ICRC both ways, parsing,
//! protection checks, copies, acknowledgements and completions. All of it is
//! NIC-emulation CPU; there is no application CPU in this benchmark.

use super::report::{median, size_label, thread_cpu_ns, Host, Report};
use indicatif::{ProgressBar, ProgressStyle};
use remora_rnic::back_to_back::BackToBack;
use remora_rnic::*;
use std::hint::black_box;
use std::time::{Duration, Instant};

const SIZES: [u32; 4] = [64, 1024, 4096, 65536];
/// Outstanding requests in the pipelined variant.
const PIPELINE_DEPTH: usize = 16;

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

fn run_transfers(
    kind: Kind,
    size: u32,
    depth: usize,
    duration: Duration,
) -> Result<Sample, FabricBenchError> {
    let mut fabric = BackToBack::new(11);
    let error = FabricBenchError::Verbs;
    let left_pd = fabric.left.alloc_protection_domain().map_err(error)?;
    let right_pd = fabric.right.alloc_protection_domain().map_err(error)?;
    // Every outstanding request uses the same two buffers of `size` bytes,
    // as memcpy reuses its two: the comparison is between like working
    // sets, not between cache levels.
    let local = fabric
        .left
        .register_memory(left_pd, u64::from(size), AccessFlags::ALL)
        .map_err(error)?;
    let remote = fabric
        .right
        .register_memory(right_pd, u64::from(size), AccessFlags::ALL)
        .map_err(error)?;
    let left_cq = fabric
        .left
        .create_completion_queue(depth * 2)
        .map_err(error)?;
    let right_cq = fabric
        .right
        .create_completion_queue(depth * 2)
        .map_err(error)?;
    let mut left_builder = QueuePairBuilder::new(left_pd, left_cq, left_cq);
    left_builder.max_read_atomic = depth.max(1);
    left_builder.send_queue_depth = depth * 2;
    let right_builder = QueuePairBuilder::new(right_pd, right_cq, right_cq);
    let (qp, _) = fabric
        .connect(&left_builder, &right_builder)
        .map_err(error)?;
    let requests: Vec<SendRequest> = (0..depth)
        .map(|slot| {
            let operation = match kind {
                Kind::Read => SendOperation::Read {
                    remote: remote.remote(0),
                },
                Kind::Write => SendOperation::Write {
                    remote: remote.remote(0),
                    immediate: None,
                },
            };
            SendRequest::new(slot as u64, operation, &[local.slice(0, size)]).expect("one element")
        })
        .collect();
    let mut outstanding = 0;
    let mut completed = 0u64;
    let mut next_request = 0;
    let start_wall = Instant::now();
    let start_cpu = thread_cpu_ns();
    loop {
        while outstanding < depth {
            fabric
                .left
                .post_send(qp, requests[next_request % depth])
                .map_err(error)?;
            next_request += 1;
            outstanding += 1;
        }
        if fabric.step(&mut |_, _| remora_rnic::back_to_back::Verdict::Deliver) == 0 {
            return Err(FabricBenchError::Stalled);
        }
        while let Some(completion) = fabric.left.poll_completion(left_cq).map_err(error)? {
            if completion.status != CompletionStatus::Success {
                return Err(FabricBenchError::TransferFailed(completion.status));
            }
            outstanding -= 1;
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

fn run_memcpy(size: u32, duration: Duration) -> Sample {
    let source = vec![0x5au8; size as usize];
    let mut destination = vec![0u8; size as usize];
    let mut operations = 0u64;
    let start_wall = Instant::now();
    let start_cpu = thread_cpu_ns();
    loop {
        for _ in 0..256 {
            destination.copy_from_slice(black_box(&source));
            black_box(&mut destination);
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
    let mut report = Report {
        bench: "fabric".into(),
        config: serde_json::json!({
            "quick": quick,
            "repetitions": plan.repetitions,
            "seconds_per_repetition": plan.duration.as_secs_f64(),
            "sizes_bytes": SIZES,
            "pipeline_depth": PIPELINE_DEPTH,
            "path_mtu_bytes": 4096,
            "carrier": "none: frames passed in memory between two devices in one thread",
            "cpu": "thread CPU time of the one thread that runs both devices (all NIC emulation)",
        }),
        host: Host::probe(),
        results: Vec::new(),
        ratios: serde_json::Map::new(),
        series: serde_json::Map::new(),
    };
    let total = (SIZES.len() * (VARIANTS.len() + 1) * plan.repetitions) as u64;
    let progress = ProgressBar::new(total);
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} runs {msg}").expect("static template"),
    );
    let mut rounds = Vec::with_capacity(plan.repetitions);
    for _ in 0..plan.repetitions {
        rounds.push(run_round(&plan, &progress)?);
    }
    progress.finish_and_clear();
    fill_report(&mut report, &rounds);
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
}

fn run_round(plan: &Plan, progress: &ProgressBar) -> Result<Round, FabricBenchError> {
    let mut round = Round {
        memcpy: Vec::new(),
        transfers: VARIANTS.iter().map(|_| Vec::new()).collect(),
    };
    for size in SIZES {
        progress.set_message(format!("memcpy {}", size_label(size)));
        round.memcpy.push(run_memcpy(size, plan.duration));
        progress.inc(1);
        for (index, (kind, depth)) in VARIANTS.iter().enumerate() {
            progress.set_message(variant_name(*kind, *depth, size));
            round.transfers[index].push(run_transfers(*kind, size, *depth, plan.duration)?);
            progress.inc(1);
        }
    }
    Ok(round)
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

fn fill_report(report: &mut Report, rounds: &[Round]) {
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
    println!("targets: read64_vs_memcpy1k <= 15, write64k_vs_memcpy_bw >= 0.25");
}

fn print_row(report: &mut Report, name: &str, size: u32, cpu_ns: f64, wall_ns: f64, versus: f64) {
    let gbps = gigabytes_per_second(size, cpu_ns);
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
