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

/// `next_due` passed straight to the port in `inner`.
macro_rules! pass_through_next_due {
    () => {
        fn next_due(&self) -> Option<std::time::Instant> {
            self.inner.next_due()
        }
    };
}

pub mod capture;
pub mod counted;
pub mod faulty;
pub mod shaped;

pub use capture::{CaptureDirection, Captured, PcapSink};
pub use counted::{Counted, PortCounters, PortCountersHandle};
pub use faulty::Faulty;
pub use shaped::{LinkShape, ShapeCounters, Shaped};
