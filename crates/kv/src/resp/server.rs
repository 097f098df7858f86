//! The TCP server: one thread per connection, each with its own session.
//!
//! A connection reads what has arrived, answers every whole request in
//! it, and writes the replies of the batch with one write, so that a
//! pipelining client gets one segment back per segment it sent. Before
//! it waits on the network (to read, or to write to a slow client) it
//! suspends its session, so that no connection holds up the store's
//! epoch while it waits. Sockets wait with short timeouts, so that every
//! thread notices a stop within [`POLL_INTERVAL`].

use super::commands::{Executor, Flow};
use super::protocol::{encode_error, parse_request, Parsed, MAX_REQUEST_BYTES};
use crate::Store;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a connection waits on its socket before looking at the stop
/// flag again.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// How long the accept loop sleeps when no connection is waiting: short,
/// because a client's first request waits for it.
const ACCEPT_INTERVAL: Duration = Duration::from_millis(2);

/// Bytes read from a socket at a time.
const READ_CHUNK_BYTES: usize = 16 * 1024;

/// Replies held before writing in the middle of a batch. A batch of small
/// requests can ask for large replies (a buffer of GETs of 4 KiB values),
/// and this bounds what a connection holds.
const FLUSH_BYTES: usize = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections served at once; one more is refused with
    /// `-ERR max number of clients reached`. Each holds a session, so
    /// keep this within the store's `sessions` less those used elsewhere.
    pub max_connections: usize,
}

impl Default for ServerLimits {
    /// Half of the default store's 64 sessions, leaving the rest to other
    /// users of the store.
    fn default() -> ServerLimits {
        ServerLimits {
            max_connections: 32,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("could not make the listener nonblocking: {0}")]
    Listener(#[source] io::Error),
    #[error("accepting a connection failed: {0}")]
    Accept(#[source] io::Error),
    #[error("{0} connection thread(s) panicked")]
    ConnectionPanicked(usize),
}

/// Serves RESP2 clients on `listener` until `stop` is set, then closes
/// every connection (within [`POLL_INTERVAL`]) and joins its thread.
pub fn serve(
    store: Store,
    listener: TcpListener,
    limits: ServerLimits,
    stop: Arc<AtomicBool>,
) -> Result<(), ServeError> {
    // Nonblocking, so that the loop sees `stop` without a connection
    // arriving.
    listener
        .set_nonblocking(true)
        .map_err(ServeError::Listener)?;
    let mut acceptor = Acceptor {
        store,
        limits,
        closing: Arc::new(AtomicBool::new(false)),
        connections: Vec::new(),
        panicked: 0,
    };
    let accepted = acceptor.accept_until(&listener, &stop);
    let panicked = acceptor.close_all();
    accepted?;
    match panicked {
        0 => Ok(()),
        count => Err(ServeError::ConnectionPanicked(count)),
    }
}

struct Acceptor {
    store: Store,
    limits: ServerLimits,
    /// Set when the accept loop ends for any reason; the connections
    /// watch this rather than the caller's flag, so that they also close
    /// when accepting fails.
    closing: Arc<AtomicBool>,
    connections: Vec<JoinHandle<()>>,
    panicked: usize,
}

impl Acceptor {
    fn accept_until(
        &mut self,
        listener: &TcpListener,
        stop: &AtomicBool,
    ) -> Result<(), ServeError> {
        while !stop.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((stream, _)) => self.admit(stream),
                Err(error) if is_passing(&error) => std::thread::sleep(ACCEPT_INTERVAL),
                Err(error) => return Err(ServeError::Accept(error)),
            }
        }
        Ok(())
    }

    fn admit(&mut self, stream: TcpStream) {
        self.reap();
        if self.connections.len() >= self.limits.max_connections {
            refuse(stream, "ERR max number of clients reached");
            return;
        }
        let store = self.store.clone();
        let closing = self.closing.clone();
        let spawned = std::thread::Builder::new()
            .name("remora-resp".into())
            .spawn(move || serve_connection(store, stream, &closing));
        // A thread that cannot start drops its stream, closing the
        // connection; the server goes on with the others.
        if let Ok(handle) = spawned {
            self.connections.push(handle);
        }
    }

    /// Joins the threads whose connections have ended, so that they stop
    /// counting against the limit. A thread finishes only after its
    /// session is dropped, so its slot is free again by then.
    fn reap(&mut self) {
        let (finished, running) = std::mem::take(&mut self.connections)
            .into_iter()
            .partition(|handle| handle.is_finished());
        self.connections = running;
        self.join(finished);
    }

    /// Tells every connection to close and joins them; returns how many
    /// threads panicked.
    fn close_all(&mut self) -> usize {
        self.closing.store(true, Ordering::SeqCst);
        let connections = std::mem::take(&mut self.connections);
        self.join(connections);
        self.panicked
    }

    fn join(&mut self, handles: Vec<JoinHandle<()>>) {
        for handle in handles {
            if handle.join().is_err() {
                self.panicked += 1;
            }
        }
    }
}

/// Accept errors that concern one connection or a passing shortage (no
/// file descriptors left), after which the server keeps accepting.
fn is_passing(error: &io::Error) -> bool {
    let kind_passes = matches!(
        error.kind(),
        io::ErrorKind::WouldBlock
            | io::ErrorKind::Interrupted
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    );
    let shortage = [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM];
    kind_passes
        || error
            .raw_os_error()
            .is_some_and(|code| shortage.contains(&code))
}

/// A socket wait that ran out (or was interrupted): time to look at the
/// stop flag and wait again.
fn is_timeout(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
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

fn serve_connection(store: Store, stream: TcpStream, closing: &AtomicBool) {
    if configure(&stream).is_err() {
        return;
    }
    let executor = match Executor::new(store) {
        Ok(executor) => executor,
        Err(error) => return refuse(stream, &format!("ERR {error}")),
    };
    let mut connection = Connection {
        stream,
        executor,
        input: Vec::new(),
        output: Vec::new(),
        closing,
    };
    // An I/O error (the client reset the connection, or stopped reading
    // while the server stops) ends this connection only; there is no one
    // to report it to.
    let _ = connection.run();
}

fn configure(stream: &TcpStream) -> io::Result<()> {
    // An accepted socket may inherit the listener's nonblocking mode on
    // some systems; the timeouts below need a blocking one.
    stream.set_nonblocking(false)?;
    // Replies go out as soon as they are written: a client waiting for
    // them is not going to send more first.
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(POLL_INTERVAL))?;
    stream.set_write_timeout(Some(POLL_INTERVAL))
}

struct Connection<'a> {
    stream: TcpStream,
    executor: Executor,
    /// Bytes read and not yet answered: at most one incomplete request
    /// ([`MAX_REQUEST_BYTES`]) plus one read.
    input: Vec<u8>,
    /// Replies not yet written.
    output: Vec<u8>,
    closing: &'a AtomicBool,
}

