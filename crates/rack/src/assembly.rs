//! The rack builder: the one place that turns a [`Topology`] into running
//! parts. It makes the carriers between every host and the switch (rings
//! in one anonymous segment, a memfd segment, or UDP on loopback), wraps
//! each link in the shaper and the fault injector the topology asks for,
//! puts a soft RNIC on every host's end, and starts the fabric thread that
//! pumps the switch, the hosts and their agents.
//!
//! Building is two steps, because systems deploy on the NICs (regions,
//! queue pairs) before they can build their switch program:
//! [`RackBuilder::build`] gives a [`StagedRack`] whose NICs are ready to
//! use, and [`StagedRack::start`] puts the switch on and starts the
//! fabric, giving an [`EmbeddedRack`].

use crate::endpoint::{
    lock, Driver, FabricThread, NodeEndpoint, Pump, RackClock, Shared, SwitchEndpoint,
};
use crate::host_cpu::{poll_seat, BusyNanos, HostCpu, IdleSpacing, Seat};
use crate::report::SwitchReport;
use crate::topology::{HostSpec, LinkSpec, Topology};
use crate::RackError;
use remora_base::Timestamp;
use remora_carrier::wrappers::{
    CaptureDirection, Captured, Counted, Faulty, PcapSink, PortCountersHandle, Shaped,
};
use remora_carrier::{DatagramPort, Port, Segment, SegmentPlan, WaitSource};
use remora_host::Agent;
use remora_rnic::{RnicConfig, SoftRnic};
use remora_sim::LinkFaults;
use remora_switch::{Program, Switch, SwitchConfig};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Slots per ring between a host and the switch.
pub const RING_DEPTH: u32 = 512;

/// What carries frames between the hosts and the switch of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbeddedCarrier {
    /// Rings in an anonymous mapping.
    InProcess,
    /// Rings in a memfd segment, as processes share them.
    SharedMemory,
    /// A UDP tunnel per link on loopback (host `i` on 127.0.0.(11+i)).
    Udp,
}

impl EmbeddedCarrier {
    pub fn name(self) -> &'static str {
        match self {
            EmbeddedCarrier::InProcess => "in-process rings",
            EmbeddedCarrier::SharedMemory => "memfd rings",
            EmbeddedCarrier::Udp => "UDP on loopback",
        }
    }
}

/// The switch's end of host `index`'s link: counted always, then shaped,
/// faulted and captured as asked.
pub fn switch_port(
    host: &HostSpec,
    index: usize,
    port: impl Port + 'static,
    capture: Option<&PcapSink>,
) -> (Box<dyn Port>, PortCountersHandle) {
    let counted = Counted::new(port);
    let handle = counted.handle();
    let mut boxed = link_end(&host.link, counted, 0x5717c4 ^ index as u64);
    if let Some(sink) = capture {
        boxed = Box::new(Captured::new(
            boxed,
            sink.clone(),
            CaptureDirection::Received,
        ));
    }
    (boxed, handle)
}

/// The host's end of its link, shaped and faulted as the topology says.
pub fn host_port(link: &LinkSpec, index: usize, port: impl Port + 'static) -> Box<dyn Port> {
    link_end(link, port, 0x40de ^ index as u64)
}

