//! Base Transport Header opcodes for the Reliable Connected transport.
//!
//! The top three bits of an opcode select the transport (000 = RC); the
//! rest select the operation. RoCEv2's congestion notification packet
//! (CNP, 0x81) is included so captures of real NICs parse.

/// Every RC opcode, plus the RoCEv2 CNP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    SendFirst = 0x00,
    SendMiddle = 0x01,
    SendLast = 0x02,
    SendLastWithImmediate = 0x03,
    SendOnly = 0x04,
    SendOnlyWithImmediate = 0x05,
    RdmaWriteFirst = 0x06,
    RdmaWriteMiddle = 0x07,
    RdmaWriteLast = 0x08,
    RdmaWriteLastWithImmediate = 0x09,
    RdmaWriteOnly = 0x0a,
    RdmaWriteOnlyWithImmediate = 0x0b,
    RdmaReadRequest = 0x0c,
    RdmaReadResponseFirst = 0x0d,
    RdmaReadResponseMiddle = 0x0e,
    RdmaReadResponseLast = 0x0f,
    RdmaReadResponseOnly = 0x10,
    Acknowledge = 0x11,
    AtomicAcknowledge = 0x12,
    CompareSwap = 0x13,
    FetchAdd = 0x14,
    SendLastWithInvalidate = 0x16,
    SendOnlyWithInvalidate = 0x17,
    CongestionNotification = 0x81,
}

/// Where a packet sits in a multi-packet message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment {
    First,
    Middle,
    Last,
    Only,
}

/// The family of operation an opcode belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpcodeFamily {
    Send,
    RdmaWrite,
    RdmaReadRequest,
    RdmaReadResponse,
    Acknowledge,
    AtomicAcknowledge,
    Atomic,
    CongestionNotification,
}

impl Opcode {
    pub const ALL: [Opcode; 24] = [
        Opcode::SendFirst,
        Opcode::SendMiddle,
        Opcode::SendLast,
        Opcode::SendLastWithImmediate,
        Opcode::SendOnly,
        Opcode::SendOnlyWithImmediate,
        Opcode::RdmaWriteFirst,
        Opcode::RdmaWriteMiddle,
        Opcode::RdmaWriteLast,
        Opcode::RdmaWriteLastWithImmediate,
        Opcode::RdmaWriteOnly,
        Opcode::RdmaWriteOnlyWithImmediate,
        Opcode::RdmaReadRequest,
        Opcode::RdmaReadResponseFirst,
        Opcode::RdmaReadResponseMiddle,
        Opcode::RdmaReadResponseLast,
        Opcode::RdmaReadResponseOnly,
        Opcode::Acknowledge,
        Opcode::AtomicAcknowledge,
        Opcode::CompareSwap,
        Opcode::FetchAdd,
        Opcode::SendLastWithInvalidate,
        Opcode::SendOnlyWithInvalidate,
        Opcode::CongestionNotification,
    ];

    pub fn from_u8(value: u8) -> Option<Opcode> {
        use Opcode::*;
        Some(match value {
            0x00 => SendFirst,
            0x01 => SendMiddle,
            0x02 => SendLast,
            0x03 => SendLastWithImmediate,
            0x04 => SendOnly,
            0x05 => SendOnlyWithImmediate,
            0x06 => RdmaWriteFirst,
            0x07 => RdmaWriteMiddle,
            0x08 => RdmaWriteLast,
            0x09 => RdmaWriteLastWithImmediate,
            0x0a => RdmaWriteOnly,
            0x0b => RdmaWriteOnlyWithImmediate,
            0x0c => RdmaReadRequest,
            0x0d => RdmaReadResponseFirst,
            0x0e => RdmaReadResponseMiddle,
            0x0f => RdmaReadResponseLast,
            0x10 => RdmaReadResponseOnly,
            0x11 => Acknowledge,
            0x12 => AtomicAcknowledge,
            0x13 => CompareSwap,
            0x14 => FetchAdd,
            0x16 => SendLastWithInvalidate,
            0x17 => SendOnlyWithInvalidate,
            0x81 => CongestionNotification,
            _ => return None,
        })
    }

    pub fn family(self) -> OpcodeFamily {
        use Opcode::*;
        match self {
            SendFirst
            | SendMiddle
            | SendLast
            | SendLastWithImmediate
            | SendOnly
            | SendOnlyWithImmediate
            | SendLastWithInvalidate
            | SendOnlyWithInvalidate => OpcodeFamily::Send,
            RdmaWriteFirst
            | RdmaWriteMiddle
            | RdmaWriteLast
            | RdmaWriteLastWithImmediate
            | RdmaWriteOnly
            | RdmaWriteOnlyWithImmediate => OpcodeFamily::RdmaWrite,
            RdmaReadRequest => OpcodeFamily::RdmaReadRequest,
            RdmaReadResponseFirst
            | RdmaReadResponseMiddle
            | RdmaReadResponseLast
            | RdmaReadResponseOnly => OpcodeFamily::RdmaReadResponse,
            Acknowledge => OpcodeFamily::Acknowledge,
            AtomicAcknowledge => OpcodeFamily::AtomicAcknowledge,
            CompareSwap | FetchAdd => OpcodeFamily::Atomic,
            CongestionNotification => OpcodeFamily::CongestionNotification,
        }
    }

