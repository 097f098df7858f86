//! The callee's checkpoint (the thesis's b2, §4.2): the service's state and
//! the replies the callee remembers, taken after each call and carried on
//! that call's reply, so that the Gatekeeper holds, for every node, the
//! state that matches the last reply it let through. A replacement started
//! from it answers a retransmission of any call whose reply left from the
//! reply it remembers, and runs any other call afresh: each call takes
//! effect once.
//!
//! A reply that carries one sets [`CHECKPOINT_FLAG`] in the Bifröst header;
//! its payload is then `body length u32 | body | checkpoint`. The
//! checkpoint is `sequence u64 | executed u64 | state length u32 | state`,
//! then the replies and then the received calls. Big-endian.
//!
//! - Replies: `callers u32`, then per caller `mac [6] | address [4] |
//!   port u16 | newest u64 | marked u16 | replies u32`, then per reply
//!   `RPC id u64 | length u32 | reply`. `newest` is the caller's newest
//!   answered RPC id; bit i of `marked` says that call `newest - i` was
//!   answered and its reply left out.
//! - Received calls: `callers u32`, then per caller `mac [6] | address [4] |
//!   port u16 | calls u32`, then per call `RPC id u64 | length u32 |
//!   datagram`.
//!
//! In memory, a reply of no bytes ([`is_answered_without_reply`]) marks a
//! call answered whose reply the checkpoint had no room for: a replacement
//! does not run it again, and tells a caller that resends it that its
//! reply is lost. (Every real reply holds at least a Bifröst header.) On
//! the wire a mark costs one bit, so a checkpoint shrunk to marks covers
//! about a hundred callers in one datagram, where twelve bytes a mark
//! covered fourteen and the rest were dropped whole, unguarded.

use remora_wire::datagram::DatagramEnd;
use remora_wire::{Ipv4Address, MacAddress};
use std::collections::BTreeMap;

/// The header flag of a reply that carries a checkpoint.
pub const CHECKPOINT_FLAG: u16 = 0x0001;
/// Replies a checkpoint keeps per caller: more than any caller's window of
/// unanswered calls, so every call a caller may still resend is covered.
pub const REPLIES_PER_CALLER: usize = 16;
/// The largest checkpoint: it rides in one datagram with its reply.
pub const MAX_CHECKPOINT_BYTES: usize = 3072;
/// Marks reach this many RPC ids below a caller's newest: a caller
/// restored from a checkpoint takes a call older than that for a stale
/// copy and never runs it (the callee's stale span), so a mark there would
/// guard nothing.
pub const MARKED_SPAN: u64 = REPLIES_PER_CALLER as u64;

/// Why a checkpoint could not be read or made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    #[error("the checkpoint is truncated at byte {0}")]
    Truncated(usize),
    #[error("a checkpoint of {0} bytes is past {MAX_CHECKPOINT_BYTES}")]
    TooLarge(usize),
    #[error("bytes follow the checkpoint's end at byte {0}")]
    TrailingBytes(usize),
    #[error("the service refused its state: {0}")]
    Service(String),
    #[error("the replies at byte {at} are not in their one encoding: {why}")]
    NotCanonical { at: usize, why: &'static str },
    #[error("call {rpc_id} is marked answered {below} ids below its caller's newest, past the {MARKED_SPAN} a checkpoint marks")]
    MarkOutsideSpan { rpc_id: u64, below: u64 },
    #[error("a caller with no reply and no mark has nothing to encode")]
    CallerWithoutReplies,
}

/// What a checkpoint holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Checkpoint {
    /// The callee's count of checkpoints taken: a newer one wins.
    pub sequence: u64,
    /// Calls the callee had run when it was taken.
    pub executed: u64,
    pub state: Vec<u8>,
    pub replies: BTreeMap<DatagramEnd, BTreeMap<u64, Vec<u8>>>,
    /// Calls received and not yet answered (b1), as their datagrams came:
    /// a replacement runs them and answers their callers.
    pub received: BTreeMap<DatagramEnd, BTreeMap<u64, Vec<u8>>>,
}

