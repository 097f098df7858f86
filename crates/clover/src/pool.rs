//! Many Clover clients multiplexed on one application thread.
//!
//! Each logical client owns one RC queue pair to the memory node (the
//! resolver tells clients apart by it) and blocks on its own request, as
//! in Clover: it has at most one request in flight, and one verb of it or
//! the two a chase posts together. A linked write's shortcut WRITE goes
//! out in the background, as Clover's collection thread sends it, at
//! most one per client at a time (RC completes a queue pair's verbs in
//! order, so it has landed before the client's next write links).
//! The pool is sans-IO in the sense that matters here: [`ClientPool::poll`]
//! takes the time and the soft RNIC, so the simulator and the rack drive
//! the same code. Requests to the metadata server (slot batches, tail
//! lookups) queue up and are answered by [`ClientPool::answer_metadata`],
//! the server's side of that RPC.

use crate::client::{
    ClientError, Lookup, Outcome, ReadOperation, Step, Thresholds, Trail, Verb, WriteOperation,
};
use crate::layout::{size_class, LayoutError, NextPointer, MAX_VALUE_BYTES, MIN_VALUE_BYTES};
use crate::metadata::{MetadataError, MetadataServer, RegionAccess, RegionPlan};
use hdrhistogram::Histogram;
use remora_rnic::{
    CompletionQueue, CompletionStatus, MemoryRegion, QueuePair, RemoteAddress, SendOperation,
    SendRequest, Timestamp, Verbs, VerbsError,
};
use remora_wire::{Rkey, VirtAddr};
use remora_workloads::history::{Event, EventKind};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::time::Duration;

/// Local bytes per client: the largest entry READ or WRITE, then three
/// 8-byte words at the end: the background shortcut WRITE's, the second
/// verb's of a pair, and the word a CAS returns.
pub const CLIENT_BUFFER_BYTES: u64 = 8192;
const BACKGROUND_AT: u64 = CLIENT_BUFFER_BYTES - 24;
const BESIDE_AT: u64 = CLIENT_BUFFER_BYTES - 16;
const ATOMIC_RESULT_AT: u64 = CLIENT_BUFFER_BYTES - 8;
/// Where a client's verb lands in its buffer and completion ids: a work
/// request id is `client × LANES + lane`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
enum Lane {
    /// A request's verb, or the first of a pair.
    First = 0,
    /// The second verb of a pair (an 8-byte READ).
    Beside = 1,
    /// A linked write's shortcut WRITE.
    Background = 2,
}
const LANES: u64 = 4;

impl Lane {
    /// The client and lane a work request id names.
    fn of_request(work_request_id: u64) -> (usize, Lane) {
        let lane = match work_request_id % LANES {
            0 => Lane::First,
            1 => Lane::Beside,
            2 => Lane::Background,
            other => panic!("no verb is posted in lane {other}"),
        };
        ((work_request_id / LANES) as usize, lane)
    }

    fn request_id(self, client: usize) -> u64 {
        client as u64 * LANES + self as u64
    }

