//! TIGA's NDP path on the embedded rack: real frames from a compute node
//! (CN) to the NDP engine on the data node's (DN's) SmartNIC, the real
//! stage code on the rack's threads, and the result back.
//!
//! The SmartNIC is an agent on the memory host's device. At its ingress a
//! flow table, one match-action stage built from the switch's pipeline API
//! ([`remora_switch::table::ExactTable`]), maps a flow (TIGA's UDP port and
//! the NDP type flag) to the offload chain an application registered. The
//! engine reads the data from the DN's memory (the emulated local DMA),
//! runs the chain and returns the result; or, one request in
//! `forward_every`, forwards the request with its data to the CN, which
//! runs the CN version and acknowledges it. The CPU-only baseline fetches
//! the raw data instead. Both cores ([`NdpEngine`], [`NdpClient`]) are
//! sans-IO; the agents only move datagrams.
//!
//! Figures come from the virtual-time runs ([`crate::simulation`]); this
//! path shows the design working end to end and checks its results.

use crate::apps::{App, StageError};
use remora_base::Timestamp;
use remora_host::{Agent, AgentError, AgentPort, Progress};
use remora_rnic::Verbs;
use remora_switch::resources::TableResources;
use remora_switch::table::{ExactTable, TableError, TableShape};
use remora_wire::datagram::DatagramEnd;
use remora_wire::tiga::{
    MessageKind, Status, TigaError, TigaHeader, TigaRepr, HEADER_LEN, TIGA_PORT,
};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The largest datagram payload the soft RNIC carries.
pub const MAX_MESSAGE_BYTES: usize = remora_rnic::datagram::MAX_DATAGRAM_PAYLOAD;
/// The largest record the rack serves: its answer, for every app, fits
/// one message with the header (MVS's result is the longest, the record
/// and a few bytes more; a test holds every app to it).
pub const MAX_RECORD_BYTES: usize = MAX_MESSAGE_BYTES - HEADER_LEN - 32;
/// Datagrams taken per turn of an agent.
const DATAGRAMS_PER_TURN: usize = 256;
/// Forwards the engine sends again per turn, at most.
const RESENDS_PER_TURN: usize = 64;
/// A datagram port's inbox.
const INBOX_DEPTH: usize = 1024;
/// Calls a client agent keeps in flight; the rest wait in the channel.
const MAX_OUTSTANDING: usize = 256;
/// How long a call waits for its answer, on the CN's agent and in
/// [`NdpRack::call`]: a lost request or answer frees its slot then.
pub const CALL_DEADLINE: Duration = Duration::from_secs(5);
/// Forwarded requests the engine remembers awaiting their CN's
/// acknowledgement; past it the oldest is forgotten (and counted), so a CN
/// that never acknowledges cannot grow the engine's memory.
pub const MAX_UNACKNOWLEDGED: usize = 4096;
/// The CN's UDP port.
const CLIENT_PORT: u16 = 40_100;
/// How long a datagram waits for its answer before it is sent again: a
/// request for its result, a forwarded request for its acknowledgement.
/// Each resend doubles the wait, up to [`MAX_RESEND_INTERVAL`], until
/// [`CALL_DEADLINE`]. Far above a call's time (tens of microseconds), and
/// above the tens of milliseconds a thread of a loaded two-core machine
/// may wait for a core, so a resend means a lost datagram, not a slow one.
pub const FIRST_RESEND_AFTER: Duration = Duration::from_millis(250);
/// The longest wait between two sends of one datagram.
pub const MAX_RESEND_INTERVAL: Duration = Duration::from_secs(1);

/// When a datagram sent at `sent` after waiting `interval` is due again,
/// and the wait after that.
fn next_resend(sent: Timestamp, interval: Duration) -> (Timestamp, Duration) {
    (
        sent.saturating_add(interval),
        (interval * 2).min(MAX_RESEND_INTERVAL),
    )
}

/// The flow table's shape: one stage, a 24-bit key (port, flag).
const FLOW_TABLE: TableShape = TableShape {
    name: "ndp_flows",
    stage: 0,
    key_bits: 24,
    action_data_bits: 8,
    capacity: 16,
};

/// A flow: TIGA's UDP port and the application's NDP type flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FlowKey {
    udp_port: u16,
    app_flag: u8,
}

/// Answers the engine remembers, newest last, to send again to a CN that
/// asks again. Up to 4 KiB each: at most 4 MiB.
const REMEMBERED_ANSWERS: usize = 1024;

/// The engine's last answers, by (CN, request id): what to send again
/// when a CN asks again, its request or its acknowledgement resent after
/// the answer went. Bounded: the oldest is forgotten first, and a request
/// asked again after that is served anew.
#[derive(Default)]
struct RecentAnswers {
    /// `None`: a forward the CN acknowledged (it has it; nothing to send).
    answers: HashMap<(DatagramEnd, u64), Option<Vec<u8>>>,
    order: VecDeque<(DatagramEnd, u64)>,
}

impl RecentAnswers {
    fn remember(&mut self, key: (DatagramEnd, u64), answer: Option<Vec<u8>>) {
        if self.answers.insert(key, answer).is_none() {
            self.order.push_back(key);
        }
        // Bounded by the one insert above.
        while self.order.len() > REMEMBERED_ANSWERS {
            if let Some(oldest) = self.order.pop_front() {
                self.answers.remove(&oldest);
            }
        }
    }

    fn get(&self, key: &(DatagramEnd, u64)) -> Option<&Option<Vec<u8>>> {
        self.answers.get(key)
    }
}

/// What the engine counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// NDP requests, each once: one asked again is counted in
    /// `asked_again` instead.
    pub requests: u64,
    /// Requests and fetches a CN asked again (its resend, or a duplicated
    /// datagram): answered as the first time, from memory, and counted in
    /// no other count but `forwards_resent`, when their forward goes
    /// again.
    pub asked_again: u64,
    /// Acknowledgements of forwards acknowledged already (the CN
    /// acknowledges every copy of a forward sent again).
    pub acknowledged_again: u64,
    /// Requests with a registered app and data in range: the ones that
    /// run, or are forwarded one in `forward_every`.
    pub servable: u64,
    pub results: u64,
    pub forwarded: u64,
    pub acknowledged: u64,
    /// Forwarded requests sent again: their acknowledgement was late or
    /// lost, or their CN asked again (its request resent).
    pub forwards_resent: u64,
    /// Fetches, each once (as `requests`).
    pub fetches: u64,
    /// Requests answered with an error status, by status.
    pub refused: BTreeMap<String, u64>,
    /// Datagrams dropped before any answer, by reason.
    pub dropped: BTreeMap<String, u64>,
}

/// The DN SmartNIC's NDP engine, with no I/O.
pub struct NdpEngine {
    flows: ExactTable<FlowKey, App>,
    memory: Vec<u8>,
    forward_every: u64,
    /// Forwarded requests awaiting their acknowledgement.
    pending_acknowledgements: HashMap<(DatagramEnd, u64), PendingForward>,
    /// The forwards, oldest first, with their generations. An entry whose
    /// generation is no longer its key's (acknowledged, or forwarded again
    /// since) is stale: it lingers until it reaches the front or a
    /// compaction, and never forgets the newer forward.
    acknowledgement_order: VecDeque<((DatagramEnd, u64), u64)>,
    next_generation: u64,
    /// No later than the earliest resend of a pending forward, if one is
    /// pending: kept so that the agent's timer costs nothing per poll.
    next_resend: Option<Timestamp>,
    recent_answers: RecentAnswers,
    counters: EngineCounters,
}

