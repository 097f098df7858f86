//! What the verbs test binaries share: where cargo put the libraries, and
//! how a missing Debian package skips a test loudly (or fails it where
//! `.ci/run` requires the package).
#![allow(dead_code)] // Each test binary uses a different part.

use std::path::{Path, PathBuf};

/// rdma-core's public header, from libibverbs-dev.
pub const RDMA_HEADER: &str = "/usr/include/infiniband/verbs.h";

/// The directory `cargo build` writes the cdylibs (and `remora`) to.
pub fn build_directory() -> PathBuf {
    let executable = std::env::current_exe().expect("test executable");
    executable
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf()
}

/// Whether `what` is there. If not, the test is skipped loudly, or fails
/// where `requirement` (an environment variable `.ci/run` sets) is set.
pub fn available(found: bool, what: &str, requirement: &str) -> bool {
    if !found {
        assert!(
            std::env::var_os(requirement).is_none(),
            "{what} is required but not installed"
        );
        eprintln!("SKIPPED: {what} is not installed (.ci/run installs it)");
    }
    found
}
