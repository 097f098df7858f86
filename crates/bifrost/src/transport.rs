//! Thrift over Bifröst: the `thrift` crate's generated clients and
//! processors run unchanged over Bifröst's RPCs.
//!
//! On the client, [`client_transport`] gives the read and write halves a
//! generated client's protocols take: writes collect one Thrift message;
//! `flush` (which the generated code calls once per message) makes one
//! Bifröst call carrying it, named after the Thrift method, and the reads
//! return the reply. On the server, [`ThriftService`] runs a generated
//! processor as a Bifröst [`Service`]. Both sides speak Thrift's strict
//! binary protocol.
//!
//! Pointers: a call's header names the one allocation its pointer
//! arguments share ([`CallHandle::pass`] before the call), so the
//! Gatekeeper lends it to the callee; a handler that returns global memory
//! of its own names it with [`return_pointer`], and the reply's header
//! carries it, so the Gatekeeper hands its control to the caller.

use crate::checked_input::{CheckedInput, UnreadBytes};
use crate::rpc::Outcome;
use crate::rpc::{Callee, Caller, RpcError, Service};
use remora_base::Timestamp;
use remora_wire::bifrost::GlobalAddress;
use remora_wire::datagram::DatagramEnd;
use std::cell::{Cell, RefCell};
use std::io::{self, Cursor, Read, Write};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use thrift::protocol::TBinaryOutputProtocol;
use thrift::server::TProcessor;

/// How a client's calls reach a callee: one blocking call.
pub trait CallPath {
    fn call(
        &mut self,
        method: &str,
        pointer: GlobalAddress,
        arguments: &[u8],
    ) -> Result<Vec<u8>, RpcError>;
}

/// The method name of a strict-binary Thrift message: a 4-byte version and
/// type, a 4-byte length, the name.
pub fn thrift_method_name(message: &[u8]) -> Option<&str> {
    let version = u32::from_be_bytes(message.get(..4)?.try_into().ok()?);
    if version & 0xffff_0000 != 0x8001_0000 {
        return None;
    }
    let length = u32::from_be_bytes(message.get(4..8)?.try_into().ok()?) as usize;
    std::str::from_utf8(message.get(8..8usize.checked_add(length)?)?).ok()
}

struct Shared<P> {
    path: P,
    outgoing: Vec<u8>,
    incoming: Cursor<Vec<u8>>,
    handle: CallHandle,
}

/// When a client's last call had its message complete (the generated
/// client's marshalling done, the call handed to the path) and when its
/// reply came back (the client's unmarshalling then begins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallTiming {
    pub flushed_at: Instant,
    pub answered_at: Instant,
}

/// What an application holds beside a generated client: the pointer the
/// next call's header carries (the allocation its pointer arguments
/// share; each call takes it, so a call that passes none carries none),
/// and the last call's timing.
#[derive(Clone, Default)]
pub struct CallHandle {
    pointer: Rc<Cell<Option<GlobalAddress>>>,
    timing: Rc<Cell<Option<CallTiming>>>,
}

impl CallHandle {
    pub fn pass(&self, pointer: GlobalAddress) {
        self.pointer.set(Some(pointer));
    }

    pub fn last_timing(&self) -> Option<CallTiming> {
        self.timing.get()
    }
}

/// Time spent in one stage, summed over calls, shared between threads (a
/// server's workers record into it; a benchmark reads the mean).
#[derive(Debug, Default)]
pub struct StageClock {
    total_ns: AtomicU64,
    count: AtomicU64,
}

