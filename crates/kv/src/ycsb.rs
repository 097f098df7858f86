//! YCSB on the store, through the shared generator
//! (`remora_workloads::ycsb`): a load phase, then a run phase on one or
//! more threads, each with its own session.
//!
//! Keys are the record numbers as 8 little-endian bytes. A value starts
//! with its key, so that every read checks it got its own record back;
//! the rest is filler that updates change.
//!
//! YCSB-E (range scans) needs an ordered index, which a hash index cannot
//! serve: it is refused, not silently skipped.

use crate::device::call_time;
use crate::store::{KvError, PrefetchStage, Session, Status, Store};
use crate::update::Update;
use hdrhistogram::Histogram;
use remora_base::Timestamp;
use remora_rack::endpoint::thread_cpu_ns;
use remora_workloads::history::{Event, EventKind};
use remora_workloads::ycsb::{Generator, Operation, WorkloadError, WorkloadSpec};
use rustc_hash::FxHashMap;
use std::time::{Duration, Instant};

/// Operations between non-blocking `complete_pending` calls.
const COMPLETE_EVERY_OPERATIONS: u64 = 16;
/// Pending operations a thread lets build up before it waits for some:
/// the device's batch of 100.
const MAX_PENDING: usize = 100;
/// Operations a thread records at most: the check's cost grows with the
/// square of a hot key's operations, so a recorded run stops here.
pub const MAX_RECORDED_OPERATIONS: u64 = 10_000;
/// Device room below which a run phase stops early (a few pages).
const RUN_STOPS_WITH_ROOM_BYTES: u64 = 16 << 20;
/// One operation in this many is timed for the latency histogram, so
/// that timing does not slow the loop it measures.
const LATENCY_SAMPLE_EVERY: u64 = 16;
/// Each key's index bucket is prefetched this many operations before
/// its operation runs, and its record half as many (a client that knows
/// its next keys, as a trace, a batch or a pipeline does).
const LOOKAHEAD_OPERATIONS: usize = 16;
/// The most operations a thread draws before its run starts; a run that
/// performs more cycles through them, as FASTER's benchmark cycles
/// through the keys it loaded from YCSB's files.
pub const MAX_TRACE_OPERATIONS: usize = 1 << 22;
/// Operations per second no device here reaches on one thread: a run's
/// trace is its duration times this, so that a short run does not spend
/// longer drawing its trace than running it.
const TRACE_OPERATIONS_PER_SECOND: f64 = 5e6;

#[derive(Debug, thiserror::Error)]
pub enum YcsbError {
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error(transparent)]
    Store(#[from] KvError),
    #[error("YCSB-E needs range scans, which a hash index cannot serve")]
    ScansUnsupported,
    #[error("key {key} read back a value that belongs to key {found}")]
    WrongValue { key: u64, found: u64 },
    #[error("key {0} was loaded but reads as absent")]
    Missing(u64),
    #[error("values must be at least 8 bytes (they start with their key), and 16 to record a history (then a write id follows); {0} given")]
    ValueTooShort(usize),
    #[error("a YCSB thread panicked")]
    Panicked,
    #[error("a history needs every key loaded before the run: YCSB-D's inserts are not recorded")]
    HistoryWithInserts,
}

/// A YCSB run's settings.
#[derive(Debug, Clone)]
pub struct YcsbRun {
    pub spec: WorkloadSpec,
    pub value_bytes: usize,
    pub threads: usize,
    /// How long the run phase lasts.
    pub duration: Duration,
    pub seed: u64,
    /// Record every operation's invocation and return, for the
    /// linearizability check (values then carry a unique write id); a
    /// recorded run stops after [`MAX_RECORDED_OPERATIONS`] per thread.
    pub record_history: bool,
}

