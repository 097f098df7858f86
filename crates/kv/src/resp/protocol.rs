//! RESP2 requests and replies, without I/O.
//!
//! [`parse_request`] looks at the front of a connection's input buffer
//! and either finds one whole request there, says that more bytes are
//! needed ([`Parsed::Incomplete`]), or rejects the input. It keeps no
//! state between calls: the caller appends what it reads and calls again
//! from the start of the unanswered request. Re-parsing is cheap because
//! a multibulk request is walked by its length lines and never scanned
//! byte by byte, and an inline line is at most [`MAX_INLINE_BYTES`].
//!
//! Every length is bounded, so a connection never has to hold more than
//! [`MAX_REQUEST_BYTES`] of a request that is still arriving.

use crate::record::{MAX_KEY_BYTES, MAX_VALUE_BYTES};
use crate::update::parse_decimal;
use std::borrow::Cow;
use std::fmt::Display;
use std::io::Write;

/// Most arguments in one request, the command name included.
pub const MAX_ARGUMENTS: usize = 1024;

/// The longest bulk argument: the store's largest key or value plus some,
/// so that a key or value a little over the store's limit still reaches
/// the store and gets an ordinary `-ERR` reply on a connection that stays
/// open, while no client can make the server buffer a huge argument.
pub const MAX_BULK_BYTES: usize = larger(MAX_KEY_BYTES, MAX_VALUE_BYTES) + 1024;

/// The longest inline request line, as in Redis.
pub const MAX_INLINE_BYTES: usize = 64 * 1024;

/// The longest `*<count>` or `$<length>` line before its CR: a sign and
/// 19 digits fit an i64, so anything longer is not a length.
pub const MAX_LENGTH_LINE_BYTES: usize = 32;

/// The longest input a request can occupy while still incomplete: the
/// parser rejects anything that would grow past it.
pub const MAX_REQUEST_BYTES: usize = larger(
    MAX_INLINE_BYTES,
    LENGTH_LINE_WITH_CRLF + MAX_ARGUMENTS * (LENGTH_LINE_WITH_CRLF + MAX_BULK_BYTES + 2),
);

const LENGTH_LINE_WITH_CRLF: usize = MAX_LENGTH_LINE_BYTES + 2;

const fn larger(first: usize, second: usize) -> usize {
    if first > second {
        first
    } else {
        second
    }
}

/// Input that is not RESP2. The server answers `-ERR Protocol error: ...`
/// and closes the connection, as Redis does, because it can no longer
/// tell where the next request starts. The wordings follow Redis's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("invalid multibulk length")]
    InvalidMultibulkLength,
    #[error("too many arguments: at most {MAX_ARGUMENTS} per request")]
    TooManyArguments,
    #[error("expected '$', got {found:?}")]
    ExpectedBulk { found: char },
    #[error("invalid bulk length")]
    InvalidBulkLength,
    #[error("a bulk argument of {length} bytes is longer than the {MAX_BULK_BYTES}-byte limit")]
    BulkTooLong { length: usize },
    #[error("too big length line: no CRLF within {MAX_LENGTH_LINE_BYTES} bytes")]
    LengthLineTooLong,
    #[error("a length line's CR is not followed by LF")]
    LengthLineWithoutCrlf,
    #[error("a bulk argument is not followed by CRLF")]
    BulkWithoutCrlf,
    #[error("too big inline request")]
    InlineTooLong,
    #[error("unbalanced quotes in request")]
    UnbalancedQuotes,
}

/// One whole request at the front of the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request<'a> {
    /// The command name and its arguments. Empty for a blank inline line
    /// or `*0`, which Redis skips without a reply.
    pub arguments: Vec<Cow<'a, [u8]>>,
    /// Bytes of input the request took.
    pub consumed: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed<'a> {
    /// The input holds only the start of a request.
    Incomplete,
    Request(Request<'a>),
}

