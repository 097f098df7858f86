//! Protection domains, memory regions, completion queues and channels,
//! shared receive queues, queue pairs and address handles.

use super::data_path::{self, PendingRequest};
use super::device::{address_of, node_of, MAX_QUEUE_DEPTH, MAX_SCATTER_GATHER};
use super::{errno_of, set_errno};
use crate::abi::*;
use crate::foreign_memory::ForeignMemory;
use crate::node::{mac_for, Node};
use remora_rnic::{
    AccessFlags, CompletionQueue, MemoryRegion, ProtectionDomain, QueuePairBuilder,
    QueuePairEndpoint, QueuePairState, QueuePairTransition, SharedReceiveQueue, Verbs, VerbsError,
};
use remora_wire::{Ipv4Address, Psn, Qpn, VirtAddr};
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

/// The largest inline payload a queue pair accepts.
pub(super) const MAX_INLINE_BYTES: u32 = 256;

/// Boxes `object` and hands the program a pointer to its first field.
fn hand_out<T, C>(object: T) -> *mut C {
    Box::into_raw(Box::new(object)).cast::<C>()
}

/// Takes back what [`hand_out`] gave: the program destroys the object.
///
/// # Safety
/// `pointer` came from `hand_out::<T, _>` and is not used again.
unsafe fn take_back<T, C>(pointer: *mut C) -> Box<T> {
    // SAFETY: the caller's promise.
    unsafe { Box::from_raw(pointer.cast::<T>()) }
}

/// The object a program's pointer stands for.
///
/// # Safety
/// `pointer` came from `hand_out::<T, _>` and is not yet destroyed.
pub(super) unsafe fn object<'a, T, C>(pointer: *mut C) -> &'a mut T {
    // SAFETY: the caller's promise; `T` is repr(C) with `C` first.
    unsafe { &mut *pointer.cast::<T>() }
}

fn null_with<T>(errno: i32) -> *mut T {
    set_errno(errno);
    std::ptr::null_mut()
}

#[repr(C)]
pub(super) struct PdObject {
    pub pd: ibv_pd,
    pub handle: ProtectionDomain,
}

pub(super) unsafe fn alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    if context.is_null() {
        return null_with(libc::EINVAL);
    }
    // SAFETY: a live context.
    let node = unsafe { node_of(context) };
    match node.with_device(|rnic| rnic.alloc_protection_domain()) {
        Ok(handle) => hand_out(PdObject {
            pd: ibv_pd { context, handle: 0 },
            handle,
        }),
        Err(error) => null_with(errno_of(&error)),
    }
}

pub(super) unsafe fn dealloc_pd(pd: *mut ibv_pd) -> c_int {
    if pd.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the program gives the PD up.
    drop(unsafe { take_back::<PdObject, _>(pd) });
    0
}

#[repr(C)]
pub(super) struct MrObject {
    pub mr: ibv_mr,
    pub region: MemoryRegion,
}

fn access_of(flags: u32) -> AccessFlags {
    let mut access = AccessFlags::NONE;
    for (bit, flag) in [
        (IBV_ACCESS_LOCAL_WRITE, AccessFlags::LOCAL_WRITE),
        (IBV_ACCESS_REMOTE_WRITE, AccessFlags::REMOTE_WRITE),
        (IBV_ACCESS_REMOTE_READ, AccessFlags::REMOTE_READ),
        (IBV_ACCESS_REMOTE_ATOMIC, AccessFlags::REMOTE_ATOMIC),
    ] {
        if flags & bit != 0 {
            access = access | flag;
        }
    }
    access
}

/// Flags Remora does not implement: a real provider without them refuses
/// with EOPNOTSUPP (on-demand paging, zero-based, memory windows).
const UNSUPPORTED_ACCESS: u32 = IBV_ACCESS_ON_DEMAND | IBV_ACCESS_ZERO_BASED | IBV_ACCESS_MW_BIND;

