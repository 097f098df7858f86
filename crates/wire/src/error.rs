//! Why a frame was rejected. Every variant is also a drop reason, so ports
//! and RNICs count drops by `WireError` without string formatting.

use thiserror::Error;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
pub enum WireError {
    #[error("frame too short for the {header} header")]
    Truncated { header: &'static str },
    #[error("ethertype {0:#06x} is not IPv4")]
    NotIpv4(u16),
    #[error("IP version {0} is not 4")]
    BadIpVersion(u8),
    #[error("IPv4 header length field is invalid")]
    BadIpHeaderLength,
    #[error("IPv4 total length disagrees with the frame")]
    BadIpTotalLength,
    #[error("IPv4 header checksum mismatch")]
    BadIpChecksum,
    #[error("IPv4 fragments are not RoCEv2")]
    IpFragment,
    #[error("IP protocol {0} is not UDP")]
    NotUdp(u8),
    #[error("UDP length disagrees with the IP payload")]
    BadUdpLength,
    #[error("UDP destination port {0} is not RoCEv2 (4791)")]
    NotRoce(u16),
    #[error("BTH transport version {0} is not 0")]
    BadTransportVersion(u8),
    #[error("opcode {0:#04x} is not a supported RC opcode")]
    UnknownOpcode(u8),
    #[error("AETH syndrome {0:#04x} is reserved")]
    ReservedSyndrome(u8),
    #[error("pad count exceeds the payload")]
    BadPadCount,
    #[error("payload and pad of {0} bytes are not a whole number of 4-byte words")]
    UnalignedPayload(usize),
    #[error("opcode {0:#04x} carries no payload, but the frame has bytes after its headers")]
    UnexpectedPayload(u8),
    #[error("ICRC mismatch")]
    IcrcMismatch,
    #[error("output buffer too small: need {needed} bytes")]
    BufferTooSmall { needed: usize },
    #[error("payload of {0} bytes does not fit one frame")]
    PayloadTooLarge(usize),
}

impl WireError {
    /// A stable name for the kind of failure, without its details: the
    /// key drop counters are grouped by.
    pub fn kind(&self) -> &'static str {
        match self {
            WireError::Truncated { .. } => "truncated",
            WireError::NotIpv4(_) => "not_ipv4",
            WireError::BadIpVersion(_) => "bad_ip_version",
            WireError::BadIpHeaderLength => "bad_ip_header_length",
            WireError::BadIpTotalLength => "bad_ip_total_length",
            WireError::BadIpChecksum => "bad_ip_checksum",
            WireError::IpFragment => "ip_fragment",
            WireError::NotUdp(_) => "not_udp",
            WireError::BadUdpLength => "bad_udp_length",
            WireError::NotRoce(_) => "not_roce",
            WireError::BadTransportVersion(_) => "bad_transport_version",
            WireError::UnknownOpcode(_) => "unknown_opcode",
            WireError::ReservedSyndrome(_) => "reserved_syndrome",
            WireError::BadPadCount => "bad_pad_count",
            WireError::UnalignedPayload(_) => "unaligned_payload",
            WireError::UnexpectedPayload(_) => "unexpected_payload",
            WireError::IcrcMismatch => "icrc_mismatch",
            WireError::BufferTooSmall { .. } => "buffer_too_small",
            WireError::PayloadTooLarge(_) => "payload_too_large",
        }
    }

    /// The error with the values it carries zeroed: one per kind, so a
    /// counter keyed by it stays as small as the list of kinds (keyed by
    /// the whole error, a sweep of ethertypes or opcodes from a hostile
    /// peer grew a device's drop counters by an entry per value).
    pub fn without_details(self) -> WireError {
        match self {
            WireError::NotIpv4(_) => WireError::NotIpv4(0),
            WireError::BadIpVersion(_) => WireError::BadIpVersion(0),
            WireError::NotUdp(_) => WireError::NotUdp(0),
            WireError::NotRoce(_) => WireError::NotRoce(0),
            WireError::BadTransportVersion(_) => WireError::BadTransportVersion(0),
            WireError::UnknownOpcode(_) => WireError::UnknownOpcode(0),
            WireError::ReservedSyndrome(_) => WireError::ReservedSyndrome(0),
            WireError::UnexpectedPayload(_) => WireError::UnexpectedPayload(0),
            WireError::UnalignedPayload(_) => WireError::UnalignedPayload(0),
            WireError::BufferTooSmall { .. } => WireError::BufferTooSmall { needed: 0 },
            WireError::PayloadTooLarge(_) => WireError::PayloadTooLarge(0),
            WireError::Truncated { .. }
            | WireError::BadIpHeaderLength
            | WireError::BadIpTotalLength
            | WireError::BadIpChecksum
            | WireError::IpFragment
            | WireError::BadUdpLength
            | WireError::BadPadCount
            | WireError::IcrcMismatch => self,
        }
    }
}
