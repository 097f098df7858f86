//! Replacing a file's contents so that a failure midway leaves the old
//! contents, never a truncated file.

use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Symbolic links followed before giving up, as the kernel's own limit.
const MAX_LINK_HOPS: usize = 40;

/// Writes `bytes` as the whole contents of `path`.
///
/// - A regular file (or none) is written beside its final name with the
///   old file's permissions, synced, and renamed over it: a write that
///   fails, or a process killed midway, leaves the earlier contents
///   (truncated first, a full disk or a kill lost them). A link is
///   followed, so the link stays and its target changes.
/// - Where the directory takes no new entry (read-only, or sticky with
///   another user's file) the file is written in place, as it could be
///   opened for writing.
/// - Anything else (`/dev/stdout` on a pipe or a terminal, a FIFO) is
///   written as it is, since it cannot be replaced.
pub fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    // Asked of the kernel, which follows `/dev/stdout` to the pipe itself;
    // followed here, its `/proc/self/fd/1` read back as "pipe:[N]", a
    // path that is not there.
    if std::fs::metadata(path).is_ok_and(|there| !there.is_file()) {
        return std::fs::write(path, bytes);
    }
    let target = follow_links(path)?;
    match write_beside(&target, bytes) {
        Err(error)
            if matches!(
                error.kind(),
                ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem
            ) =>
        {
            std::fs::write(&target, bytes)
        }
        written => written,
    }
}

/// Makes `path`, which must not exist yet, holding `bytes`, synced. A
/// write that fails removes it: a file left half written is taken for a
/// whole one by whoever finds it.
pub fn create_new_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all());
    if written.is_err() {
        let _ = std::fs::remove_file(path);
    }
    written
}

/// Writes `bytes` to a new file beside `target` and renames it over
/// `target`, keeping `target`'s permissions.
fn write_beside(target: &Path, bytes: &[u8]) -> std::io::Result<()> {
    // Unique across the process's threads, and made exclusively: two
    // writers of one target never share a partial file.
    static NEXT_PARTIAL: AtomicU64 = AtomicU64::new(0);
    let name = target
        .file_name()
        .ok_or_else(|| std::io::Error::other("the path names no file"))?;
    let mut partial_name = std::ffi::OsString::from(".");
    partial_name.push(name);
    partial_name.push(format!(
        ".{}.{}.partial",
        std::process::id(),
        NEXT_PARTIAL.fetch_add(1, Ordering::Relaxed)
    ));
    let partial = target.with_file_name(partial_name);
    let permissions = std::fs::metadata(target)
        .ok()
        .map(|there| there.permissions());
    create_new_file(&partial, bytes)?;
    let written = permissions
        .map_or(Ok(()), |permissions| {
            std::fs::set_permissions(&partial, permissions)
        })
        .and_then(|()| std::fs::rename(&partial, target));
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
        return written;
    }
    // The rename lasts once the directory is synced; best effort, as a
    // directory some file systems cannot sync still holds the file.
    if let Some(directory) = target
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        if let Ok(directory) = std::fs::File::open(directory) {
            let _ = directory.sync_all();
        }
    }
    Ok(())
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
    use std::os::unix::fs::PermissionsExt;

    /// A scratch directory of this process, removed by the caller.
    fn scratch(name: &str) -> PathBuf {
        let directory =
            std::env::temp_dir().join(format!("remora-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&directory);
        std::fs::create_dir_all(&directory).unwrap();
        directory
    }

    #[test]
    fn a_file_is_replaced_whole_keeping_its_mode_and_a_link_stays_a_link() {
        let directory = scratch("replace");
        let file = directory.join("results.json");
        std::fs::write(&file, b"earlier").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        replace_file(&file, b"later").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"later");
        let mode = std::fs::metadata(&file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "a private file stays private");
        let link = directory.join("link.json");
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

    /// A replacement that cannot finish (here, its rename, over a
    /// directory) leaves what was there and no partial file.
    #[test]
    fn a_failed_replacement_leaves_what_was_there_and_no_partial_file() {
        let directory = scratch("keep");
        let target = directory.join("a-directory");
        std::fs::create_dir_all(target.join("inside")).unwrap();
        assert!(write_beside(&target, b"later").is_err());
        assert!(target.join("inside").is_dir());
        let names: Vec<_> = std::fs::read_dir(&directory).unwrap().collect();
        assert_eq!(names.len(), 1, "no partial file is left");
        std::fs::remove_dir_all(&directory).unwrap();
    }

    /// `/dev/stdout` on a pipe leads to `/proc/self/fd/1`, which reads back
    /// as "pipe:[N]": followed by hand, the write went to a path that is
    /// not there, after the whole run. A pipe is written as it is.
    #[test]
    fn a_pipe_is_written_as_it_is() {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let (mut reader, writer) = std::io::pipe().unwrap();
        let path = PathBuf::from(format!("/proc/self/fd/{}", writer.as_raw_fd()));
        replace_file(&path, b"through a pipe").unwrap();
        drop(writer);
        let mut read = String::new();
        reader.read_to_string(&mut read).unwrap();
        assert_eq!(read, "through a pipe");
    }

    /// Two threads replacing one file shared a partial file: one renamed
    /// it while the other still wrote it, and readers saw mixed files.
    #[test]
    fn writers_of_one_file_never_mix() {
        let directory = scratch("threads");
        let file = directory.join("shared.json");
        std::thread::scope(|scope| {
            for writer in 0..4u8 {
                let file = &file;
                scope.spawn(move || {
                    let contents = vec![b'a' + writer; 4096];
                    for _ in 0..50 {
                        replace_file(file, &contents).unwrap();
                    }
                });
            }
        });
        let contents = std::fs::read(&file).unwrap();
        assert_eq!(contents.len(), 4096);
        assert!(contents.iter().all(|byte| *byte == contents[0]));
        let names: Vec<_> = std::fs::read_dir(&directory).unwrap().collect();
        assert_eq!(names.len(), 1, "no partial file is left");
        std::fs::remove_dir_all(&directory).unwrap();
    }
}
