//! The soft RNIC's view of memory a C program registered: a raw pointer
//! and a length. All of the crate's raw-memory `unsafe` is here.
//!
//! # Contract
//!
//! [`ForeignMemory::new`] is `unsafe`; its caller (`ibv_reg_mr`) promises
//! what the verbs API asks of a program that registers memory:
//!
//! 1. `[address, address + length)` is mapped, readable and writable, and
//!    stays so until the region is deregistered (`ibv_dereg_mr` drops the
//!    `ForeignMemory`, and the device never keeps a copy of it).
//! 2. The program does not write bytes that a posted request reads, nor
//!    read or write bytes that a posted request writes, until that
//!    request completes; exactly what a real RNIC's DMA requires.
//!
//! Programs do poll bytes the NIC is writing (perftest's latency tests
//! spin on the last byte of their buffer). To keep such polling free of
//! torn or reordered values, every access here is atomic: whole aligned
//! words as `AtomicU64`, the unaligned head and tail as `AtomicU8`, all
//! `Relaxed` (plain moves on x86-64), with a release fence before a write
//! and an acquire fence after a read, as [`remora_rnic::HostMemory`] does.
//! Bytes are copied in ascending order, so the last byte of a message is
//! the last one stored.
//!
//! The tests pass under miri with
//! `MIRIFLAGS=-Zmiri-disable-weak-memory-emulation cargo +nightly miri test
//! -p remora-verbs --lib foreign_memory`. With weak-memory emulation on,
//! miri stops (an internal error, "cannot have partially overlapping store
//! buffer") because two accesses here may split one word differently, a
//! byte as `AtomicU8` and then its word as `AtomicU64`: mixed-size atomics,
//! which the C++ memory model leaves undefined and x86-64 orders like any
//! other accesses.

use remora_rnic::ExternalMemory;
use std::sync::atomic::{fence, AtomicU64, AtomicU8, Ordering};

const WORD_BYTES: usize = 8;

/// A block of a C program's memory. See the module's contract.
pub struct ForeignMemory {
    start: *mut u8,
    length_bytes: usize,
}

// SAFETY: the block is plain memory the registering program keeps mapped
// (contract 1); every access is atomic, so threads may share it.
unsafe impl Send for ForeignMemory {}

impl ForeignMemory {
    /// # Safety
    ///
    /// The module's contract: the range stays mapped and writable until the
    /// value is dropped, and the program's own accesses respect posted
    /// requests. `start` must not be null.
    pub unsafe fn new(start: *mut u8, length_bytes: usize) -> ForeignMemory {
        assert!(!start.is_null(), "a registration of a null pointer");
        assert!((start as usize).checked_add(length_bytes).is_some());
        ForeignMemory {
            start,
            length_bytes,
        }
    }

    fn check(&self, offset: usize, length_bytes: usize) {
        let end = offset.checked_add(length_bytes).expect("range overflows");
        assert!(end <= self.length_bytes, "the device checks ranges first");
    }

    fn byte(&self, offset: usize) -> &AtomicU8 {
        // SAFETY: `check` keeps `offset` inside the block, which is mapped
        // (contract 1); AtomicU8 has the alignment and size of u8.
        unsafe { AtomicU8::from_ptr(self.start.add(offset)) }
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        &self.words(offset, 1)[0]
    }

    /// The `count` aligned words from `offset`, as one slice: a copy
    /// zipped with it checks no word on its own (looked up and checked one
    /// by one, the words took 29% of a progress thread's time under
    /// perftest's `ib_write_bw`, and a 64 KiB copy took about three times
    /// as long).
    fn words(&self, offset: usize, count: usize) -> &[AtomicU64] {
        // A short copy's head may end where no word starts.
        if count == 0 {
            return &[];
        }
        let pointer = self.start.wrapping_add(offset);
        assert_eq!(pointer as usize % WORD_BYTES, 0, "words are aligned");
        let end = count
            .checked_mul(WORD_BYTES)
            .and_then(|bytes| offset.checked_add(bytes));
        assert!(end.is_some_and(|end| end <= self.length_bytes));
        // SAFETY: aligned (asserted) and inside the mapped block
        // (asserted; contract 1), and AtomicU64 has u64's size and
        // alignment. Every access to the block is atomic, so a shared
        // slice of it may be read and written by several threads.
        unsafe { std::slice::from_raw_parts(pointer.cast::<AtomicU64>(), count) }
    }

