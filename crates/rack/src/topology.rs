//! One description of a rack, which every execution mode builds from:
//! hosts (role, MAC, IPv4 address, memory), offload hosts attached beside
//! a host, and each host's link to the switch (shape and faults).
//!
//! A rack file lowers to a [`Topology`] ([`crate::RackConfig::topology`]);
//! systems make one in code ([`Topology::pair`]). The simulator takes its
//! links from [`Topology::simulator_link`]; the embedded rack wraps its
//! carriers in the shaper and the fault injector from the same numbers.
//!
//! Host `i` sits on switch port `i`. An offload host (a DPU beside a
//! compute node, SmartNIC cores beside a memory node) has its own soft
//! RNIC and two links: its uplink to the switch port, like any host, and
//! a local link straight to the host it sits beside (PCIe on a real DPU),
//! which frames between the two take without crossing the switch. Each
//! link has its own shape, so a rack can make the local link faster and
//! nearer than the uplinks. A host has at most one offload host beside it.

use remora_base::PortId;
use remora_carrier::wrappers::LinkShape;
use remora_sim::{LinkConfig, LinkFaults};
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_wire::{Ipv4Address, MacAddress};
use serde::Deserialize;
use std::time::Duration;

/// The most hosts one rack holds (one switch port each).
pub const MAX_HOSTS: usize = 64;

/// Rates above this are past what one soft RNIC thread moves on the
/// machines Remora runs on (`bench fabric` measures 2–20 Gb/s), so the
/// shaper would not be what limits the link: such a rate is flagged.
pub const SOFT_RNIC_BITS_PER_SECOND: u64 = 25_000_000_000;

/// How late a rack's fabric thread may wake for a timer when idle: a
/// futex timeout plus the kernel's 50 µs timer slack, on a shared host.
/// Delays finer than this are flagged: frames arrive up to this late.
pub const WAKE_GRANULARITY: Duration = Duration::from_micros(100);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Runs an application against memory nodes.
    Compute,
    /// Offers registered memory; its CPU stays off the data path.
    Memory,
    /// A DPU or SmartNIC beside a host (`attached_to`), with its own soft
    /// RNIC and memory budget.
    Offload,
}

impl Role {
    pub fn name(self) -> &'static str {
        match self {
            Role::Compute => "compute",
            Role::Memory => "memory",
            Role::Offload => "offload",
        }
    }
}

/// A host's link to the switch, both directions alike.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkSpec {
    /// Bandwidth, delay and queue limit; `None` is an unshaped carrier
    /// (as fast as the soft RNIC goes) and the simulator's rack link.
    pub shape: Option<LinkShape>,
    pub faults: LinkFaults,
}

impl LinkSpec {
    pub const CLEAN: LinkSpec = LinkSpec {
        shape: None,
        faults: LinkFaults::NONE,
    };
}

#[derive(Debug, Clone, PartialEq)]
pub struct HostSpec {
    pub name: String,
    pub role: Role,
    pub mac: MacAddress,
    pub address: Ipv4Address,
    pub memory_bytes: u64,
    /// For an offload host: the index of the host it sits beside.
    pub attached_to: Option<usize>,
    /// The link to the switch.
    pub link: LinkSpec,
    /// For an offload host: its local link to the host it sits beside.
    pub local_link: LinkSpec,
}

