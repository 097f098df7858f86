//! Two soft RNICs wired back to back, with no carrier in between: the
//! protocol's own cost, and a harness for tests, the demo and benchmarks.
//!
//! Time is virtual: when no frame is in flight the clock jumps to the next
//! timer. A filter sees every frame and may drop or alter it, which is how
//! tests lose exactly the packet they mean to.

use crate::device::{RnicConfig, SoftRnic};
use crate::time::Timestamp;
use crate::verbs::{
    AccessFlags, CompletionQueue, MemoryRegion, QueuePair, QueuePairBuilder, SendOperation,
    SendRequest, Verbs,
};
use crate::{DataPath, VerbsError};
use remora_wire::frame::MAX_FRAME_LEN;
use remora_wire::{Ipv4Address, MacAddress};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    LeftToRight,
    RightToLeft,
}

/// What a filter decides for one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Deliver,
    Drop,
}

pub struct BackToBack {
    pub left: SoftRnic,
    pub right: SoftRnic,
    pub now: Timestamp,
    buffer: Box<[u8]>,
}

/// The stop conditions of [`BackToBack::run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSummary {
    pub frames_moved: u64,
    pub timeouts_fired: u64,
    /// False if `max_steps` ran out before both sides went quiet.
    pub quiesced: bool,
}

impl BackToBack {
    pub fn new(seed: u64) -> BackToBack {
        let [left, right] = BackToBack::configs(seed);
        BackToBack::with_configs(left, right)
    }

    /// The two devices' configs [`BackToBack::new`] uses, for a caller
    /// that changes a limit before building the pair.
    pub fn configs(seed: u64) -> [RnicConfig; 2] {
        let left = RnicConfig::new(
            MacAddress([0x02, 0, 0, 0, 0, 1]),
            Ipv4Address::new(192, 0, 2, 1),
            seed,
        );
        let right = RnicConfig::new(
            MacAddress([0x02, 0, 0, 0, 0, 2]),
            Ipv4Address::new(192, 0, 2, 2),
            seed.wrapping_add(1),
        );
        [left, right]
    }

    pub fn with_configs(left: RnicConfig, right: RnicConfig) -> BackToBack {
        BackToBack {
            left: SoftRnic::new(left),
            right: SoftRnic::new(right),
            now: Timestamp::ZERO,
            buffer: vec![0u8; MAX_FRAME_LEN].into_boxed_slice(),
        }
    }

    /// Creates one queue pair on each side and connects them.
    pub fn connect(
        &mut self,
        left: &QueuePairBuilder,
        right: &QueuePairBuilder,
    ) -> Result<(QueuePair, QueuePair), VerbsError> {
        let left_prepared = self.left.create_queue_pair(left)?;
        let right_prepared = self.right.create_queue_pair(right)?;
        let left_qp = self
            .left
            .handshake(left_prepared, right_prepared.endpoint)?;
        let right_qp = self
            .right
            .handshake(right_prepared, left_prepared.endpoint)?;
        Ok((left_qp, right_qp))
    }

    /// Moves at most one frame each way. Returns how many moved.
    pub fn step(&mut self, filter: &mut impl FnMut(Direction, &mut [u8]) -> Verdict) -> u64 {
        let mut moved = 0;
        if let Some(len) = self.left.poll_transmit(self.now, &mut self.buffer) {
            moved += 1;
            if filter(Direction::LeftToRight, &mut self.buffer[..len]) == Verdict::Deliver {
                self.right.handle_frame(self.now, &self.buffer[..len]);
            }
        }
        if let Some(len) = self.right.poll_transmit(self.now, &mut self.buffer) {
            moved += 1;
            if filter(Direction::RightToLeft, &mut self.buffer[..len]) == Verdict::Deliver {
                self.left.handle_frame(self.now, &self.buffer[..len]);
            }
        }
        moved
    }

