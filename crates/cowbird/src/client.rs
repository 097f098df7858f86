//! The compute-side client library (section 4): one [`Client`] per
//! application thread, over one block of host memory registered with the
//! compute node's NIC. Issuing a request and checking for completions are
//! local loads, stores and atomics on that block: no verb, no lock, no
//! system call and no background thread. An offload engine finds the
//! requests by reading the block and reports progress by writing it.
//!
//! The API is Table 2's: [`Client::async_read`], [`Client::async_write`],
//! [`Client::poll_create`], [`Client::poll_add`], [`Client::poll_remove`]
//! and [`Client::poll_wait`]. A full ring is [`CowbirdError::RetryLater`].
//!
//! Space is reclaimed in issue order once requests complete: request
//! metadata and write payloads at completion, a read's response once
//! `poll_wait` has returned it and been called again (its bytes stay
//! readable with [`Client::response`] until then, like a completion-queue
//! entry).

use crate::layout::{
    Entry, Kind, RequestId, RingSizes, ENTRY_BYTES, MAX_REGIONS, MAX_REQUEST_BYTES,
    METADATA_TAIL_AT, READ_PROGRESS_AT, REQUEST_DATA_TAIL_AT, WRITE_PROGRESS_AT,
};
use remora_rnic::HostMemory;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Poll groups one client may hold.
pub const MAX_POLL_GROUPS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CowbirdError {
    #[error("region {0} is not registered with this client")]
    UnknownRegion(u16),
    #[error(
        "{length} bytes at offset {offset} are outside region {region} ({region_bytes} bytes)"
    )]
    OutOfBounds {
        region: u16,
        offset: u64,
        length: u32,
        region_bytes: u64,
    },
    #[error("a response of {need} bytes does not fit a buffer of {have}")]
    BufferTooSmall { need: usize, have: usize },
    #[error("a request must move at least one byte")]
    ZeroLength,
    #[error("{length} bytes exceed the {limit}-byte limit of one request")]
    TooLong { length: usize, limit: u32 },
    #[error("the {0} is full: complete outstanding requests and retry later")]
    RetryLater(&'static str),
    #[error("poll group {0} does not exist")]
    UnknownPollGroup(usize),
    #[error("{MAX_POLL_GROUPS} poll groups exist already")]
    TooManyPollGroups,
    #[error("request {0:?} is not outstanding on this client")]
    UnknownRequest(RequestId),
    #[error("host memory of {have} bytes cannot hold rings needing {need}")]
    BlockTooSmall { have: usize, need: u64 },
    #[error("ring sizes {0:?} cannot hold one largest request")]
    BadRingSizes(RingSizes),
    #[error("a client addresses 1 to {MAX_REGIONS} memory regions, not {0}")]
    BadRegionCount(usize),
}

/// A completed request, as `poll_wait` returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub id: RequestId,
    /// A read's bytes: offset in the block and length.
    pub response: Option<(u64, u32)>,
}

#[derive(Debug, Clone, Copy)]
struct Outstanding {
    id: RequestId,
    /// Where this request's ring space ends (monotonic counters), so
    /// completing it in order frees up to there.
    request_data_end: u64,
    response_data_end: u64,
    response: Option<(u64, u32)>,
    /// In a poll group (at most one).
    grouped: bool,
    /// Nobody can look at its response any more: never awaited, removed
    /// from its group, or returned by a `poll_wait` before the last.
    released: bool,
}

#[derive(Debug, Default)]
struct PollGroup {
    /// Per type, in the order added. Requests of one type complete in
    /// sequence order, so a poll pops completed ones off the front and
    /// never scans the rest (members added out of sequence order are
    /// returned no earlier than those added before them).
    members: [VecDeque<RequestId>; 2],
}

/// One application thread's side of Cowbird.
pub struct Client {
    block: HostMemory,
    sizes: RingSizes,
    /// Bytes of each region, by region id.
    regions: Vec<u64>,
    metadata_tail: u64,
    request_data_tail: u64,
    response_data_tail: u64,
    request_data_head: u64,
    response_data_head: u64,
    next_sequence: [u64; 2],
    /// Issued and not yet reclaimed, in issue order; the front is issue
    /// number `reclaimed`.
    outstanding: VecDeque<Outstanding>,
    reclaimed: u64,
    /// Per type, the issue numbers of outstanding requests in sequence
    /// order, and the sequence of the first: finds a request in O(1).
    issue_numbers: [VecDeque<u64>; 2],
    first_sequence: [u64; 2],
    groups: Vec<Option<PollGroup>>,
    /// Returned by the last `poll_wait`: released at the next.
    delivered: Vec<RequestId>,
    /// The longest write the engine behind this client takes.
    max_write_bytes: u32,
}