/// Parses the request at the front of `input`: a multibulk array if it
/// starts with `*`, else an inline line.
pub fn parse_request(input: &[u8]) -> Result<Parsed<'_>, ProtocolError> {
    match input.first() {
        None => Ok(Parsed::Incomplete),
        Some(b'*') => parse_multibulk(input),
        Some(_) => parse_inline(input),
    }
}

fn parse_multibulk(input: &[u8]) -> Result<Parsed<'_>, ProtocolError> {
    let Some((digits, mut position)) = length_line(input, 1)? else {
        return Ok(Parsed::Incomplete);
    };
    let count = parse_decimal(digits).ok_or(ProtocolError::InvalidMultibulkLength)?;
    // Redis treats a negative count (a null array) like an empty one.
    let count = usize::try_from(count).unwrap_or(0);
    if count > MAX_ARGUMENTS {
        return Err(ProtocolError::TooManyArguments);
    }
    let mut arguments = Vec::with_capacity(count);
    for _ in 0..count {
        let Some((argument, next)) = parse_bulk(input, position)? else {
            return Ok(Parsed::Incomplete);
        };
        arguments.push(Cow::Borrowed(argument));
        position = next;
    }
    Ok(Parsed::Request(Request {
        arguments,
        consumed: position,
    }))
}

/// The `$<length>\r\n<bytes>\r\n` at `start`, and where the next element
/// starts; `None` until all of it has arrived.
fn parse_bulk(input: &[u8], start: usize) -> Result<Option<(&[u8], usize)>, ProtocolError> {
    let Some(&marker) = input.get(start) else {
        return Ok(None);
    };
    if marker != b'$' {
        return Err(ProtocolError::ExpectedBulk {
            found: char::from(marker),
        });
    }
    let Some((digits, data_start)) = length_line(input, start + 1)? else {
        return Ok(None);
    };
    let data_end = data_start + bulk_length(digits)?;
    match input.get(data_end..data_end + 2) {
        None => Ok(None),
        Some(b"\r\n") => Ok(Some((&input[data_start..data_end], data_end + 2))),
        Some(_) => Err(ProtocolError::BulkWithoutCrlf),
    }
}

fn bulk_length(digits: &[u8]) -> Result<usize, ProtocolError> {
    let length = parse_decimal(digits)
        .and_then(|length| usize::try_from(length).ok())
        .ok_or(ProtocolError::InvalidBulkLength)?;
    if length > MAX_BULK_BYTES {
        return Err(ProtocolError::BulkTooLong { length });
    }
    Ok(length)
}

/// The text of the length line at `start` (after its `*` or `$`) without
/// its CRLF, and where the next element starts; `None` until the CRLF has
/// arrived.
fn length_line(input: &[u8], start: usize) -> Result<Option<(&[u8], usize)>, ProtocolError> {
    let rest = input.get(start..).unwrap_or_default();
    let window = &rest[..rest.len().min(MAX_LENGTH_LINE_BYTES)];
    let Some(carriage) = window.iter().position(|&byte| byte == b'\r') else {
        if window.len() == MAX_LENGTH_LINE_BYTES {
            return Err(ProtocolError::LengthLineTooLong);
        }
        return Ok(None);
    };
    match rest.get(carriage + 1) {
        None => Ok(None),
        Some(b'\n') => Ok(Some((&rest[..carriage], start + carriage + 2))),
        Some(_) => Err(ProtocolError::LengthLineWithoutCrlf),
    }
}

/// A line ending in LF (a CR before it is dropped), split on spaces with
/// Redis's quoting rules.
fn parse_inline(input: &[u8]) -> Result<Parsed<'_>, ProtocolError> {
    let window = &input[..input.len().min(MAX_INLINE_BYTES + 1)];
    let Some(newline) = window.iter().position(|&byte| byte == b'\n') else {
        if input.len() > MAX_INLINE_BYTES {
            return Err(ProtocolError::InlineTooLong);
        }
        return Ok(Parsed::Incomplete);
    };
    let line = &input[..newline];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    Ok(Parsed::Request(Request {
        arguments: split_inline(line)?,
        consumed: newline + 1,
    }))
}

