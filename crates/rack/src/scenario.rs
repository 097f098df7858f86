//! The rack a system's scenario is written against, once, and run on both
//! execution modes: the deterministic simulator ([`SimulatedStage`] →
//! [`SimulatedRack`]) and the embedded rack ([`StagedRack`] →
//! [`RunningRack`]).
//!
//! A scenario stages the hosts of a topology ([`RackStage`]): it deploys
//! on their NICs and gives each host its agents, then starts the rack
//! with its switch program. It then drives the running [`Rack`]: reaches
//! a host's NIC or agent, runs until a condition holds, and crashes and
//! restarts hosts. In the simulator time is virtual and a crash lands
//! between two events; on the embedded rack time is the wall clock and a
//! crash lands wherever the fabric thread happens to be.

use crate::assembly::{CpuAccount, EmbeddedRack, StagedRack};
use crate::endpoint::{lock, Shared, SwitchEndpoint};
use crate::simulated::SimulatedRack;
use crate::topology::{LinkSpec, Topology};
use crate::RackError;
use remora_base::Timestamp;
use remora_host::hardware::NicHardware;
use remora_host::{Agent, Host};
use remora_rnic::{RnicConfig, SoftRnic};
use remora_sim::{Event, LinkFaults};
use remora_switch::{Program, Switch, SwitchConfig};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Hosts with NICs ready for deployment, before the rack runs.
pub trait RackStage {
    /// The running rack this stage starts, with switch program `P`.
    type Running<P: Program + Send + 'static>: Rack<Program = P>;

    fn nic_mut(&mut self, host: usize) -> &mut SoftRnic;

    /// The topology the stage's hosts come from.
    fn topology(&self) -> &Topology;

    /// The ACK timeout this mode's queue pairs use: short in virtual
    /// time, [`RACK_ACK_TIMEOUT`](crate::endpoint::RACK_ACK_TIMEOUT) on a
    /// real clock, where a descheduled thread is not a lost packet.
    fn queue_pair_timeout(&self) -> Duration;

    /// Two hosts' NICs at once (a deployment touches both ends).
    fn nic_pair_mut(&mut self, first: usize, second: usize) -> (&mut SoftRnic, &mut SoftRnic);

    /// Runs `agent` on host `host`; returns its index among that host's
    /// agents.
    fn add_agent(&mut self, host: usize, agent: Box<dyn Agent>) -> usize;

    /// Starts the rack with `program` on the switch.
    fn start<P: Program + Send + 'static>(self, program: P) -> Result<Self::Running<P>, RackError>;
}

/// A running rack, whichever mode runs it.
pub trait Rack {
    type Program: Program;

    /// Runs `f` on host `host`'s NIC.
    fn with_nic<R>(&mut self, host: usize, f: impl FnOnce(&mut SoftRnic) -> R) -> R;

    /// Runs `f` on agent `agent` of host `host`, if it is an `A`.
    fn with_agent<A: Agent, R>(
        &mut self,
        host: usize,
        agent: usize,
        f: impl FnOnce(&mut A) -> R,
    ) -> Option<R>;

    /// Runs `f` on the switch program.
    fn with_program<R>(&mut self, f: impl FnOnce(&mut Self::Program) -> R) -> R {
        self.with_switch(|switch| f(switch.program_mut()))
    }

    /// Runs `f` on the switch (its generator, its counters).
    fn with_switch<R>(&mut self, f: impl FnOnce(&mut Switch<Self::Program>) -> R) -> R;

    /// Runs until `done` holds, an agent fails, or `limit` passes
    /// (virtual time in the simulator, the wall clock on the embedded
    /// rack). `done` is asked between steps of the run.
    fn run_until(
        &mut self,
        done: &mut dyn FnMut(&mut Self) -> bool,
        limit: Duration,
    ) -> Result<(), RackError>;

    /// Runs for `duration` whatever happens (an agent failure still ends
    /// it).
    fn run_for(&mut self, duration: Duration) -> Result<(), RackError> {
        match self.run_until(&mut |_| false, duration) {
            Err(RackError::TimedOut(_)) => Ok(()),
            other => other,
        }
    }

