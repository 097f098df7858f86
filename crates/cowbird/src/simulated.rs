//! Cowbird in the deterministic simulator: a compute node whose threads
//! issue mixed async reads and writes through the client library, the
//! switch, and a memory node running the Spot engine, over links that may
//! lose, duplicate and reorder frames.
//!
//! Every thread works in its own window of the pool, so a plain model
//! predicts every read exactly: a read sees every write its thread issued
//! before it and none after. The run checks that each read returned the
//! model's bytes, that each request completed exactly once and in order
//! within its type, and that the pool equals the models at the end.

use crate::client::Completion;
use crate::deploy::{deploy, CowbirdSpec, Deployment};
use crate::layout::{Kind, RequestId, RingSizes};
use crate::spot::{SpotConfig, SpotStats};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use remora_fabric::node::RnicNode;
use remora_rnic::{RnicConfig, SoftRnic, Timestamp, Verbs};
use remora_sim::{LinkConfig, LinkFaults};
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::simulated::SimulatedRack;
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
    pub read_fraction: f64,
    pub faults: LinkFaults,
    pub spot: SpotConfig,
}

impl Workload {
    pub fn new(faults: LinkFaults) -> Workload {
        Workload {
            threads: 3,
            operations_per_thread: 400,
            depth: 16,
            window_bytes: 2048,
            max_length: 300,
            read_fraction: 0.6,
            faults,
            spot: SpotConfig::DEFAULT,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Outcome {
    pub simulated: Duration,
    pub completed: u64,
    pub reads_checked: u64,
    pub engine: SpotStats,
    pub retransmissions: u64,
}

/// One application thread of the workload, with its model.
struct Thread {
    index: usize,
    poll_group: usize,
    model: Vec<u8>,
    issued: u64,
    /// Outstanding requests in issue order, with a read's expected bytes.
    expected: VecDeque<(RequestId, Option<Vec<u8>>)>,
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
        let length = rng.gen_range(1..=workload.max_length);
        let offset = rng.gen_range(0..=workload.window_bytes as usize - length);
        let remote = self.window_base(workload) + offset as u64;
        let result = if rng.gen_bool(workload.read_fraction) {
            client
                .async_read(0, remote, length)
                .map(|id| (id, Some(self.model[offset..offset + length].to_vec())))
        } else {
            let bytes: Vec<u8> = (0..length).map(|_| rng.gen()).collect();
            client.async_write(0, remote, &bytes).map(|id| {
                self.model[offset..offset + length].copy_from_slice(&bytes);
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

    fn check(
        &mut self,
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
        let (_, bytes) = self.expected.remove(position).expect("found");
        let Some(bytes) = bytes else {
            return Ok(false);
        };
        let mut seen = vec![0u8; bytes.len()];
        client
            .response(completion, &mut seen)
            .map_err(|error| error.to_string())?;
        if seen != bytes {
            return Err(format!(
                "thread {}: {id:?} read {seen:?}, the model says {bytes:?}",
                self.index
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

/// Runs the workload on one seed; errors say what went wrong.
pub fn run(seed: u64, workload: &Workload) -> Result<Outcome, String> {
    let text = |error: &dyn std::fmt::Display| format!("seed {seed}: {error}");
    let mut compute = RnicNode::new(RnicConfig::new(mac(COMPUTE), ip(COMPUTE), seed));
    let mut memory = RnicNode::new(RnicConfig::new(mac(MEMORY), ip(MEMORY), seed ^ 0xc0b));
    let mut deployment =
        deploy(spec(workload), &mut compute.device, &mut memory.device).map_err(|e| text(&e))?;
    let mut link = LinkConfig::rack();
    link.faults = workload.faults;
    let mut rack = SimulatedRack::new(seed, forwarding(), vec![compute, memory], link);
    const MEMORY_HOST: usize = 1;
    let mut threads = Vec::with_capacity(workload.threads);
    for (index, client) in deployment.clients.iter_mut().enumerate() {
        threads.push(Thread {
            index,
            poll_group: client.poll_create().map_err(|e| text(&e))?,
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
            return Err(text(&format!(
                "{completed} of {total} requests completed before the time limit"
            )));
        }
        for (thread, client) in threads.iter_mut().zip(&mut deployment.clients) {
            while thread
                .issue(workload, client, &mut rng)
                .map_err(|e| text(&e))?
            {}
            responses.clear();
            client
                .poll_wait(
                    thread.poll_group,
                    &mut responses,
                    usize::MAX,
                    Duration::ZERO,
                )
                .map_err(|e| text(&e))?;
            for completion in &responses {
                reads_checked += u64::from(thread.check(client, completion).map_err(|e| text(&e))?);
                completed += 1;
            }
        }
        deployment
            .engine
            .turn(now, rack.rnic(MEMORY_HOST))
            .map_err(|e| text(&e))?;
        now = now.saturating_add(TICK);
        rack.simulation.run_until(now, 1_000_000);
    }
    check_pool(&threads, &deployment, rack.rnic(MEMORY_HOST), workload).map_err(|e| text(&e))?;
    let retransmissions = rack.rnic(MEMORY_HOST).counters().packets_retransmitted;
    Ok(Outcome {
        simulated: now.saturating_duration_since(Timestamp::ZERO),
        completed,
        reads_checked,
        engine: deployment.engine.stats(),
        retransmissions,
    })
}

/// The pool equals every thread's model.
fn check_pool(
    threads: &[Thread],
    deployment: &Deployment,
    memory: &mut SoftRnic,
    workload: &Workload,
) -> Result<(), String> {
    let pool = deployment.pool[0];
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
