//! Host memory shared between application threads and the soft RNIC, as
//! pages an application registers with `ibv_reg_mr` stay its own: the
//! application reads and writes them with plain loads, stores and atomics
//! while the NIC DMAs into them.
//!
//! Every access is atomic, on 64-bit words (byte order little-endian
//! within a word), so a NIC thread and an application thread touching one
//! region never race in Rust's memory model. Word-sized atomics keep
//! mixed-size accesses out. Bulk copies are `Relaxed` word by word;
//! ordering between a payload and the flag that publishes it comes from
//! the caller's fences or acquire/release word accesses, exactly as a
//! DMA engine's write ordering would:
//!
//! - [`HostMemory::write`] issues a release fence first, so everything
//!   the writer did before (earlier payloads) is visible to whoever
//!   acquires a word this write stores;
//! - [`HostMemory::read`] issues an acquire fence last, so what the
//!   reader does next sees everything published before the words it read.

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;

const WORD_BYTES: usize = 8;

/// A zeroed block of shared, word-aligned host memory. Clones share it.
#[derive(Clone)]
pub struct HostMemory {
    words: Arc<[AtomicU64]>,
    length_bytes: usize,
}

impl std::fmt::Debug for HostMemory {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("HostMemory")
            .field("length_bytes", &self.length_bytes)
            .finish()
    }
}

/// An access outside the block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{length_bytes} bytes at offset {offset} are outside {block_bytes} bytes of host memory")]
pub struct HostMemoryOutOfBounds {
    pub offset: usize,
    pub length_bytes: usize,
    pub block_bytes: usize,
}

impl HostMemory {
    /// `length_bytes` of zeroed memory.
    pub fn new(length_bytes: usize) -> HostMemory {
        let word_count = length_bytes.div_ceil(WORD_BYTES);
        let words: Arc<[AtomicU64]> = (0..word_count).map(|_| AtomicU64::new(0)).collect();
        HostMemory {
            words,
            length_bytes,
        }
    }

    pub fn len(&self) -> usize {
        self.length_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.length_bytes == 0
    }

    /// Whether two handles share one block.
    pub fn same_block(&self, other: &HostMemory) -> bool {
        Arc::ptr_eq(&self.words, &other.words)
    }

    fn check(&self, offset: usize, length_bytes: usize) -> Result<(), HostMemoryOutOfBounds> {
        match offset.checked_add(length_bytes) {
            Some(end) if end <= self.length_bytes => Ok(()),
            _ => Err(HostMemoryOutOfBounds {
                offset,
                length_bytes,
                block_bytes: self.length_bytes,
            }),
        }
    }

    /// Copies `into.len()` bytes from `offset`, then fences (acquire).
    pub fn read(&self, offset: usize, into: &mut [u8]) -> Result<(), HostMemoryOutOfBounds> {
        self.check(offset, into.len())?;
        let head = ((WORD_BYTES - offset % WORD_BYTES) % WORD_BYTES).min(into.len());
        let (head_bytes, rest) = into.split_at_mut(head);
        self.read_partial(offset, head_bytes);
        let first = (offset + head) / WORD_BYTES;
        let whole = rest.len() / WORD_BYTES;
        let mut chunks = rest.chunks_exact_mut(WORD_BYTES);
        // Whole words, zipped with their slice so that no word is bounds
        // checked on its own: this halved a 64 KiB copy.
        for (chunk, word) in (&mut chunks).zip(&self.words[first..first + whole]) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        self.read_partial((first + whole) * WORD_BYTES, chunks.into_remainder());
        fence(Ordering::Acquire);
        Ok(())
    }

    /// Bytes within one word.
    fn read_partial(&self, offset: usize, into: &mut [u8]) {
        if into.is_empty() {
            return;
        }
        let skip = offset % WORD_BYTES;
        assert!(skip + into.len() <= WORD_BYTES);
        let bytes = self.words[offset / WORD_BYTES]
            .load(Ordering::Relaxed)
            .to_le_bytes();
        into.copy_from_slice(&bytes[skip..skip + into.len()]);
    }

