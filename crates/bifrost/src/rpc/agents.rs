//! Agents that run the RPC runtime on a host's device: a server (a
//! [`Callee`] on [`BIFROST_PORT`]) and a client that issues a planned
//! number of calls and records their outcomes.

use super::{Callee, Caller, RpcError};
use remora_base::Timestamp;
use remora_host::{Agent, AgentError, AgentPort, Progress};
use remora_rnic::Verbs;
use remora_wire::bifrost::{
    ExportError, ExportRepr, GlobalAddress, HeartbeatRepr, NodeKind, BIFROST_PORT, CONTROL_PORT,
    EXPORT_LEN, HEARTBEAT_LEN,
};
use remora_wire::datagram::DatagramEnd;
use std::time::Duration;

/// Datagrams taken per turn.
const DATAGRAMS_PER_TURN: usize = 256;
/// A port's inbox.
const INBOX_DEPTH: usize = 1024;

/// A caller's incoming half of a turn: replies in, resends due.
fn take_replies(
    nic: &mut dyn Verbs,
    port: &mut AgentPort,
    caller: &mut Caller,
    now: Timestamp,
) -> Result<bool, AgentError> {
    let moved = port.receive(nic, DATAGRAMS_PER_TURN, |_, reply| caller.handle(reply))?;
    if caller.poll_timeout().is_some_and(|due| due <= now) {
        caller.handle_timeout(now);
    }
    Ok(moved)
}

/// A caller's outgoing half of a turn: every call and resend queued.
fn send_calls(
    nic: &mut dyn Verbs,
    port: &mut AgentPort,
    caller: &mut Caller,
) -> Result<bool, AgentError> {
    let mut moved = false;
    while let Some((to, payload)) = caller.poll_transmit() {
        port.send(nic, to, &payload)?;
        moved = true;
    }
    Ok(moved)
}

/// How often a server looks for deferred calls that finished (a worker
/// thread's outcome waits at most this long for its reply to leave).
const DEFERRED_POLL_INTERVAL: Duration = Duration::from_micros(20);

/// Why a host's agent does not come back after a crash.
#[derive(Debug, thiserror::Error)]
#[error("{0}: a replacement started from the checkpoint takes over")]
pub struct RestartRefused(&'static str);

/// Serves calls on Bifröst's port.
pub struct ServerAgent {
    pub callee: Callee,
    port: AgentPort,
    last_turn: Timestamp,
}

impl ServerAgent {
    pub fn new(callee: Callee) -> ServerAgent {
        ServerAgent {
            callee,
            port: AgentPort::new(BIFROST_PORT, INBOX_DEPTH),
            last_turn: Timestamp::ZERO,
        }
    }
}

impl Agent for ServerAgent {
    fn name(&self) -> &'static str {
        "bifrost-server"
    }

    fn poll(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        self.last_turn = now;
        let callee = &mut self.callee;
        let mut moved = self.port.receive(nic, DATAGRAMS_PER_TURN, |from, call| {
            callee.handle(from, call)
        })?;
        moved |= self.callee.poll_service();
        while let Some((to, payload)) = self.callee.poll_transmit() {
            self.port.send(nic, to, &payload)?;
            moved = true;
        }
        Ok(Progress::from_moved(moved))
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        // Open the port at once, before the first call arrives; while
        // calls run on other threads, look for their outcomes.
        if let Some(due) = self.port.poll_timeout() {
            return Some(due);
        }
        (self.callee.in_progress() > 0)
            .then(|| self.last_turn.saturating_add(DEFERRED_POLL_INTERVAL))
    }

    fn crash(&mut self) {
        self.port.forget();
        self.callee.crash();
    }

    /// Refused when the service cannot serve again (a worker pool's
    /// threads died with the host): serving on, it answered every call
    /// with an error it kept for good, a resend of a call it had run too.
    /// A replacement started from the checkpoint takes over instead.
    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        if self.callee.serves_after_crash() {
            return Ok(());
        }
        Err(AgentError::system(
            "bifrost-server",
            RestartRefused("the service's worker threads died with the host"),
        ))
    }
}

