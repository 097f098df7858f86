//! The `remora` binary as a user runs it.

use std::process::Command;

fn remora(arguments: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_remora"))
        .args(arguments)
        .output()
        .expect("run remora")
}

#[test]
fn the_demo_checks_every_operation() {
    let output = remora(&["demo"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    for operation in [
        "SEND",
        "RDMA WRITE",
        "RDMA READ",
        "CMP_SWAP",
        "FETCH_ADD",
        "read-only",
    ] {
        assert!(stdout.contains(operation), "the tour shows {operation}");
    }
    assert!(stdout.contains("all 9 operations checked"));
    assert!(
        stdout.contains("Clover, Cowbird passed") || stdout.contains("Clover and Cowbird passed")
    );
    assert!(stdout.contains("remote records fetched and checked"));
    assert!(!stdout.contains("FAILED"));
}

#[test]
fn a_campaign_writes_its_report_as_json() {
    let path = std::env::temp_dir().join(format!("remora-campaign-{}.json", std::process::id()));
    let output = remora(&[
        "sim",
        "fabric",
        "--seeds",
        "5",
        "--loss",
        "0.1",
        "--json",
        path.to_str().unwrap(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let text = std::fs::read_to_string(&path).expect("the JSON report");
    std::fs::remove_file(&path).ok();
    assert!(text.contains("\"seeds\": 5"));
    assert!(text.contains("\"loss\": 0.1"));
    assert!(text.contains("\"failures\": []"));
}

#[test]
fn bad_input_gets_a_clear_error() {
    let output = remora(&["sim", "fabric", "--seeds", "1", "--loss", "2"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("'--loss <LOSS>': probability 2 is outside [0, 1]"),
        "{stderr}"
    );

    // A campaign of no seeds would check nothing and pass.
    let output = remora(&["sim", "fabric", "--seeds", "0"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("'--seeds <SEEDS>'"), "{stderr}");

    let output = remora(&["sim", "fabric", "--config", "/nonexistent/remora.toml"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("cannot read /nonexistent/remora.toml")
    );
}