fn split_inline(line: &[u8]) -> Result<Vec<Cow<'_, [u8]>>, ProtocolError> {
    let mut arguments = Vec::new();
    let mut position = 0;
    loop {
        position += line[position..]
            .iter()
            .take_while(|byte| byte.is_ascii_whitespace())
            .count();
        if position == line.len() {
            return Ok(arguments);
        }
        if arguments.len() == MAX_ARGUMENTS {
            return Err(ProtocolError::TooManyArguments);
        }
        let (argument, next) = inline_argument(line, position)?;
        arguments.push(argument);
        position = next;
    }
}

/// The argument starting at `start` and the position after it. Like
/// Redis, a quote may open part way through an argument, and its closing
/// quote must end the argument.
fn inline_argument(line: &[u8], start: usize) -> Result<(Cow<'_, [u8]>, usize), ProtocolError> {
    let plain_length = line[start..]
        .iter()
        .position(|&byte| byte.is_ascii_whitespace() || byte == b'"' || byte == b'\'')
        .unwrap_or(line.len() - start);
    let end = start + plain_length;
    let plain = &line[start..end];
    let quote = match line.get(end) {
        Some(&quote @ (b'"' | b'\'')) => quote,
        _ => return Ok((Cow::Borrowed(plain), end)),
    };
    let mut argument = plain.to_vec();
    let next = if quote == b'"' {
        double_quoted(line, end + 1, &mut argument)?
    } else {
        single_quoted(line, end + 1, &mut argument)?
    };
    Ok((Cow::Owned(argument), next))
}

/// Appends a double-quoted section's bytes (with `\n`, `\xHH`... escapes)
/// from `position`; returns the position after the closing quote.
fn double_quoted(
    line: &[u8],
    mut position: usize,
    argument: &mut Vec<u8>,
) -> Result<usize, ProtocolError> {
    loop {
        let rest = &line[position..];
        let (byte, width) = match rest {
            [] => return Err(ProtocolError::UnbalancedQuotes),
            [b'"', after @ ..] => return end_of_quote(after, position + 1),
            [b'\\', ..] => escape(rest),
            [byte, ..] => (*byte, 1),
        };
        argument.push(byte);
        position += width;
    }
}

/// Appends a single-quoted section's bytes (only `\'` is an escape) from
/// `position`; returns the position after the closing quote.
fn single_quoted(
    line: &[u8],
    mut position: usize,
    argument: &mut Vec<u8>,
) -> Result<usize, ProtocolError> {
    loop {
        let (byte, width) = match &line[position..] {
            [] => return Err(ProtocolError::UnbalancedQuotes),
            [b'\\', b'\'', ..] => (b'\'', 2),
            [b'\'', after @ ..] => return end_of_quote(after, position + 1),
            [byte, ..] => (*byte, 1),
        };
        argument.push(byte);
        position += width;
    }
}

/// The byte an escape at the front of `rest` stands for, and its width.
fn escape(rest: &[u8]) -> (u8, usize) {
    if let [b'\\', b'x', high, low, ..] = rest {
        if let Some(byte) = hex_byte(*high, *low) {
            return (byte, 4);
        }
    }
    match rest.get(1) {
        Some(b'n') => (b'\n', 2),
        Some(b'r') => (b'\r', 2),
        Some(b't') => (b'\t', 2),
        Some(b'b') => (0x08, 2),
        Some(b'a') => (0x07, 2),
        Some(&other) => (other, 2),
        // A lone backslash at the end: the loop then finds no closing quote.
        None => (b'\\', 1),
    }
}

fn hex_byte(high: u8, low: u8) -> Option<u8> {
    let digit = |byte: u8| char::from(byte).to_digit(16);
    let value = digit(high)? * 16 + digit(low)?;
    u8::try_from(value).ok()
}

