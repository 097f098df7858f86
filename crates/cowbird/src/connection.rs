//! Reconnecting the engine's queue pairs, a control-plane step.
//!
//! The Spot engine is the requester on one RC queue pair per instance.
//! When a queue pair dies (its retries exhausted under heavy loss, or the
//! memory node restarted with a fresh NIC), the engine makes a new queue
//! pair and must have the compute node connect a new one to it: both ends
//! move, so it takes an exchange outside the data path, as connection
//! setup always does (the rack's control channel, `rdma_cm`).
//!
//! [`Connector`] is that exchange between two agents: the engine posts a
//! [`ReconnectRequest`] with its new endpoint; the compute node's
//! [`ConnectionService`] agent makes a queue pair, connects it, moves the
//! old one to the error state and answers with its endpoint. Messages take
//! [`CONTROL_LATENCY`] to arrive, as a control channel's round does, and
//! their times are the agents' timers, so the simulator schedules them.

use remora_base::Timestamp;
use remora_host::{Agent, AgentError, Progress};
use remora_rnic::{QueuePair, QueuePairBuilder, QueuePairEndpoint, Verbs, VerbsError};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a control message takes to arrive.
pub const CONTROL_LATENCY: Duration = Duration::from_micros(50);

/// Messages one direction holds at most: one per instance and epoch is
/// all a correct engine sends.
pub const MAX_PENDING_MESSAGES: usize = 1024;

/// One side's endpoint for instance `instance`'s connection number `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconnectRequest {
    pub instance: usize,
    pub epoch: u8,
    pub endpoint: QueuePairEndpoint,
    /// The engine's endpoint the exchange is for (a request's own
    /// endpoint; an answer's request's). A restarted engine counts epochs
    /// from 0 again, over the same mailbox, so an epoch alone took an
    /// older incarnation's answer, naming a queue pair already destroyed,
    /// for the current one's.
    pub engine: QueuePairEndpoint,
    /// When the message arrives.
    pub at: Timestamp,
}

/// Why a control exchange failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnectionError {
    #[error("the control channel holds {MAX_PENDING_MESSAGES} messages already")]
    Full,
    #[error("instance {instance} has no queue pair on the compute node")]
    UnknownInstance { instance: usize },
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    #[error("a compute node that restarts loses its rings and clients: not recoverable")]
    ComputeRestart,
    #[error(
        "no connection service answers on the compute node: a dead queue pair is not replaced"
    )]
    NoService,
}

#[derive(Default)]
struct Mailbox {
    requests: VecDeque<ReconnectRequest>,
    answers: VecDeque<ReconnectRequest>,
    /// Whether a [`ConnectionService`] answers. A request nobody would
    /// answer is refused: the instance fails with a typed error instead of
    /// waiting for ever (a deployment that leaves the service out).
    served: bool,
}

/// The control channel between the engine and the compute node. Cloned
/// handles share one mailbox.
#[derive(Clone, Default)]
pub struct Connector {
    mailbox: Arc<Mutex<Mailbox>>,
}

fn push(
    queue: &mut VecDeque<ReconnectRequest>,
    message: ReconnectRequest,
) -> Result<(), ConnectionError> {
    if queue.len() >= MAX_PENDING_MESSAGES {
        return Err(ConnectionError::Full);
    }
    queue.push_back(message);
    Ok(())
}

impl Connector {
    pub fn new() -> Connector {
        Connector::default()
    }

