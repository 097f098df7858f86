//! The ICRC against a frame a ConnectX-4 Lx put on the wire.

use remora_wire::{icrc, parse_frame, Opcode, Psn, Qpn};

fn captured_cnp() -> Vec<u8> {
    let hex = include_str!("../testdata/connectx4lx_cnp.hex").trim();
    (0..hex.len())
        .step_by(2)
        .map(|index| u8::from_str_radix(&hex[index..index + 2], 16).expect("hex"))
        .collect()
}

/// Offsets in the captured frame: Ethernet 14, IPv4 20 (no options), UDP 8.
const IP_START: usize = 14;
const UDP_START: usize = 34;
const BTH_START: usize = 42;

fn icrc_of(frame: &[u8]) -> u32 {
    let end = frame.len() - 4;
    icrc::compute(
        &frame[IP_START..UDP_START],
        &frame[UDP_START..BTH_START],
        &frame[BTH_START..end],
    )
}

#[test]
fn connectx4_lx_cnp_icrc_matches_the_hardware() {
    let frame = captured_cnp();
    assert_eq!(&frame[frame.len() - 4..], &[0x82, 0xfd, 0x00, 0x2a]);
    assert_eq!(icrc::to_wire(icrc_of(&frame)), [0x82, 0xfd, 0x00, 0x2a]);
    let icrc_start = frame.len() - 4;
    assert_eq!(
        icrc::to_wire(icrc::compute_frame(&frame, icrc_start)),
        [0x82, 0xfd, 0x00, 0x2a]
    );

    let parsed = parse_frame(&frame).expect("the captured CNP parses");
    assert_eq!(parsed.repr.bth.opcode, Opcode::CongestionNotification);
    assert_eq!(parsed.repr.bth.destination_qp, Qpn::new(0x118).unwrap());
    assert_eq!(parsed.repr.bth.psn, Psn::new(0));
    assert!(parsed.repr.bth.backward_congestion);
    assert_eq!(parsed.repr.ipv4.type_of_service, 0xc2);
    assert_eq!(parsed.payload.len(), 16, "a CNP carries 16 reserved bytes");
}

/// Byte offsets of the fields the ICRC masks out: TOS, TTL, IP checksum,
/// UDP checksum and BTH byte 4.
fn is_masked(byte_offset: usize) -> bool {
    [
        IP_START + 1,
        IP_START + 8,
        IP_START + 10,
        IP_START + 11,
        UDP_START + 6,
        UDP_START + 7,
        BTH_START + 4,
    ]
    .contains(&byte_offset)
}

#[test]
fn flipping_any_covered_bit_fails_verification() {
    let frame = captured_cnp();
    let wire_icrc = icrc_of(&frame);
    let covered_end = frame.len() - 4;
    let mut covered_bits = 0;
    for byte_offset in IP_START..covered_end {
        for bit in 0..8 {
            let mut flipped = frame.clone();
            flipped[byte_offset] ^= 1 << bit;
            // The chunked form checks the same masks the byte-staged one
            // does, against this test's own list of masked fields. It reads
            // the header length from the frame, so flips of that nibble
            // (which frame parsing refuses first) are left to `compute`.
            let chunked = if flipped[IP_START] & 0x0f == 5 {
                icrc::compute_frame(&flipped, covered_end)
            } else {
                icrc_of(&flipped)
            };
            if is_masked(byte_offset) {
                assert_eq!(icrc_of(&flipped), wire_icrc, "masked byte {byte_offset}");
                assert_eq!(chunked, wire_icrc, "masked byte {byte_offset}");
                continue;
            }
            covered_bits += 1;
            assert_ne!(icrc_of(&flipped), wire_icrc, "byte {byte_offset} bit {bit}");
            assert_ne!(chunked, wire_icrc, "byte {byte_offset} bit {bit}");
            assert!(
                parse_frame(&flipped).is_err(),
                "byte {byte_offset} bit {bit}"
            );
        }
    }
    // 20 + 8 + 12 + 16 covered header and payload bytes, less 7 masked.
    assert_eq!(covered_bits, (56 - 7) * 8);
}

#[test]
fn flipping_an_icrc_bit_fails_verification() {
    let frame = captured_cnp();
    for byte_offset in frame.len() - 4..frame.len() {
        for bit in 0..8 {
            let mut flipped = frame.clone();
            flipped[byte_offset] ^= 1 << bit;
            assert_eq!(
                parse_frame(&flipped).unwrap_err(),
                remora_wire::WireError::IcrcMismatch
            );
        }
    }
}

#[test]
fn every_truncation_is_rejected_without_panic() {
    let frame = captured_cnp();
    for len in 0..frame.len() {
        assert!(parse_frame(&frame[..len]).is_err(), "truncated to {len}");
    }
}
