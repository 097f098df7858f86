//! A simulated rack: hosts (a soft RNIC and its agents) and one switch as
//! nodes of the deterministic simulator, so a switch program's tests and
//! the systems built on it run the very switch and agents the embedded
//! rack runs.

use remora_base::{PortId, Timestamp};
use remora_host::{Host, Ports, LOCAL_PORT, UPLINK_PORT};
use remora_rnic::SoftRnic;
use remora_sim::{LinkConfig, LinkId, Node, NodeId, Simulation};
use remora_switch::{Program, Switch, SwitchConfig};

/// Soft RNICs behind one switch in the simulator: host `i` on switch port
/// `i`, every link alike.
pub struct SimulatedRack<P: Program> {
    pub simulation: Simulation<RackNode<P>>,
    pub switch: NodeId,
    /// The hosts' node ids, in the order given.
    pub hosts: Vec<NodeId>,
    /// Each host's link to the switch, in the same order.
    pub links: Vec<LinkId>,
    /// The local links between offload hosts and their hosts, in the
    /// topology's order.
    pub local_links: Vec<LinkId>,
}

impl<P: Program> SimulatedRack<P> {
    pub fn new(seed: u64, program: P, hosts: Vec<Host>, link: LinkConfig) -> SimulatedRack<P> {
        SimulatedRack::build(seed, program, hosts, |_| link)
    }

    /// Hosts with each one's link as `topology` describes it (host `i` on
    /// port `i`), and a local link between each offload host and the host
    /// it sits beside (port 1 of both).
    pub fn with_topology(
        seed: u64,
        program: P,
        mut hosts: Vec<Host>,
        topology: &crate::topology::Topology,
    ) -> SimulatedRack<P> {
        for (host, offload) in topology.local_links() {
            hosts[host].set_ports(Ports::with_local_peer(topology.host(offload).mac));
            hosts[offload].set_ports(Ports::with_local_peer(topology.host(host).mac));
        }
        let mut rack =
            SimulatedRack::build(seed, program, hosts, |index| topology.simulator_link(index));
        for (host, offload) in topology.local_links() {
            let link = topology.simulator_local_link(offload);
            let ends = (
                (rack.hosts[host], LOCAL_PORT),
                (rack.hosts[offload], LOCAL_PORT),
            );
            rack.local_links
                .push(rack.simulation.connect(ends.0, ends.1, link));
        }
        rack
    }

    fn build(
        seed: u64,
        program: P,
        hosts: Vec<Host>,
        link: impl Fn(usize) -> LinkConfig,
    ) -> SimulatedRack<P> {
        let mut simulation = Simulation::new(seed);
        let config = SwitchConfig::new(hosts.len() as u16);
        let switch = simulation.add_node(RackNode::Switch(Box::new(Switch::new(config, program))));
        let mut ids = Vec::with_capacity(hosts.len());
        let mut links = Vec::with_capacity(hosts.len());
        for (index, host) in hosts.into_iter().enumerate() {
            let id = simulation.add_node(RackNode::Host(Box::new(host)));
            let link = link(index);
            links.push(simulation.connect((id, UPLINK_PORT), (switch, PortId(index as u16)), link));
            ids.push(id);
        }
        SimulatedRack {
            simulation,
            switch,
            hosts: ids,
            links,
            local_links: Vec::new(),
        }
    }

    /// Host `index`'s soft RNIC.
    pub fn rnic(&mut self, index: usize) -> &mut SoftRnic {
        self.host_mut(index).nic_mut()
    }

    /// Host `index`, in the order given.
    pub fn host(&self, index: usize) -> &Host {
        self.simulation.node(self.hosts[index]).host()
    }

    pub fn host_mut(&mut self, index: usize) -> &mut Host {
        self.simulation.node_mut(self.hosts[index]).host_mut()
    }

    pub fn program(&mut self) -> &P {
        self.switch_mut().program()
    }

    /// The switch, for its generator and counters.
    pub fn switch_mut(&mut self) -> &mut Switch<P> {
        match self.simulation.node_mut(self.switch) {
            RackNode::Switch(switch) => switch,
            RackNode::Host(_) => unreachable!("the switch is a switch"),
        }
    }
}

/// A node of a simulated rack: a host, or the switch.
pub enum RackNode<P: Program> {
    Host(Box<Host>),
    Switch(Box<Switch<P>>),
}

impl<P: Program> RackNode<P> {
    /// # Panics
    /// If this node is the switch: a harness bug, not a run's failure.
    pub fn host(&self) -> &Host {
        match self {
            RackNode::Host(host) => host,
            RackNode::Switch(_) => panic!("the switch is not a host"),
        }
    }

    /// # Panics
    /// If this node is the switch.
    pub fn host_mut(&mut self) -> &mut Host {
        match self {
            RackNode::Host(host) => host,
            RackNode::Switch(_) => panic!("the switch is not a host"),
        }
    }

    pub fn rnic(&mut self) -> &mut SoftRnic {
        self.host_mut().nic_mut()
    }
}

impl<P: Program> Node for RackNode<P> {
    fn handle_frame(&mut self, now: Timestamp, port: PortId, frame: &[u8]) {
        match self {
            RackNode::Host(node) => node.handle_frame(now, port, frame),
            // The switch as a simulator node, which runs its control
            // plane after the frame (its inherent method does not: called
            // so, nothing was ever learned in a simulated rack).
            RackNode::Switch(switch) => Node::handle_frame(switch.as_mut(), now, port, frame),
        }
    }

    fn poll_transmit(&mut self, now: Timestamp, buffer: &mut [u8]) -> Option<(PortId, usize)> {
        match self {
            RackNode::Host(node) => node.poll_transmit(now, buffer),
            RackNode::Switch(switch) => switch.poll_transmit(now, buffer),
        }
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        match self {
            RackNode::Host(node) => node.poll_timeout(),
            RackNode::Switch(switch) => switch.poll_timeout(),
        }
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        match self {
            RackNode::Host(node) => node.handle_timeout(now),
            RackNode::Switch(switch) => Node::handle_timeout(switch.as_mut(), now),
        }
    }

    fn crash(&mut self, now: Timestamp) {
        match self {
            RackNode::Host(node) => node.crash(now),
            RackNode::Switch(switch) => Node::crash(switch.as_mut(), now),
        }
    }

    fn restart(&mut self, now: Timestamp) {
        match self {
            RackNode::Host(node) => node.restart(now),
            RackNode::Switch(switch) => Node::restart(switch.as_mut(), now),
        }
    }
}
