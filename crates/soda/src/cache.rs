//! The DPU's caches, with no I/O (§IV-C).
//!
//! The dynamic cache is a table of fixed entries in one registered region
//! (1 MiB by default, several chunks each), found through a hash map, with
//! random eviction and a reference count per entry that blocks eviction
//! while a reply is being sent from it. The recent list is a ring of the
//! last 128 requested entries, which the prefetcher reads to fetch the
//! entries that follow. The static cache is a bump allocator over its own
//! region: what it holds never moves and is never evicted.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use remora_wire::soda::RegionId;
use std::collections::HashMap;

/// The recent list's length, as in the paper.
pub const RECENT_LIST_LENGTH: usize = 128;

/// An entry of a region: `entry` counts entry-sized pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EntryKey {
    pub region: RegionId,
    pub entry: u64,
}

/// Whether the dynamic cache is used: always, never, or while its hit
/// rate pays for it (Eq. 3: h > B_net / B_intra).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMode {
    Auto,
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DynamicCacheConfig {
    pub capacity_bytes: u64,
    pub entry_bytes: usize,
    /// Entries fetched ahead of each requested one.
    pub prefetch_depth: u64,
    pub mode: CacheMode,
}

/// What a lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    Ready(usize),
    Filling(usize),
    Absent,
}

#[derive(Debug, Clone, Default)]
struct Slot {
    key: Option<EntryKey>,
    ready: bool,
    references: u32,
    /// Its region was forgotten while it filled or was read: out of the
    /// index (no lookup finds it), and free once its fill and readers
    /// are done.
    forgotten: bool,
}

#[derive(Debug)]
pub struct CacheTable {
    slots: Vec<Slot>,
    index: HashMap<EntryKey, usize>,
    free: Vec<usize>,
    random: ChaCha8Rng,
}

/// Tries at picking an unreferenced victim before giving up for now.
const EVICTION_TRIES: usize = 8;

impl CacheTable {
    pub fn new(entries: usize, seed: u64) -> CacheTable {
        CacheTable {
            slots: vec![Slot::default(); entries],
            index: HashMap::new(),
            free: (0..entries).rev().collect(),
            random: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    pub fn entries(&self) -> usize {
        self.slots.len()
    }

    pub fn lookup(&self, key: EntryKey) -> Lookup {
        match self.index.get(&key) {
            Some(&slot) if self.slots[slot].ready => Lookup::Ready(slot),
            Some(&slot) => Lookup::Filling(slot),
            None => Lookup::Absent,
        }
    }

    /// A slot for `key`, marked filling: a free one, or a random ready
    /// one nobody is reading. `None` when every try found a busy slot.
    pub fn reserve(&mut self, key: EntryKey) -> Option<usize> {
        debug_assert_eq!(self.lookup(key), Lookup::Absent);
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => self.victim()?,
        };
        self.unindex(slot);
        self.slots[slot] = Slot {
            key: Some(key),
            ready: false,
            references: 0,
            forgotten: false,
        };
        self.index.insert(key, slot);
        Some(slot)
    }

    fn victim(&mut self) -> Option<usize> {
        if self.slots.is_empty() {
            return None;
        }
        (0..EVICTION_TRIES)
            .map(|_| self.random.gen_range(0..self.slots.len()))
            .find(|&slot| self.slots[slot].ready && self.slots[slot].references == 0)
    }

    pub fn filled(&mut self, slot: usize) {
        self.slots[slot].ready = true;
    }

    /// A fill that failed: the slot goes back, empty.
    pub fn abandon(&mut self, slot: usize) {
        self.unindex(slot);
        self.slots[slot] = Slot::default();
        self.free.push(slot);
    }

    /// Takes the slot's key out of the index, if the index still names
    /// this slot for it (a forgotten slot's key may name a newer one).
    fn unindex(&mut self, slot: usize) {
        if let Some(key) = self.slots[slot].key {
            if self.index.get(&key) == Some(&slot) {
                self.index.remove(&key);
            }
        }
    }

    /// After a fill's waiters were served: a forgotten slot nobody reads
    /// goes back.
    pub fn settle(&mut self, slot: usize) {
        let entry = &self.slots[slot];
        if entry.forgotten && entry.ready && entry.references == 0 {
            self.abandon(slot);
        }
    }

    pub fn acquire(&mut self, slot: usize) {
        self.slots[slot].references += 1;
    }

    pub fn release(&mut self, slot: usize) {
        let references = &mut self.slots[slot].references;
        debug_assert!(*references > 0, "released more than acquired");
        *references = references.saturating_sub(1);
        self.settle(slot);
    }

    /// Drops every entry of `region` (the region was written or freed):
    /// no lookup finds one from now on. Entries being filled or read stay
    /// out of the free list until done. (Left in the index, a fill that
    /// landed after the forget was served as a hit: the memory node's
    /// bytes from before the write.)
    pub fn forget_region(&mut self, region: RegionId) {
        let stale: Vec<usize> = self
            .index
            .iter()
            .filter(|(key, _)| key.region == region)
            .map(|(_, &slot)| slot)
            .collect();
        for slot in stale {
            let entry = &self.slots[slot];
            if entry.ready && entry.references == 0 {
                self.abandon(slot);
            } else {
                self.unindex(slot);
                self.slots[slot].forgotten = true;
            }
        }
    }
}

/// The last requested entries, newest last; readers keep a sequence number.
#[derive(Debug)]
pub struct RecentList {
    ring: [Option<EntryKey>; RECENT_LIST_LENGTH],
    pushed: u64,
}

impl Default for RecentList {
    fn default() -> RecentList {
        RecentList {
            ring: [None; RECENT_LIST_LENGTH],
            pushed: 0,
        }
    }
}

impl RecentList {
    pub fn push(&mut self, key: EntryKey) {
        self.ring[(self.pushed % RECENT_LIST_LENGTH as u64) as usize] = Some(key);
        self.pushed += 1;
    }