pub(super) unsafe fn reg_mr_iova(
    pd: *mut ibv_pd,
    address: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    if pd.is_null() || address.is_null() || length == 0 {
        return null_with(libc::EINVAL);
    }
    let access_bits = access as u32;
    if access_bits & UNSUPPORTED_ACCESS != 0 {
        return null_with(libc::EOPNOTSUPP);
    }
    // SAFETY: a live PD.
    let pd_object = unsafe { object::<PdObject, _>(pd) };
    // SAFETY: ibv_reg_mr's contract is ForeignMemory's: the program keeps
    // the range mapped until ibv_dereg_mr and respects posted requests.
    let memory = unsafe { ForeignMemory::new(address.cast(), length) };
    // SAFETY: a PD's context is live while the PD is.
    let node = unsafe { node_of(pd_object.pd.context) };
    let registered = node.with_device(|rnic| {
        rnic.register_external_memory(
            pd_object.handle,
            Box::new(memory),
            VirtAddr(iova),
            access_of(access_bits),
        )
    });
    match registered {
        Ok(region) => hand_out(MrObject {
            mr: ibv_mr {
                context: pd_object.pd.context,
                pd,
                addr: address,
                length,
                handle: region.lkey.0,
                lkey: region.lkey.0,
                rkey: region.rkey.0,
            },
            region,
        }),
        Err(error) => null_with(errno_of(&error)),
    }
}

pub(super) unsafe fn dereg_mr(mr: *mut ibv_mr) -> c_int {
    if mr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live MR.
    let mr_object = unsafe { object::<MrObject, _>(mr) };
    // SAFETY: its context is live.
    let node = unsafe { node_of(mr_object.mr.context) };
    match node.with_device(|rnic| rnic.deregister_memory(mr_object.region.lkey)) {
        Ok(()) => {
            // SAFETY: the program gives the MR up.
            drop(unsafe { take_back::<MrObject, _>(mr) });
            0
        }
        Err(error) => errno_of(&error),
    }
}

/// A completion channel: an eventfd that counts events (semaphore mode,
/// so one read takes one event) and the queues they came from.
pub(super) struct ChannelShared {
    events: OwnedFd,
    ready: Mutex<VecDeque<usize>>,
}

impl ChannelShared {
    fn raise(&self, cq: *mut ibv_cq) {
        self.ready
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push_back(cq as usize);
        let _ = rustix::io::write(&self.events, &1u64.to_ne_bytes());
    }
}

#[repr(C)]
pub(super) struct ChannelObject {
    pub channel: ibv_comp_channel,
    pub shared: Arc<ChannelShared>,
}

pub(super) unsafe fn create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel {
    if context.is_null() {
        return null_with(libc::EINVAL);
    }
    let flags = rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::SEMAPHORE;
    let events = match rustix::event::eventfd(0, flags) {
        Ok(fd) => fd,
        Err(error) => return null_with(error.raw_os_error()),
    };
    let fd = events.as_raw_fd();
    hand_out(ChannelObject {
        channel: ibv_comp_channel {
            context,
            fd,
            refcnt: 0,
        },
        shared: Arc::new(ChannelShared {
            events,
            ready: Mutex::new(VecDeque::new()),
        }),
    })
}

pub(super) unsafe fn destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    if channel.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live channel.
    if unsafe { object::<ChannelObject, _>(channel) }
        .channel
        .refcnt
        > 0
    {
        return libc::EBUSY;
    }
    // SAFETY: the program gives it up.
    drop(unsafe { take_back::<ChannelObject, _>(channel) });
    0
}

/// `ibv_get_cq_event`: blocks on the channel's descriptor (or fails with
/// EAGAIN if the program made it non-blocking), then names the queue.
pub(super) unsafe fn get_cq_event(
    channel: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    context_out: *mut *mut c_void,
) -> c_int {
    if channel.is_null() || cq_out.is_null() || context_out.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: a live channel.
    let shared = Arc::clone(&unsafe { object::<ChannelObject, _>(channel) }.shared);
    let mut counter = [0u8; 8];
    if let Err(error) = rustix::io::read(&shared.events, &mut counter) {
        set_errno(error.raw_os_error());
        return -1;
    }
    let cq = shared
        .ready
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .pop_front();
    let Some(cq) = cq else {
        set_errno(libc::EAGAIN);
        return -1;
    };
    let cq = cq as *mut ibv_cq;
    // SAFETY: the queue was live when armed, and a program acks its events
    // before destroying it; the out-parameters are the caller's.
    unsafe {
        *cq_out = cq;
        *context_out = (*cq).cq_context;
    }
    0
}

