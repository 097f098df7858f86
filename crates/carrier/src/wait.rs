//! Sleeping until a port has frames, a timer is due, or someone kicks.
//!
//! An endpoint (a node, or the switch with all its ports) owns one
//! [`Waiter`]. Ring ports share the endpoint's doorbell, so one futex wait
//! covers them all; socket ports are watched together with `poll`, plus an
//! eventfd for kicks. A [`Kicker`] lets another thread (an application
//! that just posted work) wake the endpoint.
//!
//! [`IdleStrategy`] spins for a short while before blocking: a rack under
//! load never pays a wake-up, and an idle rack does not burn cores.

use crate::doorbell::{timespec, DoorbellRef};
use crate::CarrierError;
use rustix::event::{EventfdFlags, PollFd, PollFlags};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What must be watched to learn that a port received frames.
#[derive(Clone)]
pub enum WaitSource {
    /// The endpoint's doorbell in a ring segment.
    Doorbell(DoorbellRef),
    /// A socket, readable when datagrams wait.
    Fd(RawFd),
}

/// Wakes a [`Waiter`] from any thread.
#[derive(Clone)]
pub enum Kicker {
    Doorbell(DoorbellRef),
    EventFd(Arc<OwnedFd>),
}

impl Kicker {
    pub fn kick(&self) {
        match self {
            Kicker::Doorbell(doorbell) => doorbell.ring(),
            Kicker::EventFd(fd) => {
                // A full counter (EAGAIN) already means "wake up".
                let _ = rustix::io::write(fd.as_fd(), &1u64.to_ne_bytes());
            }
        }
    }
}

enum Mode {
    Doorbell(DoorbellRef),
    Poll { fds: Vec<RawFd>, kick: Arc<OwnedFd> },
}

/// Sleeps for one endpoint.
pub struct Waiter {
    mode: Mode,
}

impl Waiter {
    /// Builds a waiter over the sources of all of an endpoint's ports.
    /// Ring ports of one endpoint must share its doorbell, and one
    /// endpoint cannot mix rings with sockets.
    pub fn new(sources: &[WaitSource]) -> Result<Waiter, CarrierError> {
        let mixed = || {
            CarrierError::Segment(
                "an endpoint's ports must all be rings on one doorbell, or all sockets".into(),
            )
        };
        match sources.first() {
            Some(WaitSource::Doorbell(first)) => {
                let all_same = sources
                    .iter()
                    .all(|source| matches!(source, WaitSource::Doorbell(d) if d.same_as(first)));
                if !all_same {
                    return Err(mixed());
                }
                Ok(Waiter {
                    mode: Mode::Doorbell(first.clone()),
                })
            }
            _ => {
                let mut fds = Vec::with_capacity(sources.len());
                for source in sources {
                    match source {
                        WaitSource::Fd(fd) => fds.push(*fd),
                        WaitSource::Doorbell(_) => return Err(mixed()),
                    }
                }
                let kick =
                    rustix::event::eventfd(0, EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC)
                        .map_err(|error| CarrierError::io("eventfd", error))?;
                Ok(Waiter {
                    mode: Mode::Poll {
                        fds,
                        kick: Arc::new(kick),
                    },
                })
            }
        }
    }

    pub fn kicker(&self) -> Kicker {
        match &self.mode {
            Mode::Doorbell(doorbell) => Kicker::Doorbell(doorbell.clone()),
            Mode::Poll { kick, .. } => Kicker::EventFd(Arc::clone(kick)),
        }
    }

    /// Blocks for at most `timeout`, returning early when a source fires.
    /// `has_work` is asked once more after the sleep is announced; for
    /// rings that closes the window between the last look and the sleep.
    pub fn block(&self, timeout: Duration, has_work: &mut dyn FnMut() -> bool) {
        match &self.mode {
            Mode::Doorbell(doorbell) => doorbell.sleep(timeout, has_work),
            Mode::Poll { fds, kick } => poll_fds(fds, kick, timeout),
        }
    }
}

fn poll_fds(fds: &[RawFd], kick: &OwnedFd, timeout: Duration) {
    // SAFETY: the fds belong to ports that outlive this call (the endpoint
    // owns both its ports and its waiter).
    let borrowed: Vec<BorrowedFd<'_>> = fds
        .iter()
        .map(|fd| unsafe { BorrowedFd::borrow_raw(*fd) })
        .collect();
    let mut poll_fds: Vec<PollFd<'_>> = borrowed
        .iter()
        .map(|fd| PollFd::new(fd, PollFlags::IN))
        .collect();
    poll_fds.push(PollFd::new(kick, PollFlags::IN));
    // EINTR just means "look again".
    let _ = rustix::event::poll(&mut poll_fds, Some(&timespec(timeout)));
    let kicked = poll_fds
        .last()
        .is_some_and(|fd| fd.revents().contains(PollFlags::IN));
    if kicked {
        let mut counter = [0u8; 8];
        let _ = rustix::io::read(kick, &mut counter);
    }
}

/// Poll (yielding the core), then block: how an endpoint waits when it
/// has nothing to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleStrategy {
    /// How long to keep polling after the last work before blocking.
    pub spin: Duration,
    /// The longest single block, so shutdown flags are seen promptly.
    pub max_block: Duration,
}

impl IdleStrategy {
    pub const DEFAULT: IdleStrategy = IdleStrategy {
        spin: Duration::from_micros(50),
        max_block: Duration::from_millis(50),
    };

    /// Called after a round that found no work. `idle_since` is when work
    /// last happened; `deadline` the next timer, if any.
    pub fn idle(
        &self,
        waiter: &Waiter,
        idle_since: Instant,
        deadline: Option<Instant>,
        has_work: &mut dyn FnMut() -> bool,
    ) {
        let now = Instant::now();
        if now.duration_since(idle_since) < self.spin {
            // Polling on, but giving the core to any thread that has work:
            // on a machine with more busy threads than cores (two here,
            // with a SODA run's kernel, fault and DPU threads), a busy-wait
            // held a core the others needed. Idle, the yield returns at
            // once. `bench soda --quick`'s dpu_opt_vs_file_geomean, three
            // runs each: 0.81, 0.97, 1.01 spinning; 1.05, 1.12, 1.20
            // yielding; `bench fabric` and `bench switch` unchanged.
            std::thread::yield_now();
            return;
        }
        let mut timeout = self.max_block;
        if let Some(deadline) = deadline {
            timeout = timeout.min(deadline.saturating_duration_since(now));
        }
        if timeout.is_zero() {
            return;
        }
        waiter.block(timeout, has_work);
    }
}
