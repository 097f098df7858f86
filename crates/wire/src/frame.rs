//! Whole RoCEv2 frames: Ethernet II / IPv4 / UDP 4791 / BTH / extension
//! headers / payload / pad / ICRC.

use crate::bth::{BthHeader, BTH_LEN};
use crate::ethernet::{EthernetFrame, ETHERNET_HEADER_LEN};
use crate::extension::{AethHeader, AtomicAckEthHeader, AtomicEthHeader, ImmDtHeader, RethHeader};
use crate::icrc::{self, ICRC_LEN};
use crate::ipv4::PROTOCOL_UDP;
use crate::udp::UDP_HEADER_LEN;
use crate::{
    AckSyndrome, AethRepr, AtomicAckEthRepr, AtomicEthRepr, BthRepr, EthernetRepr, ImmDtRepr,
    Ipv4Address, Ipv4Packet, Ipv4Repr, MacAddress, Opcode, RethRepr, UdpDatagram, UdpRepr,
    WireError, ETHERTYPE_IPV4, ROCEV2_UDP_PORT,
};
use remora_base::copy_bytes;

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

impl FrameRepr {
    /// A frame from `source` to `destination` (MAC and IPv4 address each)
    /// carrying `bth` and no extension headers; the UDP source port is the
    /// flow's entropy.
    pub fn between(
        source: (MacAddress, Ipv4Address),
        destination: (MacAddress, Ipv4Address),
        source_port: u16,
        bth: BthRepr,
    ) -> FrameRepr {
        FrameRepr {
            ethernet: EthernetRepr {
                source: source.0,
                destination: destination.0,
                ethertype: ETHERTYPE_IPV4,
            },
            ipv4: Ipv4Repr::rocev2(source.1, destination.1),
            udp: UdpRepr {
                source_port,
                destination_port: ROCEV2_UDP_PORT,
                payload_len: 0,
            },
            bth,
            extension: ExtensionHeaders::default(),
        }
    }
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

/// Bytes after the UDP header of a frame of `opcode` with a payload of
/// `payload_len` bytes.
fn transport_len(opcode: Opcode, payload_len: usize) -> usize {
    BTH_LEN
        + ExtensionHeaders::len_for(opcode)
        + payload_len
        + usize::from(pad_count(payload_len))
        + ICRC_LEN
}

/// Total bytes of a frame (IPv4 with no options) of `opcode` with a payload
/// of `payload_len` bytes: what a buffer needs to hold it.
pub fn frame_len(opcode: Opcode, payload_len: usize) -> usize {
    ETHERNET_HEADER_LEN + Ipv4Repr::LEN + UDP_HEADER_LEN + transport_len(opcode, payload_len)
}

impl FrameRepr {
    /// Bytes after the UDP header for a payload of `payload_len` bytes.
    fn transport_len(&self, payload_len: usize) -> usize {
        transport_len(self.bth.opcode, payload_len)
    }

