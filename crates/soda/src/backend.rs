//! Where a graph lives while an application runs on it: the backends of
//! SODA's evaluation that are built so far. Every backend runs the same
//! kernels; only the memory under the graph's arrays changes.

use crate::dpu::DpuConfig;
use crate::far::{FarMemory, FarMemoryConfig, FarMemoryStats, SodaError};
use crate::placement::FarPlacement;
use crate::rack::{RackLinks, Route, SodaRack, SodaRackConfig};
use crate::store::{ChunkStore, FileStore, InProcessStore, StoreError};
use remora_graph::apps::{self, App, AppResult};
use remora_graph::engine::with_threads;
use remora_graph::{Graph, Vertex};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

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
    /// Every request through the DPU, forwarded alone and one at a time.
    DpuBase,
    /// Through the DPU with aggregation and asynchronous forwarding.
    DpuOptimized,
}

impl Backend {
    pub const ALL: [Backend; 6] = [
        Backend::Local,
        Backend::InProcess,
        Backend::File,
        Backend::MemServer,
        Backend::DpuBase,
        Backend::DpuOptimized,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Local => "local",
            Backend::InProcess => "in-process",
            Backend::File => "file",
            Backend::MemServer => "memserver",
            Backend::DpuBase => "dpu-base",
            Backend::DpuOptimized => "dpu-opt",
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
    /// CPU of the rack's fabric thread (emulated NICs and switch), apart
    /// from the application's; `None` off the rack.
    pub emulation_cpu_seconds: Option<f64>,
}

/// The graph's bytes: edges plus offsets.
pub fn footprint_bytes(graph: &Graph) -> u64 {
    let (edges, offsets) = graph.footprint_bytes();
    edges + offsets
}

fn buffer_bytes(graph: &Graph, options: &RunOptions) -> u64 {
    let chunk = options.chunk_bytes as u64;
    let share = (footprint_bytes(graph) as f64 * options.buffer_fraction) as u64;
    // At least a few chunks, so that one fault per kernel thread fits.
    share
        .next_multiple_of(chunk)
        .max(chunk * (options.fault_threads as u64 + 4))
}

pub fn run_on(
    backend: Backend,
    app: App,
    graph: &Graph,
    options: &RunOptions,
) -> Result<BackendRun, SodaError> {
    let mut rack_store = None;
    let store: Arc<dyn ChunkStore> = match backend {
        Backend::Local => return Ok(run_local(app, graph, options)),
        Backend::InProcess => Arc::new(InProcessStore::default()),
        Backend::File => Arc::new(FileStore::create(
            &options.work_directory.join("soda-file-store"),
        )?),
        Backend::MemServer | Backend::DpuBase | Backend::DpuOptimized => {
            let store = Arc::new(soda_rack(backend, graph, options)?);
            rack_store = Some(Arc::clone(&store));
            store
        }
    };
    let buffer_bytes = buffer_bytes(graph, options);
    let config = FarMemoryConfig {
        buffer_bytes,
        fault_threads: options.fault_threads,
        ..FarMemoryConfig::default()
    };
    let memory = FarMemory::new(store, config)?;
    let placement = FarPlacement {
        memory: &memory,
        chunk_bytes: options.chunk_bytes,
        staging_directory: options.work_directory.clone(),
    };
    let far_graph = graph.place(&placement)?;
    let started = Instant::now();
    let result = with_threads(options.threads, || {
        apps::run(app, &far_graph, options.source, options.seed)
    });
    let seconds = started.elapsed().as_secs_f64();
    drop(far_graph);
    let far = memory.stats();
    drop(memory);
    let emulation_cpu_seconds = match rack_store {
        Some(store) => Some(store.stop().map_err(StoreError::from)?.as_secs_f64()),
        None => None,
    };
    Ok(BackendRun {
        backend,
        app,
        seconds,
        result,
        buffer_bytes,
        far: Some(far),
        emulation_cpu_seconds,
    })
}

/// A compute and a memory node (and a DPU for the DPU backends), the
/// pool sized for the graph's objects.
fn soda_rack(backend: Backend, graph: &Graph, options: &RunOptions) -> Result<SodaRack, SodaError> {
    let chunk = options.chunk_bytes as u64;
    // Four arrays at most, each rounded up to whole chunks.
    let pool_bytes = footprint_bytes(graph) + 4 * chunk;
    let (dpu, route) = match backend {
        Backend::DpuBase => (
            Some(DpuConfig::base(options.chunk_bytes)),
            Route::ThroughDpu,
        ),
        Backend::DpuOptimized => (
            Some(DpuConfig::optimized(options.chunk_bytes)),
            Route::ThroughDpu,
        ),
        _ => (None, Route::Direct),
    };
    let config = SodaRackConfig {
        pool_bytes,
        channels: options.fault_threads + 1,
        chunk_bytes: options.chunk_bytes,
        dpu,
        route,
        links: options.links,
    };
    SodaRack::start(&config).map_err(|error| SodaError::Store(error.into()))
}

fn run_local(app: App, graph: &Graph, options: &RunOptions) -> BackendRun {
    let started = Instant::now();
    let result = with_threads(options.threads, || {
        apps::run(app, graph, options.source, options.seed)
    });
    BackendRun {
        backend: Backend::Local,
        app,
        seconds: started.elapsed().as_secs_f64(),
        result,
        buffer_bytes: footprint_bytes(graph),
        far: None,
        emulation_cpu_seconds: None,
    }
}
