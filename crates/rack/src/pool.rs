//! A memory node's pool: registered host memory and the extents of it
//! that owners hold ([`Extents`]: first fit, merged again on release).
//! SODA keys its extents by object, Bifröst's DSM by pointer; SODA's file
//! store keeps the extents of its backing file the same way.

use remora_rnic::HostMemory;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// Extents start on this boundary.
pub const EXTENT_ALIGNMENT: u64 = 4096;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("the pool is full: {wanted} bytes wanted, {free} free")]
    Full { wanted: u64, free: u64 },
    #[error("no extent is held under this key")]
    Unknown,
    #[error("an extent is already held under this key")]
    AlreadyHeld,
    #[error("bytes {offset}..{end} are outside an extent of {length} bytes")]
    OutOfRange { offset: u64, end: u64, length: u64 },
    #[error("the pool's memory: {0}")]
    Memory(#[from] remora_rnic::HostMemoryOutOfBounds),
}

pub struct Pool<K> {
    memory: HostMemory,
    extents: Extents<K>,
}

impl<K: Hash + Eq + Copy> Pool<K> {
    pub fn new(memory: HostMemory) -> Pool<K> {
        let bytes = memory.len() as u64;
        Pool {
            memory,
            extents: Extents::new(bytes),
        }
    }

    /// Reserves an extent of at least `bytes` for `key`; returns its start.
    pub fn reserve(&mut self, key: K, bytes: u64) -> Result<u64, PoolError> {
        self.extents.reserve(key, bytes)
    }

    /// Gives `key`'s extent back; returns it (start, length).
    pub fn release(&mut self, key: K) -> Result<(u64, u64), PoolError> {
        self.extents.release(key)
    }

    /// `key`'s extent: (start, length).
    pub fn held(&self, key: K) -> Option<(u64, u64)> {
        self.extents.held(key)
    }

    /// Where `length` bytes at `offset` of `key`'s extent are in the pool.
    pub fn locate(&self, key: K, offset: u64, length: usize) -> Result<u64, PoolError> {
        self.extents.locate(key, offset, length)
    }

    /// The node's own CPU writing its pool (loading a file, restoring a
    /// snapshot).
    pub fn write(&self, start: u64, data: &[u8]) -> Result<(), PoolError> {
        Ok(self.memory.write(start as usize, data)?)
    }

    /// The node's own CPU reading its pool (taking a snapshot).
    pub fn read(&self, start: u64, into: &mut [u8]) -> Result<(), PoolError> {
        Ok(self.memory.read(start as usize, into)?)
    }
}

/// The extents of `bytes` of space that owners hold, each under a key:
/// reserved first fit on [`EXTENT_ALIGNMENT`], merged with free neighbours
/// when released.
#[derive(Debug)]
pub struct Extents<K> {
    /// Free extents by start.
    free: BTreeMap<u64, u64>,
    held: HashMap<K, (u64, u64)>,
}

impl<K: Hash + Eq + Copy> Extents<K> {
    pub fn new(bytes: u64) -> Extents<K> {
        Extents {
            free: BTreeMap::from([(0, bytes)]),
            held: HashMap::new(),
        }
    }

    /// Reserves an extent of at least `bytes` for `key`; returns its start.
    pub fn reserve(&mut self, key: K, bytes: u64) -> Result<u64, PoolError> {
        if self.held.contains_key(&key) {
            // A second extent under one key would leak the first.
            return Err(PoolError::AlreadyHeld);
        }
        // A size from the wire may be anything: one that rounds past
        // u64::MAX wants more than any pool has.
        let wanted = bytes
            .max(1)
            .checked_next_multiple_of(EXTENT_ALIGNMENT)
            .unwrap_or(u64::MAX);
        let Some((&start, &length)) = self.free.iter().find(|(_, &length)| length >= wanted) else {
            let free = self.free.values().sum();
            return Err(PoolError::Full { wanted, free });
        };
        self.free.remove(&start);
        if length > wanted {
            self.free.insert(start + wanted, length - wanted);
        }
        self.held.insert(key, (start, wanted));
        Ok(start)
    }

    /// Gives `key`'s extent back; returns it (start, length).
    pub fn release(&mut self, key: K) -> Result<(u64, u64), PoolError> {
        let (start, length) = self.held.remove(&key).ok_or(PoolError::Unknown)?;
        // Merge with the free neighbours, so the pool does not fragment
        // for ever: the one ending where this starts, the one starting
        // where this ends.
        let (mut merged_start, mut merged_length) = (start, length);
        if let Some((&before, &before_length)) = self.free.range(..start).next_back() {
            if before + before_length == start {
                self.free.remove(&before);
                (merged_start, merged_length) = (before, before_length + merged_length);
            }
        }
        if let Some(after_length) = self.free.remove(&(start + length)) {
            merged_length += after_length;
        }
        self.free.insert(merged_start, merged_length);
        Ok((start, length))
    }

    /// `key`'s extent: (start, length).
    pub fn held(&self, key: K) -> Option<(u64, u64)> {
        self.held.get(&key).copied()
    }

    /// Where `length` bytes at `offset` of `key`'s extent are in the pool.
    pub fn locate(&self, key: K, offset: u64, length: usize) -> Result<u64, PoolError> {
        let (start, size) = self.held(key).ok_or(PoolError::Unknown)?;
        let end = offset.saturating_add(length as u64);
        if end > size {
            return Err(PoolError::OutOfRange {
                offset,
                end,
                length: size,
            });
        }
        Ok(start + offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents_are_reserved_first_fit_and_merged_when_released() {
        let mut pool: Pool<u32> = Pool::new(HostMemory::new(4 * 4096));
        assert_eq!(pool.reserve(1, 4096), Ok(0));
        assert_eq!(pool.reserve(2, 5000), Ok(4096));
        assert!(matches!(pool.reserve(3, 8192), Err(PoolError::Full { .. })));
        assert_eq!(pool.release(1), Ok((0, 4096)));
        assert_eq!(pool.release(2), Ok((4096, 8192)));
        assert_eq!(pool.reserve(3, 3 * 4096), Ok(0), "freed extents merged");
        assert_eq!(pool.release(9), Err(PoolError::Unknown));
        assert!(matches!(
            pool.locate(3, 12288, 1),
            Err(PoolError::OutOfRange { .. })
        ));
    }

    /// A size from the wire of u64::MAX wrapped to a zero-length extent
    /// at the first free start, which the next reservation was then given
    /// too; a key reserved twice lost its first extent.
    #[test]
    fn a_size_past_the_largest_and_a_key_held_twice_are_refused() {
        let mut pool: Pool<u32> = Pool::new(HostMemory::new(4 * 4096));
        for bytes in [u64::MAX, u64::MAX - 1, (u64::MAX / 4096) * 4096 + 1] {
            assert!(
                matches!(pool.reserve(1, bytes), Err(PoolError::Full { .. })),
                "{bytes}"
            );
        }
        assert_eq!(pool.reserve(1, 10), Ok(0));
        assert_eq!(pool.reserve(1, 10), Err(PoolError::AlreadyHeld));
        assert_eq!(pool.reserve(2, 10), Ok(4096), "no two owners of one extent");
    }
}
