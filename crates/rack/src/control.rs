//! The control channel: how a compute node learns a memory node's queue
//! pair and region, and the memory node learns the compute node's, with
//! nothing hard-coded. One JSON line each way over a Unix socket (one
//! host, including across network namespaces, which share the
//! filesystem) or TCP (racks spanning hosts), as `rdma_cm` or a TCP side
//! channel does on real hardware.

use crate::endpoint::{lock, DriverKicker, NodeEndpoint, Shared};
use crate::RackError;
use remora_rnic::*;
use remora_wire::{Ipv4Address, MacAddress, Psn, Qpn, Rkey, VirtAddr};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The longest control message accepted, so a confused peer cannot make a
/// node buffer without bound.
const MAX_MESSAGE_BYTES: u64 = 64 * 1024;
/// Queue pairs one memory node serves.
pub const MAX_CLIENTS: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointMessage {
    pub qpn: u32,
    pub address: [u8; 4],
    pub mac: [u8; 6],
    pub initial_psn: u32,
}

impl From<QueuePairEndpoint> for EndpointMessage {
    fn from(endpoint: QueuePairEndpoint) -> Self {
        EndpointMessage {
            qpn: endpoint.qpn.value(),
            address: endpoint.address.0,
            mac: endpoint.mac.0,
            initial_psn: endpoint.initial_psn.value(),
        }
    }
}

/// QPNs 0 and 1 are InfiniBand's special queue pairs (SMI and GSI): no
/// reliable connection ever ends there.
const FIRST_CONNECTABLE_QPN: u32 = 2;

impl TryFrom<EndpointMessage> for QueuePairEndpoint {
    type Error = RackError;
    fn try_from(message: EndpointMessage) -> Result<Self, RackError> {
        if message.qpn < FIRST_CONNECTABLE_QPN {
            return Err(RackError::Control(format!(
                "QPN {} is reserved (0 and 1 are the special queue pairs), not a connectable queue pair",
                message.qpn
            )));
        }
        let qpn = Qpn::new(message.qpn)
            .ok_or_else(|| RackError::Control(format!("QPN {:#x} is out of range", message.qpn)))?;
        // A PSN is 24 bits: a larger one would be cut silently, and the
        // two ends would disagree on where the connection starts.
        if message.initial_psn > Psn::MAX {
            return Err(RackError::Control(format!(
                "initial PSN {:#x} does not fit 24 bits",
                message.initial_psn
            )));
        }
        Ok(QueuePairEndpoint {
            qpn,
            address: Ipv4Address(message.address),
            mac: MacAddress(message.mac),
            initial_psn: Psn::new(message.initial_psn),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionMessage {
    pub address: u64,
    pub rkey: u32,
    pub length_bytes: u64,
}

impl RegionMessage {
    pub fn remote(&self, offset_bytes: u64) -> RemoteAddress {
        RemoteAddress {
            address: VirtAddr(self.address + offset_bytes),
            rkey: Rkey(self.rkey),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    Connect {
        client: String,
        endpoint: EndpointMessage,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Connected {
        endpoint: EndpointMessage,
        region: RegionMessage,
    },
    Refused {
        reason: String,
    },
}

/// The client's last word after a `Connected` reply: it has the reply.
/// A client that hung up before reading it may still have let the
/// server's write succeed (the socket buffered it); without this word,
/// within `CLIENT_TIMEOUT`, the server destroys the queue pair it made,
/// which nobody would ever use. The client does not wait to hear that
/// its word arrived (that would need a word back, and so on): one that
/// stalled past the timeout between reading the reply and confirming it
/// holds a queue pair whose peer is gone, and its first operations fail.
/// A client from before this word never confirms, so its queue pairs are
/// destroyed: both ends of a rack must be of one version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Confirm {
    Received,
}

/// Where a node's control channel listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlAddress {
    Unix(PathBuf),
    Tcp(String),
}

impl std::fmt::Display for ControlAddress {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControlAddress::Unix(path) => write!(formatter, "unix:{}", path.display()),
            ControlAddress::Tcp(address) => write!(formatter, "tcp:{address}"),
        }
    }
}

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

/// How long a connected client may take to send its request, to read the
/// reply, and to confirm it: a client that says nothing holds the server,
/// which serves one client at a time, up to three times this.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);

trait Stream: std::io::Read + Write {
    fn set_timeouts(&self, timeout: Duration) -> std::io::Result<()>;
}

impl Stream for UnixStream {
    fn set_timeouts(&self, timeout: Duration) -> std::io::Result<()> {
        self.set_nonblocking(false)?;
        self.set_read_timeout(Some(timeout))?;
        self.set_write_timeout(Some(timeout))
    }
}

impl Stream for TcpStream {
    fn set_timeouts(&self, timeout: Duration) -> std::io::Result<()> {
        self.set_nonblocking(false)?;
        self.set_read_timeout(Some(timeout))?;
        self.set_write_timeout(Some(timeout))
    }
}

fn control_error(context: &str, error: impl std::fmt::Display) -> RackError {
    RackError::Control(format!("{context}: {error}"))
}

/// A stream read against one deadline for a whole message. The stream's
/// own timeout bounds each read alone: a peer sending a byte every few
/// seconds held a reader for hours (64 KiB of them).
struct DeadlineReader<'a> {
    stream: &'a mut dyn Stream,
    deadline: Instant,
}

impl std::io::Read for DeadlineReader<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_timeouts(left)?;
        self.stream.read(buffer)
    }
}

