//! The harnesses of the `kv_resp` and `kv_records` fuzz targets, kept in
//! the crate so that the seeds (and any crash the fuzzer finds) replay as
//! ordinary tests on stable: a client sends the RESP front end arbitrary
//! bytes, and the device hands recovery and pending reads arbitrary bytes
//! where it should hold records, pages and checkpoint records. Neither
//! may make the store panic, and every reply must be well-formed RESP.

use crate::address::LogAddress;
use crate::checkpoint::{scan_page, CheckpointError, CheckpointRecord, RECORD_SLOT_BYTES};
use crate::log::CHECKPOINT_AREA_BYTES;
use crate::record::{self, parse_stored, record_bytes, MAX_KEY_BYTES, MAX_VALUE_BYTES};
use crate::resp::protocol::{parse_request, Parsed, MAX_ARGUMENTS, MAX_REQUEST_BYTES};
use crate::resp::server::{answer_requests, Batch};
use crate::resp::Executor;
use crate::update::parse_decimal;
use crate::{MemoryDevice, Store, StoreConfig};
use std::sync::Arc;

/// The store's smallest legal shape (16 KiB pages, four in memory), so
/// that a little preloading puts records on the device.
const PAGE_BITS: u32 = 14;
const MEMORY_PAGES: u64 = 4;
/// The log's room on the device, in pages: more than the preload and any
/// input can fill, so that a write fails only for the fuzzer's reasons.
const DEVICE_PAGES: u64 = 16;

/// Keys written first, so that they end up on the device: a GET or INCR
/// of one goes pending. `counter` holds a number and `word` does not.
pub const ON_DEVICE: &[(&[u8], &[u8])] = &[
    (b"k0", b"v0"),
    (b"k1", b"v1"),
    (b"k2", b"v2"),
    (b"k3", b"v3"),
    (b"counter", b"41"),
    (b"word", b"remora"),
];

/// Then fillers `f0`, `f1`, ... of this many bytes each, which push the
/// keys above out of memory. With the layout of [`crate::record`], three
/// fit the first page and four each later page, so 15 of them leave the
/// tail in page 3: `f0` to `f2` join the keys above on the device (page
/// 0), `f3` to `f6` stay in memory read-only (page 1), `f7` onwards
/// mutable (pages 2 and 3). No more than that: every page flushed is
/// copied word by word, the bulk of a run's time.
const FILLER_BYTES: usize = 4000;
const FILLERS: usize = 15;
/// The last filler is shorter, so that the tail's page keeps
/// [`TAIL_PAGE_ROOM_BYTES`]: an input with a few kilobytes of new records
/// makes the log turn a page (a read-only shift, a flush, the head
/// moving) while its commands run.
const LAST_FILLER_BYTES: usize = 2208;
pub const TAIL_PAGE_ROOM_BYTES: u64 = 2048;
/// Refreshes after the preload, at most, for the head to pass page 0.
const PRELOAD_REFRESHES: usize = 8;

/// Runs `input` as one pipelined batch from a client: requests are parsed
/// from the front and executed one after another until the input ends
/// part way through a request, a QUIT, or a protocol error (answered
/// `-ERR Protocol error`); then the batch's pending GETs are settled. The
/// store is a small one on a [`MemoryDevice`], preloaded with
/// [`ON_DEVICE`] and fillers, so that reads, read-modify-writes and
/// deferred GETs go to the device.
///
/// Panics if the executor or the parser does, if the parser breaks its
/// own bounds, or if the replies are not exactly one well-formed RESP
/// value per non-empty request. Returns the replies.
pub fn resp(input: &[u8]) -> Vec<u8> {
    let (_store, mut executor) = preloaded_executor();
    let mut replies = Vec::new();
    let expected = answer_batch(&mut executor, input, &mut replies);
    executor.settle(&mut replies);
    check_replies(&replies, expected);
    replies
}

