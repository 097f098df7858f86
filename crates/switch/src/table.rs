//! Match-action tables: exact, ternary, longest-prefix and range match,
//! each with a fixed capacity (as hardware tables have) and a stage.

use crate::resources::{TableKind, TableResources};
// Table lookups sit on every packet's path and keys are a few bytes, so a
// fast unkeyed hash fits, as a switch's hash units are unkeyed. Entries are
// installed by the control plane and every table is capacity-bounded, so
// even contrived collisions cost at most a scan of a bounded table.
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;
use std::hash::Hash;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    #[error("table {table} is full ({capacity} entries)")]
    Full {
        table: &'static str,
        capacity: usize,
    },
    #[error("prefix length {length} is longer than the key's {key_bits} bits")]
    PrefixTooLong { length: u8, key_bits: u8 },
    #[error("range {start:#x}..{end:#x} of table {table} is empty or overlaps an entry")]
    RangeOverlaps {
        table: &'static str,
        start: u64,
        end: u64,
    },
}

/// Name, stage and shape of a table, for its resource report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableShape {
    pub name: &'static str,
    pub stage: u8,
    pub key_bits: u16,
    pub action_data_bits: u16,
    pub capacity: usize,
}

fn report(shape: &TableShape, kind: TableKind, entries: usize) -> TableResources {
    TableResources {
        name: shape.name.to_string(),
        stage: shape.stage,
        kind,
        key_bits: shape.key_bits,
        action_data_bits: shape.action_data_bits,
        entries,
        capacity: shape.capacity,
    }
}

/// Exact match on a key.
#[derive(Debug, Clone)]
pub struct ExactTable<K, V> {
    shape: TableShape,
    entries: HashMap<K, V>,
}

impl<K: Hash + Eq, V> ExactTable<K, V> {
    pub fn new(shape: TableShape) -> ExactTable<K, V> {
        ExactTable {
            shape,
            entries: HashMap::with_capacity_and_hasher(shape.capacity, Default::default()),
        }
    }

    /// Adds or replaces an entry.
    pub fn insert(&mut self, key: K, value: V) -> Result<(), TableError> {
        if self.entries.len() >= self.shape.capacity && !self.entries.contains_key(&key) {
            return Err(TableError::Full {
                table: self.shape.name,
                capacity: self.shape.capacity,
            });
        }
        self.entries.insert(key, value);
        Ok(())
    }

    pub fn remove(&mut self, key: &K) -> Option<V> {
        self.entries.remove(key)
    }

    pub fn lookup(&self, key: &K) -> Option<&V> {
        self.entries.get(key)
    }

    pub fn lookup_mut(&mut self, key: &K) -> Option<&mut V> {
        self.entries.get_mut(key)
    }

    /// Every entry, in no particular order: what a control plane reads.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.entries.iter()
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.values()
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.entries.values_mut()
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&K, &mut V)> {
        self.entries.iter_mut()
    }

    /// The entries it holds at most.
    pub fn capacity(&self) -> usize {
        self.shape.capacity
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn resources(&self) -> TableResources {
        report(&self.shape, TableKind::Exact, self.entries.len())
    }
}

/// Ternary match: value and mask, highest priority wins (ties: first
/// added). Lookups scan; capacities are small, as TCAMs are.
#[derive(Debug, Clone)]
pub struct TernaryTable<V> {
    shape: TableShape,
    entries: Vec<(u128, u128, u32, V)>,
}

impl<V> TernaryTable<V> {
    pub fn new(shape: TableShape) -> TernaryTable<V> {
        TernaryTable {
            shape,
            entries: Vec::with_capacity(shape.capacity),
        }
    }

    pub fn insert(
        &mut self,
        value: u128,
        mask: u128,
        priority: u32,
        action: V,
    ) -> Result<(), TableError> {
        if self.entries.len() >= self.shape.capacity {
            return Err(TableError::Full {
                table: self.shape.name,
                capacity: self.shape.capacity,
            });
        }
        // Keep entries sorted by descending priority, stable for ties.
        let at = self.entries.partition_point(|entry| entry.2 >= priority);
        self.entries
            .insert(at, (value & mask, mask, priority, action));
        Ok(())
    }

    pub fn lookup(&self, key: u128) -> Option<&V> {
        self.entries
            .iter()
            .find(|(value, mask, _, _)| key & mask == *value)
            .map(|entry| &entry.3)
    }

