//! A host thread's own queue pair on the embedded rack: a landing buffer
//! and an outbox, registered, posted and polled through the NIC's
//! lock-free application queues. Application threads take one from a
//! [`ChannelPool`] per transfer, so no two share a queue pair and none
//! waits on the NIC's lock. A system keeps its own per-channel state in
//! `state` (SODA counts the writes its DPU has not yet persisted).

use crate::assembly::StagedRack;
use crate::endpoint::{lock, rack_queue_pair, AppQueues, DriverKicker, NodeEndpoint, Shared};
use crate::RackError;
use remora_rnic::{
    AccessFlags, CompletionOpcode, CompletionStatus, DataPath, HostMemory, MemoryRegion, QueuePair,
    QueuePairBuilder, QueuePairEndpoint, ReceiveRequest, RemoteAddress, SendOperation, SendRequest,
    Verbs, VerbsError, WorkCompletion,
};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// A request not completed by then means a dead peer (the NIC itself
/// gives up after its retries, well before).
pub const COMPLETION_DEADLINE: Duration = Duration::from_secs(5);
/// Polls of the completion queue, each after a yield, before a waiting
/// thread sleeps on its completion channel.
const SPINS_BEFORE_SLEEP: u32 = 4;
/// The longest sleep on the completion channel: a NIC that went away
/// never rings, and its queues' disconnection is seen on the next poll.
const LONGEST_SLEEP: Duration = Duration::from_millis(1);
/// Room kept after a chunk for a request's header.
pub const HEADER_ROOM: usize = 64;
/// READs a channel's queue pair has in flight: one, since a channel waits
/// for each transfer. Its peer keeps as many READ answers for replay (one
/// snapshot of up to a chunk), not the default 16: rotating a chunk-sized
/// snapshot through 16 slots kept every snapshot cold in the cache, and a
/// window of one raised the rack's 64 KiB READ rate by 15–40%
/// (`link_rate`, 2026-11-27).
pub const CHANNEL_READS_IN_FLIGHT: usize = 1;

