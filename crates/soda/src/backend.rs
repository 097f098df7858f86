//! Where a graph lives while an application runs on it: the backends of
//! SODA's evaluation. Every backend runs the same kernels; only the memory
//! under the graph's arrays changes.

use crate::cache::{CacheMode, DynamicCacheConfig};
use crate::dpu::{DpuConfig, DpuCounters};
use crate::far::{FarMemory, FarMemoryConfig, FarMemoryStats, SodaError};
use crate::placement::FarPlacement;
use crate::rack::{RackLinks, Route, SodaRack, SodaRackConfig, Traffic};
use crate::store::{Advice, ChunkStore, FileStore, InProcessStore, StoreError};
use remora_graph::apps::{self, App, AppResult};
use remora_graph::csr::VALUES_PREFIX;
use remora_graph::engine::with_threads;
use remora_graph::{Graph, Vertex};
use remora_rack::topology::Topology;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// The DPU configurations of §VI: the base proxy, each optimisation
/// added in turn (Fig. 11), and the two caching modes of "DPU opt".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DpuVariant {
    /// Every request through the DPU, forwarded alone, one at a time.
    Base,
    /// Requests received together are issued together.
    Aggregation,
    /// Aggregation and asynchronous forwarding (many in flight).
    Async,
    /// Aggregation, asynchronous forwarding and the vertex data (offsets)
    /// pinned in the static cache; everything else one-sided to the
    /// memory node, bypassing the DPU.
    Static,
    /// Aggregation, asynchronous forwarding and the edge data through the
    /// dynamic cache with prefetching; everything else bypasses the DPU.
    Dynamic,
}

impl DpuVariant {
    pub const ALL: [DpuVariant; 5] = [
        DpuVariant::Base,
        DpuVariant::Aggregation,
        DpuVariant::Async,
        DpuVariant::Static,
        DpuVariant::Dynamic,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DpuVariant::Base => "dpu-base",
            DpuVariant::Aggregation => "dpu-aggregation",
            DpuVariant::Async => "dpu-async",
            DpuVariant::Static => "dpu-static",
            DpuVariant::Dynamic => "dpu-dynamic",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Backend {
    /// Ordinary memory: the baseline every other backend must match.
    Local,
    /// Far memory whose store is this process's heap: the cost of
    /// faulting and eviction alone, with no network or disk.
    InProcess,
    /// The SSD baseline: a local file read and written with `O_DIRECT`.
    File,
    /// A memory node on an embedded rack: RDMA READ and WRITE straight
    /// from the compute node (SODA's MemServer).
    MemServer,
    /// Through a DPU beside the compute node.
    Dpu(DpuVariant),
}

impl Backend {
    /// Every backend, in the order `remora soda run --help` lists them.
    pub const ALL: [Backend; 9] = [
        Backend::Local,
        Backend::InProcess,
        Backend::File,
        Backend::MemServer,
        Backend::Dpu(DpuVariant::Base),
        Backend::Dpu(DpuVariant::Aggregation),
        Backend::Dpu(DpuVariant::Async),
        Backend::Dpu(DpuVariant::Static),
        Backend::Dpu(DpuVariant::Dynamic),
    ];

    /// The backend of this name ([`Backend::name`]), if there is one.
    pub fn from_name(name: &str) -> Option<Backend> {
        Backend::ALL
            .into_iter()
            .find(|backend| backend.name() == name)
    }

    /// Whether it runs on a rack's hosts (a memory node, and a DPU for the
    /// DPU variants).
    pub fn on_rack(self) -> bool {
        matches!(self, Backend::MemServer | Backend::Dpu(_))
    }

    pub fn name(self) -> &'static str {
        match self {
            Backend::Local => "local",
            Backend::InProcess => "in-process",
            Backend::File => "file",
            Backend::MemServer => "memserver",
            Backend::Dpu(variant) => variant.name(),
        }
    }
}

/// The dynamic cache of the benchmark runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheOptions {
    /// The cache's size as a share of the edge bytes: the paper's 1 GB
    /// cache served 18–50 GB of edges, so 5% at most.
    pub edge_fraction: f64,
    /// Chunks per entry; `None` picks enough entries for the cache to
    /// hold several streams (at least 32 entries, at most 16 chunks each).
    pub chunks_per_entry: Option<usize>,
    pub prefetch_depth: u64,
    pub mode: CacheMode,
}

