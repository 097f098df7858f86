//! `parse(emit(r)) == r` for every header and for whole frames.

use proptest::prelude::*;
use remora_wire::extension::*;
use remora_wire::*;

fn any_psn() -> impl Strategy<Value = Psn> {
    (0u32..=Psn::MAX).prop_map(Psn::new)
}

fn any_qpn() -> impl Strategy<Value = Qpn> {
    (0u32..=Qpn::MAX).prop_map(|value| Qpn::new(value).unwrap())
}

fn any_opcode() -> impl Strategy<Value = Opcode> {
    proptest::sample::select(Opcode::ALL.to_vec())
}

fn any_syndrome() -> impl Strategy<Value = AckSyndrome> {
    prop_oneof![
        (0u8..32).prop_map(|credit_count| AckSyndrome::Ack { credit_count }),
        (0u8..32).prop_map(|timer| AckSyndrome::ReceiverNotReady { timer }),
        proptest::sample::select(vec![
            NakCode::PsnSequenceError,
            NakCode::InvalidRequest,
            NakCode::RemoteAccessError,
            NakCode::RemoteOperationalError,
            NakCode::InvalidRdRequest,
        ])
        .prop_map(AckSyndrome::Nak),
    ]
}

fn any_bth() -> impl Strategy<Value = BthRepr> {
    (
        any_opcode(),
        any::<[bool; 6]>(),
        0u8..4,
        any::<u16>(),
        any_qpn(),
        any_psn(),
    )
        .prop_map(
            |(opcode, flags, pad_count, pkey, destination_qp, psn)| BthRepr {
                opcode,
                solicited_event: flags[0],
                migration_request: flags[1],
                pad_count,
                partition_key: Pkey(pkey),
                forward_congestion: flags[2],
                backward_congestion: flags[3],
                destination_qp,
                ack_request: flags[4],
                psn,
            },
        )
}

fn any_reth() -> impl Strategy<Value = RethRepr> {
    (any::<u64>(), any::<u32>(), any::<u32>()).prop_map(|(address, rkey, dma_length)| RethRepr {
        virtual_address: VirtAddr(address),
        rkey: Rkey(rkey),
        dma_length,
    })
}

fn any_aeth() -> impl Strategy<Value = AethRepr> {
    (any_syndrome(), 0u32..=0x00ff_ffff).prop_map(|(syndrome, msn)| AethRepr {
        syndrome,
        msn: Msn::new(msn),
    })
}

fn any_atomic_eth() -> impl Strategy<Value = AtomicEthRepr> {
    (any::<u64>(), any::<u32>(), any::<u64>(), any::<u64>()).prop_map(
        |(address, rkey, swap_or_add, compare)| AtomicEthRepr {
            virtual_address: VirtAddr(address),
            rkey: Rkey(rkey),
            swap_or_add,
            compare,
        },
    )
}

fn any_extension(opcode: Opcode) -> impl Strategy<Value = ExtensionHeaders> {
    (
        any_reth(),
        any_aeth(),
        any_atomic_eth(),
        any::<u64>(),
        any::<u32>(),
    )
        .prop_map(
            move |(reth, aeth, atomic, original_data, immediate)| ExtensionHeaders {
                reth: opcode.has_reth().then_some(reth),
                aeth: opcode.has_aeth().then_some(aeth),
                atomic_eth: opcode.has_atomic_eth().then_some(atomic),
                atomic_ack_eth: opcode
                    .has_atomic_ack_eth()
                    .then_some(AtomicAckEthRepr { original_data }),
                immediate: (opcode.has_immediate() || opcode.has_invalidate())
                    .then_some(ImmDtRepr { immediate }),
            },
        )
}

fn any_frame_repr() -> impl Strategy<Value = (FrameRepr, Vec<u8>)> {
    (
        any_bth(),
        any::<[u8; 12]>(),
        any::<[u8; 8]>(),
        any::<(u8, u8, u16, bool, u16)>(),
    )
        .prop_flat_map(|(bth, macs, addresses, (tos, ttl, id, df, port))| {
            let base = FrameRepr {
                ethernet: EthernetRepr {
                    source: MacAddress(macs[..6].try_into().unwrap()),
                    destination: MacAddress(macs[6..].try_into().unwrap()),
                    ethertype: ETHERTYPE_IPV4,
                },
                ipv4: Ipv4Repr {
                    source: Ipv4Address(addresses[..4].try_into().unwrap()),
                    destination: Ipv4Address(addresses[4..].try_into().unwrap()),
                    protocol: 17,
                    payload_len: 0,
                    type_of_service: tos,
                    time_to_live: ttl,
                    identification: id,
                    dont_fragment: df,
                },
                udp: UdpRepr {
                    source_port: port,
                    destination_port: ROCEV2_UDP_PORT,
                    payload_len: 0,
                },
                bth,
                extension: ExtensionHeaders::default(),
            };
            (
                Just(base),
                any_extension(bth.opcode),
                // A READ request, an atomic or an acknowledgement has none.
                proptest::collection::vec(
                    any::<u8>(),
                    0..if bth.opcode.carries_payload() { 300 } else { 1 },
                ),
            )
        })
        .prop_map(|(mut repr, extension, payload)| {
            repr.extension = extension;
            (repr.with_payload_len(payload.len()), payload)
        })
}

