//! Graph files (GAPBS .el/.wel/.sg, Ligra, SNAP): any bytes load or fail
//! with an error, never a panic; what loads is a valid CSR.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    remora_graph::fuzzing::any_graph_file(data);
});