fn kind_index(kind: Kind) -> usize {
    match kind {
        Kind::Read => 0,
        Kind::Write => 1,
    }
}

/// A client needs a region to address, and a request id holds at most
/// [`MAX_REGIONS`] region numbers.
pub fn check_region_count(count: usize) -> Result<(), CowbirdError> {
    if (1..=usize::from(MAX_REGIONS)).contains(&count) {
        Ok(())
    } else {
        Err(CowbirdError::BadRegionCount(count))
    }
}

impl Client {
    /// A client over `block` (zeroed, registered with the compute NIC),
    /// for memory regions of the given sizes (region id = index).
    pub fn new(
        block: HostMemory,
        sizes: RingSizes,
        regions: Vec<u64>,
    ) -> Result<Client, CowbirdError> {
        if !sizes.is_valid() {
            return Err(CowbirdError::BadRingSizes(sizes));
        }
        if (block.len() as u64) < sizes.block_bytes() {
            return Err(CowbirdError::BlockTooSmall {
                have: block.len(),
                need: sizes.block_bytes(),
            });
        }
        check_region_count(regions.len())?;
        Ok(Client {
            block,
            sizes,
            regions,
            metadata_tail: 0,
            request_data_tail: 0,
            response_data_tail: 0,
            request_data_head: 0,
            response_data_head: 0,
            next_sequence: [1, 1],
            outstanding: VecDeque::with_capacity(sizes.metadata_entries as usize),
            reclaimed: 0,
            issue_numbers: [VecDeque::new(), VecDeque::new()],
            first_sequence: [1, 1],
            groups: Vec::new(),
            delivered: Vec::new(),
            max_write_bytes: MAX_REQUEST_BYTES,
        })
    }

    pub fn sizes(&self) -> RingSizes {
        self.sizes
    }

    /// The block the engine reads and writes: for tests and tools that
    /// play a broken or hostile client.
    pub fn block(&self) -> &HostMemory {
        &self.block
    }

    /// Refuses writes longer than `bytes` ([`CowbirdError::TooLong`]):
    /// Cowbird-P4 moves a write's payload in one packet (see
    /// [`crate::p4`]), so its deployments cap writes at the path MTU.
    /// The longest write this client's engine takes in one request.
    pub fn max_write_bytes(&self) -> u32 {
        self.max_write_bytes
    }

    pub fn limit_write_bytes(&mut self, bytes: u32) {
        self.max_write_bytes = bytes.clamp(1, MAX_REQUEST_BYTES);
    }

    /// Requests issued and not yet reclaimed.
    pub fn outstanding(&self) -> usize {
        self.outstanding.len()
    }

    fn check_range(&self, region: u16, offset: u64, length: usize) -> Result<u32, CowbirdError> {
        let region_bytes = *self
            .regions
            .get(usize::from(region))
            .ok_or(CowbirdError::UnknownRegion(region))?;
        if length == 0 {
            return Err(CowbirdError::ZeroLength);
        }
        if length > MAX_REQUEST_BYTES as usize {
            return Err(CowbirdError::TooLong {
                length,
                limit: MAX_REQUEST_BYTES,
            });
        }
        let length = length as u32;
        match offset.checked_add(u64::from(length)) {
            Some(end) if end <= region_bytes => Ok(length),
            _ => Err(CowbirdError::OutOfBounds {
                region,
                offset,
                length,
                region_bytes,
            }),
        }
    }

    /// Reserves `length` contiguous bytes of a ring: returns (offset in
    /// the ring, new tail). Skips the ring's end if the bytes would wrap.
    fn reserve(tail: u64, head: u64, ring_bytes: u64, length: u64) -> Option<(u64, u64)> {
        let position = tail % ring_bytes;
        let start = if position + length > ring_bytes {
            tail + (ring_bytes - position)
        } else {
            tail
        };
        let end = start + length;
        // An empty ring holds nothing the skipped end could overlap: the
        // skip counted as used made a ring under twice the longest
        // request refuse a long one for good, whatever was reclaimed.
        let occupied_from = if head == tail { start } else { head };
        (end - occupied_from <= ring_bytes).then_some((start % ring_bytes, end))
    }