    pub fn segment(self) -> Segment {
        use Opcode::*;
        match self {
            SendFirst | RdmaWriteFirst | RdmaReadResponseFirst => Segment::First,
            SendMiddle | RdmaWriteMiddle | RdmaReadResponseMiddle => Segment::Middle,
            SendLast
            | SendLastWithImmediate
            | SendLastWithInvalidate
            | RdmaWriteLast
            | RdmaWriteLastWithImmediate
            | RdmaReadResponseLast => Segment::Last,
            _ => Segment::Only,
        }
    }

    /// Requests travel requester → responder; the rest are responses.
    pub fn is_request(self) -> bool {
        matches!(
            self.family(),
            OpcodeFamily::Send
                | OpcodeFamily::RdmaWrite
                | OpcodeFamily::RdmaReadRequest
                | OpcodeFamily::Atomic
        )
    }

    pub fn has_reth(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            RdmaWriteFirst | RdmaWriteOnly | RdmaWriteOnlyWithImmediate | RdmaReadRequest
        )
    }

    pub fn has_aeth(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            RdmaReadResponseFirst
                | RdmaReadResponseLast
                | RdmaReadResponseOnly
                | Acknowledge
                | AtomicAcknowledge
        )
    }

    pub fn has_atomic_eth(self) -> bool {
        self.family() == OpcodeFamily::Atomic
    }

    pub fn has_atomic_ack_eth(self) -> bool {
        self == Opcode::AtomicAcknowledge
    }

    pub fn has_immediate(self) -> bool {
        use Opcode::*;
        matches!(
            self,
            SendLastWithImmediate
                | SendOnlyWithImmediate
                | RdmaWriteLastWithImmediate
                | RdmaWriteOnlyWithImmediate
        )
    }

    /// Whether the packet ends a message that consumes a receive (the last
    /// or only packet of a SEND or of a WRITE with immediate): the packets
    /// on which IB lets a requester set the SE bit.
    pub fn completes_receive(self) -> bool {
        let ends_message = matches!(self.segment(), Segment::Last | Segment::Only);
        let consumes_receive = self.family() == OpcodeFamily::Send || self.has_immediate();
        ends_message && consumes_receive && self.is_request()
    }

    /// Whether bytes may follow the headers: not for a READ request, an
    /// atomic or an acknowledgement, whose headers say everything. (A CNP
    /// carries 16 reserved bytes.)
    pub fn carries_payload(self) -> bool {
        !matches!(
            self.family(),
            OpcodeFamily::RdmaReadRequest
                | OpcodeFamily::Atomic
                | OpcodeFamily::Acknowledge
                | OpcodeFamily::AtomicAcknowledge
        )
    }

    /// The invalidate opcodes carry an IETH (a 32-bit rkey to invalidate).
    pub fn has_invalidate(self) -> bool {
        matches!(
            self,
            Opcode::SendLastWithInvalidate | Opcode::SendOnlyWithInvalidate
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_opcode_round_trips_through_its_byte() {
        for opcode in Opcode::ALL {
            assert_eq!(Opcode::from_u8(opcode as u8), Some(opcode));
        }
        assert_eq!(Opcode::from_u8(0x15), None);
        assert_eq!(Opcode::from_u8(0x20), None, "UC opcodes are not RC");
    }

    #[test]
    fn extension_headers_match_the_ib_specification() {
        assert!(Opcode::RdmaWriteFirst.has_reth());
        assert!(!Opcode::RdmaWriteMiddle.has_reth());
        assert!(Opcode::RdmaWriteOnlyWithImmediate.has_immediate());
        assert!(!Opcode::RdmaReadResponseMiddle.has_aeth());
        assert!(Opcode::AtomicAcknowledge.has_atomic_ack_eth());
        assert!(Opcode::FetchAdd.has_atomic_eth());
        assert!(Opcode::CompareSwap.is_request());
        assert!(!Opcode::Acknowledge.is_request());
    }

    #[test]
    fn only_the_end_of_a_receive_consuming_message_may_carry_the_se_bit() {
        let completing: Vec<Opcode> = Opcode::ALL
            .into_iter()
            .filter(|opcode| opcode.completes_receive())
            .collect();
        use Opcode::*;
        assert_eq!(
            completing,
            [
                SendLast,
                SendLastWithImmediate,
                SendOnly,
                SendOnlyWithImmediate,
                RdmaWriteLastWithImmediate,
                RdmaWriteOnlyWithImmediate,
                SendLastWithInvalidate,
                SendOnlyWithInvalidate,
            ]
        );
    }
}
