//! A Clover client operation as a sans-IO state machine: it asks for RDMA
//! verbs ([`Verb`]) or a metadata-server lookup ([`Step::Locate`]) and is
//! handed their results, so the same code runs against a plain memory
//! model in tests, in the simulator and against a soft RNIC on the rack.
//!
//! A write has an entry slot the metadata server handed out beforehand:
//! 1. WRITE the new entry (a tail: next pointer null) into the slot;
//! 2. CAS the next pointer of the version the client believes is the tail
//!    from null to the new entry. If another writer got there first, the
//!    CAS returns their pointer: a conflict. The client then READs headers
//!    along the list (pointer chasing) to the new tail and CASes again.
//!
//! 3. Once linked, the write has taken effect and returns. The WRITE of
//!    the new entry's pointer into the key's shortcut word, so that readers
//!    start near the tail, is handed back with the result
//!    ([`Step::Written::shortcut`]) for the caller to issue in the
//!    background, as Clover's client hands shortcut upkeep to its
//!    collection thread (`mitsume_tool_gc_submit_request` in Clover's
//!    published code, WukLab/pDPM): off the write's critical path. The
//!    collector re-checks shortcuts before it reuses a slot: a late
//!    shortcut WRITE naming a retired version is repaired first.
//!
//! A read starts from the client's cached location and follows next
//! pointers to the tail, whose value it returns.
//!
//! Both walk the list the same way (`Chase`), as Clover's
//! `mitsume_tool_pointer_chasing` does: the first look READs the entry at
//! the cached location and, in the same round trip, the key's shortcut
//! ([`Step::IssueBoth`]). A tail ends the chase there; otherwise it goes on
//! from the shortcut (nearer the tail than a stale cache, as a rule), one
//! entry READ a hop. A write that loses its CAS starts such a chase again
//! from where it failed. With no cached location the chase starts from the
//! shortcut alone. After [`Thresholds::shortcut_after_hops`] hops without
//! a shortcut it reads one, and after [`Thresholds::metadata_after_hops`]
//! it asks the metadata server, which returns the tail.

use crate::layout::{
    decode_entry, encode_entry, LayoutError, NextPointer, HEADER_BYTES, MAX_VALUE_BYTES,
};

/// Bounds every chase: a list longer than this between two looks is a
/// broken (or cyclic) list, reported rather than followed forever.
pub const MAX_HOPS: u32 = 1 << 16;

/// One RDMA operation on the memory node's region (offsets in bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verb {
    Read { offset: u64, length: usize },
    Write { offset: u64, bytes: Vec<u8> },
    CompareSwap { offset: u64, expect: u64, swap: u64 },
}

/// What a verb (or a lookup) returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The outcomes of [`Step::IssueBoth`]'s two verbs, in their order.
    Both(Box<[Outcome; 2]>),
    Read(Vec<u8>),
    Written,
    /// The word before the CAS (the swap happened if it equals `expect`).
    Swapped {
        original: u64,
    },
    /// The metadata server's answer to [`Step::Locate`]: the key's tail.
    Located(NextPointer),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("an entry at {offset:#x} belongs to key {found}, not {expected}: the list is broken")]
    WrongKey {
        offset: u64,
        expected: u64,
        found: u64,
    },
    #[error("more than {MAX_HOPS} hops without reaching a tail: the list is broken or cyclic")]
    TooManyHops,
    #[error("the outcome does not match what was asked")]
    UnexpectedOutcome,
    #[error("the metadata server located no version of key {0}")]
    NotLocated(u64),
    #[error(
        "the shortcut threshold ({shortcut}) must be below the metadata threshold ({metadata})"
    )]
    Thresholds { shortcut: u32, metadata: u32 },
}

