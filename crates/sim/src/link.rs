//! One direction of a link: serialization at a bandwidth, a bounded queue,
//! propagation delay, and the fault model.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use remora_base::{Probability, Timestamp};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Random faults applied to every frame while faults are on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkFaults {
    /// Probability a frame vanishes.
    pub loss: Probability,
    /// Probability a frame is delivered twice.
    pub duplicate: Probability,
    /// Probability a frame is held back by up to `reorder_delay`, so later
    /// frames overtake it.
    pub reorder: Probability,
    pub reorder_delay: Duration,
    /// Probability one random bit of a frame flips.
    pub corrupt: Probability,
}

impl LinkFaults {
    pub const NONE: LinkFaults = LinkFaults {
        loss: Probability::ZERO,
        duplicate: Probability::ZERO,
        reorder: Probability::ZERO,
        reorder_delay: Duration::ZERO,
        corrupt: Probability::ZERO,
    };

    /// Decides the fate of one frame of `len_bytes`. The simulator's links
    /// and the real carriers' fault injector both draw here, so a fault
    /// profile means the same thing in both.
    pub fn draw(&self, len_bytes: usize, rng: &mut impl Rng) -> FaultDraw {
        // Draw every decision for every frame, so a change in one
        // probability does not shift the random stream of the others.
        let lost = decide(self.loss, rng);
        let duplicated = decide(self.duplicate, rng);
        let reordered = decide(self.reorder, rng);
        let delay_fraction: f64 = rng.gen();
        let corrupted = decide(self.corrupt, rng);
        let bit = rng.gen_range(0..len_bytes.max(1) * 8);
        FaultDraw {
            lost,
            duplicated,
            reorder_delay: reordered.then(|| self.reorder_delay.mul_f64(delay_fraction)),
            duplicate_delay: self.reorder_delay.mul_f64(1.0 - delay_fraction),
            // An empty frame has no bit to flip.
            corrupt_bit: (corrupted && len_bytes > 0).then_some(bit),
        }
    }
}

/// Whether an event of `probability` happens, always drawing one word.
/// `gen_bool(1.0)` draws nothing (certain), so a probability of 1 shifted
/// every later draw; below 1 this is `gen_bool` exactly, so the streams
/// of every seed run so far stay as they were.
fn decide(probability: Probability, rng: &mut impl Rng) -> bool {
    if probability.get() >= 1.0 {
        let _: u64 = rng.gen();
        return true;
    }
    rng.gen_bool(probability.get())
}

/// The fate [`LinkFaults::draw`] chose for one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FaultDraw {
    pub lost: bool,
    pub duplicated: bool,
    /// Extra delay for a reordered frame.
    pub reorder_delay: Option<Duration>,
    /// How long after the original's on-time arrival a duplicate lands.
    pub duplicate_delay: Duration,
    /// The bit to flip in a corrupted frame.
    pub corrupt_bit: Option<usize>,
}

/// Why a link cannot be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LinkConfigError {
    #[error("a link's bandwidth must be positive")]
    ZeroBandwidth,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinkConfig {
    pub bandwidth_bits_per_second: u64,
    pub propagation_delay: Duration,
    /// Frames beyond this much queued data are tail-dropped.
    pub queue_limit_bytes: usize,
    pub faults: LinkFaults,
}

impl LinkConfig {
    /// A 100 Gb/s rack link with 1 µs of propagation delay.
    pub fn rack() -> LinkConfig {
        LinkConfig {
            bandwidth_bits_per_second: 100_000_000_000,
            propagation_delay: Duration::from_micros(1),
            queue_limit_bytes: 4 << 20,
            faults: LinkFaults::NONE,
        }
    }

