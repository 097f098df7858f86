//! Agents that run the RPC runtime on a host's device: a server (a
//! [`Callee`] on [`BIFROST_PORT`]) and a client that issues a planned
//! number of calls and records their outcomes.

use super::{Callee, Caller, RpcError};
use remora_base::Timestamp;
use remora_host::{Agent, AgentError, Progress};
use remora_rnic::{DatagramPort, Verbs};
use remora_wire::bifrost::{GlobalAddress, BIFROST_PORT};
use remora_wire::datagram::DatagramEnd;

/// Datagrams taken per turn.
const DATAGRAMS_PER_TURN: usize = 256;
/// A port's inbox.
const INBOX_DEPTH: usize = 1024;
/// The largest datagram payload.
const MAX_PAYLOAD: usize = 4096;

fn open(
    nic: &mut dyn Verbs,
    port: &mut Option<DatagramPort>,
    udp_port: u16,
) -> Result<DatagramPort, AgentError> {
    if let Some(port) = *port {
        return Ok(port);
    }
    let opened = nic.open_datagram_port(udp_port, INBOX_DEPTH)?;
    *port = Some(opened);
    Ok(opened)
}

/// Serves calls on Bifröst's port.
pub struct ServerAgent {
    pub callee: Callee,
    port: Option<DatagramPort>,
}

impl ServerAgent {
    pub fn new(callee: Callee) -> ServerAgent {
        ServerAgent { callee, port: None }
    }
}

impl Agent for ServerAgent {
    fn name(&self) -> &'static str {
        "bifrost-server"
    }

    fn poll(&mut self, _now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        let port = open(nic, &mut self.port, BIFROST_PORT)?;
        let mut moved = false;
        let mut buffer = vec![0u8; MAX_PAYLOAD];
        for _ in 0..DATAGRAMS_PER_TURN {
            let Some(received) = nic.receive_datagram(port, &mut buffer)? else {
                break;
            };
            self.callee
                .handle(received.from, &buffer[..received.length]);
            moved = true;
        }
        while let Some((to, payload)) = self.callee.poll_transmit() {
            nic.send_datagram(port, to, &payload)?;
            moved = true;
        }
        Ok(Progress::from_moved(moved))
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        // Open the port at once, before the first call arrives.
        self.port.is_none().then_some(Timestamp::ZERO)
    }

    fn crash(&mut self) {
        self.port = None;
    }

    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Ok(())
    }
}

/// Issues `calls` calls of `method` to `callee`, `window` at a time, and
/// keeps every outcome.
pub struct ClientAgent {
    pub caller: Caller,
    callee: DatagramEnd,
    method: &'static str,
    udp_port: u16,
    calls: u64,
    window: usize,
    issued: u64,
    pub outcomes: Vec<(u64, Result<Vec<u8>, RpcError>)>,
    port: Option<DatagramPort>,
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
            udp_port,
            calls,
            window: window.max(1),
            issued: 0,
            outcomes: Vec::new(),
            port: None,
        }
    }

    pub fn is_done(&self) -> bool {
        self.outcomes.len() as u64 == self.calls
    }
}

impl Agent for ClientAgent {
    fn name(&self) -> &'static str {
        "bifrost-client"
    }

    fn poll(&mut self, now: Timestamp, nic: &mut dyn Verbs) -> Result<Progress, AgentError> {
        let port = open(nic, &mut self.port, self.udp_port)?;
        let mut moved = false;
        let mut buffer = vec![0u8; MAX_PAYLOAD];
        for _ in 0..DATAGRAMS_PER_TURN {
            let Some(received) = nic.receive_datagram(port, &mut buffer)? else {
                break;
            };
            self.caller.handle(&buffer[..received.length]);
            moved = true;
        }
        if self.caller.poll_timeout().is_some_and(|due| due <= now) {
            self.caller.handle_timeout(now);
        }
        while self.issued < self.calls && self.caller.outstanding() < self.window {
            let arguments = self.issued.to_be_bytes();
            self.caller
                .call(
                    now,
                    self.callee,
                    self.method,
                    GlobalAddress::NULL,
                    &arguments,
                )
                .map_err(|error| AgentError::system("bifrost-client", error))?;
            self.issued += 1;
        }
        while let Some((to, payload)) = self.caller.poll_transmit() {
            nic.send_datagram(port, to, &payload)?;
            moved = true;
        }
        while let Some(outcome) = self.caller.take_completion() {
            self.outcomes.push(outcome);
            moved = true;
        }
        Ok(Progress::from_moved(moved))
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        // Calls to issue are due now; otherwise the next retransmission.
        let can_issue = self.issued < self.calls && self.caller.outstanding() < self.window;
        if self.port.is_none() || can_issue {
            return Some(Timestamp::ZERO);
        }
        self.caller.poll_timeout()
    }

    fn crash(&mut self) {
        self.port = None;
    }

    fn restart(&mut self, _now: Timestamp, _nic: &mut dyn Verbs) -> Result<(), AgentError> {
        Ok(())
    }
}
