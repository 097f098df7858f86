//! Putting Cowbird on two soft RNICs: on the compute node, one block of
//! host memory per application thread, registered with its NIC; on the
//! memory node, the memory pool's regions, the engine's staging region and
//! one queue pair per thread to the compute node. The simulator tests,
//! the benchmark and the demo all deploy through here.

use crate::client::{Client, CowbirdError};
use crate::layout::RingSizes;
use crate::spot::{InstanceWiring, SpotConfig, SpotEngine, SpotError};
use remora_rnic::{
    AccessFlags, HostMemory, MemoryRegion, QueuePairBuilder, SoftRnic, Verbs, VerbsError,
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
    Ok(Deployment {
        clients,
        engine,
        pool,
    })
}
