//! Other programs a benchmark runs (perftest, redis-server): never
//! outliving an early return, and never waited on past a deadline.

use std::io::Read;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

/// How often a wait looks whether the program ended.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// A child process killed and reaped when dropped.
pub struct KillOnDrop(Child);

impl KillOnDrop {
    /// Starts `command` in a process group of its own: a terminal's
    /// Ctrl-C goes to the whole foreground group, and killed with it, a
    /// benchmark's redis-server or perftest failed the benchmark that
    /// `bench all` had promised to let finish. This process stops it: at
    /// its drop, or on an interrupt that ends the process.
    pub fn spawn(command: &mut Command) -> std::io::Result<KillOnDrop> {
        use std::os::unix::process::CommandExt;
        let child = command.process_group(0).spawn()?;
        // An interrupt that ends this process runs no destructors.
        crate::interrupt::kill_on_interrupt(child.id());
        Ok(KillOnDrop(child))
    }

    /// Waits until something listens on TCP `port` (the program, once it
    /// is ready for its client): see [`remora_base::await_listening`].
    pub fn await_listening(&mut self, port: u16, limit: Duration) -> std::io::Result<bool> {
        remora_base::await_listening(&mut self.0, port, limit)
    }

    /// Its output once it ends, or `None` (and killed) if it has not
    /// ended within `limit`. What it wrote to piped streams is read after
    /// it ends, so it must write less than a pipe holds (64 KiB on
    /// Linux): perftest's and redis's output is a few KiB.
    pub fn wait_within(mut self, limit: Duration) -> std::io::Result<Option<Output>> {
        let deadline = Instant::now() + limit;
        // Bounded by the deadline.
        let status = loop {
            if let Some(status) = self.0.try_wait()? {
                break status;
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            std::thread::sleep(POLL_INTERVAL);
        };
        let mut output = Output {
            status,
            stdout: Vec::new(),
            stderr: Vec::new(),
        };
        if let Some(mut stdout) = self.0.stdout.take() {
            stdout.read_to_end(&mut output.stdout)?;
        }
        if let Some(mut stderr) = self.0.stderr.take() {
            stderr.read_to_end(&mut output.stderr)?;
        }
        Ok(Some(output))
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        crate::interrupt::forget_child(self.0.id());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Stdio;

    #[test]
    fn a_program_that_ends_gives_its_output_and_one_that_hangs_is_killed() {
        let mut echo = Command::new("sh");
        echo.args(["-c", "echo table; echo oops >&2; exit 3"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let output = KillOnDrop::spawn(&mut echo)
            .unwrap()
            .wait_within(Duration::from_secs(10))
            .unwrap()
            .expect("it ended");
        assert_eq!(output.status.code(), Some(3));
        assert_eq!(output.stdout, b"table\n");
        assert_eq!(output.stderr, b"oops\n");
        let started = Instant::now();
        let hung = KillOnDrop::spawn(Command::new("sleep").arg("600"))
            .unwrap()
            .wait_within(Duration::from_millis(100))
            .unwrap();
        assert!(hung.is_none());
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "killed, not awaited"
        );
    }
}
