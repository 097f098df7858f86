//! The verbs API: the nouns of the `ibverbs` crate (context, protection
//! domain, memory region, completion queue, queue-pair builder, prepared
//! queue pair, endpoint handshake) behind a trait, so a hardware backend can
//! stand where the soft RNIC stands.

use crate::host_memory::HostMemory;
use remora_wire::{Ipv4Address, MacAddress, Psn, Qpn, Rkey, VirtAddr};
use std::fmt;
use std::ops::BitOr;
use std::time::Duration;

/// Local key: names a memory region to its own device.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Lkey(pub u32);

impl fmt::Debug for Lkey {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "Lkey({:#010x})", self.0)
    }
}

/// Memory region access rights, as in `ibv_access_flags`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
pub struct AccessFlags(u8);

impl AccessFlags {
    pub const NONE: AccessFlags = AccessFlags(0);
    pub const LOCAL_WRITE: AccessFlags = AccessFlags(1);
    pub const REMOTE_WRITE: AccessFlags = AccessFlags(2);
    pub const REMOTE_READ: AccessFlags = AccessFlags(4);
    pub const REMOTE_ATOMIC: AccessFlags = AccessFlags(8);
    pub const ALL: AccessFlags = AccessFlags(15);

    pub const fn contains(self, other: AccessFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for AccessFlags {
    type Output = AccessFlags;
    fn bitor(self, other: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 | other.0)
    }
}

/// Handles. They are plain numbers: the device owns the objects.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ProtectionDomain(pub(crate) u32);

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct CompletionQueue(pub(crate) u32);

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SharedReceiveQueue(pub(crate) u32);

/// A registered memory region, as its owner sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct MemoryRegion {
    pub lkey: Lkey,
    pub rkey: Rkey,
    pub address: VirtAddr,
    pub length_bytes: u64,
    pub access: AccessFlags,
}

impl MemoryRegion {
    /// A scatter/gather element covering `[offset, offset + length)` of the region.
    pub fn slice(&self, offset_bytes: u64, length_bytes: u32) -> ScatterGatherElement {
        ScatterGatherElement {
            // Saturating: a nonsense offset becomes an out-of-bounds error
            // when the element is used, not an overflow here.
            address: VirtAddr(self.address.0.saturating_add(offset_bytes)),
            length_bytes,
            lkey: self.lkey,
        }
    }

    /// The remote view of `offset` in the region, to hand to a peer.
    pub fn remote(&self, offset_bytes: u64) -> RemoteAddress {
        RemoteAddress {
            address: VirtAddr(self.address.0.saturating_add(offset_bytes)),
            rkey: self.rkey,
        }
    }
}

/// Path MTU: the largest payload of one packet.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Mtu(u32);

impl Mtu {
    pub const MTU_256: Mtu = Mtu(256);
    pub const MTU_1024: Mtu = Mtu(1024);
    pub const MTU_4096: Mtu = Mtu(4096);

    pub fn new(bytes: u32) -> Result<Mtu, VerbsError> {
        match bytes {
            256 | 512 | 1024 | 2048 | 4096 => Ok(Mtu(bytes)),
            other => Err(VerbsError::InvalidMtu(other)),
        }
    }

    pub const fn bytes(self) -> u32 {
        self.0
    }

    /// Packets a message of `length_bytes` needs (at least one).
    pub const fn packets_for(self, length_bytes: u32) -> u32 {
        if length_bytes == 0 {
            1
        } else {
            length_bytes.div_ceil(self.0)
        }
    }
}

/// One local buffer of a work request.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ScatterGatherElement {
    pub address: VirtAddr,
    pub length_bytes: u32,
    pub lkey: Lkey,
}

/// The most scatter/gather elements one work request may carry.
pub const MAX_SCATTER_GATHER_ELEMENTS: usize = 4;

