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
