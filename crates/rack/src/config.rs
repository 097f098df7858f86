//! The rack file.
//!
//! ```toml
//! [rack]
//! name = "two-nodes"
//!
//! [switch]
//! program = "l2l3"
//!
//! [[node]]
//! name = "compute0"
//! role = "compute"
//! address = "10.0.0.1"
//! memory = "1MiB"
//! [node.workload]
//! operations = 200
//!
//! [[node]]
//! name = "memory0"
//! role = "memory"
//! address = "10.0.0.2"
//! memory = "64MiB"
//! [node.link]
//! loss = 0.01
//! ```
//!
//! Node `i` (in file order) sits on switch port `i`. MACs default to
//! `02:00` followed by the IPv4 address, so they are unique whenever the
//! addresses are.

use crate::topology::{HostSpec, LinkSpec, Topology};
use crate::RackError;
use remora_base::Probability;
use remora_carrier::wrappers::LinkShape;
use remora_sim::LinkFaults;
use remora_wire::{Ipv4Address, MacAddress};
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

/// The most nodes one rack holds (one switch port each).
pub const MAX_NODES: usize = 64;

pub use crate::topology::Role;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RackSection {
    pub name: String,
    /// Threads that pump the embedded rack's switch and nodes; absent is
    /// `auto` (one on a machine of two cores or fewer).
    pub fabric_threads: Option<usize>,
}

/// The most fabric threads a rack file may ask for.
pub const MAX_FABRIC_THREADS: usize = MAX_NODES + 1;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchSection {
    #[serde(default = "default_program")]
    pub program: String,
    pub mac: Option<String>,
    /// For racks across hosts: the switch's port `i` listens on
    /// `tunnel_host:(tunnel_base_port + i)`.
    pub tunnel_host: Option<std::net::IpAddr>,
    #[serde(default = "default_tunnel_base_port")]
    pub tunnel_base_port: u16,
}

fn default_tunnel_base_port() -> u16 {
    47_900
}

fn default_program() -> String {
    "l2l3".into()
}

/// A node's link to the switch (both directions): its shape (bandwidth,
/// propagation delay, queue limit; unshaped when no bandwidth is given)
/// and the faults injected on it, with the simulator's fault model.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkSection {
    #[serde(default)]
    pub loss: Probability,
    #[serde(default)]
    pub duplicate: Probability,
    #[serde(default)]
    pub reorder: Probability,
    #[serde(default)]
    pub reorder_delay_us: u64,
    #[serde(default)]
    pub corrupt: Probability,
    /// "1Gbit/s", "500Mbit/s", "10Gbit/s": the link's rate each way.
    pub bandwidth: Option<String>,
    /// Propagation delay each way, in microseconds (needs a bandwidth).
    #[serde(default)]
    pub delay_us: u64,
    /// "256KiB": frames that would wait behind more than this are dropped.
    pub queue_limit: Option<String>,
}

/// The fastest link a rack file may ask for.
pub const MAX_LINK_BITS_PER_SECOND: u64 = 400_000_000_000;
/// The longest propagation delay a rack file may ask for.
pub const MAX_LINK_DELAY: Duration = Duration::from_secs(1);
/// A shaped link's queue limit when the file gives none: what a shallow
/// top-of-rack switch port buffers.
pub const DEFAULT_QUEUE_LIMIT_BYTES: u64 = 1 << 20;

/// "1Gbit/s", "250Mbit/s", "64Kbit/s", "1000bit/s" (also without "/s").
pub fn parse_bandwidth(text: &str) -> Result<u64, String> {
    let (value, unit) = number_and_unit("bandwidth", text)?;
    let multiplier = match unit.trim_end_matches("/s") {
        "bit" => 1,
        "Kbit" => 1_000,
        "Mbit" => 1_000_000,
        "Gbit" => 1_000_000_000,
        other => {
            return Err(format!(
                "bandwidth {text:?}: unknown unit {other:?} (use bit/s, Kbit/s, Mbit/s or Gbit/s)"
            ))
        }
    };
    let bits = value
        .checked_mul(multiplier)
        .ok_or_else(|| format!("bandwidth {text:?} overflows"))?;
    if bits == 0 || bits > MAX_LINK_BITS_PER_SECOND {
        return Err(format!(
            "bandwidth {text:?} must be positive and at most 400Gbit/s"
        ));
    }
    Ok(bits)
}

/// A link's delay of `micros` microseconds (its field `name`), at most
/// [`MAX_LINK_DELAY`].
fn link_delay(name: &str, micros: u64) -> Result<Duration, String> {
    let delay = Duration::from_micros(micros);
    if delay > MAX_LINK_DELAY {
        return Err(format!("{name} {micros} is longer than {MAX_LINK_DELAY:?}"));
    }
    Ok(delay)
}

