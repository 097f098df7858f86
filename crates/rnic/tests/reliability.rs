//! NAKs, go-back-N, RNR, retry limits, the replay cache and ACK coalescing.

mod common;

use common::*;
use remora_rnic::back_to_back::{BackToBack, Direction, Verdict};
use remora_rnic::*;
use remora_wire::{parse_frame, Opcode};
use std::time::Duration;

fn opcode_of(bytes: &[u8]) -> Opcode {
    parse_frame(bytes).unwrap().repr.bth.opcode
}

fn statuses(device: &mut SoftRnic, cq: CompletionQueue) -> Vec<(u64, CompletionStatus)> {
    drain(device, cq)
        .iter()
        .map(|c| (c.work_request_id, c.status))
        .collect()
}

/// Asserts that the left side's requests `1..=count` completed, in order
/// and each with success.
fn assert_all_succeeded(s: &mut Setup, count: u64) {
    let expected: Vec<_> = (1..=count)
        .map(|id| (id, CompletionStatus::Success))
        .collect();
    assert_eq!(statuses(&mut s.fabric.left, s.left_cq), expected);
}

/// Picks the remote address a case aims at.
type TargetOf = fn(&Setup) -> RemoteAddress;

#[test]
fn bad_rkey_out_of_bounds_and_missing_rights_get_remote_access_naks() {
    let cases: [(&str, AccessFlags, TargetOf); 3] = [
        ("bad rkey", AccessFlags::ALL, |s| RemoteAddress {
            address: s.right_mr.address,
            rkey: remora_wire::Rkey(s.right_mr.rkey.0 ^ 1),
        }),
        ("out of bounds", AccessFlags::ALL, |s| {
            s.right_mr.remote(REGION_BYTES - 4)
        }),
        (
            "no REMOTE_WRITE",
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
            |s| s.right_mr.remote(0),
        ),
    ];
    for (name, access, target) in cases {
        let mut s = setup_with(access, |_| {});
        write_region(&mut s.fabric.left, &s.left_mr, 0, &[0xab; 64]);
        let before = read_region(&s.fabric.right, &s.right_mr, 0, REGION_BYTES as usize);
        let remote = target(&s);
        s.fabric
            .left
            .post_send(s.left_qp, write_request(&s, 1, 0, remote, 64))
            .unwrap();
        s.fabric
            .left
            .post_send(s.left_qp, write_request(&s, 2, 0, s.right_mr.remote(0), 8))
            .unwrap();
        assert!(s.fabric.run(1000).quiesced, "{name}");
        assert_eq!(
            statuses(&mut s.fabric.left, s.left_cq),
            vec![
                (1, CompletionStatus::RemoteAccessError),
                (2, CompletionStatus::WorkRequestFlushError)
            ],
            "{name}"
        );
        assert_eq!(
            read_region(&s.fabric.right, &s.right_mr, 0, REGION_BYTES as usize),
            before,
            "{name}: memory unchanged"
        );
        assert_eq!(
            s.fabric.left.queue_pair_state(s.left_qp.0).unwrap(),
            QueuePairState::Error
        );
        assert_eq!(
            s.fabric.right.queue_pair_state(s.right_qp.0).unwrap(),
            QueuePairState::Error
        );
        assert_eq!(s.fabric.right.counters().error_naks_sent, 1);
    }
}

/// A queue pair that does not let peers WRITE (its own access flags, not
/// the region's) answered a WRITE with a Remote Access Error, which blames
/// the region and its key. It is a request the queue pair does not serve:
/// an Invalid Request NAK, as the Linux soft-RoCE driver answers.
#[test]
fn a_write_to_a_queue_pair_that_allows_none_is_an_invalid_request() {
    let mut s = setup_with(AccessFlags::ALL, |builder| {
        builder.remote_access = AccessFlags::REMOTE_READ;
    });
    let before = read_region(&s.fabric.right, &s.right_mr, 0, 64);
    let write = write_request(&s, 1, 0, s.right_mr.remote(0), 64);
    s.fabric.left.post_send(s.left_qp, write).unwrap();
    assert!(s.fabric.run(1000).quiesced);
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![(1, CompletionStatus::RemoteInvalidRequestError)]
    );
    assert_eq!(read_region(&s.fabric.right, &s.right_mr, 0, 64), before);
}

/// A WRITE with immediate to a queue pair that takes no WRITEs, with no
/// receive posted, got an RNR NAK before the refusal: the requester
/// retried for as long as its RNR retry count allowed (for ever at 7),
/// when a receive could only ever lead to the same refusal.
#[test]
fn a_write_with_immediate_the_queue_pair_refuses_is_not_told_to_retry() {
    let mut s = setup_with(AccessFlags::ALL, |builder| {
        builder.remote_access = AccessFlags::REMOTE_READ;
    });
    let operation = SendOperation::Write {
        remote: s.right_mr.remote(0),
        immediate: Some(7),
    };
    let write = request(1, operation, s.left_mr.slice(0, 8));
    s.fabric.left.post_send(s.left_qp, write).unwrap();
    assert!(s.fabric.run(1000).quiesced);
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![(1, CompletionStatus::RemoteInvalidRequestError)]
    );
    assert_eq!(s.fabric.right.counters().receiver_not_ready_naks_sent, 0);
}

