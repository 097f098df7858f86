//! A stand-in for rdma-core's `libefa.so.1` (AWS EFA direct verbs).
//! perftest links it; the real one imports rdma-core's private symbols and
//! will not load against Remora's libibverbs. Remora's device is not an
//! EFA device: every call reports EOPNOTSUPP, as on a device of another
//! vendor.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_int, c_void};

remora_verbs_exports::export! {
    "EFA_1.1" fn efadv_query_device(context: *mut c_void, attributes: *mut c_void, length: u32) -> c_int as remora_efadv_query_device { libc::EOPNOTSUPP }
    "EFA_1.1" fn efadv_create_qp_ex(context: *mut c_void, attributes: *mut c_void, efa_attributes: *mut c_void, length: u32) -> *mut c_void
        as remora_efadv_create_qp_ex { errno::set_errno(errno::Errno(libc::EOPNOTSUPP)); std::ptr::null_mut() }
    "EFA_1.1" fn efadv_create_driver_qp(pd: *mut c_void, attributes: *mut c_void, driver_type: u32) -> *mut c_void
        as remora_efadv_create_driver_qp { errno::set_errno(errno::Errno(libc::EOPNOTSUPP)); std::ptr::null_mut() }
}
