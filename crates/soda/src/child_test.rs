//! One test of the running test binary, run again in a child process:
//! for the tests whose outcome is a signal (SIGBUS on lost far memory) or
//! that set process-wide state. The child is polled, not waited for, so
//! one that hangs (the failure those tests guard against) is killed and
//! fails the test instead of hanging it.

use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How a child test ended: its status, and what it wrote to standard
/// error (the test's own messages and the harness's), for the parent to
/// show when the status is not the one it expected.
#[derive(Debug)]
pub struct ChildRun {
    pub status: ExitStatus,
    pub stderr: String,
}

/// Runs test `name` of this binary in a child with `variable` set.
///
/// # Panics
/// If the child cannot start, or runs past `deadline` (it is killed).
pub fn run_test_in_child(name: &str, variable: &str, deadline: Duration) -> ChildRun {
    let started = Instant::now();
    // A file, not a pipe: a child that wrote more than a pipe holds while
    // the parent only polled its status would block, and look hung.
    static CHILDREN: AtomicU64 = AtomicU64::new(0);
    let unique = format!(
        "remora-child-{}-{}.stderr",
        std::process::id(),
        CHILDREN.fetch_add(1, Ordering::Relaxed)
    );
    let path = std::env::temp_dir().join(unique);
    let file = std::fs::File::create(&path).expect("create the child's stderr file");
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", name, "--nocapture"])
        .env(variable, "1")
        .stdout(Stdio::null())
        .stderr(file)
        .spawn()
        .expect("start the child");
    let stderr = || {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let _ = std::fs::remove_file(&path);
        text
    };
    // Bounded by the deadline.
    loop {
        if let Some(status) = child.try_wait().expect("poll the child") {
            return ChildRun {
                status,
                stderr: stderr(),
            };
        }
        if started.elapsed() > deadline {
            child.kill().ok();
            child.wait().ok();
            panic!("the child hung for {deadline:?}; it wrote:\n{}", stderr());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
