//! Entries and next pointers: round trips, bounds, and damage detected.

use proptest::prelude::*;
use remora_clover::layout::*;

proptest! {
    #[test]
    fn next_pointers_round_trip(offset in (1u64..(1 << 48)).prop_map(|word| word << 3), version in 0u16..0x8000, committed: bool) {
        let pointer = NextPointer::new(offset, version, committed).unwrap();
        prop_assert!(!pointer.is_null());
        prop_assert_eq!((pointer.offset(), pointer.version(), pointer.committed()), (offset, version, committed));
        prop_assert_eq!(NextPointer::from_word(pointer.word()), pointer);
    }

    #[test]
    fn entries_round_trip(key: u64, value in proptest::collection::vec(any::<u8>(), MIN_VALUE_BYTES..=MAX_VALUE_BYTES)) {
        let class = size_class(value.len()).unwrap();
        prop_assert!(class >= HEADER_BYTES + value.len());
        let mut slot = vec![0xaa; class];
        encode_entry(key, &value, &mut slot).unwrap();
        let entry = decode_entry(&slot).unwrap();
        prop_assert_eq!(entry.next, NextPointer::NULL);
        prop_assert_eq!(entry.key, key);
        prop_assert_eq!(entry.value, &value[..]);
    }

    #[test]
    fn any_flipped_bit_of_key_length_or_value_is_caught(value in proptest::collection::vec(any::<u8>(), 8..64), bit in 64usize..(24 + 8) * 8) {
        let mut slot = vec![0; 128];
        encode_entry(7, &value, &mut slot).unwrap();
        slot[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(decode_entry(&slot).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode_entry(&bytes);
    }
}

#[test]
fn null_is_zero_and_bad_offsets_are_refused() {
    assert!(NextPointer::NULL.is_null());
    assert_eq!(NextPointer::NULL.word(), 0);
    for offset in [0, 12, MAX_OFFSET + 8] {
        assert_eq!(
            NextPointer::new(offset, 1, true),
            Err(LayoutError::Offset(offset))
        );
    }
}

#[test]
fn versions_wrap_within_fifteen_bits() {
    let pointer = NextPointer::new(64, 0x7fff, true).unwrap();
    assert_eq!(pointer.next_version(), 0);
    assert_eq!(
        NextPointer::new(64, 0xffff, false).unwrap().version(),
        0x7fff
    );
}

#[test]
fn values_outside_eight_bytes_to_four_kib_are_refused() {
    assert_eq!(size_class(7), Err(LayoutError::ValueSize(7)));
    assert_eq!(size_class(4097), Err(LayoutError::ValueSize(4097)));
    assert_eq!(size_class(8), Ok(64));
    assert_eq!(size_class(40), Ok(64));
    assert_eq!(size_class(41), Ok(128));
    assert_eq!(size_class(4096), Ok(8192));
    let mut small = [0u8; 30];
    assert_eq!(
        encode_entry(1, &[0; 8], &mut small),
        Err(LayoutError::Truncated(30))
    );
}