/// A bounded, inline list of scatter/gather elements: no allocation per
/// work request.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ScatterGatherList {
    elements: [ScatterGatherElement; MAX_SCATTER_GATHER_ELEMENTS],
    count: usize,
}

impl ScatterGatherList {
    pub fn new(elements: &[ScatterGatherElement]) -> Result<ScatterGatherList, VerbsError> {
        if elements.len() > MAX_SCATTER_GATHER_ELEMENTS {
            return Err(VerbsError::TooManyScatterGatherElements {
                count: elements.len(),
                max: MAX_SCATTER_GATHER_ELEMENTS,
            });
        }
        let mut list = ScatterGatherList::default();
        list.elements[..elements.len()].copy_from_slice(elements);
        list.count = elements.len();
        Ok(list)
    }

    pub fn single(element: ScatterGatherElement) -> ScatterGatherList {
        ScatterGatherList::new(&[element]).expect("one element always fits")
    }

    pub fn as_slice(&self) -> &[ScatterGatherElement] {
        &self.elements[..self.count]
    }

    pub fn total_length_bytes(&self) -> u64 {
        self.as_slice()
            .iter()
            .map(|element| u64::from(element.length_bytes))
            .sum()
    }
}

/// Where a one-sided operation lands on the peer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RemoteAddress {
    pub address: VirtAddr,
    pub rkey: Rkey,
}

impl RemoteAddress {
    /// The address `bytes` further on, under the same key.
    pub fn offset(self, bytes: u64) -> RemoteAddress {
        RemoteAddress {
            address: VirtAddr(self.address.0.saturating_add(bytes)),
            rkey: self.rkey,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SendOperation {
    Send {
        immediate: Option<u32>,
    },
    Write {
        remote: RemoteAddress,
        immediate: Option<u32>,
    },
    Read {
        remote: RemoteAddress,
    },
    CompareSwap {
        remote: RemoteAddress,
        compare: u64,
        swap: u64,
    },
    FetchAdd {
        remote: RemoteAddress,
        add: u64,
    },
}

impl SendOperation {
    pub fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOperation::Read { .. }
                | SendOperation::CompareSwap { .. }
                | SendOperation::FetchAdd { .. }
        )
    }

    /// The remote side of a one-sided operation; `None` for SEND.
    pub fn remote(&self) -> Option<RemoteAddress> {
        match *self {
            SendOperation::Send { .. } => None,
            SendOperation::Write { remote, .. }
            | SendOperation::Read { remote }
            | SendOperation::CompareSwap { remote, .. }
            | SendOperation::FetchAdd { remote, .. } => Some(remote),
        }
    }

    pub fn is_atomic(&self) -> bool {
        matches!(
            self,
            SendOperation::CompareSwap { .. } | SendOperation::FetchAdd { .. }
        )
    }

    pub fn completion_opcode(&self) -> CompletionOpcode {
        match self {
            SendOperation::Send { .. } => CompletionOpcode::Send,
            SendOperation::Write { .. } => CompletionOpcode::RdmaWrite,
            SendOperation::Read { .. } => CompletionOpcode::RdmaRead,
            SendOperation::CompareSwap { .. } => CompletionOpcode::CompareSwap,
            SendOperation::FetchAdd { .. } => CompletionOpcode::FetchAdd,
        }
    }
}

/// A send-queue work request. For READ the local list is the destination;
/// for atomics it is one 8-byte buffer that receives the original value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SendRequest {
    pub work_request_id: u64,
    pub operation: SendOperation,
    pub local: ScatterGatherList,
    /// Unsignaled requests complete silently on success; errors always
    /// produce a completion.
    pub signaled: bool,
    /// Held back until this queue pair's earlier READs and atomics have
    /// completed (`IBV_SEND_FENCE`): a SEND of the buffer a READ fills
    /// must carry what the READ brought, not what was there before.
    pub fence: bool,
    /// Asks the responder for a solicited event (`IBV_SEND_SOLICITED`):
    /// the SE bit of the message's last packet, which wakes a receiver
    /// armed for solicited completions only. Meaningful for SEND and
    /// WRITE with immediate, the requests that complete a receive.
    pub solicited: bool,
}