    /// Fences (release), then copies `from` to `offset`. Whole words are
    /// stored; partial words change only their own bytes.
    pub fn write(&self, offset: usize, from: &[u8]) -> Result<(), HostMemoryOutOfBounds> {
        self.check(offset, from.len())?;
        fence(Ordering::Release);
        let head = ((WORD_BYTES - offset % WORD_BYTES) % WORD_BYTES).min(from.len());
        let (head_bytes, rest) = from.split_at(head);
        if !head_bytes.is_empty() {
            self.write_partial(offset / WORD_BYTES, offset % WORD_BYTES, head_bytes);
        }
        let first = (offset + head) / WORD_BYTES;
        let whole = rest.len() / WORD_BYTES;
        let mut chunks = rest.chunks_exact(WORD_BYTES);
        for (chunk, word) in (&mut chunks).zip(&self.words[first..first + whole]) {
            let bytes: [u8; WORD_BYTES] = chunk.try_into().expect("a word");
            word.store(u64::from_le_bytes(bytes), Ordering::Relaxed);
        }
        let tail = chunks.remainder();
        if !tail.is_empty() {
            self.write_partial(first + whole, 0, tail);
        }
        Ok(())
    }

    /// Changes some bytes of one word and no others, in one atomic step.
    /// Two writers of disjoint bytes of one word both land. (Cleared and
    /// then set in two steps, a reader between them saw the bytes as
    /// zeros, neither the old value nor the new; found by reading.)
    fn write_partial(&self, word: usize, skip: usize, bytes: &[u8]) {
        assert!(skip + bytes.len() <= WORD_BYTES);
        let mut mask = [0u8; WORD_BYTES];
        let mut value = [0u8; WORD_BYTES];
        mask[skip..skip + bytes.len()].fill(0xff);
        value[skip..skip + bytes.len()].copy_from_slice(bytes);
        let (mask, value) = (u64::from_le_bytes(mask), u64::from_le_bytes(value));
        // A compare-and-swap loop: it retries only while another writer
        // changed the word in between, which each retry observes.
        let _ = self.words[word].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |current| {
            Some((current & !mask) | value)
        });
    }

    fn word(&self, offset: usize) -> Result<&AtomicU64, HostMemoryOutOfBounds> {
        self.check(offset, WORD_BYTES)?;
        if !offset.is_multiple_of(WORD_BYTES) {
            return Err(HostMemoryOutOfBounds {
                offset,
                length_bytes: WORD_BYTES,
                block_bytes: self.length_bytes,
            });
        }
        Ok(&self.words[offset / WORD_BYTES])
    }

    /// Loads the aligned word at `offset`.
    pub fn load_u64(&self, offset: usize, order: Ordering) -> Result<u64, HostMemoryOutOfBounds> {
        Ok(self.word(offset)?.load(order))
    }

    /// Stores the aligned word at `offset`.
    pub fn store_u64(
        &self,
        offset: usize,
        value: u64,
        order: Ordering,
    ) -> Result<(), HostMemoryOutOfBounds> {
        self.word(offset)?.store(value, order);
        Ok(())
    }

    /// Adds to the aligned word at `offset`; returns the original.
    pub fn fetch_add_u64(
        &self,
        offset: usize,
        value: u64,
        order: Ordering,
    ) -> Result<u64, HostMemoryOutOfBounds> {
        Ok(self.word(offset)?.fetch_add(value, order))
    }

    /// Compare-and-swap on the aligned word at `offset`; returns the
    /// original, as an RDMA CAS does.
    pub fn compare_swap_u64(
        &self,
        offset: usize,
        compare: u64,
        swap: u64,
        order: Ordering,
    ) -> Result<u64, HostMemoryOutOfBounds> {
        let word = self.word(offset)?;
        Ok(
            match word.compare_exchange(compare, swap, order, Ordering::Relaxed) {
                Ok(original) | Err(original) => original,
            },
        )
    }
}