/// One direction of a link: frames sent through the port are shaped
/// (tail-dropped at a full queue, serialized, delayed), and faults are
/// drawn as each leaves the link, as the simulator's link does. Drawn
/// before the shaper, a lost frame took no bandwidth, a duplicate was
/// serialized twice, and a tail-dropped frame still took a fault draw.
fn link_end(link: &LinkSpec, port: impl Port + 'static, fault_seed: u64) -> Box<dyn Port> {
    let mut boxed: Box<dyn Port> = Box::new(port);
    if link.faults != LinkFaults::NONE {
        boxed = Box::new(Faulty::new(boxed, link.faults, fault_seed));
    }
    if let Some(shape) = link.shape {
        boxed = Box::new(Shaped::new(boxed, shape));
    }
    boxed
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_carrier::wrappers::LinkShape;
    use remora_sim::Probability;

    /// An agent with a timer of its own: due at `due`, and moved
    /// `period` on by every poll.
    struct Timed {
        due: Timestamp,
        period: std::time::Duration,
    }

    impl Agent for Timed {
        fn name(&self) -> &'static str {
            "timed"
        }

        fn poll(
            &mut self,
            now: Timestamp,
            _nic: &mut dyn remora_rnic::Verbs,
        ) -> Result<remora_host::Progress, remora_host::AgentError> {
            if now >= self.due {
                self.due = now.saturating_add(self.period);
            }
            Ok(remora_host::Progress::Idle)
        }

        fn poll_timeout(&self) -> Option<Timestamp> {
            Some(self.due)
        }

        fn crash(&mut self) {}

        fn restart(
            &mut self,
            _now: Timestamp,
            _nic: &mut dyn remora_rnic::Verbs,
        ) -> Result<(), remora_host::AgentError> {
            Ok(())
        }
    }

    /// An agent pump on a host of its own, the host crashed or not.
    fn pump_of(agent: Timed, crashed: bool) -> AgentPump {
        let segment = Segment::anonymous(&SegmentPlan::star(1, 4)).unwrap();
        let config = RnicConfig::new(
            remora_wire::MacAddress([2, 0, 0, 0, 0, 1]),
            remora_wire::Ipv4Address::new(10, 0, 0, 1),
            3,
        );
        let mut host = NodeEndpoint::new(
            "host",
            SoftRnic::new(config),
            Box::new(segment.spoke_port(1).unwrap()),
        );
        if crashed {
            host.crash();
        }
        AgentPump {
            host: Arc::new(Mutex::new(host)),
            seat: Seat::new(
                Arc::new(Mutex::new(agent)),
                BusyNanos::default(),
                IdleSpacing::WhileOverdue,
            ),
        }
    }

    /// A crashed host's agent is not polled, so its due timer never
    /// moved, and the pump's deadline stayed in the past: the fabric
    /// thread never slept while the host was down.
    #[test]
    fn a_crashed_hosts_overdue_agent_does_not_keep_the_fabric_awake() {
        let clock = RackClock::new();
        let agent = Timed {
            due: Timestamp::ZERO,
            period: std::time::Duration::from_micros(20),
        };
        let mut pump = pump_of(agent, true);
        let before = clock.now();
        assert!(!pump.pump(&clock).unwrap());
        let next = pump.seat.next_poll().expect("a timer");
        let spacing = crate::host_cpu::IDLE_POLL_SPACING;
        assert!(next >= before.saturating_add(spacing), "{next:?}");
        assert_eq!(pump.deadline(&clock), Some(clock.instant(next)));
    }

    /// An agent that moves its own timer on keeps it: a worker pool's
    /// 20 µs look for finished calls is not held to the 100 µs spacing.
    #[test]
    fn an_agent_that_moves_its_timer_is_polled_at_it() {
        let clock = RackClock::new();
        let agent = Timed {
            due: Timestamp::ZERO,
            period: std::time::Duration::from_micros(20),
        };
        let mut pump = pump_of(agent, false);
        assert!(!pump.pump(&clock).unwrap());
        let after = clock.now();
        // Spaced, it would be 100 µs after the poll, which came before
        // `after`.
        let next = pump.seat.next_poll().expect("a timer");
        assert!(
            next <= after.saturating_add(std::time::Duration::from_micros(20)),
            "{next:?} after {after:?}"
        );
    }

    /// A link that loses every frame, slow enough that the first frame
    /// still holds it when the second comes, with no queue: the second is
    /// tail-dropped by the shaper and the first lost on the wire, as the
    /// simulator's link would have it. With faults drawn before shaping,
    /// both were lost to faults and the link was never busy.
    #[test]
    fn a_lossy_shaped_link_queues_before_it_loses() {
        let segment = Segment::anonymous(&SegmentPlan::star(1, 8)).unwrap();
        let link = LinkSpec {
            shape: Some(LinkShape {
                bandwidth_bits_per_second: 8_000,
                propagation_delay: std::time::Duration::ZERO,
                queue_limit_bytes: 0,
            }),
            faults: LinkFaults {
                loss: Probability::literal(1.0),
                ..LinkFaults::NONE
            },
        };
        let mut port = host_port(&link, 0, segment.spoke_port(1).unwrap());
        for _ in 0..2 {
            port.send(&[0u8; 100]).unwrap();
        }
        let drops = port.drops();
        assert_eq!(drops.shaping_queue, 1, "{drops:?}");
        assert_eq!(drops.lost_to_faults, 0, "not yet on the wire: {drops:?}");
    }
}

/// A soft RNIC for a host: its MAC and address, a seed per host and
/// per run.
pub fn host_nic(host: &HostSpec, index: usize, seed: u64) -> SoftRnic {
    SoftRnic::new(RnicConfig::new(
        host.mac,
        host.address,
        seed ^ ((index as u64) << 8),
    ))
}

