//! Per-port counters: frames and bytes each way, and drops by reason.
//!
//! The counters are written by the port's one driver thread and may be
//! read by any thread (a reporter, the launcher), so they are atomics with
//! single-writer updates: a relaxed load and store, no locked instruction
//! on the frame path.

use crate::{CarrierError, Port, SendStatus};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A snapshot of one port's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PortCounters {
    pub frames_received: u64,
    pub bytes_received: u64,
    pub frames_sent: u64,
    pub bytes_sent: u64,
    /// Sends the carrier refused for want of room: a node's are lost (RC
    /// resends them); a switch keeps a refused frame queued and tries it
    /// again, and each try counts.
    pub dropped_no_room: u64,
}

#[derive(Default)]
struct Shared {
    frames_received: AtomicU64,
    bytes_received: AtomicU64,
    frames_sent: AtomicU64,
    bytes_sent: AtomicU64,
    dropped_no_room: AtomicU64,
}

fn bump(counter: &AtomicU64, by: u64) {
    counter.store(counter.load(Ordering::Relaxed) + by, Ordering::Relaxed);
}

/// Reads a [`Counted`] port's counters from anywhere.
#[derive(Clone, Default)]
pub struct PortCountersHandle(Arc<Shared>);

impl PortCountersHandle {
    pub fn snapshot(&self) -> PortCounters {
        let shared = &self.0;
        PortCounters {
            frames_received: shared.frames_received.load(Ordering::Relaxed),
            bytes_received: shared.bytes_received.load(Ordering::Relaxed),
            frames_sent: shared.frames_sent.load(Ordering::Relaxed),
            bytes_sent: shared.bytes_sent.load(Ordering::Relaxed),
            dropped_no_room: shared.dropped_no_room.load(Ordering::Relaxed),
        }
    }
}

/// Counts what passes through the port it wraps.
pub struct Counted<P> {
    inner: P,
    shared: PortCountersHandle,
}

impl<P: Port> Counted<P> {
    pub fn new(inner: P) -> Counted<P> {
        Counted {
            inner,
            shared: PortCountersHandle::default(),
        }
    }

    pub fn handle(&self) -> PortCountersHandle {
        self.shared.clone()
    }
}

impl<P: Port> Port for Counted<P> {
    fn receive(
        &mut self,
        max_frames: usize,
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, CarrierError> {
        // Counted as they are handed on: a receive that fails part way (a
        // corrupt ring slot after good ones) has delivered the frames
        // before it, and returning early lost their count.
        let mut frames = 0u64;
        let mut bytes = 0u64;
        let received = self.inner.receive(max_frames, &mut |frame| {
            frames += 1;
            bytes += frame.len() as u64;
            sink(frame);
        });
        bump(&self.shared.0.frames_received, frames);
        bump(&self.shared.0.bytes_received, bytes);
        received
    }

    fn send(&mut self, frame: &[u8]) -> Result<SendStatus, CarrierError> {
        let status = self.inner.send(frame)?;
        match status {
            SendStatus::Queued => {
                bump(&self.shared.0.frames_sent, 1);
                bump(&self.shared.0.bytes_sent, frame.len() as u64);
            }
            SendStatus::DroppedNoRoom => bump(&self.shared.0.dropped_no_room, 1),
        }
        Ok(status)
    }

    fn flush(&mut self) -> Result<(), CarrierError> {
        self.inner.flush()
    }

    pass_through_port_state!();
    pass_through_next_due!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wrappers::test_port::TestPort;

    /// The count was bumped only when the whole receive succeeded: the
    /// frames handed up before a corrupt slot (which the switch forwards)
    /// went uncounted (found by reading).
    #[test]
    fn frames_handed_up_before_an_error_are_counted() {
        // One frame, then a corrupt ring, as a consumer finds at a bad
        // slot after good ones.
        let mut port = Counted::new(TestPort {
            to_receive: vec![vec![7; 10]],
            then_corrupt: true,
            ..TestPort::default()
        });
        let mut handed = 0;
        assert!(port.receive(8, &mut |_| handed += 1).is_err());
        assert_eq!(handed, 1);
        let counters = port.handle().snapshot();
        assert_eq!((counters.frames_received, counters.bytes_received), (1, 10));
    }
}
