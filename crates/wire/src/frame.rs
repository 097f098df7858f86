//! Whole RoCEv2 frames: Ethernet II / IPv4 / UDP 4791 / BTH / extension
//! headers / payload / pad / ICRC.

use crate::bth::{BthHeader, BTH_LEN};
use crate::ethernet::{EthernetFrame, ETHERNET_HEADER_LEN};
use crate::extension::{AethHeader, AtomicAckEthHeader, AtomicEthHeader, ImmDtHeader, RethHeader};
use crate::icrc::{self, ICRC_LEN};
use crate::ipv4::PROTOCOL_UDP;
use crate::udp::UDP_HEADER_LEN;
use crate::{
    AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, EthernetRepr, ImmDtRepr, Ipv4Packet,
    Ipv4Repr, Opcode, RethRepr, UdpDatagram, UdpRepr, WireError, ETHERTYPE_IPV4, ROCEV2_UDP_PORT,
};

/// Ethernet, IPv4 (no options), UDP and BTH.
pub const BASE_HEADERS_LEN: usize = ETHERNET_HEADER_LEN + Ipv4Repr::LEN + UDP_HEADER_LEN + BTH_LEN;
/// The largest frame any path MTU (4096) produces, with room for headers.
pub const MAX_FRAME_LEN: usize = BASE_HEADERS_LEN + 64 + 4096 + ICRC_LEN;

/// The extension headers after the BTH. Which are present is fixed by the
/// opcode; `parse_frame` fills exactly those and `emit_frame` insists on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtensionHeaders {
    pub reth: Option<RethRepr>,
    pub aeth: Option<AethRepr>,
    pub atomic_eth: Option<AtomicEthRepr>,
    pub atomic_ack_eth: Option<AtomicAckEthRepr>,
    /// ImmDt, or the IETH of a SEND-with-invalidate (same layout).
    pub immediate: Option<ImmDtRepr>,
}

impl ExtensionHeaders {
    /// Bytes the extension headers of `opcode` occupy.
    pub fn len_for(opcode: Opcode) -> usize {
        let mut len = 0;
        if opcode.has_reth() {
            len += RethRepr::LEN;
        }
        if opcode.has_aeth() {
            len += AethRepr::LEN;
        }
        if opcode.has_atomic_eth() {
            len += AtomicEthRepr::LEN;
        }
        if opcode.has_atomic_ack_eth() {
            len += AtomicAckEthRepr::LEN;
        }
        if opcode.has_immediate() || opcode.has_invalidate() {
            len += ImmDtRepr::LEN;
        }
        len
    }

    fn matches(&self, opcode: Opcode) -> bool {
        self.reth.is_some() == opcode.has_reth()
            && self.aeth.is_some() == opcode.has_aeth()
            && self.atomic_eth.is_some() == opcode.has_atomic_eth()
            && self.atomic_ack_eth.is_some() == opcode.has_atomic_ack_eth()
            && self.immediate.is_some() == (opcode.has_immediate() || opcode.has_invalidate())
    }

    /// Parses the headers `opcode` requires from the front of `bytes`.
    fn parse(opcode: Opcode, bytes: &[u8]) -> Result<(ExtensionHeaders, usize), WireError> {
        let mut headers = ExtensionHeaders::default();
        let mut offset = 0;
        if opcode.has_reth() {
            let view = RethHeader::new_checked(&bytes[offset..])?;
            headers.reth = Some(RethRepr::parse(&view));
            offset += RethRepr::LEN;
        }
        if opcode.has_aeth() {
            let view = AethHeader::new_checked(&bytes[offset..])?;
            headers.aeth = Some(AethRepr::parse(&view)?);
            offset += AethRepr::LEN;
        }
        if opcode.has_atomic_eth() {
            let view = AtomicEthHeader::new_checked(&bytes[offset..])?;
            headers.atomic_eth = Some(AtomicEthRepr::parse(&view));
            offset += AtomicEthRepr::LEN;
        }
        if opcode.has_atomic_ack_eth() {
            let view = AtomicAckEthHeader::new_checked(&bytes[offset..])?;
            headers.atomic_ack_eth = Some(AtomicAckEthRepr::parse(&view));
            offset += AtomicAckEthRepr::LEN;
        }
        if opcode.has_immediate() || opcode.has_invalidate() {
            let view = ImmDtHeader::new_checked(&bytes[offset..])?;
            headers.immediate = Some(ImmDtRepr::parse(&view));
            offset += ImmDtRepr::LEN;
        }
        Ok((headers, offset))
    }

