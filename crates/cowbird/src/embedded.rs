//! The hash-table probe benchmark on the embedded rack: real threads,
//! the real clock, the rack's in-process rings. A fabric thread runs the
//! switch, both soft RNICs and (for Cowbird-Spot) the engine, as the
//! memory node's spare CPU; the application thread probes the table.
//!
//! Variants:
//! - `local`: every record in compute-local memory;
//! - `sync`: one one-sided READ at a time;
//! - `async`: one-sided READs in batches, the application posting and
//!   polling the compute node's NIC itself, overlapping computation;
//! - `rpc`: two-sided: the application SENDs requests (batched as async)
//!   and the memory node's CPU SENDs the records back;
//! - `spot`: Cowbird's client library, the Spot engine moving the data;
//! - `spot_sync`: the same, one request at a time (latency unbatched);
//! - `p4`: Cowbird's client library, Cowbird-P4 in the switch moving the
//!   data (its CPU is the switch's, inside the fabric thread).
//!
//! [`run_histories`] runs the checked read/write histories of
//! [`crate::history`] through either engine here.
//!
//! The application's time inside communication calls is measured in its
//! own thread, split into issue and completion. The fabric thread's CPU
//! is NIC emulation and switch; the engine's time inside it is reported
//! apart.

use crate::client::{Client, Completion, CowbirdError};
use crate::config::{CowbirdConfig, CowbirdConfigError, EngineChoice};
use crate::deploy::{CowbirdSpec, Direct, DirectSpec, RpcSpec};
use crate::far_memory::{FarMemoryError, FarMemoryRack, Offload, RpcPath, RING_DEPTH};
use crate::hash_table::{calibrate, compute, is_record, record_bytes, record_of, TableSpec};
use crate::history::{Engine, Workload};
use crate::layout::RingSizes;
use crate::p4::{P4Config, P4Stats};
use crate::scenario::{histories, Outcome, ScenarioError};
use crate::simulated::p4_config;
use crate::spot::{SpotConfig, SpotStats};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use remora_rack::assembly::RackBuilder;
use remora_rack::endpoint::{lock, AppQueues, DriverKicker, RACK_ACK_TIMEOUT};
use remora_rack::topology::{Topology, COMPUTE_HOST, MEMORY_HOST};
use remora_rack::{RackConfig, RackError, Role};
use remora_rnic::*;
use remora_switch::ResourceReport;
use remora_wire::VirtAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Local,
    Sync,
    Async,
    Rpc,
    Spot,
    SpotSync,
    P4,
}

