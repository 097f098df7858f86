//! The switch's hot path, one benchmark per stage, so a regression in any
//! of them shows: `cargo bench -p remora-switch`.

use remora_switch::two_hosts;

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use remora_base::Timestamp;
use remora_switch::{parser, Emitted, PortId};

fn forwarding(criterion: &mut Criterion) {
    let frame = two_hosts::send_frame(two_hosts::SMALL_PAYLOAD_BYTES, 1);
    criterion.bench_function("parse an 82-byte RoCE frame", |bench| {
        bench.iter(|| parser::parse(black_box(&frame)).unwrap())
    });
    let mut switch = two_hosts::two_host_switch();
    let mut delivered = 0usize;
    criterion.bench_function("forward an 82-byte frame cut-through", |bench| {
        bench.iter(|| {
            switch.handle_frame_with(
                Timestamp::ZERO,
                PortId(0),
                black_box(&frame),
                &mut |_, bytes| {
                    delivered += bytes.len();
                    Emitted::Sent
                },
            )
        })
    });
    assert!(delivered > 0, "frames came out");
}

criterion_group!(benches, forwarding);
criterion_main!(benches);