    fn emit(&self, bytes: &mut [u8]) -> Result<usize, WireError> {
        let mut offset = 0;
        if let Some(reth) = &self.reth {
            reth.emit(&mut bytes[offset..])?;
            offset += RethRepr::LEN;
        }
        if let Some(aeth) = &self.aeth {
            aeth.emit(&mut bytes[offset..])?;
            offset += AethRepr::LEN;
        }
        if let Some(atomic) = &self.atomic_eth {
            atomic.emit(&mut bytes[offset..])?;
            offset += AtomicEthRepr::LEN;
        }
        if let Some(atomic_ack) = &self.atomic_ack_eth {
            atomic_ack.emit(&mut bytes[offset..])?;
            offset += AtomicAckEthRepr::LEN;
        }
        if let Some(immediate) = &self.immediate {
            immediate.emit(&mut bytes[offset..])?;
            offset += ImmDtRepr::LEN;
        }
        Ok(offset)
    }
}

/// Every header of a RoCEv2 frame.
///
/// The length fields (`ipv4.payload_len`, `udp.payload_len`) and
/// `bth.pad_count` follow from the payload; [`FrameRepr::with_payload_len`]
/// sets them, and `emit_frame` always writes the values the payload implies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRepr {
    pub ethernet: EthernetRepr,
    pub ipv4: Ipv4Repr,
    pub udp: UdpRepr,
    pub bth: BthRepr,
    pub extension: ExtensionHeaders,
}

/// A parsed, verified frame. `payload` excludes the pad and the ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedFrame<'a> {
    pub repr: FrameRepr,
    pub payload: &'a [u8],
}

fn pad_count(payload_len: usize) -> u8 {
    ((4 - payload_len % 4) % 4) as u8
}

impl FrameRepr {
    /// Bytes after the UDP header for a payload of `payload_len` bytes.
    fn transport_len(&self, payload_len: usize) -> usize {
        BTH_LEN
            + ExtensionHeaders::len_for(self.bth.opcode)
            + payload_len
            + usize::from(pad_count(payload_len))
            + ICRC_LEN
    }

    /// Total frame bytes for a payload of `payload_len` bytes.
    pub fn frame_len(&self, payload_len: usize) -> usize {
        ETHERNET_HEADER_LEN + Ipv4Repr::LEN + UDP_HEADER_LEN + self.transport_len(payload_len)
    }

    /// Sets the fields a payload of `payload_len` bytes implies.
    pub fn with_payload_len(mut self, payload_len: usize) -> FrameRepr {
        let transport_len = self.transport_len(payload_len);
        self.ethernet.ethertype = ETHERTYPE_IPV4;
        self.ipv4.protocol = PROTOCOL_UDP;
        self.ipv4.payload_len = UDP_HEADER_LEN + transport_len;
        self.udp.payload_len = transport_len;
        self.bth.pad_count = pad_count(payload_len);
        self
    }
}

