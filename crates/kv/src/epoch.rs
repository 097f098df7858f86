//! Epoch protection, after FASTER's `LightEpoch`.
//!
//! Threads share the log without locks on its hot path. A thread that
//! looks at shared state (the head, the read-only boundary, a memory
//! frame) does so inside a protected section that pins the epoch it
//! entered in. A thread that changes such state publishes the change,
//! bumps the global epoch and hands over an action; the action runs once
//! every protected thread has entered a later epoch, so none of them can
//! still act on the old state. That is how a page becomes safe to flush
//! (nobody still updates it in place) and a frame safe to reuse (nobody
//! still reads it).
//!
//! Threads refresh their epoch every few operations, so actions run
//! within a bounded number of operations of being handed over.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// A slot no thread holds.
const FREE: u64 = u64::MAX;
/// A slot whose thread holds it but is outside any protected section.
const UNPROTECTED: u64 = 0;

/// Actions waiting for their epoch to become safe. More than this means
/// threads have stopped refreshing, which is a bug in the caller.
pub const MAX_PENDING_ACTIONS: usize = 4096;

type Action = Box<dyn FnOnce() + Send>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EpochError {
    #[error("all {0} epoch slots are held: at most that many sessions can be open at once")]
    NoFreeSlot(usize),
    #[error("{MAX_PENDING_ACTIONS} epoch actions are waiting: some thread holds protection without refreshing")]
    TooManyActions,
}

/// One padded slot per thread, so that refreshing touches only its own
/// cache line.
#[repr(align(64))]
struct Slot(AtomicU64);

pub struct Epoch {
    current: AtomicU64,
    slots: Box<[Slot]>,
    waiting: Mutex<Vec<(u64, Action)>>,
    waiting_count: AtomicUsize,
    /// Set by a drain that found another draining: the other passes
    /// again once done, with the safe epoch as it is then.
    drain_again: AtomicBool,
    /// Runs inside a drain's pass, its safe epoch computed and the lock
    /// held (tests only: another thread moves on in that window).
    #[cfg(test)]
    inside_pass: Mutex<Option<Box<dyn FnMut() + Send>>>,
}

/// A thread's hold on a slot. Returned to [`Epoch::release`] when done.
#[derive(Debug, PartialEq, Eq)]
pub struct SlotIndex(usize);

impl Epoch {
    pub fn new(slots: usize) -> Epoch {
        Epoch {
            current: AtomicU64::new(1),
            slots: (0..slots).map(|_| Slot(AtomicU64::new(FREE))).collect(),
            waiting: Mutex::new(Vec::new()),
            waiting_count: AtomicUsize::new(0),
            drain_again: AtomicBool::new(false),
            #[cfg(test)]
            inside_pass: Mutex::new(None),
        }
    }

    /// Takes a free slot for a thread (unprotected to begin with).
    pub fn acquire(&self) -> Result<SlotIndex, EpochError> {
        for (index, slot) in self.slots.iter().enumerate() {
            if slot
                .0
                .compare_exchange(FREE, UNPROTECTED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(SlotIndex(index));
            }
        }
        Err(EpochError::NoFreeSlot(self.slots.len()))
    }

    pub fn release(&self, slot: SlotIndex) {
        self.slots[slot.0].0.store(FREE, Ordering::SeqCst);
        self.drain();
    }

    /// Enters a protected section at the current epoch.
    pub fn protect(&self, slot: &SlotIndex) {
        let epoch = self.current.load(Ordering::SeqCst);
        self.slots[slot.0].0.store(epoch, Ordering::SeqCst);
    }

    pub fn unprotect(&self, slot: &SlotIndex) {
        self.slots[slot.0].0.store(UNPROTECTED, Ordering::SeqCst);
        self.drain();
    }

    pub fn is_protected(&self, slot: &SlotIndex) -> bool {
        self.slots[slot.0].0.load(Ordering::Relaxed) != UNPROTECTED
    }

    /// Moves a protected thread to the current epoch and runs whatever
    /// actions that makes safe.
    pub fn refresh(&self, slot: &SlotIndex) {
        self.protect(slot);
        if self.waiting_count.load(Ordering::Acquire) > 0 {
            self.drain();
        }
    }

    /// Bumps the epoch and runs `action` once every thread protected now
    /// has moved past it. The caller has published its change already.
    pub fn bump_with(&self, action: impl FnOnce() + Send + 'static) -> Result<(), EpochError> {
        let published_in = self.current.fetch_add(1, Ordering::SeqCst);
        {
            let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            if waiting.len() >= MAX_PENDING_ACTIONS {
                return Err(EpochError::TooManyActions);
            }
            waiting.push((published_in, Box::new(action)));
            self.waiting_count.store(waiting.len(), Ordering::Release);
        }
        self.drain();
        Ok(())
    }

