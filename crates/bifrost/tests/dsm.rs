//! The DSM on an embedded rack of three memory nodes: data round trips
//! through every node, and every misuse is a typed error that touches
//! nothing.

use remora_bifrost::dsm::client::DsmError;
use remora_bifrost::dsm::message::{Operation, Request, Status};
use remora_bifrost::dsm::rack::{DsmRack, DsmRackConfig};
use remora_bifrost::dsm::GlobalPtr;

fn rack() -> DsmRack {
    DsmRack::start(DsmRackConfig::default()).expect("a DSM rack starts")
}

#[test]
fn allocations_spread_over_the_nodes_and_read_back_what_was_written() {
    let rack = rack();
    let dsm = &rack.dsm;
    let mut pointers = Vec::new();
    for index in 0..6u8 {
        // Larger than a chunk, so transfers are split.
        let size = 100_000 + u64::from(index);
        let ptr = dsm.alloc(size).unwrap();
        let data: Vec<u8> = (0..size)
            .map(|byte| (byte as u8).wrapping_add(index))
            .collect();
        dsm.write(ptr, &data).unwrap();
        pointers.push((ptr, data));
    }
    let nodes: std::collections::BTreeSet<u8> = pointers.iter().map(|(ptr, _)| ptr.node).collect();
    assert_eq!(nodes.len(), 3, "round robin over three nodes");
    for (ptr, data) in &pointers {
        let mut back = vec![0u8; data.len()];
        dsm.read(*ptr, &mut back).unwrap();
        assert_eq!(&back, data);
    }
    // Writes to one node land in order: the last one wins.
    let (ptr, _) = pointers[0];
    for round in 0..20u8 {
        dsm.write_at(ptr, 8, &[round; 16]).unwrap();
    }
    let mut back = [0u8; 16];
    dsm.read_at(ptr, 8, &mut back).unwrap();
    assert_eq!(back, [19u8; 16]);
}

#[test]
fn misuse_is_a_typed_error() {
    let rack = rack();
    let dsm = &rack.dsm;
    let ptr = dsm.alloc_on(1, 4096).unwrap();
    let mut buffer = [0u8; 16];
    assert!(matches!(
        dsm.read_at(ptr, 4090, &mut buffer),
        Err(DsmError::OutOfRange { size: 4096, .. })
    ));
    // A length a caller lent is refused before a buffer of it is made:
    // `by_reference::read_argument` allocated first, and a lent length of
    // 2^60 aborted the service's process.
    assert!(matches!(
        dsm.read_vec_at(ptr, 0, 1 << 60),
        Err(DsmError::OutOfRange { size: 4096, .. })
    ));
    assert_eq!(dsm.read_vec_at(ptr, 4088, 8).unwrap().len(), 8);
    assert!(matches!(
        dsm.write_at(ptr, 4096, &[1]),
        Err(DsmError::OutOfRange { .. })
    ));
    dsm.free(ptr).unwrap();
    assert!(matches!(dsm.free(ptr), Err(DsmError::DoubleFree(p)) if p == ptr));
    assert!(matches!(
        dsm.read(ptr, &mut buffer),
        Err(DsmError::UseAfterFree(_))
    ));
    // The same offset handed out again: the old pointer's generation is
    // stale, so it still cannot reach the new owner's bytes.
    let again = dsm.alloc_on(1, 4096).unwrap();
    assert_eq!((again.node, again.offset), (ptr.node, ptr.offset));
    assert_ne!(again.generation, ptr.generation);
    dsm.forget(ptr);
    assert!(matches!(
        dsm.write(ptr, &[7]),
        Err(DsmError::UseAfterFree(_))
    ));
    let never = GlobalPtr {
        node: 2,
        generation: 0,
        offset: 1 << 20,
    };
    assert!(matches!(
        dsm.read(never, &mut buffer),
        Err(DsmError::NotAllocated(_))
    ));
    assert!(matches!(dsm.alloc_on(9, 1), Err(DsmError::UnknownNode(9))));
    assert!(matches!(
        dsm.alloc_on(0, 1 << 40),
        Err(DsmError::NoSpace { node: 0, .. })
    ));
}

#[test]
fn snapshots_restore_a_region() {
    let rack = rack();
    let dsm = &rack.dsm;
    let ptr = dsm.alloc_on(2, 10_000).unwrap();
    assert!(matches!(dsm.restore(ptr), Err(DsmError::NoSnapshot(_))));
    dsm.write(ptr, &[1u8; 10_000]).unwrap();
    dsm.snapshot(ptr).unwrap();
    dsm.write(ptr, &[2u8; 10_000]).unwrap();
    dsm.restore(ptr).unwrap();
    let mut back = vec![0u8; 10_000];
    dsm.read(ptr, &mut back).unwrap();
    assert!(back.iter().all(|&byte| byte == 1));
}

