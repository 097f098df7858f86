//! A hostile Redis client: any bytes as one pipelined batch to the KV
//! store's RESP front end, over a store whose first keys are on the
//! device, and as two connections' batches in one server round. The
//! parser and the executor never panic, the replies are one well-formed
//! RESP value per request, and a round answers as the batches would one
//! after the other.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    remora_kv::fuzzing::resp(bytes);
    remora_kv::fuzzing::resp_round(bytes);
});
