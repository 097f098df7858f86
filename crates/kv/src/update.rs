//! Read-modify-write updates: what an RMW does to a value. They are data,
//! not closures, so a pending RMW can wait for the device and run later.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpdateError {
    #[error("the value is not an integer or out of range")]
    NotAnInteger,
    #[error("increment or decrement would overflow")]
    Overflow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    /// Adds to a little-endian u64 in the value's first 8 bytes, wrapping;
    /// the rest of the value is kept. A missing value starts as the
    /// 8-byte delta. YCSB-F's read-modify-write.
    AddToCounter(u64),
    /// Adds to a value that is an ASCII decimal i64, as Redis's INCR and
    /// DECR do; a missing value counts as 0.
    AddToDecimal(i64),
}

/// Digits, sign and padding of the longest i64.
const DECIMAL_CAPACITY_BYTES: usize = 24;

impl Update {
    /// Writes the new value into `out`.
    pub fn apply(&self, old: Option<&[u8]>, out: &mut Vec<u8>) -> Result<(), UpdateError> {
        out.clear();
        match *self {
            Update::AddToCounter(delta) => {
                let Some(old) = old else {
                    out.extend_from_slice(&delta.to_le_bytes());
                    return Ok(());
                };
                out.extend_from_slice(old);
                if out.len() < 8 {
                    out.resize(8, 0);
                }
                let counter = u64::from_le_bytes(out[..8].try_into().expect("8 bytes"));
                out[..8].copy_from_slice(&counter.wrapping_add(delta).to_le_bytes());
                Ok(())
            }
            Update::AddToDecimal(delta) => {
                let current = match old {
                    None => 0,
                    Some(bytes) => parse_decimal(bytes).ok_or(UpdateError::NotAnInteger)?,
                };
                let next = current.checked_add(delta).ok_or(UpdateError::Overflow)?;
                out.extend_from_slice(next.to_string().as_bytes());
                Ok(())
            }
        }
    }

    /// Room a new record needs for the result, given the old value's
    /// capacity: known before reading the value, so the record can be
    /// allocated before the old one is locked.
    pub fn capacity_for(&self, old_capacity: usize) -> usize {
        match self {
            Update::AddToCounter(_) => old_capacity.max(8),
            Update::AddToDecimal(_) => DECIMAL_CAPACITY_BYTES,
        }
    }
}

/// Redis's strict integer syntax (`string2ll`): an optional minus, then
/// digits with no leading zero (only "0" itself, and no "-0"), fitting an
/// i64. Rust's `parse` would also take "+1" and "007", which Redis
/// rejects. The RESP parser reads its length lines with it too.
pub fn parse_decimal(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    let canonical = match digits {
        [b'0'] => !negative,
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if !canonical {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_adds_and_keeps_the_rest_of_the_value() {
        let mut out = Vec::new();
        let mut old = 5u64.to_le_bytes().to_vec();
        old.extend_from_slice(b"tail");
        Update::AddToCounter(3).apply(Some(&old), &mut out).unwrap();
        assert_eq!(&out[..8], &8u64.to_le_bytes());
        assert_eq!(&out[8..], b"tail");
    }

    #[test]
    fn decimals_follow_redis() {
        let mut out = Vec::new();
        Update::AddToDecimal(1).apply(None, &mut out).unwrap();
        assert_eq!(out, b"1");
        Update::AddToDecimal(-5)
            .apply(Some(b"3"), &mut out)
            .unwrap();
        assert_eq!(out, b"-2");
        for bad in [
            &b"abc"[..],
            b" 1",
            b"+1",
            b"",
            b"007",
            b"-0",
            b"-",
            b"1 ",
            b"00",
        ] {
            assert_eq!(
                Update::AddToDecimal(1).apply(Some(bad), &mut out),
                Err(UpdateError::NotAnInteger)
            );
        }
        let max = i64::MAX.to_string();
        assert_eq!(
            Update::AddToDecimal(1).apply(Some(max.as_bytes()), &mut out),
            Err(UpdateError::Overflow)
        );
    }
}
