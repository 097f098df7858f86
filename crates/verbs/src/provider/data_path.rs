//! Posting work and taking completions: the operations rdma-core's inline
//! `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` and `ibv_wr_*` jump to.

use super::device::{node_of, MAX_SCATTER_GATHER};
use super::errno_of;
use super::resources::{object, CqObject, QpObject, SrqObject, MAX_INLINE_BYTES};
use crate::abi::*;
use remora_rnic::{
    CompletionOpcode, CompletionStatus, DataPath, Lkey, QueuePair, ReceiveRequest, RemoteAddress,
    ScatterGatherElement, SendOperation, SendRequest, Verbs, VerbsError, WorkCompletion,
};
use remora_wire::{Rkey, VirtAddr};
use std::ffi::{c_int, c_void};

/// The most work requests one call walks: a linked list longer than any
/// queue is a cycle or garbage, refused rather than followed forever.
const MAX_CHAIN: usize = super::device::MAX_QUEUE_DEPTH as usize;

/// Where a request's local bytes come from.
#[derive(Clone, Debug)]
pub(super) enum LocalData {
    List(Vec<ScatterGatherElement>),
    /// Inline: the bytes, copied when the request is built.
    Inline(Vec<u8>),
}

/// A send request as the program described it, before it is posted.
#[derive(Clone, Debug)]
pub(super) struct PendingRequest {
    pub work_request_id: u64,
    pub operation: SendOperation,
    pub local: LocalData,
    pub signaled: bool,
}

pub(super) fn install_operations(verbs: &mut verbs_context) {
    let operations = &mut verbs.context.ops;
    operations.poll_cq = Some(poll_cq);
    operations.req_notify_cq = Some(super::resources::req_notify_cq);
    operations.post_send = Some(post_send);
    operations.post_recv = Some(post_recv);
    operations.post_srq_recv = Some(post_srq_recv);
}

/// Copies a program's scatter/gather list.
///
/// # Safety
/// `list` points at `count` entries (the caller's work request).
unsafe fn elements(list: *const ibv_sge, count: c_int) -> Result<Vec<ScatterGatherElement>, c_int> {
    if !(0..=MAX_SCATTER_GATHER).contains(&count) {
        return Err(libc::EINVAL);
    }
    if count == 0 {
        return Ok(Vec::new());
    }
    if list.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: the caller's promise.
    let list = unsafe { std::slice::from_raw_parts(list, count as usize) };
    Ok(list.iter().map(element_of).collect())
}

fn element_of(entry: &ibv_sge) -> ScatterGatherElement {
    ScatterGatherElement {
        address: VirtAddr(entry.addr),
        length_bytes: entry.length,
        lkey: Lkey(entry.lkey),
    }
}

/// Copies the bytes an inline request names, from the program's memory.
///
/// # Safety
/// Each element's address is the program's readable memory of its length
/// (inline data is read at post time, so the lkey is not used).
unsafe fn inline_bytes(list: &[ScatterGatherElement]) -> Result<Vec<u8>, c_int> {
    let total: u64 = list
        .iter()
        .map(|element| u64::from(element.length_bytes))
        .sum();
    if total > u64::from(MAX_INLINE_BYTES) {
        return Err(libc::EINVAL);
    }
    let mut bytes = Vec::with_capacity(total as usize);
    for element in list {
        // SAFETY: the caller's promise.
        let source = unsafe {
            std::slice::from_raw_parts(
                element.address.0 as usize as *const u8,
                element.length_bytes as usize,
            )
        };
        bytes.extend_from_slice(source);
    }
    Ok(bytes)
}

fn remote(address: u64, rkey: u32) -> RemoteAddress {
    RemoteAddress {
        address: VirtAddr(address),
        rkey: Rkey(rkey),
    }
}

