//! A service whose calls run on threads of their own, so that methods may
//! block (on the DSM's one-sided reads and writes, say) while the agent
//! that runs the callee keeps the rack's fabric turning. Each worker
//! thread owns one instance of the service; calls go to whichever worker
//! is free, and outcomes come back through [`Service::poll_finished`].

use super::{CallTicket, Service};
use crate::rpc::Outcome;
use remora_wire::bifrost::GlobalAddress;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// What a worker is handed.
enum Job {
    Call {
        ticket: CallTicket,
        method: Vec<u8>,
        pointer: GlobalAddress,
        arguments: Vec<u8>,
    },
    /// A replacement's state, from its checkpoint.
    Restore {
        state: Vec<u8>,
        done: Sender<Result<(), String>>,
    },
}

/// How long restoring a pool's service may take.
const RESTORE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

type Finished = (CallTicket, Outcome);

/// A finished call as a worker reports it: with the service's state after
/// it, whether it answered or failed (a method may change state and then
/// fail, and a failed call is never run again).
type Reported = (CallTicket, Outcome, Option<Vec<u8>>);

/// Worker threads, each with its own instance of a service.
pub struct WorkerPool {
    jobs: Option<Sender<Job>>,
    finished: Receiver<Reported>,
    threads: Vec<JoinHandle<()>>,
    /// The host crashed: workers drop the jobs left and stop, as the
    /// threads of a crashed host would.
    crashed: Arc<std::sync::atomic::AtomicBool>,
    /// The service's state: at first, the first instance's; then as the
    /// newest finished call handed it back, or as restored. Meaningful
    /// with one worker.
    state: Option<Vec<u8>>,
}

impl WorkerPool {
    /// One thread per instance in `services`. The callee bounds the calls
    /// in progress, and so the queue of jobs.
    pub fn new(services: Vec<Box<dyn Service>>) -> std::io::Result<WorkerPool> {
        let (jobs, taken) = channel::<Job>();
        let taken = Arc::new(Mutex::new(taken));
        let (done, finished) = channel();
        let mut threads = Vec::new();
        let crashed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let state = services.first().and_then(|service| service.save_state());
        for (index, service) in services.into_iter().enumerate() {
            let taken = Arc::clone(&taken);
            let done = done.clone();
            let stop = Arc::clone(&crashed);
            let thread = std::thread::Builder::new()
                .name(format!("bifrost-worker-{index}"))
                .spawn(move || work(service, &taken, &done, &stop))?;
            threads.push(thread);
        }
        Ok(WorkerPool {
            jobs: Some(jobs),
            finished,
            threads,
            crashed,
            state,
        })
    }
}

/// A worker's loop: until the pool is dropped, take a job, run it, hand
/// the outcome back, with the service's state as of then (what the
/// callee's checkpoint of the reply carries: it cannot ask this thread's
/// service itself).
fn work(
    mut service: Box<dyn Service>,
    taken: &Mutex<Receiver<Job>>,
    done: &Sender<Reported>,
    crashed: &std::sync::atomic::AtomicBool,
) {
    // Whether the service keeps a state: from then on a save that fails
    // is a failure, not a service without state. Known from the start for
    // a service that has one then (the first call's failed save was
    // reported with no state, and the reply counted the call with the
    // state from before it), and from a restore.
    let mut stateful = service.save_state().is_some();
    loop {
        if crashed.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let job = {
            let Ok(taken) = taken.lock() else { return };
            match taken.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        match job {
            Job::Call {
                ticket,
                method,
                pointer,
                arguments,
            } => {
                let outcome = service
                    .call(&method, pointer, &arguments)
                    .map(|mut answer| {
                        if answer.state.is_none() {
                            answer.state = service.save_state();
                        }
                        answer
                    });
                let state = match &outcome {
                    Ok(answer) => answer.state.clone(),
                    Err(_) => service.save_state(),
                };
                let state = match state {
                    None if stateful => {
                        saved_before_the_next_call(service.as_ref(), ticket, crashed)
                    }
                    state => state,
                };
                stateful |= state.is_some();
                if stateful && state.is_none() {
                    // The host crashed while the save was retried: the
                    // call is lost with it, unanswered.
                    return;
                }
                if done.send((ticket, outcome, state)).is_err() {
                    return;
                }
            }
            Job::Restore { state, done } => {
                let restored = service.restore_state(&state);
                stateful |= restored.is_ok();
                let _ = done.send(restored);
            }
        }
    }
}

/// The first wait before a failed save (a channel that timed out once, a
/// refused snapshot) is made again; each later wait doubles, up to
/// [`SAVE_RETRY_MAX`].
const SAVE_RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(1);
const SAVE_RETRY_MAX: std::time::Duration = std::time::Duration::from_millis(100);

/// The state after a call whose first save failed, saved again until it
/// succeeds; `None` only once the host crashed (or the pool was dropped).
///
/// The worker runs no other call meanwhile, and that is the point. The
/// call's effect is in the service: reported without a state, it stayed
/// unanswered, and the next call's state, which covers its effect, went
/// into a checkpoint that still listed it as received. A replacement
/// restored from that checkpoint ran it a second time. Reported with the
/// state from before it, a failover would lose its effect while its
/// caller held its answer. Bounded by the crash flag: a host whose state
/// can never be saved again must be failed over.
fn saved_before_the_next_call(
    service: &dyn Service,
    ticket: CallTicket,
    crashed: &std::sync::atomic::AtomicBool,
) -> Option<Vec<u8>> {
    let mut wait = SAVE_RETRY_FIRST;
    let mut warned = false;
    while !crashed.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(wait);
        if let Some(state) = service.save_state() {
            return Some(state);
        }
        if !warned && wait >= SAVE_RETRY_MAX {
            tracing::warn!(
                ?ticket,
                "the service cannot save its state: the call waits, unanswered, until it can"
            );
            warned = true;
        }
        wait = (wait * 2).min(SAVE_RETRY_MAX);
    }
    None
}

