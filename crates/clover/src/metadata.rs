//! The metadata server: it hands out entry space in batches, knows where
//! every key's list starts (and its shortcut), and collects old versions.
//!
//! It sits off the data path, as in Clover: clients come to it for a batch
//! of slots now and then and, rarely, to locate a tail after a long chase.
//! It runs next to the memory node and touches the region through
//! [`RegionAccess`], the host CPU's view of registered memory.
//!
//! A region is laid out as
//!
//! ```text
//! [0, 64)                 reserved: offset 0 is never an entry
//! [64, 64 + 8 × keys)     one shortcut word per key (a NextPointer)
//! [slab start, end)       entries, in 64-byte-aligned slots of their size class
//! ```
//!
//! Garbage collection keeps the newest [`MetadataConfig::keep_versions`]
//! versions of each key, moves the key's shortcut to its tail, and retires
//! the older versions. A retired slot is handed out again only after
//! [`MetadataConfig::grace`]: clients drop cached pointers older than
//! their cache lifetime and bound each operation's duration, and both
//! together stay below the grace, so no client can still be looking at a
//! slot when a new entry is written into it.

use crate::client::MAX_HOPS;
use crate::layout::{
    decode_entry, encode_entry, size_class, LayoutError, NextPointer, HEADER_BYTES,
    MAX_VALUE_BYTES, MIN_VALUE_BYTES, SIZE_CLASSES,
};
use remora_rnic::{MemoryRegion, Timestamp, Verbs};
use remora_wire::VirtAddr;
use std::collections::{HashSet, VecDeque};
use std::time::Duration;

const RESERVED_BYTES: u64 = 64;
const SLOT_ALIGNMENT: u64 = 64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    #[error("key {key} is not in the store (it holds keys 0..{key_count})")]
    UnknownKey { key: u64, key_count: u64 },
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error(
        "no free {class_bytes}-byte slot is left: collect garbage or give the region more memory"
    )]
    OutOfSpace { class_bytes: usize },
    #[error("the region cannot be accessed: {0}")]
    Region(String),
    #[error("key {key}'s version list is broken: {reason}")]
    Broken { key: u64, reason: String },
    #[error("bad metadata configuration: {0}")]
    Config(String),
}

/// The host CPU's view of the memory node's region.
pub trait RegionAccess {
    fn read(&mut self, offset: u64, into: &mut [u8]) -> Result<(), MetadataError>;
    fn write(&mut self, offset: u64, bytes: &[u8]) -> Result<(), MetadataError>;
}

/// A plain byte array as a region (tests and models).
impl RegionAccess for Vec<u8> {
    fn read(&mut self, offset: u64, into: &mut [u8]) -> Result<(), MetadataError> {
        let start = usize::try_from(offset).map_err(|_| outside(offset))?;
        let bytes = self
            .get(start..start + into.len())
            .ok_or_else(|| outside(offset))?;
        into.copy_from_slice(bytes);
        Ok(())
    }

    fn write(&mut self, offset: u64, bytes: &[u8]) -> Result<(), MetadataError> {
        let start = usize::try_from(offset).map_err(|_| outside(offset))?;
        self.get_mut(start..start + bytes.len())
            .ok_or_else(|| outside(offset))?
            .copy_from_slice(bytes);
        Ok(())
    }
}

fn outside(offset: u64) -> MetadataError {
    MetadataError::Region(format!("offset {offset:#x} is outside the region"))
}

/// A soft RNIC's registered region, through the host CPU.
pub struct RnicRegion<'a> {
    pub rnic: &'a mut dyn Verbs,
    pub region: MemoryRegion,
}

impl RegionAccess for RnicRegion<'_> {
    fn read(&mut self, offset: u64, into: &mut [u8]) -> Result<(), MetadataError> {
        let address = VirtAddr(self.region.address.0 + offset);
        self.rnic
            .read_local(self.region.lkey, address, into)
            .map_err(|error| MetadataError::Region(error.to_string()))
    }

    fn write(&mut self, offset: u64, bytes: &[u8]) -> Result<(), MetadataError> {
        let address = VirtAddr(self.region.address.0 + offset);
        self.rnic
            .write_local(self.region.lkey, address, bytes)
            .map_err(|error| MetadataError::Region(error.to_string()))
    }
}

