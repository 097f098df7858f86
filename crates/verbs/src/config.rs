//! Where a process's Remora device finds its peer: read once, from the
//! environment or a small TOML file.
//!
//! - `REMORA_VERBS_CONFIG=FILE`: a TOML file (see [`VerbsConfig`]).
//! - `REMORA_VERBS=SPEC`: the same in one line, either
//!   `udp LOCAL_IP:PORT PEER_IP:PORT [ADDRESS]` (a UDP tunnel to a peer
//!   or to a port of `remora rack switch`; the device's address, and so
//!   its GID, is ADDRESS, or LOCAL_IP without it) or
//!   `shm RENDEZVOUS_SOCKET` (a shared-memory ring pair with the one
//!   other process that names the same socket path).

use remora_wire::Ipv4Address;
use serde::Deserialize;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

pub const CONFIG_FILE_VARIABLE: &str = "REMORA_VERBS_CONFIG";
pub const SPEC_VARIABLE: &str = "REMORA_VERBS";
/// Where to write a pcap of every frame the node sends and receives.
pub const CAPTURE_VARIABLE: &str = "REMORA_VERBS_PCAP";

/// A node's configuration file.
///
/// ```toml
/// address = "10.0.0.1"     # optional: the node's IPv4 address (its GID)
///
/// [carrier]
/// udp = { local = "127.0.0.1:7471", peer = "127.0.0.2:7471" }
/// # or: shared_memory = { rendezvous = "/tmp/remora-verbs.sock" }
///
/// [progress]
/// spin_microseconds = 5    # how long the progress thread polls before it sleeps
///
/// capture = "run.pcap"     # optional: every frame sent and received
/// ```
///
/// `REMORA_VERBS_PCAP=FILE` sets `capture` in either form.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerbsConfig {
    /// The node's own address when it is not the UDP tunnel's (a rack
    /// switch routes by the rack file's node addresses).
    #[serde(default)]
    pub address: Option<std::net::Ipv4Addr>,
    pub carrier: CarrierConfig,
    #[serde(default)]
    pub progress: ProgressConfig,
    #[serde(default)]
    pub capture: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum CarrierConfig {
    Udp { local: SocketAddr, peer: SocketAddr },
    SharedMemory { rendezvous: PathBuf },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProgressConfig {
    pub spin_microseconds: u64,
}

/// The longest spin a configuration may ask for: beyond it two processes
/// on a small machine starve each other's progress threads.
pub const MAX_SPIN_MICROSECONDS: u64 = 10_000;

impl Default for ProgressConfig {
    fn default() -> ProgressConfig {
        ProgressConfig {
            spin_microseconds: 5,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("neither {CONFIG_FILE_VARIABLE} nor {SPEC_VARIABLE} is set; set {SPEC_VARIABLE}=\"udp LOCAL_IP:PORT PEER_IP:PORT\" or \"shm SOCKET_PATH\"")]
    Missing,
    #[error("{CONFIG_FILE_VARIABLE}={path}: {source}")]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{CONFIG_FILE_VARIABLE}={path}: {source}")]
    Invalid {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{SPEC_VARIABLE}={spec:?}: {reason}; expected \"udp LOCAL_IP:PORT PEER_IP:PORT\" or \"shm SOCKET_PATH\"")]
    BadSpec { spec: String, reason: String },
    #[error("a shared-memory node takes its address from the rendezvous; drop `address`")]
    AddressWithSharedMemory,
    #[error("the UDP carrier needs IPv4 addresses (the GID is IPv4-mapped), not {0}")]
    NotIpv4(SocketAddr),
    #[error("progress.spin_microseconds {0} is past the limit of {MAX_SPIN_MICROSECONDS}")]
    SpinTooLong(u64),
}

impl VerbsConfig {
    /// The node's address as the configuration gives it, before the node
    /// starts: its own `address`, or the UDP tunnel's local one. `None`
    /// for a shared-memory node, whose rendezvous hands it out.
    pub fn address_before_start(&self) -> Option<Ipv4Address> {
        match (self.address, &self.carrier) {
            (Some(own), _) => Some(Ipv4Address(own.octets())),
            (None, CarrierConfig::Udp { local, .. }) => Some(ipv4_of(*local)),
            (None, CarrierConfig::SharedMemory { .. }) => None,
        }
    }

    /// Reads the configuration the environment names.
    pub fn from_environment() -> Result<VerbsConfig, ConfigError> {
        let mut config = VerbsConfig::from_environment_variables()?;
        if let Some(capture) = std::env::var_os(CAPTURE_VARIABLE) {
            config.capture = Some(PathBuf::from(capture));
        }
        Ok(config)
    }

    fn from_environment_variables() -> Result<VerbsConfig, ConfigError> {
        if let Some(path) = std::env::var_os(CONFIG_FILE_VARIABLE) {
            let path = PathBuf::from(path);
            let text =
                std::fs::read_to_string(&path).map_err(|source| ConfigError::Unreadable {
                    path: path.clone(),
                    source,
                })?;
            return VerbsConfig::from_toml(&text)
                .map_err(|source| ConfigError::Invalid { path, source })?
                .validated();
        }
        match std::env::var(SPEC_VARIABLE) {
            Ok(spec) => VerbsConfig::from_spec(&spec)?.validated(),
            Err(_) => Err(ConfigError::Missing),
        }
    }

    pub fn from_toml(text: &str) -> Result<VerbsConfig, toml::de::Error> {
        toml::from_str(text)
    }

    /// Parses the one-line form of `REMORA_VERBS`.
    pub fn from_spec(spec: &str) -> Result<VerbsConfig, ConfigError> {
        let bad = |reason: &str| ConfigError::BadSpec {
            spec: spec.to_string(),
            reason: reason.to_string(),
        };
        let words: Vec<&str> = spec.split_whitespace().collect();
        let mut address = None;
        let carrier = match words.as_slice() {
            ["udp", local, peer, node @ ..] if node.len() <= 1 => {
                if let [node] = node {
                    let parsed = node
                        .parse()
                        .map_err(|_| bad(&format!("{node:?} is not an IPv4 address")))?;
                    address = Some(parsed);
                }
                CarrierConfig::Udp {
                    local: local
                        .parse()
                        .map_err(|_| bad(&format!("{local:?} is not IP:PORT")))?,
                    peer: peer
                        .parse()
                        .map_err(|_| bad(&format!("{peer:?} is not IP:PORT")))?,
                }
            }
            ["shm", path] => CarrierConfig::SharedMemory {
                rendezvous: PathBuf::from(path),
            },
            ["udp", ..] => return Err(bad("udp takes two addresses and an optional node address")),
            ["shm", ..] => return Err(bad("shm takes one socket path")),
            [] => return Err(bad("it is empty")),
            [other, ..] => return Err(bad(&format!("unknown carrier {other:?}"))),
        };
        Ok(VerbsConfig {
            address,
            carrier,
            progress: ProgressConfig::default(),
            capture: None,
        })
    }

    /// Checks what parsing cannot: IPv4 addresses for the UDP carrier, an
    /// address only where one may be given, and the bound on the spin.
    pub fn validated(self) -> Result<VerbsConfig, ConfigError> {
        if let CarrierConfig::Udp { local, peer } = &self.carrier {
            for address in [local, peer] {
                if !address.is_ipv4() {
                    return Err(ConfigError::NotIpv4(*address));
                }
            }
        }
        if self.address.is_some() && matches!(self.carrier, CarrierConfig::SharedMemory { .. }) {
            return Err(ConfigError::AddressWithSharedMemory);
        }
        if self.progress.spin_microseconds > MAX_SPIN_MICROSECONDS {
            return Err(ConfigError::SpinTooLong(self.progress.spin_microseconds));
        }
        Ok(self)
    }
}

/// The IPv4 address of a socket address the configuration checked.
pub(crate) fn ipv4_of(address: SocketAddr) -> Ipv4Address {
    match address.ip() {
        IpAddr::V4(ip) => Ipv4Address(ip.octets()),
        IpAddr::V6(_) => unreachable!("validated as IPv4"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_one_line_forms_parse() {
        let udp = VerbsConfig::from_spec("udp 127.0.0.1:7471 127.0.0.2:7471").unwrap();
        // The address a device is listed with before it starts: the
        // tunnel's local one, a node's own, none for shared memory.
        assert_eq!(
            udp.address_before_start(),
            Some(Ipv4Address::new(127, 0, 0, 1))
        );
        let behind_a_switch =
            VerbsConfig::from_spec("udp 127.0.0.31:47931 127.0.0.1:47900 10.0.0.1").unwrap();
        assert_eq!(
            behind_a_switch.address_before_start(),
            Some(Ipv4Address::new(10, 0, 0, 1))
        );
        assert_eq!(
            VerbsConfig::from_spec("shm /tmp/x.sock")
                .unwrap()
                .address_before_start(),
            None
        );
        assert_eq!(
            udp.carrier,
            CarrierConfig::Udp {
                local: "127.0.0.1:7471".parse().unwrap(),
                peer: "127.0.0.2:7471".parse().unwrap()
            }
        );
        let shm = VerbsConfig::from_spec("shm /tmp/x.sock").unwrap();
        assert_eq!(
            shm.carrier,
            CarrierConfig::SharedMemory {
                rendezvous: "/tmp/x.sock".into()
            }
        );
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        for (spec, reason) in [
            ("", "empty"),
            ("tcp 1.2.3.4:5", "unknown carrier"),
            ("udp 127.0.0.1:1", "two addresses"),
            ("udp 127.0.0.1:1 127.0.0.1:2 10.0.0", "not an IPv4 address"),
            ("udp localhost:1 127.0.0.1:2", "is not IP:PORT"),
        ] {
            let error = VerbsConfig::from_spec(spec).unwrap_err().to_string();
            assert!(error.contains(reason), "{spec:?}: {error}");
        }
        let v6 = VerbsConfig::from_spec("udp [::1]:1 127.0.0.1:2")
            .unwrap()
            .validated();
        assert!(matches!(v6, Err(ConfigError::NotIpv4(_))));
    }

    #[test]
    fn a_rack_switch_tunnel_names_the_node_address() {
        let config =
            VerbsConfig::from_spec("udp 127.0.0.31:47931 127.0.0.1:47900 10.0.0.1").unwrap();
        assert_eq!(config.address, Some(std::net::Ipv4Addr::new(10, 0, 0, 1)));
        let mut shared = VerbsConfig::from_spec("shm /tmp/x.sock").unwrap();
        shared.address = config.address;
        assert!(matches!(
            shared.validated(),
            Err(ConfigError::AddressWithSharedMemory)
        ));
    }

    #[test]
    fn the_file_form_parses_and_refuses_unknown_keys() {
        let config = VerbsConfig::from_toml(
            "[carrier]\nshared_memory = { rendezvous = \"/tmp/r.sock\" }\n[progress]\nspin_microseconds = 5\n",
        )
        .unwrap();
        assert_eq!(config.progress.spin_microseconds, 5);
        assert!(VerbsConfig::from_toml("[carrier]\nudp = { local = \"1.2.3.4:1\" }\n").is_err());
        assert!(VerbsConfig::from_toml("[carrier]\nsharedmemory = {}\n").is_err());
    }
}