/// Starts a fabric thread pumping `pumps` with the real clock.
pub fn start_fabric(
    name: &str,
    pumps: Vec<Arc<Mutex<dyn Pump>>>,
    pin: bool,
) -> Result<FabricThread, RackError> {
    start_fabric_on(name, vec![pumps], RackClock::new(), pin)
}

/// Starts a fabric thread for each group of pumps (groups left empty get
/// none), all on `clock`, the clock the rack's other threads read too.
fn start_fabric_on(
    name: &str,
    groups: Vec<Vec<Arc<Mutex<dyn Pump>>>>,
    clock: RackClock,
    pin: bool,
) -> Result<FabricThread, RackError> {
    let stop = Arc::new(AtomicBool::new(false));
    let drivers = groups
        .into_iter()
        .filter(|pumps| !pumps.is_empty())
        .map(|pumps| Driver::new(pumps, clock, Arc::clone(&stop)))
        .collect::<Result<Vec<_>, _>>()?;
    FabricThread::start(name, drivers, stop, pin)
}

/// How many threads pump the embedded rack's switch and hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FabricThreads {
    /// One on a machine of two cores or fewer, where a second fabric
    /// thread would only take turns with the application; otherwise one
    /// fewer than the cores, at most one per host plus the switch.
    Auto,
    Exactly(usize),
}

impl FabricThreads {
    /// The thread count for a rack of `hosts` hosts on this machine.
    pub fn resolve(self, hosts: usize) -> usize {
        let wanted = match self {
            FabricThreads::Exactly(count) => count,
            FabricThreads::Auto => {
                let cores = std::thread::available_parallelism().map_or(1, |count| count.get());
                if cores <= 2 {
                    1
                } else {
                    cores - 1
                }
            }
        };
        wanted.clamp(1, hosts + 1)
    }
}

/// The fabric thread that pumps host `index`: the switch is on thread 0,
/// and hosts are dealt out from thread 1 on, so with two threads the
/// switch and the first host do not share one.
fn fabric_thread_of_host(index: usize, threads: usize) -> usize {
    (index + 1) % threads
}

/// Pumps `pumps` on this thread until `stop` (a switch alone, for a rack
/// across hosts).
pub fn run_here(pumps: Vec<Arc<Mutex<dyn Pump>>>, stop: Arc<AtomicBool>) -> Result<(), RackError> {
    Driver::new(pumps, RackClock::new(), stop)?.run()
}

/// Builds the embedded rack of a topology.
pub struct RackBuilder<'t> {
    topology: &'t Topology,
    thread_name: String,
    capture: Option<PcapSink>,
    pin_threads: bool,
    nic_seed: u64,
    carrier: EmbeddedCarrier,
    apart: Vec<bool>,
    own_cpu: Vec<bool>,
    stopping: Option<Arc<AtomicBool>>,
    ring_depth: u32,
    fabric_threads: FabricThreads,
}

impl<'t> RackBuilder<'t> {
    pub fn new(topology: &'t Topology) -> RackBuilder<'t> {
        RackBuilder {
            topology,
            thread_name: "fabric".into(),
            capture: None,
            pin_threads: false,
            nic_seed: 0x7ac4,
            carrier: EmbeddedCarrier::InProcess,
            apart: vec![false; topology.hosts().len()],
            own_cpu: vec![false; topology.hosts().len()],
            stopping: None,
            ring_depth: RING_DEPTH,
            fabric_threads: FabricThreads::Auto,
        }
    }

    /// How many threads pump the switch and the hosts ([`FabricThreads`]).
    pub fn fabric_threads(mut self, threads: FabricThreads) -> RackBuilder<'t> {
        self.fabric_threads = threads;
        self
    }

