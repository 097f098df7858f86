//! The `bifrost_checkpoints` fuzz target's seeds replay through its two
//! harnesses (a callee's checkpoint, a caller's) as ordinary tests.

use remora_bifrost::rpc::checkpoint::{any_caller_checkpoint, any_checkpoint};
use std::collections::BTreeMap;

#[test]
fn checkpoint_fuzz_seeds_replay() {
    let directory = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/seeds/bifrost_checkpoints"
    );
    let mut decoded = BTreeMap::new();
    for entry in std::fs::read_dir(directory).expect("the seed directory") {
        let path = entry.expect("a seed").path();
        let bytes = std::fs::read(&path).expect("a readable seed");
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        decoded.insert(
            name,
            (any_checkpoint(&bytes), any_caller_checkpoint(&bytes)),
        );
    }
    assert_eq!(
        decoded.get("marks_and_replies"),
        Some(&(true, false)),
        "{decoded:?}"
    );
    assert_eq!(
        decoded.get("mark_below_zero"),
        Some(&(false, false)),
        "{decoded:?}"
    );
    assert_eq!(
        decoded.get("caller_checkpoint"),
        Some(&(false, true)),
        "{decoded:?}"
    );
}
