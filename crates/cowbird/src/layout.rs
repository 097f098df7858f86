//! The bytes both sides agree on: one instance's block of compute-node
//! host memory (Figure 4), the request metadata entry (Table 3) and the
//! request id.
//!
//! ```text
//! [0, 16)    client words, read by the engine in one READ:
//!            metadata tail (entries issued), request-data tail (bytes)
//! [64, 88)   engine words, written by the engine in one WRITE:
//!            metadata head (entries fetched), read progress, write progress
//! [128, ..)  request metadata ring: entries of 32 bytes
//!            request data ring (write payloads)
//!            response data ring (read payloads)
//! ```
//!
//! Counters only grow; ring positions are counters modulo the ring size.
//! Progress words hold the sequence number of the last completed request
//! of each type: requests of one type complete in order.

use std::fmt;

pub const CLIENT_WORDS_AT: u64 = 0;
pub const CLIENT_WORDS_BYTES: u32 = 16;
pub const METADATA_TAIL_AT: u64 = CLIENT_WORDS_AT;
pub const REQUEST_DATA_TAIL_AT: u64 = CLIENT_WORDS_AT + 8;
pub const ENGINE_WORDS_AT: u64 = 64;
pub const ENGINE_WORDS_BYTES: u32 = 24;
pub const METADATA_HEAD_AT: u64 = ENGINE_WORDS_AT;
pub const READ_PROGRESS_AT: u64 = ENGINE_WORDS_AT + 8;
pub const WRITE_PROGRESS_AT: u64 = ENGINE_WORDS_AT + 16;
pub const METADATA_RING_AT: u64 = 128;
pub const ENTRY_BYTES: u64 = 32;
/// The largest single request: responses are packed into the engine's
/// staging buffer, which holds a batch of these.
pub const MAX_REQUEST_BYTES: u32 = 4096;

/// Ring sizes of one instance (one application thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingSizes {
    pub metadata_entries: u64,
    pub request_data_bytes: u64,
    pub response_data_bytes: u64,
}

impl RingSizes {
    pub const DEFAULT: RingSizes = RingSizes {
        metadata_entries: 1024,
        request_data_bytes: 256 * 1024,
        response_data_bytes: 256 * 1024,
    };

    /// Whether every ring can hold at least one largest request.
    pub fn is_valid(&self) -> bool {
        self.metadata_entries >= 2
            && self.request_data_bytes >= u64::from(MAX_REQUEST_BYTES)
            && self.response_data_bytes >= u64::from(MAX_REQUEST_BYTES)
    }

    pub fn request_data_at(&self) -> u64 {
        METADATA_RING_AT + self.metadata_entries * ENTRY_BYTES
    }

    pub fn response_data_at(&self) -> u64 {
        self.request_data_at() + self.request_data_bytes
    }

    /// Bytes of the whole block.
    pub fn block_bytes(&self) -> u64 {
        self.response_data_at() + self.response_data_bytes
    }

    pub fn entry_at(&self, index: u64) -> u64 {
        METADATA_RING_AT + (index % self.metadata_entries) * ENTRY_BYTES
    }
}

/// Read or write, as `rw_type` says; zero means "not valid yet".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Read,
    Write,
}

impl Kind {
    fn code(self) -> u16 {
        match self {
            Kind::Read => 1,
            Kind::Write => 2,
        }
    }

    fn from_code(code: u16) -> Option<Kind> {
        match code {
            1 => Some(Kind::Read),
            2 => Some(Kind::Write),
            _ => None,
        }
    }
}

/// Table 3, in 32 bytes: `rw_type` (16 bits) and `region_id` (16 bits)
/// share the first word with `length` (32 bits); then `req_addr` and
/// `resp_addr`; the last word carries the request's sequence number, so
/// the engine can report progress without counting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    pub region: u16,
    pub length: u32,
    /// Read: offset in the memory region. Write: offset of the payload in
    /// the compute block (request data ring).
    pub request_address: u64,
    /// Read: offset of the response in the compute block (response data
    /// ring). Write: offset in the memory region.
    pub response_address: u64,
    pub sequence: u64,
}

