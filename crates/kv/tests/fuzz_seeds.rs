//! The `kv_resp` and `kv_records` fuzz targets' seeds replay through
//! their harnesses (`remora_kv::fuzzing`) on stable, so that every seed,
//! crashes the fuzzer found included, stays a regression test; the named
//! seeds also still reach what they were written to reach.

use remora_kv::checkpoint::CheckpointRecord;
use remora_kv::fuzzing::{records, resp, resp_round, RecordsOutcome};
use remora_kv::LogAddress;
use std::collections::BTreeMap;

/// Every file of a seed directory, by name. Panics on an empty one: a
/// seed replay that replays nothing would pass for the wrong reason.
fn seeds(directory: &str) -> BTreeMap<String, Vec<u8>> {
    let mut seeds = BTreeMap::new();
    for entry in std::fs::read_dir(directory).expect("the seed directory") {
        let path = entry.expect("a seed").path();
        let bytes = std::fs::read(&path).expect("a readable seed");
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        seeds.insert(name, bytes);
    }
    assert!(!seeds.is_empty(), "no seeds in {directory}");
    seeds
}

/// Every seed also runs as two connections' batches in one server round
/// (the harness checks each against the batches run one after the
/// other). Split at a request boundary with no QUIT before it, a seed's
/// round answers exactly as its single batch does.
#[test]
fn resp_fuzz_seeds_replay_as_two_connections_in_one_round() {
    let directory = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/seeds/kv_resp");
    for (name, bytes) in seeds(directory) {
        let round = resp_round(&bytes);
        if name == "pipelined_gets_around_a_set" {
            assert_eq!(
                String::from_utf8_lossy(&round),
                String::from_utf8_lossy(&resp(&bytes))
            );
        }
    }
}

#[test]
fn resp_fuzz_seeds_replay() {
    let directory = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/seeds/kv_resp");
    let replies: BTreeMap<String, String> = seeds(directory)
        .into_iter()
        .map(|(name, bytes)| (name, String::from_utf8_lossy(&resp(&bytes)).into_owned()))
        .collect();
    let reply = |name: &str| replies.get(name).map(String::as_str).unwrap_or_default();
    let filler = format!("$4000\r\n{}\r\n", "f".repeat(4000));

    // GETs of keys on the device wait together and still answer in
    // request order among GETs answered from memory; a SET between them
    // is seen only by the GETs after it.
    assert_eq!(
        reply("pipelined_gets_around_a_set"),
        format!("$2\r\nv0\r\n$2\r\nv1\r\n+OK\r\n$3\r\nnew\r\n{filler}{filler}$-1\r\n")
    );
    // A blank line gets no reply, and nothing after QUIT runs.
    assert_eq!(
        reply("inline_requests"),
        "+PONG\r\n+OK\r\n$11\r\nhello world\r\n:2\r\n:1\r\n$-1\r\n+OK\r\n"
    );
    assert_eq!(
        reply("malformed_bulk_length"),
        "-ERR Protocol error: invalid bulk length\r\n"
    );
    assert_eq!(
        reply("malformed_quotes"),
        "$2\r\nv2\r\n-ERR Protocol error: unbalanced quotes in request\r\n"
    );
    assert_eq!(
        reply("mset_mget"),
        "+OK\r\n*4\r\n$1\r\n1\r\n$3\r\ntwo\r\n$2\r\nv3\r\n$-1\r\n"
    );
    let not_an_integer = "-ERR value is not an integer or out of range\r\n";
    assert_eq!(
        reply("incr_not_a_number"),
        format!("+OK\r\n{not_an_integer}{not_an_integer}:42\r\n:41\r\n:1\r\n")
    );
    // Over the store's limits but within the parser's: an error, and
    // no half-written MGET array.
    assert_eq!(
        reply("key_and_value_too_long"),
        "-ERR a value of 4097 bytes is longer than the 4096-byte limit\r\n\
         -ERR a key of 4097 bytes is longer than the 4096-byte limit\r\n\
         $2\r\nv0\r\n"
    );
    // Every command the executor knows, and one it does not.
    let every_command = reply("every_command");
    assert!(
        every_command.starts_with("$2\r\nv0\r\n+OK\r\n:2\r\n:2\r\n:1\r\n:0\r\n:10\r\n:7\r\n"),
        "{every_command}"
    );
    assert!(
        every_command.ends_with(
            "$2\r\nv0\r\n:42\r\n-ERR unknown command 'FLUSHALL', with args beginning with: \r\n+OK\r\n"
        ),
        "{every_command}"
    );
    // Enough bytes written to turn the tail's page; the counter written
    // before the turn is then copied, not updated in place.
    assert_eq!(
        reply("page_turn"),
        format!("+OK\r\n$2\r\nv0\r\n+OK\r\n:2\r\n$1\r\n2\r\n{filler}:42\r\n")
    );
}

#[test]
fn records_fuzz_seeds_replay() {
    let directory = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/seeds/kv_records");
    let outcomes: BTreeMap<String, RecordsOutcome> = seeds(directory)
        .into_iter()
        .map(|(name, bytes)| (name, records(&bytes)))
        .collect();
    let outcome = |name: &str| outcomes.get(name).unwrap_or_else(|| panic!("seed {name}"));

    let record = outcome("record");
    assert!(record.whole_record, "{record:?}");
    assert_eq!(record.checkpoint, None);
    assert_eq!(record.scanned, Ok(1));

    let page = outcome("page_two_records_and_end");
    assert!(page.whole_record, "{page:?}");
    assert_eq!(page.scanned, Ok(2));

    let slot = outcome("checkpoint_slot");
    assert_eq!(
        slot.checkpoint,
        Some(CheckpointRecord {
            sequence: 3,
            page_bits: 14,
            begin: LogAddress::new(0),
            tail: LogAddress::page_start(8, 14),
        })
    );
}