/// A forwarded request waiting for its CN's acknowledgement.
struct PendingForward {
    /// Its newest forward's generation (see `acknowledgement_order`).
    generation: u64,
    /// The forwarded message, to send again.
    message: Vec<u8>,
    first_sent: Timestamp,
    resend_at: Timestamp,
    interval: Duration,
}

fn reason(error: &TigaError) -> String {
    let text = format!("{error:?}");
    text.split(['(', ' ', '{'])
        .next()
        .unwrap_or("unknown")
        .to_string()
}

impl NdpEngine {
    /// An engine over the DN's `memory`, forwarding one request in
    /// `forward_every` to the CN (0: never).
    pub fn new(memory: Vec<u8>, forward_every: u64) -> NdpEngine {
        NdpEngine {
            flows: ExactTable::new(FLOW_TABLE),
            memory,
            forward_every,
            pending_acknowledgements: HashMap::new(),
            acknowledgement_order: VecDeque::new(),
            next_generation: 0,
            next_resend: None,
            recent_answers: RecentAnswers::default(),
            counters: EngineCounters::default(),
        }
    }

    /// An application registers its offload chain before CNs use it.
    pub fn register(&mut self, app: App) -> Result<(), TableError> {
        let key = FlowKey {
            udp_port: TIGA_PORT,
            app_flag: app.type_flag(),
        };
        self.flows.insert(key, app)
    }

    pub fn counters(&self) -> &EngineCounters {
        &self.counters
    }

    pub fn flow_table_resources(&self) -> TableResources {
        self.flows.resources()
    }

    /// Forwarded requests the CN has not acknowledged.
    pub fn unacknowledged(&self) -> usize {
        self.pending_acknowledgements.len()
    }

    /// Handles one datagram from `from` at `now`; answers go to `outbox`.
    pub fn handle(
        &mut self,
        now: Timestamp,
        from: DatagramEnd,
        message: &[u8],
        outbox: &mut Vec<(DatagramEnd, Vec<u8>)>,
    ) {
        let header = match TigaHeader::new_checked(message) {
            Ok(header) => header,
            Err(error) => return self.drop(reason(&error)),
        };
        let repr = TigaRepr::parse(&header);
        match repr.kind {
            MessageKind::Request | MessageKind::Fetch
                if self.answered_again(from, &repr, outbox) => {}
            MessageKind::Request => self.request(now, from, repr, outbox),
            MessageKind::Fetch => self.fetch(from, repr, outbox),
            MessageKind::Acknowledgement => self.acknowledgement(from, repr.request_id),
            MessageKind::Result | MessageKind::Forwarded | MessageKind::Data => {
                self.drop("NotForTheEngine".into());
            }
        }
    }

    /// A request or fetch its CN asked again: its forward (still
    /// unacknowledged) or its answer goes again, as the first time, and it
    /// is neither served anew nor counted toward `forward_every` (served
    /// anew, a request asked again took a forward slot for a call the CN
    /// had finished, and `requests` no longer added up). Whether it was.
    fn answered_again(
        &mut self,
        from: DatagramEnd,
        request: &TigaRepr,
        outbox: &mut Vec<(DatagramEnd, Vec<u8>)>,
    ) -> bool {
        let key = (from, request.request_id);
        if let Some(pending) = self.pending_acknowledgements.get(&key) {
            self.counters.asked_again += 1;
            self.counters.forwards_resent += 1;
            outbox.push((from, pending.message.clone()));
            return true;
        }
        let Some(answer) = self.recent_answers.get(&key) else {
            return false;
        };
        self.counters.asked_again += 1;
        // A forward the CN acknowledged: it has it, nothing goes.
        if let Some(message) = answer {
            outbox.push((from, message.clone()));
        }
        true
    }

    fn acknowledgement(&mut self, from: DatagramEnd, request_id: u64) {
        let key = (from, request_id);
        if self.pending_acknowledgements.remove(&key).is_some() {
            self.counters.acknowledged += 1;
            self.recent_answers.remember(key, None);
            if self.pending_acknowledgements.is_empty() {
                self.next_resend = None;
            }
        } else if matches!(self.recent_answers.get(&key), Some(None)) {
            self.counters.acknowledged_again += 1;
        } else {
            self.drop("UnexpectedAcknowledgement".into());
        }
    }

    fn drop(&mut self, reason: String) {
        *self.counters.dropped.entry(reason).or_default() += 1;
    }

    /// Sends again, to `outbox`, at most `max_resends` of the forwards
    /// whose acknowledgement is overdue (the rest stay due, for the next
    /// call); gives up on a forward, counted as `AcknowledgementTimedOut`,
    /// at its first resend due [`CALL_DEADLINE`] or more after it was first
    /// forwarded (5.75 s with the default waits).
    pub fn resend_forwards(
        &mut self,
        now: Timestamp,
        max_resends: usize,
        outbox: &mut Vec<(DatagramEnd, Vec<u8>)>,
    ) {
        if self.next_resend.is_none_or(|due| due > now) {
            return;
        }
        let (mut given_up, mut resent) = (0, 0);
        self.pending_acknowledgements.retain(|(to, _), pending| {
            if pending.resend_at > now {
                return true;
            }
            if now.saturating_duration_since(pending.first_sent) >= CALL_DEADLINE {
                given_up += 1;
                return false;
            }
            if resent < max_resends {
                resent += 1;
                (pending.resend_at, pending.interval) = next_resend(now, pending.interval);
                outbox.push((*to, pending.message.clone()));
                self.counters.forwards_resent += 1;
            }
            true
        });
        for _ in 0..given_up {
            self.drop("AcknowledgementTimedOut".into());
        }
        self.next_resend = self
            .pending_acknowledgements
            .values()
            .map(|pending| pending.resend_at)
            .min();
    }

    /// When [`NdpEngine::resend_forwards`] may have work: never later than
    /// the earliest resend, but earlier once that forward was acknowledged
    /// (a call then finds nothing due, and looks again).
    pub fn next_resend(&self) -> Option<Timestamp> {
        self.next_resend
    }

