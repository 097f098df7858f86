//! Thrift's binary protocol over bytes from the network, with every length
//! checked against the bytes left before anything is allocated.
//!
//! The thrift crate's reader (0.17) allocates a string's or a binary's
//! length as it reads it: a negative length becomes a huge `usize` and a
//! capacity-overflow panic, and a large positive one gigabytes. Generated
//! code does the same with a list's, set's or map's element count
//! (`Vec::with_capacity`). A call's arguments and a reply's body come from
//! a peer, so Bifröst reads them through [`CheckedInput`]: a length that
//! cannot fit in what is left is a protocol error, and the call fails
//! like any other malformed call.

use std::io::Read;
use thrift::protocol::{
    TBinaryInputProtocol, TFieldIdentifier, TInputProtocol, TListIdentifier, TMapIdentifier,
    TMessageIdentifier, TSetIdentifier, TStructIdentifier,
};
use thrift::{ProtocolError, ProtocolErrorKind};

/// A transport that knows how many bytes it has left and can look ahead.
pub trait UnreadBytes {
    fn remaining(&self) -> usize;
    /// The big-endian i32 `offset` bytes ahead, if that many are left.
    fn peek_i32(&self, offset: usize) -> Option<i32>;
}

impl UnreadBytes for &[u8] {
    fn remaining(&self) -> usize {
        self.len()
    }

    fn peek_i32(&self, offset: usize) -> Option<i32> {
        let bytes = self.get(offset..offset.checked_add(4)?)?;
        Some(i32::from_be_bytes(bytes.try_into().ok()?))
    }
}

/// The strict binary protocol over `T`, refusing lengths that do not fit.
pub struct CheckedInput<T: Read + UnreadBytes> {
    inner: TBinaryInputProtocol<T>,
}

impl<T: Read + UnreadBytes> CheckedInput<T> {
    pub fn new(transport: T) -> CheckedInput<T> {
        CheckedInput {
            inner: TBinaryInputProtocol::new(transport, true),
        }
    }

    /// Refuses `length` items (each at least a byte) unless they fit in
    /// the bytes left after `header_bytes`.
    fn check_length(&self, length: i32, header_bytes: usize, what: &str) -> thrift::Result<()> {
        let left = self
            .inner
            .transport
            .remaining()
            .saturating_sub(header_bytes);
        match usize::try_from(length) {
            Ok(count) if count <= left => Ok(()),
            Ok(count) => Err(size_error(
                ProtocolErrorKind::SizeLimit,
                format!("{what} of {count} cannot fit in the {left} bytes left"),
            )),
            Err(_) => Err(size_error(
                ProtocolErrorKind::NegativeSize,
                format!("{what} of negative length {length}"),
            )),
        }
    }

    /// Checks the length prefix of the string or binary about to be read.
    fn check_prefixed(&self, what: &str) -> thrift::Result<()> {
        match self.inner.transport.peek_i32(0) {
            Some(length) => self.check_length(length, 4, what),
            // Too short for a prefix: the reader fails on its own.
            None => Ok(()),
        }
    }
}

fn size_error(kind: ProtocolErrorKind, message: String) -> thrift::Error {
    thrift::Error::Protocol(ProtocolError::new(kind, message))
}

impl<T: Read + UnreadBytes> TInputProtocol for CheckedInput<T> {
    fn read_message_begin(&mut self) -> thrift::Result<TMessageIdentifier> {
        // Strict: version and type (4 bytes), then the name's length.
        if let Some(length) = self.inner.transport.peek_i32(4) {
            self.check_length(length, 8, "a method name")?;
        }
        self.inner.read_message_begin()
    }

    fn read_message_end(&mut self) -> thrift::Result<()> {
        self.inner.read_message_end()
    }

    fn read_struct_begin(&mut self) -> thrift::Result<Option<TStructIdentifier>> {
        self.inner.read_struct_begin()
    }

    fn read_struct_end(&mut self) -> thrift::Result<()> {
        self.inner.read_struct_end()
    }

    fn read_field_begin(&mut self) -> thrift::Result<TFieldIdentifier> {
        self.inner.read_field_begin()
    }