impl LinkSection {
    /// The link's shape, when it has one.
    pub fn shape(&self) -> Result<Option<LinkShape>, String> {
        let Some(bandwidth) = &self.bandwidth else {
            if self.delay_us != 0 || self.queue_limit.is_some() {
                return Err("delay_us and queue_limit need a bandwidth".into());
            }
            return Ok(None);
        };
        let bandwidth_bits_per_second = parse_bandwidth(bandwidth)?;
        let propagation_delay = link_delay("delay_us", self.delay_us)?;
        let queue_limit_bytes = match &self.queue_limit {
            Some(text) => parse_size(text)?,
            None => DEFAULT_QUEUE_LIMIT_BYTES,
        };
        Ok(Some(LinkShape {
            bandwidth_bits_per_second,
            propagation_delay,
            queue_limit_bytes,
        }))
    }

    /// Refuses faults that would do other than they say: reordering with
    /// no delay held frames for no time and reordered nothing (while the
    /// report counted them reordered), duplication with no delay landed
    /// every copy at its original's instant (a late duplicate, the case
    /// that tests a receiver, never came), and a delay without bound held
    /// frames for years, a silent loss.
    pub fn check_faults(&self) -> Result<(), String> {
        let reorder_delay = link_delay("reorder_delay_us", self.reorder_delay_us)?;
        if !self.reorder.is_zero() && reorder_delay.is_zero() {
            return Err("reorder needs a reorder_delay_us above 0: frames held for no time are not reordered".into());
        }
        if !self.duplicate.is_zero() && reorder_delay.is_zero() {
            return Err("duplicate needs a reorder_delay_us above 0: a copy lands up to that delay after its original, and with none every copy lands with it, never late".into());
        }
        Ok(())
    }

    pub fn faults(&self) -> LinkFaults {
        LinkFaults {
            loss: self.loss,
            duplicate: self.duplicate,
            reorder: self.reorder,
            reorder_delay: Duration::from_micros(self.reorder_delay_us),
            corrupt: self.corrupt,
        }
    }

    pub fn is_faulty(&self) -> bool {
        self.faults() != LinkFaults::NONE
    }
}

/// What a compute node does once connected.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSection {
    /// Operations against each memory node.
    #[serde(default = "default_operations")]
    pub operations: u32,
    /// The largest READ/WRITE, in bytes.
    #[serde(default = "default_max_bytes")]
    pub max_bytes: u32,
    #[serde(default)]
    pub seed: u64,
}

fn default_operations() -> u32 {
    200
}

fn default_max_bytes() -> u32 {
    4096
}

impl Default for WorkloadSection {
    fn default() -> Self {
        WorkloadSection {
            operations: default_operations(),
            max_bytes: default_max_bytes(),
            seed: 0,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNode {
    name: String,
    role: Role,
    address: String,
    mac: Option<String>,
    memory: String,
    /// Control-channel address for multi-host racks (`host:port`); by
    /// default a Unix socket in the run directory.
    control: Option<String>,
    /// The node's UDP tunnel address (`ip:port`) for racks across hosts:
    /// `remora node --udp` binds it, `remora rack switch` sends to it.
    tunnel: Option<std::net::SocketAddr>,
    #[serde(default)]
    link: LinkSection,
    /// For an offload host: its local link to the node it sits beside.
    local_link: Option<LinkSection>,
    workload: Option<WorkloadSection>,
    /// For an offload host (`role = "offload"`): the node it sits beside.
    attached_to: Option<String>,
}

/// Rack sections are checked field by field (`deny_unknown_fields` on
/// each); the top level is open, because systems own their tables:
/// [`RackConfig::check_systems`] refuses names no system claims.
#[derive(Debug, Clone, Deserialize)]
struct RawRack {
    rack: RackSection,
    switch: SwitchSection,
    #[serde(rename = "node")]
    nodes: Vec<RawNode>,
    /// Every other top-level table belongs to a system (`[cowbird]`, ...),
    /// which parses it itself.
    #[serde(flatten)]
    systems: BTreeMap<String, toml::Value>,
}

#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub name: String,
    pub role: Role,
    pub address: Ipv4Address,
    pub mac: MacAddress,
    pub memory_bytes: u64,
    pub control: Option<String>,
    pub tunnel: Option<std::net::SocketAddr>,
    pub link: LinkSection,
    /// For an offload host: its local link to the node it sits beside.
    pub local_link: LinkSection,
    pub workload: WorkloadSection,
    /// The switch port this node sits on.
    pub port: u16,
    /// For an offload host: the index of the node it sits beside.
    pub attached_to: Option<usize>,
}

#[derive(Debug, Clone)]
pub struct RackConfig {
    pub name: String,
    pub program: String,
    pub switch_mac: MacAddress,
    pub nodes: Vec<NodeConfig>,
    topology: Topology,
    pub tunnel_host: Option<std::net::IpAddr>,
    pub tunnel_base_port: u16,
    /// Threads pumping the embedded rack (`[rack] fabric_threads`).
    pub fabric_threads: crate::assembly::FabricThreads,
    /// Each system's own table (`[cowbird]`, ...), unparsed: the system's
    /// crate reads it, with its own typed errors.
    pub systems: BTreeMap<String, toml::Table>,
    /// The text this was parsed from: a launcher hands its node processes
    /// this, not the file, which may have changed since (each node would
    /// run the rack as the file said when it started).
    source: std::sync::Arc<str>,
}

/// The longest rack or node name: names become socket paths, which Unix
/// limits to about 100 bytes.
pub const MAX_NAME_BYTES: usize = 32;

/// Rack and node names end up in file and socket paths.
fn check_name(name: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
    if name.is_empty() || name.len() > MAX_NAME_BYTES || !name.chars().all(allowed) {
        return Err(format!(
            "1 to {MAX_NAME_BYTES} letters, digits, '-' and '_', not {name:?}"
        ));
    }
    Ok(())
}

pub fn parse_mac(text: &str) -> Result<MacAddress, String> {
    let parts: Vec<&str> = text.split(':').collect();
    if parts.len() != 6 {
        return Err(format!(
            "MAC address {text:?} needs six ':'-separated bytes"
        ));
    }
    let mut bytes = [0u8; 6];
    for (byte, part) in bytes.iter_mut().zip(parts) {
        *byte = u8::from_str_radix(part, 16)
            .map_err(|_| format!("MAC address {text:?}: {part:?} is not a hex byte"))?;
    }
    Ok(MacAddress(bytes))
}

/// A quantity with a unit, "64MiB" or "1 Gbit/s": the number and the
/// unit after it, trimmed.
fn number_and_unit<'a>(what: &str, text: &'a str) -> Result<(u64, &'a str), String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    if digits.is_empty() {
        return Err(format!("{what} {text:?} does not start with a number"));
    }
    let value = digits
        .parse()
        .map_err(|_| format!("{what} {text:?} is too large"))?;
    Ok((value, unit.trim()))
}