/// The most entries a DPU fetches ahead of a requested one.
pub const MAX_PREFETCH_DEPTH: u64 = 64;
/// The most chunks a dynamic cache entry holds (256 MiB at 64 KiB).
pub const MAX_CHUNKS_PER_ENTRY: usize = 4096;

impl CacheOptions {
    /// Refuses options no cache can run with.
    pub fn check(&self) -> Result<(), SodaError> {
        if !(self.edge_fraction > 0.0 && self.edge_fraction <= 1.0) {
            return Err(SodaError::Config(
                "the cache's share of the edge bytes must be above 0 and at most 1",
            ));
        }
        if self.chunks_per_entry == Some(0) {
            return Err(SodaError::Config("a cache entry holds at least one chunk"));
        }
        // An entry's bytes are chunks × chunk size: 2^48 chunks wrapped to
        // 0 and divided by zero (a panic) in a release build.
        if self
            .chunks_per_entry
            .is_some_and(|chunks| chunks > MAX_CHUNKS_PER_ENTRY)
        {
            return Err(SodaError::Config("a cache entry holds at most 4096 chunks"));
        }
        if self.prefetch_depth > MAX_PREFETCH_DEPTH {
            return Err(SodaError::Config(
                "the prefetch depth is at most 64 entries",
            ));
        }
        Ok(())
    }
}

impl Default for CacheOptions {
    fn default() -> CacheOptions {
        CacheOptions {
            edge_fraction: 0.05,
            chunks_per_entry: None,
            prefetch_depth: 1,
            mode: CacheMode::Auto,
        }
    }
}

#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Kernel threads.
    pub threads: usize,
    pub fault_threads: usize,
    /// The host buffer as a share of the graph's footprint (§V: ⅓).
    pub buffer_fraction: f64,
    pub chunk_bytes: usize,
    /// Where the file backend keeps its file and placement its staging.
    pub work_directory: PathBuf,
    /// BFS and BC start here.
    pub source: Vertex,
    /// Radii's source sampling.
    pub seed: u64,
    /// The rack's links, for the rack backends.
    pub links: RackLinks,
    /// The rack's hosts, when a rack file gives them (compute, memory and,
    /// for the DPU variants, the DPU attached to the compute host, with
    /// their links): `None` is the standard three on `links`.
    pub hosts: Option<Topology>,
    pub cache: CacheOptions,
}

impl RunOptions {
    /// The benchmark's settings (§V): 2 kernel and 2 fault threads, a host
    /// buffer of a third of the graph, 64 KiB chunks, unshaped links.
    pub fn new(work_directory: PathBuf, source: Vertex) -> RunOptions {
        RunOptions {
            threads: 2,
            fault_threads: 2,
            buffer_fraction: 1.0 / 3.0,
            chunk_bytes: crate::far::DEFAULT_CHUNK_BYTES,
            work_directory,
            source,
            seed: 1,
            links: RackLinks::default(),
            hosts: None,
            cache: CacheOptions::default(),
        }
    }
}

/// What the rack saw during a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RackReport {
    /// CPU of the fabric thread: emulated NICs, switch and DPU agents.
    pub emulation_cpu_seconds: f64,
    pub traffic: Traffic,
    /// The DPU's counters and its agents' busy time.
    pub dpu: Option<(DpuCounters, f64)>,
    /// (B_net, B_intra) in bytes per second, measured at start-up.
    pub bandwidths: Option<(f64, f64)>,
}

