//! Putting Cowbird on two soft RNICs: on the compute node, one block of
//! host memory per application thread, registered with its NIC; on the
//! memory node, the memory pool's regions, the engine's staging region and
//! one queue pair per thread to the compute node. The simulator tests,
//! the benchmark and the demo all deploy through here.

use crate::client::{check_region_count, Client, CowbirdError};
use crate::connection::{ConnectionService, Connector};
use crate::layout::RingSizes;
use crate::p4::impersonated::{self, Peer};
use crate::p4::{CowbirdP4, InstanceSpec, P4Error};
use crate::rpc::{RpcError, RpcServer};
use crate::spot::{InstanceWiring, LandedWrites, SpotConfig, SpotEngine, SpotError};
use crate::spot_agent::{SpotAgent, SpotDurable};
use remora_rnic::{
    AccessFlags, CompletionQueue, HostMemory, MemoryRegion, ProtectionDomain, QueuePair,
    QueuePairBuilder, QueuePairEndpoint, SoftRnic, Verbs, VerbsError,
};
use remora_switch::PortId;
use remora_wire::Psn;
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
    /// Also plain one-sided paths from the compute node to the pool, one
    /// per thread, for the baselines that post verbs themselves.
    pub direct: Option<DirectSpec>,
    /// Also two-sided paths to RPC servers on the memory node, one per
    /// thread.
    pub rpc: Option<RpcSpec>,
}

#[derive(Debug, Clone, Copy)]
pub struct RpcSpec {
    /// Requests the application keeps outstanding.
    pub depth: usize,
    /// The largest reply.
    pub record_bytes: u32,
}

