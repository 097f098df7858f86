//! Any bytes: parsing never panics, and what parses re-emits to a frame
//! that parses to the same headers and payload
//! (`remora_wire::any_frame`, whose seeds replay as tests).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let _ = remora_wire::any_frame(bytes);
});