#[repr(C)]
pub(super) struct CqObject {
    pub cq: ibv_cq,
    pub queue: CompletionQueue,
    pub channel: Option<Arc<ChannelShared>>,
    pub events_acknowledged: u32,
}

pub(super) unsafe fn create_cq(
    context: *mut ibv_context,
    entries: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    vector: c_int,
) -> *mut ibv_cq {
    if context.is_null() || !(1..=MAX_QUEUE_DEPTH).contains(&entries) || vector != 0 {
        return null_with(libc::EINVAL);
    }
    // SAFETY: a live context.
    let node = unsafe { node_of(context) };
    let queue = match node.with_device(|rnic| rnic.create_completion_queue(entries as usize)) {
        Ok(queue) => queue,
        Err(error) => return null_with(errno_of(&error)),
    };
    let shared = if channel.is_null() {
        None
    } else {
        // SAFETY: a live channel.
        let channel_object = unsafe { object::<ChannelObject, _>(channel) };
        channel_object.channel.refcnt += 1;
        Some(Arc::clone(&channel_object.shared))
    };
    hand_out(CqObject {
        cq: ibv_cq {
            context,
            channel,
            cq_context,
            handle: 0,
            cqe: entries,
            ..Default::default()
        },
        queue,
        channel: shared,
        events_acknowledged: 0,
    })
}

pub(super) unsafe fn destroy_cq(cq: *mut ibv_cq) -> c_int {
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live CQ.
    let cq_object = unsafe { object::<CqObject, _>(cq) };
    // SAFETY: its context is live.
    unsafe { node_of(cq_object.cq.context) }.disarm(cq_object.queue);
    if !cq_object.cq.channel.is_null() {
        // SAFETY: a CQ's channel outlives it (destroying it first is EBUSY).
        unsafe { object::<ChannelObject, _>(cq_object.cq.channel) }
            .channel
            .refcnt -= 1;
    }
    // SAFETY: the program gives it up. The device's queue stays allocated:
    // the soft RNIC does not reuse completion queue numbers.
    drop(unsafe { take_back::<CqObject, _>(cq) });
    0
}

pub(super) unsafe fn ack_cq_events(cq: *mut ibv_cq, count: u32) {
    if !cq.is_null() {
        // SAFETY: a live CQ.
        let cq_object = unsafe { object::<CqObject, _>(cq) };
        cq_object.events_acknowledged = cq_object.events_acknowledged.wrapping_add(count);
        cq_object.cq.comp_events_completed = cq_object.events_acknowledged;
    }
}

/// `req_notify_cq`: the next completion raises an event on the channel.
pub(super) unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    let _ = solicited_only;
    if cq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live CQ.
    let cq_object = unsafe { object::<CqObject, _>(cq) };
    let Some(channel) = cq_object.channel.clone() else {
        return libc::EINVAL;
    };
    let cq_address = cq as usize;
    // SAFETY: its context is live.
    let node = unsafe { node_of(cq_object.cq.context) };
    node.arm(
        cq_object.queue,
        Arc::new(move || channel.raise(cq_address as *mut ibv_cq)),
    );
    0
}

#[repr(C)]
pub(super) struct SrqObject {
    pub srq: ibv_srq,
    pub queue: SharedReceiveQueue,
}

pub(super) unsafe fn create_srq(
    pd: *mut ibv_pd,
    attributes: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    if pd.is_null() || attributes.is_null() {
        return null_with(libc::EINVAL);
    }
    // SAFETY: a live PD and the caller's attributes.
    let (pd_object, attributes) = unsafe { (object::<PdObject, _>(pd), &mut *attributes) };
    if attributes.attr.max_sge > MAX_SCATTER_GATHER as u32 {
        return null_with(libc::EINVAL);
    }
    // SAFETY: a PD's context is live.
    let node = unsafe { node_of(pd_object.pd.context) };
    let depth = attributes.attr.max_wr.max(1) as usize;
    match node.with_device(|rnic| rnic.create_shared_receive_queue(pd_object.handle, depth)) {
        Ok(queue) => {
            attributes.attr.max_sge = MAX_SCATTER_GATHER as u32;
            hand_out(SrqObject {
                srq: ibv_srq {
                    context: pd_object.pd.context,
                    srq_context: attributes.srq_context,
                    pd,
                    ..Default::default()
                },
                queue,
            })
        }
        Err(error) => null_with(errno_of(&error)),
    }
}

