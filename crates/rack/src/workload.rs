//! The compute nodes' workload on `rack up`: connect to every memory node
//! over the control channel, then run a random, checked mix of WRITE,
//! READ, SEND, FETCH_ADD and CMP_SWAP. A local model of each window of
//! remote memory predicts every READ and atomic result, so a wrong byte
//! anywhere between the two RNICs (carriers, switch) fails the run.

use crate::config::NodeConfig;
use crate::control::{self, ControlAddress};
use crate::endpoint::{lock, rack_queue_pair, DriverKicker, NodeEndpoint, Shared};
use crate::report::WorkloadReport;
use crate::RackError;
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use remora_rnic::*;
use remora_wire::VirtAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How long one operation may take before the run fails.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes of each memory node's region reserved per compute node for its
/// atomics counter, after its data window.
const COUNTER_BYTES: u64 = 8;
const MAX_SEND_BYTES: u32 = 256;

/// One memory node as the workload sees it.
pub struct Target {
    pub name: String,
    pub control: ControlAddress,
}

struct Connection {
    name: String,
    queue_pair: QueuePair,
    region: control::RegionMessage,
    window_base: u64,
    model: Vec<u8>,
    counter: u64,
}

/// Where this compute node's window starts in every memory region:
/// compute nodes split each region evenly, so their models never overlap.
pub struct Placement {
    pub compute_index: u64,
    pub compute_count: u64,
}

struct Local {
    region: MemoryRegion,
    cq: CompletionQueue,
    max_bytes: u32,
}

impl Local {
    fn write_source(&self, length: u32) -> ScatterGatherElement {
        self.region.slice(0, length)
    }

    fn read_target(&self, length: u32) -> ScatterGatherElement {
        self.region.slice(u64::from(self.max_bytes), length)
    }

    fn atomic_target(&self) -> ScatterGatherElement {
        self.region.slice(2 * u64::from(self.max_bytes), 8)
    }
}

