//! The callee's b1 checkpoint: a call deferred to the service is
//! committed to the Gatekeeper as it arrives, received and not answered;
//! a replacement restored from that commit runs the call and answers its
//! caller itself, with no resend and no replay.

use remora_base::Timestamp;
use remora_bifrost::rpc::checkpoint::Checkpoint;
use remora_bifrost::rpc::workers::WorkerPool;
use remora_bifrost::rpc::{Callee, Caller, Outcome, Service};
use remora_wire::bifrost::{parse_commit, GlobalAddress, CONTROL_PORT};
use remora_wire::datagram::DatagramEnd;
use remora_wire::{Ipv4Address, MacAddress};
use std::sync::mpsc::{channel, Receiver};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A count that each call raises; until `release` is sent (or 5 s pass)
/// a call blocks before counting, as a long computation would.
struct Tally {
    count: u64,
    release: Option<Mutex<Receiver<()>>>,
}

impl Service for Tally {
    fn call(&mut self, _: &[u8], _: GlobalAddress, _: &[u8]) -> Outcome {
        if let Some(release) = &self.release {
            let _ = release
                .lock()
                .expect("release lock")
                .recv_timeout(Duration::from_secs(5));
        }
        self.count += 1;
        Ok(self.count.to_be_bytes().to_vec().into())
    }