    /// Remembers a forwarded request until its CN acknowledges it, within
    /// [`MAX_UNACKNOWLEDGED`].
    fn await_acknowledgement(&mut self, now: Timestamp, key: (DatagramEnd, u64), message: Vec<u8>) {
        while self.pending_acknowledgements.len() >= MAX_UNACKNOWLEDGED {
            let (oldest, generation) = self
                .acknowledgement_order
                .pop_front()
                .expect("every pending acknowledgement is in the order");
            if self
                .pending_acknowledgements
                .get(&oldest)
                .is_some_and(|pending| pending.generation == generation)
            {
                self.pending_acknowledgements.remove(&oldest);
                self.drop("ForgottenAcknowledgement".into());
            }
        }
        // Compacted, the order holds one entry per pending forward.
        if self.acknowledgement_order.len() >= 2 * MAX_UNACKNOWLEDGED {
            let pending = &self.pending_acknowledgements;
            self.acknowledgement_order.retain(|(waiting, generation)| {
                pending
                    .get(waiting)
                    .is_some_and(|pending| pending.generation == *generation)
            });
        }
        let generation = self.next_generation;
        self.next_generation += 1;
        let (resend_at, interval) = next_resend(now, FIRST_RESEND_AFTER);
        let pending = PendingForward {
            generation,
            message,
            first_sent: now,
            resend_at,
            interval,
        };
        self.pending_acknowledgements.insert(key, pending);
        self.next_resend = Some(self.next_resend.map_or(resend_at, |due| due.min(resend_at)));
        self.acknowledgement_order.push_back((key, generation));
        debug_assert!(self.acknowledgement_order.len() <= 2 * MAX_UNACKNOWLEDGED);
    }

    fn answer(
        &mut self,
        to: DatagramEnd,
        request: TigaRepr,
        kind: MessageKind,
        status: Status,
        payload: &[u8],
        outbox: &mut Vec<(DatagramEnd, Vec<u8>)>,
    ) {
        if status != Status::Ok {
            *self
                .counters
                .refused
                .entry(format!("{status:?}"))
                .or_default() += 1;
        }
        let repr = TigaRepr {
            kind,
            status,
            ..request
        };
        let message = repr.to_message(payload);
        self.recent_answers
            .remember((to, request.request_id), Some(message.clone()));
        outbox.push((to, message));
    }

    /// The requested range of the DN's memory (the local DMA), or why not.
    fn data(&self, request: &TigaRepr) -> Result<&[u8], Status> {
        let start = usize::try_from(request.data_address).map_err(|_| Status::OutOfRange)?;
        let end = start
            .checked_add(request.data_length as usize)
            .ok_or(Status::OutOfRange)?;
        let data = self.memory.get(start..end).ok_or(Status::OutOfRange)?;
        if data.len() + HEADER_LEN > MAX_MESSAGE_BYTES {
            return Err(Status::TooLarge);
        }
        Ok(data)
    }

    fn request(
        &mut self,
        now: Timestamp,
        from: DatagramEnd,
        request: TigaRepr,
        outbox: &mut Vec<(DatagramEnd, Vec<u8>)>,
    ) {
        self.counters.requests += 1;
        let key = FlowKey {
            udp_port: TIGA_PORT,
            app_flag: request.app_flag,
        };
        let Some(&app) = self.flows.lookup(&key) else {
            return self.answer(
                from,
                request,
                MessageKind::Result,
                Status::NotRegistered,
                &[],
                outbox,
            );
        };
        let data = match self.data(&request) {
            Ok(data) => data.to_vec(),
            Err(status) => {
                return self.answer(from, request, MessageKind::Result, status, &[], outbox)
            }
        };
        // Counted among servable requests only: refused ones must not
        // shift which requests are forwarded.
        self.counters.servable += 1;
        if self.forward_every > 0 && self.counters.servable.is_multiple_of(self.forward_every) {
            self.counters.forwarded += 1;
            let forward = TigaRepr {
                kind: MessageKind::Forwarded,
                status: Status::Ok,
                ..request
            }
            .to_message(&data);
            outbox.push((from, forward.clone()));
            self.await_acknowledgement(now, (from, request.request_id), forward);
            return;
        }
        match app.run_pipeline(&data) {
            Ok(result) if result.len() + HEADER_LEN <= MAX_MESSAGE_BYTES => {
                self.counters.results += 1;
                self.answer(
                    from,
                    request,
                    MessageKind::Result,
                    Status::Ok,
                    &result,
                    outbox,
                );
            }
            Ok(_) => self.answer(
                from,
                request,
                MessageKind::Result,
                Status::TooLarge,
                &[],
                outbox,
            ),
            Err(error) => {
                let text = error.to_string();
                self.answer(
                    from,
                    request,
                    MessageKind::Result,
                    Status::StageFailed,
                    text.as_bytes(),
                    outbox,
                );
            }
        }
    }

    fn fetch(
        &mut self,
        from: DatagramEnd,
        request: TigaRepr,
        outbox: &mut Vec<(DatagramEnd, Vec<u8>)>,
    ) {
        self.counters.fetches += 1;
        match self.data(&request) {
            Ok(data) => {
                let data = data.to_vec();
                self.answer(from, request, MessageKind::Data, Status::Ok, &data, outbox);
            }
            Err(status) => self.answer(from, request, MessageKind::Data, status, &[], outbox),
        }
    }
}

/// Why an NDP call failed, as the CN sees it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NdpError {
    #[error("no offload chain is registered for {0:?}")]
    NotRegistered(App),
    #[error("the data range is outside the data node's memory")]
    OutOfRange,
    #[error("the data or its result is larger than one datagram ({MAX_MESSAGE_BYTES} bytes)")]
    TooLarge,
    #[error("a stage on the SmartNIC refused the data: {0}")]
    StageFailed(String),
    #[error("the CN version refused the data: {0}")]
    CpuStage(StageError),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    #[error("the rack is gone")]
    Disconnected,
}

/// Who ran a request's stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServedBy {
    /// The SmartNIC ran the offload chain.
    SmartNic,
    /// The SmartNIC forwarded it; the CN ran its version (co-processing).
    ComputeNodeForwarded,
    /// No NDP: the CN fetched the data and ran its version.
    CpuOnly,
}

/// A finished call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub result: Vec<u8>,
    pub served_by: ServedBy,
}

/// How a call is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Ndp,
    CpuOnly,
}

/// A call's outcome.
pub type Outcome = Result<Completion, NdpError>;

/// The CN side, with no I/O: requests out, answers in, acknowledgements of
/// forwarded requests out.
#[derive(Default)]
pub struct NdpClient {
    next_id: u64,
    /// The calls waiting for their answer.
    outstanding: HashMap<u64, Call>,
    /// Requests sent again.
    resent: u64,
}

/// A call waiting for its answer.
struct Call {
    app: App,
    mode: Mode,
    first_sent: Timestamp,
    resend_at: Timestamp,
    interval: Duration,
    /// The request, to send again.
    message: Vec<u8>,
}

impl NdpClient {
    /// A client whose first call takes id `first_id`. A client that comes
    /// back after a crash starts at its restart time in nanoseconds: above
    /// every id its earlier life used (fewer than one call a nanosecond),
    /// so a late answer to one of those can never finish a new call.
    pub fn starting_at(first_id: u64) -> NdpClient {
        NdpClient {
            next_id: first_id,
            outstanding: HashMap::new(),
            resent: 0,
        }
    }