/// The most of its memory node's region one compute node's workload
/// spans; `max_bytes` must fit in it.
pub const MAX_WINDOW_BYTES: u64 = 1 << 20;

/// A system's table read into its own schema; the error is TOML's, with
/// the key it is about, for the system to wrap in its typed error. (Its
/// message alone named no key: "invalid value: integer `-1`, expected
/// usize", in a table re-read from a value, so with no line either.)
pub fn parse_section<T: serde::de::DeserializeOwned>(table: &toml::Table) -> Result<T, String> {
    toml::Value::Table(table.clone())
        .try_into()
        .map_err(|error: toml::de::Error| {
            let text = error.to_string();
            text.split_whitespace().collect::<Vec<_>>().join(" ")
        })
}

/// "64MiB", "4 KiB", "1GiB", "1048576".
pub fn parse_size(text: &str) -> Result<u64, String> {
    let (value, unit) = number_and_unit("size", text)?;
    let multiplier = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => {
            return Err(format!(
                "size {text:?}: unknown unit {other:?} (use B, KiB, MiB or GiB)"
            ))
        }
    };
    value
        .checked_mul(multiplier)
        .ok_or_else(|| format!("size {text:?} overflows"))
}

/// Refuses control and tunnel addresses that could only fail once the
/// rack is up: a control address that is not `host:port` or names port 0
/// (a memory node bound an ephemeral port, and compute nodes dialled `:0`
/// until their timeout), two memory nodes on one control address (the
/// second failed "address in use"), and tunnel addresses on port 0 or
/// shared by two ends (a node's own, or a switch port's).
fn check_endpoints(
    nodes: &[NodeConfig],
    tunnel_host: Option<std::net::IpAddr>,
    tunnel_base_port: u16,
) -> Result<(), String> {
    let mut controls = HashSet::new();
    for node in nodes {
        let Some(control) = &node.control else {
            continue;
        };
        let port = control
            .rsplit_once(':')
            .and_then(|(host, port)| (!host.is_empty()).then_some(port))
            .and_then(|port| port.parse::<u16>().ok());
        if !matches!(port, Some(1..)) {
            return Err(format!(
                "node {:?}: control {control:?} is not host:port with a port of 1 to 65535",
                node.name
            ));
        }
        if !controls.insert(control) {
            return Err(format!(
                "node {:?}: control {control:?} is another node's too",
                node.name
            ));
        }
    }
    let mut tunnels = HashSet::new();
    if let Some(host) = tunnel_host {
        if tunnel_base_port == 0 {
            return Err("tunnel_base_port must be 1 to 65535 (UDP cannot send to port 0)".into());
        }
        tunnels.extend(
            (0..nodes.len() as u16)
                .map(|port| std::net::SocketAddr::new(host, tunnel_base_port + port)),
        );
    }
    for node in nodes {
        let Some(tunnel) = node.tunnel else {
            continue;
        };
        if tunnel.port() == 0 || !tunnels.insert(tunnel) {
            return Err(format!(
                "node {:?}: tunnel {tunnel} is on port 0, or is another node's or a switch port's",
                node.name
            ));
        }
    }
    Ok(())
}

