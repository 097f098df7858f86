//! The demo's frames, stamped with virtual time and kept in order, then
//! written through the carriers' pcap writer, so Wireshark opens the exact
//! bytes the devices exchanged.

use remora_carrier::wrappers::PcapSink;
use std::path::Path;
use std::time::Duration;

/// Frames collected in order, written out at the end.
#[derive(Default)]
pub struct Capture {
    frames: Vec<(Duration, Vec<u8>)>,
}

impl Capture {
    /// Records one frame. Virtual time can stand still while several frames
    /// move, so each frame is also stamped one nanosecond after the last, to
    /// keep the capture in order.
    pub fn record(&mut self, virtual_time: Duration, frame: &[u8]) {
        let after_last = self
            .frames
            .last()
            .map_or(Duration::ZERO, |(at, _)| *at + Duration::from_nanos(1));
        self.frames
            .push((virtual_time.max(after_last), frame.to_vec()));
    }

    /// Appends another capture's frames after this one's.
    pub fn append(&mut self, other: Capture) {
        for (at, frame) in other.frames {
            self.record(at, &frame);
        }
    }

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn write(&self, path: &Path) -> Result<(), CaptureError> {
        let context = |source| CaptureError {
            path: path.to_path_buf(),
            source,
        };
        let sink = PcapSink::create(path).map_err(context)?;
        for (at, frame) in &self.frames {
            sink.write(*at, frame).map_err(context)?;
        }
        sink.flush().map_err(context)
    }
}

/// A pcap file that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct CaptureError {
    pub path: std::path::PathBuf,
    pub source: remora_carrier::CarrierError,
}
