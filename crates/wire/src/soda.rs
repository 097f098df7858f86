//! SODA's two-sided request protocol (Table I of the SODA paper): what a
//! host sends its DPU agent in a SEND_WITH_IMM, the immediate data saying
//! which request it is.
//!
//! ```text
//! read  (24 bytes): region_id u16 | page_offset u48 | dest_addr u64 | size u32 | dest_rkey u32
//! write (12 bytes + size): region_id u16 | page_offset u48 | size u32 | data
//! ```
//!
//! Fields are big-endian, as the rest of the wire. A read asks the DPU to
//! place `size` bytes of the region at `page_offset` into the host's
//! registered buffer `dest_addr`/`dest_rkey`; a write carries its data.

use crate::bytes::{read_u16, read_u32, read_u64, write_u16, write_u32, write_u64};
use crate::{Rkey, VirtAddr};

/// Immediate data of a read request.
pub const IMMEDIATE_READ: u32 = 1;
/// Immediate data of a write request.
pub const IMMEDIATE_WRITE: u32 = 2;

/// The largest page offset: 48 bits.
pub const MAX_PAGE_OFFSET: u64 = (1 << 48) - 1;

/// A far-memory region (object) as the DPU knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegionId(pub u16);

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("immediate data {0} is neither a read (1) nor a write (2) request")]
    UnknownKind(u32),
    #[error("a {kind} request needs {needed} bytes, {present} present")]
    Truncated {
        kind: &'static str,
        needed: usize,
        present: usize,
    },
    #[error("a {kind} request is {needed} bytes, {present} present")]
    Trailing {
        kind: &'static str,
        needed: usize,
        present: usize,
    },
    #[error("a write request declares {declared} data bytes but carries {present}")]
    LengthMismatch { declared: u32, present: usize },
    #[error("page offset {0:#x} does not fit 48 bits")]
    PageOffsetTooLarge(u64),
}

/// A checked view of a read request.
#[derive(Debug, Clone)]
pub struct ReadRequest<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ReadRequest<T> {
    pub const LEN: usize = 24;

    /// Exactly [`Self::LEN`] bytes: a SEND's payload is the request, so
    /// bytes past it are a malformed request, as a write's are.
    pub fn new_checked(buffer: T) -> Result<Self, RequestError> {
        let present = buffer.as_ref().len();
        check_length(buffer.as_ref(), Self::LEN, "read")?;
        if present != Self::LEN {
            return Err(RequestError::Trailing {
                kind: "read",
                needed: Self::LEN,
                present,
            });
        }
        Ok(ReadRequest { buffer })
    }

    fn bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn region(&self) -> RegionId {
        region_field(self.bytes())
    }

    pub fn page_offset(&self) -> u64 {
        page_offset_field(self.bytes())
    }

    pub fn destination_address(&self) -> VirtAddr {
        VirtAddr(read_u64(self.bytes(), 8))
    }

    pub fn size(&self) -> u32 {
        read_u32(self.bytes(), 16)
    }

    pub fn destination_rkey(&self) -> Rkey {
        Rkey(read_u32(self.bytes(), 20))
    }
}

/// A checked view of a write request: its header and exactly `size`
/// bytes of data.
#[derive(Debug, Clone)]
pub struct WriteRequest<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> WriteRequest<T> {
    pub const HEADER_LEN: usize = 12;

    pub fn new_checked(buffer: T) -> Result<Self, RequestError> {
        let bytes = buffer.as_ref();
        check_length(bytes, Self::HEADER_LEN, "write")?;
        let declared = read_u32(bytes, 8);
        let present = bytes.len() - Self::HEADER_LEN;
        if declared as usize != present {
            return Err(RequestError::LengthMismatch { declared, present });
        }
        Ok(WriteRequest { buffer })
    }

    fn bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn region(&self) -> RegionId {
        region_field(self.bytes())
    }

    pub fn page_offset(&self) -> u64 {
        page_offset_field(self.bytes())
    }

    pub fn size(&self) -> u32 {
        read_u32(self.bytes(), 8)
    }

    pub fn data(&self) -> &[u8] {
        &self.bytes()[Self::HEADER_LEN..]
    }
}

/// Both requests start with region_id (16 bits) and page_offset (48).
fn region_field(bytes: &[u8]) -> RegionId {
    RegionId(read_u16(bytes, 0))
}

fn page_offset_field(bytes: &[u8]) -> u64 {
    read_u64(bytes, 0) & MAX_PAGE_OFFSET
}

