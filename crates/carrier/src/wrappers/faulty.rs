//! A fault injector for real carriers, drawing from the simulator's own
//! fault model ([`LinkFaults::draw`]), so a profile tried in the simulator
//! means the same on a live rack. Faults apply to frames sent through the
//! wrapped port; wrap both ends to fault both directions.
//!
//! Reordered frames wait in a bounded holding queue and leave on a later
//! `send` or `flush` once their extra delay has passed (wall-clock time).

use crate::{check_frame_length, CarrierError, Port, SendStatus, MAX_CARRIED_FRAME_BYTES};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use remora_sim::{LinkCounters, LinkFaults};
use std::collections::VecDeque;
use std::time::Instant;

/// Frames held back for reordering at most; beyond it a reordered frame is
/// sent at once (and counted as reordered all the same).
const MAX_HELD_FRAMES: usize = 256;

pub struct Faulty<P> {
    inner: P,
    faults: LinkFaults,
    rng: ChaCha8Rng,
    held: VecDeque<(Instant, Vec<u8>)>,
    counters: LinkCounters,
}

impl<P: Port> Faulty<P> {
    /// The profile's probabilities were checked when it was made.
    pub fn new(inner: P, faults: LinkFaults, seed: u64) -> Faulty<P> {
        Faulty {
            inner,
            faults,
            rng: ChaCha8Rng::seed_from_u64(seed),
            held: VecDeque::with_capacity(MAX_HELD_FRAMES),
            counters: LinkCounters::default(),
        }
    }

    pub fn counters(&self) -> LinkCounters {
        self.counters
    }

    fn release_due(&mut self, now: Instant) -> Result<(), CarrierError> {
        super::release_due(&mut self.held, &mut self.inner, now, &mut drop)
    }

    /// Holds `bytes` until `due`, or sends them now if they are due now or
    /// the holding queue is full.
    fn hold_or_send(&mut self, due: Instant, bytes: Vec<u8>) -> Result<SendStatus, CarrierError> {
        if due <= Instant::now() || self.held.len() >= MAX_HELD_FRAMES {
            return self.inner.send(&bytes);
        }
        // Keep the queue in due order: a later frame with a shorter delay
        // goes ahead of earlier ones, which is the point.
        let at = self.held.partition_point(|(held_due, _)| *held_due <= due);
        self.held.insert(at, (due, bytes));
        Ok(SendStatus::Queued)
    }
}

impl<P: Port> Port for Faulty<P> {
    pass_through_receive!();

    fn send(&mut self, frame: &[u8]) -> Result<SendStatus, CarrierError> {
        // Refused here, not when it leaves the delay line: there the
        // carrier's refusal failed the send of a later, valid frame.
        check_frame_length(frame, MAX_CARRIED_FRAME_BYTES)?;
        let now = Instant::now();
        self.release_due(now)?;
        self.counters.frames_offered += 1;
        let draw = self.faults.draw(frame.len(), &mut self.rng);
        if draw.lost {
            self.counters.lost += 1;
            return Ok(SendStatus::Queued);
        }
        let mut bytes = frame.to_vec();
        if let Some(bit) = draw.corrupt_bit {
            self.counters.corrupted += 1;
            bytes[bit / 8] ^= 1 << (bit % 8);
        }
        if draw.duplicated {
            self.counters.duplicated += 1;
            // The copy lands up to a reorder delay late, as on a
            // simulated link.
            self.hold_or_send(now + draw.duplicate_delay, bytes.clone())?;
        }
        let status = match draw.reorder_delay {
            Some(delay) => {
                self.counters.reordered += 1;
                self.hold_or_send(now + delay, bytes)?
            }
            None => self.inner.send(&bytes)?,
        };
        // A frame the carrier refused for want of room was not delivered.
        if status == SendStatus::Queued {
            self.counters.frames_delivered += 1;
        }
        Ok(status)
    }

    fn flush(&mut self) -> Result<(), CarrierError> {
        self.release_due(Instant::now())?;
        self.inner.flush()
    }

    pass_through_port_state!();

    fn next_due(&self) -> Option<Instant> {
        let held = self.held.front().map(|(due, _)| *due);
        [held, self.inner.next_due()].into_iter().flatten().min()
    }

    fn drops(&self) -> crate::PortDrops {
        let mut drops = self.inner.drops();
        drops.lost_to_faults += self.counters.lost;
        drops
    }
}
