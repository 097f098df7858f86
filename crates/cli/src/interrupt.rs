//! Interrupts (Ctrl-C, SIGTERM, SIGHUP): one handler for the process.
//! Commands that can stop cleanly take a stop flag the first interrupt
//! raises; scratch files of commands that cannot are removed before the
//! process ends.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Whether Ctrl-C (or SIGTERM, SIGHUP) came.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// The stop flags handed out, raised by an interrupt. Weak: a rack's own
/// end raises its flag too, so each launch takes a fresh one.
static STOP_FLAGS: Mutex<Vec<Weak<AtomicBool>>> = Mutex::new(Vec::new());

/// Scratch paths (files or directories) removed if an interrupt ends the
/// process: `kv ycsb`'s file device and `soda run`'s work directory were
/// left behind by a Ctrl-C.
static SCRATCH: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// Set by a command that has nothing to stop cleanly: its first interrupt
/// ends the process (after the scratch paths). Commands that check
/// `interrupted()` between steps (`demo`, `rack up`) leave it unset.
static EXIT_AT_FIRST: AtomicBool = AtomicBool::new(false);

/// Installs the interrupt handler, once: the first interrupt raises every
/// live stop flag and marks the process interrupted, for the steps still to
/// come to see; a second ends the process (exit 130). Only raising a flag,
/// it left a command that had passed its rack to run its other steps, deaf
/// to every further Ctrl-C. A command that asked for it
/// ([`exit_at_first_interrupt`]) ends at the first, unless a stop flag
/// is live. Either end removes the scratch paths first.
pub fn handle_interrupts() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let _ = ctrlc::set_handler(|| {
            if INTERRUPTED.swap(true, Ordering::SeqCst) {
                exit_interrupted();
            }
            let flags = STOP_FLAGS.lock().unwrap_or_else(|e| e.into_inner());
            let live: Vec<_> = flags.iter().filter_map(Weak::upgrade).collect();
            if live.is_empty() && EXIT_AT_FIRST.load(Ordering::SeqCst) {
                exit_interrupted();
            }
            for flag in live {
                flag.store(true, Ordering::Relaxed);
            }
        });
    });
}

fn exit_interrupted() -> ! {
    let scratch = std::mem::take(&mut *SCRATCH.lock().unwrap_or_else(|e| e.into_inner()));
    for path in scratch {
        let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
    }
    std::process::exit(i32::from(INTERRUPTED_EXIT));
}

/// For a command with nothing to stop cleanly: the first interrupt ends
/// the process (exit 130), removing its scratch paths. Called first thing,
/// so that an interrupt before its scratch exists ends it too.
pub fn exit_at_first_interrupt() {
    EXIT_AT_FIRST.store(true, Ordering::SeqCst);
    handle_interrupts();
}

/// A scratch directory that an interrupt removes too: on the list from
/// creation until it is gone, so that no interrupt finds it off the list
/// while it still exists.
pub struct ScratchDirectory {
    directory: Option<tempfile::TempDir>,
    path: PathBuf,
}

pub fn remove_on_interrupt(directory: tempfile::TempDir) -> ScratchDirectory {
    handle_interrupts();
    let path = directory.path().to_owned();
    SCRATCH
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(path.clone());
    ScratchDirectory {
        directory: Some(directory),
        path,
    }
}

impl ScratchDirectory {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ScratchDirectory {
    fn drop(&mut self) {
        // Removed first, then off the list.
        drop(self.directory.take());
        let mut scratch = SCRATCH.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = scratch.iter().position(|path| *path == self.path) {
            scratch.swap_remove(at);
        }
    }
}

/// Whether an interrupt came: steps after one do not start.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// A fresh flag that an interrupt raises.
pub fn stop_flag() -> Arc<AtomicBool> {
    handle_interrupts();
    let stop = Arc::new(AtomicBool::new(interrupted()));
    let mut flags = STOP_FLAGS.lock().unwrap_or_else(|e| e.into_inner());
    flags.retain(|flag| flag.strong_count() > 0);
    flags.push(Arc::downgrade(&stop));
    stop
}

/// The exit code of an interrupted command.
pub const INTERRUPTED_EXIT: u8 = 130;