/// Runs `input` as two connections' batches in one round of the server
/// ([`crate::resp::server`]): the first connection sends the whole
/// requests that end in the input's first half, the second the rest.
/// Each batch runs with its device reads detached; then the round waits
/// for all of them at once and fills each batch's replies in.
///
/// Panics as [`resp`] does, and unless each connection's replies equal
/// those of running the two batches one after the other on a fresh
/// store: detaching a batch's reads must reorder nothing. Returns both
/// connections' replies.
pub fn resp_round(input: &[u8]) -> Vec<u8> {
    let split = whole_requests_within(input, input.len() / 2);
    let parts = [&input[..split], &input[split..]];
    let (_store, mut executor) = preloaded_executor();
    let mut round = [Vec::new(), Vec::new()];
    let mut detached = Vec::new();
    for (part, replies) in parts.iter().zip(&mut round) {
        let expected = answer_batch(&mut executor, part, replies);
        detached.push((executor.detach(), expected));
    }
    executor.complete();
    for ((deferred, expected), replies) in detached.into_iter().zip(&mut round) {
        executor.fill(deferred, replies);
        check_replies(replies, expected);
    }
    let (_store, mut executor) = preloaded_executor();
    for (part, replies) in parts.iter().zip(&round) {
        let mut alone = Vec::new();
        answer_batch(&mut executor, part, &mut alone);
        executor.settle(&mut alone);
        assert!(
            alone == *replies,
            "a detached batch answered otherwise: {} against {}",
            String::from_utf8_lossy(replies),
            String::from_utf8_lossy(&alone)
        );
    }
    round.concat()
}

/// The length of the whole requests at the front of `input` that end
/// within its first `limit` bytes.
fn whole_requests_within(input: &[u8], limit: usize) -> usize {
    let mut consumed = 0;
    while let Ok(Parsed::Request(request)) = parse_request(&input[consumed..]) {
        if consumed + request.consumed > limit {
            break;
        }
        consumed += request.consumed;
    }
    consumed
}

/// Executes the requests at the front of `input` with the server's own
/// batch loop ([`answer_requests`], no flush limit), leaving deferred GETs
/// to the caller, and checks the parser's bounds. Returns the replies the
/// batch must produce: one per non-empty request, and one for a protocol
/// error.
fn answer_batch(executor: &mut Executor, input: &[u8], replies: &mut Vec<u8>) -> usize {
    let mut expected_replies = 0;
    let (consumed, batch) = answer_requests(
        executor,
        input,
        replies,
        usize::MAX,
        &mut |request, left| {
            assert!(
                request.consumed > 0 && request.consumed <= left,
                "a request took {} of {left} bytes",
                request.consumed,
            );
            assert!(request.arguments.len() <= MAX_ARGUMENTS);
            if !request.arguments.is_empty() {
                expected_replies += 1;
            }
        },
    );
    match batch {
        Batch::Drained => {
            let held = input.len() - consumed;
            assert!(
                held <= MAX_REQUEST_BYTES,
                "{held} bytes held as an incomplete request"
            );
        }
        Batch::Invalid => expected_replies += 1,
        Batch::Close => {}
        Batch::Full => unreachable!("no flush limit"),
    }
    expected_replies
}

/// Panics unless `replies` are exactly `expected` well-formed RESP values.
fn check_replies(replies: &[u8], expected: usize) {
    match count_replies(replies) {
        Ok(count) => assert_eq!(
            count,
            expected,
            "one reply per request: {}",
            String::from_utf8_lossy(replies)
        ),
        Err(malformed) => panic!(
            "malformed reply ({malformed:?}): {}",
            String::from_utf8_lossy(replies)
        ),
    }
}

