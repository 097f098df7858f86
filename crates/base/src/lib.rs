//! The types every layer of Remora shares, at the bottom of the crate
//! graph so that no crate depends on another only to name them:
//!
//! - [`Timestamp`]: time as sans-IO state machines take it, handed in by
//!   whoever drives them (the simulator's virtual clock or a real one);
//! - [`PortId`]: a port of a simulated node or of the switch;
//! - [`Probability`]: a probability in `[0, 1]`, checked once when it is
//!   made, so the code that draws from it never checks again;
//! - [`copy_bytes`]: bulk copies at the same speed wherever their buffers
//!   lie (the data path's frames, slots and registered memory), and
//!   [`BufferPool`], byte buffers kept for reuse;
//! - [`at_position`]: a config file's parse error on one line;
//! - [`tcp_port_is_listening`] and [`await_listening`]: whether a server
//!   program a harness started listens yet.

#![forbid(unsafe_code)]

mod copy;
mod files;
mod listening;
mod port;
mod position;
mod probability;
mod time;

pub use copy::{copy_bytes, extend_bytes, BufferPool, COPY_PIECE_BYTES};
pub use files::{create_new_file, replace_file};
pub use listening::{await_listening, tcp_port_is_listening};
pub use port::PortId;
pub use position::at_position;
pub use probability::{Probability, ProbabilityError};
pub use time::Timestamp;
