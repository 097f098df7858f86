//! Log compaction: live records below the head are copied to the tail and
//! the log truncated there; no live key is lost, deleted keys stay
//! deleted, and a store that keeps updating runs on a device it would
//! otherwise fill.

mod common;

use common::*;
use remora_kv::device::{FarMemoryDevice, FarMemoryPath};
use remora_kv::log::LogError;
use remora_kv::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Applies `ops` to the store and the model, numbered from `step`.
fn apply(session: &mut Session, model: &mut Model, ops: &[Op], step: usize) {
    for (offset, op) in ops.iter().enumerate() {
        apply_op(session, model, op, step + offset);
    }
}

/// Upserts whose values outgrow their records, so the log grows and
/// earlier records leave memory.
fn push_below_the_head(session: &mut Session, count: usize) {
    for step in 0..count {
        let number = (step % 200) as u8;
        let value = value_of(number, 50 + step % 250, step);
        session.upsert(&key_of(number), &value).unwrap();
    }
}

/// The smallest store's shape on a memory device of `device_bytes`.
fn smallest_store_on(device_bytes: u64) -> Store {
    Store::new(
        StoreConfig::smallest(),
        Arc::new(MemoryDevice::new(device_bytes)),
    )
    .unwrap()
}

/// A background compactor that looks every millisecond and compacts below
/// half the device's room.
fn eager_compactor(store: &Store) -> remora_kv::compactor::Compactor {
    let policy = remora_kv::compactor::CompactionPolicy {
        below_room_fraction: 0.5,
        check_every_ms: 1,
        ..Default::default()
    };
    remora_kv::compactor::Compactor::start(store.clone(), policy).unwrap()
}

/// Completes the session's one pending read and checks it found `value`.
fn assert_pending_read_finds(session: &mut Session, value: &[u8]) {
    let mut answer = None;
    session
        .complete_pending(true, &mut |completion| {
            answer = Some((completion.result.clone(), completion.value.to_vec()));
        })
        .unwrap();
    assert_eq!(answer, Some((Ok(Status::Found), value.to_vec())));
}

fn head(store: &Store) -> LogAddress {
    store.boundaries()[1]
}

fn compacted_store_agrees_with_a_map(device: Arc<dyn Device>) {
    let store = Store::new(StoreConfig::smallest(), device).unwrap();
    let mut session = store.session().unwrap();
    let mut model = Model::new();
    let mut copied = 0;
    for round in 0..8u64 {
        let ops = random_ops(4000, round);
        apply(&mut session, &mut model, &ops, round as usize * 1000);
        let before = store.boundaries()[0];
        let compaction = session.compact(head(&store)).unwrap();
        assert!(compaction.begin > before, "round {round}: {compaction:?}");
        assert!(compaction.records_copied <= compaction.records_scanned);
        copied += compaction.records_copied;
        assert_first_keys(&mut session, &model, EVERY_KEY);
    }
    assert!(copied > 0, "some records were still live below the head");
}

#[test]
fn compaction_keeps_every_live_key_in_memory_device() {
    compacted_store_agrees_with_a_map(Arc::new(MemoryDevice::new(16 << 20)));
}

#[test]
fn compaction_keeps_every_live_key_on_one_sided_far_memory() {
    let device =
        Arc::new(FarMemoryDevice::start(FarMemoryPath::OneSidedAsync, 16 << 20, 4).unwrap());
    compacted_store_agrees_with_a_map(device.clone());
    device.stop().unwrap();
}

#[test]
fn compaction_keeps_every_live_key_behind_cowbird_spot() {
    let device = Arc::new(FarMemoryDevice::start(FarMemoryPath::CowbirdSpot, 16 << 20, 4).unwrap());
    compacted_store_agrees_with_a_map(device.clone());
    device.stop().unwrap();
}

