//! A store's shape, checked when the store is made.

use crate::record::{record_bytes, MAX_KEY_BYTES, MAX_VALUE_BYTES};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("page_bits {0} is out of range: pages are 2^14 (16 KiB, the largest record rounded up) to 2^26 bytes")]
    PageBits(u32),
    #[error("memory_pages {0}: the log needs at least 4 pages in memory (mutable, read-only, one being flushed, one free), and at most 1 TiB of them")]
    MemoryPages(u64),
    #[error("mutable_fraction {0} must be in (0, 1)")]
    MutableFraction(f64),
    #[error("index_buckets {0} must be a power of two, at most 2^30")]
    IndexBuckets(u64),
    #[error("overflow_buckets {0} must be at most 2^30")]
    OverflowBuckets(u32),
    #[error("first_read_bytes {0} must be from 1 to a page's bytes")]
    FirstReadBytes(usize),
    #[error("the device holds {device_bytes} bytes, less than the {memory_bytes} bytes of the in-memory log and the {reserve_bytes} bytes the log keeps in reserve for compaction and checkpoints")]
    DeviceTooSmall {
        device_bytes: u64,
        memory_bytes: u64,
        reserve_bytes: u64,
    },
    #[error("a page of {page_bytes} bytes (page_bits) is longer than one request to the {device} device ({limit_bytes} bytes): its flushes would all fail")]
    PageTooLongForDevice {
        page_bytes: u64,
        device: String,
        limit_bytes: u64,
    },
    #[error("sessions {0} must be between 1 and 1024")]
    Sessions(usize),
    #[error("store settings: {0}")]
    Toml(String),
}

/// The most bytes of log a store keeps in memory.
const MAX_MEMORY_BYTES: u64 = 1 << 40;
/// The most hash or overflow buckets (64 GiB of them).
const MAX_BUCKETS: u64 = 1 << 30;

/// A store's settings; in TOML, every key is optional:
///
/// ```toml
/// index_buckets = 65536
/// overflow_buckets = 16384
/// page_bits = 16
/// memory_pages = 64
/// mutable_fraction = 0.9
/// first_read_bytes = 128
/// sessions = 64
/// ```
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreConfig {
    /// Hash buckets (a power of two), seven entries each.
    pub index_buckets: u64,
    /// Buckets chained on when a bucket's seven entries are taken.
    pub overflow_buckets: u32,
    /// log2 of the page size.
    pub page_bits: u32,
    /// Pages of log kept in memory: the store's local-memory budget.
    pub memory_pages: u64,
    /// Share of the in-memory pages that take in-place updates (FASTER's 0.9).
    pub mutable_fraction: f64,
    /// Bytes read from the device for a record before its size is known.
    pub first_read_bytes: usize,
    /// Sessions that can be open at once.
    pub sessions: usize,
}

impl Default for StoreConfig {
    fn default() -> StoreConfig {
        StoreConfig {
            index_buckets: 1 << 16,
            overflow_buckets: 1 << 14,
            page_bits: 16,
            memory_pages: 64,
            mutable_fraction: 0.9,
            first_read_bytes: 128,
            sessions: 64,
        }
    }
}

impl StoreConfig {
    /// The smallest store the checks allow, for tests and fuzzing: four
    /// 16 KiB pages in memory, half of them mutable, so that a few
    /// hundred records push the oldest to the device, and a first device
    /// read of 64 bytes, so that longer records take two.
    pub fn smallest() -> StoreConfig {
        StoreConfig {
            index_buckets: 1 << 8,
            overflow_buckets: 1 << 10,
            page_bits: 14,
            memory_pages: 4,
            mutable_fraction: 0.5,
            first_read_bytes: 64,
            sessions: 4,
        }
    }

    /// Reads a TOML file's settings (missing keys keep their defaults).
    pub fn from_toml(text: &str) -> Result<StoreConfig, ConfigError> {
        toml::from_str(text).map_err(|error: toml::de::Error| {
            ConfigError::Toml(remora_base::at_position(
                text,
                error.span(),
                error.message(),
            ))
        })
    }

    /// The in-memory log's bytes (saturating: `check` bounds it).
    pub fn memory_bytes(&self) -> u64 {
        self.memory_pages
            .saturating_mul(1u64.checked_shl(self.page_bits).unwrap_or(u64::MAX))
    }

    /// Pages that take in-place updates: at least one, and at most all
    /// but two (one read-only page to flush from, one free frame).
    pub fn mutable_pages(&self) -> u64 {
        let share = (self.memory_pages as f64 * self.mutable_fraction).round() as u64;
        share.clamp(1, self.memory_pages - 2)
    }

