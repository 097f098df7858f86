//! The host program of the conformance scenario: receives the host posts
//! late, to exercise RNR. It runs as an agent of a simulator
//! [`Host`](remora_host::Host).

use remora_base::Timestamp;
use remora_host::{Agent, AgentError, Progress};
use remora_rnic::{QueuePair, ReceiveRequest, Verbs};

/// Receives posted at set times, soonest first.
#[derive(Default)]
pub struct LateReceives {
    pending: Vec<(Timestamp, QueuePair, ReceiveRequest)>,
}

impl LateReceives {
    pub fn post_at(&mut self, at: Timestamp, queue_pair: QueuePair, request: ReceiveRequest) {
        self.pending.push((at, queue_pair, request));
        self.pending.sort_by_key(|(at, _, _)| *at);
    }
}

impl Agent for LateReceives {
    fn name(&self) -> &'static str {
        "late-receives"
    }

    fn poll(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        let due = self
            .pending
            .iter()
            .take_while(|(at, _, _)| *at <= now)
            .count();
        for (_, queue_pair, request) in self.pending.drain(..due) {
            // The queue pair may be in error by now; that is the scenario's
            // business, not the host's.
            let _ = nic.post_receive(queue_pair, request);
        }
        Ok(Progress::from_moved(due > 0))
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        self.pending.first().map(|(at, _, _)| *at)
    }

    fn crash(&mut self) {
        self.pending.clear();
    }

    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Ok(())
    }
}
