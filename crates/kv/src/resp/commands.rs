//! The commands, run against a server worker's [`Session`].
//!
//! Each command appends its reply before the next one runs, with one
//! exception that pipelining pays for: a GET whose record is on the
//! device ([`Status::Pending`]) leaves a gap in the replies and the next
//! GETs go on, so that a pipelined batch's device reads are in flight
//! together (as Garnet serves its FASTER-derived store). The gaps are
//! filled, in request order, by [`Executor::settle`] before any command
//! other than GET runs, so a read is never reordered with a write, and at
//! the end of the batch; or a server detaches the batch's gaps
//! ([`Executor::detach`]), runs other connections' batches, waits for all
//! of them at once ([`Executor::complete`]) and fills each
//! ([`Executor::fill`]). Other commands wait for their own pending
//! operation at once, after every read the session has pending.
//!
//! Multi-key commands are not atomic: each key is its own store
//! operation, and other connections' operations may fall in between.

use super::protocol::{
    encode_array_header, encode_bulk, encode_error, encode_integer, encode_null, encode_simple,
};
use crate::record::{MAX_KEY_BYTES, MAX_VALUE_BYTES};
use crate::update::parse_decimal;
use crate::{KvError, PrefetchStage, Session, SessionStats, Status, Store, Update, UpdateError};
use rustc_hash::FxHashMap;
use std::borrow::Cow;

/// The first context number handed to the store. Every operation takes
/// the next, never reused, so a completion left behind by a wait that
/// failed matches nothing a later command waits for (a fixed context for
/// the reads commands wait for at once let such a completion pass for a
/// later one's; found by review).
const FIRST_CONTEXT: u64 = 16;
/// GETs a batch may leave waiting before they are settled: the device's
/// batch of 100.
const MAX_DEFERRED: usize = 100;

/// How many bytes of an unknown command's name an error quotes, as Redis.
const QUOTED_NAME_BYTES: usize = 128;

/// What the connection does after a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// QUIT: write the replies so far, then close.
    Close,
}

/// A command the store could not carry out. The reply is `-ERR` and the
/// message, and the connection stays open. The wordings follow Redis's,
/// since clients and people match on them.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CommandError {
    /// Redis 7's words: the name, then the first arguments, each quoted
    /// and followed by a space (see [`unknown_command`]).
    #[error("unknown command '{name}', with args beginning with: {arguments}")]
    Unknown { name: String, arguments: String },
    #[error("unknown subcommand '{subcommand}'. Try {command} HELP.")]
    UnknownSubcommand {
        command: &'static str,
        subcommand: String,
    },
    #[error("wrong number of arguments for '{0}' command")]
    WrongArity(&'static str),
    #[error("value is not an integer or out of range")]
    NotAnInteger,
    #[error("increment or decrement would overflow")]
    Overflow,
    /// DECRBY by the one 64-bit value with no negation: Redis words it
    /// apart (7.0), and clients match on the text.
    #[error("decrement would overflow")]
    DecrementOverflow,
    #[error("syntax error")]
    Syntax,
    #[error("DB index is out of range")]
    DatabaseOutOfRange,
    #[error("the store finished waiting without completing the pending operation")]
    LostCompletion,
    #[error(transparent)]
    Store(KvError),
    /// A command over several keys failed part way; the keys before the
    /// failure stay changed. The store has no multi-key transaction, so MSET and
    /// DEL are not atomic as in Redis, and the client is told how far
    /// they went rather than only that they failed.
    #[error("{command} {done} before failing, which stay: {source}")]
    PartlyApplied {
        command: &'static str,
        done: String,
        source: Box<CommandError>,
    },
}

impl From<KvError> for CommandError {
    /// The store's update errors get Redis's wordings; the rest (a key
    /// too long, a full device...) keep the store's own.
    fn from(error: KvError) -> CommandError {
        match error {
            KvError::Update(UpdateError::NotAnInteger) => CommandError::NotAnInteger,
            KvError::Update(UpdateError::Overflow) => CommandError::Overflow,
            other => CommandError::Store(other),
        }
    }
}

/// One command as received: its canonical (lowercase) name and the
/// arguments after the name.
struct Call<'c, 'a> {
    name: &'static str,
    arguments: &'c [Cow<'a, [u8]>],
}

impl<'c, 'a> Call<'c, 'a> {
    fn exactly<const COUNT: usize>(&self) -> Result<&'c [Cow<'a, [u8]>; COUNT], CommandError> {
        self.arguments.try_into().map_err(|_| self.wrong_arity())
    }

    fn at_least(&self, minimum: usize) -> Result<&'c [Cow<'a, [u8]>], CommandError> {
        if self.arguments.len() < minimum {
            return Err(self.wrong_arity());
        }
        Ok(self.arguments)
    }

    fn wrong_arity(&self) -> CommandError {
        CommandError::WrongArity(self.name)
    }
}