/// Where things lie in a Clover region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionPlan {
    pub key_count: u64,
    pub region_bytes: u64,
}

impl RegionPlan {
    pub fn new(key_count: u64, region_bytes: u64) -> Result<RegionPlan, MetadataError> {
        let plan = RegionPlan {
            key_count,
            region_bytes,
        };
        if key_count == 0 {
            return Err(MetadataError::Config(
                "a store needs at least one key".into(),
            ));
        }
        let needed = plan.slab_start() + key_count * SIZE_CLASSES[0] as u64;
        if needed > region_bytes {
            return Err(MetadataError::Config(format!(
                "{key_count} keys need at least {needed} bytes of region, not {region_bytes}"
            )));
        }
        Ok(plan)
    }

    pub fn check_key(&self, key: u64) -> Result<(), MetadataError> {
        if key >= self.key_count {
            return Err(MetadataError::UnknownKey {
                key,
                key_count: self.key_count,
            });
        }
        Ok(())
    }

    pub fn shortcut_offset(&self, key: u64) -> Result<u64, MetadataError> {
        self.check_key(key)?;
        Ok(RESERVED_BYTES + 8 * key)
    }

    pub fn slab_start(&self) -> u64 {
        (RESERVED_BYTES + 8 * self.key_count).next_multiple_of(SLOT_ALIGNMENT)
    }

    /// The region a store of `value_bytes` values needs to make progress:
    /// the shortcut words, `keep_versions` versions of every key (a key's
    /// versions below that are never retired) and a batch of slots in
    /// each of `clients`' hands, all of the values' size class. With
    /// less, puts wait for space no collection frees, until the run's
    /// time limit.
    pub fn bytes_to_run(
        &self,
        value_bytes: usize,
        clients: usize,
        config: &MetadataConfig,
    ) -> Result<u64, MetadataError> {
        let class = size_class(value_bytes)? as u64;
        let slots = self
            .key_count
            .saturating_mul(config.keep_versions as u64)
            .saturating_add((clients as u64).saturating_mul(config.batch_slots as u64));
        Ok(self
            .slab_start()
            .saturating_add(slots.saturating_mul(class)))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetadataConfig {
    /// Slots handed to a client per request.
    pub batch_slots: usize,
    /// Versions of each key garbage collection keeps (at least the tail).
    pub keep_versions: usize,
    /// How long a retired slot waits before it is reused.
    pub grace: Duration,
}

impl MetadataConfig {
    pub const DEFAULT: MetadataConfig = MetadataConfig {
        batch_slots: 16,
        keep_versions: 2,
        grace: Duration::from_millis(400),
    };

    fn validate(&self) -> Result<(), MetadataError> {
        if self.batch_slots == 0 || self.batch_slots > 1 << 16 {
            return Err(MetadataError::Config(format!(
                "batch_slots is {}, not 1..=65536",
                self.batch_slots
            )));
        }
        if self.keep_versions == 0 {
            return Err(MetadataError::Config(
                "keep_versions must keep at least the tail".into(),
            ));
        }
        Ok(())
    }
}

/// What the server has done, for reports and for the bounded-memory test.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MetadataStats {
    pub batches: u64,
    pub slots_handed_out: u64,
    pub slots_returned: u64,
    pub collections: u64,
    pub versions_retired: u64,
    pub slots_released: u64,
    /// Shortcuts found naming a slot about to be reused, and moved on.
    pub shortcuts_repaired: u64,
    pub locates: u64,
    /// The highest offset ever carved: the region's high-water mark.
    pub carved_bytes: u64,
}

#[derive(Debug, Clone, Copy)]
struct Retired {
    at: Timestamp,
    key: u64,
    offset: u64,
    class: usize,
}

#[derive(Debug, Clone, Copy, Default)]
struct KeyRecord {
    /// The oldest version kept; null until the key is loaded.
    head: NextPointer,
    /// The newest version the server knows of.
    tail_hint: NextPointer,
}

pub struct MetadataServer {
    plan: RegionPlan,
    config: MetadataConfig,
    /// The next never-used slab offset.
    fresh: u64,
    /// Free slots by size-class index.
    free: Vec<Vec<u64>>,
    quarantine: VecDeque<Retired>,
    keys: Vec<KeyRecord>,
    stats: MetadataStats,
}

/// What one garbage-collection pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Collection {
    pub retired: u64,
    pub released: u64,
    pub versions_walked: u64,
    pub shortcuts_repaired: u64,
}