/// A closing quote must end the argument: `"a"b` is an error in Redis.
fn end_of_quote(after: &[u8], next: usize) -> Result<usize, ProtocolError> {
    match after.first() {
        Some(byte) if !byte.is_ascii_whitespace() => Err(ProtocolError::UnbalancedQuotes),
        _ => Ok(next),
    }
}

/// `+text`. CR and LF would end the line early, so they become spaces.
pub fn encode_simple(out: &mut Vec<u8>, text: &str) {
    encode_line(out, b'+', text);
}

/// `-text`, for example `ERR unknown command 'X'`.
pub fn encode_error(out: &mut Vec<u8>, text: &str) {
    encode_line(out, b'-', text);
}

pub fn encode_integer(out: &mut Vec<u8>, value: i64) {
    encode_number(out, b':', value);
}

pub fn encode_bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    encode_number(out, b'$', bytes.len());
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// The null bulk string: a GET of a missing key.
pub fn encode_null(out: &mut Vec<u8>) {
    out.extend_from_slice(b"$-1\r\n");
}

/// The header of an array of `length` elements, which follow.
pub fn encode_array_header(out: &mut Vec<u8>, length: usize) {
    encode_number(out, b'*', length);
}

fn encode_line(out: &mut Vec<u8>, marker: u8, text: &str) {
    out.push(marker);
    out.extend(text.bytes().map(|byte| match byte {
        b'\r' | b'\n' => b' ',
        other => other,
    }));
    out.extend_from_slice(b"\r\n");
}

