//! The store against a model, on small memories that push records to the
//! device, on every local device; and its typed errors.

mod common;

use common::*;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use remora_kv::device::{Completed, DeviceQueue};
use remora_kv::index::IndexError;
use remora_kv::log::LogError;
use remora_kv::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn the_store_on_the_memory_device_agrees_with_a_map(ops in prop::collection::vec(op(), 1..1500)) {
        let _ = check_against_model(Arc::new(MemoryDevice::new(8 << 20)), &ops);
    }
}

/// Prefetching is a hint: keys present, absent, on the device or in
/// frames since reused are prefetched in both stages before every
/// operation, and every read still agrees with the map.
#[test]
fn prefetching_any_key_changes_nothing_the_store_returns() {
    let store = smallest_store_in_memory();
    let mut session = store.session().unwrap();
    let mut model = Model::new();
    let ops = random_ops(4000, 11);
    for (step, op) in ops.iter().enumerate() {
        for stage in [PrefetchStage::Bucket, PrefetchStage::Record] {
            session.prefetch(&key_of((step * 7 % 256) as u8), stage);
            session.prefetch(b"a key never written", stage);
        }
        apply_op(&mut session, &mut model, op, step);
    }
    assert!(
        session.stats().device_reads > 0,
        "the run must reach the device for stale addresses to exist"
    );
    assert_first_keys(&mut session, &model, EVERY_KEY);
}

/// Regression: with one mutable page, the read-only boundary moved onto
/// the page the tail was leaving before the turn succeeded: that page was
/// flushed while other threads could still allocate small records in it
/// (and before its end marker), so a recovery scan of the device found
/// records missing or garbage past them.
#[test]
fn one_mutable_page_flushes_no_page_still_being_filled() {
    let config = StoreConfig {
        mutable_fraction: 0.1,
        ..StoreConfig::smallest()
    };
    assert_eq!(config.mutable_pages(), 1);
    let value = |thread: u64, number: u64| {
        vec![(thread * 7 + number) as u8; (number * 37 % 900 + 8) as usize]
    };
    for round in 0..4 {
        let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(32 << 20));
        let store = Store::new(config.clone(), device.clone()).unwrap();
        std::thread::scope(|scope| {
            for thread in 0..2u64 {
                let store = store.clone();
                scope.spawn(move || {
                    let mut session = store.session().unwrap();
                    for number in 0..1500u64 {
                        let key = (thread << 32 | number).to_le_bytes();
                        session.upsert(&key, &value(thread, number)).unwrap();
                    }
                });
            }
        });
        store.session().unwrap().checkpoint().unwrap();
        drop(store);
        let (recovered, _) = Store::recover(config.clone(), device).unwrap();
        let mut session = recovered.session().unwrap();
        for thread in 0..2u64 {
            for number in 0..1500u64 {
                let key = (thread << 32 | number).to_le_bytes();
                let expected = Some(value(thread, number));
                assert_eq!(
                    read_now(&mut session, &key),
                    expected,
                    "round {round}, thread {thread}, record {number}"
                );
            }
        }
    }
}

#[test]
fn the_store_on_a_direct_file_agrees_with_a_map() {
    let directory = tempfile::tempdir_in("/var/tmp").unwrap();
    let device = FileDevice::create(&directory.path().join("log"), 8 << 20, 4, true).unwrap();
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(1));
    let ops = prop::collection::vec(op(), 2000)
        .new_tree(&mut runner)
        .unwrap()
        .current();
    let stats = check_against_model(Arc::new(device), &ops);
    assert!(stats.pending > 100, "the file must serve reads: {stats:?}");
}

#[test]
fn concurrent_increments_are_never_lost_while_pages_move_to_the_device() {
    let store = Store::new(
        StoreConfig::smallest(),
        Arc::new(MemoryDevice::new(64 << 20)),
    )
    .unwrap();
    const KEYS: u64 = 300;
    const ROUNDS: u64 = 40;
    std::thread::scope(|scope| {
        for thread in 0..2u64 {
            let store = store.clone();
            scope.spawn(move || {
                let mut session = store.session().unwrap();
                for round in 0..ROUNDS {
                    for key in 0..KEYS {
                        let key = (key + thread * 7 + round) % KEYS;
                        rmw_now(&mut session, &key.to_le_bytes(), Update::AddToCounter(1)).unwrap();
                    }
                    // Upserts of other keys move the tail, so that the
                    // counters go read-only and then to the device.
                    for filler in 0..10 {
                        let filler = (1000 + thread * 100_000 + round * 10 + filler).to_le_bytes();
                        session.upsert(&filler, &[0; 1000]).unwrap();
                    }
                }
            });
        }
    });
    let mut session = store.session().unwrap();
    for key in 0..KEYS {
        let value = read_now(&mut session, &key.to_le_bytes()).expect("every key was incremented");
        assert_eq!(
            u64::from_le_bytes(value[..8].try_into().unwrap()),
            2 * ROUNDS,
            "key {key}"
        );
    }
    let [_, head, _, _] = store.boundaries();
    assert!(head.value() > 0, "the test must push pages to the device");
}

