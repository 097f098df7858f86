//! Per-device counters. Every dropped frame is counted under its reason.

use remora_wire::WireError;
use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// The frame failed to parse or verify.
    Malformed(WireError),
    /// Addressed to another MAC address (a switch flooding, or a
    /// misconfigured peer): a NIC filters these before anything else.
    WrongDestinationMac,
    /// Addressed to another IP address.
    NotForThisDevice,
    /// A BTH P_Key of another partition than the port's (the default):
    /// IBA's P_Key check drops it.
    BadPartitionKey,
    /// No queue pair with the destination QPN.
    UnknownQueuePair,
    /// The source address is not the queue pair's peer.
    WrongPeer,
    /// The queue pair is not in a state that accepts this packet.
    QueuePairNotReady,
    /// A request with a PSN beyond the expected one (go-back-N discards it).
    OutOfSequence,
    /// A response that matches no outstanding request.
    UnexpectedResponse,
    /// A duplicate READ/atomic no longer in the replay cache.
    DuplicateNotReplayable,
    /// The responder's output queue was full; the requester will retransmit.
    ResponderBusy,
    /// Congestion notifications are counted, not acted on.
    CongestionNotification,
    /// A datagram for a UDP port the host did not open.
    NoDatagramPort,
    /// A datagram for a port whose inbox was full.
    DatagramInboxFull,
}

impl DropReason {
    /// The reason as drops are counted: a malformed frame by the kind of
    /// its fault, without the values (see [`WireError::without_details`]).
    pub fn without_details(self) -> DropReason {
        match self {
            DropReason::Malformed(error) => DropReason::Malformed(error.without_details()),
            other => other,
        }
    }

    /// A stable name for reports: the reason, or for a malformed frame
    /// the kind of wire error (`icrc_mismatch`, `bad_ip_checksum`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            DropReason::Malformed(error) => error.kind(),
            DropReason::WrongDestinationMac => "wrong_destination_mac",
            DropReason::NotForThisDevice => "not_for_this_device",
            DropReason::BadPartitionKey => "bad_partition_key",
            DropReason::UnknownQueuePair => "unknown_queue_pair",
            DropReason::WrongPeer => "wrong_peer",
            DropReason::QueuePairNotReady => "queue_pair_not_ready",
            DropReason::OutOfSequence => "out_of_sequence",
            DropReason::UnexpectedResponse => "unexpected_response",
            DropReason::DuplicateNotReplayable => "duplicate_not_replayable",
            DropReason::ResponderBusy => "responder_busy",
            DropReason::NoDatagramPort => "no_datagram_port",
            DropReason::DatagramInboxFull => "datagram_inbox_full",
            DropReason::CongestionNotification => "congestion_notification",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RnicCounters {
    pub frames_received: u64,
    pub frames_transmitted: u64,
    pub bytes_received: u64,
    pub bytes_transmitted: u64,
    pub packets_retransmitted: u64,
    pub retransmit_timeouts: u64,
    pub acks_sent: u64,
    pub acks_coalesced: u64,
    pub sequence_naks_sent: u64,
    pub sequence_naks_received: u64,
    pub receiver_not_ready_naks_sent: u64,
    pub receiver_not_ready_naks_received: u64,
    pub error_naks_sent: u64,
    pub error_naks_received: u64,
    pub duplicate_requests: u64,
    pub replayed_reads: u64,
    pub replayed_atomics: u64,
    /// Replays dropped unsent because a new READ or atomic took their
    /// slot: they answered duplicates of requests already retired.
    pub stale_replays_dropped: u64,
    /// RNR and sequence NAKs for a PSN not sent again since the last one
    /// acted on: copies, which spend no retry.
    pub stale_naks_ignored: u64,
    pub drops: HashMap<DropReason, u64>,
}

impl RnicCounters {
    pub fn count_drop(&mut self, reason: DropReason) {
        *self.drops.entry(reason.without_details()).or_default() += 1;
    }

    /// Drops by reason name, summed where reasons share a name.
    pub fn drops_by_name(&self) -> std::collections::BTreeMap<&'static str, u64> {
        let mut named = std::collections::BTreeMap::new();
        for (reason, count) in &self.drops {
            *named.entry(reason.name()).or_default() += count;
        }
        named
    }

    pub fn drops_total(&self) -> u64 {
        self.drops.values().sum()
    }

    pub fn drops_for(&self, reason: DropReason) -> u64 {
        self.drops
            .get(&reason.without_details())
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drops were keyed by the whole wire error, values included: a peer
    /// sweeping ethertypes or opcodes added an entry per value (65,536 for
    /// the ethertypes). They are keyed by kind now, and still all counted.
    #[test]
    fn a_sweep_of_malformed_values_keeps_one_counter_per_kind() {
        let mut counters = RnicCounters::default();
        for ethertype in 0..=u16::MAX {
            counters.count_drop(DropReason::Malformed(WireError::NotIpv4(ethertype)));
        }
        for opcode in 0..=u8::MAX {
            counters.count_drop(DropReason::Malformed(WireError::UnknownOpcode(opcode)));
        }
        assert_eq!(counters.drops.len(), 2);
        assert_eq!(
            counters.drops_for(DropReason::Malformed(WireError::NotIpv4(0x86dd))),
            65_536
        );
        assert_eq!(counters.drops_by_name()["unknown_opcode"], 256);
    }
}
