//! Time inside device calls, for Fig. 10's communication ratio.
//!
//! Device calls nest: a page flush can run inside `complete_pending`'s
//! epoch refresh, and `complete_pending` issues reads of its own (a
//! chain's next record, a long record's rest). Each place that times a
//! call goes through [`timed`], and only the outermost timed call on a
//! thread counts, so no nanosecond is counted twice.

use std::cell::Cell;
use std::time::{Duration, Instant};

thread_local! {
    static INSIDE_TIMED_CALL: Cell<bool> = const { Cell::new(false) };
}

/// Clears the flag when the outermost call ends, by return or by panic.
struct Outermost;

impl Drop for Outermost {
    fn drop(&mut self) {
        INSIDE_TIMED_CALL.with(|inside| inside.set(false));
    }
}

/// Runs `call` and returns what it returned with the time it took, or
/// with zero when this thread is inside a timed call already (whose own
/// time includes this one's).
pub fn timed<T>(call: impl FnOnce() -> T) -> (T, Duration) {
    if INSIDE_TIMED_CALL.with(|inside| inside.replace(true)) {
        return (call(), Duration::ZERO);
    }
    let _outermost = Outermost;
    let started = Instant::now();
    let result = call();
    (result, started.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spin_for(duration: Duration) {
        let started = Instant::now();
        while started.elapsed() < duration {
            std::hint::spin_loop();
        }
    }

    #[test]
    fn a_nested_call_is_counted_once_in_its_outer_call() {
        let (inner, outer) = timed(|| {
            let ((), inner) = timed(|| spin_for(Duration::from_millis(2)));
            spin_for(Duration::from_millis(1));
            inner
        });
        assert_eq!(inner, Duration::ZERO);
        assert!(outer >= Duration::from_millis(3), "{outer:?}");
        // Back at the top: the next call is the outermost again.
        let ((), next) = timed(|| spin_for(Duration::from_millis(1)));
        assert!(next >= Duration::from_millis(1), "{next:?}");
    }

    #[test]
    fn a_panicking_call_leaves_the_next_one_timed() {
        let caught = std::panic::catch_unwind(|| timed(|| panic!("a device call failed")));
        assert!(caught.is_err());
        let ((), next) = timed(|| spin_for(Duration::from_millis(1)));
        assert!(next >= Duration::from_millis(1), "{next:?}");
    }

    #[test]
    fn each_thread_times_its_own_calls() {
        let ((), outer) = timed(|| {
            let other = std::thread::spawn(|| timed(|| spin_for(Duration::from_millis(1))).1);
            assert!(other.join().unwrap() >= Duration::from_millis(1));
        });
        assert!(outer >= Duration::from_millis(1));
    }
}