/// 64 keys updated over and over: without compaction the device fills
/// (the control); compacting whenever room runs low, the same run goes on
/// more than three times as long (the control fills at about step
/// 10 500 of 40 000) and every key reads its last value.
#[test]
fn compaction_lets_a_store_that_keeps_updating_outlive_its_device() {
    const STEPS: usize = 40_000;
    // The step a run failed at, with its error, or the model it left.
    let updates = |store: &Store, compact: bool| -> Result<Model, (usize, KvError)> {
        let mut session = store.session().unwrap();
        let mut model = Model::new();
        for step in 0..STEPS {
            let number = (step % 64) as u8;
            // Lengths that change, so updates often outgrow their
            // record and append a copy.
            let value = value_of(number, 100 + (step % 7) * 30, step);
            session
                .upsert(&key_of(number), &value)
                .map_err(|error| (step, error))?;
            model.insert(key_of(number), value);
            if compact && store.device_room_bytes() < (256 << 10) {
                session
                    .compact(head(store))
                    .map_err(|error| (step, error))?;
            }
        }
        assert_first_keys(&mut session, &model, 64);
        Ok(model)
    };
    let small = || Arc::new(MemoryDevice::new(2 << 20));
    let without = Store::new(StoreConfig::smallest(), small()).unwrap();
    match updates(&without, false) {
        Err((step, KvError::Log(remora_kv::log::LogError::DeviceFull { .. }))) => {
            // The compacting run below goes on more than three times as long.
            assert!(step < STEPS / 3, "the device filled only at step {step}");
        }
        other => panic!(
            "without compaction the device should fill: {:?}",
            other.err()
        ),
    }
    let with = Store::new(StoreConfig::smallest(), small()).unwrap();
    updates(&with, true).unwrap();
}

/// A delete below the compaction address stays deleted, though its
/// tombstone is not copied.
#[test]
fn a_deleted_key_stays_deleted_after_its_tombstone_is_compacted_away() {
    let store = smallest_store_on(16 << 20);
    let mut session = store.session().unwrap();
    session.upsert(b"gone", b"soon").unwrap();
    session.delete(b"gone").unwrap();
    push_below_the_head(&mut session, 2000);
    let compaction = session.compact(head(&store)).unwrap();
    assert!(compaction.records_scanned > 0);
    assert_eq!(read_now(&mut session, b"gone"), None);
}

/// One session compacts while another keeps writing: the writer's last
/// value of every key survives.
#[test]
fn compaction_races_a_writer_and_loses_nothing() {
    let store = smallest_store_on(32 << 20);
    // The writer goes on until the compactor has raced it for real (two
    // compactions, records copied), however the two threads are
    // scheduled: on a loaded machine 30 000 writes can end before the
    // compactor's first turn.
    let raced = AtomicBool::new(false);
    // A writer that outruns the compactor waits for it, as `kv serve`'s do.
    store.wait_for_room(std::time::Duration::from_secs(10));
    let model = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let mut session = store.session().unwrap();
            let mut model = Model::new();
            // Cold keys, written once, soon below the head where the
            // compactor copies them; then hot keys, rewritten over and
            // over while it does.
            for number in 0..128u8 {
                let value = value_of(number, 400, 0);
                session.upsert(&key_of(number), &value).unwrap();
                model.insert(key_of(number), value);
            }
            for step in 0usize.. {
                if step >= 30_000 && raced.load(Ordering::Acquire) {
                    break;
                }
                assert!(step < 3_000_000, "the compactor never raced the writer");
                let number = 128 + (step * 7 % 128) as u8;
                let value = value_of(number, 200 + step % 300, step);
                session.upsert(&key_of(number), &value).unwrap();
                model.insert(key_of(number), value);
            }
            session.suspend();
            model
        });
        let mut compactor = store.session().unwrap();
        let (mut compactions, mut copied) = (0, 0);
        while !writer.is_finished() {
            copied += compactor.compact(head(&store)).unwrap().records_copied;
            compactor.suspend();
            compactions += 1;
            if compactions > 1 && copied > 0 {
                raced.store(true, Ordering::Release);
            }
            std::thread::yield_now();
        }
        assert!(compactions > 1 && copied > 0, "{compactions} {copied}");
        writer.join().unwrap()
    });
    let mut session = store.session().unwrap();
    assert_first_keys(&mut session, &model, EVERY_KEY);
}