    /// Total frame bytes for a payload of `payload_len` bytes.
    pub fn frame_len(&self, payload_len: usize) -> usize {
        frame_len(self.bth.opcode, payload_len)
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

/// A checked, zero-copy view of a whole frame.
///
/// `new_checked` validates everything `parse_frame` does, once, and keeps
/// the offsets; the accessors then decode fields straight from the bytes.
/// This is the receive fast path: nothing is copied but what is asked for.
#[derive(Debug, Clone, Copy)]
pub struct RoceFrame<'a> {
    bytes: &'a [u8],
    bth: BthRepr,
    ip_start: usize,
    udp_start: usize,
    extension_start: usize,
    payload_start: usize,
    payload_end: usize,
}

impl<'a> RoceFrame<'a> {
    /// Checks lengths, the IPv4 header and checksum, the UDP port, the
    /// opcode and its extension headers, the pad count and the ICRC.
    pub fn new_checked(bytes: &'a [u8]) -> Result<RoceFrame<'a>, WireError> {
        let ethernet = EthernetFrame::new_checked(bytes)?;
        if ethernet.ethertype() != ETHERTYPE_IPV4 {
            return Err(WireError::NotIpv4(ethernet.ethertype()));
        }
        let ip_start = ETHERNET_HEADER_LEN;
        let ip = Ipv4Packet::new_checked(&bytes[ip_start..])?;
        if !ip.verify_checksum() {
            return Err(WireError::BadIpChecksum);
        }
        if ip.is_fragment() {
            return Err(WireError::IpFragment);
        }
        if ip.protocol() != PROTOCOL_UDP {
            return Err(WireError::NotUdp(ip.protocol()));
        }
        let udp_start = ip_start + ip.header_len();
        let udp_end = ip_start + usize::from(ip.total_len());
        let udp = UdpDatagram::new_checked(&bytes[udp_start..udp_end])?;
        if udp.destination_port() != ROCEV2_UDP_PORT {
            return Err(WireError::NotRoce(udp.destination_port()));
        }
        let transport_start = udp_start + UDP_HEADER_LEN;
        if udp_end - transport_start < BTH_LEN + ICRC_LEN {
            return Err(WireError::Truncated { header: "BTH" });
        }
        let icrc_start = udp_end - ICRC_LEN;
        let bth = BthRepr::parse(&BthHeader::new_unchecked(&bytes[transport_start..]))?;
        let extension_start = transport_start + BTH_LEN;
        let payload_start = extension_start + ExtensionHeaders::len_for(bth.opcode);
        if payload_start > icrc_start {
            return Err(WireError::Truncated {
                header: "extension",
            });
        }
        if bth.opcode.has_aeth() {
            AckSyndrome::from_u8(bytes[extension_start])?;
        }
        // Executed, a READ request with bytes after its RETH ran as if
        // they were not there.
        if !bth.opcode.carries_payload() && payload_start != icrc_start {
            return Err(WireError::UnexpectedPayload(bth.opcode as u8));
        }
        // The pad count fills the payload out to whole 4-byte words (IBA
        // 9.2, PadCnt): bytes that leave a word part-filled are no frame a
        // sender emits.
        let padded_len = icrc_start - payload_start;
        if !padded_len.is_multiple_of(4) {
            return Err(WireError::UnalignedPayload(padded_len));
        }
        let payload_end = icrc_start
            .checked_sub(usize::from(bth.pad_count))
            .filter(|end| *end >= payload_start)
            .ok_or(WireError::BadPadCount)?;
        if !icrc::matches(bytes, icrc_start) {
            return Err(WireError::IcrcMismatch);
        }
        Ok(RoceFrame {
            bytes,
            bth,
            ip_start,
            udp_start,
            extension_start,
            payload_start,
            payload_end,
        })
    }

    pub fn bth(&self) -> &BthRepr {
        &self.bth
    }

    pub fn opcode(&self) -> Opcode {
        self.bth.opcode
    }

    pub fn source_address(&self) -> crate::Ipv4Address {
        Ipv4Packet::new_unchecked(&self.bytes[self.ip_start..]).source()
    }

    /// The Ethernet destination: the first six bytes, present in every
    /// checked frame.
    pub fn destination_mac(&self) -> crate::MacAddress {
        let mut mac = [0; 6];
        mac.copy_from_slice(&self.bytes[..6]);
        crate::MacAddress(mac)
    }

    pub fn destination_address(&self) -> crate::Ipv4Address {
        Ipv4Packet::new_unchecked(&self.bytes[self.ip_start..]).destination()
    }

    /// The payload, without pad or ICRC.
    pub fn payload(&self) -> &'a [u8] {
        &self.bytes[self.payload_start..self.payload_end]
    }

    /// The bytes of the extension header `present` says is there, which
    /// starts after the headers the opcode puts before it.
    fn extension_bytes(&self, present: bool, before: usize) -> Option<&'a [u8]> {
        present.then(|| &self.bytes[self.extension_start + before..self.payload_start])
    }

    pub fn reth(&self) -> Option<RethRepr> {
        let bytes = self.extension_bytes(self.bth.opcode.has_reth(), 0)?;
        Some(RethRepr::parse(&RethHeader::new_unchecked(bytes)))
    }

    pub fn aeth(&self) -> Option<AethRepr> {
        let bytes = self.extension_bytes(self.bth.opcode.has_aeth(), 0)?;
        Some(AethRepr::parse(&AethHeader::new_unchecked(bytes)).expect("syndrome checked"))
    }

    pub fn atomic_eth(&self) -> Option<AtomicEthRepr> {
        let bytes = self.extension_bytes(self.bth.opcode.has_atomic_eth(), 0)?;
        Some(AtomicEthRepr::parse(&AtomicEthHeader::new_unchecked(bytes)))
    }

