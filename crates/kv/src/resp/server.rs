//! The TCP server: a few event-loop workers, each with one session,
//! serving many connections, as Redis serves them from one thread.
//!
//! A worker waits on all of its connections at once (`epoll`) and, for
//! each that has something, reads what has arrived, answers every whole
//! request in it and writes the replies with one write, so that a
//! pipelining client gets one segment back per segment it sent. A thread
//! per connection would instead pay a wake-up and a context switch for
//! every batch, and on a machine with few cores its waiting threads would
//! crowd out the clients and the emulated NICs.
//!
//! A worker serves in rounds. Each connection with something to do
//! answers one batch with its device reads detached; then the worker waits
//! for all of those reads at once, so that they overlap on the device
//! rather than queue one connection behind another; then each connection
//! fills in its replies and writes them. The worker suspends its session
//! before it waits on the network, so that it never holds up the store's
//! epoch while it waits. A client too slow to take its replies is read no
//! further until it does (the worker then waits for it to be writable
//! instead), so a connection holds at most one batch of replies. Every
//! worker wakes at least every [`POLL_INTERVAL`] to notice a stop.
//!
//! Workers accept from the shared listener themselves, after their round,
//! so that a client that closes and reconnects at once (redis-benchmark
//! between tests) is not refused for a connection whose close the server
//! had not yet seen.

use super::commands::{Deferred, Executor, Flow};
use super::protocol::{
    encode_error, parse_request, Parsed, ProtocolError, Request, MAX_REQUEST_BYTES,
};
use crate::{KvError, Store};
use rustix::event::epoll;
use rustix::fd::OwnedFd;
use std::io::{self, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The longest a worker waits on its sockets before looking at the stop
/// flag again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Bytes read from a socket at a time.
const READ_CHUNK_BYTES: usize = 16 * 1024;

/// Input held per connection: one incomplete request at most, plus what
/// one read brings.
const INPUT_BOUND_BYTES: usize = MAX_REQUEST_BYTES + READ_CHUNK_BYTES;

/// Replies a batch gathers before they are written. A batch of small
/// requests can ask for large replies (a buffer of GETs of 4 KiB values),
/// and this bounds what a connection holds.
const FLUSH_BYTES: usize = 64 * 1024;

/// Socket events a worker takes from one wait.
const EVENTS_PER_WAIT: usize = 256;

/// Connections a worker accepts in one round, so that a burst of them
/// does not keep it from the connections it serves.
const ACCEPTS_PER_ROUND: usize = 64;

/// How long a worker leaves the listener alone after a shortage of
/// descriptors or buffers. The listener is level-triggered, so a worker
/// that kept watching it would wake at once, fail to accept again, and
/// spin until a descriptor freed.
const SHORTAGE_PAUSE: Duration = Duration::from_millis(10);

/// The event token of the listener; connections' tokens are their slot
/// numbers.
const LISTENER_TOKEN: u64 = u64::MAX;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections served at once; one more is refused with
    /// `-ERR max number of clients reached`.
    pub max_connections: usize,
    /// Event-loop threads. Each holds one of the store's sessions and
    /// serves its share of the connections.
    pub workers: usize,
}