    /// The rack's time: virtual in the simulator, the rack's clock on the
    /// embedded rack.
    fn now(&self) -> Timestamp;

    /// Stops the rack (the embedded rack's threads; nothing runs in the
    /// simulator between calls anyway) and says where its CPU went: `None`
    /// in the simulator, whose time is virtual. NICs, agents and the
    /// program stay reachable for the scenario's last checks.
    fn stop(&mut self) -> Result<Option<CpuAccount>, RackError>;

    /// Host `host` crashes now.
    fn crash(&mut self, host: usize);

    /// Host `host` comes back now, with a fresh NIC.
    fn restart(&mut self, host: usize) -> Result<(), RackError>;

    /// Host `host`'s link to the switch is cut now, both ways: the host
    /// runs on, and every frame over that link is lost (a local link to
    /// an offload host still carries its own).
    fn partition(&mut self, host: usize);

    /// Host `host`'s link carries frames again.
    fn heal(&mut self, host: usize);
}

/// A seed of a simulated campaign that failed, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Violation {
    pub seed: u64,
    pub error: String,
}

/// The network a simulated scenario runs on: its links' faults and its
/// NICs' hardware. Link faults alone are a network of ideal NICs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Network {
    pub faults: LinkFaults,
    pub hardware: NicHardware,
}

impl Network {
    /// Clean links, ideal NICs.
    pub const CLEAN: Network = Network {
        faults: LinkFaults::NONE,
        hardware: NicHardware::Ideal,
    };
}

impl Default for Network {
    fn default() -> Network {
        Network::CLEAN
    }
}

impl From<LinkFaults> for Network {
    fn from(faults: LinkFaults) -> Network {
        Network {
            faults,
            hardware: NicHardware::Ideal,
        }
    }
}

/// The simulator's stage: the topology's hosts as simulator hosts.
pub struct SimulatedStage {
    seed: u64,
    topology: Topology,
    hosts: Vec<Host>,
}

impl SimulatedStage {
    /// Host `i` gets an ideal NIC at its topology address, seeded by
    /// `nic_seed`.
    pub fn new(seed: u64, topology: &Topology, nic_seed: u64) -> SimulatedStage {
        SimulatedStage::with_hardware(seed, topology, nic_seed, NicHardware::Ideal)
    }

    /// `topology` on `network`: every host's link to the switch with its
    /// faults (shapes as the topology has them), every NIC with its
    /// hardware, each seeded by `seed`.
    pub fn on_network(seed: u64, topology: &Topology, network: Network) -> SimulatedStage {
        let mut topology = topology.clone();
        for host in 0..topology.hosts().len() {
            let link = LinkSpec {
                faults: network.faults,
                ..topology.host(host).link
            };
            topology.set_link(host, link);
        }
        SimulatedStage::with_hardware(seed, &topology, seed, network.hardware)
    }

    /// The same, with every NIC charging `hardware`'s costs.
    pub fn with_hardware(
        seed: u64,
        topology: &Topology,
        nic_seed: u64,
        hardware: NicHardware,
    ) -> SimulatedStage {
        let profile = hardware.profile();
        let hosts = topology
            .hosts()
            .iter()
            .enumerate()
            .map(|(index, spec)| {
                let config =
                    RnicConfig::new(spec.mac, spec.address, nic_seed ^ ((index as u64) << 8));
                Host::with_profile(spec.name.clone(), config, profile.clone())
                    .expect("compiled-in profiles are checked by tests")
            })
            .collect();
        SimulatedStage {
            seed,
            topology: topology.clone(),
            hosts,
        }
    }
}

/// Between looks at `done`, the simulator runs this much virtual time.
const LOOK_EVERY: Duration = Duration::from_micros(100);
/// Simulator steps per look, a bound on a runaway run.
const MAX_EVENTS_PER_LOOK: u64 = 10_000_000;

/// The simulated queue pairs' ACK timeout: longer than a full window
/// takes to drain at the rack link's rate.
pub const SIMULATED_ACK_TIMEOUT: Duration = Duration::from_micros(200);

impl RackStage for SimulatedStage {
    type Running<P: Program + Send + 'static> = SimulatedRack<P>;