impl StageClock {
    pub fn record(&self, spent: Duration) {
        let nanos = u64::try_from(spent.as_nanos()).unwrap_or(u64::MAX);
        self.total_ns.fetch_add(nanos, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// The mean since the last reset, and how many calls it covers.
    pub fn mean(&self) -> (Duration, u64) {
        let count = self.count.load(Ordering::Relaxed);
        let total = self.total_ns.load(Ordering::Relaxed);
        (Duration::from_nanos(total / count.max(1)), count)
    }

    pub fn reset(&self) {
        self.total_ns.store(0, Ordering::Relaxed);
        self.count.store(0, Ordering::Relaxed);
    }
}

/// A generated client's input half.
pub struct ReadHalf<P>(Rc<RefCell<Shared<P>>>);
/// A generated client's output half.
pub struct WriteHalf<P>(Rc<RefCell<Shared<P>>>);

/// The two halves over `path`, and the handle on the client's calls.
pub fn client_transport<P: CallPath>(path: P) -> (ReadHalf<P>, WriteHalf<P>, CallHandle) {
    let handle = CallHandle::default();
    let shared = Rc::new(RefCell::new(Shared {
        path,
        outgoing: Vec::new(),
        incoming: Cursor::new(Vec::new()),
        handle: handle.clone(),
    }));
    (ReadHalf(Rc::clone(&shared)), WriteHalf(shared), handle)
}

/// A generated client's protocols over Bifröst.
pub type ClientProtocols<P> = (
    CheckedInput<ReadHalf<P>>,
    TBinaryOutputProtocol<WriteHalf<P>>,
);

/// Protocols over the halves, ready for a generated client's `new`, for
/// services that pass no pointers.
pub fn client_protocols<P: CallPath>(path: P) -> ClientProtocols<P> {
    let (protocols, _no_pointers) = client_protocols_passing(path);
    protocols
}

/// Protocols over the halves, and the handle through which calls pass
/// their pointer arguments' allocation.
pub fn client_protocols_passing<P: CallPath>(path: P) -> (ClientProtocols<P>, CallHandle) {
    let (read, write, slot) = client_transport(path);
    let protocols = (
        CheckedInput::new(read),
        TBinaryOutputProtocol::new(write, true),
    );
    (protocols, slot)
}

/// A reply's body is a peer's bytes: the client reads it checked.
impl<P> UnreadBytes for ReadHalf<P> {
    fn remaining(&self) -> usize {
        let shared = self.0.borrow();
        let position = usize::try_from(shared.incoming.position()).unwrap_or(usize::MAX);
        shared.incoming.get_ref().len().saturating_sub(position)
    }

    fn peek_i32(&self, offset: usize) -> Option<i32> {
        let shared = self.0.borrow();
        let at = usize::try_from(shared.incoming.position()).ok()?;
        let unread = shared.incoming.get_ref().get(at..)?;
        unread.peek_i32(offset)
    }
}

impl<P> Read for ReadHalf<P> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        self.0.borrow_mut().incoming.read(buffer)
    }
}

impl<P: CallPath> Write for WriteHalf<P> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.borrow_mut().outgoing.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    /// One message is complete: call, and keep the reply for the reads.
    fn flush(&mut self) -> io::Result<()> {
        let mut shared = self.0.borrow_mut();
        let message = std::mem::take(&mut shared.outgoing);
        let method = thrift_method_name(&message)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    "not a strict binary Thrift message",
                )
            })?
            .to_owned();
        let pointer = shared.handle.pointer.take().unwrap_or(GlobalAddress::NULL);
        let flushed_at = Instant::now();
        let reply = shared
            .path
            .call(&method, pointer, &message)
            .map_err(io::Error::other)?;
        let timing = CallTiming {
            flushed_at,
            answered_at: Instant::now(),
        };
        shared.handle.timing.set(Some(timing));
        shared.incoming = Cursor::new(reply);
        Ok(())
    }
}

/// A generated processor as a Bifröst service.
pub struct ThriftService<P: TProcessor + Send> {
    processor: P,
    /// Where the time each call spends in the processor goes, if timed.
    clock: Option<std::sync::Arc<StageClock>>,
}

impl<P: TProcessor + Send> ThriftService<P> {
    pub fn new(processor: P) -> ThriftService<P> {
        ThriftService {
            processor,
            clock: None,
        }
    }

    /// Records each call's time in the processor (unmarshalling, the
    /// handler, marshalling) in `clock`.
    pub fn timed(processor: P, clock: std::sync::Arc<StageClock>) -> ThriftService<P> {
        ThriftService {
            processor,
            clock: Some(clock),
        }
    }
}

thread_local! {
    /// The pointer the handler running on this thread returns.
    static RETURNED: Cell<Option<GlobalAddress>> = const { Cell::new(None) };
    /// The pointer the call the handler on this thread serves lent it.
    static LENT: Cell<Option<GlobalAddress>> = const { Cell::new(None) };
}

