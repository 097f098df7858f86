//! Bifröst's Gatekeeper in the switch: any payload on Bifröst's port, as a
//! call to the service address or a reply from the serving node, is
//! routed, held, stripped of its checkpoint or dropped and counted; the
//! switch never panics and forwards only well-formed frames.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    remora_bifrost::gatekeeper::any_datagram(data);
});
