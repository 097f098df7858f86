//! Checkpoints on the device, and recovery from them.
//!
//! Far memory outlives the compute host, so the log on the device is the
//! store's durable state. A checkpoint is FASTER's fold-over: the tail's
//! page is ended, every page before it becomes read-only and is flushed,
//! and a checkpoint record naming the log's begin and tail is written to
//! one of two slots at the device's start (alternating, so that a crash
//! while writing one leaves the other whole). Recovery reads the newer
//! valid record and rebuilds the hash index by scanning the log from
//! begin to tail: each record's previous-address already chains the
//! older records of its bucket entry, so the index needs only each
//! entry's newest record. Writes acknowledged before the checkpoint began
//! are in it; later ones are not.

use crate::address::{LogAddress, FIRST_ADDRESS};
use crate::device::{DeviceError, DeviceQueue};
use crate::record::{parse_stored, record_bytes, Header, Parsed, StoredRecord, KEY_OFFSET_BYTES};

/// One checkpoint record's slot: one direct-I/O block.
pub const RECORD_SLOT_BYTES: u64 = 4096;
const MAGIC: &[u8; 8] = b"RMKVCKPT";
/// 2: every record's sizes word carries its written mark (see
/// `record::sizes_word`); a log of format 1 would read as never written.
const FORMAT_VERSION: u32 = 2;
/// Magic, version, page bits, sequence, begin, tail, then a CRC-32.
const RECORD_BYTES: usize = 8 + 4 + 4 + 8 + 8 + 8 + 4;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    #[error("the device holds no valid checkpoint record")]
    NoCheckpoint,
    #[error("the checkpoint was taken with pages of 2^{found} bytes; the store is configured for 2^{configured}")]
    PageSize { found: u32, configured: u32 },
    #[error("the checkpoint record's log runs from {begin} to {tail}, more than this device's {capacity_bytes} bytes hold: not a record this store wrote")]
    ImpossibleLog {
        begin: LogAddress,
        tail: LogAddress,
        capacity_bytes: u64,
    },
    #[error("a record at {address} does not parse: {reason}")]
    CorruptLog {
        address: LogAddress,
        reason: &'static str,
    },
    #[error("the session has {0} operations pending: complete them before a checkpoint")]
    PendingOperations(usize),
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// What a checkpoint record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointRecord {
    pub sequence: u64,
    pub page_bits: u32,
    pub begin: LogAddress,
    pub tail: LogAddress,
}

impl CheckpointRecord {
    /// The slot's bytes: the record, a CRC-32 over it, zeros to the end.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(RECORD_SLOT_BYTES as usize);
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&self.page_bits.to_le_bytes());
        bytes.extend_from_slice(&self.sequence.to_le_bytes());
        bytes.extend_from_slice(&self.begin.value().to_le_bytes());
        bytes.extend_from_slice(&self.tail.value().to_le_bytes());
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        bytes.resize(RECORD_SLOT_BYTES as usize, 0);
        bytes
    }

    /// A slot's record, or `None` for a slot never written or torn.
    pub fn decode(bytes: &[u8]) -> Option<CheckpointRecord> {
        let bytes = bytes.get(..RECORD_BYTES)?;
        let (body, crc) = bytes.split_at(RECORD_BYTES - 4);
        if &body[..8] != MAGIC || crc32fast::hash(body).to_le_bytes() != crc {
            return None;
        }
        let word = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        let half = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().expect("4 bytes"));
        if half(8) != FORMAT_VERSION {
            return None;
        }
        Some(CheckpointRecord {
            page_bits: half(12),
            sequence: word(16),
            begin: LogAddress::new(word(24)),
            tail: LogAddress::new(word(32)),
        })
    }

    /// The slot this record goes to.
    pub fn slot_offset(&self) -> u64 {
        (self.sequence % 2) * RECORD_SLOT_BYTES
    }
}

/// Reads `length` bytes at `offset` through `queue`, waiting for them.
pub fn read_now(
    queue: &mut dyn DeviceQueue,
    offset: u64,
    length: usize,
    out: &mut Vec<u8>,
) -> Result<(), DeviceError> {
    let token = wait_token();
    queue.read(offset, length, token)?;
    wait_for(queue, token, DEVICE_WAIT, &mut |bytes| {
        out.clear();
        out.extend_from_slice(bytes.unwrap_or(&[]));
    })
}

/// Writes `data` at `offset` through `queue`, waiting for completion.
pub fn write_now(queue: &mut dyn DeviceQueue, offset: u64, data: &[u8]) -> Result<(), DeviceError> {
    let token = wait_token();
    queue.write(offset, data, token)?;
    wait_for(queue, token, DEVICE_WAIT, &mut |_| {})
}

/// The first token of the requests waited for at once: far above any
/// session's pending operation, whose tokens index its table.
const WAIT_TOKENS_FROM: u64 = 1 << 63;

/// Whether `token` is one of a request waited for at once.
pub fn is_wait_token(token: u64) -> bool {
    token >= WAIT_TOKENS_FROM
}

/// A token no request waited for at once has had (until 2^63 of them).
/// A fixed one let the completion a failed wait left behind pass for the
/// next wait's: the next checkpoint took its record for written before it
/// was (found by review).
fn wait_token() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let next = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    WAIT_TOKENS_FROM + next % WAIT_TOKENS_FROM
}