/// Whether a remembered reply is only the mark of an answered call whose
/// reply a shrunk checkpoint left out.
pub fn is_answered_without_reply(reply: &[u8]) -> bool {
    reply.is_empty()
}

/// Leaves out the bodies of all but the newest `keep` replies of one
/// caller, marking those calls answered, and forgets marks past
/// [`MARKED_SPAN`] below the newest: what a shrunk checkpoint keeps.
pub fn leave_out_replies(replies: &mut BTreeMap<u64, Vec<u8>>, keep: usize) {
    let Some(&newest) = replies.keys().next_back() else {
        return;
    };
    let older = replies.len().saturating_sub(keep);
    for reply in replies.values_mut().take(older) {
        *reply = Vec::new();
    }
    replies.retain(|&rpc_id, reply| {
        !is_answered_without_reply(reply) || newest - rpc_id < MARKED_SPAN
    });
}

/// The oldest RPC id from which a checkpoint's replies for one caller hold
/// every call the callee answered: the oldest kept, or [`MARKED_SPAN`]
/// below the newest if that is lower. The replies are the caller's newest
/// answered calls, the oldest of them marks, and only marks are ever left
/// out, the oldest first: nothing answered above the oldest kept is
/// missing. (Below the newest's span the bound holds too: a mark is
/// forgotten only there.)
pub fn known_from(replies: &BTreeMap<u64, Vec<u8>>) -> u64 {
    let (Some(&oldest), Some(&newest)) = (replies.keys().next(), replies.keys().next_back()) else {
        return 0;
    };
    oldest.min(newest.saturating_sub(MARKED_SPAN - 1))
}

/// Appends one `RPC id u64 | length u32 | bytes` entry: a reply, a
/// received call or an unanswered call's arguments.
fn encode_entry(bytes: &mut Vec<u8>, rpc_id: u64, payload: &[u8]) {
    bytes.extend_from_slice(&rpc_id.to_be_bytes());
    bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    bytes.extend_from_slice(payload);
}

fn encode_caller(bytes: &mut Vec<u8>, caller: &DatagramEnd) {
    bytes.extend_from_slice(&caller.mac.0);
    bytes.extend_from_slice(&caller.address.0);
    bytes.extend_from_slice(&caller.port.to_be_bytes());
}

fn decode_caller(reader: &mut Reader<'_>) -> Result<DatagramEnd, CheckpointError> {
    let mac = MacAddress(reader.take(6)?.try_into().expect("six bytes"));
    let address = Ipv4Address(reader.take(4)?.try_into().expect("four bytes"));
    let port = u16::from_be_bytes(reader.take(2)?.try_into().expect("two bytes"));
    Ok(DatagramEnd { mac, address, port })
}

/// The next caller of a list kept in increasing order: one repeated or
/// out of order is not canonical.
fn decode_next_caller(
    reader: &mut Reader<'_>,
    previous: &mut Option<DatagramEnd>,
) -> Result<DatagramEnd, CheckpointError> {
    let at = reader.at;
    let caller = decode_caller(reader)?;
    if previous.is_some_and(|previous| previous >= caller) {
        return Err(CheckpointError::NotCanonical {
            at,
            why: "callers out of order or repeated",
        });
    }
    *previous = Some(caller);
    Ok(caller)
}

/// Appends the replies each caller is remembered by: the marks as bits
/// beside the newest id, the replies kept whole.
fn encode_replies(
    bytes: &mut Vec<u8>,
    replies: &BTreeMap<DatagramEnd, BTreeMap<u64, Vec<u8>>>,
) -> Result<(), CheckpointError> {
    bytes.extend_from_slice(&(replies.len() as u32).to_be_bytes());
    for (caller, kept) in replies {
        let Some(&newest) = kept.keys().next_back() else {
            return Err(CheckpointError::CallerWithoutReplies);
        };
        let mut marked = 0u16;
        for (&rpc_id, reply) in kept {
            let below = newest - rpc_id;
            if !is_answered_without_reply(reply) {
                continue;
            }
            if below >= MARKED_SPAN {
                return Err(CheckpointError::MarkOutsideSpan { rpc_id, below });
            }
            marked |= 1 << below;
        }
        let whole = kept
            .iter()
            .filter(|(_, reply)| !is_answered_without_reply(reply));
        encode_caller(bytes, caller);
        bytes.extend_from_slice(&newest.to_be_bytes());
        bytes.extend_from_slice(&marked.to_be_bytes());
        bytes.extend_from_slice(&(whole.clone().count() as u32).to_be_bytes());
        for (rpc_id, reply) in whole {
            encode_entry(bytes, *rpc_id, reply);
        }
    }
    Ok(())
}

