//! The host buffer's bookkeeping, with no I/O: which chunks are in memory,
//! which are dirty, which are moving, and the eviction order.
//!
//! userfaultfd reports only faults, not hits, so "least recently used" is
//! least recently *faulted*: a chunk's place in the order is set when it
//! is fetched and when its first write after a fetch or write-back faults.

use crate::store::ObjectId;
use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkKey {
    pub object: ObjectId,
    pub index: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkState {
    /// A handler is fetching it; faults on it wait.
    Fetching,
    Resident {
        dirty: bool,
        stamp: u64,
    },
    /// Being written back and dropped; faults on it wait.
    Evicting,
}

#[derive(Debug)]
struct Entry {
    state: ChunkState,
    bytes: u64,
}

#[derive(Debug)]
pub struct HostBuffer {
    capacity_bytes: u64,
    high_watermark_bytes: u64,
    low_watermark_bytes: u64,
    chunks: HashMap<ChunkKey, Entry>,
    /// Resident chunks by stamp, oldest first.
    order: BTreeMap<u64, ChunkKey>,
    next_stamp: u64,
    /// Bytes of chunks fetching, resident or evicting.
    occupied_bytes: u64,
    /// Bytes of chunks evicting: what leaves once their evictions finish.
    evicting_bytes: u64,
}

impl HostBuffer {
    pub fn new(
        capacity_bytes: u64,
        high_watermark_bytes: u64,
        low_watermark_bytes: u64,
    ) -> HostBuffer {
        assert!(
            low_watermark_bytes <= high_watermark_bytes && high_watermark_bytes <= capacity_bytes
        );
        HostBuffer {
            capacity_bytes,
            high_watermark_bytes,
            low_watermark_bytes,
            chunks: HashMap::new(),
            order: BTreeMap::new(),
            next_stamp: 0,
            occupied_bytes: 0,
            evicting_bytes: 0,
        }
    }

    pub fn state(&self, key: ChunkKey) -> Option<ChunkState> {
        self.chunks.get(&key).map(|entry| entry.state)
    }

    pub fn occupied_bytes(&self) -> u64 {
        self.occupied_bytes
    }

    pub fn resident_chunks(&self) -> usize {
        self.order.len()
    }

    /// Whether fetching `bytes` more would pass the capacity.
    pub fn is_full_for(&self, bytes: u64) -> bool {
        self.occupied_bytes + bytes > self.capacity_bytes
    }

    pub fn is_above_high_watermark(&self) -> bool {
        self.occupied_bytes > self.high_watermark_bytes
    }

    pub fn is_above_low_watermark(&self) -> bool {
        self.occupied_bytes > self.low_watermark_bytes
    }

    pub fn begin_fetch(&mut self, key: ChunkKey, bytes: u64) {
        let previous = self.chunks.insert(
            key,
            Entry {
                state: ChunkState::Fetching,
                bytes,
            },
        );
        assert!(previous.is_none(), "only an absent chunk is fetched");
        self.occupied_bytes += bytes;
    }

    pub fn finish_fetch(&mut self, key: ChunkKey, dirty: bool) {
        let stamp = self.take_stamp();
        let entry = self.chunks.get_mut(&key).expect("a fetching chunk");
        assert_eq!(entry.state, ChunkState::Fetching);
        entry.state = ChunkState::Resident { dirty, stamp };
        self.order.insert(stamp, key);
    }

    /// A fetch that failed leaves the chunk absent.
    pub fn abandon_fetch(&mut self, key: ChunkKey) {
        let entry = self.chunks.remove(&key).expect("a fetching chunk");
        assert_eq!(entry.state, ChunkState::Fetching);
        self.occupied_bytes -= entry.bytes;
    }

    /// A write fault on a resident chunk: dirty, and newest in the order.
    /// Returns false if the chunk is not resident.
    pub fn mark_dirty(&mut self, key: ChunkKey) -> bool {
        let stamp = self.take_stamp();
        let Some(entry) = self.chunks.get_mut(&key) else {
            return false;
        };
        let ChunkState::Resident { stamp: old, .. } = entry.state else {
            return false;
        };
        entry.state = ChunkState::Resident { dirty: true, stamp };
        self.order.remove(&old);
        self.order.insert(stamp, key);
        true
    }

    /// Takes the least recently faulted resident chunk for eviction;
    /// returns it and whether it is dirty.
    pub fn begin_evict(&mut self) -> Option<(ChunkKey, bool)> {
        let (_, key) = self.order.pop_first()?;
        let entry = self
            .chunks
            .get_mut(&key)
            .expect("ordered chunks are resident");
        let ChunkState::Resident { dirty, .. } = entry.state else {
            unreachable!("ordered chunks are resident");
        };
        entry.state = ChunkState::Evicting;
        self.evicting_bytes += entry.bytes;
        Some((key, dirty))
    }

    /// Takes the least recently faulted clean resident chunk for
    /// eviction, if one is: dropped without a write-back. A scan of the
    /// resident chunks, for the rare shortage of memory that needs it.
    pub fn begin_evict_clean(&mut self) -> Option<ChunkKey> {
        let (&stamp, &key) = self.order.iter().find(|(_, key)| {
            matches!(
                self.chunks.get(key).map(|entry| entry.state),
                Some(ChunkState::Resident { dirty: false, .. })
            )
        })?;
        self.order.remove(&stamp);
        let entry = self
            .chunks
            .get_mut(&key)
            .expect("ordered chunks are resident");
        entry.state = ChunkState::Evicting;
        self.evicting_bytes += entry.bytes;
        Some(key)
    }

    /// Takes up to `most` chunks for eviction, oldest first, as many as
    /// bring the buffer down to its low watermark once they are evicted
    /// (at least one while it is above it): the evictor's batch.
    pub fn begin_evict_to_low_watermark(&mut self, most: usize) -> Vec<(ChunkKey, bool)> {
        let mut victims = Vec::new();
        while victims.len() < most
            && self.occupied_bytes - self.evicting_bytes > self.low_watermark_bytes
        {
            let Some(victim) = self.begin_evict() else {
                break;
            };
            victims.push(victim);
        }
        victims
    }

    pub fn finish_evict(&mut self, key: ChunkKey) {
        let entry = self.chunks.remove(&key).expect("an evicting chunk");
        assert_eq!(entry.state, ChunkState::Evicting);
        self.occupied_bytes -= entry.bytes;
        self.evicting_bytes -= entry.bytes;
    }

    /// Dirty resident chunks, for a flush.
    pub fn dirty_chunks(&self) -> Vec<ChunkKey> {
        let mut keys: Vec<ChunkKey> = self
            .chunks
            .iter()
            .filter(|(_, entry)| matches!(entry.state, ChunkState::Resident { dirty: true, .. }))
            .map(|(key, _)| *key)
            .collect();
        keys.sort_unstable();
        keys
    }

    /// After a write-back: clean (its pages are write-protected again).
    pub fn mark_clean(&mut self, key: ChunkKey) {
        if let Some(Entry {
            state: ChunkState::Resident { dirty, .. },
            ..
        }) = self.chunks.get_mut(&key)
        {
            *dirty = false;
        }
    }

    /// Whether any chunk of `object` is moving.
    pub fn is_busy(&self, object: ObjectId) -> bool {
        self.chunks.iter().any(|(key, entry)| {
            key.object == object && !matches!(entry.state, ChunkState::Resident { .. })
        })
    }

    /// Forgets every chunk of `object` (freed: nothing is written back).
    pub fn remove_object(&mut self, object: ObjectId) {
        let keys: Vec<ChunkKey> = self
            .chunks
            .keys()
            .filter(|key| key.object == object)
            .copied()
            .collect();
        for key in keys {
            let entry = self.chunks.remove(&key).expect("listed just now");
            match entry.state {
                ChunkState::Resident { stamp, .. } => {
                    self.order.remove(&stamp);
                }
                ChunkState::Evicting => self.evicting_bytes -= entry.bytes,
                ChunkState::Fetching => {}
            }
            self.occupied_bytes -= entry.bytes;
        }
    }

    fn take_stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    pub fn debug_check_invariants(&self) {
        if cfg!(debug_assertions) {
            let total: u64 = self.chunks.values().map(|entry| entry.bytes).sum();
            assert_eq!(total, self.occupied_bytes);
            let evicting: u64 = self
                .chunks
                .values()
                .filter(|entry| entry.state == ChunkState::Evicting)
                .map(|entry| entry.bytes)
                .sum();
            assert_eq!(evicting, self.evicting_bytes);
            let resident = self
                .chunks
                .values()
                .filter(|entry| matches!(entry.state, ChunkState::Resident { .. }))
                .count();
            assert_eq!(resident, self.order.len());
            for (stamp, key) in &self.order {
                assert!(matches!(
                    self.chunks[key].state,
                    ChunkState::Resident { stamp: s, .. } if s == *stamp
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(index: u32) -> ChunkKey {
        ChunkKey {
            object: ObjectId(1),
            index,
        }
    }

    #[test]
    fn eviction_takes_the_least_recently_faulted_and_a_write_refreshes() {
        let mut buffer = HostBuffer::new(4, 3, 2);
        for index in 0..3 {
            buffer.begin_fetch(key(index), 1);
            buffer.finish_fetch(key(index), false);
        }
        assert!(buffer.mark_dirty(key(0)));
        assert!(!buffer.is_above_high_watermark());
        buffer.begin_fetch(key(3), 1);
        assert!(buffer.is_above_high_watermark() && buffer.is_full_for(1));
        assert_eq!(buffer.begin_evict(), Some((key(1), false)));
        buffer.finish_evict(key(1));
        buffer.finish_fetch(key(3), false);
        assert_eq!(buffer.begin_evict(), Some((key(2), false)));
        buffer.finish_evict(key(2));
        assert_eq!(buffer.begin_evict(), Some((key(0), true)));
        assert!(buffer.is_busy(ObjectId(1)));
        buffer.finish_evict(key(0));
        buffer.debug_check_invariants();
        assert_eq!(buffer.occupied_bytes(), 1);
        buffer.remove_object(ObjectId(1));
        assert_eq!((buffer.occupied_bytes(), buffer.resident_chunks()), (0, 0));
    }

    #[test]
    fn a_batch_takes_the_oldest_chunks_down_to_the_low_watermark_and_no_further() {
        let mut buffer = HostBuffer::new(10, 9, 6);
        for index in 0..10 {
            buffer.begin_fetch(key(index), 1);
            buffer.finish_fetch(key(index), index == 2);
        }
        let oldest_four: Vec<_> = (0..4).map(|index| (key(index), index == 2)).collect();
        assert_eq!(buffer.begin_evict_to_low_watermark(16), oldest_four);
        // Evicting already counts: a second batch before they finish
        // takes nothing more.
        assert_eq!(buffer.begin_evict_to_low_watermark(16), vec![]);
        assert_eq!(buffer.occupied_bytes(), 10);
        for (victim, _) in oldest_four {
            buffer.finish_evict(victim);
        }
        buffer.debug_check_invariants();
        assert_eq!(buffer.occupied_bytes(), 6);
        assert_eq!(buffer.begin_evict_to_low_watermark(16), vec![]);
        buffer.begin_fetch(key(10), 1);
        buffer.finish_fetch(key(10), false);
        assert_eq!(buffer.begin_evict_to_low_watermark(0), vec![]);
        assert_eq!(
            buffer.begin_evict_to_low_watermark(16),
            vec![(key(4), false)]
        );
    }
}