/// Reads one message, all of it within `within`.
fn read_message<T: for<'de> Deserialize<'de>>(
    stream: &mut dyn Stream,
    within: Duration,
) -> Result<T, RackError> {
    let mut line = String::new();
    let reader = DeadlineReader {
        stream,
        deadline: Instant::now() + within,
    };
    BufReader::new(std::io::Read::take(reader, MAX_MESSAGE_BYTES))
        .read_line(&mut line)
        .map_err(|error| control_error("read", error))?;
    serde_json::from_str(&line).map_err(|error| control_error("malformed message", error))
}

fn write_message(stream: &mut dyn Stream, message: &impl Serialize) -> Result<(), RackError> {
    let mut line = serde_json::to_vec(message).map_err(|error| control_error("encode", error))?;
    line.push(b'\n');
    stream
        .write_all(&line)
        .map_err(|error| control_error("write", error))
}

/// The longest one TCP connect attempt waits: blocked in the kernel's SYN
/// retries (about two minutes to a host that drops them), a connect heard
/// neither the request's timeout nor a stop.
const CONNECT_ATTEMPT: Duration = Duration::from_secs(1);

/// Connects to `host` ("name:port"), each address it resolves to for at
/// most `within` (at least a millisecond).
fn connect_tcp(host: &str, within: Duration) -> std::io::Result<TcpStream> {
    use std::net::ToSocketAddrs;
    let within = within.max(Duration::from_millis(1));
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
    for address in host.to_socket_addrs()? {
        match TcpStream::connect_timeout(&address, within) {
            Ok(stream) => return Ok(stream),
            Err(error) => last = error,
        }
    }
    Err(last)
}

