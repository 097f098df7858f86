//! Destroyed queue pairs, completion queues and shared receive queues give
//! their places back: a process may make far more of each over its life
//! than the device holds at once (each took a place for good, so a
//! long-running server ran out after 1024 connections). A reused queue
//! pair slot takes a new number, so that nothing meant for the old queue
//! pair reaches the new one.

mod common;

use common::*;
use remora_rnic::*;

#[test]
fn queues_made_and_destroyed_again_and_again_never_run_out() {
    let mut s = setup();
    let device = &mut s.fabric.left;
    let pd = device.alloc_protection_domain().unwrap();
    let limit = device.config().max_queue_pairs;
    let mut numbers = std::collections::HashSet::new();
    for round in 0..3 * limit {
        let cq = device.create_completion_queue(16).unwrap();
        let srq = device.create_shared_receive_queue(pd, 16).unwrap();
        let mut builder = QueuePairBuilder::new(pd, cq, cq);
        builder.shared_receive_queue = Some(srq);
        let prepared = device.create_queue_pair(&builder).unwrap();
        assert!(
            numbers.insert(prepared.qpn),
            "round {round}: number {:?} given twice",
            prepared.qpn
        );
        // In use, neither queue can go.
        assert!(matches!(
            device.destroy_completion_queue(cq),
            Err(VerbsError::QueueInUse { .. })
        ));
        assert!(matches!(
            device.destroy_shared_receive_queue(srq),
            Err(VerbsError::QueueInUse { .. })
        ));
        device.retire_queue_pair(prepared.qpn).unwrap();
        device.destroy_shared_receive_queue(srq).unwrap();
        device.destroy_completion_queue(cq).unwrap();
        assert!(matches!(
            device.poll_completion(cq),
            Err(VerbsError::UnknownCompletionQueue)
        ));
    }
}

#[test]
fn a_reused_slot_answers_to_its_new_number_only() {
    let mut s = setup();
    let old = s.right_qp;
    s.fabric.right.retire_queue_pair(old.0).unwrap();
    let pd = s.fabric.right.alloc_protection_domain().unwrap();
    let builder = QueuePairBuilder::new(pd, s.right_cq, s.right_cq);
    let new = s.fabric.right.create_queue_pair(&builder).unwrap();
    assert_ne!(new.qpn, old.0);
    assert!(matches!(
        s.fabric
            .right
            .modify_queue_pair(old.0, QueuePairTransition::Init),
        Err(VerbsError::UnknownQueuePair(_))
    ));
    s.fabric
        .right
        .modify_queue_pair(new.qpn, QueuePairTransition::Init)
        .unwrap();
    // A WRITE the left side still aims at the old queue pair is dropped as
    // for no queue pair, not taken by the new one.
    let request = write_request(&s, 1, 0, s.right_mr.remote(0), 64);
    s.fabric.left.post_send(s.left_qp, request).unwrap();
    s.fabric.run(1_000);
    let drops = s.fabric.right.counters().drops_by_name();
    assert!(
        drops.get("unknown_queue_pair").copied().unwrap_or(0) > 0,
        "{drops:?}"
    );
}

/// A retired queue pair's context waits in its slot for the next one, and
/// it was still found there: it could be retired again, brought back
/// through INIT and queried (found by reading). It is gone.
#[test]
fn a_retired_queue_pair_is_gone_before_its_slot_is_reused() {
    let mut s = setup();
    let old = s.right_qp;
    s.fabric.right.retire_queue_pair(old.0).unwrap();
    assert!(matches!(
        s.fabric.right.retire_queue_pair(old.0),
        Err(VerbsError::UnknownQueuePair(_))
    ));
    assert!(matches!(
        s.fabric
            .right
            .modify_queue_pair(old.0, QueuePairTransition::Init),
        Err(VerbsError::UnknownQueuePair(_))
    ));
    assert!(matches!(
        s.fabric.right.queue_pair_state(old.0),
        Err(VerbsError::UnknownQueuePair(_))
    ));
}
