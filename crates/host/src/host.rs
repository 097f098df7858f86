//! A host in the simulator: one soft RNIC on its uplink (port 0), and on
//! a local link (port 1) if an offload host sits beside it, and the agents
//! that run beside it.

use crate::agent::{Agent, AgentError, Progress};
use crate::hardware::{HardwareProfile, NicPipeline, ProfileError};
use crate::ports::Ports;
use remora_base::{PortId, Timestamp};
use remora_rnic::{RnicConfig, SoftRnic};
use remora_sim::Node;

/// Failures a host keeps; later ones are counted, not kept, so a broken
/// agent cannot grow memory without bound.
pub const MAX_AGENT_FAILURES: usize = 64;

/// An agent that stopped with an error, and when.
#[derive(Debug)]
pub struct AgentFailure {
    pub agent: &'static str,
    pub at: Timestamp,
    pub error: AgentError,
}

struct Slot {
    agent: Box<dyn Agent>,
    /// A failed agent is not polled again until the host restarts.
    stopped: bool,
}

/// A soft RNIC and its agents as one simulator node. Agent timers are the
/// node's timers, so the simulator's heap schedules them: no tick loops.
pub struct Host {
    name: String,
    config: RnicConfig,
    nic: SoftRnic,
    agents: Vec<Slot>,
    failures: Vec<AgentFailure>,
    failures_dropped: u64,
    crashes: u64,
    ports: Ports,
    /// The NIC hardware's costs; none under the ideal profile, whose
    /// frames go straight between the simulator and the soft RNIC.
    pipeline: Option<NicPipeline>,
    /// A frame the soft RNIC sends, on its way into the pipeline.
    transmit_buffer: Vec<u8>,
}

/// Frames moved from the soft RNIC into the pipeline per turn; the rest
/// wait in the RNIC's own queues.
const MAX_FRAMES_INTO_PIPELINE: usize = 4096;

impl Host {
    /// A host whose NIC is ideal: it costs no time.
    pub fn new(name: impl Into<String>, config: RnicConfig) -> Host {
        Host::with_profile(name, config, HardwareProfile::ideal())
            .expect("the compiled-in ideal profile is checked by tests")
    }

    /// A host whose NIC charges `profile`'s costs. The profile's limit on
    /// outstanding READs and atomics caps the configuration's (a lower
    /// one configured stays). A profile whose values the pipeline cannot
    /// charge is refused.
    pub fn with_profile(
        name: impl Into<String>,
        mut config: RnicConfig,
        profile: HardwareProfile,
    ) -> Result<Host, ProfileError> {
        profile.check()?;
        config.max_read_atomic = config
            .max_read_atomic
            .min(profile.max_read_atomic.value as usize);
        let pipeline = (!profile.is_free()).then(|| NicPipeline::new(profile));
        // Only a pipeline's frames pass through the host's own buffer.
        let transmit_buffer = match pipeline {
            Some(_) => vec![0; remora_sim::FRAME_BUFFER_BYTES],
            None => Vec::new(),
        };
        Ok(Host {
            name: name.into(),
            nic: SoftRnic::new(config.clone()),
            config,
            agents: Vec::new(),
            failures: Vec::new(),
            failures_dropped: 0,
            crashes: 0,
            ports: Ports::UPLINK_ONLY,
            pipeline,
            transmit_buffer,
        })
    }

    /// The NIC hardware's pipeline, unless the profile is ideal.
    pub fn pipeline(&self) -> Option<&NicPipeline> {
        self.pipeline.as_ref()
    }