/// The pointer lent for the call being served on this thread, and the one
/// its handler returns, from the call's start until this is dropped, when
/// the outer call's come back (a call served inside another's handler, or
/// a handler that panicked, leaves the outer call's as they were).
struct Lending {
    lent_before: Option<GlobalAddress>,
    returned_before: Option<GlobalAddress>,
}

impl Lending {
    fn start(pointer: GlobalAddress) -> Lending {
        Lending {
            lent_before: LENT.with(|lent| lent.replace(Some(pointer))),
            returned_before: RETURNED.with(|returned| returned.replace(None)),
        }
    }

    /// The pointer this call's handler returned.
    fn returned(&self) -> Option<GlobalAddress> {
        RETURNED.with(Cell::take)
    }
}

impl Drop for Lending {
    fn drop(&mut self) {
        LENT.with(|lent| lent.set(self.lent_before));
        RETURNED.with(|returned| returned.set(self.returned_before));
    }
}

/// The pointer the call being served on this thread carries in its
/// header: the one allocation the Gatekeeper lent the callee for it.
/// `None` outside a call, or for a call that lent nothing.
pub fn lent_pointer() -> Option<GlobalAddress> {
    LENT.with(Cell::get)
}

/// Called by a handler that returns global memory of its own: the reply's
/// header carries `pointer`, so the Gatekeeper hands its control to the
/// caller. (The Rust generator knows nothing of pointers; the handler
/// runs on the thread of the [`ThriftService`] that called it.)
pub fn return_pointer(pointer: GlobalAddress) {
    RETURNED.with(|returned| returned.set(Some(pointer)));
}

impl<P: TProcessor + Send> Service for ThriftService<P> {
    fn call(&mut self, _method: &[u8], pointer: GlobalAddress, arguments: &[u8]) -> Outcome {
        let mut input = CheckedInput::new(arguments);
        let mut output = TBinaryOutputProtocol::new(Vec::new(), true);
        let lending = Lending::start(pointer);
        let started = Instant::now();
        let processed = self.processor.process(&mut input, &mut output);
        let pointer = lending.returned();
        drop(lending);
        if let Some(clock) = &self.clock {
            clock.record(started.elapsed());
        }
        processed.map_err(|error| error.to_string())?;
        Ok(crate::rpc::Answer {
            body: output.transport,
            pointer,
            state: None,
        })
    }
}

/// Bifröst's runtime with no network: a caller and a callee in this
/// process, with datagrams dropped on a fixed pattern, so that services
/// can be tested (and retransmission and duplicate suppression seen)
/// without a rack.
pub struct InProcessPath {
    caller: Caller,
    callee: Callee,
    now: Timestamp,
    /// Every `drop_every`-th datagram (either way) is lost; 0 loses none.
    drop_every: u64,
    sent: u64,
}

/// The two ends' addresses, for the runtime's bookkeeping.
const CALLER_END: DatagramEnd = DatagramEnd {
    mac: remora_wire::MacAddress([2, 0, 0, 0, 0, 1]),
    address: remora_wire::Ipv4Address::new(10, 0, 0, 1),
    port: 40000,
};
const CALLEE_END: DatagramEnd = DatagramEnd {
    mac: remora_wire::MacAddress([2, 0, 0, 0, 0, 2]),
    address: remora_wire::Ipv4Address::new(10, 0, 0, 2),
    port: remora_wire::bifrost::BIFROST_PORT,
};
/// The in-process runtime's resend interval (virtual: it costs nothing).
const RESEND_AFTER: Duration = Duration::from_micros(100);
/// Resends before a call fails.
const ATTEMPTS: u32 = 64;

/// How long an in-process call waits, in real time, for a service that
/// runs it on a thread of its own.
const DEFERRED_CALL_LIMIT: Duration = Duration::from_secs(10);

impl InProcessPath {
    pub fn new(service: Box<dyn Service>, drop_every: u64) -> InProcessPath {
        InProcessPath {
            caller: Caller::new(RESEND_AFTER, ATTEMPTS),
            callee: Callee::new(service),
            now: Timestamp::ZERO,
            drop_every,
            sent: 0,
        }
    }

    pub fn caller(&self) -> &Caller {
        &self.caller
    }

    pub fn callee(&self) -> &Callee {
        &self.callee
    }

    fn delivered(&mut self) -> bool {
        self.sent += 1;
        self.drop_every == 0 || !self.sent.is_multiple_of(self.drop_every)
    }
}