#[test]
fn read_and_atomic_violations_leave_memory_unchanged() {
    let mut s = setup_with(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE, |_| {});
    write_region(&mut s.fabric.right, &s.right_mr, 0, &5u64.to_le_bytes());
    let add = fetch_add(&s, 1, 0, 0, 1);
    s.fabric.left.post_send(s.left_qp, add).unwrap();
    assert!(s.fabric.run(1000).quiesced);
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![(1, CompletionStatus::RemoteAccessError)]
    );
    assert_eq!(
        read_region(&s.fabric.right, &s.right_mr, 0, 8),
        5u64.to_le_bytes()
    );

    let mut s = setup_with(AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE, |_| {});
    let read = read_request(&s, 1, 0, 0, 8);
    s.fabric.left.post_send(s.left_qp, read).unwrap();
    assert!(s.fabric.run(1000).quiesced);
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![(1, CompletionStatus::RemoteAccessError)]
    );
}

#[test]
fn a_send_larger_than_the_receive_is_an_invalid_request() {
    let mut s = setup();
    s.fabric
        .right
        .post_receive(
            s.right_qp,
            ReceiveRequest::new(9, &[s.right_mr.slice(0, 16)]).unwrap(),
        )
        .unwrap();
    let send = send_request(&s, 1, 0, 17);
    s.fabric.left.post_send(s.left_qp, send).unwrap();
    assert!(s.fabric.run(1000).quiesced);
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![(1, CompletionStatus::RemoteInvalidRequestError)]
    );
    assert_eq!(
        statuses(&mut s.fabric.right, s.right_cq),
        vec![(9, CompletionStatus::LocalLengthError)]
    );
}

/// The responder's maximum message size bounds a SEND even when the
/// receive waiting for it is larger.
#[test]
fn a_send_longer_than_the_responders_maximum_message_is_an_invalid_request() {
    let [left, mut right] = BackToBack::configs(7);
    right.max_message_bytes = 4096;
    let mut s = setup_on(
        BackToBack::with_configs(left, right),
        AccessFlags::ALL,
        |_| {},
    );
    for (id, offset) in [(9, 0), (10, 16 * 1024)] {
        let receive = ReceiveRequest::new(id, &[s.right_mr.slice(offset, 16 * 1024)]).unwrap();
        s.fabric.right.post_receive(s.right_qp, receive).unwrap();
    }
    s.fabric
        .left
        .post_send(s.left_qp, send_request(&s, 1, 0, 4096))
        .unwrap();
    assert!(s.fabric.run(1000).quiesced);
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![(1, CompletionStatus::Success)],
        "a SEND at the maximum is taken"
    );
    s.fabric
        .left
        .post_send(s.left_qp, send_request(&s, 2, 0, 4097))
        .unwrap();
    assert!(s.fabric.run(1000).quiesced);
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![(2, CompletionStatus::RemoteInvalidRequestError)]
    );
    assert_eq!(
        statuses(&mut s.fabric.right, s.right_cq),
        vec![
            (9, CompletionStatus::Success),
            (10, CompletionStatus::LocalLengthError)
        ]
    );
}

#[test]
fn a_lost_packet_mid_message_is_recovered_by_a_sequence_nak() {
    let mut s = setup_with(AccessFlags::ALL, |builder| builder.path_mtu = Mtu::MTU_1024);
    let data = pattern(8192, 1);
    write_region(&mut s.fabric.left, &s.left_mr, 0, &data);
    s.fabric
        .left
        .post_send(
            s.left_qp,
            write_request(&s, 1, 0, s.right_mr.remote(0), 8192),
        )
        .unwrap();
    let mut requests_seen = 0;
    let summary = s.fabric.run_filtered(1000, &mut |direction, _bytes| {
        if direction == Direction::LeftToRight {
            requests_seen += 1;
            if requests_seen == 3 {
                return Verdict::Drop;
            }
        }
        Verdict::Deliver
    });
    assert!(summary.quiesced);
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![(1, CompletionStatus::Success)]
    );
    assert_eq!(read_region(&s.fabric.right, &s.right_mr, 0, 8192), data);
    assert_eq!(
        s.fabric.right.counters().sequence_naks_sent,
        1,
        "one NAK per gap"
    );
    assert_eq!(s.fabric.left.counters().sequence_naks_received, 1);
    assert_eq!(
        summary.timeouts_fired, 0,
        "the NAK, not the timer, recovered"
    );
}

#[test]
fn a_lost_atomic_answer_is_replayed_not_re_executed() {
    let mut s = setup();
    write_region(&mut s.fabric.right, &s.right_mr, 0, &10u64.to_le_bytes());
    let add = fetch_add(&s, 1, 0, 0, 1);
    s.fabric.left.post_send(s.left_qp, add).unwrap();
    let mut dropped = false;
    let summary = s.fabric.run_filtered(1000, &mut |direction, bytes| {
        if direction == Direction::RightToLeft
            && opcode_of(bytes) == Opcode::AtomicAcknowledge
            && !dropped
        {
            dropped = true;
            return Verdict::Drop;
        }
        Verdict::Deliver
    });
    assert!(summary.quiesced && summary.timeouts_fired >= 1);
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![(1, CompletionStatus::Success)]
    );
    assert_eq!(
        read_region(&s.fabric.right, &s.right_mr, 0, 8),
        11u64.to_le_bytes(),
        "applied exactly once"
    );
    assert_eq!(
        read_region(&s.fabric.left, &s.left_mr, 0, 8),
        10u64.to_le_bytes(),
        "the original old value"
    );
    assert_eq!(s.fabric.right.counters().replayed_atomics, 1);
}

