//! A program's work requests, read into Remora's types: scatter/gather
//! lists, inline payloads (copied at post time), remote addresses, and the
//! send request a queue pair posts.

use super::device::MAX_SCATTER_GATHER;
use crate::abi::*;
use remora_rnic::{Lkey, RemoteAddress, ScatterGatherElement, SendOperation, SendRequest};
use remora_wire::{Rkey, VirtAddr};
use std::ffi::c_int;

/// The largest inline payload a queue pair accepts.
pub(super) const MAX_INLINE_BYTES: u32 = 256;

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
    pub flags: RequestFlags,
}

/// What a request's `IBV_SEND_*` flags ask of the device (inline data
/// aside, which the library itself stages).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct RequestFlags {
    pub signaled: bool,
    pub fence: bool,
    pub solicited: bool,
}

impl RequestFlags {
    /// The flags of `send_flags` (`ibv_send_wr.send_flags` or
    /// `ibv_qp_ex.wr_flags`), on a queue pair that signals every request
    /// when `signal_all`.
    pub fn of(send_flags: u32, signal_all: bool) -> RequestFlags {
        RequestFlags {
            signaled: signal_all || send_flags & IBV_SEND_SIGNALED != 0,
            fence: send_flags & IBV_SEND_FENCE != 0,
            solicited: send_flags & IBV_SEND_SOLICITED != 0,
        }
    }

    /// Sets them on the device's request.
    pub fn apply(self, request: &mut SendRequest) {
        request.signaled = self.signaled;
        request.fence = self.fence;
        request.solicited = self.solicited;
    }
}

/// Copies a program's scatter/gather list.
///
/// # Safety
/// `list` points at `count` entries (the caller's work request).
pub(super) unsafe fn elements(
    list: *const ibv_sge,
    count: c_int,
) -> Result<Vec<ScatterGatherElement>, c_int> {
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

pub(super) fn element_of(entry: &ibv_sge) -> ScatterGatherElement {
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
pub(super) unsafe fn inline_bytes(list: &[ScatterGatherElement]) -> Result<Vec<u8>, c_int> {
    let total: u64 = list
        .iter()
        .map(|element| u64::from(element.length_bytes))
        .sum();
    if total > u64::from(MAX_INLINE_BYTES) {
        return Err(libc::EINVAL);
    }
    let mut bytes = Vec::with_capacity(total as usize);
    // An empty element may carry a null address (`ibv_wr_set_inline_data(qp,
    // NULL, 0)`): a slice, even an empty one, may not start at null.
    for element in list.iter().filter(|element| element.length_bytes > 0) {
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

pub(super) fn remote(address: u64, rkey: u32) -> RemoteAddress {
    RemoteAddress {
        address: VirtAddr(address),
        rkey: Rkey(rkey),
    }
}

/// Reads one `ibv_send_wr`.
///
/// # Safety
/// `request` is the caller's valid work request.
pub(super) unsafe fn pending_of(
    request: &ibv_send_wr,
    signal_all: bool,
) -> Result<PendingRequest, c_int> {
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
        flags: RequestFlags::of(request.send_flags, signal_all),
    })
}
