//! Bifröst (Tarango, "Bifröst: exactly-once RPC over global memory",
//! paper 001) on Remora.
//!
//! Built so far: the distributed shared memory ([`dsm`]) that RPCs pass
//! their large arguments through by reference, over several memory nodes.
//! The RPC runtime, Thrift transport, the switch's Gatekeeper and fault
//! tolerance are the rest of issue 14.
#![forbid(unsafe_code)]

pub mod dsm;
pub mod rpc;