    /// Room for one more entry. Progress (a cache line the NIC writes) is
    /// read only when the ring looks full, so issuing stays local.
    fn reserve_entry(&mut self) -> Result<(), CowbirdError> {
        if self.outstanding.len() as u64 >= self.sizes.metadata_entries {
            self.reclaim();
        }
        if self.outstanding.len() as u64 >= self.sizes.metadata_entries {
            return Err(CowbirdError::RetryLater("request metadata ring"));
        }
        Ok(())
    }

    /// [`Client::reserve`] on the response ring, reclaiming first if full.
    fn reserve_response(&mut self, length: u64) -> Option<(u64, u64)> {
        let ring = self.sizes.response_data_bytes;
        Self::reserve(
            self.response_data_tail,
            self.response_data_head,
            ring,
            length,
        )
        .or_else(|| {
            self.reclaim();
            Self::reserve(
                self.response_data_tail,
                self.response_data_head,
                ring,
                length,
            )
        })
    }

    /// [`Client::reserve`] on the request data ring, reclaiming first if full.
    fn reserve_request_data(&mut self, length: u64) -> Option<(u64, u64)> {
        let ring = self.sizes.request_data_bytes;
        Self::reserve(self.request_data_tail, self.request_data_head, ring, length).or_else(|| {
            self.reclaim();
            Self::reserve(self.request_data_tail, self.request_data_head, ring, length)
        })
    }

    /// Starts reading `length` bytes at `offset` of memory region
    /// `region`. The bytes arrive in the response ring.
    pub fn async_read(
        &mut self,
        region: u16,
        offset: u64,
        length: usize,
    ) -> Result<RequestId, CowbirdError> {
        let length = self.check_range(region, offset, length)?;
        self.reserve_entry()?;
        let (at, end) = self
            .reserve_response(u64::from(length))
            .ok_or(CowbirdError::RetryLater("response data ring"))?;
        let response_at = self.sizes.response_data_at() + at;
        self.response_data_tail = end;
        let id = self.publish(Entry {
            kind: Kind::Read,
            region,
            length,
            request_address: offset,
            response_address: response_at,
            sequence: self.next_sequence[0],
        });
        self.outstanding.back_mut().expect("just pushed").response = Some((response_at, length));
        Ok(id)
    }

    /// Starts writing `bytes` to `offset` of memory region `region`. The
    /// bytes are copied into the request data ring now.
    pub fn async_write(
        &mut self,
        region: u16,
        offset: u64,
        bytes: &[u8],
    ) -> Result<RequestId, CowbirdError> {
        let length = self.check_range(region, offset, bytes.len())?;
        if length > self.max_write_bytes {
            return Err(CowbirdError::TooLong {
                length: bytes.len(),
                limit: self.max_write_bytes,
            });
        }
        self.reserve_entry()?;
        let (at, end) = self
            .reserve_request_data(u64::from(length))
            .ok_or(CowbirdError::RetryLater("request data ring"))?;
        let payload_at = self.sizes.request_data_at() + at;
        self.block
            .write(payload_at as usize, bytes)
            .expect("ring inside the block");
        self.request_data_tail = end;
        self.block
            .store_u64(REQUEST_DATA_TAIL_AT as usize, end, Ordering::Release)
            .expect("aligned word");
        Ok(self.publish(Entry {
            kind: Kind::Write,
            region,
            length,
            request_address: payload_at,
            response_address: offset,
            sequence: self.next_sequence[1],
        }))
    }

    /// Writes the entry, then publishes it by moving the metadata tail
    /// with a release store: an engine that reads the tail sees the entry.
    fn publish(&mut self, entry: Entry) -> RequestId {
        let mut bytes = [0u8; ENTRY_BYTES as usize];
        entry.emit(&mut bytes);
        let at = self.sizes.entry_at(self.metadata_tail) as usize;
        self.block.write(at, &bytes).expect("ring inside the block");
        self.metadata_tail += 1;
        self.block
            .store_u64(
                METADATA_TAIL_AT as usize,
                self.metadata_tail,
                Ordering::Release,
            )
            .expect("aligned word");
        let kind = kind_index(entry.kind);
        self.next_sequence[kind] += 1;
        let id = RequestId::new(entry.kind, entry.region, entry.sequence);
        let issue_number = self.reclaimed + self.outstanding.len() as u64;
        self.issue_numbers[kind].push_back(issue_number);
        self.outstanding.push_back(Outstanding {
            id,
            request_data_end: self.request_data_tail,
            response_data_end: self.response_data_tail,
            response: None,
            grouped: false,
            released: true,
        });
        id
    }

