//! The hybrid log: one address space split by four boundaries,
//!
//! ```text
//! begin ........ head ........ safe read-only ... read-only ........ tail
//!   | on the device |  in memory, read-only  | fuzzy |  mutable: updated in place |
//! ```
//!
//! Records are appended at the tail. When the tail enters a new page, the
//! read-only boundary moves so that a fixed number of pages stay mutable,
//! and the head moves so that one frame stays free for the next page.
//! Each move is published first and completed in an epoch action: once
//! every thread has seen the new read-only boundary, nobody updates those
//! pages in place and they are flushed (the safe read-only boundary);
//! once every thread has seen the new head, nobody reads those frames and
//! they can be reused (the safe head). The head never passes a page whose
//! flush has not completed, so the device is never asked for bytes it is
//! still writing.

use crate::address::{LogAddress, FIRST_ADDRESS};
use crate::device::{call_time, Device, DeviceError, DeviceQueue, Finished};
use crate::epoch::{Epoch, EpochError};
use crate::frames::Frames;
use crate::record::Header;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogError {
    #[error("the device is full: the log from its begin address needs {needed_bytes} bytes of the device's {capacity_bytes}; truncate the log or use a larger device")]
    DeviceFull {
        needed_bytes: u64,
        capacity_bytes: u64,
    },
    #[error("flushing the log failed: {0}")]
    Flush(DeviceError),
    #[error(transparent)]
    Epoch(#[from] EpochError),
    #[error("the log's addresses have reached their 48-bit limit ({limit_bytes} bytes appended since the store began): it takes no more records")]
    AddressSpaceExhausted { limit_bytes: u64 },
    #[error("truncating to {wanted} would drop records still in memory (the head is at {head})")]
    TruncateAboveHead {
        wanted: LogAddress,
        head: LogAddress,
    },
}

/// Pages at the device's end that only compaction's copies (and a
/// checkpoint's page turn) may fill: copying one page's live records takes
/// at most a page, plus the end of the page the tail leaves, so a
/// compaction of a full device can always free its first page.
pub const COMPACTION_RESERVE_PAGES: u64 = 2;

/// A page past the compaction's reserve that only a checkpoint's page
/// turn may take. Under a kept checkpoint, a compaction's truncated pages
/// keep their space until a newer checkpoint is durable; with one reserve
/// for both, the copies filled it, the checkpoint could not turn its page,
/// and the device stayed full for good.
pub const SEAL_RESERVE_PAGES: u64 = 1;

/// The pages ordinary records never take: both reserves.
pub const ORDINARY_RESERVE_PAGES: u64 = COMPACTION_RESERVE_PAGES + SEAL_RESERVE_PAGES;

/// Who asks for room at the tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// An operation's record: it stops short of both reserves.
    Ordinary,
    /// A compaction's copy, which may fill the compaction's reserve.
    Compaction,
    /// A checkpoint's page turn, which may take the last page too.
    Seal,
}

/// Device bytes before the log's ring: two checkpoint records.
pub const CHECKPOINT_AREA_BYTES: u64 = 2 * crate::checkpoint::RECORD_SLOT_BYTES;

/// The log's share of a device: whole pages after the checkpoint area.
pub fn log_capacity_bytes(device_bytes: u64, page_bits: u32) -> u64 {
    device_bytes.saturating_sub(CHECKPOINT_AREA_BYTES) >> page_bits << page_bits
}

/// Where a device keeps `address` of a log whose ring holds
/// `log_capacity_bytes` (see [`log_capacity_bytes`]).
pub fn ring_offset(address: LogAddress, log_capacity_bytes: u64) -> u64 {
    CHECKPOINT_AREA_BYTES + address.value() % log_capacity_bytes
}

/// How many pages and which of them stay mutable.
#[derive(Debug, Clone, Copy)]
pub struct LogShape {
    pub page_bits: u32,
    pub frame_count: u64,
    pub mutable_pages: u64,
}

struct Tail {
    page: u64,
    offset: u64,
}

struct Flushing {
    queue: Box<dyn DeviceQueue>,
    /// The next page to hand to the device.
    next_page: u64,
    /// Pages whose writes completed, above `flushed_until`.
    completed: BTreeSet<u64>,
    buffer: Vec<u8>,
    finished: Finished,
}