    pub fn check(&self, device_bytes: u64) -> Result<(), ConfigError> {
        let largest = record_bytes(MAX_KEY_BYTES, MAX_VALUE_BYTES) + 64;
        if !(14..=26).contains(&self.page_bits) || (1u64 << self.page_bits) < largest {
            return Err(ConfigError::PageBits(self.page_bits));
        }
        // Past 1 TiB, `memory_pages << page_bits` nears wrapping, and a
        // wrapped size once passed the device check with a small
        // allocation that the log then wrote past.
        if self.memory_pages < 4 || self.memory_pages > MAX_MEMORY_BYTES >> self.page_bits {
            return Err(ConfigError::MemoryPages(self.memory_pages));
        }
        if !(self.mutable_fraction > 0.0 && self.mutable_fraction < 1.0) {
            return Err(ConfigError::MutableFraction(self.mutable_fraction));
        }
        if !self.index_buckets.is_power_of_two() || self.index_buckets > MAX_BUCKETS {
            return Err(ConfigError::IndexBuckets(self.index_buckets));
        }
        if u64::from(self.overflow_buckets) > MAX_BUCKETS {
            return Err(ConfigError::OverflowBuckets(self.overflow_buckets));
        }
        if !(1..=1usize << self.page_bits).contains(&self.first_read_bytes) {
            return Err(ConfigError::FirstReadBytes(self.first_read_bytes));
        }
        // Ordinary records never take the reserve pages: without room for
        // them beyond the memory's worth, every write failed as a full
        // device once the first pages were written (found by reading).
        let reserve_bytes = crate::log::ORDINARY_RESERVE_PAGES << self.page_bits;
        let log_bytes = crate::log::log_capacity_bytes(device_bytes, self.page_bits);
        if log_bytes < self.memory_bytes() + reserve_bytes {
            return Err(ConfigError::DeviceTooSmall {
                device_bytes,
                memory_bytes: self.memory_bytes(),
                reserve_bytes,
            });
        }
        if !(1..=1024).contains(&self.sessions) {
            return Err(ConfigError::Sessions(self.sessions));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device with room for the memory's pages and no more passed the
    /// check; ordinary records may not take the three reserve pages, so
    /// every write failed as a full device after the first pages.
    #[test]
    fn a_device_must_hold_the_memory_and_the_reserve() {
        let config = StoreConfig::smallest();
        let page_bytes = 1u64 << config.page_bits;
        let device_bytes = |pages: u64| crate::log::CHECKPOINT_AREA_BYTES + pages * page_bytes;
        let just_enough = config.memory_pages + crate::log::ORDINARY_RESERVE_PAGES;
        assert!(matches!(
            config.check(device_bytes(just_enough - 1)),
            Err(ConfigError::DeviceTooSmall { .. })
        ));
        assert_eq!(config.check(device_bytes(just_enough)), Ok(()));
    }

    #[test]
    fn a_toml_file_sets_some_keys_and_keeps_the_rest() {
        let config = StoreConfig::from_toml("memory_pages = 8\npage_bits = 20").unwrap();
        assert_eq!(config.memory_pages, 8);
        assert_eq!(config.page_bits, 20);
        assert_eq!(config.sessions, StoreConfig::default().sessions);
    }

    /// Sizes past what a machine has were refused only by wrapping: 2^48 + 4
    /// pages of 64 KiB wrapped to 256 KiB and passed; 2^60 buckets panicked
    /// with a capacity overflow.
    #[test]
    fn sizes_past_any_machine_are_typed_errors() {
        let device = 1 << 40;
        let good = StoreConfig::default();
        good.check(device).unwrap();
        let cases = [
            StoreConfig {
                memory_pages: (1 << 48) + 4,
                ..good.clone()
            },
            StoreConfig {
                index_buckets: 1 << 60,
                ..good.clone()
            },
            StoreConfig {
                overflow_buckets: u32::MAX,
                ..good.clone()
            },
            StoreConfig {
                first_read_bytes: 0,
                ..good.clone()
            },
            StoreConfig {
                first_read_bytes: usize::MAX,
                ..good.clone()
            },
        ];
        for config in cases {
            assert!(
                matches!(
                    config.check(device),
                    Err(ConfigError::MemoryPages(_)
                        | ConfigError::IndexBuckets(_)
                        | ConfigError::OverflowBuckets(_)
                        | ConfigError::FirstReadBytes(_))
                ),
                "{config:?}"
            );
        }
    }

    #[test]
    fn an_unknown_key_is_refused_by_name() {
        let error = StoreConfig::from_toml("memory_page = 8").unwrap_err();
        assert!(
            matches!(&error, ConfigError::Toml(message) if message.contains("memory_page")),
            "{error}"
        );
    }
}