#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    #[error("an RDMA {operation} completed with {status:?}")]
    Completion {
        operation: &'static str,
        status: CompletionStatus,
    },
    #[error("an RDMA {operation} did not complete within {COMPLETION_DEADLINE:?}")]
    TimedOut { operation: &'static str },
    #[error("the channel timed out earlier and is not used again: a late completion of that request could pass for another's")]
    Retired,
    #[error("buffer: {0}")]
    Buffer(#[from] remora_rnic::HostMemoryOutOfBounds),
}

/// A transfer's data: where a read lands, or what a write sends.
pub enum Transfer<'a> {
    Into(&'a mut [u8]),
    From(&'a [u8]),
}

impl Transfer<'_> {
    pub fn len(&self) -> usize {
        match self {
            Transfer::Into(into) => into.len(),
            Transfer::From(from) => from.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The same transfer, borrowed for a shorter time: to try it on one
    /// path and, if that path failed, on another.
    pub fn reborrow(&mut self) -> Transfer<'_> {
        match self {
            Transfer::Into(into) => Transfer::Into(into),
            Transfer::From(from) => Transfer::From(from),
        }
    }
}

/// A reply to a two-sided request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub immediate: Option<u32>,
    pub byte_len: u32,
}

pub struct Channel<S = ()> {
    pub queue_pair: QueuePair,
    /// The peer's queue pair.
    pub peer: QueuePairEndpoint,
    pub queues: AppQueues,
    /// Landing buffer (`0..chunk`) then outbox (`chunk + HEADER_ROOM..`).
    pub buffer: HostMemory,
    pub region: MemoryRegion,
    pub chunk_bytes: usize,
    /// The system's own state for this channel.
    pub state: S,
    /// Set when a request timed out. Its SEND and receive may still
    /// complete, and completions carry no request number a later user
    /// could tell apart (a posted receive takes the next reply, whoever it
    /// answers), so the channel refuses all later work.
    retired: bool,
}

const RECEIVE_ID: u64 = 1;
const SEND_ID: u64 = 2;

impl<S> Channel<S> {
    /// Bytes a channel's buffer needs for `chunk_bytes` transfers.
    pub fn buffer_bytes(chunk_bytes: usize) -> usize {
        2 * (chunk_bytes + HEADER_ROOM)
    }

    fn outbox_offset(&self) -> usize {
        self.chunk_bytes + HEADER_ROOM
    }

    pub fn landing(&self) -> &HostMemory {
        &self.buffer
    }

    /// A READ into the landing buffer, or a WRITE from it.
    pub fn one_sided(
        &mut self,
        kicker: &DriverKicker,
        remote: RemoteAddress,
        length: usize,
        read: bool,
    ) -> Result<(), ChannelError> {
        let (operation, name) = if read {
            (SendOperation::Read { remote }, "READ")
        } else {
            let operation = SendOperation::Write {
                remote,
                immediate: None,
            };
            (operation, "WRITE")
        };
        let local = self.region.slice(0, length as u32);
        self.post_send(SendRequest::new(SEND_ID, operation, &[local])?)?;
        kicker.kick();
        let completion = self.wait(name)?;
        check(&completion, name)?;
        Ok(())
    }

    /// Moves a transfer's bytes from or to `region` at `at`, one-sided, a
    /// landing buffer at a time.
    pub fn transfer(
        &mut self,
        kicker: &DriverKicker,
        region: MemoryRegion,
        at: u64,
        transfer: Transfer<'_>,
    ) -> Result<(), ChannelError> {
        let chunk = self.chunk_bytes;
        match transfer {
            Transfer::Into(into) => {
                for (index, piece) in into.chunks_mut(chunk).enumerate() {
                    let remote = region.remote(at + (index * chunk) as u64);
                    self.one_sided(kicker, remote, piece.len(), true)?;
                    self.buffer.read(0, piece)?;
                }
            }
            Transfer::From(from) => {
                for (index, piece) in from.chunks(chunk).enumerate() {
                    self.buffer.write(0, piece)?;
                    let remote = region.remote(at + (index * chunk) as u64);
                    self.one_sided(kicker, remote, piece.len(), false)?;
                }
            }
        }
        Ok(())
    }

    /// Sends `request` (with `immediate`) from the outbox and waits for
    /// the reply, which lands in the landing buffer.
    pub fn two_sided(
        &mut self,
        kicker: &DriverKicker,
        immediate: u32,
        request: &[u8],
    ) -> Result<Reply, ChannelError> {
        let outbox = self.outbox_offset();
        self.buffer.write(outbox, request)?;
        let landing = self.region.slice(0, self.chunk_bytes as u32);
        self.post_receive(ReceiveRequest::new(RECEIVE_ID, &[landing])?)?;
        let operation = SendOperation::Send {
            immediate: Some(immediate),
        };
        let local = self.region.slice(outbox as u64, request.len() as u32);
        self.post_send(SendRequest::new(SEND_ID, operation, &[local])?)?;
        kicker.kick();
        let mut reply = None;
        let mut sent = None;
        // Two completions, the SEND's and the reply's receive, both taken
        // before either is judged: when the SEND fails, the queue pair
        // flushes the receive, and that completion must not be left for
        // the channel's next user.
        while reply.is_none() || sent.is_none() {
            let completion = self.wait("SEND")?;
            match completion.opcode {
                CompletionOpcode::Receive | CompletionOpcode::ReceiveRdmaWithImmediate => {
                    reply = Some(completion)
                }
                _ => sent = Some(completion),
            }
        }
        let (sent, reply) = (
            sent.expect("the loop ends with both"),
            reply.expect("the loop ends with both"),
        );
        check(&sent, "SEND")?;
        check(&reply, "SEND")?;
        Ok(Reply {
            immediate: reply.immediate,
            byte_len: reply.byte_len,
        })
    }

    /// Brings the channel's queue pair back after a request the switch
    /// refused in the peer's name (its NAK put the queue pair in error,
    /// and the peer never saw the request): see
    /// [`Verbs::resume_queue_pair`]. Takes the NIC's lock, as a control
    /// verb does.
    pub fn resume(&mut self, endpoint: &Shared<NodeEndpoint>) -> Result<(), ChannelError> {
        Ok(lock(endpoint).rnic.resume_queue_pair(self.queue_pair)?)
    }

    fn post_send(&mut self, request: SendRequest) -> Result<(), ChannelError> {
        if self.retired {
            return Err(ChannelError::Retired);
        }
        Ok(self.queues.post_send(self.queue_pair, request)?)
    }

    fn post_receive(&mut self, request: ReceiveRequest) -> Result<(), ChannelError> {
        if self.retired {
            return Err(ChannelError::Retired);
        }
        Ok(self.queues.post_receive(self.queue_pair, request)?)
    }

    fn wait(&mut self, operation: &'static str) -> Result<WorkCompletion, ChannelError> {
        let deadline = Instant::now() + COMPLETION_DEADLINE;
        let mut spins = 0u32;
        loop {
            let completion_queue = self.queues.completion_queue();
            if let Some(completion) = self.queues.poll_completion(completion_queue)? {
                return Ok(completion);
            }
            let now = Instant::now();
            if now > deadline {
                self.retired = true;
                return Err(ChannelError::TimedOut { operation });
            }
            if spins < SPINS_BEFORE_SLEEP {
                std::thread::yield_now();
                spins += 1;
            } else {
                let remaining = deadline.saturating_duration_since(now);
                self.queues
                    .sleep_until_completion(remaining.min(LONGEST_SLEEP));
            }
        }
    }
}

fn check(completion: &WorkCompletion, operation: &'static str) -> Result<(), ChannelError> {
    if completion.status != CompletionStatus::Success {
        return Err(ChannelError::Completion {
            operation,
            status: completion.status,
        });
    }
    Ok(())
}

/// Channels to one peer, lent to one thread at a time.
pub struct ChannelPool<S = ()> {
    channels: Mutex<Vec<Channel<S>>>,
    returned: Condvar,
    count: usize,
}

impl<S> ChannelPool<S> {
    pub fn new(channels: Vec<Channel<S>>) -> ChannelPool<S> {
        ChannelPool {
            count: channels.len(),
            channels: Mutex::new(channels),
            returned: Condvar::new(),
        }
    }

    /// Channels in the pool (lent or not).
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Each channel's queue pair and its peer's.
    pub fn connections(&self) -> Vec<(QueuePair, QueuePairEndpoint)> {
        self.with_each(|channel| (channel.queue_pair, channel.peer))
    }

    /// A free channel, waiting under `channels` for one to come back; the
    /// lock stays held.
    fn take_free<'a>(
        &self,
        mut channels: MutexGuard<'a, Vec<Channel<S>>>,
    ) -> (MutexGuard<'a, Vec<Channel<S>>>, Channel<S>) {
        loop {
            if let Some(channel) = channels.pop() {
                return (channels, channel);
            }
            channels = self
                .returned
                .wait(channels)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// `look` at every channel, waiting for those lent.
    fn with_each<T>(&self, look: impl Fn(&Channel<S>) -> T) -> Vec<T> {
        let mut seen = Vec::with_capacity(self.count);
        let mut taken = Vec::with_capacity(self.count);
        {
            let mut channels = lock(&self.channels);
            while taken.len() < self.count {
                let (still_held, channel) = self.take_free(channels);
                channels = still_held;
                taken.push(channel);
            }
            seen.extend(taken.iter().map(&look));
            for channel in taken {
                give_back(&mut channels, channel);
            }
        }
        self.returned.notify_all();
        seen
    }

    /// Runs `work` on every channel, once each, taking them all first
    /// (waiting for those lent). Two callers at once could each hold part
    /// of the pool and wait for the rest: callers serialize themselves.
    /// Each channel goes back to the pool even if `work` panics.
    pub fn with_every(&self, mut work: impl FnMut(&mut Channel<S>)) {
        let mut taken = Vec::with_capacity(self.count);
        {
            let mut channels = lock(&self.channels);
            while taken.len() < self.count {
                let (still_held, channel) = self.take_free(channels);
                channels = still_held;
                taken.push(Borrowed {
                    pool: self,
                    channel: Some(channel),
                });
            }
        }
        for borrowed in &mut taken {
            work(borrowed.channel.as_mut().expect("held until dropped"));
        }
    }

    /// Runs `work` on a free channel (waiting for one). The channel goes
    /// back to the pool even if `work` panics, or every later borrower
    /// (and `with_each`, which waits for them all) would wait for ever.
    pub fn with<T>(&self, work: impl FnOnce(&mut Channel<S>) -> T) -> T {
        let (channels, channel) = self.take_free(lock(&self.channels));
        // Released before the work: other threads borrow meanwhile.
        drop(channels);
        let mut borrowed = Borrowed {
            pool: self,
            channel: Some(channel),
        };
        work(borrowed.channel.as_mut().expect("held until dropped"))
    }
}

/// A channel lent out by [`ChannelPool::with`], returned when dropped.
struct Borrowed<'a, S> {
    pool: &'a ChannelPool<S>,
    channel: Option<Channel<S>>,
}

impl<S> Drop for Borrowed<'_, S> {
    fn drop(&mut self) {
        if let Some(channel) = self.channel.take() {
            give_back(&mut lock(&self.pool.channels), channel);
            self.pool.returned.notify_one();
        }
    }
}