/// What one run phase measured, summed over its threads.
#[derive(Debug, Clone)]
pub struct YcsbOutcome {
    pub operations: u64,
    pub elapsed: Duration,
    /// Time the threads spent in device calls: issuing reads, in
    /// `complete_pending`, and flushing pages (each counted once, as
    /// [`call_time::timed`] says).
    pub device_time: Duration,
    /// Sampled latencies, issue to completion, in nanoseconds.
    pub latency: Histogram<u64>,
    pub pending: u64,
    /// The run stopped before its duration because the device was
    /// nearly full.
    pub stopped_early: bool,
    /// Every operation's invocation and return, when recorded, in
    /// real-time order (nanoseconds since the run began).
    pub history: Vec<Event>,
    /// CPU time of the application threads (the store's own work and its
    /// device calls; not the NIC emulation or an engine elsewhere).
    pub application_cpu: Duration,
}

impl YcsbOutcome {
    pub fn operations_per_second(&self) -> f64 {
        self.operations as f64 / self.elapsed.as_secs_f64()
    }

    /// Fig. 10's communication ratio: time in the communication library
    /// over total execution time, over every thread.
    pub fn communication_ratio(&self, threads: usize) -> f64 {
        self.device_time.as_secs_f64() / (self.elapsed.as_secs_f64() * threads as f64)
    }
}

pub fn key_bytes(key: u64) -> [u8; 8] {
    key.to_le_bytes()
}

/// A value for `key`: the key, the write's id (unique in the run; 0 for
/// the loaded version) if the value has room, then filler.
pub fn value_for(key: u64, write_id: u64, value_bytes: usize, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&key.to_le_bytes());
    if value_bytes >= 16 {
        out.extend_from_slice(&write_id.to_le_bytes());
    }
    out.resize(value_bytes, (write_id % 251) as u8);
}

/// The write id a value carries (0 in a value too short for one).
fn write_id_of(value: &[u8]) -> u64 {
    value.get(8..16).map_or(0, |bytes| {
        u64::from_le_bytes(bytes.try_into().expect("8 bytes"))
    })
}

fn check_value(key: u64, value: &[u8]) -> Result<(), YcsbError> {
    if value.len() < 8 {
        return Err(YcsbError::WrongValue {
            key,
            found: u64::MAX,
        });
    }
    let found = u64::from_le_bytes(value[..8].try_into().expect("values have 8 bytes"));
    if found != key {
        return Err(YcsbError::WrongValue { key, found });
    }
    Ok(())
}

/// Inserts every record of the workload's load phase, split over threads.
pub fn load(store: &Store, run: &YcsbRun) -> Result<Duration, YcsbError> {
    let shortest = if run.record_history { 16 } else { 8 };
    if run.value_bytes < shortest {
        return Err(YcsbError::ValueTooShort(run.value_bytes));
    }
    // Refused before loading, since the run would refuse it after.
    if run.spec.mix.scan > 0.0 {
        return Err(YcsbError::ScansUnsupported);
    }
    let started = Instant::now();
    let keys = Generator::new(run.spec.clone(), run.seed)?.loaded_keys();
    let threads = run.threads.max(1) as u64;
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let keys = keys.clone();
                scope.spawn(move || -> Result<(), YcsbError> {
                    let mut session = store.session()?;
                    let mut value = Vec::new();
                    for key in keys.skip(thread as usize).step_by(threads as usize) {
                        value_for(key, 0, run.value_bytes, &mut value);
                        session.upsert(&key_bytes(key), &value)?;
                    }
                    Ok(())
                })
            })
            .collect();
        join_all(workers)
    })?;
    Ok(started.elapsed())
}

fn join_all<T>(
    workers: Vec<std::thread::ScopedJoinHandle<'_, Result<T, YcsbError>>>,
) -> Result<Vec<T>, YcsbError> {
    workers
        .into_iter()
        .map(|worker| worker.join().map_err(|_| YcsbError::Panicked)?)
        .collect()
}