/// `kept_from` when no checkpoint is kept.
const NO_CHECKPOINT: u64 = u64::MAX;

pub struct HybridLog {
    pub frames: Frames,
    shape: LogShape,
    epoch: Arc<Epoch>,
    device_capacity_bytes: u64,
    begin: AtomicU64,
    /// Where the newest checkpoint's log begins (or one being taken, if
    /// lower): its pages' device space is not reused, though compaction
    /// moved `begin` past them, or recovery would read overwritten pages.
    /// `NO_CHECKPOINT` when there is none to keep.
    kept_from: AtomicU64,
    head: AtomicU64,
    safe_head: AtomicU64,
    /// Where the head should be once flushes allow it.
    head_target: AtomicU64,
    read_only: AtomicU64,
    safe_read_only: AtomicU64,
    flushed_until: AtomicU64,
    tail_address: AtomicU64,
    tail: Mutex<Tail>,
    flushing: Mutex<Flushing>,
    /// Time inside the device's write calls for flushes.
    flush_nanos: AtomicU64,
    /// A flush failure, reported to the next operation that looks.
    failure: Mutex<Option<DeviceError>>,
    /// Set once `failure` holds one.
    failed: AtomicBool,
}

/// Where a record sits, as one thread sees the boundaries now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Region {
    /// Below the begin address: gone.
    Truncated,
    OnDevice,
    /// In memory and below the safe read-only boundary: nobody writes it.
    Immutable,
    /// In memory, read-only to this thread, but an older thread may still
    /// lock it: take the record lock to read it.
    Fuzzy,
    /// In memory and updated in place under the record lock.
    Mutable,
}

impl HybridLog {
    pub fn new(
        shape: LogShape,
        epoch: Arc<Epoch>,
        device: &dyn Device,
    ) -> Result<HybridLog, DeviceError> {
        let queue = device.open_queue()?;
        Ok(HybridLog {
            frames: Frames::new(shape.page_bits, shape.frame_count),
            shape,
            epoch,
            // The device keeps the checkpoint records first, then a ring
            // of whole pages, so no page wraps.
            device_capacity_bytes: log_capacity_bytes(device.capacity_bytes(), shape.page_bits),
            begin: AtomicU64::new(0),
            kept_from: AtomicU64::new(NO_CHECKPOINT),
            head: AtomicU64::new(0),
            safe_head: AtomicU64::new(0),
            head_target: AtomicU64::new(0),
            read_only: AtomicU64::new(0),
            safe_read_only: AtomicU64::new(0),
            flushed_until: AtomicU64::new(0),
            tail_address: AtomicU64::new(FIRST_ADDRESS.value()),
            tail: Mutex::new(Tail {
                page: 0,
                offset: FIRST_ADDRESS.value(),
            }),
            flushing: Mutex::new(Flushing {
                queue,
                next_page: 0,
                completed: BTreeSet::new(),
                buffer: Vec::new(),
                finished: Finished::default(),
            }),
            flush_nanos: AtomicU64::new(0),
            failure: Mutex::new(None),
            failed: AtomicBool::new(false),
        })
    }

    fn load(word: &AtomicU64) -> LogAddress {
        LogAddress::new(word.load(Ordering::SeqCst))
    }

    pub fn begin(&self) -> LogAddress {
        Self::load(&self.begin)
    }

    /// The lowest address whose device space is still needed: the begin,
    /// or a kept checkpoint's begin below it.
    pub fn needed_from(&self) -> LogAddress {
        self.needed_from_with(|| {})
    }

    /// As [`HybridLog::needed_from`], with `between` run between its two
    /// loads (a test's checkpoint and compaction).
    ///
    /// The begin is loaded first. A first checkpoint keeps, then reads the
    /// begin again ([`HybridLog::keep_checkpoint_from_begin`]): a begin
    /// loaded here after a truncation that checkpoint missed comes after
    /// its keep, so the keep is seen. Loaded the other way round, a keep
    /// and a truncation between the two loads gave the truncated begin
    /// and no keep, and the pages of the checkpoint being taken were
    /// handed to the tail.
    pub(crate) fn needed_from_with(&self, between: impl FnOnce()) -> LogAddress {
        let begin = self.begin.load(Ordering::SeqCst);
        between();
        let kept = self.kept_from.load(Ordering::SeqCst);
        LogAddress::new(begin.min(kept))
    }

