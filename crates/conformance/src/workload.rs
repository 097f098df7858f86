//! Random operation streams. Each stream is one requester queue pair issuing
//! operations against its own window of the responder's memory, so a plain
//! sequential model predicts every result: RC executes a queue pair's
//! requests exactly once, in order.

use crate::model::WindowModel;
use rand::Rng;

pub use crate::operation::{
    Operation, Violation, ATOMIC_SLOTS, DATA_WINDOW_BYTES, LOCAL_SLOT_BYTES, MAX_SEND_BYTES,
    MAX_TRANSFER_BYTES, WINDOW_BYTES,
};

fn random_bytes(rng: &mut impl Rng, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rng.fill(&mut bytes[..]);
    bytes
}

/// Which packet boundaries a stream's lengths cluster at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LengthBoundaries {
    /// 256, 1024 and 4096 bytes, whatever the stream's MTU: the stream
    /// every seed named in the regression tests was found with.
    #[default]
    Fixed,
    /// One, two and four of the stream's own MTU, so that MTUs 512 and
    /// 2048 have their one-packet and two-packet edges aimed at too.
    StreamMtu,
}

/// A name that is no [`LengthBoundaries`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no length boundaries {0:?} (there are fixed and stream-mtu)")]
pub struct UnknownLengthBoundaries(String);

impl std::str::FromStr for LengthBoundaries {
    type Err = UnknownLengthBoundaries;

    fn from_str(name: &str) -> Result<LengthBoundaries, UnknownLengthBoundaries> {
        [LengthBoundaries::Fixed, LengthBoundaries::StreamMtu]
            .into_iter()
            .find(|boundaries| boundaries.name() == name)
            .ok_or_else(|| UnknownLengthBoundaries(name.into()))
    }
}

impl LengthBoundaries {
    /// The name flags and reports use.
    pub fn name(self) -> &'static str {
        match self {
            LengthBoundaries::Fixed => "fixed",
            LengthBoundaries::StreamMtu => "stream-mtu",
        }
    }

    fn at(self, mtu: u32) -> [u32; 3] {
        match self {
            LengthBoundaries::Fixed => [256, 1024, 4096],
            LengthBoundaries::StreamMtu => [mtu, 2 * mtu, 4 * mtu],
        }
    }
}

/// Lengths cluster at packet boundaries, where segmentation bugs live.
fn random_length(rng: &mut impl Rng, max: u32, boundaries: [u32; 3]) -> u32 {
    match rng.gen_range(0..4) {
        0 => rng.gen_range(0..=16),
        1 => {
            let boundary = boundaries[rng.gen_range(0..3)];
            (boundary + rng.gen_range(0..3) - 1).min(max)
        }
        _ => rng.gen_range(0..=max),
    }
}

/// Generates `count` operations for a stream of path MTU `mtu`; compare
/// values are drawn so that about half of the CMP_SWAPs hit, and lengths
/// cluster at `boundaries`' packet edges.
pub fn generate(
    rng: &mut impl Rng,
    count: usize,
    violation_at_end: Option<Violation>,
    (boundaries, mtu): (LengthBoundaries, u32),
) -> Vec<Operation> {
    let boundaries = boundaries.at(mtu);
    let mut model = WindowModel::new();
    let mut operations = Vec::with_capacity(count + 1);
    for _ in 0..count {
        let operation = match rng.gen_range(0..10) {
            0..=2 => {
                let length = random_length(rng, MAX_TRANSFER_BYTES, boundaries);
                let offset = rng.gen_range(0..=DATA_WINDOW_BYTES - u64::from(length));
                let immediate = rng.gen_bool(0.2).then(|| rng.gen());
                Operation::Write {
                    offset,
                    data: random_bytes(rng, length as usize),
                    immediate,
                }
            }
            3..=4 => {
                let length = random_length(rng, MAX_TRANSFER_BYTES, boundaries);
                let offset = rng.gen_range(0..=DATA_WINDOW_BYTES - u64::from(length));
                Operation::Read { offset, length }
            }
            5..=6 => {
                let length = random_length(rng, MAX_SEND_BYTES, boundaries);
                let immediate = rng.gen_bool(0.3).then(|| rng.gen());
                Operation::Send {
                    data: random_bytes(rng, length as usize),
                    immediate,
                }
            }
            7 => {
                let slot = rng.gen_range(0..ATOMIC_SLOTS);
                let current = model.atomic(slot);
                let compare = if rng.gen_bool(0.5) {
                    current
                } else {
                    rng.gen()
                };
                Operation::CompareSwap {
                    slot,
                    compare,
                    swap: rng.gen(),
                }
            }
            _ => Operation::FetchAdd {
                slot: rng.gen_range(0..ATOMIC_SLOTS),
                add: rng.gen(),
            },
        };
        model.apply(&operation);
        operations.push(operation);
    }
    operations.extend(violation_at_end.map(Operation::Violation));
    operations
}

pub fn random_violation(rng: &mut impl Rng) -> Violation {
    [
        Violation::BadRkey,
        Violation::OutOfBounds,
        Violation::WriteToReadOnly,
        Violation::AtomicOnReadOnly,
    ][rng.gen_range(0..4)]
}
