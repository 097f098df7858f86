//! The symbols of `libibverbs.so.1`, with the versions rdma-core 44 gives
//! them (`objdump -T /usr/lib/x86_64-linux-gnu/libibverbs.so.1`): what
//! perftest, `ibv_rc_pingpong` and `ibv_devinfo` import, and the rest of
//! the verbs a connected-mode program calls.

// Every export forwards its caller's arguments, under the verbs contract
// (pointers this library handed out, live; out-parameters writable), to
// the function that implements it: the one safety argument of this table.
#![allow(clippy::undocumented_unsafe_blocks)]

use super::{context, device, queue_pair, resources, set_errno};
use crate::abi::*;
use std::ffi::{c_char, c_int, c_void};

/// Calls that Remora refuses: no multicast (no UD), no asynchronous events
/// to wait for, no resizing.
fn not_supported() -> c_int {
    libc::EOPNOTSUPP
}

fn status_text(status: ibv_wc_status) -> &'static std::ffi::CStr {
    const TEXTS: [&std::ffi::CStr; 23] = [
        c"success",
        c"local length error",
        c"local QP operation error",
        c"local EE context operation error",
        c"local protection error",
        c"Work Request Flushed Error",
        c"memory management operation error",
        c"bad response error",
        c"local access error",
        c"remote invalid request error",
        c"remote access error",
        c"remote operation error",
        c"transport retry counter exceeded",
        c"RNR retry counter exceeded",
        c"local RDD violation error",
        c"remote invalid RD request",
        c"aborted error",
        c"invalid EE context number",
        c"invalid EE context state",
        c"fatal error",
        c"response timeout error",
        c"general error",
        c"TM error",
    ];
    TEXTS.get(status as usize).copied().unwrap_or(c"unknown")
}

