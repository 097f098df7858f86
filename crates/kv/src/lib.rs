//! A FASTER-style key-value store (Chandramouli et al., SIGMOD'18) for
//! Remora: a hash index over a hybrid log whose tail lives in local memory
//! and whose rest lives on a pluggable device. The Cowbird paper's second
//! workload (§7, §8.2): with far memory behind Cowbird as the device, the
//! store should run close to all-local.
//!
//! - [`store`]: the store, its sessions and FASTER's operations (Read,
//!   Upsert, RMW, Delete, `complete_pending`);
//! - [`index`]: the cache-line hash index;
//! - [`log`]: the hybrid log's regions, page flushes and the head;
//! - [`epoch`]: epoch protection, which lets threads share the log;
//! - [`record`]: the record layout, and [`frames`] the memory it lives in
//!   (the crate's only unsafe code);
//! - [`device`]: the `IDevice`-shaped trait and the local devices;
//! - [`checkpoint`]: fold-over checkpoints on the device, and recovery;
//! - [`update`]: what an RMW does;
//! - [`ycsb`]: YCSB's load and run phases on the store.

pub mod address;
pub mod checkpoint;
pub mod compactor;
pub mod config;
pub mod device;
pub mod epoch;
pub mod frames;
pub mod fuzzing;
pub mod index;
pub mod log;
pub mod record;
pub mod resp;
pub mod scenario;
pub mod store;
pub mod update;
pub mod ycsb;

pub use address::LogAddress;
pub use config::{ConfigError, StoreConfig};
pub use device::{Device, DeviceError, DeviceQueue, FileDevice, MemoryDevice};
pub use store::{
    Compaction, CompactionError, CompactionTotals, Completion, KvError, OperationKind,
    PrefetchStage, Session, SessionStats, Status, Store,
};
pub use update::{Update, UpdateError};
