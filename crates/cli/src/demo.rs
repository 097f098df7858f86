//! `remora demo`: a tour of the fabric. Two soft RNICs, wired back to back,
//! run every RC operation; each result is checked, not just reported.

use crate::capture::Capture;
use crate::error::DemoError;
use remora_rnic::back_to_back::{BackToBack, Verdict};
use remora_rnic::*;
use remora_wire::VirtAddr;
use serde::Serialize;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

const REGION_BYTES: u64 = 1 << 20;
const BIG_BYTES: u32 = 64 * 1024;

#[derive(Serialize)]
struct Row {
    operation: String,
    bytes: u32,
    status: String,
    frames: u64,
    wire_bytes: u64,
    retransmitted: u64,
    checked: String,
    ok: bool,
}

/// Both devices of the tour, with one region and queue each side.
struct Tour {
    fabric: BackToBack,
    left: (MemoryRegion, CompletionQueue, QueuePair),
    right: (MemoryRegion, CompletionQueue, QueuePair),
    rows: Vec<Row>,
    capture: Capture,
}

fn setup(seed: u64, access: AccessFlags) -> Result<Tour, VerbsError> {
    let mut fabric = BackToBack::new(seed);
    let mut builders = Vec::new();
    let mut sides = Vec::new();
    for device in [&mut fabric.left, &mut fabric.right] {
        let pd = device.alloc_protection_domain()?;
        let region = device.register_memory(pd, REGION_BYTES, access)?;
        let queue = device.create_completion_queue(64)?;
        let mut builder = QueuePairBuilder::new(pd, queue, queue);
        builder.path_mtu = Mtu::MTU_4096;
        builders.push(builder);
        sides.push((region, queue));
    }
    let (left_qp, right_qp) = fabric.connect(&builders[0], &builders[1])?;
    Ok(Tour {
        fabric,
        left: (sides[0].0, sides[0].1, left_qp),
        right: (sides[1].0, sides[1].1, right_qp),
        rows: Vec::new(),
        capture: Capture::default(),
    })
}

fn pattern(len: u32, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|index| (index as u8).wrapping_mul(167).wrapping_add(seed))
        .collect()
}

fn at(region: &MemoryRegion, offset: u64) -> VirtAddr {
    VirtAddr(region.address.0 + offset)
}

impl Tour {
    fn receive_completion(&mut self) -> Option<WorkCompletion> {
        self.fabric
            .right
            .poll_completion(self.right.1)
            .ok()
            .flatten()
    }

    fn read(&self, right_side: bool, offset: u64, len: usize) -> Vec<u8> {
        let (device, region) = if right_side {
            (&self.fabric.right, &self.right.0)
        } else {
            (&self.fabric.left, &self.left.0)
        };
        let mut bytes = vec![0u8; len];
        device
            .read_local(region.lkey, at(region, offset), &mut bytes)
            .expect("inside the region");
        bytes
    }

    /// Posts one request, runs the fabric with `loss` applied to every
    /// frame, and records the row after `check` judges the outcome.
    fn run(
        &mut self,
        name: &str,
        request: SendRequest,
        loss_every: Option<u64>,
        check: impl FnOnce(&mut Tour, &WorkCompletion) -> (bool, String),
    ) -> Result<(), VerbsError> {
        let before = self.fabric.left.counters().clone();
        let right_before = self.fabric.right.counters().clone();
        self.fabric.left.post_send(self.left.2, request)?;
        let mut frame_number = 0u64;
        let Tour {
            fabric, capture, ..
        } = self;
        let now = fabric.now;
        let summary = fabric.run_filtered(100_000, &mut |_, frame| {
            capture.record(Duration::from_nanos(now.as_nanos()), frame);
            frame_number += 1;
            match loss_every {
                Some(every) if frame_number.is_multiple_of(every) => Verdict::Drop,
                _ => Verdict::Deliver,
            }
        });
        let completion = self.fabric.left.poll_completion(self.left.1)?;
        let (ok, checked) = match (&completion, summary.quiesced) {
            (Some(completion), true) => check(self, completion),
            (None, _) => (false, "no completion".to_string()),
            (_, false) => (false, "did not finish".to_string()),
        };
        let after = self.fabric.left.counters();
        let right_after = self.fabric.right.counters();
        self.rows.push(Row {
            operation: name.to_string(),
            bytes: request.local.total_length_bytes() as u32,
            status: completion.map_or("none".into(), |completion| {
                format!("{:?}", completion.status)
            }),
            frames: summary.frames_moved,
            wire_bytes: (after.bytes_transmitted - before.bytes_transmitted)
                + (right_after.bytes_transmitted - right_before.bytes_transmitted),
            retransmitted: after.packets_retransmitted - before.packets_retransmitted,
            checked,
            ok,
        });
        Ok(())
    }
}