    /// Where its verb lands within a client's buffer.
    fn within_buffer(self) -> u64 {
        match self {
            Lane::First => 0,
            Lane::Beside => BESIDE_AT,
            Lane::Background => BACKGROUND_AT,
        }
    }
}
/// The longest entry READ a client's buffer takes.
pub const MAX_ENTRY_READ_BYTES: usize = BACKGROUND_AT as usize;
/// Verbs one client may have in flight: a pair and a shortcut WRITE. A
/// client's completion queue and send queue need room for them all.
pub const MAX_VERBS_IN_FLIGHT: usize = 3;
/// Requests one client may have queued behind the running one.
pub const MAX_QUEUED_REQUESTS: usize = 1024;
/// Finished requests kept for [`ClientPool::take_finished`]; older ones
/// give way. Kept all, a run that never took them (every harness, which
/// reads `stats`) held each one, a read's value too: gigabytes over a
/// long run.
pub const MAX_FINISHED_KEPT: usize = 4096;
/// Completions one poll takes, so a poll stays short.
const COMPLETIONS_PER_POLL: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum CloverError {
    #[error("key {key} is not in the store (it holds keys 0..{key_count})")]
    UnknownKey { key: u64, key_count: u64 },
    #[error("a value of {0} bytes is outside the {MIN_VALUE_BYTES}..={MAX_VALUE_BYTES} bytes Clover stores")]
    ValueSize(usize),
    #[error("client {0} does not exist")]
    UnknownClient(usize),
    #[error("client {0} has {MAX_QUEUED_REQUESTS} requests queued: retry later")]
    QueueFull(usize),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    #[error(transparent)]
    Workload(#[from] remora_workloads::ycsb::WorkloadError),
    #[error("client {client}'s {verb} failed: {status:?}")]
    Completion {
        client: usize,
        verb: &'static str,
        status: CompletionStatus,
    },
    #[error("client {client}'s request (or its shortcut WRITE) ran past the {deadline:?} operation deadline, which garbage collection's grace relies on")]
    Deadline { client: usize, deadline: Duration },
    #[error("entry READs of {0} B do not fit a client's buffer (at most {max} B)", max = MAX_ENTRY_READ_BYTES)]
    EntryReadBytes(usize),
}

impl From<LayoutError> for CloverError {
    fn from(error: LayoutError) -> CloverError {
        match error {
            LayoutError::ValueSize(bytes) => CloverError::ValueSize(bytes),
            other => CloverError::Client(other.into()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Get { key: u64 },
    Put { key: u64, value: Vec<u8> },
}

impl Request {
    pub fn key(&self) -> u64 {
        match self {
            Request::Get { key } | Request::Put { key, .. } => *key,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Value(Vec<u8>),
    Stored,
}

/// A finished request.
#[derive(Debug, Clone)]
pub struct Completed {
    pub client: usize,
    pub key: u64,
    pub reply: Reply,
    pub latency: Duration,
    pub trail: Trail,
}

#[derive(Debug, Clone, Copy)]
pub struct PoolConfig {
    pub thresholds: Thresholds,
    /// Bytes a READ fetches per version (the expected size class).
    pub entry_read_bytes: usize,
    /// Cached locations older than this are not used.
    pub cache_lifetime: Duration,
    /// A request running longer than this fails the pool.
    pub operation_deadline: Duration,
    pub record_history: bool,
}

impl PoolConfig {
    pub const DEFAULT: PoolConfig = PoolConfig {
        thresholds: Thresholds::DEFAULT,
        entry_read_bytes: 64,
        cache_lifetime: Duration::from_millis(100),
        operation_deadline: Duration::from_millis(200),
        record_history: false,
    };
}

/// Totals over every finished request.
#[derive(Debug, Clone)]
pub struct PoolStats {
    pub reads: u64,
    pub writes: u64,
    pub conflicts: u64,
    pub hops: u64,
    pub jumps: u64,
    pub locates: u64,
    pub verbs: u64,
    /// Times a put found the region full and waited for collection.
    pub slot_waits: u64,
    /// Nanoseconds per request.
    pub latency: Histogram<u64>,
}

impl PoolStats {
    /// What was counted after `earlier`, a copy of these stats taken
    /// before.
    pub fn since(&self, earlier: &PoolStats) -> PoolStats {
        let mut latency = self.latency.clone();
        latency
            .subtract(&earlier.latency)
            .expect("an earlier copy holds no value this one lacks");
        PoolStats {
            reads: self.reads - earlier.reads,
            writes: self.writes - earlier.writes,
            conflicts: self.conflicts - earlier.conflicts,
            hops: self.hops - earlier.hops,
            jumps: self.jumps - earlier.jumps,
            locates: self.locates - earlier.locates,
            verbs: self.verbs - earlier.verbs,
            slot_waits: self.slot_waits - earlier.slot_waits,
            latency,
        }
    }

    fn new() -> PoolStats {
        PoolStats {
            reads: 0,
            writes: 0,
            conflicts: 0,
            hops: 0,
            jumps: 0,
            locates: 0,
            verbs: 0,
            slot_waits: 0,
            latency: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds"),
        }
    }
}

#[derive(Debug, Clone)]
enum Operation {
    Write(WriteOperation),
    Read(ReadOperation),
}

impl Operation {
    fn handle(&mut self, outcome: Outcome) -> Result<Step, ClientError> {
        match self {
            Operation::Write(write) => write.handle(outcome),
            Operation::Read(read) => read.handle(outcome),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Posted {
    Read(usize),
    Write,
    CompareSwap,
}

#[derive(Debug, Clone)]
enum Phase {
    /// A put waits for the metadata server's batch of slots.
    NeedsSlots,
    /// Verbs to post at the next poll: one, or a pair posted together.
    Ready(Vec<Verb>),
    /// Posted verbs by lane, and the outcomes landed so far.
    InFlight {
        posted: Vec<Posted>,
        landed: Vec<Option<Outcome>>,
    },
    /// A tail lookup waits for the metadata server.
    Locating,
}

/// A linked write's shortcut WRITE, sent in the background.
#[derive(Debug, Clone)]
struct Background {
    /// The WRITE, until it is posted.
    verb: Option<Verb>,
    /// When its write began touching remote memory: it must land within
    /// the operation deadline of this, as the write's own verbs must.
    operating_since: Timestamp,
}

#[derive(Debug, Clone)]
struct Running {
    request: Request,
    operation: Option<Operation>,
    /// When the request was taken from the queue (its latency counts
    /// from here).
    started: Timestamp,
    /// When its operation began touching remote memory: the deadline
    /// counts from here. A PUT waiting for slots holds no remote pointer,
    /// and counted from `started` it failed the run while collection
    /// (which frees slots only a grace later) was on its way.
    operating_since: Option<Timestamp>,
    phase: Phase,
}

struct Client {
    queue_pair: QueuePair,
    queued: VecDeque<Request>,
    running: Option<Running>,
    background: Option<Background>,
    slots: Vec<u64>,
    /// key → (a version, when the client learned of it).
    cache: FxHashMap<u64, (NextPointer, Timestamp)>,
}

pub struct ClientPool {
    config: PoolConfig,
    plan: RegionPlan,
    value_bytes: usize,
    clients: Vec<Client>,
    completion_queue: CompletionQueue,
    local: MemoryRegion,
    remote_base: VirtAddr,
    remote_key: Rkey,
    finished: std::collections::VecDeque<Completed>,
    history: Vec<Event>,
    stats: PoolStats,
}

/// What the pool needs of the rack: one connected queue pair per client,
/// their completion queue, a local region of
/// `clients × CLIENT_BUFFER_BYTES`, and the memory node's region.
pub struct PoolWiring {
    pub queue_pairs: Vec<QueuePair>,
    pub completion_queue: CompletionQueue,
    pub local: MemoryRegion,
    pub remote: RemoteAddress,
}

impl ClientPool {
    /// `value_bytes`: the size every put uses (one size class for the
    /// whole store keeps slot batches simple).
    pub fn new(
        config: PoolConfig,
        plan: RegionPlan,
        value_bytes: usize,
        wiring: PoolWiring,
    ) -> Result<ClientPool, CloverError> {
        size_class(value_bytes)?;
        if config.entry_read_bytes > MAX_ENTRY_READ_BYTES {
            return Err(CloverError::EntryReadBytes(config.entry_read_bytes));
        }
        let needed = wiring.queue_pairs.len() as u64 * CLIENT_BUFFER_BYTES;
        assert!(
            wiring.local.length_bytes >= needed,
            "the local region holds {} bytes, the clients need {needed}",
            wiring.local.length_bytes
        );
        let clients = wiring
            .queue_pairs
            .iter()
            .map(|queue_pair| Client {
                queue_pair: *queue_pair,
                queued: VecDeque::new(),
                running: None,
                background: None,
                slots: Vec::new(),
                cache: FxHashMap::default(),
            })
            .collect();
        Ok(ClientPool {
            config,
            plan,
            value_bytes,
            clients,
            completion_queue: wiring.completion_queue,
            local: wiring.local,
            remote_base: wiring.remote.address,
            remote_key: wiring.remote.rkey,
            finished: std::collections::VecDeque::new(),
            history: Vec::new(),
            stats: PoolStats::new(),
        })
    }

    pub fn client_count(&self) -> usize {
        self.clients.len()
    }

    pub fn stats(&self) -> &PoolStats {
        &self.stats
    }

    pub fn history(&self) -> &[Event] {
        &self.history
    }

    /// Whether a client has nothing running or queued: free for a
    /// request, though its last write's shortcut WRITE may still be in
    /// the background.
    pub fn is_idle(&self, client: usize) -> bool {
        self.clients
            .get(client)
            .is_some_and(|client| client.running.is_none() && client.queued.is_empty())
    }

    /// Whether every client is idle and every shortcut WRITE has landed.
    pub fn all_idle(&self) -> bool {
        (0..self.clients.len()).all(|client| self.is_idle(client))
            && self
                .clients
                .iter()
                .all(|client| client.background.is_none())
    }

    /// Queues a request for one client, checking it first.
    pub fn submit(&mut self, client: usize, request: Request) -> Result<(), CloverError> {
        self.plan
            .check_key(request.key())
            .map_err(|_| CloverError::UnknownKey {
                key: request.key(),
                key_count: self.plan.key_count,
            })?;
        if let Request::Put { value, .. } = &request {
            if value.len() != self.value_bytes {
                size_class(value.len())?;
                return Err(CloverError::ValueSize(value.len()));
            }
        }
        let slot = self
            .clients
            .get_mut(client)
            .ok_or(CloverError::UnknownClient(client))?;
        if slot.queued.len() >= MAX_QUEUED_REQUESTS {
            return Err(CloverError::QueueFull(client));
        }
        slot.queued.push_back(request);
        Ok(())
    }

    /// Finished requests since the last call, the newest
    /// [`MAX_FINISHED_KEPT`] of them.
    pub fn take_finished(&mut self) -> Vec<Completed> {
        std::mem::take(&mut self.finished).into()
    }

    /// Takes completions, advances clients and posts their verbs. Returns
    /// whether anything moved.
    pub fn poll(&mut self, now: Timestamp, rnic: &mut dyn Verbs) -> Result<bool, CloverError> {
        let mut moved = false;
        for _ in 0..COMPLETIONS_PER_POLL {
            let Some(completion) = rnic.poll_completion(self.completion_queue)? else {
                break;
            };
            moved = true;
            let (client, lane) = Lane::of_request(completion.work_request_id);
            // Before the completion advances the operation: past its
            // deadline, the collector may have reused what it points at,
            // so it posts no next verb and does not finish.
            self.check_deadline(now, client)?;
            self.complete(now, rnic, client, lane, completion.status)?;
        }
        for client in 0..self.clients.len() {
            self.check_deadline(now, client)?;
            moved |= self.post_background(rnic, client)?;
            moved |= self.start_next(now, client)?;
            moved |= self.post_ready(rnic, client)?;
        }
        Ok(moved)
    }

    fn check_deadline(&self, now: Timestamp, client: usize) -> Result<(), CloverError> {
        let deadline = self.config.operation_deadline;
        let Some(state) = self.clients.get(client) else {
            return Ok(());
        };
        let running_since = state
            .running
            .as_ref()
            .and_then(|running| running.operating_since);
        let background_since = state
            .background
            .as_ref()
            .map(|background| background.operating_since);
        let late = [running_since, background_since]
            .into_iter()
            .flatten()
            .any(|since| now.saturating_duration_since(since) > deadline);
        if late {
            return Err(CloverError::Deadline { client, deadline });
        }
        Ok(())
    }

    fn complete(
        &mut self,
        now: Timestamp,
        rnic: &mut dyn Verbs,
        client: usize,
        lane: Lane,
        status: CompletionStatus,
    ) -> Result<(), CloverError> {
        if lane == Lane::Background {
            if status != CompletionStatus::Success {
                return Err(CloverError::Completion {
                    client,
                    verb: "shortcut WRITE",
                    status,
                });
            }
            let background = self.clients[client].background.take();
            assert!(
                background.is_some_and(|background| background.verb.is_none()),
                "client {client} got a shortcut WRITE's completion with none posted"
            );
            return Ok(());
        }
        let running = self.clients[client]
            .running
            .as_ref()
            .expect("a completion belongs to a running request");
        let Phase::InFlight { posted, .. } = &running.phase else {
            panic!("client {client} got a completion with nothing in flight");
        };
        let posted = *posted
            .get(lane as usize)
            .unwrap_or_else(|| panic!("client {client} got a completion of lane {lane:?}"));
        if status != CompletionStatus::Success {
            let verb = match posted {
                Posted::Read(_) => "READ",
                Posted::Write => "WRITE",
                Posted::CompareSwap => "CAS",
            };
            return Err(CloverError::Completion {
                client,
                verb,
                status,
            });
        }
        let at = self.lane_buffer(client, lane);
        let outcome = match posted {
            Posted::Read(length) => {
                let mut bytes = vec![0; length];
                rnic.read_local(self.local.lkey, at, &mut bytes)?;
                Outcome::Read(bytes)
            }
            Posted::Write => Outcome::Written,
            Posted::CompareSwap => {
                let mut word = [0u8; 8];
                let at = VirtAddr(self.buffer(client).0 + ATOMIC_RESULT_AT);
                rnic.read_local(self.local.lkey, at, &mut word)?;
                Outcome::Swapped {
                    original: u64::from_le_bytes(word),
                }
            }
        };
        let running = self.clients[client].running.as_mut().expect("running");
        let Phase::InFlight { landed, .. } = &mut running.phase else {
            unreachable!("checked above");
        };
        assert!(
            landed[lane as usize].replace(outcome).is_none(),
            "client {client}'s lane {lane:?} completed twice"
        );
        if landed.iter().any(Option::is_none) {
            return Ok(());
        }
        let outcome = Outcome::gathered(landed.drain(..).flatten().collect());
        self.advance(now, client, outcome)
    }

    fn advance(
        &mut self,
        now: Timestamp,
        client: usize,
        outcome: Outcome,
    ) -> Result<(), CloverError> {
        let running = self.clients[client].running.as_mut().expect("running");
        let step = running
            .operation
            .as_mut()
            .expect("an advancing request has an operation")
            .handle(outcome)?;
        self.take_step(now, client, step);
        Ok(())
    }

    fn take_step(&mut self, now: Timestamp, client: usize, step: Step) {
        let running = self.clients[client].running.as_mut().expect("running");
        match step {
            step @ (Step::Issue(_) | Step::IssueBoth(_)) => {
                running.phase = Phase::Ready(step.into_verbs().expect("verbs"))
            }
            Step::Locate { .. } => running.phase = Phase::Locating,
            Step::Written {
                tail,
                trail,
                shortcut,
            } => {
                let operating_since = running
                    .operating_since
                    .expect("a linked write touched remote memory");
                // RC completes a queue pair's verbs in order: the last
                // shortcut WRITE landed before this write's CAS did.
                let earlier = self.clients[client].background.replace(Background {
                    verb: Some(shortcut),
                    operating_since,
                });
                assert!(
                    earlier.is_none(),
                    "client {client}'s last shortcut WRITE is still in flight"
                );
                self.finish(now, client, tail, Reply::Stored, trail)
            }
            Step::Value { tail, value, trail } => {
                self.finish(now, client, tail, Reply::Value(value), trail)
            }
        }
    }

    fn finish(
        &mut self,
        now: Timestamp,
        client: usize,
        tail: NextPointer,
        reply: Reply,
        trail: Trail,
    ) {
        let state = &mut self.clients[client];
        let running = state.running.take().expect("running");
        let key = running.request.key();
        // A tail learned from the shortcut or the server (or a version this
        // client just wrote) is as new as the request; one reached by
        // following a cached pointer is as old as that pointer.
        let learned = match (&reply, state.cache.get(&key)) {
            (Reply::Value(_), Some((_, learned))) if !trail.jumped => *learned,
            _ => running.started,
        };
        state.cache.insert(key, (tail, learned));
        let latency = now.saturating_duration_since(running.started);
        self.stats
            .latency
            .saturating_record(latency.as_nanos().max(1) as u64);
        self.stats.conflicts += u64::from(trail.conflicts);
        self.stats.hops += u64::from(trail.hops);
        self.stats.jumps += u64::from(trail.jumped);
        match &reply {
            Reply::Stored => self.stats.writes += 1,
            Reply::Value(_) => self.stats.reads += 1,
        }
        if self.config.record_history {
            let kind = match &reply {
                Reply::Stored => EventKind::WriteReturned,
                Reply::Value(value) => {
                    EventKind::ReadReturned(remora_workloads::history::value_id(value))
                }
            };
            self.history.push(Event {
                key,
                client,
                kind,
                at: now,
            });
        }
        if self.finished.len() >= MAX_FINISHED_KEPT {
            self.finished.pop_front();
        }
        self.finished.push_back(Completed {
            client,
            key,
            reply,
            latency,
            trail,
        });
    }

    fn lookup(&self, now: Timestamp, client: usize, key: u64) -> Lookup {
        let cached = self.clients[client]
            .cache
            .get(&key)
            .filter(|(_, learned)| {
                now.saturating_duration_since(*learned) < self.config.cache_lifetime
            })
            .map(|(pointer, _)| *pointer);
        Lookup {
            key,
            cached,
            shortcut: self
                .plan
                .shortcut_offset(key)
                .expect("keys are checked at submission"),
            thresholds: self.config.thresholds,
        }
    }

    /// Starts the client's next request if it is free.
    fn start_next(&mut self, now: Timestamp, client: usize) -> Result<bool, CloverError> {
        let state = &mut self.clients[client];
        if state.running.is_none() {
            let Some(request) = state.queued.pop_front() else {
                return Ok(false);
            };
            if self.config.record_history {
                let kind = match &request {
                    Request::Get { .. } => EventKind::ReadInvoked,
                    Request::Put { value, .. } => {
                        EventKind::WriteInvoked(remora_workloads::history::value_id(value))
                    }
                };
                self.history.push(Event {
                    key: request.key(),
                    client,
                    kind,
                    at: now,
                });
            }
            state.running = Some(Running {
                request,
                operation: None,
                started: now,
                operating_since: None,
                phase: Phase::NeedsSlots,
            });
        }
        let running = state.running.as_ref().expect("running");
        if running.operation.is_some() {
            return Ok(false);
        }
        let request = running.request.clone();
        let lookup = self.lookup(now, client, request.key());
        let state = &mut self.clients[client];
        let (operation, step) = match request {
            Request::Get { .. } => {
                let mut read = ReadOperation::new(lookup, self.config.entry_read_bytes);
                let step = read.start()?;
                (Operation::Read(read), step)
            }
            Request::Put { value, .. } => {
                // Without a slot the request waits for the server's batch.
                let Some(slot) = state.slots.pop() else {
                    return Ok(false);
                };
                let write = WriteOperation::new(lookup, &value, slot)?;
                let step = write.start();
                (Operation::Write(write), step)
            }
        };
        let running = state.running.as_mut().expect("running");
        running.operation = Some(operation);
        running.operating_since = Some(now);
        self.take_step(now, client, step);
        Ok(true)
    }

    fn buffer(&self, client: usize) -> VirtAddr {
        VirtAddr(self.local.address.0 + client as u64 * CLIENT_BUFFER_BYTES)
    }

    fn remote(&self, offset: u64) -> RemoteAddress {
        RemoteAddress {
            address: VirtAddr(self.remote_base.0 + offset),
            rkey: self.remote_key,
        }
    }

    /// Where a lane's verb lands in the client's buffer.
    fn lane_buffer(&self, client: usize, lane: Lane) -> VirtAddr {
        VirtAddr(self.buffer(client).0 + lane.within_buffer())
    }

    fn post_ready(&mut self, rnic: &mut dyn Verbs, client: usize) -> Result<bool, CloverError> {
        let Some(Running {
            phase: Phase::Ready(verbs),
            ..
        }) = self.clients[client].running.as_ref()
        else {
            return Ok(false);
        };
        // Cloned (a verb or two) so that the phase stays Ready until
        // every verb is posted.
        let verbs = verbs.clone();
        assert!(
            matches!(verbs.len(), 1 | 2),
            "a client posts one verb or a pair"
        );
        let lanes = [Lane::First, Lane::Beside];
        let mut posted = Vec::with_capacity(verbs.len());
        for (verb, lane) in verbs.iter().zip(lanes) {
            posted.push(self.post_verb(rnic, client, lane, verb)?);
        }
        let landed = vec![None; posted.len()];
        self.clients[client]
            .running
            .as_mut()
            .expect("running")
            .phase = Phase::InFlight { posted, landed };
        Ok(true)
    }

    /// Posts a linked write's shortcut WRITE, if one waits.
    fn post_background(
        &mut self,
        rnic: &mut dyn Verbs,
        client: usize,
    ) -> Result<bool, CloverError> {
        let Some(verb) = self.clients[client]
            .background
            .as_mut()
            .and_then(|background| background.verb.take())
        else {
            return Ok(false);
        };
        self.post_verb(rnic, client, Lane::Background, &verb)?;
        Ok(true)
    }

    fn post_verb(
        &mut self,
        rnic: &mut dyn Verbs,
        client: usize,
        lane: Lane,
        verb: &Verb,
    ) -> Result<Posted, CloverError> {
        let at = self.lane_buffer(client, lane);
        let within = at.0 - self.local.address.0;
        let room = match lane {
            Lane::First => BACKGROUND_AT,
            Lane::Beside | Lane::Background => 8,
        };
        let (operation, local, posted) = match verb {
            Verb::Read { offset, length } => {
                assert!(
                    *length as u64 <= room,
                    "a READ of {length} B in lane {lane:?}"
                );
                (
                    SendOperation::Read {
                        remote: self.remote(*offset),
                    },
                    self.local.slice(within, *length as u32),
                    Posted::Read(*length),
                )
            }
            Verb::Write { offset, bytes } => {
                assert!(
                    bytes.len() as u64 <= room,
                    "a WRITE of {} B in lane {lane:?}",
                    bytes.len()
                );
                rnic.write_local(self.local.lkey, at, bytes)?;
                (
                    SendOperation::Write {
                        remote: self.remote(*offset),
                        immediate: None,
                    },
                    self.local.slice(within, bytes.len() as u32),
                    Posted::Write,
                )
            }
            Verb::CompareSwap {
                offset,
                expect,
                swap,
            } => {
                assert_eq!(lane, Lane::First, "a CAS goes alone");
                (
                    SendOperation::CompareSwap {
                        remote: self.remote(*offset),
                        compare: *expect,
                        swap: *swap,
                    },
                    self.local
                        .slice(client as u64 * CLIENT_BUFFER_BYTES + ATOMIC_RESULT_AT, 8),
                    Posted::CompareSwap,
                )
            }
        };
        let request = SendRequest::new(lane.request_id(client), operation, &[local])?;
        rnic.post_send(self.clients[client].queue_pair, request)?;
        self.stats.verbs += 1;
        Ok(posted)
    }

    /// Whether some client waits for the metadata server.
    pub fn wants_metadata(&self) -> bool {
        self.clients.iter().any(|client| {
            client
                .running
                .as_ref()
                .is_some_and(|running| matches!(running.phase, Phase::NeedsSlots | Phase::Locating))
        })
    }

    /// The metadata server's side: hands out slot batches and locates
    /// tails for every client waiting on it.
    pub fn answer_metadata(
        &mut self,
        now: Timestamp,
        server: &mut MetadataServer,
        memory: &mut dyn RegionAccess,
    ) -> Result<(), CloverError> {
        for client in 0..self.clients.len() {
            let Some(running) = self.clients[client].running.as_ref() else {
                continue;
            };
            match running.phase {
                Phase::NeedsSlots if running.operation.is_none() => {
                    match server.allocate(self.value_bytes) {
                        Ok(batch) => self.clients[client].slots.extend(batch),
                        // The put waits for garbage collection to free
                        // space: asked again at the next answer.
                        Err(MetadataError::OutOfSpace { .. }) => {
                            self.stats.slot_waits += 1;
                            continue;
                        }
                        Err(error) => return Err(error.into()),
                    }
                    self.start_next(now, client)?;
                }
                Phase::Locating => {
                    let key = running.request.key();
                    let tail = server.locate(key, memory)?;
                    self.stats.locates += 1;
                    self.advance(now, client, Outcome::Located(tail))?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Returns every client's unused slots to the server (at the end of a
    /// run), so that no slot is lost.
    pub fn return_slots(&mut self, server: &mut MetadataServer) -> Result<(), CloverError> {
        for client in &mut self.clients {
            let slots = std::mem::take(&mut client.slots);
            server.give_back(self.value_bytes, &slots)?;
        }
        Ok(())
    }
}