/// An entry the engine could not make sense of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("rw_type {0} is neither read (1) nor write (2)")]
    Type(u16),
    #[error("length {0} is outside 1..={MAX_REQUEST_BYTES}")]
    Length(u32),
}

impl Entry {
    pub fn emit(&self, bytes: &mut [u8; ENTRY_BYTES as usize]) {
        let first = u64::from(self.kind.code())
            | u64::from(self.region) << 16
            | u64::from(self.length) << 32;
        bytes[0..8].copy_from_slice(&first.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.request_address.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.response_address.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.sequence.to_le_bytes());
    }

    pub fn parse(bytes: &[u8]) -> Result<Entry, EntryError> {
        assert_eq!(bytes.len(), ENTRY_BYTES as usize);
        let word = |index: usize| {
            u64::from_le_bytes(bytes[index * 8..index * 8 + 8].try_into().expect("a word"))
        };
        let first = word(0);
        let code = first as u16;
        let kind = Kind::from_code(code).ok_or(EntryError::Type(code))?;
        let length = (first >> 32) as u32;
        if length == 0 || length > MAX_REQUEST_BYTES {
            return Err(EntryError::Length(length));
        }
        Ok(Entry {
            kind,
            region: (first >> 16) as u16,
            length,
            request_address: word(1),
            response_address: word(2),
            sequence: word(3),
        })
    }
}

/// A request id: bit 63 the type (set for writes), bits 48..63 the
/// region, bits 0..48 the per-thread, per-type sequence number. A
/// completion check is one shift and one comparison against progress.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

const SEQUENCE_BITS: u32 = 48;
pub const MAX_REGIONS: u16 = 1 << 15;

impl RequestId {
    pub fn new(kind: Kind, region: u16, sequence: u64) -> RequestId {
        assert!(region < MAX_REGIONS && sequence < 1 << SEQUENCE_BITS);
        let kind_bit = u64::from(kind == Kind::Write) << 63;
        RequestId(kind_bit | u64::from(region) << SEQUENCE_BITS | sequence)
    }

    pub fn kind(self) -> Kind {
        match self.0 >> 63 {
            0 => Kind::Read,
            _ => Kind::Write,
        }
    }

    pub fn region(self) -> u16 {
        ((self.0 >> SEQUENCE_BITS) & u64::from(MAX_REGIONS - 1)) as u16
    }

    pub fn sequence(self) -> u64 {
        self.0 & ((1 << SEQUENCE_BITS) - 1)
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            formatter,
            "{:?}#{}@region{}",
            self.kind(),
            self.sequence(),
            self.region()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn entries_round_trip(
            write in any::<bool>(),
            region in any::<u16>(),
            length in 1..=MAX_REQUEST_BYTES,
            request_address in any::<u64>(),
            response_address in any::<u64>(),
            sequence in any::<u64>(),
        ) {
            let entry = Entry {
                kind: if write { Kind::Write } else { Kind::Read },
                region, length, request_address, response_address, sequence,
            };
            let mut bytes = [0u8; ENTRY_BYTES as usize];
            entry.emit(&mut bytes);
            prop_assert_eq!(Entry::parse(&bytes), Ok(entry));
        }

        #[test]
        fn any_bytes_parse_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 32)) {
            let _ = Entry::parse(&bytes);
        }

        #[test]
        fn request_ids_keep_their_fields(write in any::<bool>(), region in 0..MAX_REGIONS, sequence in 0u64..1 << 48) {
            let kind = if write { Kind::Write } else { Kind::Read };
            let id = RequestId::new(kind, region, sequence);
            prop_assert_eq!((id.kind(), id.region(), id.sequence()), (kind, region, sequence));
        }
    }

    #[test]
    fn an_unwritten_entry_is_not_valid() {
        assert_eq!(Entry::parse(&[0u8; 32]), Err(EntryError::Type(0)));
    }
}
