//! The DSM daemon's messages, one SEND each way, 24 bytes, big-endian:
//!
//! ```text
//! request: operation u8 | generation u8 | reserved u16 | request id u32 | offset u64 | size u64
//! reply:   status u8    | generation u8 | reserved u16 | request id u32 | offset u64 | size u64
//! ```

pub const MESSAGE_LEN: usize = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// `size` bytes; the reply names the offset and generation.
    Allocate = 1,
    Free = 2,
    /// The allocation's size, so a caller can check bounds.
    Stat = 3,
    /// Keep a copy of the allocation's bytes (one per allocation).
    Snapshot = 4,
    /// Put the copy back.
    Restore = 5,
}

impl Operation {
    pub fn name(self) -> &'static str {
        match self {
            Operation::Allocate => "alloc",
            Operation::Free => "free",
            Operation::Stat => "stat",
            Operation::Snapshot => "snapshot",
            Operation::Restore => "restore",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Ok = 0,
    NoSpace = 1,
    /// Nothing was ever allocated there.
    NotAllocated = 2,
    /// The allocation was freed (or the pointer's generation is stale).
    Freed = 3,
    NoSnapshot = 4,
    Malformed = 5,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub operation: Operation,
    pub generation: u8,
    pub request_id: u32,
    pub offset: u64,
    pub size: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub status: Status,
    pub generation: u8,
    pub request_id: u32,
    pub offset: u64,
    pub size: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("{0} bytes where a DSM message has {MESSAGE_LEN}")]
    Length(usize),
    #[error("operation {0} is unknown")]
    UnknownOperation(u8),
    #[error("status {0} is unknown")]
    UnknownStatus(u8),
    #[error("reserved bytes are not zero")]
    Reserved,
}

fn fields(bytes: &[u8]) -> Result<(u8, u8, u32, u64, u64), MessageError> {
    if bytes.len() != MESSAGE_LEN {
        return Err(MessageError::Length(bytes.len()));
    }
    if bytes[2..4] != [0, 0] {
        return Err(MessageError::Reserved);
    }
    let word = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let request_id = u32::from_be_bytes(bytes[4..8].try_into().expect("4 bytes"));
    Ok((bytes[0], bytes[1], request_id, word(8), word(16)))
}

fn emit_fields(
    first: u8,
    generation: u8,
    request_id: u32,
    offset: u64,
    size: u64,
) -> [u8; MESSAGE_LEN] {
    let mut bytes = [0u8; MESSAGE_LEN];
    bytes[0] = first;
    bytes[1] = generation;
    bytes[4..8].copy_from_slice(&request_id.to_be_bytes());
    bytes[8..16].copy_from_slice(&offset.to_be_bytes());
    bytes[16..24].copy_from_slice(&size.to_be_bytes());
    bytes
}

impl Request {
    pub fn parse(bytes: &[u8]) -> Result<Request, MessageError> {
        let (operation, generation, request_id, offset, size) = fields(bytes)?;
        let operation = match operation {
            1 => Operation::Allocate,
            2 => Operation::Free,
            3 => Operation::Stat,
            4 => Operation::Snapshot,
            5 => Operation::Restore,
            other => return Err(MessageError::UnknownOperation(other)),
        };
        Ok(Request {
            operation,
            generation,
            request_id,
            offset,
            size,
        })
    }

    pub fn emit(&self) -> [u8; MESSAGE_LEN] {
        emit_fields(
            self.operation as u8,
            self.generation,
            self.request_id,
            self.offset,
            self.size,
        )
    }
}

impl Reply {
    pub fn parse(bytes: &[u8]) -> Result<Reply, MessageError> {
        let (status, generation, request_id, offset, size) = fields(bytes)?;
        let status = match status {
            0 => Status::Ok,
            1 => Status::NoSpace,
            2 => Status::NotAllocated,
            3 => Status::Freed,
            4 => Status::NoSnapshot,
            5 => Status::Malformed,
            other => return Err(MessageError::UnknownStatus(other)),
        };
        Ok(Reply {
            status,
            generation,
            request_id,
            offset,
            size,
        })
    }

    pub fn emit(&self) -> [u8; MESSAGE_LEN] {
        emit_fields(
            self.status as u8,
            self.generation,
            self.request_id,
            self.offset,
            self.size,
        )
    }
}

/// The harness of the `dsm_messages` fuzz target, kept here so that its
/// seeds replay as tests: the first byte picks request or reply; what
/// parses emits the same bytes. Returns whether it parsed.
pub fn any_message(data: &[u8]) -> bool {
    let Some((&selector, rest)) = data.split_first() else {
        return false;
    };
    let emitted = if selector % 2 == 0 {
        Request::parse(rest).map(|request| request.emit())
    } else {
        Reply::parse(rest).map(|reply| reply.emit())
    };
    match emitted {
        Ok(bytes) => {
            assert_eq!(&bytes[..], rest);
            true
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_bad_ones_are_typed_errors() {
        let request = Request {
            operation: Operation::Allocate,
            generation: 0,
            request_id: 9,
            offset: 0,
            size: 4096,
        };
        assert_eq!(Request::parse(&request.emit()), Ok(request));
        let reply = Reply {
            status: Status::Freed,
            generation: 3,
            request_id: 9,
            offset: 8192,
            size: 0,
        };
        assert_eq!(Reply::parse(&reply.emit()), Ok(reply));
        let mut bad = request.emit();
        bad[0] = 9;
        assert_eq!(Request::parse(&bad), Err(MessageError::UnknownOperation(9)));
        bad = request.emit();
        bad[3] = 1;
        assert_eq!(Request::parse(&bad), Err(MessageError::Reserved));
        assert_eq!(Request::parse(&bad[..23]), Err(MessageError::Length(23)));
    }
}
