//! A service in the middle of a chain (the thesis's A calls B calls C,
//! §7): each call it receives makes one nested call to the next service,
//! and the nested call's answer is its answer. The callee and the caller
//! run in one agent on the middle host: the callee defers each call
//! ([`Service::begin`]), the agent issues the nested call, and its outcome
//! finishes the deferred one. Duplicates are dropped at both hops by
//! (caller, RPC id), so a call from the chain's head takes effect once at
//! its tail however often either hop resends.
//!
//! A nested call carries the RPC id of the call that caused it, so a relay
//! that crashes and restarts (with nothing kept) makes its nested calls
//! again under the same ids when its caller resends: the tail drops them
//! as duplicates and answers as before. That ties a relay to one upstream
//! caller (a second one's ids would collide), named in its configuration
//! like the next hop, so that it survives a crash: a call from another is
//! refused with an EXCEPTION. (Learned from the first call, it was lost in
//! a crash, and another caller's first call to the restarted relay reused
//! an id of the first one's at the tail, which answered it with the first
//! caller's reply.)

use super::{
    CallTicket, Callee, Caller, Refusal, RpcError, Service, CALLEE_FAILED_FLAG,
    OUTCOME_UNKNOWN_FLAG, REPLY_LOST_FLAG,
};
use crate::rpc::Outcome;
use remora_base::Timestamp;
use remora_host::{Agent, AgentError, AgentPort, Progress};
use remora_rnic::Verbs;
use remora_wire::bifrost::{GlobalAddress, BIFROST_PORT};
use remora_wire::datagram::DatagramEnd;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

/// Datagrams taken per turn, on each port.
const DATAGRAMS_PER_TURN: usize = 256;
const INBOX_DEPTH: usize = 1024;

/// A call the relay deferred, waiting for its nested call.
struct Pending {
    ticket: CallTicket,
    pointer: GlobalAddress,
    arguments: Vec<u8>,
}

/// What the relay service and its agent share.
#[derive(Default)]
struct RelayQueues {
    /// Calls begun, not yet passed on.
    begun: VecDeque<Pending>,
    /// Nested calls answered: the deferred call's outcome.
    finished: VecDeque<(CallTicket, Outcome)>,
}

/// The middle service: every call is deferred to a nested call.
struct Relay {
    queues: Arc<Mutex<RelayQueues>>,
}

impl Service for Relay {
    /// The relay only runs calls through `begin`.
    fn call(&mut self, _: &[u8], _: GlobalAddress, _: &[u8]) -> Outcome {
        Err("a relay answers through begin".into())
    }

    fn begin(
        &mut self,
        ticket: CallTicket,
        _method: &[u8],
        pointer: GlobalAddress,
        arguments: &[u8],
    ) -> Option<Outcome> {
        let mut queues = self
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        queues.begun.push_back(Pending {
            ticket,
            pointer,
            arguments: arguments.to_vec(),
        });
        None
    }

    fn poll_finished(&mut self) -> Option<(CallTicket, Outcome)> {
        let mut queues = self
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        queues.finished.pop_front()
    }
}

/// The one caller a relay serves, by its address and port (the MAC a
/// call arrives with is the last hop's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Upstream {
    pub address: remora_wire::Ipv4Address,
    pub port: u16,
}

impl Upstream {
    fn is(&self, caller: DatagramEnd) -> bool {
        caller.address == self.address && caller.port == self.port
    }
}

/// The middle host's agent: serves calls on Bifröst's port and makes their
/// nested calls to `next` (method `next_method`) from `caller_port`.
pub struct RelayAgent {
    pub callee: Callee,
    pub caller: Caller,
    /// The one caller this relay serves: its address and port.
    upstream: Upstream,
    retransmit_after: std::time::Duration,
    max_attempts: u32,
    queues: Arc<Mutex<RelayQueues>>,
    next: DatagramEnd,
    next_method: &'static str,
    nested: HashMap<u64, CallTicket>,
    serving: AgentPort,
    calling: AgentPort,
    last_turn: Timestamp,
}