impl Service for WorkerPool {
    /// The pool only runs calls through [`Service::begin`]: a blocking call
    /// here would hold up the agent the workers need.
    fn call(&mut self, _method: &[u8], _pointer: GlobalAddress, _arguments: &[u8]) -> Outcome {
        Err("a worker pool runs calls through begin".into())
    }

    fn begin(
        &mut self,
        ticket: CallTicket,
        method: &[u8],
        pointer: GlobalAddress,
        arguments: &[u8],
    ) -> Option<Outcome> {
        let job = Job::Call {
            ticket,
            method: method.to_vec(),
            pointer,
            arguments: arguments.to_vec(),
        };
        match self.jobs.as_ref().map(|jobs| jobs.send(job)) {
            Some(Ok(())) => None,
            _ => Some(Err("the service's worker threads are gone".into())),
        }
    }

    fn poll_finished(&mut self) -> Option<Finished> {
        let (ticket, outcome, state) = self.finished.try_recv().ok()?;
        if state.is_some() {
            self.state = state;
        }
        Some((ticket, outcome))
    }

    /// The service's state as of the newest finished call (which its
    /// worker took right after running it).
    fn save_state(&self) -> Option<Vec<u8>> {
        self.state.clone()
    }

    /// The host crashed: the workers stop (each after the call it is in),
    /// and the calls queued for them are lost with the host. The pool
    /// does not come back: a restarted host serves with a new one.
    fn crash(&mut self) {
        self.crashed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.jobs = None;
    }

    /// Its workers are gone for good with the crash.
    fn serves_after_crash(&self) -> bool {
        self.jobs.is_some()
    }

    /// Restores the service's state, on its thread: only for a pool of
    /// one worker (instances of a stateful service on several workers
    /// would each keep a state of their own). Its state after each call
    /// comes back with the call's answer.
    fn restore_state(&mut self, state: &[u8]) -> Result<(), String> {
        if self.threads.len() != 1 {
            return Err(format!(
                "a pool of {} workers keeps no one state to restore",
                self.threads.len()
            ));
        }
        let (done, restored) = channel();
        let job = Job::Restore {
            state: state.to_vec(),
            done,
        };
        let jobs = self.jobs.as_ref().ok_or("the service's worker is gone")?;
        jobs.send(job).map_err(|_| "the service's worker is gone")?;
        restored
            .recv_timeout(RESTORE_DEADLINE)
            .map_err(|error| format!("the service's worker did not restore: {error}"))??;
        self.state = Some(state.to_vec());
        Ok(())
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        // Closing the queue ends every worker after its current call; the
        // flag ends one retrying a save that may never succeed.
        self.crashed
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.jobs = None;
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::{Callee, Caller};
    use remora_base::Timestamp;
    use remora_wire::datagram::DatagramEnd;
    use std::time::Duration;

    /// Sleeps, then echoes: a method that blocks.
    /// Echoes after a while, counting the calls it really ran: the
    /// callee's own `executed` counts only outcomes it kept, so a duplicate
    /// run whose outcome was dropped would not show there.
    struct SlowEcho(std::sync::Arc<std::sync::atomic::AtomicU64>);

    impl Service for SlowEcho {
        fn call(&mut self, _: &[u8], _: GlobalAddress, arguments: &[u8]) -> Outcome {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(5));
            Ok(arguments.to_vec().into())
        }
    }