/// The nodes of a rack file as a topology (node `i` on switch port `i`).
fn lower(switch_mac: MacAddress, nodes: &[NodeConfig]) -> Result<Topology, String> {
    let mut topology = Topology::new(switch_mac);
    for node in nodes {
        let spec = |section: &LinkSection| -> Result<LinkSpec, String> {
            Ok(LinkSpec {
                shape: section.shape()?,
                faults: section.faults(),
            })
        };
        let host = HostSpec {
            name: node.name.clone(),
            role: node.role,
            mac: node.mac,
            address: node.address,
            memory_bytes: node.memory_bytes,
            attached_to: node.attached_to,
            link: spec(&node.link)?,
            local_link: spec(&node.local_link)?,
        };
        topology.add_host(host).map_err(|error| error.to_string())?;
    }
    Ok(topology)
}

impl RackConfig {
    pub fn load(path: &Path) -> Result<RackConfig, RackError> {
        let text = std::fs::read_to_string(path).map_err(|error| {
            RackError::Config(format!("cannot read {}: {error}", path.display()))
        })?;
        RackConfig::parse(&text).map_err(|error| match error {
            RackError::Config(message) => {
                RackError::Config(format!("{}: {message}", path.display()))
            }
            other => other,
        })
    }

    pub fn parse(text: &str) -> Result<RackConfig, RackError> {
        let raw: RawRack = toml::from_str(text).map_err(|error: toml::de::Error| {
            RackError::Config(remora_base::at_position(
                text,
                error.span(),
                error.message(),
            ))
        })?;
        let mut config = RackConfig::validate(raw).map_err(RackError::Config)?;
        config.source = text.into();
        Ok(config)
    }

    /// The text this rack was parsed from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Refuses a rack whose public fields were changed after `parse`: its
    /// topology, and the text its node processes run ([`Self::source`]),
    /// are still the parsed text's, so a launch would run another rack
    /// than the caller holds. Change the text and parse it again.
    pub fn check_unchanged(&self) -> Result<(), RackError> {
        let parsed = RackConfig::parse(&self.source)?;
        // Every field is compared, the private ones too, through Debug:
        // the fields hold no type that compares.
        if format!("{parsed:?}") != format!("{self:?}") {
            return Err(RackError::Config(format!(
                "rack {:?} was changed after it was parsed: its topology and the text its nodes run are the parsed text's; change the text and parse it again",
                self.name
            )));
        }
        Ok(())
    }

