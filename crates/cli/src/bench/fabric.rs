//! `remora bench fabric`: the protocol's own cost. Two soft RNICs in one
//! thread, frames handed straight from one to the other, so every
//! nanosecond is RoCEv2 work: building frames, ICRC both ways, parsing,
//! protection checks, copies, acknowledgements and completions. All of it is
//! NIC-emulation CPU; there is no application CPU in this benchmark.

use super::{median, thread_cpu_ns, Host, Report};
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

fn run_transfers(
    kind: Kind,
    size: u32,
    depth: usize,
    duration: Duration,
) -> Result<Sample, String> {
    let mut fabric = BackToBack::new(11);
    let error = |error: VerbsError| error.to_string();
    let left_pd = fabric.left.alloc_protection_domain().map_err(error)?;
    let right_pd = fabric.right.alloc_protection_domain().map_err(error)?;
    let local = fabric
        .left
        .register_memory(left_pd, u64::from(size) * depth as u64, AccessFlags::ALL)
        .map_err(error)?;
    let remote = fabric
        .right
        .register_memory(right_pd, u64::from(size) * depth as u64, AccessFlags::ALL)
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
            let offset = slot as u64 * u64::from(size);
            let operation = match kind {
                Kind::Read => SendOperation::Read {
                    remote: remote.remote(offset),
                },
                Kind::Write => SendOperation::Write {
                    remote: remote.remote(offset),
                    immediate: None,
                },
            };
            SendRequest::new(slot as u64, operation, &[local.slice(offset, size)])
                .expect("one element")
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
            return Err("the fabric stalled with requests outstanding".into());
        }
        while let Some(completion) = fabric.left.poll_completion(left_cq).map_err(error)? {
            if completion.status != CompletionStatus::Success {
                return Err(format!("benchmark transfer failed: {completion:?}"));
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

/// Median per-operation figures over the repetitions.
struct Figures {
    cpu_ns_per_op: f64,
    wall_ns_per_op: f64,
}

fn figures(samples: &[Sample]) -> Figures {
    let mut cpu: Vec<f64> = samples
        .iter()
        .map(|s| s.cpu_ns / s.operations as f64)
        .collect();
    let mut wall: Vec<f64> = samples
        .iter()
        .map(|s| s.wall_ns / s.operations as f64)
        .collect();
    Figures {
        cpu_ns_per_op: median(&mut cpu),
        wall_ns_per_op: median(&mut wall),
    }
}

fn size_label(size: u32) -> String {
    if size >= 1024 {
        format!("{}KiB", size / 1024)
    } else {
        format!("{size}B")
    }
}

fn gigabytes_per_second(size: u32, ns_per_op: f64) -> f64 {
    f64::from(size) / ns_per_op
}

pub fn run(quick: bool) -> Result<Report, String> {
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
    };
    let variants: Vec<(Kind, usize)> = vec![
        (Kind::Read, 1),
        (Kind::Write, 1),
        (Kind::Read, PIPELINE_DEPTH),
        (Kind::Write, PIPELINE_DEPTH),
    ];
    let total = (SIZES.len() * (variants.len() + 1) * plan.repetitions) as u64;
    let progress = ProgressBar::new(total);
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} runs {msg}").expect("static template"),
    );
    let mut memcpy = Vec::new();
    let mut transfers = Vec::new();
    for size in SIZES {
        // Interleave repetitions of every variant so drift on a shared
        // machine hits them all alike.
        let mut memcpy_samples = Vec::new();
        let mut variant_samples: Vec<Vec<Sample>> = variants.iter().map(|_| Vec::new()).collect();
        for _ in 0..plan.repetitions {
            progress.set_message(format!("memcpy {}", size_label(size)));
            memcpy_samples.push(run_memcpy(size, plan.duration));
            progress.inc(1);
            for (index, (kind, depth)) in variants.iter().enumerate() {
                progress.set_message(format!(
                    "{} {} depth {depth}",
                    if *kind == Kind::Read { "READ" } else { "WRITE" },
                    size_label(size)
                ));
                variant_samples[index].push(run_transfers(*kind, size, *depth, plan.duration)?);
                progress.inc(1);
            }
        }
        memcpy.push((size, figures(&memcpy_samples)));
        for (index, variant) in variants.iter().enumerate() {
            transfers.push((*variant, size, figures(&variant_samples[index])));
        }
    }
    progress.finish_and_clear();
    fill_report(&mut report, &memcpy, &transfers);
    Ok(report)
}

