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

/// Takes what `queue` finishes until `token` does (dropping the others);
/// its bytes (none for a write).
fn await_token(queue: &mut dyn remora_kv::DeviceQueue, token: u64) -> Option<Vec<u8>> {
    let started = std::time::Instant::now();
    loop {
        let mut found = None;
        queue
            .poll(&mut |done, bytes| {
                if done == token {
                    found = Some(bytes.map(<[u8]>::to_vec));
                }
            })
            .unwrap();
        if let Some(bytes) = found {
            return bytes;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "token {token} never finished"
        );
    }
}

/// A queue dropped with a READ in flight gave its path back as it was:
/// the READ's completion then reached the next queue on the path, which
/// took it for its own READ in the same slot and returned the other
/// request's bytes. A queue now lets its work finish before it goes.
#[test]
fn a_queue_dropped_with_work_in_flight_passes_none_of_it_on() {
    use remora_kv::Device;
    let device = FarMemoryDevice::start(FarMemoryPath::OneSidedAsync, 1 << 20, 1).unwrap();
    let mut first = device.open_queue().unwrap();
    let mut pattern = vec![0xaa; 4096];
    pattern.extend_from_slice(&[0xbb; 4096]);
    first.write(0, &pattern, 1).unwrap();
    await_token(first.as_mut(), 1);
    first.read(0, 64, 3).unwrap();
    drop(first);
    let mut second = device.open_queue().unwrap();
    second.read(4096, 64, 4).unwrap();
    assert_eq!(await_token(second.as_mut(), 4), Some(vec![0xbb; 64]));
    drop(second);
    device.stop().unwrap();
}

/// An empty READ or WRITE on far memory issued no piece, so nothing ever
/// completed it; the memory and file devices complete one at once.
#[test]
fn empty_reads_and_writes_complete_on_every_far_memory_path() {
    use remora_kv::Device;
    for path in [FarMemoryPath::OneSidedAsync, FarMemoryPath::CowbirdSpot] {
        let device = FarMemoryDevice::start(path, 1 << 20, 1).unwrap();
        let mut queue = device.open_queue().unwrap();
        queue.write(0, &[], 7).unwrap();
        assert_eq!(await_token(queue.as_mut(), 7), None, "{}", path.name());
        queue.read(0, 0, 8).unwrap();
        assert_eq!(
            await_token(queue.as_mut(), 8),
            Some(Vec::new()),
            "{}",
            path.name()
        );
        drop(queue);
        device.stop().unwrap();
    }
}

/// A Cowbird queue with work in flight on a fabric that had stopped waited
/// out its 10 s (and the store above it its 30 s) before it said anything.
/// It now fails at the next look, as the verbs path did already.
#[test]
fn work_in_flight_on_a_stopped_fabric_fails_at_once() {
    use remora_kv::{Device, DeviceError};
    for path in [FarMemoryPath::OneSidedAsync, FarMemoryPath::CowbirdSpot] {
        let device = FarMemoryDevice::start(path, 1 << 20, 1).unwrap();
        let mut queue = device.open_queue().unwrap();
        queue.write(0, &[7; 64], 1).unwrap();
        await_token(queue.as_mut(), 1);
        device.stop().unwrap();
        let started = std::time::Instant::now();
        let failed: Result<(), DeviceError> = queue.read(0, 64, 2).and_then(|()| loop {
            queue.poll(&mut |_, _| {})?;
            assert!(
                started.elapsed() < std::time::Duration::from_secs(3),
                "{}: no word of the stopped fabric in 3 s",
                path.name()
            );
        });
        // The verbs path hears it from the NIC's queues (`Gone`); Cowbird's
        // rings are plain memory, so its queue watches the fabric.
        assert!(
            matches!(failed, Err(DeviceError::Gone))
                || matches!(failed, Err(DeviceError::FarMemory(ref reason)) if reason.contains("fabric thread has stopped")),
            "{}: {failed:?}",
            path.name()
        );
        drop(queue);
    }
}

/// A verb that completed in error (here a READ the memory node refuses:
/// the device was told its region is twice as long as it is) ended the
/// queue with an error no request owned. Its request fails by its token
/// now; the queue pair, in the error state, takes no new work, and its
/// path is not given back for the next session.
#[test]
fn a_refused_read_fails_by_token_and_its_broken_path_is_not_reused() {
    use remora_kv::device::rack_nic::{connect, register_pool, PowerCut};
    use remora_kv::{Device, DeviceError};
    use remora_rack::scenario::{Network, RackStage, SimulatedStage};
    use remora_rack::topology::{Topology, COMPUTE_HOST, MEMORY_HOST};
    use std::sync::Mutex;
    const POOL_BYTES: u64 = 1 << 20;
    let stage = SimulatedStage::on_network(3, &Topology::compute_and_memory(), Network::CLEAN);
    let timeout = stage.queue_pair_timeout();
    let forwarding = stage.topology().forwarding();
    let mut rack = stage.start(forwarding).unwrap();
    let pool = register_pool(&mut rack, MEMORY_HOST, POOL_BYTES).unwrap();
    let rack = Arc::new(Mutex::new(rack));
    let paths = connect(
        &rack,
        (COMPUTE_HOST, MEMORY_HOST),
        pool,
        1,
        (timeout, PowerCut::never()),
    )
    .unwrap();
    let mut claimed = pool.region;
    claimed.length_bytes = 2 * POOL_BYTES;
    let device = FarMemoryDevice::on_paths("refusing", &claimed, paths);
    let mut queue = device.open_queue().unwrap();
    queue.read(POOL_BYTES + 4096, 64, 1).unwrap();
    let failed = (0..100_000)
        .find_map(|_| {
            queue
                .poll(&mut |token, _| panic!("request {token} completed"))
                .err()
        })
        .expect("the refused READ fails");
    assert!(
        matches!(failed, DeviceError::RequestFailed { token: 1, .. }),
        "{failed:?}"
    );
    assert!(
        matches!(queue.read(0, 64, 2), Err(DeviceError::FarMemory(ref reason)) if reason.contains("queue pair failed")),
        "new work on a failed queue pair is refused"
    );
    drop(queue);
    assert!(
        device.open_queue().is_err(),
        "the broken path was given back"
    );
}
