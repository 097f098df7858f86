//! Anonymous page-aligned mappings: the address ranges far-memory
//! objects live in, and aligned staging buffers for `O_DIRECT`.

use rustix::mm::{madvise, mmap_anonymous, munmap, Advice, MapFlags, ProtFlags};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

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
        let length = length.max(1).next_multiple_of(PAGE_BYTES);
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
    /// shared references. A caller must not also read the same bytes
    /// through [`Mapping::as_slice`] while it holds these (the far-memory
    /// code's own copies happen under write protection, as with any
    /// application write).
    pub fn as_atomics<W: AtomicWord>(&self) -> &[W] {
        let count = self.length / std::mem::size_of::<W>();
        // SAFETY: the start is page aligned, which satisfies W's alignment;
        // `count` words lie within the `length` bytes, which stay mapped
        // and readable for `&self`'s lifetime (pages not yet present are
        // supplied on touch); every bit pattern is a valid W; and atomics
        // allow mutation through `&`.
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