/// Compacted, checkpointed, recovered: the recovered store holds every
/// live key, from the log's new begin.
#[test]
fn a_compacted_log_recovers() {
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(16 << 20));
    let store = Store::new(StoreConfig::smallest(), device.clone()).unwrap();
    let mut session = store.session().unwrap();
    let mut model = Model::new();
    apply(&mut session, &mut model, &random_ops(2000, 9), 0);
    session.compact(head(&store)).unwrap();
    apply(&mut session, &mut model, &random_ops(300, 10), 5000);
    let checkpoint = session.checkpoint().unwrap();
    assert!(checkpoint.begin > LogAddress::new(0));
    drop(session);
    drop(store);
    assert_recovers(device, &model, EVERY_KEY);
}

#[test]
fn compacting_past_the_head_or_with_operations_pending_is_refused() {
    let store = smallest_store_on(16 << 20);
    let mut session = store.session().unwrap();
    push_below_the_head(&mut session, 3000);
    let tail = store.boundaries()[3];
    assert!(matches!(
        session.compact(tail),
        Err(KvError::Compaction(CompactionError::AboveHead { .. }))
    ));
    // A read of a record on the device is left pending.
    let mut out = Vec::new();
    assert_eq!(
        session.read(&key_of(0), &mut out, 1).unwrap(),
        Status::Pending
    );
    assert!(matches!(
        session.compact(head(&store)),
        Err(KvError::Compaction(CompactionError::PendingOperations(1)))
    ));
}

/// The background compactor (what `remora kv serve` runs) keeps a store
/// that keeps updating writable on a device it would otherwise fill: a
/// write that finds the device full waits for it, and every key ends with
/// its last value.
#[test]
fn the_background_compactor_keeps_a_store_that_keeps_updating_writable() {
    let store = smallest_store_on(2 << 20);
    let compactor = eager_compactor(&store);
    let mut session = store.session().unwrap();
    let mut model = Model::new();
    for step in 0..40_000usize {
        let number = (step % 64) as u8;
        let value = value_of(number, 100 + (step % 7) * 30, step);
        session.upsert(&key_of(number), &value).unwrap();
        model.insert(key_of(number), value);
    }
    assert_first_keys(&mut session, &model, 64);
    drop(session);
    compactor.stop().unwrap();
    let totals = store.compaction_totals();
    assert!(totals.compactions > 0, "{totals:?}");
    // The log went past the device's size: only compaction made room.
    assert!(store.boundaries()[3].value() > 2 << 20);
}

