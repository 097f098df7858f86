//! Workloads that Remora's systems serve, shared between them.
//!
//! - [`ycsb`]: the YCSB core workload: the A–F presets, Java-style
//!   property files, the operation mix, and key choice by
//!   [`distribution`].
//! - [`distribution`]: uniform, zipfian (scrambled or by rank) and
//!   latest key choosers, seeded so a run is reproducible.
//! - [`history`]: histories of key-value requests and their
//!   linearizability check (Clover's and the KV store's).

#![forbid(unsafe_code)]

pub mod distribution;
pub mod history;
pub mod ycsb;