impl SendRequest {
    pub fn new(
        work_request_id: u64,
        operation: SendOperation,
        local: &[ScatterGatherElement],
    ) -> Result<SendRequest, VerbsError> {
        Ok(SendRequest {
            work_request_id,
            operation,
            local: ScatterGatherList::new(local)?,
            signaled: true,
            fence: false,
            solicited: false,
        })
    }
}

/// A receive work request: where an incoming SEND lands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ReceiveRequest {
    pub work_request_id: u64,
    pub local: ScatterGatherList,
}

impl ReceiveRequest {
    pub fn new(
        work_request_id: u64,
        local: &[ScatterGatherElement],
    ) -> Result<ReceiveRequest, VerbsError> {
        Ok(ReceiveRequest {
            work_request_id,
            local: ScatterGatherList::new(local)?,
        })
    }
}

/// Completion statuses, named after `ibv_wc_status`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum CompletionStatus {
    Success,
    LocalLengthError,
    LocalQueuePairOperationError,
    LocalProtectionError,
    WorkRequestFlushError,
    BadResponseError,
    LocalAccessError,
    RemoteInvalidRequestError,
    RemoteAccessError,
    RemoteOperationError,
    RetryExceeded,
    ReceiverNotReadyRetryExceeded,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum CompletionOpcode {
    Send,
    RdmaWrite,
    RdmaRead,
    CompareSwap,
    FetchAdd,
    Receive,
    ReceiveRdmaWithImmediate,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct WorkCompletion {
    pub work_request_id: u64,
    pub status: CompletionStatus,
    pub opcode: CompletionOpcode,
    pub qpn: Qpn,
    /// Bytes received, for receive completions.
    pub byte_len: u32,
    pub immediate: Option<u32>,
    /// A receive completion of a message whose sender asked for a
    /// solicited event (its last packet's SE bit).
    pub solicited: bool,
}

/// A queue pair's path and flow attributes that a program sets as it
/// connects it (`ibv_modify_qp`'s `path_mtu`, `max_rd_atomic`,
/// `max_dest_rd_atomic` and `min_rnr_timer`); `None` keeps what it has.
/// The path MTU and the READs and atomics it serves size how it segments
/// and what it keeps to answer again, so they are fixed once it is ready
/// to send or has received a request.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct PathAttributes {
    pub path_mtu: Option<Mtu>,
    /// Outstanding READ and atomic requests it may issue.
    pub max_read_atomic: Option<usize>,
    /// Outstanding READ and atomic requests it serves.
    pub max_destination_read_atomic: Option<usize>,
    /// The wait its RNR NAKs ask of a requester.
    pub min_rnr_timer: Option<Duration>,
}

impl PathAttributes {
    /// These values, for the attributes `set` names only: what to put
    /// back after `set` was applied and what followed failed.
    pub fn for_the_attributes_of(&self, set: &PathAttributes) -> PathAttributes {
        PathAttributes {
            path_mtu: set.path_mtu.and(self.path_mtu),
            max_read_atomic: set.max_read_atomic.and(self.max_read_atomic),
            max_destination_read_atomic: set
                .max_destination_read_atomic
                .and(self.max_destination_read_atomic),
            min_rnr_timer: set.min_rnr_timer.and(self.min_rnr_timer),
        }
    }
}

/// What a peer needs to connect to a queue pair: the out-of-band exchange
/// that `rdma_cm` or a TCP side channel performs on real hardware.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct QueuePairEndpoint {
    pub qpn: Qpn,
    pub address: Ipv4Address,
    pub mac: MacAddress,
    pub initial_psn: Psn,
}