proptest! {
    #[test]
    fn bth_round_trips(repr in any_bth()) {
        let mut bytes = [0u8; BthRepr::LEN];
        repr.emit(&mut bytes).unwrap();
        prop_assert_eq!(BthRepr::parse(&BthHeader::new_checked(&bytes[..]).unwrap()).unwrap(), repr);
    }

    #[test]
    fn reth_round_trips(repr in any_reth()) {
        let mut bytes = [0u8; RethRepr::LEN];
        repr.emit(&mut bytes).unwrap();
        prop_assert_eq!(RethRepr::parse(&RethHeader::new_checked(&bytes[..]).unwrap()), repr);
    }

    #[test]
    fn aeth_round_trips(repr in any_aeth()) {
        let mut bytes = [0u8; AethRepr::LEN];
        repr.emit(&mut bytes).unwrap();
        prop_assert_eq!(AethRepr::parse(&AethHeader::new_checked(&bytes[..]).unwrap()).unwrap(), repr);
    }

    #[test]
    fn atomic_eth_round_trips(repr in any_atomic_eth()) {
        let mut bytes = [0u8; AtomicEthRepr::LEN];
        repr.emit(&mut bytes).unwrap();
        prop_assert_eq!(AtomicEthRepr::parse(&AtomicEthHeader::new_checked(&bytes[..]).unwrap()), repr);
    }

    #[test]
    fn atomic_ack_eth_round_trips(original_data in any::<u64>()) {
        let repr = AtomicAckEthRepr { original_data };
        let mut bytes = [0u8; AtomicAckEthRepr::LEN];
        repr.emit(&mut bytes).unwrap();
        prop_assert_eq!(AtomicAckEthRepr::parse(&AtomicAckEthHeader::new_checked(&bytes[..]).unwrap()), repr);
    }

    #[test]
    fn immdt_round_trips(immediate in any::<u32>()) {
        let repr = ImmDtRepr { immediate };
        let mut bytes = [0u8; ImmDtRepr::LEN];
        repr.emit(&mut bytes).unwrap();
        prop_assert_eq!(ImmDtRepr::parse(&ImmDtHeader::new_checked(&bytes[..]).unwrap()), repr);
    }

    #[test]
    fn syndrome_byte_round_trips(syndrome in any_syndrome()) {
        prop_assert_eq!(AckSyndrome::from_u8(syndrome.to_u8().unwrap()).unwrap(), syndrome);
    }

    #[test]
    fn whole_frame_round_trips((repr, payload) in any_frame_repr()) {
        let mut buffer = vec![0u8; repr.frame_len(payload.len())];
        let written = emit_frame(&repr, &payload, &mut buffer).unwrap();
        prop_assert_eq!(written, buffer.len());
        prop_assert_eq!((written - 14) % 4, 0, "RoCEv2 frames are 4-byte aligned after the Ethernet header");
        let parsed = parse_frame(&buffer).unwrap();
        prop_assert_eq!(parsed.repr, repr);
        prop_assert_eq!(parsed.payload, &payload[..]);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = any_frame(&bytes);
    }

    /// Random bytes almost never carry the IPv4 ethertype (1 in 65,536),
    /// so they stop at the Ethernet check: valid frames with bytes
    /// overwritten and the end cut reach the IPv4, UDP, BTH, extension
    /// and ICRC checks, which must refuse or accept without a panic.
    #[test]
    fn mangled_frames_never_panic(
        (repr, payload) in any_frame_repr(),
        writes in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut buffer = vec![0u8; repr.frame_len(payload.len())];
        emit_frame(&repr, &payload, &mut buffer).unwrap();
        for (position, value) in writes {
            let at = 14 + position.index(buffer.len() - 14);
            buffer[at] = value;
        }
        let _ = any_frame(&buffer);
        let length = buffer.len();
        let _ = any_frame(&buffer[..cut.index(length + 1)]);
    }

    #[test]
    fn corrupted_frames_are_rejected((repr, payload) in any_frame_repr(), position in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut buffer = vec![0u8; repr.frame_len(payload.len())];
        emit_frame(&repr, &payload, &mut buffer).unwrap();
        // Skip the Ethernet header (not covered), and the fields no check in
        // the frame protects: the UDP checksum (masked from the ICRC, and
        // ignored by RoCEv2 receivers) and BTH byte 4 (masked FECN/BECN).
        let offset = 14 + position.index(buffer.len() - 14);
        let unprotected = [14 + 20 + 6, 14 + 20 + 7, 14 + 20 + 8 + 4];
        prop_assume!(!unprotected.contains(&offset));
        buffer[offset] ^= 1 << bit;
        prop_assert!(parse_frame(&buffer).is_err());
    }
}

