//! SODA's section of a rack file, `[soda]`: one graph application through
//! far memory on the rack's hosts. The rack crate keeps the table
//! unparsed; this module reads it, with typed errors that name the field,
//! and picks the hosts: the rack's first compute node and first memory
//! node, and for the DPU backends the offload node attached to that
//! compute node, with the links the rack file gives them.
//!
//! ```toml
//! [soda]
//! app = "bfs"               # bfs, pr, radii, bc or cc
//! graph = "kron:14"         # kron:SCALE[:DEGREE], uniform:SCALE[:DEGREE], or a file
//! backend = "dpu-static"    # memserver or dpu-base, -aggregation, -async, -static, -dynamic
//! threads = 2               # kernel threads
//! fault_threads = 2
//! buffer_fraction = 0.33    # the host buffer, as a share of the graph
//! chunk_kib = 64
//! seed = 1                  # the generator's, and Radii's sampling
//! check = true              # every result compared with all-local memory
//! ```

use crate::backend::Backend;
use remora_graph::apps::App;
use remora_rack::config::parse_section;
use remora_rack::topology::Topology;
use remora_rack::{RackConfig, Role};
use serde::Deserialize;

/// The section's name in a rack file.
pub const SECTION: &str = "soda";

/// Why a `[soda]` section was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SodaConfigError {
    #[error("[soda] {0}")]
    Syntax(String),
    #[error("[soda] {field} is {value}: {rule}")]
    Invalid {
        field: &'static str,
        value: String,
        rule: &'static str,
    },
    #[error("[soda] needs a compute node and a memory node")]
    NoHosts,
    #[error("[soda] backend {0} needs an offload node attached to the first compute node")]
    NoDpu(&'static str),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSoda {
    #[serde(default = "default_app")]
    app: String,
    graph: String,
    #[serde(default = "default_backend")]
    backend: String,
    #[serde(default = "default_threads")]
    threads: usize,
    #[serde(default = "default_threads")]
    fault_threads: usize,
    #[serde(default = "default_buffer_fraction")]
    buffer_fraction: f64,
    #[serde(default = "default_chunk_kib")]
    chunk_kib: usize,
    #[serde(default = "default_seed")]
    seed: u64,
    #[serde(default = "default_check")]
    check: bool,
}

fn default_app() -> String {
    "bfs".into()
}

fn default_backend() -> String {
    "dpu-static".into()
}

fn default_threads() -> usize {
    2
}

fn default_buffer_fraction() -> f64 {
    1.0 / 3.0
}

fn default_chunk_kib() -> usize {
    64
}

fn default_seed() -> u64 {
    1
}

fn default_check() -> bool {
    true
}

/// Bounds a rack file and `remora soda run` are held to.
pub const MAX_THREADS: usize = 64;
pub const MIN_CHUNK_KIB: usize = 4;
pub const MAX_CHUNK_KIB: usize = 1024;

/// Whether `chunk_kib` is a chunk size SODA takes: a power of two from
/// [`MIN_CHUNK_KIB`] to [`MAX_CHUNK_KIB`].
pub fn is_chunk_kib(chunk_kib: usize) -> bool {
    (MIN_CHUNK_KIB..=MAX_CHUNK_KIB).contains(&chunk_kib) && chunk_kib.is_power_of_two()
}

/// The `[soda]` section, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct SodaSection {
    pub app: App,
    /// A graph as `remora soda run` takes it: a generator or a file.
    pub graph: String,
    pub backend: Backend,
    pub threads: usize,
    pub fault_threads: usize,
    pub buffer_fraction: f64,
    pub chunk_bytes: usize,
    pub seed: u64,
    /// Compare the result with all-local memory.
    pub check: bool,
}

impl SodaSection {
    /// The rack file's `[soda]` table, if it has one, and the hosts it
    /// runs on: the first compute node (host 0), the first memory node
    /// (host 1) and, for the DPU backends, the offload node beside that
    /// compute node (host 2), each with its links from the file.
    pub fn from_rack(
        rack: &RackConfig,
    ) -> Result<Option<(SodaSection, Topology)>, SodaConfigError> {
        let Some(table) = rack.systems.get(SECTION) else {
            return Ok(None);
        };
        let section = SodaSection::parse(table)?;
        let hosts = hosts(rack, section.backend)?;
        Ok(Some((section, hosts)))
    }