impl MetadataServer {
    pub fn new(plan: RegionPlan, config: MetadataConfig) -> Result<MetadataServer, MetadataError> {
        config.validate()?;
        let key_count = usize::try_from(plan.key_count)
            .map_err(|_| MetadataError::Config("too many keys".into()))?;
        Ok(MetadataServer {
            plan,
            config,
            fresh: plan.slab_start(),
            free: vec![Vec::new(); SIZE_CLASSES.len()],
            quarantine: VecDeque::new(),
            keys: vec![KeyRecord::default(); key_count],
            stats: MetadataStats::default(),
        })
    }

    pub fn plan(&self) -> RegionPlan {
        self.plan
    }

    pub fn stats(&self) -> MetadataStats {
        MetadataStats {
            carved_bytes: self.fresh,
            ..self.stats
        }
    }

    /// Slots free or waiting out their grace, over all classes.
    pub fn slots_idle(&self) -> usize {
        self.free.iter().map(Vec::len).sum::<usize>() + self.quarantine.len()
    }

    fn class_index(value_bytes: usize) -> Result<usize, MetadataError> {
        let class = size_class(value_bytes)?;
        Ok(SIZE_CLASSES
            .iter()
            .position(|size| *size == class)
            .expect("size_class returns a class"))
    }

    fn take_slot(&mut self, class: usize) -> Option<u64> {
        if let Some(offset) = self.free[class].pop() {
            return Some(offset);
        }
        let size = SIZE_CLASSES[class] as u64;
        if self.fresh + size > self.plan.region_bytes {
            return None;
        }
        let offset = self.fresh;
        self.fresh += size;
        Some(offset)
    }

    /// A batch of slots for values of `value_bytes`: at least one, at most
    /// [`MetadataConfig::batch_slots`].
    pub fn allocate(&mut self, value_bytes: usize) -> Result<Vec<u64>, MetadataError> {
        let class = Self::class_index(value_bytes)?;
        let mut batch = Vec::with_capacity(self.config.batch_slots);
        while batch.len() < self.config.batch_slots {
            let Some(offset) = self.take_slot(class) else {
                break;
            };
            batch.push(offset);
        }
        if batch.is_empty() {
            return Err(MetadataError::OutOfSpace {
                class_bytes: SIZE_CLASSES[class],
            });
        }
        self.stats.batches += 1;
        self.stats.slots_handed_out += batch.len() as u64;
        Ok(batch)
    }

    /// Slots a client no longer needs (never written, or written by a
    /// write that never linked): free at once, since no list reaches them.
    pub fn give_back(&mut self, value_bytes: usize, slots: &[u64]) -> Result<(), MetadataError> {
        let class = Self::class_index(value_bytes)?;
        self.free[class].extend_from_slice(slots);
        self.stats.slots_returned += slots.len() as u64;
        Ok(())
    }

    /// Writes the first version of `key`.
    pub fn load(
        &mut self,
        key: u64,
        value: &[u8],
        memory: &mut dyn RegionAccess,
    ) -> Result<NextPointer, MetadataError> {
        self.plan.check_key(key)?;
        let class = Self::class_index(value.len())?;
        let slot = self.take_slot(class).ok_or(MetadataError::OutOfSpace {
            class_bytes: SIZE_CLASSES[class],
        })?;
        let mut entry = vec![0; HEADER_BYTES + value.len()];
        encode_entry(key, value, &mut entry)?;
        memory.write(slot, &entry)?;
        let pointer = NextPointer::new(slot, 0, true)?;
        memory.write(
            self.plan.shortcut_offset(key)?,
            &pointer.word().to_le_bytes(),
        )?;
        self.keys[key as usize] = KeyRecord {
            head: pointer,
            tail_hint: pointer,
        };
        Ok(pointer)
    }

