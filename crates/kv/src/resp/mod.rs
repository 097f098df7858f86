//! A RESP2 (Redis protocol) front end for the store, so that Redis
//! clients such as `redis-cli` and `redis-benchmark` can drive it.
//!
//! - [`protocol`]: a sans-IO request parser (multibulk arrays and inline
//!   commands, with bounds on every length) and the reply encoder;
//! - [`commands`]: the commands (GET, SET, DEL, INCR, MGET, MSET, INFO,
//!   ...) run against one [`Session`](crate::Session), completing pending
//!   operations before answering;
//! - [`server`]: event-loop workers (`epoll`), one session each, serving
//!   many connections; a round detaches every connection's device reads
//!   and waits for them at once, and a pipelined batch is answered with
//!   one write.
//!
//! The store has no expiry, no databases but 0 and no persistence
//! settings, so the commands that clients send to learn about those
//! (`CONFIG GET`, `COMMAND DOCS`) get empty answers and clients proceed.

// The front end only moves bytes between sockets and the store's safe API.
#![forbid(unsafe_code)]

pub mod commands;
pub mod protocol;
pub mod server;

pub use commands::{CommandError, Deferred, Executor, Flow};
pub use protocol::{Parsed, ProtocolError, Request};
pub use server::{serve, ServeError, ServerLimits};
