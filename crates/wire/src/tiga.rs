//! TIGA's NDP messages, at the start of a UDP payload on TIGA's own port:
//! a CN's request to the DN's SmartNIC, its result, a request the SmartNIC
//! forwards to the CN with its data (co-processing), the CN's
//! acknowledgement, and the CPU-only baseline's fetch of raw data.
//!
//! ```text
//!  0  identifier u32 ("TIGA")   4  kind u8   5  app type flag u8
//!  6  status u8                 7  reserved (zero)
//!  8  request id u64
//! 16  data address u64 (in the DN's memory)
//! 24  data length u32           28  payload length u32 (bytes after the header)
//! ```
//!
//! Fields are big-endian.

use crate::bytes::{read_u32, read_u64, write_u32, write_u64};

/// TIGA's UDP port.
pub const TIGA_PORT: u16 = 4793;
/// "TIGA": what tells a TIGA datagram from any other.
pub const IDENTIFIER: u32 = u32::from_be_bytes(*b"TIGA");
pub const HEADER_LEN: usize = 32;

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageKind {
    /// CN → SmartNIC: run app `flag` on the data at (address, length).
    Request = 1,
    /// SmartNIC → CN: the result, as the payload.
    Result = 2,
    /// SmartNIC → CN: run it yourself; the payload is the data.
    Forwarded = 3,
    /// CN → SmartNIC: a forwarded request was done.
    Acknowledgement = 4,
    /// CN → SmartNIC: send me the raw data (no NDP).
    Fetch = 5,
    /// SmartNIC → CN: the raw data, as the payload.
    Data = 6,
}

impl MessageKind {
    fn from_byte(byte: u8) -> Option<MessageKind> {
        match byte {
            1 => Some(MessageKind::Request),
            2 => Some(MessageKind::Result),
            3 => Some(MessageKind::Forwarded),
            4 => Some(MessageKind::Acknowledgement),
            5 => Some(MessageKind::Fetch),
            6 => Some(MessageKind::Data),
            _ => None,
        }
    }
}

/// How a request fared, in a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Ok = 0,
    /// No offload chain is registered for the app flag.
    NotRegistered = 1,
    /// The data range is outside the DN's memory.
    OutOfRange = 2,
    /// A stage refused the data (a failed CRC, a bad digest).
    StageFailed = 3,
    /// The data or its result does not fit in one datagram.
    TooLarge = 4,
}

