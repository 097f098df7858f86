//! UDP (RFC 768). RoCEv2 sends with a zero checksum and relies on the ICRC,
//! so the UDP checksum is neither computed nor checked here: a veth with TX
//! offload may leave it unfinished, and the ICRC covers everything it would.

use crate::bytes::{check_len, read_u16, write_u16};
use crate::WireError;

pub const UDP_HEADER_LEN: usize = 8;
/// The IANA port for RoCEv2.
pub const ROCEV2_UDP_PORT: u16 = 4791;

#[derive(Debug, Clone)]
pub struct UdpDatagram<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpDatagram<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        UdpDatagram { buffer }
    }

    /// Checks the header fits and the length field matches the buffer.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        check_len(buffer.as_ref(), UDP_HEADER_LEN, "UDP")?;
        let datagram = UdpDatagram { buffer };
        let length = usize::from(datagram.length());
        if length < UDP_HEADER_LEN || length != datagram.buffer.as_ref().len() {
            return Err(WireError::BadUdpLength);
        }
        Ok(datagram)
    }

    pub fn source_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), 0)
    }

    pub fn destination_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), 2)
    }

    pub fn length(&self) -> u16 {
        read_u16(self.buffer.as_ref(), 4)
    }

    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), 6)
    }

    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[UDP_HEADER_LEN..]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UdpRepr {
    pub source_port: u16,
    pub destination_port: u16,
    /// Bytes after the header.
    pub payload_len: usize,
}

impl UdpRepr {
    pub const LEN: usize = UDP_HEADER_LEN;

    pub fn parse<T: AsRef<[u8]>>(datagram: &UdpDatagram<T>) -> UdpRepr {
        UdpRepr {
            source_port: datagram.source_port(),
            destination_port: datagram.destination_port(),
            payload_len: datagram.payload().len(),
        }
    }

    /// Writes the header with a zero checksum.
    pub fn emit(&self, bytes: &mut [u8]) -> Result<(), WireError> {
        check_len(bytes, Self::LEN, "UDP")?;
        let length = u16::try_from(Self::LEN + self.payload_len)
            .map_err(|_| WireError::PayloadTooLarge(self.payload_len))?;
        write_u16(bytes, 0, self.source_port);
        write_u16(bytes, 2, self.destination_port);
        write_u16(bytes, 4, length);
        write_u16(bytes, 6, 0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// TIGA's port and the Bifröst Gatekeeper's control port were both
    /// 4793: a Gatekeeper took every TIGA datagram to its service address
    /// for a node message. Each protocol the rack carries has its own.
    #[test]
    fn every_protocol_of_the_rack_has_its_own_port() {
        let ports = [
            super::ROCEV2_UDP_PORT,
            crate::bifrost::BIFROST_PORT,
            crate::bifrost::CONTROL_PORT,
            crate::tiga::TIGA_PORT,
        ];
        for (index, port) in ports.iter().enumerate() {
            assert!(!ports[index + 1..].contains(port), "port {port} twice");
        }
    }
}
