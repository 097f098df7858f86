//! A rack for the DSM: a compute node and several memory nodes behind the
//! switch, a daemon on each memory node, and the compute node's channels
//! to each.

use super::client::{Dsm, NodePath};
use super::daemon::{self, MemoryDaemon};
use crate::gatekeeper::memory::MemoryNode;
use crate::gatekeeper::{Gatekeeper, GatekeeperError};
use remora_rack::assembly::{EmbeddedRack, RackBuilder, StagedRack};
use remora_rack::channel::connect_channels;
use remora_rack::endpoint::{rack_queue_pair, Shared, SwitchEndpoint};
use remora_rack::topology::{standard_host, HostSpec, Role, Topology, COMPUTE_HOST};
use remora_rack::RackError;
use remora_rnic::VerbsError;
use remora_switch::programs::overlay::Overlaid;
use remora_switch::{Program, Switch, SwitchConfig};
use remora_wire::{Ipv4Address, Qpn};
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
    #[error(transparent)]
    Topology(#[from] remora_rack::topology::TopologyError),
    #[error("{0} memory nodes: a DSM rack has 1 to 62")]
    MemoryNodes(usize),
    #[error("a DSM rack needs a client")]
    NoClients,
    #[error("the Gatekeeper's tables: {0}")]
    Gatekeeper(#[from] GatekeeperError),
}

pub struct DsmRack {
    pub rack: EmbeddedRack,
    pub dsm: Dsm,
    pub daemons: Vec<Arc<Mutex<MemoryDaemon>>>,
}

/// A started DSM rack, the extra clients' DSMs, and the switch.
pub type StartedDsm<P> = (DsmRack, Vec<Dsm>, Shared<SwitchEndpoint<P>>);

/// The host index of memory node `node`.
pub fn memory_host(node: usize) -> usize {
    node + 1
}

/// A DSM rack before it starts: its memory nodes and daemons deployed,
/// and each client host's channels to every node, so that systems can
/// add their own agents first.
pub struct StagedDsm {
    pub staged: StagedRack,
    pub daemons: Vec<Arc<Mutex<MemoryDaemon>>>,
    /// Each client host's paths to the memory nodes, in `clients` order.
    paths: Vec<Vec<NodePath>>,
    clients: Vec<usize>,
    memory_hosts: Vec<usize>,
    /// Each memory node's address and pool, as a switch's ACL knows them.
    memory_nodes: Vec<(Ipv4Address, MemoryNode)>,
    /// Every channel: the client's queue pair and the memory node's.
    connections: Vec<((Ipv4Address, Qpn), (Ipv4Address, Qpn))>,
}

impl StagedDsm {
    /// Memory nodes at hosts 1..=N, the compute host at 0, and `extra_clients`
    /// more compute hosts after the memory nodes, each a DSM client.
    pub fn new(config: DsmRackConfig, extra_clients: usize) -> Result<StagedDsm, DsmRackError> {
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
        let clients: Vec<usize> = std::iter::once(COMPUTE_HOST)
            .chain((0..extra_clients).map(|extra| memory_host(config.memory_nodes) + extra))
            .collect();
        for &index in &clients[1..] {
            let (mac, address) = standard_host(index);
            let host = HostSpec::new(&format!("compute{index}"), Role::Compute, mac, address);
            let added = topology.add_host(host)?;
            debug_assert_eq!(added, index);
        }
        let memory_hosts: Vec<usize> = (0..config.memory_nodes).map(memory_host).collect();
        StagedDsm::on(&topology, &clients, &memory_hosts, config)
    }

    /// A DSM on `topology`'s hosts: a daemon on each of `memory_hosts` (the
    /// DSM's nodes 0, 1, ... in that order), and each of `clients` a DSM
    /// client with channels to every node (the first is the rack's own
    /// [`DsmRack::dsm`]). `config.memory_nodes` is not used: the hosts say.
    pub fn on(
        topology: &Topology,
        clients: &[usize],
        memory_hosts: &[usize],
        config: DsmRackConfig,
    ) -> Result<StagedDsm, DsmRackError> {
        if !(1..=62).contains(&memory_hosts.len()) {
            return Err(DsmRackError::MemoryNodes(memory_hosts.len()));
        }
        if clients.is_empty() {
            return Err(DsmRackError::NoClients);
        }
        let clients = clients.to_vec();
        let mut staged = RackBuilder::new(topology)
            .thread_name("dsm-fabric")
            .build()?;
        let mut daemons = Vec::new();
        let mut paths: Vec<Vec<NodePath>> = clients.iter().map(|_| Vec::new()).collect();
        let mut memory_nodes = Vec::new();
        let mut connections = Vec::new();
        for (node, &host) in memory_hosts.iter().enumerate() {
            let daemon = daemon::deploy(staged.nic_mut(host), config.pool_bytes)?;
            let resources = daemon.resources();
            let pool = resources.pool_region;
            let memory_address = topology.host(host).address;
            memory_nodes.push((
                memory_address,
                MemoryNode {
                    index: node as u8,
                    pool_base: pool.address.0,
                    pool_bytes: pool.length_bytes,
                    rkey: pool.rkey,
                },
            ));
            for (client, &client_host) in clients.iter().enumerate() {
                let channels = connect_channels(
                    &mut staged,
                    client_host,
                    host,
                    config.channels,
                    config.chunk_bytes,
                    || {
                        let mut builder = rack_queue_pair(
                            resources.protection_domain,
                            resources.completion_queue,
                        );
                        builder.shared_receive_queue = Some(resources.shared_receive_queue);
                        builder
                    },
                )?;
                let client_address = topology.host(client_host).address;
                for (queue_pair, peer) in channels.connections() {
                    connections.push(((client_address, queue_pair.0), (memory_address, peer.qpn)));
                }
                paths[client].push(NodePath {
                    channels,
                    pool: resources.pool_region,
                });
            }
            let daemon = Arc::new(Mutex::new(daemon));
            staged.add_agent(host, daemon.clone());
            daemons.push(daemon);
        }
        Ok(StagedDsm {
            staged,
            daemons,
            paths,
            clients,
            memory_hosts: memory_hosts.to_vec(),
            memory_nodes,
            connections,
        })
    }

    /// The host of client `index` (0 is the rack's own DSM's).
    pub fn client_host(&self, index: usize) -> usize {
        self.clients[index]
    }

    /// Tells a Gatekeeper the DSM's memory nodes and every client's
    /// connection to them, so that its ACL judges their RDMA (and can
    /// answer a refusal with a NAK).
    pub fn install_acl(&self, gatekeeper: &mut Gatekeeper) -> Result<(), GatekeeperError> {
        for (address, node) in &self.memory_nodes {
            gatekeeper.register_memory_node(*address, *node)?;
        }
        for (client, memory) in &self.connections {
            gatekeeper.register_connection(*client, *memory)?;
        }
        let topology = self.staged.topology();
        for &host in self.clients.iter().chain(&self.memory_hosts) {
            gatekeeper.register_host_port(topology.host(host).address, topology.port(host))?;
        }
        Ok(())
    }

    /// The host index of extra client `extra` (0 is the first after the
    /// compute host).
    pub fn extra_client_host(config: &DsmRackConfig, extra: usize) -> usize {
        memory_host(config.memory_nodes) + extra
    }

    /// Starts the rack: the compute host's DSM in the rack, and each
    /// extra client's after it.
    pub fn start(self) -> Result<(DsmRack, Vec<Dsm>), DsmRackError> {
        let switch = self.staged.l2l3_switch();
        let (rack, extra, _switch) = self.start_with(switch)?;
        Ok((rack, extra))
    }

    /// Starts the rack with `gatekeeper` in its switch, the DSM's memory
    /// nodes and connections installed in its ACL.
    pub fn start_guarded(
        self,
        mut gatekeeper: Gatekeeper,
    ) -> Result<StartedDsm<Overlaid<Gatekeeper>>, DsmRackError> {
        self.install_acl(&mut gatekeeper)?;
        let topology = self.staged.topology();
        let switch = Switch::new(
            SwitchConfig::new(topology.hosts().len() as u16),
            Overlaid::new(topology.forwarding(), gatekeeper),
        );
        self.start_with(switch)
    }

    /// Starts the rack with `switch`'s program (a Gatekeeper, say), and
    /// hands back the switch too.
    pub fn start_with<P: Program + Send + 'static>(
        self,
        switch: Switch<P>,
    ) -> Result<StartedDsm<P>, DsmRackError> {
        let (rack, switch) = self.staged.start(switch)?;
        let mut dsms = self
            .paths
            .into_iter()
            .zip(&self.clients)
            .map(|(nodes, &host)| Dsm::new(nodes, rack.fabric().kicker(), rack.host(host).clone()));
        let dsm = dsms.next().expect("the compute host is a client");
        let extra = dsms.collect();
        let rack = DsmRack {
            rack,
            dsm,
            daemons: self.daemons,
        };
        Ok((rack, extra, switch))
    }
}

impl DsmRack {
    pub fn start(config: DsmRackConfig) -> Result<DsmRack, DsmRackError> {
        let (rack, _no_extra_clients) = StagedDsm::new(config, 0)?.start()?;
        Ok(rack)
    }
}
