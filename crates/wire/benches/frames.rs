//! The wire layer's hot functions, one benchmark each, so a regression in
//! any of them shows: `cargo bench -p remora-wire`.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use remora_wire::frame::{emit_frame, parse_frame, MAX_FRAME_LEN};
use remora_wire::*;

/// A 64 B READ request, as a requester sends it.
fn read_request() -> FrameRepr {
    let mut bth = BthRepr::new(
        Opcode::RdmaReadRequest,
        Qpn::new(0x101).unwrap(),
        Psn::new(5),
    );
    bth.ack_request = true;
    let mut repr = FrameRepr::between(
        (
            MacAddress([2, 0, 0, 0, 0, 1]),
            Ipv4Address::new(10, 0, 0, 1),
        ),
        (
            MacAddress([2, 0, 0, 0, 0, 2]),
            Ipv4Address::new(10, 0, 0, 2),
        ),
        0xc101,
        bth,
    );
    repr.extension.reth = Some(RethRepr {
        virtual_address: VirtAddr(0x1000),
        rkey: Rkey(7),
        dma_length: 64,
    });
    repr
}

/// A READ response carrying `payload_bytes`.
fn read_response(payload_bytes: usize) -> (FrameRepr, Vec<u8>) {
    let bth = BthRepr::new(
        Opcode::RdmaReadResponseOnly,
        Qpn::new(0x102).unwrap(),
        Psn::new(5),
    );
    let mut repr = FrameRepr::between(
        (
            MacAddress([2, 0, 0, 0, 0, 2]),
            Ipv4Address::new(10, 0, 0, 2),
        ),
        (
            MacAddress([2, 0, 0, 0, 0, 1]),
            Ipv4Address::new(10, 0, 0, 1),
        ),
        0xc102,
        bth,
    );
    repr.extension.aeth = Some(AethRepr {
        syndrome: AckSyndrome::Ack {
            credit_count: AckSyndrome::UNLIMITED_CREDIT,
        },
        msn: Msn::new(1),
    });
    (repr, vec![0x5a; payload_bytes])
}

fn frames(criterion: &mut Criterion) {
    let mut buffer = vec![0u8; MAX_FRAME_LEN];
    let request = read_request();
    criterion.bench_function("emit 64 B READ request", |bench| {
        bench.iter(|| emit_frame(black_box(&request), &[], &mut buffer).unwrap())
    });
    let length = emit_frame(&request, &[], &mut buffer).unwrap();
    let frame = buffer[..length].to_vec();
    bench_icrc(criterion, "64 B READ request", &frame);
    for payload_bytes in [64, 4096] {
        let (response, payload) = read_response(payload_bytes);
        let length = emit_frame(&response, &payload, &mut buffer).unwrap();
        let frame = buffer[..length].to_vec();
        criterion.bench_function(&format!("emit {payload_bytes} B READ response"), |bench| {
            bench.iter(|| emit_frame(black_box(&response), &payload, &mut buffer).unwrap())
        });
        criterion.bench_function(&format!("check {payload_bytes} B READ response"), |bench| {
            bench.iter(|| RoceFrame::new_checked(black_box(&frame)).unwrap().bth().psn)
        });
        criterion.bench_function(&format!("parse {payload_bytes} B READ response"), |bench| {
            bench.iter(|| parse_frame(black_box(&frame)).unwrap().payload.len())
        });
        bench_icrc(
            criterion,
            &format!("{payload_bytes} B READ response"),
            &frame,
        );
    }
}

/// The ICRC of `frame`, beside a plain CRC-32 of the same bytes: the
/// masking's price is the difference.
fn bench_icrc(criterion: &mut Criterion, name: &str, frame: &[u8]) {
    let icrc_start = frame.len() - icrc::ICRC_LEN;
    criterion.bench_function(&format!("icrc (compute_frame) of {name}"), |bench| {
        bench.iter(|| icrc::compute_frame(black_box(frame), icrc_start))
    });
    criterion.bench_function(&format!("plain crc32 of {name}"), |bench| {
        bench.iter(|| crc32fast::hash(black_box(&frame[6..icrc_start])))
    });
}

criterion_group!(benches, frames);
criterion_main!(benches);
