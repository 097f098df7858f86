//! Bifröst's RPC runtime, with no I/O: RPCs are UDP datagrams on
//! [`BIFROST_PORT`] with the Bifröst header at the start of the payload
//! (§6.1), so the switch can parse, hold and replay them.
//!
//! A [`Caller`] numbers its calls (the RPC id, unique per caller) and
//! sends each again until it is answered or runs out of attempts. A
//! [`Callee`] runs each (caller, RPC id) once: a duplicate of a call it has
//! answered gets the same reply again, without running the method again.
//! Time comes in as an argument; the agents in [`agents`] drive both
//! through the device's datagram verbs.

pub mod agents;
pub mod chain;
pub mod checkpoint;
pub mod scenario;
pub mod workers;

use remora_base::Timestamp;
use remora_wire::bifrost::{
    BifrostHeader, BifrostRepr, CallType, GlobalAddress, BIFROST_PORT, HEADER_LEN,
};
use remora_wire::datagram::DatagramEnd;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

/// Calls a caller may have unanswered at once.
pub const MAX_OUTSTANDING: usize = 1024;
/// Answered calls a callee remembers per caller, to answer duplicates.
pub const REPLIES_KEPT_PER_CALLER: u64 = 1024;
/// Callers a callee remembers. Past it, the caller answered least
/// recently is forgotten to make room: a resend of one of its answered
/// calls after that would run again, where refusing every new caller (as
/// before) stopped the callee serving anyone new for good.
pub const MAX_CALLERS: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RpcError {
    #[error("{0} calls are unanswered: the caller's window is full")]
    TooManyOutstanding(usize),
    #[error("RPC id {0} is already unanswered")]
    IdInUse(u64),
    #[error("a relay serves one upstream caller; {0:?} is a second")]
    SecondUpstreamCaller(DatagramEnd),
    #[error(transparent)]
    Header(#[from] remora_wire::bifrost::BifrostError),
    #[error("call {rpc_id} got no answer after {attempts} attempts")]
    NoAnswer { rpc_id: u64, attempts: u32 },
    #[error("the callee raised: {0}")]
    Exception(String),
    /// A call that shares its callee's fate: the callee failed with it
    /// unanswered, and the Gatekeeper answered for it. The call may or may
    /// not have taken effect before the failure; it is not replayed.
    #[error("the callee failed with the call in flight, and the call shares its fate: {0}")]
    SharedFate(String),
    /// The call ran, exactly once, but its callee failed before the
    /// caller had the reply, and the checkpoint its replacement started
    /// from had no room for the reply. It is not run again.
    #[error("the call ran once, but its reply was lost with the callee: {0}")]
    ReplyLost(String),
    /// The callee failed, and its replacement cannot tell whether this
    /// call ran before the failure: this call is older than what its
    /// checkpoint covers of the caller ([`checkpoint::known_from`]).
    /// It is not run now. Only a caller that keeps calls out over more ids
    /// than that meets it ([`Caller::within_span`]; the agents never do).
    #[error("the callee failed and its replacement cannot tell whether the call ran: {0}")]
    OutcomeUnknown(String),
    #[error("the callee knows no method {0:?}")]
    UnknownMethod(String),
    #[error("the calling host crashed with the call in flight")]
    CallerCrashed,
    #[error("the rack's calling agent is gone")]
    Disconnected,
    #[error("no outcome within {0:?}")]
    TimedOut(std::time::Duration),
    #[error("the caller's checkpoint: {0}")]
    Checkpoint(String),
}

/// Whether a received call's datagram is a ONEWAY call.
fn is_oneway(datagram: &[u8]) -> bool {
    BifrostHeader::new_checked(datagram).is_ok_and(|header| header.call_type() == CallType::Oneway)
}

/// Sheds from a checkpoint the received calls a replacement gets again
/// without it: the two-way calls its replies cover of their caller. ONEWAY
/// calls stay: nobody sends them again ([`Callee::handle`] bounds them as
/// they come instead). So do calls below what the checkpoint's replies
/// cover of their caller (`known_from`): a replacement would refuse them
/// again as of unknown outcome, though they never ran.
///
/// The cover is taken as high as shrinking the replies may raise it
/// (marks more than [`checkpoint::MARKED_SPAN`] below the newest reply
/// go): [`Callee::fit`] sheds before it shrinks, and a call shed below
/// the cover it ends with was refused as of unknown outcome.
fn shed_received(checkpoint: &mut checkpoint::Checkpoint) {
    for (caller, calls) in checkpoint.received.iter_mut() {
        let covered_from = checkpoint.replies.get(caller).map_or(0, |replies| {
            let newest = replies.keys().next_back().copied().unwrap_or(0);
            let highest_cover = newest.saturating_sub(checkpoint::MARKED_SPAN - 1);
            checkpoint::known_from(replies).max(highest_cover)
        });
        calls.retain(|rpc_id, datagram| is_oneway(datagram) || *rpc_id < covered_from);
    }
    checkpoint.received.retain(|_, calls| !calls.is_empty());
}

/// A method's answer: the reply's bytes and, when the method returns
/// global memory of its own, the pointer the REPLY's header carries (the
/// Gatekeeper then hands its control to the caller). Without one, the
/// reply's header keeps the call's pointer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Answer {
    pub body: Vec<u8>,
    pub pointer: Option<GlobalAddress>,
    /// The service's state right after the call: what a service run on
    /// another thread hands back ([`workers::WorkerPool`] keeps it, to
    /// answer for the service's state in the reply's checkpoint).
    pub state: Option<Vec<u8>>,
}

impl From<Vec<u8>> for Answer {
    fn from(body: Vec<u8>) -> Answer {
        Answer {
            body,
            pointer: None,
            state: None,
        }
    }
}

/// Why a method gave no answer: the text its EXCEPTION carries, and the
/// flag that types it for the caller. A relay passes a nested call's
/// failure on typed (`REPLY_LOST_FLAG`, `OUTCOME_UNKNOWN_FLAG`,
/// `CALLEE_FAILED_FLAG`): as text, a nested call whose outcome was unknown
/// reached the head as an exception the callee raised, for good, and a
/// head that issued it again under a new id could run it twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub message: String,
    /// Header flags the EXCEPTION carries (0: a plain exception).
    pub flag: u16,
}

impl From<String> for Refusal {
    fn from(message: String) -> Refusal {
        Refusal { message, flag: 0 }
    }
}

impl From<&str> for Refusal {
    fn from(message: &str) -> Refusal {
        Refusal::from(message.to_string())
    }
}

/// What a method comes to: its answer, or the refusal an EXCEPTION carries.
pub type Outcome = Result<Answer, Refusal>;

/// A call's failure domain (the thesis's §4.2), chosen per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailureDomain {
    /// The callee's failure is recovered: the call is held or replayed to
    /// its replacement and takes effect once.
    #[default]
    Recover,
    /// The call shares its callee's fate: if the callee fails with the
    /// call unanswered, the caller gets [`RpcError::SharedFate`] at once.
    ShareFate,
}

/// The header flag of a call that shares its callee's fate.
pub const SHARE_FATE_FLAG: u16 = 0x0002;
/// The header flag of the Gatekeeper's answer for a call whose callee
/// failed (an EXCEPTION no callee sent).
pub const CALLEE_FAILED_FLAG: u16 = 0x0004;
/// The header flag of a replacement's answer to a call that ran before the
/// failure and whose reply its checkpoint had no room for (an EXCEPTION).
pub const REPLY_LOST_FLAG: u16 = 0x0008;
/// The header flag of a replacement's answer to a call older than its
/// checkpoint covers, which may or may not have run (an EXCEPTION).
pub const OUTCOME_UNKNOWN_FLAG: u16 = 0x0010;

/// What a method does; the error becomes an EXCEPTION reply.
pub trait Service: Send {
    fn call(&mut self, method: &[u8], pointer: GlobalAddress, arguments: &[u8]) -> Outcome;

    /// Starts a call: its outcome now, or `None` when it finishes later
    /// and [`Service::poll_finished`] hands it back under `ticket` (a
    /// service whose methods block, on the DSM say, must not hold up the
    /// agent that runs the callee). By default, runs [`Service::call`].
    fn begin(
        &mut self,
        ticket: CallTicket,
        method: &[u8],
        pointer: GlobalAddress,
        arguments: &[u8],
    ) -> Option<Outcome> {
        let _ = ticket;
        Some(self.call(method, pointer, arguments))
    }

    /// A call begun earlier that has finished, if any.
    fn poll_finished(&mut self) -> Option<(CallTicket, Outcome)> {
        None
    }

    /// The service's state, for a checkpoint; `None` for a service that
    /// keeps none (its callee then sends no checkpoints).
    fn save_state(&self) -> Option<Vec<u8>> {
        None
    }

    /// The host crashed: work the service runs on threads of its own
    /// stops, as a crashed host's threads would.
    fn crash(&mut self) {}

