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
    /// The left queue pair's protection domain.
    pub left_pd: ProtectionDomain,
}

pub fn setup_with(access: AccessFlags, configure: impl Fn(&mut QueuePairBuilder)) -> Setup {
    setup_on(BackToBack::new(7), access, configure)
}

/// [`setup_with`] on devices the caller configured.
pub fn setup_on(
    mut fabric: BackToBack,
    access: AccessFlags,
    configure: impl Fn(&mut QueuePairBuilder),
) -> Setup {
    let mut sides = Vec::new();
    for device in [&mut fabric.left, &mut fabric.right] {
        let pd = device.alloc_protection_domain().unwrap();
        let mr = device.register_memory(pd, REGION_BYTES, access).unwrap();
        let cq = device.create_completion_queue(1024).unwrap();
        let mut builder = QueuePairBuilder::new(pd, cq, cq);
        configure(&mut builder);
        sides.push((mr, cq, builder, pd));
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
        left_pd: sides[0].3,
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

/// A request with one local buffer.
pub fn request(id: u64, operation: SendOperation, local: ScatterGatherElement) -> SendRequest {
    SendRequest::new(id, operation, &[local]).unwrap()
}

/// A WRITE of `len` bytes from the left region at `local_offset`.
pub fn write_request(
    s: &Setup,
    id: u64,
    local_offset: u64,
    remote: RemoteAddress,
    len: u32,
) -> SendRequest {
    let operation = SendOperation::Write {
        remote,
        immediate: None,
    };
    request(id, operation, s.left_mr.slice(local_offset, len))
}

/// A READ of `len` bytes of the right region into the left one.
pub fn read_request(
    s: &Setup,
    id: u64,
    remote_offset: u64,
    local_offset: u64,
    len: u32,
) -> SendRequest {
    let operation = SendOperation::Read {
        remote: s.right_mr.remote(remote_offset),
    };
    request(id, operation, s.left_mr.slice(local_offset, len))
}

/// A FETCH_ADD on the right region, the old value landing on the left.
pub fn fetch_add(
    s: &Setup,
    id: u64,
    remote_offset: u64,
    local_offset: u64,
    add: u64,
) -> SendRequest {
    let operation = SendOperation::FetchAdd {
        remote: s.right_mr.remote(remote_offset),
        add,
    };
    request(id, operation, s.left_mr.slice(local_offset, 8))
}

/// A SEND of `len` bytes from the left region.
pub fn send_request(s: &Setup, id: u64, local_offset: u64, len: u32) -> SendRequest {
    request(
        id,
        SendOperation::Send { immediate: None },
        s.left_mr.slice(local_offset, len),
    )
}

/// Every frame `device` has to send at `now`, in order.
pub fn frames_of(device: &mut SoftRnic, now: Timestamp) -> Vec<Vec<u8>> {
    let mut buffer = vec![0u8; remora_wire::frame::MAX_FRAME_LEN];
    let mut frames = Vec::new();
    while let Some(length) = device.poll_transmit(now, &mut buffer) {
        frames.push(buffer[..length].to_vec());
    }
    frames
}

/// Every frame the left device has to send now, in order.
pub fn left_frames(s: &mut Setup) -> Vec<Vec<u8>> {
    frames_of(&mut s.fabric.left, s.fabric.now)
}

/// Every frame the right device has to send now, in order.
pub fn right_frames(s: &mut Setup) -> Vec<Vec<u8>> {
    frames_of(&mut s.fabric.right, s.fabric.now)
}

/// Moves every frame `from` has to send at `now` into `to`; how many.
pub fn deliver_all(from: &mut SoftRnic, to: &mut SoftRnic, now: Timestamp) -> usize {
    let mut buffer = vec![0u8; remora_wire::frame::MAX_FRAME_LEN];
    let mut moved = 0;
    while let Some(length) = from.poll_transmit(now, &mut buffer) {
        to.handle_frame(now, &buffer[..length]);
        moved += 1;
    }
    moved
}