    /// Slots per ring (a power of two).
    pub fn ring_depth(mut self, depth: u32) -> RackBuilder<'t> {
        self.ring_depth = depth;
        self
    }

    /// Sets `stop` when the fabric thread stops or fails, so threads
    /// started beside it (workloads, control servers) end too.
    pub fn stopping(mut self, stop: &Arc<AtomicBool>) -> RackBuilder<'t> {
        self.stopping = Some(Arc::clone(stop));
        self
    }

    /// The fabric thread's name.
    pub fn thread_name(mut self, name: &str) -> RackBuilder<'t> {
        self.thread_name = name.into();
        self
    }

    /// Records every frame the switch receives.
    pub fn capture(mut self, sink: PcapSink) -> RackBuilder<'t> {
        self.capture = Some(sink);
        self
    }

    /// Pins the fabric thread to the last core. Off by default: on a
    /// shared VM a pinned thread waits out its vCPU's steal (observed: 8 ms
    /// stalls) instead of moving to the other vCPU.
    pub fn pin_threads(mut self, pin: bool) -> RackBuilder<'t> {
        self.pin_threads = pin;
        self
    }

    /// Seeds the NICs' keys and first PSNs.
    pub fn nic_seed(mut self, seed: u64) -> RackBuilder<'t> {
        self.nic_seed = seed;
        self
    }

    pub fn carrier(mut self, carrier: EmbeddedCarrier) -> RackBuilder<'t> {
        self.carrier = carrier;
        self
    }

    /// Host `index` is driven by the application's own thread, not by the
    /// fabric thread: [`StagedRack::take_apart`] hands its endpoint over,
    /// and its rings wake that thread, not the fabric's.
    pub fn drive_apart(mut self, index: usize) -> RackBuilder<'t> {
        self.apart[index] = true;
        self
    }

    /// Host `index`'s agents run on a thread of their own, the host's
    /// CPU, instead of on the fabric thread ([`crate::host_cpu`]): its
    /// application's CPU is then measured apart from the NIC emulation.
    pub fn own_cpu(mut self, index: usize) -> RackBuilder<'t> {
        self.own_cpu[index] = true;
        self
    }

    /// Makes the carriers and the hosts' NICs: a link from each host to
    /// the switch, and a local link between each offload host and the
    /// host it sits beside.
    pub fn build(self) -> Result<StagedRack, RackError> {
        let hosts = self.topology.hosts();
        let local_links: Vec<(usize, usize)> = self.topology.local_links().collect();
        for (host, offload) in &local_links {
            if self.apart[*host] || self.apart[*offload] {
                return Err(RackError::Launch(format!(
                    "host {:?} has a local link: it cannot be driven apart",
                    hosts[if self.apart[*host] { *host } else { *offload }].name
                )));
            }
        }
        let links = hosts.len() + local_links.len();
        let fabric_threads = self.fabric_threads.resolve(hosts.len());
        let mut pairs = match self.carrier {
            EmbeddedCarrier::Udp => udp_pairs(links)?,
            EmbeddedCarrier::InProcess | EmbeddedCarrier::SharedMemory => {
                let plan = ring_plan(&self.apart, &local_links, fabric_threads, self.ring_depth);
                ring_pairs(links, &plan, self.carrier)?
            }
        };
        let local_pairs = pairs.split_off(hosts.len());
        let mut endpoints = Vec::with_capacity(hosts.len());
        let mut switch_ports = Vec::with_capacity(hosts.len());
        let mut port_counters = Vec::with_capacity(hosts.len());
        for (index, (host, (hub, spoke))) in hosts.iter().zip(pairs).enumerate() {
            let (port, counters) = switch_port(host, index, hub, self.capture.as_ref());
            switch_ports.push(port);
            port_counters.push(counters);
            let nic = host_nic(host, index, self.nic_seed);
            endpoints.push(Some(NodeEndpoint::new(
                &host.name,
                nic,
                host_port(&host.link, index, spoke),
            )));
        }
        for ((host, offload), (host_end, offload_end)) in local_links.into_iter().zip(local_pairs) {
            let link = &hosts[offload].local_link;
            let (host_mac, offload_mac) = (hosts[host].mac, hosts[offload].mac);
            let host_end = link_end(link, host_end, 0x10ca1 ^ host as u64);
            let offload_end = link_end(link, offload_end, 0x10ca1 ^ offload as u64);
            let (host_endpoint, offload_endpoint) = two_mut(&mut endpoints, host, offload);
            let apart = "no host with a local link is driven apart";
            host_endpoint
                .as_mut()
                .expect(apart)
                .set_local_link(offload_mac, host_end);
            offload_endpoint
                .as_mut()
                .expect(apart)
                .set_local_link(host_mac, offload_end);
        }
        Ok(StagedRack {
            topology: self.topology.clone(),
            endpoints,
            switch_ports,
            port_counters,
            agents: Vec::new(),
            apart: self.apart,
            own_cpu: self.own_cpu,
            thread_name: self.thread_name,
            pin_threads: self.pin_threads,
            fabric_threads,
            capture: self.capture,
            carrier: self.carrier,
            stopping: self.stopping,
        })
    }
}

/// Two distinct elements of `items`, mutably, in the order asked.
///
/// # Panics
/// If `first == second` or either is out of bounds.
pub(crate) fn two_mut<T>(items: &mut [T], first: usize, second: usize) -> (&mut T, &mut T) {
    assert_ne!(first, second, "two distinct hosts");
    let (low, high) = (first.min(second), first.max(second));
    let (head, tail) = items.split_at_mut(high);
    let (low_item, high_item) = (&mut head[low], &mut tail[0]);
    if first < second {
        (low_item, high_item)
    } else {
        (high_item, low_item)
    }
}

