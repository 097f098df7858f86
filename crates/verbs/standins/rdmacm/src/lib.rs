//! A stand-in for rdma-core's `librdmacm.so.1`. perftest links it, so it
//! must load beside Remora's libibverbs (the real one imports rdma-core's
//! private symbols and does not). Remora has no RDMA connection manager:
//! every call fails with ENOSYS and says so once; perftest connects
//! through its default TCP exchange instead (no `-R`).

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int, c_void};
use std::sync::Once;

fn refuse(call: &str) -> c_int {
    static SAID: Once = Once::new();
    SAID.call_once(|| {
        eprintln!("remora-verbs: librdmacm ({call}) is not supported; connect without rdma_cm (perftest: drop -R)");
    });
    errno::set_errno(errno::Errno(libc::ENOSYS));
    -1
}

fn refuse_pointer(call: &str) -> *mut c_void {
    refuse(call);
    std::ptr::null_mut()
}

remora_verbs_exports::export! {
    "RDMACM_1.0" fn rdma_create_event_channel() -> *mut c_void as remora_rdma_create_event_channel { refuse_pointer("rdma_create_event_channel") }
    "RDMACM_1.0" fn rdma_destroy_event_channel(channel: *mut c_void) as remora_rdma_destroy_event_channel { }
    "RDMACM_1.0" fn rdma_create_id(channel: *mut c_void, id: *mut *mut c_void, context: *mut c_void, space: c_int) -> c_int as remora_rdma_create_id { refuse("rdma_create_id") }
    "RDMACM_1.0" fn rdma_destroy_id(id: *mut c_void) -> c_int as remora_rdma_destroy_id { refuse("rdma_destroy_id") }
    "RDMACM_1.0" fn rdma_bind_addr(id: *mut c_void, address: *mut c_void) -> c_int as remora_rdma_bind_addr { refuse("rdma_bind_addr") }
    "RDMACM_1.0" fn rdma_resolve_addr(id: *mut c_void, source: *mut c_void, destination: *mut c_void, timeout: c_int) -> c_int as remora_rdma_resolve_addr { refuse("rdma_resolve_addr") }
    "RDMACM_1.0" fn rdma_resolve_route(id: *mut c_void, timeout: c_int) -> c_int as remora_rdma_resolve_route { refuse("rdma_resolve_route") }
    "RDMACM_1.0" fn rdma_create_qp(id: *mut c_void, pd: *mut c_void, attributes: *mut c_void) -> c_int as remora_rdma_create_qp { refuse("rdma_create_qp") }
    "RDMACM_1.0" fn rdma_create_qp_ex(id: *mut c_void, attributes: *mut c_void) -> c_int as remora_rdma_create_qp_ex { refuse("rdma_create_qp_ex") }
    "RDMACM_1.0" fn rdma_destroy_qp(id: *mut c_void) as remora_rdma_destroy_qp { }
    "RDMACM_1.0" fn rdma_connect(id: *mut c_void, parameters: *mut c_void) -> c_int as remora_rdma_connect { refuse("rdma_connect") }
    "RDMACM_1.0" fn rdma_listen(id: *mut c_void, backlog: c_int) -> c_int as remora_rdma_listen { refuse("rdma_listen") }
    "RDMACM_1.0" fn rdma_accept(id: *mut c_void, parameters: *mut c_void) -> c_int as remora_rdma_accept { refuse("rdma_accept") }
    "RDMACM_1.0" fn rdma_reject(id: *mut c_void, data: *const c_void, length: u8) -> c_int as remora_rdma_reject { refuse("rdma_reject") }
    "RDMACM_1.0" fn rdma_disconnect(id: *mut c_void) -> c_int as remora_rdma_disconnect { refuse("rdma_disconnect") }
    "RDMACM_1.0" fn rdma_get_cm_event(channel: *mut c_void, event: *mut *mut c_void) -> c_int as remora_rdma_get_cm_event { refuse("rdma_get_cm_event") }
    "RDMACM_1.0" fn rdma_ack_cm_event(event: *mut c_void) -> c_int as remora_rdma_ack_cm_event { refuse("rdma_ack_cm_event") }
    "RDMACM_1.0" fn rdma_event_str(event: c_int) -> *const c_char as remora_rdma_event_str { c"RDMA_CM_EVENT_UNSUPPORTED".as_ptr() }
    "RDMACM_1.0" fn rdma_set_option(id: *mut c_void, level: c_int, name: c_int, value: *mut c_void, length: usize) -> c_int as remora_rdma_set_option { refuse("rdma_set_option") }
    "RDMACM_1.0" fn rdma_getaddrinfo(node: *const c_char, service: *const c_char, hints: *const c_void, result: *mut *mut c_void) -> c_int as remora_rdma_getaddrinfo { refuse("rdma_getaddrinfo") }
    "RDMACM_1.0" fn rdma_freeaddrinfo(result: *mut c_void) as remora_rdma_freeaddrinfo { }
}