impl RackReport {
    /// Bytes on the memory node's link on the critical path: one-sided
    /// traffic plus the DPU's on-demand forwards and writes.
    pub fn memory_on_demand_bytes(&self) -> u64 {
        let dpu = self.dpu.map_or(0, |(counters, _)| {
            counters.on_demand_bytes + counters.written_bytes
        });
        self.traffic.direct_read_bytes + self.traffic.direct_written_bytes + dpu
    }

    /// Bytes on the memory node's link off the critical path: prefetches
    /// and static-cache loads and flushes.
    pub fn memory_background_bytes(&self) -> u64 {
        self.dpu.map_or(0, |(counters, _)| {
            counters.background_bytes + counters.static_bytes
        })
    }

    /// The dynamic cache's hit rate, when it was looked up at all.
    pub fn hit_rate(&self) -> Option<f64> {
        let (counters, _) = self.dpu?;
        (counters.lookups > 0).then(|| counters.hits as f64 / counters.lookups as f64)
    }
}

#[derive(Debug, Clone)]
pub struct BackendRun {
    pub backend: Backend,
    pub app: App,
    /// The kernel alone: placing the graph is not counted.
    pub seconds: f64,
    pub result: AppResult,
    pub buffer_bytes: u64,
    pub far: Option<FarMemoryStats>,
    pub rack: Option<RackReport>,
}

/// The graph's bytes: edges plus offsets.
pub fn footprint_bytes(graph: &Graph) -> u64 {
    let (edges, offsets) = graph.footprint_bytes();
    edges + offsets
}

/// What `app` keeps in far memory: the graph and its own per-vertex
/// values.
pub fn app_footprint_bytes(graph: &Graph, app: App) -> u64 {
    footprint_bytes(graph) + app.value_bytes_per_vertex() * graph.vertex_count() as u64
}

/// The most any app's values take, each array rounded up to chunks.
fn most_value_bytes(graph: &Graph, chunk_bytes: u64) -> u64 {
    let per_vertex = App::ALL
        .iter()
        .map(|app| app.value_bytes_per_vertex())
        .max()
        .unwrap_or(0);
    per_vertex * graph.vertex_count() as u64 + App::MOST_VALUE_ARRAYS * chunk_bytes
}

fn buffer_bytes(graph: &Graph, app: App, options: &RunOptions) -> u64 {
    let chunk = options.chunk_bytes as u64;
    let share = (app_footprint_bytes(graph, app) as f64 * options.buffer_fraction) as u64;
    // At least a few chunks, so that one fault per kernel thread fits.
    share
        .next_multiple_of(chunk)
        .max(chunk * (options.fault_threads as u64 + 4))
}

/// What each array is told: vertex data (the offsets and the apps'
/// values) pinned (static), or edge data cached dynamically.
fn advice_for(variant: Option<DpuVariant>) -> impl Fn(&str) -> Option<Advice> {
    move |name: &str| match variant {
        Some(DpuVariant::Static) if is_vertex_data(name) => Some(Advice::Pin),
        Some(DpuVariant::Dynamic) if name.ends_with("neighbours") => Some(Advice::CacheDynamically),
        _ => None,
    }
}

fn is_vertex_data(name: &str) -> bool {
    name.ends_with("offsets") || name.starts_with(VALUES_PREFIX)
}

