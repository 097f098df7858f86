//! A lock-free single-producer single-consumer ring of fixed-size slots.
//!
//! The ring's state is two counters that only grow: `tail` (slots the
//! producer has published) and `head` (slots the consumer has released).
//! Slot `i` lives at index `i % depth`. The producer writes slots past
//! `tail` and publishes them with one release store; the consumer reads
//! slots below `tail` after an acquire load and releases them with one
//! release store of `head`. Each side caches the other's counter and reads
//! it again only when the cache says the ring is full (or empty), so in
//! steady state a batch costs one shared-cache-line transfer each way.
//!
//! The counters live in a [`RingHeader`] and the slots in any
//! [`SlotStorage`]: mapped memory in production, `loom` cells in the model
//! checker (`RUSTFLAGS="--cfg loom" cargo test -p remora-carrier --test
//! loom_ring --release`), which sees every slot access and so catches a
//! data race between producer and consumer.

#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

use remora_base::copy_bytes;

/// Each slot starts with the frame's length.
pub const SLOT_LENGTH_PREFIX_BYTES: usize = 4;

/// One counter on its own cache line, so producer and consumer do not
/// false-share.
#[repr(C, align(128))]
pub struct PaddedCounter(pub AtomicU64);

/// The shared state of one ring. `repr(C)` because it is laid out in memory
/// shared between processes.
#[repr(C)]
pub struct RingHeader {
    pub tail: PaddedCounter,
    pub head: PaddedCounter,
}

impl RingHeader {
    pub fn new() -> RingHeader {
        RingHeader {
            tail: PaddedCounter(AtomicU64::new(0)),
            head: PaddedCounter(AtomicU64::new(0)),
        }
    }
}

impl Default for RingHeader {
    fn default() -> Self {
        RingHeader::new()
    }
}

/// Where the slots live.
///
/// # Safety
/// `slot_mut(i)` and `slot(i)` must give access to `slot_bytes()` bytes
/// that no other index aliases. Callers promise the SPSC discipline: a slot
/// is written only by the producer while unpublished and read only by the
/// consumer while published and unreleased.
pub unsafe trait SlotStorage {
    fn slot_count(&self) -> usize;
    fn slot_bytes(&self) -> usize;
    /// # Safety
    /// Only the producer calls this, for a slot it owns.
    unsafe fn with_slot_mut<R>(&self, index: usize, f: impl FnOnce(&mut [u8]) -> R) -> R;
    /// # Safety
    /// Only the consumer calls this, for a published slot.
    unsafe fn with_slot<R>(&self, index: usize, f: impl FnOnce(&[u8]) -> R) -> R;
}

/// The peer wrote what no correct producer could.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RingCorrupt {
    #[error("peer published tail {tail} against head {head}")]
    Tail { head: u64, tail: u64 },
    #[error("peer wrote a {length_bytes}-byte frame at sequence {sequence} into slots of {capacity_bytes} bytes")]
    Length {
        sequence: u64,
        length_bytes: u32,
        capacity_bytes: usize,
    },
}

/// Slots in plain memory, such as a mapping: `count` slots of `slot_bytes`
/// starting at `base`.
pub struct RawSlots {
    base: *mut u8,
    slot_bytes: usize,
    count: usize,
}

impl RawSlots {
    /// # Safety
    /// `base` must point to `count * slot_bytes` bytes that stay valid and
    /// are used only as this ring's slots for the life of the value.
    pub unsafe fn new(base: *mut u8, slot_bytes: usize, count: usize) -> RawSlots {
        RawSlots {
            base,
            slot_bytes,
            count,
        }
    }
}

// SAFETY: the pointer is to shared memory whose use is governed by the ring
// protocol; moving the handle to another thread changes nothing.
unsafe impl Send for RawSlots {}

// SAFETY: distinct indices map to disjoint `slot_bytes` ranges.
unsafe impl SlotStorage for RawSlots {
    fn slot_count(&self) -> usize {
        self.count
    }

    fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    unsafe fn with_slot_mut<R>(&self, index: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
        assert!(index < self.count);
        // SAFETY: `index` is in bounds (asserted), so the range lies inside
        // the mapping; the caller owns this slot under the ring protocol,
        // so nobody else touches these bytes while `f` runs.
        f(unsafe {
            std::slice::from_raw_parts_mut(self.base.add(index * self.slot_bytes), self.slot_bytes)
        })
    }

    unsafe fn with_slot<R>(&self, index: usize, f: impl FnOnce(&[u8]) -> R) -> R {
        assert!(index < self.count);
        // SAFETY: as above; the slot is published and not being written.
        f(unsafe {
            std::slice::from_raw_parts(self.base.add(index * self.slot_bytes), self.slot_bytes)
        })
    }
}

/// The producer's end. There must be exactly one per ring.
pub struct Producer<'a, S: SlotStorage> {
    header: &'a RingHeader,
    slots: S,
    /// Next slot to write; published up to here by `publish`.
    local_tail: u64,
    /// The consumer's `head` as last read.
    cached_head: u64,
}

