//! Extension transport headers: RETH, AETH, AtomicETH, AtomicAckETH, ImmDt.
//! Which of them follow a BTH is fixed by the opcode.

use crate::bytes::{check_len, read_u24, read_u32, read_u64, write_u24, write_u32, write_u64};
use crate::{Msn, Rkey, VirtAddr, WireError};

/// Defines a checked view over a fixed-length header.
macro_rules! fixed_header_view {
    ($(#[$doc:meta])* $name:ident, $len:expr, $label:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            pub const LEN: usize = $len;

            pub fn new_unchecked(buffer: T) -> Self {
                $name { buffer }
            }

            pub fn new_checked(buffer: T) -> Result<Self, WireError> {
                check_len(buffer.as_ref(), $len, $label)?;
                Ok($name { buffer })
            }

            fn bytes(&self) -> &[u8] {
                self.buffer.as_ref()
            }
        }
    };
}

fixed_header_view!(
    /// RDMA Extended Transport Header: the remote side of a WRITE or READ.
    RethHeader, 16, "RETH"
);

impl<T: AsRef<[u8]>> RethHeader<T> {
    pub fn virtual_address(&self) -> VirtAddr {
        VirtAddr(read_u64(self.bytes(), 0))
    }

    pub fn rkey(&self) -> Rkey {
        Rkey(read_u32(self.bytes(), 8))
    }

    pub fn dma_length(&self) -> u32 {
        read_u32(self.bytes(), 12)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RethRepr {
    pub virtual_address: VirtAddr,
    pub rkey: Rkey,
    pub dma_length: u32,
}

impl RethRepr {
    pub const LEN: usize = 16;

    pub fn parse<T: AsRef<[u8]>>(header: &RethHeader<T>) -> RethRepr {
        RethRepr {
            virtual_address: header.virtual_address(),
            rkey: header.rkey(),
            dma_length: header.dma_length(),
        }
    }

    pub fn emit(&self, bytes: &mut [u8]) -> Result<(), WireError> {
        check_len(bytes, Self::LEN, "RETH")?;
        write_u64(bytes, 0, self.virtual_address.0);
        write_u32(bytes, 8, self.rkey.0);
        write_u32(bytes, 12, self.dma_length);
        Ok(())
    }
}

/// The NAK codes of an AETH syndrome `011xxxxx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    PsnSequenceError = 0,
    InvalidRequest = 1,
    RemoteAccessError = 2,
    RemoteOperationalError = 3,
    InvalidRdRequest = 4,
}

impl NakCode {
    fn from_u8(value: u8) -> Option<NakCode> {
        match value {
            0 => Some(NakCode::PsnSequenceError),
            1 => Some(NakCode::InvalidRequest),
            2 => Some(NakCode::RemoteAccessError),
            3 => Some(NakCode::RemoteOperationalError),
            4 => Some(NakCode::InvalidRdRequest),
            _ => None,
        }
    }
}

/// The decoded AETH syndrome byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AckSyndrome {
    /// `000ccccc`: positive acknowledgement with a credit count (31 = unlimited).
    Ack { credit_count: u8 },
    /// `001ttttt`: receiver not ready; `timer` encodes the minimum wait.
    ReceiverNotReady { timer: u8 },
    /// `011xxxxx`: negative acknowledgement.
    Nak(NakCode),
}

impl AckSyndrome {
    pub const UNLIMITED_CREDIT: u8 = 0x1f;

    pub fn from_u8(value: u8) -> Result<AckSyndrome, WireError> {
        let low_bits = value & 0x1f;
        match value >> 5 {
            0b000 => Ok(AckSyndrome::Ack {
                credit_count: low_bits,
            }),
            0b001 => Ok(AckSyndrome::ReceiverNotReady { timer: low_bits }),
            0b011 => NakCode::from_u8(low_bits)
                .map(AckSyndrome::Nak)
                .ok_or(WireError::ReservedSyndrome(value)),
            _ => Err(WireError::ReservedSyndrome(value)),
        }
    }

    /// The syndrome byte. A credit count or RNR timer past its 5 bits is
    /// refused: cut to them, credit 32 went out as 0 and timer 37 as 5.
    pub fn to_u8(self) -> Result<u8, WireError> {
        match self {
            AckSyndrome::Ack { credit_count } if credit_count <= 0x1f => Ok(credit_count),
            AckSyndrome::ReceiverNotReady { timer } if timer <= 0x1f => Ok(0x20 | timer),
            AckSyndrome::Nak(code) => Ok(0x60 | code as u8),
            AckSyndrome::Ack { credit_count } => Err(WireError::ReservedSyndrome(credit_count)),
            AckSyndrome::ReceiverNotReady { timer } => Err(WireError::ReservedSyndrome(timer)),
        }
    }
}

