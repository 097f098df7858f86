//! Opening and closing the device: a context whose operation tables point
//! at this library's verbs, where rdma-core's inline functions look.

use super::device::{
    context_object, device, node, node_of, query_device_extended, query_port_extended,
    ContextObject,
};
use super::{report_once, set_errno};
use crate::abi::*;
use std::ffi::{c_int, c_void};
use std::os::fd::AsRawFd;

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
    let async_events = match rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC) {
        Ok(fd) => fd,
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
    verbs.context.async_fd = async_events.as_raw_fd();
    verbs.context.num_comp_vectors = 1;
    verbs.context.abi_compat = VERBS_ABI_IS_EXTENDED as *mut c_void;
    let object = Box::into_raw(Box::new(ContextObject::new(verbs, node, async_events)));
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

/// `ibv_get_async_event`: reads the context's `async_fd`, as rdma-core
/// reads the kernel's event file. Remora raises no asynchronous events, so
/// a blocking descriptor waits and a non-blocking one answers -1 with
/// EAGAIN, as a device with no events does. (It answered EOPNOTSUPP at
/// once, and an event thread that retries spun on a core.)
///
/// # Safety
/// `context` came from [`open_device`] and is not yet closed.
pub(super) unsafe fn get_async_event(context: *mut ibv_context, event: *mut c_void) -> c_int {
    if context.is_null() || event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: a live context's eventfd, open while the context is.
    let events = unsafe { std::os::fd::BorrowedFd::borrow_raw((*context).async_fd) };
    let mut count = [0u8; 8];
    match rustix::io::read(events, &mut count) {
        Err(error) => set_errno(error.raw_os_error()),
        // Nothing writes the descriptor; were it written, there would be
        // no event to describe.
        Ok(_) => set_errno(libc::EIO),
    }
    -1
}
