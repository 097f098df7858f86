//! TIGA (Duan et al., DAC'24) on Remora: near-data processing on the
//! SmartNIC of a data node, with an adaptive allocation of the SmartNIC's
//! cores among pipeline stages (§4.1, Eq. 1-4) and SmartNIC-CPU
//! co-processing under overload (§4.2).
//!
//! - [`apps`]: MVS, Spark-style analysis and IPSec, with real stages and
//!   a CN version of each.
//! - [`allocator`]: Eq. 4 and the co-processing controller, with no I/O.
//! - [`calibration`]: what the real stage code costs on this machine.
//! - [`config`]: the virtual hardware's settings, with their sources.
//! - [`rack`]: the NDP path on the embedded rack, end to end.
//! - [`simulation`]: the virtual SoC and CN in virtual time, with TIGA and
//!   the baselines (FairNIC, Floem, iPipe, CPU-only).

#![forbid(unsafe_code)]

pub mod allocator;
pub mod apps;
pub mod calibration;
pub mod config;
pub mod rack;
pub mod simulation;
