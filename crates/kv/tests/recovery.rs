//! Checkpoints and recovery after the compute side loses its memory (the
//! store is dropped without a word to the device; the device, like far
//! memory, outlives it): every write acknowledged before a checkpoint
//! comes back, on every kind of device.

mod common;

use common::*;
use remora_kv::checkpoint::CheckpointError;
use remora_kv::device::{DeviceKind, FileSettings, OpenDevice};
use remora_kv::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Applies `ops` to the store and the model; at every `checkpoint_every`
/// operations takes a checkpoint and keeps the model as it was then.
fn apply(session: &mut Session, model: &mut Model, ops: &[Op], checkpoint_every: usize) -> Model {
    let mut at_checkpoint = model.clone();
    for (step, op) in ops.iter().enumerate() {
        apply_op(session, model, op, step);
        if step % checkpoint_every == checkpoint_every - 1 {
            session.checkpoint().unwrap();
            at_checkpoint = model.clone();
        }
    }
    at_checkpoint
}

fn check_recovered(store: &Store, model: &Model) {
    let mut session = store.session().unwrap();
    for number in 0..=255u8 {
        let key = key_of(number);
        assert_eq!(
            read_now(&mut session, &key),
            model.get(&key).cloned(),
            "key {number}"
        );
    }
}

/// Two generations: write, checkpoint, write more, crash, recover, check;
/// then the same again on the recovered store.
fn crash_and_recover_twice(device: Arc<dyn Device>) {
    crash_and_recover_twice_with(StoreConfig::smallest(), device);
}

fn crash_and_recover_twice_with(config: StoreConfig, device: Arc<dyn Device>) {
    let mut model = Model::new();
    let mut at_checkpoint = Model::new();
    let mut store = Store::new(config.clone(), device.clone()).unwrap();
    for generation in 0..2u64 {
        {
            let mut session = store.session().unwrap();
            at_checkpoint = apply(&mut session, &mut model, &random_ops(700, generation), 300);
        }
        drop(store);
        let (recovered, record) = Store::recover(config.clone(), device.clone()).unwrap();
        assert_eq!(record.sequence, 2 * (generation + 1));
        check_recovered(&recovered, &at_checkpoint);
        model = at_checkpoint.clone();
        store = recovered;
    }
    let _ = at_checkpoint;
}

#[test]
fn the_memory_device_recovers_every_checkpointed_write() {
    crash_and_recover_twice(Arc::new(MemoryDevice::new(16 << 20)));
}

#[test]
fn the_file_device_recovers_every_checkpointed_write() {
    let opened = OpenDevice::open(DeviceKind::File, 16 << 20, 6, &FileSettings::default()).unwrap();
    crash_and_recover_twice(opened.device.clone());
}

#[test]
fn far_memory_behind_cowbird_recovers_every_checkpointed_write() {
    let opened = OpenDevice::open(
        DeviceKind::CowbirdSpot,
        16 << 20,
        6,
        &FileSettings::default(),
    )
    .unwrap();
    crash_and_recover_twice(opened.device.clone());
    opened.stop().unwrap();
}

/// Recovery reads whole pages; a page larger than a one-sided queue's
/// landing slot (64 KiB) is read in pieces.
#[test]
fn far_memory_with_pages_larger_than_a_landing_slot_recovers() {
    use remora_kv::device::{FarMemoryDevice, FarMemoryPath};
    let config = StoreConfig {
        page_bits: 18,
        ..StoreConfig::smallest()
    };
    for path in [FarMemoryPath::OneSidedAsync, FarMemoryPath::OneSidedSync] {
        let device = Arc::new(FarMemoryDevice::start(path, 16 << 20, 6).unwrap());
        crash_and_recover_twice_with(config.clone(), device.clone());
        device.stop().unwrap();
    }
}

#[test]
fn a_device_without_a_checkpoint_says_so() {
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(16 << 20));
    let error = Store::recover(StoreConfig::smallest(), device)
        .err()
        .unwrap();
    assert!(
        matches!(error, KvError::Checkpoint(CheckpointError::NoCheckpoint)),
        "{error}"
    );
}