fn encode_number(out: &mut Vec<u8>, marker: u8, value: impl Display) {
    out.push(marker);
    // Writing into a Vec cannot fail.
    let _ = write!(out, "{value}\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Arguments = Vec<Vec<u8>>;

    fn owned(request: &Request<'_>) -> Arguments {
        request
            .arguments
            .iter()
            .map(|argument| argument.to_vec())
            .collect()
    }

    fn words(text: &str) -> Arguments {
        text.split(' ')
            .map(|word| word.as_bytes().to_vec())
            .collect()
    }

    fn parse_one(input: &[u8]) -> Result<Arguments, ProtocolError> {
        match parse_request(input)? {
            Parsed::Request(request) => {
                assert_eq!(request.consumed, input.len(), "one whole request");
                Ok(owned(&request))
            }
            Parsed::Incomplete => panic!("{input:?} is complete"),
        }
    }

    /// Feeds `pieces` one after another as a connection would, answering
    /// every whole request as soon as it is there.
    fn parse_pieces<'p>(pieces: impl IntoIterator<Item = &'p [u8]>) -> Vec<Arguments> {
        let mut buffer = Vec::new();
        let mut requests = Vec::new();
        for piece in pieces {
            buffer.extend_from_slice(piece);
            let mut consumed = 0;
            while let Parsed::Request(request) = parse_request(&buffer[consumed..]).unwrap() {
                assert!(request.consumed > 0);
                consumed += request.consumed;
                requests.push(owned(&request));
            }
            buffer.drain(..consumed);
        }
        assert!(buffer.is_empty(), "left over: {buffer:?}");
        requests
    }

    const PIPELINE: &[u8] = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n\
        PING\r\n\
        *3\r\n$3\r\nSET\r\n$3\r\nkey\r\n$0\r\n\r\n\
        \r\n\
        SET 'a b' \"c\\x41\\n\"\n\
        *0\r\n\
        *1\r\n$4\r\nQUIT\r\n";

    fn pipeline_requests() -> Vec<Arguments> {
        vec![
            words("GET k"),
            words("PING"),
            vec![b"SET".to_vec(), b"key".to_vec(), Vec::new()],
            Vec::new(),
            vec![b"SET".to_vec(), b"a b".to_vec(), b"cA\n".to_vec()],
            Vec::new(),
            words("QUIT"),
        ]
    }

    #[test]
    fn a_multibulk_request_parses_without_copying() {
        let input = b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n";
        let Ok(Parsed::Request(request)) = parse_request(input) else {
            panic!("a whole request");
        };
        assert_eq!(request.consumed, input.len());
        assert!(matches!(request.arguments[0], Cow::Borrowed(b"GET")));
        assert_eq!(owned(&request), words("GET k"));
    }

    #[test]
    fn inline_requests_split_on_spaces_and_honour_quotes() {
        assert_eq!(parse_one(b"PING\r\n"), Ok(words("PING")));
        assert_eq!(parse_one(b"  set  k\tv \n"), Ok(words("set k v")));
        assert_eq!(parse_one(b"\r\n"), Ok(Vec::new()));
        assert_eq!(
            parse_one(b"SET k\"ey\" 'it\\'s' \"\\t\\\\\\\"\\xff\\xzz\"\r\n"),
            Ok(vec![
                b"SET".to_vec(),
                b"key".to_vec(),
                b"it's".to_vec(),
                b"\t\\\"\xffxzz".to_vec()
            ])
        );
    }

    #[test]
    fn empty_and_null_arrays_are_empty_requests() {
        assert_eq!(parse_one(b"*0\r\n"), Ok(Vec::new()));
        assert_eq!(parse_one(b"*-1\r\n"), Ok(Vec::new()));
    }

    #[test]
    fn a_pipeline_parses_the_same_however_it_is_split() {
        assert_eq!(parse_pieces([PIPELINE]), pipeline_requests());
        for split in 0..=PIPELINE.len() {
            let (first, second) = PIPELINE.split_at(split);
            assert_eq!(
                parse_pieces([first, second]),
                pipeline_requests(),
                "split at {split}"
            );
        }
        let bytes = PIPELINE.chunks(1);
        assert_eq!(parse_pieces(bytes), pipeline_requests());
    }

    #[test]
    fn every_proper_prefix_of_a_request_is_incomplete() {
        let input = b"*3\r\n$3\r\nSET\r\n$2\r\nk1\r\n$5\r\nvalue\r\n";
        for end in 0..input.len() {
            assert_eq!(parse_request(&input[..end]), Ok(Parsed::Incomplete));
        }
    }

    #[test]
    fn malformed_multibulk_input_gets_typed_errors() {
        let long_line = format!("*{}\r\n", "1".repeat(40));
        let cases: Vec<(&[u8], ProtocolError)> = vec![
            (b"*abc\r\n", ProtocolError::InvalidMultibulkLength),
            (b"*+1\r\n", ProtocolError::InvalidMultibulkLength),
            (b"*\r\n", ProtocolError::InvalidMultibulkLength),
            (b"*1025\r\n", ProtocolError::TooManyArguments),
            (
                b"*99999999999999999999\r\n",
                ProtocolError::InvalidMultibulkLength,
            ),
            (long_line.as_bytes(), ProtocolError::LengthLineTooLong),
            (b"*1\rx", ProtocolError::LengthLineWithoutCrlf),
            (b"*1\r\n:3\r\n", ProtocolError::ExpectedBulk { found: ':' }),
            (b"*1\r\n$-1\r\n", ProtocolError::InvalidBulkLength),
            (b"*1\r\n$x\r\n", ProtocolError::InvalidBulkLength),
            (
                b"*1\r\n$99999\r\n",
                ProtocolError::BulkTooLong { length: 99999 },
            ),
            (b"*1\r\n$3\r\nabcde", ProtocolError::BulkWithoutCrlf),
            (
                b"*2\r\n$1\r\na\r\n*1\r\n",
                ProtocolError::ExpectedBulk { found: '*' },
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(
                parse_request(input),
                Err(expected),
                "{}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn malformed_inline_input_gets_typed_errors() {
        for input in [
            &b"SET \"a b\r\n"[..],
            b"SET 'a\n",
            b"SET \"a\"b\n",
            b"SET \"a\\\n",
        ] {
            assert_eq!(parse_request(input), Err(ProtocolError::UnbalancedQuotes));
        }
        let endless = vec![b'a'; MAX_INLINE_BYTES + 1];
        assert_eq!(parse_request(&endless), Err(ProtocolError::InlineTooLong));
        assert_eq!(
            parse_request(&endless[..MAX_INLINE_BYTES]),
            Ok(Parsed::Incomplete)
        );
        let mut crowded = "a ".repeat(MAX_ARGUMENTS + 1).into_bytes();
        crowded.push(b'\n');
        assert_eq!(
            parse_request(&crowded),
            Err(ProtocolError::TooManyArguments)
        );
    }

    #[test]
    fn the_largest_request_fits_the_bound() {
        let mut input = format!("*{MAX_ARGUMENTS}\r\n").into_bytes();
        for _ in 0..MAX_ARGUMENTS {
            input.extend_from_slice(format!("${MAX_BULK_BYTES}\r\n").as_bytes());
            input.extend(std::iter::repeat_n(b'v', MAX_BULK_BYTES));
            input.extend_from_slice(b"\r\n");
        }
        assert!(input.len() <= MAX_REQUEST_BYTES);
        let Ok(Parsed::Request(request)) = parse_request(&input) else {
            panic!("the largest request is allowed");
        };
        assert_eq!(request.arguments.len(), MAX_ARGUMENTS);
        assert_eq!(
            parse_request(&input[..input.len() - 1]),
            Ok(Parsed::Incomplete)
        );
    }

    #[test]
    fn integers_follow_redis() {
        assert_eq!(parse_decimal(b"0"), Some(0));
        assert_eq!(parse_decimal(b"-12"), Some(-12));
        assert_eq!(parse_decimal(b"-9223372036854775808"), Some(i64::MIN));
        for bad in [
            &b""[..],
            b"-",
            b"-0",
            b"+1",
            b"01",
            b" 1",
            b"1 ",
            b"1a",
            b"9223372036854775808",
        ] {
            assert_eq!(parse_decimal(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn replies_are_encoded_as_resp2() {
        let mut out = Vec::new();
        encode_simple(&mut out, "OK");
        encode_error(&mut out, "ERR bad\r\nline");
        encode_integer(&mut out, -3);
        encode_bulk(&mut out, b"v\r\n");
        encode_null(&mut out);
        encode_array_header(&mut out, 2);
        assert_eq!(
            out,
            b"+OK\r\n-ERR bad  line\r\n:-3\r\n$3\r\nv\r\n\r\n$-1\r\n*2\r\n".to_vec()
        );
    }

    fn check_outcome(input: &[u8]) {
        match parse_request(input) {
            Ok(Parsed::Request(request)) => {
                assert!(request.consumed > 0 && request.consumed <= input.len());
                assert!(request.arguments.len() <= MAX_ARGUMENTS);
            }
            Ok(Parsed::Incomplete) => assert!(input.len() <= MAX_REQUEST_BYTES),
            Err(_) => {}
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(input in prop::collection::vec(any::<u8>(), 0..256)) {
            check_outcome(&input);
        }

        #[test]
        fn protocol_like_bytes_never_panic(
            pieces in prop::collection::vec(
                prop_oneof![
                    Just(&b"*"[..]), Just(&b"$"[..]), Just(&b"\r\n"[..]), Just(&b"\r"[..]),
                    Just(&b"\n"[..]), Just(&b"2"[..]), Just(&b"-1"[..]), Just(&b"0"[..]),
                    Just(&b"\""[..]), Just(&b"'"[..]), Just(&b"\\x4"[..]), Just(&b" "[..]),
                    Just(&b"GET"[..]),
                ],
                0..40,
            )
        ) {
            check_outcome(&pieces.concat());
        }
    }
}