impl CallPath for InProcessPath {
    fn call(
        &mut self,
        method: &str,
        pointer: GlobalAddress,
        arguments: &[u8],
    ) -> Result<Vec<u8>, RpcError> {
        let rpc_id = self
            .caller
            .call(self.now, CALLEE_END, method, pointer, arguments)?;
        // Each round either completes the call, resends it, or waits (in
        // real time, bounded) for a call running on a service's thread;
        // the caller gives up after its attempts, so the loop ends.
        let waiting_since = std::time::Instant::now();
        loop {
            while let Some((_, payload)) = self.caller.poll_transmit() {
                if self.delivered() {
                    self.callee.handle(CALLER_END, &payload);
                }
            }
            // A service that finishes calls later (a worker pool) hands
            // its outcomes back here; never asked, it ran the call once
            // and its answer never came.
            self.callee.poll_service();
            while let Some((_, payload)) = self.callee.poll_transmit() {
                if self.delivered() {
                    self.caller.handle(&payload);
                }
            }
            while let Some((id, outcome)) = self.caller.take_completion() {
                if id == rpc_id {
                    return outcome;
                }
            }
            if self.callee.in_progress() > 0 {
                if waiting_since.elapsed() > DEFERRED_CALL_LIMIT {
                    return Err(RpcError::TimedOut(DEFERRED_CALL_LIMIT));
                }
                std::thread::sleep(Duration::from_micros(50));
                continue;
            }
            self.now = self.now.saturating_add(RESEND_AFTER);
            self.caller.handle_timeout(self.now);
        }
    }
}

/// Calls through a [`CallingAgent`](crate::rpc::agents::CallingAgent) on
/// the embedded rack: the application thread hands each call over and
/// waits for its outcome. Clones call through the same agent.
#[derive(Clone)]
pub struct RackPath {
    requests: std::sync::mpsc::SyncSender<crate::rpc::agents::CallRequest>,
    kicker: remora_rack::endpoint::DriverKicker,
    deadline: Duration,
}

impl RackPath {
    /// `requests` feeds the agent; `kicker` wakes the rack's fabric thread.
    pub fn new(
        requests: std::sync::mpsc::SyncSender<crate::rpc::agents::CallRequest>,
        kicker: remora_rack::endpoint::DriverKicker,
        deadline: Duration,
    ) -> RackPath {
        RackPath {
            requests,
            kicker,
            deadline,
        }
    }
}

impl CallPath for RackPath {
    fn call(
        &mut self,
        method: &str,
        pointer: GlobalAddress,
        arguments: &[u8],
    ) -> Result<Vec<u8>, RpcError> {
        let (reply, outcome) = std::sync::mpsc::sync_channel(1);
        let request = crate::rpc::agents::CallRequest {
            method: method.into(),
            pointer,
            arguments: arguments.to_vec(),
            reply,
        };
        self.requests
            .send(request)
            .map_err(|_| RpcError::Disconnected)?;
        self.kicker.kick();
        match outcome.recv_timeout(self.deadline) {
            Ok(outcome) => outcome,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                Err(RpcError::TimedOut(self.deadline))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(RpcError::Disconnected),
        }
    }
}

/// A rack serving one Bifröst service: the service on the memory host, a
/// calling agent on the compute host, and the path a client thread calls
/// through (what the Thrift test and `bench bifrost` run).
pub struct ServiceRack {
    pub rack: remora_rack::assembly::EmbeddedRack,
    pub path: RackPath,
}

/// How often the rack's caller resends: a descheduled thread on a shared
/// machine is not a lost frame, so well above a round trip.
pub const RACK_RESEND_AFTER: Duration = Duration::from_millis(20);

/// Where a [`ServiceRack`]'s calls go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// Straight to the service's host, the switch forwarding plainly (the
    /// thesis's measured setup, "Gatekeeper bypassed").
    Bypass,
    /// To the Gatekeeper's service address; the switch routes each call
    /// by method and tracks it.
    Gatekeeper,
}

/// The Gatekeeper's service address on a [`ServiceRack`].
pub const SERVICE_ADDRESS: remora_wire::Ipv4Address = remora_wire::Ipv4Address::new(10, 0, 0, 200);

