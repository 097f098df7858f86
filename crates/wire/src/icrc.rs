//! The RoCEv2 invariant CRC.
//!
//! CRC-32 (the Ethernet polynomial) over: eight bytes of 0xFF standing in for
//! the masked LRH; the IPv4 header with TOS, TTL and header checksum set to
//! all ones; the UDP header with its checksum set to 0xFFFF; the BTH with
//! byte 4 (FECN, BECN, reserved) set to 0xFF; then everything after the BTH
//! up to the ICRC. The masked fields are the ones routers may rewrite in
//! flight. The result goes on the wire little-endian.

use crate::bth::BTH_LEN;
use crate::ethernet::ETHERNET_HEADER_LEN;
use crate::udp::UDP_HEADER_LEN;

pub const ICRC_LEN: usize = 4;

/// A hasher from a register of `initial`, cloned from one made once:
/// making a `crc32fast::Hasher` detects the CPU's features every time, a
/// cost comparable to hashing a small frame; a clone keeps what was found.
fn hasher(initial: u32) -> crc32fast::Hasher {
    static FROM_ZERO: std::sync::OnceLock<crc32fast::Hasher> = std::sync::OnceLock::new();
    static FROM_ONES: std::sync::OnceLock<crc32fast::Hasher> = std::sync::OnceLock::new();
    let template = match initial {
        0 => &FROM_ZERO,
        0xffff_ffff => &FROM_ONES,
        _ => return crc32fast::Hasher::new_with_initial(initial),
    };
    template
        .get_or_init(|| crc32fast::Hasher::new_with_initial(initial))
        .clone()
}
const MAX_IPV4_HEADER_LEN: usize = 60;
/// crc32fast hashes shorter slices with a table loop, longer ones with
/// carry-less multiplication, which costs about the same at 128 bytes as
/// the table loop at 64.
const VECTOR_MIN_BYTES: usize = 128;
/// Staging room: small frames fit whole, larger ones stage the headers.
const STAGED_BYTES: usize = 192;

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

    // CRC-32 presets its register to all ones, and the recipe begins with
    // eight 0xFF bytes: the first four cancel the preset. So the ICRC is the
    // CRC from a zero register over 0xFF x 4, the masked headers and the
    // rest, and from a zero register leading zero bytes change nothing.
    // Small frames are therefore staged after zero padding up to
    // `VECTOR_MIN_BYTES`, where crc32fast switches from its table loop to
    // its carry-less-multiply path, and hashed in one call.
    let mut staged = [0u8; STAGED_BYTES];
    let head_len = 4 + ipv4_header.len() + UDP_HEADER_LEN + BTH_LEN;
    let rest = &transport[BTH_LEN..];
    let inline = head_len + rest.len() <= STAGED_BYTES;
    let content_len = if inline {
        head_len + rest.len()
    } else {
        head_len
    };
    let start = STAGED_BYTES - content_len;
    let ip = start + 4;
    let udp = ip + ipv4_header.len();
    let bth = udp + UDP_HEADER_LEN;
    staged[start..ip].fill(0xff);
    staged[ip..udp].copy_from_slice(ipv4_header);
    staged[udp..bth].copy_from_slice(udp_header);
    staged[bth..bth + BTH_LEN].copy_from_slice(&transport[..BTH_LEN]);
    if inline {
        staged[bth + BTH_LEN..].copy_from_slice(rest);
    }
    for masked in masked_offsets(ip, udp, bth) {
        staged[masked] = 0xff;
    }
    // An initial value of all ones is a zero register in crc32fast's terms.
    let mut hasher = hasher(0xffff_ffff);
    // Pad only a frame that fits whole: a large frame's headers alone hash
    // faster on the table path than padded to the vector path.
    let hashed_from = if inline {
        start.min(STAGED_BYTES - VECTOR_MIN_BYTES)
    } else {
        start
    };
    hasher.update(&staged[hashed_from..]);
    if !inline {
        hasher.update(rest);
    }
    hasher.finalize()
}

/// Offsets of the bytes the recipe sets to ones, given where the IPv4, UDP
/// and BTH headers start: TOS, TTL, the IPv4 checksum, the UDP checksum and
/// BTH byte 4 (FECN, BECN, reserved), the fields routers may rewrite.
fn masked_offsets(ip: usize, udp: usize, bth: usize) -> [usize; 7] {
    [ip + 1, ip + 8, ip + 10, ip + 11, udp + 6, udp + 7, bth + 4]
}

/// The ICRC of an Ethernet II / IPv4 frame whose ICRC starts at
/// `icrc_start`, computed over the frame in place: for one pass the eight
/// bytes before the IPv4 header (the end of the Ethernet header) stand in
/// for the recipe's leading ones and the masked fields are set to ones;
/// all of it is restored afterwards. For a large frame this is one vector
/// pass instead of a staged copy of the headers plus a second pass.
///
/// # Panics
/// If the frame is shorter than its headers; callers emit it first.
pub fn compute_in_place(frame: &mut [u8], icrc_start: usize) -> u32 {
    let ip = ETHERNET_HEADER_LEN;
    let udp = ip + usize::from(frame[ip] & 0x0f) * 4;
    let bth = udp + UDP_HEADER_LEN;
    assert!(bth + BTH_LEN <= icrc_start && icrc_start <= frame.len());
    let masked = masked_offsets(ip, udp, bth);
    let prefix = ip - 8..ip;
    let saved_prefix: [u8; 8] = frame[prefix.clone()].try_into().expect("8 bytes");
    let saved = masked.map(|index| frame[index]);
    frame[prefix.clone()].fill(0xff);
    for index in masked {
        frame[index] = 0xff;
    }
    let mut hasher = hasher(0);
    hasher.update(&frame[prefix.start..icrc_start]);
    let icrc = hasher.finalize();
    frame[prefix].copy_from_slice(&saved_prefix);
    for (index, value) in masked.into_iter().zip(saved) {
        frame[index] = value;
    }
    icrc
}

/// The ICRC as it appears on the wire.
pub fn to_wire(icrc: u32) -> [u8; ICRC_LEN] {
    icrc.to_le_bytes()
}

pub fn from_wire(bytes: [u8; ICRC_LEN]) -> u32 {
    u32::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn in_place_equals_staged_and_restores_the_frame(
            mut frame in proptest::collection::vec(any::<u8>(), 66..600),
            options in 0usize..3,
        ) {
            // A valid IHL (5 to 7) so the layout is well defined.
            frame[ETHERNET_HEADER_LEN] = 0x45 + options as u8;
            let ip = ETHERNET_HEADER_LEN;
            let udp = ip + 20 + options * 4;
            let bth = udp + UDP_HEADER_LEN;
            let icrc_start = frame.len() - ICRC_LEN;
            prop_assume!(bth + BTH_LEN <= icrc_start);
            let before = frame.clone();
            let staged = compute(&frame[ip..udp], &frame[udp..bth], &frame[bth..icrc_start]);
            prop_assert_eq!(compute_in_place(&mut frame, icrc_start), staged);
            prop_assert_eq!(frame, before);
        }
    }
}