    fn record(&self, key: u64) -> Result<KeyRecord, MetadataError> {
        self.plan.check_key(key)?;
        let record = self.keys[key as usize];
        if record.head.is_null() {
            return Err(MetadataError::Broken {
                key,
                reason: "never loaded".into(),
            });
        }
        Ok(record)
    }

    /// The key's tail now, walked from the newest version the server knew.
    pub fn locate(
        &mut self,
        key: u64,
        memory: &mut dyn RegionAccess,
    ) -> Result<NextPointer, MetadataError> {
        let record = self.record(key)?;
        let chain = walk(key, record.tail_hint, memory)?;
        let tail = *chain.last().expect("a walk has the start");
        self.keys[key as usize].tail_hint = tail;
        self.stats.locates += 1;
        Ok(tail)
    }

    /// One garbage-collection pass at `now`.
    pub fn collect(
        &mut self,
        now: Timestamp,
        memory: &mut dyn RegionAccess,
    ) -> Result<Collection, MetadataError> {
        let mut collection = Collection::default();
        // Bounded: each turn frees a slot or sends it to the back as of
        // now, where the loop stops before it.
        while let Some(&retired) = self.quarantine.front() {
            if retired.at.saturating_add(self.config.grace) > now {
                break;
            }
            self.quarantine.pop_front();
            if self.repair_shortcut(&retired, memory, &mut collection)? {
                // A reader may have read the shortcut just before its
                // repair and READ the slot next: freed now, the slot
                // could hold another entry by then. It waits a grace
                // from now, as if retired now.
                self.quarantine.push_back(Retired { at: now, ..retired });
                continue;
            }
            self.free[retired.class].push(retired.offset);
            collection.released += 1;
        }
        for key in 0..self.plan.key_count {
            let record = self.keys[key as usize];
            if record.head.is_null() {
                continue;
            }
            let chain = walk(key, record.head, memory)?;
            collection.versions_walked += chain.len() as u64;
            let tail = *chain.last().expect("a walk has the start");
            self.regrace_late_shortcut(key, &chain, now, memory, &mut collection)?;
            // The shortcut moves before anything is retired, so it never
            // names a slot retired now.
            memory.write(self.plan.shortcut_offset(key)?, &tail.word().to_le_bytes())?;
            let keep_from = chain.len().saturating_sub(self.config.keep_versions);
            for pointer in &chain[..keep_from] {
                let class = Self::class_index(entry_length(key, pointer.offset(), memory)?)?;
                self.quarantine.push_back(Retired {
                    at: now,
                    key,
                    offset: pointer.offset(),
                    class,
                });
                collection.retired += 1;
            }
            self.keys[key as usize] = KeyRecord {
                head: chain[keep_from],
                tail_hint: tail,
            };
        }
        self.stats.collections += 1;
        self.stats.versions_retired += collection.retired;
        self.stats.slots_released += collection.released;
        Ok(collection)
    }

    /// A late shortcut WRITE (see [`MetadataServer::repair_shortcut`])
    /// that this pass is about to move off a slot in quarantine: a reader
    /// may have read it just before, and READ the slot up to a deadline
    /// from now. Freed at its first retirement's grace, the slot could be
    /// reused under that READ (by up to one collection period), and the
    /// repair before reuse would not see it, the shortcut moved already.
    /// So the slot waits a grace from now, as a repaired one does.
    /// `key`'s shortcut as it is in the region now.
    fn read_shortcut(
        &self,
        key: u64,
        memory: &mut dyn RegionAccess,
    ) -> Result<NextPointer, MetadataError> {
        let mut word = [0u8; 8];
        memory.read(self.plan.shortcut_offset(key)?, &mut word)?;
        Ok(NextPointer::from_word(u64::from_le_bytes(word)))
    }

    fn regrace_late_shortcut(
        &mut self,
        key: u64,
        chain: &[NextPointer],
        now: Timestamp,
        memory: &mut dyn RegionAccess,
        collection: &mut Collection,
    ) -> Result<(), MetadataError> {
        let shortcut = self.read_shortcut(key, memory)?;
        let on_chain = chain
            .iter()
            .any(|pointer| pointer.offset() == shortcut.offset());
        if shortcut.is_null() || on_chain {
            return Ok(());
        }
        // Rare (a WRITE delayed past a retirement), so a linear search.
        let position = self
            .quarantine
            .iter()
            .position(|retired| retired.key == key && retired.offset == shortcut.offset());
        if let Some(retired) = position.and_then(|position| self.quarantine.remove(position)) {
            self.quarantine.push_back(Retired { at: now, ..retired });
            collection.shortcuts_repaired += 1;
            self.stats.shortcuts_repaired += 1;
        }
        Ok(())
    }

