//! The hash index, after FASTER's: an array of cache-line buckets, each
//! with seven entries and a link to an overflow bucket. An entry holds a
//! 14-bit tag (more bits of the key's hash) and the log address of the
//! newest record whose key hashes there; older records of the same tag
//! hang off it through each record's previous address. Entries change
//! only by compare-and-swap.
//!
//! Two threads inserting the same new tag at once could each take an
//! empty slot. FASTER's answer is a tentative bit: a new entry is written
//! tentative, the chain is scanned for another entry of the same tag, and
//! the insert backs off if it finds one. Searches skip tentative entries.

use crate::address::{LogAddress, ADDRESS_BITS};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const ENTRIES_PER_BUCKET: usize = 7;
const TAG_BITS: u32 = 14;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;
const TENTATIVE: u64 = 1 << 63;
/// Set in every used entry, so that tag 0 with no address is not empty.
const OCCUPIED: u64 = 1 << 62;
const ADDRESS_MASK: u64 = (1 << ADDRESS_BITS) - 1;
/// Rounds of back-off before an insert gives up on a contended bucket
/// chain; each round means another thread made progress.
const MAX_INSERT_ROUNDS: usize = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    #[error("the index is full: {buckets} buckets and all {overflow_buckets} overflow buckets are in use; create the store with a larger index")]
    Full { buckets: u64, overflow_buckets: u32 },
    #[error("the index needs a power of two buckets, at least 1; {0} given")]
    BucketCount(u64),
    #[error("an insert into one bucket chain was beaten {MAX_INSERT_ROUNDS} times")]
    Livelock,
}

/// One cache line: seven entries and the overflow link (1 + the overflow
/// bucket's number; 0 for none).
#[repr(align(64))]
struct Bucket {
    entries: [AtomicU64; ENTRIES_PER_BUCKET],
    overflow: AtomicU64,
}

impl Bucket {
    fn empty() -> Bucket {
        Bucket {
            entries: std::array::from_fn(|_| AtomicU64::new(0)),
            overflow: AtomicU64::new(0),
        }
    }
}

/// An index entry's word: tag, address, tentative bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry(u64);

impl Entry {
    pub const EMPTY: Entry = Entry(0);

    fn new(tag: u64, address: LogAddress, tentative: bool) -> Entry {
        let bit = if tentative { TENTATIVE } else { 0 };
        Entry(OCCUPIED | bit | (tag << ADDRESS_BITS) | address.value())
    }

    pub fn address(self) -> LogAddress {
        LogAddress::new(self.0 & ADDRESS_MASK)
    }

    fn tag(self) -> u64 {
        (self.0 >> ADDRESS_BITS) & TAG_MASK
    }

    fn is_tentative(self) -> bool {
        self.0 & TENTATIVE != 0
    }

    /// The same tag pointing at another record.
    pub fn with_address(self, address: LogAddress) -> Entry {
        Entry::new(self.tag(), address, false)
    }
}

/// Where a key's entry lives, and what it held when looked at.
pub struct Slot<'a> {
    word: &'a AtomicU64,
    pub entry: Entry,
}

impl Slot<'_> {
    /// Points the entry at `address` if nobody changed it since it was
    /// read; on failure, `entry` is refreshed to what it holds now.
    pub fn swap_address(&mut self, address: LogAddress) -> bool {
        let wanted = self.entry.with_address(address);
        match self.word.compare_exchange(
            self.entry.0,
            wanted.0,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                self.entry = wanted;
                true
            }
            Err(now) => {
                self.entry = Entry(now);
                false
            }
        }
    }
}

pub struct HashIndex {
    buckets: Box<[Bucket]>,
    overflow: Box<[Bucket]>,
    overflow_used: AtomicU32,
    mask: u64,
}

/// What the index holds, for reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexUsage {
    pub buckets: u64,
    pub overflow_buckets: u32,
    pub overflow_buckets_used: u32,
}

/// `count` empty buckets, on huge pages where the kernel gives them:
/// advised before the first touch, which is the fill.
fn huge_page_buckets(count: usize) -> Box<[Bucket]> {
    let mut buckets = Vec::with_capacity(count);
    let spare = buckets.spare_capacity_mut();
    crate::frames::advise_huge_pages(spare.as_ptr().cast(), std::mem::size_of_val(spare));
    buckets.extend((0..count).map(|_| Bucket::empty()));
    buckets.into_boxed_slice()
}

impl HashIndex {
    pub fn new(buckets: u64, overflow_buckets: u32) -> Result<HashIndex, IndexError> {
        if buckets == 0 || !buckets.is_power_of_two() {
            return Err(IndexError::BucketCount(buckets));
        }
        Ok(HashIndex {
            buckets: huge_page_buckets(buckets as usize),
            overflow: huge_page_buckets(overflow_buckets as usize),
            overflow_used: AtomicU32::new(0),
            mask: buckets - 1,
        })
    }

