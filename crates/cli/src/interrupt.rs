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
/// Set by a command that runs steps and stops between them (`bench
/// all`): its first interrupt lets the step under way finish, then the
/// command ends with what it has; a step's own exit-at-first is ignored.
static BETWEEN_STEPS: AtomicBool = AtomicBool::new(false);
/// Child processes an interrupt that ends the process kills first: the
/// exit runs no destructors, and a benchmark's `redis-server` was left
/// listening after a SIGTERM to this process alone.
static CHILDREN: Mutex<Vec<u32>> = Mutex::new(Vec::new());
/// Clean-ups an interrupt that ends the process runs first, for what a
/// destructor would have removed (`rack up`'s network namespaces).
static FORCED_EXIT_HOOKS: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

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
            if BETWEEN_STEPS.load(Ordering::SeqCst) {
                eprintln!(
                    "\ninterrupted: this step ends, then the report of those that finished; interrupt again to stop now"
                );
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
    forced_exit_cleanup();
    std::process::exit(i32::from(INTERRUPTED_EXIT));
}

/// What an interrupt that ends the process undoes first: its children,
/// its scratch paths and what the hooks remove.
fn forced_exit_cleanup() {
    let hooks = std::mem::take(&mut *FORCED_EXIT_HOOKS.lock().unwrap_or_else(|e| e.into_inner()));
    for hook in hooks {
        hook();
    }
    let children = std::mem::take(&mut *CHILDREN.lock().unwrap_or_else(|e| e.into_inner()));
    for child in children {
        if let Some(pid) = rustix::process::Pid::from_raw(child as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
    let scratch = std::mem::take(&mut *SCRATCH.lock().unwrap_or_else(|e| e.into_inner()));
    for path in scratch {
        let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
    }
}

/// Runs `hook` if an interrupt ends the process (once, however often it
/// is asked for).
pub fn at_forced_exit(hook: fn()) {
    handle_interrupts();
    let mut hooks = FORCED_EXIT_HOOKS.lock().unwrap_or_else(|e| e.into_inner());
    if !hooks.contains(&hook) {
        hooks.push(hook);
    }
}

/// For a command with nothing to stop cleanly: the first interrupt ends
/// the process (exit 130), removing its scratch paths. Called first thing,
/// so that an interrupt before its scratch exists ends it too.
pub fn exit_at_first_interrupt() {
    EXIT_AT_FIRST.store(true, Ordering::SeqCst);
    handle_interrupts();
}

/// [`exit_at_first_interrupt`] for one step of a longer command (a
/// benchmark of `bench all`): the setting goes back to what it was when
/// the returned guard drops. Set for good, the steps after it ended at the
/// first Ctrl-C too, before the command's own end (its report).
#[must_use = "the setting lasts only while the guard lives"]
pub fn exit_at_first_interrupt_for_now() -> ExitAtFirstInterrupt {
    // Within a command that stops between its steps, the step runs on:
    // ending at once lost the report of every step before it.
    let exit = !BETWEEN_STEPS.load(Ordering::SeqCst);
    let before = EXIT_AT_FIRST.swap(exit, Ordering::SeqCst);
    handle_interrupts();
    ExitAtFirstInterrupt { before }
}

/// For a command of steps that checks [`interrupted`] between them: while
/// the guard lives, a first interrupt lets the step under way finish
/// (whatever the step asks for), and a second ends the process. Without
/// it, `bench all` heard nothing of a first Ctrl-C after `bench soda` had
/// run, and ended at once, with no report, during `bench kv`.
#[must_use = "the setting lasts only while the guard lives"]
pub fn stop_between_steps() -> BetweenSteps {
    BETWEEN_STEPS.store(true, Ordering::SeqCst);
    handle_interrupts();
    BetweenSteps
}

pub struct BetweenSteps;

impl Drop for BetweenSteps {
    fn drop(&mut self) {
        BETWEEN_STEPS.store(false, Ordering::SeqCst);
    }
}

pub struct ExitAtFirstInterrupt {
    before: bool,
}

impl Drop for ExitAtFirstInterrupt {
    fn drop(&mut self) {
        EXIT_AT_FIRST.store(self.before, Ordering::SeqCst);
    }
}

/// A child process an interrupt that ends this one kills first (see
/// [`CHILDREN`]); [`forget_child`] takes it off the list once reaped.
pub fn kill_on_interrupt(pid: u32) {
    CHILDREN.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
}

pub fn forget_child(pid: u32) {
    let mut children = CHILDREN.lock().unwrap_or_else(|e| e.into_inner());
    children.retain(|child| *child != pid);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The settings are the process's: tests of them take turns.
    fn serial() -> std::sync::MutexGuard<'static, ()> {
        static SERIAL: Mutex<()> = Mutex::new(());
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `bench soda` and `bench kv` set exit-at-first for good, so in
    /// `bench all` every benchmark after them ended at the first Ctrl-C,
    /// before the run's report. The setting lasts while its guard lives.
    #[test]
    fn exit_at_first_interrupt_for_now_ends_with_its_guard() {
        let _serial = serial();
        let before = EXIT_AT_FIRST.load(Ordering::SeqCst);
        {
            let _guard = exit_at_first_interrupt_for_now();
            assert!(EXIT_AT_FIRST.load(Ordering::SeqCst));
        }
        assert_eq!(EXIT_AT_FIRST.load(Ordering::SeqCst), before);
    }

    /// Within `bench all`, a step that would end at the first interrupt
    /// runs on instead, and the setting comes back after.
    #[test]
    fn a_step_of_a_command_that_stops_between_steps_runs_on() {
        let _serial = serial();
        let before = EXIT_AT_FIRST.load(Ordering::SeqCst);
        {
            let _steps = stop_between_steps();
            let _step = exit_at_first_interrupt_for_now();
            assert!(!EXIT_AT_FIRST.load(Ordering::SeqCst));
        }
        assert!(!BETWEEN_STEPS.load(Ordering::SeqCst));
        assert_eq!(EXIT_AT_FIRST.load(Ordering::SeqCst), before);
    }
}