#[test]
fn a_retransmitted_read_returns_the_original_data() {
    let mut s = setup_with(AccessFlags::ALL, |builder| builder.path_mtu = Mtu::MTU_256);
    write_region(&mut s.fabric.right, &s.right_mr, 0, &[1; 1024]);
    let read = read_request(&s, 1, 0, 0, 1024);
    s.fabric.left.post_send(s.left_qp, read).unwrap();
    // Lose a middle response packet; once the link is quiet (before the
    // retransmission timer fires), overwrite the source on the responder's
    // host. The retransmitted READ must still return the original bytes.
    let mut responses = 0;
    let mut drop_one = |direction, bytes: &mut [u8]| {
        if direction == Direction::RightToLeft && opcode_of(bytes) == Opcode::RdmaReadResponseMiddle
        {
            responses += 1;
            if responses == 2 {
                return Verdict::Drop;
            }
        }
        Verdict::Deliver
    };
    for _ in 0..100 {
        if s.fabric.step(&mut drop_one) == 0 {
            break;
        }
    }
    assert!(
        drain(&mut s.fabric.left, s.left_cq).is_empty(),
        "the READ waits for the lost packet"
    );
    write_region(&mut s.fabric.right, &s.right_mr, 0, &[2; 1024]);
    let summary = s.fabric.run(1000);
    assert!(summary.quiesced && summary.timeouts_fired >= 1);
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![(1, CompletionStatus::Success)]
    );
    assert_eq!(
        read_region(&s.fabric.left, &s.left_mr, 0, 1024),
        vec![1; 1024]
    );
    assert!(s.fabric.right.counters().replayed_reads >= 1);
}

#[test]
fn an_ack_beyond_an_unanswered_read_triggers_its_reissue() {
    let mut s = setup();
    write_region(&mut s.fabric.right, &s.right_mr, 0, &[3; 64]);
    let read = read_request(&s, 1, 0, 0, 64);
    s.fabric.left.post_send(s.left_qp, read).unwrap();
    s.fabric
        .left
        .post_send(
            s.left_qp,
            write_request(&s, 2, 1000, s.right_mr.remote(1000), 8),
        )
        .unwrap();
    let mut dropped = false;
    let summary = s.fabric.run_filtered(1000, &mut |direction, bytes| {
        if direction == Direction::RightToLeft
            && opcode_of(bytes) == Opcode::RdmaReadResponseOnly
            && !dropped
        {
            dropped = true;
            return Verdict::Drop;
        }
        Verdict::Deliver
    });
    assert!(summary.quiesced);
    assert_eq!(
        summary.timeouts_fired, 0,
        "the later ACK exposed the loss without a timeout"
    );
    assert_all_succeeded(&mut s, 2);
    assert_eq!(read_region(&s.fabric.left, &s.left_mr, 0, 64), vec![3; 64]);
}

#[test]
fn a_dead_link_exhausts_the_retry_count() {
    let mut s = setup_with(AccessFlags::ALL, |builder| {
        builder.retry_count = 3;
        builder.timeout = Duration::from_micros(100);
    });
    s.fabric
        .left
        .post_send(s.left_qp, write_request(&s, 1, 0, s.right_mr.remote(0), 8))
        .unwrap();
    s.fabric
        .left
        .post_send(s.left_qp, write_request(&s, 2, 0, s.right_mr.remote(0), 8))
        .unwrap();
    let summary = s.fabric.run_filtered(1000, &mut |_, _| Verdict::Drop);
    assert!(summary.quiesced);
    assert_eq!(
        summary.timeouts_fired, 4,
        "the first send plus three retries"
    );
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![
            (1, CompletionStatus::RetryExceeded),
            (2, CompletionStatus::WorkRequestFlushError)
        ]
    );
    assert_eq!(s.fabric.now, Timestamp::from_nanos(400_000));
}

/// `ibv_modify_qp`'s timeout and retry count, set after the queue pair
/// was made, are the ones a dead link exhausts.
#[test]
fn retransmission_set_after_creation_is_the_one_used() {
    let mut s = setup_with(AccessFlags::ALL, |builder| {
        builder.retry_count = 7;
        builder.timeout = Duration::from_millis(1);
    });
    let qpn = s.left_qp.0;
    s.fabric
        .left
        .set_retransmission(qpn, Some(Duration::from_micros(50)), Some(2))
        .unwrap();
    assert!(matches!(
        s.fabric.left.set_retransmission(qpn, None, Some(8)),
        Err(VerbsError::InvalidQueueDepth { .. })
    ));
    s.fabric
        .left
        .post_send(s.left_qp, write_request(&s, 1, 0, s.right_mr.remote(0), 8))
        .unwrap();
    let summary = s.fabric.run_filtered(1000, &mut |_, _| Verdict::Drop);
    assert_eq!(summary.timeouts_fired, 3, "the first send plus two retries");
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![(1, CompletionStatus::RetryExceeded)]
    );
    assert_eq!(s.fabric.now, Timestamp::from_nanos(150_000));
}

