//! Bifröst's node messages to the Gatekeeper (heartbeats and exports):
//! any bytes parse or fail with a typed error; what parses emits the same
//! bytes back.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    remora_wire::bifrost::any_node_message(data);
});
