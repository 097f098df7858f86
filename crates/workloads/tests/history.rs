//! The linearizability checker against stateright's general search, on
//! every small register history proptest makes: both must give the same
//! verdict, linearizable or not.

use proptest::prelude::*;
use remora_base::Timestamp;
use remora_workloads::history::{check, Event, EventKind, LOADED_ID};
use stateright::semantics::register::{Register, RegisterOp, RegisterRet};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester};

/// A script: at each step some client moves (invokes its next request or
/// returns the one it has open); a read returns one of the values written
/// so far, the initial one, or (rarely) one written later.
fn history(steps: &[(usize, bool, usize)]) -> Vec<Event> {
    let clients = 3;
    let mut open: Vec<Option<EventKind>> = vec![None; clients];
    let mut written: Vec<u64> = Vec::new();
    let mut next_id = 1;
    let mut events = Vec::new();
    for (time, &(client, write, pick)) in steps.iter().enumerate() {
        let client = client % clients;
        let kind = match open[client] {
            None if write => {
                let id = next_id;
                next_id += 1;
                written.push(id);
                EventKind::WriteInvoked(id)
            }
            None => EventKind::ReadInvoked,
            Some(EventKind::WriteInvoked(_)) => EventKind::WriteReturned,
            Some(_) => {
                let choices = written.len() + 2;
                let id = match pick % choices {
                    0 => LOADED_ID,
                    index if index <= written.len() => written[index - 1],
                    _ => next_id, // Not written (yet): never linearizable.
                };
                EventKind::ReadReturned(id)
            }
        };
        open[client] = match kind {
            EventKind::WriteInvoked(_) | EventKind::ReadInvoked => Some(kind),
            _ => None,
        };
        events.push(Event {
            key: 7,
            client,
            kind,
            at: Timestamp::from_nanos(time as u64),
        });
    }
    events
}

fn stateright_verdict(events: &[Event]) -> bool {
    let mut tester = LinearizabilityTester::new(Register(LOADED_ID));
    for event in events {
        let result = match event.kind {
            EventKind::WriteInvoked(id) => tester.on_invoke(event.client, RegisterOp::Write(id)),
            EventKind::ReadInvoked => tester.on_invoke(event.client, RegisterOp::Read),
            EventKind::WriteReturned => tester.on_return(event.client, RegisterRet::WriteOk),
            EventKind::ReadReturned(id) => tester.on_return(event.client, RegisterRet::ReadOk(id)),
        };
        result.expect("the script makes well-formed histories");
    }
    tester.is_consistent()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]
    #[test]
    fn the_checker_agrees_with_stateright(
        steps in proptest::collection::vec((0usize..3, any::<bool>(), 0usize..16), 0..14)
    ) {
        let events = history(&steps);
        let verdict = check(&events).unwrap();
        let ours = verdict.violations.is_empty();
        prop_assert_eq!(ours, stateright_verdict(&events), "{:?}", events);
    }
}

#[test]
fn both_kinds_of_history_occur_in_the_generated_ones() {
    // A deterministic sweep: the property above is only as good as its
    // inputs, so make sure they include both verdicts.
    let (mut linearizable, mut not) = (0, 0);
    for seed in 0..500usize {
        let steps: Vec<(usize, bool, usize)> = (0..10)
            .map(|step| {
                let mix = seed.wrapping_mul(2_654_435_761).wrapping_add(step * 40_503);
                (mix % 3, (mix / 3) % 2 == 0, (mix / 7) % 16)
            })
            .collect();
        match stateright_verdict(&history(&steps)) {
            true => linearizable += 1,
            false => not += 1,
        }
    }
    assert!(linearizable > 50 && not > 50, "{linearizable} / {not}");
}

#[test]
fn a_request_that_never_returned_has_no_ret_and_returns_carry_their_outputs() {
    let at = Timestamp::from_nanos;
    let event = |client, kind, time| Event {
        key: 3,
        client,
        kind,
        at: at(time),
    };
    let events = [
        event(0, EventKind::WriteInvoked(9), 10),
        event(1, EventKind::ReadInvoked, 12),
        event(1, EventKind::ReadReturned(9), 30),
    ];
    let mut out = Vec::new();
    let lines = remora_workloads::history::write_json_lines("h", &events, &mut out).unwrap();
    assert_eq!(lines, 2);
    let text = String::from_utf8(out).unwrap();
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(records[0]["op"], "write");
    assert_eq!(records[0]["value"], 9);
    assert!(records[0].get("ret").is_none(), "{}", records[0]);
    assert_eq!(records[1]["output"], 9);
    assert_eq!(records[1]["call"], 12);
    assert_eq!(records[1]["ret"], 30);
    // A read of a write still in flight is linearizable.
    assert!(check(&events).unwrap().violations.is_empty());
}

/// A store that returned an empty value: it read as the loaded value, and
/// the history passed when no write had finished before the read.
#[test]
fn an_empty_value_is_a_value_nobody_wrote() {
    use remora_workloads::history::value_id;
    let at = Timestamp::from_nanos;
    let read = |kind, time| Event {
        key: 1,
        client: 0,
        kind,
        at: at(time),
    };
    let events = [
        read(EventKind::ReadInvoked, 0),
        read(EventKind::ReadReturned(value_id(&[])), 1),
    ];
    assert_eq!(check(&events).unwrap().violations, [1]);
}
