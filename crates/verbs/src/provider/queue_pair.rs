//! Queue pairs: creation, the state machine `modify_qp` drives, `query_qp`,
//! posting built requests (with inline payloads staged in the device), and
//! the `ibv_wr_*` work-request builder of `ibv_qp_ex`.

use super::async_events::{Element, Raised};
use super::device::{
    address_of, context_object, node_of, MAX_QUEUE_DEPTH, MAX_READ_ATOMIC, MAX_SCATTER_GATHER,
};
use super::errno_of;
use super::resources::{
    access_of, cq_users, hand_out, null_with, object, pd_users, srq_users, take_back, CqObject,
    PdObject, SrqObject,
};
use super::work_request::{
    element_of, elements, inline_bytes, remote, LocalData, PendingRequest, RequestFlags,
    MAX_INLINE_BYTES,
};
use crate::abi::*;
use crate::node::{mac_for, Awaited, Node};
use remora_rnic::{
    AccessFlags, Lkey, LocalFaults, MemoryRegion, Mtu, PathAttributes, ProtectionDomain, QueuePair,
    QueuePairBuilder, QueuePairEndpoint, QueuePairState, QueuePairTransition, ScatterGatherElement,
    SendOperation, SendRequest, Verbs, VerbsError,
};
use remora_wire::{Ipv4Address, Psn, Qpn, VirtAddr};
use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Where a queue pair copies inline payloads: a ring of slots in a region
/// inside the device, one slot per send-queue entry. A slot is reused only
/// after the send queue has wrapped, by which time the request that used
/// it has left the queue.
pub(super) struct InlineStaging {
    pub region: MemoryRegion,
    pub slots: u64,
    /// The next slot, advanced only under the node's lock (the atomic
    /// lets threads that post on one queue pair share the object).
    pub next: AtomicU64,
}

/// What the `ibv_wr_*` calls have built since `wr_start`.
#[derive(Default)]
pub(super) struct Built {
    /// Requests built, posted by `wr_complete`.
    pub requests: Vec<PendingRequest>,
    /// The first call that failed, which fails `wr_complete`.
    pub error: Option<c_int>,
}

/// A queue pair, shared: threads may call verbs on one queue pair at once
/// (libibverbs' verbs are thread-safe), so it is only ever reached through
/// a shared reference, and what changes after creation sits in a cell, an
/// atomic or a mutex.
#[repr(C)]
pub(super) struct QpObject {
    /// The program's `ibv_qp_ex`: it reads `state` and writes `wr_id` and
    /// `wr_flags` while this library reads those and writes `state`, so
    /// each access goes through the cell's pointer to one field.
    pub qp: UnsafeCell<ibv_qp_ex>,
    pub qpn: Qpn,
    pub pd: ProtectionDomain,
    pub signal_all: bool,
    pub capabilities: ibv_qp_cap,
    pub inline: Option<InlineStaging>,
    /// Held from `wr_start` until `wr_complete` or `wr_abort`: the
    /// provider's per-QP critical section that ibv_wr_post(3) promises.
    pub builder_lock: BuilderLock,
    pub built: Mutex<Built>,
    /// What the program asked at RTR and RTS, returned by `query_qp`.
    pub attributes: Mutex<ibv_qp_attr>,
}

impl QpObject {
    /// The queue pair's context, set at creation and never written after.
    pub fn context(&self) -> *mut ibv_context {
        // SAFETY: a read of one field of the live cell.
        unsafe { (*self.qp.get()).qp_base.context }
    }

    /// A copy of the `ibv_qp` the program sees.
    pub fn base(&self) -> ibv_qp {
        // SAFETY: a read of one field of the live cell.
        unsafe { (*self.qp.get()).qp_base }
    }

    /// Sets the state the program reads in `qp->state`.
    fn set_state(&self, state: ibv_qp_state) {
        // SAFETY: a write of one field of the live cell; rdma-core writes
        // it in `ibv_modify_qp` and `ibv_query_qp` the same way.
        unsafe { (*self.qp.get()).qp_base.state = state }
    }

    /// The `wr_id` and `wr_flags` the program set for the request it is
    /// naming.
    fn request_fields(&self) -> (u64, u32) {
        // SAFETY: reads of two fields of the live cell.
        unsafe { ((*self.qp.get()).wr_id, (*self.qp.get()).wr_flags) }
    }