type Handler = fn(&mut Executor, &Call<'_, '_>, &mut Vec<u8>) -> Result<(), CommandError>;

/// The commands, by lowercase name. QUIT is not here: it changes the
/// connection's flow rather than replying from the store.
const COMMANDS: &[(&str, Handler)] = &[
    ("get", Executor::get),
    ("set", Executor::set),
    ("del", Executor::delete),
    ("exists", Executor::exists),
    ("incr", Executor::increment),
    ("decr", Executor::decrement),
    ("incrby", Executor::increment_by),
    ("decrby", Executor::decrement_by),
    ("mget", Executor::multiple_get),
    ("mset", Executor::multiple_set),
    ("ping", Executor::ping),
    ("save", Executor::save),
    ("info", Executor::info),
    ("command", Executor::command),
    ("config", Executor::config),
    ("select", Executor::select),
];

/// A batch's GETs that went to the device, taken out of the executor
/// ([`Executor::detach`]) so that other connections' batches can run
/// before they are waited for: where each reply goes in the batch's reply
/// buffer, in request order, and its context.
#[derive(Debug, Default)]
#[must_use = "every gap needs its reply: hand it to Executor::fill"]
pub struct Deferred {
    gaps: Vec<(usize, u64)>,
}

impl Deferred {
    pub fn is_empty(&self) -> bool {
        self.gaps.is_empty()
    }
}

/// What came back for a deferred GET.
#[derive(Debug)]
enum Arrival {
    Found(Vec<u8>),
    Absent,
    Failed(String),
}

impl Arrival {
    fn of(completion: &crate::store::Completion<'_>) -> Arrival {
        match &completion.result {
            Ok(Status::Found) => Arrival::Found(completion.value.to_vec()),
            Ok(_) => Arrival::Absent,
            Err(error) => Arrival::Failed(error.to_string()),
        }
    }
}

/// Runs connections' commands on one session. A batch's GETs that must
/// wait for the device are deferred and answered together when the batch
/// settles; a server may also detach a batch's deferred GETs, run other
/// connections' batches, and wait for all of them at once.
pub struct Executor {
    store: Store,
    session: Session,
    /// Reused for every value read or computed, so that a GET allocates
    /// nothing once the connection is warm.
    value: Vec<u8>,
    /// The current batch's GETs waiting for the device.
    deferred: Vec<(usize, u64)>,
    /// Batches detached and not yet filled.
    detached: usize,
    /// Completed deferred GETs by context, until their batch is filled.
    arrived: FxHashMap<u64, Arrival>,
    /// Why the last wait for the device failed, for the gaps it left.
    failure: Option<String>,
    /// Scratch for rebuilding a reply buffer around its gaps.
    rebuilt: Vec<u8>,
    /// The next deferred GET's context; contexts are never reused, so a
    /// stale completion matches no gap.
    next_context: u64,
}

impl Executor {
    /// Opens a session; fails when the store's sessions are all taken.
    pub fn new(store: Store) -> Result<Executor, KvError> {
        let session = store.session()?;
        Ok(Executor {
            store,
            session,
            value: Vec::new(),
            deferred: Vec::new(),
            detached: 0,
            arrived: FxHashMap::default(),
            failure: None,
            rebuilt: Vec::new(),
            next_context: FIRST_CONTEXT,
        })
    }

    /// Leaves epoch protection: call before waiting on the network, so
    /// that an idle or slow client never holds up the store's log.
    pub fn suspend(&mut self) {
        self.session.suspend();
    }

    pub fn stats(&self) -> SessionStats {
        self.session.stats()
    }

