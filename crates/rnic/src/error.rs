//! Typed errors for bad local arguments. Remote misbehaviour never shows up
//! here: it becomes a NAK on the wire or a completion status.

use crate::verbs::{Lkey, QueuePairState};
use remora_wire::{Qpn, VirtAddr};
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum VerbsError {
    #[error("unknown protection domain")]
    UnknownProtectionDomain,
    #[error("unknown completion queue")]
    UnknownCompletionQueue,
    #[error("unknown shared receive queue")]
    UnknownSharedReceiveQueue,
    #[error("unknown queue pair {0}")]
    UnknownQueuePair(Qpn),
    #[error("unknown local key {0:?}")]
    UnknownLocalKey(Lkey),
    #[error("the local key belongs to another protection domain")]
    WrongProtectionDomain,
    #[error("{queue} depth {requested} is outside 1..={max}")]
    InvalidQueueDepth {
        queue: &'static str,
        requested: usize,
        max: usize,
    },
    #[error("{queue} is full")]
    QueueFull { queue: &'static str },
    #[error("too many {kind} (at most {max})")]
    TooManyObjects { kind: &'static str, max: usize },
    #[error("operation {operation} is not allowed in state {state:?}")]
    InvalidState {
        operation: &'static str,
        state: QueuePairState,
    },
    #[error("transition {from:?} -> {to:?} is not allowed")]
    InvalidTransition {
        from: QueuePairState,
        to: QueuePairState,
    },
    #[error("{count} scatter/gather elements exceed the limit of {max}")]
    TooManyScatterGatherElements { count: usize, max: usize },
    #[error("local access [{address:?}, +{length_bytes}) is outside the region")]
    LocalAccessOutOfBounds {
        address: VirtAddr,
        length_bytes: u64,
    },
    #[error("the region lacks LOCAL_WRITE, needed to write into it")]
    LocalWriteNotPermitted,
    #[error("message of {length_bytes} bytes exceeds the limit of {max_bytes}")]
    MessageTooLong { length_bytes: u64, max_bytes: u64 },
    #[error("atomic target {0:?} is not 8-byte aligned")]
    MisalignedAtomic(VirtAddr),
    #[error("remote range at {address:?} of {length_bytes} bytes overflows the address space")]
    RemoteRangeOverflow {
        address: VirtAddr,
        length_bytes: u64,
    },
    #[error("atomic operations need exactly one 8-byte local buffer")]
    AtomicBufferInvalid,
    #[error("region length {0} is outside 1..=the device limit")]
    InvalidRegionLength(u64),
    #[error("the virtual address space of the device is exhausted")]
    AddressSpaceExhausted,
    #[error("path MTU {0} is not one of 256, 512, 1024, 2048, 4096")]
    InvalidMtu(u32),
    #[error("completion queue overrun: completions were lost, the queue is in error")]
    CompletionQueueOverrun,
    #[error("the region is still used by a queue")]
    RegionInUse,
}
