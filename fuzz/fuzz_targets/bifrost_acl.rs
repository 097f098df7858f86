//! The Gatekeeper's ACL on RDMA to a DSM memory node: any RoCE transport
//! from a client to the node, or from the node back, is judged, forwarded
//! or refused with a NAK, and counted; the switch never panics and its
//! NAKs are well formed.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    remora_bifrost::gatekeeper::audit::any_memory_frame(data);
});
