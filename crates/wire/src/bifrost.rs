//! Bifröst's RPC header (the thesis's Fig. 5.2, §5.2 and §6.2), at the
//! start of a UDP payload on Bifröst's own port, where the switch's
//! Gatekeeper parses it.
//!
//! ```text
//!  0  identifier u32 ("BIFR")     4  call type u8     5  name length u8
//!  6  flags u16                   8  method name [16] (zero padded)
//! 24  RPC id u64 (unique per caller)
//! 32  global address [16]: 4 zero bytes, DSM prefix u8, memory node u8,
//!     operation u8, argument u8, offset u64
//! ```
//!
//! Fields are big-endian. The method name is fixed at 16 bytes and there is
//! one global address per RPC, so the switch never parses variable-length
//! fields (the thesis's choice, §8.1).

use crate::bytes::{read_u16, read_u32, read_u64, write_u16, write_u32, write_u64};

/// Bifröst's UDP port (not RoCEv2's 4791).
pub const BIFROST_PORT: u16 = 4792;
/// "BIFR": what tells a Bifröst datagram from any other.
pub const IDENTIFIER: u32 = u32::from_be_bytes(*b"BIFR");
pub const HEADER_LEN: usize = 48;
pub const METHOD_NAME_LEN: usize = 16;

/// How a call is answered, as in Thrift.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CallType {
    Call = 1,
    Reply = 2,
    Exception = 3,
    Oneway = 4,
}

impl CallType {
    fn from_byte(byte: u8) -> Option<CallType> {
        match byte {
            1 => Some(CallType::Call),
            2 => Some(CallType::Reply),
            3 => Some(CallType::Exception),
            4 => Some(CallType::Oneway),
            _ => None,
        }
    }
}

/// A DSM operation, carried in the global address (§6.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DsmOperation {
    /// No operation: a plain pointer.
    #[default]
    None = 0,
    Allocate = 1,
    Read = 2,
    Write = 3,
    Free = 4,
}

impl DsmOperation {
    fn from_byte(byte: u8) -> Option<DsmOperation> {
        match byte {
            0 => Some(DsmOperation::None),
            1 => Some(DsmOperation::Allocate),
            2 => Some(DsmOperation::Read),
            3 => Some(DsmOperation::Write),
            4 => Some(DsmOperation::Free),
            _ => None,
        }
    }
}

/// The 16-byte global address: which memory node, where in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct GlobalAddress {
    /// The DSM system's prefix (0 is "no pointer").
    pub prefix: u8,
    pub node: u8,
    /// One name for "no operation" ([`DsmOperation::None`], the wire's
    /// 0): as an `Option`, `Some(None)` emitted as 0 came back as `None`,
    /// a round trip that changed the address and made it null.
    pub operation: DsmOperation,
    pub argument: u8,
    pub offset: u64,
}

impl GlobalAddress {
    pub const NULL: GlobalAddress = GlobalAddress {
        prefix: 0,
        node: 0,
        operation: DsmOperation::None,
        argument: 0,
        offset: 0,
    };

