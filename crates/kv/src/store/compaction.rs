//! Log compaction, as FASTER's scan-and-copy: every record below an
//! address that is still its key's newest is copied to the tail, then the
//! log is truncated there. A long-running store that keeps updating fills
//! its device with superseded copies; compaction gives that room back
//! without losing a live key.
//!
//! Only records on the device are compacted (the address may not pass the
//! head), a page at a time: each page is truncated as soon as its live
//! records are copied. Other sessions keep working meanwhile. A copy is published like
//! any append, by a compare-and-swap on the key's index entry after
//! checking that the record is still its key's newest, so a write that
//! lands in between wins and the copy is dropped. A live tombstone is not
//! copied: every older record of its key lies below it and goes with the
//! truncation, so the key stays deleted.

use super::{hash_key, locate, previous_on_chain, KvError, Located, Session};
use crate::address::LogAddress;
use crate::checkpoint::{read_now, scan_page};
use crate::log::{Allocation, Region};
use crate::record::{parse_stored, Parsed};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CompactionError {
    #[error("compacting up to {until} would pass the log's head at {head}: only records on the device are compacted")]
    AboveHead { until: LogAddress, head: LogAddress },
    #[error("the session has {0} operations pending: complete them before compacting")]
    PendingOperations(usize),
}

/// What one compaction did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Compaction {
    /// Valid records found below the compaction address.
    pub records_scanned: u64,
    /// Of those, the ones still their key's newest, copied to the tail.
    pub records_copied: u64,
    /// The log's begin address afterwards.
    pub begin: LogAddress,
}

/// Every compaction of a store, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct CompactionTotals {
    pub compactions: u64,
    pub records_scanned: u64,
    pub records_copied: u64,
}

/// The store's running [`CompactionTotals`].
#[derive(Default)]
pub(super) struct Counters {
    compactions: AtomicU64,
    records_scanned: AtomicU64,
    records_copied: AtomicU64,
}

impl Counters {
    fn add(&self, compaction: &Compaction) {
        self.compactions.fetch_add(1, Ordering::Relaxed);
        self.records_scanned
            .fetch_add(compaction.records_scanned, Ordering::Relaxed);
        self.records_copied
            .fetch_add(compaction.records_copied, Ordering::Relaxed);
    }

    pub(super) fn totals(&self) -> CompactionTotals {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        CompactionTotals {
            compactions: load(&self.compactions),
            records_scanned: load(&self.records_scanned),
            records_copied: load(&self.records_copied),
        }
    }
}

/// Records read while following a chain on the device before the log is
/// judged corrupt: far more than any chain of tag collisions.
const MAX_CHAIN_RECORDS: usize = 1 << 20;

/// One valid record of a scanned page, copied out of the page's bytes.
struct Scanned {
    address: LogAddress,
    key: Vec<u8>,
    value: Vec<u8>,
    tombstone: bool,
}

impl Session {
    /// Copies every record below `until`'s page that is still its key's
    /// newest to the tail, truncating the log page by page up to `until`'s
    /// page. `until` may not pass the head. An error (the device full, say)
    /// leaves the pages already done truncated.
    pub fn compact(&mut self, until: LogAddress) -> Result<Compaction, KvError> {
        if self.pending_count() > 0 {
            return Err(CompactionError::PendingOperations(self.pending_count()).into());
        }
        self.enter_for_completion()?;
        let log = self.shared.log.clone();
        let page_bits = self.shared.config.page_bits;
        let until = LogAddress::page_start(until.page(page_bits), page_bits);
        let head = log.head();
        if until > head {
            return Err(CompactionError::AboveHead { until, head }.into());
        }
        let begin = log.begin();
        let mut report = Compaction {
            begin,
            ..Compaction::default()
        };
        self.allocation = Allocation::Compaction;
        let compacted = self.compact_pages(begin, until, &mut report);
        self.allocation = Allocation::Ordinary;
        compacted?;
        self.shared.compactions.add(&report);
        Ok(report)
    }

