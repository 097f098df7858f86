//! A datagram port as an agent holds it: opened on the agent's first turn,
//! forgotten when its host crashes (the device that held it is gone), with
//! one receive buffer of the largest datagram.

use crate::AgentError;
use remora_rnic::datagram::MAX_DATAGRAM_PAYLOAD;
use remora_rnic::{DatagramPort, Verbs};
use remora_wire::datagram::DatagramEnd;

/// An agent's UDP port on its host's device.
pub struct AgentPort {
    udp_port: u16,
    inbox_depth: usize,
    port: Option<DatagramPort>,
    buffer: Vec<u8>,
}

impl AgentPort {
    /// A port to open on `udp_port` with an inbox of `inbox_depth`.
    pub fn new(udp_port: u16, inbox_depth: usize) -> AgentPort {
        AgentPort {
            udp_port,
            inbox_depth,
            port: None,
            buffer: vec![0; MAX_DATAGRAM_PAYLOAD],
        }
    }

    pub fn is_open(&self) -> bool {
        self.port.is_some()
    }

    /// The open port, opening it on first use.
    pub fn open(&mut self, nic: &mut dyn Verbs) -> Result<DatagramPort, AgentError> {
        if let Some(port) = self.port {
            return Ok(port);
        }
        let opened = nic.open_datagram_port(self.udp_port, self.inbox_depth)?;
        self.port = Some(opened);
        Ok(opened)
    }

    /// The host crashed: the port went with its device.
    pub fn forget(&mut self) {
        self.port = None;
    }

    /// Hands each of at most `limit` waiting datagrams to `handle`, oldest
    /// first; whether any came.
    pub fn receive(
        &mut self,
        nic: &mut dyn Verbs,
        limit: usize,
        mut handle: impl FnMut(DatagramEnd, &[u8]),
    ) -> Result<bool, AgentError> {
        let port = self.open(nic)?;
        let mut received_any = false;
        for _ in 0..limit {
            let Some(received) = nic.receive_datagram(port, &mut self.buffer)? else {
                break;
            };
            handle(received.from, &self.buffer[..received.length]);
            received_any = true;
        }
        Ok(received_any)
    }

    pub fn send(
        &mut self,
        nic: &mut dyn Verbs,
        to: DatagramEnd,
        payload: &[u8],
    ) -> Result<(), AgentError> {
        let port = self.open(nic)?;
        nic.send_datagram(port, to, payload)?;
        Ok(())
    }
}