    pub fn is_null(&self) -> bool {
        *self == GlobalAddress::NULL
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BifrostError {
    #[error("{0} bytes are too few for a Bifröst header ({HEADER_LEN})")]
    Truncated(usize),
    #[error("identifier {0:#010x} is not Bifröst's")]
    NotBifrost(u32),
    #[error("call type {0} is none of CALL 1, REPLY 2, EXCEPTION 3, ONEWAY 4")]
    UnknownCallType(u8),
    #[error("method name length {0} is past {METHOD_NAME_LEN}")]
    NameTooLong(u8),
    #[error("the method name is not zero padded past its length")]
    NamePadding,
    #[error("the global address's first four bytes are not zero")]
    AddressNotZeroPrefixed,
    #[error("DSM operation {0} is unknown")]
    UnknownOperation(u8),
    #[error("a method name of {0} bytes is longer than {METHOD_NAME_LEN}")]
    NameTooLongToEmit(usize),
}

/// A checked view of a Bifröst header.
#[derive(Debug, Clone)]
pub struct BifrostHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> BifrostHeader<T> {
    /// Checks the length, identifier, call type, name and address.
    pub fn new_checked(buffer: T) -> Result<Self, BifrostError> {
        let bytes = buffer.as_ref();
        if bytes.len() < HEADER_LEN {
            return Err(BifrostError::Truncated(bytes.len()));
        }
        let identifier = read_u32(bytes, 0);
        if identifier != IDENTIFIER {
            return Err(BifrostError::NotBifrost(identifier));
        }
        CallType::from_byte(bytes[4]).ok_or(BifrostError::UnknownCallType(bytes[4]))?;
        let name_length = bytes[5];
        if name_length as usize > METHOD_NAME_LEN {
            return Err(BifrostError::NameTooLong(name_length));
        }
        if bytes[8 + name_length as usize..24]
            .iter()
            .any(|&byte| byte != 0)
        {
            return Err(BifrostError::NamePadding);
        }
        if bytes[32..36].iter().any(|&byte| byte != 0) {
            return Err(BifrostError::AddressNotZeroPrefixed);
        }
        DsmOperation::from_byte(bytes[38]).ok_or(BifrostError::UnknownOperation(bytes[38]))?;
        Ok(BifrostHeader { buffer })
    }

    fn bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    pub fn call_type(&self) -> CallType {
        CallType::from_byte(self.bytes()[4]).expect("checked")
    }

    pub fn flags(&self) -> u16 {
        read_u16(self.bytes(), 6)
    }

    pub fn method_name(&self) -> &[u8] {
        &self.bytes()[8..8 + self.bytes()[5] as usize]
    }

    pub fn rpc_id(&self) -> u64 {
        read_u64(self.bytes(), 24)
    }

    pub fn global_address(&self) -> GlobalAddress {
        let bytes = self.bytes();
        GlobalAddress {
            prefix: bytes[36],
            node: bytes[37],
            operation: DsmOperation::from_byte(bytes[38]).expect("checked"),
            argument: bytes[39],
            offset: read_u64(bytes, 40),
        }
    }

    /// What follows the header.
    pub fn payload(&self) -> &[u8] {
        &self.bytes()[HEADER_LEN..]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BifrostRepr {
    pub call_type: CallType,
    pub flags: u16,
    pub method_name: [u8; METHOD_NAME_LEN],
    pub method_name_len: u8,
    pub rpc_id: u64,
    pub global_address: GlobalAddress,
}

impl BifrostRepr {
    pub fn new(
        call_type: CallType,
        method: &str,
        rpc_id: u64,
        global_address: GlobalAddress,
    ) -> Result<BifrostRepr, BifrostError> {
        let name = method.as_bytes();
        if name.len() > METHOD_NAME_LEN {
            return Err(BifrostError::NameTooLongToEmit(name.len()));
        }
        let mut method_name = [0u8; METHOD_NAME_LEN];
        method_name[..name.len()].copy_from_slice(name);
        Ok(BifrostRepr {
            call_type,
            flags: 0,
            method_name,
            method_name_len: name.len() as u8,
            rpc_id,
            global_address,
        })
    }

    pub fn parse<T: AsRef<[u8]>>(header: &BifrostHeader<T>) -> BifrostRepr {
        let name = header.method_name();
        let mut method_name = [0u8; METHOD_NAME_LEN];
        method_name[..name.len()].copy_from_slice(name);
        BifrostRepr {
            call_type: header.call_type(),
            flags: header.flags(),
            method_name,
            method_name_len: name.len() as u8,
            rpc_id: header.rpc_id(),
            global_address: header.global_address(),
        }
    }

    /// The method's name; a length past the field (the fields are public)
    /// gives the whole field, never a panic.
    pub fn method(&self) -> &[u8] {
        &self.method_name[..usize::from(self.method_name_len).min(METHOD_NAME_LEN)]
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes.
    pub fn emit(&self, bytes: &mut [u8]) -> Result<(), BifrostError> {
        let name_len = usize::from(self.method_name_len);
        if name_len > METHOD_NAME_LEN {
            return Err(BifrostError::NameTooLongToEmit(name_len));
        }
        if bytes.len() < HEADER_LEN {
            return Err(BifrostError::Truncated(bytes.len()));
        }
        let header = &mut bytes[..HEADER_LEN];
        header.fill(0);
        write_u32(header, 0, IDENTIFIER);
        header[4] = self.call_type as u8;
        header[5] = self.method_name_len;
        write_u16(header, 6, self.flags);
        header[8..8 + self.method_name_len as usize].copy_from_slice(self.method());
        write_u64(header, 24, self.rpc_id);
        let address = &self.global_address;
        header[36] = address.prefix;
        header[37] = address.node;
        header[38] = address.operation as u8;
        header[39] = address.argument;
        write_u64(header, 40, address.offset);
        Ok(())
    }
}

/// The harness of the `bifrost_header` fuzz target, kept here so that its
/// seeds replay as tests: any bytes parse or fail with a typed error; a
/// header that parses emits the same bytes back. Returns whether it parsed.
pub fn any_header(data: &[u8]) -> bool {
    let Ok(header) = BifrostHeader::new_checked(data) else {
        return false;
    };
    let repr = BifrostRepr::parse(&header);
    let mut emitted = [0u8; HEADER_LEN];
    repr.emit(&mut emitted).expect("a whole header fits");
    assert_eq!(&emitted[..], &data[..HEADER_LEN]);
    true
}

/// The UDP port nodes send their messages to the Gatekeeper on (at its
/// service address): heartbeats and exports, apart from RPCs, so neither
/// is ever taken for a call.
pub const CONTROL_PORT: u16 = 4794;
/// "BIFE": a node exports a method (the thesis's `export`): calls of it
/// go to the node from now on.
pub const EXPORT_IDENTIFIER: u32 = u32::from_be_bytes(*b"BIFE");
/// identifier u32, name length u8, 3 zero bytes, method name [16].
pub const EXPORT_LEN: usize = 24;
/// "BIFH": a Bifröst heartbeat.
pub const HEARTBEAT_IDENTIFIER: u32 = u32::from_be_bytes(*b"BIFH");
/// identifier u32, node kind u8, 3 zero bytes, incarnation u32, capacity
/// in bytes u64.
pub const HEARTBEAT_LEN: usize = 20;

/// What kind of node sends a heartbeat (§6.4's node types).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeKind {
    Compute = 1,
    Memory = 2,
}

/// A node's heartbeat: on boot it announces the node (kind and
/// capacity); after that it says the node is alive. The incarnation grows
/// with each restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatRepr {
    pub kind: NodeKind,
    pub incarnation: u32,
    pub capacity_bytes: u64,
}

/// Why a heartbeat did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeartbeatError {
    #[error("{0} bytes are too few for a heartbeat ({HEARTBEAT_LEN})")]
    Truncated(usize),
    #[error("identifier {0:#010x} is not a Bifröst heartbeat's")]
    Identifier(u32),
    #[error("node kind {0} is neither compute (1) nor memory (2)")]
    Kind(u8),
    #[error("reserved bytes are not zero")]
    Reserved,
}

impl HeartbeatRepr {
    pub fn parse(bytes: &[u8]) -> Result<HeartbeatRepr, HeartbeatError> {
        if bytes.len() < HEARTBEAT_LEN {
            return Err(HeartbeatError::Truncated(bytes.len()));
        }
        let identifier = read_u32(bytes, 0);
        if identifier != HEARTBEAT_IDENTIFIER {
            return Err(HeartbeatError::Identifier(identifier));
        }
        let kind = match bytes[4] {
            1 => NodeKind::Compute,
            2 => NodeKind::Memory,
            other => return Err(HeartbeatError::Kind(other)),
        };
        if bytes[5..8] != [0, 0, 0] {
            return Err(HeartbeatError::Reserved);
        }
        Ok(HeartbeatRepr {
            kind,
            incarnation: read_u32(bytes, 8),
            capacity_bytes: read_u64(bytes, 12),
        })
    }

    pub fn emit(&self, bytes: &mut [u8]) -> Result<(), HeartbeatError> {
        if bytes.len() < HEARTBEAT_LEN {
            return Err(HeartbeatError::Truncated(bytes.len()));
        }
        let heartbeat = &mut bytes[..HEARTBEAT_LEN];
        heartbeat.fill(0);
        write_u32(heartbeat, 0, HEARTBEAT_IDENTIFIER);
        heartbeat[4] = self.kind as u8;
        write_u32(heartbeat, 8, self.incarnation);
        write_u64(heartbeat, 12, self.capacity_bytes);
        Ok(())
    }
}

/// A node's export of a method: calls of it are routed to the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportRepr {
    pub method_name: [u8; METHOD_NAME_LEN],
    pub method_name_len: u8,
}

/// Why an export did not parse or could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportError {
    #[error("{0} bytes are too few for an export ({EXPORT_LEN})")]
    Truncated(usize),
    #[error("identifier {0:#010x} is not a Bifröst export's")]
    Identifier(u32),
    #[error("a method name of {0} bytes is empty or longer than {METHOD_NAME_LEN}")]
    NameLength(usize),
    #[error("reserved bytes or the name's padding are not zero")]
    Reserved,
}