    pub fn resources(&self) -> TableResources {
        report(&self.shape, TableKind::Ternary, self.entries.len())
    }
}

/// Longest-prefix match on a 32-bit key (an IPv4 address): one hash map
/// per prefix length, probed from the longest down.
#[derive(Debug, Clone)]
pub struct LpmTable<V> {
    shape: TableShape,
    by_length: Vec<HashMap<u32, V>>,
    /// Prefix lengths in use, longest first, so lookups skip empty ones.
    lengths: Vec<u8>,
    count: usize,
}

impl<V> LpmTable<V> {
    pub fn new(shape: TableShape) -> LpmTable<V> {
        LpmTable {
            shape,
            by_length: (0..=32).map(|_| HashMap::default()).collect(),
            lengths: Vec::new(),
            count: 0,
        }
    }

    fn mask(length: u8) -> u32 {
        if length == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(length))
        }
    }

    pub fn insert(&mut self, prefix: u32, length: u8, value: V) -> Result<(), TableError> {
        if length > 32 {
            return Err(TableError::PrefixTooLong {
                length,
                key_bits: 32,
            });
        }
        let key = prefix & Self::mask(length);
        let map = &mut self.by_length[usize::from(length)];
        if !map.contains_key(&key) {
            if self.count >= self.shape.capacity {
                return Err(TableError::Full {
                    table: self.shape.name,
                    capacity: self.shape.capacity,
                });
            }
            self.count += 1;
        }
        map.insert(key, value);
        if !self.lengths.contains(&length) {
            self.lengths.push(length);
            self.lengths.sort_unstable_by(|a, b| b.cmp(a));
        }
        Ok(())
    }

    pub fn lookup(&self, key: u32) -> Option<&V> {
        self.lengths.iter().find_map(|length| {
            self.by_length[usize::from(*length)].get(&(key & Self::mask(*length)))
        })
    }

    pub fn resources(&self) -> TableResources {
        report(&self.shape, TableKind::LongestPrefix, self.count)
    }
}

/// Range match on a 64-bit key: each entry covers `start..end`, and no two
/// overlap, so a key matches at most one. (Tofino's range match kind; here
/// an ordered map, so a lookup is a logarithmic search.)
#[derive(Debug, Clone)]
pub struct RangeTable<V> {
    shape: TableShape,
    /// Each entry by its start: its end and value.
    entries: BTreeMap<u64, (u64, V)>,
}

impl<V> RangeTable<V> {
    pub fn new(shape: TableShape) -> RangeTable<V> {
        RangeTable {
            shape,
            entries: BTreeMap::new(),
        }
    }

    /// Adds an entry for `start..end`, which must be non-empty and overlap
    /// no other.
    pub fn insert(&mut self, start: u64, end: u64, value: V) -> Result<(), TableError> {
        let overlaps = start >= end
            || self
                .entries
                .range(..end)
                .next_back()
                .is_some_and(|(_, (other_end, _))| *other_end > start);
        if overlaps {
            return Err(TableError::RangeOverlaps {
                table: self.shape.name,
                start,
                end,
            });
        }
        if self.entries.len() >= self.shape.capacity {
            return Err(TableError::Full {
                table: self.shape.name,
                capacity: self.shape.capacity,
            });
        }
        self.entries.insert(start, (end, value));
        Ok(())
    }

    /// The entry starting at `start`, removed.
    pub fn remove(&mut self, start: u64) -> Option<V> {
        self.entries.remove(&start).map(|(_, value)| value)
    }

    /// The entry whose range holds all of `start..start + length` (a
    /// zero-length span is held by the entry holding `start`), with its
    /// start.
    pub fn lookup_span(&self, start: u64, length: u64) -> Option<(u64, &V)> {
        let (&entry_start, (entry_end, value)) = self.entries.range(..=start).next_back()?;
        let end = start.checked_add(length)?;
        (start < *entry_end && end <= *entry_end).then_some((entry_start, value))
    }

    pub fn lookup_span_mut(&mut self, start: u64, length: u64) -> Option<(u64, &mut V)> {
        let (&entry_start, (entry_end, value)) = self.entries.range_mut(..=start).next_back()?;
        let end = start.checked_add(length)?;
        (start < *entry_end && end <= *entry_end).then_some((entry_start, value))
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.entries.values_mut().map(|(_, value)| value)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn resources(&self) -> TableResources {
        report(&self.shape, TableKind::Range, self.entries.len())
    }
}