    /// A checkpoint is being taken from the log's begin, which this
    /// returns: its pages are kept from now on, beside the last one's.
    /// Called under the store's checkpoint lock: only checkpoints write
    /// the kept address, one at a time.
    ///
    /// The begin is read again after the keep: a compaction that truncated
    /// between the read and the keep could have given the pages between
    /// the two begins to the tail already (before the first checkpoint,
    /// nothing else keeps them), and a checkpoint from the older begin
    /// would then name overwritten pages. A retry keeps from the newer
    /// begin, not the older (which would hold room for pages no longer
    /// the log's). Each retry follows a truncation, and the begin never
    /// passes the tail, so the loop ends.
    pub fn keep_checkpoint_from_begin(&self) -> LogAddress {
        self.keep_checkpoint_from_begin_with(|| {})
    }

    /// As [`HybridLog::keep_checkpoint_from_begin`], with `between` run
    /// after each read of the begin and before the keep (a test's
    /// compaction).
    pub(crate) fn keep_checkpoint_from_begin_with(&self, mut between: impl FnMut()) -> LogAddress {
        let last_kept = self.kept_from.load(Ordering::SeqCst);
        let mut begin = self.begin();
        loop {
            between();
            self.kept_from
                .store(last_kept.min(begin.value()), Ordering::SeqCst);
            let now = self.begin();
            if now == begin {
                return begin;
            }
            debug_assert!(now > begin, "the begin only moves up");
            begin = now;
        }
    }

    /// A checkpoint from `begin` is durable and supersedes every earlier
    /// one: only its pages are kept.
    pub fn checkpoint_durable_from(&self, begin: LogAddress) {
        self.kept_from.store(begin.value(), Ordering::SeqCst);
    }

    /// Whether compaction has moved the begin past the kept checkpoint's:
    /// device space waits for a new checkpoint.
    pub fn checkpoint_holds_room(&self) -> bool {
        let kept = self.kept_from.load(Ordering::SeqCst);
        kept != NO_CHECKPOINT && kept < self.begin.load(Ordering::SeqCst)
    }

    pub fn head(&self) -> LogAddress {
        Self::load(&self.head)
    }

    pub fn read_only(&self) -> LogAddress {
        Self::load(&self.read_only)
    }

    pub fn tail(&self) -> LogAddress {
        Self::load(&self.tail_address)
    }

    pub fn flushed_until(&self) -> LogAddress {
        Self::load(&self.flushed_until)
    }

    fn page_start(&self, page: u64) -> LogAddress {
        LogAddress::page_start(page, self.shape.page_bits)
    }

    /// Where `address` is, as the calling (protected) thread sees it now.
    pub fn region(&self, address: LogAddress) -> Region {
        if address.is_none() || address < self.begin() {
            Region::Truncated
        } else if address < self.head() {
            Region::OnDevice
        } else if address >= self.read_only() {
            Region::Mutable
        } else if address >= Self::load(&self.safe_read_only) {
            Region::Fuzzy
        } else {
            Region::Immutable
        }
    }

    /// Where the device keeps `address`: past the checkpoint records, a
    /// ring over the log.
    pub fn device_offset(&self, address: LogAddress) -> u64 {
        ring_offset(address, self.device_capacity_bytes)
    }

    /// Reserves `bytes` at the tail. `Ok(None)` means the next page's
    /// frame is not free yet (or another thread holds the tail): refresh
    /// the epoch, poll flushes and try again. Only `Allocation::Compaction`
    /// may take the device's [`COMPACTION_RESERVE_PAGES`] before its last
    /// [`SEAL_RESERVE_PAGES`], which only a checkpoint's seal takes.
    pub fn allocate(
        self: &Arc<Self>,
        bytes: u64,
        allocation: Allocation,
    ) -> Result<Option<LogAddress>, LogError> {
        self.check_failure()?;
        let Ok(mut tail) = self.tail.try_lock() else {
            return Ok(None);
        };
        let page_bytes = 1u64 << self.shape.page_bits;
        debug_assert!(bytes <= page_bytes - FIRST_ADDRESS.value());
        // Ordinary records never land in the reserve, whoever turned the
        // page it is in: a compaction's page is not the writers' to fill.
        self.check_room(tail.page, allocation)?;
        if tail.offset + bytes > page_bytes && !self.turn_page(&mut tail, allocation)? {
            return Ok(None);
        }
        let address = self.page_start(tail.page).plus(tail.offset);
        tail.offset += bytes;
        self.tail_address
            .store(address.value() + bytes, Ordering::SeqCst);
        Ok(Some(address))
    }