    /// The host's ports: frames to its local peer take the local link.
    pub fn set_ports(&mut self, ports: Ports) {
        self.ports = ports;
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn nic(&self) -> &SoftRnic {
        &self.nic
    }

    pub fn nic_mut(&mut self) -> &mut SoftRnic {
        &mut self.nic
    }

    /// Adds an agent; it gets its first turn at the next event.
    pub fn add_agent(&mut self, agent: Box<dyn Agent>) {
        self.agents.push(Slot {
            agent,
            stopped: false,
        });
    }

    pub fn agent_count(&self) -> usize {
        self.agents.len()
    }

    /// The agent at `index`, in the order added.
    pub fn agent(&self, index: usize) -> &dyn Agent {
        self.agents[index].agent.as_ref()
    }

    pub fn agent_mut(&mut self, index: usize) -> &mut dyn Agent {
        self.agents[index].agent.as_mut()
    }

    /// The agent at `index` as its concrete type, if it is a `T`.
    pub fn agent_as<T: Agent>(&self, index: usize) -> Option<&T> {
        // Through the box to the agent itself (a box of an agent is an
        // agent too, but not the `T` asked for).
        let agent: &dyn Agent = &*self.agents.get(index)?.agent;
        agent.as_any().downcast_ref::<T>()
    }

    pub fn agent_as_mut<T: Agent>(&mut self, index: usize) -> Option<&mut T> {
        let agent: &mut dyn Agent = &mut *self.agents.get_mut(index)?.agent;
        agent.as_any_mut().downcast_mut::<T>()
    }

    /// Agents that stopped with an error, oldest first.
    pub fn failures(&self) -> &[AgentFailure] {
        &self.failures
    }

    /// Takes the failures recorded so far, leaving none.
    pub fn take_failures(&mut self) -> Vec<AgentFailure> {
        std::mem::take(&mut self.failures)
    }

    /// How many times the host crashed.
    pub fn crashes(&self) -> u64 {
        self.crashes
    }

    /// Gives every running agent a turn: after frames, the agents frames
    /// concern; after a timer, also those whose timer is due.
    pub fn poll_agents(&mut self, now: Timestamp, after_frame: bool) -> Progress {
        let mut progress = Progress::Idle;
        for index in 0..self.agents.len() {
            let slot = &mut self.agents[index];
            let concerned = slot.agent.woken_by_frames()
                || (!after_frame && slot.agent.poll_timeout().is_some_and(|at| at <= now));
            if slot.stopped || !concerned {
                continue;
            }
            match slot.agent.poll(now, &mut self.nic) {
                Ok(turn) => progress = progress.or(turn),
                Err(error) => {
                    let agent = slot.agent.name();
                    slot.stopped = true;
                    tracing::warn!(host = %self.name, agent, %error, "agent stopped");
                    self.record_failure(agent, now, error);
                }
            }
        }
        progress
    }

    fn record_failure(&mut self, agent: &'static str, at: Timestamp, error: AgentError) {
        if self.failures.len() < MAX_AGENT_FAILURES {
            self.failures.push(AgentFailure { agent, at, error });
        } else {
            self.failures_dropped += 1;
        }
    }

    fn agents_timeout(&self) -> Option<Timestamp> {
        self.agents
            .iter()
            .filter(|slot| !slot.stopped)
            .filter_map(|slot| slot.agent.poll_timeout())
            .min()
    }
}

impl Host {
    /// Hands the soft RNIC the received frames whose hardware time is up;
    /// whether there were any.
    fn deliver_received(&mut self, now: Timestamp) -> bool {
        let Some(pipeline) = &mut self.pipeline else {
            return false;
        };
        let mut delivered = false;
        while let Some(frame) = pipeline.poll_received(now) {
            self.nic.handle_frame(now, &frame);
            delivered = true;
        }
        delivered
    }