pub(super) unsafe fn destroy_srq(srq: *mut ibv_srq) -> c_int {
    if srq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the program gives it up.
    drop(unsafe { take_back::<SrqObject, _>(srq) });
    0
}

/// Where a queue pair copies inline payloads: a ring of slots in a region
/// inside the device, one slot per send-queue entry. A slot is reused only
/// after the send queue has wrapped, by which time the request that used
/// it has left the queue.
pub(super) struct InlineStaging {
    pub region: MemoryRegion,
    pub slots: u64,
    pub next: u64,
}

#[repr(C)]
pub(super) struct QpObject {
    pub qp: ibv_qp_ex,
    pub qpn: Qpn,
    pub pd: ProtectionDomain,
    pub signal_all: bool,
    pub capabilities: ibv_qp_cap,
    pub inline: Option<InlineStaging>,
    /// Requests built through the `ibv_wr_*` calls, posted by `wr_complete`.
    pub pending: Vec<PendingRequest>,
    pub pending_error: Option<c_int>,
    /// What the program asked at RTR and RTS, returned by `query_qp`.
    pub attributes: ibv_qp_attr,
}

/// The send operations `ibv_qp_ex` may be asked for (`send_ops_flags`).
const SUPPORTED_SEND_OPS: u64 = (IBV_QP_EX_WITH_RDMA_WRITE
    | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM
    | IBV_QP_EX_WITH_SEND
    | IBV_QP_EX_WITH_SEND_WITH_IMM
    | IBV_QP_EX_WITH_RDMA_READ
    | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP
    | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) as u64;

pub(super) unsafe fn create_qp(pd: *mut ibv_pd, attributes: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    if pd.is_null() || attributes.is_null() {
        return null_with(libc::EINVAL);
    }
    // SAFETY: the caller's attributes.
    let legacy = unsafe { &mut *attributes };
    let mut extended = ibv_qp_init_attr_ex {
        qp_context: legacy.qp_context,
        send_cq: legacy.send_cq,
        recv_cq: legacy.recv_cq,
        srq: legacy.srq,
        cap: legacy.cap,
        qp_type: legacy.qp_type,
        sq_sig_all: legacy.sq_sig_all,
        comp_mask: IBV_QP_INIT_ATTR_PD,
        pd,
        ..Default::default()
    };
    // SAFETY: a live PD.
    let context = unsafe { object::<PdObject, _>(pd) }.pd.context;
    // SAFETY: as create_qp_extended's contract.
    let qp = unsafe { create_qp_extended(context, &mut extended) };
    legacy.cap = extended.cap;
    qp
}

pub(super) unsafe extern "C" fn create_qp_extended(
    context: *mut ibv_context,
    attributes: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    if context.is_null() || attributes.is_null() {
        return null_with(libc::EINVAL);
    }
    // SAFETY: the caller's attributes.
    let attributes = unsafe { &mut *attributes };
    match build_queue_pair(context, attributes) {
        Ok(qp) => qp,
        Err(errno) => null_with(errno),
    }
}

fn check_queue_pair_request(attributes: &ibv_qp_init_attr_ex) -> Result<(), c_int> {
    let known_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    if attributes.comp_mask & !known_mask != 0 || attributes.create_flags != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    if attributes.qp_type != IBV_QPT_RC {
        // UD, UC, XRC and raw packet queue pairs are not implemented.
        return Err(libc::EOPNOTSUPP);
    }
    if attributes.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0
        && attributes.send_ops_flags & !SUPPORTED_SEND_OPS != 0
    {
        return Err(libc::EOPNOTSUPP);
    }
    let capabilities = &attributes.cap;
    let sge_limit = MAX_SCATTER_GATHER as u32;
    if attributes.pd.is_null()
        || attributes.send_cq.is_null()
        || attributes.recv_cq.is_null()
        || capabilities.max_send_sge > sge_limit
        || capabilities.max_recv_sge > sge_limit
        || capabilities.max_inline_data > MAX_INLINE_BYTES
        || capabilities.max_send_wr > MAX_QUEUE_DEPTH as u32
        || capabilities.max_recv_wr > MAX_QUEUE_DEPTH as u32
    {
        return Err(libc::EINVAL);
    }
    Ok(())
}