/// Posts the receive the SEND with id 1 waited for (RNR).
fn post_the_awaited_receive(s: &mut Setup) {
    s.fabric
        .right
        .post_receive(
            s.right_qp,
            ReceiveRequest::new(4, &[s.right_mr.slice(0, 8)]).unwrap(),
        )
        .unwrap();
}

/// Posts the receive the SEND with id 1 waited for (RNR) and runs it to
/// its success.
fn post_the_receive_and_expect_the_send(s: &mut Setup) {
    post_the_awaited_receive(s);
    assert!(s.fabric.run(100).quiesced);
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![(1, CompletionStatus::Success)]
    );
}

#[test]
fn receiver_not_ready_waits_then_delivers() {
    let mut s = setup_with(AccessFlags::ALL, |builder| {
        builder.min_rnr_timer = Duration::from_micros(40)
    });
    let send = send_request(&s, 1, 0, 8);
    s.fabric.left.post_send(s.left_qp, send).unwrap();
    s.fabric.run(2);
    assert_eq!(s.fabric.right.counters().receiver_not_ready_naks_sent, 1);
    post_the_receive_and_expect_the_send(&mut s);
    assert_eq!(
        s.fabric.now,
        Timestamp::from_nanos(40_000),
        "waited the advertised RNR time"
    );
}

#[test]
fn rnr_retry_limit_fails_the_request() {
    let mut s = setup_with(AccessFlags::ALL, |builder| builder.rnr_retry = 2);
    let send = send_request(&s, 1, 0, 8);
    s.fabric.left.post_send(s.left_qp, send).unwrap();
    assert!(s.fabric.run(100).quiesced);
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![(1, CompletionStatus::ReceiverNotReadyRetryExceeded)]
    );
    assert_eq!(s.fabric.right.counters().receiver_not_ready_naks_sent, 3);
}

#[test]
fn acknowledgements_coalesce() {
    let mut s = setup();
    for id in 0..32 {
        s.fabric
            .left
            .post_send(
                s.left_qp,
                write_request(&s, id, id * 8, s.right_mr.remote(id * 8), 8),
            )
            .unwrap();
    }
    // Deliver the requests in one burst before the responder transmits.
    let mut frames = Vec::new();
    let mut buffer = vec![0u8; remora_wire::frame::MAX_FRAME_LEN];
    while let Some(len) = s.fabric.left.poll_transmit(s.fabric.now, &mut buffer) {
        frames.push(buffer[..len].to_vec());
    }
    assert_eq!(frames.len(), 32);
    for frame in &frames {
        s.fabric.right.handle_frame(s.fabric.now, frame);
    }
    assert!(s.fabric.run(100).quiesced);
    assert_eq!(
        s.fabric.right.counters().acks_sent,
        1,
        "one ACK answers the burst"
    );
    assert_eq!(drain(&mut s.fabric.left, s.left_cq).len(), 32);
}

#[test]
fn duplicated_requests_execute_once() {
    let mut s = setup();
    write_region(&mut s.fabric.right, &s.right_mr, 0, &0u64.to_le_bytes());
    for id in 0..5 {
        let add = fetch_add(&s, id, 0, id * 8, 1);
        s.fabric.left.post_send(s.left_qp, add).unwrap();
    }
    let mut buffer = vec![0u8; remora_wire::frame::MAX_FRAME_LEN];
    while let Some(len) = s.fabric.left.poll_transmit(s.fabric.now, &mut buffer) {
        for _ in 0..3 {
            s.fabric.right.handle_frame(s.fabric.now, &buffer[..len]);
        }
    }
    assert!(s.fabric.run(100).quiesced);
    assert_eq!(
        read_region(&s.fabric.right, &s.right_mr, 0, 8),
        5u64.to_le_bytes()
    );
    assert_eq!(s.fabric.right.counters().duplicate_requests, 10);
}

/// A SEND's middle packet shorter than the MTU is an invalid request. The
/// receive its first packet had taken was dropped with it: no completion,
/// not even a flush, and the program never learned of that buffer again.
/// It now completes, flushed, ahead of the receives behind it.
#[test]
fn a_receive_taken_by_a_refused_send_still_completes() {
    let mut s = setup();
    for id in [9, 10] {
        let receive = ReceiveRequest::new(id, &[s.right_mr.slice(0, 16 * 1024)]).unwrap();
        s.fabric.right.post_receive(s.right_qp, receive).unwrap();
    }
    // Three packets at the 4 KiB MTU: First, Middle, Last.
    let send = send_request(&s, 1, 0, 3 * 4096);
    s.fabric.left.post_send(s.left_qp, send).unwrap();
    let frames = left_frames(&mut s);
    let mut buffer = vec![0u8; remora_wire::frame::MAX_FRAME_LEN];
    assert_eq!(opcode_of(&frames[0]), Opcode::SendFirst);
    s.fabric.right.handle_frame(s.fabric.now, &frames[0]);
    let middle = parse_frame(&frames[1]).unwrap();
    let short = middle.repr.with_payload_len(10);
    let length =
        remora_wire::frame::emit_frame(&short, &middle.payload[..10], &mut buffer).unwrap();
    s.fabric.right.handle_frame(s.fabric.now, &buffer[..length]);
    assert_eq!(
        statuses(&mut s.fabric.right, s.right_cq),
        vec![
            (9, CompletionStatus::WorkRequestFlushError),
            (10, CompletionStatus::WorkRequestFlushError)
        ]
    );
}

