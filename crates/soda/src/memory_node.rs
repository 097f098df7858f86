//! The memory node's agent: it owns the registered pool and hands out
//! extents of it (reserve, load a file, free). Its CPU is off the data
//! path: chunks move by one-sided RDMA from the compute node or the DPU.
//!
//! On the embedded rack everything shares one process, so the agent's
//! control calls are direct calls standing in for a control channel; the
//! data path is real RoCEv2.

use crate::store::{ObjectId, StoreError};
use remora_rnic::HostMemory;
use std::collections::{BTreeMap, HashMap};

/// Extents start on this boundary.
const EXTENT_ALIGNMENT: u64 = 4096;

/// The memory node's agent: the pool and who owns which extent of it.
pub struct MemoryAgent {
    pool: HostMemory,
    /// Free extents by start.
    free: BTreeMap<u64, u64>,
    objects: HashMap<ObjectId, (u64, u64)>,
}

impl MemoryAgent {
    pub fn new(pool: HostMemory) -> MemoryAgent {
        let bytes = pool.len() as u64;
        MemoryAgent {
            pool,
            free: BTreeMap::from([(0, bytes)]),
            objects: HashMap::new(),
        }
    }

    /// Reserves an extent; returns its start in the pool.
    pub fn reserve(&mut self, object: ObjectId, bytes: u64) -> Result<u64, StoreError> {
        let wanted = bytes.next_multiple_of(EXTENT_ALIGNMENT);
        let Some((&start, &length)) = self.free.iter().find(|(_, &length)| length >= wanted) else {
            let free = self.free.values().sum();
            return Err(StoreError::Full { wanted, free });
        };
        self.free.remove(&start);
        if length > wanted {
            self.free.insert(start + wanted, length - wanted);
        }
        self.objects.insert(object, (start, wanted));
        Ok(start)
    }

    pub fn release(&mut self, object: ObjectId) -> Result<(), StoreError> {
        let (start, length) = self
            .objects
            .remove(&object)
            .ok_or(StoreError::UnknownObject(object))?;
        self.free.insert(start, length);
        // Merge with the neighbours, so the pool does not fragment forever.
        let merged = std::mem::take(&mut self.free);
        for (start, length) in merged {
            match self.free.last_key_value().map(|(&s, &l)| (s, l)) {
                Some((previous, previous_length)) if previous + previous_length == start => {
                    self.free.insert(previous, previous_length + length);
                }
                _ => {
                    self.free.insert(start, length);
                }
            }
        }
        Ok(())
    }

    /// Where `length` bytes at `offset` of `object` live in the pool.
    pub fn extent(&self, object: ObjectId, offset: u64, length: usize) -> Result<u64, StoreError> {
        let &(start, size) = self
            .objects
            .get(&object)
            .ok_or(StoreError::UnknownObject(object))?;
        crate::store::check_range(object, offset, length, size)?;
        Ok(start + offset)
    }

    /// Loads `data` into the pool at `start`: the memory node's CPU
    /// reading a file into its own memory.
    pub fn load(&self, start: u64, data: &[u8]) -> Result<(), StoreError> {
        self.pool
            .write(start as usize, data)
            .map_err(|error| StoreError::Remote(Box::new(error)))
    }
}