/// (switch end, host end) of one host's link.
type LinkEnd = (Box<dyn Port>, Box<dyn Port>);
type LinkEnds = Vec<LinkEnd>;

/// Which doorbell wakes the consumer of each ring: doorbell `k` is fabric
/// thread `k`'s, and a host driven apart sleeps on one of its own. Link
/// `i` is ring `2i` (spoke → hub) and ring `2i + 1` (hub → spoke); the
/// hosts' uplinks come first (the switch is the hub), then the local links
/// (the host is the hub, its offload host the spoke).
fn ring_plan(
    apart: &[bool],
    local_links: &[(usize, usize)],
    fabric_threads: usize,
    ring_depth: u32,
) -> SegmentPlan {
    let mut doorbell_count = fabric_threads as u32;
    let mut ring_consumers = Vec::with_capacity(2 * (apart.len() + local_links.len()));
    for (index, apart) in apart.iter().enumerate() {
        ring_consumers.push(0);
        let host = if *apart {
            doorbell_count += 1;
            doorbell_count - 1
        } else {
            fabric_thread_of_host(index, fabric_threads) as u32
        };
        ring_consumers.push(host);
    }
    for (host, offload) in local_links {
        ring_consumers.push(fabric_thread_of_host(*host, fabric_threads) as u32);
        ring_consumers.push(fabric_thread_of_host(*offload, fabric_threads) as u32);
    }
    SegmentPlan {
        doorbell_count,
        ring_consumers,
        ring_depth,
    }
}

/// Rings in one segment, laid out by `plan`.
fn ring_pairs(
    count: usize,
    plan: &SegmentPlan,
    carrier: EmbeddedCarrier,
) -> Result<LinkEnds, RackError> {
    let segment = match carrier {
        EmbeddedCarrier::SharedMemory => Segment::shared("remora-rack", plan)?,
        _ => Segment::anonymous(plan)?,
    };
    (1..=count as u32)
        .map(|spoke| -> Result<LinkEnd, RackError> {
            Ok((
                Box::new(segment.hub_port(spoke)?),
                Box::new(segment.spoke_port(spoke)?),
            ))
        })
        .collect()
}

/// A connected UDP socket pair per link on loopback (the switch's end on
/// 127.0.0.1, host `i`'s on 127.0.0.(11+i)).
fn udp_pairs(count: usize) -> Result<LinkEnds, RackError> {
    (0..count)
        .map(|index| -> Result<LinkEnd, RackError> {
            let host = SocketAddr::from(([127, 0, 0, 11 + index as u8], 0));
            let (switch, host) =
                DatagramPort::udp_pair(SocketAddr::from(([127, 0, 0, 1], 0)), host)?;
            Ok((Box::new(switch), Box::new(host)))
        })
        .collect()
}

/// An agent waiting for the fabric: its host, itself, its busy time.
type StagedAgent = (usize, Arc<Mutex<dyn Agent>>, BusyNanos);
/// An agent of a running rack and its busy time.
type RunningAgent = (Arc<Mutex<dyn Agent>>, BusyNanos);

/// Hosts with NICs ready for deployment, before the fabric starts.
pub struct StagedRack {
    topology: Topology,
    /// `None` once taken apart.
    endpoints: Vec<Option<NodeEndpoint>>,
    switch_ports: Vec<Box<dyn Port>>,
    port_counters: Vec<PortCountersHandle>,
    agents: Vec<StagedAgent>,
    apart: Vec<bool>,
    own_cpu: Vec<bool>,
    thread_name: String,
    pin_threads: bool,
    /// Resolved at build, where the rings' doorbells were laid out for it.
    fabric_threads: usize,
    capture: Option<PcapSink>,
    carrier: EmbeddedCarrier,
    stopping: Option<Arc<AtomicBool>>,
}

impl StagedRack {
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    pub fn nic_mut(&mut self, index: usize) -> &mut SoftRnic {
        &mut self.endpoint_mut(index).rnic
    }

    /// Two hosts' NICs at once (a deployment touches both ends).
    ///
    /// # Panics
    /// If `first == second`.
    pub fn nic_pair_mut(&mut self, first: usize, second: usize) -> (&mut SoftRnic, &mut SoftRnic) {
        let (first, second) = two_mut(&mut self.endpoints, first, second);
        let taken = "the host's endpoint was not taken apart";
        (
            &mut first.as_mut().expect(taken).rnic,
            &mut second.as_mut().expect(taken).rnic,
        )
    }

