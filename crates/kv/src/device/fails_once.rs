//! A device for tests of failure paths: a memory device whose queues fail
//! one poll that has a completion to deliver, losing nothing.

use crate::device::{Completed, Finished};
use crate::{Device, DeviceError, DeviceQueue, MemoryDevice};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A memory device whose queues fail a poll that has a completion (a
/// read's or a write's) to deliver, losing nothing: the next poll
/// delivers it.
pub(crate) struct FailsOnce {
    device: MemoryDevice,
    /// `None`: each queue fails its first such poll of a session's
    /// request (not one the store waits for at once, as a new store's
    /// wipe of the checkpoint slots). `Some(chosen)`: the first poll of
    /// any queue that brings a chosen token's completion fails, once armed.
    token: Option<fn(u64) -> bool>,
    /// For `token`: whether that poll is still to come.
    armed: Arc<AtomicBool>,
}

impl FailsOnce {
    /// Each queue fails its first poll that has a completion.
    pub(crate) fn new(device: MemoryDevice) -> FailsOnce {
        FailsOnce {
            device,
            token: None,
            armed: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Once [`FailsOnce::arm`]ed, the first poll that brings the
    /// completion of a token `chosen` picks fails, once.
    pub(crate) fn on_token(device: MemoryDevice, chosen: fn(u64) -> bool) -> FailsOnce {
        FailsOnce {
            device,
            token: Some(chosen),
            armed: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Arms an [`FailsOnce::on_token`] device (after the store is made).
    pub(crate) fn arm(&self) {
        self.armed.store(true, Ordering::Relaxed);
    }
}

struct FailsOnceQueue {
    inner: Box<dyn DeviceQueue>,
    token: Option<fn(u64) -> bool>,
    /// Set: the next poll that qualifies fails.
    armed: Arc<AtomicBool>,
    held: Finished,
}

impl Device for FailsOnce {
    fn name(&self) -> &str {
        "fails-once"
    }
    fn capacity_bytes(&self) -> u64 {
        self.device.capacity_bytes()
    }
    fn open_queue(&self) -> Result<Box<dyn DeviceQueue>, DeviceError> {
        let armed = match self.token {
            Some(_) => Arc::clone(&self.armed),
            None => Arc::new(AtomicBool::new(true)),
        };
        Ok(Box::new(FailsOnceQueue {
            inner: self.device.open_queue()?,
            token: self.token,
            armed,
            held: Finished::default(),
        }))
    }
}

impl DeviceQueue for FailsOnceQueue {
    fn read(&mut self, offset: u64, length: usize, token: u64) -> Result<(), DeviceError> {
        self.inner.read(offset, length, token)
    }
    fn write(&mut self, offset: u64, data: &[u8], token: u64) -> Result<(), DeviceError> {
        self.inner.write(offset, data, token)
    }
    fn poll(&mut self, done: &mut dyn FnMut(u64, Completed<'_>)) -> Result<usize, DeviceError> {
        let (held, wanted) = (&mut self.held, self.token);
        let mut qualifies = wanted.is_none() && !held.is_empty();
        self.inner.poll(&mut |token, bytes| {
            qualifies |= match wanted {
                Some(chosen) => chosen(token),
                None => !crate::checkpoint::is_wait_token(token),
            };
            match bytes {
                Some(bytes) => held.push_read(token, bytes),
                None => held.push_write(token),
            }
        })?;
        if qualifies && self.armed.swap(false, Ordering::Relaxed) {
            return Err(DeviceError::Io("injected".into()));
        }
        Ok(self.held.drain(done))
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.held.len()
    }
}
