//! What queue pairs share inside a device: registered memory, completion
//! queues, shared receive queues and counters.

use crate::counters::RnicCounters;
use crate::memory::MemoryTable;
use crate::queues::{BoundedQueue, CompletionRing};
use crate::verbs::{
    CompletionQueue, ProtectionDomain, ReceiveRequest, SharedReceiveQueue, WorkCompletion,
};

/// A shared receive queue and the protection domain its buffers belong to.
#[derive(Debug)]
pub(crate) struct SharedReceiveRing {
    pub(crate) protection_domain: ProtectionDomain,
    pub(crate) queue: BoundedQueue<ReceiveRequest>,
}

#[derive(Debug)]
pub(crate) struct Resources {
    pub(crate) memory: MemoryTable,
    pub(crate) completion_queues: Vec<CompletionRing>,
    pub(crate) retired_completion_queues: crate::queues::Retired,
    pub(crate) shared_receive_queues: Vec<SharedReceiveRing>,
    pub(crate) retired_shared_receive_queues: crate::queues::Retired,
    pub(crate) counters: RnicCounters,
    /// Completion queues that lost a completion since the device last
    /// looked: the queue pairs bound to them go to ERR. At most one entry
    /// per queue.
    pub(crate) newly_overrun: Vec<CompletionQueue>,
    /// The longest message the device sends or answers: a READ asking for
    /// more is refused, since its answer is snapshotted whole.
    pub(crate) max_message_bytes: u32,
}

impl Resources {
    /// Delivers a completion. Returns false if the queue overran; the queue
    /// then reports the loss to whoever polls it. Every loss, not only the
    /// first, moves the queue pairs bound to the queue to ERR: one bound
    /// after the overrun ran on in RTS with its completions dropped.
    pub(crate) fn complete(&mut self, queue: CompletionQueue, completion: WorkCompletion) -> bool {
        let delivered = self.completion_queues[queue.0 as usize].push(completion);
        if !delivered && !self.newly_overrun.contains(&queue) {
            self.newly_overrun.push(queue);
        }
        delivered
    }

    pub(crate) fn shared_receive_queue(
        &mut self,
        queue: SharedReceiveQueue,
    ) -> &mut BoundedQueue<ReceiveRequest> {
        &mut self.shared_receive_queues[queue.0 as usize].queue
    }
}