/// Issues `calls` calls of `method` to `callee`, `window` at a time, and
/// keeps every outcome. With [`with_checkpoints`](Self::with_checkpoints)
/// each call carries the caller's checkpoint (a1, a2) and a crash loses
/// everything but the outcomes delivered, until [`restore`](Self::restore)
/// starts it again from the checkpoint the Gatekeeper kept; without, a
/// crash loses only the port (the caller is not what is tested).
pub struct ClientAgent {
    pub caller: Caller,
    callee: DatagramEnd,
    method: &'static str,
    calls: u64,
    window: usize,
    issued: u64,
    /// The application's output: each outcome once, in the order taken.
    pub outcomes: Vec<(u64, Result<Vec<u8>, RpcError>)>,
    /// When each outcome came, in the same order.
    pub answered_at: Vec<Timestamp>,
    port: AgentPort,
    checkpoints: Option<CallerProgress>,
    /// Every n-th call (the first included) shares its callee's fate.
    share_fate_every: Option<u64>,
}

/// Whether a [`ClientAgent`]'s `index`-th call (RPC id `index + 1`)
/// shares its callee's fate, with every `every`-th doing so.
pub fn shares_fate(index: u64, every: Option<u64>) -> bool {
    every.is_some_and(|every| index.is_multiple_of(every))
}

/// What a checkpointing client keeps to take its checkpoints.
struct CallerProgress {
    sequence: u64,
    /// Unanswered calls' arguments, by RPC id.
    unanswered: std::collections::BTreeMap<u64, Vec<u8>>,
    /// Crashed and not yet restored: it issues nothing.
    awaiting_restore: bool,
}

impl ClientAgent {
    pub fn new(
        caller: Caller,
        callee: DatagramEnd,
        method: &'static str,
        udp_port: u16,
        calls: u64,
        window: usize,
    ) -> ClientAgent {
        ClientAgent {
            caller,
            callee,
            method,
            calls,
            // Within what a callee's checkpoint covers (see
            // `Caller::within_span`).
            window: window.clamp(1, super::checkpoint::REPLIES_PER_CALLER),
            issued: 0,
            outcomes: Vec::new(),
            answered_at: Vec::new(),
            port: AgentPort::new(udp_port, INBOX_DEPTH),
            checkpoints: None,
            share_fate_every: None,
        }
    }

    /// Every `every`-th call shares its callee's fate
    /// ([`super::FailureDomain::ShareFate`]); the rest are recovered. (A
    /// client with checkpoints recovers every call.)
    pub fn share_fate_every(mut self, every: u64) -> ClientAgent {
        self.share_fate_every = Some(every.max(1));
        self
    }

    /// Whether the call issued `index`-th shares its callee's fate.
    pub fn shares_fate(&self, index: u64) -> bool {
        shares_fate(index, self.share_fate_every)
    }

    /// Every call carries the caller's checkpoint, and a crash loses the
    /// caller's memory.
    pub fn with_checkpoints(mut self) -> ClientAgent {
        self.checkpoints = Some(CallerProgress {
            sequence: 0,
            unanswered: std::collections::BTreeMap::new(),
            awaiting_restore: false,
        });
        self
    }

    pub fn is_done(&self) -> bool {
        self.outcomes.len() as u64 == self.calls
    }

    /// Starts a crashed client again from `checkpoint` (the Gatekeeper's
    /// newest for it; None if it never sent a call that carried one): the
    /// outcomes it had delivered stay, later ones are forgotten, its
    /// unanswered calls go again under their RPC ids, and it goes on.
    /// Returns the checkpoint it restored from.
    pub fn restore(
        &mut self,
        now: Timestamp,
        checkpoint: Option<&[u8]>,
    ) -> Result<super::checkpoint::CallerCheckpoint, super::checkpoint::CheckpointError> {
        let checkpoint = match checkpoint {
            Some(bytes) => super::checkpoint::CallerCheckpoint::decode(bytes)?,
            None => super::checkpoint::CallerCheckpoint::default(),
        };
        let delivered = checkpoint.delivered as usize;
        self.outcomes.truncate(delivered);
        self.answered_at.truncate(delivered);
        self.issued = checkpoint.issued;
        self.caller = self.caller.fresh();
        self.caller.resume_at(checkpoint.next_rpc_id);
        for (&rpc_id, arguments) in &checkpoint.unanswered {
            self.caller
                .call_as(
                    now,
                    rpc_id,
                    self.callee,
                    self.method,
                    GlobalAddress::NULL,
                    arguments,
                )
                .map_err(|error| super::checkpoint::CheckpointError::Service(error.to_string()))?;
        }
        self.checkpoints = Some(CallerProgress {
            sequence: checkpoint.sequence,
            unanswered: checkpoint.unanswered.clone(),
            awaiting_restore: false,
        });
        Ok(checkpoint)
    }

