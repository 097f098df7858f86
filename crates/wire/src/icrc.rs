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
use crate::ipv4::Ipv4Packet;
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
/// From this length crc32fast folds four carry-less-multiply streams at
/// once (below it, one), which costs about the same at 128 bytes as one
/// stream at 64.
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
    // `VECTOR_MIN_BYTES`, where crc32fast starts folding four streams at
    // once, and hashed in one call.
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
const fn masked_offsets(ip: usize, udp: usize, bth: usize) -> [usize; 7] {
    [ip + 1, ip + 8, ip + 10, ip + 11, udp + 6, udp + 7, bth + 4]
}

/// Where the IPv4 header starts in an Ethernet II frame.
const IP_START: usize = ETHERNET_HEADER_LEN;
/// The version and header-length byte of an IPv4 header without options,
/// the only layout `compute_frame` stages itself.
const IPV4_WITHOUT_OPTIONS: u8 = 0x45;
/// Where the recipe starts in such a frame, taken from a zero register: the
/// four bytes of ones that survive the preset stand where the last four
/// bytes of the Ethernet header are.
const RECIPE_START: usize = IP_START - 4;
/// The length of an IPv4 header without options.
const IPV4_HEADER_LEN: usize = 20;
/// One past the last masked byte (BTH byte 4) when the IPv4 header has no
/// options.
const MASKED_END: usize = IP_START + IPV4_HEADER_LEN + UDP_HEADER_LEN + 4 + 1;
/// The unit of staging: crc32fast's vector paths load 16 bytes at a time.
const CHUNK_BYTES: usize = 16;
/// Frames whose chunk grid (`icrc_start / 16` chunks, from byte
/// `icrc_start % 16`) has at most this many chunks are staged whole and
/// hashed in one call; larger ones stage only the chunks with masked bytes.
const MAX_STAGED_CHUNKS: usize = 12;
/// Chunks that reach past every masked byte wherever the chunk grid starts
/// (at most 15 bytes into the frame).
const MASKED_CHUNKS: usize = MASKED_END.div_ceil(CHUNK_BYTES);
/// Bytes of the staging masks: every chunk that starts before `MASKED_END`.
const MASK_BYTES: usize = MASKED_END - 1 + CHUNK_BYTES;

/// What staging does to each of a frame's leading bytes: `keep` clears the
/// bytes before the recipe (leading zeros leave a zero register as it is),
/// `set` writes the recipe's ones and the masked fields.
struct StagingMasks {
    keep: [u8; MASK_BYTES],
    set: [u8; MASK_BYTES],
}

const STAGING_MASKS: StagingMasks = {
    let mut keep = [0xff; MASK_BYTES];
    let mut set = [0; MASK_BYTES];
    let mut index = 0;
    while index < RECIPE_START {
        keep[index] = 0;
        index += 1;
    }
    while index < IP_START {
        set[index] = 0xff;
        index += 1;
    }
    let udp = IP_START + IPV4_HEADER_LEN;
    let masked = masked_offsets(IP_START, udp, udp + UDP_HEADER_LEN);
    let mut each = 0;
    while each < masked.len() {
        set[masked[each]] = 0xff;
        each += 1;
    }
    StagingMasks { keep, set }
};

/// The ICRC of an Ethernet II / IPv4 frame whose ICRC starts at
/// `icrc_start`, read from the frame as it is.
///
/// The recipe's masked bytes are staged in 16-byte chunks, each one load,
/// a mask and one store. Staging byte by byte, as `compute` does, costs
/// more than it seems: a 16-byte load of bytes written by narrower stores
/// cannot take them from the store buffer, so the CRC waits until those
/// stores reach the cache. That wait was a third of the time to verify a 4 KiB
/// frame, and more than half of it for a small one.
///
/// The chunk grid ends at `icrc_start`. It starts within the first 16
/// bytes of the frame, before the recipe (whose leading bytes are then
/// cleared: from a zero register, leading zeros change nothing) or up to
/// five bytes into it (which the starting register then accounts for).
///
/// # Panics
/// If the frame is shorter than its headers, or its IPv4 header length is
/// under 20 bytes; `RoceFrame::new_checked` checks both first.
pub fn compute_frame(frame: &[u8], icrc_start: usize) -> u32 {
    let (udp, bth) = transport_layout(frame, icrc_start);
    if frame[IP_START] != IPV4_WITHOUT_OPTIONS {
        return compute(
            &frame[IP_START..udp],
            &frame[udp..bth],
            &frame[bth..icrc_start],
        );
    }
    let grid_start = icrc_start % CHUNK_BYTES;
    let chunk_count = icrc_start / CHUNK_BYTES;
    let staged_count = if chunk_count <= MAX_STAGED_CHUNKS {
        chunk_count
    } else {
        MASKED_CHUNKS
    };
    let mut staged = [[0u8; CHUNK_BYTES]; MAX_STAGED_CHUNKS];
    // Through black_box, or the compiler sees constant masks and turns the
    // masking back into the single-byte stores this function avoids.
    let masks = std::hint::black_box(&STAGING_MASKS);
    for (index, chunk) in staged[..staged_count].iter_mut().enumerate() {
        let from = grid_start + index * CHUNK_BYTES;
        let bytes: [u8; CHUNK_BYTES] = frame[from..from + CHUNK_BYTES].try_into().expect("a chunk");
        *chunk = if from < MASKED_END {
            std::array::from_fn(|at| (bytes[at] & masks.keep[from + at]) | masks.set[from + at])
        } else {
            bytes
        };
    }
    let mut hasher = hasher_after_recipe_prefix(grid_start);
    hasher.update(staged[..staged_count].as_flattened());
    hasher.update(&frame[grid_start + staged_count * CHUNK_BYTES..icrc_start]);
    hasher.finalize()
}

