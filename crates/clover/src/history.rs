//! Histories of Clover requests and their linearizability check.
//!
//! Every value a checked run writes starts with a unique 8-byte id, so a
//! read's result names the write it saw. Linearizability is local (a
//! history is linearizable iff each object's sub-history is), so each
//! key's events go to their own checker: stateright's
//! `LinearizabilityTester` over a register, a checker nobody here wrote.

use stateright::semantics::register::{Register, RegisterOp, RegisterRet};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester};
use std::collections::BTreeMap;

/// The id every loaded (first) version carries.
pub const LOADED_ID: u64 = 0;

/// The id at the front of a value (0 for a value too short to carry one).
pub fn value_id(value: &[u8]) -> u64 {
    value
        .get(..8)
        .map(|bytes| u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
        .unwrap_or(LOADED_ID)
}

/// A value of `length` bytes that carries `id`.
pub fn value_with_id(id: u64, length: usize) -> Vec<u8> {
    let mut value = vec![0xa5; length.max(8)];
    value[..8].copy_from_slice(&id.to_le_bytes());
    value
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    WriteInvoked(u64),
    WriteReturned,
    ReadInvoked,
    ReadReturned(u64),
}

/// One invocation or return, in real-time order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub key: u64,
    pub client: usize,
    pub kind: EventKind,
}

/// What the check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub keys: usize,
    pub operations: usize,
    /// Keys whose history is not linearizable.
    pub violations: Vec<u64>,
}

/// Checks every key's history. Requests still running at the end count as
/// in flight, which the checker handles.
pub fn check(events: &[Event]) -> Result<Verdict, String> {
    let mut testers: BTreeMap<u64, LinearizabilityTester<usize, Register<u64>>> = BTreeMap::new();
    let mut operations = 0;
    for event in events {
        let tester = testers
            .entry(event.key)
            .or_insert_with(|| LinearizabilityTester::new(Register(LOADED_ID)));
        match event.kind {
            EventKind::WriteInvoked(id) => {
                operations += 1;
                tester.on_invoke(event.client, RegisterOp::Write(id))
            }
            EventKind::ReadInvoked => {
                operations += 1;
                tester.on_invoke(event.client, RegisterOp::Read)
            }
            EventKind::WriteReturned => tester.on_return(event.client, RegisterRet::WriteOk),
            EventKind::ReadReturned(id) => tester.on_return(event.client, RegisterRet::ReadOk(id)),
        }
        .map_err(|error| format!("key {}: a malformed history: {error}", event.key))?;
    }
    let violations = testers
        .iter()
        .filter(|(_, tester)| !tester.is_consistent())
        .map(|(key, _)| *key)
        .collect();
    Ok(Verdict {
        keys: testers.len(),
        operations,
        violations,
    })
}
