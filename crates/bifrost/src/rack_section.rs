//! The rack file's `[bifrost]` section: the thesis's array services on
//! the rack's own hosts (its first compute node the client, its second the
//! service's host, its memory nodes the DSM's), through the Gatekeeper
//! with its ACL on or bypassing it; every call by reference, its answer
//! checked, and the switch's counters reported.
//!
//! ```toml
//! [bifrost]
//! workloads = ["increment_array", "add_arrays"]
//! calls = 100            # per workload
//! array_bytes = 65536
//! gatekeeper = true      # false: plain forwarding, no ACL
//! workers = 2            # the service's worker threads
//! ```

use crate::arrays::{arrays_rack_on, Workload};
use crate::by_reference::pass_by_reference;
use crate::dsm::rack::DsmRackConfig;
use crate::dsm_service::{DsmServiceHosts, DsmServiceRackError};
use crate::gatekeeper::GatekeeperCounters;
use crate::services::ArraysSyncClient;
use crate::transport::{client_protocols_passing, Routing};
use hdrhistogram::Histogram;
use remora_rack::topology::Topology;
use serde::Deserialize;
use std::time::Instant;

/// The section's name in a rack file.
pub const SECTION: &str = "bifrost";

/// Calls per workload a rack file may ask for.
const MAX_CALLS: u64 = 100_000;
/// The largest array a rack file may ask for (the service's pool and
/// channels are sized for it).
const MAX_ARRAY_BYTES: usize = 4 << 20;
const MAX_WORKERS: usize = 16;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BifrostSection {
    pub workloads: Vec<Workload>,
    pub calls: u64,
    pub array_bytes: usize,
    pub routing: Routing,
    pub workers: usize,
}

/// Why a `[bifrost]` section was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BifrostSectionError {
    #[error("[bifrost] {0}")]
    Syntax(String),
    #[error("[bifrost] {field} is {value}: {rule}")]
    Invalid {
        field: &'static str,
        value: String,
        rule: &'static str,
    },
    #[error(
        "[bifrost] needs two compute nodes (a client and the service's host) and a memory node"
    )]
    NoHosts,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSection {
    #[serde(default = "all_workloads")]
    workloads: Vec<String>,
    #[serde(default = "default_calls")]
    calls: u64,
    #[serde(default = "default_array_bytes")]
    array_bytes: usize,
    #[serde(default = "default_gatekeeper")]
    gatekeeper: bool,
    #[serde(default = "default_workers")]
    workers: usize,
}

fn all_workloads() -> Vec<String> {
    Workload::ALL
        .iter()
        .map(|workload| workload.name().to_owned())
        .collect()
}

fn default_calls() -> u64 {
    100
}

fn default_array_bytes() -> usize {
    64 << 10
}

fn default_gatekeeper() -> bool {
    true
}

fn default_workers() -> usize {
    2
}

/// The section's hosts, as a rack of their own: the client (host 0), the
/// service's host (1), and the memory nodes (2 on).
#[derive(Debug, Clone)]
pub struct SectionHosts {
    pub topology: Topology,
    pub memory: Vec<usize>,
}

impl BifrostSection {
    /// The rack file's `[bifrost]` table, if it has one, and its hosts.
    pub fn from_rack(
        rack: &remora_rack::RackConfig,
    ) -> Result<Option<(BifrostSection, SectionHosts)>, BifrostSectionError> {
        use remora_rack::Role;
        let Some(table) = rack.systems.get(SECTION) else {
            return Ok(None);
        };
        let section = BifrostSection::parse(table)?;
        let topology = rack.topology();
        let of_role = |role| {
            topology
                .hosts()
                .iter()
                .enumerate()
                .filter(move |(_, host)| host.role == role)
                .map(|(index, _)| index)
        };
        let compute: Vec<usize> = of_role(Role::Compute).take(2).collect();
        let memory: Vec<usize> = of_role(Role::Memory).take(62).collect();
        if compute.len() < 2 || memory.is_empty() {
            return Err(BifrostSectionError::NoHosts);
        }
        let order: Vec<usize> = compute.iter().chain(&memory).copied().collect();
        let topology = topology
            .subset(&order)
            .expect("a rack's compute and memory nodes make a rack");
        let memory = (2..order.len()).collect();
        Ok(Some((section, SectionHosts { topology, memory })))
    }