impl Outcome {
    /// What `handle` takes for the verbs one step issued, given their
    /// outcomes in the step's order: the one, or [`Outcome::Both`].
    ///
    /// # Panics
    /// Unless there are one or two: a step issues no more.
    pub fn gathered(outcomes: Vec<Outcome>) -> Outcome {
        let mut outcomes = outcomes.into_iter();
        match (outcomes.next(), outcomes.next(), outcomes.next()) {
            (Some(only), None, None) => only,
            (Some(first), Some(second), None) => Outcome::Both(Box::new([first, second])),
            _ => panic!("a step issues one verb or two"),
        }
    }
}

/// When a chase stops following pointers and jumps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Entry READs after which a chase that has not read the key's
    /// shortcut reads it. Every chase from a cached location reads it
    /// beside its first entry READ, so this matters only to a write that
    /// started from the shortcut and is still chasing (and to tests).
    pub shortcut_after_hops: u32,
    /// Entry READs after which it asks the metadata server.
    pub metadata_after_hops: u32,
}

impl Thresholds {
    pub const DEFAULT: Thresholds = Thresholds {
        shortcut_after_hops: 4,
        metadata_after_hops: 16,
    };

    pub fn new(
        shortcut_after_hops: u32,
        metadata_after_hops: u32,
    ) -> Result<Thresholds, ClientError> {
        if shortcut_after_hops >= metadata_after_hops {
            return Err(ClientError::Thresholds {
                shortcut: shortcut_after_hops,
                metadata: metadata_after_hops,
            });
        }
        Ok(Thresholds {
            shortcut_after_hops,
            metadata_after_hops,
        })
    }
}

/// Where an operation starts looking for a key's tail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookup {
    pub key: u64,
    /// Where the client last saw the key (any version works: the chase
    /// finds the tail), if it remembers.
    pub cached: Option<NextPointer>,
    /// Region offset of the key's shortcut word.
    pub shortcut: u64,
    pub thresholds: Thresholds,
}

/// How an operation went, for the statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trail {
    /// Entry READs.
    pub hops: u32,
    /// Failed CASes (writes only).
    pub conflicts: u32,
    /// Whether the chase used the shortcut or the metadata server: the
    /// tail it found was learned during this operation.
    pub jumped: bool,
}

/// Where an operation stands after a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Issue this verb and hand its outcome to `handle`.
    Issue(Verb),
    /// Issue both verbs at once (one round trip, as Clover posts an entry
    /// READ and a shortcut READ together) and hand both outcomes, in this
    /// order, to `handle` as [`Outcome::Both`]. The second is an 8-byte
    /// READ.
    IssueBoth(Box<[Verb; 2]>),
    /// Ask the metadata server where the key's tail is, and hand its
    /// answer to `handle` as [`Outcome::Located`].
    Locate { key: u64 },
    /// A write is linked: the new tail (also the client's new cache).
    /// `shortcut` is the 8-byte WRITE that moves the key's shortcut to
    /// it, to issue in the background: nothing waits for it, but it must
    /// land within the operation deadline of the write's start, which the
    /// collector's grace relies on.
    Written {
        tail: NextPointer,
        trail: Trail,
        shortcut: Verb,
    },
    /// A read found the tail's value.
    Value {
        tail: NextPointer,
        value: Vec<u8>,
        trail: Trail,
    },
}

impl Step {
    /// The verbs an [`Issue`](Step::Issue) or [`IssueBoth`](Step::IssueBoth)
    /// step asks for, in order; `None` for any other step.
    pub fn into_verbs(self) -> Option<Vec<Verb>> {
        match self {
            Step::Issue(verb) => Some(vec![verb]),
            Step::IssueBoth(both) => Some(Vec::from(*both)),
            _ => None,
        }
    }
}

/// What a chase asked last, so its answer is read the right way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    Entry,
    /// The entry at the cursor and the shortcut, in one round trip.
    EntryAndShortcut,
    Shortcut,
    Metadata,
}

