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

    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&[0xff; 8]);

    let mut ip = [0u8; MAX_IPV4_HEADER_LEN];
    let ip = &mut ip[..ipv4_header.len()];
    ip.copy_from_slice(ipv4_header);
    ip[1] = 0xff; // type of service
    ip[8] = 0xff; // time to live
    ip[10] = 0xff; // header checksum
    ip[11] = 0xff;
    hasher.update(ip);

    let mut udp = [0u8; UDP_HEADER_LEN];
    udp.copy_from_slice(udp_header);
    udp[6] = 0xff; // checksum
    udp[7] = 0xff;
    hasher.update(&udp);

    let mut bth = [0u8; BTH_LEN];
    bth.copy_from_slice(&transport[..BTH_LEN]);
    bth[4] = 0xff; // FECN, BECN, reserved
    hasher.update(&bth);
    hasher.update(&transport[BTH_LEN..]);
    hasher.finalize()
}

/// The ICRC as it appears on the wire.
pub fn to_wire(icrc: u32) -> [u8; ICRC_LEN] {
    icrc.to_le_bytes()
}

pub fn from_wire(bytes: [u8; ICRC_LEN]) -> u32 {
    u32::from_le_bytes(bytes)
}