    /// A `[bifrost]` table on its own.
    pub fn parse(table: &toml::Table) -> Result<BifrostSection, BifrostSectionError> {
        let raw: RawSection =
            remora_rack::config::parse_section(table).map_err(BifrostSectionError::Syntax)?;
        let invalid =
            |field, value: String, rule| BifrostSectionError::Invalid { field, value, rule };
        let mut workloads = Vec::with_capacity(raw.workloads.len());
        for name in &raw.workloads {
            let workload = Workload::ALL
                .into_iter()
                .find(|workload| workload.name() == name)
                .ok_or_else(|| {
                    invalid("workloads", name.clone(), "increment_array or add_arrays")
                })?;
            if !workloads.contains(&workload) {
                workloads.push(workload);
            }
        }
        if workloads.is_empty() {
            return Err(invalid(
                "workloads",
                "empty".into(),
                "at least one workload",
            ));
        }
        if !(1..=MAX_CALLS).contains(&raw.calls) {
            return Err(invalid("calls", raw.calls.to_string(), "from 1 to 100000"));
        }
        if !(1..=MAX_ARRAY_BYTES).contains(&raw.array_bytes) {
            return Err(invalid(
                "array_bytes",
                raw.array_bytes.to_string(),
                "from 1 to 4194304",
            ));
        }
        if !(1..=MAX_WORKERS).contains(&raw.workers) {
            return Err(invalid("workers", raw.workers.to_string(), "from 1 to 16"));
        }
        let routing = match raw.gatekeeper {
            true => Routing::Gatekeeper,
            false => Routing::Bypass,
        };
        Ok(BifrostSection {
            workloads,
            calls: raw.calls,
            array_bytes: raw.array_bytes,
            routing,
            workers: raw.workers,
        })
    }
}

/// One workload's calls.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WorkloadRun {
    pub workload: &'static str,
    pub calls: u64,
    /// Answers equal to what the workload must give.
    pub matched: u64,
    pub p50_us: f64,
    pub p99_us: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum SectionRunError {
    #[error(transparent)]
    Rack(#[from] DsmServiceRackError),
    #[error("the DSM: {0}")]
    Dsm(#[from] crate::dsm::client::DsmError),
    #[error("{workload} call {call}: {source}")]
    Call {
        workload: &'static str,
        call: u64,
        source: thrift::Error,
    },
}

/// Runs the section on its hosts: each workload's calls by reference, in
/// order, each answer checked.
pub fn run_section(
    section: &BifrostSection,
    hosts: &SectionHosts,
) -> Result<(Vec<WorkloadRun>, Option<GatekeeperCounters>), SectionRunError> {
    let config = DsmRackConfig {
        pool_bytes: 8 * MAX_ARRAY_BYTES as u64,
        chunk_bytes: section.array_bytes.clamp(4096, 1 << 20),
        ..DsmRackConfig::default()
    };
    let service_hosts = DsmServiceHosts {
        client: 0,
        service: 1,
        memory: &hosts.memory,
    };
    let (routing, workers) = (section.routing, section.workers);
    let rack = arrays_rack_on(&hosts.topology, service_hosts, config, routing, workers)?;
    let ((input, output), handle) = client_protocols_passing(rack.path.clone());
    let mut client = ArraysSyncClient::new(input, output);
    let mut runs = Vec::new();
    for &workload in &section.workloads {
        let inputs = workload.inputs(section.array_bytes);
        let expected = workload.expected(&inputs);
        let slices: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let passed = pass_by_reference(&rack.dsm, &slices)?;
        let mut latencies = Histogram::<u64>::new(3).expect("3 significant digits");
        let mut matched = 0;
        let mut answer = vec![0u8; section.array_bytes];
        for call in 0..section.calls {
            let began = Instant::now();
            let returned = workload
                .call(&mut client, &handle, &passed)
                .map_err(|source| SectionRunError::Call {
                    workload: workload.name(),
                    call,
                    source,
                })?;
            latencies.saturating_record(began.elapsed().as_nanos() as u64);
            rack.dsm.read(returned.allocation, &mut answer)?;
            rack.dsm.free(returned.allocation)?;
            matched += u64::from(answer == expected);
        }
        rack.dsm.free(passed.0)?;
        let at = |quantile: f64| latencies.value_at_quantile(quantile) as f64 / 1e3;
        runs.push(WorkloadRun {
            workload: workload.name(),
            calls: section.calls,
            matched,
            p50_us: at(0.5),
            p99_us: at(0.99),
        });
    }
    Ok((runs, rack.gatekeeper_counters()))
}
