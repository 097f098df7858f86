//! The record layout, the same in memory and on the device:
//!
//! ```text
//! word 0  header: previous address (48 bits), tombstone, invalid, locked, page end
//! word 1  key length (low 32 bits), value capacity (high 32 bits)
//! word 2  value length (low 32 bits)
//! then    the key, padded to 8 bytes; the value's capacity, padded to 8 bytes
//! ```
//!
//! A record never crosses a page. A page whose last record leaves room
//! ends with a header that has the page-end bit, so a scan of the log
//! (recovery) knows to skip to the next page.

use crate::address::{LogAddress, ADDRESS_BITS};
use crate::frames::Frames;
use std::sync::atomic::Ordering;

pub const HEADER_WORD: usize = 0;
pub const SIZES_WORD: usize = 1;
pub const VALUE_LENGTH_WORD: usize = 2;
pub const KEY_OFFSET_BYTES: u64 = 24;

/// Keys and values are each at most this long.
pub const MAX_KEY_BYTES: usize = 4096;
pub const MAX_VALUE_BYTES: usize = 4096;

const TOMBSTONE: u64 = 1 << 48;
const INVALID: u64 = 1 << 49;
const LOCKED: u64 = 1 << 50;
const PAGE_END: u64 = 1 << 51;
const PREVIOUS_MASK: u64 = (1 << ADDRESS_BITS) - 1;

pub const fn padded(bytes: u64) -> u64 {
    (bytes + 7) & !7
}

/// Bytes a record of this key length and value capacity takes.
pub const fn record_bytes(key_length: usize, value_capacity: usize) -> u64 {
    KEY_OFFSET_BYTES + padded(key_length as u64) + padded(value_capacity as u64)
}

/// A record's header word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header(pub u64);

impl Header {
    pub fn new(previous: LogAddress, tombstone: bool) -> Header {
        let bit = if tombstone { TOMBSTONE } else { 0 };
        Header(previous.value() | bit)
    }

    pub const PAGE_END: Header = Header(PAGE_END);

    pub fn previous(self) -> LogAddress {
        LogAddress::new(self.0 & PREVIOUS_MASK)
    }

    pub fn is_tombstone(self) -> bool {
        self.0 & TOMBSTONE != 0
    }

    pub fn is_invalid(self) -> bool {
        self.0 & INVALID != 0
    }

    pub fn is_page_end(self) -> bool {
        self.0 & PAGE_END != 0
    }
}

/// Set in every record's sizes word: memory no record was written to
/// reads zero, and a page whose write was lost (fresh far memory, say)
/// would otherwise read as records of an empty key, which recovery took
/// for data.
const WRITTEN: u64 = 1 << 63;

/// Key length and value capacity, from word 1.
pub fn sizes(word: u64) -> (usize, usize) {
    let capacity = (word & !WRITTEN) >> 32;
    ((word & 0xffff_ffff) as usize, capacity as usize)
}

pub fn sizes_word(key_length: usize, value_capacity: usize) -> u64 {
    debug_assert!(value_capacity <= MAX_VALUE_BYTES);
    key_length as u64 | ((value_capacity as u64) << 32) | WRITTEN
}

/// A record in the memory frames. Made only by the log, for an address
/// it has checked against the head under epoch protection.
pub struct MemoryRecord<'a> {
    frames: &'a Frames,
    address: LogAddress,
}

impl<'a> MemoryRecord<'a> {
    /// # Safety
    /// The frames contract's point 1 holds for `address` while the record
    /// lives, and the record at `address` is published (point 2).
    pub unsafe fn new(frames: &'a Frames, address: LogAddress) -> MemoryRecord<'a> {
        MemoryRecord { frames, address }
    }

    pub fn header(&self) -> Header {
        Header(
            self.frames
                .word(self.address, HEADER_WORD)
                .load(Ordering::Acquire),
        )
    }

    fn sizes(&self) -> (usize, usize) {
        sizes(
            self.frames
                .word(self.address, SIZES_WORD)
                .load(Ordering::Acquire),
        )
    }

    pub fn value_capacity(&self) -> usize {
        self.sizes().1
    }

    pub fn key(&self) -> &'a [u8] {
        let (key_length, _) = self.sizes();
        // SAFETY: the key is immutable once published (point 2), and the
        // constructor's caller guarantees liveness (point 1).
        unsafe {
            self.frames
                .bytes(self.address.plus(KEY_OFFSET_BYTES), key_length)
        }
    }

    fn value_at(&self) -> LogAddress {
        let (key_length, _) = self.sizes();
        self.address
            .plus(KEY_OFFSET_BYTES + padded(key_length as u64))
    }

    fn value_length(&self) -> usize {
        let word = self.frames.word(self.address, VALUE_LENGTH_WORD);
        (word.load(Ordering::Acquire) & 0xffff_ffff) as usize
    }

    /// Copies the value out.
    ///
    /// # Safety
    /// Nobody changes the value meanwhile: the caller holds the lock, or
    /// the record is below the read-only boundary it saw (point 3).
    pub unsafe fn copy_value(&self, out: &mut Vec<u8>) {
        out.clear();
        // SAFETY: the caller's promise.
        out.extend_from_slice(unsafe { self.frames.bytes(self.value_at(), self.value_length()) });
    }

    /// Replaces the value in place; it must fit the capacity.
    ///
    /// # Safety
    /// The caller holds the record's lock in the mutable region (point 3).
    pub unsafe fn set_value(&self, value: &[u8]) {
        assert!(value.len() <= self.value_capacity());
        // SAFETY: the caller's promise.
        unsafe { self.frames.write(self.value_at(), value) };
        self.frames
            .word(self.address, VALUE_LENGTH_WORD)
            .store(value.len() as u64, Ordering::Release);
    }

