//! The demo's frames as Wireshark sees them: a tool nobody here wrote must
//! decode every frame as RoCEv2 with the opcode we sent, and flag nothing.
//!
//! `.ci/run` installs tshark and sets `REMORA_REQUIRE_TSHARK=1`, so there a
//! missing tshark fails the test; elsewhere the test says it was skipped.

mod common;

use std::collections::BTreeSet;
use std::process::Command;

#[test]
fn wireshark_decodes_every_frame_of_the_demo() {
    let path = std::env::temp_dir().join(format!("remora-demo-{}.pcap", std::process::id()));
    let demo = Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(["demo", "--pcap", path.to_str().unwrap()])
        .output()
        .expect("run the demo");
    assert!(demo.status.success());
    let path = path.to_str().unwrap();

    let Some(frames) = common::tshark_opcodes(path) else {
        return;
    };
    assert!(
        frames.len() > 50,
        "the tour moves dozens of frames, got {}",
        frames.len()
    );
    // The totals line counts what the rows and the capture hold (it once
    // left out the access-violation row's pair).
    let stdout = String::from_utf8_lossy(&demo.stdout);
    let totals = format!("totals: {} frames,", frames.len());
    assert!(stdout.contains(&totals), "{totals} not in:\n{stdout}");
    let mut opcodes = BTreeSet::new();
    for (number, (protocols, opcode)) in frames.iter().enumerate() {
        assert!(
            protocols.contains(":infiniband"),
            "frame {}: {protocols}",
            number + 1
        );
        opcodes.insert(*opcode);
    }
    let problems = common::tshark_problems(path);
    std::fs::remove_file(path).ok();
    assert!(
        problems.trim().is_empty(),
        "frames tshark flags:\n{problems}"
    );
    // SEND only (+imm), WRITE first/middle/last/only (+imm), READ request and
    // every response kind, ACK, atomic ACK, CMP_SWAP, FETCH_ADD.
    let expected: BTreeSet<u8> = [4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 17, 18, 19, 20].into();
    assert_eq!(opcodes, expected);
}