    /// Refuses `allocation` a place in page `page` when the device cannot
    /// hold the log through that page, plus the reserve for an ordinary
    /// record.
    fn check_room(&self, page: u64, allocation: Allocation) -> Result<(), LogError> {
        let reserve_pages = match allocation {
            Allocation::Ordinary => ORDINARY_RESERVE_PAGES,
            Allocation::Compaction => SEAL_RESERVE_PAGES,
            Allocation::Seal => 0,
        };
        let reserve_bytes = reserve_pages << self.shape.page_bits;
        // The page must end below the address space's end: at it, the
        // next page's start wrapped to 0, and the subtraction below
        // overflowed (a panic, or in release every later write refused as
        // a full device with an absurd size); and a tail at the end itself
        // would read as address 0. Pages stop one short of it.
        let limit_bytes = 1u64 << crate::address::ADDRESS_BITS;
        let end = (page + 1) << self.shape.page_bits;
        if end >= limit_bytes {
            return Err(LogError::AddressSpaceExhausted { limit_bytes });
        }
        let needed_bytes = end - self.needed_from().value();
        if needed_bytes + reserve_bytes > self.device_capacity_bytes {
            return Err(LogError::DeviceFull {
                needed_bytes,
                capacity_bytes: self.device_capacity_bytes,
            });
        }
        Ok(())
    }

    /// Moves the tail to the next page if its frame is free; moves the
    /// boundaries behind it either way.
    fn turn_page(
        self: &Arc<Self>,
        tail: &mut Tail,
        allocation: Allocation,
    ) -> Result<bool, LogError> {
        let next = tail.page + 1;
        self.check_room(next, allocation)?;
        // Pages from `next` back keep `mutable_pages` mutable, but the
        // boundary never passes the page being left: until the turn
        // succeeds, small records may still go there, and a page must not
        // be flushed while records are still allocated in it.
        let read_only_page = (next + 1).saturating_sub(self.shape.mutable_pages);
        self.shift_read_only(read_only_page.min(tail.page))?;
        let first_kept = (next + 2).saturating_sub(self.shape.frame_count);
        self.head_target
            .fetch_max(self.page_start(first_kept).value(), Ordering::SeqCst);
        self.shift_head()?;
        let frame_free_from = (next + 1).saturating_sub(self.shape.frame_count);
        if Self::load(&self.safe_head) < self.page_start(frame_free_from) {
            return Ok(false);
        }
        self.end_page(tail);
        tail.page = next;
        tail.offset = 0;
        Ok(true)
    }

    /// Ends the tail's page and moves every page before the new tail to
    /// read-only, so that all of them are flushed: a checkpoint's fold-over.
    /// `Ok(None)`: the next frame is not free yet; refresh and try again.
    pub fn seal(self: &Arc<Self>) -> Result<Option<LogAddress>, LogError> {
        self.check_failure()?;
        let Ok(mut tail) = self.tail.try_lock() else {
            return Ok(None);
        };
        // A checkpoint may take the reserves: it turns at most one page.
        if tail.offset > 0 && !self.turn_page(&mut tail, Allocation::Seal)? {
            return Ok(None);
        }
        // The tail moves first, so that no thread sees the read-only
        // boundary above it.
        let boundary = self.page_start(tail.page);
        self.tail_address.store(boundary.value(), Ordering::SeqCst);
        self.shift_read_only(tail.page)?;
        Ok(Some(boundary))
    }