    /// Moves what the soft RNIC sends into the pipeline's transmit side,
    /// while it has room: fed regardless, a burst past it was dropped
    /// inside the sending NIC (and each drop cost a go-back-N).
    fn feed_transmit(&mut self, now: Timestamp) {
        let Some(pipeline) = &mut self.pipeline else {
            return;
        };
        for _ in 0..MAX_FRAMES_INTO_PIPELINE {
            if !pipeline.has_transmit_room() {
                break;
            }
            let Some(length) = self.nic.poll_transmit(now, &mut self.transmit_buffer) else {
                break;
            };
            pipeline.handle_transmitted(now, &self.transmit_buffer[..length]);
        }
    }
}

impl Node for Host {
    fn handle_frame(&mut self, now: Timestamp, _port: PortId, frame: &[u8]) {
        match &mut self.pipeline {
            None => self.nic.handle_frame(now, frame),
            Some(pipeline) => {
                pipeline.handle_received(now, frame);
                self.deliver_received(now);
            }
        }
        let _ = self.poll_agents(now, true);
    }

    fn poll_transmit(&mut self, now: Timestamp, buffer: &mut [u8]) -> Option<(PortId, usize)> {
        let length = match &mut self.pipeline {
            None => self.nic.poll_transmit(now, buffer)?,
            Some(_) => {
                self.feed_transmit(now);
                let frame = self.pipeline.as_mut()?.poll_transmit(now)?;
                buffer[..frame.len()].copy_from_slice(&frame);
                frame.len()
            }
        };
        Some((self.ports.port_for(&buffer[..length]), length))
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        let pipeline = self.pipeline.as_ref().and_then(NicPipeline::poll_timeout);
        [self.nic.poll_timeout(), self.agents_timeout(), pipeline]
            .into_iter()
            .flatten()
            .min()
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        self.deliver_received(now);
        if self.nic.poll_timeout().is_some_and(|at| at <= now) {
            self.nic.handle_timeout(now);
        }
        // Agents woken by frames see what the released frames did; those
        // whose timers are due get their turn.
        let _ = self.poll_agents(now, false);
    }

    fn crash(&mut self, now: Timestamp) {
        tracing::info!(host = %self.name, at_ns = now.as_nanos(), "host crashed");
        self.crashes += 1;
        if let Some(pipeline) = &mut self.pipeline {
            pipeline.clear();
        }
        for slot in &mut self.agents {
            slot.agent.crash();
        }
    }

