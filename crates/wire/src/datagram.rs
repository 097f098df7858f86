//! Plain UDP datagrams in Ethernet and IPv4: the non-RoCE traffic nodes
//! exchange through the switch (Bifröst's RPCs travel this way, on their
//! own port, so the switch can parse them). One parse checks every layer;
//! one emit writes them.

use crate::ethernet::{EthernetFrame, EthernetRepr, ETHERNET_HEADER_LEN, ETHERTYPE_IPV4};
use crate::ipv4::{Ipv4Packet, Ipv4Repr, IPV4_MIN_HEADER_LEN, PROTOCOL_UDP};
use crate::udp::{UdpDatagram, UdpRepr, UDP_HEADER_LEN};
use crate::{Ipv4Address, MacAddress, WireError};
use remora_base::copy_bytes;

/// Bytes of headers before a datagram's payload.
pub const DATAGRAM_HEADERS_LEN: usize = ETHERNET_HEADER_LEN + IPV4_MIN_HEADER_LEN + UDP_HEADER_LEN;

/// Who sent a datagram, or whom it is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DatagramEnd {
    pub mac: MacAddress,
    pub address: Ipv4Address,
    pub port: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DatagramRepr {
    pub source: DatagramEnd,
    pub destination: DatagramEnd,
    pub payload_len: usize,
}

/// The UDP destination port of an IPv4 frame, without checking anything
/// else: how a device decides which parser a frame goes to.
pub fn udp_destination_port(bytes: &[u8]) -> Option<u16> {
    let ip = ETHERNET_HEADER_LEN;
    let ethertype_ipv4 = bytes.get(12..14)? == ETHERTYPE_IPV4.to_be_bytes();
    let header_len = usize::from(bytes.get(ip)? & 0x0f) * 4;
    if !ethertype_ipv4 || *bytes.get(ip + 9)? != PROTOCOL_UDP {
        return None;
    }
    // A header under 20 bytes, or a fragment after the first, has no UDP
    // header where one would be read: the "port" came from the IPv4
    // header or the payload, and the frame was counted under the wrong
    // reason. Left to the full parser, which names the fault.
    let fragment_offset = u16::from_be_bytes([*bytes.get(ip + 6)?, *bytes.get(ip + 7)?]) & 0x1fff;
    if header_len < 20 || fragment_offset != 0 {
        return None;
    }
    let port = bytes.get(ip + header_len + 2..ip + header_len + 4)?;
    Some(u16::from_be_bytes([port[0], port[1]]))
}

/// Parses and checks a whole datagram frame; returns it and its payload.
pub fn parse_datagram(bytes: &[u8]) -> Result<(DatagramRepr, &[u8]), WireError> {
    let ethernet = EthernetFrame::new_checked(bytes)?;
    let ethertype = ethernet.ethertype();
    if ethertype != ETHERTYPE_IPV4 {
        return Err(WireError::NotIpv4(ethertype));
    }
    let packet = Ipv4Packet::new_checked(&bytes[ETHERNET_HEADER_LEN..])?;
    let ip = Ipv4Repr::parse(&packet)?;
    if ip.protocol != PROTOCOL_UDP {
        return Err(WireError::NotUdp(ip.protocol));
    }
    let udp = UdpDatagram::new_checked(packet.payload())?;
    let payload = udp.payload();
    // The payload borrows from `bytes`, not from the views.
    let start = ETHERNET_HEADER_LEN + packet.header_len() + UDP_HEADER_LEN;
    let repr = DatagramRepr {
        source: DatagramEnd {
            mac: ethernet.source(),
            address: ip.source,
            port: udp.source_port(),
        },
        destination: DatagramEnd {
            mac: ethernet.destination(),
            address: ip.destination,
            port: udp.destination_port(),
        },
        payload_len: payload.len(),
    };
    Ok((repr, &bytes[start..start + payload.len()]))
}

