//! Writes the frames of a workload that uses every opcode, one file each,
//! as the seed corpus of the `parse_frame` fuzz target:
//! `cargo run -p remora-rnic --example fuzz_corpus -- fuzz/seeds/parse_frame`.

use remora_rnic::back_to_back::{BackToBack, Verdict};
use remora_rnic::*;
use std::collections::BTreeSet;

fn main() {
    let directory = std::env::args()
        .nth(1)
        .expect("usage: fuzz_corpus DIRECTORY");
    std::fs::create_dir_all(&directory).expect("create the corpus directory");
    let mut fabric = BackToBack::new(5);
    let mut regions = Vec::new();
    let mut builders = Vec::new();
    for device in [&mut fabric.left, &mut fabric.right] {
        let pd = device.alloc_protection_domain().unwrap();
        regions.push(
            device
                .register_memory(pd, 1 << 16, AccessFlags::ALL)
                .unwrap(),
        );
        let cq = device.create_completion_queue(64).unwrap();
        let mut builder = QueuePairBuilder::new(pd, cq, cq);
        builder.path_mtu = Mtu::MTU_256;
        builders.push(builder);
    }
    let (left, right) = fabric.connect(&builders[0], &builders[1]).unwrap();
    let (local, remote) = (regions[0], regions[1]);
    for id in 0..4 {
        fabric
            .right
            .post_receive(
                right,
                ReceiveRequest::new(id, &[remote.slice(id * 1024, 1024)]).unwrap(),
            )
            .unwrap();
    }
    let operations = [
        (SendOperation::Send { immediate: None }, 100),
        (SendOperation::Send { immediate: Some(9) }, 700),
        (
            SendOperation::Write {
                remote: remote.remote(4096),
                immediate: None,
            },
            700,
        ),
        (
            SendOperation::Write {
                remote: remote.remote(8192),
                immediate: Some(3),
            },
            40,
        ),
        (
            SendOperation::Write {
                remote: remote.remote(8192),
                immediate: Some(4),
            },
            600,
        ),
        (
            SendOperation::Read {
                remote: remote.remote(0),
            },
            900,
        ),
        (
            SendOperation::Read {
                remote: remote.remote(0),
            },
            13,
        ),
        (
            SendOperation::CompareSwap {
                remote: remote.remote(64),
                compare: 0,
                swap: 5,
            },
            8,
        ),
        (
            SendOperation::FetchAdd {
                remote: remote.remote(64),
                add: 5,
            },
            8,
        ),
    ];
    for (id, (operation, length)) in operations.into_iter().enumerate() {
        let local_slice = local.slice(id as u64 * 1024, length);
        fabric
            .left
            .post_send(
                left,
                SendRequest::new(id as u64, operation, &[local_slice]).unwrap(),
            )
            .unwrap();
    }
    let mut seen = BTreeSet::new();
    let mut count = 0;
    fabric.run_filtered(10_000, &mut |_, frame| {
        // One file per opcode and length is variety enough.
        if seen.insert((frame[42], frame.len())) {
            std::fs::write(format!("{directory}/frame-{count:03}"), &*frame)
                .expect("write a corpus file");
            count += 1;
        }
        Verdict::Deliver
    });
    let hex = include_str!("../../wire/testdata/connectx4lx_cnp.hex").trim();
    let captured: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|index| u8::from_str_radix(&hex[index..index + 2], 16).expect("hex"))
        .collect();
    std::fs::write(format!("{directory}/connectx4lx_cnp"), captured)
        .expect("write the captured CNP");
    println!("wrote {count} frames to {directory}");
}
