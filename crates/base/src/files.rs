//! Replacing a file's contents so that a failure midway leaves the old
//! contents, never a truncated file.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Symbolic links followed before giving up, as the kernel's own limit.
const MAX_LINK_HOPS: usize = 40;

/// Writes `bytes` as the whole contents of `path`. A regular file (or
/// none) is written beside its final name, synced, and renamed over it:
/// a write that fails, or a process killed midway, leaves the earlier
/// contents (truncated first, a full disk or a kill lost them). A link
/// is followed, so the link stays and its target changes. Anything else
/// (`/dev/stdout`, a FIFO) is written as it is, since it cannot be
/// replaced.
pub fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let target = follow_links(path)?;
    if std::fs::metadata(&target).is_ok_and(|there| !there.is_file()) {
        return std::fs::write(&target, bytes);
    }
    let name = target
        .file_name()
        .ok_or_else(|| std::io::Error::other("the path names no file"))?;
    let mut partial_name = std::ffi::OsString::from(".");
    partial_name.push(name);
    partial_name.push(format!(".{}.partial", std::process::id()));
    let partial = target.with_file_name(partial_name);
    let written = write_synced(&partial, bytes).and_then(|()| std::fs::rename(&partial, &target));
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// `path` with its symbolic links followed (a dangling one to the path it
/// names).
fn follow_links(path: &Path) -> std::io::Result<PathBuf> {
    let mut current = path.to_path_buf();
    for _ in 0..MAX_LINK_HOPS {
        match std::fs::symlink_metadata(&current) {
            Ok(there) if there.file_type().is_symlink() => {
                let named = std::fs::read_link(&current)?;
                current = match current.parent() {
                    Some(parent) if named.is_relative() => parent.join(named),
                    _ => named,
                };
            }
            _ => return Ok(current),
        }
    }
    Err(std::io::Error::other(format!(
        "{}: more than {MAX_LINK_HOPS} symbolic links",
        path.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_replaced_whole_and_a_link_stays_a_link() {
        let directory = std::env::temp_dir().join(format!("remora-files-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let file = directory.join("results.json");
        std::fs::write(&file, b"earlier").unwrap();
        replace_file(&file, b"later").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"later");
        let link = directory.join("link.json");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("results.json", &link).unwrap();
        replace_file(&link, b"through the link").unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&file).unwrap(), b"through the link");
        let names: Vec<_> = std::fs::read_dir(&directory).unwrap().collect();
        assert_eq!(names.len(), 2, "no partial file is left");
        std::fs::remove_dir_all(&directory).unwrap();
    }

    /// A write that cannot finish (here, into a directory that is not
    /// there) leaves the earlier contents; truncated first, they were
    /// lost.
    #[test]
    fn a_failed_replacement_leaves_the_earlier_contents() {
        let directory =
            std::env::temp_dir().join(format!("remora-files-keep-{}", std::process::id()));
        std::fs::create_dir_all(&directory).unwrap();
        let file = directory.join("kept.json");
        std::fs::write(&file, b"earlier").unwrap();
        // A directory in the way of the partial file's name.
        let partial = directory.join(format!(".kept.json.{}.partial", std::process::id()));
        std::fs::create_dir_all(partial.join("blocker")).unwrap();
        assert!(replace_file(&file, b"later").is_err());
        assert_eq!(std::fs::read(&file).unwrap(), b"earlier");
        std::fs::remove_dir_all(&directory).unwrap();
    }
}
