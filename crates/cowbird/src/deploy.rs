//! Putting Cowbird on two soft RNICs: on the compute node, one block of
//! host memory per application thread, registered with its NIC; on the
//! memory node, the memory pool's regions, the engine's staging region and
//! one queue pair per thread to the compute node. The simulator tests,
//! the benchmark and the demo all deploy through here.

use crate::client::{Client, CowbirdError};
use crate::layout::RingSizes;
use crate::spot::{InstanceWiring, SpotConfig, SpotEngine, SpotError};
use remora_rnic::{
    AccessFlags, CompletionQueue, HostMemory, MemoryRegion, ProtectionDomain, QueuePair,
    QueuePairBuilder, SoftRnic, Verbs, VerbsError,
};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct CowbirdSpec {
    /// Application threads, each with its own rings (an instance).
    pub threads: usize,
    pub sizes: RingSizes,
    /// Bytes of each memory-pool region (region id = index).
    pub pool_regions: Vec<u64>,
    pub spot: SpotConfig,
    pub ack_timeout: Duration,
    /// Also a plain one-sided path from the compute node to the pool, for
    /// the baselines that post verbs themselves.
    pub direct: Option<DirectSpec>,
}

#[derive(Debug, Clone, Copy)]
pub struct DirectSpec {
    /// Requests the application keeps outstanding.
    pub depth: usize,
    /// Host memory the READs land in.
    pub landing_bytes: usize,
}

/// The compute node's own queue pair to the memory pool.
pub struct Direct {
    pub queue_pair: QueuePair,
    pub completion_queue: CompletionQueue,
    pub landing: HostMemory,
    pub landing_region: MemoryRegion,
}

#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    #[error(transparent)]
    Client(#[from] CowbirdError),
    #[error(transparent)]
    Spot(#[from] SpotError),
}

pub struct Deployment {
    pub clients: Vec<Client>,
    pub engine: SpotEngine,
    /// The memory pool's regions on the memory node.
    pub pool: Vec<MemoryRegion>,
    pub direct: Option<Direct>,
}

pub fn deploy(
    spec: CowbirdSpec,
    compute: &mut SoftRnic,
    memory: &mut SoftRnic,
) -> Result<Deployment, DeployError> {
    let compute_pd = compute.alloc_protection_domain()?;
    let compute_cq = compute.create_completion_queue(16)?;
    let memory_pd = memory.alloc_protection_domain()?;
    let pool = spec
        .pool_regions
        .iter()
        .map(|bytes| memory.register_memory(memory_pd, *bytes, AccessFlags::ALL))
        .collect::<Result<Vec<_>, _>>()?;
    let staging_bytes = spec.spot.staging_bytes_per_instance() * spec.threads.max(1) as u64;
    let staging = memory.register_memory(memory_pd, staging_bytes, AccessFlags::ALL)?;
    // Per thread: probe, fetch (two), payload READs and response WRITEs of
    // a batch, and the progress WRITE.
    let send_depth = 2 * spec.spot.batch_entries as usize + 8;
    let engine_cq = memory.create_completion_queue(send_depth * spec.threads.max(1))?;
    let mut engine_builder = QueuePairBuilder::new(memory_pd, engine_cq, engine_cq);
    engine_builder.timeout = spec.ack_timeout;
    engine_builder.send_queue_depth = send_depth;
    let mut compute_builder = QueuePairBuilder::new(compute_pd, compute_cq, compute_cq);
    compute_builder.timeout = spec.ack_timeout;
    let regions = spec.pool_regions.clone();
    let mut clients = Vec::with_capacity(spec.threads);
    let mut instances = Vec::with_capacity(spec.threads);
    for _ in 0..spec.threads {
        let block = HostMemory::new(spec.sizes.block_bytes() as usize);
        let region = compute.register_host_memory(compute_pd, block.clone(), AccessFlags::ALL)?;
        let near = compute.create_queue_pair(&compute_builder)?;
        let far = memory.create_queue_pair(&engine_builder)?;
        compute.handshake(near, far.endpoint)?;
        let queue_pair = memory.handshake(far, near.endpoint)?;
        instances.push(InstanceWiring {
            queue_pair,
            block: region.remote(0),
            sizes: spec.sizes,
        });
        clients.push(Client::new(block, spec.sizes, regions.clone())?);
    }
    let engine = SpotEngine::new(spec.spot, instances, pool.clone(), staging, engine_cq)?;
    let direct = match spec.direct {
        Some(direct) => Some(direct_path(direct, &spec, compute, memory, memory_pd)?),
        None => None,
    };
    Ok(Deployment {
        clients,
        engine,
        pool,
        direct,
    })
}

fn direct_path(
    direct: DirectSpec,
    spec: &CowbirdSpec,
    compute: &mut SoftRnic,
    memory: &mut SoftRnic,
    memory_pd: ProtectionDomain,
) -> Result<Direct, DeployError> {
    let pd = compute.alloc_protection_domain()?;
    let landing = HostMemory::new(direct.landing_bytes);
    let landing_region = compute.register_host_memory(pd, landing.clone(), AccessFlags::ALL)?;
    let completion_queue = compute.create_completion_queue(direct.depth * 2)?;
    let mut near = QueuePairBuilder::new(pd, completion_queue, completion_queue);
    near.timeout = spec.ack_timeout;
    near.send_queue_depth = direct.depth;
    let far_cq = memory.create_completion_queue(16)?;
    let mut far = QueuePairBuilder::new(memory_pd, far_cq, far_cq);
    far.timeout = spec.ack_timeout;
    let near = compute.create_queue_pair(&near)?;
    let far = memory.create_queue_pair(&far)?;
    let queue_pair = compute.handshake(near, far.endpoint)?;
    memory.handshake(far, near.endpoint)?;
    Ok(Direct {
        queue_pair,
        completion_queue,
        landing,
        landing_region,
    })
}