    fn built(&self) -> MutexGuard<'_, Built> {
        self.built
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn attributes(&self) -> MutexGuard<'_, ibv_qp_attr> {
        self.attributes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A lock held across calls: `wr_start` takes it and returns with it
/// held, `wr_complete` or `wr_abort` gives it back. A guard cannot live
/// across C calls, so this is the holding thread (and how many wait)
/// under a mutex, with a condition variable for the waiting threads.
///
/// A section belongs to the thread that started it: one started on one
/// thread and completed on another (or left by a thread that exits)
/// keeps the lock for good, as ibv_wr_post(3)'s per-thread sections
/// leave it undefined.
#[derive(Default)]
pub(super) struct BuilderLock {
    state: std::sync::Mutex<BuilderState>,
    released: std::sync::Condvar,
}

#[derive(Default)]
struct BuilderState {
    holder: Option<std::thread::ThreadId>,
    /// Threads inside `acquire`: the lock must outlive them.
    waiting: usize,
}

impl BuilderLock {
    fn state(&self) -> std::sync::MutexGuard<'_, BuilderState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until no other thread is building on the queue pair, then
    /// holds it. A thread that starts again while it holds it goes on
    /// holding it (its batch starts over, as before there was a lock),
    /// rather than wait for itself for ever.
    fn acquire(&self) {
        let me = std::thread::current().id();
        let mut state = self.state();
        state.waiting += 1;
        let mut state = self
            .released
            .wait_while(state, |state| {
                state.holder.is_some_and(|thread| thread != me)
            })
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        state.waiting -= 1;
        state.holder = Some(me);
    }

    /// Whether the calling thread holds the lock. Only the holder
    /// releases it, so the answer stays true until this thread releases.
    /// A thread that holds none may not end a section: its `wr_complete`
    /// would post another thread's half-built batch, or race with one
    /// starting.
    fn is_held_here(&self) -> bool {
        self.state().holder == Some(std::thread::current().id())
    }

    /// Ends the calling thread's section (it holds the lock).
    fn release(&self) {
        let mut state = self.state();
        debug_assert_eq!(state.holder, Some(std::thread::current().id()));
        state.holder = None;
        // perftest posts every request through a section: a wake-up
        // (a futex call) only when somebody waits.
        if state.waiting > 0 {
            self.released.notify_one();
        }
    }

