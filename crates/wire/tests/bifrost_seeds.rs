//! The `bifrost_header` fuzz target's committed seeds replay here on stable.

#[test]
fn bifrost_header_seeds_replay() {
    let directory = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/seeds/bifrost_header"
    );
    let mut count = 0;
    for entry in std::fs::read_dir(directory).expect("the seed directory") {
        let bytes = std::fs::read(entry.expect("a seed").path()).expect("a readable seed");
        assert!(
            remora_wire::bifrost::any_header(&bytes),
            "a seed that does not parse"
        );
        count += 1;
    }
    assert!(count >= 4);
}