impl ExportRepr {
    pub fn new(method: &str) -> Result<ExportRepr, ExportError> {
        let bytes = method.as_bytes();
        if bytes.is_empty() || bytes.len() > METHOD_NAME_LEN {
            return Err(ExportError::NameLength(bytes.len()));
        }
        let mut method_name = [0u8; METHOD_NAME_LEN];
        method_name[..bytes.len()].copy_from_slice(bytes);
        Ok(ExportRepr {
            method_name,
            method_name_len: bytes.len() as u8,
        })
    }

    /// The method's name as its bytes; a length past the field (the
    /// fields are public) gives the whole field, never a panic.
    pub fn method(&self) -> &[u8] {
        &self.method_name[..usize::from(self.method_name_len).min(METHOD_NAME_LEN)]
    }

    pub fn parse(bytes: &[u8]) -> Result<ExportRepr, ExportError> {
        if bytes.len() < EXPORT_LEN {
            return Err(ExportError::Truncated(bytes.len()));
        }
        let identifier = read_u32(bytes, 0);
        if identifier != EXPORT_IDENTIFIER {
            return Err(ExportError::Identifier(identifier));
        }
        let length = usize::from(bytes[4]);
        if length == 0 || length > METHOD_NAME_LEN {
            return Err(ExportError::NameLength(length));
        }
        let name = &bytes[8..8 + METHOD_NAME_LEN];
        if bytes[5..8] != [0, 0, 0] || name[length..].iter().any(|&byte| byte != 0) {
            return Err(ExportError::Reserved);
        }
        let mut method_name = [0u8; METHOD_NAME_LEN];
        method_name.copy_from_slice(name);
        Ok(ExportRepr {
            method_name,
            method_name_len: length as u8,
        })
    }

