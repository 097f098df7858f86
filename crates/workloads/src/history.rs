//! Histories of key-value requests and their linearizability check:
//! Clover's and the KV store's runs record them, and `--history` files
//! hold them as JSON lines.
//!
//! Every value a checked run writes starts with a unique 8-byte id, so a
//! read's result names the write it saw. Linearizability is local (a
//! history is linearizable iff each object's sub-history is), so each
//! key's events are checked on their own.
//!
//! With every write's value unique and every read naming the write it
//! saw, a register's history is checkable in polynomial time (Gibbons and
//! Korach, "Testing shared memories", 1997): a write and the reads of its
//! value form a cluster that a linearization must keep together (after
//! the write, reads see it until the next write), so the history is
//! linearizable iff no read returned before its write was invoked, no
//! read saw a value nobody wrote, and the clusters can be ordered so that
//! every operation that returned before another was invoked comes first:
//! the graph with an edge A → B whenever some operation of A returned
//! before some operation of B was invoked has no cycle, and nothing must
//! precede the cluster of the initial value. A general search (stateright's
//! `LinearizabilityTester`, exponential in the operations in flight) ran
//! for minutes on histories where one request spent a millisecond in
//! retransmissions; the tests check this checker against that one on
//! every small history proptest makes.

use remora_base::Timestamp;
use std::collections::BTreeMap;
use std::io::Write;

/// The id every loaded (first) version carries.
pub const LOADED_ID: u64 = 0;

/// The id a value too short to carry one reads as: one nobody writes, so
/// a store that returns a truncated or empty value fails the check. (It
/// read as the loaded value's id, and such a read passed whenever no
/// write to the key had finished before it.)
pub const UNREADABLE_ID: u64 = u64::MAX;

/// The id at the front of a value ([`UNREADABLE_ID`] for a value too short
/// to carry one).
pub fn value_id(value: &[u8]) -> u64 {
    value
        .get(..8)
        .map(|bytes| u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
        .unwrap_or(UNREADABLE_ID)
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
    /// When it happened, on the run's clock (simulated or real).
    pub at: Timestamp,
}

/// What the check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub keys: usize,
    pub operations: usize,
    /// Keys whose history is not linearizable.
    pub violations: Vec<u64>,
}

/// A history the checker cannot read: an event out of place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key {key}: a malformed history: {message}")]
pub struct MalformedHistory {
    pub key: u64,
    pub message: String,
}

/// Checks every key's history. Requests still running at the end count as
/// in flight: a pending write may or may not have taken effect.
pub fn check(events: &[Event]) -> Result<Verdict, MalformedHistory> {
    let mut by_key: BTreeMap<u64, Vec<(usize, Event)>> = BTreeMap::new();
    for (position, event) in events.iter().enumerate() {
        by_key
            .entry(event.key)
            .or_default()
            .push((position, *event));
    }
    let mut operations = 0;
    let mut violations = Vec::new();
    for (key, events) in &by_key {
        let history = operations_of(*key, events)?;
        operations += history.len();
        if !is_linearizable(&history) {
            violations.push(*key);
        }
    }
    Ok(Verdict {
        keys: by_key.len(),
        operations,
        violations,
    })
}

/// One request of a key's history: positions in the real-time order of
/// all events (`returned` is `None` for a request still in flight).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operation {
    pub client: usize,
    pub write: bool,
    /// The written id, or the id the read returned.
    pub value: Option<u64>,
    pub invoked: usize,
    pub returned: Option<usize>,
}

/// Pairs each invocation with its client's next return.
pub fn operations_of(
    key: u64,
    events: &[(usize, Event)],
) -> Result<Vec<Operation>, MalformedHistory> {
    let malformed = |message: String| MalformedHistory { key, message };
    let mut open: BTreeMap<usize, usize> = BTreeMap::new();
    let mut operations: Vec<Operation> = Vec::with_capacity(events.len() / 2 + 1);
    for (position, event) in events {
        match event.kind {
            EventKind::WriteInvoked(_) | EventKind::ReadInvoked => {
                let (write, value) = match event.kind {
                    EventKind::WriteInvoked(id) => (true, Some(id)),
                    _ => (false, None),
                };
                if open.insert(event.client, operations.len()).is_some() {
                    return Err(malformed(format!(
                        "client {} invoked twice without a return",
                        event.client
                    )));
                }
                operations.push(Operation {
                    client: event.client,
                    write,
                    value,
                    invoked: *position,
                    returned: None,
                });
            }
            EventKind::WriteReturned | EventKind::ReadReturned(_) => {
                let index = open.remove(&event.client).ok_or_else(|| {
                    malformed(format!(
                        "client {} returned without an invocation",
                        event.client
                    ))
                })?;
                let operation = &mut operations[index];
                match (operation.write, event.kind) {
                    (true, EventKind::WriteReturned) => {}
                    (false, EventKind::ReadReturned(id)) => operation.value = Some(id),
                    _ => {
                        return Err(malformed(format!(
                            "client {}'s return does not match its invocation",
                            event.client
                        )))
                    }
                }
                operation.returned = Some(*position);
            }
        }
    }
    Ok(operations)
}

/// A write and the reads of its value, with the span facts the ordering
/// needs: the earliest return and the latest invocation of any member.
#[derive(Debug, Clone, Copy)]
struct Cluster {
    earliest_return: usize,
    latest_invocation: usize,
    write_invoked: Option<usize>,
}

