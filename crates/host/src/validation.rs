//! A hardware profile checked against the published measurements it
//! cites: microbenchmarks in the simulator (two hosts on one cable, the
//! setup such measurements use), each beside the published figure.
//!
//! Each mirrors the published setup it is checked against:
//!
//! - `read_latency_us`: one 8 B READ at a time, post to completion, median
//!   (what `ib_read_lat` reports);
//! - `write_latency_us`: one 8 B WRITE at a time, from post until the
//!   responder's program sees the bytes in its memory, median (one way:
//!   what `ib_write_lat`'s half round trip of a WRITE ping-pong reports);
//! - `read_rate_mops` / `write_rate_mops`: 8 B READs or WRITEs over 20
//!   queue pairs with 18 outstanding on each (360 in all), completions per
//!   second;
//! - `same_address_atomic_rate_mops`: COMPARE_SWAPs to one 8-byte address
//!   over the same 20 queue pairs, completions per second.

use crate::agent::{Agent, AgentError, Progress};
use crate::hardware::HardwareProfile;
use crate::Host;
use remora_base::{PortId, Timestamp};
use remora_rnic::{
    AccessFlags, CompletionQueue, CompletionStatus, MemoryRegion, ProtectionDomain, QueuePair,
    QueuePairBuilder, RemoteAddress, RnicConfig, SendOperation, SendRequest, Verbs,
};
use remora_sim::{LinkConfig, LinkFaults, Simulation};
use remora_wire::{Ipv4Address, MacAddress};
use std::time::Duration;

/// Bytes each READ and WRITE moves.
const MESSAGE_BYTES: u32 = 8;
/// Operations a latency run times.
const LATENCY_OPERATIONS: u64 = 2_000;
/// Operations a rate run completes.
const RATE_OPERATIONS: u64 = 200_000;
/// Queue pairs of a rate run, and operations outstanding on each: the
/// published rate measurements' 360 outstanding over 20 queue pairs.
const RATE_QUEUE_PAIRS: usize = 20;
const RATE_WINDOW: usize = 18;
/// The relative error a profile may have against a published figure.
pub const MAX_RELATIVE_ERROR: f64 = 0.15;

/// The microbenchmarks a profile may be validated with, and the unit
/// each measures in.
pub const MEASURES: [(&str, &str); 5] = [
    ("read_latency_us", "us"),
    ("write_latency_us", "us"),
    ("read_rate_mops", "Mops"),
    ("write_rate_mops", "Mops"),
    ("same_address_atomic_rate_mops", "Mops"),
];

/// The unit `measure` is in; `None` for a measure no microbenchmark runs.
pub fn unit_of(measure: &str) -> Option<&'static str> {
    MEASURES
        .iter()
        .find(|(known, _)| *known == measure)
        .map(|(_, unit)| *unit)
}

/// What a microbenchmark does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Operation {
    Read,
    Write,
    CompareSwapOneAddress,
}

/// One microbenchmark's figure beside the published one.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Checked {
    pub measure: String,
    pub simulated: f64,
    pub published: f64,
    pub unit: String,
    pub source: String,
    pub relative_error: f64,
}