    fn mailbox(&self) -> std::sync::MutexGuard<'_, Mailbox> {
        self.mailbox.lock().expect("connector lock")
    }

    /// The engine asks for instance `instance` to be connected to `endpoint`.
    pub fn request(
        &self,
        now: Timestamp,
        instance: usize,
        epoch: u8,
        endpoint: QueuePairEndpoint,
    ) -> Result<(), ConnectionError> {
        let message = ReconnectRequest {
            instance,
            epoch,
            endpoint,
            engine: endpoint,
            at: now.saturating_add(CONTROL_LATENCY),
        };
        let mut mailbox = self.mailbox();
        if !mailbox.served {
            return Err(ConnectionError::NoService);
        }
        push(&mut mailbox.requests, message)
    }

    /// The compute node's answer for `instance` at `epoch`, to the
    /// engine's `engine` endpoint, once arrived. Answers to other requests
    /// of the instance are dropped: a newer request (of this engine, or of
    /// one restarted since) replaced them.
    pub fn take_answer(
        &self,
        now: Timestamp,
        instance: usize,
        (epoch, engine): (u8, QueuePairEndpoint),
    ) -> Option<QueuePairEndpoint> {
        let mut mailbox = self.mailbox();
        mailbox.answers.retain(|answer| {
            answer.instance != instance || (answer.epoch == epoch && answer.engine == engine)
        });
        let position = mailbox
            .answers
            .iter()
            .position(|answer| answer.instance == instance && answer.at <= now)?;
        mailbox
            .answers
            .remove(position)
            .map(|answer| answer.endpoint)
    }

    /// When the answer for `instance` at `epoch` to `engine` arrives, if
    /// one is on its way.
    pub fn answer_due(
        &self,
        instance: usize,
        (epoch, engine): (u8, QueuePairEndpoint),
    ) -> Option<Timestamp> {
        self.mailbox()
            .answers
            .iter()
            .filter(|answer| {
                answer.instance == instance && answer.epoch == epoch && answer.engine == engine
            })
            .map(|answer| answer.at)
            .min()
    }

    fn take_request(&self, now: Timestamp) -> Option<ReconnectRequest> {
        let mut mailbox = self.mailbox();
        let position = mailbox
            .requests
            .iter()
            .position(|request| request.at <= now)?;
        mailbox.requests.remove(position)
    }

    fn answer(&self, message: ReconnectRequest) -> Result<(), ConnectionError> {
        push(&mut self.mailbox().answers, message)
    }

    fn next_request_at(&self) -> Option<Timestamp> {
        self.mailbox()
            .requests
            .iter()
            .map(|request| request.at)
            .min()
    }
}

impl ConnectionService {
    /// Takes the service out of reach and brings it back (tests): while
    /// out, requests are refused as with no service at all.
    #[cfg(test)]
    pub(crate) fn set_served(&self, served: bool) {
        self.connector.mailbox().served = served;
    }
}

impl Drop for ConnectionService {
    /// Left out (or gone with its host), it answers nothing from now on.
    fn drop(&mut self) {
        self.connector.mailbox().served = false;
    }
}

/// The compute node's side of reconnection: an agent beside the
/// application, which makes and connects a new queue pair per request.
pub struct ConnectionService {
    connector: Connector,
    /// The compute node's queue-pair settings (its protection domain and
    /// completion queue).
    builder: QueuePairBuilder,
    /// Each instance's current queue pair.
    current: Vec<QueuePair>,
    reconnects: u64,
}

impl ConnectionService {
    pub fn new(
        connector: Connector,
        builder: QueuePairBuilder,
        current: Vec<QueuePair>,
    ) -> ConnectionService {
        connector.mailbox().served = true;
        ConnectionService {
            connector,
            builder,
            current,
            reconnects: 0,
        }
    }

    /// Queue pairs connected on request so far.
    pub fn reconnects(&self) -> u64 {
        self.reconnects
    }

    fn serve(
        &mut self,
        now: Timestamp,
        nic: &mut dyn Verbs,
        request: ReconnectRequest,
    ) -> Result<(), ConnectionError> {
        let old = *self
            .current
            .get(request.instance)
            .ok_or(ConnectionError::UnknownInstance {
                instance: request.instance,
            })?;
        // The old queue pair's peer is gone: it goes, answering nothing
        // still in flight to it (kept, each reconnection took a place on
        // the device for good). It may be gone already.
        let _ = nic.destroy_queue_pair(old.0);
        let prepared = nic.create_queue_pair(&self.builder)?;
        let queue_pair = nic.handshake(prepared, request.endpoint)?;
        self.current[request.instance] = queue_pair;
        self.reconnects += 1;
        tracing::debug!(
            instance = request.instance,
            epoch = request.epoch,
            "compute side reconnected"
        );
        self.connector.answer(ReconnectRequest {
            instance: request.instance,
            epoch: request.epoch,
            endpoint: prepared.endpoint,
            engine: request.engine,
            at: now.saturating_add(CONTROL_LATENCY),
        })
    }
}

