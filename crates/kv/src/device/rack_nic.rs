//! Far memory through a host's own NIC on a running rack
//! ([`remora_rack::scenario::Rack`]), simulated or embedded: the store's
//! queues post their verbs on the NIC itself, as an application linked
//! against libibverbs does, and a queue that finds no completion gives
//! the rack a little time to run. In the simulator that time is virtual,
//! so a store driven from one thread runs deterministically, seed by seed.
//!
//! [`connect`] makes the paths: a region on the memory host and, per
//! queue, a queue pair to it with its landing memory on the compute host.
//! It runs again after the compute host restarts with a fresh NIC, which
//! is how a recovered store reaches the log its predecessor left.
//!
//! A [`PowerCut`] shared by a device's ports stops the compute host at a
//! chosen instant: the port runs the rack up to it and then refuses
//! everything, so the store fails wherever it was, mid-operation,
//! mid-flush or mid-checkpoint, and the scenario crashes the host.

use super::far_memory::{VerbsPath, VerbsPort, SLOT_BYTES, WINDOW};
use remora_base::Timestamp;
use remora_cowbird::deploy::Direct;
use remora_rack::scenario::Rack;
use remora_rnic::{
    AccessFlags, CompletionQueue, DataPath, HostMemory, MemoryRegion, ProtectionDomain, QueuePair,
    QueuePairBuilder, ReceiveRequest, SendRequest, Verbs, VerbsError, WorkCompletion,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Virtual time a queue that found no completion lets pass: a fraction
/// of a READ's round trip on the simulated rack link.
pub const IDLE_STEP: Duration = Duration::from_micros(1);

/// The instant the compute host loses power, shared by a device's ports.
#[derive(Debug)]
pub struct PowerCut {
    /// Nanoseconds of rack time; `u64::MAX` for never.
    at_nanos: AtomicU64,
}

impl PowerCut {
    pub fn never() -> Arc<PowerCut> {
        Arc::new(PowerCut {
            at_nanos: AtomicU64::new(u64::MAX),
        })
    }

    /// The power goes at `at` (once set, a cut is never moved).
    pub fn cut_at(&self, at: Timestamp) {
        let _ = self.at_nanos.compare_exchange(
            u64::MAX,
            at.as_nanos(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    pub fn instant(&self) -> Option<Timestamp> {
        match self.at_nanos.load(Ordering::Relaxed) {
            u64::MAX => None,
            nanos => Some(Timestamp::from_nanos(nanos)),
        }
    }

    /// Whether the power is gone at `now`.
    pub fn is_cut(&self, now: Timestamp) -> bool {
        self.instant().is_some_and(|at| now >= at)
    }
}

/// One queue's port: host `host`'s NIC on `rack`.
pub struct RackNic<R> {
    rack: Arc<Mutex<R>>,
    host: usize,
    power: Arc<PowerCut>,
}

impl<R: Rack> RackNic<R> {
    pub fn new(rack: Arc<Mutex<R>>, host: usize, power: Arc<PowerCut>) -> RackNic<R> {
        RackNic { rack, host, power }
    }

    /// Runs `f` on the NIC, unless the host has lost its power.
    fn with_nic<T>(
        &self,
        f: impl FnOnce(&mut remora_rnic::SoftRnic) -> Result<T, VerbsError>,
    ) -> Result<T, VerbsError> {
        let mut rack = self.rack.lock().unwrap_or_else(|e| e.into_inner());
        if self.power.is_cut(rack.now()) {
            return Err(VerbsError::DeviceGone);
        }
        rack.with_nic(self.host, f)
    }

    /// Lets the rack run for [`IDLE_STEP`], or up to the power cut.
    fn idle(&self) -> Result<(), VerbsError> {
        let mut rack = self.rack.lock().unwrap_or_else(|e| e.into_inner());
        let now = rack.now();
        let step = match self.power.instant() {
            Some(at) if at <= now => return Err(VerbsError::DeviceGone),
            Some(at) => IDLE_STEP.min(at.saturating_duration_since(now)),
            None => IDLE_STEP,
        };
        // Only an agent's failure ends a run early. The KV scenario's
        // hosts run no agents; on a rack whose hosts do, the failure is
        // taken by this run and not reported (a `DataPath` error has no
        // room for it).
        let _ = rack.run_for(step);
        Ok(())
    }
}

impl<R: Rack + Send> DataPath for RackNic<R> {
    fn post_send(&mut self, queue_pair: QueuePair, request: SendRequest) -> Result<(), VerbsError> {
        self.with_nic(|nic| nic.post_send(queue_pair, request))
    }

    fn post_receive(
        &mut self,
        queue_pair: QueuePair,
        request: ReceiveRequest,
    ) -> Result<(), VerbsError> {
        self.with_nic(|nic| nic.post_receive(queue_pair, request))
    }

    /// The oldest completion; finding none, lets the rack run a step and
    /// looks once more.
    fn poll_completion(
        &mut self,
        queue: CompletionQueue,
    ) -> Result<Option<WorkCompletion>, VerbsError> {
        if let Some(completion) = self.with_nic(|nic| nic.poll_completion(queue))? {
            return Ok(Some(completion));
        }
        self.idle()?;
        self.with_nic(|nic| nic.poll_completion(queue))
    }
}

impl<R: Rack + Send> VerbsPort for RackNic<R> {
    /// The NIC sees a post at once: the simulator carries its frames on
    /// its next step.
    fn ring_doorbell(&mut self) {}
}

/// The memory host's side of the paths: the region that holds the log.
#[derive(Debug, Clone, Copy)]
pub struct Pool {
    pub protection_domain: ProtectionDomain,
    pub region: MemoryRegion,
}

/// Registers `capacity_bytes` on host `memory` for the log.
pub fn register_pool<R: Rack>(
    rack: &mut R,
    memory: usize,
    capacity_bytes: u64,
) -> Result<Pool, VerbsError> {
    rack.with_nic(memory, |nic| {
        let protection_domain = nic.alloc_protection_domain()?;
        let region = nic.register_memory(protection_domain, capacity_bytes, AccessFlags::ALL)?;
        Ok(Pool {
            protection_domain,
            region,
        })
    })
}

/// `count` queue pairs from host `compute` to `pool` on host `memory`,
/// each with [`WINDOW`] landing slots, as ports of `rack` that stop at
/// `power`'s cut. Queue pairs time out after `timeout`.
pub fn connect<R: Rack + Send + 'static>(
    rack: &Arc<Mutex<R>>,
    (compute, memory): (usize, usize),
    pool: Pool,
    count: usize,
    (timeout, power): (Duration, Arc<PowerCut>),
) -> Result<Vec<VerbsPath>, VerbsError> {
    let mut guard = rack.lock().unwrap_or_else(|e| e.into_inner());
    let protection_domain = guard.with_nic(compute, |nic| nic.alloc_protection_domain())?;
    let mut paths = Vec::with_capacity(count);
    for _ in 0..count {
        let direct = connect_one(
            &mut *guard,
            (compute, memory),
            protection_domain,
            pool,
            timeout,
        )?;
        let port = RackNic::new(rack.clone(), compute, power.clone());
        paths.push(VerbsPath {
            direct,
            port: Box::new(port),
        });
    }
    Ok(paths)
}

/// One queue pair and its landing memory: each side prepares its queue
/// pair, then each is brought up against the other's endpoint (the
/// exchange a connection manager makes).
fn connect_one<R: Rack>(
    rack: &mut R,
    (compute, memory): (usize, usize),
    protection_domain: ProtectionDomain,
    pool: Pool,
    timeout: Duration,
) -> Result<Direct, VerbsError> {
    let landing = HostMemory::new(WINDOW * SLOT_BYTES);
    let (landing_region, completion_queue, near) = rack.with_nic(compute, |nic| {
        let region =
            nic.register_host_memory(protection_domain, landing.clone(), AccessFlags::ALL)?;
        let completion_queue = nic.create_completion_queue(2 * WINDOW)?;
        let mut builder =
            QueuePairBuilder::new(protection_domain, completion_queue, completion_queue);
        builder.timeout = timeout;
        builder.send_queue_depth = WINDOW;
        Ok((region, completion_queue, nic.create_queue_pair(&builder)?))
    })?;
    let far = rack.with_nic(memory, |nic| {
        let completion_queue = nic.create_completion_queue(16)?;
        let mut builder =
            QueuePairBuilder::new(pool.protection_domain, completion_queue, completion_queue);
        builder.timeout = timeout;
        let far = nic.create_queue_pair(&builder)?;
        nic.handshake(far, near.endpoint)?;
        Ok(far)
    })?;
    let queue_pair = rack.with_nic(compute, |nic| nic.handshake(near, far.endpoint))?;
    Ok(Direct {
        queue_pair,
        completion_queue,
        landing,
        landing_region,
    })
}
