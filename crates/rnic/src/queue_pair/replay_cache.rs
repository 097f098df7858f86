//! The responder's replay cache.
//!
//! A retransmitted READ or atomic must return the original result and must
//! never execute twice: re-running a FETCH_ADD would add twice, and
//! re-reading memory could return bytes written after the original READ.
//! So the responder snapshots each READ's data and each atomic's original
//! value, keyed by PSN, and serves duplicates from here.
//!
//! The cache holds `max_destination_read_atomic` entries. A requester may
//! have at most that many READ/atomic requests outstanding, so every request
//! it can legitimately retransmit is still here. A delayed duplicate of an
//! older request finds nothing and is dropped, which is safe.
//!
//! Entries are keyed by absolute PSN (PSNs counted since the queue pair
//! started, never wrapping): an entry left from 2^24 PSNs ago has the same
//! 24-bit PSN as a new one, and was found first for a duplicate of it,
//! answering with another request's result.

use remora_wire::{Msn, Psn};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplayKind {
    Read,
    Atomic { original: u64 },
}

#[derive(Debug)]
pub(crate) struct ReplayEntry {
    pub(crate) first_psn: Psn,
    first_absolute: u64,
    pub(crate) packet_count: u32,
    pub(crate) kind: ReplayKind,
    pub(crate) msn: Msn,
    /// READ data; its capacity is kept across reuse to avoid allocation,
    /// and its bytes too: a READ sizes it and overwrites every byte, so a
    /// slot reused at the same length is never zeroed first (zeroing was a
    /// tenth of a 64 KiB READ's time). Stale in an atomic's slot, where
    /// nothing reads it.
    pub(crate) data: Vec<u8>,
    live: bool,
}

#[derive(Debug)]
pub(crate) struct ReplayCache {
    entries: Vec<ReplayEntry>,
    next_slot: usize,
}

impl ReplayCache {
    pub(crate) fn new(capacity: usize) -> ReplayCache {
        assert!(capacity > 0);
        let entries = (0..capacity)
            .map(|_| ReplayEntry {
                first_psn: Psn::new(0),
                first_absolute: 0,
                packet_count: 0,
                kind: ReplayKind::Read,
                msn: Msn::new(0),
                data: Vec::new(),
                live: false,
            })
            .collect();
        ReplayCache {
            entries,
            next_slot: 0,
        }
    }

    /// Claims the oldest slot for a new request. Returns its index; the
    /// caller must drop any queued output that still refers to it.
    pub(crate) fn insert(
        &mut self,
        (first_psn, first_absolute): (Psn, u64),
        packet_count: u32,
        kind: ReplayKind,
        msn: Msn,
    ) -> usize {
        assert!(packet_count > 0);
        let slot = self.next_slot;
        self.next_slot = (self.next_slot + 1) % self.entries.len();
        let entry = &mut self.entries[slot];
        entry.first_psn = first_psn;
        entry.first_absolute = first_absolute;
        entry.packet_count = packet_count;
        entry.kind = kind;
        entry.msn = msn;
        entry.live = true;
        slot
    }

    pub(crate) fn entry(&self, slot: usize) -> &ReplayEntry {
        &self.entries[slot]
    }

    pub(crate) fn entry_mut(&mut self, slot: usize) -> &mut ReplayEntry {
        &mut self.entries[slot]
    }

    /// The bytes the slots' READ snapshots hold (their capacity).
    pub(crate) fn bytes_held(&self) -> usize {
        self.entries.iter().map(|entry| entry.data.capacity()).sum()
    }

    /// The slot the next request takes.
    pub(crate) fn next_slot(&self) -> usize {
        self.next_slot
    }

    /// The entry whose range holds absolute PSN `absolute`, with the packet
    /// offset in it.
    pub(crate) fn find(&self, absolute: u64) -> Option<(usize, u32)> {
        self.entries.iter().enumerate().find_map(|(slot, entry)| {
            let offset = absolute.checked_sub(entry.first_absolute)?;
            (entry.live && offset < u64::from(entry.packet_count)).then_some((slot, offset as u32))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_entry_covering_a_psn_and_forgets_the_oldest() {
        let mut cache = ReplayCache::new(2);
        let read = cache.insert((Psn::new(10), 10), 4, ReplayKind::Read, Msn::new(1));
        let atomic = ReplayKind::Atomic { original: 7 };
        cache.insert((Psn::new(14), 14), 1, atomic, Msn::new(2));
        assert_eq!(cache.find(12), Some((read, 2)));
        assert_eq!(cache.find(15), None);
        let atomic = ReplayKind::Atomic { original: 8 };
        cache.insert((Psn::new(15), 15), 1, atomic, Msn::new(3));
        assert_eq!(cache.find(12), None, "the oldest entry was evicted");
        assert!(cache.find(14).is_some());
    }

    /// An atomic from 2^24 PSNs ago, at the same 24-bit PSN as a new one,
    /// sat in an earlier slot and answered the new one's duplicate.
    #[test]
    fn an_entry_from_a_lap_of_the_psn_space_ago_is_not_the_new_one() {
        let mut cache = ReplayCache::new(2);
        let psn = Psn::new(100);
        cache.insert(
            (psn, 100),
            1,
            ReplayKind::Atomic { original: 1 },
            Msn::new(1),
        );
        let lap = 100 + (1 << 24);
        let new = cache.insert(
            (psn, lap),
            1,
            ReplayKind::Atomic { original: 2 },
            Msn::new(2),
        );
        assert_eq!(cache.find(lap), Some((new, 0)));
        assert_eq!(cache.entry(new).kind, ReplayKind::Atomic { original: 2 });
    }
}