/// Runs the workload's operations on every thread for the run's duration.
pub fn run(store: &Store, run: &YcsbRun) -> Result<YcsbOutcome, YcsbError> {
    if run.spec.mix.scan > 0.0 {
        return Err(YcsbError::ScansUnsupported);
    }
    if run.record_history && run.spec.mix.insert > 0.0 {
        return Err(YcsbError::HistoryWithInserts);
    }
    let threads = run.threads.max(1);
    // One clock for every thread's history: the check orders events
    // across threads in real time.
    let clock = Instant::now();
    // Every thread draws its trace, then they start together.
    let start = std::sync::Barrier::new(threads);
    // Flushes run in whichever worker turns a page.
    let flushed_before = store.flush_time();
    let outcomes = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|thread| {
                let seed = run.seed.wrapping_add(1 + thread as u64);
                let start = &start;
                scope.spawn(move || {
                    // Every thread reaches the barrier, even one that
                    // could not draw its trace: the others wait there.
                    let trace = Trace::draw(run, seed);
                    start.wait();
                    run_thread(store, run, &trace?, thread as u64, clock)
                })
            })
            .collect();
        join_all(workers)
    })?;
    let elapsed = outcomes
        .iter()
        .map(|outcome| outcome.elapsed)
        .max()
        .unwrap_or_default();
    let mut total = outcomes
        .into_iter()
        .reduce(|mut sum, next| {
            sum.operations += next.operations;
            sum.device_time += next.device_time;
            sum.pending += next.pending;
            sum.application_cpu += next.application_cpu;
            sum.stopped_early |= next.stopped_early;
            sum.history.extend(next.history);
            let _ = sum.latency.add(&next.latency);
            sum
        })
        .expect("at least one thread");
    total.elapsed = elapsed;
    total.device_time += store.flush_time().saturating_sub(flushed_before);
    // Each thread's events are in its own order; a stable sort by time
    // keeps a thread's invocation before its return at equal times.
    total.history.sort_by_key(|event| event.at);
    Ok(total)
}

/// One thread's loop of the run phase.
struct Worker<'a> {
    session: Session,
    run: &'a YcsbRun,
    value: Vec<u8>,
    out: Vec<u8>,
    /// Pending operations by context (their operation number): the key
    /// to check, and the issue time if sampled.
    waiting: FxHashMap<u64, (u64, Option<Instant>)>,
    latency: Histogram<u64>,
    device_time: Duration,
    /// This thread's writes so far; its ids are `thread << 40 | number`.
    writes: u64,
    thread: u64,
    /// Events when the run records its history, timed from `clock`.
    history: Option<Vec<Event>>,
    clock: Instant,
}

fn run_thread(
    store: &Store,
    run: &YcsbRun,
    trace: &Trace,
    thread: u64,
    clock: Instant,
) -> Result<YcsbOutcome, YcsbError> {
    let mut worker = Worker {
        session: store.session()?,
        run,
        value: Vec::new(),
        out: Vec::new(),
        waiting: FxHashMap::default(),
        latency: Histogram::new(3).expect("3 significant figures are valid"),
        device_time: Duration::ZERO,
        writes: 0,
        thread,
        history: run.record_history.then(Vec::new),
        clock,
    };
    let cpu_before = thread_cpu_ns();
    let started = Instant::now();
    let deadline = started + run.duration;
    let mut operations = 0u64;
    let limit = if run.record_history {
        MAX_RECORDED_OPERATIONS
    } else {
        u64::MAX
    };
    while operations < limit
        && (!operations.is_multiple_of(1024) || (Instant::now() < deadline && has_room(store)))
    {
        let operation = trace.next(operations, &worker.session);
        worker.perform(operation, operations)?;
        operations += 1;
        if operations.is_multiple_of(COMPLETE_EVERY_OPERATIONS)
            || worker.session.pending_count() >= MAX_PENDING
        {
            let wait = worker.session.pending_count() >= MAX_PENDING;
            worker.complete(wait)?;
        }
    }
    let stopped_early = Instant::now() < deadline && !has_room(store);
    worker.complete(true)?;
    let elapsed = started.elapsed();
    worker.session.suspend();
    let stats = worker.session.stats();
    Ok(YcsbOutcome {
        operations,
        elapsed,
        stopped_early,
        history: worker.history.take().unwrap_or_default(),
        device_time: worker.device_time + stats.device_time(),
        latency: worker.latency,
        pending: stats.pending,
        application_cpu: Duration::from_nanos(thread_cpu_ns() - cpu_before),
    })
}

