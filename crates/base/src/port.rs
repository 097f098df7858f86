//! Ports: where a frame enters or leaves a node of the simulator or the
//! switch.

/// A port number of a node or of the switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortId(pub u16);
