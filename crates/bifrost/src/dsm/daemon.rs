//! A memory node's DSM daemon: an agent that answers alloc, free, stat,
//! snapshot and restore messages. Reads and writes never reach it: they
//! are one-sided RDMA to its registered pool.
//!
//! The pool, its allocation table and its snapshots are the node's
//! memory, declared durable: a crash of the daemon's host loses the
//! daemon's queue state, not the data (as a persistent memory node would
//! keep it).

use super::message::{Operation, Reply, Request, Status, MESSAGE_LEN};
use remora_base::Timestamp;
use remora_host::{Agent, AgentError, Progress};
use remora_rack::pool::{Pool, PoolError};
use remora_rnic::{
    AccessFlags, CompletionQueue, CompletionStatus, HostMemory, MemoryRegion, ProtectionDomain,
    QueuePair, ReceiveRequest, SendOperation, SendRequest, SharedReceiveQueue, Verbs, VerbsError,
    WorkCompletion,
};
use remora_wire::{Qpn, VirtAddr};
use std::collections::{HashMap, VecDeque};

/// Bytes of one message slot.
const SLOT_BYTES: u64 = 64;
/// Receive buffers in the shared receive queue: requests in flight.
pub const RECEIVE_SLOTS: u32 = 64;
/// Send buffers for replies.
pub const SEND_SLOTS: u32 = 64;
/// Completions taken per turn.
const COMPLETIONS_PER_TURN: usize = 256;
/// Replies waiting for a send buffer, at most.
const PENDING_REPLIES: usize = 4096;
const RECEIVE_KIND: u64 = 1 << 32;
/// Versions of one allocation's snapshot the daemon keeps: a callee
/// snapshots its regions with each checkpoint, and the Gatekeeper's kept
/// checkpoint can lag its newest by the replies lost on their way.
pub const SNAPSHOTS_PER_ALLOCATION: usize = 32;
const SEND_KIND: u64 = 2 << 32;