/// A READ's answer is snapshotted whole into the replay cache, and the
/// responder took any length its region allowed: a peer asking for a
/// region's worth per READ, a window of them, had the device hold that
/// many copies. A READ longer than the device's largest message is now an
/// invalid request.
#[test]
fn a_read_longer_than_the_largest_message_is_refused() {
    let mut s = setup();
    let read = read_request(&s, 1, 0, 0, 64);
    s.fabric.left.post_send(s.left_qp, read).unwrap();
    let frames = left_frames(&mut s);
    let parsed = parse_frame(&frames[0]).unwrap();
    let mut repr = parsed.repr;
    let largest = s.fabric.right.config().max_message_bytes;
    repr.extension.reth.as_mut().unwrap().dma_length = largest + 1;
    let mut forged = vec![0u8; remora_wire::frame::MAX_FRAME_LEN];
    let length = remora_wire::frame::emit_frame(&repr, parsed.payload, &mut forged).unwrap();
    s.fabric.right.handle_frame(s.fabric.now, &forged[..length]);
    assert_eq!(s.fabric.right.counters().error_naks_sent, 1);
    assert!(s.fabric.run(1000).quiesced);
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![(1, CompletionStatus::RemoteInvalidRequestError)]
    );
}

/// A requester allowed more READs outstanding than its responder keeps
/// answers for: the fifth READ took the first's replay slot and threw its
/// queued answer away, and the first READ failed much later with
/// `RetryExceeded` on a lossless link. The responder now refuses the
/// excess READ with an Invalid Request NAK, as IB asks, and the four it
/// could hold complete.
#[test]
fn a_read_past_the_responders_limit_is_refused_not_a_lost_answer() {
    let mut s = setup_with(AccessFlags::ALL, |builder| {
        builder.max_read_atomic = 16;
        builder.max_destination_read_atomic = 4;
    });
    for id in 0..5 {
        let read = read_request(&s, id, id * 8, id * 8, 8);
        s.fabric.left.post_send(s.left_qp, read).unwrap();
    }
    // The five requests reach the responder before it sends anything.
    let frames = left_frames(&mut s);
    assert_eq!(frames.len(), 5);
    for frame in &frames {
        s.fabric.right.handle_frame(s.fabric.now, frame);
    }
    s.fabric.run(10_000);
    let statuses: Vec<_> = drain(&mut s.fabric.left, s.left_cq)
        .iter()
        .map(|completion| (completion.work_request_id, completion.status))
        .collect();
    let mut wanted: Vec<_> = (0..4).map(|id| (id, CompletionStatus::Success)).collect();
    wanted.push((4, CompletionStatus::RemoteInvalidRequestError));
    assert_eq!(statuses, wanted);
}

/// With no RNR retries, the request the receiver was not ready for is
/// the one that fails with `ReceiverNotReadyRetryExceeded`; the oldest
/// unanswered request (a READ whose answer was lost) took that status and
/// the refused SEND was only flushed.
#[test]
fn rnr_exhaustion_fails_the_refused_request() {
    let mut s = setup_with(AccessFlags::ALL, |builder| builder.rnr_retry = 0);
    let read = read_request(&s, 1, 0, 0, 8);
    s.fabric.left.post_send(s.left_qp, read).unwrap();
    let send = send_request(&s, 2, 64, 8);
    s.fabric.left.post_send(s.left_qp, send).unwrap();
    // The READ's answer is lost; the SEND finds no receive posted.
    let mut first_answer = true;
    s.fabric.run_filtered(10_000, &mut |direction, _| {
        if direction == Direction::RightToLeft && first_answer {
            first_answer = false;
            return Verdict::Drop;
        }
        Verdict::Deliver
    });
    let statuses: Vec<_> = drain(&mut s.fabric.left, s.left_cq)
        .iter()
        .map(|completion| (completion.work_request_id, completion.status))
        .collect();
    assert_eq!(
        statuses,
        [
            (1, CompletionStatus::WorkRequestFlushError),
            (2, CompletionStatus::ReceiverNotReadyRetryExceeded)
        ]
    );
}

/// A READ's request reached the responder twice (a duplicating link),
/// so a replay of its answer was queued behind the original. The original
/// completed the READ, and the requester, allowed one READ at a time, sent
/// the next; the queued replay still held the one replay slot, and the
/// responder took the new READ for one past its limit: an Invalid Request
/// NAK, and both queue pairs failed. A new READ drops the stale replays of
/// the slot it takes (they answer a request its requester has retired).
#[test]
fn a_duplicate_replay_still_queued_does_not_refuse_the_next_read() {
    let mut s = setup_with(AccessFlags::ALL, |builder| {
        builder.path_mtu = Mtu::MTU_256;
        builder.max_read_atomic = 1;
        builder.max_destination_read_atomic = 1;
    });
    write_region(&mut s.fabric.right, &s.right_mr, 0, &pattern(2048, 5));
    write_region(&mut s.fabric.right, &s.right_mr, 4096, &pattern(64, 9));
    let first = read_request(&s, 1, 0, 0, 2048);
    let second = read_request(&s, 2, 4096, 4096, 64);
    s.fabric.left.post_send(s.left_qp, first).unwrap();
    s.fabric.left.post_send(s.left_qp, second).unwrap();
    let requests = left_frames(&mut s);
    assert_eq!(requests.len(), 1, "one READ at a time");
    let now = s.fabric.now;
    s.fabric.right.handle_frame(now, &requests[0]);
    s.fabric.right.handle_frame(now, &requests[0]);
    // The original answer's eight packets complete the first READ.
    let mut buffer = vec![0u8; remora_wire::frame::MAX_FRAME_LEN];
    for _ in 0..8 {
        let length = s.fabric.right.poll_transmit(now, &mut buffer).unwrap();
        s.fabric.left.handle_frame(now, &buffer[..length]);
    }
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![(1, CompletionStatus::Success)]
    );
    // The second READ reaches the responder with the replay still queued.
    assert!(deliver_all(&mut s.fabric.left, &mut s.fabric.right, now) >= 1);
    assert!(s.fabric.run(1000).quiesced);
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![(2, CompletionStatus::Success)]
    );
    assert_eq!(
        read_region(&s.fabric.left, &s.left_mr, 4096, 64),
        pattern(64, 9)
    );
    assert_eq!(
        read_region(&s.fabric.left, &s.left_mr, 0, 2048),
        pattern(2048, 5)
    );
    assert_eq!(s.fabric.right.counters().error_naks_sent, 0);
    assert_eq!(s.fabric.right.counters().stale_replays_dropped, 1);
}

