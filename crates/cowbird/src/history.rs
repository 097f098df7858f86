//! Checked histories of mixed async reads and writes, the correctness
//! workload both engines run, in the simulator ([`crate::simulated`]) and
//! on the embedded rack ([`crate::embedded`]).
//!
//! Every thread works in its own window of the pool, so a plain model
//! predicts every read: through Spot, a read sees every write its thread
//! issued before it and none after. Cowbird-P4 may redo a read after a
//! go-back, when writes issued after it (and still incomplete, so
//! concurrent with it) may have reached the pool; such a read may see the
//! model after any prefix of those writes, which is what linearizability
//! allows, and nothing else. Each read is checked against that, each
//! request must complete exactly once and in order within its type, and
//! the pool must equal the models at the end.

use crate::client::{Client, Completion, CowbirdError};
use crate::layout::{Kind, RequestId, RingSizes};
use crate::p4::P4Config;
use crate::spot::SpotConfig;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use remora_base::Timestamp;
use remora_host::hardware::NicHardware;
use remora_host::{Agent, AgentError, Progress};
use remora_rnic::{HostMemory, HostMemoryOutOfBounds, Verbs};
use remora_sim::LinkFaults;
use std::collections::VecDeque;
use std::time::Duration;

/// Which check of a history failed.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error(transparent)]
    Client(#[from] CowbirdError),
    #[error("thread {thread}: {id:?} completed out of order or twice")]
    OutOfOrder { thread: usize, id: RequestId },
    #[error("thread {thread}: {id:?} completed but was not outstanding")]
    NotOutstanding { thread: usize, id: RequestId },
    #[error("thread {thread}: {id:?} of {length} bytes at offset {offset} read bytes the model does not allow; first difference from each allowed version: {first_difference:?}; zero bytes read: {zero_bytes}")]
    ReadMismatch {
        thread: usize,
        id: RequestId,
        length: usize,
        offset: usize,
        first_difference: Vec<Option<usize>>,
        zero_bytes: usize,
    },
    #[error("thread {thread}'s window differs from its model at the end")]
    PoolDiffers { thread: usize },
    #[error("the pool is smaller than the threads' windows: {0}")]
    PoolTooSmall(#[from] HostMemoryOutOfBounds),
    #[error("{completed} of {total} requests completed before the time limit")]
    Unfinished { completed: u64, total: u64 },
}

/// What a read may return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadCheck {
    /// Exactly the model when it was issued: Spot on a live connection.
    AtIssue,
    /// The model at issue or after any prefix of the later, still
    /// incomplete writes that overlap it: an engine that may serve a read
    /// again (Cowbird-P4 after a go-back; Spot after a reconnection).
    MayBeRedone,
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
    /// The simulator's link faults (the embedded rack has none).
    pub faults: LinkFaults,
    pub engine: Engine,
    pub sizes: RingSizes,
    pub spot: SpotConfig,
    pub p4: P4Config,
    /// Spot reads are exact unless the scenario lets the engine redo
    /// them (a crash, a reconnection); P4 reads may always be redone.
    pub spot_reads: ReadCheck,
    /// The simulated NICs' hardware (the embedded rack's are what they
    /// are).
    pub hardware: NicHardware,
}

impl Workload {
    /// The rule reads are held to under this workload's engine.
    pub fn read_check(&self) -> ReadCheck {
        match self.engine {
            Engine::Spot => self.spot_reads,
            Engine::P4 => ReadCheck::MayBeRedone,
        }
    }
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
            engine: Engine::Spot,
            sizes: RingSizes {
                metadata_entries: 64,
                request_data_bytes: 8192,
                response_data_bytes: 8192,
            },
            spot: SpotConfig::DEFAULT,
            p4: P4Config::rack_default(),
            spot_reads: ReadCheck::AtIssue,
            hardware: NicHardware::Ideal,
        }
    }
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
    ) -> Result<bool, HistoryError> {
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
            Err(CowbirdError::RetryLater(_)) => return Ok(false),
            Err(error) => return Err(error.into()),
        };
        client.poll_add(self.poll_group, id)?;
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
        rule: ReadCheck,
        client: &crate::client::Client,
        completion: &Completion,
    ) -> Result<bool, HistoryError> {
        let id = completion.id;
        let thread = self.index;
        let kind = kind_index(id.kind());
        if id.sequence() <= self.last_completed[kind] {
            return Err(HistoryError::OutOfOrder { thread, id });
        }
        self.last_completed[kind] = id.sequence();
        let position = self
            .expected
            .iter()
            .position(|(expected, _)| *expected == id)
            .ok_or(HistoryError::NotOutstanding { thread, id })?;
        let (_, read) = self.expected.remove(position).expect("found");
        let Some(read) = read else {
            return Ok(false);
        };
        let mut seen = vec![0u8; read.candidates[0].len()];
        client.response(completion, &mut seen)?;
        let allowed = match rule {
            ReadCheck::AtIssue => &read.candidates[..1],
            ReadCheck::MayBeRedone => &read.candidates[..],
        };
        if !allowed.contains(&seen) {
            return Err(HistoryError::ReadMismatch {
                thread,
                id,
                length: seen.len(),
                offset: read.offset,
                first_difference: allowed
                    .iter()
                    .map(|bytes| bytes.iter().zip(&seen).position(|(a, b)| a != b))
                    .collect(),
                zero_bytes: seen.iter().filter(|byte| **byte == 0).count(),
            });
        }
        Ok(true)
    }
}