/// Walking a key's version list towards its tail: the part a write and a
/// read share.
#[derive(Debug, Clone)]
struct Chase {
    lookup: Lookup,
    /// The version believed to be the tail.
    cursor: Option<NextPointer>,
    trail: Trail,
    shortcut_read: bool,
    /// Whether the next entry READ takes the shortcut beside it: the
    /// first look of a chase, from a cached location or a failed CAS.
    shortcut_beside: bool,
    metadata_asked: bool,
    pending: Look,
}

impl Chase {
    fn new(lookup: Lookup) -> Chase {
        Chase {
            lookup,
            cursor: lookup.cached.filter(|pointer| !pointer.is_null()),
            trail: Trail::default(),
            shortcut_read: false,
            shortcut_beside: true,
            metadata_asked: false,
            pending: Look::Entry,
        }
    }

    fn next_look(&self) -> Look {
        let hops = self.trail.hops;
        let thresholds = self.lookup.thresholds;
        match self.cursor {
            None if !self.shortcut_read => Look::Shortcut,
            None => Look::Metadata,
            Some(_) if hops >= thresholds.shortcut_after_hops && !self.shortcut_read => {
                Look::Shortcut
            }
            Some(_) if hops >= thresholds.metadata_after_hops && !self.metadata_asked => {
                Look::Metadata
            }
            Some(_) if self.shortcut_beside => Look::EntryAndShortcut,
            Some(_) => Look::Entry,
        }
    }

    /// The next step towards the tail, reading `entry_bytes` of an entry.
    fn look(&mut self, entry_bytes: usize) -> Result<Step, ClientError> {
        self.pending = self.next_look();
        match self.pending {
            Look::Entry => Ok(Step::Issue(self.entry_read(entry_bytes)?)),
            Look::EntryAndShortcut => {
                self.shortcut_beside = false;
                self.shortcut_read = true;
                let entry = self.entry_read(entry_bytes)?;
                Ok(Step::IssueBoth(Box::new([entry, self.shortcut_read()])))
            }
            Look::Shortcut => {
                self.shortcut_read = true;
                self.shortcut_beside = false;
                Ok(Step::Issue(self.shortcut_read()))
            }
            Look::Metadata => {
                self.metadata_asked = true;
                self.shortcut_beside = false;
                Ok(Step::Locate {
                    key: self.lookup.key,
                })
            }
        }
    }

    /// The READ of the entry at the cursor: one hop.
    fn entry_read(&mut self, entry_bytes: usize) -> Result<Verb, ClientError> {
        self.trail.hops += 1;
        if self.trail.hops > MAX_HOPS {
            return Err(ClientError::TooManyHops);
        }
        let cursor = self.cursor.expect("an entry look has a cursor");
        Ok(Verb::Read {
            offset: cursor.offset(),
            length: entry_bytes,
        })
    }

    fn shortcut_read(&self) -> Verb {
        Verb::Read {
            offset: self.lookup.shortcut,
            length: 8,
        }
    }

    /// Takes the answer to [`Look::EntryAndShortcut`]: the entry's bytes
    /// if it is the tail (the chase ends at the cursor), or `None` when
    /// the chase goes on, from the shortcut when it names another entry
    /// (as Clover's chase jumps), else from the entry's next pointer.
    fn land_both(&mut self, outcome: Outcome) -> Result<Option<Vec<u8>>, ClientError> {
        let Outcome::Both(both) = outcome else {
            return Err(ClientError::UnexpectedOutcome);
        };
        let [Outcome::Read(entry), Outcome::Read(shortcut)] = *both else {
            return Err(ClientError::UnexpectedOutcome);
        };
        let before = self.cursor;
        if !self.follow(&entry)? {
            return Ok(Some(entry));
        }
        let shortcut = NextPointer::from_word(word(&shortcut, 0)?);
        // Neither the entry just read nor the one it points at: a jump
        // (perhaps backwards, to a shortcut whose WRITE is late, which
        // costs hops as it does Clover).
        let elsewhere = [before, self.cursor]
            .into_iter()
            .flatten()
            .all(|known| known.offset() != shortcut.offset());
        if !shortcut.is_null() && elsewhere {
            self.cursor = Some(shortcut);
            self.trail.jumped = true;
        }
        Ok(None)
    }

