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
/// (its directory exists, it is not itself a directory, and a file there
/// can be made or written), so that a long run is not lost to a mistyped
/// or unwritable path at its end.
pub fn check_file_path(path: &Path) -> Result<(), OutputError> {
    check_file_place(path)?;
    check_writable(path)
}

/// Whether `path` names a file in an existing directory.
fn check_file_place(path: &Path) -> Result<(), OutputError> {
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

/// Whether a file at `path` can be made or written. A new file is made
/// (exclusively, so nothing another process made in between is touched)
/// and removed. A regular file already there, or one a link leads to, is
/// opened for appending, which changes nothing in it; anything else there
/// (a FIFO, a device such as `/dev/stdout`) is left unopened, since
/// opening a FIFO here would block, or end its reader's input before the
/// run. `access(2)` cannot tell: root passes it for a directory no one
/// can create files in (sysfs, a read-only mount).
fn check_writable(path: &Path) -> Result<(), OutputError> {
    let refused = |source| OutputError::Write {
        path: path.to_path_buf(),
        source,
    };
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path);
    match made {
        Ok(_) => std::fs::remove_file(path).map_err(refused),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
            match std::fs::metadata(path) {
                Ok(there) if !there.is_file() => Ok(()),
                // A file, or a link to none yet: the write will make its
                // target, as this does.
                _ => std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(path)
                    .map(drop)
                    .map_err(refused),
            }
        }
        Err(error) => Err(refused(error)),
    }
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
    // Pages go in a directory made later: its parent must take an entry.
    check_file_path(path)
}

/// Writes `value` as pretty JSON to `path`, replacing what was there
/// only once the whole of it is written ([`remora_base::replace_file`]):
/// truncated first, a full disk or a kill midway lost earlier results.
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<(), OutputError> {
    let text = serde_json::to_string_pretty(value)? + "\n";
    remora_base::replace_file(path, text.as_bytes()).map_err(|source| OutputError::Write {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writability_check_leaves_no_file_and_changes_none() {
        let directory = tempfile::tempdir().unwrap();
        let new = directory.path().join("new.json");
        check_file_path(&new).unwrap();
        assert!(!new.exists(), "the check left the file it made");
        let kept = directory.path().join("kept.json");
        std::fs::write(&kept, b"earlier results").unwrap();
        check_file_path(&kept).unwrap();
        assert_eq!(std::fs::read(&kept).unwrap(), b"earlier results");
        // A link is left a link, and a FIFO is not opened (which would
        // block here, with no reader).
        let linked = directory.path().join("latest.json");
        std::os::unix::fs::symlink(directory.path().join("today.json"), &linked).unwrap();
        check_file_path(&linked).unwrap();
        assert!(linked.symlink_metadata().unwrap().file_type().is_symlink());
        let fifo = directory.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        check_file_path(&fifo).unwrap();
    }

    #[test]
    fn a_place_no_file_can_be_made_in_is_refused_with_the_reason() {
        // sysfs refuses new files even to root, who passes access(2).
        // (A read-only /sys, as containers mount it, says so instead.)
        let refused = check_file_path(Path::new("/sys/remora-check.json")).unwrap_err();
        assert!(
            matches!(&refused, OutputError::Write { source, .. }
                if matches!(source.kind(), std::io::ErrorKind::PermissionDenied
                    | std::io::ErrorKind::ReadOnlyFilesystem)),
            "{refused}"
        );
    }
}