#[test]
fn a_full_device_is_a_typed_error_until_the_log_is_truncated() {
    let config = StoreConfig::smallest();
    let store = Store::new(config.clone(), Arc::new(MemoryDevice::new(8 << 14))).unwrap();
    let mut session = store.session().unwrap();
    let mut written = 0u64;
    let error = loop {
        match session.upsert(&written.to_le_bytes(), &[1; 500]) {
            Ok(_) => written += 1,
            Err(error) => break error,
        }
        assert!(written < 10_000, "an 8-page device must fill up");
    };
    assert!(
        matches!(error, KvError::Log(LogError::DeviceFull { .. })),
        "{error}"
    );
    let [_, head, _, _] = store.boundaries();
    store.truncate_until(head).unwrap();
    session.upsert(b"after", b"truncation").unwrap();
    assert_eq!(
        read_now(&mut session, b"after"),
        Some(b"truncation".to_vec())
    );
    assert_eq!(
        read_now(&mut session, &0u64.to_le_bytes()),
        None,
        "truncated records are gone"
    );
}

#[test]
fn a_full_index_is_a_typed_error() {
    let config = StoreConfig {
        index_buckets: 1,
        overflow_buckets: 1,
        ..StoreConfig::smallest()
    };
    let store = Store::new(config, Arc::new(MemoryDevice::new(1 << 20))).unwrap();
    let mut session = store.session().unwrap();
    let error = (0u64..10_000)
        .find_map(|key| session.upsert(&key.to_le_bytes(), b"v").err())
        .expect("two buckets fill up");
    assert!(
        matches!(error, KvError::Index(IndexError::Full { .. })),
        "{error}"
    );
}

#[test]
fn bad_arguments_get_typed_errors() {
    let store = Store::new(
        StoreConfig::smallest(),
        Arc::new(MemoryDevice::new(1 << 20)),
    )
    .unwrap();
    let mut session = store.session().unwrap();
    assert!(matches!(
        session.upsert(&[0; 5000], b"v"),
        Err(KvError::KeyTooLong { length: 5000 })
    ));
    assert!(matches!(
        session.upsert(b"k", &[0; 5000]),
        Err(KvError::ValueTooLong { length: 5000 })
    ));
    session.upsert(b"word", b"remora").unwrap();
    assert!(matches!(
        rmw_now(&mut session, b"word", Update::AddToDecimal(1)),
        Err(KvError::Update(UpdateError::NotAnInteger))
    ));
    let too_small = StoreConfig {
        memory_pages: 2,
        ..StoreConfig::smallest()
    };
    assert!(matches!(
        Store::new(too_small, Arc::new(MemoryDevice::new(1 << 20))),
        Err(KvError::Config(ConfigError::MemoryPages(2)))
    ));
}

/// A memory device whose writes complete only when the test lets them.
struct HeldWrites {
    inner: MemoryDevice,
    release: Arc<AtomicBool>,
}

struct HeldQueue {
    inner: Box<dyn DeviceQueue>,
    release: Arc<AtomicBool>,
    held: Vec<u64>,
}

impl Device for HeldWrites {
    fn name(&self) -> &str {
        "held"
    }
    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }
    fn open_queue(&self) -> Result<Box<dyn DeviceQueue>, DeviceError> {
        Ok(Box::new(HeldQueue {
            inner: self.inner.open_queue()?,
            release: self.release.clone(),
            held: Vec::new(),
        }))
    }
}

