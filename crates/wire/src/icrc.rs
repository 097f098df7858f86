//! The RoCEv2 invariant CRC.
//!
//! CRC-32 (the Ethernet polynomial) over: eight bytes of 0xFF standing in for
//! the masked LRH; the IPv4 header with TOS, TTL and header checksum set to
//! all ones; the UDP header with its checksum set to 0xFFFF; the BTH with
//! byte 4 (FECN, BECN, reserved) set to 0xFF; then everything after the BTH
//! up to the ICRC. The masked fields are the ones routers may rewrite in
//! flight. The result goes on the wire little-endian.

use crate::bth::BTH_LEN;
use crate::udp::UDP_HEADER_LEN;

pub const ICRC_LEN: usize = 4;
const MAX_IPV4_HEADER_LEN: usize = 60;
/// Room for the masked headers (up to 8 + 60 + 8 + 12 bytes) and the
/// extension headers and payload of small frames.
const STAGING_BYTES: usize = 512;

/// ICRC over an IPv4 header, a UDP header and the transport bytes (BTH
/// onward, without the ICRC itself).
///
/// # Panics
/// If the headers are shorter than their fixed lengths; frame parsing
/// checks those lengths before calling this.
pub fn compute(ipv4_header: &[u8], udp_header: &[u8], transport: &[u8]) -> u32 {
    assert!((20..=MAX_IPV4_HEADER_LEN).contains(&ipv4_header.len()));
    assert_eq!(udp_header.len(), UDP_HEADER_LEN);
    assert!(transport.len() >= BTH_LEN);

    // The masked headers are gathered into one buffer, with as much of the
    // rest as fits: crc32fast is far faster on one long slice than on
    // several short ones, and most frames fit whole.
    let mut staged = [0u8; STAGING_BYTES];
    let ip = 8;
    let udp = ip + ipv4_header.len();
    let bth = udp + UDP_HEADER_LEN;
    let mut len = bth + BTH_LEN;
    staged[..ip].fill(0xff);
    staged[ip..udp].copy_from_slice(ipv4_header);
    staged[udp..bth].copy_from_slice(udp_header);
    staged[bth..len].copy_from_slice(&transport[..BTH_LEN]);
    let rest = &transport[BTH_LEN..];
    let inline = rest.len() <= STAGING_BYTES - len;
    if inline {
        staged[len..len + rest.len()].copy_from_slice(rest);
        len += rest.len();
    }
    for masked in [ip + 1, ip + 8, ip + 10, ip + 11, udp + 6, udp + 7, bth + 4] {
        // TOS, TTL, IP checksum, UDP checksum, BTH FECN/BECN/reserved.
        staged[masked] = 0xff;
    }
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&staged[..len]);
    if !inline {
        hasher.update(rest);
    }
    hasher.finalize()
}

/// The ICRC as it appears on the wire.
pub fn to_wire(icrc: u32) -> [u8; ICRC_LEN] {
    icrc.to_le_bytes()
}

pub fn from_wire(bytes: [u8; ICRC_LEN]) -> u32 {
    u32::from_le_bytes(bytes)
}