/// A thread's operations, drawn before its run starts so that the run
/// times the store and not the workload generator (as FASTER's benchmark,
/// the Cowbird paper's, times it: YCSB's keys are loaded from files
/// first). Operation `n` of a run is the trace's `n` modulo its length.
struct Trace {
    operations: Vec<Operation>,
}

impl Trace {
    /// Enough operations for `run`'s duration on the fastest device, at
    /// most [`MAX_TRACE_OPERATIONS`] (a recorded run's are all it does).
    fn draw(run: &YcsbRun, seed: u64) -> Result<Trace, YcsbError> {
        let for_duration = run.duration.as_secs_f64() * TRACE_OPERATIONS_PER_SECOND;
        let count = if run.record_history {
            MAX_RECORDED_OPERATIONS as usize
        } else {
            (for_duration as usize).clamp(LOOKAHEAD_OPERATIONS, MAX_TRACE_OPERATIONS)
        };
        let mut generator = Generator::new(run.spec.clone(), seed)?;
        let operations = (0..count)
            .map(|_| generator.next_operation())
            .collect::<Result<_, _>>()?;
        Ok(Trace { operations })
    }

    fn at(&self, number: u64) -> Operation {
        self.operations[(number % self.operations.len() as u64) as usize]
    }

    /// Operation `number`, after prefetching the keys of the operations
    /// [`LOOKAHEAD_OPERATIONS`] and half as many after it
    /// ([`Session::prefetch`]): without that, each operation waits on
    /// memory twice, one after the other.
    fn next(&self, number: u64, session: &Session) -> Operation {
        let ahead = LOOKAHEAD_OPERATIONS as u64;
        let bucket = operation_key(self.at(number + ahead));
        session.prefetch(&key_bytes(bucket), PrefetchStage::Bucket);
        let record = operation_key(self.at(number + ahead / 2));
        session.prefetch(&key_bytes(record), PrefetchStage::Record);
        self.at(number)
    }
}

/// A run stops early rather than fill the device: updates append copies
/// of records, and a run does not compact (FASTER's benchmark does not);
/// its caller may compact between runs (`Session::compact`).
fn has_room(store: &Store) -> bool {
    store.device_room_bytes() > RUN_STOPS_WITH_ROOM_BYTES
}