impl Connection<'_> {
    fn run(&mut self) -> io::Result<()> {
        while self.fill()? {
            let flow = self.answer_batch();
            self.flush()?;
            if flow == Flow::Close {
                return self.stream.shutdown(Shutdown::Write);
            }
        }
        Ok(())
    }

    /// Waits for bytes and appends them to the input; `false` when the
    /// client has closed or the server is stopping.
    fn fill(&mut self) -> io::Result<bool> {
        self.executor.suspend();
        let mut chunk = [0; READ_CHUNK_BYTES];
        loop {
            if self.closing.load(Ordering::SeqCst) {
                return Ok(false);
            }
            match self.stream.read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(length) => {
                    self.input.extend_from_slice(&chunk[..length]);
                    return Ok(true);
                }
                Err(error) if is_timeout(&error) => continue,
                Err(error) => return Err(error),
            }
        }
    }

    /// Answers every whole request in the input, in order, and drops
    /// them from it. A protocol error is answered and closes the
    /// connection, since where the next request starts is unknown.
    fn answer_batch(&mut self) -> Flow {
        let mut consumed = 0;
        let flow = loop {
            match parse_request(&self.input[consumed..]) {
                Ok(Parsed::Incomplete) => break Flow::Continue,
                Ok(Parsed::Request(request)) => {
                    consumed += request.consumed;
                    if self.executor.execute(&request.arguments, &mut self.output) == Flow::Close {
                        break Flow::Close;
                    }
                }
                Err(error) => {
                    encode_error(&mut self.output, &format!("ERR Protocol error: {error}"));
                    break Flow::Close;
                }
            }
            if self.output.len() >= FLUSH_BYTES && self.flush().is_err() {
                break Flow::Close;
            }
        };
        // The batch's GETs that went to the device are answered together.
        self.executor.settle(&mut self.output);
        self.input.drain(..consumed);
        debug_assert!(flow == Flow::Close || self.input.len() <= MAX_REQUEST_BYTES);
        flow
    }

    /// Writes the held replies, waiting for a slow client as long as the
    /// server is not stopping.
    fn flush(&mut self) -> io::Result<()> {
        self.executor.settle(&mut self.output);
        self.executor.suspend();
        let mut written = 0;
        while written < self.output.len() {
            match self.stream.write(&self.output[written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(length) => written += length,
                Err(error) if is_timeout(&error) && !self.closing.load(Ordering::SeqCst) => {}
                Err(error) => return Err(error),
            }
        }
        self.output.clear();
        Ok(())
    }
}
