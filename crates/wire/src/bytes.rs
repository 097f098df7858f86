//! Big-endian field access. Callers have already checked lengths, so the
//! slices here are always long enough; indexing would panic otherwise, which
//! is a bug in the caller's length check, never a reaction to input.

pub(crate) fn read_u16(bytes: &[u8], offset: usize) -> u16 {
    u16::from_be_bytes([bytes[offset], bytes[offset + 1]])
}

pub(crate) fn read_u24(bytes: &[u8], offset: usize) -> u32 {
    u32::from_be_bytes([0, bytes[offset], bytes[offset + 1], bytes[offset + 2]])
}

pub(crate) fn read_u32(bytes: &[u8], offset: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[offset..offset + 4]);
    u32::from_be_bytes(word)
}

pub(crate) fn read_u64(bytes: &[u8], offset: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[offset..offset + 8]);
    u64::from_be_bytes(word)
}

pub(crate) fn write_u16(bytes: &mut [u8], offset: usize, value: u16) {
    bytes[offset..offset + 2].copy_from_slice(&value.to_be_bytes());
}

pub(crate) fn write_u24(bytes: &mut [u8], offset: usize, value: u32) {
    debug_assert!(value <= 0x00ff_ffff, "24-bit field overflow: {value:#x}");
    bytes[offset..offset + 3].copy_from_slice(&value.to_be_bytes()[1..]);
}

pub(crate) fn write_u32(bytes: &mut [u8], offset: usize, value: u32) {
    bytes[offset..offset + 4].copy_from_slice(&value.to_be_bytes());
}

pub(crate) fn write_u64(bytes: &mut [u8], offset: usize, value: u64) {
    bytes[offset..offset + 8].copy_from_slice(&value.to_be_bytes());
}

/// Fails with `Truncated` unless `bytes` holds at least `needed` bytes.
pub(crate) fn check_len(
    bytes: &[u8],
    needed: usize,
    header: &'static str,
) -> Result<(), crate::WireError> {
    if bytes.len() < needed {
        return Err(crate::WireError::Truncated { header });
    }
    Ok(())
}
