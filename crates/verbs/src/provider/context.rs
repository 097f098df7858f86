//! Opening and closing the device: a context whose operation tables point
//! at this library's verbs, where rdma-core's inline functions look.

use super::async_events::{AsyncEvents, Element};
use super::device::{
    context_object, device, node, node_of, query_device_extended, query_port_extended,
    ContextObject,
};
use super::{report_once, set_errno};
use crate::abi::*;
use std::ffi::{c_int, c_void};
use std::sync::Arc;

pub(super) unsafe fn open_device(device_pointer: *mut ibv_device) -> *mut ibv_context {
    if device_pointer != device() {
        set_errno(libc::ENODEV);
        return std::ptr::null_mut();
    }
    let node = match node() {
        Ok(node) => node,
        Err(message) => {
            report_once(&message);
            set_errno(libc::ENODEV);
            return std::ptr::null_mut();
        }
    };
    let events = match AsyncEvents::new() {
        Ok(events) => Arc::new(events),
        Err(error) => {
            set_errno(error.raw_os_error());
            return std::ptr::null_mut();
        }
    };
    let mut verbs = verbs_context {
        sz: std::mem::size_of::<verbs_context>(),
        ..Default::default()
    };
    super::data_path::install_operations(&mut verbs);
    install_extended_operations(&mut verbs);
    verbs.context.device = device_pointer;
    verbs.context.cmd_fd = -1;
    verbs.context.async_fd = events.descriptor();
    verbs.context.num_comp_vectors = 1;
    verbs.context.abi_compat = VERBS_ABI_IS_EXTENDED as *mut c_void;
    let object = Box::into_raw(Box::new(ContextObject::new(verbs, node, events)));
    // SAFETY: just allocated; the program gets the ibv_context inside it.
    unsafe { &raw mut (*object).verbs.context }
}

pub(super) unsafe fn close_device(context: *mut ibv_context) -> c_int {
    if context.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the context came from open_device (the verbs contract).
    unsafe { context_object(context) }.take_down_what_is_left();
    // SAFETY: as above.
    unsafe { node_of(context) }.flush_capture();
    let offset = std::mem::offset_of!(verbs_context, context);
    // SAFETY: as above; the program gives it up here.
    drop(unsafe { Box::from_raw(context.cast::<u8>().sub(offset).cast::<ContextObject>()) });
    0
}

/// Extended operations in the `verbs_context`; the rest stay null, which
/// rdma-core's inline wrappers turn into EOPNOTSUPP.
fn install_extended_operations(verbs: &mut verbs_context) {
    verbs.create_qp_ex = Some(super::queue_pair::create_qp_extended);
    verbs.query_port = Some(query_port_extended);
    verbs.query_device_ex = Some(query_device_extended);
}

/// `ibv_get_async_event`: waits on the context's `async_fd` (a blocking
/// descriptor waits, a non-blocking one answers -1 with EAGAIN while no
/// event waits, as the kernel's event file does) and describes the oldest
/// event: a CQ's overrun (`IBV_EVENT_CQ_ERR`), an SRQ below its limit
/// (`IBV_EVENT_SRQ_LIMIT_REACHED`), a QP on an SRQ in error
/// (`IBV_EVENT_QP_LAST_WQE_REACHED`).
///
/// # Safety
/// `context` came from [`open_device`] and is not yet closed.
pub(super) unsafe fn get_async_event(context: *mut ibv_context, event: *mut c_void) -> c_int {
    if context.is_null() || event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: a live context (the caller's promise).
    let events = Arc::clone(&unsafe { context_object(context) }.events);
    // SAFETY: the program's event, which it owns.
    unsafe { events.take(event.cast::<ibv_async_event>()) }
}

/// `ibv_ack_async_event`: the program is done with an event it took, so
/// the queue it names may be destroyed.
///
/// # Safety
/// `event` is null or an event `ibv_get_async_event` wrote, whose queue
/// is live (destroying it waits for this acknowledgement).
pub(super) unsafe fn ack_async_event(event: *mut c_void) {
    let event = event.cast::<ibv_async_event>();
    if event.is_null() {
        return;
    }
    // SAFETY: the caller's promise: an event `take` wrote, naming a live
    // queue of a live context.
    let element = unsafe { Element::of(&*event) };
    // SAFETY: as above.
    let context = unsafe { element.context() };
    if context.is_null() {
        return;
    }
    // SAFETY: as above.
    unsafe { context_object(context).events.acknowledge(element) };
}
