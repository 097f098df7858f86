//! A pcap writer that any port can feed: the bytes Wireshark opens are the
//! bytes the carrier moved.

use crate::{CarrierError, Port, SendStatus};
use pcap_file::pcap::{PcapPacket, PcapWriter};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The buffered file under the pcap writer, reachable from outside it so
/// the sink can flush without giving the writer up.
#[derive(Clone)]
struct SharedFile(Arc<Mutex<BufWriter<File>>>);

impl Write for SharedFile {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("pcap file poisoned").write(bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.lock().expect("pcap file poisoned").flush()
    }
}

/// One pcap file (Ethernet link type), shareable by several ports so a
/// whole switch can write one capture. Buffered; flushed by
/// [`PcapSink::flush`] and when the last clone drops.
#[derive(Clone)]
pub struct PcapSink {
    writer: Arc<Mutex<PcapWriter<SharedFile>>>,
    file: SharedFile,
    /// Why the capture stopped, once a write failed (a full disk): the
    /// ports it watches go on without it.
    stopped: Arc<Mutex<Option<String>>>,
}

impl PcapSink {
    pub fn create(path: &Path) -> Result<PcapSink, CarrierError> {
        let file = File::create(path).map_err(|source| CarrierError::File {
            operation: "cannot create the capture file",
            path: path.to_path_buf(),
            source,
        })?;
        let file = SharedFile(Arc::new(Mutex::new(BufWriter::new(file))));
        let writer = PcapWriter::new(file.clone()).map_err(|error| {
            CarrierError::io(
                "write pcap header",
                std::io::Error::other(error.to_string()),
            )
        })?;
        Ok(PcapSink {
            writer: Arc::new(Mutex::new(writer)),
            file,
            stopped: Arc::new(Mutex::new(None)),
        })
    }

    /// Writes one frame stamped `timestamp` since the Unix epoch.
    pub fn write(&self, timestamp: Duration, frame: &[u8]) -> Result<(), CarrierError> {
        let packet = PcapPacket::new(timestamp, frame.len() as u32, frame);
        let mut writer = self.writer.lock().expect("pcap writer poisoned");
        writer.write_packet(&packet).map(|_| ()).map_err(|error| {
            CarrierError::io(
                "write pcap packet",
                std::io::Error::other(error.to_string()),
            )
        })
    }

    /// Writes one frame stamped with the wall clock.
    pub fn write_now(&self, frame: &[u8]) -> Result<(), CarrierError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        self.write(now, frame)
    }

    /// Records a frame a port moved, stamped with the wall clock. A write
    /// that fails stops the capture (see [`PcapSink::failure`]), never the
    /// port: taken for the port's failure, a full disk took the switch's
    /// ports out of service one by one.
    pub fn record(&self, frame: &[u8]) {
        let mut stopped = self.stopped.lock().expect("capture state poisoned");
        if stopped.is_some() {
            return;
        }
        if let Err(error) = self.write_now(frame) {
            *stopped = Some(error.to_string());
        }
    }

    /// Why the capture stopped early, if it did.
    pub fn failure(&self) -> Option<String> {
        self.stopped.lock().expect("capture state poisoned").clone()
    }

    pub fn flush(&self) -> Result<(), CarrierError> {
        self.file
            .clone()
            .flush()
            .map_err(|error| CarrierError::io("flush pcap file", error))
    }
}

/// Which frames a [`Captured`] port records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureDirection {
    Received,
    Sent,
    Both,
}

/// Records frames passing through the port it wraps.
pub struct Captured<P> {
    inner: P,
    sink: PcapSink,
    direction: CaptureDirection,
}

impl<P: Port> Captured<P> {
    pub fn new(inner: P, sink: PcapSink, direction: CaptureDirection) -> Captured<P> {
        Captured {
            inner,
            sink,
            direction,
        }
    }
}

impl<P: Port> Port for Captured<P> {
    fn receive(
        &mut self,
        max_frames: usize,
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, CarrierError> {
        let record = self.direction != CaptureDirection::Sent;
        self.inner.receive(max_frames, &mut |frame| {
            if record {
                self.sink.record(frame);
            }
            sink(frame);
        })
    }

    fn send(&mut self, frame: &[u8]) -> Result<SendStatus, CarrierError> {
        let status = self.inner.send(frame)?;
        if status == SendStatus::Queued && self.direction != CaptureDirection::Received {
            self.sink.record(frame);
        }
        Ok(status)
    }

    fn flush(&mut self) -> Result<(), CarrierError> {
        self.inner.flush()
    }

    pass_through_port_state!();
    pass_through_next_due!();
}