/// What `ibv_query_qp` tells of a queue pair: its state, its peer and
/// where each direction stands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct QueuePairStatus {
    pub state: QueuePairState,
    pub remote: Option<QueuePairEndpoint>,
    /// The oldest PSN of this side's requests the peer has not executed
    /// (`sq_psn` to resume from).
    pub resume_psn: Psn,
    /// The PSN this side's responder expects next (`rq_psn`).
    pub expected_psn: Psn,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum QueuePairState {
    Reset,
    Init,
    ReadyToReceive,
    ReadyToSend,
    Error,
}

/// Queue-pair attributes, chosen before the handshake.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct QueuePairBuilder {
    pub protection_domain: ProtectionDomain,
    pub send_completion_queue: CompletionQueue,
    pub receive_completion_queue: CompletionQueue,
    pub shared_receive_queue: Option<SharedReceiveQueue>,
    pub send_queue_depth: usize,
    pub receive_queue_depth: usize,
    pub path_mtu: Mtu,
    /// Go-back-N retransmission timeout.
    pub timeout: Duration,
    /// Retransmissions after a timeout or sequence error before giving up (0..=7).
    pub retry_count: u8,
    /// Retries after RNR NAKs (0..=7; 7 means forever, as in IB).
    pub rnr_retry: u8,
    /// Wait this responder asks of a requester in its RNR NAKs.
    pub min_rnr_timer: Duration,
    /// Outstanding READ/atomic requests this side may issue.
    pub max_read_atomic: usize,
    /// Outstanding READ/atomic requests this side serves (replay cache size).
    pub max_destination_read_atomic: usize,
    /// Fixed initial send PSN; drawn from the device otherwise.
    pub initial_psn: Option<Psn>,
    /// What remote peers may do through this queue pair, beside what each
    /// region allows (`ibv_modify_qp`'s `qp_access_flags`): a READ, WRITE
    /// or atomic the queue pair does not allow gets a remote access NAK
    /// whatever the key. Only the remote flags count.
    pub remote_access: AccessFlags,
    /// How a send request whose local buffers fail their checks (a key
    /// no region has, another protection domain's region, a range past
    /// the region, a READ into memory without local write) is told.
    pub local_faults: LocalFaults,
}

/// How a queue pair reports a send request whose local buffers fail their
/// checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LocalFaults {
    /// The post is refused with a typed error, and nothing is queued:
    /// Remora's own API.
    #[default]
    RefusedAtPost,
    /// The post is taken, and the request completes in its turn with
    /// [`CompletionStatus::LocalProtectionError`], the queue pair then in
    /// error, as mlx5 reports it (`IBV_WC_LOC_PROT_ERR`), which
    /// unmodified verbs programs and test suites expect.
    Completed,
}

impl QueuePairBuilder {
    pub fn new(
        protection_domain: ProtectionDomain,
        send_completion_queue: CompletionQueue,
        receive_completion_queue: CompletionQueue,
    ) -> QueuePairBuilder {
        QueuePairBuilder {
            protection_domain,
            send_completion_queue,
            receive_completion_queue,
            shared_receive_queue: None,
            send_queue_depth: 128,
            receive_queue_depth: 128,
            path_mtu: Mtu::MTU_4096,
            timeout: Duration::from_millis(1),
            retry_count: 7,
            rnr_retry: 7,
            min_rnr_timer: Duration::from_micros(20),
            max_read_atomic: 16,
            max_destination_read_atomic: 16,
            initial_psn: None,
            remote_access: AccessFlags::ALL,
            local_faults: LocalFaults::RefusedAtPost,
        }
    }
}

/// A queue pair that exists but has not yet met its peer.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PreparedQueuePair {
    pub qpn: Qpn,
    pub endpoint: QueuePairEndpoint,
}

/// A connected queue pair.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct QueuePair(pub Qpn);

