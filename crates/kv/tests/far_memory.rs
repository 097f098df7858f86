//! The store on far memory: every path to the memory node's pool (one-
//! sided verbs, synchronous and asynchronous; Cowbird-Spot; Cowbird-P4)
//! agrees with a map, with most records on the device. The read-after-
//! write property is the model's: a read always returns the newest value,
//! though the pages it lives in were flushed moments before.

mod common;

use common::*;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use remora_cowbird::embedded::embedded_p4_config;
use remora_kv::device::{FarMemoryDevice, FarMemoryPath};
use std::sync::Arc;

fn run_on(path: FarMemoryPath) {
    let device = Arc::new(FarMemoryDevice::start(path, 8 << 20, 3).unwrap());
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let ops = prop::collection::vec(op(), 1500)
        .new_tree(&mut runner)
        .unwrap()
        .current();
    let stats = check_against_model(device.clone(), &ops);
    assert!(
        stats.pending > 50,
        "{}: the pool must serve reads: {stats:?}",
        path.name()
    );
    device.stop().unwrap();
}

#[test]
fn one_sided_synchronous_reads_agree_with_a_map() {
    run_on(FarMemoryPath::OneSidedSync);
}

#[test]
fn one_sided_asynchronous_reads_agree_with_a_map() {
    run_on(FarMemoryPath::OneSidedAsync);
}

#[test]
fn cowbird_spot_agrees_with_a_map() {
    run_on(FarMemoryPath::CowbirdSpot);
}

#[test]
fn cowbird_p4_agrees_with_a_map() {
    run_on(FarMemoryPath::CowbirdP4(embedded_p4_config()));
}