    /// A `[soda]` table on its own.
    pub fn parse(table: &toml::Table) -> Result<SodaSection, SodaConfigError> {
        let raw: RawSoda = parse_section(table).map_err(SodaConfigError::Syntax)?;
        SodaSection::validate(raw)
    }

    fn validate(raw: RawSoda) -> Result<SodaSection, SodaConfigError> {
        let invalid = |field, value: String, rule| SodaConfigError::Invalid { field, value, rule };
        let app = raw
            .app
            .parse::<App>()
            .map_err(|_| invalid("app", raw.app.clone(), "bfs, pr, radii, bc or cc"))?;
        let backend = Backend::from_name(&raw.backend)
            .filter(|backend| backend.on_rack())
            .ok_or_else(|| {
                invalid(
                    "backend",
                    raw.backend.clone(),
                    "memserver, dpu-base, dpu-aggregation, dpu-async, dpu-static or dpu-dynamic",
                )
            })?;
        if raw.graph.is_empty() {
            return Err(invalid("graph", "empty".into(), "a generator or a file"));
        }
        // A file is looked for now, and a generator's scale and degree
        // checked now, not after the rack has run (`kron:abc` passed).
        let expected = "kron:SCALE[:DEGREE], uniform:SCALE[:DEGREE] or an existing file";
        match remora_graph::generate::GeneratorSpec::parse(&raw.graph, 0) {
            Some(Ok(_)) => {}
            // The generator's own reason: the scale, the degree, or the
            // edges they make.
            Some(Err(error)) => {
                return Err(invalid(
                    "graph",
                    format!("{} ({error})", raw.graph),
                    expected,
                ))
            }
            None if std::path::Path::new(&raw.graph).is_file() => {}
            None => return Err(invalid("graph", raw.graph.clone(), expected)),
        }
        for (field, threads) in [
            ("threads", raw.threads),
            ("fault_threads", raw.fault_threads),
        ] {
            if !(1..=MAX_THREADS).contains(&threads) {
                return Err(invalid(field, threads.to_string(), "from 1 to 64"));
            }
        }
        if !(raw.buffer_fraction > 0.0 && raw.buffer_fraction <= 1.0) {
            return Err(invalid(
                "buffer_fraction",
                raw.buffer_fraction.to_string(),
                "above 0 and at most 1",
            ));
        }
        if !is_chunk_kib(raw.chunk_kib) {
            return Err(invalid(
                "chunk_kib",
                raw.chunk_kib.to_string(),
                "a power of two from 4 to 1024",
            ));
        }
        Ok(SodaSection {
            app,
            graph: raw.graph,
            backend,
            threads: raw.threads,
            fault_threads: raw.fault_threads,
            buffer_fraction: raw.buffer_fraction,
            chunk_bytes: raw.chunk_kib << 10,
            seed: raw.seed,
            check: raw.check,
        })
    }
}