/// The consumer's end. There must be exactly one per ring.
pub struct Consumer<'a, S: SlotStorage> {
    header: &'a RingHeader,
    slots: S,
    local_head: u64,
    /// The producer's `tail` as last read.
    cached_tail: u64,
}

fn depth_of(slots: &impl SlotStorage) -> u64 {
    let depth = slots.slot_count();
    assert!(depth.is_power_of_two(), "ring depth must be a power of two");
    assert!(slots.slot_bytes() > SLOT_LENGTH_PREFIX_BYTES);
    depth as u64
}

impl<'a, S: SlotStorage> Producer<'a, S> {
    /// # Safety
    /// At most one producer may exist for `header` at a time, and `slots`
    /// must be the ring's own slots.
    pub unsafe fn new(header: &'a RingHeader, slots: S) -> Producer<'a, S> {
        depth_of(&slots);
        let tail = header.tail.0.load(Ordering::Acquire);
        let head = header.head.0.load(Ordering::Acquire);
        Producer {
            header,
            slots,
            local_tail: tail,
            cached_head: head,
        }
    }

    pub fn capacity_bytes(&self) -> usize {
        self.slots.slot_bytes() - SLOT_LENGTH_PREFIX_BYTES
    }

    pub fn has_room(&mut self) -> bool {
        let depth = self.slots.slot_count() as u64;
        if self.local_tail.wrapping_sub(self.cached_head) < depth {
            return true;
        }
        self.cached_head = self.header.head.0.load(Ordering::Acquire);
        // A head past the tail only comes from a broken peer process; the
        // wrapping difference is then huge and the ring looks full, which
        // drops (and counts) frames instead of overwriting unread slots.
        self.local_tail.wrapping_sub(self.cached_head) < depth
    }

    /// Writes one frame into the next slot, unpublished. Returns false if
    /// the ring is full.
    pub fn push(&mut self, frame: &[u8]) -> bool {
        assert!(frame.len() <= self.capacity_bytes());
        if !self.has_room() {
            return false;
        }
        // The depth is a power of two (checked at construction): a mask, not
        // a division, which costs tens of cycles per frame.
        let index = (self.local_tail & (self.slots.slot_count() as u64 - 1)) as usize;
        // SAFETY: slot `local_tail` is past the consumer's head and not yet
        // published, so only this producer touches it.
        unsafe {
            self.slots.with_slot_mut(index, |slot| {
                let length = frame.len() as u32;
                slot[..SLOT_LENGTH_PREFIX_BYTES].copy_from_slice(&length.to_le_bytes());
                copy_bytes(&mut slot[SLOT_LENGTH_PREFIX_BYTES..][..frame.len()], frame);
            });
        }
        // Sequence numbers wrap: the first one comes from the shared
        // header, which a peer process may have set anywhere.
        self.local_tail = self.local_tail.wrapping_add(1);
        true
    }

    /// Makes every pushed frame visible to the consumer. Returns whether
    /// anything new was published.
    pub fn publish(&mut self) -> bool {
        let published = self.header.tail.0.load(Ordering::Relaxed);
        if published == self.local_tail {
            return false;
        }
        self.header.tail.0.store(self.local_tail, Ordering::Release);
        true
    }
}

impl<'a, S: SlotStorage> Consumer<'a, S> {
    /// # Safety
    /// At most one consumer may exist for `header` at a time, and `slots`
    /// must be the ring's own slots.
    pub unsafe fn new(header: &'a RingHeader, slots: S) -> Consumer<'a, S> {
        depth_of(&slots);
        let head = header.head.0.load(Ordering::Acquire);
        Consumer {
            header,
            slots,
            local_head: head,
            cached_tail: head,
        }
    }

    /// Whether a published frame is waiting (reads the producer's tail).
    pub fn has_frames(&mut self) -> bool {
        if self.local_head != self.cached_tail {
            return true;
        }
        self.cached_tail = self.header.tail.0.load(Ordering::Acquire);
        self.local_head != self.cached_tail
    }

    /// Hands up to `max_frames` frames to `sink` straight from their slots,
    /// then releases the slots with one store.
    pub fn consume(
        &mut self,
        max_frames: usize,
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, RingCorrupt> {
        if !self.has_frames() {
            return Ok(0);
        }
        let depth = self.slots.slot_count() as u64;
        let available = self.cached_tail.wrapping_sub(self.local_head);
        if available > depth {
            // Only a broken peer process moves the tail backwards or more
            // than a lap ahead; refuse the ring rather than read garbage.
            return Err(RingCorrupt::Tail {
                head: self.local_head,
                tail: self.cached_tail,
            });
        }
        let count = available.min(max_frames as u64);
        let capacity = self.slots.slot_bytes() - SLOT_LENGTH_PREFIX_BYTES;
        let mut consumed = 0;
        let mut corrupt = None;
        while consumed < count && corrupt.is_none() {
            // Wrapping, as in `push`: the head too starts from the header.
            let sequence = self.local_head.wrapping_add(consumed);
            let index = (sequence & (depth - 1)) as usize;
            // SAFETY: the slot is below the acquired tail and not yet
            // released, so the producer does not touch it.
            unsafe {
                self.slots.with_slot(index, |slot| {
                    let mut prefix = [0u8; SLOT_LENGTH_PREFIX_BYTES];
                    prefix.copy_from_slice(&slot[..SLOT_LENGTH_PREFIX_BYTES]);
                    // A peer process could write nonsense: a length past
                    // the slot is refused, not cut to the slot (that
                    // handed up a frame of stale bytes).
                    let length_bytes = u32::from_le_bytes(prefix);
                    if length_bytes as usize > capacity {
                        corrupt = Some(RingCorrupt::Length {
                            sequence,
                            length_bytes,
                            capacity_bytes: capacity,
                        });
                        return;
                    }
                    sink(&slot[SLOT_LENGTH_PREFIX_BYTES..][..length_bytes as usize]);
                    consumed += 1;
                });
            }
        }
        // The frames handed up are released even when a later one is
        // corrupt; the corrupt one stays, and refuses the ring each time.
        self.local_head = self.local_head.wrapping_add(consumed);
        self.header.head.0.store(self.local_head, Ordering::Release);
        match corrupt {
            Some(corrupt) => Err(corrupt),
            None => Ok(consumed as usize),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOT_BYTES: usize = 64;
    const DEPTH: usize = 4;

    /// Sequence numbers come from the shared header, which a peer process
    /// may set anywhere: next to the top of the range, the producer's
    /// `+ 1` and the consumer's `head + count` overflowed (a panic in a
    /// debug build, an empty range and lost frames in a release build).
    #[test]
    fn frames_pass_where_the_sequence_numbers_wrap() {
        let header = RingHeader::new();
        let start = u64::MAX - 1;
        header.tail.0.store(start, Ordering::Relaxed);
        header.head.0.store(start, Ordering::Relaxed);
        let mut memory = vec![0u8; SLOT_BYTES * DEPTH];
        let base = memory.as_mut_ptr();
        // SAFETY: `memory` outlives both ends and is used only as slots;
        // one producer and one consumer, on this thread.
        let (mut producer, mut consumer) = unsafe {
            (
                Producer::new(&header, RawSlots::new(base, SLOT_BYTES, DEPTH)),
                Consumer::new(&header, RawSlots::new(base, SLOT_BYTES, DEPTH)),
            )
        };
        let mut received = Vec::new();
        for round in 0..3u8 {
            for frame in 0..3u8 {
                assert!(producer.push(&[round * 3 + frame; 5]));
            }
            producer.publish();
            let count = consumer
                .consume(8, &mut |frame| received.push(frame[0]))
                .expect("a sound ring");
            assert_eq!(count, 3);
        }
        assert_eq!(received, (0..9).collect::<Vec<u8>>());
        assert_eq!(header.head.0.load(Ordering::Relaxed), start.wrapping_add(9));
    }

    /// A peer wrote a length prefix past its slot: the consumer cut it to
    /// the slot and handed up a frame of stale bytes. It refuses the ring
    /// at that slot now, after handing up the frames before it.
    #[test]
    fn a_length_prefix_past_its_slot_is_refused_as_corrupt() {
        let header = RingHeader::new();
        let mut memory = vec![0u8; SLOT_BYTES * DEPTH];
        let base = memory.as_mut_ptr();
        // SAFETY: as above.
        let (mut producer, mut consumer) = unsafe {
            (
                Producer::new(&header, RawSlots::new(base, SLOT_BYTES, DEPTH)),
                Consumer::new(&header, RawSlots::new(base, SLOT_BYTES, DEPTH)),
            )
        };
        assert!(producer.push(&[1; 5]));
        assert!(producer.push(&[2; 5]));
        producer.publish();
        // The second slot's prefix, overwritten as a broken peer would.
        // SAFETY: both ends are idle on this thread.
        unsafe {
            std::ptr::copy_nonoverlapping(
                u32::MAX.to_le_bytes().as_ptr(),
                base.add(SLOT_BYTES),
                SLOT_LENGTH_PREFIX_BYTES,
            );
        }
        let mut received = Vec::new();
        let result = consumer.consume(8, &mut |frame| received.push(frame.to_vec()));
        assert_eq!(
            result,
            Err(RingCorrupt::Length {
                sequence: 1,
                length_bytes: u32::MAX,
                capacity_bytes: SLOT_BYTES - SLOT_LENGTH_PREFIX_BYTES,
            })
        );
        assert_eq!(received, vec![vec![1; 5]]);
        assert_eq!(header.head.0.load(Ordering::Relaxed), 1);
    }
}