/// A small READ's one answer packet was lost while a long READ behind it
/// was answered. The first later answer rewinds to reissue the lost one
/// (the implicit NAK), and a guard was meant to keep the answers behind
/// it from rewinding again; but progress cleared the guard in the same
/// call that set it, so every later answer packet rewound and reissued
/// both READs again. The lost READ is reissued once now.
#[test]
fn a_lost_read_answer_is_reissued_once_not_per_later_packet() {
    let mut s = setup_with(AccessFlags::ALL, |builder| builder.path_mtu = Mtu::MTU_256);
    write_region(&mut s.fabric.right, &s.right_mr, 0, &pattern(64, 3));
    write_region(&mut s.fabric.right, &s.right_mr, 4096, &pattern(16384, 4));
    let small = read_request(&s, 1, 0, 0, 64);
    let long = read_request(&s, 2, 4096, 4096, 16384);
    s.fabric.left.post_send(s.left_qp, small).unwrap();
    s.fabric.left.post_send(s.left_qp, long).unwrap();
    let mut dropped = false;
    let mut read_requests = 0;
    let mut filter = |direction, bytes: &mut [u8]| {
        let opcode = opcode_of(bytes);
        if direction == Direction::LeftToRight && opcode == Opcode::RdmaReadRequest {
            read_requests += 1;
        }
        if direction == Direction::RightToLeft && opcode == Opcode::RdmaReadResponseOnly && !dropped
        {
            dropped = true;
            return Verdict::Drop;
        }
        Verdict::Deliver
    };
    assert!(s.fabric.run_filtered(10_000, &mut filter).quiesced);
    assert_all_succeeded(&mut s, 2);
    assert_eq!(
        read_region(&s.fabric.left, &s.left_mr, 0, 64),
        pattern(64, 3)
    );
    assert_eq!(
        read_region(&s.fabric.left, &s.left_mr, 4096, 16384),
        pattern(16384, 4)
    );
    assert!(read_requests <= 4, "{read_requests} READ requests sent");
    assert!(s.fabric.right.counters().replayed_reads <= 2);
}

/// A queue pair with one RNR retry sends one SEND to a responder with no
/// receive posted: the setup and the RNR NAK, not yet handed back.
fn one_send_not_ready_with_one_rnr_retry() -> (Setup, Vec<u8>) {
    let mut s = setup_with(AccessFlags::ALL, |builder| {
        builder.rnr_retry = 1;
        builder.min_rnr_timer = Duration::from_micros(40);
    });
    let send = send_request(&s, 1, 0, 8);
    s.fabric.left.post_send(s.left_qp, send).unwrap();
    let now = s.fabric.now;
    assert_eq!(deliver_all(&mut s.fabric.left, &mut s.fabric.right, now), 1);
    let mut buffer = vec![0u8; remora_wire::frame::MAX_FRAME_LEN];
    let length = s.fabric.right.poll_transmit(now, &mut buffer).unwrap();
    (s, buffer[..length].to_vec())
}

/// A link that duplicates frames delivered an RNR NAK twice: the copy
/// spent a second RNR retry on the same refusal, so `rnr_retry = 1` acted
/// as 0 and the SEND failed though its one retry would have found the
/// receive. A NAK for a PSN not sent again since the last one is a copy.
#[test]
fn a_duplicated_rnr_nak_spends_one_retry() {
    let (mut s, nak) = one_send_not_ready_with_one_rnr_retry();
    let now = s.fabric.now;
    s.fabric.left.handle_frame(now, &nak);
    s.fabric.left.handle_frame(now, &nak);
    post_the_receive_and_expect_the_send(&mut s);
    assert_eq!(s.fabric.left.counters().stale_naks_ignored, 1);
}