    /// The outstanding request `id`, found without a search.
    fn find(&mut self, id: RequestId) -> Option<&mut Outstanding> {
        let kind = kind_index(id.kind());
        let position = id.sequence().checked_sub(self.first_sequence[kind])?;
        let issue_number = *self.issue_numbers[kind].get(position as usize)?;
        let request = self
            .outstanding
            .get_mut((issue_number - self.reclaimed) as usize)?;
        (request.id == id).then_some(request)
    }

    fn progress(&self) -> [u64; 2] {
        let load = |at: u64| {
            self.block
                .load_u64(at as usize, Ordering::Acquire)
                .expect("aligned word")
        };
        [load(READ_PROGRESS_AT), load(WRITE_PROGRESS_AT)]
    }

    /// Whether `id` has completed: one comparison against progress.
    pub fn is_complete(&self, id: RequestId) -> bool {
        id.sequence() <= self.progress()[kind_index(id.kind())]
    }

    /// Frees ring space of requests at the front that are done with:
    /// complete, out of every poll group, and, for a read someone waited
    /// for, released.
    fn reclaim(&mut self) {
        let progress = self.progress();
        while let Some(front) = self.outstanding.front() {
            let complete = front.id.sequence() <= progress[kind_index(front.id.kind())];
            let done =
                complete && !front.grouped && (front.id.kind() == Kind::Write || front.released);
            if !done {
                break;
            }
            self.request_data_head = self.request_data_head.max(front.request_data_end);
            self.response_data_head = self.response_data_head.max(front.response_data_end);
            let kind = kind_index(front.id.kind());
            // Same-type requests are issued in sequence order, so the
            // front of the queue is the front of its type.
            let popped = self.issue_numbers[kind].pop_front();
            assert_eq!(popped, Some(self.reclaimed));
            self.first_sequence[kind] += 1;
            self.outstanding.pop_front();
            self.reclaimed += 1;
        }
    }

    pub fn poll_create(&mut self) -> Result<usize, CowbirdError> {
        if let Some(free) = self.groups.iter().position(Option::is_none) {
            self.groups[free] = Some(PollGroup::default());
            return Ok(free);
        }
        if self.groups.len() == MAX_POLL_GROUPS {
            return Err(CowbirdError::TooManyPollGroups);
        }
        self.groups.push(Some(PollGroup::default()));
        Ok(self.groups.len() - 1)
    }

    fn group(&mut self, poll_id: usize) -> Result<&mut PollGroup, CowbirdError> {
        self.groups
            .get_mut(poll_id)
            .and_then(Option::as_mut)
            .ok_or(CowbirdError::UnknownPollGroup(poll_id))
    }

    /// Adds an outstanding request to a group. A request belongs to one
    /// group at a time, so groups stay bounded by the metadata ring.
    pub fn poll_add(&mut self, poll_id: usize, id: RequestId) -> Result<(), CowbirdError> {
        self.group(poll_id)?;
        let request = self.find(id).ok_or(CowbirdError::UnknownRequest(id))?;
        if request.grouped || !request.released {
            return Err(CowbirdError::UnknownRequest(id));
        }
        request.grouped = true;
        request.released = false;
        self.group(poll_id)?.members[kind_index(id.kind())].push_back(id);
        Ok(())
    }

    pub fn poll_remove(&mut self, poll_id: usize, id: RequestId) -> Result<(), CowbirdError> {
        let group = self.group(poll_id)?;
        let members = &mut group.members[kind_index(id.kind())];
        let before = members.len();
        members.retain(|member| *member != id);
        if members.len() == before {
            return Err(CowbirdError::UnknownRequest(id));
        }
        // Nobody will wait for it now: its response may be reused.
        if let Some(request) = self.find(id) {
            request.released = true;
            request.grouped = false;
        }
        Ok(())
    }

