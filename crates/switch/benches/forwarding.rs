//! The switch's hot path, one benchmark per stage, so a regression in any
//! of them shows: `cargo bench -p remora-switch`.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use remora_base::Timestamp;
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::{parser, PortId, Switch, SwitchConfig};
use remora_wire::frame::{emit_frame, FrameRepr, MAX_FRAME_LEN};
use remora_wire::{BthRepr, Ipv4Address, MacAddress, Opcode, Psn, Qpn};

fn mac(index: u8) -> MacAddress {
    MacAddress([2, 0, 10, 0, 0, index])
}

/// The L2/L3 program with hosts 1 and 2 on ports 0 and 1.
fn two_host_switch() -> Switch<L2L3Forwarding> {
    let mut program = L2L3Forwarding::new(MacAddress([2, 0x5e, 0, 0, 0, 0xfe]), 16);
    for index in 1..=2u8 {
        program
            .add_attached_host(
                mac(index),
                Ipv4Address::new(10, 0, 0, index),
                PortId(u16::from(index - 1)),
            )
            .unwrap();
    }
    Switch::new(SwitchConfig::new(2), program)
}

/// A SEND of 22 bytes from host 1 to host 2 (an 82-byte frame).
fn frame() -> Vec<u8> {
    let bth = BthRepr::new(Opcode::SendOnly, Qpn::new(0x100).unwrap(), Psn::new(1));
    let repr = FrameRepr::between(
        (mac(1), Ipv4Address::new(10, 0, 0, 1)),
        (mac(2), Ipv4Address::new(10, 0, 0, 2)),
        49152,
        bth,
    );
    let mut buffer = vec![0u8; MAX_FRAME_LEN];
    let length = emit_frame(&repr, &[0x5a; 22], &mut buffer).unwrap();
    buffer.truncate(length);
    buffer
}

fn forwarding(criterion: &mut Criterion) {
    let frame = frame();
    criterion.bench_function("parse an 82-byte RoCE frame", |bench| {
        bench.iter(|| parser::parse(black_box(&frame)).unwrap())
    });
    let mut switch = two_host_switch();
    let mut delivered = 0usize;
    criterion.bench_function("forward an 82-byte frame cut-through", |bench| {
        bench.iter(|| {
            switch.handle_frame_with(
                Timestamp::ZERO,
                PortId(0),
                black_box(&frame),
                &mut |_, bytes| {
                    delivered += bytes.len();
                    true
                },
            )
        })
    });
    assert!(delivered > 0, "frames came out");
}

criterion_group!(benches, forwarding);
criterion_main!(benches);
