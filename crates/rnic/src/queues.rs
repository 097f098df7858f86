//! Fixed-depth queues: the SQ, RQ, SRQ and CQ. Memory is reserved at
//! creation and a full queue refuses work instead of growing.

use crate::verbs::{CompletionStatus, VerbsError, WorkCompletion};
use std::collections::VecDeque;

#[derive(Debug)]
pub(crate) struct BoundedQueue<T> {
    entries: VecDeque<T>,
    depth: usize,
    name: &'static str,
}

impl<T> BoundedQueue<T> {
    pub(crate) fn new(name: &'static str, depth: usize) -> BoundedQueue<T> {
        assert!(depth > 0);
        BoundedQueue {
            entries: VecDeque::with_capacity(depth),
            depth,
            name,
        }
    }

    pub(crate) fn push(&mut self, entry: T) -> Result<(), VerbsError> {
        if self.entries.len() == self.depth {
            return Err(VerbsError::QueueFull { queue: self.name });
        }
        self.entries.push_back(entry);
        Ok(())
    }

    /// Entries it still takes.
    pub(crate) fn room(&self) -> usize {
        self.depth - self.entries.len()
    }

    pub(crate) fn pop(&mut self) -> Option<T> {
        let entry = self.entries.pop_front();
        reuse_first_slot_when_empty(&mut self.entries);
        entry
    }

    pub(crate) fn front(&self) -> Option<&T> {
        self.entries.front()
    }

    pub(crate) fn front_mut(&mut self) -> Option<&mut T> {
        self.entries.front_mut()
    }

    pub(crate) fn get(&self, index: usize) -> Option<&T> {
        self.entries.get(index)
    }

    pub(crate) fn get_mut(&mut self, index: usize) -> Option<&mut T> {
        self.entries.get_mut(index)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.entries.iter()
    }