impl HostSpec {
    pub fn new(name: &str, role: Role, mac: MacAddress, address: Ipv4Address) -> HostSpec {
        HostSpec {
            name: name.into(),
            role,
            mac,
            address,
            memory_bytes: 64 << 20,
            attached_to: None,
            link: LinkSpec::CLEAN,
            local_link: LinkSpec::CLEAN,
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TopologyError {
    #[error("a rack holds at most {MAX_HOSTS} hosts")]
    TooManyHosts,
    #[error("host {name:?}: name, address and MAC must be unique in the rack")]
    Duplicate { name: String },
    #[error("host {name:?}: an offload host needs attached_to, naming another host")]
    OffloadUnattached { name: String },
    #[error("host {name:?}: only an offload host is attached to another host")]
    AttachedNotOffload { name: String },
    #[error("host {name:?}: attached to host {index}, which is not an earlier non-offload host")]
    BadAttachment { name: String, index: usize },
    #[error("host {name:?}: host {index} already has an offload host beside it")]
    SecondOffload { name: String, index: usize },
}

/// Hosts behind one switch.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    pub switch_mac: MacAddress,
    hosts: Vec<HostSpec>,
}

/// The switch's router MAC when nobody names one.
pub const DEFAULT_SWITCH_MAC: MacAddress = MacAddress([0x02, 0x5e, 0, 0, 0, 0xfe]);

/// The addressing of racks built in code, one rule for every system:
/// host `index` is 10.0.0.(index + 1), and its MAC is `02:00` followed by
/// the address, as a rack file derives MACs.
pub fn standard_host(index: usize) -> (MacAddress, Ipv4Address) {
    let last = u8::try_from(index + 1).expect("a rack holds at most 64 hosts");
    (
        MacAddress([0x02, 0x00, 10, 0, 0, last]),
        Ipv4Address::new(10, 0, 0, last),
    )
}

/// Index of the compute host in [`Topology::compute_and_memory`].
pub const COMPUTE_HOST: usize = 0;
/// Index of the memory host in [`Topology::compute_and_memory`].
pub const MEMORY_HOST: usize = 1;

impl Topology {
    pub fn new(switch_mac: MacAddress) -> Topology {
        Topology {
            switch_mac,
            hosts: Vec::new(),
        }
    }

    /// A compute host and a memory host, each given as (MAC, address),
    /// on clean links: what most system scenarios start from.
    pub fn pair(compute: (MacAddress, Ipv4Address), memory: (MacAddress, Ipv4Address)) -> Topology {
        let mut topology = Topology::new(DEFAULT_SWITCH_MAC);
        topology
            .add_host(HostSpec::new(
                "compute",
                Role::Compute,
                compute.0,
                compute.1,
            ))
            .expect("a fresh topology takes two distinct hosts");
        topology
            .add_host(HostSpec::new("memory", Role::Memory, memory.0, memory.1))
            .expect("a fresh topology takes two distinct hosts");
        topology
    }

    /// A compute host (index [`COMPUTE_HOST`]) and a memory host
    /// ([`MEMORY_HOST`]) with the standard addressing, on clean links.
    pub fn compute_and_memory() -> Topology {
        Topology::pair(standard_host(COMPUTE_HOST), standard_host(MEMORY_HOST))
    }

    /// Adds a host on the next switch port; returns its index.
    pub fn add_host(&mut self, host: HostSpec) -> Result<usize, TopologyError> {
        if self.hosts.len() >= MAX_HOSTS {
            return Err(TopologyError::TooManyHosts);
        }
        let clash = host.mac == self.switch_mac
            || self.hosts.iter().any(|other| {
                other.name == host.name || other.address == host.address || other.mac == host.mac
            });
        if clash {
            return Err(TopologyError::Duplicate { name: host.name });
        }
        self.check_attachment(&host)?;
        self.hosts.push(host);
        Ok(self.hosts.len() - 1)
    }

    fn check_attachment(&self, host: &HostSpec) -> Result<(), TopologyError> {
        let name = host.name.clone();
        match (host.role, host.attached_to) {
            (Role::Offload, None) => Err(TopologyError::OffloadUnattached { name }),
            (Role::Offload, Some(index)) => {
                let valid = self
                    .hosts
                    .get(index)
                    .is_some_and(|target| target.role != Role::Offload);
                if !valid {
                    return Err(TopologyError::BadAttachment { name, index });
                }
                if self.attached(index).next().is_some() {
                    return Err(TopologyError::SecondOffload { name, index });
                }
                Ok(())
            }
            (_, Some(_)) => Err(TopologyError::AttachedNotOffload { name }),
            (_, None) => Ok(()),
        }
    }

    pub fn hosts(&self) -> &[HostSpec] {
        &self.hosts
    }

    pub fn host(&self, index: usize) -> &HostSpec {
        &self.hosts[index]
    }

    /// Sets host `index`'s link.
    pub fn set_link(&mut self, index: usize, link: LinkSpec) {
        self.hosts[index].link = link;
    }

    /// The switch port host `index` sits on.
    pub fn port(&self, index: usize) -> PortId {
        PortId(index as u16)
    }

    /// The first host of `role`, if the rack has one.
    pub fn first(&self, role: Role) -> Option<usize> {
        self.hosts.iter().position(|host| host.role == role)
    }

    /// The hosts at `indices`, in that order, as a rack of their own
    /// (host `indices[i]` becomes host `i`) with their links: the hosts a
    /// system runs on. An offload host comes with the host it sits
    /// beside, listed before it.
    pub fn subset(&self, indices: &[usize]) -> Result<Topology, TopologyError> {
        let mut subset = Topology::new(self.switch_mac);
        for &index in indices {
            let mut host = self.hosts[index].clone();
            host.attached_to = host
                .attached_to
                .and_then(|beside| indices.iter().position(|&kept| kept == beside));
            subset.add_host(host)?;
        }
        Ok(subset)
    }

    /// Sets offload host `index`'s local link to the host beside it.
    pub fn set_local_link(&mut self, index: usize, link: LinkSpec) {
        self.hosts[index].local_link = link;
    }

    /// Every local link, as (host, the offload host beside it).
    pub fn local_links(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.hosts
            .iter()
            .enumerate()
            .filter_map(|(offload, host)| host.attached_to.map(|host| (host, offload)))
    }

    /// The offload hosts attached to host `index`.
    pub fn attached(&self, index: usize) -> impl Iterator<Item = usize> + '_ {
        self.hosts
            .iter()
            .enumerate()
            .filter(move |(_, host)| host.attached_to == Some(index))
            .map(|(attached, _)| attached)
    }

    /// L2/L3 forwarding between every host, host `i` on port `i`.
    pub fn forwarding(&self) -> L2L3Forwarding {
        let hosts: Vec<(MacAddress, Ipv4Address)> = self
            .hosts
            .iter()
            .map(|host| (host.mac, host.address))
            .collect();
        L2L3Forwarding::with_attached_hosts(self.switch_mac, &hosts)
            .expect("MAX_HOSTS hosts fit the forwarding tables")
    }

    /// Host `index`'s link as the simulator models it: the rack link
    /// (100 Gb/s, 1 µs) unless the topology shapes it.
    pub fn simulator_link(&self, index: usize) -> LinkConfig {
        lower(&self.hosts[index].link)
    }

    /// Offload host `index`'s local link as the simulator models it.
    pub fn simulator_local_link(&self, index: usize) -> LinkConfig {
        lower(&self.hosts[index].local_link)
    }

    /// What a real-time rack cannot honour exactly in this topology, for
    /// the report: rates past the soft RNIC, delays finer than a wake-up.
    pub fn shaping_notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        for host in &self.hosts {
            note_shape(&mut notes, &host.name, "link", &host.link);
            if host.attached_to.is_some() {
                note_shape(&mut notes, &host.name, "local link", &host.local_link);
            }
        }
        notes
    }
}