pub fn run_on(
    backend: Backend,
    app: App,
    graph: &Graph,
    options: &RunOptions,
) -> Result<BackendRun, SodaError> {
    let mut rack = None;
    let store: Arc<dyn ChunkStore> = match backend {
        Backend::Local => return run_local(app, graph, options),
        Backend::InProcess => Arc::new(InProcessStore::default()),
        Backend::File => Arc::new(FileStore::create(
            &options.work_directory.join("soda-file-store"),
        )?),
        Backend::MemServer | Backend::Dpu(_) => {
            let store = Arc::new(soda_rack(backend, graph, options, 1)?);
            rack = Some(Arc::clone(&store));
            store
        }
    };
    let config = far_memory_config(graph, app, options);
    let buffer_bytes = config.buffer_bytes;
    let memory = FarMemory::new(store, config)?;
    let far_graph = place(&memory, backend, graph, options, "")?;
    // Placing (and pinning) moved bytes the run should not be charged.
    let before = rack.as_ref().map(|rack| rack_report(rack, 0.0));
    let started = Instant::now();
    let result = with_threads(options.threads, || {
        apps::run(app, &far_graph, options.source, options.seed)
    });
    let seconds = started.elapsed().as_secs_f64();
    let result = result?;
    drop(far_graph);
    let far = memory.stats();
    drop(memory);
    let rack = match (rack, before) {
        (Some(rack), Some(before)) => {
            let cpu = rack.stop().map_err(StoreError::from)?.as_secs_f64();
            Some(difference(rack_report(&rack, cpu), before))
        }
        _ => None,
    };
    Ok(BackendRun {
        backend,
        app,
        seconds,
        result,
        buffer_bytes,
        far: Some(far),
        rack,
    })
}

fn far_memory_config(graph: &Graph, app: App, options: &RunOptions) -> FarMemoryConfig {
    FarMemoryConfig {
        buffer_bytes: buffer_bytes(graph, app, options),
        fault_threads: options.fault_threads,
        ..FarMemoryConfig::default()
    }
}

/// The graph's arrays in `memory`, with the advice `backend` gives them;
/// `label` keeps processes' staging files apart.
fn place(
    memory: &FarMemory,
    backend: Backend,
    graph: &Graph,
    options: &RunOptions,
    label: &str,
) -> Result<Graph, SodaError> {
    let variant = match backend {
        Backend::Dpu(variant) => Some(variant),
        _ => None,
    };
    let advice = advice_for(variant);
    let staging_directory = options.work_directory.join(format!("staging{label}"));
    std::fs::create_dir_all(&staging_directory).map_err(|error| {
        SodaError::Placement(remora_graph::PlacementError {
            name: "staging directory".into(),
            bytes: 0,
            reason: error.to_string(),
        })
    })?;
    let placement = FarPlacement {
        memory,
        chunk_bytes: options.chunk_bytes,
        staging_directory,
        advice: &advice,
    };
    Ok(graph.place(&placement)?)
}

/// Fig. 8: two application processes at once on one compute node, each
/// with its own far memory and queue pairs, sharing the memory node and
/// (for the DPU backends) the DPU agent and its caches.
#[derive(Debug, Clone)]
pub struct SideBySide {
    /// The app of interest, then its companion (BFS in §VI-B).
    pub runs: [BackendRun; 2],
    /// The rack's figures for both together.
    pub rack: RackReport,
}

