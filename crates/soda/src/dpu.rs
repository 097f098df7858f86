//! The DPU agent: a SmartNIC beside the compute node that takes the host's
//! two-sided requests (Table I, SEND_WITH_IMM into a shared receive
//! queue), forwards them to the memory node, and replies by SEND from its
//! own registered buffers, zero-copy.
//!
//! Two pipeline agents share the DPU's state, as in §IV: the receiver
//! takes requests, looks them up and issues them; the stager polls the
//! memory node and stages data back to the host. With aggregation, every
//! request received in a turn is issued in that turn (one doorbell for
//! the batch); without it, one per turn. With asynchronous forwarding,
//! many forwards are in flight; without it, one at a time (the "DPU
//! base" of §VI). Both agents run on the DPU host's CPU of the rack,
//! which reports their busy time apart from the compute node's.
//!
//! A write returns as soon as the DPU holds the data: the DPU acknowledges
//! it, then writes it to the memory node from the receive buffer. Every
//! reply carries, in its immediate data, how many of that queue pair's
//! writes have reached the memory node, so the host knows which writes a
//! DPU crash would lose.

use remora_base::Timestamp;
use remora_host::{Agent, AgentError, Progress};
use remora_rnic::{
    CompletionOpcode, CompletionQueue, CompletionStatus, MemoryRegion, QueuePair, ReceiveRequest,
    SendOperation, SendRequest, SharedReceiveQueue, Verbs, WorkCompletion,
};
use remora_wire::soda::{RegionId, SodaRequestRepr};
use remora_wire::{Qpn, VirtAddr};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

/// The immediate data of a reply: this bit set is an error.
pub const REPLY_ERROR: u32 = 1 << 31;
/// The low bits: the queue pair's writes persisted so far (mod 2^31).
pub const PERSISTED_MASK: u32 = REPLY_ERROR - 1;
/// Completions each agent takes per turn.
const COMPLETIONS_PER_TURN: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DpuConfig {
    pub aggregation: bool,
    pub async_forwarding: bool,
    /// Receive buffers in the shared receive queue: requests in flight.
    pub receive_slots: usize,
    /// Staging buffers for data coming back from the memory node.
    pub staging_slots: usize,
    pub chunk_bytes: usize,
}

impl DpuConfig {
    /// §VI's "DPU base": every request forwarded alone, one at a time.
    pub fn base(chunk_bytes: usize) -> DpuConfig {
        DpuConfig {
            aggregation: false,
            async_forwarding: false,
            receive_slots: 16,
            staging_slots: 1,
            chunk_bytes,
        }
    }

    /// Aggregation and asynchronous forwarding.
    pub fn optimized(chunk_bytes: usize) -> DpuConfig {
        DpuConfig {
            aggregation: true,
            async_forwarding: true,
            receive_slots: 64,
            staging_slots: 16,
            chunk_bytes,
        }
    }

    /// Bytes of one receive buffer: a write request's header and a chunk.
    pub fn receive_slot_bytes(&self) -> usize {
        self.chunk_bytes + crate::channel::HEADER_ROOM
    }
}

/// What deployment made on the DPU's NIC.
#[derive(Debug, Clone, Copy)]
pub struct DpuResources {
    pub host_completion_queue: CompletionQueue,
    pub memory_completion_queue: CompletionQueue,
    pub shared_receive_queue: SharedReceiveQueue,
    pub memory_queue_pair: QueuePair,
    pub receive_region: MemoryRegion,
    pub staging_region: MemoryRegion,
    /// The memory node's pool, as the DPU reaches it.
    pub pool: MemoryRegion,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DpuCounters {
    pub read_requests: u64,
    pub write_requests: u64,
    pub refused_requests: u64,
    /// Bytes fetched from the memory node for requests (the critical path).
    pub on_demand_bytes: u64,
    /// Bytes written to the memory node.
    pub written_bytes: u64,
    /// Largest number of forwards in flight at once.
    pub most_in_flight: u64,
}

#[derive(Debug, Clone, Copy)]
enum Request {
    Read {
        qpn: Qpn,
        slot: u32,
        at: u64,
        size: u32,
    },
    Write {
        qpn: Qpn,
        slot: u32,
        at: u64,
        size: u32,
    },
    Refused {
        qpn: Qpn,
        slot: u32,
    },
}

#[derive(Debug, Clone, Copy)]
enum Forward {
    Read {
        qpn: Qpn,
        slot: u32,
        staging: u32,
        size: u32,
    },
    Write {
        qpn: Qpn,
        slot: u32,
        size: u32,
    },
}

/// Work request ids: a kind in the high half, a slot in the low half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WorkKind {
    Receive = 1,
    MemoryRead = 2,
    MemoryWrite = 3,
    DataReply = 4,
    Acknowledgement = 5,
}