    fn queue_pair_timeout(&self) -> Duration {
        SIMULATED_ACK_TIMEOUT
    }

    fn nic_mut(&mut self, host: usize) -> &mut SoftRnic {
        self.hosts[host].nic_mut()
    }

    fn topology(&self) -> &Topology {
        &self.topology
    }

    fn nic_pair_mut(&mut self, first: usize, second: usize) -> (&mut SoftRnic, &mut SoftRnic) {
        let (first, second) = crate::assembly::two_mut(&mut self.hosts, first, second);
        (first.nic_mut(), second.nic_mut())
    }

    fn add_agent(&mut self, host: usize, agent: Box<dyn Agent>) -> usize {
        self.hosts[host].add_agent(agent);
        self.hosts[host].agent_count() - 1
    }

    fn start<P: Program + Send + 'static>(self, program: P) -> Result<SimulatedRack<P>, RackError> {
        Ok(SimulatedRack::with_topology(
            self.seed,
            program,
            self.hosts,
            &self.topology,
        ))
    }
}

impl<P: Program> Rack for SimulatedRack<P> {
    type Program = P;

    fn with_nic<R>(&mut self, host: usize, f: impl FnOnce(&mut SoftRnic) -> R) -> R {
        f(self.rnic(host))
    }

    fn with_agent<A: Agent, R>(
        &mut self,
        host: usize,
        agent: usize,
        f: impl FnOnce(&mut A) -> R,
    ) -> Option<R> {
        self.host_mut(host).agent_as_mut::<A>(agent).map(f)
    }

    fn with_switch<R>(&mut self, f: impl FnOnce(&mut Switch<P>) -> R) -> R {
        f(self.switch_mut())
    }

    fn run_until(
        &mut self,
        done: &mut dyn FnMut(&mut Self) -> bool,
        limit: Duration,
    ) -> Result<(), RackError> {
        let end = self.simulation.now().saturating_add(limit);
        loop {
            if done(self) {
                return Ok(());
            }
            let now = self.simulation.now();
            if now >= end {
                return Err(RackError::TimedOut(limit));
            }
            let step_end = now.saturating_add(LOOK_EVERY).min(end);
            let outcome = self.simulation.run_until(step_end, MAX_EVENTS_PER_LOOK);
            let reached_the_end = outcome.quiesced || outcome.events < MAX_EVENTS_PER_LOOK;
            if !reached_the_end && outcome.now <= now {
                // A whole look's events at one instant: something is due
                // again each time it is handled. Looping on, the run never
                // reached `end` and hung.
                return Err(RackError::Livelock {
                    at_ns: now.as_nanos(),
                    events: outcome.events,
                });
            }
            if reached_the_end && outcome.now < step_end {
                // Nothing left to happen before the step's end (the next
                // wakeup is after it, or there is none): time moves on all
                // the same. Without this, a rack whose next event is more
                // than a step away never got there (a scenario waiting out
                // a crash with only far timers left hung).
                self.simulation.advance_to(step_end);
            }
            for host in 0..self.hosts.len() {
                self.host_failure(host)?;
            }
        }
    }

    fn now(&self) -> Timestamp {
        self.simulation.now()
    }

    fn stop(&mut self) -> Result<Option<CpuAccount>, RackError> {
        Ok(None)
    }

    fn crash(&mut self, host: usize) {
        let node = self.hosts[host];
        self.simulation.crash_now(node);
    }

    fn restart(&mut self, host: usize) -> Result<(), RackError> {
        let node = self.hosts[host];
        self.simulation.restart_now(node);
        self.host_failure(host)
    }

    fn partition(&mut self, host: usize) {
        let (now, link) = (self.simulation.now(), self.links[host]);
        self.simulation.schedule(now, Event::Partition(link));
    }

    fn heal(&mut self, host: usize) {
        let (now, link) = (self.simulation.now(), self.links[host]);
        self.simulation.schedule(now, Event::Heal(link));
    }
}

impl<P: Program> SimulatedRack<P> {
    /// The first agent failure host `index` recorded, as the rack's error.
    fn host_failure(&mut self, index: usize) -> Result<(), RackError> {
        let host = self.host_mut(index);
        match host.take_failures().into_iter().next() {
            Some(failure) => Err(RackError::Agent {
                host: host.name().to_string(),
                error: failure.error,
            }),
            None => Ok(()),
        }
    }
}