    pub fn atomic_ack_eth(&self) -> Option<AtomicAckEthRepr> {
        let present = self.bth.opcode.has_atomic_ack_eth();
        let bytes = self.extension_bytes(present, AethRepr::LEN)?;
        Some(AtomicAckEthRepr::parse(&AtomicAckEthHeader::new_unchecked(
            bytes,
        )))
    }

    /// ImmDt, or the IETH of a SEND-with-invalidate: always the last
    /// extension header.
    pub fn immediate(&self) -> Option<ImmDtRepr> {
        let opcode = self.bth.opcode;
        let present = opcode.has_immediate() || opcode.has_invalidate();
        let before = ExtensionHeaders::len_for(opcode).saturating_sub(ImmDtRepr::LEN);
        let bytes = self.extension_bytes(present, before)?;
        Some(ImmDtRepr::parse(&ImmDtHeader::new_unchecked(bytes)))
    }

    /// Every header as a `FrameRepr`.
    pub fn repr(&self) -> FrameRepr {
        let ethernet = EthernetRepr::parse(&EthernetFrame::new_unchecked(self.bytes));
        let ip = Ipv4Packet::new_unchecked(&self.bytes[self.ip_start..]);
        let ipv4 = Ipv4Repr::parse(&ip).expect("checked in new_checked");
        let udp_end = self.ip_start + usize::from(ip.total_len());
        let udp = UdpRepr::parse(&UdpDatagram::new_unchecked(
            &self.bytes[self.udp_start..udp_end],
        ));
        let extension = ExtensionHeaders {
            reth: self.reth(),
            aeth: self.aeth(),
            atomic_eth: self.atomic_eth(),
            atomic_ack_eth: self.atomic_ack_eth(),
            immediate: self.immediate(),
        };
        FrameRepr {
            ethernet,
            ipv4,
            udp,
            bth: self.bth,
            extension,
        }
    }
}

/// Parses and verifies a whole frame: lengths, IPv4 checksum, UDP port,
/// opcode, extension headers, pad and ICRC. Never panics.
pub fn parse_frame(bytes: &[u8]) -> Result<ParsedFrame<'_>, WireError> {
    let frame = RoceFrame::new_checked(bytes)?;
    Ok(ParsedFrame {
        repr: frame.repr(),
        payload: frame.payload(),
    })
}

/// The harness of the `parse_frame` fuzz target, kept here so that its
/// seeds replay as tests: any bytes parse or fail with a typed error, and
/// a frame that parses re-emits to one that parses to the same headers
/// and payload (the fields the emitter derives, lengths and pad, may
/// differ from a frame that carried IP options or Ethernet padding).
/// Returns whether it parsed.
pub fn any_frame(bytes: &[u8]) -> bool {
    let Ok(parsed) = parse_frame(bytes) else {
        return false;
    };
    let mut buffer = vec![0u8; parsed.repr.frame_len(parsed.payload.len())];
    let written =
        emit_frame(&parsed.repr, parsed.payload, &mut buffer).expect("a parsed frame re-emits");
    let again = parse_frame(&buffer[..written]).expect("an emitted frame parses");
    assert_eq!(again.payload, parsed.payload);
    assert_eq!(again.repr.bth, parsed.repr.bth);
    assert_eq!(again.repr.extension, parsed.repr.extension);
    true
}

