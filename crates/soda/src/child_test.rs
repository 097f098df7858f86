//! One test of the running test binary, run again in a child process:
//! for the tests whose outcome is a signal (SIGBUS on lost far memory) or
//! that set process-wide state. The child is polled, not waited for, so
//! one that hangs (the failure those tests guard against) is killed and
//! fails the test instead of hanging it.

use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Runs test `name` of this binary in a child with `variable` set; its
/// exit status.
///
/// # Panics
/// If the child cannot start, or runs past `deadline` (it is killed).
pub fn run_test_in_child(name: &str, variable: &str, deadline: Duration) -> ExitStatus {
    let started = Instant::now();
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", name, "--nocapture"])
        .env(variable, "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the child");
    // Bounded by the deadline.
    loop {
        if let Some(status) = child.try_wait().expect("poll the child") {
            return status;
        }
        if started.elapsed() > deadline {
            child.kill().ok();
            child.wait().ok();
            panic!("the child hung for {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