fn success(completion: &WorkCompletion) -> bool {
    completion.status == CompletionStatus::Success
}

fn tour_operations(tour: &mut Tour) -> Result<(), VerbsError> {
    let (left_region, right_region) = (tour.left.0, tour.right.0);
    let big = pattern(BIG_BYTES, 1);
    tour.fabric
        .left
        .write_local(left_region.lkey, at(&left_region, 0), &big)?;
    for (id, length) in [(0, 4096), (1, 64)] {
        let receive =
            ReceiveRequest::new(id, &[right_region.slice(0x80000 + id * 0x10000, length)])?;
        tour.fabric.right.post_receive(tour.right.2, receive)?;
    }
    let receive_for_immediate = ReceiveRequest::new(2, &[])?;
    tour.fabric
        .right
        .post_receive(tour.right.2, receive_for_immediate)?;

    let send = SendRequest::new(
        1,
        SendOperation::Send { immediate: None },
        &[left_region.slice(0, 4096)],
    )?;
    tour.run("SEND", send, None, |tour, completion| {
        let receive = tour.receive_completion();
        let landed = receive.is_some_and(|receive| receive.byte_len == 4096)
            && tour.read(true, 0x80000, 4096) == big[..4096];
        (
            success(completion) && landed,
            "receive buffer holds the payload".into(),
        )
    })?;
    let send = SendRequest::new(
        2,
        SendOperation::Send {
            immediate: Some(0xc0ffee),
        },
        &[left_region.slice(0, 64)],
    )?;
    tour.run("SEND with immediate", send, None, |tour, completion| {
        let receive = tour.receive_completion();
        let immediate_ok = receive.is_some_and(|receive| receive.immediate == Some(0xc0ffee));
        (
            success(completion) && immediate_ok,
            "receiver saw immediate 0xc0ffee".into(),
        )
    })?;
    let write = SendRequest::new(
        3,
        SendOperation::Write {
            remote: right_region.remote(0),
            immediate: None,
        },
        &[left_region.slice(0, BIG_BYTES)],
    )?;
    tour.run("RDMA WRITE", write, None, |tour, completion| {
        (
            success(completion) && tour.read(true, 0, BIG_BYTES as usize) == big,
            "remote memory equals source".into(),
        )
    })?;
    let write = SendRequest::new(
        4,
        SendOperation::Write {
            remote: right_region.remote(0x40000),
            immediate: Some(7),
        },
        &[left_region.slice(0, 100)],
    )?;
    tour.run(
        "RDMA WRITE with immediate",
        write,
        None,
        |tour, completion| {
            let receive = tour.receive_completion();
            let ok = receive.is_some_and(|receive| {
                receive.opcode == CompletionOpcode::ReceiveRdmaWithImmediate
                    && receive.immediate == Some(7)
            });
            (
                success(completion) && ok,
                "data landed, receiver saw immediate 7".into(),
            )
        },
    )?;
    let read = SendRequest::new(
        5,
        SendOperation::Read {
            remote: right_region.remote(0),
        },
        &[left_region.slice(0x20000, BIG_BYTES)],
    )?;
    tour.run("RDMA READ", read, None, |tour, completion| {
        (
            success(completion) && tour.read(false, 0x20000, BIG_BYTES as usize) == big,
            "local copy equals remote".into(),
        )
    })?;
    tour.fabric.right.write_local(
        right_region.lkey,
        at(&right_region, 0x50000),
        &41u64.to_le_bytes(),
    )?;
    let swap = SendRequest::new(
        6,
        SendOperation::CompareSwap {
            remote: right_region.remote(0x50000),
            compare: 41,
            swap: 99,
        },
        &[left_region.slice(0x40000, 8)],
    )?;
    tour.run("CMP_SWAP", swap, None, |tour, completion| {
        let old = tour.read(false, 0x40000, 8) == 41u64.to_le_bytes();
        let new = tour.read(true, 0x50000, 8) == 99u64.to_le_bytes();
        (
            success(completion) && old && new,
            "returned 41, memory now 99".into(),
        )
    })?;
    let add = SendRequest::new(
        7,
        SendOperation::FetchAdd {
            remote: right_region.remote(0x50000),
            add: 1,
        },
        &[left_region.slice(0x40008, 8)],
    )?;
    tour.run("FETCH_ADD", add, None, |tour, completion| {
        let old = tour.read(false, 0x40008, 8) == 99u64.to_le_bytes();
        let new = tour.read(true, 0x50000, 8) == 100u64.to_le_bytes();
        (
            success(completion) && old && new,
            "returned 99, memory now 100".into(),
        )
    })?;
    let write = SendRequest::new(
        8,
        SendOperation::Write {
            remote: right_region.remote(0x60000),
            immediate: None,
        },
        &[left_region.slice(0, BIG_BYTES)],
    )?;
    tour.run(
        "RDMA WRITE, 1 frame in 5 lost",
        write,
        Some(5),
        |tour, completion| {
            (
                success(completion) && tour.read(true, 0x60000, BIG_BYTES as usize) == big,
                "go-back-N delivered it intact".into(),
            )
        },
    )
}

