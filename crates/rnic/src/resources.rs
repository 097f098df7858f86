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
    pub(crate) shared_receive_queues: Vec<SharedReceiveRing>,
    pub(crate) counters: RnicCounters,
}

impl Resources {
    /// Delivers a completion. Returns false if the queue overran; the queue
    /// then reports the loss to whoever polls it.
    pub(crate) fn complete(&mut self, queue: CompletionQueue, completion: WorkCompletion) -> bool {
        self.completion_queues[queue.0 as usize].push(completion)
    }

    pub(crate) fn shared_receive_queue(
        &mut self,
        queue: SharedReceiveQueue,
    ) -> &mut BoundedQueue<ReceiveRequest> {
        &mut self.shared_receive_queues[queue.0 as usize].queue
    }
}