fn check_length(bytes: &[u8], needed: usize, kind: &'static str) -> Result<(), RequestError> {
    if bytes.len() < needed {
        return Err(RequestError::Truncated {
            kind,
            needed,
            present: bytes.len(),
        });
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequestRepr {
    pub region: RegionId,
    pub page_offset: u64,
    pub destination_address: VirtAddr,
    pub size: u32,
    pub destination_rkey: Rkey,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteRequestRepr<'a> {
    pub region: RegionId,
    pub page_offset: u64,
    pub data: &'a [u8],
}

/// Either request, as the DPU agent receives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SodaRequestRepr<'a> {
    Read(ReadRequestRepr),
    Write(WriteRequestRepr<'a>),
}

impl<'a> SodaRequestRepr<'a> {
    /// Parses a received SEND_WITH_IMM: its immediate data and payload.
    pub fn parse(immediate: u32, payload: &'a [u8]) -> Result<SodaRequestRepr<'a>, RequestError> {
        match immediate {
            IMMEDIATE_READ => {
                let view = ReadRequest::new_checked(payload)?;
                Ok(SodaRequestRepr::Read(ReadRequestRepr {
                    region: view.region(),
                    page_offset: view.page_offset(),
                    destination_address: view.destination_address(),
                    size: view.size(),
                    destination_rkey: view.destination_rkey(),
                }))
            }
            IMMEDIATE_WRITE => {
                let view = WriteRequest::new_checked(payload)?;
                Ok(SodaRequestRepr::Write(WriteRequestRepr {
                    region: view.region(),
                    page_offset: view.page_offset(),
                    data: &payload[WriteRequest::<&[u8]>::HEADER_LEN..],
                }))
            }
            other => Err(RequestError::UnknownKind(other)),
        }
    }

    pub fn immediate(&self) -> u32 {
        match self {
            SodaRequestRepr::Read(_) => IMMEDIATE_READ,
            SodaRequestRepr::Write(_) => IMMEDIATE_WRITE,
        }
    }

    pub fn buffer_len(&self) -> usize {
        match self {
            SodaRequestRepr::Read(_) => ReadRequest::<&[u8]>::LEN,
            SodaRequestRepr::Write(write) => WriteRequest::<&[u8]>::HEADER_LEN + write.data.len(),
        }
    }

    /// Writes the payload; returns its length.
    pub fn emit(&self, bytes: &mut [u8]) -> Result<usize, RequestError> {
        let needed = self.buffer_len();
        let (region, page_offset) = match self {
            SodaRequestRepr::Read(read) => (read.region, read.page_offset),
            SodaRequestRepr::Write(write) => (write.region, write.page_offset),
        };
        if page_offset > MAX_PAGE_OFFSET {
            return Err(RequestError::PageOffsetTooLarge(page_offset));
        }
        let kind = if self.immediate() == IMMEDIATE_READ {
            "read"
        } else {
            "write"
        };
        check_length(bytes, needed, kind)?;
        // region_id is the top 16 bits of the first 64-bit word.
        write_u64(bytes, 0, page_offset);
        write_u16(bytes, 0, region.0);
        match self {
            SodaRequestRepr::Read(read) => {
                write_u64(bytes, 8, read.destination_address.0);
                write_u32(bytes, 16, read.size);
                write_u32(bytes, 20, read.destination_rkey.0);
            }
            SodaRequestRepr::Write(write) => {
                let size =
                    u32::try_from(write.data.len()).map_err(|_| RequestError::LengthMismatch {
                        declared: u32::MAX,
                        present: write.data.len(),
                    })?;
                write_u32(bytes, 8, size);
                bytes[12..needed].copy_from_slice(write.data);
            }
        }
        Ok(needed)
    }
}

/// The harness of the `soda_requests` fuzz target, kept here so that its
/// seeds replay as tests: the first four bytes are the immediate data,
/// the rest the payload. A request that parses emits the same bytes back.
/// Returns whether it parsed.
pub fn any_request(data: &[u8]) -> bool {
    let Some((immediate, payload)) = data.split_first_chunk::<4>() else {
        return false;
    };
    let Ok(request) = SodaRequestRepr::parse(u32::from_be_bytes(*immediate), payload) else {
        return false;
    };
    let mut emitted = vec![0u8; request.buffer_len()];
    let length = request.emit(&mut emitted).expect("a parsed request emits");
    // A request is its whole payload: nothing past it is taken.
    assert_eq!(&emitted[..length], payload);
    assert_eq!(
        SodaRequestRepr::parse(request.immediate(), &emitted),
        Ok(request)
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_with_the_table_i_layout() {
        let read = SodaRequestRepr::Read(ReadRequestRepr {
            region: RegionId(0x0102),
            page_offset: 0x0000_0304_0506_0708,
            destination_address: VirtAddr(0x1122_3344_5566_7788),
            size: 65536,
            destination_rkey: Rkey(0xdead_beef),
        });
        let mut bytes = [0u8; 24];
        assert_eq!(read.emit(&mut bytes), Ok(24));
        assert_eq!(&bytes[..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(SodaRequestRepr::parse(IMMEDIATE_READ, &bytes), Ok(read));

        let data = [9u8; 5];
        let write = SodaRequestRepr::Write(WriteRequestRepr {
            region: RegionId(7),
            page_offset: 4096,
            data: &data,
        });
        let mut bytes = [0u8; 17];
        assert_eq!(write.emit(&mut bytes), Ok(17));
        assert_eq!(SodaRequestRepr::parse(IMMEDIATE_WRITE, &bytes), Ok(write));
    }

    #[test]
    fn malformed_requests_are_typed_errors() {
        assert_eq!(
            SodaRequestRepr::parse(3, &[0; 24]),
            Err(RequestError::UnknownKind(3))
        );
        assert!(matches!(
            SodaRequestRepr::parse(IMMEDIATE_READ, &[0; 23]),
            Err(RequestError::Truncated { needed: 24, .. })
        ));
        // Bytes past a read request were taken for a valid one.
        assert_eq!(
            SodaRequestRepr::parse(IMMEDIATE_READ, &[0; 25]),
            Err(RequestError::Trailing {
                kind: "read",
                needed: 24,
                present: 25
            })
        );
        let mut write = [0u8; 14];
        write[11] = 3;
        assert_eq!(
            SodaRequestRepr::parse(IMMEDIATE_WRITE, &write),
            Err(RequestError::LengthMismatch {
                declared: 3,
                present: 2
            })
        );
        let oversized = SodaRequestRepr::Write(WriteRequestRepr {
            region: RegionId(0),
            page_offset: 1 << 48,
            data: &[],
        });
        assert_eq!(
            oversized.emit(&mut [0; 12]),
            Err(RequestError::PageOffsetTooLarge(1 << 48))
        );
    }
}