    fn validate(raw: RawRack) -> Result<RackConfig, String> {
        check_name(&raw.rack.name).map_err(|message| format!("rack names use {message}"))?;
        let fabric_threads = match raw.rack.fabric_threads {
            None => crate::assembly::FabricThreads::Auto,
            Some(count @ 1..=MAX_FABRIC_THREADS) => crate::assembly::FabricThreads::Exactly(count),
            Some(count) => {
                return Err(format!(
                    "fabric_threads is 1 to {MAX_FABRIC_THREADS}, not {count}"
                ))
            }
        };
        if raw.nodes.is_empty() || raw.nodes.len() > MAX_NODES {
            return Err(format!(
                "a rack holds 1 to {MAX_NODES} nodes, not {}",
                raw.nodes.len()
            ));
        }
        if raw.switch.program != "l2l3" {
            return Err(format!(
                "unknown switch program {:?} (available: l2l3)",
                raw.switch.program
            ));
        }
        let switch_mac = match &raw.switch.mac {
            Some(text) => parse_mac(text)?,
            None => MacAddress([0x02, 0x5e, 0, 0, 0, 0xfe]),
        };
        let mut names = HashSet::new();
        let mut addresses = HashSet::new();
        let mut macs = HashSet::from([switch_mac]);
        let mut nodes = Vec::with_capacity(raw.nodes.len());
        for (index, node) in raw.nodes.into_iter().enumerate() {
            let context = |message: String| format!("node {:?}: {message}", node.name);
            check_name(&node.name).map_err(|message| context(format!("names use {message}")))?;
            let ip: std::net::Ipv4Addr = node
                .address
                .parse()
                .map_err(|_| context(format!("{:?} is not an IPv4 address", node.address)))?;
            let address = Ipv4Address(ip.octets());
            let mac = match &node.mac {
                Some(text) => parse_mac(text).map_err(context)?,
                None => MacAddress([
                    0x02,
                    0x00,
                    ip.octets()[0],
                    ip.octets()[1],
                    ip.octets()[2],
                    ip.octets()[3],
                ]),
            };
            let memory_bytes = parse_size(&node.memory).map_err(context)?;
            if memory_bytes == 0 || memory_bytes > 1 << 30 {
                return Err(context(format!(
                    "memory must be 1 B to 1 GiB, not {memory_bytes} B"
                )));
            }
            node.link
                .shape()
                .and_then(|_| node.link.check_faults())
                .map_err(|message| context(format!("link: {message}")))?;
            if node.local_link.is_some() && node.role != Role::Offload {
                return Err(context(
                    "only an offload host has a local link (to the node it sits beside)".into(),
                ));
            }
            let local_link = node.local_link.unwrap_or_default();
            local_link
                .shape()
                .and_then(|_| local_link.check_faults())
                .map_err(|message| context(format!("local_link: {message}")))?;
            if !names.insert(node.name.clone()) || !addresses.insert(address) || !macs.insert(mac) {
                return Err(context(
                    "name, address and MAC must be unique in the rack".into(),
                ));
            }
            let attached_to = match &node.attached_to {
                None => None,
                Some(target) => Some(
                    nodes
                        .iter()
                        .position(|earlier: &NodeConfig| &earlier.name == target)
                        .ok_or_else(|| {
                            context(format!(
                                "attached_to {target:?} names no node listed before it"
                            ))
                        })?,
                ),
            };
            if node.role != Role::Compute && node.workload.is_some() {
                return Err(context("only compute nodes run a workload".into()));
            }
            let workload = node.workload.unwrap_or_default();
            // A compute node's local buffers: a WRITE source and a READ
            // target of max_bytes each, and 8 bytes for atomic results.
            let local_bytes = 2 * u64::from(workload.max_bytes) + 8;
            if node.role == Role::Compute && (workload.max_bytes == 0 || local_bytes > memory_bytes)
            {
                return Err(context(format!(
                    "workload max_bytes {} must be positive and fit twice, plus 8 bytes, in the node's memory",
                    workload.max_bytes
                )));
            }
            // The window a workload spans in its memory node is at most
            // 1 MiB: past it the file passed, and the run failed after the
            // rack was up and connected.
            if node.role == Role::Compute && u64::from(workload.max_bytes) > MAX_WINDOW_BYTES {
                return Err(context(format!(
                    "workload max_bytes {} is past the {MAX_WINDOW_BYTES} B a workload spans in its memory node",
                    workload.max_bytes
                )));
            }
            nodes.push(NodeConfig {
                name: node.name,
                role: node.role,
                address,
                mac,
                memory_bytes,
                control: node.control,
                tunnel: node.tunnel,
                link: node.link,
                local_link,
                workload,
                port: index as u16,
                attached_to,
            });
        }
        let memory_nodes: Vec<&NodeConfig> = nodes
            .iter()
            .filter(|node| node.role == Role::Memory)
            .collect();
        // Compute nodes split every memory region evenly; each share holds
        // one largest operation and an 8-byte atomics counter.
        let computes: Vec<&NodeConfig> = nodes
            .iter()
            .filter(|node| node.role == Role::Compute)
            .collect();
        let largest = computes
            .iter()
            .map(|node| u64::from(node.workload.max_bytes))
            .max()
            .unwrap_or(0);
        let needed = (largest + 16) * computes.len() as u64;
        if let Some(small) = memory_nodes
            .iter()
            .find(|memory| memory.memory_bytes < needed)
        {
            return Err(format!(
                "memory node {:?} holds {} B, less than the {needed} B its {} compute nodes' largest operations and counters need",
                small.name,
                small.memory_bytes,
                computes.len()
            ));
        }
        let mut systems = BTreeMap::new();
        for (name, value) in raw.systems {
            let toml::Value::Table(table) = value else {
                return Err(format!(
                    "top-level key {name:?} is neither a rack section nor a system's [{name}] table"
                ));
            };
            systems.insert(name, table);
        }
        // Node ports count from 0: base + n - 1 must be a port.
        let spare_ports = usize::from(u16::MAX - raw.switch.tunnel_base_port) + 1;
        if raw.switch.tunnel_host.is_some() && nodes.len() > spare_ports {
            return Err("tunnel_base_port leaves no room for every node's port".into());
        }
        check_endpoints(&nodes, raw.switch.tunnel_host, raw.switch.tunnel_base_port)?;
        let topology = lower(switch_mac, &nodes)?;
        Ok(RackConfig {
            name: raw.rack.name,
            program: raw.switch.program,
            switch_mac,
            nodes,
            topology,
            tunnel_host: raw.switch.tunnel_host,
            tunnel_base_port: raw.switch.tunnel_base_port,
            fabric_threads,
            systems,
            source: "".into(),
        })
    }

    /// Refuses a system table no system in `known` claims (a typo, or a
    /// system this build lacks), naming the systems there are.
    pub fn check_systems(&self, known: &[&str]) -> Result<(), RackError> {
        match self
            .systems
            .keys()
            .find(|name| !known.contains(&name.as_str()))
        {
            None => Ok(()),
            Some(name) => Err(RackError::Config(format!(
                "[{name}] names no system (systems: {})",
                known.join(", ")
            ))),
        }
    }

    /// The first node of `role`, which single-pair systems run on.
    pub fn first_node(&self, role: Role) -> Option<&NodeConfig> {
        self.nodes.iter().find(|node| node.role == role)
    }

