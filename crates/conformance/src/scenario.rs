//! One seed of the fabric scenario.
//!
//! Two nodes, one link, several connections. Every connection carries two
//! streams, one each way. After a safety phase with faults and a liveness
//! phase without, each stream is checked:
//!
//! - liveness: every operation completed (the requester survived);
//! - completions: successes form a prefix, then at most one error that the
//!   run can explain, then flushes;
//! - every successful READ returned the model's bytes and every atomic the
//!   model's original value;
//! - the responder's window equals the model after some in-order prefix of
//!   the stream: every WRITE and atomic landed exactly once, and a refused
//!   access changed nothing;
//! - every SEND landed once, intact, in the receive it was matched with.

use crate::model::{Expected, WindowModel};
use crate::node::LateReceives;
use crate::workload::{
    self, Operation, Violation, DATA_WINDOW_BYTES, LOCAL_SLOT_BYTES, MAX_SEND_BYTES, WINDOW_BYTES,
};
use rand::Rng;
use remora_base::Probability;
use remora_host::hardware::NicHardware;
use remora_host::Host as HostNode;
use remora_rnic::*;
use remora_sim::{
    Event, LinkConfig, LinkCounters, LinkFaults, LinkId, NodeId, PortId, RunOutcome, Simulation,
};
use remora_wire::{Ipv4Address, MacAddress, Qpn, Rkey};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The faults of a run, as probabilities. Fields left out of a TOML file
/// are zero.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FaultProfile {
    pub loss: Probability,
    pub duplicate: Probability,
    pub reorder: Probability,
    pub corrupt: Probability,
    /// Probability the link is cut for part of the safety phase.
    pub partition: Probability,
    /// Probability one node crashes and restarts empty.
    pub crash: Probability,
    /// Probability a stream ends with a remote access violation.
    pub violation: Probability,
}

impl Default for FaultProfile {
    fn default() -> FaultProfile {
        FaultProfile::NONE
    }
}

impl FaultProfile {
    pub const NONE: FaultProfile = FaultProfile {
        loss: Probability::ZERO,
        duplicate: Probability::ZERO,
        reorder: Probability::ZERO,
        corrupt: Probability::ZERO,
        partition: Probability::ZERO,
        crash: Probability::ZERO,
        violation: Probability::ZERO,
    };

    /// `loss` with duplication, reordering and corruption alongside.
    pub fn lossy(loss: Probability) -> FaultProfile {
        FaultProfile {
            loss,
            duplicate: Probability::literal(0.02),
            reorder: Probability::literal(0.05),
            corrupt: Probability::literal(0.01),
            partition: Probability::literal(0.1),
            crash: Probability::literal(0.05),
            violation: Probability::literal(0.2),
        }
    }
}

/// One scenario run. Fields left out of a TOML file keep their defaults.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScenarioConfig {
    pub faults: FaultProfile,
    /// Queue-pair connections between the two nodes (two streams each).
    pub connections: usize,
    /// Each stream issues between half this and this many operations.
    pub operations_per_stream: usize,
    /// Virtual time with faults on.
    pub safety_phase_us: u64,
    /// Virtual time allowed, once faults stop, for everything to finish.
    pub liveness_limit_ms: u64,
    /// A bound on simulator steps per phase.
    pub max_events: u64,
    /// The NICs' hardware: `ideal` (no NIC costs), or a profile whose
    /// pipeline, PCIe and atomic costs the transport must survive too.
    pub hardware: NicHardware,
    /// Which packet boundaries operation lengths cluster at.
    pub length_boundaries: workload::LengthBoundaries,
}

impl Default for ScenarioConfig {
    fn default() -> ScenarioConfig {
        ScenarioConfig::new(FaultProfile::lossy(Probability::literal(0.01)))
    }
}

impl ScenarioConfig {
    pub fn new(faults: FaultProfile) -> ScenarioConfig {
        ScenarioConfig {
            faults,
            connections: 2,
            operations_per_stream: 60,
            safety_phase_us: 400,
            liveness_limit_ms: 1000,
            max_events: 2_000_000,
            hardware: NicHardware::Ideal,
            length_boundaries: workload::LengthBoundaries::Fixed,
        }
    }

    pub fn validate(&self) -> Result<(), ScenarioConfigError> {
        if !(1..=64).contains(&self.connections) {
            return Err(ScenarioConfigError::Connections(self.connections));
        }
        if !(1..=1000).contains(&self.operations_per_stream) {
            return Err(ScenarioConfigError::OperationsPerStream(
                self.operations_per_stream,
            ));
        }
        if self.safety_phase_us == 0 || self.liveness_limit_ms == 0 || self.max_events == 0 {
            return Err(ScenarioConfigError::ZeroBound);
        }
        // A host takes every completion in one queue: its requests' and
        // the receives of its peers' SENDs, per connection. Past its depth
        // the queue overran and the campaign panicked with no report.
        let completions = self.connections * (2 * self.operations_per_stream + 1);
        if completions > COMPLETION_QUEUE_DEPTH {
            return Err(ScenarioConfigError::TooManyCompletions(completions));
        }
        Ok(())
    }

    fn safety_phase(&self) -> Duration {
        Duration::from_micros(self.safety_phase_us)
    }

    fn liveness_limit(&self) -> Duration {
        Duration::from_millis(self.liveness_limit_ms)
    }
}

/// A campaign configuration refused before any seed runs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScenarioConfigError {
    #[error("connections = {0} is outside 1..=64")]
    Connections(usize),
    #[error("operations_per_stream = {0} is outside 1..=1000")]
    OperationsPerStream(usize),
    #[error("safety_phase_us, liveness_limit_ms and max_events must be positive")]
    ZeroBound,
    #[error("connections × (2 × operations_per_stream + 1) = {0} completions per host is past the {COMPLETION_QUEUE_DEPTH} its queue holds")]
    TooManyCompletions(usize),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SeedReport {
    pub seed: u64,
    pub failures: Vec<String>,
    pub operations: usize,
    pub succeeded: usize,
    /// Streams whose transport gave up (retry or RNR limit) under faults.
    pub streams_gave_up: usize,
    pub frames: u64,
    pub retransmitted_packets: u64,
    pub retransmit_timeouts: u64,
    /// Frames the hosts' NIC pipelines dropped, full (a hardware profile
    /// only; RC retransmits them).
    pub pipeline_frames_dropped: u64,
    /// Atomics that waited in a NIC pipeline for their word.
    pub atomics_serialized: u64,
    pub virtual_time_ns: u64,
    pub crashed: bool,
    /// Completions a crashed host produced before its crash, checked.
    pub checked_before_crash: usize,
    /// Windows a crashed host served as responder, checked as they were
    /// when it died.
    pub windows_checked_before_crash: usize,
    pub partitioned: bool,
    /// What the link's faults did, both directions: a campaign shows the
    /// faults it asked for happened (a broken profile passed silently).
    pub link: LinkCounters,
}

