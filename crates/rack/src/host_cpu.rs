//! A host's own CPU on the embedded rack: a thread that runs the host's
//! agents beside the fabric thread, as an application runs on its host's
//! cores while the NIC works on its own.
//!
//! By default a host's agents are pumps of the fabric thread, which also
//! emulates every NIC and the switch: cheap on a two-core machine, but the
//! application's work then shares one thread with the hardware it drives.
//! A host given its own CPU ([`RackBuilder::own_cpu`]) runs its agents on
//! a busy-polling thread instead, so the application's CPU is measured on
//! a thread of its own (its agents' busy time, and the polling between
//! them) and the fabric thread's CPU is the NIC emulation and switch only.
//!
//! The thread polls an agent when its host's NIC moved (the endpoint's
//! activity counter, a word the application reads without the NIC's lock,
//! as a real application reads a completion queue in its own memory), or
//! when the agent's timer is due, but an agent whose last poll found
//! nothing waits at least [`IDLE_POLL_SPACING`] before its timer alone
//! brings it back: the endpoint's lock is the NIC's, and polling under it
//! in a tight loop would starve the fabric thread of it.
//!
//! Both ways of running an agent, a pump of the fabric thread and a host's
//! own CPU, poll it through `poll_on_host`, which counts its busy time.
//!
//! [`RackBuilder::own_cpu`]: crate::assembly::RackBuilder::own_cpu

use crate::endpoint::{
    lock, thread_cpu_ns, DriverKicker, NodeEndpoint, RackClock, RackThread, Shared,
};
use crate::RackError;
use remora_base::Timestamp;
use remora_host::Agent;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An agent's busy time (its polls that moved): the CPU of the host it
/// runs on, reported apart from the NICs'.
pub type BusyNanos = Arc<AtomicU64>;

/// Polls `agent` on `host`'s NIC, unless the host is down; a poll that
/// moved adds its time to `busy_ns`. Returns whether it moved. The caller
/// holds the agent's lock: agent, then host, the order a restart takes
/// too. The agent is told the time read once the host's lock is held: a
/// time read before waiting for it was stale by the wait, and an agent
/// checking its deadlines against it (Clover's pool, whose deadline
/// guards slot reuse) let completions that came during the wait pass.
pub(crate) fn poll_on_host(
    agent: &mut dyn Agent,
    host: &Shared<NodeEndpoint>,
    clock: &RackClock,
    busy_ns: &BusyNanos,
) -> Result<bool, RackError> {
    let mut endpoint = lock(host);
    if endpoint.is_down() {
        return Ok(false);
    }
    let started = Instant::now();
    let now = clock.at(started);
    let progress = agent
        .poll(now, &mut endpoint.rnic)
        .map_err(|error| RackError::Agent {
            host: endpoint.name.clone(),
            error,
        })?;
    if progress.moved() {
        busy_ns.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
    Ok(progress.moved())
}

/// The shortest time between two polls of an agent that its timer alone
/// asks for, after a poll that found nothing: the rack's wake-up grain.
pub const IDLE_POLL_SPACING: Duration = Duration::from_micros(100);

/// One agent on a host's CPU or the fabric thread, with its busy time and
/// when it may next be polled for its timer alone.
pub(crate) struct Seat {
    agent: Arc<Mutex<dyn Agent>>,
    busy_ns: BusyNanos,
    idle_until: Timestamp,
    spacing: IdleSpacing,
}

/// When a poll that found nothing holds the agent's timer back for
/// [`IDLE_POLL_SPACING`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdleSpacing {
    /// Always: a host's own CPU polls under the NIC's lock, which the
    /// fabric thread needs.
    AfterEveryIdlePoll,
    /// Only while the timer is still due after the poll (an agent that
    /// does not move it, or a crashed host's, which is not polled): the
    /// fabric thread keeps an agent's own short timers (a worker pool's
    /// 20 µs look for finished calls, a 50 µs resend) as they are.
    WhileOverdue,
}

impl Seat {
    pub(crate) fn new(
        agent: Arc<Mutex<dyn Agent>>,
        busy_ns: BusyNanos,
        spacing: IdleSpacing,
    ) -> Seat {
        Seat {
            agent,
            busy_ns,
            idle_until: Timestamp::ZERO,
            spacing,
        }
    }

    /// When the agent's timer next asks for a poll: no sooner than the
    /// spacing after a poll that found nothing. A crashed host's agent is
    /// never polled, so its timer stays due; without the spacing, the
    /// fabric thread never slept while the host was down.
    pub(crate) fn next_poll(&self) -> Option<Timestamp> {
        let at = lock(&self.agent).poll_timeout()?;
        Some(at.max(self.idle_until))
    }
}

/// A host's agents on a thread of their own.
pub(crate) struct HostCpu {
    thread: RackThread,
    stop: Arc<AtomicBool>,
}

