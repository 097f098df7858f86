//! The soft RNIC: a RoCEv2 reliable-connected transport as a state machine
//! with no I/O and no clock.
//!
//! - [`verbs`]: the ibverbs-shaped API and its types.
//! - [`device`]: [`SoftRnic`], which implements it and is driven by
//!   `handle_frame` / `poll_transmit` / `poll_timeout` / `handle_timeout`.
//! - `memory`: registered regions with lkey/rkey, bounds and access rights.
//! - `queue_pair`: RC queue pairs, split into requester and responder.

#![forbid(unsafe_code)]

pub mod back_to_back;
mod counters;
pub mod datagram;
pub mod device;
#[doc(hidden)]
pub mod fuzzing;
pub mod host_memory;
mod memory;
mod queue_pair;
mod queues;
mod resources;
pub mod time;
pub mod verbs;

pub use counters::{DropReason, RnicCounters};
pub use device::{RnicConfig, RnicConfigError, SoftRnic};
pub use host_memory::{ExternalMemory, HostMemory, HostMemoryOutOfBounds};
pub use queue_pair::rnr_timer_duration;
pub use time::Timestamp;
pub use verbs::*;