    /// Runs until neither side has a frame to send or a timer pending, or
    /// until `max_steps` frames and timer firings together have happened.
    pub fn run_filtered(
        &mut self,
        max_steps: u64,
        filter: &mut impl FnMut(Direction, &mut [u8]) -> Verdict,
    ) -> RunSummary {
        let mut summary = RunSummary {
            frames_moved: 0,
            timeouts_fired: 0,
            quiesced: false,
        };
        while summary.frames_moved + summary.timeouts_fired < max_steps {
            let moved = self.step(filter);
            summary.frames_moved += moved;
            if moved > 0 {
                continue;
            }
            let next = [self.left.poll_timeout(), self.right.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            let Some(deadline) = next else {
                summary.quiesced = true;
                break;
            };
            self.now = self.now.max(deadline);
            self.left.handle_timeout(self.now);
            self.right.handle_timeout(self.now);
            summary.timeouts_fired += 1;
        }
        summary
    }

    pub fn run(&mut self, max_steps: u64) -> RunSummary {
        self.run_filtered(max_steps, &mut |_, _| Verdict::Deliver)
    }
}

/// Two devices back to back, connected by one or more queue pairs, with a
/// region of the same size on each side: the setup every transfer
/// benchmark and profiling loop shares. Every request uses the same two
/// buffers, as a memcpy baseline reuses its two, so comparisons are
/// between like working sets.
pub struct TransferRig {
    pub fabric: BackToBack,
    /// The left device's queue pairs, all completing to `completions`.
    pub queue_pairs: Vec<QueuePair>,
    pub completions: CompletionQueue,
    pub local: MemoryRegion,
    pub remote: MemoryRegion,
}

/// The largest READ window a queue pair grants (`max_read_atomic`, the
/// device's limit): READs posted beyond it wait in the send queue.
pub const MAX_READ_WINDOW: usize = 128;

impl TransferRig {
    /// `queue_pairs` connections, each with room for `window` requests
    /// outstanding (READs beyond [`MAX_READ_WINDOW`] wait in its send
    /// queue), and regions of `size_bytes` (at least 8).
    pub fn new(
        size_bytes: u32,
        queue_pairs: usize,
        window: usize,
    ) -> Result<TransferRig, VerbsError> {
        let mut fabric = BackToBack::new(11);
        let left_pd = fabric.left.alloc_protection_domain()?;
        let right_pd = fabric.right.alloc_protection_domain()?;
        let size = u64::from(size_bytes.max(8));
        let local = fabric
            .left
            .register_memory(left_pd, size, AccessFlags::ALL)?;
        let remote = fabric
            .right
            .register_memory(right_pd, size, AccessFlags::ALL)?;
        let completion_depth = (queue_pairs * window * 2).max(16);
        let left_cq = fabric.left.create_completion_queue(completion_depth)?;
        let right_cq = fabric.right.create_completion_queue(completion_depth)?;
        let mut left = QueuePairBuilder::new(left_pd, left_cq, left_cq);
        left.max_read_atomic = window.clamp(1, MAX_READ_WINDOW);
        left.send_queue_depth = (window * 2).max(2);
        let mut right = QueuePairBuilder::new(right_pd, right_cq, right_cq);
        right.max_destination_read_atomic = window.clamp(1, MAX_READ_WINDOW);
        let mut connections = Vec::with_capacity(queue_pairs);
        for _ in 0..queue_pairs {
            connections.push(fabric.connect(&left, &right)?.0);
        }
        Ok(TransferRig {
            fabric,
            queue_pairs: connections,
            completions: left_cq,
            local,
            remote,
        })
    }

    /// A READ (or WRITE) of the whole region, named `id`.
    pub fn request(&self, id: u64, read: bool) -> SendRequest {
        let operation = if read {
            SendOperation::Read {
                remote: self.remote.remote(0),
            }
        } else {
            SendOperation::Write {
                remote: self.remote.remote(0),
                immediate: None,
            }
        };
        let length = u32::try_from(self.local.length_bytes).expect("sized from a u32");
        SendRequest::new(id, operation, &[self.local.slice(0, length)]).expect("one element")
    }

    /// Posts `per_queue_pair` requests on each of the first `active` queue
    /// pairs, each named by its queue pair's index, so that
    /// [`TransferRig::post_again`] can replace a completed one where it ran.
    pub fn post_on_each(
        &mut self,
        active: usize,
        per_queue_pair: usize,
        read: bool,
    ) -> Result<(), VerbsError> {
        for index in 0..active {
            for _ in 0..per_queue_pair {
                self.post_again(index as u64, read)?;
            }
        }
        Ok(())
    }

    /// Posts a request named `id` on the queue pair that id names: the one
    /// a completion with that id came from.
    pub fn post_again(&mut self, id: u64, read: bool) -> Result<(), VerbsError> {
        let queue_pair = self.queue_pairs[id as usize];
        let request = self.request(id, read);
        self.fabric.left.post_send(queue_pair, request)
    }
}