/// Where the UDP header and the BTH start in an Ethernet II / IPv4 frame,
/// from the IPv4 header's length.
///
/// # Panics
/// If the BTH does not fit before `icrc_start`, or `icrc_start` is past
/// the frame.
fn transport_layout(frame: &[u8], icrc_start: usize) -> (usize, usize) {
    let udp = IP_START + Ipv4Packet::new_unchecked(&frame[IP_START..]).header_len();
    let bth = udp + UDP_HEADER_LEN;
    assert!(bth + BTH_LEN <= icrc_start && icrc_start <= frame.len());
    (udp, bth)
}

/// A hasher that has taken the recipe's bytes before `grid_start`: none
/// when the grid starts at or before the recipe, else up to four ones and
/// the IPv4 version and header-length byte. Cloned from ones made once,
/// as `hasher` is.
fn hasher_after_recipe_prefix(grid_start: usize) -> crc32fast::Hasher {
    const PREFIX: [u8; IP_START + 1 - RECIPE_START] =
        [0xff, 0xff, 0xff, 0xff, IPV4_WITHOUT_OPTIONS];
    static TEMPLATES: std::sync::OnceLock<[crc32fast::Hasher; PREFIX.len() + 1]> =
        std::sync::OnceLock::new();
    let templates = TEMPLATES.get_or_init(|| {
        std::array::from_fn(|length| {
            let mut hasher = hasher(0xffff_ffff);
            hasher.update(&PREFIX[..length]);
            hasher
        })
    });
    templates[grid_start.saturating_sub(RECIPE_START)].clone()
}

/// The ICRC of an Ethernet II / IPv4 frame whose ICRC starts at
/// `icrc_start`, computed over the frame in place: for one pass the eight
/// bytes before the IPv4 header (the end of the Ethernet header) stand in
/// for the recipe's leading ones and the masked fields are set to ones;
/// all of it is restored afterwards. For a frame just written, as on the
/// send path, this beats `compute_frame` from 256 bytes on: the chunks it
/// would stage wait for those writes to retire anyway, and one pass saves
/// its second call.
///
/// # Panics
/// If the frame is shorter than its headers; callers emit it first.
pub fn compute_in_place(frame: &mut [u8], icrc_start: usize) -> u32 {
    let ip = IP_START;
    let (udp, bth) = transport_layout(frame, icrc_start);
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

/// Whether the ICRC stored at `icrc_start` matches the frame's bytes
/// before it; false if the frame ends before the ICRC does.
///
/// # Panics
/// As [`compute_frame`], if the frame is shorter than its headers.
pub fn matches(frame: &[u8], icrc_start: usize) -> bool {
    frame
        .get(icrc_start..icrc_start + ICRC_LEN)
        .and_then(|stored| <[u8; ICRC_LEN]>::try_from(stored).ok())
        .is_some_and(|stored| from_wire(stored) == compute_frame(frame, icrc_start))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The recipe as the comment at the top of this file gives it, byte
    /// by byte, with a fresh crc32fast hasher: the reference the staged
    /// paths are checked against.
    fn recipe_icrc(frame: &[u8], icrc_start: usize) -> u32 {
        let ip = ETHERNET_HEADER_LEN;
        let udp = ip + usize::from(frame[ip] & 0x0f) * 4;
        let bth = udp + UDP_HEADER_LEN;
        let mut recipe = vec![0xff; 8];
        recipe.extend_from_slice(&frame[ip..icrc_start]);
        for masked in masked_offsets(ip, udp, bth) {
            recipe[masked - ip + 8] = 0xff;
        }
        crc32fast::hash(&recipe)
    }

    fn frame_of(length: usize, seed: u8) -> Vec<u8> {
        let mut frame: Vec<u8> = (0..length)
            .map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed))
            .collect();
        frame[ETHERNET_HEADER_LEN] = IPV4_WITHOUT_OPTIONS;
        frame
    }

    /// Every place the chunk grid can start, staged whole and staged in
    /// part, with and without bytes after the ICRC.
    #[test]
    fn frame_icrc_follows_the_recipe_at_every_length() {
        for icrc_start in 54..(MAX_STAGED_CHUNKS + 4) * CHUNK_BYTES {
            for slack in [ICRC_LEN, ICRC_LEN + 7] {
                let frame = frame_of(icrc_start + slack, icrc_start as u8);
                assert_eq!(
                    compute_frame(&frame, icrc_start),
                    recipe_icrc(&frame, icrc_start),
                    "ICRC ending at byte {icrc_start}"
                );
            }
        }
    }

    proptest! {
        #[test]
        fn every_icrc_path_equals_the_recipe(
            mut frame in proptest::collection::vec(any::<u8>(), 58..5000),
            options in 0usize..3,
            slack in 0usize..16,
        ) {
            // A valid IHL (5 to 7) so the layout is well defined.
            frame[ETHERNET_HEADER_LEN] = 0x45 + options as u8;
            let ip = ETHERNET_HEADER_LEN;
            let udp = ip + 20 + options * 4;
            let bth = udp + UDP_HEADER_LEN;
            let icrc_start = frame.len().saturating_sub(ICRC_LEN + slack);
            prop_assume!(bth + BTH_LEN <= icrc_start);
            let staged = compute(&frame[ip..udp], &frame[udp..bth], &frame[bth..icrc_start]);
            prop_assert_eq!(staged, recipe_icrc(&frame, icrc_start));
            prop_assert_eq!(compute_frame(&frame, icrc_start), staged);
            let before = frame.clone();
            prop_assert_eq!(compute_in_place(&mut frame, icrc_start), staged);
            prop_assert_eq!(frame, before, "computing in place restores the frame");
        }
    }
}
