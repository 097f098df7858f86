//! A compute node and a far-memory pool on the embedded rack, with the
//! paths an application thread can take to the pool: its own queue pair
//! (one-sided verbs), a two-sided RPC server, or a Cowbird instance whose
//! engine is Cowbird-Spot on the memory node or Cowbird-P4 in the switch.
//!
//! The probe benchmark ([`crate::embedded`]) and the far-memory devices
//! of the key-value store (`remora-kv`) both stand on it. The pool is
//! filled before the fabric runs, through the caller's `fill`.

use crate::client::Client;
use crate::deploy::{deploy, deploy_p4, CowbirdSpec, DeployError, Direct, P4Deployment};
use crate::p4::{CowbirdP4, P4Config, P4Engine};
use crate::simulated::topology;
use crate::spot_agent::SpotAgent;
use remora_rack::assembly::{EmbeddedRack, RackBuilder, StagedRack};
use remora_rack::endpoint::{AppQueues, DriverKicker, NodeEndpoint, Shared, SwitchEndpoint};
use remora_rack::host_cpu::BusyNanos;
use remora_rack::topology::{Topology, COMPUTE_HOST, MEMORY_HOST};
use remora_rack::RackError;
use remora_rnic::*;
use remora_switch::{Switch, SwitchConfig};
use std::sync::{Arc, Mutex};

/// Ring slots per link: a batch of two windows of requests and their
/// answers fits without a full ring.
pub const RING_DEPTH: u32 = 1024;

/// What moves the data of the Cowbird instances, if anything does.
#[derive(Debug, Clone, Copy)]
pub enum Offload {
    /// No engine: only the direct and RPC paths (the verbs baselines).
    None,
    Spot,
    P4(P4Config),
}