fn variant_name(kind: Kind, depth: usize, size: u32) -> String {
    let operation = if kind == Kind::Read { "read" } else { "write" };
    let mode = if depth == 1 { "serial" } else { "pipelined" };
    format!("{operation} {} {mode}", size_label(size))
}

fn fill_report(
    report: &mut Report,
    memcpy: &[(u32, Figures)],
    transfers: &[((Kind, usize), u32, Figures)],
) {
    println!(
        "{:<26} {:>12} {:>12} {:>10} {:>10} {:>14}",
        "variant", "cpu ns/op", "wall ns/op", "Mops/s", "GB/s", "x memcpy time"
    );
    let memcpy_of = |size: u32| {
        &memcpy
            .iter()
            .find(|(s, _)| *s == size)
            .expect("every size measured")
            .1
    };
    for (size, figures) in memcpy {
        let name = format!("memcpy {}", size_label(*size));
        let gbps = gigabytes_per_second(*size, figures.cpu_ns_per_op);
        println!(
            "{name:<26} {:>12.1} {:>12.1} {:>10.3} {:>10.2} {:>14}",
            figures.cpu_ns_per_op,
            figures.wall_ns_per_op,
            1e3 / figures.wall_ns_per_op,
            gbps,
            "1.0"
        );
        report.add(&name, "cpu_ns_per_op", figures.cpu_ns_per_op, "ns");
        report.add(&name, "throughput", gbps, "GB/s");
    }
    for ((kind, depth), size, figures) in transfers {
        let name = variant_name(*kind, *depth, *size);
        let gbps = gigabytes_per_second(*size, figures.cpu_ns_per_op);
        let versus = figures.cpu_ns_per_op / memcpy_of(*size).cpu_ns_per_op;
        println!(
            "{name:<26} {:>12.1} {:>12.1} {:>10.3} {:>10.2} {:>14.1}",
            figures.cpu_ns_per_op,
            figures.wall_ns_per_op,
            1e3 / figures.wall_ns_per_op,
            gbps,
            versus
        );
        report.add(&name, "nic_cpu_ns_per_op", figures.cpu_ns_per_op, "ns");
        report.add(&name, "wall_ns_per_op", figures.wall_ns_per_op, "ns");
        report.add(
            &name,
            "operations_per_second",
            1e9 / figures.wall_ns_per_op,
            "ops/s",
        );
        report.add(&name, "throughput", gbps, "GB/s");
        report.add(&name, "cost_vs_memcpy_same_size", versus, "ratio");
    }
    let find = |kind: Kind, depth: usize, size: u32| {
        &transfers
            .iter()
            .find(|((k, d), s, _)| *k == kind && *d == depth && *s == size)
            .expect("measured")
            .2
    };
    let memcpy_1k = memcpy_of(1024).cpu_ns_per_op;
    let memcpy_64k_bandwidth = gigabytes_per_second(65536, memcpy_of(65536).cpu_ns_per_op);
    let mut ratio = |key: &str, value: f64| {
        report.ratios.insert(key.into(), serde_json::json!(value));
    };
    ratio(
        "read64_vs_memcpy1k",
        find(Kind::Read, 1, 64).cpu_ns_per_op / memcpy_1k,
    );
    ratio(
        "read64_pipelined_vs_memcpy1k",
        find(Kind::Read, PIPELINE_DEPTH, 64).cpu_ns_per_op / memcpy_1k,
    );
    ratio(
        "write64k_vs_memcpy_bw",
        gigabytes_per_second(
            65536,
            find(Kind::Write, PIPELINE_DEPTH, 65536).cpu_ns_per_op,
        ) / memcpy_64k_bandwidth,
    );
    ratio(
        "write64k_serial_vs_memcpy_bw",
        gigabytes_per_second(65536, find(Kind::Write, 1, 65536).cpu_ns_per_op)
            / memcpy_64k_bandwidth,
    );
    ratio(
        "read64k_vs_memcpy_bw",
        gigabytes_per_second(65536, find(Kind::Read, PIPELINE_DEPTH, 65536).cpu_ns_per_op)
            / memcpy_64k_bandwidth,
    );
    println!();
    for (key, value) in &report.ratios {
        println!("{key:<32} {:.3}", value.as_f64().unwrap_or(f64::NAN));
    }
    println!("targets: read64_vs_memcpy1k <= 15, write64k_vs_memcpy_bw >= 0.25");
}
