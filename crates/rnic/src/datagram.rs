//! Plain UDP datagrams on ports a host opens: the non-RoCE traffic a
//! device carries beside its queue pairs (as a real NIC passes the host's
//! other packets). Bifröst's RPCs travel this way, on their own port,
//! where the switch can parse, hold and replay them.
//!
//! Each port has a bounded inbox; the device has one bounded outbox of
//! frames, sent before queue-pair traffic (datagrams are small control
//! messages). A datagram for a port nobody opened, or a full inbox, is
//! dropped and counted.

use crate::counters::DropReason;
use crate::verbs::{DatagramPort, ReceivedDatagram, VerbsError};
use remora_base::copy_bytes;
use remora_wire::datagram::{emit_datagram, parse_datagram, DatagramEnd, DATAGRAM_HEADERS_LEN};
use remora_wire::{Ipv4Address, MacAddress};
use std::collections::VecDeque;

/// The largest payload: a datagram fits one 4 KiB-MTU frame's payload.
pub const MAX_DATAGRAM_PAYLOAD: usize = 4096;
/// Ports a device may open.
pub const MAX_DATAGRAM_PORTS: usize = 16;
/// The deepest inbox.
pub const MAX_INBOX_DEPTH: usize = 4096;
/// Frames waiting to leave.
const OUTBOX_FRAMES: usize = 1024;

#[derive(Debug)]
struct PortState {
    udp_port: u16,
    depth: usize,
    inbox: VecDeque<(DatagramEnd, Vec<u8>)>,
}

#[derive(Debug, Default)]
pub(crate) struct Datagrams {
    ports: Vec<PortState>,
    outbox: VecDeque<Vec<u8>>,
}

impl Datagrams {
    pub(crate) fn any_open(&self) -> bool {
        !self.ports.is_empty()
    }

    pub(crate) fn is_open(&self, udp_port: u16) -> bool {
        self.ports.iter().any(|port| port.udp_port == udp_port)
    }

    pub(crate) fn open(&mut self, udp_port: u16, depth: usize) -> Result<DatagramPort, VerbsError> {
        if !(1..=MAX_INBOX_DEPTH).contains(&depth) {
            return Err(VerbsError::InvalidQueueDepth {
                queue: "datagram inbox",
                requested: depth,
                max: MAX_INBOX_DEPTH,
            });
        }
        if self.ports.len() >= MAX_DATAGRAM_PORTS {
            return Err(VerbsError::TooManyObjects {
                kind: "datagram ports",
                max: MAX_DATAGRAM_PORTS,
            });
        }
        if udp_port == remora_wire::udp::ROCEV2_UDP_PORT || self.is_open(udp_port) {
            return Err(VerbsError::DatagramPortTaken(udp_port));
        }
        self.ports.push(PortState {
            udp_port,
            depth,
            inbox: VecDeque::new(),
        });
        Ok(DatagramPort(self.ports.len() as u32 - 1))
    }

    fn port(&mut self, port: DatagramPort) -> Result<&mut PortState, VerbsError> {
        self.ports
            .get_mut(port.0 as usize)
            .ok_or(VerbsError::UnknownDatagramPort)
    }

    /// A received frame for one of the open ports.
    pub(crate) fn handle(
        &mut self,
        mac: MacAddress,
        address: Ipv4Address,
        bytes: &[u8],
    ) -> Result<(), DropReason> {
        let (repr, payload) = parse_datagram(bytes).map_err(DropReason::Malformed)?;
        if repr.destination.mac != mac {
            return Err(DropReason::WrongDestinationMac);
        }
        if repr.destination.address != address {
            return Err(DropReason::NotForThisDevice);
        }
        let port = self
            .ports
            .iter_mut()
            .find(|port| port.udp_port == repr.destination.port)
            .ok_or(DropReason::NoDatagramPort)?;
        if port.inbox.len() >= port.depth {
            return Err(DropReason::DatagramInboxFull);
        }
        port.inbox.push_back((repr.source, payload.to_vec()));
        Ok(())
    }

    pub(crate) fn send(
        &mut self,
        source: (MacAddress, Ipv4Address),
        port: DatagramPort,
        to: DatagramEnd,
        payload: &[u8],
    ) -> Result<(), VerbsError> {
        if payload.len() > MAX_DATAGRAM_PAYLOAD {
            return Err(VerbsError::DatagramTooLarge {
                length: payload.len(),
                max: MAX_DATAGRAM_PAYLOAD,
            });
        }
        let udp_port = self.port(port)?.udp_port;
        if self.outbox.len() >= OUTBOX_FRAMES {
            return Err(VerbsError::QueueFull {
                queue: "datagram outbox",
            });
        }
        let from = DatagramEnd {
            mac: source.0,
            address: source.1,
            port: udp_port,
        };
        let mut frame = vec![0u8; DATAGRAM_HEADERS_LEN + payload.len()];
        emit_datagram(from, to, payload, &mut frame).expect("the frame is sized for the payload");
        self.outbox.push_back(frame);
        Ok(())
    }

    pub(crate) fn receive(
        &mut self,
        port: DatagramPort,
        into: &mut [u8],
    ) -> Result<Option<ReceivedDatagram>, VerbsError> {
        let state = self.port(port)?;
        let Some((_, payload)) = state.inbox.front() else {
            return Ok(None);
        };
        if payload.len() > into.len() {
            return Err(VerbsError::DatagramTooLarge {
                length: payload.len(),
                max: into.len(),
            });
        }
        let (from, payload) = state.inbox.pop_front().expect("just looked");
        copy_bytes(&mut into[..payload.len()], &payload);
        Ok(Some(ReceivedDatagram {
            from,
            length: payload.len(),
        }))
    }

    /// The next frame to send, written into `buffer`.
    pub(crate) fn has_outgoing(&self) -> bool {
        !self.outbox.is_empty()
    }

    pub(crate) fn poll_transmit(&mut self, buffer: &mut [u8]) -> Option<usize> {
        let frame = self.outbox.pop_front()?;
        copy_bytes(&mut buffer[..frame.len()], &frame);
        Some(frame.len())
    }
}