/// Reads what [`encode_replies`] wrote, refusing any other encoding of the
/// same replies: a mark below id 0, a reply of no bytes (a mark's place),
/// ids out of order or past the newest, and a newest with neither a reply
/// nor a mark.
fn decode_replies(
    reader: &mut Reader<'_>,
) -> Result<BTreeMap<DatagramEnd, BTreeMap<u64, Vec<u8>>>, CheckpointError> {
    let callers = reader.u32()?;
    let mut replies = BTreeMap::new();
    let mut previous_caller = None;
    for _ in 0..callers {
        let at = reader.at;
        let not_canonical = |why| CheckpointError::NotCanonical { at, why };
        let caller = decode_next_caller(reader, &mut previous_caller)?;
        let newest = reader.u64()?;
        let marked = reader.u16()?;
        let mut kept = BTreeMap::new();
        for below in (0..MARKED_SPAN).filter(|below| marked & (1 << below) != 0) {
            let rpc_id = newest
                .checked_sub(below)
                .ok_or(not_canonical("a mark below RPC id 0"))?;
            kept.insert(rpc_id, Vec::new());
        }
        let count = reader.u32()?;
        let mut previous = None;
        for _ in 0..count {
            let (rpc_id, reply) = reader.entry()?;
            if reply.is_empty() {
                return Err(not_canonical("a reply of no bytes"));
            }
            if rpc_id > newest || previous.is_some_and(|previous| previous >= rpc_id) {
                return Err(not_canonical("reply ids out of order or past the newest"));
            }
            if kept.insert(rpc_id, reply.to_vec()).is_some() {
                return Err(not_canonical("a call both marked and kept"));
            }
            previous = Some(rpc_id);
        }
        if !kept.contains_key(&newest) {
            return Err(not_canonical("the newest id has no reply and no mark"));
        }
        replies.insert(caller, kept);
    }
    Ok(replies)
}

/// Appends `calls` (by caller, by RPC id) to `bytes`.
fn encode_calls(bytes: &mut Vec<u8>, calls: &BTreeMap<DatagramEnd, BTreeMap<u64, Vec<u8>>>) {
    bytes.extend_from_slice(&(calls.len() as u32).to_be_bytes());
    for (caller, kept) in calls {
        encode_caller(bytes, caller);
        bytes.extend_from_slice(&(kept.len() as u32).to_be_bytes());
        for (rpc_id, payload) in kept {
            encode_entry(bytes, *rpc_id, payload);
        }
    }
}

/// Reads what [`encode_calls`] wrote.
fn decode_calls(
    reader: &mut Reader<'_>,
) -> Result<BTreeMap<DatagramEnd, BTreeMap<u64, Vec<u8>>>, CheckpointError> {
    let callers = reader.u32()?;
    let mut calls = BTreeMap::new();
    let mut previous_caller = None;
    for _ in 0..callers {
        let caller = decode_next_caller(reader, &mut previous_caller)?;
        calls.insert(caller, decode_entries(reader)?);
    }
    Ok(calls)
}

/// A count, then that many entries in increasing RPC id order: entries
/// repeated or out of order overwrote each other, and two byte strings
/// decoded to one checkpoint (found by reading).
fn decode_entries(reader: &mut Reader<'_>) -> Result<BTreeMap<u64, Vec<u8>>, CheckpointError> {
    let count = reader.u32()?;
    let mut kept = BTreeMap::new();
    let mut previous = None;
    for _ in 0..count {
        let at = reader.at;
        let (rpc_id, payload) = reader.entry()?;
        if previous.is_some_and(|previous| previous >= rpc_id) {
            return Err(CheckpointError::NotCanonical {
                at,
                why: "RPC ids out of order or repeated",
            });
        }
        previous = Some(rpc_id);
        kept.insert(rpc_id, payload.to_vec());
    }
    Ok(kept)
}