/// The embedded rack running a scenario: the rack and its typed switch.
pub struct RunningRack<P: Program> {
    pub rack: EmbeddedRack,
    pub switch: Shared<SwitchEndpoint<P>>,
}

impl RackStage for StagedRack {
    type Running<P: Program + Send + 'static> = RunningRack<P>;

    fn queue_pair_timeout(&self) -> Duration {
        crate::endpoint::RACK_ACK_TIMEOUT
    }

    fn nic_mut(&mut self, host: usize) -> &mut SoftRnic {
        StagedRack::nic_mut(self, host)
    }

    fn topology(&self) -> &Topology {
        StagedRack::topology(self)
    }

    fn nic_pair_mut(&mut self, first: usize, second: usize) -> (&mut SoftRnic, &mut SoftRnic) {
        StagedRack::nic_pair_mut(self, first, second)
    }

    fn add_agent(&mut self, host: usize, agent: Box<dyn Agent>) -> usize {
        let agent: Arc<Mutex<dyn Agent>> = Arc::new(Mutex::new(agent));
        StagedRack::add_agent(self, host, agent);
        self.agent_count(host) - 1
    }

    fn start<P: Program + Send + 'static>(self, program: P) -> Result<RunningRack<P>, RackError> {
        let ports = self.topology().hosts().len() as u16;
        let (rack, switch) =
            StagedRack::start(self, Switch::new(SwitchConfig::new(ports), program))?;
        Ok(RunningRack { rack, switch })
    }
}

/// How often the embedded rack's scenario looks at `done`.
const EMBEDDED_LOOK_EVERY: Duration = Duration::from_micros(200);

impl<P: Program + Send + 'static> Rack for RunningRack<P> {
    type Program = P;

    fn with_nic<R>(&mut self, host: usize, f: impl FnOnce(&mut SoftRnic) -> R) -> R {
        let result = f(&mut lock(self.rack.host(host)).rnic);
        self.rack.kick();
        result
    }

    fn with_agent<A: Agent, R>(
        &mut self,
        host: usize,
        agent: usize,
        f: impl FnOnce(&mut A) -> R,
    ) -> Option<R> {
        let shared = self.rack.agent(host, agent)?;
        let mut guard = lock(shared);
        // The stage boxed the agent: look through the box.
        let boxed = guard.as_any_mut().downcast_mut::<Box<dyn Agent>>()?;
        (**boxed).as_any_mut().downcast_mut::<A>().map(f)
    }

    fn with_switch<R>(&mut self, f: impl FnOnce(&mut Switch<P>) -> R) -> R {
        let result = f(&mut lock(&self.switch).switch);
        self.rack.kick();
        result
    }

    fn run_until(
        &mut self,
        done: &mut dyn FnMut(&mut Self) -> bool,
        limit: Duration,
    ) -> Result<(), RackError> {
        let started = Instant::now();
        loop {
            if done(self) {
                return Ok(());
            }
            if self.rack.is_finished() {
                // The fabric thread stopped: an agent or a carrier failed.
                return match self.rack.stop_and_join() {
                    Err(error) => Err(error),
                    Ok(_) => Err(RackError::Launch("the fabric thread stopped".into())),
                };
            }
            if started.elapsed() >= limit {
                return Err(RackError::TimedOut(limit));
            }
            std::thread::sleep(EMBEDDED_LOOK_EVERY);
        }
    }

    fn now(&self) -> Timestamp {
        self.rack.now()
    }

    fn stop(&mut self) -> Result<Option<CpuAccount>, RackError> {
        self.rack.stop_and_join()?;
        Ok(Some(self.rack.cpu_account()))
    }

    fn crash(&mut self, host: usize) {
        self.rack.crash(host);
    }

    fn restart(&mut self, host: usize) -> Result<(), RackError> {
        self.rack.restart(host)
    }

    fn partition(&mut self, host: usize) {
        self.rack.set_partitioned(host, true);
    }

    fn heal(&mut self, host: usize) {
        self.rack.set_partitioned(host, false);
    }
}
