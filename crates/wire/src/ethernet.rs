//! Ethernet II.

use crate::bytes::{check_len, read_u16, write_u16};
use crate::WireError;
use std::fmt;

pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERNET_HEADER_LEN: usize = 14;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct MacAddress(pub [u8; 6]);

impl fmt::Debug for MacAddress {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, f] = self.0;
        write!(formatter, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{f:02x}")
    }
}

/// A checked view of an Ethernet II frame.
#[derive(Debug, Clone)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        EthernetFrame { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        check_len(buffer.as_ref(), ETHERNET_HEADER_LEN, "Ethernet")?;
        Ok(EthernetFrame { buffer })
    }

    pub fn destination(&self) -> MacAddress {
        MacAddress(
            self.buffer.as_ref()[0..6]
                .try_into()
                .expect("checked length"),
        )
    }

    pub fn source(&self) -> MacAddress {
        MacAddress(
            self.buffer.as_ref()[6..12]
                .try_into()
                .expect("checked length"),
        )
    }

    pub fn ethertype(&self) -> u16 {
        read_u16(self.buffer.as_ref(), 12)
    }

    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[ETHERNET_HEADER_LEN..]
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    pub fn set_destination(&mut self, address: MacAddress) {
        self.buffer.as_mut()[0..6].copy_from_slice(&address.0);
    }

    pub fn set_source(&mut self, address: MacAddress) {
        self.buffer.as_mut()[6..12].copy_from_slice(&address.0);
    }

    pub fn set_ethertype(&mut self, ethertype: u16) {
        write_u16(self.buffer.as_mut(), 12, ethertype);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EthernetRepr {
    pub source: MacAddress,
    pub destination: MacAddress,
    pub ethertype: u16,
}

impl EthernetRepr {
    pub const LEN: usize = ETHERNET_HEADER_LEN;

    pub fn parse<T: AsRef<[u8]>>(frame: &EthernetFrame<T>) -> EthernetRepr {
        EthernetRepr {
            source: frame.source(),
            destination: frame.destination(),
            ethertype: frame.ethertype(),
        }
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, frame: &mut EthernetFrame<T>) {
        frame.set_destination(self.destination);
        frame.set_source(self.source);
        frame.set_ethertype(self.ethertype);
    }
}
