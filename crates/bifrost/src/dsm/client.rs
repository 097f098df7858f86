//! The DSM as a caller sees it: [`Dsm::alloc`], [`Dsm::read`],
//! [`Dsm::write`], [`Dsm::free`], and snapshots, over the caller's own
//! queue pairs to every memory node.
//!
//! Bounds are checked before any access: the caller knows the size of
//! what it allocated, and asks the node (`stat`) about pointers it was
//! given. A freed pointer, a stale generation, an access past the end and
//! a double free are typed errors; nothing is read or written then.

use super::message::{Operation, Reply, Request, Status, MESSAGE_LEN};
use super::GlobalPtr;
use remora_rack::channel::{Channel, ChannelError, ChannelPool, Transfer};
use remora_rack::endpoint::{DriverKicker, NodeEndpoint, Shared};
use remora_rnic::{CompletionStatus, MemoryRegion};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;

#[derive(Debug, thiserror::Error)]
pub enum DsmError {
    #[error("memory node {0} is not one of the DSM's")]
    UnknownNode(u8),
    #[error("{length} bytes at {at} are past the end of {ptr:?}, which holds {size}")]
    OutOfRange {
        ptr: GlobalPtr,
        at: u64,
        length: usize,
        size: u64,
    },
    #[error("{0:?} was freed already")]
    DoubleFree(GlobalPtr),
    #[error("{0:?} was freed: its memory is not the caller's any more")]
    UseAfterFree(GlobalPtr),
    #[error("{0:?} was never allocated")]
    NotAllocated(GlobalPtr),
    #[error("memory node {node} has no room for {size} bytes")]
    NoSpace { node: u8, size: u64 },
    #[error("{0:?} has no snapshot to restore")]
    NoSnapshot(GlobalPtr),
    #[error("memory node {node} answered {status:?} to {operation:?}")]
    Refused {
        node: u8,
        operation: Operation,
        status: Status,
    },
    #[error("memory node {node}'s reply is malformed: {reason}")]
    BadReply { node: u8, reason: String },
    /// The switch's ACL refused the access (a NAK with a remote access
    /// error): the caller holds no rule that allows it. Nothing was read
    /// or written, and the channel was brought back for the next access.
    #[error("the Gatekeeper refused {operation} on memory node {node}: no rule allows it")]
    AccessRefused { node: u8, operation: &'static str },
    #[error(transparent)]
    Channel(#[from] ChannelError),
}

impl DsmError {
    fn is_access_refusal(&self) -> bool {
        matches!(
            self,
            DsmError::Channel(ChannelError::Completion {
                status: CompletionStatus::RemoteAccessError,
                ..
            })
        )
    }
}

/// A caller's way to one memory node.
pub struct NodePath {
    pub channels: ChannelPool,
    /// The node's pool, as the caller reaches it.
    pub pool: MemoryRegion,
}

pub struct Dsm {
    nodes: Vec<NodePath>,
    kicker: DriverKicker,
    /// The caller's own NIC, to bring a channel back after a refusal.
    endpoint: Shared<NodeEndpoint>,
    /// Sizes of live allocations the caller knows of.
    known: Mutex<HashMap<GlobalPtr, u64>>,
    next_node: AtomicUsize,
    next_request: AtomicU32,
}

impl Dsm {
    pub fn new(nodes: Vec<NodePath>, kicker: DriverKicker, endpoint: Shared<NodeEndpoint>) -> Dsm {
        Dsm {
            nodes,
            kicker,
            endpoint,
            known: Mutex::new(HashMap::new()),
            next_node: AtomicUsize::new(0),
            next_request: AtomicU32::new(1),
        }
    }

    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    fn node(&self, node: u8) -> Result<&NodePath, DsmError> {
        self.nodes
            .get(node as usize)
            .ok_or(DsmError::UnknownNode(node))
    }

    /// Runs `work` on one of the node's channels. A refusal by the
    /// switch's ACL left the channel's queue pair in error: it is brought
    /// back, and the refusal is [`DsmError::AccessRefused`].
    fn on_channel<T>(
        &self,
        node: u8,
        operation: &'static str,
        work: impl FnOnce(&mut Channel) -> Result<T, DsmError>,
    ) -> Result<T, DsmError> {
        let path = self.node(node)?;
        path.channels.with(|channel| {
            let outcome = work(channel);
            match outcome {
                Err(error) if error.is_access_refusal() => {
                    channel.resume(&self.endpoint)?;
                    Err(DsmError::AccessRefused { node, operation })
                }
                outcome => outcome,
            }
        })
    }

    /// One message to a node's daemon and its reply.
    fn ask(
        &self,
        node: u8,
        operation: Operation,
        ptr: GlobalPtr,
        size: u64,
    ) -> Result<Reply, DsmError> {
        let request = Request {
            operation,
            generation: ptr.generation,
            request_id: self.next_request.fetch_add(1, Ordering::Relaxed),
            offset: ptr.offset,
            size,
        };
        let bad = |reason: String| DsmError::BadReply { node, reason };
        self.on_channel(node, operation.name(), |channel| {
            let answer = channel.two_sided(&self.kicker, 0, &request.emit())?;
            if answer.byte_len as usize != MESSAGE_LEN {
                return Err(bad(format!("{} bytes", answer.byte_len)));
            }
            let mut bytes = [0u8; MESSAGE_LEN];
            channel
                .landing()
                .read(0, &mut bytes)
                .map_err(ChannelError::from)?;
            let reply = Reply::parse(&bytes).map_err(|error| bad(error.to_string()))?;
            if reply.request_id != request.request_id {
                return Err(bad(format!(
                    "request id {} for {}",
                    reply.request_id, request.request_id
                )));
            }
            Ok(reply)
        })
    }

    fn refused(&self, ptr: GlobalPtr, operation: Operation, status: Status) -> DsmError {
        match status {
            Status::Freed if operation == Operation::Free => DsmError::DoubleFree(ptr),
            Status::Freed => DsmError::UseAfterFree(ptr),
            Status::NotAllocated => DsmError::NotAllocated(ptr),
            Status::NoSnapshot => DsmError::NoSnapshot(ptr),
            status => DsmError::Refused {
                node: ptr.node,
                operation,
                status,
            },
        }
    }

    /// `size` bytes on the next node in turn.
    pub fn alloc(&self, size: u64) -> Result<GlobalPtr, DsmError> {
        let node = self.next_node.fetch_add(1, Ordering::Relaxed) % self.nodes.len();
        self.alloc_on(node as u8, size)
    }

    pub fn alloc_on(&self, node: u8, size: u64) -> Result<GlobalPtr, DsmError> {
        let asking = GlobalPtr {
            node,
            generation: 0,
            offset: 0,
        };
        let reply = self.ask(node, Operation::Allocate, asking, size)?;
        if reply.status != Status::Ok {
            return Err(DsmError::NoSpace { node, size });
        }
        let ptr = GlobalPtr {
            node,
            generation: reply.generation,
            offset: reply.offset,
        };
        self.known.lock().expect("known lock").insert(ptr, size);
        Ok(ptr)
    }

    pub fn free(&self, ptr: GlobalPtr) -> Result<(), DsmError> {
        let reply = self.ask(ptr.node, Operation::Free, ptr, 0)?;
        self.known.lock().expect("known lock").remove(&ptr);
        match reply.status {
            Status::Ok => Ok(()),
            status => Err(self.refused(ptr, Operation::Free, status)),
        }
    }

    /// The allocation's size, asked of its node when the caller does not
    /// know it.
    pub fn size(&self, ptr: GlobalPtr) -> Result<u64, DsmError> {
        if let Some(&size) = self.known.lock().expect("known lock").get(&ptr) {
            return Ok(size);
        }
        let reply = self.ask(ptr.node, Operation::Stat, ptr, 0)?;
        if reply.status != Status::Ok {
            return Err(self.refused(ptr, Operation::Stat, reply.status));
        }
        self.known
            .lock()
            .expect("known lock")
            .insert(ptr, reply.size);
        Ok(reply.size)
    }

    /// Forgets what the caller knows of `ptr`, so the next access asks its
    /// node (after another caller may have freed it).
    pub fn forget(&self, ptr: GlobalPtr) {
        self.known.lock().expect("known lock").remove(&ptr);
    }

    fn check(&self, ptr: GlobalPtr, at: u64, length: usize) -> Result<(), DsmError> {
        let size = self.size(ptr)?;
        if at.saturating_add(length as u64) > size {
            return Err(DsmError::OutOfRange {
                ptr,
                at,
                length,
                size,
            });
        }
        Ok(())
    }

    /// The allocation's size, asked of its node even when the caller
    /// knows it (so the switch's ACL judges the asking).
    pub fn stat(&self, ptr: GlobalPtr) -> Result<u64, DsmError> {
        self.forget(ptr);
        self.size(ptr)
    }

    pub fn read(&self, ptr: GlobalPtr, into: &mut [u8]) -> Result<(), DsmError> {
        self.read_at(ptr, 0, into)
    }

    pub fn read_at(&self, ptr: GlobalPtr, at: u64, into: &mut [u8]) -> Result<(), DsmError> {
        self.check(ptr, at, into.len())?;
        self.transfer(ptr, at, Transfer::Into(into), "READ")
    }

    /// Reads `length` bytes at `at` into a new buffer, checked against the
    /// allocation's size before the buffer is made: a length a caller
    /// lent is untrusted, and a huge one must be refused, not allocated.
    pub fn read_vec_at(&self, ptr: GlobalPtr, at: u64, length: usize) -> Result<Vec<u8>, DsmError> {
        self.check(ptr, at, length)?;
        let mut data = vec![0u8; length];
        self.transfer(ptr, at, Transfer::Into(&mut data), "READ")?;
        Ok(data)
    }

    pub fn write(&self, ptr: GlobalPtr, data: &[u8]) -> Result<(), DsmError> {
        self.write_at(ptr, 0, data)
    }

    pub fn write_at(&self, ptr: GlobalPtr, at: u64, data: &[u8]) -> Result<(), DsmError> {
        self.check(ptr, at, data.len())?;
        self.transfer(ptr, at, Transfer::From(data), "WRITE")
    }

    fn transfer(
        &self,
        ptr: GlobalPtr,
        at: u64,
        transfer: Transfer<'_>,
        operation: &'static str,
    ) -> Result<(), DsmError> {
        let pool = self.node(ptr.node)?.pool;
        let start = ptr.offset + at;
        self.on_channel(ptr.node, operation, |channel| {
            Ok(channel.transfer(&self.kicker, pool, start, transfer)?)
        })
    }

    /// The node keeps a copy of the allocation's bytes.
    pub fn snapshot(&self, ptr: GlobalPtr) -> Result<(), DsmError> {
        self.snapshot_version(ptr, 0)
    }

    /// The node puts the copy back.
    pub fn restore(&self, ptr: GlobalPtr) -> Result<(), DsmError> {
        self.restore_version(ptr, 0)
    }

    /// The node keeps a copy of the allocation's bytes as `version`
    /// (replacing one of that version; the newest
    /// [`super::daemon::SNAPSHOTS_PER_ALLOCATION`] versions are kept).
    pub fn snapshot_version(&self, ptr: GlobalPtr, version: u64) -> Result<(), DsmError> {
        self.simple(ptr, Operation::Snapshot, version)
    }

    /// The node puts back the copy of `version`.
    pub fn restore_version(&self, ptr: GlobalPtr, version: u64) -> Result<(), DsmError> {
        self.simple(ptr, Operation::Restore, version)
    }

    fn simple(&self, ptr: GlobalPtr, operation: Operation, version: u64) -> Result<(), DsmError> {
        let reply = self.ask(ptr.node, operation, ptr, version)?;
        match reply.status {
            Status::Ok => Ok(()),
            status => Err(self.refused(ptr, operation, status)),
        }
    }
}