/// A store shaped as described at [`ON_DEVICE`], and an executor on it.
/// The store is returned too, so that tests can look at its log.
fn preloaded_executor() -> (Store, Executor) {
    let config = StoreConfig {
        index_buckets: 1 << 8,
        overflow_buckets: 1 << 10,
        page_bits: PAGE_BITS,
        memory_pages: MEMORY_PAGES,
        mutable_fraction: 0.5,
        // Shorter than most fillers, so that reading one takes two reads.
        first_read_bytes: 64,
        sessions: 2,
    };
    let device_bytes = CHECKPOINT_AREA_BYTES + (DEVICE_PAGES << PAGE_BITS);
    let device = Arc::new(MemoryDevice::new(device_bytes));
    let store = Store::new(config, device).expect("a fixed, valid shape");
    {
        let mut session = store.session().expect("a free session");
        for (key, value) in ON_DEVICE {
            session.upsert(key, value).expect("the preload fits");
        }
        let filler = [b'f'; FILLER_BYTES];
        for number in 0..FILLERS {
            let length = if number + 1 == FILLERS {
                LAST_FILLER_BYTES
            } else {
                FILLER_BYTES
            };
            let key = format!("f{number}");
            session
                .upsert(key.as_bytes(), &filler[..length])
                .expect("the preload fits");
        }
        // The head follows the flushes as the session refreshes; refresh
        // until the first page has left memory, as it would have after a
        // few more operations.
        let first_kept = LogAddress::page_start(1, PAGE_BITS);
        for _ in 0..PRELOAD_REFRESHES {
            if store.boundaries()[1] >= first_kept {
                break;
            }
            session
                .complete_pending(false, &mut |_| {})
                .expect("nothing is pending");
        }
        // Dropping the session releases its epoch slot for the executor's.
    }
    let executor = Executor::new(store.clone()).expect("a free session");
    (store, executor)
}

/// Why a reply buffer is not a sequence of RESP2 values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MalformedReply {
    /// A value starts with a byte that is none of `+ - : $ *`.
    UnknownMarker { at: usize, marker: u8 },
    /// A line has no CRLF, or a lone CR or LF inside it.
    UnterminatedLine { at: usize },
    /// An integer, bulk length or array length is not a canonical i64,
    /// or is a negative length other than -1.
    BadNumber { at: usize },
    /// A bulk string's bytes are cut short or not followed by CRLF.
    BadBulk { at: usize },
}

/// Counts the top-level RESP2 values that make up `replies` exactly.
pub fn count_replies(replies: &[u8]) -> Result<usize, MalformedReply> {
    let mut count = 0;
    let mut at = 0;
    while at < replies.len() {
        at = value_end(replies, at)?;
        count += 1;
    }
    Ok(count)
}

/// Where the RESP2 value starting at `at` ends.
fn value_end(replies: &[u8], at: usize) -> Result<usize, MalformedReply> {
    let marker = replies[at];
    let (line, next) = line_at(replies, at + 1)?;
    match marker {
        b'+' | b'-' => Ok(next),
        b':' => parse_decimal(line)
            .map(|_| next)
            .ok_or(MalformedReply::BadNumber { at }),
        b'$' => match length(line, at)? {
            None => Ok(next),
            Some(length) => {
                let end = next + length;
                match replies.get(end..end + 2) {
                    Some(b"\r\n") => Ok(end + 2),
                    _ => Err(MalformedReply::BadBulk { at }),
                }
            }
        },
        b'*' => {
            let mut next = next;
            for _ in 0..length(line, at)?.unwrap_or(0) {
                if next == replies.len() {
                    return Err(MalformedReply::BadBulk { at: next });
                }
                next = value_end(replies, next)?;
            }
            Ok(next)
        }
        marker => Err(MalformedReply::UnknownMarker { at, marker }),
    }
}