/// A compactor whose store's live records alone fill the device past the
/// policy's floor can gain nothing: it backs off rather than copying the
/// same records round the log without end, loses none of them, and stops
/// when told. (`remora kv serve`, preloaded past its floor, once spun a
/// core on this and then hung when stopped.)
#[test]
fn a_compactor_that_can_gain_nothing_backs_off_loses_nothing_and_stops() {
    use remora_kv::compactor::{CompactionPolicy, Compactor};
    use std::time::Duration;
    let store = smallest_store_on(2 << 20);
    let mut session = store.session().unwrap();
    let value = vec![7u8; 400];
    let capacity = store.log_capacity_bytes() as f64;
    let mut keys = 0u32;
    // Distinct keys, so every record stays live: 60% of the device.
    while store.device_room_bytes() as f64 > 0.4 * capacity {
        session.upsert(&keys.to_le_bytes(), &value).unwrap();
        keys += 1;
        assert!(keys < 10_000, "the device never filled");
    }
    session.suspend();
    let policy = CompactionPolicy {
        below_room_fraction: 0.5,
        check_every_ms: 1,
        ..CompactionPolicy::default()
    };
    let compactor = Compactor::start(store.clone(), policy).unwrap();
    std::thread::sleep(Duration::from_millis(250));
    let early = store.compaction_totals().compactions;
    std::thread::sleep(Duration::from_millis(250));
    let late = store.compaction_totals().compactions - early;
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || sender.send(compactor.stop()));
    let stopped = receiver.recv_timeout(Duration::from_secs(10));
    stopped.expect("the compactor stops when told").unwrap();
    // Looks 1, 2, 4 ... 128 ms apart, then 200: about ten in half a
    // second, against one pass after another without the back-off.
    let passes = store.compaction_totals().compactions;
    assert!((1..=20).contains(&passes), "{passes} passes in 0.5 s");
    // By the second quarter second the looks are 128 and 200 ms apart:
    // two or three passes, where a compactor without the back-off keeps
    // passing as fast as it can.
    assert!(late <= 3, "{late} passes in the second 0.25 s");
    for key in 0..keys {
        let read = read_now(&mut session, &key.to_le_bytes());
        assert_eq!(read.as_deref(), Some(&value[..]), "key {key}");
    }
}

#[test]
fn a_policy_that_could_never_fire_or_never_stop_is_refused() {
    use remora_kv::compactor::{CompactionPolicy, CompactorError};
    for fraction in [0.0, 1.0, -1.0, f64::NAN] {
        let policy = CompactionPolicy {
            below_room_fraction: fraction,
            ..CompactionPolicy::default()
        };
        assert!(matches!(
            policy.check(),
            Err(CompactorError::RoomFraction(_))
        ));
    }
    let policy = CompactionPolicy {
        check_every_ms: 0,
        ..CompactionPolicy::default()
    };
    assert_eq!(policy.check(), Err(CompactorError::CheckEvery));
}

/// Compaction moved the begin past the pages of the last checkpoint, and
/// later writes reused their device space: a crash then recovered from
/// overwritten pages. The kept checkpoint's pages now hold their space
/// until a newer checkpoint: writes past it find the device full, and
/// recovery gives back exactly what was checkpointed.
#[test]
fn truncated_pages_of_the_kept_checkpoint_are_not_overwritten() {
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(2 << 20));
    let store = Store::new(StoreConfig::smallest(), device.clone()).unwrap();
    let mut session = store.session().unwrap();
    let mut model = Model::new();
    for step in 0..400usize {
        let number = (step % 64) as u8;
        let value = value_of(number, 200, step);
        session.upsert(&key_of(number), &value).unwrap();
        model.insert(key_of(number), value);
    }
    session.checkpoint().unwrap();
    let checkpointed = model.clone();
    let mut written = 0u64;
    let mut full = false;
    for step in 400..40_000usize {
        if step % 500 == 0 {
            // Truncates pages the checkpoint still names.
            match session.compact(head(&store)) {
                Ok(_) | Err(KvError::Log(LogError::DeviceFull { .. })) => {}
                Err(error) => panic!("{error}"),
            }
        }
        let number = (step % 64) as u8;
        // Lengths that outgrow their records, so updates go to the tail.
        match session.upsert(&key_of(number), &value_of(number, 50 + step % 250, step)) {
            Ok(_) => written += 1,
            Err(KvError::Log(LogError::DeviceFull { .. })) => {
                full = true;
                break;
            }
            Err(error) => panic!("{error}"),
        }
    }
    assert!(full, "the kept checkpoint's pages held their space");
    assert!(written > 0);
    drop(session);
    drop(store);
    assert_recovers(device, &checkpointed, 64);
}