    /// Whether it serves again after [`Service::crash`]. One that cannot
    /// (its threads are gone) answered every later call with an error it
    /// kept for good, a resend of a call it had run too.
    fn serves_after_crash(&self) -> bool {
        true
    }

    /// Takes back a state [`Service::save_state`] gave.
    fn restore_state(&mut self, state: &[u8]) -> Result<(), String> {
        let _ = state;
        Err("this service keeps no state to restore".into())
    }
}

/// Which call a deferred outcome answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallTicket {
    pub caller: DatagramEnd,
    pub rpc_id: u64,
}

/// Calls a callee may have begun and not finished.
pub const MAX_IN_PROGRESS: usize = 1024;

/// A datagram to send: where, and the payload (header first).
pub type Outgoing = (DatagramEnd, Vec<u8>);

fn encode(repr: &BifrostRepr, body: &[u8]) -> Vec<u8> {
    let mut payload = vec![0u8; HEADER_LEN + body.len()];
    repr.emit(&mut payload).expect("the buffer holds a header");
    payload[HEADER_LEN..].copy_from_slice(body);
    payload
}

#[derive(Debug)]
struct Outstanding {
    to: DatagramEnd,
    payload: Vec<u8>,
    sent_at: Timestamp,
    attempts: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallerCounters {
    pub calls: u64,
    pub retransmissions: u64,
    pub duplicate_replies: u64,
    pub malformed: u64,
}

/// The calling side.
#[derive(Debug)]
pub struct Caller {
    retransmit_after: Duration,
    max_attempts: u32,
    next_rpc_id: u64,
    outstanding: BTreeMap<u64, Outstanding>,
    sends: VecDeque<Outgoing>,
    completed: VecDeque<(u64, Result<Vec<u8>, RpcError>)>,
    counters: CallerCounters,
}

impl Caller {
    pub fn new(retransmit_after: Duration, max_attempts: u32) -> Caller {
        Caller {
            retransmit_after,
            max_attempts: max_attempts.max(1),
            next_rpc_id: 1,
            outstanding: BTreeMap::new(),
            sends: VecDeque::new(),
            completed: VecDeque::new(),
            counters: CallerCounters::default(),
        }
    }

    pub fn counters(&self) -> CallerCounters {
        self.counters
    }

    /// A caller with this one's settings and nothing else: what a caller
    /// that crashed comes back as.
    pub fn fresh(&self) -> Caller {
        Caller::new(self.retransmit_after, self.max_attempts)
    }

    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Starts a call; returns its RPC id.
    pub fn call(
        &mut self,
        now: Timestamp,
        to: DatagramEnd,
        method: &str,
        pointer: GlobalAddress,
        arguments: &[u8],
    ) -> Result<u64, RpcError> {
        let rpc_id = self.next_rpc_id;
        self.call_as(now, rpc_id, to, method, pointer, arguments)
    }

    /// Starts a call in a failure domain of its choosing.
    pub fn call_in(
        &mut self,
        now: Timestamp,
        domain: FailureDomain,
        to: DatagramEnd,
        method: &str,
        pointer: GlobalAddress,
        arguments: &[u8],
    ) -> Result<u64, RpcError> {
        let rpc_id = self.next_rpc_id;
        let flags = match domain {
            FailureDomain::Recover => 0,
            FailureDomain::ShareFate => SHARE_FATE_FLAG,
        };
        let call = (rpc_id, to, method, pointer, arguments);
        self.start_flagged(now, call, None, flags)
    }

    /// Starts a call under a chosen RPC id: a relay numbers its nested
    /// calls after the calls that caused them, so that after a restart it
    /// makes them again under the same ids and the callee drops them as
    /// duplicates. An id already unanswered is refused.
    pub fn call_as(
        &mut self,
        now: Timestamp,
        rpc_id: u64,
        to: DatagramEnd,
        method: &str,
        pointer: GlobalAddress,
        arguments: &[u8],
    ) -> Result<u64, RpcError> {
        self.start(now, rpc_id, to, method, pointer, arguments, None)
    }

    /// Starts a call that carries the caller's checkpoint (a1, see
    /// [`checkpoint::CallerCheckpoint`]) for the Gatekeeper to keep; its
    /// resends carry the same, older, checkpoint, which the Gatekeeper
    /// ignores once it holds a newer one.
    pub fn call_with_checkpoint(
        &mut self,
        now: Timestamp,
        rpc_id: u64,
        to: DatagramEnd,
        method: &str,
        arguments: &[u8],
        checkpoint: &[u8],
    ) -> Result<u64, RpcError> {
        let pointer = GlobalAddress::NULL;
        self.start(
            now,
            rpc_id,
            to,
            method,
            pointer,
            arguments,
            Some(checkpoint),
        )
    }

    /// Goes on numbering calls from `next_rpc_id` (a caller restored from
    /// its checkpoint).
    pub fn resume_at(&mut self, next_rpc_id: u64) {
        self.next_rpc_id = self.next_rpc_id.max(next_rpc_id);
    }

    pub fn next_rpc_id(&self) -> u64 {
        self.next_rpc_id
    }

    #[allow(clippy::too_many_arguments)]
    fn start(
        &mut self,
        now: Timestamp,
        rpc_id: u64,
        to: DatagramEnd,
        method: &str,
        pointer: GlobalAddress,
        arguments: &[u8],
        checkpoint: Option<&[u8]>,
    ) -> Result<u64, RpcError> {
        let call = (rpc_id, to, method, pointer, arguments);
        self.start_flagged(now, call, checkpoint, 0)
    }

    fn start_flagged(
        &mut self,
        now: Timestamp,
        (rpc_id, to, method, pointer, arguments): (u64, DatagramEnd, &str, GlobalAddress, &[u8]),
        checkpoint: Option<&[u8]>,
        flags: u16,
    ) -> Result<u64, RpcError> {
        if self.outstanding.len() >= MAX_OUTSTANDING {
            return Err(RpcError::TooManyOutstanding(self.outstanding.len()));
        }
        if self.outstanding.contains_key(&rpc_id) {
            return Err(RpcError::IdInUse(rpc_id));
        }
        let mut repr = BifrostRepr::new(CallType::Call, method, rpc_id, pointer)?;
        repr.flags |= flags;
        self.next_rpc_id = self.next_rpc_id.max(rpc_id.saturating_add(1));
        let payload = match checkpoint {
            Some(checkpoint) => {
                repr.flags |= checkpoint::CHECKPOINT_FLAG;
                encode(&repr, &checkpoint::join_reply(arguments, checkpoint))
            }
            None => encode(&repr, arguments),
        };
        self.sends.push_back((to, payload.clone()));
        self.outstanding.insert(
            rpc_id,
            Outstanding {
                to,
                payload,
                sent_at: now,
                attempts: 1,
            },
        );
        self.counters.calls += 1;
        Ok(rpc_id)
    }

    pub fn poll_transmit(&mut self) -> Option<Outgoing> {
        self.sends.pop_front()
    }

    /// Whether a new call stays within `window` RPC ids of the oldest
    /// unanswered one. A window of ids, not of calls: a callee's checkpoint
    /// keeps its newest [`checkpoint::REPLIES_PER_CALLER`] replies per
    /// caller, which covers every call a caller may still resend only if
    /// the caller's unanswered calls span no more ids than that.
    pub fn within_span(&self, window: usize) -> bool {
        self.outstanding
            .first_key_value()
            .is_none_or(|(&oldest, _)| self.next_rpc_id - oldest < window as u64)
    }

    /// A datagram that reached the caller's port.
    pub fn handle(&mut self, payload: &[u8]) {
        let Ok(header) = BifrostHeader::new_checked(payload) else {
            self.counters.malformed += 1;
            return;
        };
        let Some(body) = checkpoint::without_checkpoint(&header) else {
            self.counters.malformed += 1;
            return;
        };
        let outcome = match header.call_type() {
            CallType::Reply => Ok(body.to_vec()),
            CallType::Exception if header.flags() & CALLEE_FAILED_FLAG != 0 => {
                Err(RpcError::SharedFate(String::from_utf8_lossy(body).into()))
            }
            CallType::Exception if header.flags() & REPLY_LOST_FLAG != 0 => {
                Err(RpcError::ReplyLost(String::from_utf8_lossy(body).into()))
            }
            CallType::Exception if header.flags() & OUTCOME_UNKNOWN_FLAG != 0 => Err(
                RpcError::OutcomeUnknown(String::from_utf8_lossy(body).into()),
            ),
            CallType::Exception => Err(RpcError::Exception(String::from_utf8_lossy(body).into())),
            CallType::Call | CallType::Oneway => {
                self.counters.malformed += 1;
                return;
            }
        };
        match self.outstanding.remove(&header.rpc_id()) {
            Some(_) => self.completed.push_back((header.rpc_id(), outcome)),
            // A reply to a retransmission of an answered call.
            None => self.counters.duplicate_replies += 1,
        }
    }

    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.outstanding
            .values()
            .map(|call| call.sent_at.saturating_add(self.retransmit_after))
            .min()
    }

