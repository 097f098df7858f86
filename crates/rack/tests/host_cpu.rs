//! A host with a CPU of its own on the embedded rack: its agent is polled
//! on that thread, never while the host is down, again after a restart,
//! and the rack's CPU account names that thread's time and the agent's.

use remora_base::Timestamp;
use remora_host::{Agent, AgentError, Progress};
use remora_rack::assembly::RackBuilder;
use remora_rack::topology::{Topology, COMPUTE_HOST};
use remora_rnic::Verbs;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Counts its polls and restarts; always has work.
struct Counter {
    polls: Arc<AtomicU64>,
    restarts: Arc<AtomicU64>,
}

impl Agent for Counter {
    fn name(&self) -> &'static str {
        "counter"
    }

    fn poll(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        self.polls.fetch_add(1, Ordering::SeqCst);
        Ok(Progress::Moved)
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        Some(Timestamp::ZERO)
    }

    fn crash(&mut self) {}

    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        self.restarts.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Waits until `polls` passes `above`, for at most 10 s.
fn polled_past(polls: &AtomicU64, above: u64) -> bool {
    let limit = Instant::now() + Duration::from_secs(10);
    while Instant::now() < limit {
        if polls.load(Ordering::SeqCst) > above {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

#[test]
fn an_agent_on_its_hosts_own_cpu_stops_while_the_host_is_down_and_resumes_after() {
    let topology = Topology::compute_and_memory();
    let mut staged = RackBuilder::new(&topology)
        .thread_name("host-cpu-test")
        .own_cpu(COMPUTE_HOST)
        .build()
        .unwrap();
    let (polls, restarts) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let counter = Counter {
        polls: Arc::clone(&polls),
        restarts: Arc::clone(&restarts),
    };
    staged.add_agent(COMPUTE_HOST, Arc::new(Mutex::new(counter)));
    let switch = staged.l2l3_switch();
    let (mut rack, _switch) = staged.start(switch).unwrap();
    assert!(polled_past(&polls, 10), "the host's CPU polls its agent");
    rack.crash(COMPUTE_HOST);
    // A poll under way finished before the crash took the host: none
    // comes after it.
    let at_crash = polls.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(polls.load(Ordering::SeqCst), at_crash, "polled while down");
    rack.restart(COMPUTE_HOST).unwrap();
    assert_eq!(restarts.load(Ordering::SeqCst), 1);
    assert!(
        polled_past(&polls, at_crash),
        "polled again after the restart"
    );
    rack.stop_and_join().unwrap();
    let account = rack.cpu_account();
    let host_cpu = account.host_cpus[COMPUTE_HOST].expect("the compute host had its own CPU");
    assert!(host_cpu > Duration::ZERO, "{account:?}");
    assert!(
        account.agents[COMPUTE_HOST][0] > Duration::ZERO,
        "{account:?}"
    );
    assert_eq!(
        account.host_cpus[1], None,
        "the memory host ran on the fabric"
    );
}

/// Says whether it was polled between its crash and its restart; its
/// restart takes `restart_time`.
struct Watchful {
    crashed: bool,
    polled_while_crashed: Arc<AtomicU64>,
    restart_time: Duration,
}

impl Agent for Watchful {
    fn name(&self) -> &'static str {
        "watchful"
    }

    fn poll(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        if self.crashed {
            self.polled_while_crashed.fetch_add(1, Ordering::SeqCst);
        }
        Ok(Progress::Moved)
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        Some(Timestamp::ZERO)
    }

    fn crash(&mut self) {
        self.crashed = true;
    }

    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        std::thread::sleep(self.restart_time);
        self.crashed = false;
        Ok(())
    }
}

/// A restart swapped in the host's fresh NIC, then restarted its agents
/// one by one: while the first restarted, the fabric thread polled the
/// second, still crashed, on the new NIC (its old handles could name the
/// first's new completion queue). Every agent restarts before any is
/// polled now.
#[test]
fn no_agent_is_polled_between_its_hosts_restart_and_its_own() {
    let topology = Topology::compute_and_memory();
    let mut staged = RackBuilder::new(&topology)
        .thread_name("restart-order-test")
        .build()
        .unwrap();
    let polled_while_crashed = Arc::new(AtomicU64::new(0));
    for restart_time in [Duration::from_millis(100), Duration::ZERO] {
        let agent = Watchful {
            crashed: false,
            polled_while_crashed: Arc::clone(&polled_while_crashed),
            restart_time,
        };
        staged.add_agent(COMPUTE_HOST, Arc::new(Mutex::new(agent)));
    }
    let switch = staged.l2l3_switch();
    let (mut rack, _switch) = staged.start(switch).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    rack.crash(COMPUTE_HOST);
    rack.restart(COMPUTE_HOST).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    rack.stop_and_join().unwrap();
    assert_eq!(polled_while_crashed.load(Ordering::SeqCst), 0);
}