/// Explicit state transitions, as `ibv_modify_qp` performs them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum QueuePairTransition {
    Init,
    ReadyToReceive {
        remote: QueuePairEndpoint,
    },
    ReadyToSend,
    /// RTR → RTS with the send PSN set (`IBV_QP_SQ_PSN`) rather than the
    /// queue pair's initial one.
    ReadyToSendFrom {
        send_psn: Psn,
    },
    Error,
    Reset,
}

/// A UDP port a host opened on its device for plain datagrams.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct DatagramPort(pub(crate) u32);

/// A datagram taken from a port: who sent it and how long it is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct ReceivedDatagram {
    pub from: remora_wire::datagram::DatagramEnd,
    pub length: usize,
}

/// The data path of the verbs: what an application does for every
/// request, posting work and taking completions. Every device has it (it
/// is [`Verbs`]'s supertrait); so do the lock-free queues through which
/// an application thread of the embedded rack reaches its NIC without the
/// NIC's lock (`remora_rack::endpoint::AppQueues`), so code that only
/// moves data is written once for both.
pub trait DataPath {
    /// Posts a send-queue work request; a full send queue is
    /// [`VerbsError::QueueFull`].
    fn post_send(&mut self, queue_pair: QueuePair, request: SendRequest) -> Result<(), VerbsError>;
    /// Posts a receive buffer; a full receive queue is
    /// [`VerbsError::QueueFull`].
    fn post_receive(
        &mut self,
        queue_pair: QueuePair,
        request: ReceiveRequest,
    ) -> Result<(), VerbsError>;
    /// Takes the oldest completion of `queue`, if any.
    fn poll_completion(
        &mut self,
        queue: CompletionQueue,
    ) -> Result<Option<WorkCompletion>, VerbsError>;
}