    /// The newest epoch no protected thread is still in or before.
    fn safe_epoch(&self) -> u64 {
        let current = self.current.load(Ordering::SeqCst);
        let oldest = self
            .slots
            .iter()
            .map(|slot| slot.0.load(Ordering::SeqCst))
            .filter(|&epoch| epoch != FREE && epoch != UNPROTECTED)
            .min()
            .unwrap_or(current);
        oldest - 1
    }

    /// Runs the actions whose epoch is safe. They run outside the lock,
    /// since an action may bump the epoch itself. A drain that finds
    /// another under way asks it to pass again: the other computed its
    /// safe epoch before this thread moved on, and without a second pass
    /// nothing ran the actions this thread's move made safe. With no
    /// session left to refresh, they never ran: the log they hold leaked,
    /// and the file device's workers waited for it for good.
    fn drain(&self) {
        // Bounded: a pass again only if another drain asked since this
        // one began; past the bound the request stays for the next drain.
        for _ in 0..=self.slots.len() {
            self.drain_again.store(false, Ordering::SeqCst);
            let Some(ripe) = self.take_ripe() else {
                self.drain_again.store(true, Ordering::SeqCst);
                return;
            };
            for action in ripe {
                action();
            }
            if !self.drain_again.load(Ordering::SeqCst) {
                return;
            }
        }
    }

    /// The actions whose epoch is safe, taken from the waiting list; none
    /// if another thread is draining.
    fn take_ripe(&self) -> Option<Vec<Action>> {
        let mut waiting = self.waiting.try_lock().ok()?;
        let safe = self.safe_epoch();
        #[cfg(test)]
        if let Some(hook) = self
            .inside_pass
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
        {
            hook();
        }
        let mut ripe = Vec::new();
        let mut index = 0;
        while index < waiting.len() {
            if waiting[index].0 <= safe {
                ripe.push(waiting.swap_remove(index).1);
            } else {
                index += 1;
            }
        }
        self.waiting_count.store(waiting.len(), Ordering::Release);
        Some(ripe)
    }

    /// Actions still waiting (for tests and reports).
    pub fn waiting_actions(&self) -> usize {
        self.waiting_count.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// A drain computed its safe epoch, and another thread unprotected
    /// before the first let go of the lock: the second's drain found the
    /// lock taken and left, the first's was stale, and the action waited
    /// with no session left to run it. The second asks for another pass.
    #[test]
    fn a_thread_that_moves_on_during_another_drain_is_not_forgotten() {
        let epoch = Arc::new(Epoch::new(2));
        let first = epoch.acquire().unwrap();
        let second = Arc::new(epoch.acquire().unwrap());
        epoch.protect(&first);
        epoch.protect(&second);
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        epoch
            .bump_with(move || flag.store(true, Ordering::SeqCst))
            .unwrap();
        let (inside, slot) = (Arc::downgrade(&epoch), second.clone());
        let mut once = true;
        *epoch.inside_pass.lock().unwrap() = Some(Box::new(move || {
            if std::mem::take(&mut once) {
                inside.upgrade().unwrap().unprotect(&slot);
            }
        }));
        epoch.unprotect(&first);
        assert!(ran.load(Ordering::SeqCst), "nobody ran the action");
        assert_eq!(epoch.waiting_actions(), 0);
    }

    #[test]
    fn an_action_waits_for_every_protected_thread_to_refresh() {
        let epoch = Epoch::new(4);
        let reader = epoch.acquire().unwrap();
        let writer = epoch.acquire().unwrap();
        epoch.protect(&reader);
        epoch.protect(&writer);
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        epoch
            .bump_with(move || flag.store(true, Ordering::SeqCst))
            .unwrap();
        epoch.refresh(&writer);
        assert!(
            !ran.load(Ordering::SeqCst),
            "the reader is still in the old epoch"
        );
        epoch.refresh(&reader);
        assert!(ran.load(Ordering::SeqCst));
        assert_eq!(epoch.waiting_actions(), 0);
    }

    #[test]
    fn an_unprotected_thread_does_not_hold_actions_back() {
        let epoch = Epoch::new(2);
        let idle = epoch.acquire().unwrap();
        epoch.protect(&idle);
        epoch.unprotect(&idle);
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        epoch
            .bump_with(move || flag.store(true, Ordering::SeqCst))
            .unwrap();
        assert!(ran.load(Ordering::SeqCst));
    }

    #[test]
    fn slots_run_out_with_a_typed_error_and_come_back_when_released() {
        let epoch = Epoch::new(1);
        let only = epoch.acquire().unwrap();
        assert_eq!(epoch.acquire(), Err(EpochError::NoFreeSlot(1)));
        epoch.release(only);
        assert!(epoch.acquire().is_ok());
    }
}