impl Checkpoint {
    pub fn encode(&self) -> Result<Vec<u8>, CheckpointError> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&self.sequence.to_be_bytes());
        bytes.extend_from_slice(&self.executed.to_be_bytes());
        bytes.extend_from_slice(&(self.state.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&self.state);
        encode_replies(&mut bytes, &self.replies)?;
        encode_calls(&mut bytes, &self.received);
        if bytes.len() > MAX_CHECKPOINT_BYTES {
            return Err(CheckpointError::TooLarge(bytes.len()));
        }
        Ok(bytes)
    }

    pub fn decode(bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
        refuse_past_a_datagram(bytes)?;
        let mut reader = Reader { bytes, at: 0 };
        let sequence = reader.u64()?;
        let executed = reader.u64()?;
        let state_length = reader.u32()? as usize;
        let state = reader.take(state_length)?.to_vec();
        let replies = decode_replies(&mut reader)?;
        let received = decode_calls(&mut reader)?;
        reader.finish()?;
        Ok(Checkpoint {
            sequence,
            executed,
            state,
            replies,
            received,
        })
    }
}

/// No checkpoint is longer than [`MAX_CHECKPOINT_BYTES`], which its
/// encoding refuses: a longer one decoded, and so was no checkpoint's
/// encoding (found by review of the fuzz harness).
fn refuse_past_a_datagram(bytes: &[u8]) -> Result<(), CheckpointError> {
    if bytes.len() > MAX_CHECKPOINT_BYTES {
        return Err(CheckpointError::TooLarge(bytes.len()));
    }
    Ok(())
}

/// Reads a checkpoint front to back; every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    /// Every byte was read: a checkpoint is exactly its encoding, so that
    /// two different byte strings never decode to the same checkpoint.
    fn finish(&self) -> Result<(), CheckpointError> {
        if self.at == self.bytes.len() {
            Ok(())
        } else {
            Err(CheckpointError::TrailingBytes(self.at))
        }
    }

    fn take(&mut self, length: usize) -> Result<&'a [u8], CheckpointError> {
        let end = self
            .at
            .checked_add(length)
            .ok_or(CheckpointError::Truncated(self.at))?;
        let taken = self
            .bytes
            .get(self.at..end)
            .ok_or(CheckpointError::Truncated(self.at))?;
        self.at = end;
        Ok(taken)
    }

    fn u16(&mut self) -> Result<u16, CheckpointError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("two bytes"),
        ))
    }

    fn u32(&mut self) -> Result<u32, CheckpointError> {
        Ok(u32::from_be_bytes(
            self.take(4)?.try_into().expect("four bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, CheckpointError> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("eight bytes"),
        ))
    }

    /// What [`encode_entry`] wrote: the RPC id and the bytes.
    fn entry(&mut self) -> Result<(u64, &'a [u8]), CheckpointError> {
        let rpc_id = self.u64()?;
        let length = self.u32()? as usize;
        Ok((rpc_id, self.take(length)?))
    }
}

/// Splits a checkpointed reply's payload into its body and checkpoint.
pub fn split_reply(payload: &[u8]) -> Option<(&[u8], &[u8])> {
    let length = u32::from_be_bytes(payload.get(..4)?.try_into().ok()?) as usize;
    let body = payload.get(4..4usize.checked_add(length)?)?;
    Some((body, &payload[4 + length..]))
}

/// A datagram's payload past its header without the checkpoint it may
/// carry: a checkpoint the Gatekeeper did not take (no Gatekeeper on the
/// path) is neither the caller's nor the callee's business. None if the
/// flag says there is one and the payload does not hold it.
pub fn without_checkpoint<T: AsRef<[u8]>>(
    header: &remora_wire::bifrost::BifrostHeader<T>,
) -> Option<&[u8]> {
    if header.flags() & CHECKPOINT_FLAG == 0 {
        return Some(header.payload());
    }
    split_reply(header.payload()).map(|(body, _)| body)
}