impl SeedReport {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// One node's objects.
struct HostResources {
    id: NodeId,
    completion_queue: CompletionQueue,
    protection_domain: ProtectionDomain,
    read_only: MemoryRegion,
}

/// One direction of one connection.
struct Stream {
    name: String,
    requester: NodeId,
    responder: NodeId,
    requester_qpn: Qpn,
    responder_qpn: Qpn,
    local: MemoryRegion,
    target: MemoryRegion,
    receives: MemoryRegion,
    operations: Vec<Operation>,
    /// Index of the connection, to know which streams share a fate.
    connection: usize,
    mtu: Mtu,
}

impl Stream {
    /// Whether the stream's last request is a remote access violation.
    fn ends_in_violation(&self) -> bool {
        matches!(self.operations.last(), Some(Operation::Violation(_)))
    }
}

const COMPLETION_QUEUE_DEPTH: usize = 16_384;
/// The late-receives agent's index on every scenario host.
const LATE_RECEIVES: usize = 0;

fn device(sim: &mut Simulation<HostNode>, id: NodeId) -> &mut SoftRnic {
    sim.node_mut(id).nic_mut()
}

fn setup_host(sim: &mut Simulation<HostNode>, id: NodeId) -> HostResources {
    let device = device(sim, id);
    let protection_domain = device.alloc_protection_domain().expect("fresh device");
    let completion_queue = device
        .create_completion_queue(COMPLETION_QUEUE_DEPTH)
        .expect("depth within limits");
    let read_only = device
        .register_memory(protection_domain, 4096, AccessFlags::REMOTE_READ)
        .expect("small region");
    HostResources {
        id,
        completion_queue,
        protection_domain,
        read_only,
    }
}

/// The queue pairs' retransmission timeout: longer than a full window
/// takes to drain (256 x 4 KiB at 100 Gb/s is about 80 us), or timeouts
/// fire while the head is merely queued.
const RETRY_TIMEOUT: Duration = Duration::from_micros(500);
/// Tries after the first before a queue pair gives up.
const RETRY_COUNT: u8 = 7;

fn queue_pair_builder(
    host: &HostResources,
    rng: &mut impl Rng,
    mtu: Mtu,
    depth: usize,
) -> QueuePairBuilder {
    let mut builder = QueuePairBuilder::new(
        host.protection_domain,
        host.completion_queue,
        host.completion_queue,
    );
    builder.path_mtu = mtu;
    builder.send_queue_depth = depth;
    builder.receive_queue_depth = depth;
    builder.timeout = RETRY_TIMEOUT;
    builder.retry_count = RETRY_COUNT;
    builder.min_rnr_timer = Duration::from_micros(10);
    builder.max_read_atomic = rng.gen_range(1..=16);
    builder.max_destination_read_atomic = 16;
    builder
}

/// Builds the rack, posts the workload and schedules the faults.
struct Build {
    sim: Simulation<HostNode>,
    hosts: [HostResources; 2],
    streams: Vec<Stream>,
    partitioned: bool,
    /// The partition drawn lasts a timeout for every try.
    partition_outlasts_retries: bool,
    /// When the crash drawn happens, and to which host.
    crash: Option<(Timestamp, NodeId)>,
    /// The link between the two hosts.
    link: LinkId,
}

fn build(seed: u64, config: &ScenarioConfig) -> Build {
    let mut sim = Simulation::new(seed);
    let hardware = config.hardware;
    let node = |index: u8, sim: &mut Simulation<HostNode>| {
        let device_seed = sim.rng().gen();
        let config = RnicConfig::new(
            MacAddress([0x02, 0, 0, 0, 0, index]),
            Ipv4Address::new(192, 0, 2, index),
            device_seed,
        );
        let mut host = HostNode::with_profile(format!("host-{index}"), config, hardware.profile())
            .expect("compiled-in profiles are checked by tests");
        host.add_agent(Box::new(LateReceives::default()));
        sim.add_node(host)
    };
    let a = node(1, &mut sim);
    let b = node(2, &mut sim);
    let faults = &config.faults;
    let mut link = LinkConfig::rack();
    link.faults = LinkFaults {
        loss: faults.loss,
        duplicate: faults.duplicate,
        reorder: faults.reorder,
        reorder_delay: Duration::from_micros(5),
        corrupt: faults.corrupt,
    };
    let link_id = sim.connect((a, PortId(0)), (b, PortId(0)), link);
    let hosts = [setup_host(&mut sim, a), setup_host(&mut sim, b)];
    let mut streams = Vec::new();
    for connection in 0..config.connections {
        streams.extend(connect_streams(&mut sim, &hosts, connection, config));
    }
    let safety_end = Timestamp::ZERO.saturating_add(config.safety_phase());
    let partitioned = sim.rng().gen_bool(faults.partition.get());
    let mut partition_outlasts_retries = false;
    if partitioned {
        let start = sim.random_time(
            Timestamp::ZERO,
            Timestamp::from_nanos(safety_end.as_nanos() / 2),
        );
        let end = sim.random_time(start, start.saturating_add(config.safety_phase() / 3));
        sim.schedule(start, Event::Partition(link_id));
        sim.schedule(end, Event::Heal(link_id));
        // Progress resets the retries, so only a partition that spans a
        // timeout for every try can make a queue pair give up.
        let every_try = RETRY_TIMEOUT * (u32::from(RETRY_COUNT) + 1);
        partition_outlasts_retries =
            end.as_nanos().saturating_sub(start.as_nanos()) >= every_try.as_nanos() as u64;
    }
    let mut crash = None;
    if sim.rng().gen_bool(faults.crash.get()) {
        let victim = if sim.rng().gen_bool(0.5) { a } else { b };
        let at = sim.random_time(Timestamp::ZERO, safety_end);
        let back = sim.random_time(at, safety_end);
        sim.schedule(at, Event::Crash(victim));
        sim.schedule(back, Event::Restart(victim));
        crash = Some((at, victim));
    }
    Build {
        sim,
        hosts,
        streams,
        partitioned,
        partition_outlasts_retries,
        crash,
        link: link_id,
    }
}

fn connect_streams(
    sim: &mut Simulation<HostNode>,
    hosts: &[HostResources; 2],
    connection: usize,
    config: &ScenarioConfig,
) -> Vec<Stream> {
    let mtu = Mtu::new([256, 512, 1024, 2048, 4096][sim.rng().gen_range(0..5)]).expect("valid MTU");
    let mut plans = Vec::new();
    for _ in 0..2 {
        let count = sim
            .rng()
            .gen_range(config.operations_per_stream.div_ceil(2)..=config.operations_per_stream);
        let violation = sim
            .rng()
            .gen_bool(config.faults.violation.get())
            .then(|| workload::random_violation(sim.rng()));
        let lengths = (config.length_boundaries, mtu.bytes());
        plans.push(workload::generate(sim.rng(), count, violation, lengths));
    }
    let depth = config.operations_per_stream + 2;
    let builders: Vec<_> = hosts
        .iter()
        .map(|host| queue_pair_builder(host, sim.rng(), mtu, depth))
        .collect();
    let prepared_a = device(sim, hosts[0].id)
        .create_queue_pair(&builders[0])
        .expect("within limits");
    let prepared_b = device(sim, hosts[1].id)
        .create_queue_pair(&builders[1])
        .expect("within limits");
    device(sim, hosts[0].id)
        .handshake(prepared_a, prepared_b.endpoint)
        .expect("fresh queue pair");
    device(sim, hosts[1].id)
        .handshake(prepared_b, prepared_a.endpoint)
        .expect("fresh queue pair");
    let qpns = [prepared_a.qpn, prepared_b.qpn];
    let mut streams = Vec::new();
    for (direction, operations) in plans.into_iter().enumerate() {
        let (requester, responder) = (&hosts[direction], &hosts[1 - direction]);
        let placement = Placement {
            qpns: (qpns[direction], qpns[1 - direction]),
            connection,
            direction,
            mtu,
        };
        let stream = start_stream(sim, requester, responder, placement, operations, config);
        streams.push(stream);
    }
    streams
}

/// Where a stream sits: its queue pairs (requester, responder), connection,
/// direction and path MTU.
struct Placement {
    qpns: (Qpn, Qpn),
    connection: usize,
    direction: usize,
    mtu: Mtu,
}

fn start_stream(
    sim: &mut Simulation<HostNode>,
    requester: &HostResources,
    responder: &HostResources,
    placement: Placement,
    operations: Vec<Operation>,
    config: &ScenarioConfig,
) -> Stream {
    let Placement {
        qpns: (requester_qpn, responder_qpn),
        connection,
        direction,
        mtu,
    } = placement;
    let receive_count = operations
        .iter()
        .filter(|operation| operation.consumes_receive())
        .count()
        .max(1);
    let responder_device = device(sim, responder.id);
    let target = responder_device
        .register_memory(responder.protection_domain, WINDOW_BYTES, AccessFlags::ALL)
        .expect("window fits");
    let receives = responder_device
        .register_memory(
            responder.protection_domain,
            receive_count as u64 * u64::from(MAX_SEND_BYTES),
            AccessFlags::LOCAL_WRITE,
        )
        .expect("receive area fits");
    let local = device(sim, requester.id)
        .register_memory(
            requester.protection_domain,
            operations.len().max(1) as u64 * LOCAL_SLOT_BYTES,
            AccessFlags::LOCAL_WRITE,
        )
        .expect("local area fits");
    let stream = Stream {
        name: format!(
            "connection {connection} {}",
            if direction == 0 { "a->b" } else { "b->a" }
        ),
        requester: requester.id,
        responder: responder.id,
        requester_qpn,
        responder_qpn,
        local,
        target,
        receives,
        operations,
        connection,
        mtu,
    };
    post_receives(sim, &stream, config);
    post_operations(sim, &stream, responder);
    stream
}

/// Posts one receive per receive-consuming operation: now, or late in the
/// safety phase so that early SENDs meet an empty queue (RNR).
fn post_receives(sim: &mut Simulation<HostNode>, stream: &Stream, config: &ScenarioConfig) {
    let late_at = sim.rng().gen_bool(0.2).then(|| {
        let end = Timestamp::ZERO.saturating_add(config.safety_phase() / 4);
        sim.random_time(Timestamp::ZERO, end)
    });
    let count = stream
        .operations
        .iter()
        .filter(|operation| operation.consumes_receive())
        .count();
    let node = sim.node_mut(stream.responder);
    for index in 0..count as u64 {
        let slice = stream
            .receives
            .slice(index * u64::from(MAX_SEND_BYTES), MAX_SEND_BYTES);
        let request = ReceiveRequest::new(index, &[slice]).expect("one element");
        let queue_pair = QueuePair(stream.responder_qpn);
        match late_at {
            Some(at) => node
                .agent_as_mut::<LateReceives>(LATE_RECEIVES)
                .expect("every scenario host runs late receives")
                .post_at(at, queue_pair, request),
            None => node
                .nic_mut()
                .post_receive(queue_pair, request)
                .expect("fresh queue pair"),
        }
    }
}

/// The byte a READ's or atomic's local slot holds before its answer.
const ANSWER_MARKER: u8 = 0xa5;
/// The bytes a violating WRITE carries: zeros landing on zeroed memory
/// would pass for a refusal that changed nothing.
const VIOLATION_MARKER: u8 = 0x5a;
/// The bytes a violation's local slot holds (a WRITE's payload).
const VIOLATION_BYTES: usize = 64;

fn post_operations(sim: &mut Simulation<HostNode>, stream: &Stream, responder: &HostResources) {
    let device = device(sim, stream.requester);
    for (index, operation) in stream.operations.iter().enumerate() {
        let slot_offset = index as u64 * LOCAL_SLOT_BYTES;
        let address = remora_wire::VirtAddr(stream.local.address.0 + slot_offset);
        match operation {
            Operation::Write { data, .. } | Operation::Send { data, .. } => device
                .write_local(stream.local.lkey, address, data)
                .expect("slot fits"),
            // Where an answer lands, a marker first: zeroed memory would
            // pass for the answer wherever the model expects zeros, so a
            // READ or atomic reported done with nothing placed would pass.
            Operation::Read { length, .. } => device
                .write_local(
                    stream.local.lkey,
                    address,
                    &vec![ANSWER_MARKER; *length as usize],
                )
                .expect("slot fits"),
            Operation::CompareSwap { .. } | Operation::FetchAdd { .. } => device
                .write_local(stream.local.lkey, address, &[ANSWER_MARKER; 8])
                .expect("slot fits"),
            Operation::Violation(_) => device
                .write_local(
                    stream.local.lkey,
                    address,
                    &[VIOLATION_MARKER; VIOLATION_BYTES],
                )
                .expect("slot fits"),
        }
        let request = send_request(stream, responder, index, operation);
        device
            .post_send(QueuePair(stream.requester_qpn), request)
            .expect("valid request");
    }
}

fn send_request(
    stream: &Stream,
    responder: &HostResources,
    index: usize,
    operation: &Operation,
) -> SendRequest {
    let local = |length: u32| stream.local.slice(index as u64 * LOCAL_SLOT_BYTES, length);
    let atomic_target = |slot: u64| stream.target.remote(DATA_WINDOW_BYTES + slot * 8);
    let (operation, length) = match *operation {
        Operation::Write {
            offset,
            ref data,
            immediate,
        } => (
            SendOperation::Write {
                remote: stream.target.remote(offset),
                immediate,
            },
            data.len() as u32,
        ),
        Operation::Read { offset, length } => (
            SendOperation::Read {
                remote: stream.target.remote(offset),
            },
            length,
        ),
        Operation::Send {
            ref data,
            immediate,
        } => (SendOperation::Send { immediate }, data.len() as u32),
        Operation::CompareSwap {
            slot,
            compare,
            swap,
        } => (
            SendOperation::CompareSwap {
                remote: atomic_target(slot),
                compare,
                swap,
            },
            8,
        ),
        Operation::FetchAdd { slot, add } => (
            SendOperation::FetchAdd {
                remote: atomic_target(slot),
                add,
            },
            8,
        ),
        Operation::Violation(violation) => (
            violation_operation(stream, responder, violation),
            if violation == Violation::AtomicOnReadOnly {
                8
            } else {
                VIOLATION_BYTES as u32
            },
        ),
    };
    SendRequest::new(index as u64, operation, &[local(length)]).expect("one element")
}

fn violation_operation(
    stream: &Stream,
    responder: &HostResources,
    violation: Violation,
) -> SendOperation {
    let write = |remote| SendOperation::Write {
        remote,
        immediate: None,
    };
    match violation {
        // Flipping the low byte changes the key's generation: no region has it.
        Violation::BadRkey => write(RemoteAddress {
            address: stream.target.address,
            rkey: Rkey(stream.target.rkey.0 ^ 0xff),
        }),
        Violation::OutOfBounds => write(stream.target.remote(WINDOW_BYTES - 32)),
        Violation::WriteToReadOnly => write(responder.read_only.remote(0)),
        Violation::AtomicOnReadOnly => SendOperation::FetchAdd {
            remote: responder.read_only.remote(0),
            add: 1,
        },
    }
}

/// Runs one seed and checks it.
///
/// # Panics
/// If `config` fails [`ScenarioConfig::validate`].
pub fn run_seed(seed: u64, config: &ScenarioConfig) -> SeedReport {
    config.validate().expect("a valid scenario config");
    let Build {
        mut sim,
        hosts,
        streams,
        partitioned,
        partition_outlasts_retries,
        crash,
        link,
    } = build(seed, config);
    let safety_end = Timestamp::ZERO.saturating_add(config.safety_phase());
    let (safety, before_crash) =
        run_safety_phase(&mut sim, &hosts, &streams, crash, safety_end, config);
    // The safety phase ends at its deadline, not at the event budget. A
    // run that spent the budget early (a timer re-armed at the same
    // instant, say) had its faults stopped early and healed by the
    // liveness phase, and passed.
    let safety_cut_short =
        !safety.quiesced && safety.events >= config.max_events && safety.now < safety_end;
    sim.stop_faults();
    let liveness_end = sim.now().saturating_add(config.liveness_limit());
    let outcome = sim.run_until(liveness_end, config.max_events);
    // Faults as they happened, not as they were drawn: a run that hit its
    // event limit cancels those still to come, and what never happened
    // excuses nothing.
    let crashed = crash.is_some() && hosts.iter().any(|host| sim.node(host.id).crashes() > 0);
    let mut link_counters = LinkCounters::default();
    for direction in &sim.link_counters(link) {
        link_counters.add(direction);
    }
    let cut = link_counters.partition_drops > 0;
    let (partitioned, partition_outlasts_retries) =
        (partitioned && cut, partition_outlasts_retries && cut);
    let mut report = SeedReport {
        seed,
        crashed,
        partitioned,
        virtual_time_ns: sim.now().as_nanos(),
        link: link_counters,
        ..SeedReport::default()
    };
    if safety_cut_short {
        report.failures.push(format!(
            "safety: {} events ran out at {} ns, before the phase's end at {} ns",
            config.max_events,
            safety.now.as_nanos(),
            safety_end.as_nanos()
        ));
    }
    if !outcome.quiesced {
        report.failures.push(format!(
            "liveness: the rack did not quiesce within {:?} of virtual time",
            config.liveness_limit()
        ));
    }
    let completions: Vec<Option<Vec<WorkCompletion>>> = hosts
        .iter()
        .map(|host| drain_completions(&mut sim, host, before_crash.as_ref()))
        .collect();
    let pipeline_drops: u64 = sim
        .nodes()
        .iter()
        .filter_map(|node| node.pipeline())
        .map(|pipeline| {
            let counters = pipeline.counters();
            counters.received_dropped + counters.transmitted_dropped
        })
        .sum();
    report.pipeline_frames_dropped = pipeline_drops;
    let lossy = frames_went_missing(&link_counters, pipeline_drops);
    for (index, stream) in streams.iter().enumerate() {
        let requester = match (&completions[stream.requester.0], &before_crash) {
            (Some(completions), _) => Some(RequesterView {
                completions,
                cut_by_crash: false,
                local: LocalSlots::Device(sim.node(stream.requester).nic()),
            }),
            (None, Some(before)) => before.local[index].as_deref().map(|bytes| RequesterView {
                completions: &before.completions,
                cut_by_crash: true,
                local: LocalSlots::Snapshot(bytes),
            }),
            (None, None) => None,
        };
        let crashed_window = before_crash
            .as_ref()
            .and_then(|before| before.target[index].as_deref());
        let responder = match (completions[stream.responder.0].as_deref(), crashed_window) {
            (Some(all), _) => ResponderView::Live(all),
            (None, Some(window)) => ResponderView::CrashedWith(window),
            (None, None) => ResponderView::Gone,
        };
        let faults = RunFaults {
            crashed,
            partition_outlasts_retries,
            lossy,
        };
        let context = CheckContext::of(stream, &streams, faults);
        check_stream(&sim, stream, requester, responder, context, &mut report);
    }
    for (host, completions) in hosts.iter().zip(&completions) {
        // A crashed host's NIC is fresh: its region is gone with it.
        if completions.is_some() {
            check_read_only_untouched(&sim, host, &mut report);
        }
    }
    for node in sim.nodes() {
        let counters = node.nic().counters();
        report.frames += counters.frames_transmitted;
        report.retransmitted_packets += counters.packets_retransmitted;
        report.retransmit_timeouts += counters.retransmit_timeouts;
        if let Some(pipeline) = node.pipeline() {
            report.atomics_serialized += pipeline.counters().atomics_serialized;
        }
    }
    report
}

/// Whether frames that never arrived in this run could have eaten the NAK
/// a violation drew: lost, corrupted, cut by a partition, dropped at a
/// full link queue or in a NIC's pipeline. Read from the profile, every
/// run of a profile with violations counted as lossy (the lossy profiles
/// corrupt at 1%), and a responder that never sent the NAK passed as one
/// whose NAK was lost.
fn frames_went_missing(link: &LinkCounters, pipeline_drops: u64) -> bool {
    link.lost + link.corrupted + link.partition_drops + link.queue_drops + pipeline_drops > 0
}

/// A refused WRITE or atomic aimed at a host's read-only region changed
/// nothing there. (No check read it: a responder that applied such an
/// access before its NAK passed every seed.)
fn check_read_only_untouched(
    sim: &Simulation<HostNode>,
    host: &HostResources,
    report: &mut SeedReport,
) {
    let mut memory = vec![0u8; host.read_only.length_bytes as usize];
    let read = sim.node(host.id).nic().read_local(
        host.read_only.lkey,
        host.read_only.address,
        &mut memory,
    );
    if read.is_err() || memory.iter().any(|&byte| byte != 0) {
        report.failures.push(format!(
            "host {}: its read-only region was written ({read:?})",
            host.id.0
        ));
    }
}

/// Every completion a host produced, or `None` if it crashed (they are
/// lost with it; those from before the crash are in `before_crash`). A
/// host whose crash was drawn but never came (the run hit its event
/// limit) produced those taken before it, then these.
fn drain_completions(
    sim: &mut Simulation<HostNode>,
    host: &HostResources,
    before_crash: Option<&BeforeCrash>,
) -> Option<Vec<WorkCompletion>> {
    if sim.node(host.id).crashes() > 0 {
        return None;
    }
    let mut completions = match before_crash {
        Some(before) if before.host == host.id => before.completions.clone(),
        _ => Vec::new(),
    };
    take_completions(sim, host, &mut completions);
    Some(completions)
}

/// Moves every completion waiting in live `host`'s queue into `into`.
fn take_completions(
    sim: &mut Simulation<HostNode>,
    host: &HostResources,
    into: &mut Vec<WorkCompletion>,
) {
    let nic = sim.node_mut(host.id).nic_mut();
    // The host's one completion queue; bounded by its depth.
    for _ in 0..COMPLETION_QUEUE_DEPTH {
        match nic.poll_completion(host.completion_queue) {
            Ok(Some(completion)) => into.push(completion),
            Ok(None) => break,
            Err(error) => panic!("completion queue of a live host: {error}"),
        }
    }
}

/// What a host had done just before its crash, taken from it then: its
/// completions, and for each stream it requests on (by index), the local
/// region its READs and atomics returned into. Without it, a crash threw
/// away every check of what the victim completed before it.
struct BeforeCrash {
    host: NodeId,
    completions: Vec<WorkCompletion>,
    local: Vec<Option<Vec<u8>>>,
    /// By stream, the window of each stream the victim served as
    /// responder: what its requests had done there when the host died.
    target: Vec<Option<Vec<u8>>>,
}

/// Runs the safety phase, stopping just before a crash drawn in it to take
/// what the victim did before it ([`BeforeCrash`]). Stopping and going on
/// changes nothing the simulation does: the same events run in the same
/// order, since `run_until` stops only once no node has anything due by
/// its deadline, and taking completions and reading memory moves nothing.
/// (It assumes a node's frames all left at its last turn before the stop;
/// past `MAX_FRAMES_PER_TURN` ready at once, the rest would leave at the
/// restart's first turn instead of the next event's.)
fn run_safety_phase(
    sim: &mut Simulation<HostNode>,
    hosts: &[HostResources; 2],
    streams: &[Stream],
    crash: Option<(Timestamp, NodeId)>,
    safety_end: Timestamp,
    config: &ScenarioConfig,
) -> (RunOutcome, Option<BeforeCrash>) {
    // A crash at the very start has nothing before it to take (and
    // stopping 1 ns before it is impossible).
    let Some((at, victim)) = crash.filter(|(at, _)| *at <= safety_end && *at > Timestamp::ZERO)
    else {
        return (sim.run_until(safety_end, config.max_events), None);
    };
    let victim = hosts
        .iter()
        .find(|host| host.id == victim)
        .expect("the victim is one of the hosts");
    let just_before = Timestamp::from_nanos(at.as_nanos().saturating_sub(1));
    let first = sim.run_until(just_before, config.max_events);
    let before = before_crash(sim, victim, streams);
    let rest = sim.run_until(safety_end, config.max_events - first.events);
    let outcome = RunOutcome {
        events: first.events + rest.events,
        ..rest
    };
    (outcome, Some(before))
}

fn before_crash(
    sim: &mut Simulation<HostNode>,
    victim: &HostResources,
    streams: &[Stream],
) -> BeforeCrash {
    let mut completions = Vec::new();
    take_completions(sim, victim, &mut completions);
    let nic = sim.node(victim.id).nic();
    let copy = |region: &MemoryRegion, length_bytes: u64| {
        let mut bytes = vec![0u8; length_bytes as usize];
        nic.read_local(region.lkey, region.address, &mut bytes)
            .expect("a live host's region");
        bytes
    };
    let local = streams
        .iter()
        .map(|stream| {
            (stream.requester == victim.id).then(|| copy(&stream.local, stream.local.length_bytes))
        })
        .collect();
    let target = streams
        .iter()
        .map(|stream| (stream.responder == victim.id).then(|| copy(&stream.target, WINDOW_BYTES)))
        .collect();
    BeforeCrash {
        host: victim.id,
        completions,
        local,
        target,
    }
}

/// A requester's completions as the checks see them.
struct RequesterView<'a> {
    completions: &'a [WorkCompletion],
    /// Taken before a crash: the rest were lost with the host.
    cut_by_crash: bool,
    local: LocalSlots<'a>,
}