/// Emits a frame with `payload` into `buffer`; returns the frame length.
pub fn emit_frame(repr: &FrameRepr, payload: &[u8], buffer: &mut [u8]) -> Result<usize, WireError> {
    emit_frame_with(repr, payload.len(), buffer, |space| {
        copy_bytes(space, payload)
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
    let template = FlowTemplate::new(&repr.ethernet, &repr.ipv4, &repr.udp);
    template.emit(&repr.bth, &repr.extension, payload_len, buffer, fill)
}

const IP_START: usize = ETHERNET_HEADER_LEN;
/// From this size on, the send path computes the ICRC in place.
const IN_PLACE_ICRC_MIN_FRAME_BYTES: usize = 256;
const UDP_START: usize = IP_START + Ipv4Repr::LEN;
const BTH_START: usize = UDP_START + UDP_HEADER_LEN;

/// The Ethernet, IPv4 and UDP headers of one flow, built once and patched
/// per packet: the transmit fast path. Only the two length fields and the
/// IPv4 checksum change from packet to packet; the checksum is finished
/// from a sum precomputed over the fixed fields.
#[derive(Debug, Clone, Copy)]
pub struct FlowTemplate {
    headers: [u8; BTH_START],
    /// One's-complement sum of the IPv4 header with zero length and checksum.
    ip_partial_sum: u32,
}

impl FlowTemplate {
    /// A template from the flow's headers; their length fields are ignored.
    pub fn new(ethernet: &EthernetRepr, ipv4: &Ipv4Repr, udp: &UdpRepr) -> FlowTemplate {
        let mut headers = [0u8; BTH_START];
        let mut ethernet = *ethernet;
        ethernet.ethertype = ETHERTYPE_IPV4;
        ethernet.emit(&mut EthernetFrame::new_unchecked(&mut headers[..IP_START]));
        let mut ipv4 = *ipv4;
        ipv4.protocol = PROTOCOL_UDP;
        ipv4.payload_len = 0;
        ipv4.emit(&mut headers[IP_START..UDP_START])
            .expect("20 bytes");
        headers[IP_START + 2..IP_START + 4].fill(0);
        headers[IP_START + 10..IP_START + 12].fill(0);
        // Its length is ignored too: emitted as given, one past 16 bits
        // failed here (a panic) before `emit` could refuse the payload.
        let mut udp = *udp;
        udp.payload_len = 0;
        udp.emit(&mut headers[UDP_START..BTH_START])
            .expect("8 bytes");
        let ip_partial_sum = headers[IP_START..UDP_START]
            .chunks_exact(2)
            .map(|pair| u32::from(u16::from_be_bytes([pair[0], pair[1]])))
            .sum();
        FlowTemplate {
            headers,
            ip_partial_sum,
        }
    }

    /// Emits one frame of this flow and returns its length. `fill` writes
    /// the `payload_len` payload bytes in place.
    pub fn emit(
        &self,
        bth: &BthRepr,
        extension: &ExtensionHeaders,
        payload_len: usize,
        buffer: &mut [u8],
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<usize, WireError> {
        if !extension.matches(bth.opcode) {
            return Err(WireError::UnknownOpcode(bth.opcode as u8));
        }
        if !bth.opcode.carries_payload() && payload_len > 0 {
            return Err(WireError::UnexpectedPayload(bth.opcode as u8));
        }
        let pad = usize::from(pad_count(payload_len));
        let transport_len = transport_len(bth.opcode, payload_len);
        let frame_len = BTH_START + transport_len;
        let ip_total = u16::try_from(frame_len - IP_START)
            .map_err(|_| WireError::PayloadTooLarge(payload_len))?;
        if buffer.len() < frame_len {
            return Err(WireError::BufferTooSmall { needed: frame_len });
        }
        let frame = &mut buffer[..frame_len];
        frame[..BTH_START].copy_from_slice(&self.headers);
        let mut sum = self.ip_partial_sum + u32::from(ip_total);
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        frame[IP_START + 2..IP_START + 4].copy_from_slice(&ip_total.to_be_bytes());
        frame[IP_START + 10..IP_START + 12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        let udp_len = (UDP_HEADER_LEN + transport_len) as u16;
        frame[UDP_START + 4..UDP_START + 6].copy_from_slice(&udp_len.to_be_bytes());
        let mut bth = *bth;
        bth.pad_count = pad as u8;
        bth.emit(&mut frame[BTH_START..])?;
        let payload_start =
            BTH_START + BTH_LEN + extension.emit(&mut frame[BTH_START + BTH_LEN..])?;
        let payload_end = payload_start + payload_len;
        fill(&mut frame[payload_start..payload_end]);
        let icrc_start = frame_len - ICRC_LEN;
        frame[payload_end..icrc_start].fill(0);
        // A large frame just written hashes fastest in place (see
        // `compute_in_place`); a small one staged in chunks.
        let icrc = if frame_len >= IN_PLACE_ICRC_MIN_FRAME_BYTES {
            icrc::compute_in_place(frame, icrc_start)
        } else {
            icrc::compute_frame(frame, icrc_start)
        };
        frame[icrc_start..].copy_from_slice(&icrc::to_wire(icrc));
        Ok(frame_len)
    }
}