    /// Issues the next call; with checkpoints, the call carries the
    /// caller's progress with this call in it (a1) and every outcome
    /// taken so far (a2).
    fn issue(&mut self, now: Timestamp) -> Result<(), RpcError> {
        let arguments = self.issued.to_be_bytes();
        let rpc_id = self.caller.next_rpc_id();
        let Some(progress) = self.checkpoints.as_mut() else {
            let domain = if self.shares_fate(self.issued) {
                super::FailureDomain::ShareFate
            } else {
                super::FailureDomain::Recover
            };
            self.caller.call_in(
                now,
                domain,
                self.callee,
                self.method,
                GlobalAddress::NULL,
                &arguments,
            )?;
            self.issued += 1;
            return Ok(());
        };
        progress.sequence += 1;
        progress.unanswered.insert(rpc_id, arguments.to_vec());
        let checkpoint = super::checkpoint::CallerCheckpoint {
            sequence: progress.sequence,
            issued: self.issued + 1,
            delivered: self.outcomes.len() as u64,
            next_rpc_id: rpc_id + 1,
            unanswered: progress.unanswered.clone(),
        };
        let bytes = checkpoint
            .encode()
            .map_err(|error| RpcError::Checkpoint(error.to_string()))?;
        self.caller.call_with_checkpoint(
            now,
            rpc_id,
            self.callee,
            self.method,
            &arguments,
            &bytes,
        )?;
        self.issued += 1;
        Ok(())
    }

    /// Calls left, and room in the window: `window` unanswered calls at
    /// most, spanning `window` RPC ids at most.
    fn can_issue(&self) -> bool {
        let restoring = self
            .checkpoints
            .as_ref()
            .is_some_and(|progress| progress.awaiting_restore);
        !restoring
            && self.issued < self.calls
            && self.caller.outstanding() < self.window
            && self.caller.within_span(self.window)
    }
}

impl Agent for ClientAgent {
    fn name(&self) -> &'static str {
        "bifrost-client"
    }

    fn poll(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        let mut moved = take_replies(nic, &mut self.port, &mut self.caller, now)?;
        // Outcomes first, so the next call's checkpoint covers them (a2).
        while let Some(outcome) = self.caller.take_completion() {
            if let Some(progress) = self.checkpoints.as_mut() {
                progress.unanswered.remove(&outcome.0);
            }
            self.outcomes.push(outcome);
            self.answered_at.push(now);
            moved = true;
        }
        while self.can_issue() {
            self.issue(now)
                .map_err(|error| AgentError::system("bifrost-client", error))?;
        }
        moved |= send_calls(nic, &mut self.port, &mut self.caller)?;
        Ok(Progress::from_moved(moved))
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        // Calls to issue are due now; otherwise the next retransmission.
        if self.port.poll_timeout().is_some() || self.can_issue() {
            return Some(Timestamp::ZERO);
        }
        self.caller.poll_timeout()
    }

    fn crash(&mut self) {
        self.port.forget();
        if let Some(progress) = self.checkpoints.as_mut() {
            // The caller's memory goes; the outcomes it delivered stay
            // (the application's output), trimmed by the restore.
            self.caller = self.caller.fresh();
            self.issued = 0;
            progress.unanswered.clear();
            progress.awaiting_restore = true;
        }
    }

    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Ok(())
    }
}

/// A call handed to a [`CallingAgent`] by an application thread.
pub struct CallRequest {
    pub method: String,
    pub pointer: GlobalAddress,
    pub arguments: Vec<u8>,
    /// Where the outcome goes.
    pub reply: std::sync::mpsc::SyncSender<Result<Vec<u8>, RpcError>>,
}

/// Makes the calls application threads hand it (over a channel), so a
/// blocking client — Thrift's generated ones — can run beside the rack's
/// fabric thread.
pub struct CallingAgent {
    pub caller: Caller,
    callee: DatagramEnd,
    requests: std::sync::mpsc::Receiver<CallRequest>,
    waiting: std::collections::HashMap<u64, std::sync::mpsc::SyncSender<Result<Vec<u8>, RpcError>>>,
    port: AgentPort,
}

impl CallingAgent {
    pub fn new(
        caller: Caller,
        callee: DatagramEnd,
        udp_port: u16,
        requests: std::sync::mpsc::Receiver<CallRequest>,
    ) -> CallingAgent {
        CallingAgent {
            caller,
            callee,
            requests,
            waiting: std::collections::HashMap::new(),
            port: AgentPort::new(udp_port, INBOX_DEPTH),
        }
    }
}