fn build_queue_pair(
    context: *mut ibv_context,
    attributes: &mut ibv_qp_init_attr_ex,
) -> Result<*mut ibv_qp, c_int> {
    check_queue_pair_request(attributes)?;
    // SAFETY: checked non-null above; live objects of this context.
    let (pd, send_cq, recv_cq) = unsafe {
        (
            object::<PdObject, _>(attributes.pd).handle,
            object::<CqObject, _>(attributes.send_cq).queue,
            object::<CqObject, _>(attributes.recv_cq).queue,
        )
    };
    let srq = (!attributes.srq.is_null())
        // SAFETY: a live SRQ.
        .then(|| unsafe { object::<SrqObject, _>(attributes.srq) }.queue);
    let mut builder = QueuePairBuilder::new(pd, send_cq, recv_cq);
    builder.shared_receive_queue = srq;
    builder.send_queue_depth = attributes.cap.max_send_wr.max(1) as usize;
    builder.receive_queue_depth = attributes.cap.max_recv_wr.max(1) as usize;
    // SAFETY: a live context.
    let node = unsafe { node_of(context) };
    let inline_bytes = u64::from(attributes.cap.max_inline_data);
    let created = node.with_device(|rnic| -> Result<_, VerbsError> {
        let prepared = rnic.create_queue_pair(&builder)?;
        let inline = if inline_bytes > 0 {
            let slots = builder.send_queue_depth as u64;
            let region = rnic.register_memory(
                pd,
                slots * u64::from(MAX_INLINE_BYTES),
                AccessFlags::LOCAL_WRITE,
            )?;
            Some(InlineStaging {
                region,
                slots,
                next: 0,
            })
        } else {
            None
        };
        Ok((prepared, inline))
    });
    let (prepared, inline) = created.map_err(|error| errno_of(&error))?;
    attributes.cap.max_send_sge = MAX_SCATTER_GATHER as u32;
    attributes.cap.max_recv_sge = MAX_SCATTER_GATHER as u32;
    if attributes.cap.max_inline_data > 0 {
        attributes.cap.max_inline_data = MAX_INLINE_BYTES;
    }
    let qp_num = prepared.qpn.value();
    let mut qp = ibv_qp_ex {
        qp_base: ibv_qp {
            context,
            qp_context: attributes.qp_context,
            pd: attributes.pd,
            send_cq: attributes.send_cq,
            recv_cq: attributes.recv_cq,
            srq: attributes.srq,
            handle: qp_num,
            qp_num,
            state: IBV_QPS_RESET,
            qp_type: IBV_QPT_RC,
            ..Default::default()
        },
        ..Default::default()
    };
    data_path::install_request_builder(&mut qp);
    Ok(hand_out(QpObject {
        qp,
        qpn: prepared.qpn,
        pd,
        signal_all: attributes.sq_sig_all != 0,
        capabilities: attributes.cap,
        inline,
        pending: Vec::new(),
        pending_error: None,
        attributes: ibv_qp_attr::default(),
    }))
}

pub(super) unsafe fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live QP.
    let qp_object = unsafe { object::<QpObject, _>(qp) };
    // SAFETY: its context is live.
    let node = unsafe { node_of(qp_object.qp.qp_base.context) };
    let qpn = qp_object.qpn;
    let inline = qp_object.inline.as_ref().map(|staging| staging.region.lkey);
    // Flush what is outstanding; the device keeps the queue pair's slot.
    let _ = node.with_device(|rnic| {
        let _ = rnic.modify_queue_pair(qpn, QueuePairTransition::Error);
        inline.map(|lkey| rnic.deregister_memory(lkey))
    });
    // SAFETY: the program gives it up.
    drop(unsafe { take_back::<QpObject, _>(qp) });
    0
}