impl Status {
    fn from_byte(byte: u8) -> Option<Status> {
        match byte {
            0 => Some(Status::Ok),
            1 => Some(Status::NotRegistered),
            2 => Some(Status::OutOfRange),
            3 => Some(Status::StageFailed),
            4 => Some(Status::TooLarge),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TigaError {
    #[error("{0} bytes are too few for a TIGA header ({HEADER_LEN})")]
    Truncated(usize),
    #[error("identifier {0:#010x} is not TIGA's")]
    NotTiga(u32),
    #[error("message kind {0} is unknown")]
    UnknownKind(u8),
    #[error("status {0} is unknown")]
    UnknownStatus(u8),
    #[error("the reserved byte is {0}, not zero")]
    Reserved(u8),
    #[error("the header announces {announced} payload bytes, {present} follow")]
    PayloadLength { announced: u32, present: usize },
}

/// A checked view of a TIGA message.
#[derive(Debug, Clone)]
pub struct TigaHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TigaHeader<T> {
    /// Checks the length, identifier, kind, status and payload length.
    pub fn new_checked(buffer: T) -> Result<Self, TigaError> {
        let bytes = buffer.as_ref();
        if bytes.len() < HEADER_LEN {
            return Err(TigaError::Truncated(bytes.len()));
        }
        let identifier = read_u32(bytes, 0);
        if identifier != IDENTIFIER {
            return Err(TigaError::NotTiga(identifier));
        }
        MessageKind::from_byte(bytes[4]).ok_or(TigaError::UnknownKind(bytes[4]))?;
        Status::from_byte(bytes[6]).ok_or(TigaError::UnknownStatus(bytes[6]))?;
        if bytes[7] != 0 {
            return Err(TigaError::Reserved(bytes[7]));
        }
        let announced = read_u32(bytes, 28);
        let present = bytes.len() - HEADER_LEN;
        if announced as usize != present {
            return Err(TigaError::PayloadLength { announced, present });
        }
        Ok(TigaHeader { buffer })
    }

    fn bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn kind(&self) -> MessageKind {
        MessageKind::from_byte(self.bytes()[4]).expect("checked")
    }

    pub fn app_flag(&self) -> u8 {
        self.bytes()[5]
    }

    pub fn status(&self) -> Status {
        Status::from_byte(self.bytes()[6]).expect("checked")
    }

    pub fn request_id(&self) -> u64 {
        read_u64(self.bytes(), 8)
    }

    pub fn data_address(&self) -> u64 {
        read_u64(self.bytes(), 16)
    }

    pub fn data_length(&self) -> u32 {
        read_u32(self.bytes(), 24)
    }

    pub fn payload(&self) -> &[u8] {
        &self.bytes()[HEADER_LEN..]
    }
}

/// A TIGA header's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TigaRepr {
    pub kind: MessageKind,
    pub app_flag: u8,
    pub status: Status,
    pub request_id: u64,
    pub data_address: u64,
    pub data_length: u32,
}

impl TigaRepr {
    pub fn parse<T: AsRef<[u8]>>(header: &TigaHeader<T>) -> TigaRepr {
        TigaRepr {
            kind: header.kind(),
            app_flag: header.app_flag(),
            status: header.status(),
            request_id: header.request_id(),
            data_address: header.data_address(),
            data_length: header.data_length(),
        }
    }

    /// The whole message: this header, then `payload`.
    pub fn to_message(&self, payload: &[u8]) -> Vec<u8> {
        let mut message = vec![0u8; HEADER_LEN + payload.len()];
        write_u32(&mut message, 0, IDENTIFIER);
        message[4] = self.kind as u8;
        message[5] = self.app_flag;
        message[6] = self.status as u8;
        write_u64(&mut message, 8, self.request_id);
        write_u64(&mut message, 16, self.data_address);
        write_u32(&mut message, 24, self.data_length);
        write_u32(&mut message, 28, payload.len() as u32);
        message[HEADER_LEN..].copy_from_slice(payload);
        message
    }
}

/// The harness of the `tiga_messages` fuzz target, kept here so that its
/// seeds replay as tests: any bytes parse or fail with a typed error; a
/// message that parses is emitted back byte for byte. Returns whether it
/// parsed.
pub fn any_message(data: &[u8]) -> bool {
    let Ok(header) = TigaHeader::new_checked(data) else {
        return false;
    };
    let repr = TigaRepr::parse(&header);
    assert_eq!(repr.to_message(header.payload()), data);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> TigaRepr {
        TigaRepr {
            kind: MessageKind::Request,
            app_flag: 1,
            status: Status::Ok,
            request_id: 9,
            data_address: 0x4000,
            data_length: 1024,
        }
    }

    #[test]
    fn messages_round_trip() {
        let message = request().to_message(b"abc");
        assert_eq!(&message[..4], b"TIGA");
        let header = TigaHeader::new_checked(&message[..]).unwrap();
        assert_eq!(TigaRepr::parse(&header), request());
        assert_eq!(header.payload(), b"abc");
        assert!(any_message(&message));
    }

    #[test]
    fn bad_messages_are_typed_errors() {
        let message = request().to_message(b"abc");
        assert_eq!(
            TigaHeader::new_checked(&message[..10]).err(),
            Some(TigaError::Truncated(10))
        );
        let mut wrong = message.clone();
        wrong[0] = b'X';
        assert!(matches!(
            TigaHeader::new_checked(&wrong[..]),
            Err(TigaError::NotTiga(_))
        ));
        let mut wrong = message.clone();
        wrong[4] = 0;
        assert_eq!(
            TigaHeader::new_checked(&wrong[..]).err(),
            Some(TigaError::UnknownKind(0))
        );
        let mut wrong = message.clone();
        wrong[6] = 200;
        assert_eq!(
            TigaHeader::new_checked(&wrong[..]).err(),
            Some(TigaError::UnknownStatus(200))
        );
        let mut wrong = message.clone();
        wrong[7] = 1;
        assert_eq!(
            TigaHeader::new_checked(&wrong[..]).err(),
            Some(TigaError::Reserved(1))
        );
        assert_eq!(
            TigaHeader::new_checked(&message[..message.len() - 1]).err(),
            Some(TigaError::PayloadLength {
                announced: 3,
                present: 2
            })
        );
        assert!(!any_message(&wrong));
    }
}
