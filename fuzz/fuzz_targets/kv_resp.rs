//! A hostile Redis client: any bytes as one pipelined batch to the KV
//! store's RESP front end, over a store whose first keys are on the
//! device. The parser and the executor never panic, and the replies are
//! one well-formed RESP value per request.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    remora_kv::fuzzing::resp(bytes);
});