impl ServiceRack {
    /// The service on the memory host, serving `methods`, called through
    /// `routing`.
    pub fn start(
        service: Box<dyn Service>,
        routing: Routing,
        methods: &[&str],
    ) -> Result<ServiceRack, ServiceRackError> {
        use crate::gatekeeper::{Gatekeeper, GatekeeperConfig, NodeKind};
        use crate::rpc::agents::{CallingAgent, ServerAgent};
        use remora_rack::topology::{Topology, COMPUTE_HOST, MEMORY_HOST};
        use remora_switch::programs::overlay::Overlaid;
        use remora_switch::{Switch, SwitchConfig};
        use std::sync::{Arc, Mutex};
        let topology = Topology::compute_and_memory();
        let mut staged = remora_rack::assembly::RackBuilder::new(&topology)
            .thread_name("bifrost-fabric")
            .build()?;
        let server = ServerAgent::new(Callee::new(service));
        staged.add_agent(MEMORY_HOST, Arc::new(Mutex::new(server)));
        let (requests, taken) = std::sync::mpsc::sync_channel(64);
        let server_address = topology.host(MEMORY_HOST).address;
        let callee = match routing {
            Routing::Bypass => crate::rpc::callee_at(topology.switch_mac, server_address),
            Routing::Gatekeeper => crate::rpc::callee_at(topology.switch_mac, SERVICE_ADDRESS),
        };
        let caller = Caller::new(RACK_RESEND_AFTER, 50);
        let calling = CallingAgent::new(caller, callee, 40000, taken);
        staged.add_agent(COMPUTE_HOST, Arc::new(Mutex::new(calling)));
        let rack = match routing {
            Routing::Bypass => {
                let switch = staged.l2l3_switch();
                staged.start(switch)?.0
            }
            Routing::Gatekeeper => {
                let mut gatekeeper = Gatekeeper::new(GatekeeperConfig::new(SERVICE_ADDRESS));
                gatekeeper.register_node(server_address, NodeKind::Compute, 0)?;
                for method in methods {
                    gatekeeper.route(method, server_address)?;
                }
                let config = SwitchConfig::new(topology.hosts().len() as u16);
                let program = Overlaid::new(topology.forwarding(), gatekeeper);
                staged.start(Switch::new(config, program))?.0
            }
        };
        let path = RackPath::new(requests, rack.fabric().kicker(), Duration::from_secs(5));
        Ok(ServiceRack { rack, path })
    }
}

/// Why a service rack could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServiceRackError {
    #[error(transparent)]
    Rack(#[from] remora_rack::RackError),
    #[error("the Gatekeeper's tables: {0}")]
    Gatekeeper(#[from] crate::gatekeeper::GatekeeperError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::scenario::Counter;
    use crate::rpc::workers::WorkerPool;

    /// A service that runs calls on its own threads (a worker pool) ran
    /// the call once, but the in-process path never asked for its outcome:
    /// after every attempt the caller got `NoAnswer`.
    #[test]
    fn an_in_process_call_gets_a_worker_pools_answer() {
        let pool = WorkerPool::new(vec![Box::new(Counter(0)) as Box<dyn Service>]).unwrap();
        let mut path = InProcessPath::new(Box::new(pool), 0);
        let first = path.call("increment", GlobalAddress::NULL, b"").unwrap();
        let second = path.call("increment", GlobalAddress::NULL, b"").unwrap();
        assert_ne!(first, second, "two calls, each run once");
        assert_eq!(path.callee().counters().executed, 2);
    }

    /// A call served inside another's handler reset the pointer the outer
    /// call lent and the one its handler had returned: the outer reply
    /// carried none, and its caller never got control of it.
    #[test]
    fn a_nested_call_leaves_the_outer_calls_pointers_as_they_were() {
        let pointer = |offset| {
            crate::dsm::GlobalPtr {
                node: 0,
                generation: 1,
                offset,
            }
            .to_address()
        };
        let outer = Lending::start(pointer(0));
        return_pointer(pointer(4096));
        {
            let inner = Lending::start(pointer(8192));
            assert_eq!(lent_pointer(), Some(pointer(8192)));
            return_pointer(pointer(12288));
            assert_eq!(inner.returned(), Some(pointer(12288)));
        }
        assert_eq!(lent_pointer(), Some(pointer(0)));
        assert_eq!(outer.returned(), Some(pointer(4096)));
        drop(outer);
        assert_eq!(lent_pointer(), None);
    }
}