/// The access-violation row, on a pair of its own; returns the row and
/// that pair's counters, which the totals include.
fn tour_violation(
    seed: u64,
    capture: &mut Capture,
) -> Result<(Row, [RnicCounters; 2]), VerbsError> {
    let mut tour = setup(seed, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)?;
    let right_region = tour.right.0;
    let before = tour.read(true, 0, 4096);
    let write = SendRequest::new(
        9,
        SendOperation::Write {
            remote: right_region.remote(0),
            immediate: None,
        },
        &[tour.left.0.slice(0, 4096)],
    )?;
    tour.run(
        "WRITE to a read-only region",
        write,
        None,
        |tour, completion| {
            let unchanged = tour.read(true, 0, 4096) == before;
            (
                completion.status == CompletionStatus::RemoteAccessError && unchanged,
                "NAK remote access error, memory unchanged".into(),
            )
        },
    )?;
    capture.append(std::mem::take(&mut tour.capture));
    let counters = [
        tour.fabric.left.counters().clone(),
        tour.fabric.right.counters().clone(),
    ];
    Ok((tour.rows.pop().expect("one row"), counters))
}

fn print_table(rows: &[Row]) {
    println!(
        "Remora fabric tour: two soft RNICs back to back, path MTU 4096, real RoCEv2 frames\n"
    );
    println!(
        "{:<30} {:>7} {:<19} {:>6} {:>9} {:>7}  check",
        "operation", "bytes", "status", "frames", "wire B", "retx"
    );
    for row in rows {
        let mark = if row.ok { "ok" } else { "FAILED" };
        println!(
            "{:<30} {:>7} {:<19} {:>6} {:>9} {:>7}  {mark}: {}",
            row.operation,
            row.bytes,
            row.status,
            row.frames,
            row.wire_bytes,
            row.retransmitted,
            row.checked
        );
    }
}

/// The files `remora demo` writes besides its table.
pub struct Outputs<'a> {
    pub json: Option<&'a Path>,
    pub pcap: Option<&'a Path>,
    pub history: Option<&'a Path>,
    /// A directory for the HTML report.
    pub report: Option<&'a Path>,
}