    /// Takes the answer to a shortcut READ or a metadata lookup.
    fn land(&mut self, outcome: Outcome) -> Result<(), ClientError> {
        let pointer = match (self.pending, outcome) {
            (Look::Shortcut, Outcome::Read(bytes)) => NextPointer::from_word(word(&bytes, 0)?),
            (Look::Metadata, Outcome::Located(pointer)) if pointer.is_null() => {
                return Err(ClientError::NotLocated(self.lookup.key))
            }
            (Look::Metadata, Outcome::Located(pointer)) => pointer,
            _ => return Err(ClientError::UnexpectedOutcome),
        };
        // A null shortcut (never set) leaves the cursor where it was.
        if !pointer.is_null() {
            self.cursor = Some(pointer);
            self.trail.jumped = true;
        }
        Ok(())
    }

    /// Takes the entry READ at the cursor: true if it pointed on (the
    /// cursor moved and the chase goes on), false at the tail.
    fn follow(&mut self, bytes: &[u8]) -> Result<bool, ClientError> {
        let cursor = self.cursor.expect("an entry look has a cursor");
        let next = NextPointer::from_word(word(bytes, 0)?);
        let key = word(bytes, 8)?;
        if key != self.lookup.key {
            return Err(ClientError::WrongKey {
                offset: cursor.offset(),
                expected: self.lookup.key,
                found: key,
            });
        }
        if next.is_null() {
            return Ok(false);
        }
        self.cursor = Some(next);
        Ok(true)
    }
}