    /// The message that starts a call, and its id.
    pub fn begin(
        &mut self,
        now: Timestamp,
        app: App,
        address: u64,
        length: u32,
        mode: Mode,
    ) -> (u64, Vec<u8>) {
        let request_id = self.next_id;
        self.next_id += 1;
        let kind = match mode {
            Mode::Ndp => MessageKind::Request,
            Mode::CpuOnly => MessageKind::Fetch,
        };
        let repr = TigaRepr {
            kind,
            app_flag: app.type_flag(),
            status: Status::Ok,
            request_id,
            data_address: address,
            data_length: length,
        };
        let message = repr.to_message(&[]);
        let (resend_at, interval) = next_resend(now, FIRST_RESEND_AFTER);
        let call = Call {
            app,
            mode,
            first_sent: now,
            resend_at,
            interval,
            message: message.clone(),
        };
        self.outstanding.insert(request_id, call);
        (request_id, message)
    }

    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    /// Requests sent again so far.
    pub fn resent(&self) -> u64 {
        self.resent
    }

    /// The requests due to be sent again at `now` (their request or its
    /// answer may be lost): the engine answers a request it sees twice
    /// again, and an answer that comes twice is a stray.
    pub fn resends(&mut self, now: Timestamp) -> Vec<Vec<u8>> {
        let mut due = Vec::new();
        for call in self.outstanding.values_mut() {
            if call.resend_at <= now {
                (call.resend_at, call.interval) = next_resend(now, call.interval);
                due.push(call.message.clone());
            }
        }
        self.resent += due.len() as u64;
        due
    }

    /// When a request is next due again, or a call expires, if any is out.
    pub fn next_due(&self, deadline: Duration) -> Option<Timestamp> {
        self.outstanding
            .values()
            .map(|call| call.resend_at.min(call.first_sent.saturating_add(deadline)))
            .min()
    }

    /// Gives up the calls sent `deadline` or longer before `now` (their
    /// request or answer was lost): returns their ids, and their slots are
    /// free again.
    pub fn expire(&mut self, now: Timestamp, deadline: Duration) -> Vec<u64> {
        let expired: Vec<u64> = self
            .outstanding
            .iter()
            .filter(|(_, call)| now.saturating_duration_since(call.first_sent) >= deadline)
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            self.outstanding.remove(id);
        }
        expired
    }

    /// When the oldest call expires, if any is out.
    pub fn next_expiry(&self, deadline: Duration) -> Option<Timestamp> {
        self.outstanding
            .values()
            .map(|call| call.first_sent.saturating_add(deadline))
            .min()
    }

    /// Handles an answer: the finished call, if any, and an
    /// acknowledgement to send back, if the request was forwarded. Stray
    /// or malformed answers are ignored (and give `None`).
    pub fn handle(&mut self, message: &[u8]) -> (Option<(u64, Outcome)>, Option<Vec<u8>>) {
        let Ok(header) = TigaHeader::new_checked(message) else {
            return (None, None);
        };
        let repr = TigaRepr::parse(&header);
        let acknowledgement = || {
            TigaRepr {
                kind: MessageKind::Acknowledgement,
                ..repr
            }
            .to_message(&[])
        };
        let Some((app, mode)) = self
            .outstanding
            .get(&repr.request_id)
            .map(|call| (call.app, call.mode))
        else {
            // A forward again of a call already finished: its first
            // acknowledgement was lost or is late, and the engine sends it
            // until one comes. Or a forward of a call that expired: it is
            // acknowledged too, so an acknowledgement says the CN has the
            // forward, not that it ran it. (Only this client's calls come
            // to its port.)
            let forwarded_again = repr.kind == MessageKind::Forwarded && repr.status == Status::Ok;
            return (None, forwarded_again.then(acknowledgement));
        };
        // The engine answers a call, refusals too, in its mode's kinds: any
        // other is a stray (another client's, or no answer at all), and
        // the call still waits for its own.
        let answers_the_call = match mode {
            Mode::Ndp => matches!(repr.kind, MessageKind::Result | MessageKind::Forwarded),
            Mode::CpuOnly => repr.kind == MessageKind::Data,
        };
        if !answers_the_call {
            return (None, None);
        }
        let outcome = match (repr.status, repr.kind, mode) {
            (Status::NotRegistered, ..) => Err(NdpError::NotRegistered(app)),
            (Status::OutOfRange, ..) => Err(NdpError::OutOfRange),
            (Status::TooLarge, ..) => Err(NdpError::TooLarge),
            (Status::StageFailed, ..) => Err(NdpError::StageFailed(
                String::from_utf8_lossy(header.payload()).into_owned(),
            )),
            (Status::Ok, MessageKind::Result, Mode::Ndp) => Ok(Completion {
                result: header.payload().to_vec(),
                served_by: ServedBy::SmartNic,
            }),
            (Status::Ok, MessageKind::Forwarded, Mode::Ndp) => {
                self.outstanding.remove(&repr.request_id);
                let outcome = app
                    .run_on_cpu(header.payload())
                    .map_err(NdpError::CpuStage)
                    .map(|result| Completion {
                        result,
                        served_by: ServedBy::ComputeNodeForwarded,
                    });
                return (Some((repr.request_id, outcome)), Some(acknowledgement()));
            }
            (Status::Ok, MessageKind::Data, Mode::CpuOnly) => app
                .run_on_cpu(header.payload())
                .map_err(NdpError::CpuStage)
                .map(|result| Completion {
                    result,
                    served_by: ServedBy::CpuOnly,
                }),
            (Status::Ok, kind, mode) => {
                unreachable!("{kind:?} answers a {mode:?} call: checked above")
            }
        };
        self.outstanding.remove(&repr.request_id);
        (Some((repr.request_id, outcome)), None)
    }
}

/// The SmartNIC's engine on the memory host's device.
pub struct NdpEngineAgent {
    pub engine: NdpEngine,
    port: AgentPort,
}

impl NdpEngineAgent {
    pub fn new(engine: NdpEngine) -> NdpEngineAgent {
        NdpEngineAgent {
            engine,
            port: AgentPort::new(TIGA_PORT, INBOX_DEPTH),
        }
    }
}

impl Agent for NdpEngineAgent {
    fn name(&self) -> &'static str {
        "tiga-ndp-engine"
    }

    fn poll(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        let mut outbox = Vec::new();
        let engine = &mut self.engine;
        let mut moved = self
            .port
            .receive(nic, DATAGRAMS_PER_TURN, |from, message| {
                engine.handle(now, from, message, &mut outbox)
            })?;
        // Only with nothing held, and a bounded number a turn: a port
        // holds what the device cannot take, and a burst of thousands of
        // forwards falling due at once (a CN gone) overflowed it, which
        // stops the agent for good.
        if self.port.held() == 0 {
            engine.resend_forwards(now, RESENDS_PER_TURN, &mut outbox);
        }
        moved |= !outbox.is_empty();
        for (to, message) in outbox {
            self.port.send(nic, to, &message)?;
        }
        Ok(Progress::from_moved(moved))
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        [self.port.poll_timeout(), self.engine.next_resend()]
            .into_iter()
            .flatten()
            .min()
    }

    fn crash(&mut self) {
        self.port.forget();
    }

    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Ok(())
    }
}

/// A call handed to the CN's agent by an application thread.
pub struct NdpCall {
    pub app: App,
    pub address: u64,
    pub length: u32,
    pub mode: Mode,
    pub reply: SyncSender<Outcome>,
}

/// The CN's side on the compute host's device.
pub struct NdpClientAgent {
    client: NdpClient,
    engine: DatagramEnd,
    calls: Receiver<NdpCall>,
    waiting: HashMap<u64, SyncSender<Outcome>>,
    port: AgentPort,
}