    /// Entries pushed since `seen` (at most the ring's length, oldest
    /// first), each with its sequence number: a reader that handles only
    /// some of them resumes after the last it handled.
    pub fn since(&self, seen: u64) -> Vec<(u64, EntryKey)> {
        let first = seen.max(self.pushed.saturating_sub(RECENT_LIST_LENGTH as u64));
        (first..self.pushed)
            .filter_map(|at| {
                let key = self.ring[(at % RECENT_LIST_LENGTH as u64) as usize]?;
                Some((at, key))
            })
            .collect()
    }
}

/// The static cache's space: a bump allocator, never evicted.
#[derive(Debug)]
pub struct StaticSpace {
    capacity_bytes: u64,
    /// Free ranges (start, end), by start, none touching another: at
    /// most one more than the pinned regions.
    free: Vec<(u64, u64)>,
}

/// Pinned regions start on a page, as the memory node's do.
const STATIC_ALIGNMENT_BYTES: u64 = 4096;

impl StaticSpace {
    pub fn new(capacity_bytes: u64) -> StaticSpace {
        StaticSpace {
            capacity_bytes,
            free: (capacity_bytes > 0)
                .then_some((0, capacity_bytes))
                .into_iter()
                .collect(),
        }
    }

    /// `bytes` of space starting on a page, first fit; its offset, or
    /// `None` when no free range holds it.
    pub fn allocate(&mut self, bytes: u64) -> Option<u64> {
        let fits = |&(start, end): &(u64, u64)| {
            let aligned = start.checked_next_multiple_of(STATIC_ALIGNMENT_BYTES)?;
            aligned
                .checked_add(bytes)
                .filter(|&taken_end| taken_end <= end)?;
            Some(aligned)
        };
        let (at, aligned) = self
            .free
            .iter()
            .enumerate()
            .find_map(|(at, range)| fits(range).map(|aligned| (at, aligned)))?;
        let (start, end) = self.free.remove(at);
        // What is left on either side stays free, in order.
        let mut index = at;
        for (left_start, left_end) in [(start, aligned), (aligned + bytes, end)] {
            if left_end > left_start {
                self.free.insert(index, (left_start, left_end));
                index += 1;
            }
        }
        Some(aligned)
    }

