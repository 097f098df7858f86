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

/// Writes `value` as pretty JSON to `path`.
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), OutputError> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").map_err(|source| OutputError::Write {
        path: path.to_path_buf(),
        source,
    })
}
