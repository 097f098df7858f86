//! A Clover client operation as a sans-IO state machine: it asks for RDMA
//! verbs ([`Verb`]) and is handed their results, so the same code runs
//! against a plain memory model in tests and against a soft RNIC on the
//! rack.
//!
//! A write has an entry slot the metadata server handed out beforehand:
//! 1. WRITE the new entry (a tail: next pointer null) into the slot;
//! 2. READ the header of the version the client believes is the tail;
//!    while its next pointer is set, follow it (pointer chasing);
//! 3. CAS that tail's next pointer from null to the new entry. If another
//!    writer got there first, the CAS returns their pointer: that is a
//!    conflict, and the chase resumes from it.
//!
//! A read starts from the client's cached location and follows next
//! pointers to the tail, whose value it returns.

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

/// What a verb returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Read(Vec<u8>),
    Written,
    /// The word before the CAS (the swap happened if it equals `expect`).
    Swapped {
        original: u64,
    },
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
    #[error("the verb's outcome does not match what was asked")]
    UnexpectedOutcome,
}

/// Where an operation stands after a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Issue this verb and hand its outcome to `handle`.
    Issue(Verb),
    /// A write is linked: the new tail (also the client's new cache).
    Written {
        tail: NextPointer,
        conflicts: u32,
        hops: u32,
    },
    /// A read found the tail's value.
    Value {
        tail: NextPointer,
        value: Vec<u8>,
        hops: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteState {
    WritingEntry,
    ReadingHeader,
    Swapping,
}

/// Walking a key's version list towards its tail: the one part a write
/// and a read share.
#[derive(Debug, Clone)]
struct Chase {
    key: u64,
    /// The version believed to be the tail.
    cursor: NextPointer,
    hops: u32,
}

impl Chase {
    fn new(key: u64, cached: NextPointer) -> Chase {
        assert!(!cached.is_null(), "a key's list always has a first version");
        Chase {
            key,
            cursor: cached,
            hops: 0,
        }
    }

    /// Counts one more READ of the cursor and returns its offset.
    fn hop(&mut self) -> Result<u64, ClientError> {
        self.hops += 1;
        if self.hops > MAX_HOPS {
            return Err(ClientError::TooManyHops);
        }
        Ok(self.cursor.offset())
    }

    /// Takes the header READ at the cursor: true if it pointed on (the
    /// cursor moved and the chase goes on), false at the tail.
    fn follow(&mut self, bytes: &[u8]) -> Result<bool, ClientError> {
        let (next, key) = header(bytes)?;
        if key != self.key {
            return Err(ClientError::WrongKey {
                offset: self.cursor.offset(),
                expected: self.key,
                found: key,
            });
        }
        if next.is_null() {
            return Ok(false);
        }
        self.cursor = next;
        Ok(true)
    }
}

/// Appends a version of `key`.
#[derive(Debug, Clone)]
pub struct WriteOperation {
    entry: Vec<u8>,
    slot: u64,
    chase: Chase,
    state: WriteState,
    conflicts: u32,
}

impl WriteOperation {
    /// `slot`: space the metadata server allocated, big enough for the
    /// value's size class. `cached_tail`: where the client last saw the
    /// key's tail (any version of the key works; the chase finds the tail).
    pub fn new(
        key: u64,
        value: &[u8],
        slot: u64,
        cached_tail: NextPointer,
    ) -> Result<WriteOperation, ClientError> {
        let mut entry = vec![0; HEADER_BYTES + value.len()];
        encode_entry(key, value, &mut entry)?;
        // Checked here so that the pointer built at the CAS cannot fail.
        NextPointer::new(slot, 0, true)?;
        Ok(WriteOperation {
            entry,
            slot,
            chase: Chase::new(key, cached_tail),
            state: WriteState::WritingEntry,
            conflicts: 0,
        })
    }

    /// The first verb.
    pub fn start(&self) -> Step {
        Step::Issue(Verb::Write {
            offset: self.slot,
            bytes: self.entry.clone(),
        })
    }

    fn read_cursor(&mut self) -> Result<Step, ClientError> {
        let offset = self.chase.hop()?;
        self.state = WriteState::ReadingHeader;
        Ok(Step::Issue(Verb::Read {
            offset,
            length: HEADER_BYTES,
        }))
    }

    fn new_tail(&self) -> NextPointer {
        NextPointer::new(self.slot, self.chase.cursor.next_version(), true)
            .expect("checked at construction")
    }

    pub fn handle(&mut self, outcome: Outcome) -> Result<Step, ClientError> {
        match (self.state, outcome) {
            (WriteState::WritingEntry, Outcome::Written) => self.read_cursor(),
            (WriteState::ReadingHeader, Outcome::Read(bytes)) => {
                if self.chase.follow(&bytes)? {
                    return self.read_cursor();
                }
                self.state = WriteState::Swapping;
                Ok(Step::Issue(Verb::CompareSwap {
                    offset: self.chase.cursor.offset(),
                    expect: 0,
                    swap: self.new_tail().word(),
                }))
            }
            (WriteState::Swapping, Outcome::Swapped { original }) => {
                if original == 0 {
                    return Ok(Step::Written {
                        tail: self.new_tail(),
                        conflicts: self.conflicts,
                        hops: self.chase.hops,
                    });
                }
                // Another writer linked first: chase from its entry.
                self.conflicts += 1;
                self.chase.cursor = NextPointer::from_word(original);
                self.read_cursor()
            }
            _ => Err(ClientError::UnexpectedOutcome),
        }
    }
}

/// The next pointer and key of an entry header.
fn header(bytes: &[u8]) -> Result<(NextPointer, u64), ClientError> {
    if bytes.len() < 16 {
        return Err(LayoutError::Truncated(bytes.len()).into());
    }
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    Ok((NextPointer::from_word(word(0)), word(8)))
}

/// Reads the latest version of `key`, starting from where the client last
/// saw it. `entry_bytes` is how much to read per version (the size class
/// the client expects; a longer value costs one more READ).
#[derive(Debug, Clone)]
pub struct ReadOperation {
    chase: Chase,
    entry_bytes: usize,
}

impl ReadOperation {
    pub fn new(key: u64, cached: NextPointer, entry_bytes: usize) -> ReadOperation {
        ReadOperation {
            chase: Chase::new(key, cached),
            entry_bytes: entry_bytes.max(HEADER_BYTES),
        }
    }

    pub fn start(&mut self) -> Result<Step, ClientError> {
        self.read_cursor()
    }

    fn read_cursor(&mut self) -> Result<Step, ClientError> {
        let offset = self.chase.hop()?;
        Ok(Step::Issue(Verb::Read {
            offset,
            length: self.entry_bytes,
        }))
    }

    pub fn handle(&mut self, outcome: Outcome) -> Result<Step, ClientError> {
        let Outcome::Read(bytes) = outcome else {
            return Err(ClientError::UnexpectedOutcome);
        };
        if self.chase.follow(&bytes)? {
            return self.read_cursor();
        }
        let length = u32::from_le_bytes(
            bytes
                .get(16..20)
                .ok_or(LayoutError::Truncated(bytes.len()))?
                .try_into()
                .expect("4 bytes"),
        ) as usize;
        if length > MAX_VALUE_BYTES {
            return Err(LayoutError::ValueSize(length).into());
        }
        if bytes.len() < HEADER_BYTES + length {
            // The value is longer than the client guessed: read it whole.
            self.entry_bytes = HEADER_BYTES + length;
            self.chase.hops -= 1;
            return self.read_cursor();
        }
        let entry = decode_entry(&bytes)?;
        Ok(Step::Value {
            tail: self.chase.cursor,
            value: entry.value.to_vec(),
            hops: self.chase.hops,
        })
    }
}