impl RelayAgent {
    /// A relay serving `upstream`, whose nested calls resend every
    /// `retransmit_after`, up to `max_attempts` times.
    pub fn new(
        upstream: Upstream,
        retransmit_after: std::time::Duration,
        max_attempts: u32,
        next: DatagramEnd,
        next_method: &'static str,
        caller_port: u16,
    ) -> RelayAgent {
        let queues = Arc::new(Mutex::new(RelayQueues::default()));
        let relay = Relay {
            queues: Arc::clone(&queues),
        };
        RelayAgent {
            callee: Callee::new(Box::new(relay)),
            caller: Caller::new(retransmit_after, max_attempts),
            upstream,
            retransmit_after,
            max_attempts,
            queues,
            next,
            next_method,
            nested: HashMap::new(),
            serving: AgentPort::new(BIFROST_PORT, INBOX_DEPTH),
            calling: AgentPort::new(caller_port, INBOX_DEPTH),
            last_turn: Timestamp::ZERO,
        }
    }

    /// Issues the nested call of every call begun since the last turn.
    fn pass_on(&mut self, now: Timestamp) -> Result<bool, AgentError> {
        let begun: Vec<Pending> = {
            let mut queues = self
                .queues
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            queues.begun.drain(..).collect()
        };
        let moved = !begun.is_empty();
        for pending in begun {
            if !self.upstream.is(pending.ticket.caller) {
                let refused = RpcError::SecondUpstreamCaller(pending.ticket.caller);
                self.finish(pending.ticket, Err(refused));
                continue;
            }
            // The nested call carries the id of the call that caused it.
            match self.caller.call_as(
                now,
                pending.ticket.rpc_id,
                self.next,
                self.next_method,
                pending.pointer,
                &pending.arguments,
            ) {
                Ok(rpc_id) => {
                    self.nested.insert(rpc_id, pending.ticket);
                }
                Err(error) => self.finish(pending.ticket, Err(error)),
            }
        }
        Ok(moved)
    }

    fn finish(&mut self, ticket: CallTicket, outcome: Result<Vec<u8>, RpcError>) {
        let outcome = outcome.map(Into::into).map_err(refusal_upstream);
        let mut queues = self
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        queues.finished.push_back((ticket, outcome));
    }
}

/// The refusal a nested call's failure makes upstream, typed as the head
/// must see it: a nested call the tail may have run (no answer, timed
/// out, its outcome unknown) is an outcome unknown upstream too, never an
/// exception the relay raised (the head would take it as final, and one
/// that issued the call again under a new id could run it twice at the
/// tail); a lost reply or a shared fate stays what it was; the tail's own
/// exception passes as its text.
fn refusal_upstream(error: RpcError) -> Refusal {
    let flagged = |flag, message: String| Refusal { message, flag };
    match error {
        RpcError::Exception(message) => Refusal::from(message),
        RpcError::ReplyLost(message) => flagged(REPLY_LOST_FLAG, message),
        RpcError::SharedFate(message) => flagged(CALLEE_FAILED_FLAG, message),
        RpcError::OutcomeUnknown(message) => flagged(OUTCOME_UNKNOWN_FLAG, message),
        unknown @ (RpcError::NoAnswer { .. } | RpcError::TimedOut(_)) => {
            flagged(OUTCOME_UNKNOWN_FLAG, unknown.to_string())
        }
        other => Refusal::from(other.to_string()),
    }
}