/// Parses and verifies a whole frame: lengths, IPv4 checksum, UDP port,
/// opcode, extension headers, pad and ICRC. Never panics.
pub fn parse_frame(bytes: &[u8]) -> Result<ParsedFrame<'_>, WireError> {
    let ethernet = EthernetFrame::new_checked(bytes)?;
    let ethernet_repr = EthernetRepr::parse(&ethernet);
    if ethernet_repr.ethertype != ETHERTYPE_IPV4 {
        return Err(WireError::NotIpv4(ethernet_repr.ethertype));
    }
    // Slice the original buffer rather than the views, so the payload
    // borrows from `bytes` and outlives the views.
    let ip_bytes = &bytes[ETHERNET_HEADER_LEN..];
    let ip = Ipv4Packet::new_checked(ip_bytes)?;
    let ipv4_repr = Ipv4Repr::parse(&ip)?;
    if ipv4_repr.protocol != PROTOCOL_UDP {
        return Err(WireError::NotUdp(ipv4_repr.protocol));
    }
    let ip_header = &ip_bytes[..ip.header_len()];
    let udp_bytes = &ip_bytes[ip.header_len()..usize::from(ip.total_len())];
    let udp = UdpDatagram::new_checked(udp_bytes)?;
    let udp_repr = UdpRepr::parse(&udp);
    if udp_repr.destination_port != ROCEV2_UDP_PORT {
        return Err(WireError::NotRoce(udp_repr.destination_port));
    }
    let (udp_header, transport) = udp_bytes.split_at(UDP_HEADER_LEN);
    if transport.len() < BTH_LEN + ICRC_LEN {
        return Err(WireError::Truncated { header: "BTH" });
    }
    let (covered, icrc_bytes) = transport.split_at(transport.len() - ICRC_LEN);
    let bth_repr = BthRepr::parse(&BthHeader::new_unchecked(covered))?;
    let (extension, extension_len) = ExtensionHeaders::parse(bth_repr.opcode, &covered[BTH_LEN..])?;
    let padded_payload = &covered[BTH_LEN + extension_len..];
    let payload_len = padded_payload
        .len()
        .checked_sub(usize::from(bth_repr.pad_count))
        .ok_or(WireError::BadPadCount)?;

    let expected = icrc::compute(ip_header, udp_header, covered);
    let received = icrc::from_wire(icrc_bytes.try_into().expect("split at ICRC_LEN"));
    if expected != received {
        return Err(WireError::IcrcMismatch);
    }
    Ok(ParsedFrame {
        repr: FrameRepr {
            ethernet: ethernet_repr,
            ipv4: ipv4_repr,
            udp: udp_repr,
            bth: bth_repr,
            extension,
        },
        payload: &padded_payload[..payload_len],
    })
}

/// Emits a frame with `payload` into `buffer`; returns the frame length.
pub fn emit_frame(repr: &FrameRepr, payload: &[u8], buffer: &mut [u8]) -> Result<usize, WireError> {
    emit_frame_with(repr, payload.len(), buffer, |space| {
        space.copy_from_slice(payload)
    })
}

/// Emits a frame whose `payload_len` payload bytes are written by `fill`,
/// so a sender can copy straight from registered memory into the frame.
pub fn emit_frame_with(
    repr: &FrameRepr,
    payload_len: usize,
    buffer: &mut [u8],
    fill: impl FnOnce(&mut [u8]),
) -> Result<usize, WireError> {
    if !repr.extension.matches(repr.bth.opcode) {
        return Err(WireError::UnknownOpcode(repr.bth.opcode as u8));
    }
    let repr = repr.with_payload_len(payload_len);
    let frame_len = repr.frame_len(payload_len);
    if buffer.len() < frame_len {
        return Err(WireError::BufferTooSmall { needed: frame_len });
    }
    let frame = &mut buffer[..frame_len];
    let ip_start = ETHERNET_HEADER_LEN;
    let udp_start = ip_start + Ipv4Repr::LEN;
    let bth_start = udp_start + UDP_HEADER_LEN;
    repr.ethernet
        .emit(&mut EthernetFrame::new_unchecked(&mut frame[..ip_start]));
    repr.ipv4.emit(&mut frame[ip_start..udp_start])?;
    repr.udp.emit(&mut frame[udp_start..bth_start])?;
    repr.bth.emit(&mut frame[bth_start..])?;
    let payload_start =
        bth_start + BTH_LEN + repr.extension.emit(&mut frame[bth_start + BTH_LEN..])?;
    let payload_end = payload_start + payload_len;
    fill(&mut frame[payload_start..payload_end]);
    let icrc_start = frame_len - ICRC_LEN;
    frame[payload_end..icrc_start].fill(0);
    let icrc = icrc::compute(
        &frame[ip_start..udp_start],
        &frame[udp_start..bth_start],
        &frame[bth_start..icrc_start],
    );
    frame[icrc_start..].copy_from_slice(&icrc::to_wire(icrc));
    Ok(frame_len)
}