    pub fn emit(&self, bytes: &mut [u8]) -> Result<(), ExportError> {
        let name_len = usize::from(self.method_name_len);
        if name_len == 0 || name_len > METHOD_NAME_LEN {
            return Err(ExportError::NameLength(name_len));
        }
        if bytes.len() < EXPORT_LEN {
            return Err(ExportError::Truncated(bytes.len()));
        }
        let export = &mut bytes[..EXPORT_LEN];
        export.fill(0);
        write_u32(export, 0, EXPORT_IDENTIFIER);
        export[4] = self.method_name_len;
        // The name alone: bytes of the field past its length (the fields
        // are public) went out too, and the parser refused them.
        export[8..8 + name_len].copy_from_slice(self.method());
        Ok(())
    }
}

/// A commit: a callee's checkpoint taken when a call arrived (the
/// thesis's b1), sent to the Gatekeeper on its own, since no packet
/// leaves a callee between a call's arrival and its reply. "BIFC", a
/// 4-byte length, then that many bytes of checkpoint.
pub const COMMIT_IDENTIFIER: u32 = u32::from_be_bytes(*b"BIFC");
pub const COMMIT_HEADER_LEN: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CommitError {
    #[error("{0} bytes are too few for a commit's header ({COMMIT_HEADER_LEN})")]
    Truncated(usize),
    #[error("identifier {0:#010x} is not a commit's")]
    Identifier(u32),
    #[error("a commit says {said} bytes of checkpoint and carries {carried}")]
    Length { said: usize, carried: usize },
}

