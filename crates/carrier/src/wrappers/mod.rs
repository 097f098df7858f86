//! Wrappers that stack on any [`Port`](crate::Port): each is a port
//! itself, so `Captured<Faulty<Counted<DatagramPort>>>` is as valid as a
//! bare ring.

/// The [`Port`](crate::Port) methods a wrapper passes straight to the port
/// in its `inner` field.
macro_rules! pass_through_port_state {
    () => {
        fn has_room(&mut self) -> bool {
            self.inner.has_room()
        }

        fn has_frames(&mut self) -> bool {
            self.inner.has_frames()
        }

        fn wait_source(&self) -> crate::wait::WaitSource {
            self.inner.wait_source()
        }
    };
}

/// `receive` passed straight to the port in `inner`: for wrappers that act
/// only on what is sent.
macro_rules! pass_through_receive {
    () => {
        fn receive(
            &mut self,
            max_frames: usize,
            sink: &mut dyn FnMut(&[u8]),
        ) -> Result<usize, crate::CarrierError> {
            self.inner.receive(max_frames, sink)
        }
    };
}

/// `next_due` and `drops` passed straight to the port in `inner`: for
/// wrappers that hold no frame and lose none.
macro_rules! pass_through_next_due {
    () => {
        fn next_due(&self) -> Option<std::time::Instant> {
            self.inner.next_due()
        }

        fn drops(&self) -> crate::PortDrops {
            self.inner.drops()
        }
    };
}

/// Sends the frames of `held` (in due order) whose time has come, while
/// the carrier behind has room: the delay lines of the fault injector and
/// the shaper. A frame the carrier has no room for stays, as a NIC's
/// queue holds it, and goes on a later turn. Each sent frame's buffer is
/// handed to `recycle`.
fn release_due(
    held: &mut std::collections::VecDeque<(std::time::Instant, Vec<u8>)>,
    inner: &mut dyn crate::Port,
    now: std::time::Instant,
    recycle: &mut dyn FnMut(Vec<u8>),
) -> Result<(), crate::CarrierError> {
    // Bounded by the queue's length.
    while held.front().is_some_and(|(due, _)| *due <= now) {
        if !inner.has_room() {
            break;
        }
        let (_, frame) = held.pop_front().expect("front checked");
        inner.send(&frame)?;
        recycle(frame);
    }
    Ok(())
}

pub mod capture;
pub mod copied;
pub mod counted;
pub mod faulty;
pub mod shaped;
#[cfg(test)]
pub(crate) mod test_port;

pub use capture::{CaptureDirection, Captured, PcapSink};
pub use copied::Copied;
pub use counted::{Counted, PortCounters, PortCountersHandle};
pub use faulty::Faulty;
pub use shaped::{LinkShape, ShapeCounters, Shaped};
