//! IPv4 (RFC 791). Options are accepted on parse and never emitted.

use crate::bytes::{check_len, read_u16, write_u16};
use crate::WireError;
use std::fmt;

pub const IPV4_MIN_HEADER_LEN: usize = 20;
pub const PROTOCOL_UDP: u8 = 17;
const FLAG_MORE_FRAGMENTS: u16 = 0x2000;
const FLAG_DONT_FRAGMENT: u16 = 0x4000;
const FRAGMENT_OFFSET_MASK: u16 = 0x1fff;

#[cfg(test)]
mod checksum_tests {
    use super::internet_checksum;
    use proptest::prelude::*;

    /// The RFC 1071 definition, 16 bits at a time.
    fn reference(bytes: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for pair in bytes.chunks(2) {
            sum += (u32::from(pair[0]) << 8) | u32::from(*pair.get(1).unwrap_or(&0));
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    proptest! {
        #[test]
        fn matches_rfc_1071(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            prop_assert_eq!(internet_checksum(&bytes), reference(&bytes));
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Ipv4Address(pub [u8; 4]);

impl Ipv4Address {
    pub const fn new(a: u8, b: u8, c: u8, d: u8) -> Ipv4Address {
        Ipv4Address([a, b, c, d])
    }
}

impl fmt::Debug for Ipv4Address {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d] = self.0;
        write!(formatter, "{a}.{b}.{c}.{d}")
    }
}

impl fmt::Display for Ipv4Address {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, formatter)
    }
}

/// The Internet checksum: one's-complement sum of 16-bit words.
pub fn internet_checksum(bytes: &[u8]) -> u16 {
    // Summing 32-bit words into a 64-bit accumulator and folding at the end
    // gives the same one's-complement sum with a quarter of the additions.
    let mut sum: u64 = 0;
    let mut words = bytes.chunks_exact(4);
    for word in &mut words {
        sum += u64::from(u32::from_be_bytes([word[0], word[1], word[2], word[3]]));
    }
    let mut tail = words.remainder().chunks(2);
    for pair in &mut tail {
        let high = u64::from(pair[0]) << 8;
        sum += high | pair.get(1).map_or(0, |low| u64::from(*low));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A checked view of an IPv4 packet. `new_checked` validates the version,
/// the header length and the total length against the buffer.
#[derive(Debug, Clone)]
pub struct Ipv4Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        Ipv4Packet { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let bytes = buffer.as_ref();
        check_len(bytes, IPV4_MIN_HEADER_LEN, "IPv4")?;
        let packet = Ipv4Packet { buffer };
        if packet.version() != 4 {
            return Err(WireError::BadIpVersion(packet.version()));
        }
        let header_len = packet.header_len();
        if header_len < IPV4_MIN_HEADER_LEN {
            return Err(WireError::BadIpHeaderLength);
        }
        let total_len = usize::from(packet.total_len());
        if total_len < header_len || total_len > packet.buffer.as_ref().len() {
            return Err(WireError::BadIpTotalLength);
        }
        Ok(packet)
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }

    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[0] & 0x0f) * 4
    }

    pub fn type_of_service(&self) -> u8 {
        self.buffer.as_ref()[1]
    }

    pub fn total_len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), 2)
    }

    pub fn identification(&self) -> u16 {
        read_u16(self.buffer.as_ref(), 4)
    }

    fn flags_and_offset(&self) -> u16 {
        read_u16(self.buffer.as_ref(), 6)
    }

    pub fn dont_fragment(&self) -> bool {
        self.flags_and_offset() & FLAG_DONT_FRAGMENT != 0
    }

    pub fn is_fragment(&self) -> bool {
        let field = self.flags_and_offset();
        field & FLAG_MORE_FRAGMENTS != 0 || field & FRAGMENT_OFFSET_MASK != 0
    }

    pub fn time_to_live(&self) -> u8 {
        self.buffer.as_ref()[8]
    }

    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[9]
    }

    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), 10)
    }

    pub fn source(&self) -> Ipv4Address {
        Ipv4Address(
            self.buffer.as_ref()[12..16]
                .try_into()
                .expect("checked length"),
        )
    }

    pub fn destination(&self) -> Ipv4Address {
        Ipv4Address(
            self.buffer.as_ref()[16..20]
                .try_into()
                .expect("checked length"),
        )
    }

    /// True when the header checksum verifies. Only valid after `new_checked`.
    pub fn verify_checksum(&self) -> bool {
        internet_checksum(&self.buffer.as_ref()[..self.header_len()]) == 0
    }

    /// The bytes after the header, up to the total length (Ethernet padding
    /// beyond it is excluded).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..usize::from(self.total_len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    pub fn fill_checksum(&mut self) {
        let header_len = self.header_len();
        let bytes = self.buffer.as_mut();
        write_u16(bytes, 10, 0);
        let checksum = internet_checksum(&bytes[..header_len]);
        write_u16(bytes, 10, checksum);
    }
}

/// An IPv4 header without options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ipv4Repr {
    pub source: Ipv4Address,
    pub destination: Ipv4Address,
    pub protocol: u8,
    /// Bytes after the header.
    pub payload_len: usize,
    pub type_of_service: u8,
    pub time_to_live: u8,
    pub identification: u16,
    pub dont_fragment: bool,
}

impl Ipv4Repr {
    pub const LEN: usize = IPV4_MIN_HEADER_LEN;

    /// The IPv4 header of a RoCEv2 packet: UDP, TTL 64, don't fragment,
    /// best-effort class; the length is filled in at emission.
    pub fn rocev2(source: Ipv4Address, destination: Ipv4Address) -> Ipv4Repr {
        Ipv4Repr {
            source,
            destination,
            protocol: PROTOCOL_UDP,
            payload_len: 0,
            type_of_service: 0,
            time_to_live: 64,
            identification: 0,
            dont_fragment: true,
        }
    }

    /// Parses a packet from `new_checked`, rejecting fragments and bad checksums.
    pub fn parse<T: AsRef<[u8]>>(packet: &Ipv4Packet<T>) -> Result<Ipv4Repr, WireError> {
        if !packet.verify_checksum() {
            return Err(WireError::BadIpChecksum);
        }
        if packet.is_fragment() {
            return Err(WireError::IpFragment);
        }
        Ok(Ipv4Repr {
            source: packet.source(),
            destination: packet.destination(),
            protocol: packet.protocol(),
            payload_len: packet.payload().len(),
            type_of_service: packet.type_of_service(),
            time_to_live: packet.time_to_live(),
            identification: packet.identification(),
            dont_fragment: packet.dont_fragment(),
        })
    }

    /// Writes the header, including its checksum, into the first 20 bytes.
    pub fn emit(&self, bytes: &mut [u8]) -> Result<(), WireError> {
        check_len(bytes, Self::LEN, "IPv4")?;
        let total_len = u16::try_from(Self::LEN + self.payload_len)
            .map_err(|_| WireError::PayloadTooLarge(self.payload_len))?;
        bytes[0] = 0x45;
        bytes[1] = self.type_of_service;
        write_u16(bytes, 2, total_len);
        write_u16(bytes, 4, self.identification);
        let flags = if self.dont_fragment {
            FLAG_DONT_FRAGMENT
        } else {
            0
        };
        write_u16(bytes, 6, flags);
        bytes[8] = self.time_to_live;
        bytes[9] = self.protocol;
        bytes[12..16].copy_from_slice(&self.source.0);
        bytes[16..20].copy_from_slice(&self.destination.0);
        Ipv4Packet::new_unchecked(&mut bytes[..Self::LEN]).fill_checksum();
        Ok(())
    }
}
