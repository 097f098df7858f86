//! Host memory registered with the NIC: the application sees what remote
//! WRITEs and atomics put there through its own handle, remote READs
//! return what it stored, and bounds and keys are checked as for any
//! region.

mod common;

use common::*;
use remora_rnic::back_to_back::BackToBack;
use remora_rnic::*;
use std::sync::atomic::Ordering;

struct HostSetup {
    fabric: BackToBack,
    queue_pair: QueuePair,
    completions: CompletionQueue,
    local: MemoryRegion,
    host: HostMemory,
    remote: MemoryRegion,
}

/// The right device's region is host memory the test also holds.
fn host_setup() -> HostSetup {
    let mut fabric = BackToBack::new(11);
    let left_pd = fabric.left.alloc_protection_domain().unwrap();
    let local = fabric
        .left
        .register_memory(left_pd, 4096, AccessFlags::ALL)
        .unwrap();
    let completions = fabric.left.create_completion_queue(64).unwrap();
    let right_pd = fabric.right.alloc_protection_domain().unwrap();
    let host = HostMemory::new(4096);
    let remote = fabric
        .right
        .register_host_memory(right_pd, host.clone(), AccessFlags::ALL)
        .unwrap();
    let right_cq = fabric.right.create_completion_queue(64).unwrap();
    let (queue_pair, _) = fabric
        .connect(
            &QueuePairBuilder::new(left_pd, completions, completions),
            &QueuePairBuilder::new(right_pd, right_cq, right_cq),
        )
        .unwrap();
    HostSetup {
        fabric,
        queue_pair,
        completions,
        local,
        host,
        remote,
    }
}

impl HostSetup {
    fn run(&mut self, request: SendRequest) -> WorkCompletion {
        self.fabric
            .left
            .post_send(self.queue_pair, request)
            .unwrap();
        assert!(self.fabric.run(1000).quiesced);
        let mut completions = drain(&mut self.fabric.left, self.completions);
        assert_eq!(completions.len(), 1);
        completions.pop().unwrap()
    }
}

#[test]
fn remote_writes_and_atomics_land_in_the_applications_memory() {
    let mut s = host_setup();
    let payload = pattern(1500, 3);
    write_region(&mut s.fabric.left, &s.local, 0, &payload);
    let write = request(
        1,
        SendOperation::Write {
            remote: s.remote.remote(13),
            immediate: None,
        },
        s.local.slice(0, 1500),
    );
    assert_eq!(s.run(write).status, CompletionStatus::Success);
    let mut seen = vec![0u8; 1500];
    s.host.read(13, &mut seen).unwrap();
    assert_eq!(seen, payload);

    s.host.store_u64(2048, 40, Ordering::Release).unwrap();
    let add = request(
        2,
        SendOperation::FetchAdd {
            remote: s.remote.remote(2048),
            add: 2,
        },
        s.local.slice(2048, 8),
    );
    assert_eq!(s.run(add).status, CompletionStatus::Success);
    assert_eq!(s.host.load_u64(2048, Ordering::Acquire), Ok(42));
    assert_eq!(
        read_region(&s.fabric.left, &s.local, 2048, 8),
        40u64.to_le_bytes()
    );
}

#[test]
fn remote_reads_return_what_the_application_stored() {
    let mut s = host_setup();
    s.host.write(100, b"stored by the application").unwrap();
    let read = request(
        1,
        SendOperation::Read {
            remote: s.remote.remote(100),
        },
        s.local.slice(0, 25),
    );
    assert_eq!(s.run(read).status, CompletionStatus::Success);
    assert_eq!(
        read_region(&s.fabric.left, &s.local, 0, 25),
        b"stored by the application"
    );
}

#[test]
fn host_memory_is_bounds_checked_like_any_region() {
    let mut s = host_setup();
    let read = request(
        1,
        SendOperation::Read {
            remote: s.remote.remote(4090),
        },
        s.local.slice(0, 16),
    );
    assert_eq!(s.run(read).status, CompletionStatus::RemoteAccessError);
    let empty = HostMemory::new(0);
    let pd = s.fabric.right.alloc_protection_domain().unwrap();
    assert!(matches!(
        s.fabric
            .right
            .register_host_memory(pd, empty, AccessFlags::ALL),
        Err(VerbsError::InvalidRegionLength(0))
    ));
}