fixed_header_view!(
    /// ACK Extended Transport Header: syndrome and message sequence number.
    AethHeader, 4, "AETH"
);

impl<T: AsRef<[u8]>> AethHeader<T> {
    pub fn syndrome_byte(&self) -> u8 {
        self.bytes()[0]
    }

    pub fn msn(&self) -> Msn {
        Msn::new(read_u24(self.bytes(), 1))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AethRepr {
    pub syndrome: AckSyndrome,
    pub msn: Msn,
}

impl AethRepr {
    pub const LEN: usize = 4;

    pub fn parse<T: AsRef<[u8]>>(header: &AethHeader<T>) -> Result<AethRepr, WireError> {
        Ok(AethRepr {
            syndrome: AckSyndrome::from_u8(header.syndrome_byte())?,
            msn: header.msn(),
        })
    }

    pub fn emit(&self, bytes: &mut [u8]) -> Result<(), WireError> {
        check_len(bytes, Self::LEN, "AETH")?;
        bytes[0] = self.syndrome.to_u8()?;
        write_u24(bytes, 1, self.msn.value());
        Ok(())
    }
}

fixed_header_view!(
    /// Atomic Extended Transport Header: target, swap-or-add and compare.
    AtomicEthHeader, 28, "AtomicETH"
);

impl<T: AsRef<[u8]>> AtomicEthHeader<T> {
    pub fn virtual_address(&self) -> VirtAddr {
        VirtAddr(read_u64(self.bytes(), 0))
    }

    pub fn rkey(&self) -> Rkey {
        Rkey(read_u32(self.bytes(), 8))
    }

    pub fn swap_or_add(&self) -> u64 {
        read_u64(self.bytes(), 12)
    }

    pub fn compare(&self) -> u64 {
        read_u64(self.bytes(), 20)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicEthRepr {
    pub virtual_address: VirtAddr,
    pub rkey: Rkey,
    pub swap_or_add: u64,
    pub compare: u64,
}

impl AtomicEthRepr {
    pub const LEN: usize = 28;

    pub fn parse<T: AsRef<[u8]>>(header: &AtomicEthHeader<T>) -> AtomicEthRepr {
        AtomicEthRepr {
            virtual_address: header.virtual_address(),
            rkey: header.rkey(),
            swap_or_add: header.swap_or_add(),
            compare: header.compare(),
        }
    }

    pub fn emit(&self, bytes: &mut [u8]) -> Result<(), WireError> {
        check_len(bytes, Self::LEN, "AtomicETH")?;
        write_u64(bytes, 0, self.virtual_address.0);
        write_u32(bytes, 8, self.rkey.0);
        write_u64(bytes, 12, self.swap_or_add);
        write_u64(bytes, 20, self.compare);
        Ok(())
    }
}

fixed_header_view!(
    /// Atomic ACK Extended Transport Header: the value before the atomic.
    AtomicAckEthHeader, 8, "AtomicAckETH"
);

impl<T: AsRef<[u8]>> AtomicAckEthHeader<T> {
    pub fn original_data(&self) -> u64 {
        read_u64(self.bytes(), 0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicAckEthRepr {
    pub original_data: u64,
}

impl AtomicAckEthRepr {
    pub const LEN: usize = 8;

    pub fn parse<T: AsRef<[u8]>>(header: &AtomicAckEthHeader<T>) -> AtomicAckEthRepr {
        AtomicAckEthRepr {
            original_data: header.original_data(),
        }
    }

    pub fn emit(&self, bytes: &mut [u8]) -> Result<(), WireError> {
        check_len(bytes, Self::LEN, "AtomicAckETH")?;
        write_u64(bytes, 0, self.original_data);
        Ok(())
    }
}

fixed_header_view!(
    /// Immediate data: 32 bits delivered to the receiver's completion. Also
    /// used for the IETH of SEND-with-invalidate, which has the same shape.
    ImmDtHeader, 4, "ImmDt"
);

impl<T: AsRef<[u8]>> ImmDtHeader<T> {
    pub fn immediate(&self) -> u32 {
        read_u32(self.bytes(), 0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImmDtRepr {
    pub immediate: u32,
}

impl ImmDtRepr {
    pub const LEN: usize = 4;

    pub fn parse<T: AsRef<[u8]>>(header: &ImmDtHeader<T>) -> ImmDtRepr {
        ImmDtRepr {
            immediate: header.immediate(),
        }
    }

    pub fn emit(&self, bytes: &mut [u8]) -> Result<(), WireError> {
        check_len(bytes, Self::LEN, "ImmDt")?;
        write_u32(bytes, 0, self.immediate);
        Ok(())
    }
}