impl DeviceQueue for HeldQueue {
    fn read(&mut self, offset: u64, length: usize, token: u64) -> Result<(), DeviceError> {
        self.inner.read(offset, length, token)
    }
    fn write(&mut self, offset: u64, data: &[u8], token: u64) -> Result<(), DeviceError> {
        // The bytes land at once, but the write is not reported done.
        self.inner.write(offset, data, token)
    }
    fn poll(&mut self, done: &mut dyn FnMut(u64, Completed<'_>)) -> Result<usize, DeviceError> {
        let held = &mut self.held;
        let mut reads = 0;
        self.inner.poll(&mut |token, bytes| match bytes {
            None => held.push(token),
            Some(_) => {
                reads += 1;
                done(token, bytes)
            }
        })?;
        if !self.release.load(Ordering::SeqCst) {
            return Ok(reads);
        }
        let writes = held.len();
        for token in held.drain(..) {
            done(token, None);
        }
        Ok(reads + writes)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.held.len()
    }
}

#[test]
fn records_whose_flush_is_in_flight_stay_readable_with_their_newest_value() {
    let release = Arc::new(AtomicBool::new(false));
    let device = HeldWrites {
        inner: MemoryDevice::new(8 << 20),
        release: release.clone(),
    };
    let store = Store::new(StoreConfig::smallest(), Arc::new(device)).unwrap();
    let mut session = store.session().unwrap();
    // Fill the mutable pages; the next page then needs a flush that the
    // device holds, so the writer stalls on its own thread...
    // The writer counts the keys whose newest value was acknowledged.
    let acknowledged = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer = {
        let store = store.clone();
        let acknowledged = acknowledged.clone();
        std::thread::spawn(move || {
            let mut session = store.session().unwrap();
            for key in 0u64..200 {
                session
                    .upsert(&key.to_le_bytes(), &[key as u8; 300])
                    .unwrap();
                session
                    .upsert(&key.to_le_bytes(), &[key as u8 ^ 0xff; 300])
                    .unwrap();
                acknowledged.store(key + 1, Ordering::SeqCst);
            }
        })
    };
    // Wait until the writer stalls on the held flush: its count stops.
    let mut last = u64::MAX;
    let stalled_by = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let now = acknowledged.load(Ordering::SeqCst);
        if now == last {
            break;
        }
        last = now;
        assert!(
            std::time::Instant::now() < stalled_by,
            "the writer never stalled"
        );
    }
    assert!(
        !writer.is_finished(),
        "the writer stalled on the held flush"
    );
    let written = acknowledged.load(Ordering::SeqCst);
    assert!(written > 0, "some keys were written before the stall");
    // ...while every record already written reads back its newest value.
    let [_, head, _, _] = store.boundaries();
    assert_eq!(
        head.value(),
        0,
        "no page left memory while its flush was held"
    );
    for key in 0..written {
        assert_eq!(
            read_now(&mut session, &key.to_le_bytes()),
            Some(vec![key as u8 ^ 0xff; 300]),
            "key {key}, acknowledged before the stall"
        );
    }
    session.suspend();
    release.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    for key in 0u64..200 {
        assert_eq!(
            read_now(&mut session, &key.to_le_bytes()),
            Some(vec![key as u8 ^ 0xff; 300])
        );
    }
}

/// A store on a memory device whose record for "victim" has gone to the
/// device, late in page 0; returns the device, a session and the record's
/// offset on the device.
fn a_victim_on_the_device() -> (Arc<MemoryDevice>, Session, u64) {
    use remora_kv::log::CHECKPOINT_AREA_BYTES;
    use remora_kv::record::record_bytes;
    let device = Arc::new(MemoryDevice::new(8 << 20));
    let store = Store::new(StoreConfig::smallest(), device.clone()).unwrap();
    let mut session = store.session().unwrap();
    // Twelve fillers of about 1 KiB put the victim late in page 0.
    for number in 0u64..12 {
        session.upsert(&number.to_le_bytes(), &[1; 1000]).unwrap();
    }
    session.upsert(b"victim", b"value").unwrap();
    for number in 100u64..400 {
        session.upsert(&number.to_le_bytes(), &[2; 1000]).unwrap();
    }
    let victim_at = 64 + 12 * record_bytes(8, 1000);
    (device, session, CHECKPOINT_AREA_BYTES + victim_at)
}

/// Overwrites `bytes` at `offset` of `device`, as a corrupt write would.
fn corrupt(device: &MemoryDevice, offset: u64, bytes: &[u8]) {
    let mut queue = device.open_queue().unwrap();
    remora_kv::checkpoint::write_now(queue.as_mut(), offset, bytes).unwrap();
}

/// Reads "victim" and another key, both pending: within 5 s the victim's
/// read fails as corrupt on its own, the other is found, and nothing is
/// left pending (one failure once stranded the rest for good).
fn assert_the_victim_alone_is_corrupt(session: &mut Session) {
    let mut out = Vec::new();
    assert_eq!(
        session.read(b"victim", &mut out, 1).unwrap(),
        Status::Pending
    );
    assert_eq!(
        session.read(&150u64.to_le_bytes(), &mut out, 2).unwrap(),
        Status::Pending
    );
    let started = std::time::Instant::now();
    let mut results = std::collections::BTreeMap::new();
    session
        .complete_pending(true, &mut |completion| {
            results.insert(completion.context, completion.result);
        })
        .unwrap();
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert!(
        matches!(results[&1], Err(KvError::Corrupt(_))),
        "{results:?}"
    );
    assert!(matches!(results[&2], Ok(Status::Found)), "{results:?}");
    assert_eq!(session.pending_count(), 0);
}

