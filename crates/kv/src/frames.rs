//! The memory frames that hold the log's in-memory pages: one block of
//! `frame_count` pages, aligned for `O_DIRECT`, shared by every thread.
//!
//! This is the crate's only unsafe code. Threads share the frames without
//! a lock, so the frames hand out raw access under a contract that the
//! log's protocol keeps:
//!
//! 1. **Liveness.** An address is read or written only by a thread that
//!    holds epoch protection and saw the address at or above the log's
//!    head in that protected section. A frame is reused only after every
//!    such thread has refreshed (the head's epoch action), so the bytes
//!    belong to that address for the whole access.
//! 2. **Immutable parts.** A record's key and sizes are written once, by
//!    the thread that allocated it, before the record is published with a
//!    release compare-and-swap on its index entry; readers reach it
//!    through an acquire load of that entry (or of a later record's
//!    previous-address, itself published the same way).
//! 3. **Mutable values.** A value is changed in place only while its
//!    record's lock bit is held, and only in the mutable region. Readers
//!    of the mutable region take the same lock. Below the read-only
//!    boundary nobody writes, so readers need no lock there; a page is
//!    flushed only once every thread has seen the boundary pass it.
//!
//! Words that threads update concurrently (record headers, value lengths)
//! are accessed only as atomics through [`Frames::word`], and a page is
//! copied out for a flush with atomic loads ([`Frames::copy_page`]).

use crate::address::LogAddress;
use std::alloc::{alloc, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

/// Frames are aligned for direct I/O on any device this machine has.
pub const FRAME_ALIGNMENT_BYTES: usize = 4096;

/// A transparent huge page on x86-64 and most arm64 kernels.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// Asks the kernel to back the whole huge pages inside `[start, start +
/// length)` with transparent huge pages, before they are first touched:
/// the index and the frames are touched at random, and with 4 KiB pages
/// a store of millions of keys misses the TLB on nearly every operation.
/// Advice only: a kernel that says no (THP off) leaves the memory as it
/// was, so the answer is ignored.
pub(crate) fn advise_huge_pages(start: *const u8, length: usize) {
    let first = (start as usize).next_multiple_of(HUGE_PAGE_BYTES);
    let end = (start as usize + length) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
    if end <= first {
        return;
    }
    // SAFETY: MADV_HUGEPAGE changes how the range is backed, never its
    // contents or whether it is mapped; the range lies inside memory this
    // process allocated and still owns. (Miri has no madvise.)
    #[cfg(not(miri))]
    unsafe {
        libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE);
    }
}

/// Starts loading the cache line at `pointer` into every cache level;
/// nothing on targets without a prefetch instruction.
pub(crate) fn prefetch_line(pointer: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: PREFETCHT0 is a hint: it dereferences nothing the program
    // can observe and never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(pointer.cast());
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = pointer;
}

pub struct Frames {
    base: NonNull<u8>,
    layout: Layout,
    page_bits: u32,
    frame_count: u64,
}

// SAFETY: the frames are plain bytes; every access goes through the
// module's contract above, which the log's epoch and lock protocol keeps,
// so sharing them between threads is sound.
unsafe impl Send for Frames {}
// SAFETY: as for Send.
unsafe impl Sync for Frames {}

impl Frames {
    /// Zeroed frames. Panics only if the allocator fails, as `Vec` does.
    pub fn new(page_bits: u32, frame_count: u64) -> Frames {
        let bytes = (frame_count << page_bits) as usize;
        let layout = Layout::from_size_align(bytes, FRAME_ALIGNMENT_BYTES)
            .expect("frame sizes are checked by the store's config");
        assert!(bytes > 0, "the store's config refuses empty frames");
        // SAFETY: the layout has a non-zero size (asserted above).
        let base = unsafe { alloc(layout) };
        let base = NonNull::new(base).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        // Advised before the zeroing below touches the pages (an aligned
        // `alloc_zeroed` would zero them first, on small pages).
        advise_huge_pages(base.as_ptr(), bytes);
        // SAFETY: `base` is a fresh allocation of `bytes` bytes.
        unsafe { base.as_ptr().write_bytes(0, bytes) };
        Frames {
            base,
            layout,
            page_bits,
            frame_count,
        }
    }