    /// Deletes a poll group. Its members are released, as `poll_remove`
    /// releases one: nobody will wait for them through it, and a request
    /// left grouped would stop reclaiming at the ring's front for good.
    pub fn poll_destroy(&mut self, poll_id: usize) -> Result<(), CowbirdError> {
        self.group(poll_id)?;
        let group = self.groups[poll_id].take().expect("checked just now");
        for id in group.members.into_iter().flatten() {
            if let Some(request) = self.find(id) {
                request.released = true;
                request.grouped = false;
            }
        }
        Ok(())
    }

    /// Waits until `max_ret` of the group's requests completed or
    /// `timeout` passed, and appends those that did to `responses`.
    /// Responses returned by the previous call may be overwritten from now.
    pub fn poll_wait(
        &mut self,
        poll_id: usize,
        responses: &mut Vec<Completion>,
        max_ret: usize,
        timeout: Duration,
    ) -> Result<usize, CowbirdError> {
        self.group(poll_id)?;
        // Keeps the vector's capacity: no allocation per poll.
        let delivered = std::mem::take(&mut self.delivered);
        for id in &delivered {
            if let Some(request) = self.find(*id) {
                request.released = true;
            }
        }
        self.delivered = delivered;
        self.delivered.clear();
        self.reclaim();
        // A zero timeout is one look, and needs no clock: polls run
        // every few operations, and a clock read costs as much as a look.
        let mut started = None;
        // Counted over every look: each look's finds are in `responses`
        // already (the count of the last look alone was returned, and
        // each look could take `max_ret` more).
        let mut found = 0;
        loop {
            found += self.collect(poll_id, responses, max_ret - found);
            if found >= max_ret || timeout.is_zero() {
                return Ok(found);
            }
            if started.get_or_insert_with(Instant::now).elapsed() >= timeout {
                return Ok(found);
            }
            std::hint::spin_loop();
        }
    }

    /// Moves completed members of a group to `responses`, up to `max_ret`.
    fn collect(
        &mut self,
        poll_id: usize,
        responses: &mut Vec<Completion>,
        max_ret: usize,
    ) -> usize {
        let progress = self.progress();
        let mut found = 0;
        for (kind, progress) in progress.into_iter().enumerate() {
            // Bounded by the group's members.
            while found < max_ret {
                let group = self.groups[poll_id].as_mut().expect("checked");
                let Some(&id) = group.members[kind].front() else {
                    break;
                };
                if id.sequence() > progress {
                    break;
                }
                group.members[kind].pop_front();
                let request = self.find(id).expect("members are outstanding");
                request.grouped = false;
                responses.push(Completion {
                    id,
                    response: request.response,
                });
                self.delivered.push(id);
                found += 1;
            }
        }
        found
    }

