//! Bringing a rack up.
//!
//! - **embedded**: one process. The switch and every node's soft RNIC run
//!   on one fabric thread over in-process rings; each compute node's
//!   workload runs on its own application thread.
//! - **processes**: the launcher runs the switch; every node is a child
//!   `remora node` process, over a memfd ring segment the children inherit
//!   (`shm`) or a UDP tunnel per node (`udp`, node `i` on 127.0.0.(10+i)).
//! - **netns**: every node runs in its own network namespace behind a
//!   veth; the switch reads and writes the root-side veths with AF_PACKET.
//!   Namespaces and veths are removed on exit. Needs root.
//!
//! In every mode the nodes meet over the control channel (Unix sockets in
//! a run directory), Ctrl-C stops everything cleanly, and a node that dies
//! is reported rather than waited for.

use crate::assembly::{self, RackBuilder, SwitchReporting};
use crate::config::{NodeConfig, RackConfig, Role};
use crate::control::{self, ControlAddress, MemoryService};
use crate::endpoint::{
    lock, pin_current_thread, rack_queue_pair, DriverKicker, FabricThread, NodeEndpoint,
    ReceivePool, Shared, SwitchEndpoint, ThreadRole,
};
use crate::report::{NodeReport, RackReport, RnicSummary, SwitchReport};
use crate::workload::{self, Placement, Target};
use crate::RackError;
use remora_carrier::wrappers::{Copied, PcapSink, PortCountersHandle};
use remora_carrier::{bind_pair, DatagramPort, PacketSocketOptions, Port, Segment, SegmentPlan};
use remora_rnic::*;
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::{PortId, Switch, SwitchConfig};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

const RING_DEPTH: u32 = 512;
const RECEIVE_SLOTS: u64 = 256;
const RECEIVE_SLOT_BYTES: u32 = 256;
/// How long nodes get to finish after being asked to stop.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long the launcher waits for a node to say it is serving before it
/// stops it: a node stopped while still starting dies of the signal
/// before it can report.
const READY_WAIT: Duration = Duration::from_secs(20);

