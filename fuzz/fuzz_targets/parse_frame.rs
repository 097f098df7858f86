//! Any bytes: parsing never panics, and what parses re-emits to a frame
//! that parses to the same headers and payload.
#![no_main]

use libfuzzer_sys::fuzz_target;
use remora_wire::{emit_frame, parse_frame};

fuzz_target!(|bytes: &[u8]| {
    let Ok(parsed) = parse_frame(bytes) else {
        return;
    };
    let mut buffer = vec![0u8; parsed.repr.frame_len(parsed.payload.len())];
    let written = emit_frame(&parsed.repr, parsed.payload, &mut buffer).expect("a parsed frame re-emits");
    let again = parse_frame(&buffer[..written]).expect("an emitted frame parses");
    // Fields the emitter derives (lengths, pad) may differ from a frame that
    // carried IP options or Ethernet padding; the rest must match.
    assert_eq!(again.payload, parsed.payload);
    assert_eq!(again.repr.bth.opcode, parsed.repr.bth.opcode);
    assert_eq!(again.repr.bth.psn, parsed.repr.bth.psn);
    assert_eq!(again.repr.extension, parsed.repr.extension);
});
