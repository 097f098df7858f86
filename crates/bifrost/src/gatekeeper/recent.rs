//! Calls the Gatekeeper remembers for a while after they left the RPC
//! graph: answered, expired, or failed with their callee.
//!
//! Each record is kept under its call's exact key. These were hashed
//! register cells, one call per cell, and a newer call that hashed to an
//! older one's cell overwrote it. A resend of the older call was then
//! taken for a new call: a call that had failed with its callee ran on
//! the replacement after its caller was told it failed, and many calls
//! failed at once by one node's failure collided among themselves (a
//! birthday bound, not a rare event). Here a record leaves only when the
//! table is full, oldest first; one that leaves before its call lease has
//! passed is counted, since a resend may still come for it.

use std::collections::VecDeque;

use remora_base::Timestamp;
use remora_switch::resources::TableResources;
use remora_switch::table::{ExactTable, TableShape};
use std::time::Duration;

use super::CallKey;

/// A bounded record of calls, by exact key, oldest evicted first.
pub(super) struct RecentCalls<V> {
    records: ExactTable<CallKey, Record<V>>,
    /// Keys in the order they were recorded, each with the stamp of its
    /// record: an entry whose stamp no longer matches (its record was
    /// taken, or recorded again later) is stale and skipped.
    order: VecDeque<(CallKey, u64)>,
    next_stamp: u64,
    /// A record younger than this is still wanted: its caller may resend.
    keep_for: Duration,
    forgotten_early: u64,
}

struct Record<V> {
    value: V,
    recorded_at: Timestamp,
    stamp: u64,
}

impl<V> RecentCalls<V> {
    pub(super) fn new(shape: TableShape, keep_for: Duration) -> RecentCalls<V> {
        RecentCalls {
            records: ExactTable::new(shape),
            order: VecDeque::with_capacity(shape.capacity),
            next_stamp: 0,
            keep_for,
            forgotten_early: 0,
        }
    }

    /// Records `value` for `key`, replacing an older record of the same
    /// call, and makes room by the oldest record when full.
    pub(super) fn record(&mut self, now: Timestamp, key: CallKey, value: V) {
        // A table of no room (a Gatekeeper configured for no calls in
        // flight still answers a fate-sharing call to a failed node)
        // keeps nothing, and says so.
        if self.records.capacity() == 0 {
            self.forgotten_early += 1;
            return;
        }
        if self.records.lookup(&key).is_none() && self.records.len() >= self.records.capacity() {
            self.evict_oldest(now);
        }
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        let record = Record {
            value,
            recorded_at: now,
            stamp,
        };
        let recorded = self.records.insert(key, record);
        debug_assert!(recorded.is_ok(), "room was made for the record");
        self.order.push_back((key, stamp));
        self.compact_order();
        self.debug_check_invariants();
    }

    pub(super) fn get(&self, key: &CallKey) -> Option<&V> {
        self.records.lookup(key).map(|record| &record.value)
    }

    /// Takes the record of `key` out (its stale place in the order is
    /// skipped later).
    pub(super) fn take(&mut self, key: &CallKey) -> Option<V> {
        self.records.remove(key).map(|record| record.value)
    }

    /// Drops every record `forget` says to; bounded by the capacity.
    pub(super) fn forget_where(&mut self, mut forget: impl FnMut(&V) -> bool) {
        let forgotten: Vec<CallKey> = self
            .records
            .iter()
            .filter(|(_, record)| forget(&record.value))
            .map(|(key, _)| *key)
            .collect();
        for key in forgotten {
            self.records.remove(&key);
        }
        self.compact_order();
    }

    /// Records evicted before their call lease had passed: a resend of
    /// one of them is taken for a new call.
    pub(super) fn forgotten_early(&self) -> u64 {
        self.forgotten_early
    }

    pub(super) fn resources(&self) -> TableResources {
        self.records.resources()
    }

    fn evict_oldest(&mut self, now: Timestamp) {
        // Bounded: the order holds at most twice the capacity (see
        // `compact_order`), and the table is full, so a live entry comes.
        while let Some((key, stamp)) = self.order.pop_front() {
            let live = self
                .records
                .lookup(&key)
                .is_some_and(|record| record.stamp == stamp);
            if !live {
                continue;
            }
            let Some(record) = self.records.remove(&key) else {
                continue;
            };
            if record.recorded_at.saturating_add(self.keep_for) > now {
                self.forgotten_early += 1;
            }
            return;
        }
    }