    /// The pages from `begin`'s to `until`'s, each copied and truncated.
    fn compact_pages(
        &mut self,
        begin: LogAddress,
        until: LogAddress,
        report: &mut Compaction,
    ) -> Result<(), KvError> {
        let log = self.shared.log.clone();
        let page_bits = self.shared.config.page_bits;
        let mut page = Vec::new();
        for number in begin.page(page_bits)..until.page(page_bits) {
            let start = LogAddress::page_start(number, page_bits);
            let offset = log.device_offset(start);
            read_now(self.queue.as_mut(), offset, 1 << page_bits, &mut page)?;
            for record in valid_records(start, &page, begin)? {
                report.records_scanned += 1;
                report.records_copied += u64::from(self.copy_if_newest(&record)?);
            }
            // The page is done: its room goes back at once, so that a
            // compaction of a nearly full device needs at most a page's
            // live records of room, and one cut short keeps its progress.
            log.truncate_until(LogAddress::page_start(number + 1, page_bits))?;
            report.begin = log.begin();
            // Let the epoch move between pages: a long compaction must
            // not hold up the other sessions' flushes.
            self.refresh()?;
        }
        Ok(())
    }

    /// Copies `record` to the tail if it is still its key's newest and not
    /// a tombstone. `true`: copied.
    fn copy_if_newest(&mut self, record: &Scanned) -> Result<bool, KvError> {
        let shared = self.shared.clone();
        loop {
            let Some(slot) = shared.index.find(hash_key(&record.key)) else {
                return Ok(false);
            };
            let newest = self.newest_address(&record.key, slot.entry.address())?;
            if newest != Some(record.address) || record.tombstone {
                return Ok(false);
            }
            let (key, value) = (&record.key, &record.value);
            if self.append(slot, key, value, value.len(), false)? {
                return Ok(true);
            }
        }
    }

    /// The address of `key`'s newest record on the chain from
    /// `chain_head`, reading records on the device as it must.
    fn newest_address(
        &mut self,
        key: &[u8],
        chain_head: LogAddress,
    ) -> Result<Option<LogAddress>, KvError> {
        let mut address = match locate(&self.shared.log, key, chain_head) {
            Located::Absent => return Ok(None),
            Located::Memory(_, address, _) => return Ok(Some(address)),
            Located::Device(address) => address,
        };
        let mut bytes = Vec::new();
        for _ in 0..MAX_CHAIN_RECORDS {
            if self.shared.log.region(address) == Region::Truncated {
                return Ok(None);
            }
            self.read_record_now(address, &mut bytes)?;
            let Parsed::Whole(stored) = parse_stored(&bytes) else {
                return Err(KvError::Corrupt("a record on a chain does not parse"));
            };
            if stored.key == key {
                return Ok(Some(address));
            }
            address = previous_on_chain(address, stored.header)?;
        }
        Err(KvError::Corrupt("a chain on the device does not end"))
    }

    /// The whole record at `address` on the device, into `bytes`.
    fn read_record_now(&mut self, address: LogAddress, bytes: &mut Vec<u8>) -> Result<(), KvError> {
        let room = address.bytes_to_page_end(self.shared.config.page_bits) as usize;
        let offset = self.shared.log.device_offset(address);
        let mut length = self.shared.config.first_read_bytes.min(room);
        loop {
            read_now(self.queue.as_mut(), offset, length, bytes)?;
            match parse_stored(bytes) {
                Parsed::Whole(_) => return Ok(()),
                Parsed::Needs(needed) if needed > length && needed <= room => length = needed,
                Parsed::Needs(_) => {
                    return Err(KvError::Corrupt("a record runs past its page's end"))
                }
                Parsed::Corrupt(why) => return Err(KvError::Corrupt(why)),
            }
        }
    }
}

/// The valid records of one page at or above `begin`, copied out.
fn valid_records(
    start: LogAddress,
    page: &[u8],
    begin: LogAddress,
) -> Result<Vec<Scanned>, KvError> {
    let mut records = Vec::new();
    scan_page(start, page, |address, stored| {
        if address >= begin {
            records.push(Scanned {
                address,
                key: stored.key.to_vec(),
                value: stored.value.to_vec(),
                tombstone: stored.header.is_tombstone(),
            });
        }
    })?;
    Ok(records)
}