impl Default for ServerLimits {
    /// One worker, as Redis has one thread: on a small machine a second
    /// competes with the clients and the emulated NICs for the cores.
    fn default() -> ServerLimits {
        ServerLimits {
            max_connections: 1024,
            workers: 1,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("could not make the listener nonblocking: {0}")]
    Listener(#[source] io::Error),
    #[error("accepting a connection failed: {0}")]
    Accept(#[source] io::Error),
    #[error("a server needs at least one worker and room for one connection")]
    NoCapacity,
    #[error("a worker could not open a session: {0}")]
    Session(#[source] KvError),
    #[error("a worker could not set up its event loop: {0}")]
    EventLoop(#[source] io::Error),
    #[error("{0} worker thread(s) panicked")]
    WorkerPanicked(usize),
}

/// Serves RESP2 clients on `listener` until `stop` is set, then closes
/// every connection (within [`POLL_INTERVAL`]) and joins the workers.
/// The first worker runs on the calling thread.
pub fn serve(
    store: Store,
    listener: TcpListener,
    limits: ServerLimits,
    stop: Arc<AtomicBool>,
) -> Result<(), ServeError> {
    if limits.workers == 0 || limits.max_connections == 0 {
        return Err(ServeError::NoCapacity);
    }
    // Nonblocking, so that workers woken for the same connection do not
    // wait in accept.
    listener
        .set_nonblocking(true)
        .map_err(ServeError::Listener)?;
    let shared = Arc::new(Shared {
        listener,
        max_connections: limits.max_connections,
        live: AtomicUsize::new(0),
        stop,
        closing: AtomicBool::new(false),
    });
    let mut workers = (0..limits.workers)
        .map(|_| Worker::new(&store, shared.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let mut first = workers.remove(0);
    let mut threads = Vec::with_capacity(workers.len());
    for mut worker in workers {
        let spawned = std::thread::Builder::new()
            .name("remora-resp".into())
            .spawn(move || worker.run());
        match spawned {
            Ok(thread) => threads.push(thread),
            Err(error) => {
                shared.closing.store(true, Ordering::SeqCst);
                join_workers(threads);
                return Err(ServeError::EventLoop(error));
            }
        }
    }
    let served = first.run();
    drop(first);
    let (failure, panicked) = join_workers(threads);
    served?;
    if let Some(error) = failure {
        return Err(error);
    }
    match panicked {
        0 => Ok(()),
        count => Err(ServeError::WorkerPanicked(count)),
    }
}

/// Joins the workers; the first error one returned, and how many
/// panicked.
fn join_workers(threads: Vec<JoinHandle<Result<(), ServeError>>>) -> (Option<ServeError>, usize) {
    let mut failure = None;
    let mut panicked = 0;
    for thread in threads {
        match thread.join() {
            Ok(Ok(())) => {}
            Ok(Err(error)) => failure = failure.or(Some(error)),
            Err(_) => panicked += 1,
        }
    }
    (failure, panicked)
}

/// What the workers share.
struct Shared {
    listener: TcpListener,
    max_connections: usize,
    /// Connections open on every worker.
    live: AtomicUsize,
    /// The caller's stop.
    stop: Arc<AtomicBool>,
    /// Set when a worker fails, so that the others stop too.
    closing: AtomicBool,
}

impl Shared {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst) || self.closing.load(Ordering::SeqCst)
    }
}

/// One event loop: its connections, its session, and the listener.
struct Worker {
    poller: OwnedFd,
    shared: Arc<Shared>,
    executor: Executor,
    /// Connections by slot; a slot's number is its event token.
    connections: Vec<Option<Connection>>,
    free_slots: Vec<usize>,
    /// Connections that still had whole requests when their turn ended.
    again: Vec<usize>,
    /// Connections of the round in progress that began a batch, and how
    /// it ended (kept to reuse its allocation).
    begun: Vec<(usize, Batch)>,
    /// Set while the listener is out of the poller after a shortage: when
    /// it goes back in.
    accepting_again_at: Option<std::time::Instant>,
}

fn event_loop_error(errno: rustix::io::Errno) -> ServeError {
    ServeError::EventLoop(errno.into())
}

impl Worker {
    fn new(store: &Store, shared: Arc<Shared>) -> Result<Worker, ServeError> {
        let executor = Executor::new(store.clone()).map_err(ServeError::Session)?;
        let poller = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(event_loop_error)?;
        watch_listener(&poller, &shared.listener)?;
        Ok(Worker {
            poller,
            shared,
            executor,
            connections: Vec::new(),
            free_slots: Vec::new(),
            again: Vec::new(),
            begun: Vec::new(),
            accepting_again_at: None,
        })
    }

    /// Takes the listener out of the poller for [`SHORTAGE_PAUSE`].
    fn pause_accepting(&mut self) -> Result<(), ServeError> {
        epoll::delete(&self.poller, &self.shared.listener).map_err(event_loop_error)?;
        self.accepting_again_at = Some(std::time::Instant::now() + SHORTAGE_PAUSE);
        Ok(())
    }

    /// Puts the listener back once its pause is over.
    fn resume_accepting_when_due(&mut self) -> Result<(), ServeError> {
        match self.accepting_again_at {
            Some(at) if std::time::Instant::now() >= at => {
                watch_listener(&self.poller, &self.shared.listener)?;
                self.accepting_again_at = None;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Serves until the server stops; then closes this worker's
    /// connections. An error stops the other workers too.
    fn run(&mut self) -> Result<(), ServeError> {
        let served = self.serve_until_stopped();
        if served.is_err() {
            self.shared.closing.store(true, Ordering::SeqCst);
        }
        for slot in 0..self.connections.len() {
            self.close(slot);
        }
        served
    }

    fn serve_until_stopped(&mut self) -> Result<(), ServeError> {
        let mut events = Vec::with_capacity(EVENTS_PER_WAIT);
        let poll_interval = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: POLL_INTERVAL.as_nanos() as _,
        };
        let no_wait = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let pause = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: SHORTAGE_PAUSE.as_nanos() as _,
        };
        while !self.shared.stopping() {
            self.resume_accepting_when_due()?;
            // Idle, or about to be: the store's epoch may move on.
            self.executor.suspend();
            let timeout = match (self.again.is_empty(), self.accepting_again_at) {
                (false, _) => &no_wait,
                (true, Some(_)) => &pause,
                (true, None) => &poll_interval,
            };
            events.clear();
            let buffer = rustix::buffer::spare_capacity(&mut events);
            match epoll::wait(&self.poller, buffer, Some(timeout)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(errno) => return Err(event_loop_error(errno)),
            }
            let mut slots = std::mem::take(&mut self.again);
            let mut connecting = false;
            for event in &events {
                match event.data.u64() {
                    LISTENER_TOKEN => connecting = true,
                    slot => slots.push(slot as usize),
                }
            }
            self.serve_round(&once_each(slots));
            // After the round, so that connections that just closed no
            // longer count against the limit.
            if connecting {
                self.accept()?;
            }
        }
        Ok(())
    }

    /// Takes the connections waiting on the listener, a bounded number a
    /// round. Their first requests are not missed: the poller is
    /// level-triggered.
    fn accept(&mut self) -> Result<(), ServeError> {
        for _ in 0..ACCEPTS_PER_ROUND {
            match self.shared.listener.accept() {
                Ok((stream, _)) => self.admit(stream),
                Err(error) if concerns_one_connection(&error) => {}
                // None waiting: the listener wakes this worker again.
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                // None can be taken now: the connections go on being
                // served, and accepting resumes after a pause.
                Err(error) if is_shortage(&error) => return self.pause_accepting(),
                Err(error) => return Err(ServeError::Accept(error)),
            }
        }
        Ok(())
    }

    fn admit(&mut self, stream: TcpStream) {
        let live = &self.shared.live;
        // Counted before the check, so that workers accepting at the same
        // instant never pass the limit between them.
        if live.fetch_add(1, Ordering::SeqCst) >= self.shared.max_connections {
            live.fetch_sub(1, Ordering::SeqCst);
            return refuse(stream, "ERR max number of clients reached");
        }
        if !self.register(stream) {
            self.shared.live.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Adds an admitted connection to this worker's poller; `false` (the
    /// stream dropped, so closed) if the socket cannot be set up.
    fn register(&mut self, stream: TcpStream) -> bool {
        if configure(&stream).is_err() {
            return false;
        }
        let slot = self.free_slots.pop().unwrap_or_else(|| {
            self.connections.push(None);
            self.connections.len() - 1
        });
        let token = epoll::EventData::new_u64(slot as u64);
        if epoll::add(&self.poller, &stream, token, epoll::EventFlags::IN).is_err() {
            self.free_slots.push(slot);
            return false;
        }
        self.connections[slot] = Some(Connection::new(stream));
        true
    }

    /// A turn for each connection in `slots`, in three steps: each
    /// answers a batch with its device reads detached (one that needed
    /// none writes its replies at once); the worker waits for all of
    /// those reads at once, so that they overlap on the device rather
    /// than queue one connection behind another; then each fills in its
    /// replies and writes them.
    fn serve_round(&mut self, slots: &[usize]) {
        let mut begun = std::mem::take(&mut self.begun);
        for &slot in slots {
            let Some(connection) = self.connections.get_mut(slot).and_then(Option::as_mut) else {
                // Closed earlier in this round.
                continue;
            };
            if connection.in_round {
                // Both woken and left over from the last round.
                continue;
            }
            match connection.begin_turn(&mut self.executor) {
                // Answered from memory: written now, not held back by
                // other connections' device reads.
                Begun::Batch(batch) if connection.deferred.is_empty() => {
                    let turn = connection.finish_turn(batch, &mut self.executor);
                    self.conclude(slot, turn);
                }
                Begun::Batch(batch) => {
                    connection.in_round = true;
                    begun.push((slot, batch));
                }
                Begun::Over(turn) => self.conclude(slot, turn),
            }
        }
        self.executor.complete();
        for (slot, batch) in begun.drain(..) {
            let connection = self.connections[slot]
                .as_mut()
                .expect("a connection that began a batch stays open until it ends it");
            connection.in_round = false;
            let turn = connection.finish_turn(batch, &mut self.executor);
            self.conclude(slot, turn);
        }
        self.begun = begun;
    }

    /// Watches the connection for what its turn ended waiting for.
    fn conclude(&mut self, slot: usize, turn: Turn) {
        let Some(connection) = self.connections[slot].as_mut() else {
            return;
        };
        let interest = match turn {
            Turn::Read => epoll::EventFlags::IN,
            Turn::Write => epoll::EventFlags::OUT,
            Turn::Again => {
                self.again.push(slot);
                epoll::EventFlags::IN
            }
            Turn::Close => return self.close(slot),
        };
        if connection.interest != interest {
            let token = epoll::EventData::new_u64(slot as u64);
            if epoll::modify(&self.poller, &connection.stream, token, interest).is_err() {
                return self.close(slot);
            }
            connection.interest = interest;
        }
    }

    fn close(&mut self, slot: usize) {
        let Some(connection) = self.connections[slot].take() else {
            return;
        };
        // Closing the socket removes it from the poller as well; deleting
        // it first keeps that true even if the descriptor were shared.
        let _ = epoll::delete(&self.poller, &connection.stream);
        drop(connection);
        self.free_slots.push(slot);
        self.shared.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Watches the listener for connections. Exclusive: a connection arriving
/// wakes one worker, not all.
fn watch_listener(poller: &OwnedFd, listener: &TcpListener) -> Result<(), ServeError> {
    let flags = epoll::EventFlags::IN | epoll::EventFlags::EXCLUSIVE;
    let token = epoll::EventData::new_u64(LISTENER_TOKEN);
    epoll::add(poller, listener, token, flags).map_err(event_loop_error)
}

/// The connections of a round, each once: one both due again (its last
/// turn ended `Again`) and readable was served twice, ended both turns
/// `Again`, was due twice the next round, and so on: a busy pipelining
/// client took ever more turns a round, and the list grew without bound.
fn once_each(mut slots: Vec<usize>) -> Vec<usize> {
    slots.sort_unstable();
    slots.dedup();
    slots
}

/// Accept errors that concern one connection only: the next may be taken.
/// accept(2) passes on a pending network error of the new connection
/// (EPROTO, ENETDOWN, EHOSTUNREACH and the rest its man page lists, and
/// EPERM from a firewall rule); each stopped the whole server.
fn concerns_one_connection(error: &io::Error) -> bool {
    let kind = matches!(
        error.kind(),
        io::ErrorKind::Interrupted
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    );
    let network = [
        libc::EPROTO,
        libc::ENOPROTOOPT,
        libc::ENETDOWN,
        libc::ENONET,
        libc::EHOSTDOWN,
        libc::EHOSTUNREACH,
        libc::ENETUNREACH,
        libc::EOPNOTSUPP,
        libc::EPERM,
    ];
    kind || error
        .raw_os_error()
        .is_some_and(|errno| network.contains(&errno))
}

/// A passing shortage (no file descriptors or buffers left), after which
/// the server keeps serving and accepts again later.
fn is_shortage(error: &io::Error) -> bool {
    let shortage = [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM];
    error
        .raw_os_error()
        .is_some_and(|code| shortage.contains(&code))
}

/// Answers `message` as an error and closes. Best effort: the connection
/// is being turned away, and nobody is left to tell if the write fails.
fn refuse(mut stream: TcpStream, message: &str) {
    let mut reply = Vec::new();
    encode_error(&mut reply, message);
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(POLL_INTERVAL));
    let _ = stream.write_all(&reply);
    let _ = stream.shutdown(Shutdown::Write);
}

fn configure(stream: &TcpStream) -> io::Result<()> {
    // An accepted socket may inherit the listener's mode on some
    // systems; the event loop needs a nonblocking one either way.
    stream.set_nonblocking(true)?;
    // Replies go out as soon as they are written: a client waiting for
    // them is not going to send more first.
    stream.set_nodelay(true)
}

/// What a connection waits for after its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// More requests.
    Read,
    /// The client to take the replies held.
    Write,
    /// Nothing: whole requests are left, for another turn soon.
    Again,
    Close,
}

/// Requests a batch parses before it answers them, so that their keys'
/// index buckets load together rather than one cache miss after another:
/// the depth redis-benchmark pipelines at (`-P 16`).
const PREFETCH_WINDOW: usize = 16;

/// How parsing a window of requests ended.
enum WindowEnd {
    /// The window filled; more requests may follow.
    More,
    /// The input ends in an incomplete request, or at a request's end.
    Incomplete,
    /// The input breaks the protocol after the window's requests.
    Invalid(ProtocolError),
}

/// Up to [`PREFETCH_WINDOW`] whole requests from the front of `input`.
fn parse_window(input: &[u8]) -> (Vec<Request<'_>>, WindowEnd) {
    let mut window = Vec::with_capacity(PREFETCH_WINDOW);
    let mut scanned = 0;
    while window.len() < PREFETCH_WINDOW {
        match parse_request(&input[scanned..]) {
            Ok(Parsed::Incomplete) => return (window, WindowEnd::Incomplete),
            Ok(Parsed::Request(request)) => {
                scanned += request.consumed;
                window.push(request);
            }
            Err(error) => return (window, WindowEnd::Invalid(error)),
        }
    }
    (window, WindowEnd::More)
}

/// How the first half of a turn ended.
enum Begun {
    /// A batch was answered, its device reads still to wait for.
    Batch(Batch),
    /// The turn is over without a batch.
    Over(Turn),
}

/// How answering a batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Batch {
    /// No whole request is left in the input.
    Drained,
    /// The replies reached the flush limit; whole requests may be left.
    Full,
    /// The client asked to close.
    Close,
    /// The client broke the protocol: the error is answered, and the
    /// connection closes, since where the next request starts is unknown.
    Invalid,
}

impl Batch {
    fn closes(self) -> bool {
        matches!(self, Batch::Close | Batch::Invalid)
    }
}

/// Answers the whole requests at the front of `input`, in order, until
/// the replies in `output` reach `flush_bytes`: the server's batch, with
/// no I/O, so the fuzz harness runs the very loop the server does. GETs
/// that went to the device are left as gaps in the replies. `inspect`
/// sees each request just before it runs, with the input left from its
/// start. Returns the bytes of input consumed and how the batch ended.
pub(crate) fn answer_requests(
    executor: &mut Executor,
    input: &[u8],
    output: &mut Vec<u8>,
    flush_bytes: usize,
    inspect: &mut dyn FnMut(&Request<'_>, usize),
) -> (usize, Batch) {
    let mut consumed = 0;
    // Bounded: each window consumes at least one request, or ends the loop.
    loop {
        let (window, end) = parse_window(&input[consumed..]);
        for request in &window {
            executor.prefetch(&request.arguments);
        }
        for request in &window {
            if output.len() >= flush_bytes {
                return (consumed, Batch::Full);
            }
            inspect(request, input.len() - consumed);
            consumed += request.consumed;
            if executor.execute(&request.arguments, output) == Flow::Close {
                return (consumed, Batch::Close);
            }
        }
        match end {
            WindowEnd::More => {}
            WindowEnd::Incomplete => return (consumed, Batch::Drained),
            WindowEnd::Invalid(error) => {
                encode_error(output, &format!("ERR Protocol error: {error}"));
                return (consumed, Batch::Invalid);
            }
        }
    }
}

/// Bytes a connection's input and output buffers keep between bursts.
const KEPT_BUFFER_BYTES: usize = 64 << 10;

struct Connection {
    stream: TcpStream,
    /// Bytes read and not yet answered: at most one incomplete request
    /// plus one read ([`INPUT_BOUND_BYTES`]).
    input: Vec<u8>,
    /// Replies of the last batch, written up to `written`.
    output: Vec<u8>,
    written: usize,
    /// Set when the connection closes once its replies are written.
    ending: bool,
    /// Cleared when a read finds that the client has closed its side.
    client_open: bool,
    /// The current batch's GETs that went to the device.
    deferred: Deferred,
    /// Set while the connection has a batch in the worker's round.
    in_round: bool,
    /// What the poller watches the socket for.
    interest: epoll::EventFlags,
}

impl Connection {
    fn new(stream: TcpStream) -> Connection {
        Connection {
            stream,
            input: Vec::new(),
            output: Vec::new(),
            written: 0,
            ending: false,
            client_open: true,
            deferred: Deferred::default(),
            in_round: false,
            interest: epoll::EventFlags::IN,
        }
    }

    /// The first half of a turn: writes the replies still held, reads
    /// what has arrived and answers a batch of it, its device reads
    /// detached. An I/O error (the client reset the connection) closes
    /// this connection only: there is no one to report it to.
    fn begin_turn(&mut self, executor: &mut Executor) -> Begun {
        self.try_begin_turn(executor)
            .unwrap_or(Begun::Over(Turn::Close))
    }

    fn try_begin_turn(&mut self, executor: &mut Executor) -> io::Result<Begun> {
        if !self.write_held()? {
            return Ok(Begun::Over(Turn::Write));
        }
        if self.ending {
            return self.end().map(Begun::Over);
        }
        self.client_open = self.fill()?;
        let batch = self.answer_batch(executor);
        self.deferred = executor.detach();
        Ok(Begun::Batch(batch))
    }

    /// The second half, once the worker has waited for the device: fills
    /// in the replies of the batch's detached reads and writes the batch.
    fn finish_turn(&mut self, batch: Batch, executor: &mut Executor) -> Turn {
        executor.fill(std::mem::take(&mut self.deferred), &mut self.output);
        self.ending = batch.closes();
        self.try_finish_turn(batch).unwrap_or(Turn::Close)
    }

    fn try_finish_turn(&mut self, batch: Batch) -> io::Result<Turn> {
        if !self.write_held()? {
            return Ok(Turn::Write);
        }
        match batch {
            Batch::Close | Batch::Invalid => self.end(),
            Batch::Drained if self.client_open => Ok(Turn::Read),
            // The client has closed its side and everything it sent is
            // answered.
            Batch::Drained => Ok(Turn::Close),
            Batch::Full => Ok(Turn::Again),
        }
    }

    fn end(&mut self) -> io::Result<Turn> {
        self.stream.shutdown(Shutdown::Write)?;
        Ok(Turn::Close)
    }

    /// Reads what has arrived, up to the input bound; `false` once the
    /// client has closed its side.
    fn fill(&mut self) -> io::Result<bool> {
        // Each read adds at least a byte, so this ends within the bound.
        while self.input.len() < INPUT_BOUND_BYTES {
            self.input.reserve(READ_CHUNK_BYTES);
            let buffer = rustix::buffer::spare_capacity(&mut self.input);
            match rustix::io::read(&self.stream, buffer) {
                Ok(0) => return Ok(false),
                Ok(_) => {}
                Err(rustix::io::Errno::AGAIN) => break,
                Err(rustix::io::Errno::INTR) => {}
                Err(errno) => return Err(errno.into()),
            }
        }
        Ok(true)
    }

    /// Answers the whole requests at the front of the input (see
    /// [`answer_requests`]) until the replies fill [`FLUSH_BYTES`], and
    /// drops them from it.
    fn answer_batch(&mut self, executor: &mut Executor) -> Batch {
        debug_assert!(self.output.is_empty(), "the last batch was written");
        let (consumed, batch) = answer_requests(
            executor,
            &self.input,
            &mut self.output,
            FLUSH_BYTES,
            &mut |_, _| {},
        );
        self.input.drain(..consumed);
        debug_assert!(batch != Batch::Drained || self.input.len() <= MAX_REQUEST_BYTES);
        // A burst of large requests grew the buffer to megabytes: give
        // them back once the burst is answered, so idle connections do not
        // each keep the most they ever held.
        if self.input.capacity() > KEPT_BUFFER_BYTES {
            self.input
                .shrink_to(KEPT_BUFFER_BYTES.max(self.input.len()));
        }
        batch
    }

    /// Writes the held replies; `false` while the client is not taking
    /// them.
    fn write_held(&mut self) -> io::Result<bool> {
        // Each write takes at least a byte, so this ends.
        while self.written < self.output.len() {
            match self.stream.write(&self.output[self.written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(length) => self.written += length,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
        }
        self.output.clear();
        self.written = 0;
        // As for the input: a large MGET's replies are not kept for good.
        self.output.shrink_to(KEPT_BUFFER_BYTES);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_due_again_and_readable_is_served_once_a_round() {
        assert_eq!(once_each(vec![3, 1, 3, 2, 1]), vec![1, 2, 3]);
    }

    /// A new connection's pending network error, passed on by accept(2),
    /// stopped the whole server; it costs that connection only.
    #[test]
    fn an_accept_error_of_one_connection_does_not_stop_the_server() {
        for errno in [
            libc::EPROTO,
            libc::ENETUNREACH,
            libc::EHOSTUNREACH,
            libc::EPERM,
        ] {
            let error = io::Error::from_raw_os_error(errno);
            assert!(concerns_one_connection(&error), "{error}");
        }
        // A listener's own failure still ends the serving.
        assert!(!concerns_one_connection(&io::Error::from_raw_os_error(
            libc::EBADF
        )));
    }

    /// A large MGET's replies grew the output buffer for good: with
    /// hundreds of connections, gigabytes were kept for idle clients.
    #[test]
    fn a_connection_gives_back_a_large_reply_buffer_once_written() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (served, _) = listener.accept().unwrap();
        let mut connection = Connection::new(served);
        connection.output = Vec::with_capacity(4 << 20);
        connection.output.extend_from_slice(b"+OK\r\n");
        assert!(connection.write_held().unwrap());
        assert!(connection.output.capacity() <= KEPT_BUFFER_BYTES);
        let mut reply = [0u8; 5];
        std::io::Read::read_exact(&mut &client, &mut reply).unwrap();
        assert_eq!(&reply, b"+OK\r\n");
    }
}