    /// Starts loading the index bucket of the request's key (its first
    /// argument), so that a batch's lookups overlap their cache misses.
    /// It changes nothing: a request without a key loads a useless line.
    pub fn prefetch(&self, arguments: &[Cow<'_, [u8]>]) {
        if let [_, key, ..] = arguments {
            self.session.prefetch(key, PrefetchStage::Bucket);
        }
    }

    /// Runs the request `arguments` (the command name first) and appends
    /// its reply to `reply`. An empty request gets no reply, as in Redis.
    pub fn execute(&mut self, arguments: &[Cow<'_, [u8]>], reply: &mut Vec<u8>) -> Flow {
        let Some((name, rest)) = arguments.split_first() else {
            return Flow::Continue;
        };
        if name.eq_ignore_ascii_case(b"quit") {
            encode_simple(reply, "OK");
            return Flow::Close;
        }
        let is_get = name.eq_ignore_ascii_case(b"get");
        if !is_get || self.deferred.len() >= MAX_DEFERRED {
            self.settle(reply);
        }
        let start = reply.len();
        if let Err(error) = self.dispatch(name, rest, reply) {
            // A command that fails part way (an MGET with one key too
            // long) must not leave half an array behind.
            reply.truncate(start);
            encode_error(reply, &format!("ERR {error}"));
        }
        Flow::Continue
    }

    fn dispatch(
        &mut self,
        name: &[u8],
        arguments: &[Cow<'_, [u8]>],
        reply: &mut Vec<u8>,
    ) -> Result<(), CommandError> {
        let Some(&(name, handler)) = COMMANDS
            .iter()
            .find(|(known, _)| name.eq_ignore_ascii_case(known.as_bytes()))
        else {
            return Err(unknown_command(name, arguments));
        };
        handler(self, &Call { name, arguments }, reply)
    }

    /// A context no operation has had.
    fn fresh_context(&mut self) -> u64 {
        let context = self.next_context;
        self.next_context += 1;
        context
    }

    fn get(&mut self, call: &Call<'_, '_>, reply: &mut Vec<u8>) -> Result<(), CommandError> {
        let [key] = call.exactly()?;
        let context = self.fresh_context();
        match self.session.read(key, &mut self.value, context)? {
            Status::Pending => self.deferred.push((reply.len(), context)),
            Status::Found => encode_bulk(reply, &self.value),
            _ => encode_null(reply),
        }
        Ok(())
    }

    /// Waits for the batch's deferred GETs and writes their replies into
    /// their gaps in `reply`, in request order. A failed read's gap gets
    /// an error reply, as it would have without deferral; every gap gets a
    /// reply, so the client's count of replies stays right.
    pub fn settle(&mut self, reply: &mut Vec<u8>) {
        self.complete();
        let deferred = self.detach();
        self.fill(deferred, reply);
    }

    /// Takes the batch's deferred GETs out, so that another batch can run
    /// on this session before they are waited for ([`Executor::complete`])
    /// and answered ([`Executor::fill`]).
    pub fn detach(&mut self) -> Deferred {
        let gaps = std::mem::take(&mut self.deferred);
        self.detached += usize::from(!gaps.is_empty());
        Deferred { gaps }
    }

    /// Waits for every read the session has pending, the batch's and the
    /// detached ones, and keeps what came back. Commands other than GET
    /// wait on the session themselves, so they run only after this.
    pub fn complete(&mut self) {
        if self.session.pending_count() == 0 {
            return;
        }
        let arrived = &mut self.arrived;
        let completed = self.session.complete_pending(true, &mut |completion| {
            arrived.insert(completion.context, Arrival::of(&completion));
        });
        if let Err(error) = completed {
            self.failure = Some(error.to_string());
        }
    }

    /// Writes the replies of `deferred`'s GETs, which must have been
    /// waited for, into their gaps in `reply`, the buffer they were
    /// deferred from.
    pub fn fill(&mut self, deferred: Deferred, reply: &mut Vec<u8>) {
        if deferred.gaps.is_empty() {
            return;
        }
        let mut rebuilt = std::mem::take(&mut self.rebuilt);
        rebuilt.clear();
        let mut copied = 0;
        for &(at, context) in &deferred.gaps {
            rebuilt.extend_from_slice(&reply[copied..at]);
            copied = at;
            match self.arrived.remove(&context) {
                Some(Arrival::Found(value)) => encode_bulk(&mut rebuilt, &value),
                Some(Arrival::Absent) => encode_null(&mut rebuilt),
                Some(Arrival::Failed(why)) => encode_error(&mut rebuilt, &format!("ERR {why}")),
                None => {
                    let why = self
                        .failure
                        .as_deref()
                        .unwrap_or("the device read was lost");
                    encode_error(&mut rebuilt, &format!("ERR {why}"));
                }
            }
        }
        rebuilt.extend_from_slice(&reply[copied..]);
        std::mem::swap(reply, &mut rebuilt);
        self.rebuilt = rebuilt;
        self.detached -= 1;
        if self.detached == 0 && self.deferred.is_empty() {
            // Nothing is waited for: what is left came for no gap.
            self.arrived.clear();
            self.failure = None;
        }
    }

    /// Plain `SET key value`; Redis's options (EX, NX...) are a syntax
    /// error, since the store has neither expiry nor conditional writes.
    fn set(&mut self, call: &Call<'_, '_>, reply: &mut Vec<u8>) -> Result<(), CommandError> {
        match call.at_least(2)? {
            [key, value] => {
                self.session.upsert(key, value)?;
                encode_simple(reply, "OK");
                Ok(())
            }
            _ => Err(CommandError::Syntax),
        }
    }

    /// Replies how many of the keys existed. The store's delete does not
    /// say, so each key is read first and deleted only if it exists.
    fn delete(&mut self, call: &Call<'_, '_>, reply: &mut Vec<u8>) -> Result<(), CommandError> {
        let keys = call.at_least(1)?;
        check_key_lengths(keys.iter().map(|key| key.len()))?;
        let mut existed = 0;
        for key in keys {
            let deleted = self.read(key).and_then(|exists| {
                if exists {
                    self.session.delete(key)?;
                }
                Ok(exists)
            });
            match deleted {
                Ok(exists) => existed += i64::from(exists),
                Err(error) if existed == 0 => return Err(error),
                Err(error) => {
                    return Err(CommandError::PartlyApplied {
                        command: "DEL",
                        done: format!("deleted {existed} keys"),
                        source: Box::new(error),
                    })
                }
            }
        }
        encode_integer(reply, existed);
        Ok(())
    }

    /// Counts existing keys; a key named twice counts twice, as in Redis.
    fn exists(&mut self, call: &Call<'_, '_>, reply: &mut Vec<u8>) -> Result<(), CommandError> {
        let mut existing = 0;
        for key in call.at_least(1)? {
            existing += i64::from(self.read(key)?);
        }
        encode_integer(reply, existing);
        Ok(())
    }

    fn increment(&mut self, call: &Call<'_, '_>, reply: &mut Vec<u8>) -> Result<(), CommandError> {
        let [key] = call.exactly()?;
        self.add(key, 1, reply)
    }

    fn decrement(&mut self, call: &Call<'_, '_>, reply: &mut Vec<u8>) -> Result<(), CommandError> {
        let [key] = call.exactly()?;
        self.add(key, -1, reply)
    }

    fn increment_by(
        &mut self,
        call: &Call<'_, '_>,
        reply: &mut Vec<u8>,
    ) -> Result<(), CommandError> {
        let [key, delta] = call.exactly()?;
        let delta = parse_decimal(delta).ok_or(CommandError::NotAnInteger)?;
        self.add(key, delta, reply)
    }

    fn decrement_by(
        &mut self,
        call: &Call<'_, '_>,
        reply: &mut Vec<u8>,
    ) -> Result<(), CommandError> {
        let [key, delta] = call.exactly()?;
        let delta = parse_decimal(delta).ok_or(CommandError::NotAnInteger)?;
        let negated = delta.checked_neg().ok_or(CommandError::DecrementOverflow)?;
        self.add(key, negated, reply)
    }

    fn multiple_get(
        &mut self,
        call: &Call<'_, '_>,
        reply: &mut Vec<u8>,
    ) -> Result<(), CommandError> {
        let keys = call.at_least(1)?;
        encode_array_header(reply, keys.len());
        for key in keys {
            self.reply_with_value(key, reply)?;
        }
        Ok(())
    }

    /// Checks every length before writing anything, so that a pair over
    /// the store's limits fails the whole MSET rather than half of it.
    fn multiple_set(
        &mut self,
        call: &Call<'_, '_>,
        reply: &mut Vec<u8>,
    ) -> Result<(), CommandError> {
        let arguments = call.at_least(2)?;
        if arguments.len() % 2 != 0 {
            return Err(call.wrong_arity());
        }
        let pairs = arguments.chunks_exact(2);
        check_key_lengths(pairs.clone().map(|pair| pair[0].len()))?;
        check_value_lengths(pairs.clone().map(|pair| pair[1].len()))?;
        for (written, pair) in pairs.enumerate() {
            let [key, value] = pair else { continue };
            match self.session.upsert(key, value) {
                Ok(_) => {}
                Err(error) if written == 0 => return Err(error.into()),
                Err(error) => {
                    return Err(CommandError::PartlyApplied {
                        command: "MSET",
                        done: format!("wrote the first {written} pairs"),
                        source: Box::new(error.into()),
                    })
                }
            }
        }
        encode_simple(reply, "OK");
        Ok(())
    }

    /// Redis's SAVE: a checkpoint on the device, answered once every write
    /// acknowledged before it is there (see `Session::checkpoint`).
    fn save(&mut self, call: &Call<'_, '_>, reply: &mut Vec<u8>) -> Result<(), CommandError> {
        let [] = call.exactly()?;
        self.session.checkpoint()?;
        encode_simple(reply, "OK");
        Ok(())
    }

    fn ping(&mut self, call: &Call<'_, '_>, reply: &mut Vec<u8>) -> Result<(), CommandError> {
        match call.arguments {
            [] => encode_simple(reply, "PONG"),
            [message] => encode_bulk(reply, message),
            _ => return Err(call.wrong_arity()),
        }
        Ok(())
    }

    /// One text for every section asked for: the store has few numbers.
    fn info(&mut self, _call: &Call<'_, '_>, reply: &mut Vec<u8>) -> Result<(), CommandError> {
        encode_bulk(reply, self.info_text().as_bytes());
        Ok(())
    }

    /// The command table is not described: an empty array, which
    /// redis-cli takes (from `COMMAND DOCS`) as "no hints" and goes on.
    fn command(&mut self, _call: &Call<'_, '_>, reply: &mut Vec<u8>) -> Result<(), CommandError> {
        encode_array_header(reply, 0);
        Ok(())
    }

    /// `CONFIG GET` of anything is an empty array: the store has none of
    /// Redis's settings (redis-benchmark asks for `save` and
    /// `appendonly`, and proceeds without them).
    fn config(&mut self, call: &Call<'_, '_>, reply: &mut Vec<u8>) -> Result<(), CommandError> {
        let [subcommand, parameters @ ..] = call.at_least(1)? else {
            return Err(call.wrong_arity());
        };
        if !subcommand.eq_ignore_ascii_case(b"get") {
            return Err(CommandError::UnknownSubcommand {
                command: "CONFIG",
                subcommand: quoted(subcommand),
            });
        }
        if parameters.is_empty() {
            return Err(CommandError::WrongArity("config|get"));
        }
        encode_array_header(reply, 0);
        Ok(())
    }

    /// The store is one keyspace: database 0.
    fn select(&mut self, call: &Call<'_, '_>, reply: &mut Vec<u8>) -> Result<(), CommandError> {
        let [index] = call.exactly()?;
        match parse_decimal(index) {
            Some(0) => encode_simple(reply, "OK"),
            Some(_) => return Err(CommandError::DatabaseOutOfRange),
            None => return Err(CommandError::NotAnInteger),
        }
        Ok(())
    }

    /// The `# Keyspace` counters are this executor's session's: under `kv
    /// serve`, the operations of every connection its worker served.
    fn info_text(&self) -> String {
        let stats = self.session.stats();
        let [begin, head, _, tail] = self.store.boundaries();
        let compactions = self.store.compaction_totals();
        format!(
            "# Server\r\n\
             server_name:remora-kv\r\n\
             remora_kv_version:{version}\r\n\
             protocol:RESP2\r\n\
             \r\n\
             # Keyspace\r\n\
             db0:device={device},operations={operations},in_place_updates={in_place},\
             copies_to_tail={copies},pending={pending},device_reads={device_reads}\r\n\
             \r\n\
             # Log\r\n\
             log:begin={begin},head={head},tail={tail},device_room_bytes={room},\
             compactions={compactions},records_copied={copied}\r\n",
            version = env!("CARGO_PKG_VERSION"),
            device = self.store.device_name(),
            operations = stats.operations,
            in_place = stats.in_place_updates,
            copies = stats.copies_to_tail,
            pending = stats.pending,
            device_reads = stats.device_reads,
            begin = begin.value(),
            head = head.value(),
            tail = tail.value(),
            room = self.store.device_room_bytes(),
            compactions = compactions.compactions,
            copied = compactions.records_copied,
        )
    }

    /// Appends `key`'s value as a bulk string, or null if it is absent.
    fn reply_with_value(&mut self, key: &[u8], reply: &mut Vec<u8>) -> Result<(), CommandError> {
        if self.read(key)? {
            encode_bulk(reply, &self.value);
        } else {
            encode_null(reply);
        }
        Ok(())
    }

    /// Reads `key` into `self.value`; `true` if it exists.
    fn read(&mut self, key: &[u8]) -> Result<bool, CommandError> {
        let context = self.fresh_context();
        let status = match self.session.read(key, &mut self.value, context)? {
            Status::Pending => self.complete_own(context)?,
            status => status,
        };
        Ok(status == Status::Found)
    }

    /// Adds `delta` to the decimal at `key` (a missing key counts as 0)
    /// and replies with the new number.
    fn add(&mut self, key: &[u8], delta: i64, reply: &mut Vec<u8>) -> Result<(), CommandError> {
        let update = Update::AddToDecimal(delta);
        let context = self.fresh_context();
        let status = self.session.rmw(key, update, &mut self.value, context)?;
        if status == Status::Pending {
            self.complete_own(context)?;
        }
        let number = parse_decimal(&self.value).ok_or(CommandError::NotAnInteger)?;
        encode_integer(reply, number);
        Ok(())
    }
}

impl Executor {
    /// Waits for the operation this command started under `context` and
    /// copies its value (a read's value or an RMW's new value) into
    /// `self.value`.
    ///
    /// The session may hold others: deferred GETs whose settle failed
    /// (their gaps already answered with the error) and whose reads come
    /// in now. Each of those once overwrote the value, so an MGET could
    /// answer with another key's value, or an INCR that was applied
    /// report "not an integer" (found by reading). They are kept for
    /// gaps a detached batch still has, and otherwise dropped.
    fn complete_own(&mut self, context: u64) -> Result<Status, CommandError> {
        let keep_others = self.detached > 0 || !self.deferred.is_empty();
        let (value, arrived) = (&mut self.value, &mut self.arrived);
        let mut result = None;
        self.session.complete_pending(true, &mut |completion| {
            if completion.context == context {
                value.clear();
                value.extend_from_slice(completion.value);
                result = Some(completion.result);
            } else if keep_others {
                arrived.insert(completion.context, Arrival::of(&completion));
            }
        })?;
        Ok(result.ok_or(CommandError::LostCompletion)??)
    }
}

fn check_key_lengths(mut lengths: impl Iterator<Item = usize>) -> Result<(), CommandError> {
    match lengths.find(|&length| length > MAX_KEY_BYTES) {
        Some(length) => Err(CommandError::Store(KvError::KeyTooLong { length })),
        None => Ok(()),
    }
}

fn check_value_lengths(mut lengths: impl Iterator<Item = usize>) -> Result<(), CommandError> {
    match lengths.find(|&length| length > MAX_VALUE_BYTES) {
        Some(length) => Err(CommandError::Store(KvError::ValueTooLong { length })),
        None => Ok(()),
    }
}

/// A name for an error message: at most [`QUOTED_NAME_BYTES`], lossily
/// decoded (the encoder turns any CR or LF into a space).
fn quoted(name: &[u8]) -> String {
    String::from_utf8_lossy(&name[..name.len().min(QUOTED_NAME_BYTES)]).into_owned()
}

/// The error for a command no one knows, worded as Redis 7 words it
/// (clients and tests match on it): the name cut at 128 bytes, then each
/// argument quoted and followed by a space, while what is quoted so far
/// is under 128 bytes, and the argument cut to what is left of them.
fn unknown_command(name: &[u8], arguments: &[Cow<'_, [u8]>]) -> CommandError {
    let mut quoted_arguments = String::new();
    for argument in arguments {
        let room = QUOTED_NAME_BYTES.saturating_sub(quoted_arguments.len());
        if room == 0 {
            break;
        }
        let shown = &argument[..argument.len().min(room)];
        quoted_arguments.push_str(&format!("'{}' ", String::from_utf8_lossy(shown)));
    }
    CommandError::Unknown {
        name: quoted(name),
        arguments: quoted_arguments,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::fails_once::FailsOnce;
    use crate::{MemoryDevice, StoreConfig};
    use std::sync::Arc;

    /// A store whose oldest records a few hundred writes push to the device.
    fn small_store() -> Store {
        let config = StoreConfig::smallest();
        Store::new(config, Arc::new(MemoryDevice::new(16 << 20))).unwrap()
    }

    fn run(executor: &mut Executor, arguments: &[&[u8]]) -> (String, Flow) {
        let arguments: Vec<Cow<'_, [u8]>> = arguments
            .iter()
            .map(|argument| Cow::Borrowed(*argument))
            .collect();
        let mut reply = Vec::new();
        let flow = executor.execute(&arguments, &mut reply);
        // A batch of one: the server settles at the end of each batch.
        executor.settle(&mut reply);
        (String::from_utf8_lossy(&reply).into_owned(), flow)
    }

    /// Runs `commands` as one batch (a pipeline), settled at its end: the
    /// replies, in order.
    fn batch_replies(executor: &mut Executor, commands: &[impl AsRef<str>]) -> Vec<u8> {
        let mut replies = Vec::new();
        for command in commands {
            let arguments: Vec<Cow<'_, [u8]>> = command
                .as_ref()
                .split(' ')
                .map(|word| Cow::Borrowed(word.as_bytes()))
                .collect();
            executor.execute(&arguments, &mut replies);
        }
        executor.settle(&mut replies);
        replies
    }

    fn reply(executor: &mut Executor, text: &str) -> String {
        let words: Vec<&[u8]> = text.split(' ').map(str::as_bytes).collect();
        run(executor, &words).0
    }

    #[test]
    fn strings_and_counters_behave_as_in_redis() {
        let mut executor = Executor::new(small_store()).unwrap();
        assert_eq!(reply(&mut executor, "GET k"), "$-1\r\n");
        assert_eq!(reply(&mut executor, "set k v"), "+OK\r\n");
        assert_eq!(reply(&mut executor, "GeT k"), "$1\r\nv\r\n");
        assert_eq!(reply(&mut executor, "INCR n"), ":1\r\n");
        assert_eq!(reply(&mut executor, "INCRBY n 41"), ":42\r\n");
        assert_eq!(reply(&mut executor, "DECRBY n 2"), ":40\r\n");
        assert_eq!(reply(&mut executor, "DECR n"), ":39\r\n");
        assert_eq!(reply(&mut executor, "EXISTS k n k missing"), ":3\r\n");
        assert_eq!(reply(&mut executor, "DEL k missing"), ":1\r\n");
        assert_eq!(reply(&mut executor, "DEL k"), ":0\r\n");
        assert_eq!(reply(&mut executor, "MSET a 1 b 2"), "+OK\r\n");
        assert_eq!(
            reply(&mut executor, "MGET a k b"),
            "*3\r\n$1\r\n1\r\n$-1\r\n$1\r\n2\r\n"
        );
    }

    #[test]
    fn errors_get_redis_wordings_and_leave_the_executor_usable() {
        let mut executor = Executor::new(small_store()).unwrap();
        let cases = [
            (
                "FLUSHALL",
                "-ERR unknown command 'FLUSHALL', with args beginning with: \r\n",
            ),
            (
                "GET",
                "-ERR wrong number of arguments for 'get' command\r\n",
            ),
            (
                "GET a b",
                "-ERR wrong number of arguments for 'get' command\r\n",
            ),
            (
                "MSET a 1 b",
                "-ERR wrong number of arguments for 'mset' command\r\n",
            ),
            (
                "PING a b",
                "-ERR wrong number of arguments for 'ping' command\r\n",
            ),
            ("SET k v EX 10", "-ERR syntax error\r\n"),
            (
                "INCRBY n x",
                "-ERR value is not an integer or out of range\r\n",
            ),
            (
                "DECRBY n -9223372036854775808",
                "-ERR decrement would overflow\r\n",
            ),
            ("SELECT 1", "-ERR DB index is out of range\r\n"),
            (
                "CONFIG SET save x",
                "-ERR unknown subcommand 'SET'. Try CONFIG HELP.\r\n",
            ),
            (
                "CONFIG GET",
                "-ERR wrong number of arguments for 'config|get' command\r\n",
            ),
        ];
        for (request, expected) in cases {
            assert_eq!(reply(&mut executor, request), expected, "{request}");
        }
        assert_eq!(reply(&mut executor, "SET word remora"), "+OK\r\n");
        assert_eq!(
            reply(&mut executor, "INCR word"),
            "-ERR value is not an integer or out of range\r\n"
        );
        assert_eq!(reply(&mut executor, "PING"), "+PONG\r\n");
    }

    #[test]
    fn over_long_keys_and_values_are_errors_and_nothing_is_half_written() {
        let mut executor = Executor::new(small_store()).unwrap();
        let long = vec![b'x'; MAX_VALUE_BYTES + 1];
        let (text, _) = run(&mut executor, &[b"SET", b"k", &long]);
        assert!(text.starts_with("-ERR a value of 4097 bytes"), "{text}");
        let (text, _) = run(&mut executor, &[b"MSET", b"first", b"1", b"k", &long]);
        assert!(text.starts_with("-ERR a value of"), "{text}");
        assert_eq!(reply(&mut executor, "EXISTS first"), ":0\r\n");
        let (text, _) = run(&mut executor, &[b"MGET", b"first", &long]);
        assert!(text.starts_with("-ERR a key of 4097 bytes"), "{text}");
    }

    #[test]
    fn administrative_commands_answer_so_that_clients_proceed() {
        let mut executor = Executor::new(small_store()).unwrap();
        assert_eq!(reply(&mut executor, "PING hello"), "$5\r\nhello\r\n");
        assert_eq!(reply(&mut executor, "CONFIG GET save"), "*0\r\n");
        assert_eq!(reply(&mut executor, "COMMAND DOCS"), "*0\r\n");
        assert_eq!(reply(&mut executor, "COMMAND"), "*0\r\n");
        assert_eq!(reply(&mut executor, "SELECT 0"), "+OK\r\n");
        assert_eq!(run(&mut executor, &[]), (String::new(), Flow::Continue));
        assert_eq!(
            run(&mut executor, &[b"quit"]),
            ("+OK\r\n".into(), Flow::Close)
        );
        let info = reply(&mut executor, "INFO");
        assert!(info.contains("# Server\r\nserver_name:remora-kv"), "{info}");
        assert!(info.contains("db0:device=memory,operations="), "{info}");
    }

    #[test]
    fn pipelined_gets_wait_for_the_device_together_and_answer_in_order() {
        let mut executor = Executor::new(small_store()).unwrap();
        for number in 0..8 {
            reply(&mut executor, &format!("SET key-{number} old-{number}"));
        }
        let filler = vec![b'f'; 1000];
        for number in 0..200 {
            let key = format!("filler-{number}");
            run(&mut executor, &[b"SET", key.as_bytes(), &filler]);
        }
        let pending_before = executor.stats().pending;
        // One batch: GETs of keys on the device, a SET in the middle, and
        // GETs after it; replies must come back in request order, the SET
        // seen only by the GETs after it.
        let mut batch = Vec::new();
        for number in 0..8 {
            batch.push(format!("GET key-{number}"));
        }
        batch.push("SET key-3 new-3".into());
        batch.push("GET key-3".into());
        batch.push("GET missing".into());
        let replies = batch_replies(&mut executor, &batch);
        let mut expected = String::new();
        for number in 0..8 {
            expected += &format!("$5\r\nold-{number}\r\n");
        }
        expected += "+OK\r\n$5\r\nnew-3\r\n$-1\r\n";
        assert_eq!(String::from_utf8_lossy(&replies), expected);
        assert!(
            executor.stats().pending >= pending_before + 8,
            "{:?}",
            executor.stats()
        );
    }

    /// Regression: a settle whose device poll failed left its GETs pending
    /// in the session, and the next batch reused their contexts, so their
    /// late completions indexed past the next batch's gaps (a panic).
    /// An executor on a device whose queues fail their first poll with a
    /// completion to deliver.
    fn executor_on_a_failing_device() -> Executor {
        let store = Store::new(
            StoreConfig::smallest(),
            Arc::new(FailsOnce::new(MemoryDevice::new(16 << 20))),
        )
        .unwrap();
        Executor::new(store).unwrap()
    }

    /// Writes enough to push the keys written before onto the device.
    fn push_earlier_keys_to_the_device(executor: &mut Executor) {
        let filler = vec![b'f'; 1000];
        for number in 0..200 {
            let key = format!("filler-{number}");
            run(executor, &[b"SET", key.as_bytes(), &filler]);
        }
    }

    /// MSET and DEL that failed part way replied a bare error while the
    /// keys before the failure stayed changed: the client could not tell
    /// a write that happened from one that did not. Redis's are atomic;
    /// these say how far they went.
    #[test]
    fn a_delete_that_fails_part_way_says_how_far_it_went() {
        let mut executor = executor_on_a_failing_device();
        reply(&mut executor, "SET old value");
        push_earlier_keys_to_the_device(&mut executor);
        reply(&mut executor, "SET new value");
        let text = reply(&mut executor, "DEL new old");
        assert!(
            text.starts_with("-ERR DEL deleted 1 keys before failing, which stay: "),
            "{text}"
        );
        assert_eq!(reply(&mut executor, "EXISTS new"), ":0\r\n");
        assert_eq!(reply(&mut executor, "EXISTS old"), ":1\r\n");
    }

    #[test]
    fn a_multiple_set_that_fails_part_way_says_how_far_it_went() {
        let config = StoreConfig::smallest();
        let store = Store::new(config, Arc::new(MemoryDevice::new(1 << 20))).unwrap();
        let mut executor = Executor::new(store).unwrap();
        let filler = vec![b'f'; 1000];
        let mut filled = false;
        for number in 0..10_000 {
            let key = format!("filler-{number}");
            let (text, _) = run(&mut executor, &[b"SET", key.as_bytes(), &filler]);
            if text.starts_with("-ERR") {
                filled = true;
                break;
            }
        }
        assert!(filled, "the device never filled");
        let big = vec![b'b'; MAX_VALUE_BYTES];
        let (text, _) = run(&mut executor, &[b"MSET", b"x", b"1", b"y", &big]);
        assert!(
            text.starts_with("-ERR MSET wrote the first 1 pairs before failing, which stay: "),
            "{text}"
        );
        assert_eq!(reply(&mut executor, "GET x"), "$1\r\n1\r\n");
        assert_eq!(reply(&mut executor, "EXISTS y"), ":0\r\n");
    }

    #[test]
    fn a_failed_settle_never_lets_stale_completions_into_the_next_batch() {
        let mut executor = executor_on_a_failing_device();
        reply(&mut executor, "SET first one");
        reply(&mut executor, "SET second two");
        push_earlier_keys_to_the_device(&mut executor);
        assert!(
            reply(&mut executor, "GET first").starts_with("-ERR"),
            "the injected failure"
        );
        assert_eq!(reply(&mut executor, "GET second"), "$3\r\ntwo\r\n");
        assert_eq!(reply(&mut executor, "GET first"), "$3\r\none\r\n");
    }

    /// A GET whose settle failed left its reads pending; the MGET after it
    /// waited on the session and took every completion as its own, the
    /// last one winning: the big value's second read came after the small
    /// key's read, and MGET answered with the big value.
    #[test]
    fn a_command_that_waits_takes_only_its_own_completion() {
        let mut executor = executor_on_a_failing_device();
        let big = vec![b'b'; 1000];
        run(&mut executor, &[b"SET", b"big", &big]);
        reply(&mut executor, "SET small tiny");
        reply(&mut executor, "SET counter 10");
        push_earlier_keys_to_the_device(&mut executor);
        let replies = batch_replies(&mut executor, &["GET big", "MGET small", "INCR counter"]);
        let replies = String::from_utf8_lossy(&replies);
        let (first, rest) = replies.split_once("\r\n").expect("three replies");
        assert!(first.starts_with("-ERR"), "the injected failure: {replies}");
        assert_eq!(rest, "*1\r\n$4\r\ntiny\r\n:11\r\n");
        assert_eq!(
            reply(&mut executor, "GET big").len(),
            "$1000\r\n".len() + 1002
        );
    }

    #[test]
    fn values_on_the_device_are_read_and_incremented_through_pending() {
        let mut executor = Executor::new(small_store()).unwrap();
        assert_eq!(reply(&mut executor, "SET counter 10"), "+OK\r\n");
        assert_eq!(reply(&mut executor, "SET first value"), "+OK\r\n");
        let filler = vec![b'f'; 1000];
        for number in 0..200 {
            let key = format!("filler-{number}");
            run(&mut executor, &[b"SET", key.as_bytes(), &filler]);
        }
        assert_eq!(reply(&mut executor, "GET first"), "$5\r\nvalue\r\n");
        assert_eq!(reply(&mut executor, "INCR counter"), ":11\r\n");
        assert_eq!(reply(&mut executor, "GET counter"), "$2\r\n11\r\n");
        assert!(executor.stats().pending >= 2, "{:?}", executor.stats());
    }
}