/// Where a requester's READs and atomics left what they returned.
enum LocalSlots<'a> {
    /// The live host's local region.
    Device(&'a SoftRnic),
    /// A copy of it taken before the host crashed.
    Snapshot(&'a [u8]),
}

impl LocalSlots<'_> {
    /// The bytes at `offset` into `stream`'s local region.
    fn read(&self, stream: &Stream, offset: u64, into: &mut [u8]) {
        match self {
            LocalSlots::Device(device) => device
                .read_local(
                    stream.local.lkey,
                    remora_wire::VirtAddr(stream.local.address.0 + offset),
                    into,
                )
                .expect("local slot"),
            LocalSlots::Snapshot(bytes) => {
                let start = offset as usize;
                into.copy_from_slice(&bytes[start..start + into.len()]);
            }
        }
    }
}

/// What the checks see of a stream's responder.
enum ResponderView<'a> {
    /// Alive at the end: its completions (and its window, on the device).
    Live(&'a [WorkCompletion]),
    /// Crashed: its window as it was when the host died.
    CrashedWith(&'a [u8]),
    /// Neither.
    Gone,
}

#[derive(Clone, Copy)]
struct CheckContext {
    /// Giving up (the retry limit) is legal in this run.
    may_give_up: bool,
    /// The other stream on this connection ends with a violation, which
    /// errors both queue pairs of the connection, so this stream's
    /// requests may be flushed with no error of its own. A stream's own
    /// violation explains its flushes only if the violation itself was
    /// refused (checked from its completion).
    opposite_violation: bool,
}

/// What happened in a run that bears on giving up.
#[derive(Debug, Clone, Copy)]
struct RunFaults {
    crashed: bool,
    /// A partition long enough to outlast every retry.
    partition_outlasts_retries: bool,
    /// Frames went missing ([`frames_went_missing`]).
    lossy: bool,
}

impl CheckContext {
    /// The context `stream`'s checks run in, among the run's `streams`.
    fn of(stream: &Stream, streams: &[Stream], faults: RunFaults) -> CheckContext {
        let opposite_violation = streams.iter().any(|other| {
            !std::ptr::eq(other, stream)
                && other.connection == stream.connection
                && other.ends_in_violation()
        });
        // A transport gives up only when its peer is gone (a crash, or a
        // partition long enough to outlast every retry) or errored after
        // this stream's violation and the loss ate the NAK that said so.
        // Loss alone must never exhaust the retries, nor a partition
        // shorter than them. Not after the opposite stream's violation:
        // its responder is this stream's requester, which errored as it
        // sent the NAK and flushed this stream's requests, so none is left
        // to retry (excused, a requester that gave up on them passed).
        let may_give_up = faults.crashed
            || faults.partition_outlasts_retries
            || (stream.ends_in_violation() && faults.lossy);
        CheckContext {
            may_give_up,
            opposite_violation,
        }
    }
}

fn check_stream(
    sim: &Simulation<HostNode>,
    stream: &Stream,
    requester: Option<RequesterView<'_>>,
    responder: ResponderView<'_>,
    context: CheckContext,
    report: &mut SeedReport,
) {
    report.operations += stream.operations.len();
    let mut fail = |message: String| report.failures.push(format!("{}: {message}", stream.name));
    let requester_alive = requester.as_ref().is_some_and(|view| !view.cut_by_crash);
    let (succeeded, gave_up) = match requester {
        Some(view) => {
            let mine: Vec<_> = view
                .completions
                .iter()
                .filter(|c| c.qpn == stream.requester_qpn && !is_receive(c))
                .copied()
                .collect();
            if view.cut_by_crash {
                report.checked_before_crash += mine.len();
            }
            let view = RequesterView {
                completions: &mine,
                ..view
            };
            check_requester(stream, &view, context, &mut fail)
        }
        None => (0, false),
    };
    report.succeeded += succeeded;
    report.streams_gave_up += usize::from(gave_up);
    let all = match responder {
        ResponderView::Live(all) => all,
        // The crashed responder's window as it died: every request its
        // requester saw succeed, the old device had done by then (the
        // restarted one has no queue pairs). Unchecked, a responder that
        // acknowledged a WRITE it never applied just before a crash
        // passed (half the crash seeds crash a responder).
        ResponderView::CrashedWith(window) => {
            check_responder_window(stream, window, succeeded, &mut fail);
            report.windows_checked_before_crash += 1;
            return;
        }
        ResponderView::Gone => return,
    };
    {
        let receives: Vec<_> = all
            .iter()
            .filter(|c| c.qpn == stream.responder_qpn && is_receive(c))
            .copied()
            .collect();
        // What succeeded before a requester's crash landed too (in order,
        // each once); what it had in flight may have landed or not.
        check_responder_memory(sim, stream, succeeded, &mut fail);
        check_receives(
            sim,
            stream,
            &receives,
            if requester_alive {
                Some(succeeded)
            } else {
                None
            },
            &mut fail,
        );
    }
}

fn is_receive(completion: &WorkCompletion) -> bool {
    matches!(
        completion.opcode,
        CompletionOpcode::Receive | CompletionOpcode::ReceiveRdmaWithImmediate
    )
}

/// Checks completions and returned values. Returns how many succeeded and
/// whether the transport gave up.
fn check_requester(
    stream: &Stream,
    view: &RequesterView<'_>,
    context: CheckContext,
    fail: &mut impl FnMut(String),
) -> (usize, bool) {
    let completions = view.completions;
    // A crash cuts the list short: what the host would have completed
    // after it died with it.
    let whole = completions.len() == stream.operations.len();
    let cut_short = view.cut_by_crash && completions.len() < stream.operations.len();
    if !whole && !cut_short {
        fail(format!(
            "liveness: {} of {} operations completed",
            completions.len(),
            stream.operations.len()
        ));
    }
    let mut model = WindowModel::new();
    let mut succeeded = 0;
    let mut errored = false;
    let mut gave_up = false;
    // The stream's own violation errors its queue pair once refused: a
    // NAK (or, when the loss ate it and giving up is legal, the retries
    // running out). Only then may requests before it be flushed.
    let own_violation_refused = stream.ends_in_violation()
        && completions
            .get(stream.operations.len() - 1)
            .is_some_and(|completion| match completion.status {
                CompletionStatus::RemoteAccessError => true,
                CompletionStatus::RetryExceeded => context.may_give_up,
                _ => false,
            });
    // Refused by a NAK, which acknowledges every request before it: a
    // WRITE or SEND before the violation had landed and must succeed, so
    // the first request flushed may only be a READ or atomic whose answer
    // never came (after which all are flushed, in order). Accepted, a
    // requester that flushed landed work passed, and an application that
    // retried it ran it twice.
    let refused_by_nak = own_violation_refused
        && !context.opposite_violation
        && completions
            .last()
            .is_some_and(|completion| completion.status == CompletionStatus::RemoteAccessError);
    for (index, (operation, completion)) in stream.operations.iter().zip(completions).enumerate() {
        if completion.work_request_id != index as u64 {
            fail(format!(
                "completion {index} is for work request {}",
                completion.work_request_id
            ));
            return (succeeded, gave_up);
        }
        let status = completion.status;
        let is_violation = matches!(operation, Operation::Violation(_));
        match status {
            CompletionStatus::Success if errored => {
                fail(format!("op {index} succeeded after an error"))
            }
            CompletionStatus::Success if is_violation => fail(format!(
                "op {index}: the access violation {operation:?} succeeded"
            )),
            CompletionStatus::Success => {
                succeeded += 1;
                let expected = model.apply(operation);
                check_returned_value(&view.local, stream, index, &expected, fail);
            }
            CompletionStatus::WorkRequestFlushError => {
                let explained = errored || context.opposite_violation || own_violation_refused;
                if !explained {
                    fail(format!("op {index} flushed with no error before it"));
                }
                if refused_by_nak && !errored && !operation.awaits_an_answer() {
                    fail(format!(
                        "op {index} ({}) flushed, though the NAK refusing the violation acknowledged it",
                        describe(operation)
                    ));
                }
                errored = true;
            }
            // Requests before the refused one may have been flushed already
            // (a READ whose answer was lost), so this may follow flushes.
            CompletionStatus::RemoteAccessError if is_violation => errored = true,
            // Not ReceiverNotReadyRetryExceeded: the queue pairs keep
            // rnr_retry at 7, which retries for ever.
            CompletionStatus::RetryExceeded if context.may_give_up && !errored => {
                errored = true;
                gave_up = true;
            }
            other => {
                fail(format!(
                    "op {index} ({}) completed with {other:?}",
                    describe(operation)
                ));
                errored = true;
            }
        }
    }
    (succeeded, gave_up)
}

fn describe(operation: &Operation) -> String {
    match operation {
        Operation::Write {
            offset,
            data,
            immediate,
        } => format!("WRITE {} B at {offset}, imm {immediate:?}", data.len()),
        Operation::Read { offset, length } => format!("READ {length} B at {offset}"),
        Operation::Send { data, immediate } => format!("SEND {} B, imm {immediate:?}", data.len()),
        Operation::CompareSwap { slot, .. } => format!("CMP_SWAP slot {slot}"),
        Operation::FetchAdd { slot, .. } => format!("FETCH_ADD slot {slot}"),
        Operation::Violation(violation) => format!("violation {violation:?}"),
    }
}

fn check_returned_value(
    local: &LocalSlots<'_>,
    stream: &Stream,
    index: usize,
    expected: &Expected,
    fail: &mut impl FnMut(String),
) {
    let slot = index as u64 * LOCAL_SLOT_BYTES;
    match expected {
        Expected::Nothing => {}
        Expected::ReadData(bytes) => {
            let mut actual = vec![0u8; bytes.len()];
            local.read(stream, slot, &mut actual);
            if &actual != bytes {
                let first = actual
                    .iter()
                    .zip(bytes)
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                fail(format!("op {index}: READ of {} B returned wrong data (first difference at byte {first})", bytes.len()));
            }
        }
        Expected::AtomicOriginal(original) => {
            let mut actual = [0u8; 8];
            local.read(stream, slot, &mut actual);
            let actual = u64::from_le_bytes(actual);
            if actual != *original {
                fail(format!(
                    "op {index}: atomic returned {actual:#x}, the model says {original:#x}"
                ));
            }
        }
    }
}

/// The window must equal the model after `k` operations for some `k` no
/// smaller than the number that succeeded: in order, each exactly once.
/// The one operation after those `k` may be a WRITE cut off when its queue
/// pair went to error: then its leading whole packets, and only those, landed.
fn check_responder_memory(
    sim: &Simulation<HostNode>,
    stream: &Stream,
    lower: usize,
    fail: &mut impl FnMut(String),
) {
    let mut memory = vec![0u8; WINDOW_BYTES as usize];
    let device = sim.node(stream.responder).nic();
    device
        .read_local(stream.target.lkey, stream.target.address, &mut memory)
        .expect("live responder window");
    check_responder_window(stream, &memory, lower, fail);
}

/// `memory`, a responder's window, must be the effect of an in-order
/// prefix of at least `lower` of the stream's operations (a multi-packet
/// WRITE may be cut off after whole packets).
fn check_responder_window(
    stream: &Stream,
    memory: &[u8],
    lower: usize,
    fail: &mut impl FnMut(String),
) {
    let mut model = WindowModel::new();
    // The closest prefix, to say where the memory went wrong.
    let mut closest = (usize::MAX, 0, 0);
    for k in 0..=stream.operations.len() {
        if k >= lower {
            let differences = model
                .bytes()
                .iter()
                .zip(memory)
                .filter(|(a, b)| a != b)
                .count();
            if differences == 0
                || is_cut_off_write(&model, stream.operations.get(k), stream.mtu, memory)
            {
                return;
            }
            if differences < closest.0 {
                let first = model
                    .bytes()
                    .iter()
                    .zip(memory)
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                closest = (differences, k, first);
            }
        }
        if let Some(operation) = stream.operations.get(k) {
            model.apply(operation);
        }
    }
    let (differences, k, first) = closest;

    fail(format!(
        "responder memory matches no in-order prefix of {lower}..={} operations (lost, duplicated or \
         reordered effects); closest is {k} operations, {differences} bytes differ from offset {first}",
        stream.operations.len()
    ));
}

/// True if `memory` is `model` plus the first whole packets of `operation`,
/// a WRITE of more than one packet.
fn is_cut_off_write(
    model: &WindowModel,
    operation: Option<&Operation>,
    mtu: Mtu,
    memory: &[u8],
) -> bool {
    let Some(Operation::Write { offset, data, .. }) = operation else {
        return false;
    };
    let mtu = mtu.bytes() as usize;
    let start = *offset as usize;
    let mut partial = model.bytes().to_vec();
    for landed in (mtu..data.len()).step_by(mtu) {
        partial[start..start + landed].copy_from_slice(&data[..landed]);
        if partial == memory {
            return true;
        }
    }
    false
}

/// Receive completions come in posting order, each matched with the next
/// receive-consuming operation of the stream.
fn check_receives(
    sim: &Simulation<HostNode>,
    stream: &Stream,
    receives: &[WorkCompletion],
    requester_succeeded: Option<usize>,
    fail: &mut impl FnMut(String),
) {
    let consuming: Vec<&Operation> = stream
        .operations
        .iter()
        .filter(|operation| operation.consumes_receive())
        .collect();
    let device = sim.node(stream.responder).nic();
    let mut delivered = 0;
    for (index, completion) in receives.iter().enumerate() {
        if completion.status != CompletionStatus::Success {
            continue;
        }
        let Some(operation) = consuming.get(index) else {
            fail(format!(
                "receive {index} completed but only {} operations consume receives",
                consuming.len()
            ));
            return;
        };
        if completion.work_request_id != index as u64 || delivered != index {
            fail(format!("receive {index} completed out of order"));
            return;
        }
        delivered += 1;
        check_one_receive(device, stream, index, completion, operation, fail);
    }
    if let Some(succeeded) = requester_succeeded {
        let owed = stream.operations[..succeeded.min(stream.operations.len())]
            .iter()
            .filter(|operation| operation.consumes_receive())
            .count();
        if delivered < owed {
            fail(format!("{owed} receive-consuming operations succeeded but only {delivered} receives completed"));
        }
    }
}

fn check_one_receive(
    device: &SoftRnic,
    stream: &Stream,
    index: usize,
    completion: &WorkCompletion,
    operation: &Operation,
    fail: &mut impl FnMut(String),
) {
    let (data, immediate, opcode) = match operation {
        Operation::Send { data, immediate } => (data, *immediate, CompletionOpcode::Receive),
        Operation::Write {
            data, immediate, ..
        } => (data, *immediate, CompletionOpcode::ReceiveRdmaWithImmediate),
        _ => unreachable!("only SEND and WRITE-with-immediate consume receives"),
    };
    if completion.opcode != opcode
        || completion.immediate != immediate
        || completion.byte_len as usize != data.len()
    {
        fail(format!(
            "receive {index}: {completion:?} does not match {}",
            describe(operation)
        ));
        return;
    }
    if opcode == CompletionOpcode::Receive {
        let mut actual = vec![0u8; data.len()];
        let address = remora_wire::VirtAddr(
            stream.receives.address.0 + index as u64 * u64::from(MAX_SEND_BYTES),
        );
        device
            .read_local(stream.receives.lkey, address, &mut actual)
            .expect("receive slot");
        if &actual != data {
            fail(format!("receive {index}: SEND payload arrived corrupted"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_rnic::RnicConfig;
    use remora_wire::{Ipv4Address, MacAddress};

    /// A stream of `operations` between two nodes, for the checks alone.
    fn stream_of(operations: Vec<Operation>) -> Stream {
        let region = MemoryRegion {
            lkey: Lkey(1),
            rkey: Rkey(1),
            address: remora_wire::VirtAddr(0),
            length_bytes: 4096,
            access: AccessFlags::ALL,
        };
        Stream {
            name: "checked".into(),
            requester: NodeId(0),
            responder: NodeId(1),
            requester_qpn: Qpn::new(1).unwrap(),
            responder_qpn: Qpn::new(2).unwrap(),
            local: region,
            target: region,
            receives: region,
            operations,
            connection: 0,
            mtu: Mtu::new(1024).unwrap(),
        }
    }

    /// A completion of work request `index` with `status`.
    fn completion(index: u64, status: CompletionStatus) -> WorkCompletion {
        WorkCompletion {
            work_request_id: index,
            status,
            opcode: CompletionOpcode::RdmaWrite,
            qpn: Qpn::new(1).unwrap(),
            byte_len: 0,
            immediate: None,
            solicited: false,
        }
    }

    /// The failures `check_requester` finds in `statuses` for `stream`.
    fn requester_failures(stream: &Stream, statuses: &[CompletionStatus]) -> Vec<String> {
        let completions: Vec<_> = statuses
            .iter()
            .enumerate()
            .map(|(index, status)| completion(index as u64, *status))
            .collect();
        let local = [0u8; 4096];
        let view = RequesterView {
            completions: &completions,
            cut_by_crash: false,
            local: LocalSlots::Snapshot(&local),
        };
        let context = CheckContext {
            may_give_up: false,
            opposite_violation: false,
        };
        let mut failures = Vec::new();
        check_requester(stream, &view, context, &mut |failure| {
            failures.push(failure)
        });
        failures
    }

    /// A stream whose opposite stream ended in a violation was allowed to
    /// give up in a lossy run, though its requester errored as it sent the
    /// NAK and had nothing left to retry: only a stream's own violation,
    /// with frames lost, excuses giving up.
    #[test]
    fn the_opposite_streams_violation_does_not_excuse_giving_up() {
        let read = Operation::Read {
            offset: 0,
            length: 8,
        };
        let violating = stream_of(vec![read.clone(), Operation::Violation(Violation::BadRkey)]);
        let opposite = stream_of(vec![read]);
        let streams = [violating, opposite];
        let lossy = RunFaults {
            crashed: false,
            partition_outlasts_retries: false,
            lossy: true,
        };
        let own = CheckContext::of(&streams[0], &streams, lossy);
        assert!(own.may_give_up && !own.opposite_violation);
        let other = CheckContext::of(&streams[1], &streams, lossy);
        assert!(other.opposite_violation);
        assert!(!other.may_give_up, "the opposite stream may not give up");
        let clean = RunFaults {
            lossy: false,
            ..lossy
        };
        assert!(!CheckContext::of(&streams[0], &streams, clean).may_give_up);
        let crashed = RunFaults {
            crashed: true,
            ..clean
        };
        assert!(CheckContext::of(&streams[1], &streams, crashed).may_give_up);
    }

    /// Giving up after a violation was excused by the profile's loss: a
    /// lossy profile's run that lost nothing excused it too. Only frames
    /// the run lost, by any means, do.
    #[test]
    fn only_frames_a_run_lost_excuse_giving_up() {
        assert!(!frames_went_missing(&LinkCounters::default(), 0));
        for link in [
            LinkCounters {
                lost: 1,
                ..LinkCounters::default()
            },
            LinkCounters {
                corrupted: 1,
                ..LinkCounters::default()
            },
            LinkCounters {
                partition_drops: 1,
                ..LinkCounters::default()
            },
            LinkCounters {
                queue_drops: 1,
                ..LinkCounters::default()
            },
        ] {
            assert!(frames_went_missing(&link, 0), "{link:?}");
        }
        assert!(frames_went_missing(&LinkCounters::default(), 1));
    }

    /// A crash victim's window as it died must hold what its requester saw
    /// succeed: one missing a WRITE the requester had completed fails.
    #[test]
    fn a_crashed_responders_window_missing_a_completed_write_fails_the_check() {
        let write = Operation::Write {
            offset: 0,
            data: vec![7; 8],
            immediate: None,
        };
        let stream = stream_of(vec![write.clone(), write]);
        let mut failures = Vec::new();
        let untouched = vec![0u8; WINDOW_BYTES as usize];
        check_responder_window(&stream, &untouched, 1, &mut |failure| {
            failures.push(failure)
        });
        assert_eq!(failures.len(), 1, "{failures:?}");
        let mut written = untouched;
        written[..8].fill(7);
        failures.clear();
        check_responder_window(&stream, &written, 1, &mut |failure| failures.push(failure));
        assert!(failures.is_empty(), "{failures:?}");
    }

    /// A NAK refusing the stream's violation acknowledges every request
    /// before it: a WRITE flushed ahead of it had landed, and the check
    /// let it pass. A READ whose answer never came may be flushed, and
    /// what follows it with it.
    #[test]
    fn a_write_flushed_before_a_refused_violation_fails_the_check() {
        use CompletionStatus::{RemoteAccessError, Success, WorkRequestFlushError as Flush};
        let write = Operation::Write {
            offset: 0,
            data: vec![1; 8],
            immediate: None,
        };
        let read = Operation::Read {
            offset: 0,
            length: 8,
        };
        let violation = Operation::Violation(crate::operation::Violation::BadRkey);
        let flushed_write = stream_of(vec![write.clone(), violation.clone()]);
        let failures = requester_failures(&flushed_write, &[Flush, RemoteAccessError]);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(failures[0].contains("acknowledged"), "{failures:?}");
        assert!(requester_failures(&flushed_write, &[Success, RemoteAccessError]).is_empty());
        let read_first = stream_of(vec![read, write, violation]);
        let failures = requester_failures(&read_first, &[Flush, Flush, RemoteAccessError]);
        assert!(failures.is_empty(), "{failures:?}");
    }

    #[test]
    fn a_campaign_past_a_hosts_completion_queue_is_refused() {
        let config = ScenarioConfig {
            connections: 64,
            operations_per_stream: 1000,
            ..ScenarioConfig::default()
        };
        assert!(matches!(
            config.validate(),
            Err(ScenarioConfigError::TooManyCompletions(_))
        ));
        assert!(ScenarioConfig::default().validate().is_ok());
    }

    /// The safety phase's outcome was thrown away: a seed whose events ran
    /// out long before the phase's end (here after 46 µs of 400) had its
    /// faults stopped there, finished in the liveness phase, and passed.
    #[test]
    fn a_safety_phase_cut_short_by_the_event_budget_fails_the_seed() {
        let config = ScenarioConfig {
            max_events: 2_000,
            ..ScenarioConfig::default()
        };
        let report = run_seed(3, &config);
        assert!(
            report
                .failures
                .iter()
                .any(|failure| failure.starts_with("safety: 2000 events ran out")),
            "{:?}",
            report.failures
        );
        // The rest of the seed passed: only the cut-short phase fails it.
        assert_eq!(report.failures.len(), 1, "{:?}", report.failures);
        assert!(run_seed(3, &ScenarioConfig::default()).failures.is_empty());
    }

    /// No check read a host's read-only region, so a responder that applied
    /// a refused WRITE or atomic there before its NAK passed every seed.
    /// (The violating WRITE also carried zeros, which zeroed memory hides.)
    #[test]
    fn a_write_into_the_read_only_region_fails_the_seed() {
        let mut sim = Simulation::new(1);
        let config = RnicConfig::new(
            MacAddress([2, 0, 0, 0, 0, 1]),
            Ipv4Address::new(192, 0, 2, 1),
            1,
        );
        let id = sim.add_node(HostNode::new("host", config));
        let host = setup_host(&mut sim, id);
        let mut report = SeedReport::default();
        check_read_only_untouched(&sim, &host, &mut report);
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        device(&mut sim, id)
            .write_local(
                host.read_only.lkey,
                host.read_only.address,
                &[VIOLATION_MARKER],
            )
            .unwrap();
        check_read_only_untouched(&sim, &host, &mut report);
        assert_eq!(report.failures.len(), 1);
    }
}