pub fn run(outputs: &Outputs<'_>) -> Result<ExitCode, DemoError> {
    // From the start: installed only with the rack step, as before, the
    // steps after it could not be interrupted at all.
    crate::interrupt::handle_interrupts();
    crate::output::check_optional_file_path(outputs.json)?;
    if let Some(directory) = outputs.report {
        crate::output::check_directory_path(directory)?;
    }
    let mut history = outputs
        .history
        .map(crate::HistoryFile::create)
        .transpose()?;
    let mut tour = setup(1, AccessFlags::ALL)?;
    tour_operations(&mut tour)?;
    let mut rows = std::mem::take(&mut tour.rows);
    let (violation, violation_counters) = tour_violation(2, &mut tour.capture)?;
    rows.push(violation);
    if let Some(path) = outputs.pcap {
        tour.capture.write(path)?;
        println!("wrote {} frames to {}", tour.capture.len(), path.display());
    }
    print_table(&rows);
    // Every pair the tour used: the totals add up to the rows and the
    // capture.
    let counters = [
        tour.fabric.left.counters(),
        tour.fabric.right.counters(),
        &violation_counters[0],
        &violation_counters[1],
    ];
    println!(
        "\ntotals: {} frames, {} ACKs sent ({} coalesced away), {} sequence NAKs, {} retransmit timeouts, {} frames dropped",
        counters.iter().map(|c| c.frames_transmitted).sum::<u64>(),
        counters.iter().map(|c| c.acks_sent).sum::<u64>(),
        counters.iter().map(|c| c.acks_coalesced).sum::<u64>(),
        counters.iter().map(|c| c.sequence_naks_sent).sum::<u64>(),
        counters.iter().map(|c| c.retransmit_timeouts).sum::<u64>(),
        counters.iter().map(|c| c.drops_total()).sum::<u64>(),
    );
    let rack = rack_step()?;
    let mut rack_failures = rack.failures();
    // Every system the command line knows takes its turn.
    let mut steps = serde_json::Map::new();
    // An interrupt ends the tour, and what ran is still written and
    // reported (it returned at once, and --json and --report had nothing).
    let mut not_run = Vec::new();
    for system in crate::systems::SYSTEMS {
        if !not_run.is_empty() || crate::interrupt::interrupted() {
            not_run.push(system.name());
            continue;
        }
        let step = system.demo_step(history.as_mut())?;
        rack_failures.extend(step.failures.iter().cloned());
        steps.insert(system.name().into(), serde_json::json!(step));
    }
    if let Some(file) = history {
        println!("{}", file.finish()?);
    }
    if let Some(first) = not_run.first() {
        println!("interrupted: the {first} step and those after it not run");
    }
    let failed = rows.iter().filter(|row| !row.ok).count() + rack_failures.len();
    let mut summary = serde_json::json!({
        "rows": rows,
        "rack": rack,
        "failed": failed,
        "interrupted": !not_run.is_empty(),
        "not_run": not_run,
    });
    summary.as_object_mut().expect("an object").extend(steps);
    if let Some(path) = outputs.json {
        crate::output::write_json(path, &summary)?;
    }
    if let Some(directory) = outputs.report {
        let html = remora_report::page::demo_page(&summary, &remora_report::utc_now())
            .map_err(remora_report::ReportError::from)?;
        let page = remora_report::write_page(directory, &html)?;
        println!("wrote the demo's report to {}", page.display());
    }
    if failed > 0 {
        println!("\n{failed} checks FAILED");
        for failure in rack_failures {
            println!("  {failure}");
        }
    }
    if !not_run.is_empty() {
        return Ok(ExitCode::from(crate::interrupt::INTERRUPTED_EXIT));
    }
    if failed > 0 {
        return Ok(ExitCode::FAILURE);
    }
    println!(
        "\nall {} operations checked, and the rack's workload, {} passed",
        rows.len(),
        in_prose(&crate::systems::titles())
    );
    Ok(ExitCode::SUCCESS)
}

/// The same RDMA, now on the embedded rack: a compute and a memory node
/// behind the L2/L3 switch on in-process rings, connected over the control
/// channel, running a checked mix of every operation.
fn rack_step() -> Result<remora_rack::RackReport, DemoError> {
    let rack =
        remora_rack::RackConfig::parse(include_str!("../../../examples/rack-two-nodes.toml"))?;
    let options = remora_rack::LaunchOptions {
        mode: remora_rack::Mode::Embedded,
        carrier: remora_rack::CarrierKind::Shm,
        capture: None,
        executable: std::env::current_exe().map_err(DemoError::Executable)?,
    };
    println!("\nthe embedded rack (examples/rack-two-nodes.toml):");
    let report = remora_rack::launch::rack_up(&rack, &options, crate::interrupt::stop_flag())?;
    print!("{report}");
    Ok(report)
}

/// "A", "A and B", "A, B and C".
fn in_prose(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [only] => (*only).to_owned(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}