    fn read_field_end(&mut self) -> thrift::Result<()> {
        self.inner.read_field_end()
    }

    fn read_bool(&mut self) -> thrift::Result<bool> {
        self.inner.read_bool()
    }

    fn read_bytes(&mut self) -> thrift::Result<Vec<u8>> {
        self.check_prefixed("a binary")?;
        self.inner.read_bytes()
    }

    fn read_i8(&mut self) -> thrift::Result<i8> {
        self.inner.read_i8()
    }

    fn read_i16(&mut self) -> thrift::Result<i16> {
        self.inner.read_i16()
    }

    fn read_i32(&mut self) -> thrift::Result<i32> {
        self.inner.read_i32()
    }

    fn read_i64(&mut self) -> thrift::Result<i64> {
        self.inner.read_i64()
    }

    fn read_double(&mut self) -> thrift::Result<f64> {
        self.inner.read_double()
    }

    fn read_string(&mut self) -> thrift::Result<String> {
        self.check_prefixed("a string")?;
        self.inner.read_string()
    }

    fn read_list_begin(&mut self) -> thrift::Result<TListIdentifier> {
        let list = self.inner.read_list_begin()?;
        self.check_length(list.size, 0, "a list")?;
        Ok(list)
    }

    fn read_list_end(&mut self) -> thrift::Result<()> {
        self.inner.read_list_end()
    }

    fn read_set_begin(&mut self) -> thrift::Result<TSetIdentifier> {
        let set = self.inner.read_set_begin()?;
        self.check_length(set.size, 0, "a set")?;
        Ok(set)
    }

    fn read_set_end(&mut self) -> thrift::Result<()> {
        self.inner.read_set_end()
    }

    fn read_map_begin(&mut self) -> thrift::Result<TMapIdentifier> {
        let map = self.inner.read_map_begin()?;
        self.check_length(map.size, 0, "a map")?;
        Ok(map)
    }

    fn read_map_end(&mut self) -> thrift::Result<()> {
        self.inner.read_map_end()
    }

    fn read_byte(&mut self) -> thrift::Result<u8> {
        self.inner.read_byte()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A strict message header naming `name`, then `rest`.
    fn message(name_length: i32, rest: &[u8]) -> Vec<u8> {
        let mut bytes = vec![0x80, 0x01, 0x00, 0x01];
        bytes.extend_from_slice(&name_length.to_be_bytes());
        bytes.extend_from_slice(rest);
        bytes
    }

    #[test]
    fn a_negative_or_oversized_name_is_a_protocol_error_not_a_panic() {
        for length in [-1, i32::MIN, i32::MAX, 5] {
            let bytes = message(length, b"ping");
            let mut input = CheckedInput::new(&bytes[..]);
            match input.read_message_begin() {
                Err(thrift::Error::Protocol(error)) => assert!(
                    matches!(
                        error.kind,
                        ProtocolErrorKind::NegativeSize | ProtocolErrorKind::SizeLimit
                    ),
                    "{length}: {error:?}"
                ),
                other => panic!("{length}: {other:?}"),
            }
        }
    }

    #[test]
    fn lengths_that_fit_read_as_before() {
        let mut bytes = message(4, b"ping");
        bytes.extend_from_slice(&7i32.to_be_bytes());
        bytes.extend_from_slice(&3i32.to_be_bytes());
        bytes.extend_from_slice(b"abc");
        let mut input = CheckedInput::new(&bytes[..]);
        let header = input.read_message_begin().unwrap();
        assert_eq!(header.name, "ping");
        assert_eq!(header.sequence_number, 7);
        assert_eq!(input.read_bytes().unwrap(), b"abc");
    }

    #[test]
    fn a_binary_or_list_longer_than_the_bytes_left_is_refused() {
        let mut binary = (-2i32).to_be_bytes().to_vec();
        binary.extend_from_slice(b"xy");
        assert!(CheckedInput::new(&binary[..]).read_bytes().is_err());
        let mut list = vec![thrift::protocol::TType::I64 as u8];
        list.extend_from_slice(&1_000_000i32.to_be_bytes());
        assert!(CheckedInput::new(&list[..]).read_list_begin().is_err());
    }
}