impl Worker<'_> {
    fn perform(&mut self, operation: Operation, number: u64) -> Result<(), YcsbError> {
        let sampled = number.is_multiple_of(LATENCY_SAMPLE_EVERY);
        let started = sampled.then(Instant::now);
        let key = operation_key(operation);
        let status = match operation {
            Operation::Read { .. } | Operation::ReadModifyWrite { .. } => {
                self.record(key, number, EventKind::ReadInvoked);
                let status = match operation {
                    // The counter is the key itself, and adding 0 keeps it:
                    // the value (and its write id) comes back unchanged.
                    Operation::ReadModifyWrite { .. } => {
                        let update = Update::AddToCounter(0);
                        self.session
                            .rmw(&key_bytes(key), update, &mut self.out, number)?
                    }
                    _ => self.session.read(&key_bytes(key), &mut self.out, number)?,
                };
                match status {
                    Status::Pending => {}
                    Status::NotFound => return Err(YcsbError::Missing(key)),
                    _ => {
                        check_value(key, &self.out)?;
                        let id = write_id_of(&self.out);
                        self.record(key, number, EventKind::ReadReturned(id));
                    }
                }
                status
            }
            Operation::Update { .. } | Operation::Insert { .. } => {
                self.writes += 1;
                let id = self.thread << 40 | self.writes;
                value_for(key, id, self.run.value_bytes, &mut self.value);
                self.record(key, number, EventKind::WriteInvoked(id));
                let status = self.session.upsert(&key_bytes(key), &self.value)?;
                self.record(key, number, EventKind::WriteReturned);
                status
            }
            Operation::Scan { .. } => return Err(YcsbError::ScansUnsupported),
        };
        if status == Status::Pending {
            self.waiting.insert(number, (key, started));
        } else if let Some(started) = started {
            let _ = self.latency.record(started.elapsed().as_nanos() as u64);
        }
        Ok(())
    }

    /// Records an event of operation `number` (each operation is its own
    /// client: a thread has many in flight, even on one key).
    fn record(&mut self, key: u64, number: u64, kind: EventKind) {
        if let Some(history) = &mut self.history {
            history.push(Event {
                key,
                client: (self.thread << 40 | number) as usize,
                kind,
                at: Timestamp::from_nanos(self.clock.elapsed().as_nanos() as u64),
            });
        }
    }

    /// Completes pending operations, checking reads and timing samples.
    fn complete(&mut self, wait: bool) -> Result<(), YcsbError> {
        let mut failure = None;
        let (waiting, latency) = (&mut self.waiting, &mut self.latency);
        let mut returned = Vec::new();
        let session = &mut self.session;
        let (completed, spent) = call_time::timed(|| {
            session.complete_pending(wait, &mut |completion| {
                let Some((key, issued)) = waiting.remove(&completion.context) else {
                    return;
                };
                if let Some(issued) = issued {
                    let _ = latency.record(issued.elapsed().as_nanos() as u64);
                }
                let outcome = match completion.result {
                    Ok(Status::Found) => check_value(key, completion.value).map(|()| {
                        returned.push((key, completion.context, write_id_of(completion.value)));
                    }),
                    Ok(_) => Err(YcsbError::Missing(key)),
                    Err(error) => Err(error.into()),
                };
                if let Err(error) = outcome {
                    failure.get_or_insert(error);
                }
            })
        });
        self.device_time += spent;
        completed?;
        for (key, number, id) in returned {
            self.record(key, number, EventKind::ReadReturned(id));
        }
        match failure {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

fn operation_key(operation: Operation) -> u64 {
    match operation {
        Operation::Read { key }
        | Operation::Update { key }
        | Operation::Insert { key }
        | Operation::Scan { key, .. }
        | Operation::ReadModifyWrite { key } => key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryDevice, StoreConfig};
    use std::sync::Arc;

    fn small_store() -> Store {
        Store::new(
            StoreConfig::smallest(),
            Arc::new(MemoryDevice::new(8 << 20)),
        )
        .expect("a small store")
    }

    /// A run of `spec` on `threads` threads for 1 ms, seed 5.
    fn one_millisecond(spec: WorkloadSpec, threads: usize) -> YcsbRun {
        YcsbRun {
            spec,
            value_bytes: 64,
            threads,
            duration: Duration::from_millis(1),
            seed: 5,
            record_history: false,
        }
    }

    /// A workload the generator refuses is the run's error, on every
    /// thread, not a hang at the barrier where the threads start.
    #[test]
    fn a_workload_no_thread_can_draw_fails_without_hanging() {
        let store = small_store();
        let mut spec = WorkloadSpec::preset("a").expect("YCSB-A exists");
        spec.record_count = 0;
        let run = one_millisecond(spec, 2);
        assert!(matches!(
            super::run(&store, &run),
            Err(YcsbError::Workload(_))
        ));
    }

    /// Drawing a thread's operations before its run must not change
    /// which operations run, nor their order: the trace is the
    /// generator's own sequence, cycled past its end.
    #[test]
    fn the_trace_hands_out_the_generators_sequence_in_order() {
        let store = small_store();
        let session = store.session().expect("a session");
        let mut spec = WorkloadSpec::preset("d").expect("YCSB-D exists");
        spec.record_count = 1000;
        let run = one_millisecond(spec.clone(), 1);
        let trace = Trace::draw(&run, 5).expect("a trace");
        let length = trace.operations.len() as u64;
        assert_eq!(length, 5000, "1 ms at 5 M operations per second");
        let mut reference = Generator::new(spec, 5).expect("a generator");
        for number in 0..length {
            assert_eq!(
                trace.next(number, &session),
                reference.next_operation().expect("keys to spare")
            );
        }
        assert_eq!(trace.next(length + 3, &session), trace.at(3));
    }
}
