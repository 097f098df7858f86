//! A pcap writer that any port can feed: the bytes Wireshark opens are the
//! bytes the carrier moved.

use crate::{CarrierError, Port, SendStatus};
use pcap_file::pcap::{PcapPacket, PcapWriter};
use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Bytes of whole records a sink buffers before it writes them out.
const FLUSH_AT_BYTES: usize = 8 * 1024;

/// The records the pcap writer produced and the file has not yet taken.
/// The writer writes a record in pieces; the sink's lock is held for a
/// whole record (see [`SinkState`]), so each write to the file is of
/// whole records.
#[derive(Clone)]
struct RecordBuffer(Arc<Mutex<Vec<u8>>>);

impl Write for RecordBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .expect("pcap buffer poisoned")
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The capture file, opened for appending. Several processes may share
/// one (both ends of a verbs program given the same `REMORA_VERBS_PCAP`):
/// each writes whole records with one `write` to the file's end, and each
/// holds a shared `flock` while it has the file open. The first opens it
/// alone (an exclusive lock taken at once), so it empties the file and
/// writes the pcap header; a later one finds it held, and only appends.
/// Both truncated it and wrote at their own offsets before, and the
/// capture interleaved two streams' bytes (tshark flagged it malformed).
struct CaptureFile {
    file: File,
}

impl CaptureFile {
    /// Opens `path`; a first writer empties it and writes `header` while
    /// it holds the file alone (after, a second opener could take the
    /// exclusive lock in the gap of the turn to shared, or append before
    /// the header). The header's write error, if it failed: the capture
    /// starts stopped, as a later failed write stops it.
    fn open(path: &Path, header: &[u8]) -> Result<(CaptureFile, Option<String>), CarrierError> {
        use rustix::fs::{flock, FlockOperation};
        let failed = |operation, source| CarrierError::File {
            operation,
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| failed("cannot create the capture file", source))?;
        let mut capture = CaptureFile { file };
        let first = flock(&capture.file, FlockOperation::NonBlockingLockExclusive).is_ok();
        let regular = capture
            .file
            .metadata()
            .is_ok_and(|metadata| metadata.is_file());
        let mut header_failed = None;
        if first {
            if regular {
                capture
                    .file
                    .set_len(0)
                    .map_err(|source| failed("cannot empty the capture file", source))?;
            }
            if let Err(error) = capture.write_out(&mut header.to_vec()) {
                header_failed = Some(CarrierError::io("write pcap header", error).to_string());
            }
        }
        // Held while the file is open (a first writer's lock turns shared):
        // the next writer finds the file in use and leaves it whole.
        flock(&capture.file, FlockOperation::LockShared)
            .map_err(|error| failed("cannot lock the capture file", error.into()))?;
        Ok((capture, header_failed))
    }

    /// Appends `records` (whole ones) with one write where the file
    /// allows, and empties the buffer.
    fn write_out(&mut self, records: &mut Vec<u8>) -> std::io::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let written = self.file.write_all(records);
        records.clear();
        written
    }
}

/// One pcap file (Ethernet link type), shareable by several ports so a
/// whole switch can write one capture, and by several processes (see
/// [`CaptureFile`]). Buffered; flushed by [`PcapSink::flush`], once
/// [`FLUSH_AT_BYTES`] are buffered, and when the last clone drops.
#[derive(Clone)]
pub struct PcapSink {
    state: Arc<Mutex<SinkState>>,
    /// Why the capture stopped, once a write failed (a full disk): the
    /// ports it watches go on without it.
    stopped: Arc<Mutex<Option<String>>>,
}

/// The writer, the records it buffered and the file they go to, under
/// one lock: held for a whole record, so the buffer always ends at a
/// record's end when it is written out.
struct SinkState {
    writer: PcapWriter<RecordBuffer>,
    /// The writer's own buffer, reachable from outside it.
    buffer: RecordBuffer,
    file: CaptureFile,
}

impl SinkState {
    /// Appends the buffered records to the file.
    fn write_out(&mut self) -> Result<(), CarrierError> {
        let mut records = self.buffer.0.lock().expect("pcap buffer poisoned");
        self.file
            .write_out(&mut records)
            .map_err(|error| CarrierError::io("write pcap file", error))
    }
}

impl Drop for SinkState {
    /// The last sink went: what it buffered goes out.
    fn drop(&mut self) {
        let _ = self.write_out();
    }
}

impl PcapSink {
    pub fn create(path: &Path) -> Result<PcapSink, CarrierError> {
        let buffer = RecordBuffer(Arc::new(Mutex::new(Vec::new())));
        let writer = PcapWriter::new(buffer.clone()).map_err(|error| {
            CarrierError::io(
                "write pcap header",
                std::io::Error::other(error.to_string()),
            )
        })?;
        // The header the writer made goes to the file at its opening (by
        // its first writer only); the buffer keeps records alone.
        let header = std::mem::take(&mut *buffer.0.lock().expect("pcap buffer poisoned"));
        let (file, stopped) = CaptureFile::open(path, &header)?;
        Ok(PcapSink {
            state: Arc::new(Mutex::new(SinkState {
                writer,
                buffer,
                file,
            })),
            stopped: Arc::new(Mutex::new(stopped)),
        })
    }

    /// Writes one frame stamped `timestamp` since the Unix epoch.
    pub fn write(&self, timestamp: Duration, frame: &[u8]) -> Result<(), CarrierError> {
        let packet = PcapPacket::new(timestamp, frame.len() as u32, frame);
        let mut state = self.state();
        state.writer.write_packet(&packet).map_err(|error| {
            CarrierError::io(
                "write pcap packet",
                std::io::Error::other(error.to_string()),
            )
        })?;
        let full = state.buffer.0.lock().expect("pcap buffer poisoned").len() >= FLUSH_AT_BYTES;
        if full {
            state.write_out()?;
        }
        Ok(())
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
        self.state().write_out()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SinkState> {
        self.state.lock().expect("pcap sink poisoned")
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
