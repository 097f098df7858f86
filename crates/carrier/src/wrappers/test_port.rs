//! A port for the wrappers' unit tests: it keeps what it is sent, hands up
//! the frames it was given, and may then fail as a corrupt ring does.

use crate::wait::WaitSource;
use crate::{CarrierError, Port, SendStatus};

#[derive(Default)]
pub(crate) struct TestPort {
    pub sent: Vec<Vec<u8>>,
    /// Handed up by the next receive, in order.
    pub to_receive: Vec<Vec<u8>>,
    /// The receive that hands them up then fails.
    pub then_corrupt: bool,
}

impl Port for TestPort {
    fn receive(
        &mut self,
        max_frames: usize,
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, CarrierError> {
        let count = self.to_receive.len().min(max_frames);
        for frame in self.to_receive.drain(..count) {
            sink(&frame);
        }
        if self.then_corrupt {
            return Err(CarrierError::Segment(
                "a length prefix past its slot".into(),
            ));
        }
        Ok(count)
    }

    fn send(&mut self, frame: &[u8]) -> Result<SendStatus, CarrierError> {
        self.sent.push(frame.to_vec());
        Ok(SendStatus::Queued)
    }

    fn flush(&mut self) -> Result<(), CarrierError> {
        Ok(())
    }

    fn has_room(&mut self) -> bool {
        true
    }

    fn has_frames(&mut self) -> bool {
        !self.to_receive.is_empty()
    }

    fn wait_source(&self) -> WaitSource {
        WaitSource::Fd(-1)
    }
}
