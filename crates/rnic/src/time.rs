//! Time as the RNIC sees it: a number handed in by the caller (see
//! [`remora_base::Timestamp`]). The RNIC never reads a clock.

pub use remora_base::Timestamp;