/// How long a request waited for at once may take: recovery, compaction
/// and checkpoints used to spin for ever on a device that stopped
/// answering.
pub const DEVICE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Polls `queue` until `token` completes, handing its completion to
/// `arrived`; at most `limit`.
fn wait_for(
    queue: &mut dyn DeviceQueue,
    token: u64,
    limit: std::time::Duration,
    arrived: &mut dyn FnMut(crate::device::Completed<'_>),
) -> Result<(), DeviceError> {
    let started = std::time::Instant::now();
    loop {
        let mut done = false;
        queue.poll(&mut |completed, bytes| {
            if completed == token {
                arrived(bytes);
                done = true;
            }
        })?;
        if done {
            return Ok(());
        }
        if started.elapsed() > limit {
            return Err(DeviceError::TimedOut(limit));
        }
        std::thread::yield_now();
    }
}

/// The valid records in the two slots, each with its slot's offset,
/// oldest first (of two with one sequence, slot 0 counts as the newer).
fn valid_records(queue: &mut dyn DeviceQueue) -> Result<Vec<(CheckpointRecord, u64)>, DeviceError> {
    let mut bytes = Vec::new();
    let mut records = Vec::with_capacity(2);
    for slot in 0..2 {
        let offset = slot * RECORD_SLOT_BYTES;
        read_now(queue, offset, RECORD_SLOT_BYTES as usize, &mut bytes)?;
        if let Some(record) = CheckpointRecord::decode(&bytes) {
            records.push((record, offset));
        }
    }
    records.sort_by_key(|(record, offset)| (record.sequence, std::cmp::Reverse(*offset)));
    Ok(records)
}

/// Leaves neither slot a valid record, the slot of the older record
/// first: a crash between the two writes leaves the newer, with the
/// device as it was before (nothing of the new store is written yet), and
/// its pages kept. The older record's pages may have been reused once the
/// newer was durable, so leaving it would recover a torn log.
pub fn wipe_records(queue: &mut dyn DeviceQueue) -> Result<(), DeviceError> {
    let zeros = vec![0u8; RECORD_SLOT_BYTES as usize];
    for (_, offset) in valid_records(queue)? {
        write_now(queue, offset, &zeros)?;
    }
    Ok(())
}

/// The newest valid checkpoint record on the device.
pub fn newest_record(queue: &mut dyn DeviceQueue) -> Result<CheckpointRecord, CheckpointError> {
    let newest = valid_records(queue)?.pop().map(|(record, _)| record);
    newest.ok_or(CheckpointError::NoCheckpoint)
}

/// Calls `each(address, record)` for every valid record of one page's
/// bytes (`page_start` is the page's first address), in address order.
pub fn scan_page(
    page_start: LogAddress,
    page: &[u8],
    mut each: impl FnMut(LogAddress, &StoredRecord<'_>),
) -> Result<(), CheckpointError> {
    let mut offset = if page_start.is_none() {
        FIRST_ADDRESS.value() as usize
    } else {
        0
    };
    while offset + KEY_OFFSET_BYTES as usize <= page.len() {
        let address = page_start.plus(offset as u64);
        let header = u64::from_le_bytes(page[offset..offset + 8].try_into().expect("8 bytes"));
        if Header(header).is_page_end() {
            return Ok(());
        }
        let record = match parse_stored(&page[offset..]) {
            Parsed::Whole(record) => record,
            Parsed::Corrupt(reason) => return Err(CheckpointError::CorruptLog { address, reason }),
            Parsed::Needs(_) => {
                let reason = "a record crosses its page's end";
                return Err(CheckpointError::CorruptLog { address, reason });
            }
        };
        if !record.header.is_invalid() {
            each(address, &record);
        }
        let capacity = stored_capacity(&page[offset..]);
        offset += record_bytes(record.key.len(), capacity) as usize;
    }
    Ok(())
}

/// A stored record's value capacity (its size word's high half).
fn stored_capacity(bytes: &[u8]) -> usize {
    let word = u64::from_le_bytes(bytes[8..16].try_into().expect("parsed records have sizes"));
    crate::record::sizes(word).1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `read_now` and `write_now` polled for ever for a completion that
    /// never came (found by reading); the wait now ends with a typed error.
    #[test]
    fn a_wait_for_a_completion_that_never_comes_times_out() {
        let device = crate::MemoryDevice::new(1 << 20);
        let mut queue = crate::Device::open_queue(&device).unwrap();
        let limit = std::time::Duration::from_millis(20);
        let waited = wait_for(queue.as_mut(), 5, limit, &mut |_| {});
        assert_eq!(waited, Err(DeviceError::TimedOut(limit)));
        queue.write(0, &[1; 8], 5).unwrap();
        assert_eq!(wait_for(queue.as_mut(), 5, limit, &mut |_| {}), Ok(()));
    }

    #[test]
    fn a_record_round_trips_and_a_torn_one_is_refused() {
        let record = CheckpointRecord {
            sequence: 7,
            page_bits: 16,
            begin: LogAddress::new(0),
            tail: LogAddress::new(5 << 16),
        };
        let mut bytes = record.encode();
        assert_eq!(bytes.len(), RECORD_SLOT_BYTES as usize);
        assert_eq!(CheckpointRecord::decode(&bytes), Some(record));
        assert_eq!(record.slot_offset(), RECORD_SLOT_BYTES);
        bytes[30] ^= 1;
        assert_eq!(CheckpointRecord::decode(&bytes), None);
        assert_eq!(CheckpointRecord::decode(&[0; 64]), None);
    }
}