pub fn run(
    endpoint: &Shared<NodeEndpoint>,
    kicker: &DriverKicker,
    node: &NodeConfig,
    targets: &[Target],
    placement: Placement,
    stop: &AtomicBool,
) -> Result<WorkloadReport, RackError> {
    let workload = node.workload;
    let (local, builder) = {
        let mut guard = lock(endpoint);
        let rnic = &mut guard.rnic;
        let pd = rnic.alloc_protection_domain()?;
        let region = rnic.register_memory(pd, node.memory_bytes, AccessFlags::ALL)?;
        let cq = rnic.create_completion_queue(1024)?;
        (
            Local {
                region,
                cq,
                max_bytes: workload.max_bytes,
            },
            rack_queue_pair(pd, cq),
        )
    };
    let mut connections = Vec::with_capacity(targets.len());
    for target in targets {
        connections.push(connect(
            endpoint, kicker, node, &builder, target, &placement, stop,
        )?);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(workload.seed ^ u64::from(node.port));
    let mut latency =
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds");
    let mut report = WorkloadReport {
        targets: targets.iter().map(|target| target.name.clone()).collect(),
        ..WorkloadReport::default()
    };
    let started = Instant::now();
    for _ in 0..workload.operations {
        for connection in &mut connections {
            if stop.load(Ordering::Relaxed) {
                // Reported as a failed data check, it read as corruption.
                return Err(RackError::Stopped("the workload"));
            }
            let begun = Instant::now();
            one_operation(
                endpoint,
                kicker,
                &local,
                connection,
                (&mut rng, stop),
                &mut report,
            )?;
            latency.saturating_record(begun.elapsed().as_nanos() as u64);
        }
    }
    report.elapsed_seconds = started.elapsed().as_secs_f64();
    report.operations_per_second = report.operations as f64 / report.elapsed_seconds.max(1e-9);
    report.latency_p50_us = latency.value_at_quantile(0.5) as f64 / 1000.0;
    report.latency_p99_us = latency.value_at_quantile(0.99) as f64 / 1000.0;
    Ok(report)
}

fn connect(
    endpoint: &Shared<NodeEndpoint>,
    kicker: &DriverKicker,
    node: &NodeConfig,
    builder: &QueuePairBuilder,
    target: &Target,
    placement: &Placement,
    stop: &AtomicBool,
) -> Result<Connection, RackError> {
    let (queue_pair, region) =
        control::connect_queue_pair(endpoint, kicker, &node.name, builder, &target.control, stop)?;
    // Eight-byte aligned, so every compute node's atomics counter is too.
    let share = (region.length_bytes / placement.compute_count) & !7;
    let window = (share.saturating_sub(COUNTER_BYTES) & !7).min(crate::config::MAX_WINDOW_BYTES);
    if window < u64::from(node.workload.max_bytes) {
        return Err(RackError::Workload(format!(
            "{}'s region leaves {window} B per compute node, less than max_bytes {}",
            target.name, node.workload.max_bytes
        )));
    }
    Ok(Connection {
        name: target.name.clone(),
        queue_pair,
        region,
        window_base: placement.compute_index * share,
        model: vec![0; window as usize],
        counter: 0,
    })
}

fn one_operation(
    endpoint: &Shared<NodeEndpoint>,
    kicker: &DriverKicker,
    local: &Local,
    connection: &mut Connection,
    (rng, stop): (&mut ChaCha8Rng, &AtomicBool),
    report: &mut WorkloadReport,
) -> Result<(), RackError> {
    let window = connection.model.len() as u64;
    let length = rng.gen_range(1..=local.max_bytes);
    let offset = rng.gen_range(0..=window - u64::from(length));
    let remote = connection.region.remote(connection.window_base + offset);
    let counter = connection.region.remote(connection.window_base + window);
    report.operations += 1;
    match rng.gen_range(0..10) {
        0..=3 => {
            let bytes: Vec<u8> = (0..length).map(|_| rng.gen()).collect();
            lock(endpoint)
                .rnic
                .write_local(local.region.lkey, local.region.address, &bytes)?;
            execute(
                (endpoint, kicker, stop),
                local,
                connection,
                SendOperation::Write {
                    remote,
                    immediate: None,
                },
                local.write_source(length),
            )?;
            connection.model[offset as usize..][..length as usize].copy_from_slice(&bytes);
            report.writes += 1;
            report.payload_bytes += u64::from(length);
        }
        4..=6 => {
            execute(
                (endpoint, kicker, stop),
                local,
                connection,
                SendOperation::Read { remote },
                local.read_target(length),
            )?;
            let mut bytes = vec![0u8; length as usize];
            lock(endpoint).rnic.read_local(
                local.region.lkey,
                VirtAddr(local.region.address.0 + u64::from(local.max_bytes)),
                &mut bytes,
            )?;
            if bytes != connection.model[offset as usize..][..length as usize] {
                return Err(RackError::Workload(format!(
                    "READ of {length} B at {offset} from {} differs from what was written",
                    connection.name
                )));
            }
            report.reads += 1;
            report.checked_results += 1;
            report.payload_bytes += u64::from(length);
        }
        7 => {
            let length = length.min(MAX_SEND_BYTES);
            execute(
                (endpoint, kicker, stop),
                local,
                connection,
                SendOperation::Send { immediate: None },
                local.write_source(length),
            )?;
            report.sends += 1;
            report.payload_bytes += u64::from(length);
        }
        _ => {
            let (operation, next) = if rng.gen_bool(0.5) {
                let add = rng.gen_range(1..1000);
                (
                    SendOperation::FetchAdd {
                        remote: counter,
                        add,
                    },
                    connection.counter.wrapping_add(add),
                )
            } else {
                let swap = rng.gen();
                (
                    SendOperation::CompareSwap {
                        remote: counter,
                        compare: connection.counter,
                        swap,
                    },
                    swap,
                )
            };
            execute(
                (endpoint, kicker, stop),
                local,
                connection,
                operation,
                local.atomic_target(),
            )?;
            let mut original = [0u8; 8];
            lock(endpoint).rnic.read_local(
                local.region.lkey,
                VirtAddr(local.region.address.0 + 2 * u64::from(local.max_bytes)),
                &mut original,
            )?;
            if u64::from_le_bytes(original) != connection.counter {
                return Err(RackError::Workload(format!(
                    "atomic on {} returned {} where the model holds {}",
                    connection.name,
                    u64::from_le_bytes(original),
                    connection.counter
                )));
            }
            connection.counter = next;
            report.atomics += 1;
            report.checked_results += 1;
        }
    }
    Ok(())
}

/// Posts one request and waits for its completion.
fn execute(
    (endpoint, kicker, stop): (&Shared<NodeEndpoint>, &DriverKicker, &AtomicBool),
    local: &Local,
    connection: &Connection,
    operation: SendOperation,
    element: ScatterGatherElement,
) -> Result<(), RackError> {
    let request = SendRequest::new(1, operation, &[element])?;
    lock(endpoint)
        .rnic
        .post_send(connection.queue_pair, request)?;
    kicker.kick();
    let poll = || Ok(lock(endpoint).rnic.poll_completion(local.cq)?);
    wait_for_completion(poll, stop, OPERATION_TIMEOUT, &connection.name)
}

/// Waits for the completion `poll` finds, up to `timeout`, or until
/// `stop` is raised: Ctrl-C, or a fabric that ended (a workload beside a
/// failed fabric ends at once, not after waiting out its operation).
fn wait_for_completion(
    mut poll: impl FnMut() -> Result<Option<WorkCompletion>, RackError>,
    stop: &AtomicBool,
    timeout: Duration,
    peer: &str,
) -> Result<(), RackError> {
    let started = Instant::now();
    let mut spins = 0u32;
    loop {
        if let Some(completion) = poll()? {
            if completion.status != CompletionStatus::Success {
                return Err(RackError::Workload(format!(
                    "{:?} to {peer} completed with {:?}",
                    completion.opcode, completion.status
                )));
            }
            return Ok(());
        }
        if stop.load(Ordering::Relaxed) {
            return Err(RackError::Stopped("the workload"));
        }
        if started.elapsed() > timeout {
            return Err(RackError::Workload(format!(
                "no completion from {peer} within {timeout:?}"
            )));
        }
        // Spin briefly, then yield, so the driver gets the lock and a core.
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An operation waiting on a peer or fabric that is gone waited out
    /// its whole timeout (10 s) after Ctrl-C or the fabric's end, and then
    /// failed as a data check ("no completion"): it stops at once now.
    #[test]
    fn a_stopped_workload_does_not_wait_out_an_operation() {
        let stop = AtomicBool::new(true);
        let started = Instant::now();
        let waited = wait_for_completion(|| Ok(None), &stop, Duration::from_secs(10), "memory0");
        assert!(matches!(waited, Err(RackError::Stopped(_))), "{waited:?}");
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
