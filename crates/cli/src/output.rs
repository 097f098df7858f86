//! Results written as files (`--json`).

use std::path::{Path, PathBuf};

/// A result file (`--json`) that could not be written.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    #[error("cannot encode the results as JSON: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Checks, before any work, that a result file can be written at `path`
/// (its directory exists, and it is not itself a directory), so that a
/// long run is not lost to a mistyped path at its end.
pub fn check_file_path(path: &Path) -> Result<(), OutputError> {
    let refuse = |reason: &str| OutputError::Write {
        path: path.to_path_buf(),
        source: std::io::Error::other(reason.to_string()),
    };
    if path.is_dir() {
        return Err(refuse("it is a directory"));
    }
    let directory = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    if !directory.is_dir() {
        return Err(refuse("its directory does not exist"));
    }
    Ok(())
}

/// [`check_file_path`] for a result file the user may have asked for.
pub fn check_optional_file_path(path: Option<&Path>) -> Result<(), OutputError> {
    path.map_or(Ok(()), check_file_path)
}

/// Checks, before any work, that `path` can hold written pages: a
/// directory, or nothing yet under an existing directory.
pub fn check_directory_path(path: &Path) -> Result<(), OutputError> {
    if path.is_dir() {
        return Ok(());
    }
    if path.exists() {
        return Err(OutputError::Write {
            path: path.to_path_buf(),
            source: std::io::Error::other("it is a file, not a directory"),
        });
    }
    check_file_path(path)
}

/// Writes `value` as pretty JSON to `path`.
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), OutputError> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").map_err(|source| OutputError::Write {
        path: path.to_path_buf(),
        source,
    })
}