    pub fn handle_timeout(&mut self, now: Timestamp) {
        let due: Vec<u64> = self
            .outstanding
            .iter()
            .filter(|(_, call)| call.sent_at.saturating_add(self.retransmit_after) <= now)
            .map(|(&rpc_id, _)| rpc_id)
            .collect();
        for rpc_id in due {
            let call = self.outstanding.get_mut(&rpc_id).expect("listed just now");
            if call.attempts >= self.max_attempts {
                let attempts = call.attempts;
                self.outstanding.remove(&rpc_id);
                self.completed
                    .push_back((rpc_id, Err(RpcError::NoAnswer { rpc_id, attempts })));
                continue;
            }
            call.attempts += 1;
            call.sent_at = now;
            self.sends.push_back((call.to, call.payload.clone()));
            self.counters.retransmissions += 1;
        }
    }

    /// A finished call: its RPC id and its result.
    pub fn take_completion(&mut self) -> Option<(u64, Result<Vec<u8>, RpcError>)> {
        self.completed.pop_front()
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CalleeCounters {
    pub executed: u64,
    /// Calls refused because [`MAX_IN_PROGRESS`] were running (the caller
    /// sends them again).
    pub busy: u64,
    /// Replies sent without their checkpoint, and commits not sent, which
    /// did not fit.
    pub checkpoints_too_large: u64,
    /// b1 commits sent.
    pub commits: u64,
    pub duplicates: u64,
    /// Resends of calls answered before a failover whose replies the
    /// checkpoint had no room for: answered with [`RpcError::ReplyLost`],
    /// not run again.
    pub replies_lost: u64,
    /// Calls the checkpoint held that shared the failed node's fate: not
    /// run again on restore (they failed with it).
    pub shared_fate_not_replayed: u64,
    /// Calls of a caller restored from a checkpoint that are older than
    /// the checkpoint covered: answered with [`RpcError::OutcomeUnknown`],
    /// not run.
    pub outcomes_unknown: u64,
    pub stale: u64,
    pub malformed: u64,
    /// Callers forgotten to make room for new ones ([`MAX_CALLERS`]).
    pub callers_forgotten: u64,
    /// ONEWAY calls refused, not run, because the b1 commit had no room
    /// left for them ([`Callee::committing_to`]): the commit never sheds a
    /// ONEWAY call, so none is taken that it could not hold.
    pub oneways_refused: u64,
}

/// Which caller goes first when room is short: the one answered least
/// recently (ties by address and port, so a seed's runs agree).
fn recency(caller: &DatagramEnd, memory: &CallerMemory) -> (u64, [u8; 4], u16) {
    (memory.last_answered, caller.address.0, caller.port)
}

/// What a callee remembers of one caller.
#[derive(Debug, Default)]
struct CallerMemory {
    /// Replies by RPC id, the newest [`REPLIES_KEPT_PER_CALLER`].
    replies: BTreeMap<u64, Vec<u8>>,
    /// Every answered call from this RPC id on is remembered (within
    /// [`REPLIES_KEPT_PER_CALLER`] of the newest): 0, or, for a caller
    /// restored from a checkpoint, the oldest id the checkpoint covered
    /// ([`checkpoint::known_from`]). An older call may
    /// have run before the failure or not; run, a late copy of it ran
    /// again, and dropped, a call that never ran went unanswered for ever.
    /// (The oldest reply kept is no such bound: a lost call can sit below
    /// answered ones.)
    known_from: u64,
    /// The callee's executed count when it last answered this caller: the
    /// least recent is forgotten first.
    last_answered: u64,
}

/// The called side.
pub struct Callee {
    service: Box<dyn Service>,
    callers: HashMap<DatagramEnd, CallerMemory>,
    /// Calls begun and not finished, with the header their reply copies.
    in_progress: HashMap<CallTicket, BifrostRepr>,
    sends: VecDeque<Outgoing>,
    counters: CalleeCounters,
    /// Replies carry a checkpoint (for a Gatekeeper to keep).
    checkpointing: bool,
    /// Checkpoints taken: the next one's sequence follows.
    checkpoints_taken: u64,
    /// Deferred calls received and not yet answered, as their datagrams
    /// came (what a b1 checkpoint carries).
    received: BTreeMap<CallTicket, Vec<u8>>,
    /// Where b1 commits go (the Gatekeeper's control port), if anywhere.
    commit_to: Option<DatagramEnd>,
    /// While `restore` runs again the calls a checkpoint committed: they
    /// were admitted once, and are not judged again.
    replaying: bool,
}

/// The bytes of deferred ONEWAY calls a b1 commit holds at most, their
/// entries' overhead included: half the datagram. The rest is left to the
/// service's state, the callers' reply marks and two-way calls, which
/// [`Callee::fit`] can shrink; ONEWAY calls it never sheds.
const ONEWAY_COMMIT_BYTES: usize = checkpoint::MAX_CHECKPOINT_BYTES / 2;
/// A received call's overhead in a commit, at worst: its RPC id (8) and
/// length (4), and a caller entry of its own (12, and a count of 4).
const RECEIVED_ENTRY_OVERHEAD_BYTES: usize = 8 + 4 + 12 + 4;

impl Callee {
    pub fn new(service: Box<dyn Service>) -> Callee {
        Callee {
            service,
            callers: HashMap::new(),
            in_progress: HashMap::new(),
            sends: VecDeque::new(),
            counters: CalleeCounters::default(),
            checkpointing: false,
            checkpoints_taken: 0,
            received: BTreeMap::new(),
            commit_to: None,
            replaying: false,
        }
    }

    /// A callee whose every reply carries its checkpoint
    /// ([`checkpoint`]), for a Gatekeeper to keep.
    pub fn with_checkpoints(service: Box<dyn Service>) -> Callee {
        Callee {
            checkpointing: true,
            ..Callee::new(service)
        }
    }

    /// The host crashed: the service's own threads stop.
    pub fn crash(&mut self) {
        self.service.crash();
        self.in_progress.clear();
        // The b1 commits in progress died with the host too.
        self.received.clear();
    }

    /// Whether its service serves again after a crash.
    pub fn serves_after_crash(&self) -> bool {
        self.service.serves_after_crash()
    }

    /// With checkpoints, each call deferred to the service also commits a
    /// checkpoint to `gatekeeper` (its control port) as it arrives (b1):
    /// the call received and not yet answered, which a replacement runs
    /// and answers its caller. (A call the service answers at once needs
    /// none: its reply's checkpoint, b2, follows at once.)
    pub fn committing_to(mut self, gatekeeper: DatagramEnd) -> Callee {
        self.commit_to = Some(DatagramEnd {
            port: remora_wire::bifrost::CONTROL_PORT,
            ..gatekeeper
        });
        self
    }

    /// The next checkpoint to send, encoded: its sequence follows the last
    /// sent.
    fn take_checkpoint(&mut self) -> Option<Result<Vec<u8>, checkpoint::CheckpointError>> {
        let mut checkpoint = self.whole_checkpoint()?;
        self.checkpoints_taken += 1;
        checkpoint.sequence = self.checkpoints_taken;
        Some(self.fit(&mut checkpoint))
    }

    /// Commits a b1 checkpoint: what the callee has received and not
    /// answered, now.
    fn commit(&mut self) {
        let Some(to) = self.commit_to else {
            return;
        };
        match self.take_checkpoint() {
            Some(Ok(bytes)) => {
                self.sends
                    .push_back((to, remora_wire::bifrost::emit_commit(&bytes)));
                self.counters.commits += 1;
            }
            Some(Err(_)) => self.counters.checkpoints_too_large += 1,
            None => {}
        }
    }

    /// The checkpoint of what the callee has done, as it would be sent:
    /// the service's state and the newest replies to each caller, shrunk
    /// to one datagram if need be.
    pub fn checkpoint(&self) -> Option<checkpoint::Checkpoint> {
        let mut checkpoint = self.whole_checkpoint()?;
        // Only its shape is wanted here, not its encoding.
        let _ = self.fit(&mut checkpoint);
        Some(checkpoint)
    }

    /// The checkpoint with up to [`checkpoint::REPLIES_PER_CALLER`]
    /// replies for every caller, whatever its size.
    fn whole_checkpoint(&self) -> Option<checkpoint::Checkpoint> {
        let state = self.service.save_state()?;
        let replies = self
            .callers
            .iter()
            .map(|(caller, memory)| {
                let mut newest = memory
                    .replies
                    .iter()
                    .rev()
                    .take(checkpoint::REPLIES_PER_CALLER)
                    .map(|(id, reply)| (*id, reply.clone()))
                    .collect();
                // Marks restored from an older checkpoint that the
                // caller's newer calls have left behind guard nothing.
                checkpoint::leave_out_replies(&mut newest, checkpoint::REPLIES_PER_CALLER);
                (*caller, newest)
            })
            .collect();
        let mut received: BTreeMap<DatagramEnd, BTreeMap<u64, Vec<u8>>> = BTreeMap::new();
        for (ticket, payload) in &self.received {
            received
                .entry(ticket.caller)
                .or_default()
                .insert(ticket.rpc_id, payload.clone());
        }
        Some(checkpoint::Checkpoint {
            sequence: self.checkpoints_taken,
            executed: self.counters.executed,
            state,
            replies,
            received,
        })
    }

    /// Encodes `checkpoint`, shrinking it first while it is past one
    /// datagram: fewer reply bodies per caller (halving down to none; every
    /// answered call within [`checkpoint::MARKED_SPAN`] of the caller's
    /// newest stays, marked answered without its reply, a bit on the
    /// wire), then the callers answered least recently. Dropped whole, as
    /// before, it left the Gatekeeper's older checkpoint, and a failover
    /// rolled the state back under every caller (four callers of a counter,
    /// sixteen calls each, were enough). Replies dropped with their ids
    /// made a resend of those calls run again after a failover.
    /// Only a caller dropped whole loses that guard, which takes about a
    /// hundred callers with no reply kept (fourteen, when a mark took
    /// twelve bytes). Before any caller goes, the two-way calls received
    /// and not answered go (those its replies cover, `known_from` on): a
    /// replacement gets them again without the checkpoint (the Gatekeeper
    /// replays their frames, their callers resend), where a reply guard
    /// dropped lets a call run twice. Kept,
    /// fifty deferred calls filled the datagram, and replies left with
    /// no checkpoint or with their callers' guards dropped. One that fits
    /// is encoded once, as nearly all do.
    fn fit(
        &self,
        checkpoint: &mut checkpoint::Checkpoint,
    ) -> Result<Vec<u8>, checkpoint::CheckpointError> {
        let mut keep = checkpoint::REPLIES_PER_CALLER;
        let mut received_shed = false;
        let mut dropping = None;
        // Each turn sheds the received calls, halves the replies kept or
        // drops a caller: bounded by log2 of the replies plus the callers
        // plus one.
        loop {
            let too_large = match checkpoint.encode() {
                Err(error @ checkpoint::CheckpointError::TooLarge(_)) => error,
                encoded => return encoded,
            };
            // The received calls go first: a replacement gets every one it
            // sheds again (the caller resends it, the Gatekeeper replays
            // it), where a reply body left out is an outcome lost for good
            // (a resend is told `ReplyLost`). Shedding spares the calls
            // below the highest cover the halving may leave (it drops
            // marks far below the newest reply, see `shed_received`).
            if !std::mem::replace(&mut received_shed, true) {
                shed_received(checkpoint);
                continue;
            }
            if keep > 0 {
                keep /= 2;
                for replies in checkpoint.replies.values_mut() {
                    checkpoint::leave_out_replies(replies, keep);
                }
                continue;
            }
            let order = dropping.get_or_insert_with(|| {
                let mut callers: Vec<_> = self.callers.iter().collect();
                callers.sort_unstable_by_key(|&(caller, memory)| recency(caller, memory));
                callers.into_iter().map(|(caller, _)| *caller)
            });
            let Some(caller) = order.next() else {
                return Err(too_large);
            };
            checkpoint.replies.remove(&caller);
        }
    }

    /// Whether a ONEWAY call (its datagram as it came) fits in what the b1
    /// commit keeps for them, [`ONEWAY_COMMIT_BYTES`], were it deferred. A
    /// budget of their own, not the room left in the whole commit: that
    /// room is the state's and the callers' marks' too, so judged on it,
    /// ONEWAY calls filled it to the brim (later growth then dropped
    /// callers' guards), or, with enough callers remembered, were all
    /// refused. A callee that commits nothing holds any, and so does one
    /// replaying what a checkpoint committed.
    fn oneway_fits(&self, payload: &[u8]) -> bool {
        if !(self.checkpointing && self.commit_to.is_some()) || self.replaying {
            return true;
        }
        let held: usize = self
            .received
            .values()
            .filter(|datagram| is_oneway(datagram))
            .map(|datagram| RECEIVED_ENTRY_OVERHEAD_BYTES + datagram.len())
            .sum();
        held + RECEIVED_ENTRY_OVERHEAD_BYTES + payload.len() <= ONEWAY_COMMIT_BYTES
    }

    /// Starts from a checkpoint (a replacement taking over a failed node):
    /// the service's state and the replies it remembers.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<(), checkpoint::CheckpointError> {
        let checkpoint = checkpoint::Checkpoint::decode(bytes)?;
        self.service
            .restore_state(&checkpoint.state)
            .map_err(checkpoint::CheckpointError::Service)?;
        let known_from: Vec<(DatagramEnd, u64)> = checkpoint
            .replies
            .iter()
            .map(|(caller, replies)| (*caller, checkpoint::known_from(replies)))
            .collect();
        self.callers = checkpoint
            .replies
            .into_iter()
            .map(|(caller, replies)| {
                let memory = CallerMemory {
                    replies,
                    ..CallerMemory::default()
                };
                (caller, memory)
            })
            .collect();
        self.in_progress.clear();
        self.received.clear();
        self.counters.executed = checkpoint.executed;
        self.checkpoints_taken = checkpoint.sequence;
        // The calls the failed node had received and not answered (b1) run
        // here now, and their callers hear from the replacement; copies
        // that come later are duplicates. They run before the bound below
        // is set: the checkpoint proves they never finished, however old.
        self.replaying = true;
        for (caller, calls) in checkpoint.received {
            for payload in calls.into_values() {
                // A call that shared the failed node's fate failed with it:
                // the Gatekeeper told its caller so. Run here, it took
                // effect after that answer.
                let shared_fate = BifrostHeader::new_checked(&payload[..])
                    .is_ok_and(|header| header.flags() & SHARE_FATE_FLAG != 0);
                if shared_fate {
                    self.counters.shared_fate_not_replayed += 1;
                    continue;
                }
                self.handle(caller, &payload);
            }
        }
        self.replaying = false;
        for (caller, known_from) in known_from {
            if let Some(memory) = self.callers.get_mut(&caller) {
                memory.known_from = known_from;
            }
        }
        Ok(())
    }

    /// Calls begun and not yet finished.
    pub fn in_progress(&self) -> usize {
        self.in_progress.len()
    }

    pub fn counters(&self) -> CalleeCounters {
        self.counters
    }

    pub fn service_mut(&mut self) -> &mut dyn Service {
        self.service.as_mut()
    }

    /// A call that reached the callee's port.
    pub fn handle(&mut self, from: DatagramEnd, payload: &[u8]) {
        let Ok(header) = BifrostHeader::new_checked(payload) else {
            self.counters.malformed += 1;
            return;
        };
        let oneway = header.call_type() == CallType::Oneway;
        if !oneway && header.call_type() != CallType::Call {
            self.counters.malformed += 1;
            return;
        }
        let rpc_id = header.rpc_id();
        // Looked up, not made: a caller is remembered once a call of its
        // ran (in `finish`). Made here, every refused or malformed call
        // from a new port would hold a place for ever, in the table and
        // in every checkpoint.
        let memory = self.callers.get(&from);
        if let Some(reply) = memory.and_then(|memory| memory.replies.get(&rpc_id)) {
            // Run once: a duplicate gets the same answer again.
            self.counters.duplicates += 1;
            if checkpoint::is_answered_without_reply(reply) {
                self.counters.replies_lost += 1;
                if !oneway {
                    let message =
                        "ran before its callee failed; its reply did not fit the checkpoint";
                    self.send_refusal(from, &header, REPLY_LOST_FLAG, message);
                }
            } else if !oneway {
                let reply = reply.clone();
                self.send_reply(from, reply);
            }
            return;
        }
        let newest = memory
            .and_then(|memory| memory.replies.last_key_value())
            .map_or(0, |(&id, _)| id);
        if rpc_id.saturating_add(REPLIES_KEPT_PER_CALLER) <= newest {
            // Older than any call a caller keeps out: long answered.
            self.counters.stale += 1;
            return;
        }
        if memory.is_some_and(|memory| rpc_id < memory.known_from) {
            self.counters.outcomes_unknown += 1;
            if !oneway {
                let message = "is older than the checkpoint its callee's replacement started from";
                self.send_refusal(from, &header, OUTCOME_UNKNOWN_FLAG, message);
            }
            return;
        }
        let ticket = CallTicket {
            caller: from,
            rpc_id,
        };
        if self.in_progress.contains_key(&ticket) {
            // Still running: the reply goes out when it finishes.
            self.counters.duplicates += 1;
            return;
        }
        if self.in_progress.len() >= MAX_IN_PROGRESS {
            self.counters.busy += 1;
            return;
        }
        let repr = BifrostRepr {
            flags: header.flags() & !checkpoint::CHECKPOINT_FLAG,
            ..BifrostRepr::parse(&header)
        };
        let Some(arguments) = checkpoint::without_checkpoint(&header) else {
            self.counters.malformed += 1;
            return;
        };
        if oneway && !self.oneway_fits(payload) {
            // Before it runs: begun, it cannot be taken back. Taken, it
            // sat in the commit for good (never shed), failed every commit
            // and reply checkpoint after it, and was lost with the node.
            // A ONEWAY is answered by nobody: it is counted.
            self.counters.oneways_refused += 1;
            return;
        }
        match self.service.begin(
            ticket,
            header.method_name(),
            header.global_address(),
            arguments,
        ) {
            Some(outcome) => self.finish(ticket, repr, outcome),
            None => {
                self.in_progress.insert(ticket, repr);
                if self.checkpointing && self.commit_to.is_some() {
                    self.received.insert(ticket, payload.to_vec());
                    self.commit();
                }
            }
        }
    }

    /// Takes the outcomes of deferred calls that have finished and
    /// queues their replies; whether any finished.
    pub fn poll_service(&mut self) -> bool {
        let mut finished = false;
        // Bounded: at most the calls in progress can finish.
        for _ in 0..=self.in_progress.len() {
            let Some((ticket, outcome)) = self.service.poll_finished() else {
                break;
            };
            if let Some(repr) = self.in_progress.remove(&ticket) {
                self.finish(ticket, repr, outcome);
                finished = true;
            }
        }
        finished
    }

    /// Remembers a call's outcome and answers it (ONEWAY: executed once,
    /// never answered).
    fn finish(&mut self, ticket: CallTicket, call: BifrostRepr, outcome: Outcome) {
        self.counters.executed += 1;
        self.received.remove(&ticket);
        let (call_type, body, returned, flag) = match outcome {
            Ok(answer) => (CallType::Reply, answer.body, answer.pointer, 0),
            Err(refusal) => (
                CallType::Exception,
                refusal.message.into_bytes(),
                None,
                refusal.flag,
            ),
        };
        let oneway = call.call_type == CallType::Oneway;
        // The reply's header is the call's, method name bytes and all
        // (they need not be UTF-8), with the answer's type and the pointer
        // it returns, if any.
        let repr = BifrostRepr {
            call_type,
            global_address: returned.unwrap_or(call.global_address),
            flags: call.flags | flag,
            ..call
        };
        let reply = encode(&repr, &body);
        if !self.callers.contains_key(&ticket.caller) && self.callers.len() >= MAX_CALLERS {
            self.forget_least_recent_caller();
        }
        let executed = self.counters.executed;
        let memory = self.callers.entry(ticket.caller).or_default();
        memory.last_answered = executed;
        memory.replies.insert(ticket.rpc_id, reply.clone());
        while memory.replies.len() as u64 > REPLIES_KEPT_PER_CALLER {
            memory.replies.pop_first();
        }
        if !oneway {
            self.send_reply(ticket.caller, reply);
        }
    }

    /// Answers a resent call that ran before a failover and whose reply
    /// the checkpoint this callee started from had no room for.
    /// Answers `call` with an EXCEPTION flagged `flag` that says "call N
    /// `what`", without running it.
    fn send_refusal<T: AsRef<[u8]>>(
        &mut self,
        to: DatagramEnd,
        call: &BifrostHeader<T>,
        flag: u16,
        what: &str,
    ) {
        self.send_reply(to, exception(call, flag, what));
    }

    /// Makes room for a new caller: the one answered least recently goes.
    fn forget_least_recent_caller(&mut self) {
        let least_recent = self
            .callers
            .iter()
            .min_by_key(|&(caller, memory)| recency(caller, memory))
            .map(|(caller, _)| *caller);
        if let Some(caller) = least_recent {
            self.callers.remove(&caller);
            self.counters.callers_forgotten += 1;
        }
        debug_assert!(self.callers.len() < MAX_CALLERS);
    }

    /// Sends a reply; with checkpoints on, it carries the callee's state
    /// as of now (b2). Every reply does, a duplicate's too, so that no
    /// caller holds an answer the Gatekeeper's checkpoint does not cover.
    /// Kept replies stay plain.
    fn send_reply(&mut self, to: DatagramEnd, reply: Vec<u8>) {
        let checkpoint = if self.checkpointing {
            self.take_checkpoint()
        } else {
            None
        };
        let reply = match checkpoint {
            Some(Ok(bytes)) => match BifrostHeader::new_checked(&reply[..]) {
                Ok(header) => {
                    let flagged = BifrostRepr {
                        flags: header.flags() | checkpoint::CHECKPOINT_FLAG,
                        ..BifrostRepr::parse(&header)
                    };
                    encode(&flagged, &checkpoint::join_reply(header.payload(), &bytes))
                }
                Err(_) => reply,
            },
            // Too large for a datagram even shrunk (the service's state
            // alone past it): no checkpoint can cover the answer, and a
            // failover would restore an older state under it (a resend
            // then ran the call again on the replacement). The caller is
            // told the outcome is unknown rather than handed an answer
            // the Gatekeeper cannot keep. Counted.
            Some(Err(error)) => {
                self.counters.checkpoints_too_large += 1;
                match BifrostHeader::new_checked(&reply[..]) {
                    Ok(header) => exception(
                        &header,
                        OUTCOME_UNKNOWN_FLAG,
                        &format!(
                            "ran, but no checkpoint can cover it ({error}): a failover would undo it"
                        ),
                    ),
                    Err(_) => reply,
                }
            }
            None => reply,
        };
        self.sends.push_back((to, reply));
    }

    pub fn poll_transmit(&mut self) -> Option<Outgoing> {
        self.sends.pop_front()
    }
}

/// An EXCEPTION flagged `flag` answering the call `header` names (a call,
/// or the reply to one), saying "call N `what`". A checkpoint's flag does
/// not carry over: the exception has none.
fn exception<T: AsRef<[u8]>>(header: &BifrostHeader<T>, flag: u16, what: &str) -> Vec<u8> {
    let repr = BifrostRepr {
        call_type: CallType::Exception,
        flags: (header.flags() & !checkpoint::CHECKPOINT_FLAG) | flag,
        ..BifrostRepr::parse(header)
    };
    let message = format!("call {} {what}", header.rpc_id());
    encode(&repr, message.as_bytes())
}

/// The callee's address for a host: its IPv4 address on Bifröst's port,
/// reached through the switch's router MAC.
pub fn callee_at(
    router: remora_wire::MacAddress,
    address: remora_wire::Ipv4Address,
) -> DatagramEnd {
    DatagramEnd {
        mac: router,
        address,
        port: BIFROST_PORT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Answer;

    impl Service for Answer {
        fn call(&mut self, _method: &[u8], _pointer: GlobalAddress, _arguments: &[u8]) -> Outcome {
            Ok(b"ok".to_vec().into())
        }
    }

    /// The one caller host of these tests, calling from `port`.
    fn caller_on(port: u16) -> DatagramEnd {
        DatagramEnd {
            mac: remora_wire::MacAddress([2, 0, 0, 0, 0, 1]),
            address: remora_wire::Ipv4Address::new(10, 0, 0, 1),
            port,
        }
    }

    /// A method name is 16 bytes off the wire, not a string: bytes that
    /// are not UTF-8 come back in the reply as they were, and once.
    /// Calls that are refused before they run (here: flagged as carrying a
    /// checkpoint but too short to hold one) leave nothing behind, so a
    /// sender cycling through source ports fills neither the caller table
    /// nor the checkpoint, and a real caller is still served.
    #[test]
    fn refused_calls_from_many_ports_leave_no_caller_behind() {
        let junk = BifrostRepr {
            flags: checkpoint::CHECKPOINT_FLAG,
            ..BifrostRepr::new(CallType::Call, "", 1, GlobalAddress::NULL).unwrap()
        };
        let mut callee = Callee::new(Box::new(Answer));
        let junk_senders = MAX_CALLERS as u16 + 100;
        for port in 0..junk_senders {
            callee.handle(caller_on(port), &encode(&junk, b""));
        }
        assert_eq!(callee.counters().malformed, u64::from(junk_senders));
        assert!(callee.callers.is_empty());
        let call = BifrostRepr::new(CallType::Call, "", 2, GlobalAddress::NULL).unwrap();
        callee.handle(caller_on(60000), &encode(&call, b""));
        assert_eq!(callee.counters().callers_forgotten, 0);
        let (to, reply) = callee.poll_transmit().expect("the real caller is answered");
        assert_eq!(to, caller_on(60000));
        assert_eq!(
            BifrostHeader::new_checked(&reply[..]).unwrap().payload(),
            b"ok"
        );
        assert_eq!(callee.callers.len(), 1);
    }

    /// A service whose state grows past one datagram.
    struct Hoard(Vec<u8>);

    impl Service for Hoard {
        fn call(&mut self, _: &[u8], _: GlobalAddress, arguments: &[u8]) -> Outcome {
            self.0.extend_from_slice(arguments);
            Ok(b"kept".to_vec().into())
        }

        fn save_state(&self) -> Option<Vec<u8>> {
            Some(self.0.clone())
        }

        fn restore_state(&mut self, state: &[u8]) -> Result<(), String> {
            self.0 = state.to_vec();
            Ok(())
        }
    }

    /// Once a service's state alone was past a datagram, its replies went
    /// out bare while the Gatekeeper kept the last checkpoint that fitted:
    /// a failover restored that older state under every answer since,
    /// and a resend of one of those calls ran again on the replacement.
    /// Such a reply is now an outcome-unknown exception.
    #[test]
    fn an_answer_no_checkpoint_can_cover_is_an_unknown_outcome() {
        let mut callee = Callee::with_checkpoints(Box::new(Hoard(Vec::new())));
        let mut answers = Vec::new();
        for rpc_id in 1..=4u64 {
            let call =
                BifrostRepr::new(CallType::Call, "keep", rpc_id, GlobalAddress::NULL).unwrap();
            callee.handle(caller_on(1), &encode(&call, &[7; 1200]));
            let reply = callee.poll_transmit().expect("answered").1;
            let header = BifrostHeader::new_checked(&reply[..]).unwrap();
            answers.push((header.call_type(), header.flags()));
        }
        // 1,200 and 2,400 bytes of state fit; 3,600 and 4,800 do not.
        let covered = (CallType::Reply, checkpoint::CHECKPOINT_FLAG);
        assert_eq!(answers[..2], [covered, covered]);
        for (call_type, flags) in &answers[2..] {
            assert_eq!(*call_type, CallType::Exception);
            assert_ne!(flags & OUTCOME_UNKNOWN_FLAG, 0);
            assert_eq!(flags & checkpoint::CHECKPOINT_FLAG, 0);
        }
        assert_eq!(callee.counters().checkpoints_too_large, 2);
    }

    /// A checkpoint keeps replies for every caller; past one datagram it
    /// was dropped whole, and replies went out bare from then on (four
    /// callers of a counter, sixteen calls each, were enough), so the
    /// Gatekeeper kept an old state for a failover to roll back to. It is
    /// shrunk to fit now, and carries the newest state.
    #[test]
    fn a_checkpoint_past_a_datagram_is_shrunk_to_fit_not_dropped() {
        let mut callee = Callee::with_checkpoints(Box::new(super::scenario::Counter(0)));
        let mut last_reply = Vec::new();
        for rpc_id in 1..=16u64 {
            for port in [1, 2, 3, 4] {
                let call =
                    BifrostRepr::new(CallType::Call, "increment", rpc_id, GlobalAddress::NULL)
                        .unwrap();
                callee.handle(caller_on(port), &encode(&call, b""));
                last_reply = callee.poll_transmit().expect("answered").1;
            }
        }
        assert_eq!(callee.counters().checkpoints_too_large, 0);
        let header = BifrostHeader::new_checked(&last_reply[..]).unwrap();
        assert_ne!(
            header.flags() & checkpoint::CHECKPOINT_FLAG,
            0,
            "the reply carries its checkpoint"
        );
        let kept = callee.checkpoint().unwrap();
        assert!(kept.encode().is_ok());
        assert_eq!(kept.state, 64u64.to_be_bytes().to_vec(), "the newest state");
        assert!(kept
            .replies
            .values()
            .all(|replies| replies.contains_key(&16)));
    }

    /// Shrinking a checkpoint to one datagram halved the replies kept
    /// before it shed the received two-way calls, which a replacement gets
    /// again anyway (resent, or replayed by the Gatekeeper): a caller's
    /// answered call lost its reply body, and its resend was told
    /// `ReplyLost`, while the call that would come again stayed. The
    /// received calls go first now.
    #[test]
    fn a_shrunk_checkpoint_sheds_received_calls_before_reply_bodies() {
        let callee = Callee::with_checkpoints(Box::new(super::scenario::Counter(0)));
        let caller = caller_on(1);
        let replies: BTreeMap<u64, Vec<u8>> = (1..=8u64).map(|id| (id, vec![1; 200])).collect();
        let waiting =
            BifrostRepr::new(CallType::Call, "increment", 9, GlobalAddress::NULL).unwrap();
        let mut checkpoint = checkpoint::Checkpoint {
            state: 0u64.to_be_bytes().to_vec(),
            replies: BTreeMap::from([(caller, replies.clone())]),
            received: BTreeMap::from([(
                caller,
                BTreeMap::from([(9, encode(&waiting, &[2; 1500]))]),
            )]),
            ..checkpoint::Checkpoint::default()
        };
        assert!(checkpoint.encode().is_err(), "too large whole");
        callee.fit(&mut checkpoint).expect("fits");
        assert!(
            checkpoint.received.is_empty(),
            "the call that comes again is shed"
        );
        assert_eq!(
            checkpoint.replies[&caller], replies,
            "every reply body is kept"
        );
    }

    /// Shed before the replies shrink, a received call between the cover
    /// the whole replies give and the one the shrunk replies end with
    /// (marks far below the newest go) was shed and then lay below the
    /// cover: the replacement refused its resend as of unknown outcome,
    /// though it never ran. Such a call is kept; one above every cover
    /// is shed.
    #[test]
    fn a_shrunk_checkpoint_keeps_a_received_call_the_shrinking_may_cover() {
        let callee = Callee::with_checkpoints(Box::new(super::scenario::Counter(0)));
        let caller = caller_on(1);
        let replies: BTreeMap<u64, Vec<u8>> =
            BTreeMap::from([(1, vec![1; 100]), (100, vec![1; 100])]);
        let call = |rpc_id, bytes| {
            let repr =
                BifrostRepr::new(CallType::Call, "increment", rpc_id, GlobalAddress::NULL).unwrap();
            encode(&repr, &vec![2; bytes])
        };
        let mut checkpoint = checkpoint::Checkpoint {
            state: 0u64.to_be_bytes().to_vec(),
            replies: BTreeMap::from([(caller, replies)]),
            received: BTreeMap::from([(
                caller,
                BTreeMap::from([(50, call(50, 1200)), (101, call(101, 2000))]),
            )]),
            ..checkpoint::Checkpoint::default()
        };
        callee.fit(&mut checkpoint).expect("fits");
        let kept: Vec<u64> = checkpoint.received[&caller].keys().copied().collect();
        assert_eq!(kept, [50], "call 50 stays, call 101 is shed");
    }

    /// A Counter service's "increment" call with RPC id `rpc_id`.
    fn increment_call(rpc_id: u64) -> Vec<u8> {
        let repr =
            BifrostRepr::new(CallType::Call, "increment", rpc_id, GlobalAddress::NULL).unwrap();
        encode(&repr, b"")
    }

    /// A callee that answered `calls` (caller port, RPC id) in order and
    /// failed, and its replacement, restored from the checkpoint on the
    /// last reply.
    fn counter_replacement_after(calls: impl IntoIterator<Item = (u16, u64)>) -> Callee {
        let mut failed = Callee::with_checkpoints(Box::new(super::scenario::Counter(0)));
        let mut last_reply = Vec::new();
        for (port, rpc_id) in calls {
            failed.handle(caller_on(port), &increment_call(rpc_id));
            last_reply = failed.poll_transmit().expect("answered").1;
        }
        let header = BifrostHeader::new_checked(&last_reply[..]).unwrap();
        let (_, kept) = checkpoint::split_reply(header.payload()).expect("a checkpoint");
        let mut replacement = Callee::with_checkpoints(Box::new(super::scenario::Counter(0)));
        replacement.restore(kept).unwrap();
        replacement
    }

    /// A checkpoint shrunk to one datagram dropped the older replies with
    /// their ids. A replacement started from it took a resend of such a
    /// call (its reply lost with the failed node) for a new call and ran
    /// it again: a counter counted one call twice. The id stays now, and
    /// the resend is told its reply is lost.
    #[test]
    fn a_resend_of_a_call_whose_reply_a_shrunk_checkpoint_left_out_is_not_run_again() {
        let calls = (1..=16u64).flat_map(|rpc_id| [1, 2, 3, 4].map(|port| (port, rpc_id)));
        let mut replacement = counter_replacement_after(calls);
        let call = increment_call;
        let before = replacement.checkpoint().unwrap().state;
        assert_eq!(before, 64u64.to_be_bytes().to_vec());

        replacement.handle(caller_on(1), &call(3));

        let answer = replacement.poll_transmit().expect("answered").1;
        let mut caller = Caller::new(Duration::from_millis(1), 3);
        let header = BifrostHeader::new_checked(&answer[..]).unwrap();
        assert_eq!(header.call_type(), CallType::Exception);
        assert_ne!(header.flags() & REPLY_LOST_FLAG, 0);
        assert_eq!(
            replacement.checkpoint().unwrap().state,
            before,
            "the call did not run again"
        );
        assert_eq!(replacement.counters().replies_lost, 1);
        // The caller hears it as a lost reply, not as the service's error.
        let rpc_id = caller
            .call(
                Timestamp::ZERO,
                caller_on(0),
                "increment",
                GlobalAddress::NULL,
                b"",
            )
            .unwrap();
        let lost = BifrostRepr {
            rpc_id,
            ..BifrostRepr::parse(&header)
        };
        caller.handle(&encode(&lost, header.payload()));
        assert!(matches!(
            caller.take_completion(),
            Some((id, Err(RpcError::ReplyLost(_)))) if id == rpc_id
        ));
    }

    /// A mark of an answered call took twelve bytes in a checkpoint, so
    /// one datagram held fourteen callers' marks and dropped the rest
    /// whole. A replacement started from it ran a resend from a dropped
    /// caller again (forty callers of a counter were enough). A mark is a
    /// bit now, and a hundred callers fit.
    #[test]
    fn a_resend_from_one_of_a_hundred_callers_is_not_run_again_after_a_failover() {
        const CALLERS: u16 = 100;
        let calls = (1..=16u64).flat_map(|rpc_id| (1..=CALLERS).map(move |port| (port, rpc_id)));
        let mut replacement = counter_replacement_after(calls);
        let kept = replacement.checkpoint().unwrap();
        assert_eq!(
            kept.replies.len(),
            usize::from(CALLERS),
            "no caller dropped"
        );
        let before = kept.state;
        assert_eq!(before, (16 * u64::from(CALLERS)).to_be_bytes().to_vec());

        for port in [1, CALLERS / 2, CALLERS] {
            replacement.handle(caller_on(port), &increment_call(16));
            assert_refused_with(&mut replacement, REPLY_LOST_FLAG);
        }
        assert_eq!(
            replacement.checkpoint().unwrap().state,
            before,
            "no call ran again"
        );
        // The callers' next calls run.
        replacement.handle(caller_on(1), &increment_call(17));
        assert!(replacement.poll_transmit().is_some());
        let after = replacement.checkpoint().unwrap().state;
        assert_eq!(after, (16 * u64::from(CALLERS) + 1).to_be_bytes().to_vec());
    }

    /// A callee remembers 1024 replies per caller, a checkpoint 16. A
    /// replacement started from one took a late copy of a call older than
    /// the 16 (but within the 1024) for a new call and ran it again.
    #[test]
    fn a_late_copy_of_a_call_older_than_a_checkpoints_replies_is_not_run_again() {
        let mut replacement = counter_replacement_after((1..=40u64).map(|rpc_id| (1, rpc_id)));
        let call = increment_call;
        let before = replacement.checkpoint().unwrap().state;
        assert_eq!(before, 40u64.to_be_bytes().to_vec());

        replacement.handle(caller_on(1), &call(10));

        assert_refused_with(&mut replacement, OUTCOME_UNKNOWN_FLAG);
        assert_eq!(
            replacement.checkpoint().unwrap().state,
            before,
            "it did not run again"
        );
        assert_eq!(replacement.counters().outcomes_unknown, 1);
        // The next new call still runs.
        replacement.handle(caller_on(1), &call(41));
        assert!(replacement.poll_transmit().is_some());
        assert_eq!(
            replacement.checkpoint().unwrap().state,
            41u64.to_be_bytes().to_vec()
        );
    }

    /// The next datagram `callee` sends is an EXCEPTION flagged `flag`.
    fn assert_refused_with(callee: &mut Callee, flag: u16) {
        let answer = callee.poll_transmit().expect("answered").1;
        let header = BifrostHeader::new_checked(&answer[..]).unwrap();
        assert_eq!(header.call_type(), CallType::Exception);
        assert_ne!(header.flags() & flag, 0, "flags {:#x}", header.flags());
    }

    /// A caller may keep up to 1024 calls out, and a checkpoint covers
    /// its calls from the oldest reply it kept (or 16 ids below the
    /// newest, if lower). A resend of an older call, which may or may not
    /// have run, went unanswered for ever after a failover (a raw `Caller`
    /// with forty calls out waited them all out). It is told now that its
    /// outcome is unknown; it is not run. A call within the cover that the
    /// checkpoint shows never ran, runs.
    #[test]
    fn a_call_older_than_a_checkpoint_covers_is_answered_outcome_unknown() {
        let answered = (20..=40u64).filter(|rpc_id| rpc_id % 2 == 0);
        let mut replacement = counter_replacement_after(answered.map(|rpc_id| (1, rpc_id)));
        let before = replacement.checkpoint().unwrap().state;
        assert_eq!(before, 11u64.to_be_bytes().to_vec());

        // Below 20, the oldest reply kept: the replacement cannot know.
        replacement.handle(caller_on(1), &increment_call(3));
        assert_refused_with(&mut replacement, OUTCOME_UNKNOWN_FLAG);
        let caller = Caller::new(Duration::from_millis(1), 3);
        let outcome = answer_to_a_fresh_call(caller, &mut replacement, 19);
        assert!(
            matches!(outcome, Some(Err(RpcError::OutcomeUnknown(_)))),
            "{outcome:?}"
        );
        // 24 ran, and its reply is kept.
        let caller = Caller::new(Duration::from_millis(1), 3);
        let outcome = answer_to_a_fresh_call(caller, &mut replacement, 24);
        assert_eq!(
            outcome,
            Some(Ok(3u64.to_be_bytes().to_vec())),
            "answered from memory"
        );
        assert_eq!(
            replacement.checkpoint().unwrap().state,
            before,
            "nothing ran"
        );

        // 23 sits between kept replies: the checkpoint shows it never ran.
        let caller = Caller::new(Duration::from_millis(1), 3);
        let outcome = answer_to_a_fresh_call(caller, &mut replacement, 23);
        assert_eq!(outcome, Some(Ok(12u64.to_be_bytes().to_vec())), "it ran");
        assert_eq!(replacement.counters().outcomes_unknown, 2);
    }

    /// A call the checkpoint holds as received and not answered (b1) is
    /// replayed at the restore, however far below the caller's answered
    /// calls it sits: the checkpoint proves it never finished. The bound
    /// for older calls was set before the replay, and refused it.
    #[test]
    fn a_received_call_below_the_cover_runs_at_the_restore() {
        let caller = caller_on(1);
        let replies = (6..=25u64).map(|rpc_id| (rpc_id, b"answered".to_vec()));
        let checkpoint = checkpoint::Checkpoint {
            sequence: 1,
            executed: 20,
            state: 20u64.to_be_bytes().to_vec(),
            replies: BTreeMap::from([(caller, replies.collect())]),
            received: BTreeMap::from([(caller, BTreeMap::from([(5, increment_call(5))]))]),
        };
        let mut replacement = Callee::with_checkpoints(Box::new(super::scenario::Counter(0)));
        replacement.restore(&checkpoint.encode().unwrap()).unwrap();

        assert_eq!(replacement.counters().outcomes_unknown, 0);
        assert_eq!(
            replacement.checkpoint().unwrap().state,
            21u64.to_be_bytes().to_vec(),
            "the received call ran"
        );
        // An older call the checkpoint does not hold is still refused.
        replacement.poll_transmit();
        replacement.handle(caller, &increment_call(4));
        assert_refused_with(&mut replacement, OUTCOME_UNKNOWN_FLAG);
    }

    /// Sends `rpc_id` as a fresh call from `caller` (port 1) to `callee`,
    /// and hands the callee's answer back to the caller: the outcome the
    /// caller then takes.
    fn answer_to_a_fresh_call(
        mut caller: Caller,
        callee: &mut Callee,
        rpc_id: u64,
    ) -> Option<Result<Vec<u8>, RpcError>> {
        caller
            .call_as(
                Timestamp::ZERO,
                rpc_id,
                caller_on(0),
                "increment",
                GlobalAddress::NULL,
                b"",
            )
            .unwrap();
        let (_, call) = caller.poll_transmit().expect("sent");
        callee.handle(caller_on(1), &call);
        let (_, answer) = callee.poll_transmit().expect("answered");
        caller.handle(&answer);
        caller.take_completion().map(|(id, outcome)| {
            assert_eq!(id, rpc_id);
            outcome
        })
    }

    /// The replacement's bound on stale copies is the caller's span, not
    /// the oldest reply its checkpoint kept: a call lost on its way (1,
    /// below the answered 2 to 16) never ran, and its resend must run.
    #[test]
    fn a_resent_call_below_the_replies_a_checkpoint_kept_runs_if_it_never_ran() {
        let mut replacement = counter_replacement_after((2..=16u64).map(|rpc_id| (1, rpc_id)));

        replacement.handle(caller_on(1), &increment_call(1));

        assert!(
            replacement.poll_transmit().is_some(),
            "the lost call is answered"
        );
        assert_eq!(
            replacement.checkpoint().unwrap().state,
            16u64.to_be_bytes().to_vec(),
            "the lost call ran, once"
        );
        assert_eq!(replacement.counters().stale, 0);
    }

    /// A callee never forgot a caller: after 1024 callers (clients that
    /// restarted on new ports, say) it refused every new one for good. The
    /// caller answered least recently makes room now, and the newest are
    /// still answered exactly once.
    #[test]
    fn a_callee_with_every_caller_place_taken_forgets_the_least_recent() {
        let call = BifrostRepr::new(CallType::Call, "", 1, GlobalAddress::NULL).unwrap();
        let mut callee = Callee::new(Box::new(Answer));
        let callers = MAX_CALLERS as u16 + 10;
        for port in 0..callers {
            callee.handle(caller_on(port), &encode(&call, b""));
            assert!(
                callee.poll_transmit().is_some(),
                "caller {port} is answered"
            );
        }
        assert_eq!(callee.counters().executed, u64::from(callers));
        assert_eq!(callee.counters().callers_forgotten, 10);
        assert_eq!(callee.callers.len(), MAX_CALLERS);
        assert!(
            !callee.callers.contains_key(&caller_on(0)),
            "the least recent went"
        );
        // The newest caller's resend is still a duplicate, not a second run.
        callee.handle(caller_on(callers - 1), &encode(&call, b""));
        assert_eq!(callee.counters().executed, u64::from(callers));
        assert_eq!(callee.counters().duplicates, 1);
    }

    /// A service that defers every call and finishes none, as a stalled
    /// worker pool would: its calls stay received and not answered.
    struct Stalled;

    impl Service for Stalled {
        fn call(&mut self, _: &[u8], _: GlobalAddress, _: &[u8]) -> Outcome {
            Err("a stalled service answers through begin".into())
        }

        fn begin(
            &mut self,
            _: CallTicket,
            _: &[u8],
            _: GlobalAddress,
            _: &[u8],
        ) -> Option<Outcome> {
            None
        }

        fn save_state(&self) -> Option<Vec<u8>> {
            Some(0u64.to_be_bytes().to_vec())
        }

        fn restore_state(&mut self, _: &[u8]) -> Result<(), String> {
            Ok(())
        }
    }

    /// The b1 commit sheds two-way calls received, never ONEWAY ones
    /// (nobody sends them again), and nothing bounded those as they came:
    /// some fifty deferred ONEWAY calls filled the datagram, and every
    /// commit after failed (counted `checkpoints_too_large`), replies' too,
    /// so a failover lost the ONEWAY calls and rolled back under callers
    /// answered since. One the commit cannot hold is refused before it
    /// runs now, and counted; a two-way call still comes in (the commit
    /// sheds it).
    #[test]
    fn oneway_calls_the_commit_cannot_hold_are_refused_and_counted() {
        let mut callee = Callee::with_checkpoints(Box::new(Stalled)).committing_to(caller_on(9));
        const SENT: u64 = 64;
        for rpc_id in 1..=SENT {
            let call =
                BifrostRepr::new(CallType::Oneway, "log", rpc_id, GlobalAddress::NULL).unwrap();
            callee.handle(caller_on(1), &encode(&call, b""));
        }
        let call = BifrostRepr::new(CallType::Call, "log", 1, GlobalAddress::NULL).unwrap();
        callee.handle(caller_on(2), &encode(&call, b""));

        let mut last_commit = None;
        while let Some((to, datagram)) = callee.poll_transmit() {
            assert_eq!(to.port, remora_wire::bifrost::CONTROL_PORT, "only commits");
            let commit = remora_wire::bifrost::parse_commit(&datagram).expect("a commit");
            last_commit = Some(commit.to_vec());
        }
        let counters = callee.counters();
        assert_eq!(counters.checkpoints_too_large, 0, "a commit did not fit");
        let oneways_taken = callee.in_progress() as u64 - 1;
        assert!(counters.oneways_refused > 0, "{counters:?}");
        assert_eq!(
            oneways_taken + counters.oneways_refused,
            SENT,
            "each ONEWAY call taken or counted"
        );
        assert_eq!(
            counters.commits,
            oneways_taken + 1,
            "each call taken committed"
        );
        let kept = checkpoint::Checkpoint::decode(&last_commit.expect("commits")).unwrap();
        assert_eq!(
            kept.received[&caller_on(1)].len() as u64,
            oneways_taken,
            "the last commit holds every ONEWAY call taken"
        );
    }

    /// A call that shares its callee's fate and was received, not answered,
    /// when the callee failed: the Gatekeeper answered its caller that it
    /// failed with the callee, and the replacement's restore ran it anyway
    /// (it took effect after its caller was told it had failed). Only the
    /// other call runs now.
    #[test]
    fn a_restore_does_not_run_a_call_that_shared_the_failed_nodes_fate() {
        let mut callee = Callee::with_checkpoints(Box::new(Stalled)).committing_to(caller_on(9));
        let mut fated = BifrostRepr::new(CallType::Call, "bump", 1, GlobalAddress::NULL).unwrap();
        fated.flags |= SHARE_FATE_FLAG;
        callee.handle(caller_on(1), &encode(&fated, b""));
        let plain = BifrostRepr::new(CallType::Call, "bump", 1, GlobalAddress::NULL).unwrap();
        callee.handle(caller_on(2), &encode(&plain, b""));
        let checkpoint = callee.checkpoint().expect("a checkpointing callee");
        assert_eq!(checkpoint.received.len(), 2, "both calls were received");
        let mut replacement = Callee::with_checkpoints(Box::new(super::scenario::Counter(0)));
        replacement.restore(&checkpoint.encode().unwrap()).unwrap();
        let mut answered = Vec::new();
        while let Some((to, _)) = replacement.poll_transmit() {
            answered.push(to);
        }
        assert_eq!(answered, [caller_on(2)], "only the plain call ran");
        assert_eq!(replacement.counters().shared_fate_not_replayed, 1);
    }

    /// Answers method "now" at once, and defers every other call for good.
    struct NowOrNever;

    impl Service for NowOrNever {
        fn call(&mut self, _: &[u8], _: GlobalAddress, _: &[u8]) -> Outcome {
            Ok(b"ok".to_vec().into())
        }

        fn begin(
            &mut self,
            _: CallTicket,
            method: &[u8],
            _: GlobalAddress,
            _: &[u8],
        ) -> Option<Outcome> {
            (method == b"now").then(|| Ok(b"ok".to_vec().into()))
        }

        fn save_state(&self) -> Option<Vec<u8>> {
            Some(0u64.to_be_bytes().to_vec())
        }
    }

    /// ONEWAY calls were judged on the room left in the whole commit, the
    /// callers' reply marks included: with some 115 callers remembered
    /// (26 bytes each, marks only) no commit had room, and every ONEWAY
    /// call was refused. They have a budget of their own now.
    #[test]
    fn many_callers_remembered_do_not_shut_out_oneway_calls() {
        let mut callee = Callee::with_checkpoints(Box::new(NowOrNever)).committing_to(caller_on(9));
        for port in 1000..1150 {
            let call = BifrostRepr::new(CallType::Call, "now", 1, GlobalAddress::NULL).unwrap();
            callee.handle(caller_on(port), &encode(&call, b""));
        }
        while callee.poll_transmit().is_some() {}
        let call = BifrostRepr::new(CallType::Oneway, "log", 1, GlobalAddress::NULL).unwrap();
        callee.handle(caller_on(1), &encode(&call, b""));
        let counters = callee.counters();
        assert_eq!(counters.oneways_refused, 0, "{counters:?}");
        assert_eq!(callee.in_progress(), 1, "the ONEWAY call was taken");
    }

    /// A replacement runs again the ONEWAY calls the failed node's last
    /// commit held, every one: they were admitted once.
    #[test]
    fn a_restore_runs_every_oneway_call_the_commit_held() {
        let mut callee = Callee::with_checkpoints(Box::new(Stalled)).committing_to(caller_on(9));
        for rpc_id in 1..=64 {
            let call =
                BifrostRepr::new(CallType::Oneway, "log", rpc_id, GlobalAddress::NULL).unwrap();
            callee.handle(caller_on(1), &encode(&call, b""));
        }
        let mut last_commit = None;
        while let Some((_, datagram)) = callee.poll_transmit() {
            let commit = remora_wire::bifrost::parse_commit(&datagram).expect("a commit");
            last_commit = Some(commit.to_vec());
        }
        let taken = callee.in_progress();
        let mut replacement =
            Callee::with_checkpoints(Box::new(Stalled)).committing_to(caller_on(9));
        replacement
            .restore(&last_commit.expect("commits"))
            .expect("the commit restores");
        assert_eq!(replacement.in_progress(), taken);
        assert_eq!(replacement.counters().oneways_refused, 0);
    }

    #[test]
    fn a_method_name_that_is_not_utf8_is_answered_with_the_same_bytes() {
        let call = BifrostRepr {
            method_name: [0xff; 16],
            method_name_len: 16,
            ..BifrostRepr::new(CallType::Call, "", 7, GlobalAddress::NULL).unwrap()
        };
        let caller = caller_on(40000);
        let mut callee = Callee::new(Box::new(Answer));
        let payload = encode(&call, b"");
        callee.handle(caller, &payload);
        callee.handle(caller, &payload);
        let (to, reply) = callee.poll_transmit().expect("a reply");
        let header = BifrostHeader::new_checked(&reply[..]).unwrap();
        assert_eq!(
            (to, header.call_type(), header.method_name()),
            (caller, CallType::Reply, &[0xff; 16][..])
        );
        assert_eq!(header.payload(), b"ok");
        assert_eq!(
            (callee.counters().executed, callee.counters().duplicates),
            (1, 1)
        );
    }
}
