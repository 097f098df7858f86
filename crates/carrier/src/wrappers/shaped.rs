//! A link shaper for real carriers: frames sent through the wrapped port
//! leave at a set bandwidth (a token bucket one frame deep, so a burst is
//! serialized back to back) and arrive a set propagation delay later (a
//! delay line), with tail drop past a queue limit. It is the simulator's
//! link model ([`LinkShape`] is the same triple as the simulator's
//! `LinkConfig`) on a wall clock, so a shaped rack and a simulated one
//! mean the same thing. Wrap both ends to shape both directions.
//!
//! Frames wait in the delay line and leave on a later `send` or `flush`
//! once due; [`Port::next_due`] tells the driver when to wake for them.
//! A driver wakes late by its own granularity (a futex timeout on a busy
//! host), so delays much finer than that are not kept exactly: the rack
//! flags them.

use crate::{check_frame_length, CarrierError, Port, SendStatus, MAX_CARRIED_FRAME_BYTES};
use remora_base::BufferPool;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Frames in the delay line at most. A frame past it is dropped and
/// counted, as a full queue drops it: bandwidth × delay fits far below
/// this for any sane link (1 Gb/s × 1 ms is about 80 jumbo frames).
pub const MAX_DELAYED_FRAMES: usize = 16_384;
/// Buffers of frames already released, kept for the next frames: a
/// shaped link at full rate would otherwise allocate a buffer per frame.
const MAX_SPARE_BUFFERS: usize = 64;

/// Bandwidth, propagation delay and queue limit of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkShape {
    pub bandwidth_bits_per_second: u64,
    pub propagation_delay: Duration,
    /// Frames that would wait longer than this many bytes take to
    /// serialize are tail-dropped.
    pub queue_limit_bytes: u64,
}

impl LinkShape {
    /// How long `bytes` take to serialize at the link's bandwidth.
    pub fn serialization(&self, bytes: u64) -> Duration {
        let nanos = u128::from(bytes) * 8 * 1_000_000_000
            / u128::from(self.bandwidth_bits_per_second.max(1));
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// What a shaper did, for the rack's report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ShapeCounters {
    pub frames_shaped: u64,
    pub bytes_shaped: u64,
    /// Frames tail-dropped because the queue was past its limit.
    pub queue_drops: u64,
    /// Frames dropped because the delay line was full.
    pub delay_line_drops: u64,
}

pub struct Shaped<P> {
    inner: P,
    shape: LinkShape,
    /// When the last accepted frame finishes serializing.
    busy_until: Option<Instant>,
    /// Frames and when they arrive, in arrival order (serialization is
    /// FIFO and the delay is constant, so arrivals are sorted).
    delayed: VecDeque<(Instant, Vec<u8>)>,
    spare: BufferPool,
    counters: ShapeCounters,
}

impl<P: Port> Shaped<P> {
    pub fn new(inner: P, shape: LinkShape) -> Shaped<P> {
        Shaped {
            inner,
            shape,
            busy_until: None,
            delayed: VecDeque::new(),
            spare: BufferPool::new(MAX_SPARE_BUFFERS),
            counters: ShapeCounters::default(),
        }
    }

    pub fn counters(&self) -> ShapeCounters {
        self.counters
    }

    fn release_due(&mut self, now: Instant) -> Result<(), CarrierError> {
        let spare = &mut self.spare;
        super::release_due(&mut self.delayed, &mut self.inner, now, &mut |buffer| {
            spare.give_back(buffer)
        })
    }
}

impl<P: Port> Port for Shaped<P> {
    pass_through_receive!();

    fn send(&mut self, frame: &[u8]) -> Result<SendStatus, CarrierError> {
        // Refused here, not when it leaves the delay line: there the
        // carrier's refusal failed the send of a later, valid frame.
        check_frame_length(frame, MAX_CARRIED_FRAME_BYTES)?;
        let now = Instant::now();
        self.release_due(now)?;
        let start = self.busy_until.map_or(now, |busy| busy.max(now));
        let waited = start.saturating_duration_since(now);
        if waited > self.shape.serialization(self.shape.queue_limit_bytes) {
            self.counters.queue_drops += 1;
            return Ok(SendStatus::Queued);
        }
        if self.delayed.len() >= MAX_DELAYED_FRAMES {
            self.counters.delay_line_drops += 1;
            return Ok(SendStatus::Queued);
        }
        let finished = start + self.shape.serialization(frame.len() as u64);
        self.busy_until = Some(finished);
        self.counters.frames_shaped += 1;
        self.counters.bytes_shaped += frame.len() as u64;
        let held = self.spare.copy_of(frame);
        self.delayed
            .push_back((finished + self.shape.propagation_delay, held));
        Ok(SendStatus::Queued)
    }

    fn flush(&mut self) -> Result<(), CarrierError> {
        self.release_due(Instant::now())?;
        self.inner.flush()
    }

    fn has_room(&mut self) -> bool {
        // The shaper always takes a frame: past its queue limit it drops,
        // as a switch queue would, and counts the drop.
        true
    }

    fn has_frames(&mut self) -> bool {
        self.inner.has_frames()
    }

    #[cfg(not(loom))]
    fn wait_source(&self) -> crate::wait::WaitSource {
        self.inner.wait_source()
    }

    fn next_due(&self) -> Option<Instant> {
        let delayed = self.delayed.front().map(|(due, _)| *due);
        [delayed, self.inner.next_due()].into_iter().flatten().min()
    }

    fn drops(&self) -> crate::PortDrops {
        let mut drops = self.inner.drops();
        drops.shaping_queue += self.counters.queue_drops;
        drops.shaping_delay_line += self.counters.delay_line_drops;
        drops
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wrappers::test_port::TestPort;

    #[test]
    fn frames_in_reused_buffers_arrive_whole_and_in_order() {
        let shape = LinkShape {
            bandwidth_bits_per_second: 100_000_000_000,
            propagation_delay: Duration::ZERO,
            queue_limit_bytes: 1 << 30,
        };
        let mut shaped = Shaped::new(TestPort::default(), shape);
        // Long and short frames alternate, so a reused buffer that kept a
        // longer frame's tail would show.
        let frames: Vec<Vec<u8>> = (0..3 * MAX_SPARE_BUFFERS)
            .map(|index| vec![index as u8; if index % 2 == 0 { 4160 } else { 60 }])
            .collect();
        for frame in &frames {
            shaped.send(frame).unwrap();
            std::thread::sleep(Duration::from_micros(1));
            shaped.flush().unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while shaped.inner.sent.len() < frames.len() && Instant::now() < deadline {
            shaped.flush().unwrap();
        }
        assert_eq!(shaped.inner.sent, frames);
        assert!(shaped.spare.kept() <= MAX_SPARE_BUFFERS);
        assert!(shaped.spare.kept() > 0, "released buffers are kept");
    }
}