#[derive(Debug, thiserror::Error)]
pub enum FarMemoryError {
    #[error(transparent)]
    Rack(#[from] RackError),
    #[error("deploying: {0}")]
    Deploy(#[from] DeployError),
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    #[error("the switch's generator: {0}")]
    Generator(#[from] remora_switch::generator::GeneratorError),
    #[error("filling the pool: {0}")]
    Fill(String),
}

/// The compute node's end of the two-sided path.
pub struct RpcPath {
    pub queue_pair: QueuePair,
    /// Request slots, then reply slots.
    pub buffers: HostMemory,
    pub buffers_region: MemoryRegion,
    pub queues: AppQueues,
}

/// The running rack and the paths not yet taken by application threads.
pub struct FarMemoryRack {
    pub rack: EmbeddedRack,
    pub pool: MemoryRegion,
    pub clients: Vec<Client>,
    /// One per application thread, taken by the fetchers.
    pub direct: Vec<(Direct, AppQueues)>,
    pub rpc: Vec<RpcPath>,
    /// The memory node's agents' busy time (engine or RPC servers).
    pub engine_busy: Vec<BusyNanos>,
    pub engine: Option<Arc<Mutex<SpotAgent>>>,
    /// The switch, when it runs Cowbird-P4.
    pub p4_switch: Option<Shared<SwitchEndpoint<CowbirdP4>>>,
}

/// What fills the pool before the fabric runs: the pool's region and the
/// memory node's NIC.
pub type Fill<'a> = dyn FnOnce(MemoryRegion, &mut SoftRnic) -> Result<(), FarMemoryError> + 'a;

/// The two hosts of the topology with their NICs, before the fabric runs.
fn stage(topology: &Topology) -> Result<StagedRack, FarMemoryError> {
    RackBuilder::new(topology)
        .thread_name("cowbird-fabric")
        .ring_depth(RING_DEPTH)
        .nic_seed(0xc0b)
        .build()
        .map_err(FarMemoryError::from)
}

impl FarMemoryRack {
    /// Deploys `spec` (its `window` is the direct and RPC paths' depth)
    /// with `offload`, fills the pool and starts the fabric.
    pub fn start(
        spec: CowbirdSpec,
        offload: Offload,
        fill: Box<Fill<'_>>,
    ) -> Result<FarMemoryRack, FarMemoryError> {
        if let Offload::P4(config) = offload {
            return Self::start_p4(spec, config, fill);
        }
        let topology = topology();
        let mut staged = stage(&topology)?;
        let depth = spec.direct.map_or(0, |direct| direct.depth);
        let rpc_depth = spec.rpc.map_or(0, |rpc| rpc.depth);
        let (compute, memory) = staged.nic_pair_mut(COMPUTE_HOST, MEMORY_HOST);
        let deployment = deploy(spec, compute, memory)?;
        let pool = deployment.pool[0];
        let compute = staged.endpoint_mut(COMPUTE_HOST);
        let direct = deployment
            .direct
            .into_iter()
            .map(|direct| {
                let queues = compute.attach_queues(direct.completion_queue, depth);
                (direct, queues)
            })
            .collect();
        let mut servers = Vec::new();
        let rpc = deployment
            .rpc
            .into_iter()
            .map(|rpc| {
                // Requests and their replies' receives: two entries per
                // request.
                let queues = compute.attach_queues(rpc.completion_queue, 2 * rpc_depth);
                servers.push(rpc.server);
                RpcPath {
                    queue_pair: rpc.queue_pair,
                    buffers: rpc.buffers,
                    buffers_region: rpc.buffers_region,
                    queues,
                }
            })
            .collect();
        fill(pool, staged.nic_mut(MEMORY_HOST))?;
        let mut engine_busy = Vec::new();
        let mut spot = None;
        if matches!(offload, Offload::Spot) {
            let agent = Arc::new(Mutex::new(deployment.engine));
            engine_busy.push(staged.add_agent(MEMORY_HOST, agent.clone()));
            spot = Some(agent);
            // The compute node's connection service is left out: the
            // benchmarks measure the data path, and on the embedded rack
            // every agent shares the fabric thread, where an idle control
            // service still costs each turn (a real compute node runs it
            // on its own CPU). A queue pair that dies here fails its
            // instance with a typed error (`ConnectionError::NoService`),
            // as before reconnection existed.
        }
        for server in servers {
            engine_busy.push(staged.add_agent(MEMORY_HOST, Arc::new(Mutex::new(server))));
        }
        let switch = staged.l2l3_switch();
        let (rack, _switch) = staged.start(switch)?;
        Ok(FarMemoryRack {
            rack,
            pool,
            clients: deployment.clients,
            direct,
            rpc,
            engine_busy,
            engine: spot,
            p4_switch: None,
        })
    }

    /// Cowbird-P4: the clients on the compute node, the pool on the
    /// memory node, the engine in the switch; nothing else.
    fn start_p4(
        spec: CowbirdSpec,
        config: P4Config,
        fill: Box<Fill<'_>>,
    ) -> Result<FarMemoryRack, FarMemoryError> {
        let topology = topology();
        let staged = stage(&topology)?;
        let (deployment, rack, switch) = p4_rack(config, &topology, &spec, staged, fill)?;
        Ok(FarMemoryRack {
            rack,
            pool: deployment.pool[0],
            clients: deployment.clients,
            direct: Vec::new(),
            rpc: Vec::new(),
            engine_busy: Vec::new(),
            engine: None,
            p4_switch: Some(switch),
        })
    }

    pub fn compute(&self) -> &Shared<NodeEndpoint> {
        self.rack.host(COMPUTE_HOST)
    }

    pub fn memory(&self) -> &Shared<NodeEndpoint> {
        self.rack.host(MEMORY_HOST)
    }

    /// Wakes the fabric thread after posting on a direct path.
    pub fn kicker(&self) -> DriverKicker {
        self.rack.fabric().kicker()
    }
}

/// Cowbird-P4 on the two hosts: the clients and the pool deployed with
/// the switch program, the pool filled, then the switch with its probe
/// generator running.
fn p4_rack(
    config: P4Config,
    topology: &Topology,
    spec: &CowbirdSpec,
    mut staged: StagedRack,
    fill: Box<Fill<'_>>,
) -> Result<
    (
        P4Deployment,
        EmbeddedRack,
        Shared<SwitchEndpoint<CowbirdP4>>,
    ),
    FarMemoryError,
> {
    let mut program = P4Engine::with_forwarding(config, topology.forwarding());
    let (compute, memory) = staged.nic_pair_mut(COMPUTE_HOST, MEMORY_HOST);
    let ports = crate::scenario::switch_ports();
    let deployment = deploy_p4(spec, compute, memory, &mut program, ports)?;
    fill(deployment.pool[0], staged.nic_mut(MEMORY_HOST))?;
    let template = program.probe_template();
    let mut switch = Switch::new(SwitchConfig::new(2), program);
    switch.add_template(template, Timestamp::ZERO)?;
    let (rack, switch) = staged.start(switch)?;
    Ok((deployment, rack, switch))
}