/// A checkpoint record whose CRC holds but whose log ends before it
/// begins, or is longer than the device, is refused by name: the first
/// underflowed the room arithmetic (every write then failed, or a debug
/// build panicked), the second scanned for hours. So is one whose begin
/// or tail is not a page start, or whose tail is page 0's start (the
/// store never writes such; found by reading): from a tail of 0 the
/// first record went to address 0, the null address, and its write
/// returned done but read back as absent; from a tail inside a page, the
/// index rebuild skipped the page's records and the next recovery found
/// a zeroed hole.
#[test]
fn a_checkpoint_record_naming_an_impossible_log_is_refused() {
    use remora_kv::address::LogAddress;
    use remora_kv::checkpoint::{write_now, CheckpointRecord};
    let config = StoreConfig::smallest();
    let page_bytes = 1u64 << config.page_bits;
    for (begin, tail) in [
        (0x1_0000_0000, 0x10040),
        (0, 1 << 47),
        (0, 0),
        (0, 2 * page_bytes + 100),
        (64, 2 * page_bytes),
    ] {
        let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(16 << 20));
        let record = CheckpointRecord {
            sequence: 1,
            page_bits: config.page_bits,
            begin: LogAddress::new(begin),
            tail: LogAddress::new(tail),
        };
        let mut queue = device.open_queue().unwrap();
        write_now(queue.as_mut(), record.slot_offset(), &record.encode()).unwrap();
        drop(queue);
        let error = Store::recover(config.clone(), device).err().unwrap();
        assert!(
            matches!(
                error,
                KvError::Checkpoint(CheckpointError::ImpossibleLog { .. })
            ),
            "{error}"
        );
    }
}

/// Writers keep incrementing while a checkpoint is taken: each counter
/// comes back at least at what was acknowledged before the checkpoint
/// began, and at most one past what was acknowledged when it ended.
#[test]
fn a_checkpoint_taken_under_concurrent_writes_holds_what_was_acknowledged() {
    const KEYS: u64 = 64;
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(64 << 20));
    let store = Store::new(StoreConfig::smallest(), device.clone()).unwrap();
    let acknowledged: Arc<Vec<AtomicU64>> =
        Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|thread| {
            let (store, acknowledged, stop) = (store.clone(), acknowledged.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut session = store.session().unwrap();
                while !stop.load(Ordering::Relaxed) {
                    for key in (thread..KEYS).step_by(2) {
                        let value =
                            rmw_now(&mut session, &key.to_le_bytes(), Update::AddToCounter(1))
                                .unwrap();
                        let count = u64::from_le_bytes(value[..8].try_into().unwrap());
                        acknowledged[key as usize].store(count, Ordering::SeqCst);
                    }
                    session
                        .upsert(&(1000 + thread).to_le_bytes(), &[7; 900])
                        .unwrap();
                }
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(50));
    let snapshot = |counts: &Vec<AtomicU64>| -> Vec<u64> {
        counts.iter().map(|c| c.load(Ordering::SeqCst)).collect()
    };
    let before = snapshot(&acknowledged);
    store.session().unwrap().checkpoint().unwrap();
    let after = snapshot(&acknowledged);
    std::thread::sleep(std::time::Duration::from_millis(20));
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.join().unwrap();
    }
    drop(store);
    let (recovered, _) = Store::recover(StoreConfig::smallest(), device).unwrap();
    let mut session = recovered.session().unwrap();
    for key in 0..KEYS {
        let value = read_now(&mut session, &key.to_le_bytes()).expect("every counter was written");
        let count = u64::from_le_bytes(value[..8].try_into().unwrap());
        let (low, high) = (before[key as usize], after[key as usize] + 1);
        assert!(
            low <= count && count <= high,
            "key {key}: {count} outside [{low}, {high}]"
        );
    }
}

