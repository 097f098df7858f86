//! Logical addresses in the hybrid log.
//!
//! The log is one sequence of bytes that only grows at its tail. A record
//! is named by where it starts in that sequence, a [`LogAddress`]. Pages
//! of the sequence live in a circular buffer of memory frames while they
//! are near the tail, and on the device once flushed; the address does not
//! change when a record moves from one to the other.

use std::fmt;

/// Bits an address may use: it shares an index entry's 64 bits with a tag
/// and a tentative bit.
pub const ADDRESS_BITS: u32 = 48;

/// The first address a record can have. Address 0 means "none" in index
/// entries and in records' previous-address fields, so the log starts a
/// little past it, as FASTER's does.
pub const FIRST_ADDRESS: LogAddress = LogAddress(64);

/// A byte position in the hybrid log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct LogAddress(u64);

impl LogAddress {
    /// No record: the end of every chain.
    pub const NONE: LogAddress = LogAddress(0);

    const MASK: u64 = (1 << ADDRESS_BITS) - 1;

    /// An address from its 48 bits; higher bits are dropped.
    pub const fn new(value: u64) -> LogAddress {
        LogAddress(value & Self::MASK)
    }

    pub const fn value(self) -> u64 {
        self.0
    }

    pub const fn is_none(self) -> bool {
        self.0 == 0
    }

    /// The page this address falls in, for pages of `1 << page_bits` bytes.
    pub const fn page(self, page_bits: u32) -> u64 {
        self.0 >> page_bits
    }

    pub const fn offset_in_page(self, page_bits: u32) -> u64 {
        self.0 & ((1 << page_bits) - 1)
    }

    /// Bytes from this address to its page's end.
    pub const fn bytes_to_page_end(self, page_bits: u32) -> u64 {
        (1 << page_bits) - self.offset_in_page(page_bits)
    }

    /// The first address of page `page`.
    pub const fn page_start(page: u64, page_bits: u32) -> LogAddress {
        LogAddress::new(page << page_bits)
    }

    pub const fn plus(self, bytes: u64) -> LogAddress {
        LogAddress::new(self.0 + bytes)
    }
}

impl fmt::Display for LogAddress {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{:#x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_and_offsets_split_an_address() {
        let address = LogAddress::new((5 << 16) + 40);
        assert_eq!(address.page(16), 5);
        assert_eq!(address.offset_in_page(16), 40);
        assert_eq!(address.bytes_to_page_end(16), (1 << 16) - 40);
        assert_eq!(LogAddress::page_start(5, 16).plus(40), address);
    }

    #[test]
    fn an_address_keeps_only_its_48_bits() {
        assert_eq!(LogAddress::new(u64::MAX).value(), (1 << 48) - 1);
    }
}
