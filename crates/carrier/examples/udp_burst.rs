//! Frames per second through one UDP tunnel, in bursts of equal-sized
//! frames, with and without UDP segmentation offload (GSO):
//! `cargo run --release -p remora-carrier --example udp_burst -- [FRAME_BYTES] [SECONDS]`.

use remora_carrier::datagram::BATCH_FRAMES;
use remora_carrier::{DatagramPort, Port};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn rate(segmented: bool, frame_bytes: usize, duration: Duration) -> f64 {
    let (left, mut right) = DatagramPort::udp_pair(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .expect("a UDP pair on loopback");
    let mut left = if segmented {
        left
    } else {
        left.without_segmentation()
    };
    let frame = vec![0x5a; frame_bytes];
    let started = Instant::now();
    let mut received = 0u64;
    while started.elapsed() < duration {
        for _ in 0..BATCH_FRAMES {
            left.send(&frame).expect("queued");
        }
        left.flush().expect("sent");
        // Drain what arrived, so the socket buffer never overflows.
        let mut burst = 0;
        while burst < BATCH_FRAMES {
            let count = right.receive(BATCH_FRAMES, &mut |_| {}).expect("received");
            if count == 0 {
                break;
            }
            burst += count;
        }
        received += burst as u64;
    }
    received as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let mut arguments = std::env::args().skip(1);
    let frame_bytes = arguments
        .next()
        .map_or(4096, |text| text.parse().expect("FRAME_BYTES"));
    let seconds = arguments
        .next()
        .map_or(2, |text| text.parse().expect("SECONDS"));
    let duration = Duration::from_secs(seconds);
    for round in 0..3 {
        let plain = rate(false, frame_bytes, duration);
        let segmented = rate(true, frame_bytes, duration);
        println!(
            "round {round}: {frame_bytes} B frames, sendmmsg {:.0} k/s, GSO {:.0} k/s, ratio {:.2}",
            plain / 1e3,
            segmented / 1e3,
            segmented / plain
        );
    }
}
