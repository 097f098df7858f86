//! The event loop: a virtual clock, a heap of scheduled events, nodes and
//! the links between their ports.

use crate::link::{Channel, LinkConfig, LinkCounters};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use remora_base::{PortId, Timestamp};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

/// The largest frame a node may hand the simulator.
pub const FRAME_BUFFER_BYTES: usize = 16 * 1024;
/// Frames one node may emit in one turn, so a runaway node cannot stall
/// the clock.
const MAX_FRAMES_PER_TURN: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub usize);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LinkId(pub usize);

/// A node is any sans-IO state machine with ports.
pub trait Node {
    fn handle_frame(&mut self, now: Timestamp, port: PortId, frame: &[u8]);
    /// The next frame to send and the port it leaves by.
    fn poll_transmit(&mut self, now: Timestamp, buffer: &mut [u8]) -> Option<(PortId, usize)>;
    fn poll_timeout(&self) -> Option<Timestamp>;
    fn handle_timeout(&mut self, now: Timestamp);
    /// Loses all volatile state. The simulator stops driving the node.
    fn crash(&mut self, now: Timestamp);
    /// Comes back empty after a crash.
    fn restart(&mut self, now: Timestamp);
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Deliver {
        node: NodeId,
        port: PortId,
        frame: Vec<u8>,
        /// The link that carries it, if any: a partition that begins while
        /// the frame is on it loses the frame.
        carried_by: Option<Carriage>,
    },
    Crash(NodeId),
    Restart(NodeId),
    Partition(LinkId),
    Heal(LinkId),
}

impl Event {
    fn is_fault(&self) -> bool {
        !matches!(self, Event::Deliver { .. })
    }
}

/// Which way along which link a frame travels, and how many partitions
/// that direction had seen when the frame was sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Carriage {
    link: LinkId,
    direction: usize,
    cuts_when_sent: u64,
    /// The link's duplicate of a frame, not the frame: a cut that loses
    /// it takes back its count as a duplicate, not as a delivery.
    duplicate: bool,
}

#[derive(Debug, PartialEq, Eq)]
struct Scheduled {
    at: Timestamp,
    /// Ties break by insertion order, so the run is deterministic.
    sequence: u64,
    event: Event,
}

impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.sequence).cmp(&(other.at, other.sequence))
    }
}

impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

struct Link {
    /// `ends[d]` receives what `channels[d]` carries.
    ends: [(NodeId, PortId); 2],
    channels: [Channel; 2],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOutcome {
    pub events: u64,
    pub now: Timestamp,
    /// Nothing left to do: no frame in flight, no timer, no pending event.
    pub quiesced: bool,
}

pub struct Simulation<N: Node> {
    now: Timestamp,
    rng: ChaCha8Rng,
    nodes: Vec<N>,
    crashed: Vec<bool>,
    links: Vec<Link>,
    ports: BTreeMap<(NodeId, PortId), (LinkId, usize)>,
    queue: BinaryHeap<Reverse<Scheduled>>,
    sequence: u64,
    faults_on: bool,
    buffer: Vec<u8>,
    dropped_at_crashed_nodes: u64,
}

impl<N: Node> Simulation<N> {
    pub fn new(seed: u64) -> Simulation<N> {
        Simulation {
            now: Timestamp::ZERO,
            rng: ChaCha8Rng::seed_from_u64(seed),
            nodes: Vec::new(),
            crashed: Vec::new(),
            links: Vec::new(),
            ports: BTreeMap::new(),
            queue: BinaryHeap::new(),
            sequence: 0,
            faults_on: true,
            buffer: vec![0; FRAME_BUFFER_BYTES],
            dropped_at_crashed_nodes: 0,
        }
    }

    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// The run's one source of randomness, for scenarios to draw from too.
    pub fn rng(&mut self) -> &mut ChaCha8Rng {
        &mut self.rng
    }

    pub fn add_node(&mut self, node: N) -> NodeId {
        self.nodes.push(node);
        self.crashed.push(false);
        NodeId(self.nodes.len() - 1)
    }