impl NdpClientAgent {
    pub fn new(engine: DatagramEnd, calls: Receiver<NdpCall>) -> NdpClientAgent {
        NdpClientAgent {
            client: NdpClient::default(),
            engine,
            calls,
            waiting: HashMap::new(),
            port: AgentPort::new(CLIENT_PORT, INBOX_DEPTH),
        }
    }
}

impl Agent for NdpClientAgent {
    fn name(&self) -> &'static str {
        "tiga-ndp-client"
    }

    fn poll(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        let mut acknowledgements = Vec::new();
        for id in self.client.expire(now, CALL_DEADLINE) {
            if let Some(reply) = self.waiting.remove(&id) {
                let _ = reply.try_send(Err(NdpError::TimedOut(CALL_DEADLINE)));
            }
        }
        let (client, waiting) = (&mut self.client, &mut self.waiting);
        let mut moved = self.port.receive(nic, DATAGRAMS_PER_TURN, |_, answer| {
            let (finished, acknowledgement) = client.handle(answer);
            acknowledgements.extend(acknowledgement);
            let Some((id, outcome)) = finished else {
                return;
            };
            if let Some(reply) = waiting.remove(&id) {
                // A caller that gave up is gone: its outcome has no taker.
                let _ = reply.try_send(outcome);
            }
        })?;
        for acknowledgement in acknowledgements {
            self.port.send(nic, self.engine, &acknowledgement)?;
        }
        for request in self.client.resends(now) {
            self.port.send(nic, self.engine, &request)?;
            moved = true;
        }
        while self.client.outstanding() < MAX_OUTSTANDING {
            let Ok(call) = self.calls.try_recv() else {
                break;
            };
            let (id, message) =
                self.client
                    .begin(now, call.app, call.address, call.length, call.mode);
            self.waiting.insert(id, call.reply);
            self.port.send(nic, self.engine, &message)?;
            moved = true;
        }
        Ok(Progress::from_moved(moved))
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        if let Some(due) = self.port.poll_timeout() {
            return Some(due);
        }
        self.client.next_due(CALL_DEADLINE)
    }

    fn crash(&mut self) {
        self.port.forget();
        // Calls in flight die with the host: their callers hear it.
        for (_, reply) in self.waiting.drain() {
            let _ = reply.try_send(Err(NdpError::Disconnected));
        }
        self.client = NdpClient::default();
    }

    fn restart(&mut self, now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        self.client = NdpClient::starting_at(now.as_nanos());
        Ok(())
    }
}

/// Where one record of the DN's data lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordLocation {
    pub app: App,
    pub id: u64,
    pub address: u64,
    pub length: u32,
}

/// The DN's memory: `records_per_app` records of `bytes` bytes for each
/// of `apps`, one after another. (Built for every app whatever the rack
/// served, 100,000 records of 4 KiB held 1.2 GB for one app's 400 MB.)
pub fn build_data(
    seed: u64,
    apps: &[App],
    records_per_app: u64,
    bytes: usize,
) -> Result<(Vec<u8>, Vec<RecordLocation>), crate::apps::PayloadSizeError> {
    let records = apps.len() * records_per_app as usize;
    let mut memory = Vec::with_capacity(records * bytes);
    let mut locations = Vec::with_capacity(records);
    for &app in apps {
        for id in 0..records_per_app {
            let record = app.make_payload(seed, id, bytes)?;
            locations.push(RecordLocation {
                app,
                id,
                address: memory.len() as u64,
                length: record.len() as u32,
            });
            memory.extend_from_slice(&record);
        }
    }
    Ok((memory, locations))
}

/// A rack running TIGA's NDP path: the engine on the memory host's
/// SmartNIC, the client on the compute host, and the channel application
/// threads call through.
pub struct NdpRack {
    pub rack: remora_rack::assembly::EmbeddedRack,
    pub engine: Arc<Mutex<NdpEngineAgent>>,
    calls: SyncSender<NdpCall>,
    kicker: remora_rack::endpoint::DriverKicker,
    deadline: Duration,
}

impl NdpRack {
    /// Starts the rack with `memory` on the DN and `apps` registered.
    pub fn start(
        memory: Vec<u8>,
        apps: &[App],
        forward_every: u64,
    ) -> Result<NdpRack, NdpRackError> {
        let topology = remora_rack::topology::Topology::compute_and_memory();
        NdpRack::start_on(&topology, memory, apps, forward_every)
    }

    /// The same on `topology`'s compute host (host 0) and memory host
    /// (host 1), with their links: a rack file's nodes.
    pub fn start_on(
        topology: &remora_rack::topology::Topology,
        memory: Vec<u8>,
        apps: &[App],
        forward_every: u64,
    ) -> Result<NdpRack, NdpRackError> {
        use remora_rack::topology::{COMPUTE_HOST, MEMORY_HOST};
        let mut staged = remora_rack::assembly::RackBuilder::new(topology)
            .thread_name("tiga-fabric")
            .build()?;
        let mut engine = NdpEngine::new(memory, forward_every);
        for &app in apps {
            engine.register(app)?;
        }
        let engine = Arc::new(Mutex::new(NdpEngineAgent::new(engine)));
        staged.add_agent(MEMORY_HOST, engine.clone());
        let (calls, taken) = std::sync::mpsc::sync_channel(1024);
        let engine_end = DatagramEnd {
            mac: topology.switch_mac,
            address: topology.host(MEMORY_HOST).address,
            port: TIGA_PORT,
        };
        staged.add_agent(
            COMPUTE_HOST,
            Arc::new(Mutex::new(NdpClientAgent::new(engine_end, taken))),
        );
        let switch = staged.l2l3_switch();
        let (rack, _switch) = staged.start(switch)?;
        let kicker = rack.fabric().kicker();
        Ok(NdpRack {
            rack,
            engine,
            calls,
            kicker,
            deadline: CALL_DEADLINE,
        })
    }

    /// Stops the rack and says where its CPU went: the NIC and switch
    /// emulation (the fabric thread, less the agents it ran), the compute
    /// node's client (its application work: the CN versions it runs) and
    /// the SmartNIC's engine, apart. Without it the rack's CPU was never
    /// reported, and the three were one thread's time.
    pub fn stop(mut self) -> Result<NdpCpu, NdpRackError> {
        use remora_rack::topology::{COMPUTE_HOST, MEMORY_HOST};
        self.rack.stop_and_join()?;
        let account = self.rack.cpu_account();
        let agent = |host: usize| account.agents[host].first().copied().unwrap_or_default();
        Ok(NdpCpu {
            nic_emulation: account.fabric,
            client: agent(COMPUTE_HOST),
            engine: agent(MEMORY_HOST),
        })
    }

    /// Runs `app` on the record at (address, length): on the SmartNIC, or
    /// with `Mode::CpuOnly` by fetching it to the CN.
    pub fn call(&self, app: App, address: u64, length: u32, mode: Mode) -> Outcome {
        let (reply, outcome) = std::sync::mpsc::sync_channel(1);
        self.calls
            .send(NdpCall {
                app,
                address,
                length,
                mode,
                reply,
            })
            .map_err(|_| NdpError::Disconnected)?;
        self.kicker.kick();
        match outcome.recv_timeout(self.deadline) {
            Ok(outcome) => outcome,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                Err(NdpError::TimedOut(self.deadline))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(NdpError::Disconnected),
        }
    }