/// The hosts `backend` runs on, as a topology of their own: compute,
/// memory and, for a DPU backend, the DPU beside the compute node.
fn hosts(rack: &RackConfig, backend: Backend) -> Result<Topology, SodaConfigError> {
    let topology = rack.topology();
    let (Some(compute), Some(memory)) =
        (topology.first(Role::Compute), topology.first(Role::Memory))
    else {
        return Err(SodaConfigError::NoHosts);
    };
    let mut hosts = vec![compute, memory];
    if let Backend::Dpu(_) = backend {
        let dpu = topology
            .attached(compute)
            .next()
            .ok_or(SodaConfigError::NoDpu(backend.name()))?;
        hosts.push(dpu);
    }
    Ok(topology
        .subset(&hosts)
        .expect("a rack's hosts, the DPU after its compute node, make a rack"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SodaSection, SodaConfigError> {
        SodaSection::parse(&text.parse::<toml::Table>().unwrap())
    }

    #[test]
    fn a_section_sets_the_run_and_defaults_fill_the_rest() {
        let section = parse("graph = \"kron:12\"\napp = \"pr\"\nbackend = \"memserver\"").unwrap();
        assert_eq!(section.app, App::PageRank);
        assert_eq!(section.backend, Backend::MemServer);
        assert_eq!(section.chunk_bytes, 64 << 10);
        assert!(section.check);
        let defaults = parse("graph = \"kron:12\"").unwrap();
        assert_eq!(defaults.app, App::Bfs);
        assert_eq!(defaults.backend.name(), "dpu-static");
    }

    #[test]
    fn bad_settings_name_their_field() {
        let field = |text: &str| match parse(&format!("graph = \"kron:10\"\n{text}")) {
            Err(SodaConfigError::Invalid { field, .. }) => field,
            other => panic!("{text}: {other:?}"),
        };
        // A generator's scale and degree are checked up front too (they
        // passed and failed once the rack was up; found by reading).
        for graph in [
            "kron:abc",
            "kron:",
            "kron:99",
            "uniform:10:0",
            "kron:10:4:1",
        ] {
            assert!(
                matches!(
                    parse(&format!("graph = \"{graph}\"")),
                    Err(SodaConfigError::Invalid { field: "graph", .. })
                ),
                "{graph}"
            );
        }
        assert_eq!(field("app = \"sssp\""), "app");
        assert_eq!(field("backend = \"local\""), "backend");
        assert_eq!(field("backend = \"dpu-turbo\""), "backend");
        assert_eq!(field("threads = 0"), "threads");
        assert_eq!(field("fault_threads = 65"), "fault_threads");
        assert_eq!(field("buffer_fraction = 0.0"), "buffer_fraction");
        assert_eq!(field("chunk_kib = 48"), "chunk_kib");
        // A missing file is named before the rack runs, not after.
        assert!(matches!(
            parse("graph = \"/nonexistent/graph.el\""),
            Err(SodaConfigError::Invalid { field: "graph", .. })
        ));
        assert!(matches!(
            parse("app = \"bfs\""),
            Err(SodaConfigError::Syntax(_))
        ));
        assert!(matches!(
            parse("graph = \"kron:10\"\nspeed = 3"),
            Err(SodaConfigError::Syntax(_))
        ));
    }

    const RACK: &str = r#"
        [rack]
        name = "s"
        [switch]
        program = "l2l3"
        [[node]]
        name = "m"
        role = "memory"
        address = "10.0.2.2"
        memory = "64MiB"
        [[node]]
        name = "c"
        role = "compute"
        address = "10.0.2.1"
        memory = "1MiB"
    "#;

    #[test]
    fn the_hosts_are_the_first_compute_and_memory_nodes_and_the_dpu_beside_them() {
        let dpu = "[[node]]\nname = \"d\"\nrole = \"offload\"\naddress = \"10.0.2.3\"\nmemory = \"16MiB\"\nattached_to = \"c\"\n[node.local_link]\nbandwidth = \"2Gbit/s\"\n";
        let rack =
            RackConfig::parse(&format!("{RACK}{dpu}\n[soda]\ngraph = \"kron:10\"\n")).unwrap();
        let (section, hosts) = SodaSection::from_rack(&rack).unwrap().unwrap();
        assert_eq!(section.backend.name(), "dpu-static");
        let names: Vec<&str> = hosts
            .hosts()
            .iter()
            .map(|host| host.name.as_str())
            .collect();
        assert_eq!(names, ["c", "m", "d"]);
        assert_eq!(hosts.local_links().collect::<Vec<_>>(), vec![(0, 2)]);
        assert_eq!(
            hosts.simulator_local_link(2).bandwidth_bits_per_second,
            2_000_000_000
        );
        let without_dpu =
            RackConfig::parse(&format!("{RACK}\n[soda]\ngraph = \"kron:10\"\n")).unwrap();
        assert_eq!(
            SodaSection::from_rack(&without_dpu).unwrap_err(),
            SodaConfigError::NoDpu("dpu-static")
        );
        let memserver = RackConfig::parse(&format!(
            "{RACK}\n[soda]\ngraph = \"kron:10\"\nbackend = \"memserver\"\n"
        ))
        .unwrap();
        let (_, hosts) = SodaSection::from_rack(&memserver).unwrap().unwrap();
        assert_eq!(hosts.hosts().len(), 2);
    }
}
