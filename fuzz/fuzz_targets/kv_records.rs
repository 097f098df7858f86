//! A corrupt device: any bytes where the KV store expects a record, a
//! checkpoint record slot or a page of the log. Pending reads and
//! recovery refuse them without a panic, and a checkpoint record that
//! decodes re-encodes to itself.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    remora_kv::fuzzing::records(bytes);
});