    /// Sets the tombstone bit (a delete in the mutable region, under the lock).
    pub fn mark_tombstone(&self, tombstone: bool) {
        let word = self.frames.word(self.address, HEADER_WORD);
        if tombstone {
            word.fetch_or(TOMBSTONE, Ordering::AcqRel);
        } else {
            word.fetch_and(!TOMBSTONE, Ordering::AcqRel);
        }
    }

    /// Marks a record whose publication lost its race: nothing points at
    /// it, and a recovery scan skips it.
    pub fn mark_invalid(&self) {
        let word = self.frames.word(self.address, HEADER_WORD);
        word.fetch_or(INVALID, Ordering::AcqRel);
    }

    /// Spins for the record's lock; `unlock` releases it. Holders do a
    /// bounded copy, so the wait is short.
    pub fn lock(&self) {
        let word = self.frames.word(self.address, HEADER_WORD);
        loop {
            let now = word.fetch_or(LOCKED, Ordering::Acquire);
            if now & LOCKED == 0 {
                return;
            }
            while word.load(Ordering::Relaxed) & LOCKED != 0 {
                std::hint::spin_loop();
            }
        }
    }

    pub fn unlock(&self) {
        let word = self.frames.word(self.address, HEADER_WORD);
        word.fetch_and(!LOCKED, Ordering::Release);
    }
}

/// Writes a fresh record at `address`, which the caller has just
/// allocated and not published.
///
/// # Safety
/// The bytes are the caller's alone (frames contract, point 2).
pub unsafe fn write_new(
    frames: &Frames,
    address: LogAddress,
    header: Header,
    key: &[u8],
    value: &[u8],
    value_capacity: usize,
) {
    frames
        .word(address, HEADER_WORD)
        .store(header.0, Ordering::Relaxed);
    let sizes = sizes_word(key.len(), value_capacity);
    frames
        .word(address, SIZES_WORD)
        .store(sizes, Ordering::Relaxed);
    let length = value.len() as u64;
    frames
        .word(address, VALUE_LENGTH_WORD)
        .store(length, Ordering::Relaxed);
    let key_at = address.plus(KEY_OFFSET_BYTES);
    // SAFETY: the caller's promise covers the whole record.
    unsafe {
        frames.write(key_at, key);
        frames.write(key_at.plus(padded(key.len() as u64)), value);
    }
}

/// A record as read back from the device: a copy, so no rules apply.
#[derive(Debug)]
pub struct StoredRecord<'a> {
    pub header: Header,
    pub key: &'a [u8],
    pub value: &'a [u8],
}

/// What a device read of a record's first bytes shows.
#[derive(Debug)]
pub enum Parsed<'a> {
    Whole(StoredRecord<'a>),
    /// The record is longer than what was read: read this many bytes.
    Needs(usize),
    /// The bytes are not a record: the log or the device is corrupt.
    Corrupt(&'static str),
}

pub fn parse_stored(bytes: &[u8]) -> Parsed<'_> {
    if bytes.len() < KEY_OFFSET_BYTES as usize {
        return Parsed::Needs(KEY_OFFSET_BYTES as usize);
    }
    let word = |index: usize| {
        let at = 8 * index;
        u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
    };
    let header = Header(word(HEADER_WORD) & !LOCKED);
    if header.is_page_end() {
        return Parsed::Corrupt("a chain points at a page end");
    }
    if word(SIZES_WORD) & WRITTEN == 0 {
        return Parsed::Corrupt("no record was written here (a lost write)");
    }
    let (key_length, capacity) = sizes(word(SIZES_WORD));
    let value_length = (word(VALUE_LENGTH_WORD) & 0xffff_ffff) as usize;
    if key_length > MAX_KEY_BYTES || capacity > MAX_VALUE_BYTES || value_length > capacity {
        return Parsed::Corrupt("record sizes out of range");
    }
    let total = record_bytes(key_length, capacity) as usize;
    if bytes.len() < total {
        return Parsed::Needs(total);
    }
    let key_at = KEY_OFFSET_BYTES as usize;
    let value_at = key_at + padded(key_length as u64) as usize;
    Parsed::Whole(StoredRecord {
        header,
        key: &bytes[key_at..key_at + key_length],
        value: &bytes[value_at..value_at + value_length],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_written_to_memory_parses_back_from_its_bytes() {
        let frames = Frames::new(12, 1);
        let at = LogAddress::new(64);
        let header = Header::new(LogAddress::new(128), false);
        // SAFETY: single-threaded test.
        unsafe { write_new(&frames, at, header, b"key", b"value", 16) };
        let size = record_bytes(3, 16) as usize;
        // SAFETY: single-threaded test.
        let bytes = unsafe { frames.bytes(at, size) }.to_vec();
        match parse_stored(&bytes[..30]) {
            Parsed::Needs(total) => assert_eq!(total, size),
            other => panic!("expected a request for more bytes, got {other:?}"),
        }
        let Parsed::Whole(record) = parse_stored(&bytes) else {
            panic!("whole record expected")
        };
        assert_eq!(record.key, b"key");
        assert_eq!(record.value, b"value");
        assert_eq!(record.header.previous(), LogAddress::new(128));
    }

    #[test]
    fn nonsense_sizes_are_corrupt_not_a_panic() {
        let mut bytes = vec![0u8; 64];
        bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(parse_stored(&bytes), Parsed::Corrupt(_)));
    }
}