/// The little-endian word at `at`.
fn word(bytes: &[u8], at: usize) -> Result<u64, ClientError> {
    let slice = bytes
        .get(at..at + 8)
        .ok_or(LayoutError::Truncated(bytes.len()))?;
    Ok(u64::from_le_bytes(slice.try_into().expect("8 bytes")))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteState {
    WritingEntry,
    Looking,
    Swapping,
}

/// Appends a version of a key.
#[derive(Debug, Clone)]
pub struct WriteOperation {
    entry: Vec<u8>,
    slot: u64,
    chase: Chase,
    state: WriteState,
}

impl WriteOperation {
    /// `slot`: space the metadata server allocated, big enough for the
    /// value's size class.
    pub fn new(lookup: Lookup, value: &[u8], slot: u64) -> Result<WriteOperation, ClientError> {
        let mut entry = vec![0; HEADER_BYTES + value.len()];
        encode_entry(lookup.key, value, &mut entry)?;
        // Checked here so that the pointer built at the CAS cannot fail.
        NextPointer::new(slot, 0, true)?;
        Ok(WriteOperation {
            entry,
            slot,
            chase: Chase::new(lookup),
            state: WriteState::WritingEntry,
        })
    }

    /// The first verb.
    pub fn start(&self) -> Step {
        Step::Issue(Verb::Write {
            offset: self.slot,
            bytes: self.entry.clone(),
        })
    }

    /// The new entry's region offset.
    pub fn slot(&self) -> u64 {
        self.slot
    }

    fn look(&mut self) -> Result<Step, ClientError> {
        self.state = WriteState::Looking;
        self.chase.look(HEADER_BYTES)
    }

    /// CAS at the cursor, or look further if there is none yet.
    fn swap_or_look(&mut self) -> Result<Step, ClientError> {
        let Some(cursor) = self.chase.cursor else {
            return self.look();
        };
        self.state = WriteState::Swapping;
        Ok(Step::Issue(Verb::CompareSwap {
            offset: cursor.offset(),
            expect: 0,
            swap: self.new_tail(cursor).word(),
        }))
    }

    /// The pointer to this entry. Its version is one past the version the
    /// client CASes after; a resolver that redirects the CAS further down
    /// the list leaves it as it is, so versions are hints, never relied on.
    fn new_tail(&self, cursor: NextPointer) -> NextPointer {
        NextPointer::new(self.slot, cursor.next_version(), true).expect("checked at construction")
    }

    pub fn handle(&mut self, outcome: Outcome) -> Result<Step, ClientError> {
        match (self.state, outcome) {
            (WriteState::WritingEntry, Outcome::Written) => self.swap_or_look(),
            (WriteState::Looking, outcome) if self.chase.pending == Look::EntryAndShortcut => {
                if self.chase.land_both(outcome)?.is_some() {
                    return self.swap_or_look();
                }
                self.look()
            }
            (WriteState::Looking, outcome) if self.chase.pending != Look::Entry => {
                self.chase.land(outcome)?;
                self.swap_or_look()
            }
            (WriteState::Looking, Outcome::Read(bytes)) => {
                if self.chase.follow(&bytes)? {
                    return self.look();
                }
                self.swap_or_look()
            }
            (WriteState::Swapping, Outcome::Swapped { original }) => {
                let cursor = self.chase.cursor.expect("a CAS has a cursor");
                if original == 0 {
                    // Linked: the write has taken effect.
                    let tail = self.new_tail(cursor);
                    return Ok(Step::Written {
                        tail,
                        trail: self.chase.trail,
                        shortcut: Verb::Write {
                            offset: self.chase.lookup.shortcut,
                            bytes: tail.word().to_le_bytes().to_vec(),
                        },
                    });
                }
                // Another writer linked first. As Clover's client does, the
                // chase starts again where the CAS failed (the word it
                // returned is not used), with the shortcut beside.
                self.chase.trail.conflicts += 1;
                self.chase.shortcut_beside = true;
                self.look()
            }
            _ => Err(ClientError::UnexpectedOutcome),
        }
    }
}

/// Reads the latest version of a key. `entry_bytes` is how much to read
/// per version (the size class the client expects; a longer value costs
/// one more READ).
#[derive(Debug, Clone)]
pub struct ReadOperation {
    chase: Chase,
    entry_bytes: usize,
}

impl ReadOperation {
    pub fn new(lookup: Lookup, entry_bytes: usize) -> ReadOperation {
        ReadOperation {
            chase: Chase::new(lookup),
            entry_bytes: entry_bytes.max(HEADER_BYTES),
        }
    }

    pub fn start(&mut self) -> Result<Step, ClientError> {
        self.chase.look(self.entry_bytes)
    }

    pub fn handle(&mut self, outcome: Outcome) -> Result<Step, ClientError> {
        let bytes = match (self.chase.pending, outcome) {
            (Look::EntryAndShortcut, outcome) => match self.chase.land_both(outcome)? {
                Some(tail) => tail,
                None => return self.chase.look(self.entry_bytes),
            },
            (Look::Entry, Outcome::Read(bytes)) => {
                if self.chase.follow(&bytes)? {
                    return self.chase.look(self.entry_bytes);
                }
                bytes
            }
            (Look::Entry, _) => return Err(ClientError::UnexpectedOutcome),
            (Look::Shortcut | Look::Metadata, outcome) => {
                self.chase.land(outcome)?;
                return self.chase.look(self.entry_bytes);
            }
        };
        let length = word(&bytes, 16)? as u32 as usize;
        if length > MAX_VALUE_BYTES {
            return Err(LayoutError::ValueSize(length).into());
        }
        if bytes.len() < HEADER_BYTES + length {
            // The value is longer than the client guessed: read it whole.
            // The re-read is of the same version, so it is not a hop.
            self.entry_bytes = HEADER_BYTES + length;
            self.chase.pending = Look::Entry;
            let cursor = self.chase.cursor.expect("a finished chase has a cursor");
            return Ok(Step::Issue(Verb::Read {
                offset: cursor.offset(),
                length: self.entry_bytes,
            }));
        }
        let entry = decode_entry(&bytes)?;
        Ok(Step::Value {
            tail: self.chase.cursor.expect("a finished chase has a cursor"),
            value: entry.value.to_vec(),
            trail: self.chase.trail,
        })
    }
}