    pub fn page_bytes(&self) -> usize {
        1 << self.page_bits
    }

    /// Where `address` lives in the block: its page's frame, its offset.
    fn position(&self, address: LogAddress, length: usize) -> usize {
        let frame = address.page(self.page_bits) % self.frame_count;
        let offset = address.offset_in_page(self.page_bits) as usize;
        assert!(
            offset + length <= self.page_bytes(),
            "{length} bytes at {address} cross a page end; records never do"
        );
        ((frame << self.page_bits) as usize) + offset
    }

    /// The 8-byte word `word` of the record at `address`, as an atomic.
    pub fn word(&self, address: LogAddress, word: usize) -> &AtomicU64 {
        let at = self.position(address, 8 * (word + 1)) + 8 * word;
        assert_eq!(at % 8, 0, "records are 8-byte aligned");
        // SAFETY: `at + 8` is inside the block (position checks the page
        // bounds), the pointer is 8-aligned (checked) and the block lives
        // as long as `self`. AtomicU64 has u64's layout; header and length
        // words are only ever accessed through this function, atomically.
        unsafe { &*(self.base.as_ptr().add(at) as *const AtomicU64) }
    }

    /// Asks the CPU to bring the cache line holding `address` in, without
    /// waiting for it. Safe for any address, even one whose frame was
    /// reused since it was seen: a prefetch reads nothing the program
    /// sees and cannot fault, and the position is always inside the block.
    pub fn prefetch(&self, address: LogAddress) {
        prefetch_line(self.base.as_ptr().wrapping_add(self.position(address, 0)));
    }

    /// The bytes `length` long at `address`.
    ///
    /// # Safety
    /// Nobody writes these bytes while the slice lives (module contract,
    /// points 1 and 3).
    pub unsafe fn bytes(&self, address: LogAddress, length: usize) -> &[u8] {
        let at = self.position(address, length);
        // SAFETY: in bounds (position), alive as long as `self`, and the
        // caller promises no concurrent writer.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(at), length) }
    }

    /// Writes `data` at `address`.
    ///
    /// # Safety
    /// The caller has these bytes to itself: it allocated the record and
    /// has not published it, or it holds the record's lock and nobody
    /// reads them without it (module contract, points 2 and 3).
    pub unsafe fn write(&self, address: LogAddress, data: &[u8]) {
        let at = self.position(address, data.len());
        // SAFETY: in bounds (position) and exclusive (the caller's promise);
        // `data` cannot overlap the frames since the caller cannot hold a
        // slice of bytes it is writing.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.as_ptr().add(at), data.len())
        }
    }

    /// Copies page `page` into `out` word by word with atomic loads. A
    /// page is flushed once nobody changes its values, but a thread that
    /// still saw it above the safe read-only boundary may toggle a
    /// record's lock bit; atomic loads make that a benign race, and the
    /// device copy masks the bit.
    pub fn copy_page(&self, page: u64, out: &mut Vec<u8>) {
        let start = LogAddress::page_start(page, self.page_bits);
        out.clear();
        out.reserve(self.page_bytes());
        for word in 0..self.page_bytes() / 8 {
            let value = self
                .word(start, word)
                .load(std::sync::atomic::Ordering::Relaxed);
            out.extend_from_slice(&value.to_le_bytes());
        }
    }
}

impl Drop for Frames {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { dealloc(self.base.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn addresses_a_frame_count_apart_share_a_frame() {
        let frames = Frames::new(12, 2);
        let early = LogAddress::new(64);
        let late = LogAddress::new(64 + 2 * 4096);
        frames.word(early, 0).store(7, Ordering::Relaxed);
        assert_eq!(frames.word(late, 0).load(Ordering::Relaxed), 7);
        // SAFETY: single-threaded test.
        unsafe { frames.write(late.plus(8), b"remora") };
        // SAFETY: single-threaded test.
        assert_eq!(unsafe { frames.bytes(early.plus(8), 6) }, b"remora");
    }

    #[test]
    #[should_panic(expected = "cross a page end")]
    fn an_access_across_a_page_end_is_refused() {
        let frames = Frames::new(12, 2);
        // SAFETY: single-threaded test; the call panics before any access.
        let _ = unsafe { frames.bytes(LogAddress::new(4090), 8) };
    }
}