    pub fn endpoint_mut(&mut self, index: usize) -> &mut NodeEndpoint {
        self.endpoints[index]
            .as_mut()
            .expect("the host's endpoint was not taken apart")
    }

    /// Takes the endpoint of a host marked [`RackBuilder::drive_apart`]:
    /// the application owns and pumps it (no lock on its path).
    pub fn take_apart(&mut self, index: usize) -> Option<NodeEndpoint> {
        if !self.apart[index] {
            return None;
        }
        self.endpoints[index].take()
    }

    /// Agents added to host `index` so far.
    pub fn agent_count(&self, index: usize) -> usize {
        self.agents
            .iter()
            .filter(|(host, _, _)| *host == index)
            .count()
    }

    /// Runs `agent` on host `index`'s CPU: a pump of the fabric thread.
    /// Returns the counter of its busy time.
    pub fn add_agent(&mut self, index: usize, agent: Arc<Mutex<dyn Agent>>) -> BusyNanos {
        let busy = Arc::new(AtomicU64::new(0));
        self.agents.push((index, agent, Arc::clone(&busy)));
        busy
    }

    /// Puts `switch` on the switch's ports and starts the fabric thread
    /// (and a thread for each host given its own CPU). Returns the rack
    /// and a handle on the switch, typed by its program.
    pub fn start<P: Program + Send + 'static>(
        self,
        switch: Switch<P>,
    ) -> Result<(EmbeddedRack, Shared<SwitchEndpoint<P>>), RackError> {
        let switch = Arc::new(Mutex::new(SwitchEndpoint::new(switch, self.switch_ports)));
        let hosts: Vec<Option<Shared<NodeEndpoint>>> = self
            .endpoints
            .into_iter()
            .map(|endpoint| endpoint.map(|endpoint| Arc::new(Mutex::new(endpoint))))
            .collect();
        // A host's agents are pumped on its NIC's thread, so the two never
        // wait for each other's lock across threads.
        let threads = self.fabric_threads;
        let mut groups: Vec<Vec<Arc<Mutex<dyn Pump>>>> = vec![Vec::new(); threads];
        groups[0].push(switch.clone());
        for (index, (host, apart)) in hosts.iter().zip(&self.apart).enumerate() {
            if let (Some(host), false) = (host, apart) {
                groups[fabric_thread_of_host(index, threads)].push(host.clone());
            }
        }
        let mut agents: Vec<Vec<RunningAgent>> = vec![Vec::new(); hosts.len()];
        for (index, agent, busy) in self.agents {
            agents[index].push((Arc::clone(&agent), Arc::clone(&busy)));
            let host = hosts[index].clone().ok_or_else(|| {
                RackError::Launch(format!(
                    "host {index}'s endpoint was taken apart: no agent can run on it"
                ))
            })?;
            if !self.own_cpu[index] {
                groups[fabric_thread_of_host(index, threads)].push(Arc::new(Mutex::new(
                    AgentPump {
                        host,
                        seat: Seat::new(agent, busy, IdleSpacing::WhileOverdue),
                    },
                )));
            }
        }
        let clock = RackClock::new();
        let mut fabric = start_fabric_on(&self.thread_name, groups, clock, self.pin_threads)?;
        if let Some(stop) = &self.stopping {
            fabric = fabric.stopping_rack(stop);
        }
        let mut host_cpus = Vec::new();
        for (index, own) in self.own_cpu.iter().enumerate() {
            if let (true, Some(host)) = (*own, &hosts[index]) {
                let name = format!("{}-cpu", self.topology.host(index).name);
                let cpu = HostCpu::start(
                    &name,
                    Arc::clone(host),
                    agents[index].clone(),
                    clock,
                    fabric.kicker(),
                )?;
                host_cpus.push((index, cpu));
            }
        }
        let switch_pump: Arc<Mutex<dyn SwitchReporting>> = switch.clone();
        let rack = EmbeddedRack {
            topology: self.topology,
            hosts,
            agents,
            incarnations: Vec::new(),
            clock,
            switch: switch_pump,
            port_counters: self.port_counters,
            capture: self.capture,
            carrier: self.carrier,
            own_cpu: self.own_cpu,
            host_cpus,
            host_cpu_times: Vec::new(),
            fabric: Some(fabric),
            fabric_cpu: Duration::ZERO,
        };
        Ok((rack, switch))
    }

    /// The usual switch: L2/L3 forwarding between the topology's hosts.
    pub fn l2l3_switch(&self) -> Switch<remora_switch::programs::l2l3::L2L3Forwarding> {
        Switch::new(
            SwitchConfig::new(self.topology.hosts().len() as u16),
            self.topology.forwarding(),
        )
    }
}

