//! The hash-table probe microbenchmark of Figures 1 and 8: a table of
//! records, a fraction in compute-local memory and the rest in the
//! memory pool; each probe hashes a key to its record, fetches the record
//! (locally or remotely), checks it is the right one, and spends a fixed
//! amount of real computation on it.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
pub struct TableSpec {
    pub records: u64,
    pub record_bytes: usize,
    /// Fraction of records in compute-local memory (the paper's 5%).
    pub local_fraction: f64,
    /// Real work per record.
    pub work_per_record: Duration,
}

impl TableSpec {
    pub const DEFAULT: TableSpec = TableSpec {
        records: 1 << 16,
        record_bytes: 64,
        local_fraction: 0.05,
        work_per_record: Duration::ZERO,
    };

    /// Records kept locally: the first ones.
    pub fn local_records(&self) -> u64 {
        (self.records as f64 * self.local_fraction) as u64
    }

    pub fn is_local(&self, record: u64) -> bool {
        record < self.local_records()
    }

    /// Where a remote record sits in the pool.
    pub fn remote_offset(&self, record: u64) -> u64 {
        assert!(!self.is_local(record));
        (record - self.local_records()) * self.record_bytes as u64
    }

    pub fn remote_bytes(&self) -> u64 {
        (self.records - self.local_records()) * self.record_bytes as u64
    }
}

/// A record's contents: its index, then bytes derived from it, so a
/// probe can check it got the record it asked for.
pub fn record_bytes(record: u64, length: usize) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..length)
        .map(|index| (record as u8).wrapping_mul(31).wrapping_add(index as u8))
        .collect();
    let tag = record.to_le_bytes();
    let take = length.min(8);
    bytes[..take].copy_from_slice(&tag[..take]);
    bytes
}

/// Which record a probe of `key` touches: a multiplicative hash.
pub fn record_of(key: u64, records: u64) -> u64 {
    key.wrapping_mul(0x9e37_79b9_7f4a_7c15) % records
}

/// Whether `bytes` are record `record`'s.
pub fn is_record(bytes: &[u8], record: u64) -> bool {
    let take = bytes.len().min(8);
    bytes[..take] == record.to_le_bytes()[..take]
}

/// Real computation: rounds of a mixing function over the record, which
/// the compiler cannot skip, `rounds` times.
///
/// Never inlined: the calibration and the probe loop then time the very
/// same machine code (inlined, each call site compiled its own copy, and
/// a build's calibration could pick work for a loop it did not run).
#[inline(never)]
pub fn compute(bytes: &[u8], rounds: u32) -> u64 {
    let mut state = 0xcbf2_9ce4_8422_2325u64;
    for _ in 0..rounds {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            state = (state ^ u64::from_le_bytes(word)).wrapping_mul(0x0100_0000_01b3);
        }
        state = state.rotate_left(17);
    }
    std::hint::black_box(state)
}

/// Rounds of [`compute`] over a record of `record_bytes` that take about
/// `work` on this machine now (median of a few measurements).
pub fn calibrate(record_bytes: usize, work: Duration) -> u32 {
    if work.is_zero() {
        return 0;
    }
    let record = record_bytes_for_calibration(record_bytes);
    let trial_rounds = 10_000u32;
    let mut per_round_ns: Vec<f64> = (0..5)
        .map(|_| {
            let started = Instant::now();
            compute(&record, trial_rounds);
            started.elapsed().as_nanos() as f64 / f64::from(trial_rounds)
        })
        .collect();
    per_round_ns.sort_by(f64::total_cmp);
    let per_round = per_round_ns[2].max(0.1);
    ((work.as_nanos() as f64 / per_round).round() as u32).max(1)
}

fn record_bytes_for_calibration(length: usize) -> Vec<u8> {
    record_bytes(1, length)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_identify_themselves() {
        for length in [8, 64, 256, 512] {
            let bytes = record_bytes(12345, length);
            assert!(is_record(&bytes, 12345));
            assert!(!is_record(&bytes, 12346));
        }
    }

    #[test]
    fn local_and_remote_records_partition_the_table() {
        let spec = TableSpec::DEFAULT;
        let local = (0..spec.records)
            .filter(|record| spec.is_local(*record))
            .count() as u64;
        assert_eq!(local, spec.local_records());
        assert_eq!(
            spec.remote_offset(spec.records - 1) + 64,
            spec.remote_bytes()
        );
    }
}
