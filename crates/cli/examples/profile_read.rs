use remora_rnic::back_to_back::{BackToBack, Verdict};
use remora_rnic::*;
fn main() {
    let size: u32 = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(64);
    let write = std::env::args().nth(2).is_some();
    let mut fabric = BackToBack::new(1);
    let lpd = fabric.left.alloc_protection_domain().unwrap();
    let rpd = fabric.right.alloc_protection_domain().unwrap();
    let local = fabric
        .left
        .register_memory(lpd, 1 << 20, AccessFlags::ALL)
        .unwrap();
    let remote = fabric
        .right
        .register_memory(rpd, 1 << 20, AccessFlags::ALL)
        .unwrap();
    let lcq = fabric.left.create_completion_queue(64).unwrap();
    let rcq = fabric.right.create_completion_queue(64).unwrap();
    let (qp, _) = fabric
        .connect(
            &QueuePairBuilder::new(lpd, lcq, lcq),
            &QueuePairBuilder::new(rpd, rcq, rcq),
        )
        .unwrap();
    let op = if write {
        SendOperation::Write {
            remote: remote.remote(0),
            immediate: None,
        }
    } else {
        SendOperation::Read {
            remote: remote.remote(0),
        }
    };
    let request = SendRequest::new(1, op, &[local.slice(0, size)]).unwrap();
    for _ in 0..(2_000_000_000 / (size as usize * 8 + 4096)) {
        fabric.left.post_send(qp, request).unwrap();
        while fabric.left.poll_completion(lcq).unwrap().is_none() {
            fabric.step(&mut |_, _| Verdict::Deliver);
        }
    }
}