/// What deployment made on the memory node's NIC.
#[derive(Debug, Clone, Copy)]
pub struct DaemonResources {
    pub protection_domain: ProtectionDomain,
    /// The pool, which callers read and write one-sided.
    pub pool_region: MemoryRegion,
    pub completion_queue: CompletionQueue,
    pub shared_receive_queue: SharedReceiveQueue,
    /// Receive slots, then send slots.
    pub message_region: MemoryRegion,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Allocation {
    id: u64,
    size: u64,
    generation: u8,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DaemonCounters {
    pub requests: u64,
    pub malformed: u64,
    pub allocations: u64,
    pub frees: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{0} replies are waiting for send buffers: the callers do not take them")]
    RepliesPiledUp(usize),
    #[error("a completion with unknown work request id {0:#x}")]
    UnknownWork(u64),
    #[error("the DSM daemon does not come back after its host restarts yet (its registrations live in the NIC that crashed)")]
    RestartUnsupported,
}

pub struct MemoryDaemon {
    resources: DaemonResources,
    pool: Pool<u64>,
    allocations: HashMap<u64, Allocation>,
    /// The last generation handed out at each offset ever allocated.
    generations: HashMap<u64, u8>,
    /// Each allocation's snapshots, by version, the newest
    /// [`SNAPSHOTS_PER_ALLOCATION`] kept (with the generation they are of).
    snapshots: HashMap<u64, (u8, std::collections::BTreeMap<u64, Vec<u8>>)>,
    /// Bytes the snapshots hold, at most `snapshot_budget_bytes`: with
    /// none, one client's snapshots of a pool-sized allocation (32
    /// versions each) held 32 times the pool in the daemon's heap.
    snapshot_bytes: u64,
    /// The pool's size: snapshots may hold as much again.
    snapshot_budget_bytes: u64,
    next_id: u64,
    free_send_slots: Vec<u32>,
    replies: VecDeque<(Qpn, Reply)>,
    receives_posted: bool,
    counters: DaemonCounters,
}

/// Registers a pool of `pool_bytes` and the daemon's queues on `nic`.
pub fn deploy(nic: &mut dyn Verbs, pool_bytes: u64) -> Result<MemoryDaemon, VerbsError> {
    let protection_domain = nic.alloc_protection_domain()?;
    let memory = HostMemory::new(pool_bytes as usize);
    let pool_region = nic.register_host_memory(
        protection_domain,
        memory.clone(),
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
    )?;
    let completion_queue =
        nic.create_completion_queue(4 * (RECEIVE_SLOTS + SEND_SLOTS) as usize)?;
    let shared_receive_queue =
        nic.create_shared_receive_queue(protection_domain, RECEIVE_SLOTS as usize)?;
    let message_region = nic.register_memory(
        protection_domain,
        u64::from(RECEIVE_SLOTS + SEND_SLOTS) * SLOT_BYTES,
        AccessFlags::LOCAL_WRITE,
    )?;
    let resources = DaemonResources {
        protection_domain,
        pool_region,
        completion_queue,
        shared_receive_queue,
        message_region,
    };
    Ok(MemoryDaemon {
        resources,
        pool: Pool::new(memory),
        allocations: HashMap::new(),
        generations: HashMap::new(),
        snapshots: HashMap::new(),
        snapshot_bytes: 0,
        snapshot_budget_bytes: pool_bytes,
        next_id: 0,
        free_send_slots: (0..SEND_SLOTS).collect(),
        replies: VecDeque::new(),
        receives_posted: false,
        counters: DaemonCounters::default(),
    })
}

impl MemoryDaemon {
    pub fn resources(&self) -> DaemonResources {
        self.resources
    }

    pub fn counters(&self) -> DaemonCounters {
        self.counters
    }

    fn slot_address(&self, slot: u32) -> VirtAddr {
        VirtAddr(self.resources.message_region.address.0 + u64::from(slot) * SLOT_BYTES)
    }

    fn repost(&self, nic: &mut dyn Verbs, slot: u32) -> Result<(), VerbsError> {
        let local = self
            .resources
            .message_region
            .slice(u64::from(slot) * SLOT_BYTES, SLOT_BYTES as u32);
        let request = ReceiveRequest::new(RECEIVE_KIND | u64::from(slot), &[local])?;
        nic.post_shared_receive(self.resources.shared_receive_queue, request)
    }

    /// The allocation at `offset` if `generation` is its own; otherwise
    /// why not.
    fn live(&self, offset: u64, generation: u8) -> Result<Allocation, Status> {
        match self.allocations.get(&offset) {
            Some(allocation) if allocation.generation == generation => Ok(*allocation),
            Some(_) => Err(Status::Freed),
            None if self.generations.contains_key(&offset) => Err(Status::Freed),
            None => Err(Status::NotAllocated),
        }
    }

    /// What a request does to the node; returns the reply.
    pub fn handle(&mut self, request: Request) -> Reply {
        let reply = |status, generation, offset, size| Reply {
            status,
            generation,
            request_id: request.request_id,
            offset,
            size,
        };
        let refused = |status| reply(status, request.generation, request.offset, 0);
        match request.operation {
            Operation::Allocate => {
                let id = self.next_id;
                self.next_id += 1;
                match self.pool.reserve(id, request.size.max(1)) {
                    Err(PoolError::Full { .. }) | Err(_) => refused(Status::NoSpace),
                    Ok(start) => {
                        let generation = self
                            .generations
                            .get(&start)
                            .map_or(0, |g| g.wrapping_add(1));
                        self.generations.insert(start, generation);
                        let allocation = Allocation {
                            id,
                            size: request.size,
                            generation,
                        };
                        self.allocations.insert(start, allocation);
                        self.counters.allocations += 1;
                        reply(Status::Ok, generation, start, request.size)
                    }
                }
            }
            operation => match self.live(request.offset, request.generation) {
                Err(status) => refused(status),
                Ok(allocation) => self.on_live(operation, request, allocation),
            },
        }
    }

    fn on_live(&mut self, operation: Operation, request: Request, allocation: Allocation) -> Reply {
        let offset = request.offset;
        let mut status = Status::Ok;
        match operation {
            Operation::Allocate => unreachable!("handled before"),
            Operation::Free => {
                self.pool
                    .release(allocation.id)
                    .expect("a live allocation holds its extent");
                self.allocations.remove(&offset);
                if let Some((_, versions)) = self.snapshots.remove(&offset) {
                    self.snapshot_bytes -= bytes_held(&versions);
                }
                self.counters.frees += 1;
            }
            Operation::Stat => {}
            // A snapshot's and a restore's version ride in the size field.
            Operation::Snapshot => status = self.snapshot(offset, request.size, allocation),
            Operation::Restore => match self.snapshots.get(&offset) {
                Some((generation, versions)) if *generation == allocation.generation => {
                    match versions.get(&request.size) {
                        Some(copy) => self
                            .pool
                            .write(offset, copy)
                            .expect("an allocation lies in the pool"),
                        None => status = Status::NoSnapshot,
                    }
                }
                _ => status = Status::NoSnapshot,
            },
        }
        Reply {
            status,
            generation: allocation.generation,
            request_id: request.request_id,
            offset,
            size: allocation.size,
        }
    }

    /// Keeps a copy of `allocation` as `version`, within the snapshot
    /// budget (refused with `NoSpace` past it, nothing kept).
    fn snapshot(&mut self, offset: u64, version: u64, allocation: Allocation) -> Status {
        let kept = self
            .snapshots
            .entry(offset)
            .or_insert_with(|| (allocation.generation, Default::default()));
        let mut held = self.snapshot_bytes;
        if kept.0 != allocation.generation {
            held -= bytes_held(&kept.1);
            *kept = (allocation.generation, Default::default());
        }
        // What the copy takes the place of: this version's last copy, or
        // else, when the allocation keeps its most versions already, the
        // oldest, which the insert evicts (judged without it, a budget
        // filled by one allocation refused every later version for good).
        let replaced = match kept.1.get(&version) {
            Some(copy) => copy.len() as u64,
            None if kept.1.len() >= SNAPSHOTS_PER_ALLOCATION => kept
                .1
                .first_key_value()
                .map_or(0, |(_, oldest)| oldest.len() as u64),
            None => 0,
        };
        if held - replaced + allocation.size > self.snapshot_budget_bytes {
            self.snapshot_bytes = held;
            return Status::NoSpace;
        }
        let mut copy = vec![0u8; allocation.size as usize];
        self.pool
            .read(offset, &mut copy)
            .expect("an allocation lies in the pool");
        held += allocation.size;
        if let Some(previous) = kept.1.insert(version, copy) {
            held -= previous.len() as u64;
        }
        // Bounded: one over the limit at most, after the insert.
        while kept.1.len() > SNAPSHOTS_PER_ALLOCATION {
            if let Some((_, oldest)) = kept.1.pop_first() {
                held -= oldest.len() as u64;
            }
        }
        self.snapshot_bytes = held;
        debug_assert!(self.snapshot_bytes <= self.snapshot_budget_bytes);
        Status::Ok
    }

    fn received(
        &mut self,
        nic: &mut dyn Verbs,
        completion: &WorkCompletion,
    ) -> Result<(), AgentError> {
        let slot = completion.work_request_id as u32;
        let length = (completion.byte_len as usize).min(SLOT_BYTES as usize);
        let mut bytes = [0u8; SLOT_BYTES as usize];
        nic.read_local(
            self.resources.message_region.lkey,
            self.slot_address(slot),
            &mut bytes[..length],
        )?;
        self.repost(nic, slot)?;
        self.counters.requests += 1;
        let reply = match Request::parse(&bytes[..length]) {
            Ok(request) => self.handle(request),
            Err(_) => {
                // A malformed request is answered, never a panic.
                self.counters.malformed += 1;
                Reply {
                    status: Status::Malformed,
                    generation: 0,
                    request_id: 0,
                    offset: 0,
                    size: 0,
                }
            }
        };
        if self.replies.len() >= PENDING_REPLIES {
            return Err(AgentError::system(
                "dsm-daemon",
                DaemonError::RepliesPiledUp(self.replies.len()),
            ));
        }
        self.replies.push_back((completion.qpn, reply));
        Ok(())
    }

    fn send_replies(&mut self, nic: &mut dyn Verbs) -> Result<bool, AgentError> {
        let mut sent = false;
        while let Some(slot) = self.free_send_slots.pop() {
            let Some((qpn, reply)) = self.replies.pop_front() else {
                self.free_send_slots.push(slot);
                break;
            };
            let at = RECEIVE_SLOTS + slot;
            nic.write_local(
                self.resources.message_region.lkey,
                self.slot_address(at),
                &reply.emit(),
            )?;
            let local = self
                .resources
                .message_region
                .slice(u64::from(at) * SLOT_BYTES, MESSAGE_LEN as u32);
            let request = SendRequest::new(
                SEND_KIND | u64::from(slot),
                SendOperation::Send { immediate: None },
                &[local],
            )?;
            nic.post_send(QueuePair(qpn), request)?;
            sent = true;
        }
        Ok(sent)
    }
}

impl Agent for MemoryDaemon {
    fn name(&self) -> &'static str {
        "dsm-daemon"
    }

    fn poll(&mut self, _now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        if !self.receives_posted {
            for slot in 0..RECEIVE_SLOTS {
                self.repost(nic, slot)?;
            }
            self.receives_posted = true;
        }
        let mut moved = false;
        for _ in 0..COMPLETIONS_PER_TURN {
            let Some(completion) = nic.poll_completion(self.resources.completion_queue)? else {
                break;
            };
            moved = true;
            let id = completion.work_request_id;
            match (id & !0xffff_ffff, completion.status) {
                (RECEIVE_KIND, CompletionStatus::Success) => self.received(nic, &completion)?,
                (RECEIVE_KIND, CompletionStatus::WorkRequestFlushError) => {}
                (RECEIVE_KIND, _) => self.repost(nic, id as u32)?,
                (SEND_KIND, _) => self.free_send_slots.push(id as u32),
                _ => {
                    return Err(AgentError::system(
                        "dsm-daemon",
                        DaemonError::UnknownWork(id),
                    ))
                }
            }
        }
        moved |= self.send_replies(nic)?;
        Ok(Progress::from_moved(moved))
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        None
    }

    fn crash(&mut self) {
        // Queue state goes; the pool and its tables are the node's memory.
        self.replies.clear();
        self.free_send_slots = (0..SEND_SLOTS).collect();
        self.receives_posted = false;
    }

    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Err(AgentError::system(
            "dsm-daemon",
            DaemonError::RestartUnsupported,
        ))
    }
}

/// Bytes `versions` hold.
fn bytes_held(versions: &std::collections::BTreeMap<u64, Vec<u8>>) -> u64 {
    versions.values().map(|copy| copy.len() as u64).sum()
}