fn work_id(kind: WorkKind, slot: u32) -> u64 {
    (kind as u64) << 32 | u64::from(slot)
}

fn work_kind(id: u64) -> (Option<WorkKind>, u32) {
    let kind = match id >> 32 {
        1 => Some(WorkKind::Receive),
        2 => Some(WorkKind::MemoryRead),
        3 => Some(WorkKind::MemoryWrite),
        4 => Some(WorkKind::DataReply),
        5 => Some(WorkKind::Acknowledgement),
        _ => None,
    };
    (kind, id as u32)
}

#[derive(Debug, thiserror::Error)]
pub enum DpuError {
    #[error("a completion with unknown work request id {0:#x}")]
    UnknownWork(u64),
    #[error("the memory node failed a forward: {0:?}")]
    Memory(CompletionStatus),
}

/// The DPU's state, shared by its two agents and its control plane.
pub struct DpuState {
    config: DpuConfig,
    resources: DpuResources,
    regions: HashMap<RegionId, (u64, u64)>,
    requests: VecDeque<Request>,
    free_staging: Vec<u32>,
    in_flight: HashMap<u64, Forward>,
    next_forward: u64,
    persisted: HashMap<Qpn, u32>,
    counters: DpuCounters,
    /// Receive buffers posted at start-up (again after a restart).
    receives_posted: bool,
}

impl DpuState {
    pub fn new(config: DpuConfig, resources: DpuResources) -> DpuState {
        DpuState {
            config,
            resources,
            regions: HashMap::new(),
            requests: VecDeque::new(),
            free_staging: (0..config.staging_slots as u32).collect(),
            in_flight: HashMap::new(),
            next_forward: 0,
            persisted: HashMap::new(),
            counters: DpuCounters::default(),
            receives_posted: false,
        }
    }

    /// Control plane: the host tells the DPU where a region lives on the
    /// memory node.
    pub fn register_region(&mut self, region: RegionId, memory_offset: u64, length: u64) {
        self.regions.insert(region, (memory_offset, length));
    }

    pub fn forget_region(&mut self, region: RegionId) {
        self.regions.remove(&region);
    }

    pub fn counters(&self) -> DpuCounters {
        self.counters
    }

    fn post_receives(&mut self, nic: &mut dyn Verbs) -> Result<(), AgentError> {
        for slot in 0..self.config.receive_slots as u32 {
            self.repost(nic, slot)?;
        }
        self.receives_posted = true;
        Ok(())
    }

    fn repost(&mut self, nic: &mut dyn Verbs, slot: u32) -> Result<(), AgentError> {
        let bytes = self.config.receive_slot_bytes();
        let local = self
            .resources
            .receive_region
            .slice(u64::from(slot) * bytes as u64, bytes as u32);
        let request = ReceiveRequest::new(work_id(WorkKind::Receive, slot), &[local])?;
        nic.post_shared_receive(self.resources.shared_receive_queue, request)?;
        Ok(())
    }

    /// Where `size` bytes at `page_offset` of `region` live in the pool.
    fn locate(&self, region: RegionId, page_offset: u64, size: u32) -> Option<u64> {
        let &(start, length) = self.regions.get(&region)?;
        let end = page_offset.checked_add(u64::from(size))?;
        let fits = end <= length && size as usize <= self.config.chunk_bytes;
        fits.then_some(start + page_offset)
    }

    fn take_request(
        &mut self,
        nic: &mut dyn Verbs,
        completion: &WorkCompletion,
    ) -> Result<(), AgentError> {
        let (_, slot) = work_kind(completion.work_request_id);
        let bytes = self.config.receive_slot_bytes();
        let mut payload = vec![0u8; (completion.byte_len as usize).min(bytes)];
        let address = self.resources.receive_region.address.0 + u64::from(slot) * bytes as u64;
        nic.read_local(
            self.resources.receive_region.lkey,
            VirtAddr(address),
            &mut payload,
        )?;
        let qpn = completion.qpn;
        let request = match completion
            .immediate
            .map(|immediate| SodaRequestRepr::parse(immediate, &payload))
        {
            Some(Ok(SodaRequestRepr::Read(read))) => {
                match self.locate(read.region, read.page_offset, read.size) {
                    Some(at) => Request::Read {
                        qpn,
                        slot,
                        at,
                        size: read.size,
                    },
                    None => Request::Refused { qpn, slot },
                }
            }
            Some(Ok(SodaRequestRepr::Write(write))) => {
                let size = write.data.len() as u32;
                match self.locate(write.region, write.page_offset, size) {
                    Some(at) => Request::Write {
                        qpn,
                        slot,
                        at,
                        size,
                    },
                    None => Request::Refused { qpn, slot },
                }
            }
            // A malformed request is refused, never a panic.
            _ => Request::Refused { qpn, slot },
        };
        self.requests.push_back(request);
        Ok(())
    }

