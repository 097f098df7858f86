//! Cowbird-P4 against hostile hosts: the first byte picks the attack.
//! Odd: arbitrary well-formed frames answer the switch's impersonated
//! queue pairs. Even: arbitrary bytes in the compute node's block (tail
//! words and metadata entries), probed by the switch over real soft RNICs
//! in the simulator. The switch never panics and never emits a malformed
//! frame.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let Some((selector, rest)) = bytes.split_first() else {
        return;
    };
    if selector & 1 == 1 {
        remora_cowbird::fuzzing::p4_hostile_answers(rest);
    } else {
        remora_cowbird::fuzzing::p4_hostile_block(rest);
    }
});
