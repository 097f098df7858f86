//! `remora demo`: a tour of the fabric. Two soft RNICs, wired back to back,
//! run every RC operation; each result is checked, not just reported.

use crate::capture::Capture;
use crate::error::{DemoError, InSystem, SystemError};
use remora_rnic::back_to_back::{BackToBack, Verdict};
use remora_rnic::*;
use remora_sim::Probability;
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

pub fn run(
    json: Option<&Path>,
    pcap: Option<&Path>,
    history: Option<&Path>,
) -> Result<ExitCode, DemoError> {
    let mut history = history.map(crate::HistoryFile::create).transpose()?;
    let mut tour = setup(1, AccessFlags::ALL)?;
    tour_operations(&mut tour)?;
    let mut rows = std::mem::take(&mut tour.rows);
    let (violation, violation_counters) = tour_violation(2, &mut tour.capture)?;
    rows.push(violation);
    if let Some(path) = pcap {
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
    for system in crate::systems::SYSTEMS {
        let step = system.demo_step(history.as_mut())?;
        rack_failures.extend(step.failures.iter().cloned());
        steps.insert(system.name().into(), serde_json::json!(step));
    }
    if let Some(file) = history {
        println!("{}", file.finish()?);
    }
    let failed = rows.iter().filter(|row| !row.ok).count() + rack_failures.len();
    if let Some(path) = json {
        let mut summary = serde_json::json!({ "rows": rows, "rack": rack, "failed": failed });
        summary.as_object_mut().expect("an object").extend(steps);
        crate::write_json(path, &summary)?;
    }
    if failed > 0 {
        println!("\n{failed} checks FAILED");
        for failure in rack_failures {
            println!("  {failure}");
        }
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
        rack_file: "examples/rack-two-nodes.toml".into(),
    };
    println!("\nthe embedded rack (examples/rack-two-nodes.toml):");
    let report = remora_rack::launch::rack_up(&rack, &options, crate::rack::stop_flag())?;
    print!("{report}");
    Ok(report)
}

/// One system's step of the demo: what ran, and what failed its check.
#[derive(serde::Serialize)]
pub struct SystemStep {
    pub variants: Vec<serde_json::Value>,
    pub failures: Vec<String>,
}

/// Cowbird's memory host crashes mid-run and comes back, through one
/// scenario run in the simulator and on the embedded rack.
fn crash_step(step: &mut SystemStep) {
    use remora_cowbird::scenario::{memory_crash, CrashOutcome, CrashPlan, ScenarioError};
    use remora_cowbird::simulated::{topology, Workload};
    use remora_rack::scenario::SimulatedStage;
    use std::time::Duration;
    println!("\nCowbird's memory host crashes after 400 requests and restarts (one scenario, both modes):");
    let workload = Workload {
        p4: remora_cowbird::embedded::embedded_p4_config(),
        ..Workload::new(remora_sim::LinkFaults::NONE)
    };
    let report = |mode: &str,
                  result: Result<CrashOutcome, ScenarioError>,
                  step: &mut SystemStep| {
        match result {
            Ok(outcome) => {
                println!(
                "  {mode:<9} {} requests completed once, pool equal to the models: yes (engine restarted {}, {} queue pairs reconnected)",
                outcome.completed, outcome.engine_restarts, outcome.compute_reconnects
            );
                step.variants.push(serde_json::json!({
                    "variant": format!("memory crash, {mode}"),
                    "completed": outcome.completed,
                    "compute_reconnects": outcome.compute_reconnects,
                }));
            }
            Err(error) => step
                .failures
                .push(format!("Cowbird memory crash, {mode}: {error}")),
        }
    };
    let plan = |down_for, limit, hold_issuing| CrashPlan {
        after_completed: 400,
        down_for,
        hold_issuing,
        limit,
    };
    let stage = SimulatedStage::new(1, &topology(), 0xc0b);
    let simulated = memory_crash(
        stage,
        1,
        &workload,
        plan(Duration::from_micros(500), Duration::from_secs(2), false),
    );
    report("simulated", simulated, step);
    let topology = topology();
    let embedded = remora_rack::assembly::RackBuilder::new(&topology)
        .thread_name("demo-crash")
        .build()
        .map_err(ScenarioError::from)
        .and_then(|stage| {
            memory_crash(
                stage,
                1,
                &workload,
                plan(Duration::from_millis(20), Duration::from_secs(60), true),
            )
        });
    report("embedded", embedded, step);
}

/// Clover in the simulator, over links losing 2% of frames: 8 clients on
/// 16 hot keys, plain and with the resolver. Every key's history goes
/// through stateright's linearizability checker, and every version list
/// is audited whole.
pub fn clover_step(
    mut history: Option<&mut crate::HistoryFile>,
) -> Result<SystemStep, SystemError> {
    use remora_clover::simulated::{run, Run, SwitchChoice};
    println!("\nClover in the simulator (8 clients, 16 keys, YCSB-A zipf 0.99, 2% loss):");
    let mut step = SystemStep {
        variants: Vec::new(),
        failures: Vec::new(),
    };
    for (name, switch) in [
        ("plain Clover", SwitchChoice::Plain),
        (
            "with the resolver",
            SwitchChoice::Resolver { cached_keys: 16 },
        ),
    ] {
        let configuration = Run {
            clients: 8,
            keys: 16,
            operations: 400,
            zipf_theta: Some(0.99),
            faults: remora_sim::LinkFaults {
                loss: Probability::literal(0.02),
                duplicate: Probability::literal(0.01),
                reorder: Probability::literal(0.02),
                reorder_delay: std::time::Duration::from_micros(20),
                corrupt: Probability::literal(0.0),
            },
            check_history: true,
            ..Run::new(switch)
        };
        let outcome = run(1, &configuration).in_system("clover")?;
        if let Some(file) = history.as_deref_mut() {
            file.write(&format!("demo/{name}"), &outcome)
                .in_system("clover")?;
        }
        let verdict = outcome
            .verdict
            .clone()
            .ok_or_else(|| crate::HistoryFileError::NoHistory(format!("demo/{name}")))
            .in_system("clover")?;
        let operations = (outcome.stats.reads + outcome.stats.writes) as f64;
        println!(
            "  {name:<18} {:>8.0} ops/s (simulated)  conflicts/op {:.2}  {} operations linearizable on {} keys: {}  versions audited whole: {}",
            outcome.operations_per_second(),
            outcome.stats.conflicts as f64 / operations,
            verdict.operations,
            verdict.keys,
            if verdict.violations.is_empty() { "yes" } else { "NO" },
            outcome.versions,
        );
        if !verdict.violations.is_empty() {
            step.failures.push(format!(
                "Clover {name}: keys {:?} not linearizable",
                verdict.violations
            ));
        }
        step.variants.push(serde_json::json!({
            "variant": name,
            "operations_per_second_simulated": outcome.operations_per_second(),
            "conflicts": outcome.stats.conflicts,
            "operations": verdict.operations,
            "violations": verdict.violations,
            "versions": outcome.versions,
            "resolver": outcome.resolver,
        }));
    }
    Ok(step)
}

/// Cowbird: checked histories through the Spot engine and through
/// Cowbird-P4 in the simulator at 1% loss, then the hash-table probe on
/// the embedded rack, batched one-sided READs against the client library
/// with the Spot engine and with Cowbird-P4, every record checked as it
/// arrives.
pub fn cowbird_step(_history: Option<&mut crate::HistoryFile>) -> Result<SystemStep, SystemError> {
    use remora_cowbird::embedded::{run_variant, ProbeBench, Variant};
    use remora_cowbird::hash_table::TableSpec;
    use remora_cowbird::simulated::{run, Engine, Workload};
    let mut step = SystemStep {
        variants: Vec::new(),
        failures: Vec::new(),
    };
    println!("\nCowbird in the simulator (3 threads, mixed async reads and writes, 1% loss):");
    let faults = remora_cowbird::simulated::lossy(Probability::literal(0.01));
    for engine in [Engine::Spot, Engine::P4] {
        let workload = Workload {
            engine,
            ..Workload::new(faults)
        };
        match run(1, &workload) {
            Ok(outcome) => {
                let recovery = match outcome.switch_engine {
                    Some(p4) => format!(
                        "{} go-backs, {} packets sent again",
                        p4.go_backs, p4.retransmitted
                    ),
                    None => format!(
                        "{} retransmissions, {} responses packed into {} WRITEs",
                        outcome.retransmissions,
                        outcome.engine.reads,
                        outcome.engine.response_writes
                    ),
                };
                println!(
                    "  {engine:?}: {} requests completed once and in order, {} reads allowed by the model, pool equal to the model: yes ({recovery})",
                    outcome.completed, outcome.reads_checked,
                );
                step.variants.push(serde_json::json!({
                    "variant": format!("simulated {engine:?}, 1% loss"),
                    "completed": outcome.completed,
                    "reads_checked": outcome.reads_checked,
                }));
            }
            Err(error) => step
                .failures
                .push(format!("Cowbird {engine:?} in the simulator: {error}")),
        }
    }
    crash_step(&mut step);
    println!("\nthe hash-table probe on the embedded rack (64 B records, 95% remote, 0.3 s each):");
    let bench = ProbeBench::new(TableSpec::DEFAULT, std::time::Duration::from_millis(300));
    for variant in [Variant::Async, Variant::Spot, Variant::P4] {
        match run_variant(&bench, variant, 1) {
            Ok(outcome) => {
                println!(
                    "  {:<6} {:>9.0} probes/s, {} remote records fetched and checked",
                    variant.name(),
                    outcome.operations_per_second(),
                    outcome.remote_operations,
                );
                step.variants.push(serde_json::json!({
                    "variant": variant.name(),
                    "operations_per_second": outcome.operations_per_second(),
                    "remote_operations": outcome.remote_operations,
                }));
            }
            Err(error) => step
                .failures
                .push(format!("Cowbird {}: {error}", variant.name())),
        }
    }
    Ok(step)
}

/// SODA: BFS on a small Kronecker graph whose arrays live in far-memory
/// objects (userfaultfd, a host buffer of a third of the graph), checked
/// against all-local memory.
pub fn soda_step() -> Result<SystemStep, SystemError> {
    use remora_graph::apps::App;
    use remora_soda::backend::{run_on, Backend, RunOptions};
    let mut step = SystemStep {
        variants: Vec::new(),
        failures: Vec::new(),
    };
    let graph = crate::soda::graph_from("kron:14:8", 1, Default::default()).in_system("soda")?;
    println!(
        "\nSODA: BFS on a Kronecker graph ({} vertices, {} edges) in far memory, host buffer a third of it:",
        graph.vertex_count(),
        graph.edge_count()
    );
    let work = tempfile::tempdir()
        .map_err(crate::soda::SodaCliError::WorkDirectory)
        .in_system("soda")?;
    let options = RunOptions {
        chunk_bytes: 16 << 10,
        ..RunOptions::new(work.path().to_owned(), crate::soda::default_source(&graph))
    };
    let run = |backend| run_on(backend, App::Bfs, &graph, &options).in_system("soda");
    let local = run(Backend::Local)?;
    for backend in [
        Backend::InProcess,
        Backend::File,
        Backend::MemServer,
        Backend::Dpu(remora_soda::backend::DpuVariant::Static),
    ] {
        let far = run(backend)?;
        let agrees = far.result.compare(&local.result);
        let stats = far.far.clone().unwrap_or_default();
        println!(
            "  {:<10} {:.3} s, {} faults, {} evictions, depths equal to local memory: {}",
            backend.name(),
            far.seconds,
            stats.missing_faults,
            stats.evictions,
            if agrees.is_ok() { "yes" } else { "NO" }
        );
        if let Err(mismatch) = agrees {
            step.failures
                .push(format!("SODA BFS on {}: {mismatch}", backend.name()));
        }
        step.variants.push(serde_json::json!({
            "variant": format!("bfs, {}", backend.name()),
            "seconds": far.seconds,
            "faults": stats.missing_faults,
            "evictions": stats.evictions,
        }));
    }
    Ok(step)
}

/// "A", "A and B", "A, B and C".
fn in_prose(names: &[&str]) -> String {
    match names {
        [] => String::new(),
        [only] => (*only).to_owned(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// Bifröst, as far as it is built: the DSM over three memory nodes on the
/// embedded rack (data through every node, misuse refused), and the RPC
/// runtime's exactly-once calls over lossy links in the simulator.
pub fn bifrost_step() -> Result<SystemStep, SystemError> {
    use remora_bifrost::dsm::client::DsmError;
    use remora_bifrost::dsm::rack::{DsmRack, DsmRackConfig};
    use remora_bifrost::rpc::scenario::exactly_once;
    let mut step = SystemStep {
        variants: Vec::new(),
        failures: Vec::new(),
    };
    println!(
        "\nBifröst's global memory on the embedded rack (a compute node, three memory nodes):"
    );
    let rack = DsmRack::start(DsmRackConfig::default()).in_system("bifrost")?;
    let dsm = &rack.dsm;
    let mut round_trips = 0;
    for index in 0..dsm.node_count() as u8 {
        let data = vec![index + 1; 100_000];
        let ptr = dsm.alloc(data.len() as u64).in_system("bifrost")?;
        dsm.write(ptr, &data).in_system("bifrost")?;
        let mut back = vec![0u8; data.len()];
        dsm.read(ptr, &mut back).in_system("bifrost")?;
        if back == data {
            round_trips += 1;
        } else {
            step.failures
                .push(format!("DSM: node {} returned other bytes", ptr.node));
        }
        dsm.free(ptr).in_system("bifrost")?;
        if !matches!(dsm.free(ptr), Err(DsmError::DoubleFree(_))) {
            step.failures
                .push("DSM: a double free was not refused".into());
        }
    }
    println!("  100 kB written and read back on {round_trips} of 3 nodes; double frees refused");
    step.variants
        .push(serde_json::json!({ "variant": "dsm", "nodes_round_tripped": round_trips }));
    let faults = remora_sim::LinkFaults {
        loss: Probability::literal(0.1),
        duplicate: Probability::literal(0.05),
        ..remora_sim::LinkFaults::NONE
    };
    match exactly_once(7, faults, 300) {
        Ok(outcome) => {
            println!(
                "  RPC in the simulator, 10% loss and 5% duplication: {} calls ran exactly once ({} retransmissions, {} duplicates answered from the reply kept)",
                outcome.executed, outcome.retransmissions, outcome.duplicates
            );
            step.variants.push(serde_json::json!({
                "variant": "rpc exactly once",
                "calls": outcome.calls,
                "retransmissions": outcome.retransmissions,
                "duplicates": outcome.duplicates,
            }));
        }
        Err(error) => step.failures.push(format!("Bifröst RPC: {error}")),
    }
    let middle_crash = remora_bifrost::rpc::scenario::MiddleCrash {
        after_answers: 120,
        down_for: std::time::Duration::from_millis(1),
    };
    match remora_bifrost::rpc::scenario::chain(5, faults, 300, Some(middle_crash)) {
        Ok(outcome) => {
            println!(
                "  a chain A calls B calls C over the same links, B crashing after 120 answers and restarting 1 ms later with nothing kept: {} calls from A took effect once each at C ({} + {} resends on the two hops, {} + {} duplicates dropped)",
                outcome.calls,
                outcome.head_retransmissions,
                outcome.middle_retransmissions,
                outcome.duplicates_at_middle,
                outcome.duplicates_at_tail
            );
            step.variants.push(serde_json::json!({
                "variant": "chain of three services, the middle crashing",
                "calls": outcome.calls,
                "executed_at_tail": outcome.executed_at_tail,
            }));
        }
        Err(error) => step.failures.push(format!("Bifröst chain: {error}")),
    }
    match remora_bifrost::rpc::scenario::failover(
        11,
        faults,
        2000,
        800,
        std::time::Duration::from_millis(1),
    ) {
        Ok(outcome) => {
            println!(
                "  the Gatekeeper in the switch, the serving node crashed after 800 answers: found silent {:.0} us later by its missed heartbeats, {} calls held, a spare restored from its checkpoint of {} calls took over and the switch replayed {} calls to it; {} calls, each took effect once",
                outcome.detection_time.as_nanos() as f64 / 1e3,
                outcome.held,
                outcome.checkpoint_covers,
                outcome.replayed,
                outcome.calls
            );
            step.variants.push(serde_json::json!({
                "variant": "gatekeeper failover",
                "calls": outcome.calls,
                "held": outcome.held,
                "replayed": outcome.replayed,
                "detection_us": outcome.detection_time.as_nanos() as f64 / 1e3,
                "checkpoint_covers": outcome.checkpoint_covers,
            }));
        }
        Err(error) => step.failures.push(format!("Bifröst failover: {error}")),
    }
    match remora_bifrost::rpc::scenario::caller_crash(
        13,
        faults,
        400,
        150,
        std::time::Duration::from_micros(400),
    ) {
        Ok(outcome) => {
            println!(
                "  the head caller crashed after {} outcomes and came back from the checkpoint its calls carried ({} outcomes, {} calls unanswered, resent): {} calls, each ran once",
                outcome.delivered_at_crash,
                outcome.delivered_in_checkpoint,
                outcome.resent_after_restore,
                outcome.calls
            );
            step.variants.push(serde_json::json!({
                "variant": "head caller crash",
                "calls": outcome.calls,
                "executed": outcome.executed,
                "resent_after_restore": outcome.resent_after_restore,
            }));
        }
        Err(error) => step.failures.push(format!("Bifröst caller crash: {error}")),
    }
    println!("  (the Gatekeeper's ACL on DSM accesses is not built yet)");
    Ok(step)
}

/// TIGA: MVS through the SmartNIC's NDP engine on the embedded rack,
/// checked against the CN version, and one short virtual-time run of the
/// allocator on calibrated costs.
pub fn tiga_step() -> Result<SystemStep, SystemError> {
    use remora_tiga::apps::App;
    use remora_tiga::rack::{build_data, Mode, NdpRack, ServedBy};
    let mut step = SystemStep {
        variants: Vec::new(),
        failures: Vec::new(),
    };
    println!("\nTIGA's near-data processing on the embedded rack (a compute node, a data node's SmartNIC):");
    const RECORDS: u64 = 64;
    const SEED: u64 = 3;
    let (memory, locations) = build_data(SEED, RECORDS, 1024).in_system("tiga")?;
    let rack = NdpRack::start(memory, &App::ALL, 8).in_system("tiga")?;
    let (mut on_nic, mut forwarded, mut matched) = (0u64, 0u64, 0u64);
    for location in locations.iter().filter(|location| location.app == App::Mvs) {
        let payload = App::Mvs
            .make_payload(SEED, location.id, 1024)
            .in_system("tiga")?;
        let expected = App::Mvs.run_on_cpu(&payload);
        match rack.call(App::Mvs, location.address, location.length, Mode::Ndp) {
            Ok(completion) => {
                match completion.served_by {
                    ServedBy::SmartNic => on_nic += 1,
                    _ => forwarded += 1,
                }
                if Ok(&completion.result) == expected.as_ref() {
                    matched += 1;
                } else {
                    step.failures.push(format!(
                        "TIGA: MVS record {} differs from the CN version",
                        location.id
                    ));
                }
            }
            Err(error) => step
                .failures
                .push(format!("TIGA: MVS record {}: {error}", location.id)),
        }
    }
    let (counters, unacknowledged) = rack.settled_counters(std::time::Duration::from_secs(5));
    if unacknowledged > 0 || counters.forwarded != counters.acknowledged {
        step.failures.push(format!(
            "TIGA: {unacknowledged} forwarded requests never acknowledged"
        ));
    }
    println!(
        "  {matched} of {RECORDS} MVS queries match the CN version: {on_nic} ran on the SmartNIC (CRC check, serialisation), {forwarded} were forwarded to the CN and acknowledged"
    );
    step.variants.push(serde_json::json!({
        "variant": "ndp on the rack", "queries": RECORDS, "matched": matched, "on_smartnic": on_nic, "forwarded": forwarded,
    }));
    allocation_run(&mut step)?;
    Ok(step)
}

/// Half a virtual second of MVS at 1.3 times the SoC's capacity: TIGA's
/// allocator against the even split, on costs calibrated here.
fn allocation_run(step: &mut SystemStep) -> Result<(), SystemError> {
    use remora_tiga::apps::App;
    use remora_tiga::calibration::{soc_stage_costs_ns, Calibration};
    use remora_tiga::config::SocConfig;
    use remora_tiga::simulation::{run, PayloadSchedule, Scheme, Workload};
    let calibration = Calibration::measure(5).in_system("tiga")?;
    let config = SocConfig::default();
    let per_request_ns: f64 = soc_stage_costs_ns(&calibration, App::Mvs, config.slowdown)
        .iter()
        .sum();
    let workload = Workload {
        apps: vec![App::Mvs],
        offered_per_second: 1.3 * config.soc_cores as f64 * 1e9 / per_request_ns,
        payload: PayloadSchedule::Fixed(1024),
        duration_ns: 500_000_000,
        measure_from_ns: 250_000_000,
        host_cpu_for_ipipe: false,
        seed: 1,
    };
    let tiga = run(Scheme::TigaWithoutCpu, &workload, &config, &calibration).in_system("tiga")?;
    let fair = run(Scheme::FairNic, &workload, &config, &calibration).in_system("tiga")?;
    let ratio = tiga.throughput_per_second / fair.throughput_per_second;
    println!(
        "  virtual time, 8 SoC cores at 1/{:.1} of this core: TIGA moved the split from {:?} to {:?} and serves {:.2} M/s, {ratio:.2}x FairNIC's even split",
        config.slowdown,
        fair.final_allocation,
        tiga.final_allocation,
        tiga.throughput_per_second / 1e6
    );
    if tiga.final_allocation == fair.final_allocation {
        step.failures
            .push("TIGA: the allocator never left the even split under overload".into());
    }
    step.variants.push(serde_json::json!({
        "variant": "virtual-time allocation", "allocation": tiga.final_allocation, "tiga_over_fairnic": ratio,
    }));
    Ok(())
}
