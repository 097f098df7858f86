//! Random operation streams. Each stream is one requester queue pair issuing
//! operations against its own window of the responder's memory, so a plain
//! sequential model predicts every result: RC executes a queue pair's
//! requests exactly once, in order.

use crate::model::WindowModel;
use rand::Rng;

/// Bytes of a stream's data window on the responder.
pub const DATA_WINDOW_BYTES: u64 = 16 * 1024;
/// 8-byte atomic targets after the data window.
pub const ATOMIC_SLOTS: u64 = 32;
pub const WINDOW_BYTES: u64 = DATA_WINDOW_BYTES + ATOMIC_SLOTS * 8;
/// Longest WRITE or READ.
pub const MAX_TRANSFER_BYTES: u32 = 6000;
/// Longest SEND; each receive buffer holds this much.
pub const MAX_SEND_BYTES: u32 = 3000;
/// Local buffer per operation on the requester.
pub const LOCAL_SLOT_BYTES: u64 = 8 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// An rkey no region has.
    BadRkey,
    /// A WRITE running past the end of the window's region.
    OutOfBounds,
    /// A WRITE into a region registered without REMOTE_WRITE.
    WriteToReadOnly,
    /// An atomic on a region registered without REMOTE_ATOMIC.
    AtomicOnReadOnly,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    Write {
        offset: u64,
        data: Vec<u8>,
        immediate: Option<u32>,
    },
    Read {
        offset: u64,
        length: u32,
    },
    Send {
        data: Vec<u8>,
        immediate: Option<u32>,
    },
    CompareSwap {
        slot: u64,
        compare: u64,
        swap: u64,
    },
    FetchAdd {
        slot: u64,
        add: u64,
    },
    Violation(Violation),
}

impl Operation {
    /// SENDs and WRITE-with-immediate consume a receive at the responder.
    pub fn consumes_receive(&self) -> bool {
        matches!(
            self,
            Operation::Send { .. }
                | Operation::Write {
                    immediate: Some(_),
                    ..
                }
        )
    }
}

fn random_bytes(rng: &mut impl Rng, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rng.fill(&mut bytes[..]);
    bytes
}

/// Lengths cluster at packet boundaries, where segmentation bugs live.
fn random_length(rng: &mut impl Rng, max: u32) -> u32 {
    match rng.gen_range(0..4) {
        0 => rng.gen_range(0..=16),
        1 => {
            let mtu = [256u32, 1024, 4096][rng.gen_range(0..3)];
            (mtu + rng.gen_range(0..3) - 1).min(max)
        }
        _ => rng.gen_range(0..=max),
    }
}

/// Generates `count` operations; compare values are drawn so that about
/// half of the CMP_SWAPs hit.
pub fn generate(
    rng: &mut impl Rng,
    count: usize,
    violation_at_end: Option<Violation>,
) -> Vec<Operation> {
    let mut model = WindowModel::new();
    let mut operations = Vec::with_capacity(count + 1);
    for _ in 0..count {
        let operation = match rng.gen_range(0..10) {
            0..=2 => {
                let length = random_length(rng, MAX_TRANSFER_BYTES);
                let offset = rng.gen_range(0..=DATA_WINDOW_BYTES - u64::from(length));
                let immediate = rng.gen_bool(0.2).then(|| rng.gen());
                Operation::Write {
                    offset,
                    data: random_bytes(rng, length as usize),
                    immediate,
                }
            }
            3..=4 => {
                let length = random_length(rng, MAX_TRANSFER_BYTES);
                let offset = rng.gen_range(0..=DATA_WINDOW_BYTES - u64::from(length));
                Operation::Read { offset, length }
            }
            5..=6 => {
                let length = random_length(rng, MAX_SEND_BYTES);
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