    /// The engine's counters, once every forwarded request is acknowledged
    /// or `deadline` passes (acknowledgements trail the results).
    pub fn settled_counters(&self, deadline: Duration) -> (EngineCounters, usize) {
        let started = std::time::Instant::now();
        loop {
            let engine = self
                .engine
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let unacknowledged = engine.engine.unacknowledged();
            if unacknowledged == 0 || started.elapsed() > deadline {
                return (engine.engine.counters().clone(), unacknowledged);
            }
            drop(engine);
            self.kicker.kick();
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Where an [`NdpRack`]'s CPU went ([`NdpRack::stop`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NdpCpu {
    /// The soft RNICs and the switch: the fabric thread apart from the
    /// agents it ran.
    pub nic_emulation: Duration,
    /// The compute node's client agent (polls that moved): the CN
    /// versions it runs, CPU-only and forwarded requests alike.
    pub client: Duration,
    /// The SmartNIC's engine agent (polls that moved).
    pub engine: Duration,
}

/// Why an NDP rack could not start, or stop.
#[derive(Debug, thiserror::Error)]
pub enum NdpRackError {
    #[error(transparent)]
    Rack(#[from] remora_rack::RackError),
    #[error("registering an offload chain: {0}")]
    Register(#[from] TableError),
}

/// What calling every record of one application through the rack found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecordCheck {
    pub calls: u64,
    /// Results equal to the CN version's.
    pub matched: u64,
    pub on_smartnic: u64,
    pub forwarded: u64,
    pub cpu_only: u64,
    /// What went wrong, a line per record.
    pub failures: Vec<String>,
}

impl NdpRack {
    /// Calls every record of `app` among `locations` (`seed` and `bytes`
    /// made them, as [`build_data`]) in `mode`, and checks each result
    /// against the CN version run here.
    pub fn check_records(
        &self,
        app: App,
        mode: Mode,
        locations: &[RecordLocation],
        seed: u64,
        bytes: usize,
    ) -> RecordCheck {
        let mut check = RecordCheck::default();
        for location in locations.iter().filter(|location| location.app == app) {
            check.calls += 1;
            let expected = app
                .make_payload(seed, location.id, bytes)
                .map_err(|error| error.to_string())
                .and_then(|payload| app.run_on_cpu(&payload).map_err(|error| error.to_string()));
            match self.call(app, location.address, location.length, mode) {
                Ok(completion) => {
                    match completion.served_by {
                        ServedBy::SmartNic => check.on_smartnic += 1,
                        ServedBy::ComputeNodeForwarded => check.forwarded += 1,
                        ServedBy::CpuOnly => check.cpu_only += 1,
                    }
                    if Ok(&completion.result) == expected.as_ref() {
                        check.matched += 1;
                    } else {
                        check.failures.push(format!(
                            "TIGA: {} record {} differs from the CN version",
                            app.name(),
                            location.id
                        ));
                    }
                }
                Err(error) => check.failures.push(format!(
                    "TIGA: {} record {}: {error}",
                    app.name(),
                    location.id
                )),
            }
        }
        check
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_wire::{Ipv4Address, MacAddress};

    fn client_end(port: u16) -> DatagramEnd {
        DatagramEnd {
            mac: MacAddress([2, 0, 0, 0, 0, 1]),
            address: Ipv4Address::new(10, 0, 0, 1),
            port,
        }
    }

    /// An engine over 4 KiB of 7s serving MVS, forwarding one request in
    /// `forward_every`, and a client.
    fn mvs_engine(forward_every: u64) -> (NdpEngine, NdpClient) {
        let mut engine = NdpEngine::new(vec![7u8; 4096], forward_every);
        engine.register(App::Mvs).unwrap();
        (engine, NdpClient::default())
    }

    /// Refused requests counted toward `forward_every`: with refused and
    /// good requests alternating, every good one was forwarded (or none).
    #[test]
    fn forward_every_counts_only_requests_that_can_be_served() {
        let (mut engine, mut client) = mvs_engine(2);
        let mut outbox = Vec::new();
        for _ in 0..2 {
            let (_, refused) = client.begin(Timestamp::ZERO, App::Mvs, 1 << 40, 64, Mode::Ndp);
            engine.handle(Timestamp::ZERO, client_end(1), &refused, &mut outbox);
            let (_, good) = client.begin(Timestamp::ZERO, App::Mvs, 0, 64, Mode::Ndp);
            engine.handle(Timestamp::ZERO, client_end(1), &good, &mut outbox);
        }
        let counters = engine.counters();
        assert_eq!((counters.requests, counters.servable), (4, 2));
        assert_eq!(counters.forwarded, 1, "one good request in two");
    }

    /// `[tiga] record_bytes` took up to 64 KiB, but a record above about
    /// 4 KiB has no answer that fits a datagram: every call failed. The
    /// largest record the rack takes has an answer that fits, for every
    /// app.
    #[test]
    fn the_largest_record_has_an_answer_that_fits_one_message() {
        for app in App::ALL {
            for bytes in [crate::apps::MIN_PAYLOAD_BYTES, MAX_RECORD_BYTES] {
                let record = app.make_payload(1, 3, bytes).unwrap();
                assert!(record.len() + HEADER_LEN <= MAX_MESSAGE_BYTES);
                let result = app.run_on_cpu(&record).unwrap();
                assert!(
                    result.len() + HEADER_LEN <= MAX_MESSAGE_BYTES,
                    "{app:?}: {bytes}-byte record, {}-byte result",
                    result.len()
                );
            }
        }
    }

    /// A compute node that crashed came back numbering its calls from 0
    /// again: an answer to its earlier life's call 0, late, finished the
    /// new call 0 with another record's result.
    #[test]
    fn a_restarted_client_never_reuses_its_earlier_lifes_ids() {
        let (_calls, receiver) = std::sync::mpsc::sync_channel(1);
        let mut agent = NdpClientAgent::new(client_end(9), receiver);
        let mut engine = NdpEngine::new(vec![7u8; 4096], 1);
        engine.register(App::Mvs).unwrap();
        let (old_id, request) = agent
            .client
            .begin(Timestamp::ZERO, App::Mvs, 0, 64, Mode::Ndp);
        let mut outbox = Vec::new();
        engine.handle(Timestamp::ZERO, client_end(1), &request, &mut outbox);
        let (_, late_answer) = outbox.pop().unwrap();
        agent.crash();
        let restarted = Timestamp::from_nanos(5_000);
        let mut fabric = remora_rnic::back_to_back::BackToBack::new(1);
        agent.restart(restarted, &mut fabric.left).unwrap();
        let (new_id, _) = agent.client.begin(restarted, App::Mvs, 64, 64, Mode::Ndp);
        assert_ne!(new_id, old_id);
        let (finished, _) = agent.client.handle(&late_answer);
        assert!(finished.is_none(), "a late answer finished a new call");
        assert_eq!(agent.client.outstanding(), 1);
    }

    /// An answer of the other mode's kind (a SmartNIC result to a plain
    /// fetch) is a stray: the call still waits for its own.
    #[test]
    fn an_answer_of_the_other_modes_kind_is_a_stray() {
        let (mut engine, mut client) = mvs_engine(1_000);
        let mut other = NdpClient::default();
        let (id, _) = client.begin(Timestamp::ZERO, App::Mvs, 0, 64, Mode::CpuOnly);
        let (other_id, request) = other.begin(Timestamp::ZERO, App::Mvs, 0, 64, Mode::Ndp);
        assert_eq!(id, other_id);
        let mut outbox = Vec::new();
        engine.handle(Timestamp::ZERO, client_end(1), &request, &mut outbox);
        let (_, answer) = outbox.pop().unwrap();
        let (finished, _) = client.handle(&answer);
        assert!(finished.is_none(), "an NDP call's answer finished a fetch");
        assert_eq!(client.outstanding(), 1);
        let (finished, _) = other.handle(&answer);
        assert_eq!(finished.unwrap().0, other_id, "it is the NDP call's own");
    }

    /// A CN that never acknowledged its forwarded requests grew the
    /// engine's set of them without end.
    #[test]
    fn unacknowledged_forwards_are_bounded_and_the_oldest_forgotten() {
        let (mut engine, mut client) = mvs_engine(1);
        let mut outbox = Vec::new();
        let forwards = MAX_UNACKNOWLEDGED + 10;
        for _ in 0..forwards {
            let (_, request) = client.begin(Timestamp::ZERO, App::Mvs, 0, 64, Mode::Ndp);
            engine.handle(Timestamp::ZERO, client_end(1), &request, &mut outbox);
        }
        assert_eq!(engine.counters().forwarded, forwards as u64);
        assert_eq!(engine.unacknowledged(), MAX_UNACKNOWLEDGED);
        assert_eq!(engine.counters().dropped["ForgottenAcknowledgement"], 10);
        // The newest still wait for, and take, their acknowledgement.
        let (_, newest) = outbox.last().unwrap();
        let (_, acknowledgement) = client.handle(newest);
        engine.handle(
            Timestamp::ZERO,
            client_end(1),
            &acknowledgement.unwrap(),
            &mut Vec::new(),
        );
        assert_eq!(engine.counters().acknowledged, 1);
        assert_eq!(engine.unacknowledged(), MAX_UNACKNOWLEDGED - 1);
    }

    /// The acknowledgement order keeps a stale entry for each forward
    /// acknowledged: past 8192 it outgrew its bound unless compacted, and
    /// a stale entry at the front would have forgotten a newer forward.
    /// (Before the engine remembered its answers, one request asked again
    /// and again was forwarded anew each time; now each round is a new
    /// request.)
    #[test]
    fn forwards_acknowledged_over_and_over_keep_the_order_bounded() {
        let (mut engine, mut client) = mvs_engine(1);
        let mut outbox = Vec::new();
        let acknowledgement_of = |request: &[u8]| {
            TigaRepr {
                kind: MessageKind::Acknowledgement,
                ..TigaRepr::parse(&TigaHeader::new_checked(request).unwrap())
            }
            .to_message(&[])
        };
        // One round short of a compaction, so the next forward's entries
        // are all there when the one after compacts.
        for _ in 0..2 * MAX_UNACKNOWLEDGED - 1 {
            let (_, request) = client.begin(Timestamp::ZERO, App::Mvs, 0, 64, Mode::Ndp);
            engine.handle(Timestamp::ZERO, client_end(1), &request, &mut outbox);
            let acknowledgement = acknowledgement_of(&request);
            engine.handle(
                Timestamp::ZERO,
                client_end(1),
                &acknowledgement,
                &mut outbox,
            );
            outbox.clear();
        }
        let (_, request) = client.begin(Timestamp::ZERO, App::Mvs, 0, 64, Mode::Ndp);
        engine.handle(Timestamp::ZERO, client_end(1), &request, &mut outbox);
        let (_, other) = client.begin(Timestamp::ZERO, App::Mvs, 0, 64, Mode::Ndp);
        engine.handle(Timestamp::ZERO, client_end(1), &other, &mut outbox);
        assert_eq!(engine.unacknowledged(), 2);
        assert!(engine.acknowledgement_order.len() <= 2 * MAX_UNACKNOWLEDGED);
        assert!(!engine
            .counters()
            .dropped
            .contains_key("ForgottenAcknowledgement"));
        engine.handle(
            Timestamp::ZERO,
            client_end(1),
            &acknowledgement_of(&request),
            &mut outbox,
        );
        assert_eq!(engine.unacknowledged(), 1);
    }

    /// A request asked again (its CN's resend after 250 ms, or a
    /// duplicated datagram) after its answer was served anew: it took a
    /// forward slot for a call its CN had finished, `requests` counted it
    /// twice, and the CN's acknowledgement of each copy of a forward was
    /// counted as a drop. It is answered from memory now, as the first
    /// time.
    #[test]
    fn a_request_asked_again_is_answered_as_the_first_time() {
        let (mut engine, mut client) = mvs_engine(2);
        let mut outbox = Vec::new();
        let (_, first) = client.begin(Timestamp::ZERO, App::Mvs, 0, 64, Mode::Ndp);
        engine.handle(Timestamp::ZERO, client_end(1), &first, &mut outbox);
        let answered: Vec<Vec<u8>> = outbox.drain(..).map(|(_, message)| message).collect();
        assert_eq!(answered.len(), 1);
        // Asked again: the same result, not a forward (it would have been
        // the second servable request, the one forward_every forwards).
        engine.handle(Timestamp::ZERO, client_end(1), &first, &mut outbox);
        let again: Vec<Vec<u8>> = outbox.drain(..).map(|(_, message)| message).collect();
        assert_eq!(again, answered);
        let (_, second) = client.begin(Timestamp::ZERO, App::Mvs, 0, 64, Mode::Ndp);
        engine.handle(Timestamp::ZERO, client_end(1), &second, &mut outbox);
        let (_, forward) = outbox.pop().expect("the second request is forwarded");
        let forward_header = TigaHeader::new_checked(&forward[..]).unwrap();
        assert_eq!(
            TigaRepr::parse(&forward_header).kind,
            MessageKind::Forwarded
        );
        let acknowledgement = TigaRepr {
            kind: MessageKind::Acknowledgement,
            ..TigaRepr::parse(&forward_header)
        }
        .to_message(&[]);
        for _ in 0..2 {
            engine.handle(
                Timestamp::ZERO,
                client_end(1),
                &acknowledgement,
                &mut outbox,
            );
        }
        // Asked again after its forward was acknowledged: the CN has it.
        engine.handle(Timestamp::ZERO, client_end(1), &second, &mut outbox);
        assert!(outbox.is_empty(), "{outbox:?}");
        let counters = engine.counters();
        // (The engine's memory holds 7s, no MVS record: the first request's
        // answer is a StageFailed refusal, remembered like any answer.)
        assert_eq!(
            (counters.requests, counters.servable, counters.forwarded),
            (2, 2, 1)
        );
        assert_eq!(counters.refused.values().sum::<u64>(), 1);
        assert_eq!((counters.asked_again, counters.acknowledged_again), (2, 1));
        assert!(counters.dropped.is_empty(), "{:?}", counters.dropped);
    }

    /// A call whose request or answer was lost held one of the CN's slots
    /// for good; after 256 losses the client never sent again.
    #[test]
    fn a_call_without_an_answer_expires_and_frees_its_slot() {
        let mut client = NdpClient::default();
        let sent = Timestamp::from_nanos(1_000);
        let (id, _) = client.begin(sent, App::Mvs, 0, 64, Mode::Ndp);
        let deadline = Duration::from_millis(5);
        assert_eq!(
            client.next_expiry(deadline),
            Some(sent.saturating_add(deadline))
        );
        let early = sent.saturating_add(deadline / 2);
        assert!(client.expire(early, deadline).is_empty());
        assert_eq!(client.outstanding(), 1);
        assert_eq!(
            client.expire(sent.saturating_add(deadline), deadline),
            vec![id]
        );
        assert_eq!(client.outstanding(), 0);
        assert_eq!(client.next_expiry(deadline), None);
    }

    /// A lost request or answer cost its call the whole 5 s deadline: the
    /// request is sent again after [`FIRST_RESEND_AFTER`], then at doubled
    /// waits, and an answer to any copy finishes the call once.
    #[test]
    fn a_call_without_an_answer_is_sent_again_with_backoff() {
        let (mut engine, mut client) = mvs_engine(0);
        let sent = Timestamp::from_nanos(1_000);
        let (id, request) = client.begin(sent, App::Mvs, 0, 64, Mode::Ndp);
        let first = sent.saturating_add(FIRST_RESEND_AFTER);
        assert_eq!(client.next_due(CALL_DEADLINE), Some(first));
        let just_before = Timestamp::from_nanos(first.as_nanos() - 1);
        assert!(client.resends(just_before).is_empty());
        assert_eq!(client.resends(first), vec![request.clone()]);
        assert_eq!(
            client.next_due(CALL_DEADLINE),
            Some(first.saturating_add(2 * FIRST_RESEND_AFTER)),
            "the wait doubles"
        );
        assert!(client.resends(first).is_empty(), "once per wait");
        assert_eq!(client.resent(), 1);
        // Both copies reach the engine; each is answered.
        let mut outbox = Vec::new();
        engine.handle(first, client_end(1), &request, &mut outbox);
        engine.handle(first, client_end(1), &request, &mut outbox);
        let answers: Vec<Vec<u8>> = outbox.into_iter().map(|(_, answer)| answer).collect();
        assert_eq!(answers.len(), 2);
        let (finished, _) = client.handle(&answers[0]);
        assert_eq!(finished.map(|(finished, _)| finished), Some(id));
        let (again, acknowledgement) = client.handle(&answers[1]);
        assert!(again.is_none() && acknowledgement.is_none(), "a stray");
        assert_eq!(client.next_due(CALL_DEADLINE), None);
    }

    /// A forward whose acknowledgement was lost stayed unacknowledged for
    /// good. The engine sends it again until one comes; the CN, its call
    /// long finished, acknowledges it again; and a request asked again
    /// while its forward waits gets the same forward, not a new one, so
    /// forwards and acknowledgements still match one for one.
    #[test]
    fn a_forward_is_sent_again_until_it_is_acknowledged() {
        let (mut engine, mut client) = mvs_engine(1);
        let now = Timestamp::from_nanos(1_000);
        let (id, request) = client.begin(now, App::Mvs, 0, 64, Mode::Ndp);
        let mut outbox = Vec::new();
        engine.handle(now, client_end(1), &request, &mut outbox);
        let (_, forward) = outbox.pop().unwrap();
        let (finished, lost_acknowledgement) = client.handle(&forward);
        assert_eq!(finished.map(|(finished, _)| finished), Some(id));
        assert!(lost_acknowledgement.is_some());
        // The request again, before the resend: the same forward.
        engine.handle(now, client_end(1), &request, &mut outbox);
        assert_eq!(outbox.pop().unwrap().1, forward);
        assert_eq!(engine.counters().forwarded, 1);
        let due = now.saturating_add(FIRST_RESEND_AFTER);
        assert_eq!(engine.next_resend(), Some(due));
        engine.resend_forwards(Timestamp::from_nanos(due.as_nanos() - 1), 8, &mut outbox);
        assert!(outbox.is_empty());
        engine.resend_forwards(due, 8, &mut outbox);
        assert_eq!(outbox.pop(), Some((client_end(1), forward.clone())));
        assert_eq!(engine.counters().forwards_resent, 2);
        let (finished, acknowledgement) = client.handle(&forward);
        assert!(finished.is_none(), "the call finished once");
        engine.handle(due, client_end(1), &acknowledgement.unwrap(), &mut outbox);
        assert_eq!(engine.unacknowledged(), 0);
        assert_eq!(engine.counters().acknowledged, engine.counters().forwarded);
        assert_eq!(engine.next_resend(), None);
    }

    /// A CN that never acknowledges is not sent its forward for ever: past
    /// the call deadline the engine gives up on it, and says so.
    #[test]
    fn a_forward_never_acknowledged_is_given_up_at_the_deadline() {
        let (mut engine, mut client) = mvs_engine(1);
        let (_, request) = client.begin(Timestamp::ZERO, App::Mvs, 0, 64, Mode::Ndp);
        let mut outbox = Vec::new();
        engine.handle(Timestamp::ZERO, client_end(1), &request, &mut outbox);
        let mut resends = 0;
        while let Some(due) = engine.next_resend() {
            outbox.clear();
            engine.resend_forwards(due, 8, &mut outbox);
            resends += outbox.len();
            assert!(resends < 20, "bounded by the deadline");
        }
        assert!(resends >= 4, "{resends} resends within the deadline");
        assert_eq!(engine.unacknowledged(), 0);
        assert_eq!(engine.counters().dropped["AcknowledgementTimedOut"], 1);
    }

    /// Thousands of forwards falling due at once (a CN gone) went out in
    /// one turn, past what the agent's port may hold, which stops the
    /// agent: a call sends at most the number it is given, and the rest
    /// stay due for the next.
    #[test]
    fn forwards_due_at_once_go_a_bounded_number_per_call() {
        let (mut engine, mut client) = mvs_engine(1);
        let mut outbox = Vec::new();
        for _ in 0..100 {
            let (_, request) = client.begin(Timestamp::ZERO, App::Mvs, 0, 64, Mode::Ndp);
            engine.handle(Timestamp::ZERO, client_end(1), &request, &mut outbox);
        }
        let due = Timestamp::ZERO.saturating_add(FIRST_RESEND_AFTER);
        let mut turns = Vec::new();
        for _ in 0..3 {
            outbox.clear();
            engine.resend_forwards(due, 40, &mut outbox);
            turns.push(outbox.len());
            if let Some(next) = engine.next_resend() {
                assert!(next <= due || turns.iter().sum::<usize>() == 100);
            }
        }
        assert_eq!(turns, vec![40, 40, 20]);
        assert_eq!(engine.counters().forwards_resent, 100);
    }
}
