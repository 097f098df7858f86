//! Clover's client operations against a plain memory model, with many
//! writers and readers interleaved at random: every write is linked
//! exactly once, in each writer's order, the version list is never broken
//! or cyclic, a reader never goes back in time, and the whole history of
//! the key is linearizable as a register, by stateright's
//! `LinearizabilityTester` (a checker nobody here wrote).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use remora_clover::client::{
    ClientError, Lookup, Outcome, ReadOperation, Step, Thresholds, Verb, WriteOperation, MAX_HOPS,
};
use remora_clover::layout::{decode_entry, encode_entry, size_class, NextPointer};
use stateright::semantics::register::{Register, RegisterOp, RegisterRet};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester};
use std::collections::{HashMap, HashSet};

const KEY: u64 = 42;
const FIRST: u64 = 64;
/// The key's shortcut word: writers move it to their entries.
const SHORTCUT: u64 = 8;

fn lookup(cached: NextPointer) -> Lookup {
    Lookup {
        key: KEY,
        cached: Some(cached),
        shortcut: SHORTCUT,
        thresholds: Thresholds::DEFAULT,
    }
}

/// The memory node's region; every verb is atomic, as on one RNIC.
struct Region(Vec<u8>);

impl Region {
    fn execute(&mut self, verb: Verb) -> Outcome {
        match verb {
            Verb::Read { offset, length } => {
                Outcome::Read(self.0[offset as usize..][..length].to_vec())
            }
            Verb::Write { offset, bytes } => {
                self.0[offset as usize..][..bytes.len()].copy_from_slice(&bytes);
                Outcome::Written
            }
            Verb::CompareSwap {
                offset,
                expect,
                swap,
            } => {
                let at = offset as usize..offset as usize + 8;
                let original = u64::from_le_bytes(self.0[at.clone()].try_into().unwrap());
                if original == expect {
                    self.0[at].copy_from_slice(&swap.to_le_bytes());
                }
                Outcome::Swapped { original }
            }
        }
    }

    /// The metadata server's answer: the tail, walked from the start.
    fn locate(&self) -> NextPointer {
        let mut pointer = NextPointer::new(FIRST, 0, true).unwrap();
        loop {
            let entry = decode_entry(&self.0[pointer.offset() as usize..][..64]).unwrap();
            if entry.next.is_null() {
                return pointer;
            }
            pointer = entry.next;
        }
    }

    /// Walks the list from the first version: values in order, refusing a
    /// cycle or a foreign key.
    fn versions(&self) -> Vec<Vec<u8>> {
        let mut seen = HashSet::new();
        let mut offset = FIRST;
        let mut values = Vec::new();
        loop {
            assert!(seen.insert(offset), "the list is cyclic at {offset:#x}");
            let entry = decode_entry(&self.0[offset as usize..offset as usize + 64])
                .expect("a whole entry");
            assert_eq!(entry.key, KEY);
            values.push(entry.value.to_vec());
            if entry.next.is_null() {
                return values;
            }
            offset = entry.next.offset();
        }
    }
}

enum Operation {
    Write {
        writer: usize,
        machine: WriteOperation,
    },
    Read {
        reader: usize,
        machine: ReadOperation,
    },
}

fn value_of(writer: usize, sequence: usize) -> Vec<u8> {
    format!("w{writer:02}-{sequence:04}").into_bytes()
}