pub(super) unsafe fn qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    // The QP object opens with an ibv_qp_ex whose builder calls are filled
    // in, whatever call created it.
    qp.cast()
}

/// The peer a queue pair is connected to: the GID's address, or, for a
/// program that connects by LID alone (no GRH), the only peer a
/// point-to-point carrier has.
fn peer_address(node: &Node, route: &ibv_ah_attr) -> Result<Ipv4Address, c_int> {
    if route.is_global != 0 {
        return address_of(&route.grh.dgid).ok_or(libc::EINVAL);
    }
    node.peer_address().ok_or(libc::EINVAL)
}

fn transition_for(
    node: &Node,
    attributes: &ibv_qp_attr,
    mask: u32,
    qpn: Qpn,
) -> Result<Option<QueuePairTransition>, c_int> {
    if mask & IBV_QP_STATE == 0 {
        return Ok(None);
    }
    let transition = match attributes.qp_state {
        IBV_QPS_RESET => QueuePairTransition::Reset,
        IBV_QPS_INIT => QueuePairTransition::Init,
        IBV_QPS_RTR => {
            let required = IBV_QP_AV | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
            if mask & required != required {
                return Err(libc::EINVAL);
            }
            let address = peer_address(node, &attributes.ah_attr)?;
            let remote = QueuePairEndpoint {
                qpn: Qpn::new(attributes.dest_qp_num).ok_or(libc::EINVAL)?,
                address,
                mac: mac_for(address),
                initial_psn: Psn::new(attributes.rq_psn & 0x00ff_ffff),
            };
            QueuePairTransition::ReadyToReceive { remote }
        }
        IBV_QPS_RTS if mask & IBV_QP_SQ_PSN != 0 => QueuePairTransition::ReadyToSendFrom {
            send_psn: Psn::new(attributes.sq_psn & 0x00ff_ffff),
        },
        IBV_QPS_RTS => QueuePairTransition::ReadyToSend,
        IBV_QPS_ERR => QueuePairTransition::Error,
        _ => return Err(libc::EINVAL),
    };
    let _ = qpn;
    Ok(Some(transition))
}

fn state_of(state: QueuePairState) -> ibv_qp_state {
    match state {
        QueuePairState::Reset => IBV_QPS_RESET,
        QueuePairState::Init => IBV_QPS_INIT,
        QueuePairState::ReadyToReceive => IBV_QPS_RTR,
        QueuePairState::ReadyToSend => IBV_QPS_RTS,
        QueuePairState::Error => IBV_QPS_ERR,
    }
}

pub(super) unsafe fn modify_qp(
    qp: *mut ibv_qp,
    attributes: *mut ibv_qp_attr,
    mask: c_int,
) -> c_int {
    if qp.is_null() || attributes.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live QP and the caller's attributes.
    let (qp_object, attributes) = unsafe { (object::<QpObject, _>(qp), &*attributes) };
    let mask = mask as u32;
    // SAFETY: its context is live.
    let node = unsafe { node_of(qp_object.qp.qp_base.context) };
    let qpn = qp_object.qpn;
    let transition = match transition_for(node, attributes, mask, qpn) {
        Ok(transition) => transition,
        Err(errno) => return errno,
    };
    let current = node.inspect(|rnic| rnic.queue_pair_state(qpn));
    let result = match (transition, current) {
        // INIT → INIT re-sets attributes the soft RNIC does not model.
        (Some(QueuePairTransition::Init), Ok(QueuePairState::Init)) | (None, _) => Ok(()),
        (Some(transition), _) => node
            .with_device(|rnic| rnic.modify_queue_pair(qpn, transition))
            .map(|_| ()),
    };
    if let Err(error) = result {
        return errno_of(&error);
    }
    remember_attributes(&mut qp_object.attributes, attributes, mask);
    qp_object.qp.qp_base.state = node
        .inspect(|rnic| rnic.queue_pair_state(qpn))
        .map_or(IBV_QPS_ERR, state_of);
    0
}

/// Copies one attribute from what the program gave into what is kept.
type CopyAttribute<'a> = &'a dyn Fn(&mut ibv_qp_attr);