/// An RNR NAK's copy that came after the resend it asked for (a
/// duplicating link delays one copy behind the other) spent a second RNR
/// retry; with the budget spent it failed the SEND at once, though the
/// resend delivered it. An RNR NAK for a resent PSN may be such a copy:
/// the resend's answer, or the retransmission timer, decides.
#[test]
fn an_rnr_nak_copy_after_the_resend_spends_no_retry() {
    let (mut s, nak) = one_send_not_ready_with_one_rnr_retry();
    let now = s.fabric.now;
    // The first copy spends the only RNR retry.
    s.fabric.left.handle_frame(now, &nak);
    post_the_awaited_receive(&mut s);
    s.fabric.now = s.fabric.left.poll_timeout().expect("the RNR wait");
    let resent = left_frames(&mut s);
    assert_eq!(resent.len(), 1, "the SEND went again after the RNR wait");
    // The late copy comes before the resend's answer.
    let now = s.fabric.now;
    s.fabric.left.handle_frame(now, &nak);
    for frame in &resent {
        s.fabric.right.handle_frame(now, frame);
    }
    assert!(s.fabric.run(100).quiesced);
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![(1, CompletionStatus::Success)]
    );
}

/// A sequence NAK's copy that came after the resend it asked for (a
/// duplicating link delays one copy behind the other) was taken for news:
/// it spent a second retry and rewound go-back-N again. The responder NAKs
/// a gap once until the packet it waits for comes, so a second sequence
/// NAK for a PSN not yet acknowledged is a copy.
#[test]
fn a_sequence_nak_copy_after_the_resend_spends_no_retry() {
    let mut s = setup();
    for id in 0..2 {
        let write = write_request(&s, id, id * 8, s.right_mr.remote(id * 8), 8);
        s.fabric.left.post_send(s.left_qp, write).unwrap();
    }
    let requests = left_frames(&mut s);
    assert_eq!(requests.len(), 2);
    let now = s.fabric.now;
    // The first WRITE is lost: the second opens a gap, NAKed once.
    s.fabric.right.handle_frame(now, &requests[1]);
    let mut buffer = vec![0u8; remora_wire::frame::MAX_FRAME_LEN];
    let length = s.fabric.right.poll_transmit(now, &mut buffer).unwrap();
    let nak = buffer[..length].to_vec();
    s.fabric.left.handle_frame(now, &nak);
    let resent = left_frames(&mut s);
    assert!(!resent.is_empty(), "the NAK rewound to the lost WRITE");
    s.fabric.left.handle_frame(now, &nak);
    let counters = s.fabric.left.counters();
    assert_eq!(counters.sequence_naks_received, 1);
    assert_eq!(counters.stale_naks_ignored, 1);
    assert!(left_frames(&mut s).is_empty(), "the copy rewound again");
    for frame in &resent {
        s.fabric.right.handle_frame(now, frame);
    }
    assert!(s.fabric.run(1000).quiesced);
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![
            (0, CompletionStatus::Success),
            (1, CompletionStatus::Success)
        ]
    );
}

/// The ACK of two WRITEs overtook the last answer packet of the READ
/// before them (a reordering link). That answer retired the READ, but
/// only up to its own PSN: the WRITEs the ACK had acknowledged were sent
/// again and waited for the resend's ACK (or, were it lost, the
/// retransmission timer). An ACK acknowledges every request up to its
/// PSN, and the READ's last answer releases them.
#[test]
fn writes_acknowledged_ahead_of_a_read_retire_with_its_last_answer() {
    let mut s = setup_with(AccessFlags::ALL, |builder| builder.path_mtu = Mtu::MTU_256);
    write_region(&mut s.fabric.right, &s.right_mr, 0, &pattern(1024, 7));
    let read = read_request(&s, 1, 0, 0, 1024);
    s.fabric.left.post_send(s.left_qp, read).unwrap();
    for id in 2..4 {
        let offset = 2048 + id * 8;
        let write = write_request(&s, id, offset, s.right_mr.remote(offset), 8);
        s.fabric.left.post_send(s.left_qp, write).unwrap();
    }
    let now = s.fabric.now;
    assert_eq!(deliver_all(&mut s.fabric.left, &mut s.fabric.right, now), 3);
    let answers = right_frames(&mut s);
    let opcodes: Vec<_> = answers.iter().map(|frame| opcode_of(frame)).collect();
    assert_eq!(
        opcodes,
        [
            Opcode::RdmaReadResponseFirst,
            Opcode::RdmaReadResponseMiddle,
            Opcode::RdmaReadResponseMiddle,
            Opcode::RdmaReadResponseLast,
            Opcode::Acknowledge,
        ],
        "four READ answer packets, then one ACK for both WRITEs"
    );
    // The ACK overtakes the READ's last answer packet.
    for index in [0, 1, 2, 4, 3] {
        s.fabric.left.handle_frame(now, &answers[index]);
    }
    assert_all_succeeded(&mut s, 3);
    assert!(
        left_frames(&mut s).is_empty(),
        "the acknowledged WRITEs were sent again"
    );
    assert_eq!(
        read_region(&s.fabric.left, &s.left_mr, 0, 1024),
        pattern(1024, 7)
    );
}

