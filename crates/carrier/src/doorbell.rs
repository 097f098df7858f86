//! A doorbell: one 32-bit word that a consumer sleeps on and producers ring.
//!
//! The word lives wherever the rings live (a heap mapping or a memfd shared
//! between processes), so the futex is a shared one, not process-private.
//! Producers pay one fence and one load per publish; the system call
//! happens only when the consumer has actually gone to sleep.
//!
//! The protocol is the classic Dekker pair. The consumer stores SLEEPING,
//! fences, and checks its rings once more before it sleeps; the producer
//! publishes its tail, fences, and reads the word. Whichever order they
//! run in, either the consumer sees the frame or the producer sees the
//! sleeper.

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A relative timeout as the kernel takes it.
pub(crate) fn timespec(duration: Duration) -> rustix::time::Timespec {
    rustix::time::Timespec {
        tv_sec: duration.as_secs() as i64,
        tv_nsec: i64::from(duration.subsec_nanos()),
    }
}

/// A doorbell inside shared memory (a segment), kept alive with it.
#[derive(Clone)]
pub struct DoorbellRef {
    _keep_alive: Arc<dyn Send + Sync>,
    pointer: *const Doorbell,
}

// SAFETY: the doorbell is an atomic word in memory the Arc keeps alive.
unsafe impl Send for DoorbellRef {}
// SAFETY: every access to the doorbell's word is atomic, so shared use
// from several threads is what it is built for.
unsafe impl Sync for DoorbellRef {}

impl DoorbellRef {
    /// A handle on the doorbell at `pointer`, which lives as long as
    /// `keep_alive` does.
    ///
    /// # Safety
    /// `pointer` must point to an initialised [`Doorbell`] inside the
    /// memory `keep_alive` owns, suitably aligned.
    pub(crate) unsafe fn new(
        keep_alive: Arc<dyn Send + Sync>,
        pointer: *const Doorbell,
    ) -> DoorbellRef {
        DoorbellRef {
            _keep_alive: keep_alive,
            pointer,
        }
    }

    pub fn same_as(&self, other: &DoorbellRef) -> bool {
        std::ptr::eq(self.pointer, other.pointer)
    }
}

impl std::ops::Deref for DoorbellRef {
    type Target = Doorbell;
    fn deref(&self) -> &Doorbell {
        // SAFETY: `new`'s contract: the pointer is to a live doorbell the
        // Arc keeps mapped.
        unsafe { &*self.pointer }
    }
}

const AWAKE: u32 = 0;
const SLEEPING: u32 = 1;

/// The word itself, `repr(C)` and padded to a cache line so it can be laid
/// out in shared memory next to others.
#[repr(C, align(64))]
pub struct Doorbell {
    word: AtomicU32,
}

impl Doorbell {
    pub const fn new() -> Doorbell {
        Doorbell {
            word: AtomicU32::new(AWAKE),
        }
    }

    /// Wakes the consumer if it sleeps. Call after publishing.
    pub fn ring(&self) {
        fence(Ordering::SeqCst);
        if self.word.load(Ordering::Relaxed) == SLEEPING
            && self.word.swap(AWAKE, Ordering::SeqCst) == SLEEPING
        {
            // An error here is EFAULT on a bad address, which the mapping
            // rules out; nothing useful can be done with it anyway.
            let _ = rustix::thread::futex::wake(
                &self.word,
                rustix::thread::futex::Flags::empty(),
                u32::MAX,
            );
        }
    }

    /// Sleeps until rung or until `timeout`, unless `has_work` (checked
    /// after announcing the sleep) says there is already something to do.
    pub fn sleep(&self, timeout: Duration, has_work: &mut dyn FnMut() -> bool) {
        self.word.store(SLEEPING, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if has_work() {
            self.word.store(AWAKE, Ordering::Relaxed);
            return;
        }
        // EAGAIN (already rung), EINTR and ETIMEDOUT all mean "look again".
        let _ = rustix::thread::futex::wait(
            &self.word,
            rustix::thread::futex::Flags::empty(),
            SLEEPING,
            Some(&timespec(timeout)),
        );
        self.word.store(AWAKE, Ordering::Relaxed);
    }
}

impl Default for Doorbell {
    fn default() -> Self {
        Doorbell::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_ring_wakes_a_sleeper_long_before_its_timeout() {
        let doorbell = Arc::new(Doorbell::new());
        let ringer = Arc::clone(&doorbell);
        let thread = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            ringer.ring();
        });
        let started = Instant::now();
        doorbell.sleep(Duration::from_secs(10), &mut || false);
        assert!(started.elapsed() < Duration::from_secs(5));
        thread.join().unwrap();
    }

    #[test]
    fn work_found_after_announcing_the_sleep_skips_it() {
        let doorbell = Doorbell::new();
        let started = Instant::now();
        doorbell.sleep(Duration::from_secs(10), &mut || true);
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
