//! Cowbird in the deterministic simulator: a compute node whose threads
//! issue mixed async reads and writes through the client library, the
//! switch, and a memory node running the Spot engine, over links that may
//! lose, duplicate and reorder frames.
//!
//! The engine is the Spot engine on the memory node or Cowbird-P4 in the
//! switch ([`Engine`]).
//!
//! Every thread works in its own window of the pool, so a plain model
//! predicts every read: through Spot, a read sees every write its thread
//! issued before it and none after. Cowbird-P4 may redo a read after a
//! go-back, when writes issued after it (and still incomplete, so
//! concurrent with it) may have reached the pool; such a read may see the
//! model after any prefix of those writes, which is what linearizability
//! allows, and nothing else. The run checks each read against that, that
//! each request completed exactly once and in order within its type, and
//! that the pool equals the models at the end.

use crate::client::Client;
use crate::client::Completion;
use crate::deploy::{deploy, deploy_p4, CowbirdSpec, SwitchPorts};
use crate::layout::{Kind, RequestId, RingSizes};
use crate::p4::{CowbirdP4, P4Config, P4Stats};
use crate::spot::{SpotConfig, SpotStats};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use remora_fabric::node::RnicNode;
use remora_rnic::{MemoryRegion, RnicConfig, SoftRnic, Timestamp, Verbs};
use remora_sim::PortId;
use remora_sim::{LinkConfig, LinkFaults};
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::simulated::SimulatedRack;
use remora_switch::Program;
use remora_wire::{Ipv4Address, MacAddress, VirtAddr};
use std::collections::VecDeque;
use std::time::Duration;

const COMPUTE: u8 = 1;
const MEMORY: u8 = 2;
const TICK: Duration = Duration::from_micros(1);

pub fn mac(index: u8) -> MacAddress {
    MacAddress([0x02, 0, 0, 0, 0xc0, index])
}

pub fn ip(index: u8) -> Ipv4Address {
    Ipv4Address::new(10, 0, 1, index)
}

/// The rack's forwarding between the two hosts.
pub fn forwarding() -> L2L3Forwarding {
    let hosts = [COMPUTE, MEMORY].map(|index| (mac(index), ip(index)));
    L2L3Forwarding::with_attached_hosts(MacAddress([0x02, 0x5e, 0, 0, 0, 0xfe]), &hosts)
        .expect("two hosts fit the tables")
}

/// A checked workload.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    pub threads: usize,
    pub operations_per_thread: u64,
    /// Requests a thread keeps outstanding.
    pub depth: usize,
    pub window_bytes: u64,
    pub max_length: usize,
    /// Writes are at most this long (Cowbird-P4 caps them at the MTU).
    pub max_write_length: usize,
    pub read_fraction: f64,
    pub faults: LinkFaults,
    pub spot: SpotConfig,
    pub engine: Engine,
}

/// Which offload engine serves the clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Spot,
    P4,
}