    /// Before a retired slot is reused: a writer's shortcut WRITE that
    /// landed after the slot was retired may name it. A writer's shortcut
    /// WRITE lands within the operation deadline of the write's start
    /// (the pool fails a run otherwise), which is shorter than the grace,
    /// so by now every such WRITE has landed; a shortcut naming the slot is moved
    /// to the key's tail. Whether it was.
    fn repair_shortcut(
        &mut self,
        retired: &Retired,
        memory: &mut dyn RegionAccess,
        collection: &mut Collection,
    ) -> Result<bool, MetadataError> {
        let shortcut = self.read_shortcut(retired.key, memory)?;
        if shortcut.is_null() || shortcut.offset() != retired.offset {
            return Ok(false);
        }
        let head = self.keys[retired.key as usize].head;
        let tail = *walk(retired.key, head, memory)?
            .last()
            .expect("a walk has the start");
        memory.write(
            self.plan.shortcut_offset(retired.key)?,
            &tail.word().to_le_bytes(),
        )?;
        collection.shortcuts_repaired += 1;
        self.stats.shortcuts_repaired += 1;
        Ok(true)
    }

    /// Walks every key's list, checking that it is whole: no cycle, no
    /// foreign key, every entry's checksum right. Returns the versions.
    pub fn audit(&self, memory: &mut dyn RegionAccess) -> Result<u64, MetadataError> {
        let mut versions = 0;
        for key in 0..self.plan.key_count {
            let record = self.keys[key as usize];
            if record.head.is_null() {
                continue;
            }
            for pointer in walk(key, record.head, memory)? {
                let length = entry_length(key, pointer.offset(), memory)?;
                let mut entry = vec![0; HEADER_BYTES + length];
                memory.read(pointer.offset(), &mut entry)?;
                decode_entry(&entry).map_err(|error| MetadataError::Broken {
                    key,
                    reason: format!("entry at {:#x}: {error}", pointer.offset()),
                })?;
                versions += 1;
            }
        }
        Ok(versions)
    }

    /// The key's list from its oldest kept version, as the server knows it.
    pub fn head(&self, key: u64) -> Result<NextPointer, MetadataError> {
        Ok(self.record(key)?.head)
    }
}

/// The value length recorded in an entry's header.
/// The value length `key`'s entry at `offset` claims. A length past the
/// largest value is a broken list, named by its key: read unchecked, the
/// audit allocated it (4 GiB for a garbage `0xFFFFFFFF`) and then blamed
/// the region, and a collection failed whole on a size class.
fn entry_length(
    key: u64,
    offset: u64,
    memory: &mut dyn RegionAccess,
) -> Result<usize, MetadataError> {
    let mut header = [0u8; HEADER_BYTES];
    memory.read(offset, &mut header)?;
    let length = u32::from_le_bytes(header[16..20].try_into().expect("4 bytes")) as usize;
    let broken = |reason| MetadataError::Broken { key, reason };
    if !(MIN_VALUE_BYTES..=MAX_VALUE_BYTES).contains(&length) {
        return Err(broken(format!(
            "entry at {offset:#x} claims {length} value bytes"
        )));
    }
    // The length picks the class the slot is freed into: one the
    // checksum does not vouch for (100 bytes claimed in a 64-byte slot)
    // sent the slot to a larger class, where it overlapped the next one.
    // The header is in hand: only the value is read.
    let mut entry = vec![0u8; HEADER_BYTES + length];
    entry[..HEADER_BYTES].copy_from_slice(&header);
    memory.read(offset + HEADER_BYTES as u64, &mut entry[HEADER_BYTES..])?;
    decode_entry(&entry).map_err(|error| broken(format!("entry at {offset:#x}: {error}")))?;
    Ok(length)
}