/// Memory outside Rust's heap that a region may be backed by: a C
/// program's own pages, registered with `ibv_reg_mr`. Offsets are from the
/// start of the block; the device checks every range against
/// [`ExternalMemory::len`] before it calls, so implementations may treat an
/// out-of-range offset as a broken invariant. How the bytes are reached
/// (and whatever `unsafe` that takes) is the implementation's own, so this
/// crate stays free of it.
pub trait ExternalMemory: Send {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `into.len()` bytes from `offset`.
    fn read(&self, offset: usize, into: &mut [u8]);
    /// Copies `from` to `offset`.
    fn write(&mut self, offset: usize, from: &[u8]);
    /// Applies `update` atomically to the little-endian word at `offset`
    /// (the owner may touch it concurrently) and returns the original.
    /// The device checks that the word's registered address is 8-byte
    /// aligned, not `offset`: memory registered for remote atomics must lie
    /// at an address congruent to its registered one modulo 8 (the verbs
    /// provider refuses `ibv_reg_mr` otherwise), so the word is aligned
    /// in memory too.
    fn update_word(&mut self, offset: usize, update: &dyn Fn(u64) -> u64) -> u64;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A partial-word write cleared its bytes and then set them, and a
    /// reader in between saw zeros: rewriting a byte with its own value,
    /// a reader must never see anything else.
    #[test]
    fn a_partial_word_write_is_one_step_for_readers() {
        let memory = HostMemory::new(64);
        memory.write(0, &[0xff; 8]).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for _ in 0..200_000 {
                    memory.write(1, &[0xff]).unwrap();
                }
                stop.store(true, Ordering::Relaxed);
            });
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) || reads == 0 {
                let word = memory.load_u64(0, Ordering::Relaxed).unwrap();
                assert_eq!(
                    word,
                    u64::MAX,
                    "read {word:#x} between the steps of a write"
                );
                reads += 1;
            }
        });
    }

    proptest! {
        /// Writes and reads at any offset and length behave as on a plain
        /// byte array.
        #[test]
        fn copies_match_a_byte_array(
            operations in proptest::collection::vec((0usize..100, proptest::collection::vec(any::<u8>(), 0..40)), 1..20),
        ) {
            let memory = HostMemory::new(140);
            let mut model = [0u8; 140];
            for (offset, bytes) in operations {
                memory.write(offset, &bytes).unwrap();
                model[offset..offset + bytes.len()].copy_from_slice(&bytes);
                let mut seen = vec![0u8; 140 - offset];
                memory.read(offset, &mut seen).unwrap();
                prop_assert_eq!(&seen[..], &model[offset..]);
            }
        }
    }

    #[test]
    fn unaligned_copies_round_trip_and_leave_neighbours_alone() {
        let memory = HostMemory::new(37);
        memory.write(0, &[0xee; 37]).unwrap();
        memory
            .write(3, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
            .unwrap();
        let mut all = [0u8; 37];
        memory.read(0, &mut all).unwrap();
        assert_eq!(&all[..3], &[0xee; 3]);
        assert_eq!(&all[3..14], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
        assert_eq!(&all[14..], &[0xee; 23]);
    }

    #[test]
    fn out_of_bounds_and_misaligned_accesses_are_refused() {
        let memory = HostMemory::new(16);
        assert!(memory.write(10, &[0; 7]).is_err());
        assert!(memory.read(usize::MAX, &mut [0; 2]).is_err());
        assert!(memory.load_u64(4, Ordering::Relaxed).is_err());
        assert!(memory.load_u64(16, Ordering::Relaxed).is_err());
        assert_eq!(memory.load_u64(8, Ordering::Relaxed), Ok(0));
    }

    #[test]
    fn atomics_return_the_original() {
        let memory = HostMemory::new(8);
        assert_eq!(memory.fetch_add_u64(0, 5, Ordering::SeqCst), Ok(0));
        assert_eq!(memory.compare_swap_u64(0, 4, 9, Ordering::SeqCst), Ok(5));
        assert_eq!(memory.compare_swap_u64(0, 5, 9, Ordering::SeqCst), Ok(5));
        assert_eq!(memory.load_u64(0, Ordering::SeqCst), Ok(9));
    }

    #[test]
    fn a_published_payload_is_seen_whole_by_another_thread() {
        // The producer writes a payload, then publishes a flag with a
        // release store; the consumer acquires the flag, then reads.
        let memory = HostMemory::new(64);
        let producer = memory.clone();
        let thread = std::thread::spawn(move || {
            producer.write(8, &[7u8; 40]).unwrap();
            producer.store_u64(0, 1, Ordering::Release).unwrap();
        });
        while memory.load_u64(0, Ordering::Acquire).unwrap() == 0 {
            std::hint::spin_loop();
        }
        let mut payload = [0u8; 40];
        memory.read(8, &mut payload).unwrap();
        assert_eq!(payload, [7u8; 40]);
        thread.join().unwrap();
    }
}
