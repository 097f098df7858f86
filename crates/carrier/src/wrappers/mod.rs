//! Wrappers that stack on any [`Port`](crate::Port): each is a port
//! itself, so `Captured<Faulty<Counted<DatagramPort>>>` is as valid as a
//! bare ring.

pub mod capture;
pub mod counted;
pub mod faulty;

pub use capture::{CaptureDirection, Captured, PcapSink};
pub use counted::{Counted, PortCounters, PortCountersHandle};
pub use faulty::Faulty;