/// A checkpointed reply's payload.
pub fn join_reply(body: &[u8], checkpoint: &[u8]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(4 + body.len() + checkpoint.len());
    payload.extend_from_slice(&(body.len() as u32).to_be_bytes());
    payload.extend_from_slice(body);
    payload.extend_from_slice(checkpoint);
    payload
}

/// The caller's checkpoint (the thesis's a1 and a2, §4.2): the head
/// caller's progress, carried on each call it sends (flag
/// [`CHECKPOINT_FLAG`], payload `arguments length u32 | arguments |
/// checkpoint`) and kept by the Gatekeeper, newest per caller. It is taken
/// when the call is sent (a1: the call is in it) and so also covers every
/// reply taken before (a2, committed on the next call). A caller restarted
/// from it delivers exactly the outcomes it had delivered, resends its
/// unanswered calls under their RPC ids (the callee drops duplicates and
/// answers from memory), and goes on from the next id.
///
/// `sequence u64 | issued u64 | delivered u64 | next RPC id u64 | calls
/// u32`, then per unanswered call `RPC id u64 | length u32 | arguments`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CallerCheckpoint {
    /// Grows with every checkpoint a caller takes: a newer one wins.
    pub sequence: u64,
    /// Calls the application had issued.
    pub issued: u64,
    /// Outcomes the application had taken.
    pub delivered: u64,
    pub next_rpc_id: u64,
    /// The calls not yet answered, by RPC id, with their arguments.
    pub unanswered: BTreeMap<u64, Vec<u8>>,
}

impl CallerCheckpoint {
    pub fn encode(&self) -> Result<Vec<u8>, CheckpointError> {
        let mut bytes = Vec::new();
        for value in [self.sequence, self.issued, self.delivered, self.next_rpc_id] {
            bytes.extend_from_slice(&value.to_be_bytes());
        }
        bytes.extend_from_slice(&(self.unanswered.len() as u32).to_be_bytes());
        for (rpc_id, arguments) in &self.unanswered {
            encode_entry(&mut bytes, *rpc_id, arguments);
        }
        if bytes.len() > MAX_CHECKPOINT_BYTES {
            return Err(CheckpointError::TooLarge(bytes.len()));
        }
        Ok(bytes)
    }

    pub fn decode(bytes: &[u8]) -> Result<CallerCheckpoint, CheckpointError> {
        refuse_past_a_datagram(bytes)?;
        let mut reader = Reader { bytes, at: 0 };
        let mut checkpoint = CallerCheckpoint {
            sequence: reader.u64()?,
            issued: reader.u64()?,
            delivered: reader.u64()?,
            next_rpc_id: reader.u64()?,
            unanswered: BTreeMap::new(),
        };
        checkpoint.unanswered = decode_entries(&mut reader)?;
        reader.finish()?;
        Ok(checkpoint)
    }
}

/// The harness of the `bifrost_checkpoints` fuzz target for callers'
/// checkpoints: any bytes decode or fail with a typed error; what decodes
/// encodes to the very same bytes.
pub fn any_caller_checkpoint(data: &[u8]) -> bool {
    let Ok(checkpoint) = CallerCheckpoint::decode(data) else {
        return false;
    };
    // Decoding is canonical: what decodes is its own encoding.
    assert_eq!(checkpoint.encode().as_deref(), Ok(data));
    true
}

