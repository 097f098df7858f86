//! A rack for the DSM: a compute node and several memory nodes behind the
//! switch, a daemon on each memory node, and the compute node's channels
//! to each.

use super::client::{Dsm, NodePath};
use super::daemon::{self, MemoryDaemon};
use remora_rack::assembly::{EmbeddedRack, RackBuilder};
use remora_rack::channel::connect_channels;
use remora_rack::endpoint::rack_queue_pair;
use remora_rack::topology::{standard_host, HostSpec, Role, Topology, COMPUTE_HOST};
use remora_rack::RackError;
use remora_rnic::VerbsError;
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DsmRackConfig {
    /// Memory nodes (the thesis uses three or more).
    pub memory_nodes: usize,
    pub pool_bytes: u64,
    /// Channels from the compute node to each memory node.
    pub channels: usize,
    /// The largest single transfer.
    pub chunk_bytes: usize,
}

impl Default for DsmRackConfig {
    fn default() -> DsmRackConfig {
        DsmRackConfig {
            memory_nodes: 3,
            pool_bytes: 16 << 20,
            channels: 2,
            chunk_bytes: 64 << 10,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DsmRackError {
    #[error(transparent)]
    Rack(#[from] RackError),
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    #[error("{0} memory nodes: a DSM rack has 1 to 62")]
    MemoryNodes(usize),
}

pub struct DsmRack {
    pub rack: EmbeddedRack,
    pub dsm: Dsm,
    pub daemons: Vec<Arc<Mutex<MemoryDaemon>>>,
}

/// The host index of memory node `node`.
pub fn memory_host(node: usize) -> usize {
    node + 1
}

impl DsmRack {
    pub fn start(config: DsmRackConfig) -> Result<DsmRack, DsmRackError> {
        if !(1..=62).contains(&config.memory_nodes) {
            return Err(DsmRackError::MemoryNodes(config.memory_nodes));
        }
        let mut topology = Topology::compute_and_memory();
        for node in 1..config.memory_nodes {
            let (mac, address) = standard_host(memory_host(node));
            let host = HostSpec::new(&format!("memory{node}"), Role::Memory, mac, address);
            topology
                .add_host(host)
                .expect("distinct standard hosts fit a rack");
        }
        let mut staged = RackBuilder::new(&topology)
            .thread_name("dsm-fabric")
            .build()?;
        let mut daemons = Vec::new();
        let mut nodes = Vec::new();
        for node in 0..config.memory_nodes {
            let host = memory_host(node);
            let daemon = daemon::deploy(staged.nic_mut(host), config.pool_bytes)?;
            let resources = daemon.resources();
            let channels = connect_channels(
                &mut staged,
                COMPUTE_HOST,
                host,
                config.channels,
                config.chunk_bytes,
                || {
                    let mut builder =
                        rack_queue_pair(resources.protection_domain, resources.completion_queue);
                    builder.shared_receive_queue = Some(resources.shared_receive_queue);
                    builder
                },
            )?;
            nodes.push(NodePath {
                channels,
                pool: resources.pool_region,
            });
            let daemon = Arc::new(Mutex::new(daemon));
            staged.add_agent(host, daemon.clone());
            daemons.push(daemon);
        }
        let switch = staged.l2l3_switch();
        let (rack, _switch) = staged.start(switch)?;
        let dsm = Dsm::new(nodes, rack.fabric().kicker());
        Ok(DsmRack { rack, dsm, daemons })
    }
}