    /// Restarts the log from a checkpoint: everything from `begin` to
    /// `tail` (a page start) is on the device, nothing is in memory.
    pub fn restore(&self, begin: LogAddress, tail: LogAddress) {
        let mut tail_state = self.tail.lock().unwrap_or_else(|e| e.into_inner());
        let page = tail.page(self.shape.page_bits);
        tail_state.page = page;
        tail_state.offset = tail.offset_in_page(self.shape.page_bits);
        for boundary in [
            &self.head,
            &self.safe_head,
            &self.head_target,
            &self.read_only,
            &self.safe_read_only,
            &self.flushed_until,
            &self.tail_address,
        ] {
            boundary.store(tail.value(), Ordering::SeqCst);
        }
        self.begin.store(begin.value(), Ordering::SeqCst);
        self.kept_from.store(begin.value(), Ordering::SeqCst);
        let mut flushing = self.flushing.lock().unwrap_or_else(|e| e.into_inner());
        flushing.next_page = page;
    }

    pub fn page_bits(&self) -> u32 {
        self.shape.page_bits
    }

    /// Marks the rest of the tail's page as empty, for scans.
    fn end_page(&self, tail: &Tail) {
        let page_bytes = 1u64 << self.shape.page_bits;
        if tail.offset + 8 <= page_bytes {
            let at = self.page_start(tail.page).plus(tail.offset);
            let header = self.frames.word(at, crate::record::HEADER_WORD);
            header.store(Header::PAGE_END.0, Ordering::Release);
        }
    }

    /// Publishes a read-only boundary at the start of `page`; its pages
    /// are flushed once every thread has seen it.
    fn shift_read_only(self: &Arc<Self>, page: u64) -> Result<(), LogError> {
        let boundary = self.page_start(page).value();
        if self.read_only.fetch_max(boundary, Ordering::SeqCst) >= boundary {
            return Ok(());
        }
        let log = self.clone();
        self.epoch.bump_with(move || {
            log.safe_read_only.fetch_max(boundary, Ordering::SeqCst);
            if let Err(failure) = log.flush_until(page) {
                log.keep_failure(failure);
            }
        })?;
        Ok(())
    }

    /// Moves the head toward its target as far as completed flushes allow;
    /// frames are free once every thread has seen it.
    fn shift_head(self: &Arc<Self>) -> Result<(), LogError> {
        let target = self.head_target.load(Ordering::SeqCst);
        let boundary = target.min(self.flushed_until.load(Ordering::SeqCst));
        if self.head.fetch_max(boundary, Ordering::SeqCst) >= boundary {
            return Ok(());
        }
        let log = self.clone();
        self.epoch.bump_with(move || {
            log.safe_head.fetch_max(boundary, Ordering::SeqCst);
        })?;
        Ok(())
    }

    /// Hands every page below `page` that is not yet on its way to the device.
    fn flush_until(&self, page: u64) -> Result<(), DeviceError> {
        let mut flushing = self.flushing.lock().unwrap_or_else(|e| e.into_inner());
        let flushing = &mut *flushing;
        while flushing.next_page < page {
            let number = flushing.next_page;
            self.frames.copy_page(number, &mut flushing.buffer);
            let offset = self.device_offset(self.page_start(number));
            let (queue, buffer) = (&mut flushing.queue, &flushing.buffer);
            let (written, spent) = call_time::timed(|| queue.write(offset, buffer, number));
            self.flush_nanos
                .fetch_add(spent.as_nanos() as u64, Ordering::Relaxed);
            written?;
            flushing.next_page += 1;
        }
        Ok(())
    }

    /// Collects completed flushes and moves the head behind them. Any
    /// thread may call it; one at a time does the work.
    pub fn poll_flushes(self: &Arc<Self>) -> Result<(), LogError> {
        self.check_failure()?;
        let advanced = {
            let Ok(mut flushing) = self.flushing.try_lock() else {
                return Ok(());
            };
            let flushing = &mut *flushing;
            let finished = &mut flushing.finished;
            let polled = flushing
                .queue
                .poll(&mut |page, _| finished.push_write(page));
            let completed = &mut flushing.completed;
            finished.drain(&mut |page, _| {
                completed.insert(page);
            });
            match polled {
                // A page that did not reach the device stops the log for
                // every session, with the reason: told to one session
                // alone and forgotten, it held the head for good, and
                // every session ended stalled 30 s later.
                Err(failure @ DeviceError::RequestFailed { .. }) => {
                    self.keep_failure(failure);
                    self.check_failure()?;
                }
                // The queue's own trouble: its completions may still come
                // at a later poll.
                Err(failure) => return Err(LogError::Flush(failure)),
                Ok(_) => {}
            }
            self.advance_flushed(completed)
        };
        if advanced {
            self.shift_head()?;
        }
        Ok(())
    }