impl Agent for RelayAgent {
    fn name(&self) -> &'static str {
        "bifrost-relay"
    }

    fn poll(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        self.last_turn = now;
        let callee = &mut self.callee;
        let mut moved = self
            .serving
            .receive(nic, DATAGRAMS_PER_TURN, |from, call| {
                callee.handle(from, call)
            })?;
        moved |= self.pass_on(now)?;
        let caller = &mut self.caller;
        moved |= self
            .calling
            .receive(nic, DATAGRAMS_PER_TURN, |_, reply| caller.handle(reply))?;
        if self.caller.poll_timeout().is_some_and(|due| due <= now) {
            self.caller.handle_timeout(now);
        }
        while let Some((rpc_id, outcome)) = self.caller.take_completion() {
            if let Some(ticket) = self.nested.remove(&rpc_id) {
                self.finish(ticket, outcome);
            }
            moved = true;
        }
        while let Some((to, payload)) = self.caller.poll_transmit() {
            self.calling.send(nic, to, &payload)?;
            moved = true;
        }
        moved |= self.callee.poll_service();
        while let Some((to, payload)) = self.callee.poll_transmit() {
            self.serving.send(nic, to, &payload)?;
            moved = true;
        }
        Ok(Progress::from_moved(moved))
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        if let Some(due) = self.serving.poll_timeout().or(self.calling.poll_timeout()) {
            return Some(due);
        }
        self.caller.poll_timeout()
    }

    /// A relay keeps nothing: its calls in progress, the replies it
    /// remembers and its nested calls die with it; its caller resends.
    fn crash(&mut self) {
        self.serving.forget();
        self.calling.forget();
        let queues = Arc::new(Mutex::new(RelayQueues::default()));
        self.callee = Callee::new(Box::new(Relay {
            queues: Arc::clone(&queues),
        }));
        self.queues = queues;
        self.caller = Caller::new(self.retransmit_after, self.max_attempts);
        self.nested.clear();
    }

    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_wire::{Ipv4Address, MacAddress};

    fn end(host: u8, port: u16) -> DatagramEnd {
        DatagramEnd {
            mac: MacAddress([2, 0, 0, 0, 0, host]),
            address: Ipv4Address::new(10, 0, 0, host),
            port,
        }
    }

    /// A service that refuses as a relay does when its nested call got no
    /// answer.
    struct NestedUnanswered;

    impl Service for NestedUnanswered {
        fn call(&mut self, _: &[u8], _: GlobalAddress, _: &[u8]) -> Outcome {
            Err(refusal_upstream(RpcError::NoAnswer {
                rpc_id: 7,
                attempts: 3,
            }))
        }
    }

    /// A relay turned its nested call's failure into text, so a nested
    /// call that got no answer (the tail may have run it) reached the head
    /// as an exception the relay raised, final: a head that issued it
    /// again under a new id could run it twice at the tail. It arrives as
    /// an outcome unknown, and a lost reply stays a lost reply.
    #[test]
    fn a_relay_passes_a_nested_failure_upstream_typed() {
        let mut head = Caller::new(std::time::Duration::from_secs(60), 3);
        let mut relay = Callee::new(Box::new(NestedUnanswered));
        let to = end(2, BIFROST_PORT);
        let rpc_id = head
            .call(Timestamp::ZERO, to, "next", GlobalAddress::NULL, b"")
            .unwrap();
        let (_, call) = head.poll_transmit().expect("the call");
        relay.handle(end(1, 40000), &call);
        let (_, reply) = relay.poll_transmit().expect("the relay's answer");
        head.handle(&reply);
        let (answered, outcome) = head.take_completion().expect("an outcome");
        assert_eq!(answered, rpc_id);
        assert!(
            matches!(outcome, Err(RpcError::OutcomeUnknown(_))),
            "{outcome:?}"
        );
        let lost = refusal_upstream(RpcError::ReplyLost("gone".into()));
        assert_eq!(lost.flag, REPLY_LOST_FLAG);
        assert_eq!(
            refusal_upstream(RpcError::Exception("no".into())),
            Refusal::from("no")
        );
    }

    /// A stranger's call, begun on `relay`, is refused at the next turn.
    fn stranger_is_refused(relay: &mut RelayAgent, rpc_id: u64) -> bool {
        let ticket = CallTicket {
            caller: end(9, 40000),
            rpc_id,
        };
        let pending = Pending {
            ticket,
            pointer: GlobalAddress::NULL,
            arguments: Vec::new(),
        };
        relay.queues.lock().unwrap().begun.push_back(pending);
        relay.pass_on(Timestamp::ZERO).unwrap();
        let finished = relay.queues.lock().unwrap().finished.pop_front();
        matches!(finished, Some((refused, Err(_))) if refused == ticket)
    }

    /// The upstream was learned from the first call and forgotten in a
    /// crash, so a stranger calling the restarted relay first became its
    /// upstream, and the tail answered the stranger's ids with the first
    /// caller's replies. It is configuration now, and a crash keeps it.
    #[test]
    fn a_relay_serves_its_configured_upstream_only_before_and_after_a_crash() {
        let upstream = Upstream {
            address: Ipv4Address::new(10, 0, 0, 1),
            port: 40000,
        };
        let mut relay = RelayAgent::new(
            upstream,
            std::time::Duration::from_micros(50),
            10,
            end(2, BIFROST_PORT),
            "increment",
            40001,
        );
        assert!(stranger_is_refused(&mut relay, 1));
        relay.crash();
        assert!(stranger_is_refused(&mut relay, 1));
        assert_eq!(relay.nested.len(), 0, "no nested call was made for it");
    }
}