/// A store recovered from `device` holds `model`'s first `count` keys.
fn assert_recovers(device: Arc<dyn Device>, model: &Model, count: u16) {
    let (recovered, _) = Store::recover(StoreConfig::smallest(), device).unwrap();
    let mut session = recovered.session().unwrap();
    assert_first_keys(&mut session, model, count);
}

/// With the background compactor, a checkpoint no longer pins the device:
/// the compactor checkpoints after truncating, so a store that keeps
/// updating stays writable past the device's size, and a crash recovers
/// each key at a value no older than the explicit checkpoint's.
#[test]
fn the_compactor_checkpoints_so_a_kept_checkpoint_does_not_fill_the_device() {
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(2 << 20));
    let store = Store::new(StoreConfig::smallest(), device.clone()).unwrap();
    let compactor = eager_compactor(&store);
    let mut session = store.session().unwrap();
    // Values carry their step; each key's step at the checkpoint is kept.
    let mut at_checkpoint = [0usize; 64];
    for step in 0..40_000usize {
        let number = (step % 64) as u8;
        // Lengths that outgrow their records, so updates go to the tail.
        let mut value = vec![number; 50 + step % 250];
        value[..8].copy_from_slice(&(step as u64).to_le_bytes());
        session.upsert(&key_of(number), &value).unwrap();
        if step == 1_000 {
            session.checkpoint().unwrap();
            for (key, kept) in at_checkpoint.iter_mut().enumerate() {
                *kept = step - (step + 64 - key) % 64;
            }
        }
    }
    assert!(
        store.boundaries()[3].value() > 2 << 20,
        "the log passed the device's size"
    );
    drop(session);
    compactor.stop().unwrap();
    drop(store);
    let (recovered, _) = Store::recover(StoreConfig::smallest(), device).unwrap();
    let mut session = recovered.session().unwrap();
    for (number, kept) in at_checkpoint.iter().enumerate() {
        let value = read_now(&mut session, &key_of(number as u8)).expect("every key");
        let step = u64::from_le_bytes(value[..8].try_into().unwrap()) as usize;
        assert!(
            step >= *kept && step % 64 == number,
            "key {number}: step {step}, kept {kept}"
        );
    }
}

/// A read of K whose chain went through a colliding key J (one index
/// entry: same bucket, same tag) was pending on J's record when a
/// compaction copied K to the tail and truncated K's old page: the walk
/// from J ran below the log's begin and answered NotFound, though K was
/// there all along (so a DEL of K did nothing). The read looks again from
/// the index's new head.
#[test]
fn a_read_racing_a_compaction_that_moves_its_key_still_finds_it() {
    let store = smallest_store_on(16 << 20);
    let mut reader = store.session().unwrap();
    let mut compacting = store.session().unwrap();
    let buckets = StoreConfig::smallest().index_buckets;
    let entry_of = |key: &[u8]| {
        let hash = remora_kv::store::hash_key(key);
        (hash & (buckets - 1), hash >> 50)
    };
    let key = b"the key".to_vec();
    let wanted = entry_of(&key);
    let colliding = (0u64..1 << 28)
        .map(u64::to_le_bytes)
        .find(|candidate| entry_of(candidate) == wanted)
        .expect("a key sharing the entry");
    reader.upsert(&key, b"value").unwrap();
    reader.upsert(&colliding, b"other").unwrap();
    push_below_the_head(&mut reader, 3000);
    let mut out = Vec::new();
    assert_eq!(reader.read(&key, &mut out, 1).unwrap(), Status::Pending);
    reader.suspend();
    compacting.compact(head(&store)).unwrap();
    compacting.suspend();
    assert_pending_read_finds(&mut reader, b"value");
    assert_eq!(read_now(&mut reader, &key), Some(b"value".to_vec()));
}

