//! The MemServer backend: chunks live in a memory node's registered pool
//! and move by one-sided RDMA READ and WRITE from the compute node's soft
//! RNIC, through the switch of an embedded rack. The memory node's CPU is
//! off the data path; its memory agent only reserves, loads and frees
//! extents of the pool.
//!
//! Each fault thread (and the evictor) takes a channel: a queue pair of
//! its own with a registered landing buffer, posted and polled without
//! the NIC's lock. The rack's fabric thread runs both NICs and the switch:
//! its CPU is the emulated hardware's, reported apart.
//!
//! On the embedded rack everything shares one process, so the memory
//! agent's control calls (reserve, load, free) are direct calls on it
//! standing in for a control channel; the data path is real RoCEv2.

use crate::store::{ChunkStore, ObjectId, StoreError};
use remora_rack::assembly::{EmbeddedRack, RackBuilder};
use remora_rack::endpoint::{rack_queue_pair, AppQueues, DriverKicker};
use remora_rack::topology::{Topology, COMPUTE_HOST, MEMORY_HOST};
use remora_rack::RackError;
use remora_rnic::{
    AccessFlags, CompletionStatus, HostMemory, MemoryRegion, QueuePair, SendOperation, SendRequest,
    Verbs, VerbsError,
};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// A request that has not completed by then is a dead memory node (the
/// NIC itself gives up after its retries, well before).
const COMPLETION_DEADLINE: Duration = Duration::from_secs(5);
/// Polls of a completion queue before a waiting thread starts sleeping.
const SPINS_BEFORE_SLEEP: u32 = 64;
const SLEEP_BETWEEN_POLLS: Duration = Duration::from_micros(20);
/// Extents start on this boundary.
const EXTENT_ALIGNMENT: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum MemoryNodeError {
    #[error(transparent)]
    Rack(#[from] RackError),
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    #[error("an RDMA {operation} completed with {status:?}")]
    Completion {
        operation: &'static str,
        status: CompletionStatus,
    },
    #[error("an RDMA {operation} did not complete within {COMPLETION_DEADLINE:?}")]
    TimedOut { operation: &'static str },
    #[error("landing buffer: {0}")]
    Landing(#[from] remora_rnic::HostMemoryOutOfBounds),
}

#[derive(Debug, Clone)]
pub struct MemoryNodeConfig {
    /// The memory node's pool: every object's bytes.
    pub pool_bytes: u64,
    /// Queue pairs on the compute node: one per fault thread, plus one for
    /// the evictor.
    pub channels: usize,
    /// The landing buffer per channel: the largest single transfer.
    pub landing_bytes: usize,
    /// The rack: a compute and a memory host, links shaped as wanted.
    pub topology: Topology,
}

/// The memory node's agent: the pool and who owns which extent of it.
struct MemoryAgent {
    pool: HostMemory,
    /// Free extents by start.
    free: BTreeMap<u64, u64>,
    objects: HashMap<ObjectId, (u64, u64)>,
}

impl MemoryAgent {
    fn reserve(&mut self, object: ObjectId, bytes: u64) -> Result<u64, StoreError> {
        let wanted = bytes.next_multiple_of(EXTENT_ALIGNMENT);
        let Some((&start, &length)) = self.free.iter().find(|(_, &length)| length >= wanted) else {
            let free = self.free.values().sum();
            return Err(StoreError::Full { wanted, free });
        };
        self.free.remove(&start);
        if length > wanted {
            self.free.insert(start + wanted, length - wanted);
        }
        self.objects.insert(object, (start, wanted));
        Ok(start)
    }

    fn release(&mut self, object: ObjectId) -> Result<(), StoreError> {
        let (start, length) = self
            .objects
            .remove(&object)
            .ok_or(StoreError::UnknownObject(object))?;
        self.free.insert(start, length);
        // Merge with the neighbours, so the pool does not fragment forever.
        let merged = std::mem::take(&mut self.free);
        for (start, length) in merged {
            match self.free.last_key_value().map(|(&s, &l)| (s, l)) {
                Some((previous, previous_length)) if previous + previous_length == start => {
                    self.free.insert(previous, previous_length + length);
                }
                _ => {
                    self.free.insert(start, length);
                }
            }
        }
        Ok(())
    }

    fn extent(&self, object: ObjectId, offset: u64, length: usize) -> Result<u64, StoreError> {
        let &(start, size) = self
            .objects
            .get(&object)
            .ok_or(StoreError::UnknownObject(object))?;
        let end = offset.saturating_add(length as u64);
        if end > size {
            return Err(StoreError::OutOfRange {
                object,
                offset,
                end,
                length: size,
            });
        }
        Ok(start + offset)
    }
}

struct Channel {
    queue_pair: QueuePair,
    queues: AppQueues,
    landing: HostMemory,
    landing_region: MemoryRegion,
}

/// Bytes that crossed the compute↔memory link, by direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkTraffic {
    pub read_bytes: u64,
    pub written_bytes: u64,
}

pub struct MemoryNodeStore {
    rack: Mutex<EmbeddedRack>,
    kicker: DriverKicker,
    pool: MemoryRegion,
    agent: Mutex<MemoryAgent>,
    channels: Mutex<Vec<Channel>>,
    channel_returned: Condvar,
    landing_bytes: usize,
    read_bytes: AtomicU64,
    written_bytes: AtomicU64,
}

impl MemoryNodeStore {
    /// Builds the rack, registers the pool and connects the channels.
    pub fn start(config: &MemoryNodeConfig) -> Result<MemoryNodeStore, MemoryNodeError> {
        let mut staged = RackBuilder::new(&config.topology)
            .thread_name("soda-fabric")
            .build()?;
        let (compute, memory) = staged.nic_pair_mut(COMPUTE_HOST, MEMORY_HOST);
        let memory_domain = memory.alloc_protection_domain()?;
        let pool_memory = HostMemory::new(config.pool_bytes as usize);
        let pool = memory.register_host_memory(
            memory_domain,
            pool_memory.clone(),
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        )?;
        let memory_queue = memory.create_completion_queue(config.channels * 4)?;
        let compute_domain = compute.alloc_protection_domain()?;
        let mut pending = Vec::with_capacity(config.channels);
        for _ in 0..config.channels {
            let completion_queue = compute.create_completion_queue(4)?;
            let landing = HostMemory::new(config.landing_bytes);
            let landing_region = compute.register_host_memory(
                compute_domain,
                landing.clone(),
                AccessFlags::LOCAL_WRITE,
            )?;
            let near =
                compute.create_queue_pair(&rack_queue_pair(compute_domain, completion_queue))?;
            let far = memory.create_queue_pair(&rack_queue_pair(memory_domain, memory_queue))?;
            let (near_endpoint, far_endpoint) = (near.endpoint, far.endpoint);
            let queue_pair = compute.handshake(near, far_endpoint)?;
            memory.handshake(far, near_endpoint)?;
            pending.push((queue_pair, completion_queue, landing, landing_region));
        }
        let endpoint = staged.endpoint_mut(COMPUTE_HOST);
        let channels = pending
            .into_iter()
            .map(
                |(queue_pair, completion_queue, landing, landing_region)| Channel {
                    queue_pair,
                    queues: endpoint.attach_queues(completion_queue, 4),
                    landing,
                    landing_region,
                },
            )
            .collect();
        let switch = staged.l2l3_switch();
        let (rack, _switch) = staged.start(switch)?;
        let kicker = rack.fabric().kicker();
        Ok(MemoryNodeStore {
            rack: Mutex::new(rack),
            kicker,
            pool,
            agent: Mutex::new(MemoryAgent {
                pool: pool_memory,
                free: BTreeMap::from([(0, config.pool_bytes)]),
                objects: HashMap::new(),
            }),
            channels: Mutex::new(channels),
            channel_returned: Condvar::new(),
            landing_bytes: config.landing_bytes,
            read_bytes: AtomicU64::new(0),
            written_bytes: AtomicU64::new(0),
        })
    }

    pub fn traffic(&self) -> LinkTraffic {
        LinkTraffic {
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
            written_bytes: self.written_bytes.load(Ordering::Relaxed),
        }
    }

    /// Stops the rack; returns the fabric thread's CPU time: the emulated
    /// NICs and switch, apart from the application's.
    pub fn stop(&self) -> Result<Duration, MemoryNodeError> {
        Ok(self.rack.lock().expect("rack lock").stop_and_join()?)
    }

    /// The memory node crashes: its NIC stops answering (for tests of
    /// what the application sees).
    pub fn crash_memory_node(&self) {
        self.rack.lock().expect("rack lock").crash(MEMORY_HOST);
    }

    fn take_channel(&self) -> Channel {
        let mut channels = self.channels.lock().expect("channel lock");
        loop {
            if let Some(channel) = channels.pop() {
                return channel;
            }
            channels = self.channel_returned.wait(channels).expect("channel lock");
        }
    }

    fn give_back(&self, channel: Channel) {
        self.channels.lock().expect("channel lock").push(channel);
        self.channel_returned.notify_one();
    }

    /// One RDMA operation of at most a landing buffer, waited for.
    fn transfer(
        &self,
        channel: &Channel,
        remote_offset: u64,
        length: usize,
        read: bool,
    ) -> Result<(), MemoryNodeError> {
        let remote = self.pool.remote(remote_offset);
        let (operation, name) = if read {
            (SendOperation::Read { remote }, "READ")
        } else {
            (
                SendOperation::Write {
                    remote,
                    immediate: None,
                },
                "WRITE",
            )
        };
        let local = channel.landing_region.slice(0, length as u32);
        let request = SendRequest::new(0, operation, &[local])?;
        let queued = channel.queues.post_send(channel.queue_pair, request)?;
        assert!(queued, "a channel has one request in flight");
        self.kicker.kick();
        let deadline = Instant::now() + COMPLETION_DEADLINE;
        let mut spins = 0u32;
        let completion = loop {
            if let Some(completion) = channel.queues.poll_completion() {
                break completion;
            }
            if Instant::now() > deadline {
                return Err(MemoryNodeError::TimedOut { operation: name });
            }
            if spins < SPINS_BEFORE_SLEEP {
                std::thread::yield_now();
                spins += 1;
            } else {
                std::thread::sleep(SLEEP_BETWEEN_POLLS);
            }
        };
        if completion.status != CompletionStatus::Success {
            return Err(MemoryNodeError::Completion {
                operation: name,
                status: completion.status,
            });
        }
        Ok(())
    }

    fn with_channel<T>(
        &self,
        work: impl FnOnce(&Channel) -> Result<T, MemoryNodeError>,
    ) -> Result<T, StoreError> {
        let channel = self.take_channel();
        let result = work(&channel);
        self.give_back(channel);
        result.map_err(StoreError::from)
    }
}

impl ChunkStore for MemoryNodeStore {
    fn name(&self) -> &'static str {
        "memserver"
    }

    fn reserve(
        &self,
        object: ObjectId,
        bytes: u64,
        initial: Option<&Path>,
    ) -> Result<(), StoreError> {
        let mut agent = self.agent.lock().expect("memory agent lock");
        let start = agent.reserve(object, bytes)?;
        // The memory node's CPU loads the file into its own pool.
        let loaded = match initial {
            Some(path) => crate::store::read_initial(path, bytes),
            None => Ok(vec![0; bytes as usize]),
        };
        let loaded = loaded.and_then(|data| {
            agent
                .pool
                .write(start as usize, &data)
                .map_err(|error| StoreError::Remote(Box::new(error)))
        });
        if loaded.is_err() {
            let _ = agent.release(object);
        }
        loaded
    }

    fn fetch(&self, object: ObjectId, offset: u64, into: &mut [u8]) -> Result<(), StoreError> {
        let start =
            self.agent
                .lock()
                .expect("memory agent lock")
                .extent(object, offset, into.len())?;
        self.with_channel(|channel| {
            for (index, piece) in into.chunks_mut(self.landing_bytes).enumerate() {
                let at = start + (index * self.landing_bytes) as u64;
                self.transfer(channel, at, piece.len(), true)?;
                channel.landing.read(0, piece)?;
            }
            Ok(())
        })?;
        self.read_bytes
            .fetch_add(into.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn write_back(&self, object: ObjectId, offset: u64, data: &[u8]) -> Result<(), StoreError> {
        let start =
            self.agent
                .lock()
                .expect("memory agent lock")
                .extent(object, offset, data.len())?;
        self.with_channel(|channel| {
            for (index, piece) in data.chunks(self.landing_bytes).enumerate() {
                channel.landing.write(0, piece)?;
                let at = start + (index * self.landing_bytes) as u64;
                self.transfer(channel, at, piece.len(), false)?;
            }
            Ok(())
        })?;
        self.written_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn release(&self, object: ObjectId) -> Result<(), StoreError> {
        self.agent
            .lock()
            .expect("memory agent lock")
            .release(object)
    }
}

impl Drop for MemoryNodeStore {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            tracing::error!(%error, "stopping the SODA rack failed");
        }
    }
}

impl From<MemoryNodeError> for StoreError {
    fn from(error: MemoryNodeError) -> StoreError {
        StoreError::Remote(Box::new(error))
    }
}