remora_verbs_exports::export! {
    "IBVERBS_1.1" fn ibv_get_device_list(count: *mut c_int) -> *mut *mut ibv_device
        as remora_ibv_get_device_list { unsafe { device::get_device_list(count) } }
    "IBVERBS_1.1" fn ibv_free_device_list(list: *mut *mut ibv_device)
        as remora_ibv_free_device_list { unsafe { device::free_device_list(list) } }
    "IBVERBS_1.1" fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char
        as remora_ibv_get_device_name { device::device_name(device) }
    "IBVERBS_1.1" fn ibv_get_device_guid(device: *mut ibv_device) -> u64
        as remora_ibv_get_device_guid { device::device_guid(device) }
    "IBVERBS_1.1" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context
        as remora_ibv_open_device { unsafe { context::open_device(device) } }
    "IBVERBS_1.1" fn ibv_close_device(context: *mut ibv_context) -> c_int
        as remora_ibv_close_device { unsafe { context::close_device(context) } }
    "IBVERBS_1.1" fn ibv_query_device(context: *mut ibv_context, attributes: *mut ibv_device_attr) -> c_int
        as remora_ibv_query_device { unsafe { device::query_device(context, attributes) } }
    "IBVERBS_1.1" fn ibv_query_port(context: *mut ibv_context, port: u8, attributes: *mut ibv_port_attr) -> c_int
        as remora_ibv_query_port { unsafe { device::query_port(context, port, attributes) } }
    "IBVERBS_1.1" fn ibv_query_gid(context: *mut ibv_context, port: u8, index: c_int, gid: *mut ibv_gid) -> c_int
        as remora_ibv_query_gid { unsafe { device::query_gid(context, port, index, gid) } }
    "IBVERBS_1.11" fn _ibv_query_gid_ex(context: *mut ibv_context, port: u32, index: u32, entry: *mut ibv_gid_entry, flags: u32, size: usize) -> c_int
        as remora_ibv_query_gid_ex { unsafe { device::query_gid_extended(context, port, index, entry, flags, size) } }
    "IBVERBS_PRIVATE_34" fn ibv_query_gid_type(context: *mut ibv_context, port: u8, index: u32, kind: *mut u32) -> c_int
        as remora_ibv_query_gid_type { unsafe { device::query_gid_type(context, port, index, kind) } }
    "IBVERBS_1.1" fn ibv_query_pkey(context: *mut ibv_context, port: u8, index: c_int, pkey: *mut u16) -> c_int
        as remora_ibv_query_pkey { unsafe { device::query_pkey(context, port, index, pkey) } }
    "IBVERBS_1.1" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd
        as remora_ibv_alloc_pd { unsafe { resources::alloc_pd(context) } }
    "IBVERBS_1.1" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int
        as remora_ibv_dealloc_pd { unsafe { resources::dealloc_pd(pd) } }
    "IBVERBS_1.1" fn ibv_reg_mr(pd: *mut ibv_pd, address: *mut c_void, length: usize, access: c_int) -> *mut ibv_mr
        as remora_ibv_reg_mr { unsafe { resources::reg_mr_iova(pd, address, length, address as u64, access) } }
    "IBVERBS_1.7" fn ibv_reg_mr_iova(pd: *mut ibv_pd, address: *mut c_void, length: usize, iova: u64, access: c_int) -> *mut ibv_mr
        as remora_ibv_reg_mr_iova { unsafe { resources::reg_mr_iova(pd, address, length, iova, access) } }
    "IBVERBS_1.8" fn ibv_reg_mr_iova2(pd: *mut ibv_pd, address: *mut c_void, length: usize, iova: u64, access: u32) -> *mut ibv_mr
        as remora_ibv_reg_mr_iova2 { unsafe { resources::reg_mr_iova(pd, address, length, iova, access as c_int) } }
    "IBVERBS_1.1" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int
        as remora_ibv_dereg_mr { unsafe { resources::dereg_mr(mr) } }
    "IBVERBS_1.0" fn ibv_create_comp_channel(context: *mut ibv_context) -> *mut ibv_comp_channel
        as remora_ibv_create_comp_channel { unsafe { resources::create_comp_channel(context) } }
    "IBVERBS_1.0" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int
        as remora_ibv_destroy_comp_channel { unsafe { resources::destroy_comp_channel(channel) } }
    "IBVERBS_1.1" fn ibv_create_cq(context: *mut ibv_context, entries: c_int, cq_context: *mut c_void, channel: *mut ibv_comp_channel, vector: c_int) -> *mut ibv_cq
        as remora_ibv_create_cq { unsafe { resources::create_cq(context, entries, cq_context, channel, vector) } }
    "IBVERBS_1.1" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int
        as remora_ibv_destroy_cq { unsafe { resources::destroy_cq(cq) } }
    "IBVERBS_1.1" fn ibv_resize_cq(cq: *mut ibv_cq, entries: c_int) -> c_int
        as remora_ibv_resize_cq { not_supported() }
    "IBVERBS_1.1" fn ibv_get_cq_event(channel: *mut ibv_comp_channel, cq: *mut *mut ibv_cq, cq_context: *mut *mut c_void) -> c_int
        as remora_ibv_get_cq_event { unsafe { resources::get_cq_event(channel, cq, cq_context) } }
    "IBVERBS_1.1" fn ibv_ack_cq_events(cq: *mut ibv_cq, count: u32)
        as remora_ibv_ack_cq_events { unsafe { resources::ack_cq_events(cq, count) } }
    "IBVERBS_1.1" fn ibv_create_srq(pd: *mut ibv_pd, attributes: *mut ibv_srq_init_attr) -> *mut ibv_srq
        as remora_ibv_create_srq { unsafe { resources::create_srq(pd, attributes) } }
    "IBVERBS_1.1" fn ibv_modify_srq(srq: *mut ibv_srq, attributes: *mut ibv_srq_attr, mask: c_int) -> c_int
        as remora_ibv_modify_srq { unsafe { resources::modify_srq(srq, attributes, mask) } }
    "IBVERBS_1.1" fn ibv_query_srq(srq: *mut ibv_srq, attributes: *mut ibv_srq_attr) -> c_int
        as remora_ibv_query_srq { unsafe { resources::query_srq(srq, attributes) } }
    "IBVERBS_1.1" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int
        as remora_ibv_destroy_srq { unsafe { resources::destroy_srq(srq) } }
    "IBVERBS_1.1" fn ibv_create_qp(pd: *mut ibv_pd, attributes: *mut ibv_qp_init_attr) -> *mut ibv_qp
        as remora_ibv_create_qp { unsafe { queue_pair::create_qp(pd, attributes) } }
    "IBVERBS_1.1" fn ibv_modify_qp(qp: *mut ibv_qp, attributes: *mut ibv_qp_attr, mask: c_int) -> c_int
        as remora_ibv_modify_qp { unsafe { queue_pair::modify_qp(qp, attributes, mask) } }
    "IBVERBS_1.1" fn ibv_query_qp(qp: *mut ibv_qp, attributes: *mut ibv_qp_attr, mask: c_int, init: *mut ibv_qp_init_attr) -> c_int
        as remora_ibv_query_qp { unsafe { queue_pair::query_qp(qp, attributes, mask, init) } }
    "IBVERBS_1.1" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int
        as remora_ibv_destroy_qp { unsafe { queue_pair::destroy_qp(qp) } }
    "IBVERBS_1.6" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex
        as remora_ibv_qp_to_qp_ex { unsafe { queue_pair::qp_to_qp_ex(qp) } }
    "IBVERBS_1.1" fn ibv_create_ah(pd: *mut ibv_pd, attributes: *mut ibv_ah_attr) -> *mut ibv_ah
        as remora_ibv_create_ah { unsafe { resources::create_ah(pd, attributes) } }
    "IBVERBS_1.1" fn ibv_create_ah_from_wc(pd: *mut ibv_pd, completion: *mut ibv_wc, grh: *mut c_void, port: u8) -> *mut ibv_ah
        as remora_ibv_create_ah_from_wc { set_errno(libc::EOPNOTSUPP); std::ptr::null_mut() }
    "IBVERBS_1.1" fn ibv_init_ah_from_wc(context: *mut ibv_context, port: u8, completion: *mut ibv_wc, grh: *mut c_void, attributes: *mut ibv_ah_attr) -> c_int
        as remora_ibv_init_ah_from_wc { not_supported() }
    "IBVERBS_1.1" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int
        as remora_ibv_destroy_ah { unsafe { resources::destroy_ah(ah) } }
    "IBVERBS_1.1" fn ibv_attach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int
        as remora_ibv_attach_mcast { not_supported() }
    "IBVERBS_1.1" fn ibv_detach_mcast(qp: *mut ibv_qp, gid: *const ibv_gid, lid: u16) -> c_int
        as remora_ibv_detach_mcast { not_supported() }
    "IBVERBS_1.1" fn ibv_get_async_event(context: *mut ibv_context, event: *mut c_void) -> c_int
        as remora_ibv_get_async_event { unsafe { context::get_async_event(context, event) } }
    "IBVERBS_1.1" fn ibv_ack_async_event(event: *mut c_void)
        as remora_ibv_ack_async_event { unsafe { context::ack_async_event(event) } }
    "IBVERBS_1.1" fn ibv_fork_init() -> c_int
        as remora_ibv_fork_init { 0 }
    "IBVERBS_1.1" fn ibv_wc_status_str(status: ibv_wc_status) -> *const c_char
        as remora_ibv_wc_status_str { status_text(status).as_ptr() }
    "IBVERBS_1.1" fn ibv_node_type_str(node_type: ibv_node_type) -> *const c_char
        as remora_ibv_node_type_str { if node_type == IBV_NODE_CA { c"InfiniBand channel adapter".as_ptr() } else { c"unknown".as_ptr() } }
    "IBVERBS_1.1" fn ibv_port_state_str(state: ibv_port_state) -> *const c_char
        as remora_ibv_port_state_str { if state == IBV_PORT_ACTIVE { c"PORT_ACTIVE".as_ptr() } else { c"PORT_DOWN".as_ptr() } }
    "IBVERBS_1.0" fn ibv_read_sysfs_file(directory: *const c_char, file: *const c_char, buffer: *mut c_char, size: usize) -> c_int
        as remora_ibv_read_sysfs_file { set_errno(libc::ENOENT); -1 }
}
