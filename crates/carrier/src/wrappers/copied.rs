//! Received frames copied out of memory another process can write, before
//! anyone parses them.
//!
//! A ring port hands its consumer the frame where it lies, in the shared
//! segment. Parsers check a field and read it again later (a length, an
//! opcode's header), which is sound for memory nobody else writes. A node
//! process of a `rack up` maps the whole segment, so a faulty or hostile
//! sibling could rewrite a published slot while it is parsed and make the
//! second read disagree with the first: a panic where a malformed frame
//! must be dropped and counted. Over this wrapper, every frame is parsed
//! from a private copy. (The switch copies first for the same reason.)

use crate::{CarrierError, Port, SendStatus};

/// Hands `sink` a private copy of each frame the port it wraps receives.
pub struct Copied<P> {
    inner: P,
    /// The copy, reused frame after frame.
    scratch: Vec<u8>,
}

impl<P: Port> Copied<P> {
    pub fn new(inner: P) -> Copied<P> {
        Copied {
            inner,
            scratch: Vec::new(),
        }
    }
}

impl<P: Port> Port for Copied<P> {
    fn receive(
        &mut self,
        max_frames: usize,
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, CarrierError> {
        let scratch = &mut self.scratch;
        self.inner.receive(max_frames, &mut |frame| {
            scratch.clear();
            scratch.extend_from_slice(frame);
            sink(scratch);
        })
    }

    fn send(&mut self, frame: &[u8]) -> Result<SendStatus, CarrierError> {
        self.inner.send(frame)
    }

    fn flush(&mut self) -> Result<(), CarrierError> {
        self.inner.flush()
    }

    pass_through_port_state!();
    pass_through_next_due!();
}