/// Regression: a record on the device whose sizes run past its page's end
/// made the pending read ask for the same bytes again and again until the
/// 30-second stall error; it is a corrupt log, reported at once.
#[test]
fn a_record_running_past_its_page_end_is_reported_corrupt_at_once() {
    let (device, mut session, victim) = a_victim_on_the_device();
    // Its sizes word now claims a 4 KiB value: more than the page holds.
    let sizes = 6u64 | (4096u64 << 32);
    corrupt(&device, victim + 8, &sizes.to_le_bytes());
    assert_the_victim_alone_is_corrupt(&mut session);
}

/// Regression: a record of another key whose previous address was its own
/// (a flipped bit) made the pending read follow it to itself for ever: 30
/// seconds of a spinning core, then a stall error with the token still
/// pending. A chain that does not run down the log is corrupt, at once.
#[test]
fn a_chain_record_pointing_at_itself_is_reported_corrupt_at_once() {
    let (device, mut session, victim) = a_victim_on_the_device();
    use remora_kv::log::CHECKPOINT_AREA_BYTES;
    // Another key's record now ("wictim"), its previous address its own.
    corrupt(&device, victim + 24, b"w");
    let own_address = victim - CHECKPOINT_AREA_BYTES;
    corrupt(&device, victim, &own_address.to_le_bytes());
    assert_the_victim_alone_is_corrupt(&mut session);
}

/// Regression: the reads `complete_pending` issues itself (here a long
/// record's rest) were timed into `device_issue_nanos` as well as into
/// `complete_pending`'s own time, which the YCSB run adds to it, so Fig.
/// 10's communication ratio counted them twice and could pass 1. Inside a
/// timed `complete_pending`, they count once, in its time.
#[test]
fn reads_issued_while_completing_are_not_timed_as_issues() {
    let store = smallest_store_in_memory();
    let mut session = store.session().unwrap();
    // 300-byte values are longer than the first 64-byte device read.
    for number in 0u64..400 {
        session.upsert(&number.to_le_bytes(), &[3; 300]).unwrap();
    }
    let mut out = Vec::new();
    assert_eq!(
        session.read(&0u64.to_le_bytes(), &mut out, 1).unwrap(),
        Status::Pending
    );
    let issued = session.stats();
    assert!(issued.device_issue_nanos > 0, "the first read is timed");
    let mut value = None;
    let (completed, spent) = remora_kv::device::call_time::timed(|| {
        session.complete_pending(true, &mut |completion| {
            value = Some(completion.value.to_vec());
        })
    });
    completed.unwrap();
    assert!(spent > std::time::Duration::ZERO);
    assert_eq!(value, Some(vec![3; 300]));
    let completed = session.stats();
    assert_eq!(
        completed.device_reads,
        issued.device_reads + 1,
        "the record's rest is a second read, issued while completing"
    );
    assert_eq!(completed.device_issue_nanos, issued.device_issue_nanos);
}

/// How a [`FaultyReads`] device spoils its next read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadFault {
    /// Refused as it is issued (a slot timeout, a failed post).
    Refused,
    /// Taken, and reported failed by `poll` (an I/O error).
    Failed,
}

/// A memory device whose queues spoil the next read as `fault` says (then
/// clear it).
struct FaultyReads {
    inner: MemoryDevice,
    fault: Arc<std::sync::Mutex<Option<ReadFault>>>,
}

struct FaultyQueue {
    inner: Box<dyn DeviceQueue>,
    fault: Arc<std::sync::Mutex<Option<ReadFault>>>,
    failed: Vec<u64>,
}

impl FaultyReads {
    fn new() -> (FaultyReads, Arc<std::sync::Mutex<Option<ReadFault>>>) {
        let fault = Arc::new(std::sync::Mutex::new(None));
        let device = FaultyReads {
            inner: MemoryDevice::new(8 << 20),
            fault: fault.clone(),
        };
        (device, fault)
    }
}

impl Device for FaultyReads {
    fn name(&self) -> &str {
        "faulty"
    }
    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }
    fn open_queue(&self) -> Result<Box<dyn DeviceQueue>, DeviceError> {
        Ok(Box::new(FaultyQueue {
            inner: self.inner.open_queue()?,
            fault: self.fault.clone(),
            failed: Vec::new(),
        }))
    }
}

