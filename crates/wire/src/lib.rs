//! RoCEv2 wire formats.
//!
//! Every node in a Remora rack speaks real RoCEv2 frames: Ethernet II, IPv4,
//! UDP to port 4791, the InfiniBand Base Transport Header, its extension
//! headers, a payload padded to four bytes, and the invariant CRC (ICRC).
//!
//! Each header has a checked view over a byte buffer (`new_checked` before
//! touching untrusted bytes) and a plain `Repr` struct with `parse` and
//! `emit`, in the style of smoltcp. [`frame`] puts them together: one call
//! parses and verifies a whole frame, one call emits one.
//!
//! No input, however malformed, panics: parsers return [`WireError`], whose
//! variants double as drop reasons for counters.

#![forbid(unsafe_code)]

pub mod bifrost;
pub mod bth;
mod bytes;
pub mod datagram;
pub mod error;
pub mod ethernet;
pub mod extension;
pub mod frame;
pub mod icrc;
pub mod ipv4;
pub mod opcode;
pub mod soda;
pub mod tiga;
pub mod types;
pub mod udp;

pub use bth::{BthHeader, BthRepr};
pub use error::WireError;
pub use ethernet::{EthernetFrame, EthernetRepr, MacAddress, ETHERTYPE_IPV4};
pub use extension::{
    AckSyndrome, AethHeader, AethRepr, AtomicAckEthHeader, AtomicAckEthRepr, AtomicEthHeader,
    AtomicEthRepr, ImmDtHeader, ImmDtRepr, NakCode, RethHeader, RethRepr,
};
pub use frame::{
    any_frame, emit_frame, parse_frame, ExtensionHeaders, FlowTemplate, FrameRepr, ParsedFrame,
    RoceFrame,
};
pub use ipv4::{Ipv4Address, Ipv4Packet, Ipv4Repr};
pub use opcode::Opcode;
pub use types::{Msn, Pkey, Psn, Qpn, Rkey, VirtAddr};
pub use udp::{UdpDatagram, UdpRepr, ROCEV2_UDP_PORT};