    /// Keeps only the entries `keep` says, in order.
    pub(crate) fn retain(&mut self, keep: impl FnMut(&T) -> bool) {
        self.entries.retain(keep);
        reuse_first_slot_when_empty(&mut self.entries);
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Starts an emptied deque over at its first slot. Popping moves a deque's
/// start on through its buffer, so a queue pair that holds one request at
/// a time would touch a new slot, a cold cache line, with every request;
/// with a thousand queue pairs active, those misses were a fifth of a READ.
pub(crate) fn reuse_first_slot_when_empty<T>(entries: &mut VecDeque<T>) {
    if entries.is_empty() {
        // `clear` on an empty deque only resets its start.
        entries.clear();
    }
}

/// Checks a requested depth against a device limit.
pub(crate) fn check_depth(
    queue: &'static str,
    requested: usize,
    max: usize,
) -> Result<(), VerbsError> {
    if requested == 0 || requested > max {
        return Err(VerbsError::InvalidQueueDepth {
            queue,
            requested,
            max,
        });
    }
    Ok(())
}

/// Which of a kind's numbered objects (queue pairs' slots, completion
/// queues, shared receive queues) were destroyed, so that new ones take
/// their places, the longest destroyed first: without it a process could
/// create at most the device's limit of each in its lifetime.
#[derive(Debug, Default)]
pub(crate) struct Retired {
    flags: Vec<bool>,
    free: std::collections::VecDeque<usize>,
}

impl Retired {
    pub(crate) fn is_retired(&self, index: usize) -> bool {
        self.flags.get(index).copied().unwrap_or(false)
    }

    pub(crate) fn retire(&mut self, index: usize) {
        if self.flags.len() <= index {
            self.flags.resize(index + 1, false);
        }
        if !self.flags[index] {
            self.flags[index] = true;
            self.free.push_back(index);
        }
    }

    /// A destroyed place for a new object, if there is one.
    pub(crate) fn reuse(&mut self) -> Option<usize> {
        let index = self.free.pop_front()?;
        self.flags[index] = false;
        Some(index)
    }

    /// How many places wait to be reused.
    pub(crate) fn count(&self) -> usize {
        self.free.len()
    }

    /// Whether place `index` of `items` holds a live object.
    pub(crate) fn holds<T>(&self, items: &[T], index: usize) -> bool {
        index < items.len() && !self.is_retired(index)
    }

    /// How many of `items` are live.
    pub(crate) fn live<T>(&self, items: &[T]) -> usize {
        items.len() - self.count()
    }

    /// Puts `item` in the place destroyed longest ago, or a new one at the
    /// end of `items`; its index.
    pub(crate) fn place<T>(&mut self, items: &mut Vec<T>, item: T) -> usize {
        match self.reuse() {
            Some(index) => {
                items[index] = item;
                index
            }
            None => {
                items.push(item);
                items.len() - 1
            }
        }
    }
}

/// Fails with `TooManyObjects` once `count` objects of a kind reach `max`.
pub(crate) fn check_room(kind: &'static str, count: usize, max: usize) -> Result<(), VerbsError> {
    if count >= max {
        return Err(VerbsError::TooManyObjects { kind, max });
    }
    Ok(())
}

/// A completion queue. Overrunning it loses a completion, which IB treats
/// as a catastrophic error of the queue: once the completions it held
/// before are polled, polling reports `CompletionQueueOverrun` rather than
/// pretend nothing was lost, and the device moves every queue pair bound
/// to it to ERR.
#[derive(Debug)]
pub(crate) struct CompletionRing {
    queue: BoundedQueue<WorkCompletion>,
    overrun: bool,
}

impl CompletionRing {
    pub(crate) fn new(depth: usize) -> CompletionRing {
        CompletionRing {
            queue: BoundedQueue::new("completion queue", depth),
            overrun: false,
        }
    }

    /// Drops the completions of queue pair `qpn`.
    pub(crate) fn discard_of(&mut self, qpn: remora_wire::Qpn) {
        self.queue.retain(|completion| completion.qpn != qpn);
    }

    /// Returns false when the completion was lost to an overrun.
    pub(crate) fn push(&mut self, completion: WorkCompletion) -> bool {
        if self.overrun || self.queue.push(completion).is_err() {
            self.overrun = true;
            return false;
        }
        true
    }

    /// Whether a completion was lost to an overrun.
    pub(crate) fn overran(&self) -> bool {
        self.overrun
    }

    /// Completions waiting to be polled (an overrun counts as one: the
    /// poll that reports it).
    pub(crate) fn waiting(&self) -> usize {
        self.queue.len().max(usize::from(self.overrun))
    }

    /// Whether a completion waiting to be polled would wake a waiter armed
    /// for solicited completions only: a solicited receive, a failure, or
    /// the overrun.
    pub(crate) fn solicited_or_failed_waiting(&self) -> bool {
        self.overrun
            || self.queue.iter().any(|completion| {
                completion.solicited || completion.status != CompletionStatus::Success
            })
    }

    /// The oldest completion; after an overrun, the completions written
    /// before it (as on hardware, they are intact) and then the overrun.
    pub(crate) fn pop(&mut self) -> Result<Option<WorkCompletion>, VerbsError> {
        match self.queue.pop() {
            Some(completion) => Ok(Some(completion)),
            None if self.overrun => Err(VerbsError::CompletionQueueOverrun),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::{CompletionOpcode, CompletionStatus};
    use remora_wire::Qpn;

    fn completion(id: u64) -> WorkCompletion {
        WorkCompletion {
            work_request_id: id,
            status: CompletionStatus::Success,
            opcode: CompletionOpcode::Send,
            qpn: Qpn::new(1).unwrap(),
            byte_len: 0,
            immediate: None,
            solicited: false,
        }
    }

    #[test]
    fn a_full_queue_refuses_work() {
        let mut queue = BoundedQueue::new("send queue", 2);
        queue.push(1).unwrap();
        queue.push(2).unwrap();
        assert_eq!(
            queue.push(3),
            Err(VerbsError::QueueFull {
                queue: "send queue"
            })
        );
        assert_eq!(queue.pop(), Some(1));
    }

    #[test]
    fn an_overrun_completion_queue_reports_the_loss_after_what_it_held() {
        let mut ring = CompletionRing::new(1);
        assert!(ring.push(completion(1)));
        assert!(!ring.push(completion(2)));
        assert_eq!(ring.waiting(), 1);
        // The completion written before the overrun is intact.
        assert_eq!(ring.pop(), Ok(Some(completion(1))));
        assert_eq!(ring.waiting(), 1, "the overrun is still to be reported");
        assert_eq!(ring.pop(), Err(VerbsError::CompletionQueueOverrun));
        assert_eq!(ring.pop(), Err(VerbsError::CompletionQueueOverrun));
    }

    #[test]
    fn only_solicited_or_failed_completions_wake_a_solicited_waiter() {
        let mut ring = CompletionRing::new(4);
        assert!(ring.push(completion(1)));
        assert!(!ring.solicited_or_failed_waiting());
        let solicited = WorkCompletion {
            solicited: true,
            ..completion(2)
        };
        assert!(ring.push(solicited));
        assert!(ring.solicited_or_failed_waiting());
        let mut ring = CompletionRing::new(4);
        let failed = WorkCompletion {
            status: CompletionStatus::WorkRequestFlushError,
            ..completion(3)
        };
        assert!(ring.push(failed));
        assert!(ring.solicited_or_failed_waiting());
    }

    /// Where the queue's next entry will sit in its buffer.
    fn front_slot_address(queue: &BoundedQueue<u64>) -> usize {
        queue.entries.as_slices().0.as_ptr() as usize
    }

    #[test]
    fn an_emptied_queue_starts_again_at_its_first_slot() {
        let mut queue = BoundedQueue::new("send queue", 8);
        queue.push(1).unwrap();
        let first = front_slot_address(&queue);
        for request in 2..20 {
            assert!(queue.pop().is_some());
            queue.push(request).unwrap();
            assert_eq!(front_slot_address(&queue), first, "request {request}");
        }
        // A queue that never empties moves on through its buffer, as it must.
        queue.push(20).unwrap();
        assert!(queue.pop().is_some());
        assert_ne!(front_slot_address(&queue), first);
    }
}