    /// Splits `offset..offset + length` into an unaligned head, whole
    /// aligned words and an unaligned tail, as byte counts.
    fn split(&self, offset: usize, length_bytes: usize) -> (usize, usize, usize) {
        let address = (self.start as usize).wrapping_add(offset);
        let head = (address.next_multiple_of(WORD_BYTES) - address).min(length_bytes);
        let words = (length_bytes - head) / WORD_BYTES;
        (head, words, length_bytes - head - words * WORD_BYTES)
    }
}

impl ExternalMemory for ForeignMemory {
    fn len(&self) -> usize {
        self.length_bytes
    }

    fn read(&self, offset: usize, into: &mut [u8]) {
        self.check(offset, into.len());
        let (head, words, _) = self.split(offset, into.len());
        let (head_bytes, rest) = into.split_at_mut(head);
        for (index, byte) in head_bytes.iter_mut().enumerate() {
            *byte = self.byte(offset + index).load(Ordering::Relaxed);
        }
        let mut chunks = rest.chunks_exact_mut(WORD_BYTES);
        for (chunk, word) in (&mut chunks).zip(self.words(offset + head, words)) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
        }
        let tail_offset = offset + head + words * WORD_BYTES;
        for (index, byte) in chunks.into_remainder().iter_mut().enumerate() {
            *byte = self.byte(tail_offset + index).load(Ordering::Relaxed);
        }
        fence(Ordering::Acquire);
    }

    fn write(&mut self, offset: usize, from: &[u8]) {
        self.check(offset, from.len());
        fence(Ordering::Release);
        let (head, words, _) = self.split(offset, from.len());
        let (head_bytes, rest) = from.split_at(head);
        for (index, byte) in head_bytes.iter().enumerate() {
            self.byte(offset + index).store(*byte, Ordering::Relaxed);
        }
        let mut chunks = rest.chunks_exact(WORD_BYTES);
        for (chunk, word) in (&mut chunks).zip(self.words(offset + head, words)) {
            let bytes: [u8; WORD_BYTES] = chunk.try_into().expect("a word");
            word.store(u64::from_ne_bytes(bytes), Ordering::Relaxed);
        }
        // Ascending to the end: the last byte of a message is stored last.
        let tail_offset = offset + head + words * WORD_BYTES;
        for (index, byte) in chunks.remainder().iter().enumerate() {
            self.byte(tail_offset + index)
                .store(*byte, Ordering::Relaxed);
        }
    }

    fn update_word(&mut self, offset: usize, update: &dyn Fn(u64) -> u64) -> u64 {
        self.check(offset, WORD_BYTES);
        let word = self.word(offset);
        // Little-endian words on the wire; this target is little-endian
        // (x86-64, aarch64), so the native value is the wire's value.
        let mut current = word.load(Ordering::Acquire);
        // Bounded by the program's own writers: each failed exchange means
        // one of them changed the word.
        loop {
            match word.compare_exchange(
                current,
                update(current),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(original) => return original,
                Err(seen) => current = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(bytes: &mut [u8], skip: usize) -> ForeignMemory {
        // SAFETY: the test's buffer outlives the block, and nothing else
        // touches it while the block is used.
        unsafe { ForeignMemory::new(bytes.as_mut_ptr().add(skip), bytes.len() - skip) }
    }

    #[test]
    fn unaligned_reads_and_writes_round_trip_every_split() {
        let mut backing = vec![0u8; 64];
        for skip in 0..8 {
            let mut memory = block(&mut backing, skip);
            for (offset, length) in [(0, 1), (1, 13), (3, 24), (0, 56)] {
                let pattern: Vec<u8> = (0..length).map(|i| (i * 7 + skip + offset) as u8).collect();
                memory.write(offset, &pattern);
                let mut back = vec![0u8; length];
                memory.read(offset, &mut back);
                assert_eq!(back, pattern, "skip {skip} offset {offset} length {length}");
            }
        }
    }

    #[test]
    fn word_updates_return_the_original_and_store_the_update() {
        let mut backing = vec![0u64; 4];
        // SAFETY: as in `block`; the words are aligned.
        let mut memory = unsafe { ForeignMemory::new(backing.as_mut_ptr().cast(), 32) };
        memory.write(8, &41u64.to_le_bytes());
        assert_eq!(memory.update_word(8, &|value| value + 1), 41);
        let mut back = [0u8; 8];
        memory.read(8, &mut back);
        assert_eq!(u64::from_le_bytes(back), 42);
    }

    #[test]
    #[should_panic(expected = "the device checks ranges first")]
    fn a_range_past_the_block_is_a_broken_invariant() {
        let mut backing = vec![0u8; 16];
        let memory = block(&mut backing, 0);
        let mut into = [0u8; 4];
        memory.read(14, &mut into);
    }
}