impl Agent for CallingAgent {
    fn name(&self) -> &'static str {
        "bifrost-calling"
    }

    fn poll(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        let mut moved = take_replies(nic, &mut self.port, &mut self.caller, now)?;
        // Bounded by the caller's window: a full window leaves the rest
        // queued in the channel. The window is one of RPC ids, within what
        // a callee's checkpoint covers (`Caller::within_span`): with up to
        // 1024 calls out, a replacement restored from a checkpoint that
        // kept the newest 16 replies ran again a resent call older than
        // those.
        while self.caller.outstanding() < super::MAX_OUTSTANDING
            && self
                .caller
                .within_span(super::checkpoint::REPLIES_PER_CALLER)
        {
            let Ok(request) = self.requests.try_recv() else {
                break;
            };
            match self.caller.call(
                now,
                self.callee,
                &request.method,
                request.pointer,
                &request.arguments,
            ) {
                Ok(rpc_id) => {
                    self.waiting.insert(rpc_id, request.reply);
                }
                // The application hears why; nothing else is affected.
                Err(error) => drop(request.reply.try_send(Err(error))),
            }
            moved = true;
        }
        moved |= send_calls(nic, &mut self.port, &mut self.caller)?;
        while let Some((rpc_id, outcome)) = self.caller.take_completion() {
            if let Some(reply) = self.waiting.remove(&rpc_id) {
                // A caller that gave up is gone: its outcome has no taker.
                let _ = reply.try_send(outcome);
            }
            moved = true;
        }
        Ok(Progress::from_moved(moved))
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        if let Some(due) = self.port.poll_timeout() {
            return Some(due);
        }
        self.caller.poll_timeout()
    }

    fn crash(&mut self) {
        self.port.forget();
        // Calls in flight die with the host: their callers hear it, and
        // the caller forgets them (kept, they were sent again after the
        // restart, and a call its application retried ran twice). Its
        // ids go on from where they were: from 1 again, the callee would
        // answer new calls with the replies it kept for old ones.
        for (_, reply) in self.waiting.drain() {
            let _ = reply.try_send(Err(RpcError::CallerCrashed));
        }
        let mut fresh = self.caller.fresh();
        fresh.resume_at(self.caller.next_rpc_id());
        self.caller = fresh;
    }

    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Ok(())
    }
}

/// A node's messages to the Gatekeeper on its control port: heartbeats
/// (the first announces the node, its kind and capacity: registration on
/// boot; the rest say it lives) and, after each heartbeat, an export of
/// each method it serves (the thesis's `export`: calls of the method go
/// to it; the Gatekeeper refuses an export of a method another live node
/// serves, so a restarted node does not take back what its replacement
/// took over). A crash silences them; a restart announces the node again
/// with a new incarnation.
pub struct ControlAgent {
    port: AgentPort,
    gatekeeper: DatagramEnd,
    heartbeat: HeartbeatRepr,
    exports: Vec<ExportRepr>,
    interval: Duration,
    next_at: Timestamp,
}

impl ControlAgent {
    /// Heartbeats every `interval` to `gatekeeper` (the service address,
    /// on [`CONTROL_PORT`]).
    pub fn new(
        gatekeeper: DatagramEnd,
        kind: NodeKind,
        capacity_bytes: u64,
        interval: Duration,
    ) -> ControlAgent {
        ControlAgent {
            port: AgentPort::new(CONTROL_PORT, 1),
            gatekeeper: DatagramEnd {
                port: CONTROL_PORT,
                ..gatekeeper
            },
            heartbeat: HeartbeatRepr {
                kind,
                incarnation: 0,
                capacity_bytes,
            },
            exports: Vec::new(),
            interval,
            next_at: Timestamp::ZERO,
        }
    }

    /// Exports `method`: the node serves it.
    pub fn export(mut self, method: &str) -> Result<ControlAgent, ExportError> {
        self.exports.push(ExportRepr::new(method)?);
        Ok(self)
    }

    /// How many times the node restarted.
    pub fn incarnation(&self) -> u32 {
        self.heartbeat.incarnation
    }
}

