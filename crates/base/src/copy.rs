//! Bulk byte copies that run at the same speed wherever the two buffers
//! lie.
//!
//! glibc copies blocks of 4 KiB and more with `rep movsb` on AVX2
//! machines. On this project's reference machine that instruction runs
//! 20–30× slower (about 1.8 GB/s instead of 40) when the destination lies
//! 8–24 bytes past the source modulo 4096: 4 KiB took 1.5–2.4 µs instead
//! of 0.09, and 64 KiB 24–35 µs instead of 1.6. Frames, ring slots and
//! registered memory fall at such offsets by chance, so a run's data rate
//! depended on where the allocator had put its buffers. Copying in pieces
//! below glibc's threshold keeps every copy on its vector loop, which was
//! as fast as the good case of `rep movsb` or faster at every offset
//! measured (`cargo bench -p remora-base`).

/// The largest piece handed to `memcpy` at once: under glibc's
/// `rep movsb` threshold, which is 4 KiB on AVX2 machines and at least
/// 2 KiB everywhere.
pub const COPY_PIECE_BYTES: usize = 2048;

/// Copies `from` into `into`, which must be as long.
///
/// # Panics
///
/// If the lengths differ, as `<[u8]>::copy_from_slice` does.
#[inline]
pub fn copy_bytes(into: &mut [u8], from: &[u8]) {
    assert_eq!(
        into.len(),
        from.len(),
        "a copy's source and destination differ in length"
    );
    if from.len() <= COPY_PIECE_BYTES {
        into.copy_from_slice(from);
        return;
    }
    for (into, from) in into
        .chunks_mut(COPY_PIECE_BYTES)
        .zip(from.chunks(COPY_PIECE_BYTES))
    {
        into.copy_from_slice(from);
    }
}

/// Appends `from` to `vector`, copying as [`copy_bytes`] does (piece by
/// piece, so nothing is zeroed first).
#[inline]
pub fn extend_bytes(vector: &mut Vec<u8>, from: &[u8]) {
    vector.reserve(from.len());
    for piece in from.chunks(COPY_PIECE_BYTES) {
        vector.extend_from_slice(piece);
    }
}

/// Byte buffers kept for reuse, at most `capacity` of them, so that a
/// path holding frames or reads for a while does not allocate for each.
#[derive(Debug)]
pub struct BufferPool {
    spare: Vec<Vec<u8>>,
    capacity: usize,
}

impl BufferPool {
    pub fn new(capacity: usize) -> BufferPool {
        BufferPool {
            spare: Vec::new(),
            capacity,
        }
    }

    /// An empty buffer: a kept one if there is one.
    pub fn take(&mut self) -> Vec<u8> {
        let mut buffer = self.spare.pop().unwrap_or_default();
        buffer.clear();
        buffer
    }

    /// A buffer holding a copy of `bytes`, copied as [`copy_bytes`] does.
    pub fn copy_of(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut buffer = self.take();
        extend_bytes(&mut buffer, bytes);
        buffer
    }

    /// Keeps `buffer` for reuse, unless `capacity` are kept already.
    pub fn give_back(&mut self, buffer: Vec<u8>) {
        if self.spare.len() < self.capacity {
            self.spare.push(buffer);
        }
    }

    /// Buffers kept now.
    pub fn kept(&self) -> usize {
        self.spare.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_copy_at_any_offset_and_length_equals_the_source(
            source in proptest::collection::vec(any::<u8>(), 0..9000),
            offset in 0usize..64,
        ) {
            let mut destination = vec![0u8; source.len() + offset];
            copy_bytes(&mut destination[offset..], &source);
            prop_assert_eq!(&destination[offset..], &source[..]);
            prop_assert!(destination[..offset].iter().all(|byte| *byte == 0));

            let mut grown = vec![7u8; offset];
            extend_bytes(&mut grown, &source);
            prop_assert_eq!(&grown[offset..], &source[..]);
            prop_assert_eq!(grown.len(), offset + source.len());
        }
    }

    #[test]
    fn a_pool_keeps_at_most_its_capacity_and_hands_out_empty_buffers() {
        let mut pool = BufferPool::new(2);
        let long = pool.copy_of(&[9u8; 4160]);
        pool.give_back(long);
        pool.give_back(vec![1, 2, 3]);
        pool.give_back(vec![4]);
        assert_eq!(pool.kept(), 2);
        assert!(pool.take().is_empty());
        assert_eq!(pool.copy_of(&[5, 6]), vec![5, 6]);
        assert_eq!(pool.kept(), 0);
    }

    #[test]
    #[should_panic(expected = "differ in length")]
    fn copies_of_unequal_lengths_are_refused() {
        copy_bytes(&mut [0u8; 3], &[1u8; 4]);
    }
}