/// A commit's checkpoint bytes, checked.
pub fn parse_commit(bytes: &[u8]) -> Result<&[u8], CommitError> {
    if bytes.len() < COMMIT_HEADER_LEN {
        return Err(CommitError::Truncated(bytes.len()));
    }
    let identifier = read_u32(bytes, 0);
    if identifier != COMMIT_IDENTIFIER {
        return Err(CommitError::Identifier(identifier));
    }
    let said = read_u32(bytes, 4) as usize;
    let carried = bytes.len() - COMMIT_HEADER_LEN;
    if said != carried {
        return Err(CommitError::Length { said, carried });
    }
    Ok(&bytes[COMMIT_HEADER_LEN..])
}

/// A commit carrying `checkpoint`.
pub fn emit_commit(checkpoint: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0u8; COMMIT_HEADER_LEN + checkpoint.len()];
    write_u32(&mut bytes, 0, COMMIT_IDENTIFIER);
    write_u32(&mut bytes, 4, checkpoint.len() as u32);
    bytes[COMMIT_HEADER_LEN..].copy_from_slice(checkpoint);
    bytes
}

/// A message a node sends the Gatekeeper on [`CONTROL_PORT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeMessage<'a> {
    Heartbeat(HeartbeatRepr),
    Export(ExportRepr),
    /// A callee's checkpoint (its bytes).
    Commit(&'a [u8]),
}

/// Why a node's message did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeMessageError {
    #[error(transparent)]
    Heartbeat(#[from] HeartbeatError),
    #[error(transparent)]
    Export(#[from] ExportError),
    #[error(transparent)]
    Commit(#[from] CommitError),
    #[error("{0} bytes are too few for a node's message")]
    Truncated(usize),
}

impl NodeMessage<'_> {
    /// A heartbeat, an export or a commit, told apart by the identifier.
    pub fn parse(bytes: &[u8]) -> Result<NodeMessage<'_>, NodeMessageError> {
        if bytes.len() < 4 {
            return Err(NodeMessageError::Truncated(bytes.len()));
        }
        match read_u32(bytes, 0) {
            EXPORT_IDENTIFIER => Ok(NodeMessage::Export(ExportRepr::parse(bytes)?)),
            COMMIT_IDENTIFIER => Ok(NodeMessage::Commit(parse_commit(bytes)?)),
            _ => Ok(NodeMessage::Heartbeat(HeartbeatRepr::parse(bytes)?)),
        }
    }
}