    /// Whether a thread holds or waits for the lock: then the queue pair
    /// (and the lock) may not be freed.
    fn is_in_use(&self) -> bool {
        let state = self.state();
        state.holder.is_some() || state.waiting > 0
    }
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
    // As a kernel provider: no remote access until the program grants it
    // with qp_access_flags (which moving to INIT requires).
    builder.remote_access = AccessFlags::NONE;
    // A bad local buffer completes with IBV_WC_LOC_PROT_ERR, as on mlx5,
    // rather than failing the post.
    builder.local_faults = LocalFaults::Completed;
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
            let registered = rnic.register_memory(
                pd,
                slots * u64::from(MAX_INLINE_BYTES),
                AccessFlags::LOCAL_WRITE,
            );
            let region = match registered {
                Ok(region) => region,
                Err(error) => {
                    // The verb fails whole: a queue pair left behind held
                    // its slot, and its CQs and SRQ could never be
                    // destroyed (they counted it as a user).
                    let retired = rnic.retire_queue_pair(prepared.qpn);
                    debug_assert!(retired.is_ok(), "a queue pair just made retires");
                    return Err(error);
                }
            };
            Some(InlineStaging {
                region,
                slots,
                next: AtomicU64::new(0),
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
    // SAFETY: a live context.
    unsafe { context_object(context) }
        .owned()
        .queue_pairs
        .push((
            prepared.qpn,
            inline.as_ref().map(|staging| staging.region.lkey),
        ));
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
    install_request_builder(&mut qp);
    // SAFETY: the objects named were live above.
    unsafe { hold_users(&qp.qp_base, true) };
    let on_srq = !attributes.srq.is_null();
    let handed: *mut ibv_qp = hand_out(QpObject {
        qp: UnsafeCell::new(qp),
        qpn: prepared.qpn,
        pd,
        signal_all: attributes.sq_sig_all != 0,
        capabilities: attributes.cap,
        inline,
        builder_lock: BuilderLock::default(),
        built: Mutex::default(),
        attributes: Mutex::default(),
    });
    if on_srq {
        // SAFETY: just made, on a live context.
        unsafe { watch_for_its_last_receive(handed) };
    }
    Ok(handed)
}

/// For a queue pair on a shared receive queue: once it is in error (by a
/// failure or a modify), `IBV_EVENT_QP_LAST_WQE_REACHED` comes on the
/// context's `async_fd`: it takes no more of the shared queue's receives,
/// and the program may destroy it, which programs wait for. It fires once,
/// and is armed again when the queue pair is reset.
///
/// # Safety
/// `qp` is live, on a live context.
unsafe fn watch_for_its_last_receive(qp: *mut ibv_qp) {
    // SAFETY: the caller's promise.
    let qp_object = unsafe { object::<QpObject, _>(qp) };
    let context = qp_object.context();
    // SAFETY: a live context.
    let events = Arc::clone(&unsafe { context_object(context) }.events);
    let element = Element::QueuePair(qp as usize);
    // SAFETY: a live context.
    unsafe { node_of(context) }.arm(
        Awaited::InError(qp_object.qpn),
        Arc::new(move || {
            events.raise(Raised {
                kind: IBV_EVENT_QP_LAST_WQE_REACHED,
                element,
            })
        }),
    );
}

pub(super) unsafe fn destroy_qp(qp: *mut ibv_qp) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live QP.
    let qp_object = unsafe { object::<QpObject, _>(qp) };
    // SAFETY: its context is live.
    let node = unsafe { node_of(qp_object.context()) };
    // SAFETY: its context is live.
    let events = &unsafe { context_object(qp_object.context()) }.events;
    let element = Element::QueuePair(qp as usize);
    // An event the program took must be acknowledged first, as
    // rdma-core's destroy waits; from here none names it.
    if !events.retire(element) {
        return libc::EBUSY;
    }
    if qp_object.builder_lock.is_in_use() {
        // A thread is between ibv_wr_start and ibv_wr_complete, or waits
        // to be, on the lock that would be freed. (Checked after the wait
        // above, which a thread could have started one in.)
        events.unretire(element);
        return libc::EBUSY;
    }
    let qpn = qp_object.qpn;
    node.unwatch(Awaited::InError(qpn));
    let inline = qp_object.inline.as_ref().map(|staging| staging.region.lkey);
    // Its work goes with it, completions included; a later queue pair
    // takes its slot, under a new number.
    node.with_device(|rnic| retire_with_staging(rnic, qpn, inline));
    events.retired(element);
    // SAFETY: its context is live.
    unsafe { context_object(qp_object.context()) }
        .owned()
        .queue_pairs
        .retain(|(owned, _)| *owned != qpn);
    // SAFETY: a QP's PD, CQs and SRQ outlive it (their destroy is EBUSY).
    unsafe { hold_users(&qp_object.base(), false) };
    // SAFETY: the program gives it up.
    drop(unsafe { take_back::<QpObject, _>(qp) });
    0
}

/// Retires a queue pair on the device, and deregisters its inline
/// staging region if it has one: what a destroy, or a close of its
/// context, takes down. (Either may already be gone: nothing to undo.)
pub(super) fn retire_with_staging(
    rnic: &mut remora_rnic::SoftRnic,
    qpn: Qpn,
    inline: Option<Lkey>,
) {
    let _ = rnic.retire_queue_pair(qpn);
    if let Some(lkey) = inline {
        let _ = rnic.deregister_memory(lkey);
    }
}

/// Counts a QP among the users of its PD, CQs and SRQ (`hold`), or no
/// longer.
///
/// # Safety
/// The objects `qp` names are live.
unsafe fn hold_users(qp: &ibv_qp, hold: bool) {
    // SAFETY: the caller's promise.
    let users = unsafe {
        [
            Some(pd_users(qp.pd)),
            Some(cq_users(qp.send_cq)),
            Some(cq_users(qp.recv_cq)),
            srq_users(qp.srq),
        ]
    };
    for users in users.into_iter().flatten() {
        if hold {
            users.hold();
        } else {
            users.release();
        }
    }
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
    Ok(Some(transition))
}

/// The attributes moving an RC queue pair from `current` to `target`
/// must carry, as the kernel's table has them (`ib_modify_qp_is_ok`; only
/// the required ones: optional extras are taken). A program that left one
/// out got EINVAL from a real provider, and here ran on with defaults: an
/// INIT without access flags left the queue pair open to every remote
/// READ, WRITE and atomic, an RTS without a send PSN kept a random one
/// and failed much later with retries exceeded (found by reading).
fn required_attributes(current: QueuePairState, target: ibv_qp_state) -> u32 {
    match (current, target) {
        (QueuePairState::Reset, IBV_QPS_INIT) => {
            IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS
        }
        (QueuePairState::Init, IBV_QPS_RTR) => {
            IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER
        }
        (QueuePairState::ReadyToReceive, IBV_QPS_RTS) => {
            IBV_QP_SQ_PSN
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_MAX_QP_RD_ATOMIC
        }
        _ => 0,
    }
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
    let node = unsafe { node_of(qp_object.context()) };
    let qpn = qp_object.qpn;
    let transition = match transition_for(node, attributes, mask) {
        Ok(transition) => transition,
        Err(errno) => return errno,
    };
    let current = node.inspect(|rnic| rnic.queue_pair_state(qpn));
    if let (Some(_), Ok(state)) = (transition, &current) {
        let required = required_attributes(*state, attributes.qp_state);
        if mask & required != required {
            return libc::EINVAL;
        }
    }
    let path = match path_attributes_of(attributes, mask) {
        Ok(path) => path,
        Err(errno) => return errno,
    };
    // The path attributes and the move in one hold of the device: no frame
    // reaches the queue pair between them.
    let result = node.with_device(|rnic| {
        let before = rnic.path_attributes(qpn)?;
        rnic.set_path_attributes(qpn, path)?;
        let moved = match (transition, current) {
            // INIT → INIT re-sets attributes the soft RNIC does not model.
            (Some(QueuePairTransition::Init), Ok(QueuePairState::Init)) | (None, _) => Ok(()),
            (Some(transition), _) => rnic.modify_queue_pair(qpn, transition).map(|_| ()),
        };
        if moved.is_err() {
            // A refused modify changes nothing: what it set goes back (it
            // was settable a moment ago, in the same state).
            let _ = rnic.set_path_attributes(qpn, before.for_the_attributes_of(&path));
        }
        moved
    });
    if let Err(error) = result {
        return errno_of(&error);
    }
    if mask & IBV_QP_RNR_RETRY != 0 {
        let rnr_retry = attributes.rnr_retry.min(7);
        if let Err(error) = node.with_device(|rnic| rnic.set_rnr_retry(qpn, rnr_retry)) {
            return errno_of(&error);
        }
    }
    if mask & IBV_QP_ACCESS_FLAGS != 0 {
        let access = access_of(attributes.qp_access_flags);
        if let Err(error) = node.with_device(|rnic| rnic.set_remote_access(qpn, access)) {
            return errno_of(&error);
        }
    }
    let (timeout, retry_count) = retransmission_of(attributes, mask);
    if timeout.is_some() || retry_count.is_some() {
        let set = node.with_device(|rnic| rnic.set_retransmission(qpn, timeout, retry_count));
        if let Err(error) = set {
            return errno_of(&error);
        }
    }
    remember_attributes(&mut qp_object.attributes(), attributes, mask);
    let state = node
        .inspect(|rnic| rnic.queue_pair_state(qpn))
        .map_or(IBV_QPS_ERR, state_of);
    qp_object.set_state(state);
    if state == IBV_QPS_RESET && !qp_object.base().srq.is_null() {
        // Reset, it may be used again: its next error is news.
        // SAFETY: live (above).
        unsafe { watch_for_its_last_receive(qp) };
    }
    0
}

/// The path MTU, READ and atomic limits and RNR timer a program set, if
/// it set them; EINVAL for a value no device takes. A `max_dest_rd_atomic`
/// of 0 serves no READs or atomics (a peer's are refused); a
/// `max_rd_atomic` of 0 is taken as 1. Limits above `max_qp_rd_atom` are
/// EINVAL, as from the kernel.
fn path_attributes_of(attributes: &ibv_qp_attr, mask: u32) -> Result<PathAttributes, c_int> {
    let mut path = PathAttributes::default();
    if mask & IBV_QP_PATH_MTU != 0 {
        let bytes = match attributes.path_mtu {
            IBV_MTU_256 => 256,
            IBV_MTU_512 => 512,
            IBV_MTU_1024 => 1024,
            IBV_MTU_2048 => 2048,
            IBV_MTU_4096 => 4096,
            _ => return Err(libc::EINVAL),
        };
        path.path_mtu = Some(Mtu::new(bytes).map_err(|_| libc::EINVAL)?);
    }
    // The limit query_device reports (max_qp_rd_atom), below the device's.
    let limit = |requested: u8| {
        if c_int::from(requested) > MAX_READ_ATOMIC {
            return Err(libc::EINVAL);
        }
        Ok(Some(usize::from(requested)))
    };
    if mask & IBV_QP_MAX_QP_RD_ATOMIC != 0 {
        // Issuing none would hold every READ and atomic posted for ever:
        // 0 is taken as 1.
        path.max_read_atomic = limit(attributes.max_rd_atomic)?.map(|limit| limit.max(1));
    }
    if mask & IBV_QP_MAX_DEST_RD_ATOMIC != 0 {
        // Serving none refuses a peer's READs and atomics.
        path.max_destination_read_atomic = limit(attributes.max_dest_rd_atomic)?;
    }
    if mask & IBV_QP_MIN_RNR_TIMER != 0 {
        if attributes.min_rnr_timer > 31 {
            return Err(libc::EINVAL);
        }
        path.min_rnr_timer = Some(remora_rnic::rnr_timer_duration(attributes.min_rnr_timer));
    }
    Ok(path)
}

/// The retransmission timeout and retry count a program set, if it set
/// them. The timeout is IB's exponent: 4.096 µs × 2^timeout. Its 0 means
/// "wait forever", which a soft RNIC on carriers that can drop a datagram
/// cannot honour without hanging, so 0 keeps the device's own timeout.
fn retransmission_of(
    attributes: &ibv_qp_attr,
    mask: u32,
) -> (Option<std::time::Duration>, Option<u8>) {
    const TIMEOUT_UNIT_NANOS: u64 = 4096;
    let timeout = (mask & IBV_QP_TIMEOUT != 0 && attributes.timeout != 0).then(|| {
        let exponent = u32::from(attributes.timeout.min(31));
        std::time::Duration::from_nanos(TIMEOUT_UNIT_NANOS << exponent)
    });
    let retry_count = (mask & IBV_QP_RETRY_CNT != 0).then_some(attributes.retry_cnt.min(7));
    (timeout, retry_count)
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
    if qp.is_null() || attributes.is_null() || init_attributes.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live QP.
    let qp_object = unsafe { object::<QpObject, _>(qp) };
    // SAFETY: its context is live.
    let node = unsafe { node_of(qp_object.context()) };
    let status =
        match node.inspect(|rnic| rnic.query_queue_pair(remora_rnic::QueuePair(qp_object.qpn))) {
            Ok(status) => status,
            Err(error) => return errno_of(&error),
        };
    let mut reported = *qp_object.attributes();
    reported.qp_state = state_of(status.state);
    reported.cur_qp_state = reported.qp_state;
    reported.rq_psn = status.expected_psn.value();
    reported.sq_psn = status.resume_psn.value();
    reported.cap = qp_object.capabilities;
    // As rdma-core's `ibv_query_qp`: a query of the state refreshes the
    // one the program reads in `qp->state` (a move to ERR after a failed
    // request is the device's, and nothing else tells the program).
    if mask & IBV_QP_STATE as c_int != 0 {
        qp_object.set_state(reported.qp_state);
    }
    let base = qp_object.base();
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

/// Posts built requests on the device, all or none, then stages their
/// inline bytes.
pub(super) fn post_pending(
    qp_object: &QpObject,
    requests: &[PendingRequest],
) -> Result<(), VerbsError> {
    // SAFETY: a live QP's context is live.
    let node = unsafe { node_of(qp_object.context()) };
    let queue_pair = QueuePair(qp_object.qpn);
    let staging = &qp_object.inline;
    node.with_device(|rnic| {
        let mut built = Vec::with_capacity(requests.len());
        // Each inline request's staging slot and bytes, in posting order.
        let mut inline = Vec::new();
        for pending in requests {
            let staged: [ScatterGatherElement; 1];
            let elements: &[ScatterGatherElement] = match &pending.local {
                LocalData::List(list) => list,
                LocalData::Inline(bytes) if bytes.is_empty() => &[],
                LocalData::Inline(bytes) => {
                    let staging = staging.as_ref().ok_or(VerbsError::MessageTooLong {
                        length_bytes: bytes.len() as u64,
                        max_bytes: 0,
                    })?;
                    let next = staging.next.load(Ordering::Relaxed);
                    let slot = (next + inline.len() as u64) % staging.slots;
                    let element = staging
                        .region
                        .slice(slot * u64::from(MAX_INLINE_BYTES), bytes.len() as u32);
                    inline.push((element, bytes));
                    staged = [element];
                    &staged
                }
            };
            let mut request =
                SendRequest::new(pending.work_request_id, pending.operation, elements)?;
            pending.flags.apply(&mut request);
            built.push(request);
        }
        rnic.post_send_all(queue_pair, built)?;
        // Staged only once the device took the requests: refused ones must
        // neither overwrite a slot a request in flight still sends from
        // nor step the slots out of line with the send queue. The device
        // gathers when it transmits, later, under this same lock's next
        // holder.
        if let Some(staging) = staging {
            for (element, bytes) in inline {
                rnic.write_local(element.lkey, element.address, bytes)?;
                staging.next.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    })
}

/// Fills the `ibv_wr_*` calls of a queue pair.
pub(super) fn install_request_builder(qp: &mut ibv_qp_ex) {
    qp.wr_start = Some(builder::start);
    qp.wr_complete = Some(builder::complete);
    qp.wr_abort = Some(builder::abort);
    qp.wr_rdma_write = Some(builder::rdma_write);
    qp.wr_rdma_write_imm = Some(builder::rdma_write_immediate);
    qp.wr_rdma_read = Some(builder::rdma_read);
    qp.wr_send = Some(builder::send);
    qp.wr_send_imm = Some(builder::send_immediate);
    qp.wr_atomic_cmp_swp = Some(builder::compare_swap);
    qp.wr_atomic_fetch_add = Some(builder::fetch_add);
    qp.wr_set_sge = Some(builder::set_sge);
    qp.wr_set_sge_list = Some(builder::set_sge_list);
    qp.wr_set_inline_data = Some(builder::set_inline_data);
    qp.wr_set_inline_data_list = Some(builder::set_inline_data_list);
    qp.wr_set_ud_addr = Some(builder::set_ud_address);
}

/// The `ibv_wr_*` work-request builder: `wr_start`, one call per request
/// naming its operation (taking `wr_id` and `wr_flags` from the QP), one
/// naming its local data, then `wr_complete` posts them all.
mod builder {
    use super::*;

    /// # Safety
    /// `qp` is a live queue pair of this library.
    pub(super) unsafe fn qp_object<'a>(qp: *mut ibv_qp_ex) -> &'a QpObject {
        // SAFETY: the caller's promise.
        unsafe { object::<QpObject, _>(qp) }
    }

    fn push(qp: &QpObject, operation: SendOperation) {
        let (work_request_id, flags) = qp.request_fields();
        qp.built().requests.push(PendingRequest {
            work_request_id,
            operation,
            local: LocalData::List(Vec::new()),
            flags: RequestFlags::of(flags, qp.signal_all),
        });
    }

    /// Whether the request being built reads into local memory (a READ or
    /// an atomic), which inline data cannot serve.
    fn building_read_or_atomic(qp: &QpObject) -> bool {
        qp.built()
            .requests
            .last()
            .is_some_and(|last| last.operation.is_read_or_atomic())
    }

    fn set_local(qp: &QpObject, local: Result<LocalData, c_int>) {
        let mut built = qp.built();
        let built = &mut *built;
        match (built.requests.last_mut(), local) {
            // Inline data is for SEND and WRITE only (ibv_wr_post(3)): a
            // READ's answer went to the staging slot, and the program's
            // buffer was never written though the READ succeeded.
            (Some(last), Ok(LocalData::Inline(_))) if last.operation.is_read_or_atomic() => {
                built.error = Some(libc::EINVAL)
            }
            (Some(last), Ok(local)) => last.local = local,
            (_, Err(errno)) => built.error = Some(errno),
            (None, _) => built.error = Some(libc::EINVAL),
        }
    }

    /// The queue pair's builder lock, through a shared reference: another
    /// thread may be building on it until this one holds the lock.
    ///
    /// # Safety
    /// `qp` is a live queue pair of this library.
    unsafe fn builder_lock<'a>(qp: *mut ibv_qp_ex) -> &'a BuilderLock {
        // SAFETY: the caller's promise; `QpObject` is repr(C) with its
        // `ibv_qp_ex` first.
        &unsafe { &*qp.cast::<QpObject>() }.builder_lock
    }

    pub(super) unsafe extern "C" fn start(qp: *mut ibv_qp_ex) {
        // SAFETY: the verbs contract: a live queue pair of this library.
        unsafe { builder_lock(qp) }.acquire();
        // SAFETY: the verbs contract; the builder is ours until released.
        *unsafe { qp_object(qp) }.built() = Built::default();
    }

    pub(super) unsafe extern "C" fn complete(qp: *mut ibv_qp_ex) -> c_int {
        // SAFETY: the verbs contract.
        if !unsafe { builder_lock(qp) }.is_held_here() {
            return libc::EINVAL;
        }
        // SAFETY: the verbs contract; this thread holds the builder.
        let qp = unsafe { qp_object(qp) };
        let built = std::mem::take(&mut *qp.built());
        let posted = match built.error {
            Some(errno) => errno,
            None => match post_pending(qp, &built.requests) {
                Ok(()) => 0,
                Err(error) => errno_of(&error),
            },
        };
        qp.builder_lock.release();
        posted
    }

    pub(super) unsafe extern "C" fn abort(qp: *mut ibv_qp_ex) {
        // SAFETY: the verbs contract.
        if !unsafe { builder_lock(qp) }.is_held_here() {
            return;
        }
        // SAFETY: the verbs contract; this thread holds the builder.
        let qp = unsafe { qp_object(qp) };
        *qp.built() = Built::default();
        qp.builder_lock.release();
    }

    pub(super) unsafe extern "C" fn rdma_write(qp: *mut ibv_qp_ex, rkey: u32, address: u64) {
        let operation = SendOperation::Write {
            remote: remote(address, rkey),
            immediate: None,
        };
        // SAFETY: the verbs contract.
        push(unsafe { qp_object(qp) }, operation);
    }

    pub(super) unsafe extern "C" fn rdma_write_immediate(
        qp: *mut ibv_qp_ex,
        rkey: u32,
        address: u64,
        immediate: u32,
    ) {
        let operation = SendOperation::Write {
            remote: remote(address, rkey),
            immediate: Some(u32::from_be(immediate)),
        };
        // SAFETY: the verbs contract.
        push(unsafe { qp_object(qp) }, operation);
    }

    pub(super) unsafe extern "C" fn rdma_read(qp: *mut ibv_qp_ex, rkey: u32, address: u64) {
        let operation = SendOperation::Read {
            remote: remote(address, rkey),
        };
        // SAFETY: the verbs contract.
        push(unsafe { qp_object(qp) }, operation);
    }

    pub(super) unsafe extern "C" fn send(qp: *mut ibv_qp_ex) {
        // SAFETY: the verbs contract.
        push(
            unsafe { qp_object(qp) },
            SendOperation::Send { immediate: None },
        );
    }

    pub(super) unsafe extern "C" fn send_immediate(qp: *mut ibv_qp_ex, immediate: u32) {
        let operation = SendOperation::Send {
            immediate: Some(u32::from_be(immediate)),
        };
        // SAFETY: the verbs contract.
        push(unsafe { qp_object(qp) }, operation);
    }

    pub(super) unsafe extern "C" fn compare_swap(
        qp: *mut ibv_qp_ex,
        rkey: u32,
        address: u64,
        compare: u64,
        swap: u64,
    ) {
        let operation = SendOperation::CompareSwap {
            remote: remote(address, rkey),
            compare,
            swap,
        };
        // SAFETY: the verbs contract.
        push(unsafe { qp_object(qp) }, operation);
    }

    pub(super) unsafe extern "C" fn fetch_add(
        qp: *mut ibv_qp_ex,
        rkey: u32,
        address: u64,
        add: u64,
    ) {
        let operation = SendOperation::FetchAdd {
            remote: remote(address, rkey),
            add,
        };
        // SAFETY: the verbs contract.
        push(unsafe { qp_object(qp) }, operation);
    }

    pub(super) unsafe extern "C" fn set_sge(
        qp: *mut ibv_qp_ex,
        lkey: u32,
        address: u64,
        length: u32,
    ) {
        let element = element_of(&ibv_sge {
            addr: address,
            length,
            lkey,
        });
        // SAFETY: the verbs contract.
        let qp = unsafe { qp_object(qp) };
        // IBV_SEND_INLINE is ignored for a READ or an atomic, as
        // ibv_post_send ignores it.
        let (_, flags) = qp.request_fields();
        let inline = flags & IBV_SEND_INLINE != 0 && !building_read_or_atomic(qp);
        let local = if inline {
            // SAFETY: inline data is the program's memory, read now.
            unsafe { inline_bytes(&[element]) }.map(LocalData::Inline)
        } else {
            Ok(LocalData::List(vec![element]))
        };
        set_local(qp, local);
    }

    pub(super) unsafe extern "C" fn set_sge_list(
        qp: *mut ibv_qp_ex,
        count: usize,
        list: *const ibv_sge,
    ) {
        // SAFETY: the verbs contract: `list` holds `count` entries.
        let local = unsafe { elements(list, c_int::try_from(count).unwrap_or(c_int::MAX)) };
        // SAFETY: the verbs contract.
        set_local(unsafe { qp_object(qp) }, local.map(LocalData::List));
    }

    pub(super) unsafe extern "C" fn set_inline_data(
        qp: *mut ibv_qp_ex,
        address: *mut c_void,
        length: usize,
    ) {
        let buffer = ibv_data_buf {
            addr: address,
            length,
        };
        // SAFETY: the verbs contract.
        unsafe { set_inline_data_list(qp, 1, &buffer) };
    }

    pub(super) unsafe extern "C" fn set_inline_data_list(
        qp: *mut ibv_qp_ex,
        count: usize,
        buffers: *const ibv_data_buf,
    ) {
        // Any number of buffers within the inline bytes, as rdma-core's
        // providers take (not the gather list's four); a buffer needs a
        // byte to count, so more than that many is refused.
        let local = if buffers.is_null() || count > MAX_INLINE_BYTES as usize {
            Err(libc::EINVAL)
        } else {
            // SAFETY: the verbs contract: `buffers` holds `count` entries,
            // each the program's readable memory.
            let buffers = unsafe { std::slice::from_raw_parts(buffers, count) };
            // A length past 32 bits is refused, not cut: cut, (1 << 32) + 16
            // passed the inline limit as 16 and posted 16 bytes.
            let list: Result<Vec<ScatterGatherElement>, c_int> = buffers
                .iter()
                .map(|buffer| {
                    Ok(ScatterGatherElement {
                        address: VirtAddr(buffer.addr as u64),
                        length_bytes: u32::try_from(buffer.length).map_err(|_| libc::EINVAL)?,
                        lkey: Lkey(0),
                    })
                })
                .collect();
            // SAFETY: as above.
            list.and_then(|list| unsafe { inline_bytes(&list) }.map(LocalData::Inline))
        };
        // SAFETY: the verbs contract.
        set_local(unsafe { qp_object(qp) }, local);
    }

    /// Datagram addressing on an RC queue pair is a program error.
    pub(super) unsafe extern "C" fn set_ud_address(
        qp: *mut ibv_qp_ex,
        ah: *mut ibv_ah,
        remote_qpn: u32,
        remote_qkey: u32,
    ) {
        let _ = (ah, remote_qpn, remote_qkey);
        // SAFETY: the verbs contract.
        unsafe { qp_object(qp) }.built().error = Some(libc::EINVAL);
    }
}