    fn restart(&mut self, now: Timestamp) {
        tracing::info!(host = %self.name, at_ns = now.as_nanos(), "host restarted");
        // A restarted host has a new device: no queue pairs, no keys, no
        // regions inside it. A new seed, so its keys and PSNs differ from
        // the last incarnation's, as a rebooted NIC's would.
        let mut config = self.config.clone();
        config.seed = config.seed.wrapping_add(self.crashes << 32);
        self.nic = SoftRnic::new(config);
        for index in 0..self.agents.len() {
            let slot = &mut self.agents[index];
            slot.stopped = false;
            if let Err(error) = slot.agent.restart(now, &mut self.nic) {
                let agent = slot.agent.name();
                slot.stopped = true;
                self.record_failure(agent, now, error);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::NicHardware;
    use remora_wire::{Ipv4Address, MacAddress};

    fn config() -> RnicConfig {
        RnicConfig::new(
            MacAddress([2, 0, 0, 0, 0, 1]),
            Ipv4Address::new(10, 0, 0, 1),
            1,
        )
    }

    /// A profile built in code with a zero cache line divided by zero on
    /// the first atomic; it is refused when the host takes it.
    #[test]
    fn a_hand_built_profile_with_a_zero_cache_line_is_refused() {
        let mut profile = NicHardware::Cx5.profile();
        profile.cache_line_bytes.value = 0.0;
        let refused = Host::with_profile("host", config(), profile);
        assert!(matches!(
            refused,
            Err(ProfileError::Invalid {
                field: "cache_line_bytes",
                ..
            })
        ));
    }

    /// A fractional cache line (8.5) or READ/atomic slot count (16.5)
    /// passed the checks, cut down to a whole number where it was used.
    #[test]
    fn a_hand_built_profile_with_fractional_counts_is_refused() {
        let mut line = NicHardware::Cx5.profile();
        line.cache_line_bytes.value = 8.5;
        let mut slots = NicHardware::Cx5.profile();
        slots.max_read_atomic.value = 16.5;
        for (profile, expected) in [(line, "cache_line_bytes"), (slots, "max_read_atomic")] {
            let refused = Host::with_profile("host", config(), profile);
            assert!(
                matches!(refused, Err(ProfileError::Invalid { field, .. }) if field == expected),
                "{expected}"
            );
        }
    }

    /// More frames ready to send than the transmit pipeline holds (40
    /// queue pairs, each a full window of 8-byte WRITEs): the host fed
    /// them all in and the pipeline dropped those past its bound, each a
    /// go-back-N later. They wait in the NIC's queues now, and all leave.
    #[test]
    fn a_burst_past_the_transmit_pipeline_waits_in_the_nic() {
        use remora_rnic::{
            AccessFlags, DataPath, QueuePairBuilder, QueuePairEndpoint, RemoteAddress,
            SendOperation, SendRequest, Verbs,
        };
        use remora_wire::{Psn, Qpn, Rkey, VirtAddr};
        const QUEUE_PAIRS: u32 = 40;
        const WRITES: u64 = 256;
        let mut host = Host::with_profile("host", config(), NicHardware::Cx5.profile()).unwrap();
        let nic = host.nic_mut();
        let domain = nic.alloc_protection_domain().unwrap();
        let region = nic.register_memory(domain, 4096, AccessFlags::ALL).unwrap();
        let queue = nic.create_completion_queue(16_384).unwrap();
        let mut builder = QueuePairBuilder::new(domain, queue, queue);
        builder.send_queue_depth = WRITES as usize;
        for index in 0..QUEUE_PAIRS {
            let prepared = nic.create_queue_pair(&builder).unwrap();
            let peer = QueuePairEndpoint {
                qpn: Qpn::new(0x100 + index).unwrap(),
                address: Ipv4Address::new(10, 0, 0, 2),
                mac: MacAddress([2, 0, 0, 0, 0, 2]),
                initial_psn: Psn::new(0),
            };
            let queue_pair = nic.handshake(prepared, peer).unwrap();
            for id in 0..WRITES {
                let remote = RemoteAddress {
                    address: VirtAddr(0x1000),
                    rkey: Rkey(7),
                };
                let write = SendOperation::Write {
                    remote,
                    immediate: None,
                };
                let request = SendRequest::new(id, write, &[region.slice(0, 8)]).unwrap();
                nic.post_send(queue_pair, request).unwrap();
            }
        }
        let mut buffer = vec![0u8; remora_wire::frame::MAX_FRAME_LEN];
        let mut sent = 0u64;
        let mut now = Timestamp::ZERO;
        for _ in 0..1_000_000 {
            match host.poll_transmit(now, &mut buffer) {
                Some(_) => sent += 1,
                None => match host.poll_timeout() {
                    Some(next) if sent < u64::from(QUEUE_PAIRS) * WRITES => now = now.max(next),
                    _ => break,
                },
            }
        }
        let pipeline = host.pipeline().expect("a cx5 host has a pipeline");
        assert_eq!(pipeline.counters().transmitted_dropped, 0);
        assert_eq!(sent, u64::from(QUEUE_PAIRS) * WRITES);
    }

    /// The profile's READ/atomic limit caps the configuration's; it used
    /// to replace it, raising a lower limit the configuration chose.
    #[test]
    fn a_lower_configured_read_atomic_limit_stays_under_a_profile() {
        let mut lower = config();
        lower.max_read_atomic = 4;
        let host = Host::with_profile("host", lower, NicHardware::Cx5.profile()).unwrap();
        assert_eq!(host.config.max_read_atomic, 4);
        let host = Host::with_profile("host", config(), NicHardware::Cx5.profile()).unwrap();
        assert_eq!(host.config.max_read_atomic, 16);
    }
}