/// Why a profile could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum ValidationError {
    #[error("profile {profile}: no microbenchmark measures {measure:?}")]
    UnknownMeasure { profile: String, measure: String },
    #[error("setting up the microbenchmark: {0}")]
    Setup(#[from] remora_rnic::VerbsError),
    #[error(transparent)]
    Profile(#[from] crate::hardware::ProfileError),
    #[error("{measure}: an operation completed with {status:?}")]
    Failed {
        measure: &'static str,
        status: CompletionStatus,
    },
    #[error("{measure}: {completed} of {wanted} operations completed in the time allowed")]
    Unfinished {
        measure: &'static str,
        completed: u64,
        wanted: u64,
    },
}

/// Runs every microbenchmark `profile` lists under `[[validation]]`.
pub fn validate(profile: &HardwareProfile) -> Result<Vec<Checked>, ValidationError> {
    profile
        .validations
        .iter()
        .map(|validation| {
            let simulated = measure(profile, &validation.measure)?;
            Ok(Checked {
                measure: validation.measure.clone(),
                simulated,
                published: validation.value,
                unit: validation.unit.clone(),
                source: validation.source.clone(),
                relative_error: (simulated - validation.value).abs() / validation.value,
            })
        })
        .collect()
}

/// The largest relative error of a validation.
pub fn max_relative_error(checked: &[Checked]) -> f64 {
    checked
        .iter()
        .map(|check| check.relative_error)
        .fold(0.0, f64::max)
}

fn measure(profile: &HardwareProfile, measure: &str) -> Result<f64, ValidationError> {
    let run = |operation, queue_pairs, window, operations| {
        run_probe(profile, operation, (queue_pairs, window), operations)
    };
    let result = match measure {
        "read_latency_us" => run(Operation::Read, 1, 1, LATENCY_OPERATIONS)?.median_latency_us(),
        "write_latency_us" => run(Operation::Write, 1, 1, LATENCY_OPERATIONS)?.median_one_way_us(),
        "read_rate_mops" => run(
            Operation::Read,
            RATE_QUEUE_PAIRS,
            RATE_WINDOW,
            RATE_OPERATIONS,
        )?
        .rate_mops(),
        "write_rate_mops" => run(
            Operation::Write,
            RATE_QUEUE_PAIRS,
            RATE_WINDOW,
            RATE_OPERATIONS,
        )?
        .rate_mops(),
        "same_address_atomic_rate_mops" => run(
            Operation::CompareSwapOneAddress,
            RATE_QUEUE_PAIRS,
            RATE_WINDOW,
            RATE_OPERATIONS / 20,
        )?
        .rate_mops(),
        _ => {
            return Err(ValidationError::UnknownMeasure {
                profile: profile.name.clone(),
                measure: measure.into(),
            })
        }
    };
    Ok(result)
}

/// The cable between the two hosts: a few metres at 100 Gb/s.
fn cable() -> LinkConfig {
    LinkConfig {
        bandwidth_bits_per_second: 100_000_000_000,
        // Light in copper or fibre covers about 0.2 m per ns: 2 m.
        propagation_delay: Duration::from_nanos(10),
        queue_limit_bytes: 4 << 20,
        faults: LinkFaults::NONE,
    }
}

fn host(profile: &HardwareProfile, index: u8) -> Result<Host, ValidationError> {
    let config = RnicConfig::new(
        MacAddress([2, 0, 0, 0, 0, index]),
        Ipv4Address::new(10, 0, 0, index),
        u64::from(index),
    );
    Ok(Host::with_profile(
        format!("host{index}"),
        config,
        profile.clone(),
    )?)
}

/// What one run measured.
struct ProbeResult {
    latencies_ns: Vec<u64>,
    one_way_ns: Vec<u64>,
    completed: u64,
    elapsed_ns: u64,
}

fn median_us(values_ns: &[u64]) -> f64 {
    let mut sorted = values_ns.to_vec();
    sorted.sort_unstable();
    sorted
        .get(sorted.len() / 2)
        .map_or(0.0, |ns| *ns as f64 / 1e3)
}

impl ProbeResult {
    fn median_latency_us(&self) -> f64 {
        median_us(&self.latencies_ns)
    }

    fn median_one_way_us(&self) -> f64 {
        median_us(&self.one_way_ns)
    }

    fn rate_mops(&self) -> f64 {
        self.completed as f64 / self.elapsed_ns.max(1) as f64 * 1e3
    }
}

fn run_probe(
    profile: &HardwareProfile,
    operation: Operation,
    (queue_pair_count, window): (usize, usize),
    operations: u64,
) -> Result<ProbeResult, ValidationError> {
    let mut requester = host(profile, 1)?;
    let mut responder = host(profile, 2)?;
    let (domain, region) = setup_responder(&mut responder)?;
    let probe = Probe::connect(
        [&mut requester, &mut responder],
        (domain, region.remote(0)),
        operation,
        (queue_pair_count, window),
        operations,
    )?;
    requester.add_agent(Box::new(probe));
    responder.add_agent(Box::new(Watcher::new(region)));
    let mut simulation = Simulation::new(1);
    let requester_id = simulation.add_node(requester);
    let responder_id = simulation.add_node(responder);
    simulation.connect(
        (requester_id, PortId(0)),
        (responder_id, PortId(0)),
        cable(),
    );
    // A bound well past any sane run: 10 s of virtual time.
    simulation.run_until(Timestamp::from_nanos(10_000_000_000), 200_000_000);
    let probe = simulation
        .node(requester_id)
        .agent_as::<Probe>(0)
        .expect("the probe is the requester's only agent");
    let watcher = simulation
        .node(responder_id)
        .agent_as::<Watcher>(0)
        .expect("the watcher is the responder's only agent");
    let name = operation.name();
    if let Some(status) = probe.failure {
        return Err(ValidationError::Failed {
            measure: name,
            status,
        });
    }
    if probe.completed < operations {
        return Err(ValidationError::Unfinished {
            measure: name,
            completed: probe.completed,
            wanted: operations,
        });
    }
    Ok(ProbeResult {
        latencies_ns: probe.latencies_ns.clone(),
        one_way_ns: watcher.one_way_ns.clone(),
        completed: probe.completed,
        elapsed_ns: probe.last_completion_ns - probe.first_post_ns.unwrap_or(0),
    })
}

/// The responder's region, and the protection domain its queue pairs
/// must share with it.
fn setup_responder(
    responder: &mut Host,
) -> Result<(ProtectionDomain, MemoryRegion), ValidationError> {
    let nic = responder.nic_mut();
    let domain = nic.alloc_protection_domain()?;
    let region = nic.register_memory(domain, 1 << 20, AccessFlags::ALL)?;
    Ok((domain, region))
}

impl Operation {
    fn name(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
            Operation::CompareSwapOneAddress => "same-address compare-and-swap",
        }
    }

    fn request(
        self,
        work_request_id: u64,
        local: &MemoryRegion,
        remote: RemoteAddress,
    ) -> SendRequest {
        let operation = match self {
            Operation::Read => SendOperation::Read { remote },
            Operation::Write => SendOperation::Write {
                remote,
                immediate: None,
            },
            // Most fail their compare after the first: each is still one
            // atomic on the word, as under contention.
            Operation::CompareSwapOneAddress => SendOperation::CompareSwap {
                remote,
                compare: 0,
                swap: 1,
            },
        };
        SendRequest::new(work_request_id, operation, &[local.slice(0, MESSAGE_BYTES)])
            .expect("one element is a valid list")
    }
}