impl Workload {
    pub fn new(faults: LinkFaults) -> Workload {
        Workload {
            threads: 3,
            operations_per_thread: 400,
            depth: 16,
            window_bytes: 2048,
            max_length: 300,
            max_write_length: crate::layout::MAX_REQUEST_BYTES as usize,
            read_fraction: 0.6,
            faults,
            spot: SpotConfig::DEFAULT,
            engine: Engine::Spot,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Outcome {
    pub simulated: Duration,
    pub completed: u64,
    pub reads_checked: u64,
    /// The Spot engine's counters (zero under Cowbird-P4).
    pub engine: SpotStats,
    /// Cowbird-P4's counters, when it was the engine.
    pub switch_engine: Option<P4Stats>,
    pub retransmissions: u64,
}

/// What a read may return: the model when it was issued, then after each
/// later write of its thread that overlaps it.
struct ExpectedRead {
    offset: usize,
    candidates: Vec<Vec<u8>>,
}

/// One application thread of the workload, with its model.
struct Thread {
    index: usize,
    poll_group: usize,
    model: Vec<u8>,
    issued: u64,
    /// Outstanding requests in issue order, with what a read may return.
    expected: VecDeque<(RequestId, Option<ExpectedRead>)>,
    last_completed: [u64; 2],
}

fn kind_index(kind: Kind) -> usize {
    match kind {
        Kind::Read => 0,
        Kind::Write => 1,
    }
}

impl Thread {
    fn window_base(&self, workload: &Workload) -> u64 {
        self.index as u64 * workload.window_bytes
    }

    fn issue(
        &mut self,
        workload: &Workload,
        client: &mut crate::client::Client,
        rng: &mut ChaCha8Rng,
    ) -> Result<bool, String> {
        if self.issued == workload.operations_per_thread || self.expected.len() >= workload.depth {
            return Ok(false);
        }
        let read = rng.gen_bool(workload.read_fraction);
        let mut length = rng.gen_range(1..=workload.max_length);
        if !read {
            length = length.min(workload.max_write_length);
        }
        let offset = rng.gen_range(0..=workload.window_bytes as usize - length);
        let remote = self.window_base(workload) + offset as u64;
        let result = if read {
            client.async_read(0, remote, length).map(|id| {
                let candidates = vec![self.model[offset..offset + length].to_vec()];
                (id, Some(ExpectedRead { offset, candidates }))
            })
        } else {
            let bytes: Vec<u8> = (0..length).map(|_| rng.gen()).collect();
            client.async_write(0, remote, &bytes).map(|id| {
                self.model[offset..offset + length].copy_from_slice(&bytes);
                self.note_write(offset, length);
                (id, None)
            })
        };
        let (id, expected) = match result {
            Ok(issued) => issued,
            Err(crate::client::CowbirdError::RetryLater(_)) => return Ok(false),
            Err(error) => return Err(error.to_string()),
        };
        client
            .poll_add(self.poll_group, id)
            .map_err(|error| error.to_string())?;
        self.expected.push_back((id, expected));
        self.issued += 1;
        Ok(true)
    }

    /// A write landed in the model: outstanding reads it overlaps may see
    /// it, once their engine may have redone them.
    fn note_write(&mut self, offset: usize, length: usize) {
        for (_, read) in &mut self.expected {
            let Some(read) = read else { continue };
            let read_length = read.candidates[0].len();
            if offset < read.offset + read_length && read.offset < offset + length {
                let now = self.model[read.offset..read.offset + read_length].to_vec();
                read.candidates.push(now);
            }
        }
    }

    fn check(
        &mut self,
        engine: Engine,
        client: &crate::client::Client,
        completion: &Completion,
    ) -> Result<bool, String> {
        let id = completion.id;
        let kind = kind_index(id.kind());
        if id.sequence() <= self.last_completed[kind] {
            return Err(format!("{id:?} completed out of order or twice"));
        }
        self.last_completed[kind] = id.sequence();
        let position = self
            .expected
            .iter()
            .position(|(expected, _)| *expected == id)
            .ok_or(format!("{id:?} completed but was not outstanding"))?;
        let (_, read) = self.expected.remove(position).expect("found");
        let Some(read) = read else {
            return Ok(false);
        };
        let mut seen = vec![0u8; read.candidates[0].len()];
        client
            .response(completion, &mut seen)
            .map_err(|error| error.to_string())?;
        let allowed = match engine {
            Engine::Spot => &read.candidates[..1],
            Engine::P4 => &read.candidates[..],
        };
        if !allowed.contains(&seen) {
            let first_difference: Vec<Option<usize>> = allowed
                .iter()
                .map(|bytes| bytes.iter().zip(&seen).position(|(a, b)| a != b))
                .collect();
            return Err(format!(
                "thread {}: {id:?} of {} bytes at offset {} read bytes the model does not allow; first difference from each allowed version: {first_difference:?}; zero bytes read: {}",
                self.index,
                seen.len(),
                read.offset,
                seen.iter().filter(|byte| **byte == 0).count(),
            ));
        }
        Ok(true)
    }
}

fn spec(workload: &Workload) -> CowbirdSpec {
    CowbirdSpec {
        threads: workload.threads,
        sizes: RingSizes {
            metadata_entries: 64,
            request_data_bytes: 8192,
            response_data_bytes: 8192,
        },
        pool_regions: vec![workload.window_bytes * workload.threads as u64],
        spot: workload.spot,
        ack_timeout: Duration::from_micros(200),
        direct: None,
        rpc: None,
    }
}

const COMPUTE_HOST: usize = 0;
const MEMORY_HOST: usize = 1;

/// Cowbird-P4's address on the wire.
pub fn p4_config() -> P4Config {
    P4Config::new(
        MacAddress([0x02, 0xc0, 0xb1, 0, 0, 0xfe]),
        Ipv4Address::new(10, 0, 1, 254),
    )
}

/// Runs the workload on one seed; errors say what went wrong.
pub fn run(seed: u64, workload: &Workload) -> Result<Outcome, String> {
    let text = |error: &dyn std::fmt::Display| format!("seed {seed}: {error}");
    let mut compute = RnicNode::new(RnicConfig::new(mac(COMPUTE), ip(COMPUTE), seed));
    let mut memory = RnicNode::new(RnicConfig::new(mac(MEMORY), ip(MEMORY), seed ^ 0xc0b));
    let mut link = LinkConfig::rack();
    link.faults = workload.faults;
    let spec = spec(workload);
    match workload.engine {
        Engine::Spot => {
            let mut deployment =
                deploy(spec, &mut compute.device, &mut memory.device).map_err(|e| text(&e))?;
            let mut rack = SimulatedRack::new(seed, forwarding(), vec![compute, memory], link);
            let mut engine = deployment.engine;
            let mut outcome = drive(
                seed,
                workload,
                &mut rack,
                &mut deployment.clients,
                deployment.pool[0],
                |now, rack| {
                    engine
                        .turn(now, rack.rnic(MEMORY_HOST))
                        .map(|_| ())
                        .map_err(|error| error.to_string())
                },
            )
            .map_err(|e| text(&e))?;
            outcome.engine = engine.stats();
            Ok(outcome)
        }
        Engine::P4 => {
            let mut program = CowbirdP4::new(p4_config(), forwarding());
            let ports = SwitchPorts {
                compute: PortId(COMPUTE_HOST as u16),
                memory: PortId(MEMORY_HOST as u16),
            };
            let mut deployment = deploy_p4(
                &spec,
                &mut compute.device,
                &mut memory.device,
                &mut program,
                ports,
            )
            .map_err(|e| text(&e))?;
            let template = program.probe_template();
            let mut rack = SimulatedRack::new(seed, program, vec![compute, memory], link);
            rack.switch_mut()
                .add_template(template, Timestamp::ZERO)
                .map_err(|e| text(&e))?;
            let outcome = drive(
                seed,
                workload,
                &mut rack,
                &mut deployment.clients,
                deployment.pool[0],
                |_, rack| match (0..spec.threads)
                    .find_map(|index| rack.program().failure(index).map(str::to_string))
                {
                    Some(failure) => Err(failure),
                    None => Ok(()),
                },
            );
            let mut outcome = outcome.map_err(|error| {
                let program = rack.program();
                let states: Vec<String> = (0..spec.threads)
                    .filter_map(|index| program.describe(index))
                    .collect();
                text(&format!(
                    "{error}; {:?}; {}",
                    program.stats(),
                    states.join("; ")
                ))
            })?;
            outcome.switch_engine = Some(rack.program().stats());
            Ok(outcome)
        }
    }
}

/// The application loop: threads issue, poll and check; `turn` gives the
/// engine its turn each tick; the simulation moves the rack.
fn drive<P: Program>(
    seed: u64,
    workload: &Workload,
    rack: &mut SimulatedRack<P>,
    clients: &mut [Client],
    pool: MemoryRegion,
    mut turn: impl FnMut(Timestamp, &mut SimulatedRack<P>) -> Result<(), String>,
) -> Result<Outcome, String> {
    let mut threads = Vec::with_capacity(workload.threads);
    for (index, client) in clients.iter_mut().enumerate() {
        threads.push(Thread {
            index,
            poll_group: client.poll_create().map_err(|e| e.to_string())?,
            model: vec![0u8; workload.window_bytes as usize],
            issued: 0,
            expected: VecDeque::new(),
            last_completed: [0, 0],
        });
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut completed, mut reads_checked) = (0u64, 0u64);
    let total = workload.operations_per_thread * workload.threads as u64;
    let limit = Timestamp::from_nanos(total * 20_000_000 + 1_000_000_000);
    let mut now = Timestamp::ZERO;
    let mut responses = Vec::new();
    while completed < total {
        now = now.max(rack.simulation.now());
        if now >= limit {
            return Err(format!(
                "{completed} of {total} requests completed before the time limit"
            ));
        }
        for (thread, client) in threads.iter_mut().zip(clients.iter_mut()) {
            while thread.issue(workload, client, &mut rng)? {}
            responses.clear();
            client
                .poll_wait(
                    thread.poll_group,
                    &mut responses,
                    usize::MAX,
                    Duration::ZERO,
                )
                .map_err(|e| e.to_string())?;
            for completion in &responses {
                reads_checked += u64::from(thread.check(workload.engine, client, completion)?);
                completed += 1;
            }
        }
        turn(now, rack)?;
        now = now.saturating_add(TICK);
        rack.simulation.run_until(now, 1_000_000);
    }
    check_pool(&threads, pool, rack.rnic(MEMORY_HOST), workload)?;
    let retransmissions = rack.rnic(MEMORY_HOST).counters().packets_retransmitted;
    Ok(Outcome {
        simulated: now.saturating_duration_since(Timestamp::ZERO),
        completed,
        reads_checked,
        engine: SpotStats::default(),
        switch_engine: None,
        retransmissions,
    })
}

/// The pool equals every thread's model.
fn check_pool(
    threads: &[Thread],
    pool: MemoryRegion,
    memory: &mut SoftRnic,
    workload: &Workload,
) -> Result<(), String> {
    for thread in threads {
        let mut bytes = vec![0u8; workload.window_bytes as usize];
        let at = VirtAddr(pool.address.0 + thread.window_base(workload));
        memory
            .read_local(pool.lkey, at, &mut bytes)
            .map_err(|error| error.to_string())?;
        if bytes != thread.model {
            return Err(format!(
                "thread {}'s window differs from its model at the end",
                thread.index
            ));
        }
    }
    Ok(())
}
