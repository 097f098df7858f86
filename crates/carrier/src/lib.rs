//! Carriers move whole RoCEv2 frames between a node's port and the switch.
//!
//! Every carrier moves the same bytes: a frame that leaves a soft RNIC
//! arrives bit for bit at the switch, whatever lies between. The carriers:
//!
//! - [`ring`]: a lock-free single-producer single-consumer ring of
//!   fixed-size slots, checked with `loom`;
//! - [`segment`]: rings and doorbells laid out in one mapping, either
//!   anonymous (in-process rings) or a memfd shared between processes;
//! - [`datagram`]: sockets that carry one frame per datagram, batched
//!   with `sendmmsg`/`recvmmsg`: the UDP tunnel and AF_PACKET;
//! - [`wrappers`]: stackable on any [`Port`]: per-port counters, a pcap
//!   writer and a fault injector that uses the simulator's fault model.
//!
//! A port never blocks. Whoever drives ports sleeps through a [`wait`]
//! `Waiter`, which spins briefly and then blocks on a futex (rings) or in
//! `poll` (sockets), so an idle rack does not burn cores.

#[cfg(not(loom))]
pub mod datagram;
#[cfg(not(loom))]
pub mod doorbell;
pub mod ring;
#[cfg(not(loom))]
pub mod segment;
#[cfg(not(loom))]
pub mod wait;
#[cfg(not(loom))]
pub mod wrappers;

#[cfg(not(loom))]
pub use datagram::{bind_pair, DatagramPort, PacketSocketOptions, Segmentation};
#[cfg(not(loom))]
pub use doorbell::Doorbell;
#[cfg(not(loom))]
pub use segment::{RingPort, Segment, SegmentPlan};
#[cfg(not(loom))]
pub use wait::{IdleStrategy, Kicker, WaitSource, Waiter};

use remora_wire::frame::MAX_FRAME_LEN;

/// The largest frame any carrier moves: a full RoCEv2 frame at MTU 4096.
pub const MAX_CARRIED_FRAME_BYTES: usize = MAX_FRAME_LEN;

/// What became of a frame handed to [`Port::send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendStatus {
    /// Queued; it leaves at the latest at the next [`Port::flush`].
    Queued,
    /// The carrier had no room and dropped it, as a full switch queue
    /// would. The RNIC's retransmission recovers.
    DroppedNoRoom,
}

#[derive(Debug, thiserror::Error)]
pub enum CarrierError {
    #[error("frame of {length_bytes} bytes exceeds the carrier's {limit_bytes}-byte limit")]
    FrameTooLarge {
        length_bytes: usize,
        limit_bytes: usize,
    },
    #[error("{operation}: {source}")]
    Io {
        operation: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("shared segment: {0}")]
    Segment(String),
    #[error("the peer is gone")]
    PeerGone,
    #[error("{operation} {path}: {source}")]
    File {
        operation: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

#[cfg(not(loom))]
impl CarrierError {
    pub(crate) fn io(operation: &'static str, source: impl Into<std::io::Error>) -> CarrierError {
        CarrierError::Io {
            operation,
            source: source.into(),
        }
    }
}

/// One end of a carrier: the port of a node or of the switch.
///
/// Ports never block; see [`wait::Waiter`] for sleeping until one has work.
pub trait Port: Send {
    /// Hands up to `max_frames` received frames to `sink`, oldest first,
    /// and returns how many it handed over.
    fn receive(
        &mut self,
        max_frames: usize,
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, CarrierError>;

    /// Queues one frame. It is visible to the peer at the latest after the
    /// next [`Port::flush`].
    fn send(&mut self, frame: &[u8]) -> Result<SendStatus, CarrierError>;

    /// Makes every queued frame visible to the peer (publishes a ring's
    /// tail, or hands a batch to `sendmmsg`).
    fn flush(&mut self) -> Result<(), CarrierError>;

    /// Whether [`Port::send`] would queue a frame now rather than drop it.
    fn has_room(&mut self) -> bool;

    /// Whether a frame waits, without taking it. Ring ports answer from
    /// their shared counters; socket ports answer false, because `poll` is
    /// level-triggered and so cannot miss what is already queued.
    fn has_frames(&mut self) -> bool;

    /// What a waiter must watch to learn that frames arrived.
    #[cfg(not(loom))]
    fn wait_source(&self) -> WaitSource;

    /// When the port next has something to do on its own (a fault
    /// injector's held frame falling due): the driver's next wake-up.
    fn next_due(&self) -> Option<std::time::Instant> {
        None
    }

    /// The frames this port and the wrappers under it lost, by where.
    fn drops(&self) -> PortDrops {
        PortDrops::default()
    }
}

/// Frames a port's carrier and the wrappers on it lost, by where: what a
/// rack's report adds up, so that no frame goes without a count. (A
/// refusal for want of room is the sender's to count: the port says so.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PortDrops {
    /// Datagrams the kernel refused (buffer full, peer unreachable, over
    /// the MTU), and those queued behind a send that failed the port.
    pub refused_by_kernel: u64,
    /// Received datagrams longer than any frame.
    pub truncated_on_receive: u64,
    /// Frames a shaped link's queue tail-dropped.
    pub shaping_queue: u64,
    /// Frames a shaped link's delay line had no room for.
    pub shaping_delay_line: u64,
    /// Frames a link's fault injection lost, as asked.
    pub lost_to_faults: u64,
}

impl PortDrops {
    pub fn add(&mut self, other: &PortDrops) {
        self.refused_by_kernel += other.refused_by_kernel;
        self.truncated_on_receive += other.truncated_on_receive;
        self.shaping_queue += other.shaping_queue;
        self.shaping_delay_line += other.shaping_delay_line;
        self.lost_to_faults += other.lost_to_faults;
    }

    pub fn total(&self) -> u64 {
        self.refused_by_kernel
            + self.truncated_on_receive
            + self.shaping_queue
            + self.shaping_delay_line
            + self.lost_to_faults
    }
}

impl<P: Port + ?Sized> Port for Box<P> {
    fn receive(
        &mut self,
        max_frames: usize,
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, CarrierError> {
        (**self).receive(max_frames, sink)
    }

    fn send(&mut self, frame: &[u8]) -> Result<SendStatus, CarrierError> {
        (**self).send(frame)
    }

    fn flush(&mut self) -> Result<(), CarrierError> {
        (**self).flush()
    }

    fn has_room(&mut self) -> bool {
        (**self).has_room()
    }

    fn has_frames(&mut self) -> bool {
        (**self).has_frames()
    }

    #[cfg(not(loom))]
    fn wait_source(&self) -> WaitSource {
        (**self).wait_source()
    }

    fn next_due(&self) -> Option<std::time::Instant> {
        (**self).next_due()
    }

    fn drops(&self) -> PortDrops {
        (**self).drops()
    }
}

#[cfg(not(loom))]
pub(crate) fn check_frame_length(frame: &[u8], limit_bytes: usize) -> Result<(), CarrierError> {
    if frame.len() > limit_bytes {
        return Err(CarrierError::FrameTooLarge {
            length_bytes: frame.len(),
            limit_bytes,
        });
    }
    Ok(())
}
