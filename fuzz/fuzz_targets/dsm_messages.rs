//! Bifröst's DSM daemon messages: any bytes parse as a request or reply
//! or fail with a typed error; what parses emits the same bytes back.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    remora_bifrost::dsm::message::any_message(data);
});
