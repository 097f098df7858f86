//! The operations a stream issues, and the window of memory they work in.
//! Both the generator ([`crate::workload`]) and the model
//! ([`crate::model`]) speak of these.

/// Bytes of a stream's data window on the responder.
pub const DATA_WINDOW_BYTES: u64 = 16 * 1024;
/// 8-byte atomic targets after the data window.
pub const ATOMIC_SLOTS: u64 = 32;
pub const WINDOW_BYTES: u64 = DATA_WINDOW_BYTES + ATOMIC_SLOTS * 8;
/// Longest WRITE or READ.
pub const MAX_TRANSFER_BYTES: u32 = 6000;
/// Longest SEND; each receive buffer holds this much.
pub const MAX_SEND_BYTES: u32 = 3000;
/// Local buffer per operation on the requester.
pub const LOCAL_SLOT_BYTES: u64 = 8 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// An rkey no region has.
    BadRkey,
    /// A WRITE running past the end of the window's region.
    OutOfBounds,
    /// A WRITE into a region registered without REMOTE_WRITE.
    WriteToReadOnly,
    /// An atomic on a region registered without REMOTE_ATOMIC.
    AtomicOnReadOnly,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    Write {
        offset: u64,
        data: Vec<u8>,
        immediate: Option<u32>,
    },
    Read {
        offset: u64,
        length: u32,
    },
    Send {
        data: Vec<u8>,
        immediate: Option<u32>,
    },
    CompareSwap {
        slot: u64,
        compare: u64,
        swap: u64,
    },
    FetchAdd {
        slot: u64,
        add: u64,
    },
    Violation(Violation),
}

impl Operation {
    /// READs and atomics: complete only once their answer arrives, so an
    /// acknowledgement of later requests does not complete them.
    pub fn awaits_an_answer(&self) -> bool {
        matches!(
            self,
            Operation::Read { .. } | Operation::CompareSwap { .. } | Operation::FetchAdd { .. }
        )
    }

    /// SENDs and WRITE-with-immediate consume a receive at the responder.
    pub fn consumes_receive(&self) -> bool {
        matches!(
            self,
            Operation::Send { .. }
                | Operation::Write {
                    immediate: Some(_),
                    ..
                }
        )
    }
}