/// Puts a channel back among the free ones, which are lent from the end:
/// a retired one at the front, lent only when no other is free. At the
/// end, the channel that had just timed out was lent next, and every
/// transfer that took it failed at once with `Retired` while healthy
/// channels sat unused (a SODA fetch then poisoned its chunk; found by
/// review).
fn give_back<S>(free: &mut Vec<Channel<S>>, channel: Channel<S>) {
    if channel.retired {
        free.insert(0, channel);
    } else {
        free.push(channel);
    }
}

/// Connects `count` channels from host `near` to host `peer` of a staged
/// rack, each moving up to `chunk_bytes` at a time; `peer_queue` builds
/// the peer's end (its completion queue, maybe a shared receive queue).
pub fn connect_channels<S: Default>(
    staged: &mut StagedRack,
    near: usize,
    peer: usize,
    count: usize,
    chunk_bytes: usize,
    peer_queue: impl Fn() -> QueuePairBuilder,
) -> Result<ChannelPool<S>, RackError> {
    // A pool of none made every borrower wait for ever for a channel that
    // no one would give back (found by reading).
    if count == 0 {
        return Err(RackError::Config(
            "a channel pool needs at least one channel (channels = 0)".into(),
        ));
    }
    let mut pending = Vec::with_capacity(count);
    for _ in 0..count {
        let (compute, far) = staged.nic_pair_mut(near, peer);
        let domain = compute.alloc_protection_domain()?;
        let completion_queue = compute.create_completion_queue(8)?;
        let buffer = HostMemory::new(Channel::<S>::buffer_bytes(chunk_bytes));
        let region =
            compute.register_host_memory(domain, buffer.clone(), AccessFlags::LOCAL_WRITE)?;
        let mut near_builder = rack_queue_pair(domain, completion_queue);
        near_builder.max_read_atomic = CHANNEL_READS_IN_FLIGHT;
        let near_queue = compute.create_queue_pair(&near_builder)?;
        let mut far_builder = peer_queue();
        far_builder.max_destination_read_atomic = CHANNEL_READS_IN_FLIGHT;
        let far_queue = far.create_queue_pair(&far_builder)?;
        let (near_endpoint, far_endpoint) = (near_queue.endpoint, far_queue.endpoint);
        far.handshake(far_queue, near_endpoint)?;
        let (compute, _) = staged.nic_pair_mut(near, peer);
        let queue_pair = compute.handshake(near_queue, far_endpoint)?;
        pending.push((queue_pair, far_endpoint, completion_queue, buffer, region));
    }
    let endpoint = staged.endpoint_mut(near);
    let channels = pending
        .into_iter()
        .map(
            |(queue_pair, peer, completion_queue, buffer, region)| Channel {
                queue_pair,
                peer,
                queues: endpoint.attach_queues(completion_queue, 8),
                buffer,
                region,
                chunk_bytes,
                state: S::default(),
                retired: false,
            },
        )
        .collect();
    Ok(ChannelPool::new(channels))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assembly::RackBuilder;
    use crate::endpoint::rack_queue_pair;
    use crate::topology::Topology;

    /// A channel that timed out went back to the end of the free list and
    /// was lent next, so every later transfer that took it failed at once
    /// while the healthy channel sat unused. It waits behind them now.
    #[test]
    fn a_retired_channel_is_lent_only_when_no_other_is_free() {
        let topology = Topology::compute_and_memory();
        let mut staged = RackBuilder::new(&topology)
            .thread_name("retired-channel")
            .build()
            .unwrap();
        let memory = staged.nic_mut(1);
        let domain = memory.alloc_protection_domain().unwrap();
        let completions = memory.create_completion_queue(8).unwrap();
        let pool = connect_channels::<()>(&mut staged, 0, 1, 2, 4096, || {
            rack_queue_pair(domain, completions)
        })
        .unwrap();
        let retired = pool.with(|channel| {
            channel.retired = true;
            channel.queue_pair
        });
        for _ in 0..3 {
            let lent = pool.with(|channel| channel.queue_pair);
            assert_ne!(lent, retired, "the retired channel was lent first");
        }
        // Both taken at once: the retired one is still lent then.
        let mut lent = Vec::new();
        pool.with_every(|channel| lent.push(channel.queue_pair));
        assert!(lent.contains(&retired));
        assert_ne!(pool.with(|channel| channel.queue_pair), retired);
    }
}
