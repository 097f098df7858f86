//! Time as the RNIC sees it: a number handed in by the caller. The RNIC never
//! reads a clock, so the simulator's virtual time and a real monotonic clock
//! drive the very same code.

use std::time::Duration;

/// Nanoseconds since an arbitrary epoch chosen by whoever drives the RNIC.
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
