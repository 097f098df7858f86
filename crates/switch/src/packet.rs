//! A packet in the pipeline: the frame's bytes, what the parser found, and
//! the intrinsic metadata programs set (egress, mirror, recirculation,
//! digest, and whether the ICRC must be recomputed).

use crate::parser::ParsedHeaders;
pub use remora_base::PortId;

/// Where the packet goes after the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Egress {
    /// No program decision yet; the runtime drops such packets and counts
    /// them as `no_egress`.
    Unset,
    Port(PortId),
    /// Every port but the ingress one.
    Flood,
    Drop,
    /// The program took the packet whole, as the endpoint it plays (a
    /// timer pass that sent nothing, an answer to a queue pair it
    /// impersonates): its purpose, not a drop.
    Consumed,
}

/// Packets the runtime makes for its own reasons carry this ingress port.
pub const GENERATOR_PORT: PortId = PortId(u16::MAX);
/// Packets coming back through the pipeline carry this ingress port.
pub const RECIRCULATION_PORT: PortId = PortId(u16::MAX - 1);

/// A message from the data plane to the control plane (a P4 digest), the
/// metadata a pass may leave on its packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest {
    /// Program-defined kind.
    pub kind: u16,
    pub values: [u64; 4],
}

#[derive(Debug, Clone)]
pub struct Packet {
    pub bytes: Vec<u8>,
    /// The port this pass came in on: the recirculation port after the
    /// first pass, as in P4.
    pub ingress_port: PortId,
    /// The port the frame first arrived on, kept across recirculation.
    pub original_ingress_port: PortId,
    pub headers: ParsedHeaders,
    pub egress: Egress,
    /// A copy also leaves by this port (after the deparser).
    pub mirror: Option<PortId>,
    /// Run the packet through the pipeline again after this pass.
    pub recirculate: bool,
    /// How many times it has already been recirculated.
    pub recirculations: u8,
    /// Set by programs that changed bytes the ICRC covers; the deparser
    /// then recomputes it.
    pub rewritten: bool,
    /// Sent to the control plane after the pass.
    pub digest: Option<Digest>,
    /// Leaves by the egress ports' background queue, behind every normal
    /// frame (a P4 program's queue choice). Set for a background
    /// template's packets; a program that sends frames of one flow from
    /// both generator and ordinary packets picks one class for them all,
    /// or a backed-up port reorders the flow.
    pub background: bool,
}

impl Packet {
    pub fn new(bytes: Vec<u8>, ingress_port: PortId, headers: ParsedHeaders) -> Packet {
        Packet {
            bytes,
            ingress_port,
            original_ingress_port: ingress_port,
            headers,
            egress: Egress::Unset,
            mirror: None,
            recirculate: false,
            recirculations: 0,
            rewritten: false,
            digest: None,
            background: false,
        }
    }
}