/// Reads one `ibv_send_wr`.
///
/// # Safety
/// `request` is the caller's valid work request.
unsafe fn pending_of(request: &ibv_send_wr, signal_all: bool) -> Result<PendingRequest, c_int> {
    // SAFETY: the union member the opcode selects.
    let (rdma, atomic, immediate) = unsafe {
        (
            request.wr.rdma,
            request.wr.atomic,
            u32::from_be(request.__bindgen_anon_1.imm_data),
        )
    };
    let operation = match request.opcode {
        IBV_WR_RDMA_WRITE => SendOperation::Write {
            remote: remote(rdma.remote_addr, rdma.rkey),
            immediate: None,
        },
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOperation::Write {
            remote: remote(rdma.remote_addr, rdma.rkey),
            immediate: Some(immediate),
        },
        IBV_WR_SEND => SendOperation::Send { immediate: None },
        IBV_WR_SEND_WITH_IMM => SendOperation::Send {
            immediate: Some(immediate),
        },
        IBV_WR_RDMA_READ => SendOperation::Read {
            remote: remote(rdma.remote_addr, rdma.rkey),
        },
        IBV_WR_ATOMIC_CMP_AND_SWP => SendOperation::CompareSwap {
            remote: remote(atomic.remote_addr, atomic.rkey),
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => SendOperation::FetchAdd {
            remote: remote(atomic.remote_addr, atomic.rkey),
            add: atomic.compare_add,
        },
        // Memory windows, local invalidation, TSO and atomic writes.
        _ => return Err(libc::EINVAL),
    };
    // SAFETY: the request's own list.
    let list = unsafe { elements(request.sg_list, request.num_sge) }?;
    let inline = request.send_flags & IBV_SEND_INLINE != 0;
    let local = if inline && !operation.is_read_or_atomic() {
        // SAFETY: inline data is the program's memory, read now.
        LocalData::Inline(unsafe { inline_bytes(&list) }?)
    } else {
        LocalData::List(list)
    };
    Ok(PendingRequest {
        work_request_id: request.wr_id,
        operation,
        local,
        signaled: signal_all || request.send_flags & IBV_SEND_SIGNALED != 0,
    })
}

/// Posts built requests on the device, staging inline bytes first.
fn post_pending(qp_object: &mut QpObject, requests: &[PendingRequest]) -> Result<(), VerbsError> {
    // SAFETY: a live QP's context is live.
    let node = unsafe { node_of(qp_object.qp.qp_base.context) };
    let queue_pair = QueuePair(qp_object.qpn);
    let staging = &mut qp_object.inline;
    node.with_device(|rnic| {
        for pending in requests {
            let elements = match &pending.local {
                LocalData::List(list) => list.clone(),
                LocalData::Inline(bytes) if bytes.is_empty() => Vec::new(),
                LocalData::Inline(bytes) => {
                    let staging = staging.as_mut().ok_or(VerbsError::MessageTooLong {
                        length_bytes: bytes.len() as u64,
                        max_bytes: 0,
                    })?;
                    let slot = staging.next % staging.slots;
                    staging.next += 1;
                    let element = staging
                        .region
                        .slice(slot * u64::from(MAX_INLINE_BYTES), bytes.len() as u32);
                    rnic.write_local(element.lkey, element.address, bytes)?;
                    vec![element]
                }
            };
            let mut request =
                SendRequest::new(pending.work_request_id, pending.operation, &elements)?;
            request.signaled = pending.signaled;
            rnic.post_send(queue_pair, request)?;
        }
        Ok(())
    })
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
    let mut current = request;
    for _ in 0..MAX_CHAIN {
        if current.is_null() {
            return 0;
        }
        // SAFETY: the program's work request list.
        let work_request = unsafe { &*current };
        // SAFETY: as above.
        let result =
            unsafe { pending_of(work_request, qp_object.signal_all) }.and_then(|pending| {
                post_pending(qp_object, &[pending]).map_err(|error| errno_of(&error))
            });
        if let Err(errno) = result {
            if !bad_request.is_null() {
                // SAFETY: the caller's out-parameter.
                unsafe { *bad_request = current };
            }
            return errno;
        }
        current = work_request.next;
    }
    libc::EINVAL
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
    let mut current = request;
    for _ in 0..MAX_CHAIN {
        if current.is_null() {
            return 0;
        }
        // SAFETY: the program's list.
        let work_request = unsafe { &*current };
        // SAFETY: the request's own scatter/gather list.
        let result =
            unsafe { elements(work_request.sg_list, work_request.num_sge) }.and_then(|list| {
                ReceiveRequest::new(work_request.wr_id, &list)
                    .and_then(&mut *post)
                    .map_err(|error| errno_of(&error))
            });
        if let Err(errno) = result {
            if !bad_request.is_null() {
                // SAFETY: the caller's out-parameter.
                unsafe { *bad_request = current };
            }
            return errno;
        }
        current = work_request.next;
    }
    libc::EINVAL
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
        (
            QueuePair(qp_object.qpn),
            node_of(qp_object.qp.qp_base.context),
        )
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
        (cq_object.queue, node_of(cq_object.cq.context))
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
    unsafe fn qp_object<'a>(qp: *mut ibv_qp_ex) -> &'a mut QpObject {
        // SAFETY: the caller's promise.
        unsafe { object::<QpObject, _>(qp) }
    }

    fn push(qp: &mut QpObject, operation: SendOperation) {
        let signaled = qp.signal_all || qp.qp.wr_flags & IBV_SEND_SIGNALED != 0;
        qp.pending.push(PendingRequest {
            work_request_id: qp.qp.wr_id,
            operation,
            local: LocalData::List(Vec::new()),
            signaled,
        });
    }

    fn set_local(qp: &mut QpObject, local: Result<LocalData, c_int>) {
        match (qp.pending.last_mut(), local) {
            (Some(last), Ok(local)) => last.local = local,
            (_, Err(errno)) => qp.pending_error = Some(errno),
            (None, _) => qp.pending_error = Some(libc::EINVAL),
        }
    }

    pub(super) unsafe extern "C" fn start(qp: *mut ibv_qp_ex) {
        // SAFETY: the verbs contract.
        let qp = unsafe { qp_object(qp) };
        qp.pending.clear();
        qp.pending_error = None;
    }

    pub(super) unsafe extern "C" fn complete(qp: *mut ibv_qp_ex) -> c_int {
        // SAFETY: the verbs contract.
        let qp = unsafe { qp_object(qp) };
        let pending = std::mem::take(&mut qp.pending);
        if let Some(errno) = qp.pending_error.take() {
            return errno;
        }
        match post_pending(qp, &pending) {
            Ok(()) => 0,
            Err(error) => errno_of(&error),
        }
    }

    pub(super) unsafe extern "C" fn abort(qp: *mut ibv_qp_ex) {
        // SAFETY: the verbs contract.
        let qp = unsafe { qp_object(qp) };
        qp.pending.clear();
        qp.pending_error = None;
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
        let inline = qp.qp.wr_flags & IBV_SEND_INLINE != 0;
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
        let local = if buffers.is_null() || count > MAX_SCATTER_GATHER as usize {
            Err(libc::EINVAL)
        } else {
            // SAFETY: the verbs contract: `buffers` holds `count` entries,
            // each the program's readable memory.
            let buffers = unsafe { std::slice::from_raw_parts(buffers, count) };
            let list: Vec<ScatterGatherElement> = buffers
                .iter()
                .map(|buffer| ScatterGatherElement {
                    address: VirtAddr(buffer.addr as u64),
                    length_bytes: buffer.length as u32,
                    lkey: Lkey(0),
                })
                .collect();
            // SAFETY: as above.
            unsafe { inline_bytes(&list) }.map(LocalData::Inline)
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
        unsafe { qp_object(qp) }.pending_error = Some(libc::EINVAL);
    }
}
