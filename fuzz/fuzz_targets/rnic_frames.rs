//! Frames with valid checksums but fuzzer-chosen headers and payloads, fired
//! at both sides of a connected queue pair with work in flight. The RNIC may
//! NAK, drop or error its queue pairs, but must never panic or hang. The
//! harness lives in `remora_rnic::fuzzing` so findings replay as tests.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let summary = remora_rnic::fuzzing::run_forged_frames(bytes, 100_000);
    assert!(summary.quiesced, "the fabric must settle");
});