/// A memory node kept up to 32 snapshots of every allocation with no
/// bound on their sum: one client's snapshots of a pool-sized allocation
/// held 32 times the pool in the daemon's heap. Snapshots hold at most
/// the pool's size again; past it one is refused, and a free gives its
/// bytes back.
#[test]
fn snapshots_hold_no_more_than_the_pool() {
    let rack = rack();
    let dsm = &rack.dsm;
    let half = 8 << 20;
    let ptr = dsm.alloc_on(1, half).unwrap();
    dsm.snapshot_version(ptr, 1).unwrap();
    dsm.snapshot_version(ptr, 2).unwrap();
    // A version again replaces its copy: no more bytes.
    dsm.snapshot_version(ptr, 2).unwrap();
    assert!(matches!(
        dsm.snapshot_version(ptr, 3),
        Err(DsmError::Refused {
            node: 1,
            operation: Operation::Snapshot,
            status: Status::NoSpace,
        })
    ));
    dsm.restore_version(ptr, 1).unwrap();
    dsm.free(ptr).unwrap();
    let again = dsm.alloc_on(1, half).unwrap();
    dsm.snapshot_version(again, 1).unwrap();
    dsm.snapshot_version(again, 2).unwrap();
    // An allocation of a 32nd of the pool fills the budget with its 32
    // versions; each later one takes the oldest's place, not refused.
    let thirty_second = dsm.alloc_on(2, (16 << 20) / 32).unwrap();
    for version in 1..=40 {
        dsm.snapshot_version(thirty_second, version)
            .unwrap_or_else(|error| panic!("version {version}: {error}"));
    }
    dsm.restore_version(thirty_second, 40).unwrap();
}

/// Snapshots by version: each restores its own bytes, an unknown version
/// is refused, and only the newest 32 are kept.
#[test]
fn snapshots_are_kept_by_version() {
    use remora_bifrost::dsm::daemon::SNAPSHOTS_PER_ALLOCATION;
    let rack = rack();
    let dsm = &rack.dsm;
    let ptr = dsm.alloc_on(1, 64).unwrap();
    let versions = SNAPSHOTS_PER_ALLOCATION as u64 + 8;
    for version in 1..=versions {
        dsm.write(ptr, &[version as u8; 64]).unwrap();
        dsm.snapshot_version(ptr, version).unwrap();
    }
    let mut back = [0u8; 64];
    for version in [versions, versions - 5, 9] {
        dsm.restore_version(ptr, version).unwrap();
        dsm.read(ptr, &mut back).unwrap();
        assert_eq!(back, [version as u8; 64], "version {version}");
    }
    for dropped in [1, 8] {
        assert!(
            matches!(
                dsm.restore_version(ptr, dropped),
                Err(DsmError::NoSnapshot(_))
            ),
            "version {dropped} is older than the newest {SNAPSHOTS_PER_ALLOCATION}"
        );
    }
    assert!(matches!(
        dsm.restore_version(ptr, versions + 1),
        Err(DsmError::NoSnapshot(_))
    ));
}

#[test]
fn the_daemon_answers_a_malformed_request_and_stays_up() {
    use remora_bifrost::dsm::message::Reply;
    let rack = rack();
    let mut daemon = rack.daemons[0].lock().unwrap();
    // Freeing what was never allocated, and a restore with no snapshot.
    let never = Request {
        operation: Operation::Free,
        generation: 0,
        request_id: 1,
        offset: 64,
        size: 0,
    };
    assert_eq!(daemon.handle(never).status, Status::NotAllocated);
    let reply: Reply = daemon.handle(Request {
        operation: Operation::Allocate,
        generation: 0,
        request_id: 2,
        offset: 0,
        size: 10,
    });
    assert_eq!(reply.status, Status::Ok);
    let restore = Request {
        operation: Operation::Restore,
        generation: reply.generation,
        request_id: 3,
        offset: reply.offset,
        size: 0,
    };
    assert_eq!(daemon.handle(restore).status, Status::NoSnapshot);
}

#[test]
fn dsm_message_seeds_replay() {
    let directory = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/seeds/dsm_messages");
    let mut count = 0;
    for entry in std::fs::read_dir(directory).expect("the seed directory") {
        let bytes = std::fs::read(entry.expect("a seed").path()).expect("a readable seed");
        assert!(remora_bifrost::dsm::message::any_message(&bytes));
        count += 1;
    }
    assert!(count >= 2);
}

/// `pass_by_reference`, `return_array` and the failover counter's region
/// returned a failed write's error with the new allocation's pointer
/// dropped: nobody else may free it (the Gatekeeper's rules give its
/// control to its maker alone), so it leaked. It is freed first now.
#[test]
fn an_allocation_whose_first_write_failed_is_freed() {
    let rack = rack();
    let dsm = &rack.dsm;
    let ptr = dsm.alloc_on(1, 4096).unwrap();
    let failed =
        remora_bifrost::by_reference::freed_on_error(dsm, ptr, dsm.write_at(ptr, 4090, &[0u8; 16]));
    assert!(matches!(failed, Err(DsmError::OutOfRange { .. })));
    assert!(dsm.free(ptr).is_err(), "it was freed already");
}
