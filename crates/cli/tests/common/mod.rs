//! Helpers shared by the CLI's test binaries.
#![allow(dead_code)] // Each test binary uses a different part.

use std::path::PathBuf;
use std::process::Command;

/// Runs tshark and returns what it printed, or None if it is not
/// installed (which fails the test where `REMORA_REQUIRE_TSHARK` is set).
pub fn tshark(arguments: &[&str]) -> Option<String> {
    let output = match Command::new("tshark").args(arguments).output() {
        Ok(output) => output,
        Err(_) => {
            assert!(
                std::env::var_os("REMORA_REQUIRE_TSHARK").is_none(),
                "tshark is required but not installed"
            );
            eprintln!("SKIPPED: tshark is not installed (.ci/run installs it)");
            return None;
        }
    };
    assert!(
        output.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Some(String::from_utf8(output.stdout).expect("tshark prints text"))
}

/// Every frame's protocol stack and BTH opcode, as tshark decodes them.
pub fn tshark_opcodes(path: &str) -> Option<Vec<(String, u8)>> {
    let decoded = tshark(&[
        "-r",
        path,
        "-T",
        "fields",
        "-e",
        "frame.protocols",
        "-e",
        "infiniband.bth.opcode",
    ])?;
    Some(
        decoded
            .lines()
            .enumerate()
            .map(|(number, line)| {
                let (protocols, opcode) = line.split_once('\t').expect("two fields");
                let opcode = opcode
                    .parse::<u8>()
                    .unwrap_or_else(|_| panic!("frame {} has no BTH opcode", number + 1));
                (protocols.to_string(), opcode)
            })
            .collect(),
    )
}

/// Frames tshark marks malformed or warns about, as its text output.
pub fn tshark_problems(path: &str) -> String {
    tshark(&[
        "-r",
        path,
        "-Y",
        "_ws.malformed || _ws.expert.severity >= \"warning\"",
    ])
    .unwrap_or_default()
}

/// The Python with scapy that `.ci/run` installs, or None (which fails the
/// test where `REMORA_REQUIRE_SCAPY` is set).
pub fn scapy_python() -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = std::env::var_os("REMORA_SCAPY_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".ci/venv/bin/python"));
    let works = Command::new(&python)
        .args(["-c", "import scapy.contrib.roce"])
        .output()
        .is_ok_and(|output| output.status.success());
    if !works {
        assert!(
            std::env::var_os("REMORA_REQUIRE_SCAPY").is_none(),
            "scapy is required but {} cannot import it",
            python.display()
        );
        eprintln!(
            "SKIPPED: no Python with scapy at {} (.ci/run installs it)",
            python.display()
        );
        return None;
    }
    Some(python)
}

pub fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("remora-test-{}-{name}", std::process::id()))
}

/// Sends `child` a SIGINT (Ctrl-C) and waits for it to end: its exit
/// status, or a panic naming `what` if it goes on for 15 s.
pub fn interrupt_and_wait(child: &mut std::process::Child, what: &str) -> std::process::ExitStatus {
    let interrupt = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(interrupt.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("{what} went on for 15 s after Ctrl-C");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