    pub fn usage(&self) -> IndexUsage {
        IndexUsage {
            buckets: self.buckets.len() as u64,
            overflow_buckets: self.overflow.len() as u32,
            overflow_buckets_used: self
                .overflow_used
                .load(Ordering::Relaxed)
                .min(self.overflow.len() as u32),
        }
    }

    fn tag_of(hash: u64) -> u64 {
        (hash >> (64 - TAG_BITS)) & TAG_MASK
    }

    /// The chain of buckets for `hash`, first to last.
    fn chain(&self, hash: u64) -> impl Iterator<Item = &Bucket> {
        let first = &self.buckets[(hash & self.mask) as usize];
        std::iter::successors(Some(first), |bucket| {
            match bucket.overflow.load(Ordering::Acquire) {
                0 => None,
                link => Some(&self.overflow[(link - 1) as usize]),
            }
        })
    }

    /// The settled entry for `hash`'s tag, if there is one.
    pub fn find(&self, hash: u64) -> Option<Slot<'_>> {
        let tag = Self::tag_of(hash);
        for bucket in self.chain(hash) {
            for word in &bucket.entries {
                let entry = Entry(word.load(Ordering::Acquire));
                if entry != Entry::EMPTY && !entry.is_tentative() && entry.tag() == tag {
                    return Some(Slot { word, entry });
                }
            }
        }
        None
    }

    /// Starts loading `hash`'s first bucket into the cache, so that a
    /// lookup a few operations later does not wait on memory for it.
    pub fn prefetch(&self, hash: u64) {
        let bucket = &self.buckets[(hash & self.mask) as usize];
        crate::frames::prefetch_line((bucket as *const Bucket).cast());
    }

    /// The entry for `hash`'s tag, made (pointing nowhere) if missing.
    pub fn find_or_create(&self, hash: u64) -> Result<Slot<'_>, IndexError> {
        let tag = Self::tag_of(hash);
        for _ in 0..MAX_INSERT_ROUNDS {
            if let Some(slot) = self.find(hash) {
                return Ok(slot);
            }
            if let Some(slot) = self.try_insert(hash, tag)? {
                return Ok(slot);
            }
            std::hint::spin_loop();
        }
        Err(IndexError::Livelock)
    }

    /// Claims an empty entry tentatively, then settles it unless another
    /// entry of the same tag appeared meanwhile. `None`: try again.
    fn try_insert(&self, hash: u64, tag: u64) -> Result<Option<Slot<'_>>, IndexError> {
        let tentative = Entry::new(tag, LogAddress::NONE, true);
        let word = self.claim_empty(hash, tentative)?;
        let rival = self.chain(hash).any(|bucket| {
            bucket.entries.iter().any(|other| {
                let entry = Entry(other.load(Ordering::Acquire));
                !std::ptr::eq(other, word) && entry != Entry::EMPTY && entry.tag() == tag
            })
        });
        if rival {
            word.store(Entry::EMPTY.0, Ordering::Release);
            return Ok(None);
        }
        let settled = Entry::new(tag, LogAddress::NONE, false);
        word.store(settled.0, Ordering::Release);
        Ok(Some(Slot {
            word,
            entry: settled,
        }))
    }

    /// Writes `entry` into the first empty word of the chain, growing the
    /// chain by an overflow bucket when every word is taken. Every word is
    /// claimed by compare-and-swap, a grown bucket's too: another thread
    /// may have linked it first and filled its words, and a plain store
    /// there overwrote a live entry (an acknowledged write then read as
    /// missing).
    fn claim_empty(&self, hash: u64, entry: Entry) -> Result<&AtomicU64, IndexError> {
        // Each round either claims a word or grows the chain by a bucket
        // (linking one or following another thread's): at most one round
        // per overflow bucket, and one more.
        for _ in 0..=self.overflow.len() {
            let mut last = &self.buckets[(hash & self.mask) as usize];
            for bucket in self.chain(hash) {
                last = bucket;
                for word in &bucket.entries {
                    if word
                        .compare_exchange(0, entry.0, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                    {
                        return Ok(word);
                    }
                }
            }
            self.grow(last)?;
        }
        Err(self.full())
    }

    fn full(&self) -> IndexError {
        IndexError::Full {
            buckets: self.buckets.len() as u64,
            overflow_buckets: self.overflow.len() as u32,
        }
    }

    /// Links a fresh overflow bucket after `last` (or follows the one
    /// another thread linked first).
    fn grow(&self, last: &Bucket) -> Result<&Bucket, IndexError> {
        // Taken only while buckets remain: a count bumped on every refusal
        // wrapped after 2^32 of them and handed out buckets in use.
        let capacity = self.overflow.len();
        let taken = self
            .overflow_used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                ((used as usize) < capacity).then_some(used + 1)
            });
        let Ok(number) = taken else {
            if let link @ 1.. = last.overflow.load(Ordering::Acquire) {
                return Ok(&self.overflow[(link - 1) as usize]);
            }
            return Err(self.full());
        };
        let link = u64::from(number) + 1;
        match last
            .overflow
            .compare_exchange(0, link, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Ok(&self.overflow[number as usize]),
            // Another thread grew the chain first; the bucket taken here
            // stays unused, which the usage report shows.
            Err(theirs) => Ok(&self.overflow[(theirs - 1) as usize]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Threads that grew one chain at once stored into the grown bucket's
    /// first word blindly: one thread's entry, already pointed at its
    /// record, was overwritten by another's, and that key read as missing.
    /// Every tag inserted by racing threads must be found at its address.
    #[test]
    fn racing_threads_growing_one_chain_lose_no_entry() {
        const THREADS: u64 = 4;
        const TAGS_PER_THREAD: u64 = 40;
        for round in 0..50 {
            let index = HashIndex::new(1, 64).unwrap();
            let start = std::sync::Barrier::new(THREADS as usize);
            std::thread::scope(|scope| {
                for thread in 0..THREADS {
                    let (index, start) = (&index, &start);
                    scope.spawn(move || {
                        start.wait();
                        for number in 0..TAGS_PER_THREAD {
                            let tag = 1 + thread * TAGS_PER_THREAD + number;
                            let mut slot = index.find_or_create(hash_with(tag, 0)).unwrap();
                            assert!(slot.swap_address(LogAddress::new(64 * tag)));
                        }
                    });
                }
            });
            for tag in 1..=THREADS * TAGS_PER_THREAD {
                let found = index
                    .find(hash_with(tag, 0))
                    .map(|slot| slot.entry.address());
                assert_eq!(
                    found,
                    Some(LogAddress::new(64 * tag)),
                    "round {round}, tag {tag}"
                );
            }
        }
    }

    /// A full index refused every later insert, and each refusal bumped the
    /// count of overflow buckets taken: it wrapped after 2^32 refusals and
    /// handed out buckets in use. Refusals leave it at the capacity.
    #[test]
    fn refusals_of_a_full_index_do_not_count_buckets_taken() {
        let index = HashIndex::new(1, 1).unwrap();
        let capacity = 2 * ENTRIES_PER_BUCKET as u64;
        for tag in 1..=capacity {
            index.find_or_create(hash_with(tag, 0)).unwrap();
        }
        for tag in capacity + 1..capacity + 100 {
            assert!(matches!(
                index.find_or_create(hash_with(tag, 0)),
                Err(IndexError::Full { .. })
            ));
        }
        assert_eq!(index.overflow_used.load(Ordering::Relaxed), 1);
    }

    fn hash_with(tag: u64, bucket: u64) -> u64 {
        (tag << (64 - TAG_BITS)) | bucket
    }

    #[test]
    fn an_entry_is_found_after_it_is_created_and_pointed() {
        let index = HashIndex::new(4, 0).unwrap();
        let hash = hash_with(9, 2);
        assert!(index.find(hash).is_none());
        let mut slot = index.find_or_create(hash).unwrap();
        assert!(slot.swap_address(LogAddress::new(640)));
        assert_eq!(
            index.find(hash).unwrap().entry.address(),
            LogAddress::new(640)
        );
    }

    #[test]
    fn a_stale_swap_fails_and_shows_the_new_entry() {
        let index = HashIndex::new(1, 0).unwrap();
        let mut first = index.find_or_create(5).unwrap();
        let mut second = index.find_or_create(5).unwrap();
        assert!(first.swap_address(LogAddress::new(64)));
        assert!(!second.swap_address(LogAddress::new(128)));
        assert_eq!(second.entry.address(), LogAddress::new(64));
    }

    #[test]
    fn a_full_chain_overflows_and_then_reports_full() {
        let index = HashIndex::new(1, 1).unwrap();
        for tag in 0..(2 * ENTRIES_PER_BUCKET as u64) {
            index.find_or_create(hash_with(tag, 0)).unwrap();
        }
        assert_eq!(index.usage().overflow_buckets_used, 1);
        let full = index.find_or_create(hash_with(100, 0)).err();
        assert_eq!(
            full,
            Some(IndexError::Full {
                buckets: 1,
                overflow_buckets: 1
            })
        );
    }

    #[test]
    fn bucket_counts_must_be_powers_of_two() {
        assert_eq!(HashIndex::new(3, 0).err(), Some(IndexError::BucketCount(3)));
    }

    #[test]
    fn racing_inserts_of_one_tag_settle_on_one_entry() {
        let index = HashIndex::new(2, 8).unwrap();
        let hash = hash_with(77, 1);
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        index.find_or_create(hash).unwrap();
                    }
                });
            }
        });
        let settled = index
            .chain(hash)
            .flat_map(|bucket| bucket.entries.iter())
            .filter(|word| Entry(word.load(Ordering::Acquire)).tag() == 77)
            .count();
        assert_eq!(settled, 1);
    }
}
