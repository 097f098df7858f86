//! Local memory as the device: the upper bound every other device is
//! measured against. Reads and writes complete at once, when issued.

use super::{check_range, Completed, Device, DeviceError, DeviceQueue, Finished};
use std::sync::{Arc, RwLock};

/// Bytes under one lock: a flush of one page does not block reads of others.
const STRIPE_BYTES: u64 = 64 * 1024;

pub struct MemoryDevice {
    stripes: Arc<[RwLock<Box<[u8]>>]>,
    capacity_bytes: u64,
}

impl MemoryDevice {
    /// A device of `capacity_bytes`, rounded up to whole stripes.
    pub fn new(capacity_bytes: u64) -> MemoryDevice {
        let count = capacity_bytes.div_ceil(STRIPE_BYTES).max(1);
        let stripes = (0..count)
            .map(|_| RwLock::new(vec![0u8; STRIPE_BYTES as usize].into_boxed_slice()))
            .collect();
        MemoryDevice {
            stripes,
            capacity_bytes,
        }
    }
}

impl Device for MemoryDevice {
    fn name(&self) -> &str {
        "memory"
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    fn open_queue(&self) -> Result<Box<dyn DeviceQueue>, DeviceError> {
        Ok(Box::new(MemoryQueue {
            stripes: self.stripes.clone(),
            capacity_bytes: self.capacity_bytes,
            finished: Finished::default(),
            scratch: Vec::new(),
        }))
    }
}

struct MemoryQueue {
    stripes: Arc<[RwLock<Box<[u8]>>]>,
    capacity_bytes: u64,
    finished: Finished,
    scratch: Vec<u8>,
}

impl MemoryQueue {
    /// Calls `each` with every stripe piece of `[offset, offset + length)`.
    fn pieces(offset: u64, length: u64, mut each: impl FnMut(usize, usize, usize, usize)) {
        let mut done = 0;
        while done < length {
            let at = offset + done;
            let stripe = (at / STRIPE_BYTES) as usize;
            let within = (at % STRIPE_BYTES) as usize;
            let take = (STRIPE_BYTES - at % STRIPE_BYTES).min(length - done) as usize;
            each(stripe, within, take, done as usize);
            done += take as u64;
        }
    }
}

impl DeviceQueue for MemoryQueue {
    fn read(&mut self, offset: u64, length: usize, token: u64) -> Result<(), DeviceError> {
        check_range(offset, length as u64, self.capacity_bytes)?;
        self.scratch.resize(length, 0);
        let (stripes, scratch) = (&self.stripes, &mut self.scratch);
        Self::pieces(offset, length as u64, |stripe, within, take, done| {
            let bytes = stripes[stripe].read().unwrap_or_else(|e| e.into_inner());
            scratch[done..done + take].copy_from_slice(&bytes[within..within + take]);
        });
        self.finished.push_read(token, &self.scratch);
        Ok(())
    }

    fn write(&mut self, offset: u64, data: &[u8], token: u64) -> Result<(), DeviceError> {
        check_range(offset, data.len() as u64, self.capacity_bytes)?;
        let stripes = &self.stripes;
        Self::pieces(offset, data.len() as u64, |stripe, within, take, done| {
            let mut bytes = stripes[stripe].write().unwrap_or_else(|e| e.into_inner());
            bytes[within..within + take].copy_from_slice(&data[done..done + take]);
        });
        self.finished.push_write(token);
        Ok(())
    }

    fn poll(&mut self, done: &mut dyn FnMut(u64, Completed<'_>)) -> Result<usize, DeviceError> {
        Ok(self.finished.drain(done))
    }

    fn in_flight(&self) -> usize {
        self.finished.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_written_across_stripes_read_back() {
        let device = MemoryDevice::new(3 * STRIPE_BYTES);
        let mut queue = device.open_queue().unwrap();
        let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let at = STRIPE_BYTES - 300;
        queue.write(at, &data, 1).unwrap();
        queue.read(at, data.len(), 2).unwrap();
        let mut seen = Vec::new();
        queue
            .poll(&mut |token, bytes| seen.push((token, bytes.map(<[u8]>::to_vec))))
            .unwrap();
        assert_eq!(seen, vec![(1, None), (2, Some(data))]);
        assert_eq!(queue.in_flight(), 0);
    }

    #[test]
    fn a_read_past_the_end_is_refused() {
        let device = MemoryDevice::new(STRIPE_BYTES);
        let mut queue = device.open_queue().unwrap();
        assert!(matches!(
            queue.read(STRIPE_BYTES - 8, 16, 0),
            Err(DeviceError::OutOfRange { .. })
        ));
    }
}
