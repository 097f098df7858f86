//! Posting work and taking completions: the operations rdma-core's inline
//! `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` jump to (the
//! `ibv_wr_*` builder is the queue pair's, in `queue_pair`).

use super::device::node_of;
use super::errno_of;
use super::queue_pair::{post_pending, QpObject};
use super::resources::{object, CqObject, SrqObject};
use super::work_request::{elements, pending_of};
use crate::abi::*;
use remora_rnic::{
    CompletionOpcode, CompletionStatus, DataPath, QueuePair, ReceiveRequest, Verbs, VerbsError,
    WorkCompletion,
};
use std::ffi::c_int;

/// The most work requests one call walks: a linked list longer than any
/// queue is a cycle or garbage, refused rather than followed forever.
const MAX_CHAIN: usize = super::device::MAX_QUEUE_DEPTH as usize;

pub(super) fn install_operations(verbs: &mut verbs_context) {
    let operations = &mut verbs.context.ops;
    operations.poll_cq = Some(poll_cq);
    operations.req_notify_cq = Some(super::resources::req_notify_cq);
    operations.post_send = Some(post_send);
    operations.post_recv = Some(post_recv);
    operations.post_srq_recv = Some(post_srq_recv);
}

/// A work request of a program's linked list.
trait Linked {
    fn next(&self) -> *mut Self;
}

impl Linked for ibv_send_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
}

impl Linked for ibv_recv_wr {
    fn next(&self) -> *mut Self {
        self.next
    }
}

/// Walks a program's list of work requests, handing each to `post`; on
/// the first refusal, names that request in `bad_request` and returns
/// its errno. A list longer than any queue is refused (EINVAL).
///
/// # Safety
/// `request` is the program's valid list; `bad_request` is null or the
/// caller's out-parameter.
unsafe fn walk_chain<T: Linked>(
    request: *mut T,
    bad_request: *mut *mut T,
    post: &mut dyn FnMut(&T) -> Result<(), c_int>,
) -> c_int {
    let mut current = request;
    for _ in 0..MAX_CHAIN {
        if current.is_null() {
            return 0;
        }
        // SAFETY: the caller's promise.
        let work_request = unsafe { &*current };
        if let Err(errno) = post(work_request) {
            if !bad_request.is_null() {
                // SAFETY: the caller's out-parameter.
                unsafe { *bad_request = current };
            }
            return errno;
        }
        current = work_request.next();
    }
    // A chain of exactly MAX_CHAIN ends here, every request posted.
    if current.is_null() {
        return 0;
    }
    // A longer one: the rest is refused, and the caller told where.
    if !bad_request.is_null() {
        // SAFETY: the caller's out-parameter.
        unsafe { *bad_request = current };
    }
    libc::EINVAL
}

unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    request: *mut ibv_send_wr,
    bad_request: *mut *mut ibv_send_wr,
) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live QP.
    let qp_object = unsafe { object::<QpObject, _>(qp) };
    let signal_all = qp_object.signal_all;
    let mut post = |work_request: &ibv_send_wr| {
        // SAFETY: a request of the program's list.
        let pending = unsafe { pending_of(work_request, signal_all) }?;
        post_pending(qp_object, &[pending]).map_err(|error| errno_of(&error))
    };
    // SAFETY: the program's list.
    unsafe { walk_chain(request, bad_request, &mut post) }
}

/// Walks a receive list, posting each through `post`.
///
/// # Safety
/// `request` is the program's valid list.
unsafe fn post_receive_chain(
    request: *mut ibv_recv_wr,
    bad_request: *mut *mut ibv_recv_wr,
    post: &mut dyn FnMut(ReceiveRequest) -> Result<(), VerbsError>,
) -> c_int {
    let mut post_one = |work_request: &ibv_recv_wr| {
        // SAFETY: the request's own scatter/gather list.
        let list = unsafe { elements(work_request.sg_list, work_request.num_sge) }?;
        ReceiveRequest::new(work_request.wr_id, &list)
            .and_then(&mut *post)
            .map_err(|error| errno_of(&error))
    };
    // SAFETY: the caller's promise.
    unsafe { walk_chain(request, bad_request, &mut post_one) }
}

unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    request: *mut ibv_recv_wr,
    bad_request: *mut *mut ibv_recv_wr,
) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live QP and its live context.
    let (queue_pair, node) = unsafe {
        let qp_object = object::<QpObject, _>(qp);
        (QueuePair(qp_object.qpn), node_of(qp_object.context()))
    };
    // SAFETY: the program's list.
    unsafe {
        post_receive_chain(request, bad_request, &mut |receive| {
            node.with_device(|rnic| rnic.post_receive(queue_pair, receive))
        })
    }
}

unsafe extern "C" fn post_srq_recv(
    srq: *mut ibv_srq,
    request: *mut ibv_recv_wr,
    bad_request: *mut *mut ibv_recv_wr,
) -> c_int {
    if srq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: a live SRQ and its live context.
    let (queue, node) = unsafe {
        let srq_object = object::<SrqObject, _>(srq);
        (srq_object.queue, node_of(srq_object.srq.context))
    };
    // SAFETY: the program's list.
    unsafe {
        post_receive_chain(request, bad_request, &mut |receive| {
            node.with_device(|rnic| rnic.post_shared_receive(queue, receive))
        })
    }
}

fn status_of(status: CompletionStatus) -> ibv_wc_status {
    match status {
        CompletionStatus::Success => IBV_WC_SUCCESS,
        CompletionStatus::LocalLengthError => IBV_WC_LOC_LEN_ERR,
        CompletionStatus::LocalQueuePairOperationError => IBV_WC_LOC_QP_OP_ERR,
        CompletionStatus::LocalProtectionError => IBV_WC_LOC_PROT_ERR,
        CompletionStatus::WorkRequestFlushError => IBV_WC_WR_FLUSH_ERR,
        CompletionStatus::BadResponseError => IBV_WC_BAD_RESP_ERR,
        CompletionStatus::LocalAccessError => IBV_WC_LOC_ACCESS_ERR,
        CompletionStatus::RemoteInvalidRequestError => IBV_WC_REM_INV_REQ_ERR,
        CompletionStatus::RemoteAccessError => IBV_WC_REM_ACCESS_ERR,
        CompletionStatus::RemoteOperationError => IBV_WC_REM_OP_ERR,
        CompletionStatus::RetryExceeded => IBV_WC_RETRY_EXC_ERR,
        CompletionStatus::ReceiverNotReadyRetryExceeded => IBV_WC_RNR_RETRY_EXC_ERR,
    }
}

fn opcode_of(opcode: CompletionOpcode) -> ibv_wc_opcode {
    match opcode {
        CompletionOpcode::Send => IBV_WC_SEND,
        CompletionOpcode::RdmaWrite => IBV_WC_RDMA_WRITE,
        CompletionOpcode::RdmaRead => IBV_WC_RDMA_READ,
        CompletionOpcode::CompareSwap => IBV_WC_COMP_SWAP,
        CompletionOpcode::FetchAdd => IBV_WC_FETCH_ADD,
        CompletionOpcode::Receive => IBV_WC_RECV,
        CompletionOpcode::ReceiveRdmaWithImmediate => IBV_WC_RECV_RDMA_WITH_IMM,
    }
}

/// The `ibv_wc` of a completion.
pub fn work_completion(completion: &WorkCompletion) -> ibv_wc {
    let mut entry = ibv_wc {
        wr_id: completion.work_request_id,
        status: status_of(completion.status),
        opcode: opcode_of(completion.opcode),
        byte_len: completion.byte_len,
        qp_num: completion.qpn.value(),
        ..Default::default()
    };
    if let Some(immediate) = completion.immediate {
        entry.__bindgen_anon_1.imm_data = immediate.to_be();
        entry.wc_flags |= IBV_WC_WITH_IMM;
    }
    entry
}

unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, capacity: c_int, into: *mut ibv_wc) -> c_int {
    if cq.is_null() || capacity < 0 || (capacity > 0 && into.is_null()) {
        return -1;
    }
    // SAFETY: a live CQ and its live context.
    let (queue, node) = unsafe {
        let cq_object = object::<CqObject, _>(cq);
        (cq_object.queue, node_of(cq_object.context()))
    };
    let mut written = 0usize;
    let taken = node.poll_completions(queue, capacity as usize, &mut |completion| {
        // SAFETY: `into` holds `capacity` entries and at most that many
        // completions are taken.
        unsafe { into.add(written).write(work_completion(&completion)) };
        written += 1;
    });
    match taken {
        Ok(count) => count as c_int,
        // An overrun queue, as a real CQ in error: a negative return.
        Err(_) => -1,
    }
}