/// A compaction under a kept checkpoint frees no device space until a newer
/// checkpoint: its copies filled the reserve, and the checkpoint that would
/// have let the truncated pages go could not turn its page (the same
/// reserve), so the background compactor died and every write and `SAVE`
/// failed as a full device until a restart. A checkpoint has a page of its
/// own now.
#[test]
fn a_compaction_under_a_kept_checkpoint_leaves_room_for_the_checkpoint_that_frees_it() {
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(2 << 20));
    let store = Store::new(StoreConfig::smallest(), device.clone()).unwrap();
    let mut session = store.session().unwrap();
    // Many live records: copying them takes more than the reserve.
    for number in 0u16..2000 {
        let value = value_of(number as u8, 300, usize::from(number));
        session.upsert(&number.to_le_bytes(), &value).unwrap();
    }
    session.checkpoint().unwrap();
    'filling: for round in 1..100usize {
        for number in 0u16..2000 {
            let value = value_of(number as u8, 300, round);
            match session.upsert(&number.to_le_bytes(), &value) {
                Ok(_) => {}
                Err(KvError::Log(LogError::DeviceFull { .. })) => break 'filling,
                Err(error) => panic!("{error}"),
            }
        }
    }
    match session.compact(head(&store)) {
        Ok(_) | Err(KvError::Log(LogError::DeviceFull { .. })) => {}
        Err(error) => panic!("{error}"),
    }
    session
        .checkpoint()
        .expect("the checkpoint that lets the truncated pages go");
    let value = value_of(7, 300, 1_000_000);
    session
        .upsert(&7u16.to_le_bytes(), &value)
        .expect("room again once the checkpoint is durable");
}

/// A memory device whose reads take their bytes when the queue is polled,
/// not when they are issued, as a far-memory read in flight does.
struct DeferredReads(MemoryDevice);

struct DeferredReadsQueue {
    inner: Box<dyn DeviceQueue>,
    waiting: Vec<(u64, usize, u64)>,
}

impl Device for DeferredReads {
    fn name(&self) -> &str {
        "deferred-reads"
    }

    fn capacity_bytes(&self) -> u64 {
        self.0.capacity_bytes()
    }

    fn open_queue(&self) -> Result<Box<dyn DeviceQueue>, DeviceError> {
        Ok(Box::new(DeferredReadsQueue {
            inner: self.0.open_queue()?,
            waiting: Vec::new(),
        }))
    }
}

impl DeviceQueue for DeferredReadsQueue {
    fn read(&mut self, offset: u64, length: usize, token: u64) -> Result<(), DeviceError> {
        self.waiting.push((offset, length, token));
        Ok(())
    }

    fn write(&mut self, offset: u64, data: &[u8], token: u64) -> Result<(), DeviceError> {
        self.inner.write(offset, data, token)
    }

    fn poll(
        &mut self,
        done: &mut dyn FnMut(u64, remora_kv::device::Completed<'_>),
    ) -> Result<usize, DeviceError> {
        for (offset, length, token) in self.waiting.drain(..) {
            self.inner.read(offset, length, token)?;
        }
        self.inner.poll(done)
    }

    fn in_flight(&self) -> usize {
        self.waiting.len() + self.inner.in_flight()
    }
}

/// A read was in flight on a record when a compaction truncated its page
/// and the log went on past the device's end, reusing the page's space:
/// the read took the newer bytes there for the record, and answered
/// corrupt or with another record's chain. A read whose record fell below
/// the log's begin looks again from the index.
#[test]
fn a_read_in_flight_on_a_page_truncated_and_reused_looks_again() {
    let device_bytes = 1 << 20;
    let device: Arc<dyn Device> = Arc::new(DeferredReads(MemoryDevice::new(device_bytes)));
    let store = Store::new(StoreConfig::smallest(), device).unwrap();
    let mut reader = store.session().unwrap();
    let mut writer = store.session().unwrap();
    let key = b"the key".to_vec();
    reader.upsert(&key, b"value").unwrap();
    push_below_the_head(&mut reader, 3000);
    let mut out = Vec::new();
    assert_eq!(reader.read(&key, &mut out, 1).unwrap(), Status::Pending);
    reader.suspend();
    let start = store.boundaries()[0];
    let mut written = 0;
    while store.boundaries()[0].value() < start.value() + 2 * device_bytes {
        push_below_the_head(&mut writer, 500);
        writer.compact(head(&store)).unwrap();
        written += 1;
        assert!(written < 10_000, "the log never lapped the device");
    }
    writer.suspend();
    assert_pending_read_finds(&mut reader, b"value");
}

/// A memory device whose reads are refused once `failing` is set.
struct ReadsFailWhenSet {
    device: MemoryDevice,
    failing: Arc<AtomicBool>,
}

struct ReadsFailWhenSetQueue {
    inner: Box<dyn DeviceQueue>,
    failing: Arc<AtomicBool>,
}

impl Device for ReadsFailWhenSet {
    fn name(&self) -> &str {
        "reads-fail-when-set"
    }

