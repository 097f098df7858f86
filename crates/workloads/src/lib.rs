//! Workloads that Remora's systems serve, shared between them.
//!
//! - [`ycsb`]: the YCSB core workload: the A–F presets, Java-style
//!   property files, the operation mix, and key choice by
//!   [`distribution`].
//! - [`distribution`]: uniform, zipfian (scrambled or by rank) and
//!   latest key choosers, seeded so a run is reproducible.

#![forbid(unsafe_code)]

pub mod distribution;
pub mod ycsb;
