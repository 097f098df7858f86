//! A node of a rack file joined from inside another program: its NIC on
//! the UDP tunnel the rack file gives it, its own fabric thread, and
//! queue pairs to the rack's memory nodes over their control channels.
//!
//! `remora node` runs a node's built-in role; this is for a program that
//! is the node's application itself (the KV store's `remora kv serve
//! --rack`), on a rack whose switch and memory nodes are processes of
//! their own, as across hosts (`remora rack switch`, `remora node --udp`).

use crate::assembly::start_fabric;
use crate::config::{NodeConfig, RackConfig};
use crate::control::{connect_queue_pair, ControlAddress, RegionMessage};
use crate::endpoint::{
    lock, rack_queue_pair, AppQueues, DriverKicker, FabricThread, NodeEndpoint, Shared,
};
use crate::launch::{control_address, node_endpoint};
use crate::RackError;
use remora_carrier::DatagramPort;
use remora_rnic::*;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// This process's node of the rack.
pub struct AttachedNode {
    node: NodeConfig,
    endpoint: Shared<NodeEndpoint>,
    fabric: Option<FabricThread>,
    kicker: DriverKicker,
}

/// A queue pair to a memory node's region, with host memory of this
/// node's registered for the data to land in and leave from, and the
/// application's lock-free queues to the NIC.
pub struct RemotePath {
    pub queue_pair: QueuePair,
    pub completion_queue: CompletionQueue,
    pub landing: HostMemory,
    pub landing_region: MemoryRegion,
    pub queues: AppQueues,
    /// The memory node's region.
    pub region: RegionMessage,
}

impl AttachedNode {
    /// Brings node `name` of `rack` up on its UDP tunnel.
    pub fn attach(rack: &RackConfig, name: &str) -> Result<AttachedNode, RackError> {
        let node = rack.node(name)?.clone();
        let port = DatagramPort::udp(rack.node_tunnel(&node)?, rack.switch_tunnel(&node)?)?;
        let endpoint = node_endpoint(rack, &node, port);
        let fabric = start_fabric("rnic", vec![endpoint.clone()], false)?;
        let kicker = fabric.kicker();
        Ok(AttachedNode {
            node,
            endpoint,
            fabric: Some(fabric),
            kicker,
        })
    }

    /// See [`FabricThread::stopped_flag`]; none once stopped.
    pub fn fabric_stopped_flag(&self) -> Option<std::sync::Arc<std::sync::atomic::AtomicBool>> {
        self.fabric.as_ref().map(FabricThread::stopped_flag)
    }

    pub fn kicker(&self) -> DriverKicker {
        self.kicker.clone()
    }

    /// A queue pair to memory node `memory` (its control address from the
    /// rack file, or a socket in `run_directory`), `depth` requests deep,
    /// with `landing_bytes` of host memory.
    pub fn connect(
        &self,
        rack: &RackConfig,
        memory: &str,
        run_directory: &Path,
        depth: usize,
        landing_bytes: usize,
        stop: &AtomicBool,
    ) -> Result<RemotePath, RackError> {
        let target = rack.node(memory)?;
        let address: ControlAddress = control_address(target, run_directory);
        let (pd, landing, landing_region, completion_queue) = {
            let mut guard = lock(&self.endpoint);
            let rnic = &mut guard.rnic;
            let pd = rnic.alloc_protection_domain()?;
            let landing = HostMemory::new(landing_bytes);
            let region = rnic.register_host_memory(pd, landing.clone(), AccessFlags::ALL)?;
            let completion_queue = rnic.create_completion_queue(2 * depth)?;
            (pd, landing, region, completion_queue)
        };
        let mut builder = rack_queue_pair(pd, completion_queue);
        builder.send_queue_depth = depth;
        let client = &self.node.name;
        let (queue_pair, region) = connect_queue_pair(
            &self.endpoint,
            &self.kicker,
            client,
            &builder,
            &address,
            stop,
        )?;
        let queues = lock(&self.endpoint).attach_queues(completion_queue, depth);
        Ok(RemotePath {
            queue_pair,
            completion_queue,
            landing,
            landing_region,
            queues,
            region,
        })
    }

    /// Stops the fabric thread; returns its CPU time.
    pub fn stop(&mut self) -> Result<Duration, RackError> {
        match self.fabric.take() {
            Some(fabric) => fabric.stop_and_join(),
            None => Ok(Duration::ZERO),
        }
    }
}

impl Drop for AttachedNode {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}