/// The harness of the `bifrost_node_messages` fuzz target: any bytes
/// parse or fail with a typed error; a message that parses emits the same
/// bytes.
pub fn any_node_message(data: &[u8]) -> bool {
    let Ok(message) = NodeMessage::parse(data) else {
        return false;
    };
    let mut emitted = [0u8; EXPORT_LEN];
    let length = match message {
        NodeMessage::Heartbeat(repr) => {
            repr.emit(&mut emitted).expect("a whole heartbeat fits");
            HEARTBEAT_LEN
        }
        NodeMessage::Export(repr) => {
            repr.emit(&mut emitted).expect("a whole export fits");
            EXPORT_LEN
        }
        NodeMessage::Commit(checkpoint) => {
            assert_eq!(
                emit_commit(checkpoint),
                data,
                "a commit emits the same bytes"
            );
            return true;
        }
    };
    assert_eq!(&emitted[..length], &data[..length]);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The representations' fields are public, and a name length past
    /// the 16-byte field sliced past it: `emit` and `method` panicked. They
    /// give the typed error (and the whole field) now.
    #[test]
    fn a_name_length_past_the_field_is_an_error_not_a_panic() {
        let mut repr = BifrostRepr::new(CallType::Call, "add", 1, GlobalAddress::NULL).unwrap();
        repr.method_name_len = 17;
        assert_eq!(repr.method().len(), METHOD_NAME_LEN);
        assert_eq!(
            repr.emit(&mut [0u8; HEADER_LEN]),
            Err(BifrostError::NameTooLongToEmit(17))
        );
        let mut export = ExportRepr::new("add").unwrap();
        export.method_name_len = 200;
        assert_eq!(export.method().len(), METHOD_NAME_LEN);
        assert_eq!(
            export.emit(&mut [0u8; EXPORT_LEN]),
            Err(ExportError::NameLength(200))
        );
    }

    #[test]
    fn headers_round_trip_and_bad_ones_are_typed_errors() {
        let address = GlobalAddress {
            prefix: 0xb1,
            node: 2,
            operation: DsmOperation::Read,
            argument: 0,
            offset: 0x1000,
        };
        let repr = BifrostRepr::new(CallType::Call, "add_arrays", 77, address).unwrap();
        let mut bytes = [0u8; HEADER_LEN + 3];
        repr.emit(&mut bytes).unwrap();
        assert_eq!(&bytes[..4], b"BIFR");
        let header = BifrostHeader::new_checked(&bytes[..]).unwrap();
        assert_eq!(BifrostRepr::parse(&header), repr);
        assert_eq!(header.method_name(), b"add_arrays");
        assert_eq!(header.payload().len(), 3);
        assert!(any_header(&bytes));

        let mut wrong = bytes;
        wrong[4] = 9;
        assert_eq!(
            BifrostHeader::new_checked(&wrong[..]).unwrap_err(),
            BifrostError::UnknownCallType(9)
        );
        let mut wrong = bytes;
        wrong[5] = 17;
        assert_eq!(
            BifrostHeader::new_checked(&wrong[..]).unwrap_err(),
            BifrostError::NameTooLong(17)
        );
        let mut wrong = bytes;
        wrong[23] = b'x';
        assert_eq!(
            BifrostHeader::new_checked(&wrong[..]).unwrap_err(),
            BifrostError::NamePadding
        );
        let mut wrong = bytes;
        wrong[0] = b'X';
        assert!(matches!(
            BifrostHeader::new_checked(&wrong[..]),
            Err(BifrostError::NotBifrost(_))
        ));
        assert_eq!(
            BifrostHeader::new_checked(&bytes[..47]).unwrap_err(),
            BifrostError::Truncated(47)
        );
        assert!(BifrostRepr::new(
            CallType::Call,
            "a_method_name_too_long",
            1,
            GlobalAddress::NULL
        )
        .is_err());
    }

    #[test]
    fn heartbeats_round_trip_and_bad_ones_are_typed_errors() {
        let repr = HeartbeatRepr {
            kind: NodeKind::Memory,
            incarnation: 3,
            capacity_bytes: 1 << 30,
        };
        let mut bytes = [0u8; HEARTBEAT_LEN];
        repr.emit(&mut bytes).unwrap();
        assert_eq!(HeartbeatRepr::parse(&bytes), Ok(repr));
        assert!(any_node_message(&bytes));
        assert_eq!(
            HeartbeatRepr::parse(&bytes[..19]),
            Err(HeartbeatError::Truncated(19))
        );
        let mut wrong = bytes;
        wrong[4] = 7;
        assert_eq!(HeartbeatRepr::parse(&wrong), Err(HeartbeatError::Kind(7)));
        let mut wrong = bytes;
        wrong[6] = 1;
        assert_eq!(HeartbeatRepr::parse(&wrong), Err(HeartbeatError::Reserved));
        let mut wrong = bytes;
        wrong[0] = b'X';
        assert!(matches!(
            HeartbeatRepr::parse(&wrong),
            Err(HeartbeatError::Identifier(_))
        ));
        assert!(!any_node_message(&wrong));
    }

    #[test]
    fn commits_round_trip_and_bad_ones_are_typed_errors() {
        let checkpoint = b"a callee's checkpoint";
        let bytes = emit_commit(checkpoint);
        assert_eq!(
            NodeMessage::parse(&bytes),
            Ok(NodeMessage::Commit(&checkpoint[..]))
        );
        assert!(any_node_message(&bytes));
        assert!(matches!(
            parse_commit(&bytes[..bytes.len() - 1]),
            Err(CommitError::Length { .. })
        ));
        assert!(matches!(
            parse_commit(&bytes[..5]),
            Err(CommitError::Truncated(5))
        ));
        let mut other = bytes.clone();
        other[0] ^= 1;
        assert!(matches!(
            parse_commit(&other),
            Err(CommitError::Identifier(_))
        ));
    }

    #[test]
    fn exports_round_trip_and_bad_ones_are_typed_errors() {
        let repr = ExportRepr::new("increment").unwrap();
        let mut bytes = [0u8; EXPORT_LEN];
        repr.emit(&mut bytes).unwrap();
        assert_eq!(NodeMessage::parse(&bytes), Ok(NodeMessage::Export(repr)));
        assert_eq!(repr.method(), b"increment");
        assert!(any_node_message(&bytes));
        assert_eq!(ExportRepr::new(""), Err(ExportError::NameLength(0)));
        assert_eq!(
            ExportRepr::new("a_method_name_too_long"),
            Err(ExportError::NameLength(22))
        );
        let mut wrong = bytes;
        wrong[4] = 17;
        assert_eq!(ExportRepr::parse(&wrong), Err(ExportError::NameLength(17)));
        let mut wrong = bytes;
        wrong[20] = b'x';
        assert_eq!(ExportRepr::parse(&wrong), Err(ExportError::Reserved));
        assert_eq!(
            NodeMessage::parse(&bytes[..10]),
            Err(NodeMessageError::Export(ExportError::Truncated(10)))
        );
        // A name shortened through the public length: the bytes past it
        // went out too, and the parser refused its own emitter's export.
        let mut shortened = repr;
        shortened.method_name_len = 3;
        shortened.emit(&mut bytes).unwrap();
        assert_eq!(ExportRepr::parse(&bytes).unwrap().method(), b"inc");
    }

    /// `Some(DsmOperation::None)` went out as 0 and came back as `None`: a
    /// plain pointer changed in a round trip, and became null. The
    /// operation is one plain field now.
    #[test]
    fn a_plain_pointer_round_trips_unchanged() {
        let address = GlobalAddress {
            prefix: 0xb1,
            node: 1,
            operation: DsmOperation::None,
            argument: 0,
            offset: 0,
        };
        let repr = BifrostRepr::new(CallType::Reply, "make", 7, address).unwrap();
        let mut bytes = [0u8; HEADER_LEN];
        repr.emit(&mut bytes).unwrap();
        let parsed = BifrostRepr::parse(&BifrostHeader::new_checked(&bytes[..]).unwrap());
        assert_eq!(parsed.global_address, address);
        assert!(!parsed.global_address.is_null());
    }
}