/// Whether one register's history (unique write values, the initial
/// value [`LOADED_ID`]) is linearizable.
pub fn is_linearizable(operations: &[Operation]) -> bool {
    let mut clusters: BTreeMap<u64, Cluster> = BTreeMap::new();
    let empty = Cluster {
        earliest_return: usize::MAX,
        latest_invocation: 0,
        write_invoked: None,
    };
    clusters.insert(LOADED_ID, empty);
    for write in operations.iter().filter(|operation| operation.write) {
        let id = write.value.expect("a write carries its id");
        if id == LOADED_ID || clusters.insert(id, empty).is_some() {
            return false; // Ids are unique and never the initial one.
        }
    }
    for operation in operations {
        let Some(id) = operation.value else {
            continue; // A read still in flight constrains nothing.
        };
        if !operation.write && !clusters.contains_key(&id) {
            return false; // A value nobody wrote.
        }
        if operation.write && operation.returned.is_none() && !is_read(operations, id) {
            continue; // A pending write nobody saw may not have happened.
        }
        let cluster = clusters.get_mut(&id).expect("every value has a cluster");
        cluster.earliest_return = cluster
            .earliest_return
            .min(operation.returned.unwrap_or(usize::MAX));
        cluster.latest_invocation = cluster.latest_invocation.max(operation.invoked);
        if operation.write {
            cluster.write_invoked = Some(operation.invoked);
        }
    }
    let reads_before_their_write = operations.iter().any(|read| {
        !read.write
            && read.returned.is_some_and(|returned| {
                clusters[&read.value.expect("returned reads carry values")]
                    .write_invoked
                    .is_some_and(|invoked| returned < invoked)
            })
    });
    !reads_before_their_write && clusters_can_be_ordered(&clusters)
}

fn is_read(operations: &[Operation], id: u64) -> bool {
    operations
        .iter()
        .any(|operation| !operation.write && operation.value == Some(id))
}

/// Whether the clusters have an order in which every cluster with a
/// member that returned before a member of another was invoked comes
/// first, the initial value's cluster before all (Kahn's algorithm over
/// the edge A → B iff A's earliest return precedes B's latest
/// invocation).
fn clusters_can_be_ordered(clusters: &BTreeMap<u64, Cluster>) -> bool {
    let ids: Vec<u64> = clusters.keys().copied().collect();
    let edge = |from: u64, to: u64| {
        from != to && clusters[&from].earliest_return < clusters[&to].latest_invocation
    };
    // The initial value's cluster has no write: nothing may precede it.
    if ids.iter().any(|&id| edge(id, LOADED_ID)) {
        return false;
    }
    let mut incoming: BTreeMap<u64, usize> = ids
        .iter()
        .map(|&to| (to, ids.iter().filter(|&&from| edge(from, to)).count()))
        .collect();
    let mut ready: Vec<u64> = ids.iter().copied().filter(|id| incoming[id] == 0).collect();
    let mut placed = 0;
    // Each cluster is placed once: bounded by the cluster count.
    while let Some(from) = ready.pop() {
        placed += 1;
        for &to in &ids {
            if edge(from, to) {
                let count = incoming.get_mut(&to).expect("every cluster counts");
                *count -= 1;
                if *count == 0 {
                    ready.push(to);
                }
            }
        }
    }
    placed == ids.len()
}

/// One request as an outside checker reads it: `{"history", "client",
/// "op", "key", "value", "output", "call", "ret"}` with times in
/// nanoseconds of the run's clock. A write's `value` is the id it wrote;
/// a read's `output` is the id it saw; `ret` is absent for a request that
/// never returned.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OperationRecord<'a> {
    pub history: &'a str,
    pub client: usize,
    pub op: &'static str,
    pub key: u64,
    pub value: Option<u64>,
    pub output: Option<u64>,
    pub call: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ret: Option<u64>,
}

/// The records of `events`, in invocation order: each client's
/// invocation paired with its next return.
pub fn records<'a>(history: &'a str, events: &[Event]) -> Vec<OperationRecord<'a>> {
    let mut records: Vec<OperationRecord<'a>> = Vec::with_capacity(events.len() / 2 + 1);
    let mut open: BTreeMap<usize, usize> = BTreeMap::new();
    for event in events {
        let call = |op, value| OperationRecord {
            history,
            client: event.client,
            op,
            key: event.key,
            value,
            output: None,
            call: event.at.as_nanos(),
            ret: None,
        };
        match event.kind {
            EventKind::WriteInvoked(id) => {
                open.insert(event.client, records.len());
                records.push(call("write", Some(id)));
            }
            EventKind::ReadInvoked => {
                open.insert(event.client, records.len());
                records.push(call("read", None));
            }
            EventKind::WriteReturned | EventKind::ReadReturned(_) => {
                let Some(index) = open.remove(&event.client) else {
                    continue; // A return with no call: `check` reports it.
                };
                let record = &mut records[index];
                record.ret = Some(event.at.as_nanos());
                if let EventKind::ReadReturned(id) = event.kind {
                    record.output = Some(id);
                }
            }
        }
    }
    records
}

/// Writes `events` as JSON lines, one request each (see
/// [`OperationRecord`]). Returns how many lines it wrote.
pub fn write_json_lines(
    history: &str,
    events: &[Event],
    out: &mut dyn Write,
) -> std::io::Result<usize> {
    let records = records(history, events);
    for record in &records {
        serde_json::to_writer(&mut *out, record).map_err(std::io::Error::other)?;
        out.write_all(b"\n")?;
    }
    Ok(records.len())
}