/// What the rack reads off its switch, whatever the program.
pub(crate) trait SwitchReporting: Send {
    fn report(&self, ports: &[PortCountersHandle]) -> SwitchReport;
}

impl<P: Program + Send> SwitchReporting for SwitchEndpoint<P> {
    fn report(&self, ports: &[PortCountersHandle]) -> SwitchReport {
        SwitchReport {
            counters: self.switch.counters(),
            ports: ports.iter().map(PortCountersHandle::snapshot).collect(),
            port_drops: self.port_drops(),
            frames_refused_by_carriers: self.health().frames_refused,
            frames_discarded_at_failed_ports: self.health().frames_discarded,
            failed_ports: self.health().failed.clone(),
            resources: self.switch.resources(),
        }
    }
}

/// A running embedded rack: hosts, the switch and the fabric thread.
pub struct EmbeddedRack {
    topology: Topology,
    /// `None` for a host whose endpoint the application took.
    hosts: Vec<Option<Shared<NodeEndpoint>>>,
    /// Each host's agents, in the order added, with their busy time.
    agents: Vec<Vec<RunningAgent>>,
    /// Restarts per host, which seed each new NIC apart.
    incarnations: Vec<u64>,
    /// Time as the agents see it on restart.
    clock: RackClock,
    switch: Arc<Mutex<dyn SwitchReporting>>,
    port_counters: Vec<PortCountersHandle>,
    capture: Option<PcapSink>,
    carrier: EmbeddedCarrier,
    /// Which hosts have a CPU of their own.
    own_cpu: Vec<bool>,
    /// The threads of hosts with a CPU of their own, by host.
    host_cpus: Vec<(usize, HostCpu)>,
    /// Their CPU time once stopped, by host.
    host_cpu_times: Vec<(usize, Duration)>,
    fabric: Option<FabricThread>,
    fabric_cpu: Duration,
}

impl EmbeddedRack {
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Host `index`'s endpoint.
    ///
    /// # Panics
    /// If the application took it apart before the start.
    pub fn host(&self, index: usize) -> &Shared<NodeEndpoint> {
        self.hosts[index]
            .as_ref()
            .expect("the host's endpoint was not taken apart")
    }

    pub fn carrier(&self) -> EmbeddedCarrier {
        self.carrier
    }

    pub fn fabric(&self) -> &FabricThread {
        self.fabric
            .as_ref()
            .expect("the fabric runs until stop_and_join")
    }

    /// Wakes the fabric thread after work was posted (nothing once it
    /// stopped).
    pub fn kick(&self) {
        if let Some(fabric) = &self.fabric {
            fabric.kicker().kick();
        }
    }

    /// The rack's clock: what its agents read as now.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Whether the fabric thread or a host's CPU thread stopped: an
    /// agent or a carrier failed.
    pub fn is_finished(&self) -> bool {
        self.fabric.as_ref().is_none_or(FabricThread::is_finished)
            || self.host_cpus.iter().any(|(_, cpu)| cpu.is_finished())
    }

    /// Stops the hosts' CPU threads and the fabric thread; returns the
    /// fabric thread's CPU time (NIC emulation, switch and the agents it
    /// pumped), apart from the application's.
    pub fn stop_and_join(&mut self) -> Result<Duration, RackError> {
        let mut failure = None;
        for (index, mut cpu) in std::mem::take(&mut self.host_cpus) {
            match cpu.stop_and_join() {
                Ok(time) => self.host_cpu_times.push((index, time)),
                Err(error) => failure = failure.or(Some(error)),
            }
        }
        if let Some(fabric) = self.fabric.take() {
            self.fabric_cpu = fabric.stop_and_join()?;
        }
        if let Some(error) = failure {
            return Err(error);
        }
        if let Some(sink) = &self.capture {
            sink.flush()?;
        }
        Ok(self.fabric_cpu)
    }

    /// The switch's counters, resources and per-port frames.
    pub fn switch_report(&self) -> SwitchReport {
        self.switch
            .lock()
            .expect("switch lock")
            .report(&self.port_counters)
    }

    /// Agent `agent` of host `host` (in the order added).
    pub fn agent(&self, host: usize, agent: usize) -> Option<&Arc<Mutex<dyn Agent>>> {
        self.agents.get(host)?.get(agent).map(|(agent, _)| agent)
    }