    /// Whether the rack has a compute node and a memory node: what a
    /// system running on the first of each needs.
    pub fn has_compute_and_memory(&self) -> bool {
        self.first_node(Role::Compute).is_some() && self.first_node(Role::Memory).is_some()
    }

    /// The rack as hosts and links, which every execution mode builds.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    pub fn node(&self, name: &str) -> Result<&NodeConfig, RackError> {
        self.nodes
            .iter()
            .find(|node| node.name == name)
            .ok_or_else(|| {
                RackError::Config(format!("no node named {name:?} in rack {:?}", self.name))
            })
    }

    /// The switch port's tunnel address for `node`, in racks across hosts.
    pub fn switch_tunnel(&self, node: &NodeConfig) -> Result<std::net::SocketAddr, RackError> {
        let host = self.tunnel_host.ok_or_else(|| {
            RackError::Config("[switch] tunnel_host is needed for a rack across hosts".into())
        })?;
        Ok(std::net::SocketAddr::new(
            host,
            self.tunnel_base_port + node.port,
        ))
    }

    /// A node's own tunnel address, in racks across hosts.
    pub fn node_tunnel(&self, node: &NodeConfig) -> Result<std::net::SocketAddr, RackError> {
        node.tunnel.ok_or_else(|| {
            RackError::Config(format!(
                "node {:?} needs a tunnel address for a rack across hosts",
                node.name
            ))
        })
    }

    pub fn memory_nodes(&self) -> impl Iterator<Item = &NodeConfig> {
        self.nodes.iter().filter(|node| node.role == Role::Memory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A section's bad value said what was wrong but not where: TOML's
    /// message names no key, and a table re-read from a value has no line.
    #[test]
    fn a_bad_value_in_a_section_names_its_key() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Section {
            threads: usize,
        }
        let table: toml::Table = "threads = -1".parse().unwrap();
        let error = parse_section::<Section>(&table).unwrap_err();
        assert!(error.contains("threads"), "{error}");
    }

    const GOOD: &str = r#"
        [rack]
        name = "t"
        [switch]
        program = "l2l3"
        [[node]]
        name = "c"
        role = "compute"
        address = "10.0.0.1"
        memory = "1MiB"
        [[node]]
        name = "m"
        role = "memory"
        address = "10.0.0.2"
        memory = "4MiB"
        [node.link]
        loss = 0.01
    "#;

    /// `reorder` with the default delay of 0 held frames for no time and
    /// reordered nothing, though the report counted frames reordered; a
    /// reorder delay had no bound, and a large one lost frames silently.
    #[test]
    fn reordering_needs_a_bounded_positive_delay() {
        let error = RackConfig::parse(&format!("{GOOD}reorder = 0.5\n"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("reorder_delay_us above 0"), "{error}");
        let error = RackConfig::parse(&format!(
            "{GOOD}reorder = 0.5\nreorder_delay_us = 9999999999\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(error.contains("longer than"), "{error}");
        RackConfig::parse(&format!("{GOOD}reorder = 0.5\nreorder_delay_us = 50\n"))
            .expect("a bounded positive delay");
    }

    /// A duplicate lands up to the reorder delay after its original: with
    /// none, every copy landed at the original's instant and no late
    /// duplicate was ever sent.
    #[test]
    fn duplication_needs_a_positive_delay() {
        let error = RackConfig::parse(&format!("{GOOD}duplicate = 0.5\n"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("duplicate needs a reorder_delay_us"),
            "{error}"
        );
        RackConfig::parse(&format!("{GOOD}duplicate = 0.5\nreorder_delay_us = 20\n"))
            .expect("copies may land late");
    }

    /// Control and tunnel addresses that could only fail once the rack
    /// was up were taken: port 0, a control address that is not
    /// host:port, one shared by two nodes, a node's tunnel on a switch
    /// port's address.
    #[test]
    fn control_and_tunnel_addresses_are_checked_when_the_file_is_read() {
        let with_memory_key =
            |line: &str| GOOD.replace("memory = \"4MiB\"", &format!("memory = \"4MiB\"\n{line}"));
        let both = |line: &str| {
            with_memory_key(line)
                .replace("memory = \"1MiB\"", &format!("memory = \"1MiB\"\n{line}"))
        };
        let refused = |text: String, expected: &str| {
            let error = RackConfig::parse(&text).unwrap_err().to_string();
            assert!(error.contains(expected), "{expected}: {error}");
        };
        refused(
            with_memory_key("control = \"127.0.0.1:0\""),
            "is not host:port",
        );
        refused(with_memory_key("control = \"nowhere\""), "is not host:port");
        refused(
            both("control = \"127.0.0.1:7000\""),
            "is another node's too",
        );
        refused(with_memory_key("tunnel = \"127.0.0.1:0\""), "tunnel");
        refused(both("tunnel = \"127.0.0.1:7100\""), "tunnel");
        let on_a_switch_port = with_memory_key("tunnel = \"127.0.0.1:7201\"").replace(
            "program = \"l2l3\"",
            "program = \"l2l3\"\ntunnel_host = \"127.0.0.1\"\ntunnel_base_port = 7200",
        );
        refused(on_a_switch_port, "tunnel");
        let zero_base = GOOD.replace(
            "program = \"l2l3\"",
            "program = \"l2l3\"\ntunnel_host = \"127.0.0.1\"\ntunnel_base_port = 0",
        );
        refused(zero_base, "tunnel_base_port");
        RackConfig::parse(&with_memory_key(
            "control = \"127.0.0.1:7000\"\ntunnel = \"127.0.0.1:7100\"",
        ))
        .expect("a control and a tunnel address of one node");
    }

    #[test]
    fn system_tables_are_kept_for_their_systems_and_unknown_ones_refused() {
        let text = format!("{GOOD}\n[cowbird]\nengine = \"p4\"\n");
        let rack = RackConfig::parse(&text).unwrap();
        assert_eq!(rack.systems["cowbird"]["engine"].as_str(), Some("p4"));
        assert!(rack.check_systems(&["cowbird", "clover"]).is_ok());
        let error = rack.check_systems(&["clover"]).unwrap_err().to_string();
        assert!(error.contains("[cowbird] names no system"), "{error}");
        let error = RackConfig::parse(&format!("speed = 3\n{GOOD}"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("neither a rack section"), "{error}");
    }

    #[test]
    fn fabric_threads_are_auto_by_default_and_refused_out_of_range() {
        use crate::assembly::FabricThreads;
        assert_eq!(
            RackConfig::parse(GOOD).unwrap().fabric_threads,
            FabricThreads::Auto
        );
        let two = GOOD.replace("name = \"t\"", "name = \"t\"\nfabric_threads = 2");
        assert_eq!(
            RackConfig::parse(&two).unwrap().fabric_threads,
            FabricThreads::Exactly(2)
        );
        for bad in [0, MAX_FABRIC_THREADS + 1] {
            let text = GOOD.replace(
                "name = \"t\"",
                &format!("name = \"t\"\nfabric_threads = {bad}"),
            );
            let error = RackConfig::parse(&text).unwrap_err().to_string();
            assert!(error.contains("fabric_threads is 1 to"), "{error}");
        }
    }

    #[test]
    fn a_link_takes_a_bandwidth_a_delay_and_a_queue_limit() {
        let text = GOOD.replace(
            "loss = 0.01",
            "loss = 0.01\nbandwidth = \"1Gbit/s\"\ndelay_us = 50\nqueue_limit = \"256KiB\"",
        );
        let rack = RackConfig::parse(&text).unwrap();
        let shape = rack.topology().host(1).link.shape.unwrap();
        assert_eq!(shape.bandwidth_bits_per_second, 1_000_000_000);
        assert_eq!(shape.propagation_delay, Duration::from_micros(50));
        assert_eq!(shape.queue_limit_bytes, 256 << 10);
        assert_eq!(rack.topology().host(1).link.faults.loss.get(), 0.01);
        assert!(rack.topology().host(0).link.shape.is_none());
        // 50 µs is finer than a real-time rack wakes: flagged, not hidden.
        let notes = rack.topology().shaping_notes();
        assert!(notes.iter().any(|note| note.contains("\"m\"")), "{notes:?}");
        let simulated = rack.topology().simulator_link(1);
        assert_eq!(simulated.bandwidth_bits_per_second, 1_000_000_000);
    }

    #[test]
    fn bad_links_are_refused_with_the_node_named() {
        for (link, expected) in [
            ("bandwidth = \"1Gbps\"", "unknown unit"),
            ("bandwidth = \"0Gbit/s\"", "must be positive"),
            ("bandwidth = \"1000Gbit/s\"", "at most 400Gbit/s"),
            ("delay_us = 5", "need a bandwidth"),
            ("bandwidth = \"1Gbit/s\"\ndelay_us = 5000000", "longer than"),
            ("loss = 1.5", "outside [0, 1]"),
        ] {
            let text = GOOD.replace("loss = 0.01", link);
            let error = RackConfig::parse(&text).unwrap_err().to_string();
            assert!(error.contains(expected), "{link}: {error}");
        }
    }

    #[test]
    fn an_offload_host_is_attached_to_a_node_listed_before_it() {
        let dpu = "\n[[node]]\nname = \"dpu\"\nrole = \"offload\"\naddress = \"10.0.0.3\"\nmemory = \"1MiB\"\nattached_to = \"c\"\n";
        let rack = RackConfig::parse(&format!("{GOOD}{dpu}")).unwrap();
        assert_eq!(rack.nodes[2].attached_to, Some(0));
        assert_eq!(rack.topology().attached(0).collect::<Vec<_>>(), vec![2]);
        let unattached = dpu.replace("attached_to = \"c\"\n", "");
        let error = RackConfig::parse(&format!("{GOOD}{unattached}"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("needs attached_to"), "{error}");
        let unknown = dpu.replace("\"c\"", "\"nobody\"");
        let error = RackConfig::parse(&format!("{GOOD}{unknown}"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("names no node"), "{error}");
    }

    #[test]
    fn an_offload_hosts_local_link_is_shaped_apart_and_only_an_offload_host_has_one() {
        let dpu = "\n[[node]]\nname = \"dpu\"\nrole = \"offload\"\naddress = \"10.0.0.3\"\nmemory = \"1MiB\"\nattached_to = \"c\"\n[node.local_link]\nbandwidth = \"2Gbit/s\"\ndelay_us = 10\n";
        let rack = RackConfig::parse(&format!("{GOOD}{dpu}")).unwrap();
        let topology = rack.topology();
        assert_eq!(topology.local_links().collect::<Vec<_>>(), vec![(0, 2)]);
        let local = topology.simulator_local_link(2);
        assert_eq!(local.bandwidth_bits_per_second, 2_000_000_000);
        assert_eq!(local.propagation_delay, Duration::from_micros(10));
        assert_eq!(topology.simulator_link(2), remora_sim::LinkConfig::rack());
        let notes = topology.shaping_notes();
        assert!(
            notes.iter().any(|note| note.contains("local link")),
            "{notes:?}"
        );
        let on_compute = GOOD.replace(
            "memory = \"1MiB\"\n",
            "memory = \"1MiB\"\n[node.local_link]\nbandwidth = \"2Gbit/s\"\n",
        );
        let error = RackConfig::parse(&on_compute).unwrap_err().to_string();
        assert!(error.contains("only an offload host"), "{error}");
        let second = dpu
            .replace("\"dpu\"", "\"dpu2\"")
            .replace("10.0.0.3", "10.0.0.4");
        let error = RackConfig::parse(&format!("{GOOD}{dpu}{second}"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("already has an offload host"), "{error}");
    }

    #[test]
    fn a_good_rack_parses_with_derived_macs_and_ports() {
        let rack = RackConfig::parse(GOOD).unwrap();
        assert_eq!(rack.nodes.len(), 2);
        assert_eq!(rack.nodes[1].mac, MacAddress([2, 0, 10, 0, 0, 2]));
        assert_eq!(rack.nodes[1].port, 1);
        assert_eq!(rack.nodes[1].memory_bytes, 4 << 20);
        assert!(rack.nodes[1].link.is_faulty());
    }

    #[test]
    fn bad_racks_get_clear_errors() {
        let cases = [
            (GOOD.replace("10.0.0.2", "10.0.0.1"), "unique"),
            (GOOD.replace("4MiB", "4 parsecs"), "unknown unit"),
            (
                GOOD.replace("\"l2l3\"", "\"magic\""),
                "unknown switch program",
            ),
            (GOOD.replace("loss = 0.01", "loss = 2.0"), "outside [0, 1]"),
            (
                GOOD.replace("role = \"memory\"", "role = \"toaster\""),
                "unknown variant",
            ),
            (
                GOOD.replace("10.0.0.2", "10.0.0.999"),
                "not an IPv4 address",
            ),
            (
                GOOD.replace("memory = \"1MiB\"", "memory = \"1MiB\"\nflavour = 1"),
                "unknown field",
            ),
            // Past the 1 MiB a workload spans: the file passed, and the run
            // failed once the rack was up.
            (
                GOOD.replace(
                    "memory = \"1MiB\"",
                    "memory = \"8MiB\"\n[node.workload]\nmax_bytes = 2097152",
                )
                .replace("memory = \"4MiB\"", "memory = \"64MiB\""),
                "past the 1048576 B a workload spans",
            ),
        ];
        for (text, expected) in cases {
            let error = RackConfig::parse(&text).unwrap_err().to_string();
            assert!(error.contains(expected), "{error:?} lacks {expected:?}");
        }
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("4 KiB"), Ok(4096));
        assert_eq!(parse_size("12"), Ok(12));
        assert!(parse_size("MiB").is_err());
        let too_large = parse_size("99999999999999999999999").unwrap_err();
        assert!(too_large.contains("too large"), "{too_large}");
    }

    /// Node ports count from 0, so two nodes fit from port 65534; the
    /// check counted one port too few.
    #[test]
    fn the_last_tunnel_ports_are_usable() {
        let rack = |base: u16| {
            let text = std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../examples/rack-across-hosts.toml"
            ))
            .unwrap()
            .replace(
                "tunnel_base_port = 47900",
                &format!("tunnel_base_port = {base}"),
            );
            RackConfig::parse(&text)
        };
        let fitting = rack(65534).unwrap();
        let last = fitting.nodes.last().unwrap();
        assert_eq!(fitting.switch_tunnel(last).unwrap().port(), 65535);
        assert!(rack(65535).is_err());
    }
}