/// Writes a datagram frame carrying `payload` into `buffer`; returns its
/// length.
pub fn emit_datagram(
    source: DatagramEnd,
    destination: DatagramEnd,
    payload: &[u8],
    buffer: &mut [u8],
) -> Result<usize, WireError> {
    let length = DATAGRAM_HEADERS_LEN + payload.len();
    if buffer.len() < length {
        return Err(WireError::BufferTooSmall { needed: length });
    }
    let mut frame = EthernetFrame::new_unchecked(&mut buffer[..length]);
    EthernetRepr {
        source: source.mac,
        destination: destination.mac,
        ethertype: ETHERTYPE_IPV4,
    }
    .emit(&mut frame);
    let ip = Ipv4Repr {
        payload_len: UDP_HEADER_LEN + payload.len(),
        ..Ipv4Repr::rocev2(source.address, destination.address)
    };
    ip.emit(&mut buffer[ETHERNET_HEADER_LEN..])?;
    let udp = UdpRepr {
        source_port: source.port,
        destination_port: destination.port,
        payload_len: payload.len(),
    };
    udp.emit(&mut buffer[ETHERNET_HEADER_LEN + IPV4_MIN_HEADER_LEN..])?;
    copy_bytes(&mut buffer[DATAGRAM_HEADERS_LEN..length], payload);
    Ok(length)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_round_trip_and_bad_ones_are_typed_errors() {
        let source = DatagramEnd {
            mac: MacAddress([2, 0, 10, 0, 0, 1]),
            address: Ipv4Address::new(10, 0, 0, 1),
            port: 40000,
        };
        let destination = DatagramEnd {
            mac: MacAddress([2, 0, 10, 0, 0, 2]),
            address: Ipv4Address::new(10, 0, 0, 2),
            port: 4792,
        };
        let mut buffer = [0u8; 128];
        let length = emit_datagram(source, destination, b"hello", &mut buffer).unwrap();
        assert_eq!(udp_destination_port(&buffer[..length]), Some(4792));
        let (repr, payload) = parse_datagram(&buffer[..length]).unwrap();
        assert_eq!(
            (repr.source, repr.destination, payload),
            (source, destination, &b"hello"[..])
        );
        let mut corrupt = buffer;
        corrupt[ETHERNET_HEADER_LEN + 8] ^= 1;
        assert_eq!(
            parse_datagram(&corrupt[..length]).unwrap_err(),
            WireError::BadIpChecksum
        );
        assert!(emit_datagram(source, destination, &[0; 200], &mut buffer).is_err());
        assert_eq!(udp_destination_port(&buffer[..20]), None);
    }

    /// An IPv4 header length under 20 bytes, or a later fragment, has no
    /// UDP header where the port was read from: the "port" came from the
    /// destination address or the payload, and the device counted the
    /// frame as bound for no datagram port, not as the fault it is.
    #[test]
    fn no_port_is_read_past_a_short_header_or_from_a_later_fragment() {
        let end = |last, port| DatagramEnd {
            mac: MacAddress([2, 0, 10, 0, 0, last]),
            address: Ipv4Address::new(10, 0, 0, last),
            port,
        };
        let mut buffer = [0u8; 128];
        let length = emit_datagram(end(1, 40000), end(2, 4792), b"hello", &mut buffer).unwrap();
        let mut short_header = buffer;
        short_header[ETHERNET_HEADER_LEN] = 0x44;
        assert_eq!(udp_destination_port(&short_header[..length]), None);
        let mut later_fragment = buffer;
        later_fragment[ETHERNET_HEADER_LEN + 7] = 1;
        assert_eq!(udp_destination_port(&later_fragment[..length]), None);
        let mut first_fragment = buffer;
        first_fragment[ETHERNET_HEADER_LEN + 6] = 0x20;
        assert_eq!(udp_destination_port(&first_fragment[..length]), Some(4792));
    }
}