impl Agent for ConnectionService {
    fn name(&self) -> &'static str {
        "cowbird-connection-service"
    }

    fn poll(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        let mut progress = Progress::Idle;
        // Bounded by the mailbox's capacity.
        for _ in 0..MAX_PENDING_MESSAGES {
            let Some(request) = self.connector.take_request(now) else {
                break;
            };
            self.serve(now, nic, request)
                .map_err(|error| AgentError::system("cowbird-connection-service", error))?;
            progress = Progress::Moved;
        }
        Ok(progress)
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        self.connector.next_request_at()
    }

    fn woken_by_frames(&self) -> bool {
        false
    }

    fn crash(&mut self) {}

    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Err(AgentError::system(
            "cowbird-connection-service",
            ConnectionError::ComputeRestart,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_rnic::{RnicConfig, SoftRnic};
    use remora_wire::{Ipv4Address, MacAddress, Psn, Qpn};

    /// The engine's endpoint of queue pair `qpn`, at 10.0.0.2.
    fn engine(qpn: u32) -> QueuePairEndpoint {
        QueuePairEndpoint {
            qpn: Qpn::new(qpn).unwrap(),
            address: Ipv4Address::new(10, 0, 0, 2),
            mac: MacAddress([2, 0, 0, 0, 0, 2]),
            initial_psn: Psn::new(0),
        }
    }

    /// The compute node's NIC, and the settings its queue pairs take.
    fn compute_nic() -> (SoftRnic, QueuePairBuilder) {
        let mut nic = SoftRnic::new(RnicConfig::new(
            MacAddress([2, 0, 0, 0, 0, 1]),
            Ipv4Address::new(10, 0, 0, 1),
            1,
        ));
        let domain = nic.alloc_protection_domain().unwrap();
        let queue = nic.create_completion_queue(8).unwrap();
        (nic, QueuePairBuilder::new(domain, queue, queue))
    }

    /// A deployment that left the connection service out (the far-memory
    /// rack) had a dead queue pair's instance ask for a new one that
    /// nobody would connect: it waited for ever, and the application's
    /// requests with it. The request is refused, and the instance fails.
    #[test]
    fn a_request_nobody_would_answer_is_refused() {
        let endpoint = engine(0x20);
        let connector = Connector::new();
        let request = |connector: &Connector| connector.request(Timestamp::ZERO, 0, 1, endpoint);
        assert_eq!(request(&connector), Err(ConnectionError::NoService));
        let (_nic, builder) = compute_nic();
        let service = ConnectionService::new(connector.clone(), builder, Vec::new());
        assert_eq!(request(&connector), Ok(()));
        drop(service);
        assert_eq!(request(&connector), Err(ConnectionError::NoService));
    }

    /// A restarted engine counts its instances' epochs from 0 again over
    /// the same mailbox. When the memory node failed again mid-way, two
    /// epoch-0 requests waited, and the older answer, naming a compute
    /// queue pair the service had destroyed serving the newer, was taken
    /// for the current one: the instance connected to a dead queue pair.
    #[test]
    fn a_stale_incarnations_answer_is_not_taken_as_current() {
        let (stale, current) = (engine(0x20), engine(0x21));
        let connector = Connector::new();
        let (mut nic, builder) = compute_nic();
        let first = nic.create_queue_pair(&builder).unwrap();
        let mut service =
            ConnectionService::new(connector.clone(), builder, vec![QueuePair(first.qpn)]);
        connector.request(Timestamp::ZERO, 0, 0, stale).unwrap();
        connector.request(Timestamp::ZERO, 0, 0, current).unwrap();
        let at = Timestamp::ZERO.saturating_add(CONTROL_LATENCY);
        let _ = service.poll(at, &mut nic).unwrap();
        let later = at.saturating_add(CONTROL_LATENCY);
        let answer = connector.take_answer(later, 0, (0, current)).unwrap();
        assert_eq!(
            answer.qpn, service.current[0].0,
            "the live compute queue pair"
        );
        assert_eq!(connector.take_answer(later, 0, (0, stale)), None);
    }
}