impl HostCpu {
    /// Starts a thread named `name` running `agents` on `host`'s NIC,
    /// kicking the fabric thread after every poll that moved.
    pub(crate) fn start(
        name: &str,
        host: Shared<NodeEndpoint>,
        agents: Vec<(Arc<Mutex<dyn Agent>>, BusyNanos)>,
        clock: RackClock,
        fabric: DriverKicker,
    ) -> Result<HostCpu, RackError> {
        let stop = Arc::new(AtomicBool::new(false));
        let seats = agents
            .into_iter()
            .map(|(agent, busy_ns)| Seat::new(agent, busy_ns, IdleSpacing::AfterEveryIdlePoll))
            .collect();
        let thread_stop = Arc::clone(&stop);
        let thread = RackThread::spawn(name, "a host's CPU thread", move || {
            run(&host, seats, clock, &fabric, &thread_stop)
        })?;
        Ok(HostCpu { thread, stop })
    }

    /// Whether the thread stopped by itself (an agent failed).
    pub(crate) fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Stops the thread; returns its CPU time, or the agent failure that
    /// stopped it.
    pub(crate) fn stop_and_join(&mut self) -> Result<Duration, RackError> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join()
    }
}

impl Drop for HostCpu {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

/// The thread's loop: busy-polls until stopped; returns its CPU time.
fn run(
    host: &Shared<NodeEndpoint>,
    mut seats: Vec<Seat>,
    clock: RackClock,
    fabric: &DriverKicker,
    stop: &AtomicBool,
) -> Result<Duration, RackError> {
    let started_ns = thread_cpu_ns();
    let activity = lock(host).activity();
    let mut seen_activity = u64::MAX;
    while !stop.load(Ordering::Relaxed) {
        let current = activity.load(Ordering::Acquire);
        let nic_moved = current != seen_activity;
        seen_activity = current;
        let now = clock.now();
        for seat in &mut seats {
            if poll_seat(seat, host, &clock, now, nic_moved)? {
                fabric.kick();
            }
        }
        std::hint::spin_loop();
    }
    Ok(Duration::from_nanos(thread_cpu_ns() - started_ns))
}

/// Polls one agent if its NIC moved or its timer is due; returns whether
/// it moved.
pub(crate) fn poll_seat(
    seat: &mut Seat,
    host: &Shared<NodeEndpoint>,
    clock: &RackClock,
    now: Timestamp,
    nic_moved: bool,
) -> Result<bool, RackError> {
    // Agent, then host: the order the fabric thread and a restart take.
    let mut agent = lock(&seat.agent);
    let timer_due = now >= seat.idle_until && agent.poll_timeout().is_some_and(|at| at <= now);
    let woken = timer_due || (nic_moved && agent.woken_by_frames());
    if !woken {
        return Ok(false);
    }
    let moved = poll_on_host(&mut *agent, host, clock, &seat.busy_ns)?;
    let space = match seat.spacing {
        _ if moved => false,
        IdleSpacing::AfterEveryIdlePoll => true,
        IdleSpacing::WhileOverdue => agent.poll_timeout().is_some_and(|at| at <= now),
    };
    seat.idle_until = match space {
        true => now.saturating_add(IDLE_POLL_SPACING),
        false => now,
    };
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_carrier::{Segment, SegmentPlan};
    use remora_host::{AgentError, Progress};
    use remora_rnic::{RnicConfig, SoftRnic, Verbs};
    use remora_wire::{Ipv4Address, MacAddress};

    /// Remembers the time it was polled at.
    struct Stamper {
        polled_at: Option<Timestamp>,
    }

    impl Agent for Stamper {
        fn name(&self) -> &'static str {
            "stamper"
        }

        fn poll(&mut self, now: Timestamp, _nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
            self.polled_at = Some(now);
            Ok(Progress::Idle)
        }

        fn poll_timeout(&self) -> Option<Timestamp> {
            None
        }

        fn crash(&mut self) {}

        fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
            Ok(())
        }
    }

    fn host() -> Shared<NodeEndpoint> {
        let segment = Segment::anonymous(&SegmentPlan::star(1, 4)).unwrap();
        let config = RnicConfig::new(
            MacAddress([2, 0, 0, 0, 0, 1]),
            Ipv4Address::new(10, 0, 0, 1),
            8,
        );
        Arc::new(Mutex::new(NodeEndpoint::new(
            "host",
            SoftRnic::new(config),
            Box::new(segment.spoke_port(1).unwrap()),
        )))
    }

    /// The time an agent was polled at was read before its host's lock,
    /// so a poll that waited for the lock saw a time from before the
    /// wait: Clover's pool checked its completions' deadlines against it
    /// and passed what arrived during the wait. It is read once the lock
    /// is held.
    #[test]
    fn an_agent_is_told_the_time_after_its_hosts_lock_is_taken() {
        let host = host();
        let clock = RackClock::new();
        let held = lock(&host);
        let (polled_at, released_at) = std::thread::scope(|scope| {
            let poller = scope.spawn(|| {
                let mut agent = Stamper { polled_at: None };
                let busy_ns = BusyNanos::default();
                poll_on_host(&mut agent, &host, &clock, &busy_ns).unwrap();
                agent.polled_at.expect("polled")
            });
            std::thread::sleep(Duration::from_millis(20));
            let released_at = clock.now();
            drop(held);
            (poller.join().unwrap(), released_at)
        });
        assert!(
            polled_at >= released_at,
            "{polled_at:?} before {released_at:?}"
        );
    }
}