/// Asks the memory node at `address` for a connection, retrying while it
/// is not up yet, until `timeout` or until `stop` is set.
pub fn request(
    address: &ControlAddress,
    request: &Request,
    timeout: Duration,
    stop: &AtomicBool,
) -> Result<Reply, RackError> {
    let started = Instant::now();
    let mut stream: Box<dyn Stream> = loop {
        if stop.load(Ordering::Relaxed) {
            // Stopped, not a control-channel fault.
            return Err(RackError::Stopped("connecting to a memory node"));
        }
        let attempt: std::io::Result<Box<dyn Stream>> = match address {
            ControlAddress::Unix(path) => {
                UnixStream::connect(path).map(|stream| Box::new(stream) as Box<dyn Stream>)
            }
            ControlAddress::Tcp(host) => {
                let left = timeout.saturating_sub(started.elapsed());
                connect_tcp(host, left.min(CONNECT_ATTEMPT))
                    .map(|stream| Box::new(stream) as Box<dyn Stream>)
            }
        };
        match attempt {
            Ok(stream) => break stream,
            Err(error) if started.elapsed() > timeout => {
                return Err(control_error(
                    &format!("no answer from {address} within {timeout:?}"),
                    error,
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    stream
        .set_timeouts(timeout)
        .map_err(|error| control_error("set timeouts", error))?;
    write_message(stream.as_mut(), request)?;
    let reply = read_message(stream.as_mut(), timeout)?;
    if matches!(reply, Reply::Connected { .. }) {
        // Unconfirmed, the server takes its queue pair back.
        write_message(stream.as_mut(), &Confirm::Received)?;
    }
    Ok(reply)
}

/// Asks the memory node at `address` to connect a queue pair made from
/// `builder` on this node's NIC, completes the handshake and wakes the
/// fabric: the connected queue pair and the region the node offers.
pub fn connect_queue_pair(
    endpoint: &Shared<NodeEndpoint>,
    kicker: &DriverKicker,
    client: &str,
    builder: &QueuePairBuilder,
    address: &ControlAddress,
    stop: &AtomicBool,
) -> Result<(QueuePair, RegionMessage), RackError> {
    const CONTROL_TIMEOUT: Duration = Duration::from_secs(20);
    let prepared = lock(endpoint).rnic.create_queue_pair(builder)?;
    let message = Request::Connect {
        client: client.to_string(),
        endpoint: prepared.endpoint.into(),
    };
    let connected = request(address, &message, CONTROL_TIMEOUT, stop).and_then(|reply| {
        let (remote, region) = match reply {
            Reply::Connected { endpoint, region } => (endpoint, region),
            Reply::Refused { reason } => {
                return Err(RackError::Control(format!("{address} refused: {reason}")))
            }
        };
        let queue_pair = lock(endpoint)
            .rnic
            .handshake(prepared, remote.try_into()?)?;
        Ok((queue_pair, region))
    });
    if connected.is_err() {
        // Left behind, each failed try held a queue pair: a client that
        // retried used up the NIC's (found by reading).
        let _ = lock(endpoint).rnic.destroy_queue_pair(prepared.qpn);
    }
    kicker.kick();
    connected
}

/// What a memory node offers: one region every client may read, write and
/// use atomics on, and a pool of receive buffers for SENDs.
#[derive(Debug, Clone, Copy)]
pub struct MemoryService {
    pub builder: QueuePairBuilder,
    pub region: MemoryRegion,
}

/// Serves connection requests until `stop` is set: each creates a queue
/// pair on the node's RNIC, connects it to the client's endpoint and
/// answers with its own endpoint and the region's key.
pub fn serve(
    address: &ControlAddress,
    endpoint: Shared<NodeEndpoint>,
    service: MemoryService,
    kicker: DriverKicker,
    stop: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>, RackError> {
    let listener = match address {
        ControlAddress::Unix(path) => {
            let _ = std::fs::remove_file(path);
            Listener::Unix(
                UnixListener::bind(path)
                    .map_err(|error| control_error(&format!("listen on {address}"), error))?,
            )
        }
        ControlAddress::Tcp(host) => Listener::Tcp(
            TcpListener::bind(host)
                .map_err(|error| control_error(&format!("listen on {address}"), error))?,
        ),
    };
    match &listener {
        Listener::Unix(socket) => socket.set_nonblocking(true),
        Listener::Tcp(socket) => socket.set_nonblocking(true),
    }
    .map_err(|error| control_error("set non-blocking", error))?;
    Ok(std::thread::spawn(move || {
        let mut served = 0;
        let mut connected: Option<QueuePair> = None;
        while !stop.load(Ordering::Relaxed) {
            let accepted: std::io::Result<Box<dyn Stream>> = match &listener {
                Listener::Unix(socket) => socket
                    .accept()
                    .map(|(stream, _)| Box::new(stream) as Box<dyn Stream>),
                Listener::Tcp(socket) => socket
                    .accept()
                    .map(|(stream, _)| Box::new(stream) as Box<dyn Stream>),
            };
            let Ok(mut stream) = accepted else {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            };
            // A client that connects and then says nothing must not hold
            // the server (and so the node's shutdown) forever.
            if stream.set_timeouts(CLIENT_TIMEOUT).is_err() {
                continue;
            }
            let reply = if served >= MAX_CLIENTS {
                Reply::Refused {
                    reason: format!("this node serves at most {MAX_CLIENTS} queue pairs"),
                }
            } else {
                match read_message::<Request>(stream.as_mut(), CLIENT_TIMEOUT)
                    .and_then(|request| accept(&endpoint, &service, request))
                {
                    Ok((reply, queue_pair)) => {
                        connected = Some(queue_pair);
                        reply
                    }
                    Err(error) => Reply::Refused {
                        reason: error.to_string(),
                    },
                }
            };
            kicker.kick();
            // The read's deadline may have left the stream's timeout short.
            let _ = stream.set_timeouts(CLIENT_TIMEOUT);
            let told = write_message(stream.as_mut(), &reply).is_ok();
            match connected.take() {
                // A write into the socket's buffer succeeds even when the
                // client has hung up: it confirms that it has the reply.
                Some(_) if told && confirmed(stream.as_mut()) => served += 1,
                // A client that hung up (or timed out) before its reply
                // will never use the queue pair made for it: kept, it
                // counted as served and held one of the NIC's for good
                // (found by reading).
                Some(queue_pair) => {
                    let _ = lock(&endpoint).rnic.destroy_queue_pair(queue_pair.0);
                }
                None => {}
            }
        }
    }))
}

/// Whether the client confirms, within its timeout, that it has the reply.
fn confirmed(stream: &mut dyn Stream) -> bool {
    matches!(
        read_message::<Confirm>(stream, CLIENT_TIMEOUT),
        Ok(Confirm::Received)
    )
}

/// Connects a queue pair for `request`: the reply, and the queue pair
/// (to take back if the reply never reaches the client).
fn accept(
    endpoint: &Shared<NodeEndpoint>,
    service: &MemoryService,
    request: Request,
) -> Result<(Reply, QueuePair), RackError> {
    let Request::Connect {
        endpoint: remote, ..
    } = request;
    let remote = QueuePairEndpoint::try_from(remote)?;
    let mut node = lock(endpoint);
    let prepared = node.rnic.create_queue_pair(&service.builder)?;
    let queue_pair = match node.rnic.handshake(prepared, remote) {
        Ok(queue_pair) => queue_pair,
        Err(error) => {
            let _ = node.rnic.destroy_queue_pair(prepared.qpn);
            return Err(error.into());
        }
    };
    let reply = Reply::Connected {
        endpoint: prepared.endpoint.into(),
        region: RegionMessage {
            address: service.region.address.value(),
            rkey: service.region.rkey.0,
            length_bytes: service.region.length_bytes,
        },
    };
    Ok((reply, queue_pair))
}