/// A refused INCR (a value that is not an integer, or one that would
/// overflow) had already taken room at the tail for its new record, and
/// left that room unwritten: the next checkpoint's recovery then read the
/// gap as records and stopped with a corrupt log. The room now reads as an
/// invalid record, so every key written around it comes back.
#[test]
fn a_refused_increment_leaves_a_log_that_recovers() {
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(16 << 20));
    let store = Store::new(StoreConfig::smallest(), device.clone()).unwrap();
    let mut session = store.session().unwrap();
    let mut model = Model::new();
    let mut write = |session: &mut Session, key: &[u8], value: &[u8]| {
        session.upsert(key, value).unwrap();
        model.insert(key.to_vec(), value.to_vec());
    };
    write(&mut session, b"word", b"remora");
    write(&mut session, b"largest", b"9223372036854775807");
    for (key, refusal) in [
        (&b"word"[..], UpdateError::NotAnInteger),
        (b"largest", UpdateError::Overflow),
    ] {
        match rmw_now(&mut session, key, Update::AddToDecimal(1)) {
            Err(KvError::Update(error)) => assert_eq!(error, refusal),
            other => panic!("{key:?}: {other:?}"),
        }
    }
    for number in 0..=255u8 {
        write(&mut session, &key_of(number), &value_of(number, 40, 1));
    }
    session.checkpoint().unwrap();
    drop(session);
    drop(store);
    let (recovered, _) = Store::recover(StoreConfig::smallest(), device).unwrap();
    let mut session = recovered.session().unwrap();
    for (key, value) in &model {
        assert_eq!(read_now(&mut session, key).as_ref(), Some(value), "{key:?}");
    }
}

/// A checkpoint whose log pages never reached the device (a lost write:
/// the pages read as zeros). Recovery took the zeros for records of an
/// empty key and came back with a store that had lost them silently;
/// every record now carries a written mark, and the lost page is named.
#[test]
fn a_log_page_that_never_reached_the_device_is_refused() {
    use remora_kv::address::LogAddress;
    use remora_kv::checkpoint::{write_now, CheckpointRecord};
    let config = StoreConfig::smallest();
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(16 << 20));
    let record = CheckpointRecord {
        sequence: 1,
        page_bits: config.page_bits,
        begin: LogAddress::new(0),
        tail: LogAddress::page_start(2, config.page_bits),
    };
    let mut queue = device.open_queue().unwrap();
    write_now(queue.as_mut(), record.slot_offset(), &record.encode()).unwrap();
    drop(queue);
    let error = Store::recover(config, device).err().unwrap();
    assert!(
        matches!(
            error,
            KvError::Checkpoint(CheckpointError::CorruptLog { .. })
        ),
        "{error}"
    );
}

/// A new store left the slots of an earlier store's checkpoints as they
/// were. After a run that took two checkpoints, a new run on the same
/// device took one (sequence 1, in the slot of the old sequence 1), and
/// its recovery took the old run's sequence 2: the old bounds over the
/// new run's pages, a key written and checkpointed by the new run lost.
/// A new store wipes both slots first.
#[test]
fn a_new_store_never_recovers_an_earlier_stores_checkpoint() {
    let device: Arc<dyn Device> = Arc::new(MemoryDevice::new(16 << 20));
    let config = StoreConfig::smallest();
    {
        let store = Store::new(config.clone(), device.clone()).unwrap();
        let mut session = store.session().unwrap();
        session.upsert(b"old", b"first run").unwrap();
        session.checkpoint().unwrap();
        session.checkpoint().unwrap();
    }
    {
        let store = Store::new(config.clone(), device.clone()).unwrap();
        let mut session = store.session().unwrap();
        session.upsert(b"new", b"second run").unwrap();
        assert_eq!(session.checkpoint().unwrap().sequence, 1);
    }
    let (recovered, record) = Store::recover(config.clone(), device.clone()).unwrap();
    assert_eq!(record.sequence, 1, "the second run's checkpoint");
    let mut session = recovered.session().unwrap();
    assert_eq!(read_now(&mut session, b"new"), Some(b"second run".to_vec()));
    assert_eq!(read_now(&mut session, b"old"), None);
    drop(session);
    // A new store with no checkpoint of its own recovers nothing.
    drop(Store::new(config.clone(), device.clone()).unwrap());
    let error = Store::recover(config, device).err().unwrap();
    assert!(matches!(
        error,
        KvError::Checkpoint(CheckpointError::NoCheckpoint)
    ));
}
