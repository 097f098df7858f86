//! The demo's frames as Wireshark sees them: a tool nobody here wrote must
//! decode every frame as RoCEv2 with the opcode we sent, and flag nothing.
//!
//! `.ci/run` installs tshark and sets `REMORA_REQUIRE_TSHARK=1`, so there a
//! missing tshark fails the test; elsewhere the test says it was skipped.

use std::collections::BTreeSet;
use std::process::Command;

fn tshark(arguments: &[&str]) -> Option<String> {
    let output = Command::new("tshark").args(arguments).output().ok()?;
    assert!(
        output.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(String::from_utf8(output.stdout).expect("tshark prints text"))
}

#[test]
fn wireshark_decodes_every_frame_of_the_demo() {
    if Command::new("tshark").arg("--version").output().is_err() {
        assert!(
            std::env::var_os("REMORA_REQUIRE_TSHARK").is_none(),
            "tshark is required but not installed"
        );
        eprintln!("SKIPPED: tshark is not installed (.ci/run installs it)");
        return;
    }
    let path = std::env::temp_dir().join(format!("remora-demo-{}.pcap", std::process::id()));
    let demo = Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(["demo", "--pcap", path.to_str().unwrap()])
        .output()
        .expect("run the demo");
    assert!(demo.status.success());
    let path = path.to_str().unwrap();

    let decoded = tshark(&[
        "-r",
        path,
        "-T",
        "fields",
        "-e",
        "frame.protocols",
        "-e",
        "infiniband.bth.opcode",
    ])
    .unwrap();
    let frames: Vec<&str> = decoded.lines().collect();
    assert!(
        frames.len() > 50,
        "the tour moves dozens of frames, got {}",
        frames.len()
    );
    let mut opcodes = BTreeSet::new();
    for (number, line) in frames.iter().enumerate() {
        let (protocols, opcode) = line.split_once('\t').expect("two fields");
        assert!(
            protocols.ends_with("udp:infiniband") || protocols.contains(":infiniband"),
            "frame {}: {protocols}",
            number + 1
        );
        opcodes.insert(
            opcode
                .parse::<u8>()
                .unwrap_or_else(|_| panic!("frame {} has no BTH opcode", number + 1)),
        );
    }
    let problems = tshark(&[
        "-r",
        path,
        "-Y",
        "_ws.malformed || _ws.expert.severity >= \"warning\"",
    ])
    .unwrap();
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