/// The harness of the `bifrost_checkpoints` fuzz target, kept here so that
/// tests replay it: any bytes decode or fail with a typed error; what
/// decodes encodes to the very same bytes.
pub fn any_checkpoint(data: &[u8]) -> bool {
    let Ok(checkpoint) = Checkpoint::decode(data) else {
        return false;
    };
    // Decoding is canonical: what decodes is its own encoding.
    assert_eq!(checkpoint.encode().as_deref(), Ok(data));
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries repeated or out of order overwrote each other: the same
    /// checkpoint had several encodings, which `Reader::finish` says
    /// never happens (found by reading). Replies were checked already;
    /// received calls and a caller's unanswered calls now are too.
    #[test]
    fn repeated_or_unordered_calls_are_not_canonical() {
        let caller = DatagramEnd {
            mac: MacAddress([2, 0, 0, 0, 0, 1]),
            address: Ipv4Address::new(10, 0, 0, 1),
            port: 40000,
        };
        fn not_canonical<T>(result: Result<T, CheckpointError>) -> bool {
            matches!(result, Err(CheckpointError::NotCanonical { .. }))
        }
        for ids in [[5u64, 5], [6, 5]] {
            let mut unanswered = Vec::new();
            for value in [1u64, 2, 3, 4] {
                unanswered.extend_from_slice(&value.to_be_bytes());
            }
            unanswered.extend_from_slice(&2u32.to_be_bytes());
            for id in ids {
                encode_entry(&mut unanswered, id, b"call");
            }
            assert!(
                not_canonical(CallerCheckpoint::decode(&unanswered)),
                "{ids:?}"
            );
            let empty = Checkpoint {
                sequence: 1,
                executed: 0,
                state: Vec::new(),
                replies: BTreeMap::new(),
                received: BTreeMap::new(),
            };
            let mut received = empty.encode().unwrap();
            // The encoding ends with the count of callers with received
            // calls, none here: one caller with two entries instead.
            received.truncate(received.len() - 4);
            received.extend_from_slice(&1u32.to_be_bytes());
            encode_caller(&mut received, &caller);
            received.extend_from_slice(&2u32.to_be_bytes());
            for id in ids {
                encode_entry(&mut received, id, b"call");
            }
            assert!(not_canonical(Checkpoint::decode(&received)), "{ids:?}");
        }
        // Longer than any encoding: a state past the datagram.
        let mut long = Vec::new();
        for value in [1u64, 0] {
            long.extend_from_slice(&value.to_be_bytes());
        }
        let state = vec![7u8; MAX_CHECKPOINT_BYTES];
        long.extend_from_slice(&(state.len() as u32).to_be_bytes());
        long.extend_from_slice(&state);
        long.extend_from_slice(&0u32.to_be_bytes());
        long.extend_from_slice(&0u32.to_be_bytes());
        assert!(matches!(
            Checkpoint::decode(&long),
            Err(CheckpointError::TooLarge(_))
        ));
        assert!(
            !any_checkpoint(&long),
            "the fuzz harness takes it as refused"
        );
        // The same caller twice, with one call each.
        let mut repeated = Checkpoint {
            sequence: 1,
            executed: 0,
            state: Vec::new(),
            replies: BTreeMap::new(),
            received: BTreeMap::new(),
        }
        .encode()
        .unwrap();
        repeated.truncate(repeated.len() - 4);
        repeated.extend_from_slice(&2u32.to_be_bytes());
        for id in [5, 6] {
            encode_caller(&mut repeated, &caller);
            repeated.extend_from_slice(&1u32.to_be_bytes());
            encode_entry(&mut repeated, id, b"call");
        }
        assert!(not_canonical(Checkpoint::decode(&repeated)));
    }

    #[test]
    fn checkpoints_round_trip_and_truncations_are_typed_errors() {
        let caller = DatagramEnd {
            mac: MacAddress([2, 0, 0, 0, 0, 1]),
            address: Ipv4Address::new(10, 0, 0, 1),
            port: 40000,
        };
        let mut replies = BTreeMap::new();
        replies.insert(
            caller,
            BTreeMap::from([(7u64, b"seven".to_vec()), (8, Vec::new())]),
        );
        let received = BTreeMap::from([(caller, BTreeMap::from([(9u64, b"call".to_vec())]))]);
        let checkpoint = Checkpoint {
            sequence: 11,
            executed: 9,
            state: 42u64.to_be_bytes().to_vec(),
            replies,
            received,
        };
        let bytes = checkpoint.encode().unwrap();
        assert_eq!(Checkpoint::decode(&bytes), Ok(checkpoint));
        for cut in 0..bytes.len() {
            assert!(matches!(
                Checkpoint::decode(&bytes[..cut]),
                Err(CheckpointError::Truncated(_))
            ));
        }
        assert!(any_checkpoint(&bytes));
        // One encoding per checkpoint: bytes after its end are refused.
        let padded = [&bytes[..], &[0]].concat();
        assert_eq!(
            Checkpoint::decode(&padded),
            Err(CheckpointError::TrailingBytes(bytes.len()))
        );
        let payload = join_reply(b"body", &bytes);
        assert_eq!(split_reply(&payload), Some((&b"body"[..], &bytes[..])));
        assert_eq!(split_reply(&[0, 0, 0, 9, 1]), None);
    }

    fn one_caller_replies(replies: BTreeMap<u64, Vec<u8>>) -> Checkpoint {
        let caller = DatagramEnd {
            mac: MacAddress([2, 0, 0, 0, 0, 1]),
            address: Ipv4Address::new(10, 0, 0, 1),
            port: 40000,
        };
        Checkpoint {
            replies: BTreeMap::from([(caller, replies)]),
            ..Checkpoint::default()
        }
    }

    /// A mark costs a bit: sixteen marked calls and one whole reply take
    /// the caller's fixed 26 bytes and the reply's.
    #[test]
    fn marks_are_bits_beside_the_newest_id_and_only_within_the_span() {
        let mut replies: BTreeMap<u64, Vec<u8>> = (1..=40u64).map(|id| (id, vec![7; 3])).collect();
        leave_out_replies(&mut replies, 1);
        assert_eq!(
            replies.len(),
            MARKED_SPAN as usize,
            "marks past the span forgotten"
        );
        assert_eq!(replies.keys().next(), Some(&25));
        assert_eq!(replies[&40], vec![7; 3], "the newest reply kept whole");
        let checkpoint = one_caller_replies(replies);
        let bytes = checkpoint.encode().unwrap();
        let fixed = 8 + 8 + 4 + 4 + 4;
        assert_eq!(bytes.len(), fixed + 26 + 12 + 3);
        assert_eq!(Checkpoint::decode(&bytes), Ok(checkpoint));

        let outside = one_caller_replies(BTreeMap::from([(3, Vec::new()), (40, vec![1])]));
        assert_eq!(
            outside.encode(),
            Err(CheckpointError::MarkOutsideSpan {
                rpc_id: 3,
                below: 37
            })
        );
        let empty = one_caller_replies(BTreeMap::new());
        assert_eq!(empty.encode(), Err(CheckpointError::CallerWithoutReplies));
    }

    /// Two callers' blocks swapped decoded to the same checkpoint: a
    /// second encoding of it. Callers must come in order.
    #[test]
    fn callers_out_of_order_are_refused() {
        let caller = |port| DatagramEnd {
            mac: MacAddress([2, 0, 0, 0, 0, 1]),
            address: Ipv4Address::new(10, 0, 0, 1),
            port,
        };
        let two = Checkpoint {
            replies: BTreeMap::from([
                (caller(1), BTreeMap::from([(3, vec![1])])),
                (caller(2), BTreeMap::from([(4, vec![2])])),
            ]),
            ..Checkpoint::default()
        };
        let bytes = two.encode().unwrap();
        // sequence, executed, state length, callers; then two blocks of
        // caller 12, newest 8, marked 2, replies 4, id 8, length 4, reply 1.
        let first = 8 + 8 + 4 + 4;
        let block = 12 + 8 + 2 + 4 + 8 + 4 + 1;
        let mut swapped = bytes[..first].to_vec();
        swapped.extend_from_slice(&bytes[first + block..first + 2 * block]);
        swapped.extend_from_slice(&bytes[first..first + block]);
        swapped.extend_from_slice(&bytes[first + 2 * block..]);
        assert!(matches!(
            Checkpoint::decode(&swapped),
            Err(CheckpointError::NotCanonical {
                why: "callers out of order or repeated",
                ..
            })
        ));
        assert_eq!(Checkpoint::decode(&bytes), Ok(two));
    }

    /// The cover starts at the oldest reply kept, or 16 ids below the
    /// newest if that is lower.
    #[test]
    fn the_cover_is_the_oldest_kept_or_the_newest_span() {
        let replies = |ids: &[u64]| ids.iter().map(|&id| (id, vec![1])).collect();
        assert_eq!(known_from(&replies(&[20, 22, 40])), 20);
        assert_eq!(known_from(&replies(&[30, 40])), 25);
        assert_eq!(known_from(&replies(&[3])), 0);
        assert_eq!(known_from(&BTreeMap::new()), 0);
    }

    /// Each set of replies has one encoding; the others are refused by
    /// name, not read as something else.
    #[test]
    fn replies_in_any_other_encoding_are_refused() {
        let good = one_caller_replies(BTreeMap::from([(4, Vec::new()), (5, vec![9])]));
        let bytes = good.encode().unwrap();
        // sequence, executed, state length, callers, then the caller.
        let caller_at = 8 + 8 + 4 + 4;
        let newest_at = caller_at + 12;
        let marked_at = newest_at + 8;
        let reply_at = marked_at + 2 + 4;
        let edit = |at: usize, with: &[u8]| {
            let mut edited = bytes.clone();
            edited[at..at + with.len()].copy_from_slice(with);
            Checkpoint::decode(&edited)
        };
        let refused = |result: Result<Checkpoint, CheckpointError>, expected: &str| match result {
            Err(CheckpointError::NotCanonical { at, why }) => {
                assert_eq!(at, caller_at);
                assert_eq!(why, expected);
            }
            other => panic!("{other:?}, expected {expected}"),
        };
        let edits: [(usize, &[u8], &str); 4] = [
            (newest_at, &0u64.to_be_bytes(), "a mark below RPC id 0"),
            (
                marked_at,
                &3u16.to_be_bytes(),
                "a call both marked and kept",
            ),
            (
                reply_at,
                &6u64.to_be_bytes(),
                "reply ids out of order or past the newest",
            ),
            (
                newest_at,
                &7u64.to_be_bytes(),
                "the newest id has no reply and no mark",
            ),
        ];
        for (at, with, why) in edits {
            refused(edit(at, with), why);
        }
        let mut empty_reply = bytes.clone();
        empty_reply[reply_at + 8..reply_at + 12].copy_from_slice(&0u32.to_be_bytes());
        empty_reply.remove(reply_at + 12);
        refused(Checkpoint::decode(&empty_reply), "a reply of no bytes");
        assert_eq!(Checkpoint::decode(&bytes), Ok(good));
    }

    #[test]
    fn a_checkpoint_past_one_datagram_is_refused() {
        let checkpoint = Checkpoint {
            sequence: 1,
            executed: 0,
            state: vec![0; MAX_CHECKPOINT_BYTES],
            replies: BTreeMap::new(),
            received: BTreeMap::new(),
        };
        assert!(matches!(
            checkpoint.encode(),
            Err(CheckpointError::TooLarge(_))
        ));
    }

    #[test]
    fn caller_checkpoints_round_trip_and_truncations_are_typed_errors() {
        let checkpoint = CallerCheckpoint {
            sequence: 5,
            issued: 12,
            delivered: 9,
            next_rpc_id: 13,
            unanswered: BTreeMap::from([(10, vec![1; 8]), (12, Vec::new())]),
        };
        let bytes = checkpoint.encode().unwrap();
        assert_eq!(CallerCheckpoint::decode(&bytes), Ok(checkpoint));
        for cut in 0..bytes.len() {
            assert!(matches!(
                CallerCheckpoint::decode(&bytes[..cut]),
                Err(CheckpointError::Truncated(_))
            ));
        }
        assert!(any_caller_checkpoint(&bytes));
        let huge = CallerCheckpoint {
            unanswered: BTreeMap::from([(1, vec![0; MAX_CHECKPOINT_BYTES])]),
            ..CallerCheckpoint::default()
        };
        assert!(matches!(huge.encode(), Err(CheckpointError::TooLarge(_))));
    }
}
