//! The committed seeds of the `wire` fuzz targets replay here on stable:
//! each must parse (they are valid messages) and round-trip.

/// Feeds every seed of `target` to its harness; returns how many there were.
fn replay(target: &str, harness: fn(&[u8]) -> bool) -> usize {
    let directory = format!("{}/../../fuzz/seeds/{target}", env!("CARGO_MANIFEST_DIR"));
    let mut count = 0;
    for entry in std::fs::read_dir(&directory).expect("the seed directory") {
        let path = entry.expect("a seed").path();
        let bytes = std::fs::read(&path).expect("a readable seed");
        assert!(harness(&bytes), "{} does not parse", path.display());
        count += 1;
    }
    count
}

#[test]
fn parse_frame_seeds_replay() {
    assert!(replay("parse_frame", remora_wire::any_frame) >= 10);
}

#[test]
fn bifrost_header_seeds_replay() {
    assert!(replay("bifrost_header", remora_wire::bifrost::any_header) >= 4);
}

#[test]
fn tiga_messages_seeds_replay() {
    assert!(replay("tiga_messages", remora_wire::tiga::any_message) >= 7);
}

#[test]
fn bifrost_node_messages_seeds_replay() {
    assert!(
        replay(
            "bifrost_node_messages",
            remora_wire::bifrost::any_node_message
        ) >= 4
    );
}