    pub fn node(&self, id: NodeId) -> &N {
        &self.nodes[id.0]
    }

    pub fn node_mut(&mut self, id: NodeId) -> &mut N {
        &mut self.nodes[id.0]
    }

    pub fn nodes(&self) -> &[N] {
        &self.nodes
    }

    pub fn is_crashed(&self, id: NodeId) -> bool {
        self.crashed[id.0]
    }

    /// Connects two ports with a full-duplex link.
    ///
    /// # Panics
    /// If a port is already connected or the config is invalid.
    pub fn connect(
        &mut self,
        a: (NodeId, PortId),
        b: (NodeId, PortId),
        config: LinkConfig,
    ) -> LinkId {
        config.validate().expect("link config");
        let id = LinkId(self.links.len());
        for (end, direction) in [(a, 0), (b, 1)] {
            let previous = self.ports.insert(end, (id, direction));
            assert!(previous.is_none(), "port {end:?} is already connected");
        }
        self.links.push(Link {
            ends: [b, a],
            channels: [Channel::new(config), Channel::new(config)],
        });
        id
    }

    pub fn link_counters(&self, id: LinkId) -> [LinkCounters; 2] {
        let link = &self.links[id.0];
        [link.channels[0].counters, link.channels[1].counters]
    }

    pub fn dropped_at_crashed_nodes(&self) -> u64 {
        self.dropped_at_crashed_nodes
    }

    pub fn schedule(&mut self, at: Timestamp, event: Event) {
        self.sequence += 1;
        self.queue.push(Reverse(Scheduled {
            at,
            sequence: self.sequence,
            event,
        }));
    }

    /// Ends the safety phase: no more random faults, partitions heal,
    /// crashed nodes restart and pending fault events are cancelled.
    pub fn stop_faults(&mut self) {
        self.faults_on = false;
        let pending = std::mem::take(&mut self.queue);
        self.queue = pending
            .into_iter()
            .filter(|entry| !entry.0.event.is_fault())
            .collect();
        for link in &mut self.links {
            for channel in &mut link.channels {
                channel.set_partitioned(false);
            }
        }
        for index in 0..self.nodes.len() {
            if self.crashed[index] {
                self.crashed[index] = false;
                self.nodes[index].restart(self.now);
            }
        }
    }

    /// Runs until virtual time passes `deadline`, nothing is left to do, or
    /// `max_events` steps have been taken.
    pub fn run_until(&mut self, deadline: Timestamp, max_events: u64) -> RunOutcome {
        let mut events = 0;
        while events < max_events {
            self.transmit_all();
            let Some(next) = self.next_wakeup() else {
                return RunOutcome {
                    events,
                    now: self.now,
                    quiesced: true,
                };
            };
            if next > deadline {
                break;
            }
            self.now = self.now.max(next);
            self.process_due();
            events += 1;
        }
        RunOutcome {
            events,
            now: self.now,
            quiesced: false,
        }
    }

    fn next_wakeup(&self) -> Option<Timestamp> {
        let event = self.queue.peek().map(|entry| entry.0.at);
        let timer = self
            .nodes
            .iter()
            .zip(&self.crashed)
            .filter(|(_, crashed)| !**crashed)
            .filter_map(|(node, _)| node.poll_timeout())
            .min();
        [event, timer].into_iter().flatten().min()
    }

    /// Handles the events and timers that are due now.
    fn process_due(&mut self) {
        if self
            .queue
            .peek()
            .is_some_and(|entry| entry.0.at <= self.now)
        {
            let Reverse(scheduled) = self.queue.pop().expect("peeked");
            self.apply(scheduled.event);
            return;
        }
        for index in 0..self.nodes.len() {
            let due = self.nodes[index]
                .poll_timeout()
                .is_some_and(|at| at <= self.now);
            if due && !self.crashed[index] {
                self.nodes[index].handle_timeout(self.now);
            }
        }
    }