    /// Call `rpc_id` of one test caller.
    fn test_ticket(rpc_id: u64) -> CallTicket {
        CallTicket {
            caller: DatagramEnd {
                mac: remora_wire::MacAddress([2, 0, 0, 0, 0, 9]),
                address: remora_wire::Ipv4Address::new(10, 0, 0, 9),
                port: 40000,
            },
            rpc_id,
        }
    }

    /// Counts, then fails: state changed by a call that failed.
    struct CountThenFail(u64);

    impl Service for CountThenFail {
        fn call(&mut self, _: &[u8], _: GlobalAddress, _: &[u8]) -> Outcome {
            self.0 += 1;
            Err("counted, then failed".into())
        }
        fn save_state(&self) -> Option<Vec<u8>> {
            Some(self.0.to_be_bytes().to_vec())
        }
    }

    /// The pool kept the state of answered calls only: a method that
    /// changed its state and then failed (an exception, remembered and
    /// never run again) left the pool's state, and so the checkpoint, as
    /// before it, and a failover lost that change.
    #[test]
    fn a_failed_calls_state_is_kept_too() {
        let mut pool =
            WorkerPool::new(vec![Box::new(CountThenFail(0)) as Box<dyn Service>]).unwrap();
        assert!(pool
            .begin(test_ticket(1), b"count", GlobalAddress::NULL, b"")
            .is_none());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let finished = loop {
            if let Some(finished) = pool.poll_finished() {
                break finished;
            }
            assert!(std::time::Instant::now() < deadline, "the call finished");
            std::thread::yield_now();
        };
        assert!(finished.1.is_err());
        assert_eq!(pool.save_state(), Some(1u64.to_be_bytes().to_vec()));
    }

    /// Counts; its second save fails (a snapshot that could not be
    /// taken), and no later one succeeds.
    struct CountThenCannotSave(u64);

    impl Service for CountThenCannotSave {
        fn call(&mut self, _: &[u8], _: GlobalAddress, _: &[u8]) -> Outcome {
            self.0 += 1;
            Ok(self.0.to_be_bytes().to_vec().into())
        }
        fn save_state(&self) -> Option<Vec<u8>> {
            (self.0 < 2).then(|| self.0.to_be_bytes().to_vec())
        }
    }

    /// A save that failed came back as no state, and the pool kept the
    /// state from before: call 2's reply carried a checkpoint counting it
    /// with the state of call 1, and a failover lost its effect while its
    /// caller held the answer. Such a call now waits, unanswered, until a
    /// save succeeds, which for this service is never.
    #[test]
    fn a_call_whose_state_could_not_be_saved_is_not_answered() {
        let mut pool =
            WorkerPool::new(vec![Box::new(CountThenCannotSave(0)) as Box<dyn Service>]).unwrap();
        for rpc_id in [1, 2] {
            assert!(pool
                .begin(test_ticket(rpc_id), b"count", GlobalAddress::NULL, b"")
                .is_none());
        }
        let deadline = std::time::Instant::now() + Duration::from_millis(300);
        let mut answered = Vec::new();
        while std::time::Instant::now() < deadline {
            if let Some((ticket, _)) = pool.poll_finished() {
                answered.push(ticket.rpc_id);
            }
            std::thread::yield_now();
        }
        assert_eq!(answered, vec![1], "only the call whose state was saved");
        assert_eq!(pool.save_state(), Some(1u64.to_be_bytes().to_vec()));
    }

    /// Counts; its saves at a count in `failing_at` fail, `failures`
    /// times in all, then succeed (a DSM that came back).
    struct CountWithPassingSaveFailures {
        count: u64,
        failing_at: [u64; 2],
        failures: std::sync::atomic::AtomicU32,
    }

    impl Service for CountWithPassingSaveFailures {
        fn call(&mut self, _: &[u8], _: GlobalAddress, _: &[u8]) -> Outcome {
            self.count += 1;
            Ok(self.count.to_be_bytes().to_vec().into())
        }
        fn save_state(&self) -> Option<Vec<u8>> {
            let failing = self.failing_at.contains(&self.count)
                && self
                    .failures
                    .fetch_update(
                        std::sync::atomic::Ordering::Relaxed,
                        std::sync::atomic::Ordering::Relaxed,
                        |left| left.checked_sub(1),
                    )
                    .is_ok();
            (!failing).then(|| self.count.to_be_bytes().to_vec())
        }
        fn restore_state(&mut self, state: &[u8]) -> Result<(), String> {
            let bytes = state.try_into().map_err(|_| "8 bytes".to_string())?;
            self.count = u64::from_be_bytes(bytes);
            Ok(())
        }
    }