/// Runs `writers` writers of `writes` each and `readers` readers, one verb
/// at a time in a random order.
fn run(seed: u64, writers: usize, writes: usize, readers: usize, check_linearizable: bool) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut region = Region(vec![0; 1 << 20]);
    encode_entry(KEY, b"initial!", &mut region.0[FIRST as usize..]).unwrap();
    let first = NextPointer::new(FIRST, 0, true).unwrap();
    region.0[SHORTCUT as usize..][..8].copy_from_slice(&first.word().to_le_bytes());
    let class = size_class(16).unwrap() as u64;
    let mut next_slot = FIRST + class;
    let mut cached = vec![first; writers + readers];
    let mut done = vec![0usize; writers];
    let mut reads_seen: Vec<Vec<Vec<u8>>> = vec![Vec::new(); readers];
    // A verb to execute, or None for a metadata lookup.
    let mut active: Vec<(Operation, Option<Verb>)> = Vec::new();
    let mut conflicts = 0;
    // Recorded only where it will be checked: the tester's bookkeeping
    // grows with every thread's history.
    let mut history =
        check_linearizable.then(|| LinearizabilityTester::new(Register(b"initial!".to_vec())));
    let start_write = |writer: usize, sequence: usize, slot: u64, cache: NextPointer| {
        let value = value_of(writer, sequence);
        let machine = WriteOperation::new(lookup(cache), &value, slot).unwrap();
        let Step::Issue(verb) = machine.start() else {
            unreachable!()
        };
        (Operation::Write { writer, machine }, Some(verb))
    };
    for (writer, cache) in cached.iter().enumerate().take(writers) {
        if let Some(history) = history.as_mut() {
            history
                .on_invoke(writer, RegisterOp::Write(value_of(writer, 0)))
                .unwrap();
        }
        active.push(start_write(writer, 0, next_slot, *cache));
        next_slot += class;
    }
    for reader in 0..readers {
        if let Some(history) = history.as_mut() {
            history
                .on_invoke(writers + reader, RegisterOp::Read)
                .unwrap();
        }
        let mut machine = ReadOperation::new(lookup(cached[writers + reader]), 64);
        let Step::Issue(verb) = machine.start().unwrap() else {
            unreachable!()
        };
        active.push((Operation::Read { reader, machine }, Some(verb)));
    }
    // Bounded: every step either finishes an operation or advances one,
    // and chases are bounded by MAX_HOPS inside the machines.
    let mut steps = 0u64;
    while !active.is_empty() {
        steps += 1;
        assert!(steps < 10_000_000, "seed {seed}: no progress");
        let index = rng.gen_range(0..active.len());
        let (mut operation, verb) = active.swap_remove(index);
        let outcome = match verb {
            Some(verb) => region.execute(verb),
            None => Outcome::Located(region.locate()),
        };
        let step = match &mut operation {
            Operation::Write { machine, .. } => machine.handle(outcome),
            Operation::Read { machine, .. } => machine.handle(outcome),
        }
        .unwrap_or_else(|error| panic!("seed {seed}: {error}"));
        match (operation, step) {
            (operation, Step::Issue(verb)) => active.push((operation, Some(verb))),
            (operation, Step::Locate { .. }) => active.push((operation, None)),
            (Operation::Write { writer, .. }, Step::Written { tail, trail }) => {
                conflicts += trail.conflicts;
                if let Some(history) = history.as_mut() {
                    history.on_return(writer, RegisterRet::WriteOk).unwrap();
                }
                cached[writer] = tail;
                done[writer] += 1;
                if done[writer] < writes {
                    if let Some(history) = history.as_mut() {
                        history
                            .on_invoke(writer, RegisterOp::Write(value_of(writer, done[writer])))
                            .unwrap();
                    }
                    active.push(start_write(writer, done[writer], next_slot, cached[writer]));
                    next_slot += class;
                }
            }
            (Operation::Read { reader, .. }, Step::Value { tail, value, .. }) => {
                cached[writers + reader] = tail;
                if let Some(history) = history.as_mut() {
                    history
                        .on_return(writers + reader, RegisterRet::ReadOk(value.clone()))
                        .unwrap();
                }
                reads_seen[reader].push(value);
                // Readers keep reading while writers write.
                if done.iter().any(|count| *count < writes) {
                    if let Some(history) = history.as_mut() {
                        history
                            .on_invoke(writers + reader, RegisterOp::Read)
                            .unwrap();
                    }
                    let mut machine = ReadOperation::new(lookup(tail), 64);
                    let Step::Issue(verb) = machine.start().unwrap() else {
                        unreachable!()
                    };
                    active.push((Operation::Read { reader, machine }, Some(verb)));
                }
            }
            _ => panic!("seed {seed}: a step of the wrong kind"),
        }
    }
    // The tester's search grows quickly with concurrency: it checks the
    // smaller configurations.
    if let Some(history) = &history {
        assert!(
            history.is_consistent(),
            "seed {seed}: the history is not linearizable"
        );
    }
    let versions = region.versions();
    assert_eq!(
        versions.len(),
        1 + writers * writes,
        "seed {seed}: every write linked exactly once"
    );
    let position: HashMap<&Vec<u8>, usize> = versions
        .iter()
        .enumerate()
        .map(|(index, value)| (value, index))
        .collect();
    assert_eq!(
        position.len(),
        versions.len(),
        "seed {seed}: no value linked twice"
    );
    for writer in 0..writers {
        let order: Vec<usize> = (0..writes)
            .map(|sequence| position[&value_of(writer, sequence)])
            .collect();
        assert!(
            order.windows(2).all(|pair| pair[0] < pair[1]),
            "seed {seed}: writer {writer}'s writes out of order"
        );
    }
    for (reader, values) in reads_seen.iter().enumerate() {
        let order: Vec<usize> = values.iter().map(|value| position[value]).collect();
        assert!(
            order.windows(2).all(|pair| pair[0] <= pair[1]),
            "seed {seed}: reader {reader} went back in time"
        );
    }
    if writers > 1 && writes > 4 {
        assert!(
            conflicts > 0,
            "seed {seed}: contended writers never conflicted; the test would prove nothing"
        );
    }
}