/// The pointers from `start` to the tail, refusing cycles, foreign keys
/// and lists longer than [`MAX_HOPS`].
fn walk(
    key: u64,
    start: NextPointer,
    memory: &mut dyn RegionAccess,
) -> Result<Vec<NextPointer>, MetadataError> {
    let broken = |reason: String| MetadataError::Broken { key, reason };
    let mut chain = vec![start];
    let mut seen = HashSet::from([start.offset()]);
    loop {
        let cursor = *chain.last().expect("the chain has the start");
        let mut header = [0u8; 16];
        memory.read(cursor.offset(), &mut header)?;
        let next = NextPointer::from_word(u64::from_le_bytes(header[..8].try_into().expect("8")));
        let found = u64::from_le_bytes(header[8..].try_into().expect("8 bytes"));
        if found != key {
            return Err(broken(format!(
                "the entry at {:#x} holds key {found}",
                cursor.offset()
            )));
        }
        if next.is_null() {
            return Ok(chain);
        }
        if !seen.insert(next.offset()) {
            return Err(broken(format!("cycle back to {:#x}", next.offset())));
        }
        if chain.len() >= MAX_HOPS as usize {
            return Err(broken(format!("longer than {MAX_HOPS} versions")));
        }
        chain.push(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Links `value` after `tail` in a slot the server hands out.
    fn append(
        server: &mut MetadataServer,
        memory: &mut Vec<u8>,
        tail: NextPointer,
        value: &[u8],
    ) -> NextPointer {
        let slot = server.allocate(value.len()).unwrap()[0];
        let mut entry = vec![0; HEADER_BYTES + value.len()];
        encode_entry(0, value, &mut entry).unwrap();
        memory.write(slot, &entry).unwrap();
        let pointer = NextPointer::new(slot, 0, true).unwrap();
        memory
            .write(tail.offset(), &pointer.word().to_le_bytes())
            .unwrap();
        pointer
    }

    fn shortcut(server: &MetadataServer, memory: &mut Vec<u8>) -> u64 {
        server.read_shortcut(0, memory).unwrap().offset()
    }

    /// A server of one key, keeping one version, with its first version
    /// loaded: the server, its memory, and the version.
    fn one_key(grace: Duration) -> (MetadataServer, Vec<u8>, NextPointer) {
        let config = MetadataConfig {
            batch_slots: 1,
            keep_versions: 1,
            grace,
        };
        let plan = RegionPlan::new(1, 1 << 16).unwrap();
        let mut server = MetadataServer::new(plan, config).unwrap();
        let mut memory = vec![0u8; 1 << 16];
        let first = server.load(0, b"version zero....", &mut memory).unwrap();
        (server, memory, first)
    }

    /// A garbage length in an entry made the audit allocate it (4 GiB for
    /// 0xFFFFFFFF) and report a region error, and a collection fail whole
    /// on a size class: both name the broken key now.
    #[test]
    fn a_garbage_entry_length_is_reported_as_a_broken_list() {
        let (mut server, mut memory, first) = one_key(Duration::from_millis(1));
        let second = append(&mut server, &mut memory, first, b"version one.....");
        memory
            .write(second.offset() + 16, &u32::MAX.to_le_bytes())
            .unwrap();
        let broken = |result: Result<(), MetadataError>| {
            matches!(result, Err(MetadataError::Broken { key: 0, .. }))
        };
        assert!(broken(server.audit(&mut memory).map(drop)));
        // The collection retires `first`, reading its length; break that.
        memory
            .write(first.offset() + 16, &u32::MAX.to_le_bytes())
            .unwrap();
        let at = Timestamp::from_nanos(0);
        assert!(broken(server.collect(at, &mut memory).map(drop)));
    }

    /// A length below the smallest value failed a collection whole with a
    /// layout error naming no key, and a length the checksum does not
    /// vouch for (100 bytes in a 64-byte slot) freed the slot into the
    /// 128-byte class, where it overlapped the next slot. Both are the
    /// key's broken list, and nothing is freed.
    #[test]
    fn an_entry_length_its_checksum_does_not_vouch_for_frees_nothing() {
        for length in [0u32, 100] {
            let (mut server, mut memory, first) = one_key(Duration::from_millis(1));
            append(&mut server, &mut memory, first, b"version one.....");
            memory
                .write(first.offset() + 16, &length.to_le_bytes())
                .unwrap();
            let collected = server.collect(Timestamp::from_nanos(0), &mut memory);
            assert!(
                matches!(collected, Err(MetadataError::Broken { key: 0, .. })),
                "length {length}: {collected:?}"
            );
            assert_eq!(server.slots_idle(), 0, "length {length}");
        }
    }

    /// A writer's shortcut WRITE that lands after its version was retired
    /// names a slot in quarantine; before the slot is reused, the
    /// collector moves the shortcut on to the tail.
    /// A key of three versions, the first two retired by a collection at
    /// time 0 (the shortcut then on the third), and then the late shortcut
    /// WRITE of the second's writer: the server, its memory, and the three.
    fn a_late_shortcut_to_a_retired_version(
        grace: Duration,
    ) -> (MetadataServer, Vec<u8>, [NextPointer; 3]) {
        let (mut server, mut memory, first) = one_key(grace);
        let second = append(&mut server, &mut memory, first, b"version one.....");
        let third = append(&mut server, &mut memory, second, b"version two.....");
        let collection = server.collect(Timestamp::ZERO, &mut memory).unwrap();
        assert_eq!(collection.retired, 2);
        assert_eq!(shortcut(&server, &mut memory), third.offset());
        let late = second.word().to_le_bytes();
        memory
            .write(server.plan.shortcut_offset(0).unwrap(), &late)
            .unwrap();
        (server, memory, [first, second, third])
    }

    #[test]
    fn a_late_shortcut_naming_a_retired_slot_is_repaired_before_reuse() {
        let grace = Duration::from_millis(1);
        let (mut server, mut memory, [_, second, third]) =
            a_late_shortcut_to_a_retired_version(grace);
        let at = Timestamp::from_nanos;
        let after_grace = grace.as_nanos() as u64 + 1;
        let released = server.collect(at(after_grace), &mut memory).unwrap();
        assert_eq!(released.shortcuts_repaired, 1);
        assert_eq!(shortcut(&server, &mut memory), third.offset());
        assert_eq!(server.stats().shortcuts_repaired, 1);
        // A reader that read the late shortcut just before the repair may
        // READ `second` next: it was freed at once, and could be reused
        // under that READ. It waits a grace from the repair now.
        assert_eq!(released.released, 1);
        assert!(server
            .free
            .iter()
            .all(|free| !free.contains(&second.offset())));
        let later = server
            .collect(at(2 * after_grace + 1), &mut memory)
            .unwrap();
        assert_eq!(later.released, 1);
        assert!(server
            .free
            .iter()
            .any(|free| free.contains(&second.offset())));
    }

    /// A late shortcut naming a retired slot, moved on to the tail by a
    /// collection's regular pass before the slot's grace ended: the slot
    /// was freed at that grace, though a reader that read the late
    /// shortcut just before the pass could READ it up to a deadline after
    /// the pass. It waits a grace from the pass now.
    #[test]
    fn a_late_shortcut_moved_by_a_regular_pass_keeps_its_slot_a_grace_from_the_pass() {
        let grace_nanos = 1_000_000;
        let (mut server, mut memory, [first, second, third]) =
            a_late_shortcut_to_a_retired_version(Duration::from_nanos(grace_nanos));
        let at = Timestamp::from_nanos;
        let pass = grace_nanos / 2;
        let moved = server.collect(at(pass), &mut memory).unwrap();
        assert_eq!(moved.shortcuts_repaired, 1);
        assert_eq!(shortcut(&server, &mut memory), third.offset());
        let is_free =
            |server: &MetadataServer, offset| server.free.iter().any(|free| free.contains(&offset));
        let first_grace_over = server.collect(at(grace_nanos + 1), &mut memory).unwrap();
        assert_eq!(first_grace_over.released, 1);
        assert!(is_free(&server, first.offset()));
        assert!(!is_free(&server, second.offset()));
        let pass_grace_over = server
            .collect(at(pass + grace_nanos + 1), &mut memory)
            .unwrap();
        assert_eq!(pass_grace_over.released, 1);
        assert!(is_free(&server, second.offset()));
    }
}
