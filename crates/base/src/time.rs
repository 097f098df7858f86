//! Time as a state machine sees it: a number handed in by the caller. The
//! state machines never read a clock, so the simulator's virtual time and
//! a real monotonic clock drive the very same code.

use std::time::Duration;

/// Nanoseconds since an arbitrary epoch chosen by whoever drives the
/// state machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    pub const ZERO: Timestamp = Timestamp(0);

    pub const fn from_nanos(nanos: u64) -> Timestamp {
        Timestamp(nanos)
    }

    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Saturates rather than wrapping: a deadline past the end of time is
    /// simply never reached.
    pub fn saturating_add(self, duration: Duration) -> Timestamp {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        Timestamp(self.0.saturating_add(nanos))
    }

    pub fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adding_past_the_end_of_time_saturates() {
        let late = Timestamp::from_nanos(u64::MAX - 1);
        assert_eq!(
            late.saturating_add(Duration::from_secs(1)).as_nanos(),
            u64::MAX
        );
        assert_eq!(
            Timestamp::ZERO.saturating_duration_since(late),
            Duration::ZERO
        );
    }
}
