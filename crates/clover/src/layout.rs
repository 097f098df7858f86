//! How entries lie in a memory node's region.
//!
//! An entry is `[next: u64][key: u64][value length: u32][checksum: u32]
//! [value]`, all little-endian, in a slab of its size class. Only `next`
//! ever changes after an entry is written, and only once, by the CAS that
//! appends the following version; so the checksum (CRC-32 of key, length
//! and value) lets a reader tell a whole entry from a slot being reused.
//!
//! The next pointer is one 64-bit word, so one RDMA CAS moves it:
//!
//! ```text
//! bit 63 .. 16   entry offset in the region / 8   (48 bits: 2 PiB)
//! bit 15 ..  1   version of the entry pointed to  (15 bits, wraps)
//! bit  0         committed
//! ```
//!
//! Zero is null: the tail of a version list. Offset 0 is never an entry
//! (regions start with a header), so no real pointer is zero.

use std::fmt;

pub const HEADER_BYTES: usize = 24;
/// Values from 8 bytes to 4 KiB, as the issue asks.
pub const MIN_VALUE_BYTES: usize = 8;
pub const MAX_VALUE_BYTES: usize = 4096;
/// Slab sizes: an entry goes in the smallest that holds it.
pub const SIZE_CLASSES: [usize; 7] = [64, 128, 256, 512, 1024, 2048, 8192];
const OFFSET_SHIFT: u32 = 16;
const VERSION_MASK: u64 = 0x7fff;
/// The largest region offset a pointer can name.
pub const MAX_OFFSET: u64 = ((1 << 48) - 1) << 3;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("a value of {0} bytes is outside the {MIN_VALUE_BYTES}..={MAX_VALUE_BYTES} bytes Clover stores")]
    ValueSize(usize),
    #[error("entry offset {0:#x} is not 8-byte aligned, is zero, or is past {MAX_OFFSET:#x}")]
    Offset(u64),
    #[error("{0} bytes are too few for an entry")]
    Truncated(usize),
    #[error("the entry's checksum does not match: torn or reused slot")]
    Checksum,
}

/// A version's location, version number and commit flag, packed.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct NextPointer(u64);

impl NextPointer {
    pub const NULL: NextPointer = NextPointer(0);

    pub fn new(offset: u64, version: u16, committed: bool) -> Result<NextPointer, LayoutError> {
        if offset == 0 || !offset.is_multiple_of(8) || offset > MAX_OFFSET {
            return Err(LayoutError::Offset(offset));
        }
        let version = u64::from(version) & VERSION_MASK;
        Ok(NextPointer(
            (offset >> 3) << OFFSET_SHIFT | version << 1 | u64::from(committed),
        ))
    }

    pub const fn from_word(word: u64) -> NextPointer {
        NextPointer(word)
    }

    pub const fn word(self) -> u64 {
        self.0
    }

    pub const fn is_null(self) -> bool {
        self.0 == 0
    }

    pub const fn offset(self) -> u64 {
        (self.0 >> OFFSET_SHIFT) << 3
    }

    pub const fn version(self) -> u16 {
        ((self.0 >> 1) & VERSION_MASK) as u16
    }

    pub const fn committed(self) -> bool {
        self.0 & 1 == 1
    }

    /// The version after this one, wrapping within 15 bits.
    pub const fn next_version(self) -> u16 {
        ((self.version() as u64 + 1) & VERSION_MASK) as u16
    }
}

impl fmt::Debug for NextPointer {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_null() {
            return formatter.write_str("NextPointer(null)");
        }
        write!(
            formatter,
            "NextPointer({:#x} v{}{})",
            self.offset(),
            self.version(),
            if self.committed() { " committed" } else { "" }
        )
    }
}

/// The slab size an entry holding `value_bytes` goes in.
pub fn size_class(value_bytes: usize) -> Result<usize, LayoutError> {
    if !(MIN_VALUE_BYTES..=MAX_VALUE_BYTES).contains(&value_bytes) {
        return Err(LayoutError::ValueSize(value_bytes));
    }
    let needed = HEADER_BYTES + value_bytes;
    Ok(*SIZE_CLASSES
        .iter()
        .find(|class| **class >= needed)
        .expect("the largest class holds the largest value"))
}

fn checksum(key: u64, value: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&key.to_le_bytes());
    hasher.update(&(value.len() as u32).to_le_bytes());
    hasher.update(value);
    hasher.finalize()
}

/// Writes a new entry (a tail: its next pointer null) into `slot`, which
/// must be at least its size class. Returns the bytes used.
pub fn encode_entry(key: u64, value: &[u8], slot: &mut [u8]) -> Result<usize, LayoutError> {
    size_class(value.len())?;
    let length = HEADER_BYTES + value.len();
    if slot.len() < length {
        return Err(LayoutError::Truncated(slot.len()));
    }
    slot[0..8].copy_from_slice(&NextPointer::NULL.word().to_le_bytes());
    slot[8..16].copy_from_slice(&key.to_le_bytes());
    slot[16..20].copy_from_slice(&(value.len() as u32).to_le_bytes());
    slot[20..24].copy_from_slice(&checksum(key, value).to_le_bytes());
    slot[HEADER_BYTES..length].copy_from_slice(value);
    Ok(length)
}

/// An entry as read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    pub next: NextPointer,
    pub key: u64,
    pub value: &'a [u8],
}

/// Reads an entry, checking its length and checksum. `bytes` may run past
/// the entry (a READ of a whole size class).
pub fn decode_entry(bytes: &[u8]) -> Result<Entry<'_>, LayoutError> {
    if bytes.len() < HEADER_BYTES {
        return Err(LayoutError::Truncated(bytes.len()));
    }
    let word = |range: std::ops::Range<usize>| {
        bytes[range]
            .iter()
            .rev()
            .fold(0u64, |value, byte| value << 8 | u64::from(*byte))
    };
    let next = NextPointer::from_word(word(0..8));
    let key = word(8..16);
    let length = word(16..20) as usize;
    let stored = word(20..24) as u32;
    if !(MIN_VALUE_BYTES..=MAX_VALUE_BYTES).contains(&length) {
        return Err(LayoutError::ValueSize(length));
    }
    if bytes.len() < HEADER_BYTES + length {
        return Err(LayoutError::Truncated(bytes.len()));
    }
    let value = &bytes[HEADER_BYTES..HEADER_BYTES + length];
    if checksum(key, value) != stored {
        return Err(LayoutError::Checksum);
    }
    Ok(Entry { next, key, value })
}