    pub fn validate(&self) -> Result<(), LinkConfigError> {
        if self.bandwidth_bits_per_second == 0 {
            return Err(LinkConfigError::ZeroBandwidth);
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkCounters {
    pub frames_offered: u64,
    pub frames_delivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub corrupted: u64,
    pub partition_drops: u64,
    pub queue_drops: u64,
}

impl LinkCounters {
    /// Adds `other`'s counts to these (both directions of a link, or many
    /// seeds' links).
    pub fn add(&mut self, other: &LinkCounters) {
        self.frames_offered += other.frames_offered;
        self.frames_delivered += other.frames_delivered;
        self.lost += other.lost;
        self.duplicated += other.duplicated;
        self.reordered += other.reordered;
        self.corrupted += other.corrupted;
        self.partition_drops += other.partition_drops;
        self.queue_drops += other.queue_drops;
    }
}

/// One direction of a link.
#[derive(Debug)]
pub(crate) struct Channel {
    pub(crate) config: LinkConfig,
    pub(crate) counters: LinkCounters,
    busy_until: Timestamp,
    /// The part of a nanosecond past `busy_until` the wire is still busy,
    /// in picoseconds: a 62-byte frame at 100 Gb/s takes 4.96 ns, and in
    /// whole nanoseconds small frames got a fifth more bandwidth.
    busy_fraction_ps: u64,
    partitioned: bool,
    /// Partitions begun so far: a frame sent before the latest one began
    /// and not yet arrived is lost with the link.
    cuts: u64,
}

/// What the channel decided for one offered frame: arrival times (none if
/// lost, two if duplicated) and whether to flip a bit.
pub(crate) struct Fate {
    pub(crate) arrivals: [Option<Timestamp>; 2],
    pub(crate) corrupt_bit: Option<usize>,
}

impl Channel {
    pub(crate) fn new(config: LinkConfig) -> Channel {
        Channel {
            config,
            counters: LinkCounters::default(),
            busy_until: Timestamp::ZERO,
            busy_fraction_ps: 0,
            partitioned: false,
            cuts: 0,
        }
    }

    /// Cuts the channel, or heals it. A cut loses what is on the wire.
    pub(crate) fn set_partitioned(&mut self, partitioned: bool) {
        if partitioned && !self.partitioned {
            self.cuts += 1;
        }
        self.partitioned = partitioned;
    }

    pub(crate) fn cuts(&self) -> u64 {
        self.cuts
    }

    fn serialization(&self, len_bytes: usize) -> Duration {
        Duration::from_nanos((self.serialization_ps(len_bytes) / 1000) as u64)
    }

    fn serialization_ps(&self, len_bytes: usize) -> u128 {
        let bits = len_bytes as u128 * 8;
        bits * 1_000_000_000_000 / u128::from(self.config.bandwidth_bits_per_second.max(1))
    }

    /// Takes the wire from `start` for a frame of `len_bytes`, carrying
    /// the fraction of a nanosecond to the next frame.
    fn occupy(&mut self, start: Timestamp, len_bytes: usize) {
        let carried = match start == self.busy_until {
            true => u128::from(self.busy_fraction_ps),
            false => 0,
        };
        let busy_ps = carried + self.serialization_ps(len_bytes);
        let whole_ns = u64::try_from(busy_ps / 1000).unwrap_or(u64::MAX);
        self.busy_until = start.saturating_add(Duration::from_nanos(whole_ns));
        self.busy_fraction_ps = (busy_ps % 1000) as u64;
    }

    pub(crate) fn offer(
        &mut self,
        now: Timestamp,
        len_bytes: usize,
        faults_on: bool,
        rng: &mut ChaCha8Rng,
    ) -> Fate {
        self.counters.frames_offered += 1;
        let nothing = Fate {
            arrivals: [None, None],
            corrupt_bit: None,
        };
        if self.partitioned {
            self.counters.partition_drops += 1;
            return nothing;
        }
        let start = self.busy_until.max(now);
        let queued = start.saturating_duration_since(now);
        let queue_limit = self.serialization(self.config.queue_limit_bytes);
        if queued > queue_limit {
            self.counters.queue_drops += 1;
            return nothing;
        }
        self.occupy(start, len_bytes);
        let arrival = self
            .busy_until
            .saturating_add(self.config.propagation_delay);
        if !faults_on {
            self.counters.frames_delivered += 1;
            return Fate {
                arrivals: [Some(arrival), None],
                corrupt_bit: None,
            };
        }
        let draw = self.config.faults.draw(len_bytes, rng);
        if draw.lost {
            self.counters.lost += 1;
            return nothing;
        }
        let mut first = arrival;
        if let Some(extra) = draw.reorder_delay {
            self.counters.reordered += 1;
            first = first.saturating_add(extra);
        }
        // The copy lands on its own schedule, up to a reorder delay after
        // the original's on-time arrival: a copy at the very same instant
        // tested no late duplicate (one the receiver has moved past). The
        // delay is the reordering draw's complement, so it takes no draw
        // of its own and leaves every later draw as it was.
        let second = draw.duplicated.then(|| {
            self.counters.duplicated += 1;
            arrival.saturating_add(draw.duplicate_delay)
        });
        if draw.corrupt_bit.is_some() {
            self.counters.corrupted += 1;
        }
        let corrupt_bit = draw.corrupt_bit;
        self.counters.frames_delivered += 1;
        Fate {
            arrivals: [Some(first), second],
            corrupt_bit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    /// A probability of 1 drew nothing (`gen_bool(1.0)` is certain), so
    /// corrupting every frame changed which frames were lost.
    #[test]
    fn a_certain_fault_leaves_the_other_faults_draws_as_they_were() {
        let lost_frames = |corrupt: f64| {
            let faults = LinkFaults {
                loss: Probability::literal(0.3),
                corrupt: Probability::new(corrupt).unwrap(),
                ..LinkFaults::NONE
            };
            let mut rng = ChaCha8Rng::seed_from_u64(7);
            (0..1000)
                .map(|_| faults.draw(100, &mut rng).lost)
                .collect::<Vec<bool>>()
        };
        let sometimes = lost_frames(0.5);
        assert_eq!(lost_frames(1.0), sometimes);
        assert_eq!(lost_frames(0.0), sometimes);
    }
}
