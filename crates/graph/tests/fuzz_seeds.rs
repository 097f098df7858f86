//! The `graph_files` fuzz target's committed seeds (and any findings
//! added to them) replay here on stable.

#[test]
fn graph_file_seeds_replay() {
    let directory = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/seeds/graph_files");
    let mut loaded = 0;
    let mut seen = 0;
    for entry in std::fs::read_dir(directory).expect("the seed directory") {
        let bytes = std::fs::read(entry.expect("a seed").path()).expect("a readable seed");
        seen += 1;
        loaded += usize::from(remora_graph::fuzzing::any_graph_file(&bytes));
    }
    assert!(seen >= 6, "seeds missing: {seen}");
    // Every committed seed is a valid file of its format.
    assert_eq!(loaded, seen);
}

/// Found by the `graph_files` fuzzer: a 12-byte edge list ("0 121012101")
/// asked for 121 M vertices, a gigabyte of offsets, and ran the fuzzer out
/// of memory. Ids that sparse are now refused unless allowed.
#[test]
fn a_twelve_byte_edge_list_cannot_ask_for_a_gigabyte() {
    use remora_graph::load::{parse, GraphFormat, LoadError, LoadOptions};
    let finding = [0u8, 48, 32, 49, 50, 49, 48, 49, 50, 49, 48, 49];
    assert!(!remora_graph::fuzzing::any_graph_file(&finding));
    let defaults = parse(GraphFormat::EdgeList, &finding[1..], LoadOptions::default());
    assert!(matches!(
        defaults,
        Err(LoadError::SparseIds {
            vertex_count: 121_012_102,
            ..
        })
    ));
    let allowed = LoadOptions {
        max_vertex_count: Some(1000),
        ..LoadOptions::default()
    };
    assert!(parse(GraphFormat::EdgeList, b"0 999\n", allowed).is_ok());
}
