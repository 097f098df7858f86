//! A deterministic discrete-event simulator for sans-IO nodes.
//!
//! Nodes are the very state machines production runs (soft RNICs, later
//! switches and system nodes), driven through [`Node`]: frames in, frames
//! out, timers. The simulator owns a virtual clock and the links between
//! node ports. Links model bandwidth, propagation delay, a bounded queue,
//! loss, duplication, reordering, bit corruption and partitions; nodes can
//! crash and restart. Every random draw comes from one seeded generator, so
//! a seed and a commit reproduce a run exactly.
//!
//! A run has two phases: a safety phase with faults, then a liveness phase
//! in which faults stop and everything in flight must complete.

#![forbid(unsafe_code)]

mod link;
mod simulation;

pub use link::{FaultDraw, LinkConfig, LinkConfigError, LinkCounters, LinkFaults};
pub use remora_base::{PortId, Probability, ProbabilityError, Timestamp};
pub use simulation::{
    Carriage, Event, LinkId, Node, NodeId, RunOutcome, Simulation, FRAME_BUFFER_BYTES,
};