impl DeviceQueue for FaultyQueue {
    fn read(&mut self, offset: u64, length: usize, token: u64) -> Result<(), DeviceError> {
        match self.fault.lock().unwrap().take() {
            Some(ReadFault::Refused) => Err(DeviceError::Io("refused for the test".into())),
            Some(ReadFault::Failed) => {
                self.failed.push(token);
                Ok(())
            }
            None => self.inner.read(offset, length, token),
        }
    }
    fn write(&mut self, offset: u64, data: &[u8], token: u64) -> Result<(), DeviceError> {
        self.inner.write(offset, data, token)
    }
    fn poll(&mut self, done: &mut dyn FnMut(u64, Completed<'_>)) -> Result<usize, DeviceError> {
        if let Some(token) = self.failed.pop() {
            return Err(DeviceError::RequestFailed {
                token,
                reason: "failed for the test".into(),
            });
        }
        self.inner.poll(done)
    }
    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.failed.len()
    }
}

/// A store on a [`FaultyReads`] device with "key" and 300 fillers that push
/// it to the device.
fn store_with_key_on_the_device() -> (Store, Arc<std::sync::Mutex<Option<ReadFault>>>) {
    let (device, fault) = FaultyReads::new();
    let store = Store::new(StoreConfig::smallest(), Arc::new(device)).unwrap();
    let mut session = store.session().unwrap();
    session.upsert(b"key", b"value").unwrap();
    for number in 0u64..300 {
        session.upsert(&number.to_le_bytes(), &[3; 1000]).unwrap();
    }
    (store, fault)
}

/// Regression: a device read that failed as it was issued left its
/// operation pending for good: every later wait stalled for 30 s and
/// SAVE was refused with "operations pending" ever after. The caller now
/// hears the failure at once, and the session goes on.
#[test]
fn a_read_the_device_refuses_to_issue_is_not_left_pending() {
    let (store, fault) = store_with_key_on_the_device();
    let mut session = store.session().unwrap();
    *fault.lock().unwrap() = Some(ReadFault::Refused);
    let mut out = Vec::new();
    assert!(matches!(
        session.read(b"key", &mut out, 1),
        Err(KvError::Device(DeviceError::Io(_)))
    ));
    assert_eq!(session.pending_count(), 0);
    assert_eq!(read_now(&mut session, b"key"), Some(b"value".to_vec()));
    session.checkpoint().unwrap();
}

/// `page_bits` up to 26 passed the config check, but the file device moves
/// at most 1 MiB per request: every flush failed. Refused at the start now.
#[test]
fn a_page_longer_than_the_devices_requests_is_refused_at_the_start() {
    let directory = tempfile::tempdir_in("/var/tmp").unwrap();
    let device =
        Arc::new(FileDevice::create(&directory.path().join("log"), 256 << 20, 1, true).unwrap());
    let config = StoreConfig {
        page_bits: 21,
        ..StoreConfig::smallest()
    };
    assert!(matches!(
        Store::new(config, device.clone()),
        Err(KvError::Config(ConfigError::PageTooLongForDevice {
            page_bytes: 2097152,
            ..
        }))
    ));
    let fits = StoreConfig {
        page_bits: 20,
        ..StoreConfig::smallest()
    };
    Store::new(fits, device).unwrap();
}

/// The file device dropped a failed read with its token: the operation
/// waiting on it stayed pending for good (every later wait stalled 30 s).
/// A failed request is reported by name, and its operation fails alone.
#[test]
fn a_read_that_fails_on_the_device_fails_its_operation_alone() {
    let (store, fault) = store_with_key_on_the_device();
    let mut session = store.session().unwrap();
    *fault.lock().unwrap() = Some(ReadFault::Failed);
    let mut out = Vec::new();
    assert_eq!(session.read(b"key", &mut out, 1).unwrap(), Status::Pending);
    assert_eq!(
        session.read(&150u64.to_le_bytes(), &mut out, 2).unwrap(),
        Status::Pending
    );
    let mut results = std::collections::BTreeMap::new();
    session
        .complete_pending(true, &mut |completion| {
            results.insert(completion.context, completion.result);
        })
        .unwrap();
    assert!(
        matches!(
            results[&1],
            Err(KvError::Device(DeviceError::RequestFailed { .. }))
        ),
        "{results:?}"
    );
    assert!(matches!(results[&2], Ok(Status::Found)), "{results:?}");
    assert_eq!(session.pending_count(), 0);
    assert_eq!(read_now(&mut session, b"key"), Some(b"value".to_vec()));
}
