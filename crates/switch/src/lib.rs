//! A programmable top-of-rack switch in software.
//!
//! The pipeline is the one a P4 programmer knows: a [`parser`] extracts
//! headers into a [`packet::Packet`], a [`program::Program`] runs its
//! match-action stages over them ([`table`]s and [`register`]s, each
//! placed in a numbered stage), and the deparser writes the frame back,
//! recomputing the RoCEv2 ICRC when a program rewrote covered bytes.
//! Around it: a [`generator`] of periodic packets, recirculation,
//! mirroring, and digests to a control plane that may update tables at
//! runtime.
//!
//! [`runtime::Switch`] is sans-IO like the soft RNIC: `handle_frame`,
//! `poll_transmit`, `poll_timeout`, `handle_timeout`, `poll_digest`. It
//! implements the simulator's `Node`, so every program also runs in the
//! deterministic simulator, and the rack drives it over real carriers.
//!
//! Programs report their resources ([`resources::ResourceReport`]): stages,
//! table entries, register bytes, recirculations per packet, and whether
//! they need the ICRC recomputed, which a Tofino cannot do.

#![forbid(unsafe_code)]

pub mod generator;
pub mod packet;
pub mod parser;
pub mod program;
pub mod programs;
pub mod register;
pub mod resources;
pub mod runtime;
pub mod table;
pub mod two_hosts;

pub use packet::{Egress, Packet, PortId};
pub use program::{Digest, Program};
pub use resources::ResourceReport;
pub use runtime::{AccountingError, Emitted, Switch, SwitchConfig, SwitchCounters};