    /// Copies a read's bytes out of the response ring.
    pub fn response(&self, completion: &Completion, into: &mut [u8]) -> Result<(), CowbirdError> {
        let (at, length) = completion
            .response
            .ok_or(CowbirdError::UnknownRequest(completion.id))?;
        // A completion's fields are public: one whose response lies
        // outside this client's response ring (another client's, with
        // larger rings) is refused, not read there (which panicked past
        // the block). One inside the ring is not checked further: another
        // client's of the same ring sizes reads this client's bytes there.
        let ring_start = self.sizes.response_data_at();
        let ring_end = ring_start + self.sizes.response_data_bytes;
        let end = at.checked_add(u64::from(length));
        if at < ring_start || end.is_none_or(|end| end > ring_end) {
            return Err(CowbirdError::UnknownRequest(completion.id));
        }
        let length = length as usize;
        if into.len() < length {
            return Err(CowbirdError::BufferTooSmall {
                need: length,
                have: into.len(),
            });
        }
        self.block
            .read(at as usize, &mut into[..length])
            .expect("the response ring lies inside the block");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{READ_PROGRESS_AT, WRITE_PROGRESS_AT};
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    /// A ring under twice the longest request, emptied after a short one,
    /// refused a request of the longest for good: the bytes its wrap
    /// skipped counted as used though nothing was.
    #[test]
    fn an_empty_small_ring_takes_the_longest_request() {
        let sizes = RingSizes {
            metadata_entries: 8,
            request_data_bytes: u64::from(MAX_REQUEST_BYTES),
            response_data_bytes: u64::from(MAX_REQUEST_BYTES),
        };
        let block = HostMemory::new(sizes.block_bytes() as usize);
        let mut client = Client::new(block.clone(), sizes, vec![1 << 20]).unwrap();
        let longest = vec![7u8; MAX_REQUEST_BYTES as usize];
        client.async_write(0, 0, &longest[..100]).unwrap();
        block
            .store_u64(WRITE_PROGRESS_AT as usize, 1, Ordering::Release)
            .unwrap();
        client
            .async_write(0, 0, &longest)
            .expect("the emptied request ring takes the longest write");
        block
            .store_u64(WRITE_PROGRESS_AT as usize, 2, Ordering::Release)
            .unwrap();
        let group = client.poll_create().unwrap();
        let short = client.async_read(0, 0, 100).unwrap();
        client.poll_add(group, short).unwrap();
        block
            .store_u64(READ_PROGRESS_AT as usize, 1, Ordering::Release)
            .unwrap();
        let mut done = Vec::new();
        client
            .poll_wait(group, &mut done, 1, Duration::ZERO)
            .unwrap();
        assert_eq!(done.len(), 1);
        // The next wait releases the response the last one handed out.
        client
            .poll_wait(group, &mut done, 1, Duration::ZERO)
            .unwrap();
        client
            .async_read(0, 0, MAX_REQUEST_BYTES as usize)
            .expect("the emptied response ring takes the longest read");
    }

    /// A wait that found one completion, then timed out, returned the last
    /// look's count, 0, with the completion in the vector.
    #[test]
    fn a_wait_counts_what_every_look_found() {
        let block = HostMemory::new(RingSizes::DEFAULT.block_bytes() as usize);
        let mut client = Client::new(block.clone(), RingSizes::DEFAULT, vec![1 << 20]).unwrap();
        let group = client.poll_create().unwrap();
        for offset in [0, 64] {
            let id = client.async_read(0, offset, 64).unwrap();
            client.poll_add(group, id).unwrap();
        }
        block
            .store_u64(READ_PROGRESS_AT as usize, 1, Ordering::Release)
            .unwrap();
        let mut done = Vec::new();
        let found = client
            .poll_wait(group, &mut done, 2, Duration::from_millis(2))
            .unwrap();
        assert_eq!((found, done.len()), (1, 1));
    }

    /// A completion from another client, whose response lies past this
    /// client's block, panicked in `response`; it is a typed error.
    #[test]
    fn a_foreign_completion_is_a_typed_error_not_a_panic() {
        let small = RingSizes {
            metadata_entries: 8,
            ..RingSizes::DEFAULT
        };
        let block = HostMemory::new(small.block_bytes() as usize);
        let client = Client::new(block, small, vec![1 << 20]).unwrap();
        let foreign = Completion {
            id: RequestId(3),
            response: Some((small.block_bytes() + 4096, 64)),
        };
        let mut into = [0u8; 64];
        assert!(matches!(
            client.response(&foreign, &mut into),
            Err(CowbirdError::UnknownRequest(RequestId(3)))
        ));
    }

    /// A group destroyed with requests in it (a kv session dropped with
    /// reads in flight) left them grouped: reclaiming stopped at them, and
    /// after a ring's worth of requests the client refused every one.
    #[test]
    fn a_destroyed_groups_requests_are_reclaimed_once_complete() {
        let sizes = RingSizes {
            metadata_entries: 8,
            ..RingSizes::DEFAULT
        };
        let block = HostMemory::new(sizes.block_bytes() as usize);
        let mut client = Client::new(block.clone(), sizes, vec![1 << 20]).unwrap();
        let group = client.poll_create().unwrap();
        for index in 0..4 {
            let id = client.async_read(0, index * 64, 64).unwrap();
            client.poll_add(group, id).unwrap();
        }
        client.poll_destroy(group).unwrap();
        // The engine completes them.
        block
            .store_u64(READ_PROGRESS_AT as usize, 4, Ordering::Release)
            .unwrap();
        // Four rings' worth more, each completed as it goes: room comes
        // back only if the first four were reclaimed.
        for sequence in 5..=4 * sizes.metadata_entries {
            client
                .async_read(0, 0, 64)
                .unwrap_or_else(|error| panic!("request {sequence}: {error}"));
            block
                .store_u64(READ_PROGRESS_AT as usize, sequence, Ordering::Release)
                .unwrap();
        }
    }
}
