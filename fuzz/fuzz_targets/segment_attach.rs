//! A shared-memory segment is written by other processes: attaching to an
//! arbitrary one must be refused or work, never crash, and a corrupt ring
//! must be reported, not read out of bounds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use remora_carrier::{Port, Segment, SegmentPlan};

fuzz_target!(|data: &[u8]| {
    // Start from a valid two-spoke segment and overwrite a prefix of it
    // with the input, so the fuzzer reaches past the magic number.
    let valid = Segment::shared("fuzz", &SegmentPlan::star(2, 2)).unwrap();
    let duplicate = rustix::io::dup(valid.shared_fd().unwrap()).unwrap();
    let file = std::fs::File::from(rustix::io::dup(&duplicate).unwrap());
    std::os::unix::fs::FileExt::write_all_at(&file, &data[..data.len().min(64 * 1024)], 0).unwrap();
    drop(valid);
    if let Ok(segment) = Segment::attach(duplicate) {
        for spoke in 1..=2 {
            if let Ok(mut port) = segment.spoke_port(spoke) {
                let _ = port.receive(8, &mut |frame| assert!(frame.len() <= remora_carrier::MAX_CARRIED_FRAME_BYTES));
                let _ = port.has_room();
            }
        }
    }
});