    /// Where the CPU went, once stopped ([`EmbeddedRack::stop_and_join`]).
    pub fn cpu_account(&self) -> CpuAccount {
        let agents: Vec<Vec<Duration>> = self
            .agents
            .iter()
            .map(|agents| {
                agents
                    .iter()
                    .map(|(_, busy)| Duration::from_nanos(busy.load(Ordering::Relaxed)))
                    .collect()
            })
            .collect();
        let on_fabric: Duration = agents
            .iter()
            .zip(&self.own_cpu)
            .filter(|(_, own)| !**own)
            .flat_map(|(busy, _)| busy.iter())
            .sum();
        let mut host_cpus = vec![None; self.agents.len()];
        for (index, time) in &self.host_cpu_times {
            host_cpus[*index] = Some(*time);
        }
        CpuAccount {
            fabric: self.fabric_cpu.saturating_sub(on_fabric),
            host_cpus,
            agents,
        }
    }

    /// Host `index` crashes: its NIC stops and its agents lose their
    /// volatile state.
    pub fn crash(&mut self, index: usize) {
        let _span = tracing::info_span!("crash", host = index).entered();
        lock(self.host(index)).crash();
        for (agent, _) in &self.agents[index] {
            lock(agent).crash();
        }
    }

    /// Cuts host `index`'s link to the switch both ways, or mends it:
    /// while cut, its NIC runs on and every frame over that link is lost.
    pub fn set_partitioned(&mut self, index: usize, partitioned: bool) {
        let _span = tracing::info_span!("partition", host = index, partitioned).entered();
        lock(self.host(index)).set_partitioned(partitioned);
        self.kick();
    }

    /// Host `index` comes back with a fresh NIC; its agents rebuild from
    /// what they kept. An agent that cannot is an error (the others are
    /// restarted all the same).
    ///
    /// Every agent of the host is held from before the NIC comes back
    /// until all have restarted: held one at a time, the fabric thread
    /// polled those not yet restarted on the new NIC, where their old
    /// handles could name what another agent had just made. (Agents, then
    /// the host: the lock order everywhere.)
    pub fn restart(&mut self, index: usize) -> Result<(), RackError> {
        let _span = tracing::info_span!("restart", host = index).entered();
        if self.incarnations.len() <= index {
            self.incarnations.resize(index + 1, 0);
        }
        self.incarnations[index] += 1;
        let now = self.clock.now();
        let mut agents: Vec<_> = self.agents[index]
            .iter()
            .map(|(agent, _)| lock(agent))
            .collect();
        let mut host = lock(self.host(index));
        host.restart(self.incarnations[index]);
        let mut first_failure = None;
        for agent in &mut agents {
            if let Err(error) = agent.restart(now, &mut host.rnic) {
                first_failure.get_or_insert(RackError::Agent {
                    host: host.name.clone(),
                    error,
                });
            }
        }
        drop(host);
        drop(agents);
        self.kick();
        first_failure.map_or(Ok(()), Err)
    }
}

impl Drop for EmbeddedRack {
    fn drop(&mut self) {
        // The threads' own drops stop and join them, hosts' CPUs first:
        // they kick the fabric.
        self.host_cpus.clear();
        self.fabric.take();
    }
}

/// Where an embedded rack's CPU went, from each thread's CPU clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuAccount {
    /// The fabric thread apart from the agents it pumped: NIC emulation
    /// and the switch, including its short spin before each sleep.
    pub fabric: Duration,
    /// Each host's own CPU thread, for hosts given one: its agents' busy
    /// time plus its polling between them.
    pub host_cpus: Vec<Option<Duration>>,
    /// Each host's agents' busy time (polls that moved), in the order
    /// added, wherever they ran.
    pub agents: Vec<Vec<Duration>>,
}

/// An agent as a pump of the fabric thread, its busy time counted apart:
/// polled as a host's CPU polls it, on every pump for an agent woken by
/// frames (the fabric thread pumps when frames move), else when its timer
/// is due.
struct AgentPump {
    host: Shared<NodeEndpoint>,
    seat: Seat,
}

impl Pump for AgentPump {
    fn pump(&mut self, clock: &RackClock) -> Result<bool, RackError> {
        poll_seat(&mut self.seat, &self.host, clock, clock.now(), true)
    }

    fn deadline(&self, clock: &RackClock) -> Option<Instant> {
        self.seat.next_poll().map(|at| clock.instant(at))
    }

    fn has_frames(&mut self) -> bool {
        false
    }

    fn wait_sources(&self) -> Vec<WaitSource> {
        Vec::new()
    }
}