/// The verbs of a device, shaped after the `ibverbs` crate.
pub trait Verbs: DataPath {
    fn alloc_protection_domain(&mut self) -> Result<ProtectionDomain, VerbsError>;
    fn register_memory(
        &mut self,
        protection_domain: ProtectionDomain,
        length_bytes: u64,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError>;
    /// Registers memory the application keeps a handle on and reads and
    /// writes directly, with no verb and no lock, while the NIC DMAs into
    /// it (`ibv_reg_mr` on the application's own pages).
    fn register_host_memory(
        &mut self,
        protection_domain: ProtectionDomain,
        memory: HostMemory,
        access: AccessFlags,
    ) -> Result<MemoryRegion, VerbsError>;
    fn deregister_memory(&mut self, lkey: Lkey) -> Result<(), VerbsError>;
    fn create_completion_queue(&mut self, depth: usize) -> Result<CompletionQueue, VerbsError>;
    fn create_shared_receive_queue(
        &mut self,
        protection_domain: ProtectionDomain,
        depth: usize,
    ) -> Result<SharedReceiveQueue, VerbsError>;
    fn create_queue_pair(
        &mut self,
        builder: &QueuePairBuilder,
    ) -> Result<PreparedQueuePair, VerbsError>;
    fn modify_queue_pair(
        &mut self,
        qpn: Qpn,
        transition: QueuePairTransition,
    ) -> Result<QueuePairState, VerbsError>;
    /// `ibv_destroy_qp`: the queue pair goes with its work and the
    /// completions still waiting for it, and its place is taken again
    /// (under a number of a later generation).
    fn destroy_queue_pair(&mut self, qpn: Qpn) -> Result<(), VerbsError>;
    /// `ibv_query_qp`.
    fn query_queue_pair(&self, queue_pair: QueuePair) -> Result<QueuePairStatus, VerbsError>;
    /// Brings a queue pair in ERR back to RTS against the same peer, where
    /// the peer's queue pair stands: RESET, INIT, RTR expecting the PSN it
    /// expected, and RTS sending from the oldest PSN the peer has not
    /// executed. Right only when the peer never saw the request that was
    /// refused (a switch refused it in the peer's name), so the peer's
    /// queue pair is still in RTS and in step with this one.
    fn resume_queue_pair(&mut self, queue_pair: QueuePair) -> Result<(), VerbsError> {
        let status = self.query_queue_pair(queue_pair)?;
        let remote = status.remote.ok_or(VerbsError::InvalidTransition {
            from: status.state,
            to: QueuePairState::ReadyToSend,
        })?;
        let qpn = queue_pair.0;
        self.modify_queue_pair(qpn, QueuePairTransition::Reset)?;
        self.modify_queue_pair(qpn, QueuePairTransition::Init)?;
        let remote = QueuePairEndpoint {
            initial_psn: status.expected_psn,
            ..remote
        };
        self.modify_queue_pair(qpn, QueuePairTransition::ReadyToReceive { remote })?;
        let send_psn = status.resume_psn;
        self.modify_queue_pair(qpn, QueuePairTransition::ReadyToSendFrom { send_psn })?;
        Ok(())
    }
    /// INIT → RTR → RTS against `remote`: what `ibverbs`'s `handshake` does.
    fn handshake(
        &mut self,
        prepared: PreparedQueuePair,
        remote: QueuePairEndpoint,
    ) -> Result<QueuePair, VerbsError> {
        self.modify_queue_pair(prepared.qpn, QueuePairTransition::Init)?;
        self.modify_queue_pair(prepared.qpn, QueuePairTransition::ReadyToReceive { remote })?;
        self.modify_queue_pair(prepared.qpn, QueuePairTransition::ReadyToSend)?;
        Ok(QueuePair(prepared.qpn))
    }
    fn post_shared_receive(
        &mut self,
        queue: SharedReceiveQueue,
        request: ReceiveRequest,
    ) -> Result<(), VerbsError>;
    /// The host CPU reading registered memory.
    fn read_local(&self, lkey: Lkey, address: VirtAddr, into: &mut [u8]) -> Result<(), VerbsError>;
    /// The host CPU writing registered memory.
    fn write_local(&mut self, lkey: Lkey, address: VirtAddr, from: &[u8])
        -> Result<(), VerbsError>;
    /// Opens UDP port `udp_port` for plain datagrams, with an inbox of
    /// `depth` (beyond which arrivals are dropped and counted).
    fn open_datagram_port(
        &mut self,
        udp_port: u16,
        depth: usize,
    ) -> Result<DatagramPort, VerbsError>;
    /// Queues a datagram from `port` to `to`.
    fn send_datagram(
        &mut self,
        port: DatagramPort,
        to: remora_wire::datagram::DatagramEnd,
        payload: &[u8],
    ) -> Result<(), VerbsError>;
    /// Takes the oldest datagram that reached `port`, into `into`.
    fn receive_datagram(
        &mut self,
        port: DatagramPort,
        into: &mut [u8],
    ) -> Result<Option<ReceivedDatagram>, VerbsError>;
}

/// Typed errors for bad local arguments. Remote misbehaviour never shows
/// up here: it becomes a NAK on the wire or a completion status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    #[error("the device behind these queues is gone")]
    DeviceGone,
    #[error("unknown datagram port")]
    UnknownDatagramPort,
    #[error("UDP port {0} is RoCEv2's or already open")]
    DatagramPortTaken(u16),
    #[error("a datagram of {length} bytes is past {max}")]
    DatagramTooLarge { length: usize, max: usize },
    #[error("too many {kind} (at most {max})")]
    TooManyObjects { kind: &'static str, max: usize },
    #[error("operation {operation} is not allowed in state {state:?}")]
    InvalidState {
        operation: &'static str,
        state: QueuePairState,
    },
    #[error("{attribute} cannot change once the queue pair sends or has received a request")]
    AttributeFixed { attribute: &'static str },
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
    #[error("the {kind} is still used by a queue pair")]
    QueueInUse { kind: &'static str },
}
