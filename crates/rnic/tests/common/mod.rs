//! A connected pair of devices with one region and one CQ each side.
#![allow(dead_code)] // Each test binary uses a different part of this module.

use remora_rnic::back_to_back::BackToBack;
use remora_rnic::*;

pub const REGION_BYTES: u64 = 256 * 1024;

pub struct Setup {
    pub fabric: BackToBack,
    pub left_qp: QueuePair,
    pub right_qp: QueuePair,
    pub left_mr: MemoryRegion,
    pub right_mr: MemoryRegion,
    pub left_cq: CompletionQueue,
    pub right_cq: CompletionQueue,
}

pub fn setup_with(access: AccessFlags, configure: impl Fn(&mut QueuePairBuilder)) -> Setup {
    let mut fabric = BackToBack::new(7);
    let mut sides = Vec::new();
    for device in [&mut fabric.left, &mut fabric.right] {
        let pd = device.alloc_protection_domain().unwrap();
        let mr = device.register_memory(pd, REGION_BYTES, access).unwrap();
        let cq = device.create_completion_queue(1024).unwrap();
        let mut builder = QueuePairBuilder::new(pd, cq, cq);
        configure(&mut builder);
        sides.push((mr, cq, builder));
    }
    let (left_qp, right_qp) = fabric.connect(&sides[0].2, &sides[1].2).unwrap();
    Setup {
        fabric,
        left_qp,
        right_qp,
        left_mr: sides[0].0,
        right_mr: sides[1].0,
        left_cq: sides[0].1,
        right_cq: sides[1].1,
    }
}

pub fn setup() -> Setup {
    setup_with(AccessFlags::ALL, |_| {})
}

pub fn drain(device: &mut SoftRnic, cq: CompletionQueue) -> Vec<WorkCompletion> {
    let mut completions = Vec::new();
    while let Some(completion) = device.poll_completion(cq).unwrap() {
        completions.push(completion);
    }
    completions
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

pub fn read_region(device: &SoftRnic, mr: &MemoryRegion, offset: u64, len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    device
        .read_local(
            mr.lkey,
            remora_wire::VirtAddr(mr.address.0 + offset),
            &mut bytes,
        )
        .unwrap();
    bytes
}

pub fn write_region(device: &mut SoftRnic, mr: &MemoryRegion, offset: u64, bytes: &[u8]) {
    device
        .write_local(mr.lkey, remora_wire::VirtAddr(mr.address.0 + offset), bytes)
        .unwrap();
}
