//! A background compactor for a long-running store (`remora kv serve`):
//! a thread with a session of its own that looks at the device's free
//! room every so often and, when it falls below a share of the log's
//! capacity, compacts everything below the head
//! ([`crate::Session::compact`]). Without it a store that keeps updating
//! fills its device with superseded copies and refuses writes.

use crate::log::LogError;
use crate::{KvError, Session, Store};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// When the compactor works.
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompactionPolicy {
    /// Compact when the device's free room falls below this share of the
    /// log's capacity, in (0, 1).
    pub below_room_fraction: f64,
    /// How often the room is looked at, in milliseconds (at least 1).
    pub check_every_ms: u64,
    /// How long a write that finds the device full waits for the
    /// compactor to make room before it fails, in milliseconds.
    pub writers_wait_ms: u64,
}

impl Default for CompactionPolicy {
    fn default() -> CompactionPolicy {
        CompactionPolicy {
            below_room_fraction: 0.25,
            check_every_ms: 5,
            writers_wait_ms: 2000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CompactorError {
    #[error("below_room_fraction {0} is outside (0, 1)")]
    RoomFraction(f64),
    #[error("check_every_ms must be at least 1")]
    CheckEvery,
    #[error("compacting: {0}")]
    Store(#[from] KvError),
    #[error("the compactor's thread could not start: {0}")]
    Thread(String),
    #[error("the compactor's thread panicked")]
    Panicked,
}

impl CompactionPolicy {
    pub fn check(&self) -> Result<(), CompactorError> {
        if !(self.below_room_fraction > 0.0 && self.below_room_fraction < 1.0) {
            return Err(CompactorError::RoomFraction(self.below_room_fraction));
        }
        if self.check_every_ms == 0 {
            return Err(CompactorError::CheckEvery);
        }
        Ok(())
    }

    /// Whether `store` has less room than the policy allows.
    fn is_due(&self, store: &Store) -> bool {
        let floor = store.log_capacity_bytes() as f64 * self.below_room_fraction;
        (store.device_room_bytes() as f64) < floor
    }
}

/// The longest the compactor waits between looks after passes that
/// gained nothing: short enough that writers waiting for room are not
/// kept long once superseded records appear below the head.
const MOST_BACKOFF: Duration = Duration::from_millis(200);

/// Compactions to the head while the room stays below the policy's floor
/// and each one gains some. A full device is not a failure: writers that
/// outran the compactor wait on it, and the pages it freed stay freed.
/// `false`: the last pass gained no room, so the data still live fill the
/// device past the floor and another pass now would only move them.
fn compact_while_due(
    store: &Store,
    session: &mut Session,
    policy: CompactionPolicy,
    stopping: &AtomicBool,
) -> Result<bool, KvError> {
    while policy.is_due(store) && !stopping.load(Ordering::Relaxed) {
        let room_before = store.device_room_bytes();
        let [before, head, ..] = store.boundaries();
        let compacted = session.compact(head);
        match compacted {
            Ok(_) | Err(KvError::Log(LogError::DeviceFull { .. })) => {}
            Err(error) => return Err(error),
        }
        // The pages given back still hold the kept checkpoint's log: a
        // new checkpoint lets their space go (else writers would fill the
        // device waiting on it).
        if store.checkpoint_holds_room() {
            match session.checkpoint() {
                // Its page turn has a reserve of its own; should even that
                // be gone, writers' deletes or a later pass may make room,
                // and a compactor that ended here never looked again.
                Ok(_) | Err(KvError::Log(LogError::DeviceFull { .. })) => {}
                Err(error) => return Err(error),
            }
        }
        session.suspend();
        // Nothing below the head to give back yet, or nothing gained by
        // giving it back: wait for writers to supersede records.
        if store.boundaries()[0] == before || store.device_room_bytes() <= room_before {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A running compactor; [`Compactor::stop`] ends it.
pub struct Compactor {
    store: Store,
    stop: Arc<AtomicBool>,
    failure: Arc<Mutex<Option<KvError>>>,
    handle: Option<JoinHandle<()>>,
}

impl Compactor {
    /// Starts compacting `store` as `policy` says. It takes one of the
    /// store's sessions.
    pub fn start(store: Store, policy: CompactionPolicy) -> Result<Compactor, CompactorError> {
        policy.check()?;
        let mut session = store.session()?;
        session.suspend();
        store.wait_for_room(Duration::from_millis(policy.writers_wait_ms));
        let stop = Arc::new(AtomicBool::new(false));
        let failure = Arc::new(Mutex::new(None));
        let (stopping, failing, kept) = (stop.clone(), failure.clone(), store.clone());
        let handle = std::thread::Builder::new()
            .name("remora-kv-compactor".into())
            .spawn(move || {
                let interval = Duration::from_millis(policy.check_every_ms);
                let mut wait = interval;
                while !stopping.load(Ordering::Relaxed) {
                    match compact_while_due(&store, &mut session, policy, &stopping) {
                        Ok(true) => wait = interval,
                        // Looking again at once would copy the same live
                        // records round the log: back off.
                        Ok(false) => wait = (wait * 2).min(MOST_BACKOFF.max(interval)),
                        Err(error) => {
                            // Nothing frees room from now on: writers that
                            // find the device full fail at once, where each
                            // waited out its room wait for a compactor that
                            // was gone. Said now, not only at the stop.
                            store.wait_for_room(Duration::ZERO);
                            tracing::error!(
                                %error,
                                "the compactor stopped; writes that find the device full now fail"
                            );
                            *failing.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
                            return;
                        }
                    }
                    std::thread::sleep(wait);
                }
            })
            .map_err(|error| CompactorError::Thread(error.to_string()))?;
        Ok(Compactor {
            store: kept,
            stop,
            failure,
            handle: Some(handle),
        })
    }

    /// Stops the thread; the error that stopped it early, if one did.
    pub fn stop(mut self) -> Result<(), CompactorError> {
        self.halt();
        let joined = self.handle.take().map(JoinHandle::join);
        if let Some(Err(_)) = joined {
            return Err(CompactorError::Panicked);
        }
        match self
            .failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            Some(error) => Err(error.into()),
            None => Ok(()),
        }
    }
}

impl Compactor {
    /// Tells the thread to stop; writers no longer wait for room.
    fn halt(&self) {
        self.stop.store(true, Ordering::Relaxed);
        self.store.wait_for_room(Duration::ZERO);
    }
}

impl Drop for Compactor {
    fn drop(&mut self) {
        self.halt();
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}