    fn reply_immediate(&self, qpn: Qpn, error: bool) -> u32 {
        let persisted = self.persisted.get(&qpn).copied().unwrap_or(0) & PERSISTED_MASK;
        if error {
            persisted | REPLY_ERROR
        } else {
            persisted
        }
    }

    fn send_reply(
        &mut self,
        nic: &mut dyn Verbs,
        qpn: Qpn,
        kind: WorkKind,
        slot: u32,
        data: Option<(u32, u32)>,
        error: bool,
    ) -> Result<(), AgentError> {
        let immediate = Some(self.reply_immediate(qpn, error));
        let local: Vec<_> = data
            .map(|(staging, size)| {
                let offset = u64::from(staging) * self.config.chunk_bytes as u64;
                self.resources.staging_region.slice(offset, size)
            })
            .into_iter()
            .collect();
        let request = SendRequest::new(
            work_id(kind, slot),
            SendOperation::Send { immediate },
            &local,
        )?;
        nic.post_send(QueuePair(qpn), request)?;
        Ok(())
    }

    /// Issues one request; false when it must wait (no staging buffer, or
    /// a forward in flight without asynchronous forwarding).
    fn issue(&mut self, nic: &mut dyn Verbs, request: Request) -> Result<bool, AgentError> {
        if !self.config.async_forwarding && !self.in_flight.is_empty() {
            return Ok(false);
        }
        match request {
            Request::Refused { qpn, slot } => {
                self.counters.refused_requests += 1;
                self.send_reply(nic, qpn, WorkKind::Acknowledgement, slot, None, true)?;
                self.repost(nic, slot)?;
            }
            Request::Read {
                qpn,
                slot,
                at,
                size,
            } => {
                let Some(staging) = self.free_staging.pop() else {
                    return Ok(false);
                };
                self.counters.read_requests += 1;
                let local = self
                    .resources
                    .staging_region
                    .slice(u64::from(staging) * self.config.chunk_bytes as u64, size);
                let forward = Forward::Read {
                    qpn,
                    slot,
                    staging,
                    size,
                };
                let operation = SendOperation::Read {
                    remote: self.resources.pool.remote(at),
                };
                self.forward(nic, forward, operation, local, WorkKind::MemoryRead)?;
            }
            Request::Write {
                qpn,
                slot,
                at,
                size,
            } => {
                self.counters.write_requests += 1;
                // The DPU holds the data: acknowledge now, persist next.
                self.send_reply(nic, qpn, WorkKind::Acknowledgement, slot, None, false)?;
                let header = remora_wire::soda::WriteRequest::<&[u8]>::HEADER_LEN as u64;
                let offset = u64::from(slot) * self.config.receive_slot_bytes() as u64 + header;
                let local = self.resources.receive_region.slice(offset, size);
                let operation = SendOperation::Write {
                    remote: self.resources.pool.remote(at),
                    immediate: None,
                };
                self.forward(
                    nic,
                    Forward::Write { qpn, slot, size },
                    operation,
                    local,
                    WorkKind::MemoryWrite,
                )?;
            }
        }
        Ok(true)
    }

    fn forward(
        &mut self,
        nic: &mut dyn Verbs,
        forward: Forward,
        operation: SendOperation,
        local: remora_rnic::ScatterGatherElement,
        kind: WorkKind,
    ) -> Result<(), AgentError> {
        self.next_forward = (self.next_forward + 1) & 0xffff_ffff;
        let id = work_id(kind, self.next_forward as u32);
        nic.post_send(
            self.resources.memory_queue_pair,
            SendRequest::new(id, operation, &[local])?,
        )?;
        self.in_flight.insert(id, forward);
        self.counters.most_in_flight = self
            .counters
            .most_in_flight
            .max(self.in_flight.len() as u64);
        Ok(())
    }

    /// The receiver's turn: take requests, then issue what can go.
    fn receive_turn(&mut self, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        if !self.receives_posted {
            self.post_receives(nic)?;
        }
        let mut moved = false;
        for _ in 0..COMPLETIONS_PER_TURN {
            let Some(completion) = nic.poll_completion(self.resources.host_completion_queue)?
            else {
                break;
            };
            moved = true;
            self.host_completion(nic, &completion)?;
        }
        let budget = if self.config.aggregation {
            self.requests.len()
        } else {
            1
        };
        for _ in 0..budget {
            let Some(request) = self.requests.pop_front() else {
                break;
            };
            if !self.issue(nic, request)? {
                self.requests.push_front(request);
                break;
            }
            moved = true;
        }
        Ok(Progress::from_moved(moved))
    }

