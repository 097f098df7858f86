//! Per-call cost of the wire layer's hot operations on a READ request.
use remora_wire::*;
use std::hint::black_box;
use std::time::Instant;

/// The fastest of nine runs: on a shared machine, noise only adds time.
fn time(name: &str, iterations: u32, mut f: impl FnMut()) {
    let best = (0..9)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iterations / 9 {
                f();
            }
            start.elapsed().as_nanos() as f64 / f64::from(iterations / 9)
        })
        .fold(f64::INFINITY, f64::min);
    println!("{name:<28} {best:7.1} ns");
}

fn main() {
    crc_shapes();
    let mut bth = BthRepr::new(
        Opcode::RdmaReadRequest,
        Qpn::new(0x101).unwrap(),
        Psn::new(5),
    );
    bth.ack_request = true;
    let repr = FrameRepr {
        ethernet: EthernetRepr::default(),
        ipv4: Ipv4Repr {
            source: Ipv4Address::new(1, 2, 3, 4),
            destination: Ipv4Address::new(5, 6, 7, 8),
            protocol: 17,
            time_to_live: 64,
            ..Ipv4Repr::default()
        },
        udp: UdpRepr {
            source_port: 1,
            destination_port: ROCEV2_UDP_PORT,
            payload_len: 0,
        },
        bth,
        extension: ExtensionHeaders {
            reth: Some(RethRepr {
                virtual_address: VirtAddr(0x1000),
                rkey: Rkey(7),
                dma_length: 64,
            }),
            ..ExtensionHeaders::default()
        },
    };
    let mut buffer = vec![0u8; 5000];
    let len = emit_frame(&repr, &[], &mut buffer).unwrap();
    println!("frame {len} bytes");
    let n = 2_000_000;
    time("emit_frame", n, || {
        black_box(emit_frame(black_box(&repr), &[], &mut buffer).unwrap());
    });
    time("parse_frame", n, || {
        black_box(parse_frame(black_box(&buffer[..len])).unwrap());
    });
    time("icrc::compute", n, || {
        black_box(icrc::compute(
            &buffer[14..34],
            &buffer[34..42],
            black_box(&buffer[42..len - 4]),
        ));
    });
    time("icrc::compute_frame", n, || {
        black_box(icrc::compute_frame(black_box(&buffer[..len]), len - 4));
    });
    time("ipv4 checksum", n, || {
        black_box(remora_wire::ipv4::internet_checksum(black_box(
            &buffer[14..34],
        )));
    });
    let payload = vec![7u8; 4096];
    let mut big = repr;
    big.bth.opcode = Opcode::RdmaWriteMiddle;
    big.extension = ExtensionHeaders::default();
    let big_len = emit_frame(&big, &payload, &mut buffer).unwrap();
    time("emit_frame 4 KiB", n / 10, || {
        black_box(emit_frame(black_box(&big), &payload, &mut buffer).unwrap());
    });
    time("parse_frame 4 KiB", n / 10, || {
        black_box(parse_frame(black_box(&buffer[..big_len])).unwrap());
    });
    // Staged byte by byte (`compute`), against in 16-byte chunks as the
    // receive path does (`compute_frame`; a send of this size computes in
    // place).
    time("icrc::compute 4 KiB", n / 10, || {
        black_box(icrc::compute(
            &buffer[14..34],
            &buffer[34..42],
            black_box(&buffer[42..big_len - 4]),
        ));
    });
    time("icrc::compute_frame 4 KiB", n / 10, || {
        black_box(icrc::compute_frame(
            black_box(&buffer[..big_len]),
            big_len - 4,
        ));
    });
}

#[allow(dead_code)]
pub fn crc_shapes() {
    let data = [0xa5u8; 64];
    time("crc32fast 64 B, one update", 2_000_000, || {
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(black_box(&data));
        black_box(hasher.finalize());
    });
    time("crc32fast 48 + 16 B", 2_000_000, || {
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(black_box(&data[..48]));
        hasher.update(black_box(&data[48..]));
        black_box(hasher.finalize());
    });
    time("crc32fast::hash 64 B", 2_000_000, || {
        black_box(crc32fast::hash(black_box(&data)));
    });
    let mut head = [0u8; 88];
    time("stage 48 B head", 2_000_000, || {
        head = [0xff; 88];
        head[8..56].copy_from_slice(black_box(&data[..48]));
        black_box(&head);
    });
}
