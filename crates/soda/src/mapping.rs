//! Anonymous page-aligned mappings: the address ranges far-memory
//! objects live in, and aligned staging buffers for `O_DIRECT`.

use rustix::fd::AsRawFd;
use rustix::mm::{madvise, mmap_anonymous, munmap, Advice, MapFlags, ProtFlags};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

mod sealed {
    pub trait Sealed {}
}

/// Atomic integers a mapping can be seen as: each has its integer's size
/// and bit validity (every bit pattern, the kernel's zero pages included,
/// is a value), an alignment of at most a page, and no drop.
pub trait AtomicWord: sealed::Sealed + Send + Sync + 'static {}
impl sealed::Sealed for AtomicU32 {}
impl AtomicWord for AtomicU32 {}
impl sealed::Sealed for AtomicU64 {}
impl AtomicWord for AtomicU64 {}

pub const PAGE_BYTES: usize = 4096;

pub struct Mapping {
    start: NonNull<u8>,
    length: usize,
}

// SAFETY: a Mapping is plain memory; who may touch it when is governed by
// the borrows its users hand out.
unsafe impl Send for Mapping {}
// SAFETY: as above; shared access only reads through `&`.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Reserves `length` bytes (rounded up to pages), not yet backed: the
    /// kernel gives pages on first touch, or userfaultfd does.
    pub fn new(length: usize) -> rustix::io::Result<Mapping> {
        let length = length
            .max(1)
            .checked_next_multiple_of(PAGE_BYTES)
            .ok_or(rustix::io::Errno::NOMEM)?;
        // SAFETY: a fresh private anonymous mapping at an address the
        // kernel picks aliases nothing.
        let pointer = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                length,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::PRIVATE | MapFlags::NORESERVE,
            )
        }?;
        let start = NonNull::new(pointer.cast::<u8>()).expect("mmap never returns null on success");
        Ok(Mapping { start, length })
    }

    pub fn address(&self) -> usize {
        self.start.as_ptr() as usize
    }

    pub fn len(&self) -> usize {
        self.length
    }

    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping is `length` readable bytes for its lifetime;
        // pages not yet present are supplied on touch (by the kernel or by
        // a userfaultfd handler that serves every registered range).
        unsafe { std::slice::from_raw_parts(self.start.as_ptr(), self.length) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.start.as_ptr(), self.length) }
    }

    /// The mapping as atomic words, which threads update in place through
    /// shared references.
    ///
    /// # Safety
    /// No view of the same bytes as plain bytes ([`Mapping::as_slice`],
    /// [`Mapping::as_mut_slice`]) may be alive while these are: a store
    /// through a word under a live `&[u8]` is undefined behaviour. (Safe,
    /// as it was, it let safe code do just that; found by reading.) The
    /// far-memory code's own copies happen under write protection, as with
    /// any application write.
    pub unsafe fn as_atomics<W: AtomicWord>(&self) -> &[W] {
        let count = self.length / std::mem::size_of::<W>();
        // SAFETY: the start is page aligned, which satisfies W's alignment;
        // `count` words lie within the `length` bytes, which stay mapped
        // and readable for `&self`'s lifetime (pages not yet present are
        // supplied on touch); every bit pattern is a valid W; atomics
        // allow mutation through `&`; and the caller promises no byte
        // view of them is alive.
        unsafe { std::slice::from_raw_parts(self.start.as_ptr().cast::<W>(), count) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping came from mmap with this length and no
        // borrow of it outlives `self`.
        let result = unsafe { munmap(self.start.as_ptr().cast(), self.length) };
        debug_assert!(result.is_ok(), "munmap of our own mapping failed");
    }
}

/// Copies `into.len()` bytes from `address` in this process.
///
/// # Safety
/// The range must be mapped and readable, and no thread may write it
/// during the copy (the far-memory code write-protects a chunk first).
pub unsafe fn copy_out(address: usize, into: &mut [u8]) {
    // SAFETY: the caller promises the range is readable and unwritten.
    unsafe { std::ptr::copy_nonoverlapping(address as *const u8, into.as_mut_ptr(), into.len()) }
}

/// Drops the pages of a page-aligned range of an anonymous mapping.
///
/// # Safety
/// The range must lie in a private anonymous mapping that stays mapped.
pub unsafe fn drop_range(address: usize, length: usize) -> rustix::io::Result<()> {
    debug_assert!(address.is_multiple_of(PAGE_BYTES));
    // SAFETY: the caller promises the range is ours; dropping pages of a
    // private anonymous mapping only makes the next touch fault.
    unsafe {
        madvise(
            address as *mut std::ffi::c_void,
            length,
            Advice::LinuxDontNeed,
        )
    }
}

/// Set once the kernel refused `MADV_DONTNEED` through `process_madvise`
/// (kernels before 6.13 take only a few kinds of advice there), so later
/// batches go range by range without asking again.
static BATCHED_DROP_REFUSED: AtomicBool = AtomicBool::new(false);

