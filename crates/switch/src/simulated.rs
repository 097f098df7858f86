//! A simulated rack: soft RNICs and one switch as nodes of the
//! deterministic simulator, so a switch program's tests and the systems
//! built on it (Clover's resolver) run the very switch the rack runs.

use crate::{Program, Switch, SwitchConfig};
use remora_fabric::node::RnicNode;
use remora_rnic::{SoftRnic, Timestamp};
use remora_sim::{LinkConfig, Node, NodeId, PortId, Simulation};

/// Soft RNICs behind one switch in the simulator: host `i` on switch port
/// `i`, every link alike.
pub struct SimulatedRack<P: Program> {
    pub simulation: Simulation<RackNode<P>>,
    pub switch: NodeId,
    /// The hosts' node ids, in the order given.
    pub hosts: Vec<NodeId>,
}

impl<P: Program> SimulatedRack<P> {
    pub fn new(seed: u64, program: P, hosts: Vec<RnicNode>, link: LinkConfig) -> SimulatedRack<P> {
        let mut simulation = Simulation::new(seed);
        let config = SwitchConfig::new(hosts.len() as u16);
        let switch = simulation.add_node(RackNode::Switch(Box::new(Switch::new(config, program))));
        let hosts = hosts
            .into_iter()
            .enumerate()
            .map(|(index, host)| {
                let id = simulation.add_node(RackNode::Rnic(Box::new(host)));
                simulation.connect((id, PortId(0)), (switch, PortId(index as u16)), link);
                id
            })
            .collect();
        SimulatedRack {
            simulation,
            switch,
            hosts,
        }
    }

    /// Host `index`'s soft RNIC.
    pub fn rnic(&mut self, index: usize) -> &mut SoftRnic {
        self.simulation.node_mut(self.hosts[index]).rnic()
    }

    pub fn program(&mut self) -> &P {
        self.switch_mut().program()
    }

    /// The switch, for its generator and counters.
    pub fn switch_mut(&mut self) -> &mut Switch<P> {
        match self.simulation.node_mut(self.switch) {
            RackNode::Switch(switch) => switch,
            RackNode::Rnic(_) => unreachable!("the switch is a switch"),
        }
    }
}

/// A node of a simulated rack: a host's soft RNIC, or the switch.
pub enum RackNode<P: Program> {
    Rnic(Box<RnicNode>),
    Switch(Box<Switch<P>>),
}

impl<P: Program> RackNode<P> {
    pub fn rnic(&mut self) -> &mut SoftRnic {
        match self {
            RackNode::Rnic(node) => &mut node.device,
            RackNode::Switch(_) => panic!("not an RNIC"),
        }
    }
}

impl<P: Program> Node for RackNode<P> {
    fn handle_frame(&mut self, now: Timestamp, port: PortId, frame: &[u8]) {
        match self {
            RackNode::Rnic(node) => node.handle_frame(now, port, frame),
            RackNode::Switch(switch) => switch.handle_frame(now, port, frame),
        }
    }

    fn poll_transmit(&mut self, now: Timestamp, buffer: &mut [u8]) -> Option<(PortId, usize)> {
        match self {
            RackNode::Rnic(node) => node.poll_transmit(now, buffer),
            RackNode::Switch(switch) => switch.poll_transmit(now, buffer),
        }
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        match self {
            RackNode::Rnic(node) => node.poll_timeout(),
            RackNode::Switch(switch) => switch.poll_timeout(),
        }
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        match self {
            RackNode::Rnic(node) => node.handle_timeout(now),
            RackNode::Switch(switch) => switch.handle_timeout(now),
        }
    }

    fn crash(&mut self, now: Timestamp) {
        match self {
            RackNode::Rnic(node) => node.crash(now),
            RackNode::Switch(switch) => Node::crash(switch.as_mut(), now),
        }
    }

    fn restart(&mut self, now: Timestamp) {
        match self {
            RackNode::Rnic(node) => node.restart(now),
            RackNode::Switch(switch) => Node::restart(switch.as_mut(), now),
        }
    }
}