    /// Drops the stale entries of the order once they outnumber the live
    /// ones, so that it stays within twice the capacity.
    fn compact_order(&mut self) {
        if self.order.len() <= 2 * self.records.capacity().max(1) {
            return;
        }
        let records = &self.records;
        self.order.retain(|(key, stamp)| {
            records
                .lookup(key)
                .is_some_and(|record| record.stamp == *stamp)
        });
    }

    fn debug_check_invariants(&self) {
        debug_assert!(self.records.len() <= self.records.capacity());
        debug_assert!(self.order.len() <= 2 * self.records.capacity().max(1));
        debug_assert!(self.order.len() >= self.records.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_wire::Ipv4Address;

    fn recent(capacity: usize) -> RecentCalls<u32> {
        let shape = TableShape {
            name: "recent",
            stage: 1,
            key_bits: 112,
            action_data_bits: 32,
            capacity,
        };
        RecentCalls::new(shape, Duration::from_secs(1))
    }

    fn key(rpc_id: u64) -> CallKey {
        (Ipv4Address::new(10, 0, 0, 1), 40000, rpc_id)
    }

    /// A table of no room refused the insert, which only a debug
    /// assertion caught.
    #[test]
    fn a_table_of_no_room_keeps_nothing_and_counts_it() {
        let mut calls = recent(0);
        calls.record(Timestamp::ZERO, key(1), 1);
        assert_eq!(calls.get(&key(1)), None);
        assert_eq!(calls.forgotten_early(), 1);
    }

    #[test]
    fn every_call_keeps_its_record_until_the_table_is_full() {
        let mut calls = recent(64);
        for rpc_id in 0..64 {
            calls.record(Timestamp::ZERO, key(rpc_id), rpc_id as u32);
        }
        for rpc_id in 0..64 {
            assert_eq!(calls.get(&key(rpc_id)), Some(&(rpc_id as u32)));
        }
        assert_eq!(calls.forgotten_early(), 0);
    }

    #[test]
    fn a_full_table_forgets_the_oldest_and_counts_it_if_still_wanted() {
        let mut calls = recent(2);
        calls.record(Timestamp::ZERO, key(1), 1);
        calls.record(Timestamp::ZERO, key(2), 2);
        calls.record(Timestamp::ZERO, key(3), 3);
        assert_eq!(calls.get(&key(1)), None);
        assert_eq!(calls.forgotten_early(), 1);
        let later = Timestamp::ZERO.saturating_add(Duration::from_secs(2));
        calls.record(later, key(4), 4);
        assert_eq!(calls.get(&key(2)), None);
        assert_eq!(calls.get(&key(3)), Some(&3));
        assert_eq!(calls.forgotten_early(), 1, "key 2's lease had passed");
    }

    #[test]
    fn a_record_taken_or_renewed_leaves_no_stale_eviction() {
        let mut calls = recent(2);
        calls.record(Timestamp::ZERO, key(1), 1);
        calls.record(Timestamp::ZERO, key(2), 2);
        // Renewed: key 1 is now the newest, so key 2 goes first.
        calls.record(Timestamp::ZERO, key(1), 10);
        calls.record(Timestamp::ZERO, key(3), 3);
        assert_eq!(calls.get(&key(1)), Some(&10));
        assert_eq!(calls.get(&key(2)), None);
        assert_eq!(calls.take(&key(1)), Some(10));
        calls.record(Timestamp::ZERO, key(4), 4);
        assert_eq!(
            calls.get(&key(3)),
            Some(&3),
            "room was free: nothing evicted"
        );
        for rpc_id in 5..1000 {
            calls.record(Timestamp::ZERO, key(rpc_id), rpc_id as u32);
        }
        assert!(calls.order.len() <= 4);
        calls.forget_where(|value| *value == 999);
        assert_eq!(calls.get(&key(999)), None);
        assert_eq!(calls.get(&key(998)), Some(&998));
    }
}