impl Agent for ControlAgent {
    fn name(&self) -> &'static str {
        "bifrost-control"
    }

    fn poll(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        if now < self.next_at {
            return Ok(Progress::Idle);
        }
        let mut bytes = [0u8; EXPORT_LEN];
        self.heartbeat
            .emit(&mut bytes)
            .expect("a heartbeat fits its own length");
        self.port
            .send(nic, self.gatekeeper, &bytes[..HEARTBEAT_LEN])?;
        // After the heartbeat that announced the node, so the Gatekeeper
        // knows it; repeated, since a datagram may be lost.
        for export in &self.exports {
            export
                .emit(&mut bytes)
                .expect("an export fits its own length");
            self.port.send(nic, self.gatekeeper, &bytes)?;
        }
        self.next_at = now.saturating_add(self.interval);
        Ok(Progress::from_moved(true))
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        Some(
            self.port
                .poll_timeout()
                .map_or(self.next_at, |due| due.min(self.next_at)),
        )
    }

    fn crash(&mut self) {
        self.port.forget();
    }

    fn restart(&mut self, now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        self.heartbeat.incarnation = self.heartbeat.incarnation.wrapping_add(1);
        self.next_at = now;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_rnic::{RnicConfig, SoftRnic};
    use remora_wire::{Ipv4Address, MacAddress};

    /// A server over a worker pool restarted after a crash with the
    /// pool's threads gone: it answered every call with "the worker
    /// threads are gone" and kept that answer, a resend of a call it had
    /// run too. Its restart is refused now.
    #[test]
    fn a_server_whose_workers_died_does_not_restart() {
        let pool =
            super::super::workers::WorkerPool::new(vec![
                Box::new(super::super::scenario::Counter(0)) as Box<dyn super::super::Service>,
            ])
            .unwrap();
        let mut server = ServerAgent::new(Callee::new(Box::new(pool)));
        let mut nic = SoftRnic::new(RnicConfig::new(
            MacAddress([2, 0, 0, 0, 0, 7]),
            Ipv4Address::new(10, 0, 0, 7),
            7,
        ));
        assert!(
            server.restart(Timestamp::ZERO, &mut nic).is_ok(),
            "before a crash"
        );
        server.crash();
        let refused = server.restart(Timestamp::ZERO, &mut nic).unwrap_err();
        assert!(
            refused.downcast_ref::<RestartRefused>().is_some(),
            "{refused}"
        );
        // A service of its own thread comes back.
        let mut plain = ServerAgent::new(Callee::new(Box::new(super::super::scenario::Counter(0))));
        plain.crash();
        assert!(plain.restart(Timestamp::ZERO, &mut nic).is_ok());
    }

    /// An application's calls through a calling agent were let out up to
    /// 1024 at once, past the 16 replies per caller a callee's checkpoint
    /// keeps: after a failover, a resent call older than those ran again.
    /// The agent now keeps its unanswered calls within that span of ids,
    /// as a client agent does; the rest wait in the channel.
    #[test]
    fn a_calling_agent_keeps_its_calls_within_what_a_checkpoint_covers_and_forgets_them_in_a_crash()
    {
        let mut nic = SoftRnic::new(RnicConfig::new(
            MacAddress([2, 0, 0, 0, 0, 1]),
            Ipv4Address::new(10, 0, 0, 1),
            1,
        ));
        let callee = DatagramEnd {
            mac: MacAddress([2, 0, 0, 0, 0, 2]),
            address: Ipv4Address::new(10, 0, 0, 2),
            port: remora_wire::bifrost::BIFROST_PORT,
        };
        let (requests, taken) = std::sync::mpsc::sync_channel(64);
        let caller = Caller::new(std::time::Duration::from_millis(20), 50);
        let mut agent = CallingAgent::new(caller, callee, 40000, taken);
        let mut replies = Vec::new();
        for _ in 0..40 {
            let (reply, outcome) = std::sync::mpsc::sync_channel(1);
            replies.push(outcome);
            requests
                .send(CallRequest {
                    method: "increment".into(),
                    pointer: remora_wire::bifrost::GlobalAddress::NULL,
                    arguments: Vec::new(),
                    reply,
                })
                .unwrap();
        }
        let progress = agent.poll(Timestamp::ZERO, &mut nic).unwrap();
        assert_eq!(progress, Progress::Moved);
        assert_eq!(
            agent.caller.outstanding(),
            super::super::checkpoint::REPLIES_PER_CALLER
        );
        // A crash tells the callers of those calls they died with the
        // host. They were kept and sent again after the restart: a call
        // its application retried then ran twice.
        let next = agent.caller.next_rpc_id();
        agent.crash();
        agent.restart(Timestamp::ZERO, &mut nic).unwrap();
        assert_eq!(agent.caller.outstanding(), 0, "nothing is sent again");
        assert!(matches!(
            replies[0].try_recv(),
            Ok(Err(RpcError::CallerCrashed))
        ));
        assert_eq!(agent.caller.next_rpc_id(), next, "ids go on");
    }
}
