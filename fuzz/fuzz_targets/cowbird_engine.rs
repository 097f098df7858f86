//! A hostile compute node: any bytes in its Cowbird block (tail words and
//! metadata entries). The Spot engine refuses or serves them over two real
//! soft RNICs, never panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    remora_cowbird::fuzzing::hostile_block(bytes);
});
