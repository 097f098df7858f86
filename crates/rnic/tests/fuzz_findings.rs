//! Inputs the fuzzers found, replayed on every test run.

#[test]
fn rnic_frames_findings_settle() {
    let directory = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fuzz_regressions");
    let mut count = 0;
    for entry in std::fs::read_dir(directory).expect("findings directory") {
        let path = entry.expect("entry").path();
        let bytes = std::fs::read(&path).expect("finding");
        let summary = remora_rnic::fuzzing::run_forged_frames(&bytes, 100_000);
        assert!(
            summary.quiesced,
            "{} does not settle: {summary:?}",
            path.display()
        );
        count += 1;
    }
    assert!(count > 0);
}