/// The file a node process creates once it serves (its interrupt handler
/// is in place, so a SIGTERM from now on stops it cleanly, with a report).
pub fn ready_marker(run_directory: &Path, name: &str) -> PathBuf {
    run_directory.join(format!("{name}.ready"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Embedded,
    Processes,
    Netns,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CarrierKind {
    Shm,
    Udp,
}

#[derive(Debug, Clone)]
pub struct LaunchOptions {
    pub mode: Mode,
    /// For processes mode.
    pub carrier: CarrierKind,
    /// Writes every frame the switch receives to this pcap file.
    pub capture: Option<PathBuf>,
    /// The `remora` executable children run (processes and netns modes).
    pub executable: PathBuf,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Embedded => "embedded",
            Mode::Processes => "processes",
            Mode::Netns => "netns",
        }
    }
}

/// A temporary directory for control sockets and child reports, removed
/// on drop.
struct RunDirectory(PathBuf);

impl RunDirectory {
    fn create(rack: &str) -> Result<RunDirectory, RackError> {
        let path = std::env::temp_dir().join(format!("remora-{rack}-{}", std::process::id()));
        // A fresh directory only this user can enter: never one someone
        // prepared (the rack runs as root in netns mode).
        std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
            .create(&path)
            .map_err(|error| {
                RackError::Launch(format!("cannot create {}: {error}", path.display()))
            })?;
        Ok(RunDirectory(path))
    }
}

impl Drop for RunDirectory {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn control_address(node: &NodeConfig, run_directory: &Path) -> ControlAddress {
    match &node.control {
        Some(address) => ControlAddress::Tcp(address.clone()),
        None => ControlAddress::Unix(run_directory.join(format!("{}.sock", node.name))),
    }
}

fn build_switch(rack: &RackConfig) -> Result<Switch<L2L3Forwarding>, RackError> {
    let mut program = L2L3Forwarding::new(rack.switch_mac, crate::config::MAX_NODES * 2);
    for node in &rack.nodes {
        let port = PortId(node.port);
        let table = |error: remora_switch::table::TableError| RackError::Config(error.to_string());
        program
            .add_attached_host(node.mac, node.address, port)
            .map_err(table)?;
    }
    Ok(Switch::new(
        SwitchConfig::new(rack.nodes.len() as u16),
        program,
    ))
}

/// The switch's end of a node's link, as the rack builder wraps it.
fn switch_port(
    rack: &RackConfig,
    node: &NodeConfig,
    port: impl Port + 'static,
    capture: Option<&PcapSink>,
) -> (Box<dyn Port>, PortCountersHandle) {
    let index = usize::from(node.port);
    assembly::switch_port(rack.topology().host(index), index, port, capture)
}

/// A node's end of its link, and its endpoint (one process per node).
pub(crate) fn node_endpoint(
    rack: &RackConfig,
    node: &NodeConfig,
    port: impl Port + 'static,
) -> Shared<NodeEndpoint> {
    let index = usize::from(node.port);
    let host = rack.topology().host(index);
    Arc::new(Mutex::new(NodeEndpoint::new(
        &node.name,
        assembly::host_nic(host, index, nic_seed()),
        assembly::host_port(&host.link, index, port),
    )))
}

/// NIC seeds differ per run, so keys and PSNs never repeat across racks.
fn nic_seed() -> u64 {
    0x7ac4 ^ u64::from(std::process::id())
}

/// Waits for a node's role to end and records how it went.
fn join_role(role: RoleHandle, report: &mut NodeReport) {
    match role {
        RoleHandle::Compute(thread) => match thread.join() {
            Ok(Ok(workload)) => report.workload = Some(workload),
            Ok(Err(error)) => report.error = Some(error.to_string()),
            Err(_) => report.error = Some("the workload thread panicked".into()),
        },
        RoleHandle::Memory(thread) => {
            let _ = thread.join();
        }
        RoleHandle::Idle => {}
    }
}

/// What a node runs besides its RNIC.
enum RoleHandle {
    Memory(std::thread::JoinHandle<()>),
    Compute(std::thread::JoinHandle<Result<crate::report::WorkloadReport, RackError>>),
    /// Nothing beside the NIC (an offload host under `rack up`).
    Idle,
}

fn start_memory(
    node: &NodeConfig,
    endpoint: &Shared<NodeEndpoint>,
    kicker: DriverKicker,
    run_directory: &Path,
    stop: Arc<AtomicBool>,
) -> Result<RoleHandle, RackError> {
    let service = {
        let mut guard = lock(endpoint);
        let rnic = &mut guard.rnic;
        let pd = rnic.alloc_protection_domain()?;
        let region = rnic.register_memory(pd, node.memory_bytes, AccessFlags::ALL)?;
        let cq = rnic.create_completion_queue(4 * RECEIVE_SLOTS as usize)?;
        let srq = rnic.create_shared_receive_queue(pd, RECEIVE_SLOTS as usize)?;
        let inbox = rnic.register_memory(
            pd,
            RECEIVE_SLOTS * u64::from(RECEIVE_SLOT_BYTES),
            AccessFlags::LOCAL_WRITE,
        )?;
        let pool = ReceivePool {
            queue: srq,
            completions: cq,
            region: inbox,
            slot_bytes: RECEIVE_SLOT_BYTES,
        };
        for slot in 0..RECEIVE_SLOTS {
            pool.post(rnic, slot)?;
        }
        guard.receive_pool = Some(pool);
        let mut builder = rack_queue_pair(pd, cq);
        builder.shared_receive_queue = Some(srq);
        MemoryService { builder, region }
    };
    let address = control_address(node, run_directory);
    Ok(RoleHandle::Memory(control::serve(
        &address,
        Arc::clone(endpoint),
        service,
        kicker,
        stop,
    )?))
}

fn start_compute(
    rack: &RackConfig,
    node: &NodeConfig,
    endpoint: &Shared<NodeEndpoint>,
    kicker: DriverKicker,
    run_directory: &Path,
    stop: Arc<AtomicBool>,
    pin: bool,
) -> RoleHandle {
    let targets: Vec<Target> = rack
        .memory_nodes()
        .map(|memory| Target {
            name: memory.name.clone(),
            control: control_address(memory, run_directory),
        })
        .collect();
    let computes: Vec<&NodeConfig> = rack
        .nodes
        .iter()
        .filter(|other| other.role == Role::Compute)
        .collect();
    let placement = Placement {
        compute_index: computes
            .iter()
            .position(|other| other.name == node.name)
            .unwrap_or(0) as u64,
        compute_count: computes.len().max(1) as u64,
    };
    let (node, endpoint) = (node.clone(), Arc::clone(endpoint));
    RoleHandle::Compute(std::thread::spawn(move || {
        if pin {
            pin_current_thread(ThreadRole::Application(placement.compute_index as usize));
        }
        workload::run(&endpoint, &kicker, &node, &targets, placement, &stop)
    }))
}

fn start_role(
    rack: &RackConfig,
    node: &NodeConfig,
    endpoint: &Shared<NodeEndpoint>,
    kicker: DriverKicker,
    run_directory: &Path,
    stop: &Arc<AtomicBool>,
    pin_threads: bool,
) -> Result<RoleHandle, RackError> {
    match node.role {
        Role::Memory => start_memory(node, endpoint, kicker, run_directory, Arc::clone(stop)),
        // An offload host's programs belong to the system that uses it;
        // `rack up` brings its NIC up and leaves it idle.
        Role::Offload => Ok(RoleHandle::Idle),
        Role::Compute => Ok(start_compute(
            rack,
            node,
            endpoint,
            kicker,
            run_directory,
            Arc::clone(stop),
            pin_threads,
        )),
    }
}

fn node_report(node: &NodeConfig, endpoint: &Shared<NodeEndpoint>) -> NodeReport {
    let endpoint = lock(endpoint);
    NodeReport {
        name: node.name.clone(),
        role: node.role.name().into(),
        rnic: RnicSummary::from(endpoint.rnic.counters()),
        frames_dropped_no_room: endpoint.frames_dropped_no_room(),
        carrier_drops: endpoint.carrier_drops(),
        workload: None,
        error: None,
    }
}

/// Brings the rack up, runs every compute node's workload to the end, then
/// shuts everything down and reports. `stop` (set by Ctrl-C) ends it early.
pub fn rack_up(
    rack: &RackConfig,
    options: &LaunchOptions,
    stop: Arc<AtomicBool>,
) -> Result<RackReport, RackError> {
    rack.check_unchanged()?;
    let run_directory = RunDirectory::create(&rack.name)?;
    let capture = options
        .capture
        .as_deref()
        .map(PcapSink::create)
        .transpose()?;
    let mut report = match options.mode {
        Mode::Embedded => embedded(rack, &run_directory.0, capture.as_ref(), stop),
        Mode::Processes | Mode::Netns => {
            supervised(rack, options, &run_directory.0, capture.as_ref(), stop)
        }
    }?;
    if let Some(reason) = capture.as_ref().and_then(PcapSink::failure) {
        report.notes.push(format!(
            "the capture stopped early, the rack ran on: {reason}"
        ));
    }
    Ok(report)
}

fn embedded(
    rack: &RackConfig,
    run_directory: &Path,
    capture: Option<&PcapSink>,
    stop: Arc<AtomicBool>,
) -> Result<RackReport, RackError> {
    // One process for the whole rack: its threads get their own cores.
    let pin_threads = true;
    let mut builder = RackBuilder::new(rack.topology())
        .nic_seed(nic_seed())
        .pin_threads(pin_threads)
        .fabric_threads(rack.fabric_threads)
        .stopping(&stop);
    if let Some(sink) = capture {
        builder = builder.capture(sink.clone());
    }
    let (mut embedded, _switch) = builder.build()?.start(build_switch(rack)?)?;
    let fabric_threads = embedded.fabric().thread_count();
    let endpoints: Vec<Shared<NodeEndpoint>> = (0..rack.nodes.len())
        .map(|index| embedded.host(index).clone())
        .collect();
    let mut roles = Vec::new();
    for (node, endpoint) in rack.nodes.iter().zip(&endpoints) {
        roles.push(start_role(
            rack,
            node,
            endpoint,
            embedded.fabric().kicker(),
            run_directory,
            &stop,
            pin_threads,
        )?);
    }
    let mut reports: Vec<NodeReport> = rack
        .nodes
        .iter()
        .zip(&endpoints)
        .map(|(node, endpoint)| node_report(node, endpoint))
        .collect();
    // Compute roles first: memory roles end only once everything stops.
    let (computes, services): (Vec<_>, Vec<_>) = roles
        .into_iter()
        .enumerate()
        .partition(|(_, role)| matches!(role, RoleHandle::Compute(_)));
    for (index, role) in computes {
        join_role(role, &mut reports[index]);
    }
    embedded.stop_and_join()?;
    for (index, role) in services {
        join_role(role, &mut reports[index]);
    }
    for ((report, node), endpoint) in reports.iter_mut().zip(&rack.nodes).zip(&endpoints) {
        report.rnic = node_report(node, endpoint).rnic;
    }
    Ok(RackReport {
        rack: rack.name.clone(),
        mode: Mode::Embedded.name().into(),
        carrier: embedded.carrier().name().into(),
        fabric_threads,
        nodes: reports,
        switch: embedded.switch_report(),
        notes: rack.topology().shaping_notes(),
    })
}

/// The per-node carrier a child process gets, as command-line arguments.
struct ChildCarrier {
    arguments: Vec<String>,
    /// Descriptors this child, and only this child, inherits: they stay
    /// close-on-exec here and the child clears the flag on its own copies
    /// between fork and exec. Closed here when the launch ends.
    inherited: Vec<OwnedFd>,
}

/// Network namespaces and veths made for a netns rack, removed on drop.
struct Namespaces {
    names: Vec<String>,
    veths: Vec<String>,
    node_sides: Vec<String>,
}

fn ip(arguments: &[&str]) -> Result<(), RackError> {
    let output = Command::new("ip")
        .args(arguments)
        .output()
        .map_err(|error| RackError::Launch(format!("cannot run ip (iproute2): {error}")))?;
    if !output.status.success() {
        return Err(RackError::Launch(format!(
            "ip {}: {}",
            arguments.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}

/// A namespace or veth a rack made, until it removes it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum NetworkObject {
    Namespace(String),
    Veth(String),
}

/// What every live `Namespaces` made: an exit that runs no destructors (a
/// second Ctrl-C) left them behind, each namespace keeping its veth pair
/// alive. [`remove_live_namespaces`] removes them on such an exit.
static LIVE_NETWORK_OBJECTS: Mutex<Vec<NetworkObject>> = Mutex::new(Vec::new());

fn live_network_objects() -> MutexGuard<'static, Vec<NetworkObject>> {
    LIVE_NETWORK_OBJECTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Removes `objects`, veths before the namespaces that hold their peers.
fn remove_network_objects(objects: &[NetworkObject]) {
    for object in objects {
        if let NetworkObject::Veth(name) = object {
            let _ = Command::new("ip").args(["link", "del", name]).output();
        }
    }
    for object in objects {
        if let NetworkObject::Namespace(name) = object {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}

/// Removes every namespace and veth a live rack made: for a process that
/// ends without running destructors (`rack up`'s second Ctrl-C).
pub fn remove_live_namespaces() {
    let objects = std::mem::take(&mut *live_network_objects());
    remove_network_objects(&objects);
}

impl Namespaces {
    /// Keeps `object` on the live list as soon as it exists.
    fn made(object: NetworkObject) {
        live_network_objects().push(object);
    }

    fn create(count: usize) -> Result<Namespaces, RackError> {
        if !rustix::process::geteuid().is_root() {
            return Err(RackError::Launch("netns mode creates network namespaces and veths and opens AF_PACKET sockets: it needs root (CAP_NET_ADMIN and CAP_NET_RAW). Run it with sudo, or use --mode embedded or --mode processes".into()));
        }
        let tag = std::process::id() % 100_000;
        let mut made = Namespaces {
            names: Vec::new(),
            veths: Vec::new(),
            node_sides: Vec::new(),
        };
        for index in 0..count {
            let (namespace, switch_side, node_side) = (
                format!("remora{tag}n{index}"),
                format!("rmr{tag}s{index}"),
                format!("rmr{tag}n{index}"),
            );
            ip(&["netns", "add", &namespace])?;
            Namespaces::made(NetworkObject::Namespace(namespace.clone()));
            made.names.push(namespace.clone());
            ip(&[
                "link",
                "add",
                "name",
                &switch_side,
                "type",
                "veth",
                "peer",
                "name",
                &node_side,
                "netns",
                &namespace,
            ])?;
            Namespaces::made(NetworkObject::Veth(switch_side.clone()));
            made.veths.push(switch_side.clone());
            made.node_sides.push(node_side.clone());
            // No kernel traffic on the rack's wires: no IPv6 autoconfiguration.
            let _ = std::fs::write(
                format!("/proc/sys/net/ipv6/conf/{switch_side}/disable_ipv6"),
                "1",
            );
            let _ = Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &namespace,
                    "sh",
                    "-c",
                    &format!("echo 1 > /proc/sys/net/ipv6/conf/{node_side}/disable_ipv6"),
                ])
                .output();
            // Jumbo frames: a RoCE frame at MTU 4096 is about 4.2 KB.
            ip(&["link", "set", "dev", &switch_side, "mtu", "9000", "up"])?;
            ip(&[
                "-n", &namespace, "link", "set", "dev", &node_side, "mtu", "9000", "up",
            ])?;
        }
        Ok(made)
    }

    fn switch_side(&self, index: usize) -> &str {
        &self.veths[index]
    }
}

impl Namespaces {
    fn objects(&self) -> Vec<NetworkObject> {
        let veths = self.veths.iter().cloned().map(NetworkObject::Veth);
        let namespaces = self.names.iter().cloned().map(NetworkObject::Namespace);
        veths.chain(namespaces).collect()
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        let objects = self.objects();
        remove_network_objects(&objects);
        live_network_objects().retain(|live| !objects.contains(live));
    }
}

fn supervised(
    rack: &RackConfig,
    options: &LaunchOptions,
    run_directory: &Path,
    capture: Option<&PcapSink>,
    stop: Arc<AtomicBool>,
) -> Result<RackReport, RackError> {
    let spokes = rack.nodes.len() as u32;
    let mut switch_ports = Vec::new();
    let mut port_counters = Vec::new();
    let mut carriers = Vec::new();
    let mut segment = None;
    let mut namespaces = None;
    let carrier_name;
    match (options.mode, options.carrier) {
        (Mode::Netns, _) => {
            carrier_name = "AF_PACKET over veth";
            let made = Namespaces::create(rack.nodes.len())?;
            for node in &rack.nodes {
                let index = usize::from(node.port);
                let port = DatagramPort::packet(&PacketSocketOptions {
                    interface: made.switch_side(index).into(),
                    promiscuous: true,
                })?;
                let (port, counters) = switch_port(rack, node, port, capture);
                switch_ports.push(port);
                port_counters.push(counters);
                carriers.push(ChildCarrier {
                    arguments: vec!["--packet-interface".into(), made.node_sides[index].clone()],
                    inherited: Vec::new(),
                });
            }
            namespaces = Some(made);
        }
        (Mode::Processes, CarrierKind::Shm) => {
            carrier_name = "shared-memory rings (memfd)";
            let shared = Segment::shared(
                &format!("remora-{}", rack.name),
                &SegmentPlan::star(spokes, RING_DEPTH),
            )?;
            for node in &rack.nodes {
                let fd = descriptor_for_one_child(shared.shared_fd()?)?;
                let (port, counters) = switch_port(
                    rack,
                    node,
                    shared.hub_port(u32::from(node.port) + 1)?,
                    capture,
                );
                switch_ports.push(port);
                port_counters.push(counters);
                carriers.push(ChildCarrier {
                    arguments: vec!["--shm-fd".into(), fd.as_raw_fd().to_string()],
                    inherited: vec![fd],
                });
            }
            segment = Some(shared);
        }
        (Mode::Processes, CarrierKind::Udp) => {
            carrier_name = "UDP tunnel";
            for node in &rack.nodes {
                // Node `i` on 127.0.0.(10+i); at most 64 nodes, so it fits.
                let node_host = std::net::Ipv4Addr::new(127, 0, 0, 10 + node.port as u8);
                let [(switch_socket, switch_address), (node_socket, node_address)] = bind_pair(
                    SocketAddr::from(([127, 0, 0, 1], 0)),
                    SocketAddr::from((node_host, 0)),
                )?;
                let (port, counters) = switch_port(
                    rack,
                    node,
                    DatagramPort::udp_on(switch_socket, node_address)?,
                    capture,
                );
                switch_ports.push(port);
                port_counters.push(counters);
                let fd = OwnedFd::from(node_socket);
                carriers.push(ChildCarrier {
                    arguments: vec![
                        "--udp-fd".into(),
                        fd.as_raw_fd().to_string(),
                        "--udp-peer".into(),
                        switch_address.to_string(),
                    ],
                    inherited: vec![fd],
                });
            }
        }
        (Mode::Embedded, _) => unreachable!("embedded racks are not supervised"),
    }
    let switch = Arc::new(Mutex::new(SwitchEndpoint::new(
        build_switch(rack)?,
        switch_ports,
    )));
    let fabric = assembly::start_fabric("switch", vec![switch.clone()], false)?;
    let children = spawn_children(rack, options, run_directory, &carriers, namespaces.as_ref());
    // The children hold their own copies now.
    drop(carriers);
    let outcome =
        children.and_then(|children| supervise(rack, children, run_directory, &stop, &fabric));
    let fabric_result = fabric.stop_and_join();
    drop(segment);
    drop(namespaces);
    let reports = outcome?;
    fabric_result?;
    let switch_report = lock(&switch).report(&port_counters);
    if let Some(sink) = capture {
        sink.flush()?;
    }
    Ok(RackReport {
        rack: rack.name.clone(),
        mode: options.mode.name().into(),
        carrier: carrier_name.into(),
        // The switch process pumps its ports on one thread; each node
        // process pumps its own NIC.
        fabric_threads: 1,
        nodes: reports,
        switch: switch_report,
        notes: supervised_notes(rack, options.mode, stop.load(Ordering::Relaxed)),
    })
}

/// The shaping notes, and that a node process has one carrier: an
/// offload host's local link crosses the switch here.
fn supervised_notes(rack: &RackConfig, mode: Mode, interrupted: bool) -> Vec<String> {
    let topology = rack.topology();
    let mut notes = topology.shaping_notes();
    if interrupted {
        notes.push("interrupted: the nodes were stopped before their workloads finished".into());
    }
    for (host, offload) in topology.local_links() {
        notes.push(format!(
            "host {:?}: in {} mode its local link to {:?} crosses the switch (one carrier per node process), shaped as its uplink",
            topology.host(offload).name,
            mode.name(),
            topology.host(host).name
        ));
    }
    notes
}

fn spawn_children(
    rack: &RackConfig,
    options: &LaunchOptions,
    run_directory: &Path,
    carriers: &[ChildCarrier],
    namespaces: Option<&Namespaces>,
) -> Result<Vec<Child>, RackError> {
    let mut children: Vec<Child> = Vec::new();
    // Every node runs the rack this launcher parsed: the file may have
    // changed since, and nodes started later would have read another.
    let rack_snapshot = run_directory.join("rack.toml");
    std::fs::write(&rack_snapshot, rack.source()).map_err(|error| {
        RackError::Launch(format!("cannot write {}: {error}", rack_snapshot.display()))
    })?;
    // Memory nodes first, so compute nodes find their control sockets soon.
    let mut order: Vec<&NodeConfig> = rack.nodes.iter().collect();
    order.sort_by_key(|node| node.role != Role::Memory);
    let mut by_port: Vec<Option<Child>> = (0..rack.nodes.len()).map(|_| None).collect();
    for node in order {
        let mut command = match namespaces {
            Some(made) => {
                let mut command = Command::new("ip");
                command
                    .args(["netns", "exec", &made.names[usize::from(node.port)]])
                    .arg(&options.executable);
                command
            }
            None => Command::new(&options.executable),
        };
        command
            .arg("node")
            .arg(&rack_snapshot)
            .args(["--name", &node.name, "--run-dir"])
            .arg(run_directory);
        let carrier = &carriers[usize::from(node.port)];
        command.args(&carrier.arguments);
        let own: Vec<RawFd> = carrier.inherited.iter().map(AsRawFd::as_raw_fd).collect();
        let launcher = rustix::process::getpid();
        // SAFETY: between fork and exec only async-signal-safe calls run:
        // fcntl on descriptors this process owns, and prctl and getppid.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                for fd in &own {
                    // Close-on-exec is the only descriptor flag.
                    let borrowed = std::os::fd::BorrowedFd::borrow_raw(*fd);
                    rustix::io::fcntl_setfd(borrowed, rustix::io::FdFlags::empty())?;
                }
                // A node ends with its launcher (this thread supervises
                // them to the end): killed, the launcher left its nodes
                // running for ever with their memory registered. The
                // setting survives `ip netns exec`. A launcher gone
                // before it took effect starts no node.
                rustix::process::set_parent_process_death_signal(Some(
                    rustix::process::Signal::TERM,
                ))?;
                if rustix::process::getppid() != Some(launcher) {
                    return Err(std::io::Error::other("the launcher is gone"));
                }
                Ok(())
            });
        }
        command
            .arg("--report")
            .arg(run_directory.join(format!("{}.json", node.name)));
        match command.spawn() {
            Ok(child) => by_port[usize::from(node.port)] = Some(child),
            Err(error) => {
                for mut child in by_port.into_iter().flatten() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                return Err(RackError::Launch(format!(
                    "cannot start node {}: {error}",
                    node.name
                )));
            }
        }
    }
    children.extend(
        by_port
            .into_iter()
            .map(|child| child.expect("every node spawned")),
    );
    Ok(children)
}

/// What became of a node process.
#[derive(Debug)]
enum Exit {
    Running,
    Exited(std::process::ExitStatus),
    /// Its wait failed (someone else took its status: under a parent that
    /// ignores SIGCHLD the kernel reaps it): it is gone, and it is never
    /// signalled again, as its pid may be another process's by now.
    Lost(String),
}

impl Exit {
    fn is_running(&self) -> bool {
        matches!(self, Exit::Running)
    }

    /// What a child's wait or try-wait said.
    fn of(waited: std::io::Result<Option<std::process::ExitStatus>>) -> Exit {
        match waited {
            Ok(Some(status)) => Exit::Exited(status),
            Ok(None) => Exit::Running,
            Err(error) => Exit::Lost(error.to_string()),
        }
    }
}

fn signal(child: &Child, signal: rustix::process::Signal) {
    if let Some(pid) = rustix::process::Pid::from_raw(child.id() as i32) {
        let _ = rustix::process::kill_process(pid, signal);
    }
}

/// Waits for every compute node to finish, then stops the memory nodes
/// once each has said it serves (up to [`READY_WAIT`]: one stopped while
/// still starting died of the signal unreported). A node that dies early,
/// the switch's end, or Ctrl-C stops the rack at once.
fn supervise(
    rack: &RackConfig,
    mut children: Vec<Child>,
    run_directory: &Path,
    stop: &AtomicBool,
    switch: &FabricThread,
) -> Result<Vec<NodeReport>, RackError> {
    let mut exits: Vec<Exit> = children.iter().map(|_| Exit::Running).collect();
    let mut failure: Option<String> = None;
    let mut ready_deadline = None;
    // Bounded by the compute workloads' own timeouts, which end them, and
    // then by the ready wait's.
    loop {
        for (index, child) in children.iter_mut().enumerate() {
            if !exits[index].is_running() {
                continue;
            }
            exits[index] = Exit::of(child.try_wait());
            let node = &rack.nodes[index];
            match &exits[index] {
                Exit::Exited(status) if !status.success() || node.role != Role::Compute => {
                    failure.get_or_insert_with(|| {
                        format!("node {} exited early ({status})", node.name)
                    });
                }
                Exit::Lost(error) => {
                    failure.get_or_insert_with(|| {
                        format!("node {} cannot be waited for ({error})", node.name)
                    });
                }
                Exit::Exited(_) | Exit::Running => {}
            }
        }
        let computes_done = rack
            .nodes
            .iter()
            .zip(&exits)
            .all(|(node, exit)| node.role != Role::Compute || !exit.is_running());
        if switch.is_finished() {
            failure.get_or_insert_with(|| "the switch stopped".into());
        }
        if failure.is_some() || stop.load(Ordering::Relaxed) {
            break;
        }
        if computes_done {
            let deadline = *ready_deadline.get_or_insert_with(|| Instant::now() + READY_WAIT);
            if all_serve(rack, &exits, run_directory) || Instant::now() > deadline {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let names: Vec<&str> = rack.nodes.iter().map(|node| node.name.as_str()).collect();
    if let Some(stopped) = stop_children(&mut children, &mut exits, &names, STOP_GRACE) {
        failure.get_or_insert(stopped);
    }
    let mut reports = Vec::new();
    for (node, exit) in rack.nodes.iter().zip(&exits) {
        let path = run_directory.join(format!("{}.json", node.name));
        let report = std::fs::read_to_string(&path)
            .ok()
            .and_then(|text| serde_json::from_str::<NodeReport>(&text).ok());
        reports.push(report.unwrap_or_else(|| NodeReport {
            name: node.name.clone(),
            role: node.role.name().into(),
            error: Some(match exit {
                Exit::Exited(status) => format!("exited ({status}) without a report"),
                Exit::Lost(error) => {
                    format!("could not be waited for ({error}) and left no report")
                }
                Exit::Running => "vanished without a report".into(),
            }),
            ..NodeReport::default()
        }));
    }
    if let Some(message) = failure {
        if let Some(report) = reports
            .iter_mut()
            .find(|report| message.contains(&format!("node {} ", report.name)))
        {
            report.error.get_or_insert(message);
        }
    }
    // An interrupted rack still reports: the nodes wrote what they did
    // before the signal (a workload cut short says so in its error), and
    // the caller writes the report it asked for (`rack up --json`).
    Ok(reports)
}

/// Asks every running child to stop, waits up to `grace`, then kills
/// those still running; returns what went wrong first, if anything. Each
/// child's wait ends: a failed wait marks it lost (retried after the
/// grace, a wait that kept failing spun a core for ever).
fn stop_children(
    children: &mut [Child],
    exits: &mut [Exit],
    names: &[&str],
    grace: Duration,
) -> Option<String> {
    for (child, exit) in children.iter().zip(exits.iter()) {
        if exit.is_running() {
            signal(child, rustix::process::Signal::TERM);
        }
    }
    let mut failure = None;
    let deadline = Instant::now() + grace;
    for ((child, exit), name) in children.iter_mut().zip(exits.iter_mut()).zip(names) {
        // Bounded by the deadline, then by one kill and one wait.
        while exit.is_running() {
            *exit = Exit::of(child.try_wait());
            if !exit.is_running() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                *exit = Exit::of(child.wait().map(Some));
                failure.get_or_insert_with(|| {
                    format!("node {name} did not stop within {grace:?} and was killed")
                });
            } else {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    failure
}

/// Whether every node still running has said it serves.
fn all_serve(rack: &RackConfig, exits: &[Exit], run_directory: &Path) -> bool {
    rack.nodes
        .iter()
        .zip(exits)
        .all(|(node, exit)| !exit.is_running() || ready_marker(run_directory, &node.name).exists())
}

/// How a single node process reaches the switch.
#[derive(Debug)]
pub enum NodeCarrier {
    /// Spoke of an inherited shared segment.
    Shm { fd: OwnedFd },
    /// An inherited, bound UDP socket and the switch port's address.
    Udp {
        fd: OwnedFd,
        peer: std::net::SocketAddr,
    },
    /// A bound UDP socket of its own, for racks spanning hosts.
    UdpBind {
        local: std::net::SocketAddr,
        peer: std::net::SocketAddr,
    },
    /// The tunnel addresses the rack file gives this node and its switch port.
    UdpFromRack,
    /// AF_PACKET on an interface.
    Packet { interface: String },
}

/// Runs one node until its workload ends (compute) or `stop` (memory), and
/// returns its report: `remora node`.
pub fn run_node(
    rack: &RackConfig,
    name: &str,
    carrier: NodeCarrier,
    run_directory: &Path,
    stop: Arc<AtomicBool>,
) -> Result<NodeReport, RackError> {
    let node = rack.node(name)?;
    let port: Box<dyn Port> = match carrier {
        // Every node process maps the whole segment: parse private copies.
        NodeCarrier::Shm { fd } => Box::new(Copied::new(
            Segment::attach(fd)?.spoke_port(u32::from(node.port) + 1)?,
        )),
        NodeCarrier::Udp { fd, peer } => Box::new(DatagramPort::udp_on(UdpSocket::from(fd), peer)?),
        NodeCarrier::UdpBind { local, peer } => Box::new(DatagramPort::udp(local, peer)?),
        NodeCarrier::UdpFromRack => Box::new(DatagramPort::udp(
            rack.node_tunnel(node)?,
            rack.switch_tunnel(node)?,
        )?),
        NodeCarrier::Packet { interface } => {
            Box::new(DatagramPort::packet(&PacketSocketOptions {
                interface,
                promiscuous: true,
            })?)
        }
    };
    let endpoint = node_endpoint(rack, node, port);
    let fabric =
        assembly::start_fabric("rnic", vec![endpoint.clone()], false)?.stopping_rack(&stop);
    // Several node processes share the host: leave placement to the kernel.
    let role = start_role(
        rack,
        node,
        &endpoint,
        fabric.kicker(),
        run_directory,
        &stop,
        false,
    )?;
    // Serving: a stop from now on ends the node cleanly, with its report.
    // A marker that cannot be written only costs the launcher its wait.
    let _ready = ReadyMarker::write(ready_marker(run_directory, name));
    let mut report = node_report(node, &endpoint);
    if matches!(role, RoleHandle::Compute(_)) {
        join_role(role, &mut report);
        fabric.stop_and_join()?;
    } else {
        // A memory or offload node serves until stopped from outside
        // (Ctrl-C, SIGTERM).
        while !stop.load(Ordering::Relaxed) && !fabric.is_finished() {
            std::thread::sleep(Duration::from_millis(20));
        }
        fabric.stop_and_join()?;
        join_role(role, &mut report);
    }
    report.rnic = node_report(node, &endpoint).rnic;
    Ok(report)
}

/// The ready marker of a node process, removed when the node ends on any
/// path: a user's own run directory (a rack across hosts) keeps none.
struct ReadyMarker(PathBuf);

impl ReadyMarker {
    fn write(path: PathBuf) -> ReadyMarker {
        let _ = std::fs::write(&path, b"");
        ReadyMarker(path)
    }
}

impl Drop for ReadyMarker {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Runs only the switch, for a rack across hosts: switch port `i` is a UDP
/// tunnel on `tunnel_host:(tunnel_base_port + i)` to node `i`'s tunnel
/// address, and each host runs `remora node --udp`. Runs until `stop`.
pub fn run_switch(
    rack: &RackConfig,
    capture: Option<&Path>,
    stop: Arc<AtomicBool>,
) -> Result<SwitchReport, RackError> {
    let capture = capture.map(PcapSink::create).transpose()?;
    let mut ports = Vec::new();
    let mut counters = Vec::new();
    for node in &rack.nodes {
        let port = DatagramPort::udp(rack.switch_tunnel(node)?, rack.node_tunnel(node)?)?;
        let (port, handle) = switch_port(rack, node, port, capture.as_ref());
        ports.push(port);
        counters.push(handle);
    }
    let switch = Arc::new(Mutex::new(SwitchEndpoint::new(build_switch(rack)?, ports)));
    assembly::run_here(vec![switch.clone()], stop)?;
    if let Some(sink) = capture {
        sink.flush()?;
    }
    let report = lock(&switch).report(&counters);
    Ok(report)
}

/// A copy of `fd` for one child to inherit: close-on-exec until that
/// child's `pre_exec` clears the flag on it. (A plain `dup` left every
/// copy inheritable, so every node inherited every node's descriptor.)
fn descriptor_for_one_child(fd: std::os::fd::BorrowedFd<'_>) -> Result<OwnedFd, RackError> {
    rustix::io::fcntl_dupfd_cloexec(fd, 0)
        .map_err(|error| RackError::Launch(format!("dup the segment: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// A child whose status someone else took (reaped behind the
    /// launcher's back, as the kernel does under a parent that ignores
    /// SIGCHLD): each wait fails. The stop loop then ran kill and wait
    /// again and again with no pause, a core at 100% for ever.
    #[test]
    fn a_child_that_cannot_be_waited_for_does_not_spin_the_supervisor() {
        let child = Command::new("true").spawn().unwrap();
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty()).unwrap();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut exits = vec![Exit::Running];
            let mut children = [child];
            stop_children(&mut children, &mut exits, &["memory0"], Duration::ZERO);
            let _ = done.send(exits.pop());
        });
        let exit = finished
            .recv_timeout(Duration::from_secs(5))
            .expect("the stop loop ended");
        assert!(matches!(exit, Some(Exit::Lost(_))), "{exit:?}");
    }

    #[test]
    fn a_childs_copy_of_the_segment_stays_close_on_exec_for_the_others() {
        let file = std::fs::File::open("/dev/null").unwrap();
        let copy = descriptor_for_one_child(file.as_fd()).unwrap();
        let flags = rustix::io::fcntl_getfd(&copy).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
    }
}
