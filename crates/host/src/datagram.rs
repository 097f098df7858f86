//! A datagram port as an agent holds it: opened on the agent's first turn,
//! forgotten when its host crashes (the device that held it is gone), with
//! one receive buffer of the largest datagram.
//!
//! A datagram the device's outbox has no room for is held and sent first
//! on a later turn, in order. While any is held the port takes no new
//! datagrams: requests wait in the inbox (the device drops and counts what
//! overflows it) instead of answers piling up here, and one burst never
//! stops an agent.

use crate::AgentError;
use remora_base::Timestamp;
use remora_rnic::datagram::MAX_DATAGRAM_PAYLOAD;
use remora_rnic::{DatagramPort, Verbs, VerbsError};
use remora_wire::datagram::DatagramEnd;
use std::collections::VecDeque;

/// The most datagrams a port holds. An agent sends a bounded number per
/// datagram it takes, and takes none while any is held, so this is never
/// reached; past it a send is refused, as the device's own would be.
pub const MAX_HELD_DATAGRAMS: usize = 4096;

/// An agent's UDP port on its host's device.
pub struct AgentPort {
    udp_port: u16,
    inbox_depth: usize,
    port: Option<DatagramPort>,
    buffer: Vec<u8>,
    /// Datagrams the device had no room for, oldest first.
    held: VecDeque<(DatagramEnd, Vec<u8>)>,
}

impl AgentPort {
    /// A port to open on `udp_port` with an inbox of `inbox_depth`.
    pub fn new(udp_port: u16, inbox_depth: usize) -> AgentPort {
        AgentPort {
            udp_port,
            inbox_depth,
            port: None,
            buffer: vec![0; MAX_DATAGRAM_PAYLOAD],
            held: VecDeque::new(),
        }
    }

    pub fn is_open(&self) -> bool {
        self.port.is_some()
    }

    /// Datagrams waiting for room in the device's outbox.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// When the agent needs a turn for the port's sake: at once while it
    /// is not open yet or holds datagrams.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        (!self.is_open() || !self.held.is_empty()).then_some(Timestamp::ZERO)
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
        self.held.clear();
    }

    /// Sends held datagrams, then hands each of at most `limit` waiting
    /// datagrams to `handle`, oldest first, unless some are still held;
    /// whether anything moved.
    pub fn receive(
        &mut self,
        nic: &mut dyn Verbs,
        limit: usize,
        mut handle: impl FnMut(DatagramEnd, &[u8]),
    ) -> Result<bool, AgentError> {
        let port = self.open(nic)?;
        let held_before = self.held.len();
        if !self.send_held(nic, port)? {
            return Ok(self.held.len() < held_before);
        }
        let mut received_any = held_before > 0;
        for _ in 0..limit {
            let Some(received) = nic.receive_datagram(port, &mut self.buffer)? else {
                break;
            };
            handle(received.from, &self.buffer[..received.length]);
            received_any = true;
        }
        Ok(received_any)
    }

    /// Sends `payload` to `to`, or holds it while the device's outbox is
    /// full (or others are held before it).
    pub fn send(
        &mut self,
        nic: &mut dyn Verbs,
        to: DatagramEnd,
        payload: &[u8],
    ) -> Result<(), AgentError> {
        let port = self.open(nic)?;
        if self.held.is_empty() {
            match nic.send_datagram(port, to, payload) {
                Err(VerbsError::QueueFull { .. }) => {}
                result => return Ok(result?),
            }
        }
        if self.held.len() >= MAX_HELD_DATAGRAMS {
            return Err(VerbsError::QueueFull {
                queue: "an agent's held datagrams",
            }
            .into());
        }
        self.held.push_back((to, payload.to_vec()));
        Ok(())
    }

    /// Sends held datagrams, oldest first, until the device is full
    /// again; whether none is left.
    fn send_held(&mut self, nic: &mut dyn Verbs, port: DatagramPort) -> Result<bool, AgentError> {
        // Bounded by what is held: each pass sends one or stops.
        while let Some((to, payload)) = self.held.front() {
            match nic.send_datagram(port, *to, payload) {
                Err(VerbsError::QueueFull { .. }) => return Ok(false),
                result => result?,
            }
            self.held.pop_front();
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use remora_rnic::back_to_back::BackToBack;

    const PORT: u16 = 4793;

    /// [`PORT`] on `nic`.
    fn end_of(nic: &remora_rnic::SoftRnic) -> DatagramEnd {
        let config = nic.config();
        DatagramEnd {
            mac: config.mac,
            address: config.address,
            port: PORT,
        }
    }

    /// A burst that filled the device's datagram outbox made `send` fail,
    /// which stopped the agent (TIGA's engine, Bifröst's callees) and lost
    /// the answers after it. Now they are held and sent, in order, once
    /// the outbox drains, and the port takes nothing new meanwhile.
    #[test]
    fn a_full_outbox_holds_datagrams_until_it_drains() {
        let mut fabric = BackToBack::new(3);
        let mut sender = AgentPort::new(PORT, 16);
        let mut receiver = AgentPort::new(PORT, 4096);
        receiver.open(&mut fabric.right).unwrap();
        let to = end_of(&fabric.right);
        let total = 1500u32;
        for index in 0..total {
            sender
                .send(&mut fabric.left, to, &index.to_be_bytes())
                .unwrap();
        }
        assert!(sender.held() > 0, "the device's outbox filled");
        assert!(
            sender.poll_timeout().is_some(),
            "a holding port wants a turn"
        );
        let mut got = Vec::new();
        for _ in 0..64 {
            fabric.run(10_000);
            let mut taken = 0;
            sender
                .receive(&mut fabric.left, 16, |_, _| taken += 1)
                .unwrap();
            assert_eq!(taken, 0, "nothing came to the sender");
            receiver
                .receive(&mut fabric.right, 4096, |_, payload| {
                    got.push(u32::from_be_bytes(payload.try_into().unwrap()))
                })
                .unwrap();
            if sender.held() == 0 && got.len() == total as usize {
                break;
            }
        }
        assert_eq!(
            got,
            (0..total).collect::<Vec<_>>(),
            "every datagram, in order"
        );
        assert_eq!(sender.poll_timeout(), None);
    }

    /// While datagrams are held, the port takes no new ones: requests wait
    /// in the device's inbox instead of answers piling up.
    #[test]
    fn a_holding_port_takes_nothing_new() {
        let mut fabric = BackToBack::new(4);
        let mut left = AgentPort::new(PORT, 16);
        let mut right = AgentPort::new(PORT, 16);
        right.open(&mut fabric.right).unwrap();
        let to_left = end_of(&fabric.left);
        left.open(&mut fabric.left).unwrap();
        right.send(&mut fabric.right, to_left, b"request").unwrap();
        fabric.run(10_000);
        let to = end_of(&fabric.right);
        while left.held() == 0 {
            left.send(&mut fabric.left, to, b"answer").unwrap();
        }
        let mut taken = 0;
        left.receive(&mut fabric.left, 16, |_, _| taken += 1)
            .unwrap();
        assert_eq!(taken, 0, "held answers first");
        fabric.run(100_000);
        for _ in 0..64 {
            right.receive(&mut fabric.right, 4096, |_, _| {}).unwrap();
            left.receive(&mut fabric.left, 16, |_, _| taken += 1)
                .unwrap();
            if taken > 0 {
                break;
            }
            fabric.run(100_000);
        }
        assert_eq!(taken, 1, "the request, once the answers went");
    }
}