/// The compute node's two-sided path and the server behind it.
pub struct Rpc {
    pub queue_pair: QueuePair,
    pub completion_queue: CompletionQueue,
    /// Requests (first) and replies (after), `depth` slots each.
    pub buffers: HostMemory,
    pub buffers_region: MemoryRegion,
    pub server: RpcServer,
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
    #[error(transparent)]
    Rpc(#[from] RpcError),
    #[error(transparent)]
    P4(#[from] P4Error),
}

/// The Spot engine's send queue per instance (and so its share of the
/// engine's completion queue): probe, fetch (two), payload READs and
/// response WRITEs of a batch, and the progress WRITE.
pub fn engine_send_queue_depth(batch_entries: u64) -> usize {
    2 * batch_entries as usize + 8
}

pub struct Deployment {
    pub clients: Vec<Client>,
    /// The Spot engine, the memory node's agent.
    pub engine: SpotAgent,
    /// The compute node's agent that connects new queue pairs to the
    /// engine after one died.
    pub connection_service: ConnectionService,
    /// The memory pool's regions on the memory node.
    pub pool: Vec<MemoryRegion>,
    /// The pool's bytes: host memory that survives the memory node's
    /// crashes.
    pub pool_memory: Vec<HostMemory>,
    /// One per thread, when asked for.
    pub direct: Vec<Direct>,
    pub rpc: Vec<Rpc>,
}

/// The memory pool, in a protection domain of its own: host memory the
/// node keeps (and declares durable), registered with its NIC.
struct Pool {
    protection_domain: ProtectionDomain,
    regions: Vec<MemoryRegion>,
    memory: Vec<HostMemory>,
}

fn register_pool(spec: &CowbirdSpec, memory: &mut SoftRnic) -> Result<Pool, VerbsError> {
    let protection_domain = memory.alloc_protection_domain()?;
    let memory_blocks: Vec<HostMemory> = spec
        .pool_regions
        .iter()
        .map(|bytes| HostMemory::new(*bytes as usize))
        .collect();
    let regions = memory_blocks
        .iter()
        .map(|block| {
            memory.register_host_memory(protection_domain, block.clone(), AccessFlags::ALL)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Pool {
        protection_domain,
        regions,
        memory: memory_blocks,
    })
}

/// One application thread's block of host memory, registered with the
/// compute NIC, and the client over it.
fn client_block(
    spec: &CowbirdSpec,
    compute: &mut SoftRnic,
    compute_pd: ProtectionDomain,
) -> Result<(Client, MemoryRegion), DeployError> {
    let block = HostMemory::new(spec.sizes.block_bytes() as usize);
    let region = compute.register_host_memory(compute_pd, block.clone(), AccessFlags::ALL)?;
    let client = Client::new(block, spec.sizes, spec.pool_regions.clone())?;
    Ok((client, region))
}

pub fn deploy(
    spec: CowbirdSpec,
    compute: &mut SoftRnic,
    memory: &mut SoftRnic,
) -> Result<Deployment, DeployError> {
    // Checked before anything is allocated: a spec with no region (every
    // path indexes region 0) or more than a request id can name is
    // refused, not a panic after the memory is taken.
    check_region_count(spec.pool_regions.len())?;
    spec.spot.check()?;
    let compute_pd = compute.alloc_protection_domain()?;
    let compute_cq = compute.create_completion_queue(16)?;
    let Pool {
        protection_domain: memory_pd,
        regions: pool,
        memory: pool_memory,
    } = register_pool(&spec, memory)?;
    let staging_bytes = spec.spot.staging_bytes_per_instance() * spec.threads.max(1) as u64;
    let staging = memory.register_memory(memory_pd, staging_bytes, AccessFlags::ALL)?;
    let send_depth = engine_send_queue_depth(spec.spot.batch_entries);
    let engine_cq_depth = send_depth * spec.threads.max(1);
    let engine_cq = memory.create_completion_queue(engine_cq_depth)?;
    let mut engine_builder = QueuePairBuilder::new(memory_pd, engine_cq, engine_cq);
    engine_builder.timeout = spec.ack_timeout;
    engine_builder.send_queue_depth = send_depth;
    let mut compute_builder = QueuePairBuilder::new(compute_pd, compute_cq, compute_cq);
    compute_builder.timeout = spec.ack_timeout;
    let mut clients = Vec::with_capacity(spec.threads);
    let mut instances = Vec::with_capacity(spec.threads);
    let mut compute_queue_pairs = Vec::with_capacity(spec.threads);
    for _ in 0..spec.threads {
        let (client, region) = client_block(&spec, compute, compute_pd)?;
        let near = compute.create_queue_pair(&compute_builder)?;
        let far = memory.create_queue_pair(&engine_builder)?;
        compute_queue_pairs.push(compute.handshake(near, far.endpoint)?);
        let queue_pair = memory.handshake(far, near.endpoint)?;
        instances.push(InstanceWiring {
            queue_pair,
            block: region.remote(0),
            sizes: spec.sizes,
        });
        clients.push(client);
    }
    let connector = Connector::new();
    let landed = LandedWrites::new(instances.len(), &spec.spot);
    let durable = SpotDurable {
        config: spec.spot,
        pool: pool_memory.clone(),
        blocks: instances
            .iter()
            .map(|instance| (instance.block, instance.sizes))
            .collect(),
        queue_pair: engine_builder,
        completion_queue_depth: engine_cq_depth,
        connector: connector.clone(),
        landed: landed.clone(),
    };
    let engine = SpotEngine::new(
        spec.spot,
        instances,
        pool.clone(),
        staging,
        engine_builder,
        connector.clone(),
        landed,
    )?;
    let engine = SpotAgent::new(durable, engine);
    let connection_service =
        ConnectionService::new(connector, compute_builder, compute_queue_pairs);
    let direct = per_thread(spec.direct, spec.threads, |direct| {
        direct_path(direct, &spec, compute, memory, memory_pd)
    })?;
    let rpc = per_thread(spec.rpc, spec.threads, |rpc| {
        rpc_path(rpc, &spec, compute, memory, memory_pd, pool[0])
    })?;
    Ok(Deployment {
        clients,
        engine,
        connection_service,
        pool,
        pool_memory,
        direct,
        rpc,
    })
}

/// One `make(wanted)` per thread if a path is wanted, none otherwise.
fn per_thread<S: Copy, T>(
    wanted: Option<S>,
    threads: usize,
    mut make: impl FnMut(S) -> Result<T, DeployError>,
) -> Result<Vec<T>, DeployError> {
    wanted.map_or(Ok(Vec::new()), |spec| {
        (0..threads).map(|_| make(spec)).collect()
    })
}

/// The most READs a soft RNIC's responder remembers per queue pair.
const MAX_DESTINATION_READ_ATOMIC: usize = 128;

/// Where the hosts sit on the switch, for Cowbird-P4.
#[derive(Debug, Clone, Copy)]
pub struct SwitchPorts {
    pub compute: PortId,
    pub memory: PortId,
}

/// Cowbird-P4 on the same two soft RNICs: per application thread a queue
/// pair on each host, connected to a peer the switch plays (Phase I).
/// Nothing of Cowbird runs on either host; the pool and the clients are
/// as in [`deploy`].
pub struct P4Deployment {
    pub clients: Vec<Client>,
    pub pool: Vec<MemoryRegion>,
    pub pool_memory: Vec<HostMemory>,
}

pub fn deploy_p4(
    spec: &CowbirdSpec,
    compute: &mut SoftRnic,
    memory: &mut SoftRnic,
    switch: &mut CowbirdP4,
    ports: SwitchPorts,
) -> Result<P4Deployment, DeployError> {
    check_region_count(spec.pool_regions.len())?;
    let compute_pd = compute.alloc_protection_domain()?;
    let Pool {
        protection_domain: memory_pd,
        regions: pool,
        memory: pool_memory,
    } = register_pool(spec, memory)?;
    let engine = (switch.config().mac, switch.config().address);
    let mtu = switch.config().path_mtu;
    // The switch keeps up to a window of PSNs in flight on each queue
    // pair; the hosts remember as many READs for replays as they can (an
    // older duplicate goes unanswered, and a later answer settles it), up
    // to what their device allows (a ConnectX-5 remembers 16).
    let depth = (impersonated::WINDOW_PACKETS as usize).min(MAX_DESTINATION_READ_ATOMIC);
    let builder = |rnic: &mut SoftRnic, pd| -> Result<QueuePairBuilder, VerbsError> {
        let queue = rnic.create_completion_queue(4)?;
        let mut builder = QueuePairBuilder::new(pd, queue, queue);
        builder.timeout = spec.ack_timeout;
        builder.path_mtu = mtu;
        builder.max_destination_read_atomic = depth.min(rnic.config().max_read_atomic);
        Ok(builder)
    };
    let compute_builder = builder(compute, compute_pd)?;
    let memory_builder = builder(memory, memory_pd)?;
    let mut clients = Vec::with_capacity(spec.threads);
    for _ in 0..spec.threads {
        let (mut client, block) = client_block(spec, compute, compute_pd)?;
        client.limit_write_bytes(mtu.bytes());
        let near = compute.create_queue_pair(&compute_builder)?;
        let far = memory.create_queue_pair(&memory_builder)?;
        let peer = |port, rnic: &SoftRnic, endpoint: QueuePairEndpoint| Peer {
            port,
            mac: rnic.config().mac,
            address: rnic.config().address,
            qpn: endpoint.qpn,
            initial_psn: Psn::new(0),
        };
        let (compute_side, memory_side) = switch.add_instance(InstanceSpec {
            compute: peer(ports.compute, compute, near.endpoint),
            memory: peer(ports.memory, memory, far.endpoint),
            block: block.remote(0),
            sizes: spec.sizes,
            regions: pool.iter().map(|region| region.remote(0)).collect(),
        })?;
        let played = |qpn| QueuePairEndpoint {
            qpn,
            address: engine.1,
            mac: engine.0,
            initial_psn: Psn::new(0),
        };
        compute.handshake(near, played(compute_side))?;
        memory.handshake(far, played(memory_side))?;
        clients.push(client);
    }
    Ok(P4Deployment {
        clients,
        pool,
        pool_memory,
    })
}

fn rpc_path(
    rpc: RpcSpec,
    spec: &CowbirdSpec,
    compute: &mut SoftRnic,
    memory: &mut SoftRnic,
    memory_pd: ProtectionDomain,
    pool: MemoryRegion,
) -> Result<Rpc, DeployError> {
    let depth = rpc.depth.max(1);
    let slot_bytes = rpc.record_bytes.max(crate::rpc::REQUEST_BYTES);
    let pd = compute.alloc_protection_domain()?;
    let buffers = HostMemory::new(2 * depth * slot_bytes as usize);
    let buffers_region = compute.register_host_memory(pd, buffers.clone(), AccessFlags::ALL)?;
    let completion_queue = compute.create_completion_queue(depth * 4)?;
    let mut near = QueuePairBuilder::new(pd, completion_queue, completion_queue);
    near.timeout = spec.ack_timeout;
    near.send_queue_depth = depth;
    near.receive_queue_depth = depth;
    let server_buffers = memory.register_memory(
        memory_pd,
        2 * depth as u64 * u64::from(slot_bytes),
        AccessFlags::ALL,
    )?;
    let server_cq = memory.create_completion_queue(depth * 4)?;
    let mut far = QueuePairBuilder::new(memory_pd, server_cq, server_cq);
    far.timeout = spec.ack_timeout;
    far.send_queue_depth = depth;
    far.receive_queue_depth = depth;
    let near = compute.create_queue_pair(&near)?;
    let far = memory.create_queue_pair(&far)?;
    let queue_pair = compute.handshake(near, far.endpoint)?;
    let server_queue_pair = memory.handshake(far, near.endpoint)?;
    let server = RpcServer::new(
        memory,
        server_queue_pair,
        server_cq,
        server_buffers,
        depth as u64,
        slot_bytes,
        pool,
    )?;
    Ok(Rpc {
        queue_pair,
        completion_queue,
        buffers,
        buffers_region,
        server,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::MAX_REGIONS;
    use remora_rnic::RnicConfig;
    use remora_wire::{Ipv4Address, MacAddress};

    fn nic(last: u8) -> SoftRnic {
        SoftRnic::new(RnicConfig::new(
            MacAddress([2, 0, 0, 0, 0, last]),
            Ipv4Address::new(10, 0, 0, last),
            u64::from(last),
        ))
    }

    fn spec(pool_regions: Vec<u64>) -> CowbirdSpec {
        CowbirdSpec {
            threads: 1,
            sizes: RingSizes::DEFAULT,
            pool_regions,
            spot: SpotConfig::DEFAULT,
            ack_timeout: Duration::from_millis(10),
            direct: None,
            rpc: None,
        }
    }

    /// A Spot configuration of 0-entry batches, built in code (only the
    /// rack file's check refused it): each instance posted no fetch and
    /// waited for its completion for ever. Refused before anything is
    /// allocated now.
    #[test]
    fn a_zero_batch_is_refused_not_left_fetching() {
        let mut spec = spec(vec![1 << 20]);
        spec.spot.batch_entries = 0;
        let (mut compute, mut memory) = (nic(1), nic(2));
        let deployed = deploy(spec, &mut compute, &mut memory);
        assert!(matches!(
            deployed,
            Err(DeployError::Spot(SpotError::ZeroBatch))
        ));
    }

    /// Cowbird-P4's deployment, on a switch of its own.
    fn deploy_on_p4(
        spec: CowbirdSpec,
        compute: &mut SoftRnic,
        memory: &mut SoftRnic,
    ) -> Result<P4Deployment, DeployError> {
        use crate::simulated::{forwarding, p4_config};
        let mut switch = crate::p4::P4Engine::with_forwarding(p4_config(), forwarding());
        let ports = SwitchPorts {
            compute: remora_base::PortId(0),
            memory: remora_base::PortId(1),
        };
        deploy_p4(&spec, compute, memory, &mut switch, ports)
    }

    /// A spec with no pool region deployed, and the rack then indexed
    /// region 0 (a panic); one with more regions than a request id names
    /// allocated every region first and then hit the client's assertion.
    /// Both engines' deployments refuse them first.
    #[test]
    fn a_pool_of_no_region_or_too_many_is_refused_before_anything_is_allocated() {
        let too_many = usize::from(MAX_REGIONS) + 1;
        let spot = |spec, compute: &mut SoftRnic, memory: &mut SoftRnic| {
            deploy(spec, compute, memory).map(drop)
        };
        let p4 = |spec, compute: &mut SoftRnic, memory: &mut SoftRnic| {
            deploy_on_p4(spec, compute, memory).map(drop)
        };
        let both: [(&str, Deploys); 2] = [("spot", &spot), ("p4", &p4)];
        for (engine, deploy) in both {
            refuses_bad_region_counts_first(engine, deploy, too_many);
            assert!(deploy(spec(vec![4096]), &mut nic(1), &mut nic(2)).is_ok());
        }
    }

    type Deploys<'a> =
        &'a dyn Fn(CowbirdSpec, &mut SoftRnic, &mut SoftRnic) -> Result<(), DeployError>;

    fn refuses_bad_region_counts_first(engine: &str, deploy: Deploys, too_many: usize) {
        for (regions, count) in [(Vec::new(), 0), (vec![1; too_many], too_many)] {
            let (mut compute, mut memory) = (nic(1), nic(2));
            let refused = deploy(spec(regions), &mut compute, &mut memory);
            let next = |nic: &mut SoftRnic| {
                (
                    nic.alloc_protection_domain().unwrap(),
                    nic.create_completion_queue(4).unwrap(),
                )
            };
            assert_eq!(
                (next(&mut compute), next(&mut memory)),
                (next(&mut nic(1)), next(&mut nic(2))),
                "{engine}, {count} regions: a protection domain or CQ was taken before the refusal"
            );
            assert!(
                matches!(
                    refused,
                    Err(DeployError::Client(CowbirdError::BadRegionCount(found))) if found == count
                ),
                "{engine}: {count} regions were not refused"
            );
        }
    }
}