/// The requester's program: keeps `window` operations outstanding on each
/// queue pair until `operations` have been posted, timing each.
struct Probe {
    operation: Operation,
    remote: RemoteAddress,
    local: MemoryRegion,
    completion_queue: CompletionQueue,
    queue_pairs: Vec<QueuePair>,
    outstanding: Vec<usize>,
    window: usize,
    operations: u64,
    posted: u64,
    completed: u64,
    latencies_ns: Vec<u64>,
    first_post_ns: Option<u64>,
    last_completion_ns: u64,
    failure: Option<CompletionStatus>,
}

/// Queue pairs a probe can name in a work request id's low byte.
const MAX_PROBE_QUEUE_PAIRS: usize = 256;

impl Probe {
    /// Connects `queue_pair_count` queue pairs from the requester to the
    /// responder's domain, each allowed `window` READs or atomics.
    fn connect(
        [requester, responder]: [&mut Host; 2],
        (responder_domain, remote): (ProtectionDomain, RemoteAddress),
        operation: Operation,
        (queue_pair_count, window): (usize, usize),
        operations: u64,
    ) -> Result<Probe, ValidationError> {
        assert!(queue_pair_count <= MAX_PROBE_QUEUE_PAIRS);
        let nic = requester.nic_mut();
        let domain = nic.alloc_protection_domain()?;
        let local = nic.register_memory(domain, 1 << 20, AccessFlags::ALL)?;
        let completion_queue = nic.create_completion_queue(16_384)?;
        let responder_queue = responder.nic_mut().create_completion_queue(16_384)?;
        let mut queue_pairs = Vec::new();
        // READs and atomics past the device's limit wait in the send
        // queue, as on the hardware.
        let read_atomic = window.min(nic.config().max_read_atomic);
        for _ in 0..queue_pair_count {
            let mut ours = QueuePairBuilder::new(domain, completion_queue, completion_queue);
            ours.max_read_atomic = read_atomic;
            let mut theirs =
                QueuePairBuilder::new(responder_domain, responder_queue, responder_queue);
            theirs.max_destination_read_atomic = read_atomic;
            let prepared = requester.nic_mut().create_queue_pair(&ours)?;
            let peer = responder.nic_mut().create_queue_pair(&theirs)?;
            queue_pairs.push(requester.nic_mut().handshake(prepared, peer.endpoint)?);
            responder.nic_mut().handshake(peer, prepared.endpoint)?;
        }
        Ok(Probe {
            operation,
            remote,
            local,
            completion_queue,
            outstanding: vec![0; queue_pairs.len()],
            queue_pairs,
            window,
            operations,
            posted: 0,
            completed: 0,
            latencies_ns: Vec::new(),
            first_post_ns: None,
            last_completion_ns: 0,
            failure: None,
        })
    }