    fn host_completion(
        &mut self,
        nic: &mut dyn Verbs,
        completion: &WorkCompletion,
    ) -> Result<(), AgentError> {
        let (kind, slot) = work_kind(completion.work_request_id);
        if completion.status != CompletionStatus::Success {
            // A host queue pair went down (its process ended): its
            // requests are dropped; the buffer goes back.
            if kind == Some(WorkKind::DataReply) {
                self.free_staging.push(slot);
            }
            if kind == Some(WorkKind::Receive)
                && completion.status != CompletionStatus::WorkRequestFlushError
            {
                self.repost(nic, slot)?;
            }
            return Ok(());
        }
        match (kind, completion.opcode) {
            (
                Some(WorkKind::Receive),
                CompletionOpcode::Receive | CompletionOpcode::ReceiveRdmaWithImmediate,
            ) => self.take_request(nic, completion),
            (Some(WorkKind::DataReply), _) => {
                self.free_staging.push(slot);
                Ok(())
            }
            (Some(WorkKind::Acknowledgement), _) => Ok(()),
            _ => Err(AgentError::system(
                "soda-dpu",
                DpuError::UnknownWork(completion.work_request_id),
            )),
        }
    }

    /// The stager's turn: forwards that finished go back to the host.
    fn stage_turn(&mut self, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        let mut moved = false;
        for _ in 0..COMPLETIONS_PER_TURN {
            let Some(completion) = nic.poll_completion(self.resources.memory_completion_queue)?
            else {
                break;
            };
            moved = true;
            let forward = self
                .in_flight
                .remove(&completion.work_request_id)
                .ok_or_else(|| {
                    AgentError::system(
                        "soda-dpu",
                        DpuError::UnknownWork(completion.work_request_id),
                    )
                })?;
            let failed = completion.status != CompletionStatus::Success;
            match forward {
                // A read the memory node refused is refused to the host.
                Forward::Read {
                    qpn, slot, staging, ..
                } if failed => {
                    self.counters.refused_requests += 1;
                    self.free_staging.push(staging);
                    self.repost(nic, slot)?;
                    self.send_reply(nic, qpn, WorkKind::Acknowledgement, slot, None, true)?;
                }
                // A write the DPU acknowledged and cannot persist is data
                // lost: the DPU stops, and the host marks what it held.
                Forward::Write { .. } if failed => {
                    return Err(AgentError::system(
                        "soda-dpu",
                        DpuError::Memory(completion.status),
                    ));
                }
                Forward::Read {
                    qpn,
                    slot,
                    staging,
                    size,
                } => {
                    self.counters.on_demand_bytes += u64::from(size);
                    self.repost(nic, slot)?;
                    self.send_reply(
                        nic,
                        qpn,
                        WorkKind::DataReply,
                        staging,
                        Some((staging, size)),
                        false,
                    )?;
                }
                Forward::Write { qpn, slot, size } => {
                    self.counters.written_bytes += u64::from(size);
                    *self.persisted.entry(qpn).or_insert(0) += 1;
                    self.repost(nic, slot)?;
                }
            }
        }
        Ok(Progress::from_moved(moved))
    }

    fn crash(&mut self) {
        // What the DPU held is gone: queued requests, forwards, and the
        // writes it acknowledged but had not persisted.
        self.requests.clear();
        self.in_flight.clear();
        self.free_staging = (0..self.config.staging_slots as u32).collect();
        self.persisted.clear();
        self.receives_posted = false;
    }
}

pub type SharedDpu = Arc<Mutex<DpuState>>;

fn lock(state: &SharedDpu) -> MutexGuard<'_, DpuState> {
    state.lock().expect("DPU state lock")
}

/// Takes requests, looks them up and issues them.
pub struct DpuReceiver(pub SharedDpu);

/// Polls the memory node and stages data back to the host.
pub struct DpuStager(pub SharedDpu);

impl Agent for DpuReceiver {
    fn name(&self) -> &'static str {
        "soda-dpu-receiver"
    }
    fn poll(&mut self, _now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        lock(&self.0).receive_turn(nic)
    }
    fn poll_timeout(&self) -> Option<Timestamp> {
        None
    }
    fn crash(&mut self) {
        lock(&self.0).crash();
    }
    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        // The host reconnects; nothing survives a DPU crash but the
        // region map, which the control plane gave and keeps.
        Ok(())
    }
}

impl Agent for DpuStager {
    fn name(&self) -> &'static str {
        "soda-dpu-stager"
    }
    fn poll(&mut self, _now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        lock(&self.0).stage_turn(nic)
    }
    fn poll_timeout(&self) -> Option<Timestamp> {
        None
    }
    fn crash(&mut self) {}
    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Ok(())
    }
}
