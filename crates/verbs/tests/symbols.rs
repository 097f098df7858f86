//! Every versioned symbol that Debian's RDMA programs import from the four
//! libraries is exported by Remora's, with the same version
//! (`objdump -T`). A program whose import is missing would fail to load.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const PROGRAMS: [&str; 8] = [
    "ib_send_lat",
    "ib_write_lat",
    "ib_read_lat",
    "ib_atomic_lat",
    "ib_write_bw",
    "ib_read_bw",
    "ibv_rc_pingpong",
    "ibv_devinfo",
];

/// `(version, symbol)` pairs of a dynamic symbol table: the undefined ones
/// (imports) or the defined ones (exports).
fn dynamic_symbols(path: &Path, imports: bool) -> BTreeSet<(String, String)> {
    let output = Command::new("objdump")
        .arg("-T")
        .arg(path)
        .output()
        .expect("objdump");
    assert!(output.status.success(), "objdump -T {}", path.display());
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .filter(|line| {
            line.contains("*UND*") == imports && line.contains(" DF ") | line.contains("*UND*")
        })
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (version, name) = (fields[fields.len() - 2], fields[fields.len() - 1]);
            let version = version.trim_start_matches('(').trim_end_matches(')');
            let ours = ["IBVERBS_", "RDMACM_", "MLX5_", "EFA_"];
            ours.iter()
                .any(|prefix| version.starts_with(prefix))
                .then(|| (version.to_string(), name.to_string()))
        })
        .collect()
}

#[test]
fn every_import_of_the_rdma_programs_is_exported_with_its_version() {
    let programs: Vec<PathBuf> = PROGRAMS
        .iter()
        .map(|name| PathBuf::from("/usr/bin").join(name))
        .filter(|path| path.exists())
        .collect();
    let all_found = programs.len() == PROGRAMS.len();
    if !common::available(
        all_found,
        "perftest or ibverbs-utils",
        "REMORA_REQUIRE_PERFTEST",
    ) {
        return;
    }
    let imports: BTreeSet<(String, String)> = programs
        .iter()
        .flat_map(|program| dynamic_symbols(program, true))
        .collect();
    let mut exports = BTreeSet::new();
    for library in ["ibverbs", "rdmacm", "mlx5", "efa"] {
        let path = common::build_directory().join(format!("lib{library}.so"));
        assert!(
            path.exists(),
            "{} is missing: run `cargo build --workspace`",
            path.display()
        );
        exports.extend(dynamic_symbols(&path, false));
    }
    let missing: Vec<_> = imports.difference(&exports).collect();
    assert!(missing.is_empty(), "imported but not exported: {missing:?}");
    assert!(imports.len() > 60, "only {} imports found", imports.len());
}