    fn save_state(&self) -> Option<Vec<u8>> {
        Some(self.count.to_be_bytes().to_vec())
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<(), String> {
        let bytes: [u8; 8] = state.try_into().map_err(|_| "eight bytes".to_string())?;
        self.count = u64::from_be_bytes(bytes);
        Ok(())
    }
}

fn end(last: u8, port: u16) -> DatagramEnd {
    DatagramEnd {
        mac: MacAddress([2, 0, 0, 0, 0, last]),
        address: Ipv4Address::new(10, 0, 0, last),
        port,
    }
}

fn callee(count: u64, release: Option<Receiver<()>>) -> Callee {
    let tally = Tally {
        count,
        release: release.map(Mutex::new),
    };
    let pool = WorkerPool::new(vec![Box::new(tally)]).expect("a worker starts");
    Callee::with_checkpoints(Box::new(pool)).committing_to(end(200, 4792))
}

/// `caller` calls "tally" on the callee at 10.0.0.2: the call's RPC id
/// and datagram.
fn tally_call(caller: &mut Caller) -> (u64, Vec<u8>) {
    let rpc_id = caller
        .call(
            Timestamp::ZERO,
            end(2, 4792),
            "tally",
            GlobalAddress::NULL,
            b"",
        )
        .unwrap();
    let (_, call) = caller.poll_transmit().expect("the call");
    (rpc_id, call)
}

#[test]
fn a_call_received_and_not_answered_is_committed_and_a_replacement_answers_it() {
    let caller_end = end(1, 40000);
    let mut caller = Caller::new(Duration::from_secs(60), 3);
    // The failed node: it had counted to 5, then took a call it never
    // finished.
    let (release, stalled) = channel::<()>();
    let mut failed = callee(5, Some(stalled));
    let (rpc_id, call) = tally_call(&mut caller);
    failed.handle(caller_end, &call);
    let (to, commit) = failed
        .poll_transmit()
        .expect("a commit as the call arrived");
    assert_eq!(to.address, Ipv4Address::new(10, 0, 0, 200));
    assert_eq!(to.port, CONTROL_PORT);
    let checkpoint = parse_commit(&commit).expect("a commit").to_vec();
    let decoded = Checkpoint::decode(&checkpoint).unwrap();
    assert_eq!(decoded.executed, 0);
    assert_eq!(decoded.state, 5u64.to_be_bytes());
    assert_eq!(
        decoded.received[&caller_end]
            .keys()
            .copied()
            .collect::<Vec<_>>(),
        [rpc_id]
    );
    assert_eq!(failed.counters().commits, 1);

    // The replacement starts from the commit: it runs the call and
    // answers the caller, which never resent it.
    let mut replacement = callee(0, None);
    replacement.restore(&checkpoint).unwrap();
    let started = Instant::now();
    let mut answer = None;
    while answer.is_none() && started.elapsed() < Duration::from_secs(5) {
        replacement.poll_service();
        while let Some((to, reply)) = replacement.poll_transmit() {
            if to == caller_end {
                caller.handle(&reply);
            }
        }
        answer = caller.take_completion();
        std::thread::sleep(Duration::from_millis(1));
    }
    let (answered, outcome) = answer.expect("the replacement answered");
    assert_eq!(answered, rpc_id);
    assert_eq!(outcome.unwrap(), 6u64.to_be_bytes(), "counted once, from 5");
    assert_eq!(caller.counters().retransmissions, 0);
    // A resend that comes after is a duplicate, answered from memory.
    replacement.handle(caller_end, &call);
    assert_eq!(replacement.counters().duplicates, 1);
    assert_eq!(replacement.counters().executed, 1);
    drop(release);
}

#[test]
fn a_callee_that_commits_nowhere_sends_no_commit() {
    let tally = Tally {
        count: 0,
        release: None,
    };
    let pool = WorkerPool::new(vec![Box::new(tally)]).expect("a worker starts");
    let mut callee = Callee::with_checkpoints(Box::new(pool));
    let mut caller = Caller::new(Duration::from_secs(60), 3);
    let (_, call) = tally_call(&mut caller);
    callee.handle(end(1, 40000), &call);
    assert!(callee.poll_transmit().is_none());
    assert_eq!(callee.counters().commits, 0);
}

/// Each deferred call's datagram stood in the b1 commit's list of calls
/// received, which the shrinking never touched: some fifty of them filled
/// the datagram, and commits, then replies, left with no checkpoint. The
/// two-way calls received give way first now (the Gatekeeper replays
/// them to a replacement, and their callers resend).
#[test]
fn many_deferred_calls_do_not_crowd_out_the_checkpoint() {
    use remora_bifrost::rpc::checkpoint::CHECKPOINT_FLAG;
    use remora_wire::bifrost::{BifrostHeader, CallType};
    let (release, stalled) = channel::<()>();
    let mut node = callee(0, Some(stalled));
    const CALLERS: u8 = 8;
    const CALLS_EACH: usize = 8;
    let ends: Vec<DatagramEnd> = (0..CALLERS).map(|index| end(10 + index, 40000)).collect();
    let mut callers: Vec<Caller> = ends
        .iter()
        .map(|_| Caller::new(Duration::from_secs(60), 3))
        .collect();
    let mut first_call = None;
    for (caller, from) in callers.iter_mut().zip(&ends) {
        for _ in 0..CALLS_EACH {
            let (_, call) = tally_call(caller);
            node.handle(*from, &call);
            first_call.get_or_insert(call);
        }
    }
    let mut last_commit = None;
    while let Some((to, datagram)) = node.poll_transmit() {
        if to.port == CONTROL_PORT {
            last_commit = Some(parse_commit(&datagram).expect("a commit").to_vec());
        }
    }
    assert_eq!(
        node.counters().checkpoints_too_large,
        0,
        "a commit did not fit"
    );
    // A replacement from the last commit runs a call the commit left out
    // when it comes again (the Gatekeeper's replay, or the caller's
    // resend): it never ran, and is not refused as of unknown outcome.
    let mut replacement = callee(0, None);
    replacement.restore(&last_commit.expect("commits")).unwrap();
    replacement.handle(ends[0], &first_call.expect("a call"));
    let started = Instant::now();
    let mut answer = None;
    while answer.is_none() && started.elapsed() < Duration::from_secs(5) {
        replacement.poll_service();
        answer = replacement.poll_transmit().filter(|(to, _)| *to == ends[0]);
        std::thread::sleep(Duration::from_millis(1));
    }
    let (_, reply) = answer.expect("the replacement answered the call again");
    let header = BifrostHeader::new_checked(&reply[..]).unwrap();
    assert_eq!(
        header.call_type(),
        CallType::Reply,
        "refused, though it never ran"
    );
    let calls = usize::from(CALLERS) * CALLS_EACH;
    for _ in 0..calls {
        release.send(()).unwrap();
    }
    let started = Instant::now();
    let mut replies = 0;
    while replies < calls && started.elapsed() < Duration::from_secs(10) {
        node.poll_service();
        while let Some((to, datagram)) = node.poll_transmit() {
            if to.port == CONTROL_PORT {
                continue;
            }
            let header = BifrostHeader::new_checked(&datagram[..]).unwrap();
            assert_ne!(
                header.flags() & CHECKPOINT_FLAG,
                0,
                "a reply left without its checkpoint"
            );
            replies += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(replies, calls);
    assert_eq!(node.counters().checkpoints_too_large, 0);
}