/// Keeps what `query_qp` reports back.
fn remember_attributes(kept: &mut ibv_qp_attr, given: &ibv_qp_attr, mask: u32) {
    let fields: [(u32, CopyAttribute); 10] = [
        (IBV_QP_PATH_MTU, &|kept| kept.path_mtu = given.path_mtu),
        (IBV_QP_ACCESS_FLAGS, &|kept| {
            kept.qp_access_flags = given.qp_access_flags
        }),
        (IBV_QP_AV, &|kept| kept.ah_attr = given.ah_attr),
        (IBV_QP_DEST_QPN, &|kept| {
            kept.dest_qp_num = given.dest_qp_num
        }),
        (IBV_QP_TIMEOUT, &|kept| kept.timeout = given.timeout),
        (IBV_QP_RETRY_CNT, &|kept| kept.retry_cnt = given.retry_cnt),
        (IBV_QP_RNR_RETRY, &|kept| kept.rnr_retry = given.rnr_retry),
        (IBV_QP_MAX_QP_RD_ATOMIC, &|kept| {
            kept.max_rd_atomic = given.max_rd_atomic
        }),
        (IBV_QP_MAX_DEST_RD_ATOMIC, &|kept| {
            kept.max_dest_rd_atomic = given.max_dest_rd_atomic
        }),
        (IBV_QP_MIN_RNR_TIMER, &|kept| {
            kept.min_rnr_timer = given.min_rnr_timer
        }),
    ];
    for (bit, copy) in fields {
        if mask & bit != 0 {
            copy(kept);
        }
    }
    kept.port_num = 1;
}

pub(super) unsafe fn query_qp(
    qp: *mut ibv_qp,
    attributes: *mut ibv_qp_attr,
    mask: c_int,
    init_attributes: *mut ibv_qp_init_attr,
) -> c_int {
    let _ = mask;
    if qp.is_null() || attributes.is_null() || init_attributes.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live QP.
    let qp_object = unsafe { object::<QpObject, _>(qp) };
    // SAFETY: its context is live.
    let node = unsafe { node_of(qp_object.qp.qp_base.context) };
    let status =
        match node.inspect(|rnic| rnic.query_queue_pair(remora_rnic::QueuePair(qp_object.qpn))) {
            Ok(status) => status,
            Err(error) => return errno_of(&error),
        };
    let mut reported = qp_object.attributes;
    reported.qp_state = state_of(status.state);
    reported.cur_qp_state = reported.qp_state;
    reported.rq_psn = status.expected_psn.value();
    reported.sq_psn = status.resume_psn.value();
    reported.cap = qp_object.capabilities;
    let base = &qp_object.qp.qp_base;
    // SAFETY: the caller's out-parameters.
    unsafe {
        *attributes = reported;
        *init_attributes = ibv_qp_init_attr {
            qp_context: base.qp_context,
            send_cq: base.send_cq,
            recv_cq: base.recv_cq,
            srq: base.srq,
            cap: qp_object.capabilities,
            qp_type: IBV_QPT_RC,
            sq_sig_all: c_int::from(qp_object.signal_all),
        };
    }
    0
}

#[repr(C)]
struct AhObject {
    ah: ibv_ah,
}

/// Address handles exist for programs that make them (perftest does for
/// every connection); an RC queue pair takes its peer from `modify_qp`.
pub(super) unsafe fn create_ah(pd: *mut ibv_pd, attributes: *mut ibv_ah_attr) -> *mut ibv_ah {
    if pd.is_null() || attributes.is_null() {
        return null_with(libc::EINVAL);
    }
    // SAFETY: a live PD.
    let context = unsafe { object::<PdObject, _>(pd) }.pd.context;
    hand_out(AhObject {
        ah: ibv_ah {
            context,
            pd,
            handle: 0,
        },
    })
}

pub(super) unsafe fn destroy_ah(ah: *mut ibv_ah) -> c_int {
    if ah.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the program gives it up.
    drop(unsafe { take_back::<AhObject, _>(ah) });
    0
}

/// Extended operations in the `verbs_context`; the rest stay null, which
/// rdma-core's inline wrappers turn into EOPNOTSUPP.
pub(super) fn install_extended_operations(verbs: &mut verbs_context) {
    verbs.create_qp_ex = Some(create_qp_extended);
}
