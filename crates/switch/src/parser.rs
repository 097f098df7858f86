//! The parser: Ethernet, then IPv4, then UDP, then (on port 4791) the BTH
//! and the extension headers its opcode implies. It records where each
//! header starts and the fields programs match on. It checks lengths only,
//! as a switch parser does: no checksum and no ICRC verification, which
//! are the end hosts' business.

use remora_wire::ethernet::ETHERNET_HEADER_LEN;
use remora_wire::frame::ExtensionHeaders;
use remora_wire::icrc::ICRC_LEN;
use remora_wire::ipv4::{IPV4_MIN_HEADER_LEN, PROTOCOL_UDP};
use remora_wire::{
    BthHeader, EthernetFrame, Ipv4Address, MacAddress, Opcode, Psn, Qpn, ETHERTYPE_IPV4,
    ROCEV2_UDP_PORT,
};

/// Where the parser stopped, and why, for frames it could not fully parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum ParseStop {
    /// Shorter than an Ethernet header: dropped before the pipeline.
    RuntFrame,
    /// Not IPv4, or an IPv4 header that does not fit.
    NotIpv4,
    /// IPv4 but not UDP to port 4791.
    NotRoce,
    /// UDP 4791 whose BTH or extension headers do not fit.
    TruncatedRoce,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Fields {
    pub offset: usize,
    pub header_len: usize,
    pub source: Ipv4Address,
    pub destination: Ipv4Address,
    pub time_to_live: u8,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoceFields {
    /// Offset of the BTH.
    pub bth_offset: usize,
    /// Offset of the first extension header (right after the BTH).
    pub extension_offset: usize,
    /// Offset of the payload (after the extension headers).
    pub payload_offset: usize,
    /// Offset of the ICRC (the last four bytes).
    pub icrc_offset: usize,
    pub opcode: Opcode,
    pub destination_qp: Qpn,
    pub psn: Psn,
}

/// What the parser extracted. Headers beyond `stop` are absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedHeaders {
    pub destination_mac: MacAddress,
    pub source_mac: MacAddress,
    pub ethertype: u16,
    pub ipv4: Option<Ipv4Fields>,
    pub roce: Option<RoceFields>,
    /// Why parsing stopped early, if it did.
    pub stop: Option<ParseStop>,
}

/// Parses `frame`; `Err` only for a frame too short to be Ethernet.
/// Inlined, so the headers are built where the caller keeps them rather
/// than copied out of the function.
#[inline]
pub fn parse(frame: &[u8]) -> Result<ParsedHeaders, ParseStop> {
    let ethernet = EthernetFrame::new_checked(frame).map_err(|_| ParseStop::RuntFrame)?;
    let mut headers = ParsedHeaders {
        destination_mac: ethernet.destination(),
        source_mac: ethernet.source(),
        ethertype: ethernet.ethertype(),
        ipv4: None,
        roce: None,
        stop: None,
    };
    headers.stop = parse_network(frame, &mut headers).err();
    Ok(headers)
}

fn parse_network(frame: &[u8], headers: &mut ParsedHeaders) -> Result<(), ParseStop> {
    let ip = ETHERNET_HEADER_LEN;
    if headers.ethertype != ETHERTYPE_IPV4 || frame.len() < ip + IPV4_MIN_HEADER_LEN {
        return Err(ParseStop::NotIpv4);
    }
    let header_len = usize::from(frame[ip] & 0x0f) * 4;
    if frame[ip] >> 4 != 4 || header_len < IPV4_MIN_HEADER_LEN || frame.len() < ip + header_len {
        return Err(ParseStop::NotIpv4);
    }
    let address = |at: usize| Ipv4Address(frame[ip + at..ip + at + 4].try_into().expect("4 bytes"));
    headers.ipv4 = Some(Ipv4Fields {
        offset: ip,
        header_len,
        source: address(12),
        destination: address(16),
        time_to_live: frame[ip + 8],
    });
    let udp = ip + header_len;
    let is_udp = frame[ip + 9] == PROTOCOL_UDP;
    if !is_udp
        || frame.len() < udp + 8
        || u16::from_be_bytes([frame[udp + 2], frame[udp + 3]]) != ROCEV2_UDP_PORT
    {
        return Err(ParseStop::NotRoce);
    }
    // The IPv4 packet ends where its total length says: Ethernet may pad
    // past it, and the ICRC is the packet's last four bytes, not the
    // frame's (at the frame's end, a padded frame's ICRC was recomputed
    // over the wrong bytes and written two bytes late).
    let total_len = usize::from(u16::from_be_bytes([frame[ip + 2], frame[ip + 3]]));
    headers.roce = Some(parse_transport(frame, udp + 8, ip + total_len)?);
    Ok(())
}

/// The transport headers of `frame`, whose IPv4 packet ends at
/// `packet_end` (padding may follow).
fn parse_transport(
    frame: &[u8],
    bth_offset: usize,
    packet_end: usize,
) -> Result<RoceFields, ParseStop> {
    let bth = BthHeader::new_checked(&frame[bth_offset..]).map_err(|_| ParseStop::TruncatedRoce)?;
    let opcode = Opcode::from_u8(bth.opcode_byte()).ok_or(ParseStop::TruncatedRoce)?;
    let extension_offset = bth_offset + remora_wire::bth::BTH_LEN;
    let payload_offset = extension_offset + ExtensionHeaders::len_for(opcode);
    if packet_end > frame.len() || packet_end < payload_offset + ICRC_LEN {
        return Err(ParseStop::TruncatedRoce);
    }
    Ok(RoceFields {
        bth_offset,
        extension_offset,
        payload_offset,
        icrc_offset: packet_end - ICRC_LEN,
        opcode,
        destination_qp: bth.destination_qp(),
        psn: bth.psn(),
    })
}