#[test]
fn one_writer_appends_in_order() {
    run(1, 1, 50, 0, true);
}

#[test]
fn contended_writers_and_readers_keep_the_list_whole_across_seeds() {
    for seed in 0..200 {
        run(seed, 8, 10, 3, false);
    }
}

#[test]
fn histories_of_contended_writers_and_readers_are_linearizable() {
    for seed in 0..40 {
        run(seed, 3, 4, 2, true);
    }
}

#[test]
fn a_cyclic_list_is_reported_not_followed_forever() {
    let mut region = Region(vec![0; 4096]);
    encode_entry(KEY, b"looping!", &mut region.0[FIRST as usize..]).unwrap();
    let itself = NextPointer::new(FIRST, 1, true).unwrap();
    region.0[FIRST as usize..FIRST as usize + 8].copy_from_slice(&itself.word().to_le_bytes());
    let mut read = ReadOperation::new(
        Lookup {
            thresholds: Thresholds::new(MAX_HOPS + 1, MAX_HOPS + 2).unwrap(),
            ..lookup(itself)
        },
        64,
    );
    let mut step = read.start().unwrap();
    let error = loop {
        let Step::Issue(verb) = step else {
            panic!("a cyclic list has no tail")
        };
        match read.handle(region.execute(verb)) {
            Ok(next) => step = next,
            Err(error) => break error,
        }
    };
    assert_eq!(error, ClientError::TooManyHops);
}

#[test]
fn an_entry_of_another_key_in_the_chain_is_a_broken_list() {
    let mut region = Region(vec![0; 4096]);
    encode_entry(KEY + 1, b"stranger", &mut region.0[FIRST as usize..]).unwrap();
    let mut read = ReadOperation::new(lookup(NextPointer::new(FIRST, 0, true).unwrap()), 64);
    let Step::Issue(verb) = read.start().unwrap() else {
        unreachable!()
    };
    assert!(matches!(
        read.handle(region.execute(verb)),
        Err(ClientError::WrongKey { .. })
    ));
}

/// A linked write points the key's shortcut at its entry before it
/// reports, so a reader with no cached location starts at the tail.
#[test]
fn a_linked_write_moves_the_shortcut_to_its_entry() {
    let mut region = Region(vec![0; 1 << 16]);
    encode_entry(KEY, b"initial!", &mut region.0[FIRST as usize..]).unwrap();
    let first = NextPointer::new(FIRST, 0, true).unwrap();
    region.0[SHORTCUT as usize..][..8].copy_from_slice(&first.word().to_le_bytes());
    let slot = FIRST + size_class(16).unwrap() as u64;
    let mut machine = WriteOperation::new(lookup(first), &value_of(0, 1), slot).unwrap();
    let mut step = machine.start();
    let mut verbs = 0;
    let tail = loop {
        match step {
            Step::Issue(verb) => {
                verbs += 1;
                step = machine.handle(region.execute(verb)).unwrap();
            }
            Step::Written { tail, .. } => break tail,
            other => panic!("unexpected {other:?}"),
        }
    };
    // The entry, the CAS, the shortcut.
    assert_eq!(verbs, 3);
    assert_eq!(tail.offset(), slot);
    let shortcut = u64::from_le_bytes(region.0[SHORTCUT as usize..][..8].try_into().unwrap());
    assert_eq!(NextPointer::from_word(shortcut).offset(), slot);
}