    fn reap(&mut self, now: u64, nic: &mut dyn Verbs) -> Result<bool, AgentError> {
        let mut moved = false;
        while let Some(completion) = nic.poll_completion(self.completion_queue)? {
            moved = true;
            if completion.status != CompletionStatus::Success {
                self.failure.get_or_insert(completion.status);
            }
            let queue_pair = (completion.work_request_id & 0xff) as usize;
            self.outstanding[queue_pair] -= 1;
            self.latencies_ns
                .push(now.saturating_sub(completion.work_request_id >> 8));
            self.completed += 1;
            self.last_completion_ns = now;
        }
        Ok(moved)
    }

    fn post(&mut self, now: u64, nic: &mut dyn Verbs) -> Result<bool, AgentError> {
        let mut moved = false;
        for index in 0..self.queue_pairs.len() {
            while self.outstanding[index] < self.window && self.posted < self.operations {
                let work_request_id = (now << 8) | index as u64;
                // A WRITE carries its post time: the watcher at the far
                // end times its arrival.
                if self.operation == Operation::Write {
                    nic.write_local(self.local.lkey, self.local.address, &now.to_le_bytes())?;
                }
                let request = self
                    .operation
                    .request(work_request_id, &self.local, self.remote);
                nic.post_send(self.queue_pairs[index], request)?;
                self.outstanding[index] += 1;
                self.posted += 1;
                self.first_post_ns.get_or_insert(now);
                moved = true;
            }
        }
        Ok(moved)
    }
}

impl Agent for Probe {
    fn name(&self) -> &'static str {
        "hardware-probe"
    }

    fn poll(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        let now = now.as_nanos();
        let reaped = self.reap(now, nic)?;
        let posted = if self.failure.is_none() {
            self.post(now, nic)?
        } else {
            false
        };
        Ok(Progress::from_moved(reaped || posted))
    }

    /// Its first turn, to post the first operations.
    fn poll_timeout(&self) -> Option<Timestamp> {
        (self.posted == 0).then_some(Timestamp::ZERO)
    }

    fn crash(&mut self) {}

    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Ok(())
    }
}

/// The responder's program: sees, on each turn, whether a WRITE changed
/// its first word, which carries the WRITE's post time, and records how
/// long ago that was.
struct Watcher {
    region: MemoryRegion,
    last_seen: u64,
    one_way_ns: Vec<u64>,
}

impl Watcher {
    fn new(region: MemoryRegion) -> Watcher {
        Watcher {
            region,
            last_seen: 0,
            one_way_ns: Vec::new(),
        }
    }
}

impl Agent for Watcher {
    fn name(&self) -> &'static str {
        "hardware-watcher"
    }

    fn poll(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        let mut word = [0u8; 8];
        nic.read_local(self.region.lkey, self.region.address, &mut word)?;
        let posted_ns = u64::from_le_bytes(word);
        if posted_ns == self.last_seen {
            return Ok(Progress::Idle);
        }
        self.last_seen = posted_ns;
        self.one_way_ns
            .push(now.as_nanos().saturating_sub(posted_ns));
        Ok(Progress::Moved)
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        None
    }

    fn crash(&mut self) {}

    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::NicHardware;

    /// Every microbenchmark runs to the end and measures something, and
    /// comes within 15% of its published figure, but the READ rate: the
    /// profile's one known miss (about 22%; crates/host/profiles/cx5.toml
    /// says why it is not tuned away), which `remora bench clover`
    /// reports as `cx5_profile_max_error`. A profile or model change that
    /// moves another figure out of its bound fails here.
    #[test]
    fn every_validation_of_the_cx5_profile_runs_and_holds_its_bound() {
        let checked = validate(&NicHardware::Cx5.profile()).unwrap();
        assert_eq!(checked.len(), MEASURES.len());
        for check in &checked {
            assert!(check.simulated > 0.0, "{check:?}");
            if check.measure != "read_rate_mops" {
                assert!(check.relative_error <= MAX_RELATIVE_ERROR, "{check:?}");
            }
        }
    }

    #[test]
    fn an_unknown_measure_is_refused_by_name() {
        let mut profile = NicHardware::Cx5.profile();
        profile.validations[0].measure = "jitter".into();
        assert!(matches!(
            validate(&profile),
            Err(ValidationError::UnknownMeasure { .. })
        ));
        assert!(matches!(
            profile.check(),
            Err(crate::hardware::ProfileError::UnknownMeasure { .. })
        ));
    }

    #[test]
    fn a_published_figure_in_another_unit_is_refused() {
        let mut profile = NicHardware::Cx5.profile();
        profile.validations[0].value = 1910.0;
        profile.validations[0].unit = "ns".into();
        assert!(matches!(
            profile.check(),
            Err(crate::hardware::ProfileError::Unit { unit: "us", .. })
        ));
    }
}