    fn apply(&mut self, event: Event) {
        match event {
            Event::Deliver {
                node,
                port,
                frame,
                carried_by,
            } => {
                if let Some(carriage) = carried_by {
                    let channel = &mut self.links[carriage.link.0].channels[carriage.direction];
                    // Cut while on the wire (or in a queue along it): a
                    // partition is a link down, and what it carried is
                    // gone, not delivered after it began.
                    if channel.cuts() != carriage.cuts_when_sent {
                        if carriage.duplicate {
                            channel.counters.duplicated -= 1;
                        } else {
                            channel.counters.partition_drops += 1;
                            channel.counters.frames_delivered -= 1;
                        }
                        return;
                    }
                }
                if self.crashed[node.0] {
                    self.dropped_at_crashed_nodes += 1;
                } else {
                    self.nodes[node.0].handle_frame(self.now, port, &frame);
                }
            }
            Event::Crash(node) => {
                if !self.crashed[node.0] {
                    self.crashed[node.0] = true;
                    self.nodes[node.0].crash(self.now);
                }
            }
            Event::Restart(node) => {
                if self.crashed[node.0] {
                    self.crashed[node.0] = false;
                    self.nodes[node.0].restart(self.now);
                }
            }
            Event::Partition(link) => self.set_partition(link, true),
            Event::Heal(link) => self.set_partition(link, false),
        }
    }

    fn set_partition(&mut self, link: LinkId, partitioned: bool) {
        for channel in &mut self.links[link.0].channels {
            channel.set_partitioned(partitioned);
        }
    }

    /// Lets every live node send what it has, onto its links.
    fn transmit_all(&mut self) {
        for index in 0..self.nodes.len() {
            if self.crashed[index] {
                continue;
            }
            for _ in 0..MAX_FRAMES_PER_TURN {
                let Some((port, len)) = self.nodes[index].poll_transmit(self.now, &mut self.buffer)
                else {
                    break;
                };
                self.carry(NodeId(index), port, len);
            }
        }
    }

    fn carry(&mut self, from: NodeId, port: PortId, len: usize) {
        let Some(&(link_id, direction)) = self.ports.get(&(from, port)) else {
            return; // An unconnected port: the frame goes nowhere.
        };
        let link = &mut self.links[link_id.0];
        let fate = link.channels[direction].offer(self.now, len, self.faults_on, &mut self.rng);
        let (to_node, to_port) = link.ends[direction];
        let mut frame = self.buffer[..len].to_vec();
        if let Some(bit) = fate.corrupt_bit {
            frame[bit / 8] ^= 1 << (bit % 8);
        }
        let cuts_when_sent = link.channels[direction].cuts();
        for (index, arrival) in fate.arrivals.into_iter().enumerate() {
            let Some(arrival) = arrival else { continue };
            let carriage = Carriage {
                link: link_id,
                direction,
                cuts_when_sent,
                duplicate: index == 1,
            };
            let event = Event::Deliver {
                node: to_node,
                port: to_port,
                frame: frame.clone(),
                carried_by: Some(carriage),
            };
            self.schedule(arrival, event);
        }
    }

    /// Moves the clock on to `at` when nothing is left to happen before
    /// it (never backwards).
    pub fn advance_to(&mut self, at: Timestamp) {
        self.now = self.now.max(at);
    }

    /// Crashes `node` now, as a scheduled [`Event::Crash`] would.
    pub fn crash_now(&mut self, node: NodeId) {
        self.apply(Event::Crash(node));
    }

    /// Restarts `node` now, as a scheduled [`Event::Restart`] would.
    pub fn restart_now(&mut self, node: NodeId) {
        self.apply(Event::Restart(node));
    }

    /// Draws a uniformly random time in `[from, to)`.
    pub fn random_time(&mut self, from: Timestamp, to: Timestamp) -> Timestamp {
        if to <= from {
            return from;
        }
        Timestamp::from_nanos(self.rng.gen_range(from.as_nanos()..to.as_nanos()))
    }
}
