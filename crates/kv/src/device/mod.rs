//! Devices behind the log's stable region, behind one trait shaped like
//! FASTER's `IDevice`: asynchronous reads and writes of byte ranges,
//! completed by polling.
//!
//! A [`Device`] is shared by the store; each thread opens its own
//! [`DeviceQueue`] on it (Cowbird's `poll_create` per thread), issues on
//! it and polls it. Writes copy their bytes when issued. A read of bytes
//! whose write has not completed is never issued by the store: a page
//! leaves memory only after its flush completes.

pub mod call_time;
pub mod choice;
#[cfg(test)]
pub(crate) mod fails_once;
pub mod far_memory;
pub mod file;
pub mod memory;
pub mod rack_nic;

pub use choice::{DeviceKind, FileSettings, OpenDevice};
pub use far_memory::{FarMemoryDevice, FarMemoryPath};
pub use file::FileDevice;
pub use memory::MemoryDevice;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceError {
    #[error("{length} bytes at offset {offset} are outside the device's {capacity_bytes} bytes")]
    OutOfRange {
        offset: u64,
        length: u64,
        capacity_bytes: u64,
    },
    #[error("a write of {length} bytes at offset {offset} is not aligned to the device's {alignment_bytes} bytes")]
    Unaligned {
        offset: u64,
        length: u64,
        alignment_bytes: u64,
    },
    #[error("device I/O failed: {0}")]
    Io(String),
    #[error("the device's workers are gone")]
    Closed,
    #[error("the far-memory path failed: {0}")]
    FarMemory(String),
    #[error("a far-memory device is one registered region of at most {limit_bytes} bytes, not {capacity_bytes}")]
    TooLarge {
        capacity_bytes: u64,
        limit_bytes: u64,
    },
    #[error("the device is gone: its NIC's host is down")]
    Gone,
    /// A request waited for at once got no completion in time.
    #[error("the device did not complete a request within {0:?}")]
    TimedOut(std::time::Duration),
    /// One request failed, and only it: the queue goes on. `poll` returns
    /// it (one per call) so that its caller can fail the request's owner
    /// rather than wait for a completion that never comes.
    #[error("request {token} failed: {reason}")]
    RequestFailed { token: u64, reason: String },
}

/// What a completion carries: a read's bytes, or nothing for a write.
pub type Completed<'a> = Option<&'a [u8]>;

/// A device shared by every thread of a store.
pub trait Device: Send + Sync {
    /// A short name for reports: `memory`, `file`, `cowbird-spot`, ...
    fn name(&self) -> &str;
    fn capacity_bytes(&self) -> u64;
    /// The longest read or write one request may move: a log page must
    /// fit, since flushes, compaction and recovery move whole pages.
    fn max_request_bytes(&self) -> u64 {
        u64::MAX
    }
    /// A queue for one thread.
    fn open_queue(&self) -> Result<Box<dyn DeviceQueue>, DeviceError>;
}

/// One thread's queue on a device.
pub trait DeviceQueue: Send {
    /// Starts a read; its bytes come back from [`DeviceQueue::poll`] with
    /// `token`. A full queue waits for room inside the call.
    fn read(&mut self, offset: u64, length: usize, token: u64) -> Result<(), DeviceError>;
    /// Starts a write of a copy of `data`.
    fn write(&mut self, offset: u64, data: &[u8], token: u64) -> Result<(), DeviceError>;
    /// Hands every finished request to `done`, and returns how many.
    fn poll(&mut self, done: &mut dyn FnMut(u64, Completed<'_>)) -> Result<usize, DeviceError>;
    /// Requests issued and not yet handed out by `poll`.
    fn in_flight(&self) -> usize;
}

/// Refuses a range past the device's end.
pub fn check_range(offset: u64, length: u64, capacity_bytes: u64) -> Result<(), DeviceError> {
    match offset.checked_add(length) {
        Some(end) if end <= capacity_bytes => Ok(()),
        _ => Err(DeviceError::OutOfRange {
            offset,
            length,
            capacity_bytes,
        }),
    }
}

/// Completions a queue has finished but not yet handed out, with their
/// bytes kept in one reused buffer.
#[derive(Default)]
pub struct Finished {
    bytes: Vec<u8>,
    entries: Vec<(u64, Option<(usize, usize)>)>,
}

impl Finished {
    pub fn push_read(&mut self, token: u64, data: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(data);
        self.entries.push((token, Some((start, data.len()))));
    }

    pub fn push_write(&mut self, token: u64) {
        self.entries.push((token, None));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Hands everything out and empties.
    pub fn drain(&mut self, done: &mut dyn FnMut(u64, Completed<'_>)) -> usize {
        let count = self.entries.len();
        for &(token, range) in &self.entries {
            done(
                token,
                range.map(|(start, length)| &self.bytes[start..start + length]),
            );
        }
        self.entries.clear();
        self.bytes.clear();
        count
    }
}