pub fn run_beside(
    backend: Backend,
    apps: [App; 2],
    graph: &Graph,
    options: &RunOptions,
) -> Result<SideBySide, SodaError> {
    if !matches!(backend, Backend::MemServer | Backend::Dpu(_)) {
        return Err(SodaError::Config(
            "processes share a rack: memserver or a DPU backend",
        ));
    }
    let rack = Arc::new(soda_rack(backend, graph, options, 2)?);
    let mut memories = Vec::new();
    let mut graphs = Vec::new();
    let mut buffers = Vec::new();
    for (process, &app) in apps.iter().enumerate() {
        let store =
            SodaRack::process(&rack, process).map_err(|error| SodaError::Store(error.into()))?;
        let config = far_memory_config(graph, app, options);
        buffers.push(config.buffer_bytes);
        let memory = FarMemory::new(Arc::new(store), config)?;
        graphs.push(place(
            &memory,
            backend,
            graph,
            options,
            &process.to_string(),
        )?);
        memories.push(memory);
    }
    let before = rack_report(&rack, 0.0);
    let outcomes: Vec<(Result<AppResult, remora_graph::apps::AppError>, f64)> =
        std::thread::scope(|scope| {
            let workers: Vec<_> = apps
                .iter()
                .zip(&graphs)
                .map(|(&app, far_graph)| {
                    scope.spawn(move || {
                        with_threads(options.threads, || {
                            let started = Instant::now();
                            let result = apps::run(app, far_graph, options.source, options.seed);
                            (result, started.elapsed().as_secs_f64())
                        })
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|worker| worker.join().expect("an application thread"))
                .collect()
        });
    drop(graphs);
    let stats: Vec<FarMemoryStats> = memories.iter().map(FarMemory::stats).collect();
    drop(memories);
    let cpu = rack.stop().map_err(StoreError::from)?.as_secs_f64();
    let report = difference(rack_report(&rack, cpu), before);
    let runs = outcomes
        .into_iter()
        .zip(stats)
        .zip(apps)
        .zip(buffers)
        .map(|((((result, seconds), far), app), buffer_bytes)| {
            Ok(BackendRun {
                backend,
                app,
                seconds,
                result: result?,
                buffer_bytes,
                far: Some(far),
                rack: None,
            })
        })
        .collect::<Result<Vec<BackendRun>, SodaError>>()?;
    let [first, second]: [BackendRun; 2] = runs.try_into().expect("two runs");
    Ok(SideBySide {
        runs: [first, second],
        rack: report,
    })
}

fn rack_report(rack: &SodaRack, emulation_cpu_seconds: f64) -> RackReport {
    RackReport {
        emulation_cpu_seconds,
        traffic: rack.traffic(),
        dpu: rack
            .dpu_report()
            .map(|(counters, busy)| (counters, busy.as_secs_f64())),
        bandwidths: rack.bandwidths(),
    }
}

/// The run's share: counters after less counters before.
fn difference(after: RackReport, before: RackReport) -> RackReport {
    let traffic = Traffic {
        direct_read_bytes: after.traffic.direct_read_bytes - before.traffic.direct_read_bytes,
        direct_written_bytes: after.traffic.direct_written_bytes
            - before.traffic.direct_written_bytes,
        dpu_read_bytes: after.traffic.dpu_read_bytes - before.traffic.dpu_read_bytes,
        dpu_written_bytes: after.traffic.dpu_written_bytes - before.traffic.dpu_written_bytes,
    };
    let dpu = match (after.dpu, before.dpu) {
        (Some((late, late_busy)), Some((early, early_busy))) => Some((
            DpuCounters {
                read_requests: late.read_requests - early.read_requests,
                write_requests: late.write_requests - early.write_requests,
                refused_requests: late.refused_requests - early.refused_requests,
                on_demand_bytes: late.on_demand_bytes - early.on_demand_bytes,
                written_bytes: late.written_bytes - early.written_bytes,
                lookups: late.lookups - early.lookups,
                hits: late.hits - early.hits,
                straddling_reads: late.straddling_reads - early.straddling_reads,
                background_bytes: late.background_bytes - early.background_bytes,
                static_bytes: late.static_bytes - early.static_bytes,
                ..late
            },
            late_busy - early_busy,
        )),
        (dpu, _) => dpu,
    };
    RackReport {
        traffic,
        dpu,
        ..after
    }
}

/// A compute and a memory node (and a DPU for the DPU backends), the
/// pool sized for the graph's objects.
fn soda_rack(
    backend: Backend,
    graph: &Graph,
    options: &RunOptions,
    processes: usize,
) -> Result<SodaRack, SodaError> {
    options.cache.check()?;
    let chunk = options.chunk_bytes as u64;
    // Four arrays at most, each rounded up to whole chunks, and any app's
    // values.
    let pool_bytes = footprint_bytes(graph) + 4 * chunk + most_value_bytes(graph, chunk);
    let (edge_bytes, offset_bytes) = graph.footprint_bytes();
    let (dpu, route) = match backend {
        Backend::Dpu(variant) => {
            let mut config = match variant {
                DpuVariant::Base => DpuConfig::base(options.chunk_bytes),
                _ => DpuConfig::optimized(options.chunk_bytes),
            };
            config.async_forwarding =
                variant != DpuVariant::Aggregation && variant != DpuVariant::Base;
            let route = match variant {
                DpuVariant::Static | DpuVariant::Dynamic => Route::Direct,
                _ => Route::ThroughDpu,
            };
            if variant == DpuVariant::Static {
                // Room for every offsets array, each rounded to chunks,
                // and any app's values.
                config.static_bytes =
                    (offset_bytes + 4 * chunk + most_value_bytes(graph, chunk)) * processes as u64;
            }
            if variant == DpuVariant::Dynamic {
                let capacity = (edge_bytes as f64 * options.cache.edge_fraction) as u64;
                let entry_bytes = options.chunk_bytes * entry_chunks(capacity, options);
                config.dynamic = Some(DynamicCacheConfig {
                    // At least one entry, so the cache exists at all.
                    capacity_bytes: capacity.max(entry_bytes as u64) / entry_bytes as u64
                        * entry_bytes as u64,
                    entry_bytes,
                    prefetch_depth: options.cache.prefetch_depth,
                    mode: options.cache.mode,
                });
            }
            (Some(config), route)
        }
        _ => (None, Route::Direct),
    };
    let config = SodaRackConfig {
        pool_bytes: pool_bytes * processes as u64,
        processes,
        channels: options.fault_threads + 1,
        chunk_bytes: options.chunk_bytes,
        dpu,
        route,
        links: options.links,
        hosts: options.hosts.clone(),
    };
    SodaRack::start(&config).map_err(|error| SodaError::Store(error.into()))
}

/// Chunks per dynamic cache entry: as asked, or enough entries (32) for
/// several streams, between 1 and 16 chunks each (16 is the paper's
/// 1 MiB of 64 KiB chunks).
pub fn entry_chunks(capacity_bytes: u64, options: &RunOptions) -> usize {
    const ENTRIES_WANTED: u64 = 32;
    const MOST_CHUNKS: u64 = 16;
    let chunk = options.chunk_bytes as u64;
    options
        .cache
        .chunks_per_entry
        .unwrap_or_else(|| (capacity_bytes / ENTRIES_WANTED / chunk).clamp(1, MOST_CHUNKS) as usize)
}

fn run_local(app: App, graph: &Graph, options: &RunOptions) -> Result<BackendRun, SodaError> {
    let started = Instant::now();
    let result = with_threads(options.threads, || {
        apps::run(app, graph, options.source, options.seed)
    })?;
    Ok(BackendRun {
        backend: Backend::Local,
        app,
        seconds: started.elapsed().as_secs_f64(),
        result,
        buffer_bytes: app_footprint_bytes(graph, app),
        far: None,
        rack: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_options_no_cache_can_run_with_are_refused() {
        let good = CacheOptions::default();
        good.check().unwrap();
        let bad = [
            CacheOptions {
                chunks_per_entry: Some(0),
                ..good
            },
            // 2^48 chunks of 64 KiB wrapped to 0 bytes: a divide by zero.
            CacheOptions {
                chunks_per_entry: Some(1 << 48),
                ..good
            },
            CacheOptions {
                prefetch_depth: MAX_PREFETCH_DEPTH + 1,
                ..good
            },
            CacheOptions {
                edge_fraction: 0.0,
                ..good
            },
            CacheOptions {
                edge_fraction: f64::NAN,
                ..good
            },
        ];
        for options in bad {
            assert!(
                matches!(options.check(), Err(SodaError::Config(_))),
                "{options:?}"
            );
        }
    }
}
