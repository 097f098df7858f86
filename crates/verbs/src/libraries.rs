//! Where a program finds the drop-in: a directory of `lib*.so.1` links to
//! the libraries cargo built, which `LD_LIBRARY_PATH` names. (The loader
//! looks for the soname, `libibverbs.so.1`; cargo writes `libibverbs.so`.)

use std::path::{Path, PathBuf};

/// The four libraries a program linked against rdma-core loads: ours and
/// the three stand-ins.
pub const LIBRARIES: [&str; 4] = ["ibverbs", "rdmacm", "mlx5", "efa"];

#[derive(Debug, thiserror::Error)]
pub enum LibrariesError {
    #[error("{0} is missing: build the drop-in first (cargo build --workspace)")]
    Missing(PathBuf),
    #[error("linking the libraries in {directory}: {source}")]
    Io {
        directory: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Makes `built/name` hold a `lib*.so.1` link to each library in `built`
/// (a cargo target directory such as `target/release`) and returns it.
/// Another process may be making the same links: a link that already
/// points at its library is kept.
pub fn link_libraries(built: &Path, name: &str) -> Result<PathBuf, LibrariesError> {
    let directory = built.join(name);
    let io = |source| LibrariesError::Io {
        directory: directory.clone(),
        source,
    };
    std::fs::create_dir_all(&directory).map_err(io)?;
    for library_name in LIBRARIES {
        let library = built.join(format!("lib{library_name}.so"));
        if !library.exists() {
            return Err(LibrariesError::Missing(library));
        }
        let link = directory.join(format!("lib{library_name}.so.1"));
        if std::fs::read_link(&link).ok().as_deref() == Some(library.as_path()) {
            continue;
        }
        let _ = std::fs::remove_file(&link);
        match std::os::unix::fs::symlink(&library, &link) {
            Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => {
                return Err(io(error));
            }
            _ => {}
        }
    }
    Ok(directory)
}
