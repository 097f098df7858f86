//! Bifröst's checkpoints, a callee's and a caller's: any bytes decode or
//! fail with a typed error; what decodes encodes back to the same
//! checkpoint.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    remora_bifrost::rpc::checkpoint::any_checkpoint(data);
    remora_bifrost::rpc::checkpoint::any_caller_checkpoint(data);
});