    /// Calls `rpc_ids` on `pool` and the state each answer came with.
    fn answered_with_states(pool: &mut WorkerPool, rpc_ids: &[u64]) -> Vec<(u64, u64)> {
        for &rpc_id in rpc_ids {
            assert!(pool
                .begin(test_ticket(rpc_id), b"count", GlobalAddress::NULL, b"")
                .is_none());
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut answered = Vec::new();
        while answered.len() < rpc_ids.len() && std::time::Instant::now() < deadline {
            if let Some((ticket, _)) = pool.poll_finished() {
                let state = pool.save_state().expect("a saved state");
                let count = u64::from_be_bytes(state.try_into().expect("8 bytes"));
                answered.push((ticket.rpc_id, count));
            }
            std::thread::yield_now();
        }
        answered
    }

    /// A call whose save failed went unanswered while the next call ran
    /// and reported a state covering both: that state's checkpoint listed
    /// the first call as received, not answered, and a replacement
    /// restored from it ran the call a second time (found by reading).
    /// Now the worker saves again, running nothing else, until the save
    /// succeeds: each call is answered in order with the state just
    /// after it. The first call after the start or after a restore too
    /// (its failed save was reported with no state, and its reply counted
    /// it with the state from before it; found by review).
    #[test]
    fn a_call_whose_save_fails_for_a_while_is_answered_with_its_own_state() {
        for failing_at in [1, 2] {
            let service = CountWithPassingSaveFailures {
                count: 0,
                failing_at: [failing_at, failing_at],
                failures: std::sync::atomic::AtomicU32::new(6),
            };
            let mut pool = WorkerPool::new(vec![Box::new(service) as Box<dyn Service>]).unwrap();
            assert_eq!(
                answered_with_states(&mut pool, &[1, 2, 3]),
                vec![(1, 1), (2, 2), (3, 3)],
                "failing at {failing_at}"
            );
        }
        // No state to save at the start (the pool's save and the worker's
        // fail), a state from the restore on.
        let service = CountWithPassingSaveFailures {
            count: 0,
            failing_at: [0, 8],
            failures: std::sync::atomic::AtomicU32::new(2 + 6),
        };
        let mut pool = WorkerPool::new(vec![Box::new(service) as Box<dyn Service>]).unwrap();
        pool.restore_state(&7u64.to_be_bytes()).unwrap();
        assert_eq!(
            answered_with_states(&mut pool, &[1, 2]),
            vec![(1, 8), (2, 9)],
            "the first call after a restore"
        );
    }

    #[test]
    fn blocking_calls_finish_on_workers_and_each_runs_once() {
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let workers: Vec<Box<dyn Service>> = (0..3)
            .map(|_| Box::new(SlowEcho(ran.clone())) as Box<dyn Service>)
            .collect();
        let mut callee = Callee::new(Box::new(WorkerPool::new(workers).unwrap()));
        let mut caller = Caller::new(Duration::from_millis(1), 1000);
        let end = DatagramEnd {
            mac: remora_wire::MacAddress([2, 0, 0, 0, 0, 9]),
            address: remora_wire::Ipv4Address::new(10, 0, 0, 9),
            port: 40000,
        };
        for index in 0..6u8 {
            caller
                .call(Timestamp::ZERO, end, "echo", GlobalAddress::NULL, &[index])
                .unwrap();
        }
        let mut outcomes = Vec::new();
        let started = std::time::Instant::now();
        while outcomes.len() < 6 && started.elapsed() < Duration::from_secs(10) {
            while let Some((_, call)) = caller.poll_transmit() {
                // Every call is sent twice: the copy that comes while the
                // first runs is a duplicate, not a second execution.
                callee.handle(end, &call);
                callee.handle(end, &call);
            }
            callee.poll_service();
            while let Some((_, reply)) = callee.poll_transmit() {
                caller.handle(&reply);
            }
            while let Some(outcome) = caller.take_completion() {
                outcomes.push(outcome);
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(outcomes.len(), 6);
        for (rpc_id, outcome) in outcomes {
            assert_eq!(outcome.unwrap(), vec![rpc_id as u8 - 1]);
        }
        // A late duplicate run would show after the replies: give it time.
        std::thread::sleep(Duration::from_millis(50));
        callee.poll_service();
        assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 6);
        assert_eq!(callee.counters().executed, 6);
        assert_eq!(callee.counters().duplicates, 6);
        assert_eq!(callee.in_progress(), 0);
    }
}