    /// Moves `flushed_until` over the completed pages that follow it.
    fn advance_flushed(&self, completed: &mut BTreeSet<u64>) -> bool {
        let mut next = self.flushed_until().page(self.shape.page_bits);
        let before = next;
        while completed.remove(&next) {
            next += 1;
        }
        self.flushed_until
            .store(self.page_start(next).value(), Ordering::SeqCst);
        next != before
    }

    /// Bytes the log can still grow (from its tail) before the device is full.
    pub fn device_room_bytes(&self) -> u64 {
        let used = self.tail().value() - self.needed_from().value();
        self.device_capacity_bytes.saturating_sub(used)
    }

    /// The device's bytes the log's ring can use.
    pub fn device_capacity_bytes(&self) -> u64 {
        self.device_capacity_bytes
    }

    pub fn flush_time(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.flush_nanos.load(Ordering::Relaxed))
    }

    /// Forgets everything below `address` (rounded down to a page): its
    /// records read as absent and its device space is reused.
    pub fn truncate_until(&self, address: LogAddress) -> Result<(), LogError> {
        let head = self.head();
        if address > head {
            return Err(LogError::TruncateAboveHead {
                wanted: address,
                head,
            });
        }
        let page = address.page(self.shape.page_bits);
        self.begin
            .fetch_max(self.page_start(page).value(), Ordering::SeqCst);
        Ok(())
    }

    fn keep_failure(&self, failure: DeviceError) {
        let mut kept = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        kept.get_or_insert(failure);
        self.failed.store(true, Ordering::Release);
    }

    /// Every append asks, so the common answer is one load, not a lock.
    fn check_failure(&self) -> Result<(), LogError> {
        if !self.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        let kept = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        match &*kept {
            Some(failure) => Err(LogError::Flush(failure.clone())),
            None => Ok(()),
        }
    }

    /// Checks the boundaries' order (debug builds call it often).
    pub fn debug_check_invariants(&self) {
        // Every boundary only moves up, and other threads move them while
        // this reads. So each is loaded before the boundary it must stay
        // below: that one, read later, can only have moved further up, and
        // the check never sees a false order.
        let begin = self.begin();
        let safe_head = Self::load(&self.safe_head);
        let head = self.head();
        let flushed = self.flushed_until();
        let safe_read_only = Self::load(&self.safe_read_only);
        let read_only = self.read_only();
        debug_assert!(safe_head <= head, "safe head {safe_head} above head {head}");
        debug_assert!(head <= flushed, "head {head} above flushed {flushed}");
        debug_assert!(
            flushed <= safe_read_only,
            "flushed {flushed} above safe read-only {safe_read_only}"
        );
        debug_assert!(safe_read_only <= read_only);
        debug_assert!(read_only <= self.tail());
        debug_assert!(begin <= head || begin.page(self.shape.page_bits) == 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::ADDRESS_BITS;
    use crate::device::memory::MemoryDevice;

    /// Turning onto the last page below 2^48 computed the next page's start
    /// as 0 and subtracted the begin from it: a panic in debug builds, and
    /// in release every write refused for good as a full device. The log's
    /// end is a typed error of its own.
    #[test]
    fn the_log_refuses_pages_at_the_end_of_its_address_space() {
        const PAGE_BITS: u32 = 12;
        let device = MemoryDevice::new(1 << 20);
        let shape = LogShape {
            page_bits: PAGE_BITS,
            frame_count: 4,
            mutable_pages: 2,
        };
        let log = HybridLog::new(shape, Arc::new(Epoch::new(4)), &device).unwrap();
        let last_page = ((1u64 << ADDRESS_BITS) >> PAGE_BITS) - 1;
        let near_end = LogAddress::page_start(last_page - 2, PAGE_BITS);
        log.restore(near_end, near_end);
        assert!(log
            .check_room(last_page - 1, Allocation::Compaction)
            .is_ok());
        assert!(matches!(
            log.check_room(last_page, Allocation::Compaction),
            Err(LogError::AddressSpaceExhausted { .. })
        ));
    }
}
