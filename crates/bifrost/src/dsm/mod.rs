//! Distributed shared memory over memory nodes (the thesis's §5.1 and
//! §6.2): `alloc(size) -> GlobalPtr`, `read`, `write`, `free`, and
//! region snapshots.
//!
//! A [`GlobalPtr`] names a memory node and an offset in its pool, plus a
//! generation that tells a freed allocation from a later one at the same
//! offset. Reads and writes are one-sided RDMA from the caller's soft
//! RNIC; alloc, free, stat, snapshot and restore are messages to the
//! memory node's daemon ([`daemon::MemoryDaemon`]), an agent whose CPU
//! serves only those. Each caller's writes to one node travel on one
//! queue pair, so they are applied in order (strict consistency per node).

pub mod client;
pub mod daemon;
pub mod message;
pub mod rack;

use remora_wire::bifrost::{DsmOperation, GlobalAddress};

/// The DSM's prefix in a global address (§6.2's fifth byte).
pub const DSM_PREFIX: u8 = 0xb1;

/// A pointer into global memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GlobalPtr {
    /// The memory node (its index among the DSM's nodes).
    pub node: u8,
    /// Bumped each time the node hands out this offset again.
    pub generation: u8,
    /// The allocation's start in the node's pool.
    pub offset: u64,
}

impl GlobalPtr {
    /// As the RPC header carries it: a plain pointer, for no operation.
    pub fn to_address(self) -> GlobalAddress {
        GlobalAddress {
            prefix: DSM_PREFIX,
            node: self.node,
            operation: DsmOperation::None,
            argument: self.generation,
            offset: self.offset,
        }
    }

    /// From an RPC header's global address; `None` for another system's
    /// address or the null one.
    pub fn from_address(address: &GlobalAddress) -> Option<GlobalPtr> {
        (address.prefix == DSM_PREFIX).then_some(GlobalPtr {
            node: address.node,
            generation: address.argument,
            offset: address.offset,
        })
    }
}