/// Drops the pages of several page-aligned ranges, as [`drop_range`] does
/// each. Where the kernel takes `MADV_DONTNEED` through `process_madvise`,
/// all the ranges go in one call, and from Linux 6.16 that call shoots
/// down the other CPUs' TLBs once for them all. The shootdown is an IPI
/// that waits for the other CPU, and in a VM each IPI is a VM exit: on this
/// machine one 64 KiB range cost 17 µs alone and 2.3 µs in a batch of 16
/// (`crates/soda/examples/drop_cost.rs`). Elsewhere the ranges are dropped
/// one by one.
///
/// # Safety
/// Every range must lie in a private anonymous mapping that stays mapped.
pub unsafe fn drop_ranges(ranges: &[(usize, usize)]) -> rustix::io::Result<()> {
    let mut dropped_bytes = 0;
    if ranges.len() > 1 && !BATCHED_DROP_REFUSED.load(Ordering::Relaxed) {
        // SAFETY: the caller's promise, passed on.
        match unsafe { drop_ranges_in_one_call(ranges) } {
            Ok(bytes) => dropped_bytes = bytes,
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS | rustix::io::Errno::PERM) => {
                BATCHED_DROP_REFUSED.store(true, Ordering::Relaxed);
            }
            // Anything else (no descriptor for the pidfd: EMFILE, ENFILE;
            // ENOMEM) fails this batch only: its ranges go one by one
            // below. (Returned, nothing was dropped while the chunks were
            // counted as evicted, and the buffer's bound was not kept.)
            Err(_) => {}
        }
    }
    // The kernel may stop part way (it returns the bytes it advised, in
    // order); whatever it left is dropped range by range.
    for (address, length) in remaining_after(ranges, dropped_bytes) {
        // SAFETY: the caller's promise; what is left of a page-aligned
        // range after whole pages is page aligned.
        unsafe { drop_range(address, length) }?;
    }
    Ok(())
}

/// The parts of `ranges` after their first `advised_bytes`, taken in order.
fn remaining_after(ranges: &[(usize, usize)], mut advised_bytes: usize) -> Vec<(usize, usize)> {
    let mut left = Vec::with_capacity(ranges.len());
    for &(address, length) in ranges {
        let skipped = advised_bytes.min(length);
        advised_bytes -= skipped;
        if skipped < length {
            left.push((address + skipped, length - skipped));
        }
    }
    left
}

/// One `process_madvise(MADV_DONTNEED)` over `ranges` in this process;
/// the bytes it advised.
///
/// # Safety
/// As [`drop_ranges`].
unsafe fn drop_ranges_in_one_call(ranges: &[(usize, usize)]) -> rustix::io::Result<usize> {
    // Opened per call, not kept: a kept descriptor would name the parent
    // in a forked child, which would then drop its parent's pages.
    let process = rustix::process::pidfd_open(
        rustix::process::getpid(),
        rustix::process::PidfdFlags::empty(),
    )?;
    let vectors: Vec<libc::iovec> = ranges
        .iter()
        .map(|&(address, length)| {
            debug_assert!(address.is_multiple_of(PAGE_BYTES));
            libc::iovec {
                iov_base: address as *mut libc::c_void,
                iov_len: length,
            }
        })
        .collect();
    // SAFETY: `vectors` is `len` valid iovecs for the call's duration; the
    // caller promises each range is ours, and dropping pages of a private
    // anonymous mapping only makes the next touch fault.
    let advised = unsafe {
        libc::syscall(
            libc::SYS_process_madvise,
            process.as_raw_fd(),
            vectors.as_ptr(),
            vectors.len(),
            libc::MADV_DONTNEED,
            0u32,
        )
    };
    if advised < 0 {
        return Err(rustix::io::Errno::from_raw_os_error(
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        ));
    }
    Ok(advised as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK_BYTES: usize = 4 * PAGE_BYTES;

    fn filled(chunks: usize) -> Mapping {
        let mut mapping = Mapping::new(chunks * CHUNK_BYTES).expect("a mapping");
        mapping.as_mut_slice().fill(0xab);
        mapping
    }

    fn chunk(mapping: &Mapping, index: usize) -> &[u8] {
        &mapping.as_slice()[index * CHUNK_BYTES..(index + 1) * CHUNK_BYTES]
    }

    #[test]
    fn dropping_ranges_together_empties_those_and_keeps_the_rest() {
        let mapping = filled(5);
        let ranges: Vec<(usize, usize)> = [0, 2, 3]
            .iter()
            .map(|index| (mapping.address() + index * CHUNK_BYTES, CHUNK_BYTES))
            .collect();
        // SAFETY: the ranges lie in `mapping`, which stays mapped.
        unsafe { drop_ranges(&ranges) }.expect("dropping our own pages");
        for index in 0..5 {
            let expected = if [0, 2, 3].contains(&index) { 0 } else { 0xab };
            assert!(
                chunk(&mapping, index).iter().all(|byte| *byte == expected),
                "chunk {index}"
            );
        }
    }

    #[test]
    fn a_batch_the_kernel_advised_only_in_part_is_finished_range_by_range() {
        let ranges = [(0x10000, 0x4000), (0x20000, 0x4000), (0x30000, 0x4000)];
        assert_eq!(remaining_after(&ranges, 0), ranges.to_vec());
        // Stopped one page into the second range.
        assert_eq!(
            remaining_after(&ranges, 0x5000),
            vec![(0x21000, 0x3000), (0x30000, 0x4000)]
        );
        assert_eq!(remaining_after(&ranges, 0x8000), vec![(0x30000, 0x4000)]);
        assert_eq!(remaining_after(&ranges, 0xc000), vec![]);
    }
}