/// A link as the simulator models it: the rack link (100 Gb/s, 1 µs)
/// unless shaped.
fn lower(link: &LinkSpec) -> LinkConfig {
    let mut config = LinkConfig::rack();
    if let Some(shape) = link.shape {
        config.bandwidth_bits_per_second = shape.bandwidth_bits_per_second;
        config.propagation_delay = shape.propagation_delay;
        config.queue_limit_bytes = shape.queue_limit_bytes as usize;
    }
    config.faults = link.faults;
    config
}

/// Notes what a real-time rack cannot honour of `link`'s shape.
fn note_shape(notes: &mut Vec<String>, host: &str, which: &str, link: &LinkSpec) {
    let Some(shape) = link.shape else {
        return;
    };
    if shape.bandwidth_bits_per_second > SOFT_RNIC_BITS_PER_SECOND {
        notes.push(format!(
            "host {host:?}: its {which}'s {} bit/s is above what a soft RNIC moves (about {SOFT_RNIC_BITS_PER_SECOND} bit/s at most): the NIC, not the shaper, sets the rate",
            shape.bandwidth_bits_per_second
        ));
    }
    let delay = shape.propagation_delay;
    if !delay.is_zero() && delay < WAKE_GRANULARITY {
        notes.push(format!(
            "host {host:?}: its {which}'s delay of {delay:?} is finer than the rack's wake-up granularity ({WAKE_GRANULARITY:?}): frames may arrive up to that much later than set"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(index: u8) -> MacAddress {
        MacAddress([2, 0, 0, 0, 0, index])
    }

    fn ip(index: u8) -> Ipv4Address {
        Ipv4Address::new(10, 0, 0, index)
    }

    #[test]
    fn an_offload_host_sits_beside_an_existing_host() {
        let mut topology = Topology::pair((mac(1), ip(1)), (mac(2), ip(2)));
        let mut dpu = HostSpec::new("dpu", Role::Offload, mac(3), ip(3));
        assert_eq!(
            topology.add_host(dpu.clone()),
            Err(TopologyError::OffloadUnattached { name: "dpu".into() })
        );
        dpu.attached_to = Some(7);
        assert!(matches!(
            topology.add_host(dpu.clone()),
            Err(TopologyError::BadAttachment { index: 7, .. })
        ));
        dpu.attached_to = Some(0);
        assert_eq!(topology.add_host(dpu), Ok(2));
        assert_eq!(topology.attached(0).collect::<Vec<_>>(), vec![2]);
        assert_eq!(topology.port(2), PortId(2));
    }

    #[test]
    fn a_subset_keeps_its_hosts_links_and_attachments_renumbered() {
        let mut topology = Topology::pair((mac(1), ip(1)), (mac(2), ip(2)));
        let mut dpu = HostSpec::new("dpu", Role::Offload, mac(3), ip(3));
        dpu.attached_to = Some(0);
        topology.add_host(dpu).unwrap();
        topology.set_local_link(
            2,
            LinkSpec {
                shape: None,
                faults: LinkFaults::NONE,
            },
        );
        assert_eq!(topology.first(Role::Memory), Some(1));
        assert_eq!(topology.first(Role::Offload), Some(2));
        let subset = topology.subset(&[1, 0, 2]).unwrap();
        let names: Vec<&str> = subset
            .hosts()
            .iter()
            .map(|host| host.name.as_str())
            .collect();
        assert_eq!(names, ["memory", "compute", "dpu"]);
        assert_eq!(subset.local_links().collect::<Vec<_>>(), vec![(1, 2)]);
        assert!(matches!(
            topology.subset(&[2]),
            Err(TopologyError::OffloadUnattached { .. })
        ));
    }

    #[test]
    fn duplicates_are_refused() {
        let mut topology = Topology::pair((mac(1), ip(1)), (mac(2), ip(2)));
        let twin = HostSpec::new("other", Role::Memory, mac(9), ip(2));
        assert!(matches!(
            topology.add_host(twin),
            Err(TopologyError::Duplicate { .. })
        ));
    }

    #[test]
    fn shaped_links_lower_to_the_simulator_and_fine_delays_are_flagged() {
        let mut topology = Topology::pair((mac(1), ip(1)), (mac(2), ip(2)));
        let shape = LinkShape {
            bandwidth_bits_per_second: 1_000_000_000,
            propagation_delay: Duration::from_micros(50),
            queue_limit_bytes: 65_536,
        };
        topology.set_link(
            0,
            LinkSpec {
                shape: Some(shape),
                faults: LinkFaults::NONE,
            },
        );
        let link = topology.simulator_link(0);
        assert_eq!(link.bandwidth_bits_per_second, 1_000_000_000);
        assert_eq!(link.propagation_delay, Duration::from_micros(50));
        assert_eq!(topology.simulator_link(1), LinkConfig::rack());
        let notes = topology.shaping_notes();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("wake-up granularity"));
    }
}