/// The line from `start` to its CRLF, and where the next value starts.
fn line_at(replies: &[u8], start: usize) -> Result<(&[u8], usize), MalformedReply> {
    let rest = replies.get(start..).unwrap_or_default();
    let end = rest
        .iter()
        .position(|&byte| byte == b'\r' || byte == b'\n')
        .ok_or(MalformedReply::UnterminatedLine { at: start })?;
    match rest.get(end..end + 2) {
        Some(b"\r\n") => Ok((&rest[..end], start + end + 2)),
        _ => Err(MalformedReply::UnterminatedLine { at: start }),
    }
}

/// A bulk or array length: `None` for -1 (null).
fn length(line: &[u8], at: usize) -> Result<Option<usize>, MalformedReply> {
    match parse_decimal(line) {
        Some(-1) => Ok(None),
        Some(length) => usize::try_from(length)
            .map(Some)
            .map_err(|_| MalformedReply::BadNumber { at }),
        None => Err(MalformedReply::BadNumber { at }),
    }
}

/// What [`records`] made of its input, for the seeds' tests.
#[derive(Debug)]
pub struct RecordsOutcome {
    /// `parse_stored` found a whole record.
    pub whole_record: bool,
    /// The input starts with a valid checkpoint record slot.
    pub checkpoint: Option<CheckpointRecord>,
    /// How many live records a recovery scan of the input, as page 1 of
    /// a log of 16 KiB pages, found, or why it stopped.
    pub scanned: Result<usize, CheckpointError>,
}