    fn capacity_bytes(&self) -> u64 {
        self.device.capacity_bytes()
    }

    fn open_queue(&self) -> Result<Box<dyn DeviceQueue>, DeviceError> {
        Ok(Box::new(ReadsFailWhenSetQueue {
            inner: self.device.open_queue()?,
            failing: self.failing.clone(),
        }))
    }
}

impl DeviceQueue for ReadsFailWhenSetQueue {
    fn read(&mut self, offset: u64, length: usize, token: u64) -> Result<(), DeviceError> {
        if self.failing.load(Ordering::Relaxed) {
            return Err(DeviceError::Io("reads refused for the test".into()));
        }
        self.inner.read(offset, length, token)
    }

    fn write(&mut self, offset: u64, data: &[u8], token: u64) -> Result<(), DeviceError> {
        self.inner.write(offset, data, token)
    }

    fn poll(
        &mut self,
        done: &mut dyn FnMut(u64, remora_kv::device::Completed<'_>),
    ) -> Result<usize, DeviceError> {
        self.inner.poll(done)
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight()
    }
}

/// A compactor that failed (here, its device refused its reads) ended
/// without a word, and every writer that then found the device full
/// waited out the 2 s room wait for it, each time, before failing. Now
/// the writers fail at once, and the stop reports the compactor's error.
#[test]
fn writers_stop_waiting_for_a_compactor_that_failed() {
    use remora_kv::compactor::{CompactionPolicy, Compactor, CompactorError};
    use std::time::{Duration, Instant};
    let failing = Arc::new(AtomicBool::new(false));
    let device = ReadsFailWhenSet {
        device: MemoryDevice::new(2 << 20),
        failing: failing.clone(),
    };
    let store = Store::new(StoreConfig::smallest(), Arc::new(device)).unwrap();
    let mut session = store.session().unwrap();
    push_below_the_head(&mut session, 3000);
    failing.store(true, Ordering::Relaxed);
    let policy = CompactionPolicy {
        below_room_fraction: 0.9,
        check_every_ms: 1,
        writers_wait_ms: 2_000,
    };
    let compactor = Compactor::start(store.clone(), policy).unwrap();
    let mut full_waits = Vec::new();
    for step in 0..200_000usize {
        let number = (step % 200) as u8;
        let started = Instant::now();
        match session.upsert(&key_of(number), &value_of(number, 300, step)) {
            Ok(_) => {}
            Err(KvError::Log(LogError::DeviceFull { .. })) => {
                full_waits.push(started.elapsed());
                if full_waits.len() == 3 {
                    break;
                }
            }
            Err(error) => panic!("{error}"),
        }
    }
    assert_eq!(full_waits.len(), 3, "the device never filled");
    assert!(
        full_waits
            .iter()
            .all(|wait| *wait < Duration::from_millis(500)),
        "writers waited for a compactor that had failed: {full_waits:?}"
    );
    assert!(matches!(compactor.stop(), Err(CompactorError::Store(_))));
}
