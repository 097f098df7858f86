//! What the store's tests share: a small store, operations that wait
//! for the device, and a check of random operations against a map.
#![allow(dead_code)]

use proptest::prelude::*;
use remora_kv::*;
use std::collections::HashMap;
use std::sync::Arc;

/// The smallest store, on 8 MiB of memory device.
pub fn smallest_store_in_memory() -> Store {
    Store::new(
        StoreConfig::smallest(),
        Arc::new(MemoryDevice::new(8 << 20)),
    )
    .unwrap()
}

pub fn read_now(session: &mut Session, key: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    match session.read(key, &mut out, 7).unwrap() {
        Status::Found => Some(out),
        Status::NotFound => None,
        Status::Pending => {
            let mut answer = None;
            session
                .complete_pending(true, &mut |completion| {
                    assert_eq!(completion.context, 7);
                    answer = match completion.result.unwrap() {
                        Status::Found => Some(Some(completion.value.to_vec())),
                        Status::NotFound => Some(None),
                        other => panic!("a read completed as {other:?}"),
                    };
                })
                .unwrap();
            answer.expect("the pending read completed")
        }
        other => panic!("a read returned {other:?}"),
    }
}

pub fn rmw_now(session: &mut Session, key: &[u8], update: Update) -> Result<Vec<u8>, KvError> {
    let mut out = Vec::new();
    match session.rmw(key, update, &mut out, 9)? {
        Status::Found | Status::NotFound => Ok(out),
        Status::Pending => {
            let mut answer = None;
            session.complete_pending(true, &mut |completion| {
                answer = Some(completion.result.map(|_| completion.value.to_vec()));
            })?;
            answer.expect("the pending RMW completed")
        }
        other => panic!("an RMW returned {other:?}"),
    }
}

#[derive(Debug, Clone)]
pub enum Op {
    Upsert(u8, usize),
    Read(u8),
    Delete(u8),
    Increment(u8),
}

pub fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<u8>(), 0usize..300).prop_map(|(k, n)| Op::Upsert(k, n)),
        4 => any::<u8>().prop_map(Op::Read),
        1 => any::<u8>().prop_map(Op::Delete),
        2 => any::<u8>().prop_map(Op::Increment),
    ]
}

/// `count` random operations, the same for the same seed.
pub fn random_ops(count: usize, seed: u64) -> Vec<Op> {
    use proptest::strategy::ValueTree;
    let config = proptest::test_runner::Config::default();
    let rng = proptest::test_runner::TestRng::from_seed(
        proptest::test_runner::RngAlgorithm::ChaCha,
        &[seed as u8; 32],
    );
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(config, rng);
    prop::collection::vec(op(), count)
        .new_tree(&mut runner)
        .unwrap()
        .current()
}

/// The map a store's contents are checked against.
pub type Model = HashMap<Vec<u8>, Vec<u8>>;

/// Applies `op` (number `step` of a run) to the store and the model,
/// checking every read and read-modify-write against the model.
pub fn apply_op(session: &mut Session, model: &mut Model, op: &Op, step: usize) {
    match *op {
        Op::Upsert(k, length) => {
            let value = value_of(k, length, step);
            assert_eq!(session.upsert(&key_of(k), &value).unwrap(), Status::Done);
            model.insert(key_of(k), value);
        }
        Op::Read(k) => assert_eq!(
            read_now(session, &key_of(k)),
            model.get(&key_of(k)).cloned(),
            "step {step}: read of key {k}"
        ),
        Op::Delete(k) => {
            session.delete(&key_of(k)).unwrap();
            model.remove(&key_of(k));
        }
        Op::Increment(k) => {
            let mut expected = Vec::new();
            Update::AddToCounter(1)
                .apply(model.get(&key_of(k)).map(Vec::as_slice), &mut expected)
                .unwrap();
            let got = rmw_now(session, &key_of(k), Update::AddToCounter(1)).unwrap();
            assert_eq!(got, expected, "step {step}: RMW of key {k}");
            model.insert(key_of(k), got);
        }
    }
}

pub fn key_of(number: u8) -> Vec<u8> {
    format!("key-{number}").into_bytes()
}

pub fn value_of(number: u8, length: usize, step: usize) -> Vec<u8> {
    (0..length)
        .map(|i| (i + step + number as usize) as u8)
        .collect()
}

/// Runs `ops` against the store and a map, checking every read and RMW.
/// Returns the session's counters.
pub fn check_against_model(device: Arc<dyn Device>, ops: &[Op]) -> SessionStats {
    check_against_model_with(StoreConfig::smallest(), device, ops)
}

/// [`check_against_model`] on a store of `config`.
pub fn check_against_model_with(
    config: StoreConfig,
    device: Arc<dyn Device>,
    ops: &[Op],
) -> SessionStats {
    let store = Store::new(config, device).unwrap();
    let mut session = store.session().unwrap();
    let mut model = Model::new();
    for (step, op) in ops.iter().enumerate() {
        apply_op(&mut session, &mut model, op, step);
    }
    assert_first_keys(&mut session, &model, EVERY_KEY);
    session.stats()
}

/// Every key the operations can name: numbers 0 to 255.
pub const EVERY_KEY: u16 = 256;

/// Keys `0..count` read back as the model holds them.
pub fn assert_first_keys(session: &mut Session, model: &Model, count: u16) {
    for number in 0..count {
        let key = key_of(number as u8);
        assert_eq!(
            read_now(session, &key),
            model.get(&key).cloned(),
            "key {number}"
        );
    }
}