/// Every thread's history, driven one pass at a time.
pub struct Histories {
    threads: Vec<Thread>,
    rng: ChaCha8Rng,
    responses: Vec<Completion>,
    pub completed: u64,
    pub reads_checked: u64,
    total: u64,
    /// Threads stop issuing once this many requests completed (they keep
    /// polling), until released: see [`HistoryApplication::hold_issuing_at`].
    hold_issuing_at: Option<u64>,
}

impl Histories {
    pub fn new(
        seed: u64,
        workload: &Workload,
        clients: &mut [Client],
    ) -> Result<Histories, HistoryError> {
        let mut threads = Vec::with_capacity(workload.threads);
        for (index, client) in clients.iter_mut().enumerate() {
            threads.push(Thread {
                index,
                poll_group: client.poll_create()?,
                model: vec![0u8; workload.window_bytes as usize],
                issued: 0,
                expected: VecDeque::new(),
                last_completed: [0, 0],
            });
        }
        Ok(Histories {
            threads,
            rng: ChaCha8Rng::seed_from_u64(seed),
            responses: Vec::new(),
            completed: 0,
            reads_checked: 0,
            total: workload.operations_per_thread * workload.threads as u64,
            hold_issuing_at: None,
        })
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn is_done(&self) -> bool {
        self.completed == self.total
    }

    /// Issuing is held: the hold's count of completions was reached.
    pub fn is_holding(&self) -> bool {
        self.hold_issuing_at.is_some_and(|at| self.completed >= at)
    }

    /// One pass over the threads: each issues what its depth allows,
    /// polls, and checks what completed.
    pub fn step(
        &mut self,
        workload: &Workload,
        clients: &mut [Client],
    ) -> Result<(), HistoryError> {
        let rule = workload.read_check();
        let holding = self.is_holding();
        for (thread, client) in self.threads.iter_mut().zip(clients.iter_mut()) {
            while !holding && thread.issue(workload, client, &mut self.rng)? {}
            self.responses.clear();
            client.poll_wait(
                thread.poll_group,
                &mut self.responses,
                usize::MAX,
                Duration::ZERO,
            )?;
            for completion in &self.responses {
                self.reads_checked += u64::from(thread.check(rule, client, completion)?);
                self.completed += 1;
            }
        }
        Ok(())
    }

    /// The pool (region 0's bytes) equals every thread's model.
    pub fn check_pool(&self, pool: &HostMemory, workload: &Workload) -> Result<(), HistoryError> {
        for thread in &self.threads {
            let mut bytes = vec![0u8; workload.window_bytes as usize];
            pool.read(thread.window_base(workload) as usize, &mut bytes)?;
            if bytes != thread.model {
                return Err(HistoryError::PoolDiffers {
                    thread: thread.index,
                });
            }
        }
        Ok(())
    }

    /// The error for a run that ran out of time.
    pub fn unfinished(&self) -> HistoryError {
        HistoryError::Unfinished {
            completed: self.completed,
            total: self.total,
        }
    }
}

/// How often the application polls its rings: a thread that spins on
/// host memory, seen by the simulator once a microsecond.
pub const APPLICATION_POLL: Duration = Duration::from_micros(1);

/// The checked histories as the compute node's application: an agent
/// that issues, polls and checks through the client library, touching
/// only host memory (never the NIC).
pub struct HistoryApplication {
    workload: Workload,
    clients: Vec<Client>,
    histories: Histories,
    next_poll: Timestamp,
}

const APPLICATION: &str = "cowbird-histories";

impl HistoryApplication {
    pub fn new(
        seed: u64,
        workload: Workload,
        mut clients: Vec<Client>,
    ) -> Result<HistoryApplication, HistoryError> {
        let histories = Histories::new(seed, &workload, &mut clients)?;
        Ok(HistoryApplication {
            workload,
            clients,
            histories,
            next_poll: Timestamp::ZERO,
        })
    }

    pub fn histories(&self) -> &Histories {
        &self.histories
    }

    pub fn is_done(&self) -> bool {
        self.histories.is_done()
    }

    /// Stop issuing once `completed` requests completed, until
    /// [`release`](Self::release); requests in flight still complete. A
    /// scenario whose observer cannot stop time (the embedded rack looks
    /// every 200 µs, in which Spot completes hundreds of requests) holds
    /// the application so that what it does at that count still comes
    /// mid-run.
    pub fn hold_issuing_at(&mut self, completed: u64) {
        self.histories.hold_issuing_at = Some(completed);
    }

    pub fn release(&mut self) {
        self.histories.hold_issuing_at = None;
    }
}

impl Agent for HistoryApplication {
    fn name(&self) -> &'static str {
        APPLICATION
    }

    fn poll(&mut self, now: Timestamp, _nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        if now < self.next_poll || self.histories.is_done() {
            return Ok(Progress::Idle);
        }
        self.next_poll = now.saturating_add(APPLICATION_POLL);
        let completed = self.histories.completed;
        self.histories
            .step(&self.workload, &mut self.clients)
            .map_err(|error| AgentError::system(APPLICATION, error))?;
        Ok(Progress::from_moved(self.histories.completed != completed))
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        (!self.histories.is_done()).then_some(self.next_poll)
    }

    fn crash(&mut self) {}

    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Err(AgentError::system(
            APPLICATION,
            crate::connection::ConnectionError::ComputeRestart,
        ))
    }
}
