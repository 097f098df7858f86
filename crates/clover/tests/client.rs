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
        cached: Some(cached),
        ..forgotten()
    }
}

/// A lookup with no cached location: the chase starts from the shortcut
/// alone.
fn forgotten() -> Lookup {
    Lookup {
        key: KEY,
        cached: None,
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

    /// Executes a step's verbs (a pair one after the other) and returns
    /// what the operation is handed.
    fn answer(&mut self, step: Step) -> Outcome {
        let verbs = step.into_verbs().expect("verbs to execute");
        Outcome::gathered(verbs.into_iter().map(|verb| self.execute(verb)).collect())
    }

    /// Writes entries of `KEY` at `offsets`, each pointing at the next,
    /// and the shortcut naming `shortcut`: a list as writers leave it.
    fn with_list(offsets: &[u64], shortcut: u64) -> Region {
        let mut region = Region(vec![0; 1 << 16]);
        for (index, offset) in offsets.iter().enumerate() {
            let value = format!("version{index}");
            encode_entry(KEY, value.as_bytes(), &mut region.0[*offset as usize..]).unwrap();
            if let Some(next) = offsets.get(index + 1) {
                let pointer = NextPointer::new(*next, index as u16 + 1, true).unwrap();
                region.0[*offset as usize..][..8].copy_from_slice(&pointer.word().to_le_bytes());
            }
        }
        let pointer = NextPointer::new(shortcut, 0, true).unwrap();
        region.0[SHORTCUT as usize..][..8].copy_from_slice(&pointer.word().to_le_bytes());
        region
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

/// What an operation waits for: its verbs (one, or a pair executed one
/// at a time, in either order, as the memory node may take them), or a
/// metadata lookup.
enum Work {
    Verbs {
        left: Vec<(usize, Verb)>,
        landed: Vec<Option<Outcome>>,
    },
    Locate,
}

impl Work {
    fn of(step: Step) -> Work {
        if let Step::Locate { .. } = step {
            return Work::Locate;
        }
        let verbs = step.into_verbs().expect("a step with work");
        Work::Verbs {
            landed: vec![None; verbs.len()],
            left: verbs.into_iter().enumerate().collect(),
        }
    }

    /// Executes one verb, or the lookup: the operation's outcome once
    /// everything it waits for has landed.
    fn execute(&mut self, region: &mut Region, rng: &mut ChaCha8Rng) -> Option<Outcome> {
        let Work::Verbs { left, landed } = self else {
            return Some(Outcome::Located(region.locate()));
        };
        let (position, verb) = left.swap_remove(rng.gen_range(0..left.len()));
        landed[position] = Some(region.execute(verb));
        if !left.is_empty() {
            return None;
        }
        Some(Outcome::gathered(landed.drain(..).flatten().collect()))
    }
}

enum Operation {
    /// A linked write's shortcut WRITE, in the background.
    Shortcut,
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
    let mut active: Vec<(Operation, Work)> = Vec::new();
    let mut conflicts = 0;
    // Recorded only where it will be checked: the tester's bookkeeping
    // grows with every thread's history.
    let mut history =
        check_linearizable.then(|| LinearizabilityTester::new(Register(b"initial!".to_vec())));
    // A quarter of the operations start with no cached location, from
    // the shortcut alone, which late shortcut WRITEs leave behind.
    let lookup_for = |cached: NextPointer, rng: &mut ChaCha8Rng| match rng.gen_bool(0.25) {
        true => forgotten(),
        false => lookup(cached),
    };
    let start_write = |writer: usize, sequence: usize, slot: u64, lookup: Lookup| {
        let value = value_of(writer, sequence);
        let machine = WriteOperation::new(lookup, &value, slot).unwrap();
        let work = Work::of(machine.start());
        (Operation::Write { writer, machine }, work)
    };
    for (writer, cache) in cached.iter().enumerate().take(writers) {
        if let Some(history) = history.as_mut() {
            history
                .on_invoke(writer, RegisterOp::Write(value_of(writer, 0)))
                .unwrap();
        }
        active.push(start_write(
            writer,
            0,
            next_slot,
            lookup_for(*cache, &mut rng),
        ));
        next_slot += class;
    }
    for reader in 0..readers {
        if let Some(history) = history.as_mut() {
            history
                .on_invoke(writers + reader, RegisterOp::Read)
                .unwrap();
        }
        let start = lookup_for(cached[writers + reader], &mut rng);
        let mut machine = ReadOperation::new(start, 64);
        let work = Work::of(machine.start().unwrap());
        active.push((Operation::Read { reader, machine }, work));
    }
    // Bounded: every step either finishes an operation or advances one,
    // and chases are bounded by MAX_HOPS inside the machines.
    let mut steps = 0u64;
    while !active.is_empty() {
        steps += 1;
        assert!(steps < 10_000_000, "seed {seed}: no progress");
        let index = rng.gen_range(0..active.len());
        let (mut operation, mut work) = active.swap_remove(index);
        let Some(outcome) = work.execute(&mut region, &mut rng) else {
            active.push((operation, work));
            continue;
        };
        let step = match &mut operation {
            Operation::Shortcut => continue,
            Operation::Write { machine, .. } => machine.handle(outcome),
            Operation::Read { machine, .. } => machine.handle(outcome),
        }
        .unwrap_or_else(|error| panic!("seed {seed}: {error}"));
        match (operation, step) {
            (operation, step @ (Step::Issue(_) | Step::IssueBoth(_) | Step::Locate { .. })) => {
                active.push((operation, Work::of(step)))
            }
            (
                Operation::Write { writer, .. },
                Step::Written {
                    tail,
                    trail,
                    shortcut,
                },
            ) => {
                // The shortcut lands in the background, at any later step.
                active.push((Operation::Shortcut, Work::of(Step::Issue(shortcut))));
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
                    let start = lookup_for(cached[writer], &mut rng);
                    active.push(start_write(writer, done[writer], next_slot, start));
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
                    let mut machine = ReadOperation::new(lookup_for(tail, &mut rng), 64);
                    let work = Work::of(machine.start().unwrap());
                    active.push((Operation::Read { reader, machine }, work));
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
        if !matches!(step, Step::Issue(_) | Step::IssueBoth(_)) {
            panic!("a cyclic list has no tail")
        }
        match read.handle(region.answer(step)) {
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
    let step = read.start().unwrap();
    assert!(matches!(
        read.handle(region.answer(step)),
        Err(ClientError::WrongKey { .. })
    ));
}

/// A linked write returns once its CAS links it, and hands back the
/// WRITE that moves the key's shortcut to its entry, to go out in the
/// background (as Clover's collection thread sends it).
#[test]
fn a_linked_write_returns_at_its_cas_and_hands_back_its_shortcut() {
    let mut region = Region::with_list(&[FIRST], FIRST);
    let first = NextPointer::new(FIRST, 0, true).unwrap();
    let slot = FIRST + size_class(16).unwrap() as u64;
    let mut machine = WriteOperation::new(lookup(first), &value_of(0, 1), slot).unwrap();
    let mut step = machine.start();
    let mut round_trips = 0;
    let (tail, shortcut) = loop {
        match step {
            Step::Written { tail, shortcut, .. } => break (tail, shortcut),
            other => {
                round_trips += 1;
                step = machine.handle(region.answer(other)).unwrap();
            }
        }
    };
    // The entry and the CAS.
    assert_eq!(round_trips, 2);
    assert_eq!(tail.offset(), slot);
    assert_eq!(
        region.versions().len(),
        2,
        "linked before the shortcut moved"
    );
    region.execute(shortcut);
    let word = u64::from_le_bytes(region.0[SHORTCUT as usize..][..8].try_into().unwrap());
    assert_eq!(NextPointer::from_word(word).offset(), slot);
}

/// The verbs an operation issues, round trip by round trip, until it
/// finishes: each round trip's READ offsets (a pair gives two), or the
/// CAS's or WRITE's offset.
fn offsets_until_done(
    region: &mut Region,
    mut step: Step,
    mut handle: impl FnMut(Outcome) -> Step,
) -> Vec<Vec<u64>> {
    let offset = |verb: &Verb| match verb {
        Verb::Read { offset, .. } | Verb::Write { offset, .. } => *offset,
        Verb::CompareSwap { offset, .. } => *offset,
    };
    let mut trips = Vec::new();
    for _ in 0..64 {
        match &step {
            Step::Issue(verb) => trips.push(vec![offset(verb)]),
            Step::IssueBoth(both) => trips.push(both.iter().map(offset).collect()),
            _ => return trips,
        }
        step = handle(region.answer(step));
    }
    panic!("no end after 64 round trips");
}

/// A read from a stale cached location reads the entry and the
/// shortcut together, and goes on from the shortcut: two round trips to
/// the tail three versions on, not four hops.
#[test]
fn a_stale_read_jumps_to_the_shortcut_read_beside_its_first_entry() {
    let list = [FIRST, FIRST + 128, FIRST + 256, FIRST + 384];
    let mut region = Region::with_list(&list, list[3]);
    let mut read = ReadOperation::new(lookup(NextPointer::new(FIRST, 0, true).unwrap()), 64);
    let start = read.start().unwrap();
    let trips = offsets_until_done(&mut region, start, |outcome| read.handle(outcome).unwrap());
    assert_eq!(trips, vec![vec![FIRST, SHORTCUT], vec![list[3]]]);
    // A cached tail costs one round trip.
    let mut read = ReadOperation::new(lookup(NextPointer::new(list[3], 3, true).unwrap()), 64);
    let start = read.start().unwrap();
    let trips = offsets_until_done(&mut region, start, |outcome| read.handle(outcome).unwrap());
    assert_eq!(trips, vec![vec![list[3], SHORTCUT]]);
    // A shortcut naming the entry just read is not read again: the chase
    // follows the entry's next pointer.
    let mut region = Region::with_list(&list, FIRST);
    let mut read = ReadOperation::new(lookup(NextPointer::new(FIRST, 0, true).unwrap()), 64);
    let start = read.start().unwrap();
    let trips = offsets_until_done(&mut region, start, |outcome| read.handle(outcome).unwrap());
    assert_eq!(
        trips,
        vec![
            vec![FIRST, SHORTCUT],
            vec![list[1]],
            vec![list[2]],
            vec![list[3]]
        ]
    );
    // A shortcut behind the cursor (its WRITE late) is jumped to all the
    // same, as Clover does, and costs the hops back.
    let mut read = ReadOperation::new(lookup(NextPointer::new(list[2], 2, true).unwrap()), 64);
    let start = read.start().unwrap();
    let trips = offsets_until_done(&mut region, start, |outcome| read.handle(outcome).unwrap());
    assert_eq!(
        trips,
        vec![
            vec![list[2], SHORTCUT],
            vec![FIRST],
            vec![list[1]],
            vec![list[2]],
            vec![list[3]]
        ]
    );
}

/// A write that loses its CAS chases again from where it failed, as
/// Clover's client does (the word the CAS returned is not used): the
/// failed entry and the shortcut together, then the shortcut's entry,
/// then the CAS there. A conflict costs three round trips.
#[test]
fn a_lost_cas_chases_again_from_where_it_failed_with_the_shortcut() {
    let winner = FIRST + 128;
    let mut region = Region::with_list(&[FIRST, winner], winner);
    let slot = FIRST + 512;
    let cached = NextPointer::new(FIRST, 0, true).unwrap();
    let mut machine = WriteOperation::new(lookup(cached), &value_of(0, 1), slot).unwrap();
    let start = machine.start();
    let mut trail = None;
    let trips = offsets_until_done(&mut region, start, |outcome| {
        let step = machine.handle(outcome).unwrap();
        if let Step::Written { trail: done, .. } = &step {
            trail = Some(*done);
        }
        step
    });
    assert_eq!(
        trips,
        vec![
            vec![slot],
            vec![FIRST],
            vec![FIRST, SHORTCUT],
            vec![winner],
            vec![winner]
        ]
    );
    let trail = trail.expect("the write linked");
    assert_eq!((trail.conflicts, trail.hops), (1, 2));
    assert_eq!(region.versions().len(), 3);
}