fn send_only_repr() -> FrameRepr {
    FrameRepr {
        ethernet: EthernetRepr::default(),
        ipv4: Ipv4Repr::default(),
        udp: UdpRepr {
            source_port: 1,
            destination_port: ROCEV2_UDP_PORT,
            payload_len: 0,
        },
        bth: BthRepr::new(Opcode::SendOnly, Qpn::new(1).unwrap(), Psn::new(0)),
        extension: ExtensionHeaders::default(),
    }
}

/// A payload past what an IPv4 packet holds, with its lengths set by
/// `with_payload_len`: the template emitted the UDP length as given, which
/// failed (a panic) before the frame's own check could refuse it.
#[test]
fn an_oversized_payload_is_a_typed_error_not_a_panic() {
    let repr = send_only_repr().with_payload_len(70_000);
    let payload = vec![0u8; 70_000];
    let mut buffer = vec![0u8; 80_000];
    assert!(matches!(
        emit_frame(&repr, &payload, &mut buffer),
        Err(WireError::PayloadTooLarge(70_000))
    ));
}

/// A READ request, an atomic or an acknowledgement with bytes after its
/// headers was accepted, and a READ request ran as if they were not
/// there. Both ends refuse it now.
#[test]
fn bytes_after_the_headers_of_an_opcode_without_payload_are_refused() {
    let mut read = send_only_repr().with_payload_len(8);
    read.bth.opcode = Opcode::RdmaReadRequest;
    read.extension.reth = Some(RethRepr {
        virtual_address: VirtAddr(0x1000),
        rkey: Rkey(7),
        dma_length: 64,
    });
    let mut buffer = vec![0u8; 256];
    assert_eq!(
        emit_frame(&read, &[1; 8], &mut buffer),
        Err(WireError::UnexpectedPayload(Opcode::RdmaReadRequest as u8))
    );
    // The same bytes from a peer that sends them anyway: a SEND of 24
    // bytes relabelled as a READ request (its RETH is the first 16), the
    // ICRC made right for the new opcode.
    let send = send_only_repr().with_payload_len(24);
    let length = emit_frame(&send, &[1; 24], &mut buffer).unwrap();
    let frame = &mut buffer[..length];
    frame[14 + 20 + 8] = Opcode::RdmaReadRequest as u8;
    let icrc_start = length - 4;
    let icrc = remora_wire::icrc::compute_frame(frame, icrc_start);
    frame[icrc_start..].copy_from_slice(&icrc.to_le_bytes());
    assert_eq!(
        parse_frame(frame).map(drop),
        Err(WireError::UnexpectedPayload(Opcode::RdmaReadRequest as u8))
    );
}

/// A SEND whose payload and pad leave the last 4-byte word part-filled
/// (9 bytes, pad 0) was accepted; the pad count exists to fill that word.
#[test]
fn a_payload_that_leaves_a_word_part_filled_is_refused() {
    let send = send_only_repr().with_payload_len(8);
    let mut buffer = vec![0u8; 256];
    let length = emit_frame(&send, &[1; 8], &mut buffer).unwrap();
    // One byte more before the ICRC, the lengths and checksums made right.
    let icrc_start = length - 4;
    buffer.copy_within(icrc_start..length, icrc_start + 1);
    buffer[icrc_start] = 1;
    let length = length + 1;
    let ip = 14;
    let total = u16::from_be_bytes([buffer[ip + 2], buffer[ip + 3]]) + 1;
    buffer[ip + 2..ip + 4].copy_from_slice(&total.to_be_bytes());
    let udp = ip + 20;
    let udp_length = u16::from_be_bytes([buffer[udp + 4], buffer[udp + 5]]) + 1;
    buffer[udp + 4..udp + 6].copy_from_slice(&udp_length.to_be_bytes());
    remora_wire::ipv4::Ipv4Packet::new_unchecked(&mut buffer[ip..]).fill_checksum();
    let frame = &mut buffer[..length];
    let icrc_start = length - 4;
    let icrc = remora_wire::icrc::compute_frame(frame, icrc_start);
    frame[icrc_start..].copy_from_slice(&icrc.to_le_bytes());
    assert_eq!(
        parse_frame(frame).map(drop),
        Err(WireError::UnalignedPayload(9))
    );
}

/// A credit count or RNR timer past its 5 bits was cut to them on emit:
/// credit 32 went out as 0, timer 37 as 5. Both are refused.
#[test]
fn an_out_of_range_credit_or_timer_is_refused_on_emit() {
    for syndrome in [
        AckSyndrome::Ack { credit_count: 0x20 },
        AckSyndrome::ReceiverNotReady { timer: 37 },
    ] {
        let aeth = AethRepr {
            syndrome,
            msn: Msn::new(0),
        };
        let mut bytes = [0u8; AethRepr::LEN];
        assert!(aeth.emit(&mut bytes).is_err(), "{syndrome:?}");
    }
}

#[test]
fn a_too_small_buffer_is_a_typed_error() {
    let repr = send_only_repr();
    let mut small = [0u8; 20];
    assert!(matches!(
        emit_frame(&repr, &[1, 2, 3], &mut small),
        Err(WireError::BufferTooSmall { .. })
    ));
}
