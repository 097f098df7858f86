//! A simulated rack: soft RNICs and one switch as nodes of the
//! deterministic simulator, so a switch program's tests and the systems
//! built on it (Clover's resolver) run the very switch the rack runs.

use crate::{Program, Switch};
use remora_fabric::node::RnicNode;
use remora_rnic::{SoftRnic, Timestamp};
use remora_sim::{Node, PortId};

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