/// Hands `input` to the three readers of bytes back from the device: as
/// a record a pending read fetched ([`parse_stored`]), as a checkpoint
/// record slot ([`CheckpointRecord::decode`]) and as a page that
/// recovery scans ([`scan_page`], as page 1 of a log of 16 KiB pages).
///
/// Panics if any of them does, or if what they return breaks the
/// store's assumptions: a whole record lies within the input and within
/// the size limits; a request for more bytes asks for more than were
/// given (else a pending read would re-read forever) and no more than
/// the largest record; a decoded checkpoint record re-encodes to a slot
/// that decodes to the same record; a scan reports keys in address order
/// from within the page.
pub fn records(input: &[u8]) -> RecordsOutcome {
    let whole_record = match parse_stored(input) {
        record::Parsed::Whole(record) => {
            assert!(record.key.len() <= MAX_KEY_BYTES);
            assert!(record.value.len() <= MAX_VALUE_BYTES);
            assert!(!record.header.is_page_end());
            true
        }
        record::Parsed::Needs(length) => {
            assert!(
                length > input.len(),
                "asked for {length} bytes, given {}",
                input.len()
            );
            assert!(length as u64 <= record_bytes(MAX_KEY_BYTES, MAX_VALUE_BYTES));
            false
        }
        record::Parsed::Corrupt(_) => false,
    };

    let checkpoint = CheckpointRecord::decode(input);
    if let Some(decoded) = checkpoint {
        let slot = decoded.encode();
        assert_eq!(slot.len() as u64, RECORD_SLOT_BYTES);
        assert_eq!(CheckpointRecord::decode(&slot), Some(decoded));
    }

    let page_start = LogAddress::page_start(1, PAGE_BITS);
    let page_end = page_start.plus(input.len() as u64);
    let mut previous: Option<LogAddress> = None;
    let mut live = 0;
    let scanned = scan_page(page_start, input, |address, record| {
        assert!(address >= page_start && address < page_end, "{address}");
        assert!(previous.is_none_or(|previous| previous < address));
        assert!(record.key.len() <= MAX_KEY_BYTES);
        previous = Some(address);
        live += 1;
    })
    .map(|()| live);

    RecordsOutcome {
        whole_record,
        checkpoint,
        scanned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(executor: &mut Executor, command: &str) -> String {
        let mut replies = Vec::new();
        let arguments: Vec<std::borrow::Cow<'_, [u8]>> = command
            .split(' ')
            .map(|word| std::borrow::Cow::Borrowed(word.as_bytes()))
            .collect();
        executor.execute(&arguments, &mut replies);
        executor.settle(&mut replies);
        String::from_utf8_lossy(&replies).into_owned()
    }

    /// The preload's layout is what the fuzz target's seeds rely on: the
    /// first keys answer from the device, the last fillers from memory.
    #[test]
    fn the_preloaded_keys_answer_from_the_device() {
        let (store, mut executor) = preloaded_executor();
        let [_, head, read_only, tail] = store.boundaries();
        assert_eq!(tail.page(PAGE_BITS), 3, "{tail}");
        assert_eq!(head, LogAddress::page_start(1, PAGE_BITS));
        assert_eq!(read_only, LogAddress::page_start(2, PAGE_BITS));
        assert_eq!(tail.bytes_to_page_end(PAGE_BITS), TAIL_PAGE_ROOM_BYTES);

        assert_eq!(run(&mut executor, "GET k2"), "$2\r\nv2\r\n");
        assert_eq!(run(&mut executor, "INCR counter"), ":42\r\n");
        assert_eq!(
            run(&mut executor, "INCR word"),
            "-ERR value is not an integer or out of range\r\n"
        );
        assert_eq!(executor.stats().pending, 3, "{:?}", executor.stats());
        // Longer than the first read: a second read fetches the rest.
        assert_eq!(run(&mut executor, "GET f2").len(), 4009);
        let device_reads = executor.stats().pending;
        assert_eq!(device_reads, 4, "{:?}", executor.stats());
        assert_eq!(run(&mut executor, "EXISTS f3 f14"), ":2\r\n");
        assert_eq!(executor.stats().pending, device_reads);
    }

    /// A few kilobytes of new records turn the tail's page: the records
    /// written so far become read-only and updates of them copy.
    #[test]
    fn a_few_kilobytes_of_writes_turn_a_page() {
        let (store, mut executor) = preloaded_executor();
        assert_eq!(run(&mut executor, "SET first 1"), "+OK\r\n");
        assert_eq!(
            run(&mut executor, &format!("SET padding {}", "p".repeat(3000))),
            "+OK\r\n"
        );
        let [_, _, read_only, tail] = store.boundaries();
        assert_eq!(tail.page(PAGE_BITS), 4, "{tail}");
        assert_eq!(read_only, LogAddress::page_start(3, PAGE_BITS));
        let copies = executor.stats().copies_to_tail;
        assert_eq!(run(&mut executor, "INCR first"), ":2\r\n");
        assert_eq!(executor.stats().copies_to_tail, copies + 1);
    }

    #[test]
    fn replies_are_counted_and_malformed_ones_named() {
        assert_eq!(count_replies(b""), Ok(0));
        assert_eq!(
            count_replies(b"+OK\r\n-ERR x\r\n:-3\r\n$-1\r\n$2\r\nab\r\n*2\r\n$1\r\na\r\n$-1\r\n"),
            Ok(6)
        );
        assert_eq!(
            count_replies(b"OK\r\n"),
            Err(MalformedReply::UnknownMarker {
                at: 0,
                marker: b'O'
            })
        );
        assert_eq!(
            count_replies(b"+OK\n"),
            Err(MalformedReply::UnterminatedLine { at: 1 })
        );
        assert_eq!(
            count_replies(b":01\r\n"),
            Err(MalformedReply::BadNumber { at: 0 })
        );
        assert_eq!(
            count_replies(b"$3\r\nab\r\n"),
            Err(MalformedReply::BadBulk { at: 0 })
        );
        assert_eq!(
            count_replies(b"*2\r\n:1\r\n"),
            Err(MalformedReply::BadBulk { at: 8 })
        );
    }

    #[test]
    fn a_protocol_error_ends_the_batch_with_one_reply() {
        let replies = resp(b"PING\r\n*1\r\n:3\r\nPING\r\n");
        assert_eq!(
            String::from_utf8_lossy(&replies),
            "+PONG\r\n-ERR Protocol error: expected '$', got ':'\r\n"
        );
    }
}