impl Variant {
    pub const ALL: [Variant; 7] = [
        Variant::Local,
        Variant::Sync,
        Variant::Async,
        Variant::Rpc,
        Variant::Spot,
        Variant::SpotSync,
        Variant::P4,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Local => "local",
            Variant::Sync => "sync",
            Variant::Async => "async",
            Variant::Rpc => "rpc",
            Variant::Spot => "spot",
            Variant::SpotSync => "spot_sync",
            Variant::P4 => "p4",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct ProbeBench {
    pub table: TableSpec,
    pub duration: Duration,
    /// Requests in one batch of the async and Spot variants (the paper's 100).
    pub batch: usize,
    pub spot: SpotConfig,
    /// Rounds of work per record, calibrated once so that every variant
    /// does the same work.
    pub work_rounds: u32,
    /// Application threads, each with its own fetcher (queue pair, RPC
    /// server or Cowbird instance) probing the same table.
    pub threads: usize,
    /// Each Cowbird instance's rings.
    pub sizes: RingSizes,
    /// Cowbird-P4's settings.
    pub p4: P4Config,
}

impl ProbeBench {
    /// Calibrates the table's work per record on this machine now.
    pub fn new(table: TableSpec, duration: Duration) -> ProbeBench {
        ProbeBench {
            table,
            duration,
            batch: 100,
            spot: SpotConfig::DEFAULT,
            work_rounds: calibrate(table.record_bytes, table.work_per_record),
            threads: 1,
            sizes: RingSizes::DEFAULT,
            p4: embedded_p4_config(),
        }
    }
}

/// What one variant measured.
#[derive(Debug, Clone)]
pub struct VariantOutcome {
    pub variant: Variant,
    pub operations: u64,
    pub remote_operations: u64,
    pub elapsed: Duration,
    /// Application time inside communication calls: issuing, and polls
    /// that returned completions.
    pub issue: Duration,
    pub completion: Duration,
    /// Polls that returned nothing: the application waiting.
    pub waiting: Duration,
    /// Issue to completion seen, per remote request, in ns.
    pub latency: Histogram<u64>,
    /// Fabric thread CPU (NIC emulation, switch, and the engine).
    pub fabric_cpu: Duration,
    /// The engine's share of the fabric thread.
    pub engine: Duration,
    pub engine_stats: Option<SpotStats>,
    /// Cowbird-P4's counters and resources, for its variant.
    pub p4: Option<(P4Stats, ResourceReport)>,
    /// Bytes through the compute node's NIC, both ways.
    pub network_bytes: u64,
    /// The memory node's NIC counters at the end (the engine's requester
    /// side for Spot): retransmissions and timeouts show up here.
    pub memory_rnic: RnicCounters,
}

impl VariantOutcome {
    pub fn operations_per_second(&self) -> f64 {
        self.operations as f64 / self.elapsed.as_secs_f64()
    }

    /// Application time in communication calls per remote request, ns.
    pub fn app_ns_per_remote(&self) -> f64 {
        (self.issue + self.completion).as_nanos() as f64 / self.remote_operations.max(1) as f64
    }

    /// Share of the run the application spent in communication calls
    /// (Figure 10's communication ratio).
    pub fn communication_ratio(&self) -> f64 {
        (self.issue + self.completion).as_secs_f64() / self.elapsed.as_secs_f64()
    }
}

/// How the application fetches remote records.
trait Fetcher {
    /// Starts fetching the record at `offset` of the pool; returns its
    /// token (below the window), or None if it must wait for completions.
    fn issue(&mut self, offset: u64) -> Result<Option<usize>, EmbeddedError>;
    /// Makes issued requests go (verbs post them here).
    fn flush(&mut self) -> Result<(), EmbeddedError>;
    /// Appends the tokens of finished fetches.
    fn poll(&mut self, done: &mut Vec<usize>) -> Result<(), EmbeddedError>;
    /// A finished fetch's bytes, until its token is issued again.
    fn bytes(&self, token: usize) -> &[u8];
}

/// Finished fetches' bytes, one record-sized slot per token, kept until
/// the token is issued again.
struct Arena {
    bytes: Vec<u8>,
    record_bytes: usize,
}

impl Arena {
    fn new(window: usize, record_bytes: usize) -> Arena {
        Arena {
            bytes: vec![0; window * record_bytes],
            record_bytes,
        }
    }

    fn slot(&self, token: usize) -> &[u8] {
        &self.bytes[token * self.record_bytes..(token + 1) * self.record_bytes]
    }

    fn slot_mut(&mut self, token: usize) -> &mut [u8] {
        &mut self.bytes[token * self.record_bytes..(token + 1) * self.record_bytes]
    }
}

/// The rack: endpoints, the pool filled with the table's remote records,
/// and the fabric thread.
/// Which part of an embedded run failed.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error(transparent)]
    Rack(#[from] RackError),
    #[error(transparent)]
    FarMemory(#[from] FarMemoryError),
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    #[error(transparent)]
    Client(#[from] CowbirdError),
    #[error(transparent)]
    Config(#[from] CowbirdConfigError),
    #[error("host memory: {0}")]
    HostMemory(#[from] HostMemoryOutOfBounds),
    #[error("latency histogram: {0}")]
    Histogram(String),
    #[error("{variant} verb completed with {status:?}")]
    Completion {
        variant: &'static str,
        status: CompletionStatus,
    },
    #[error("{in_flight} requests still unanswered 30 s after the run's end: the fabric stopped?")]
    Stalled { in_flight: usize },
    #[error("the RPC server refused a request")]
    RpcRefused,
    #[error("no {0} deployed for another application thread")]
    NoPath(&'static str),
    #[error("{which} record {record} came back wrong")]
    WrongRecord { which: &'static str, record: u64 },
    #[error("an application thread panicked")]
    Panicked,
    #[error("no application thread ran")]
    NoThreads,
}

fn histogram(error: impl std::fmt::Display) -> EmbeddedError {
    EmbeddedError::Histogram(error.to_string())
}

/// The P4 settings the embedded rack uses by default: the simulator's,
/// with the rack's timeout (a fabric thread descheduled for milliseconds
/// is not a lost packet).
pub fn embedded_p4_config() -> P4Config {
    P4Config {
        timeout: RACK_ACK_TIMEOUT,
        ..p4_config()
    }
}

/// The rack a variant probes: the direct paths (every variant but the
/// two Cowbird engines' reads them), RPC servers for `rpc`, and the
/// engine for the Cowbird variants; the pool holds the table's remote
/// records.
fn probe_rack(
    bench: &ProbeBench,
    variant: Variant,
    window: usize,
) -> Result<FarMemoryRack, EmbeddedError> {
    let offload = match variant {
        Variant::Spot | Variant::SpotSync => Offload::Spot,
        Variant::P4 => Offload::P4(bench.p4),
        Variant::Local | Variant::Sync | Variant::Async | Variant::Rpc => Offload::None,
    };
    let verbs = matches!(offload, Offload::None | Offload::Spot);
    let spec = CowbirdSpec {
        direct: verbs.then_some(DirectSpec {
            depth: window,
            landing_bytes: window * bench.table.record_bytes,
        }),
        rpc: (variant == Variant::Rpc).then_some(RpcSpec {
            depth: window,
            record_bytes: bench.table.record_bytes as u32,
        }),
        ..probe_spec(bench, bench.threads)
    };
    let table = bench.table;
    let fill = move |pool, memory: &mut SoftRnic| {
        fill_pool(&table, pool, memory).map_err(|error| FarMemoryError::Fill(error.to_string()))
    };
    Ok(FarMemoryRack::start(spec, offload, Box::new(fill))?)
}

/// The probe benchmark's Cowbird deployment: `threads` instances with
/// default rings over a pool holding the table's remote records.
fn probe_spec(bench: &ProbeBench, threads: usize) -> CowbirdSpec {
    CowbirdSpec {
        threads,
        sizes: bench.sizes,
        pool_regions: vec![bench.table.remote_bytes().max(1)],
        spot: bench.spot,
        ack_timeout: RACK_ACK_TIMEOUT,
        direct: None,
        rpc: None,
    }
}

/// Writes every remote record into the pool.
fn fill_pool(
    table: &TableSpec,
    pool: MemoryRegion,
    memory: &mut SoftRnic,
) -> Result<(), EmbeddedError> {
    for record in table.local_records()..table.records {
        let at = VirtAddr(pool.address.0 + table.remote_offset(record));
        memory.write_local(pool.lkey, at, &record_bytes(record, table.record_bytes))?;
    }
    Ok(())
}

/// One-sided READs posted by the application on the compute NIC through
/// its lock-free queues (a send queue and a doorbell, completions pushed
/// back), as a verbs application drives a real NIC.
struct VerbsFetcher {
    queues: AppQueues,
    kicker: DriverKicker,
    direct: Direct,
    pool: MemoryRegion,
    record_bytes: u32,
    free_slots: Vec<u64>,
    pending: Vec<SendRequest>,
    arena: Arena,
}

impl VerbsFetcher {
    fn new(
        rig: &mut FarMemoryRack,
        window: usize,
        record_bytes: usize,
    ) -> Result<VerbsFetcher, EmbeddedError> {
        let (direct, queues) = rig
            .direct
            .pop()
            .ok_or(EmbeddedError::NoPath("direct path"))?;
        Ok(VerbsFetcher {
            queues,
            kicker: rig.kicker(),
            direct,
            pool: rig.pool,
            record_bytes: record_bytes as u32,
            free_slots: (0..window as u64).rev().collect(),
            pending: Vec::with_capacity(window),
            arena: Arena::new(window, record_bytes),
        })
    }
}

impl Fetcher for VerbsFetcher {
    fn issue(&mut self, offset: u64) -> Result<Option<usize>, EmbeddedError> {
        let Some(slot) = self.free_slots.pop() else {
            return Ok(None);
        };
        let local = self
            .direct
            .landing_region
            .slice(slot * u64::from(self.record_bytes), self.record_bytes);
        let operation = SendOperation::Read {
            remote: self.pool.remote(offset),
        };
        self.pending
            .push(SendRequest::new(slot, operation, &[local])?);
        Ok(Some(slot as usize))
    }

    fn flush(&mut self) -> Result<(), EmbeddedError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        for request in self.pending.drain(..) {
            // The queue holds a whole window, so it is never full here.
            self.queues.post_send(self.direct.queue_pair, request)?;
        }
        self.kicker.kick();
        Ok(())
    }

    fn poll(&mut self, done: &mut Vec<usize>) -> Result<(), EmbeddedError> {
        let completion_queue = self.queues.completion_queue();
        while let Some(completion) = self.queues.poll_completion(completion_queue)? {
            if completion.status != CompletionStatus::Success {
                return Err(EmbeddedError::Completion {
                    variant: "a READ",
                    status: completion.status,
                });
            }
            let slot = completion.work_request_id as usize;
            let at = slot * self.record_bytes as usize;
            self.direct.landing.read(at, self.arena.slot_mut(slot))?;
            done.push(slot);
            self.free_slots.push(slot as u64);
        }
        Ok(())
    }

    fn bytes(&self, token: usize) -> &[u8] {
        self.arena.slot(token)
    }
}

/// The compute node's end of the two-sided path.
/// Two-sided fetches: a receive for the reply and a SEND of the request
/// per record, through the compute NIC's lock-free queues.
struct RpcFetcher {
    path: RpcPath,
    kicker: DriverKicker,
    slot_bytes: u64,
    window: u64,
    record_bytes: usize,
    free_slots: Vec<u64>,
    posted: bool,
    arena: Arena,
}

impl RpcFetcher {
    fn new(
        rig: &mut FarMemoryRack,
        window: usize,
        record_bytes: usize,
    ) -> Result<RpcFetcher, EmbeddedError> {
        let path = rig.rpc.pop().ok_or(EmbeddedError::NoPath("RPC path"))?;
        let slot_bytes = u64::from((record_bytes as u32).max(crate::rpc::REQUEST_BYTES));
        Ok(RpcFetcher {
            path,
            kicker: rig.kicker(),
            slot_bytes,
            window: window as u64,
            record_bytes,
            free_slots: (0..window as u64).rev().collect(),
            posted: false,
            arena: Arena::new(window, record_bytes),
        })
    }
}

impl Fetcher for RpcFetcher {
    fn issue(&mut self, offset: u64) -> Result<Option<usize>, EmbeddedError> {
        let Some(slot) = self.free_slots.pop() else {
            return Ok(None);
        };
        let request_at = slot * self.slot_bytes;
        let reply_at = (self.window + slot) * self.slot_bytes;
        let request = crate::rpc::encode_request(offset, self.record_bytes as u32);
        self.path.buffers.write(request_at as usize, &request)?;
        let region = self.path.buffers_region;
        let receive =
            ReceiveRequest::new(slot, &[region.slice(reply_at, self.record_bytes as u32)])?;
        let send = SendRequest::new(
            u64::MAX,
            SendOperation::Send { immediate: None },
            &[region.slice(request_at, crate::rpc::REQUEST_BYTES)],
        )?;
        let queue_pair = self.path.queue_pair;
        // The queues hold a whole window, so they are never full here.
        self.path.queues.post_receive(queue_pair, receive)?;
        self.path.queues.post_send(queue_pair, send)?;
        self.posted = true;
        Ok(Some(slot as usize))
    }

    fn flush(&mut self) -> Result<(), EmbeddedError> {
        if std::mem::take(&mut self.posted) {
            self.kicker.kick();
        }
        Ok(())
    }

    fn poll(&mut self, done: &mut Vec<usize>) -> Result<(), EmbeddedError> {
        let completion_queue = self.path.queues.completion_queue();
        while let Some(completion) = self.path.queues.poll_completion(completion_queue)? {
            if completion.status != CompletionStatus::Success {
                return Err(EmbeddedError::Completion {
                    variant: "an RPC",
                    status: completion.status,
                });
            }
            if completion.opcode != CompletionOpcode::Receive {
                continue;
            }
            if completion.byte_len as usize != self.record_bytes {
                return Err(EmbeddedError::RpcRefused);
            }
            let slot = completion.work_request_id;
            let reply_at = ((self.window + slot) * self.slot_bytes) as usize;
            self.path
                .buffers
                .read(reply_at, self.arena.slot_mut(slot as usize))?;
            done.push(slot as usize);
            self.free_slots.push(slot);
        }
        Ok(())
    }

    fn bytes(&self, token: usize) -> &[u8] {
        self.arena.slot(token)
    }
}

/// Cowbird: local loads and stores on the client's rings.
struct SpotFetcher {
    client: Client,
    poll_group: usize,
    window: usize,
    outstanding: usize,
    responses: Vec<Completion>,
    record_bytes: usize,
    arena: Arena,
}

impl SpotFetcher {
    fn new(
        rig: &mut FarMemoryRack,
        window: usize,
        record_bytes: usize,
    ) -> Result<SpotFetcher, EmbeddedError> {
        let mut client = rig
            .clients
            .pop()
            .ok_or(EmbeddedError::NoPath("Cowbird client"))?;
        let poll_group = client.poll_create()?;
        Ok(SpotFetcher {
            client,
            poll_group,
            window,
            outstanding: 0,
            responses: Vec::with_capacity(window),
            record_bytes,
            arena: Arena::new(window, record_bytes),
        })
    }

    /// Reads complete in sequence order and at most a window is
    /// outstanding, so a read's sequence modulo the window is a free token.
    fn token(&self, id: crate::layout::RequestId) -> usize {
        (id.sequence() % self.window as u64) as usize
    }
}

impl Fetcher for SpotFetcher {
    fn issue(&mut self, offset: u64) -> Result<Option<usize>, EmbeddedError> {
        if self.outstanding == self.window {
            return Ok(None);
        }
        let id = match self.client.async_read(0, offset, self.record_bytes) {
            Ok(id) => id,
            Err(CowbirdError::RetryLater(_)) => return Ok(None),
            Err(error) => return Err(error.into()),
        };
        self.client.poll_add(self.poll_group, id)?;
        self.outstanding += 1;
        Ok(Some(self.token(id)))
    }

    fn flush(&mut self) -> Result<(), EmbeddedError> {
        Ok(())
    }

    fn poll(&mut self, done: &mut Vec<usize>) -> Result<(), EmbeddedError> {
        self.responses.clear();
        self.client.poll_wait(
            self.poll_group,
            &mut self.responses,
            usize::MAX,
            Duration::ZERO,
        )?;
        for completion in &self.responses {
            let token = self.token(completion.id);
            self.client
                .response(completion, self.arena.slot_mut(token))?;
            done.push(token);
            self.outstanding -= 1;
        }
        Ok(())
    }

    fn bytes(&self, token: usize) -> &[u8] {
        self.arena.slot(token)
    }
}

/// Counts and timings of the application loop.
struct Tally {
    operations: u64,
    remote_operations: u64,
    issue: Duration,
    completion: Duration,
    waiting: Duration,
    latency: Histogram<u64>,
}

/// Probes the table for `duration`, keeping up to `window` remote
/// records in flight and computing on each record as it arrives.
/// How long a probe run waits, after its duration, for the requests it
/// has in flight.
const DRAIN_LIMIT: Duration = Duration::from_secs(30);

fn probe_loop(
    bench: &ProbeBench,
    fetcher: &mut dyn Fetcher,
    window: usize,
    seed: u64,
    drain_limit: Duration,
) -> Result<(Tally, Duration), EmbeddedError> {
    let table = bench.table;
    let rounds = bench.work_rounds;
    let local: Vec<Vec<u8>> = (0..table.local_records())
        .map(|record| record_bytes(record, table.record_bytes))
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut tally = Tally {
        operations: 0,
        remote_operations: 0,
        issue: Duration::ZERO,
        completion: Duration::ZERO,
        waiting: Duration::ZERO,
        latency: Histogram::new_with_bounds(1, 60_000_000_000, 3).map_err(histogram)?,
    };
    let mut token_record = vec![0u64; window];
    let mut token_issued = vec![Instant::now(); window];
    let mut done = Vec::with_capacity(window);
    let mut ready_local = Vec::with_capacity(window);
    let mut in_flight = 0usize;
    let started = Instant::now();
    let mut finishing = false;
    loop {
        finishing |= started.elapsed() >= bench.duration;
        if finishing && in_flight == 0 {
            break;
        }
        // Bounded: a fabric thread that stopped with an error answers
        // nothing more, and the run waited for its requests for ever.
        if finishing && started.elapsed() > bench.duration + drain_limit {
            return Err(EmbeddedError::Stalled { in_flight });
        }
        // Issue: choose a window's records; local ones wait for the
        // compute phase, remote ones go to the fetcher. Phases are timed
        // once per pass with the TSC-backed clock (a thread CPU clock
        // read is a system call here, which would cost more than the
        // calls it times).
        let issued_at_pass = Instant::now();
        for _ in 0..window {
            if finishing || in_flight == window {
                break;
            }
            let record = record_of(rng.gen(), table.records);
            if table.is_local(record) {
                ready_local.push(record);
                continue;
            }
            let Some(token) = fetcher.issue(table.remote_offset(record))? else {
                break;
            };
            token_record[token] = record;
            token_issued[token] = issued_at_pass;
            in_flight += 1;
        }
        fetcher.flush()?;
        let poll_started = Instant::now();
        done.clear();
        fetcher.poll(&mut done)?;
        let poll = poll_started.elapsed();
        tally.issue += poll_started - issued_at_pass;
        // A poll that found nothing is waiting, which an application with
        // other work would spend on it: counted apart.
        match done.is_empty() {
            true => tally.waiting += poll,
            false => tally.completion += poll,
        }
        // Compute on every record this pass brought.
        for record in ready_local.drain(..) {
            let bytes = &local[record as usize];
            if !is_record(bytes, record) {
                return Err(EmbeddedError::WrongRecord {
                    which: "local",
                    record,
                });
            }
            compute(bytes, rounds);
            tally.operations += 1;
        }
        for token in &done {
            let (record, bytes) = (token_record[*token], fetcher.bytes(*token));
            if !is_record(bytes, record) {
                return Err(EmbeddedError::WrongRecord {
                    which: "remote",
                    record,
                });
            }
            let latency = token_issued[*token].elapsed();
            tally.latency.saturating_record(latency.as_nanos() as u64);
            compute(bytes, rounds);
            tally.operations += 1;
            tally.remote_operations += 1;
            in_flight -= 1;
        }
    }
    Ok((tally, started.elapsed()))
}

/// Runs `probe_loop` on one application thread per fetcher, all at once,
/// and sums what they did (the run lasts as long as the slowest thread).
fn probe_threads(
    bench: &ProbeBench,
    fetchers: Vec<Box<dyn Fetcher + Send>>,
    window: usize,
    seed: u64,
) -> Result<(Tally, Duration), EmbeddedError> {
    let results: Vec<Result<(Tally, Duration), EmbeddedError>> = std::thread::scope(|scope| {
        let threads: Vec<_> = fetchers
            .into_iter()
            .enumerate()
            .map(|(index, mut fetcher)| {
                let seed = seed.wrapping_mul(1_000).wrapping_add(index as u64);
                scope.spawn(move || probe_loop(bench, fetcher.as_mut(), window, seed, DRAIN_LIMIT))
            })
            .collect();
        threads
            .into_iter()
            .map(|thread| thread.join().unwrap_or(Err(EmbeddedError::Panicked)))
            .collect()
    });
    let mut total: Option<(Tally, Duration)> = None;
    for result in results {
        let (tally, elapsed) = result?;
        total = Some(match total {
            None => (tally, elapsed),
            Some((mut sum, longest)) => {
                sum.operations += tally.operations;
                sum.remote_operations += tally.remote_operations;
                sum.issue += tally.issue;
                sum.completion += tally.completion;
                sum.waiting += tally.waiting;
                sum.latency.add(&tally.latency).map_err(histogram)?;
                (sum, longest.max(elapsed))
            }
        });
    }
    total.ok_or(EmbeddedError::NoThreads)
}

/// Runs one variant on a fresh rack.
pub fn run_variant(
    bench: &ProbeBench,
    variant: Variant,
    seed: u64,
) -> Result<VariantOutcome, EmbeddedError> {
    let bench = *bench;
    std::thread::Builder::new()
        .name(format!("probe-{}", variant.name()))
        .spawn(move || measure(&bench, variant, seed))
        .map_err(|error| RackError::Launch(error.to_string()))?
        .join()
        .map_err(|_| EmbeddedError::Panicked)?
}

fn measure(
    bench: &ProbeBench,
    variant: Variant,
    seed: u64,
) -> Result<VariantOutcome, EmbeddedError> {
    let window = match variant {
        Variant::Sync | Variant::SpotSync => 1,
        // Two batches: one in flight while the other is processed.
        Variant::Local | Variant::Async | Variant::Rpc | Variant::Spot | Variant::P4 => {
            2 * bench.batch
        }
    };
    let mut table_bench = *bench;
    if variant == Variant::Local {
        table_bench.table.local_fraction = 1.0;
    }
    let mut rig = probe_rack(&table_bench, variant, window)?;
    let compute_before = lock(rig.compute()).rnic.counters().clone();
    let record_bytes = bench.table.record_bytes;
    let mut fetchers = Vec::with_capacity(bench.threads);
    for _ in 0..bench.threads {
        let fetcher: Box<dyn Fetcher + Send> = match variant {
            Variant::Local | Variant::Sync | Variant::Async => {
                Box::new(VerbsFetcher::new(&mut rig, window, record_bytes)?)
            }
            Variant::Rpc => Box::new(RpcFetcher::new(&mut rig, window, record_bytes)?),
            Variant::Spot | Variant::SpotSync | Variant::P4 => {
                Box::new(SpotFetcher::new(&mut rig, window, record_bytes)?)
            }
        };
        fetchers.push(fetcher);
    }
    let (tally, elapsed) = probe_threads(&table_bench, fetchers, window, seed)?;
    let compute_after = lock(rig.compute()).rnic.counters().clone();
    let network_bytes = (compute_after.bytes_received + compute_after.bytes_transmitted)
        - (compute_before.bytes_received + compute_before.bytes_transmitted);
    let engine_busy = Duration::from_nanos(
        rig.engine_busy
            .iter()
            .map(|busy| busy.load(Ordering::Relaxed))
            .sum(),
    );
    let fabric_cpu = rig.rack.stop_and_join()?;
    let engine_stats = rig
        .engine
        .as_ref()
        .map(|engine| engine.lock().expect("engine lock").stats());
    let memory_rnic = lock(rig.memory()).rnic.counters().clone();
    let p4 = rig.p4_switch.as_ref().map(|switch| {
        let switch = &lock(switch).switch;
        (switch.program().stats(), switch.resources())
    });
    Ok(VariantOutcome {
        variant,
        operations: tally.operations,
        remote_operations: tally.remote_operations,
        elapsed,
        issue: tally.issue,
        completion: tally.completion,
        waiting: tally.waiting,
        latency: tally.latency,
        fabric_cpu,
        engine: engine_busy,
        engine_stats,
        p4,
        network_bytes,
        memory_rnic,
    })
}

/// Runs [`crate::history`]'s checked read/write histories on the embedded
/// rack (real threads, real clock, in-process rings) through the engine
/// `workload.engine` names, on `topology`'s compute and memory hosts
/// (with its links' shapes and faults): [`crate::scenario::histories`].
/// The compute host has a CPU of its own, on which the application and
/// the connection service run, as on a real compute node; the Spot
/// engine is an agent of the memory host on the fabric thread. Gives up
/// after `time_limit`.
pub fn run_histories(
    seed: u64,
    workload: &Workload,
    topology: &Topology,
    time_limit: Duration,
) -> Result<Outcome, ScenarioError> {
    let _span = tracing::info_span!("cowbird_embedded", seed, engine = ?workload.engine).entered();
    let stage = RackBuilder::new(topology)
        .thread_name("cowbird-fabric")
        .ring_depth(RING_DEPTH)
        .nic_seed(0xc0b ^ seed)
        .own_cpu(COMPUTE_HOST)
        .build()?;
    histories(stage, seed, workload, None, time_limit)
}

/// Cowbird as a rack file's `[cowbird]` section asks for: the checked
/// workload (engine, threads, rings, engine settings) and the placement of
/// the rack's first compute and memory nodes. None without the section.
pub fn from_rack(rack: &RackConfig) -> Result<Option<(Workload, Topology)>, CowbirdConfigError> {
    let Some(config) = CowbirdConfig::from_rack(rack)? else {
        return Ok(None);
    };
    let (Some(compute), Some(memory)) = (
        rack.first_node(Role::Compute),
        rack.first_node(Role::Memory),
    ) else {
        return Err(CowbirdConfigError::NoHosts);
    };
    let mut workload = Workload::new(remora_sim::LinkFaults::NONE);
    workload.engine = match config.engine {
        EngineChoice::Spot => Engine::Spot,
        EngineChoice::P4 => Engine::P4,
    };
    workload.threads = config.threads;
    workload.operations_per_thread = config.operations;
    workload.sizes = RingSizes {
        metadata_entries: config.metadata_entries,
        request_data_bytes: config.request_data_bytes,
        response_data_bytes: config.response_data_bytes,
    };
    workload.spot = SpotConfig {
        batch_entries: config.spot.batch_entries,
        probe_interval_min: Duration::from_micros(config.spot.probe_interval_min_us),
        probe_interval_max: Duration::from_micros(config.spot.probe_interval_max_us),
    };
    workload.p4 = P4Config {
        probe_period: Duration::from_micros(config.p4.probe_period_us),
        timeout: Duration::from_micros(config.p4.timeout_us),
        max_entries_in_flight: config.p4.max_entries_in_flight,
        // Checked to be one of the five IB MTUs when the section was read.
        path_mtu: Mtu::new(config.p4.path_mtu)
            .map_err(|error| CowbirdConfigError::Invalid(error.to_string()))?,
        ..p4_config()
    };
    if workload.engine == Engine::P4 {
        workload.max_write_length = workload.max_write_length.min(config.p4.path_mtu as usize);
    }
    // The rack's first compute and memory nodes, with their links.
    let topology = rack.topology();
    let mut pair = Topology::pair((compute.mac, compute.address), (memory.mac, memory.address));
    pair.switch_mac = rack.switch_mac;
    pair.set_link(COMPUTE_HOST, topology.host(usize::from(compute.port)).link);
    pair.set_link(MEMORY_HOST, topology.host(usize::from(memory.port)).link);
    Ok(Some((workload, pair)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fetcher whose fabric has stopped: it takes requests and never
    /// finishes one.
    struct Silent;

    impl Fetcher for Silent {
        fn issue(&mut self, offset: u64) -> Result<Option<usize>, EmbeddedError> {
            Ok(Some((offset % 4) as usize))
        }
        fn flush(&mut self) -> Result<(), EmbeddedError> {
            Ok(())
        }
        fn poll(&mut self, _done: &mut Vec<usize>) -> Result<(), EmbeddedError> {
            Ok(())
        }
        fn bytes(&self, _token: usize) -> &[u8] {
            &[]
        }
    }

    /// A probe run whose fabric thread stopped with an error waited for
    /// its requests in flight for ever. It gives up, with a typed error.
    #[test]
    fn a_probe_run_whose_fabric_stopped_ends_with_an_error() {
        let bench = ProbeBench {
            table: TableSpec {
                local_fraction: 0.0,
                ..TableSpec::DEFAULT
            },
            duration: Duration::from_millis(1),
            batch: 100,
            spot: SpotConfig::DEFAULT,
            work_rounds: 0,
            threads: 1,
            sizes: RingSizes::DEFAULT,
            p4: embedded_p4_config(),
        };
        let outcome = probe_loop(&bench, &mut Silent, 4, 1, Duration::from_millis(20));
        assert!(matches!(
            outcome,
            Err(EmbeddedError::Stalled { in_flight: 4 })
        ));
    }
}
