//! The reference: a plain byte array per stream window, updated by one
//! operation at a time. What the responder's memory holds after `k`
//! operations executed exactly once, in order, is `WindowModel` after `k`
//! calls to `apply`.

use crate::operation::{Operation, DATA_WINDOW_BYTES, WINDOW_BYTES};

/// What a successful operation must have returned to its requester.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    Nothing,
    ReadData(Vec<u8>),
    AtomicOriginal(u64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowModel {
    bytes: Vec<u8>,
}

impl Default for WindowModel {
    fn default() -> Self {
        WindowModel::new()
    }
}

impl WindowModel {
    pub fn new() -> WindowModel {
        WindowModel {
            bytes: vec![0; WINDOW_BYTES as usize],
        }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    fn atomic_range(slot: u64) -> std::ops::Range<usize> {
        let start = (DATA_WINDOW_BYTES + slot * 8) as usize;
        start..start + 8
    }

    pub fn atomic(&self, slot: u64) -> u64 {
        let bytes = &self.bytes[Self::atomic_range(slot)];
        u64::from_le_bytes(bytes.try_into().expect("8 bytes"))
    }

    fn set_atomic(&mut self, slot: u64, value: u64) {
        self.bytes[Self::atomic_range(slot)].copy_from_slice(&value.to_le_bytes());
    }

    /// Applies one operation and returns what it must have returned.
    /// SENDs and violations leave the window unchanged.
    pub fn apply(&mut self, operation: &Operation) -> Expected {
        match operation {
            Operation::Write { offset, data, .. } => {
                let start = *offset as usize;
                self.bytes[start..start + data.len()].copy_from_slice(data);
                Expected::Nothing
            }
            Operation::Read { offset, length } => {
                let start = *offset as usize;
                Expected::ReadData(self.bytes[start..start + *length as usize].to_vec())
            }
            Operation::CompareSwap {
                slot,
                compare,
                swap,
            } => {
                let original = self.atomic(*slot);
                if original == *compare {
                    self.set_atomic(*slot, *swap);
                }
                Expected::AtomicOriginal(original)
            }
            Operation::FetchAdd { slot, add } => {
                let original = self.atomic(*slot);
                self.set_atomic(*slot, original.wrapping_add(*add));
                Expected::AtomicOriginal(original)
            }
            Operation::Send { .. } | Operation::Violation(_) => Expected::Nothing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomics_follow_ib_semantics() {
        let mut model = WindowModel::new();
        assert_eq!(
            model.apply(&Operation::FetchAdd { slot: 3, add: 5 }),
            Expected::AtomicOriginal(0)
        );
        let miss = Operation::CompareSwap {
            slot: 3,
            compare: 4,
            swap: 9,
        };
        assert_eq!(model.apply(&miss), Expected::AtomicOriginal(5));
        let hit = Operation::CompareSwap {
            slot: 3,
            compare: 5,
            swap: 9,
        };
        assert_eq!(model.apply(&hit), Expected::AtomicOriginal(5));
        assert_eq!(model.atomic(3), 9);
    }

    #[test]
    fn reads_see_earlier_writes() {
        let mut model = WindowModel::new();
        model.apply(&Operation::Write {
            offset: 10,
            data: vec![1, 2, 3],
            immediate: None,
        });
        assert_eq!(
            model.apply(&Operation::Read {
                offset: 9,
                length: 5
            }),
            Expected::ReadData(vec![0, 1, 2, 3, 0])
        );
    }
}