/// Each of a READ's four answer packets was overtaken by an ACK of the
/// WRITE behind it (a reordering link). The first ACK rightly went back
/// and asked again for the READ and the WRITE; but each late original
/// answer advanced the READ's resume point, which re-armed the implicit
/// NAK, and the ACK of the resent WRITE then went back again: a go-back
/// per answer packet, three READ re-requests where the first asked for
/// everything. Until evidence from a request sent after it, one go-back
/// stands for the gap.
#[test]
fn answers_reordered_behind_acks_draw_one_go_back_not_one_per_packet() {
    let mut s = setup_with(AccessFlags::ALL, |builder| builder.path_mtu = Mtu::MTU_256);
    write_region(&mut s.fabric.right, &s.right_mr, 0, &pattern(1024, 8));
    let read = read_request(&s, 1, 0, 0, 1024);
    s.fabric.left.post_send(s.left_qp, read).unwrap();
    let write = write_request(&s, 2, 2048, s.right_mr.remote(2048), 8);
    s.fabric.left.post_send(s.left_qp, write).unwrap();
    let now = s.fabric.now;
    assert_eq!(deliver_all(&mut s.fabric.left, &mut s.fabric.right, now), 2);
    let answers = right_frames(&mut s);
    assert_eq!(answers.len(), 5, "four READ answer packets, then the ACK");
    let mut ack = answers[4].clone();
    let mut read_requests = 0;
    let mut replays_in_flight = Vec::new();
    for original in &answers[..4] {
        // The newest ACK overtakes the original answer still in flight.
        s.fabric.left.handle_frame(now, &ack);
        s.fabric.left.handle_frame(now, original);
        let resent = left_frames(&mut s);
        read_requests += resent
            .iter()
            .filter(|frame| opcode_of(frame) == Opcode::RdmaReadRequest)
            .count();
        for frame in &resent {
            s.fabric.right.handle_frame(now, frame);
        }
        // The replayed answers stay in flight; the ACK of the resent
        // WRITE overtakes the next original answer.
        for frame in right_frames(&mut s) {
            if opcode_of(&frame) == Opcode::Acknowledge {
                ack = frame;
            } else {
                replays_in_flight.push(frame);
            }
        }
    }
    assert_eq!(read_requests, 1, "one go-back re-requests the READ");
    for frame in &replays_in_flight {
        s.fabric.left.handle_frame(now, frame);
    }
    assert!(s.fabric.run(1000).quiesced);
    assert_all_succeeded(&mut s, 2);
    assert_eq!(
        read_region(&s.fabric.left, &s.left_mr, 0, 1024),
        pattern(1024, 8)
    );
}

/// A READ answer that cannot be placed (its local region went since the
/// post) failed the READ before retiring what the answer acknowledged:
/// the WRITE before it, whose own ACK was lost, was flushed though the
/// responder executed it, and a program that retries what was flushed
/// wrote twice (found by reading).
#[test]
fn a_failed_read_answer_still_acknowledges_the_requests_before_it() {
    let mut s = setup();
    let landing = s
        .fabric
        .left
        .register_memory(s.left_pd, 4096, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let write = write_request(&s, 1, 0, s.right_mr.remote(0), 64);
    s.fabric.left.post_send(s.left_qp, write).unwrap();
    let read = request(
        2,
        SendOperation::Read {
            remote: s.right_mr.remote(1024),
        },
        landing.slice(0, 64),
    );
    s.fabric.left.post_send(s.left_qp, read).unwrap();
    s.fabric.left.deregister_memory(landing.lkey).unwrap();
    // The WRITE's ACK is lost; the READ's answer acknowledges it.
    s.fabric.run_filtered(1_000, &mut |direction, bytes| {
        if direction == Direction::RightToLeft && opcode_of(bytes) == Opcode::Acknowledge {
            return Verdict::Drop;
        }
        Verdict::Deliver
    });
    assert_eq!(
        statuses(&mut s.fabric.left, s.left_cq),
        vec![
            (1, CompletionStatus::Success),
            (2, CompletionStatus::LocalProtectionError)
        ]
    );
}

/// A replay slot kept the capacity of the largest READ it ever held: a
/// peer's large READs held that memory for the queue pair's life (found
/// by reading). A much smaller READ in the slot gives it back.
#[test]
fn a_replay_slot_gives_back_a_large_reads_memory() {
    use remora_rnic::back_to_back::BackToBack;
    const LARGE: u32 = 4 << 20;
    let mut fabric = BackToBack::new(7);
    let mut sides = Vec::new();
    for device in [&mut fabric.left, &mut fabric.right] {
        let pd = device.alloc_protection_domain().unwrap();
        let mr = device
            .register_memory(pd, u64::from(LARGE), AccessFlags::ALL)
            .unwrap();
        let cq = device.create_completion_queue(64).unwrap();
        let mut builder = QueuePairBuilder::new(pd, cq, cq);
        // One slot: every READ reuses it.
        builder.max_read_atomic = 1;
        builder.max_destination_read_atomic = 1;
        sides.push((mr, cq, builder));
    }
    let (left_qp, right_qp) = fabric.connect(&sides[0].2, &sides[1].2).unwrap();
    let (left_mr, left_cq, right_mr) = (sides[0].0, sides[0].1, sides[1].0);
    let mut held_after = Vec::new();
    for (id, length) in [(1, LARGE), (2, 64)] {
        let read = request(
            id,
            SendOperation::Read {
                remote: right_mr.remote(0),
            },
            left_mr.slice(0, length),
        );
        fabric.left.post_send(left_qp, read).unwrap();
        fabric.run(100_000);
        assert_eq!(
            statuses(&mut fabric.left, left_cq),
            vec![(id, CompletionStatus::Success)]
        );
        held_after.push(fabric.right.replay_bytes_held(right_qp.0).unwrap());
    }
    assert!(held_after[0] >= LARGE as usize, "{held_after:?}");
    assert!(held_after[1] < 1 << 20, "{held_after:?}");
}
