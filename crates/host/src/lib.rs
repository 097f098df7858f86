//! Hosts and the programs that run on them.
//!
//! An [`Agent`] is a host program written as a sans-IO state machine, as
//! the soft RNIC is: time comes in as an argument, [`Agent::poll`] drives
//! it over the host's NIC through the [`Verbs`](remora_rnic::Verbs) trait,
//! [`Agent::poll_timeout`] says when it next wants a turn, and
//! [`Agent::crash`] / [`Agent::restart`] let a harness take the host down
//! and bring it back. The same agent runs in the simulator (inside a
//! [`Host`], where its timers are events of the simulator's heap) and on
//! the embedded rack (pumped by the fabric thread).
//!
//! A [`Host`] is one soft RNIC plus its agents, and is a node of the
//! simulator: a crash loses the NIC (queue pairs, keys, regions inside
//! the device) and each agent's volatile state; what an agent declares
//! durable (host memory it keeps across [`Agent::crash`]) survives.

#![forbid(unsafe_code)]

mod agent;
mod datagram;
pub mod hardware;
mod host;
mod ports;
pub mod validation;

pub use agent::{Agent, AgentError, AsAny, Progress};
pub use datagram::AgentPort;
pub use hardware::{HardwareProfile, NicPipeline};
pub use host::{AgentFailure, Host, MAX_AGENT_FAILURES};
pub use ports::{Ports, LOCAL_PORT, UPLINK_PORT};