    /// Gives back what `allocate(bytes)` returned at `offset`. A pin and
    /// an unpin once used the space up for good: it was only ever taken.
    pub fn release(&mut self, offset: u64, bytes: u64) {
        let end = offset.saturating_add(bytes).min(self.capacity_bytes);
        if end <= offset {
            return;
        }
        let at = self.free.partition_point(|&(start, _)| start < offset);
        debug_assert!(at == 0 || self.free[at - 1].1 <= offset, "a double release");
        self.free.insert(at, (offset, end));
        // Joins the neighbours it touches.
        if at + 1 < self.free.len() && self.free[at].1 == self.free[at + 1].0 {
            self.free[at].1 = self.free[at + 1].1;
            self.free.remove(at + 1);
        }
        if at > 0 && self.free[at - 1].1 == self.free[at].0 {
            self.free[at - 1].1 = self.free[at].1;
            self.free.remove(at);
        }
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    /// The longest free range: the largest region a pin can take now.
    pub fn largest_free_bytes(&self) -> u64 {
        self.free
            .iter()
            .map(|(start, end)| end - start)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(entry: u64) -> EntryKey {
        EntryKey {
            region: RegionId(1),
            entry,
        }
    }

    #[test]
    fn entries_fill_hit_and_are_evicted_only_when_unreferenced() {
        let mut table = CacheTable::new(2, 7);
        let first = table.reserve(key(0)).unwrap();
        assert_eq!(table.lookup(key(0)), Lookup::Filling(first));
        table.filled(first);
        table.acquire(first);
        let second = table.reserve(key(1)).unwrap();
        table.filled(second);
        // Full: only the unreferenced entry can go.
        let third = table.reserve(key(2)).unwrap();
        assert_eq!(third, second);
        assert_eq!(table.lookup(key(1)), Lookup::Absent);
        assert_eq!(table.lookup(key(0)), Lookup::Ready(first));
        // Everything busy or filling: no room now.
        assert_eq!(table.reserve(key(3)), None);
        table.release(first);
        table.filled(third);
        assert!(table.reserve(key(3)).is_some());
    }

    /// A region forgotten (written, unpinned) while one of its entries
    /// filled kept that entry in the index: the fill, landing after, was
    /// served as a hit with the bytes from before the write. It is out of
    /// the index at once now, and its slot comes back when done.
    #[test]
    fn an_entry_filling_when_its_region_is_forgotten_is_never_a_hit() {
        let mut table = CacheTable::new(1, 7);
        let filling = table.reserve(key(0)).unwrap();
        table.forget_region(RegionId(1));
        assert_eq!(table.lookup(key(0)), Lookup::Absent);
        // A new fill of the same entry takes no slot while the old one is
        // busy...
        assert_eq!(table.reserve(key(0)), None);
        table.filled(filling);
        assert_eq!(
            table.lookup(key(0)),
            Lookup::Absent,
            "the stale fill is no hit"
        );
        // ...and the old slot comes back once its waiters are served.
        table.acquire(filling);
        table.settle(filling);
        assert_eq!(table.reserve(key(0)), None, "still read");
        table.release(filling);
        let again = table.reserve(key(0)).expect("the slot came back");
        assert_eq!(table.lookup(key(0)), Lookup::Filling(again));
    }

    /// Static space was a bump allocator: pinning and unpinning one
    /// object again and again ran it out while the cache held nothing.
    #[test]
    fn static_space_comes_back_and_joins_its_neighbours() {
        let mut space = StaticSpace::new(64 << 10);
        for _ in 0..10 {
            let whole = space.allocate(64 << 10).expect("all of it is free again");
            space.release(whole, 64 << 10);
        }
        let first = space.allocate(16 << 10).unwrap();
        let second = space.allocate(100).unwrap();
        let third = space.allocate(16 << 10).unwrap();
        assert_eq!((first, second, third), (0, 16 << 10, 20 << 10));
        assert_eq!(space.allocate(64 << 10), None);
        // The page-rounding gap after the 100 bytes is free, and joins the
        // 100 bytes once they come back.
        assert_eq!(space.largest_free_bytes(), 28 << 10);
        space.release(second, 100);
        assert_eq!(space.largest_free_bytes(), 28 << 10);
        space.release(first, 16 << 10);
        space.release(third, 16 << 10);
        assert_eq!(space.largest_free_bytes(), 64 << 10);
        assert_eq!(space.allocate(64 << 10), Some(0));
    }

    #[test]
    fn the_recent_list_keeps_the_last_128() {
        let mut list = RecentList::default();
        for entry in 0..200 {
            list.push(key(entry));
        }
        let keys = list.since(0);
        assert_eq!(keys.len(), RECENT_LIST_LENGTH);
        assert_eq!(keys[0], (72, key(72)));
        list.push(key(500));
        assert_eq!(list.since(200), vec![(200, key(500))]);
        assert_eq!(
            list.since(199),
            vec![(199, key(199)), (200, key(500))],
            "a reader resumes at the first entry it did not handle"
        );
    }

    #[test]
    fn static_space_never_overcommits() {
        let mut space = StaticSpace::new(10_000);
        assert_eq!(space.allocate(5000), Some(0));
        assert_eq!(space.allocate(5000), None);
        assert_eq!(space.allocate(1000), Some(8192));
    }
}
