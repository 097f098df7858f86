//! `remora soda`: run one graph application on one backend.

use clap::{Args, Subcommand, ValueEnum};
use remora_graph::apps::App;
use remora_graph::generate::{generate, GeneratorSpec};
use remora_graph::load::{load, LoadOptions};
use remora_graph::{Graph, Vertex};
use remora_soda::backend::{
    footprint_bytes, run_on, Backend, BackendRun, CacheOptions, DpuVariant, RackReport, RunOptions,
};
use remora_soda::cache::CacheMode;
use remora_soda::config::{is_chunk_kib, MAX_CHUNK_KIB, MAX_THREADS, MIN_CHUNK_KIB};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Subcommand)]
pub enum SodaCommand {
    /// Run one application on a graph, on local memory or through far
    /// memory, and print what it found (and per-vertex results with --out).
    Run(RunArgs),
}

#[derive(Clone, Copy, ValueEnum)]
pub enum BackendChoice {
    /// Ordinary memory.
    Local,
    /// Far memory kept in this process: faulting and eviction alone.
    InProcess,
    /// Far memory on a local file read with O_DIRECT (the SSD baseline).
    File,
    /// Far memory on a memory node of an embedded rack, by RDMA READ and
    /// WRITE from the compute node (SODA's MemServer).
    Memserver,
    /// Through a DPU beside the compute node, every request alone.
    DpuBase,
    /// Through the DPU, requests received together issued together.
    DpuAggregation,
    /// Through the DPU with aggregation and asynchronous forwarding.
    DpuAsync,
    /// DPU opt with the vertex data pinned in the DPU's static cache.
    DpuStatic,
    /// DPU opt with the edge data through the DPU's dynamic cache.
    DpuDynamic,
}

impl From<BackendChoice> for Backend {
    fn from(choice: BackendChoice) -> Backend {
        match choice {
            BackendChoice::Local => Backend::Local,
            BackendChoice::InProcess => Backend::InProcess,
            BackendChoice::File => Backend::File,
            BackendChoice::Memserver => Backend::MemServer,
            BackendChoice::DpuBase => Backend::Dpu(DpuVariant::Base),
            BackendChoice::DpuAggregation => Backend::Dpu(DpuVariant::Aggregation),
            BackendChoice::DpuAsync => Backend::Dpu(DpuVariant::Async),
            BackendChoice::DpuStatic => Backend::Dpu(DpuVariant::Static),
            BackendChoice::DpuDynamic => Backend::Dpu(DpuVariant::Dynamic),
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
pub enum CacheModeChoice {
    /// On while its hit rate beats B_net / B_intra (Eq. 3).
    Auto,
    On,
    Off,
}

impl From<CacheModeChoice> for CacheMode {
    fn from(choice: CacheModeChoice) -> CacheMode {
        match choice {
            CacheModeChoice::Auto => CacheMode::Auto,
            CacheModeChoice::On => CacheMode::On,
            CacheModeChoice::Off => CacheMode::Off,
        }
    }
}

#[derive(Args)]
pub struct RunArgs {
    /// bfs, pr, radii, bc or cc.
    app: App,
    /// A graph file (.el, .wel, .sg, .adj, or a SNAP .txt), or a generated
    /// graph: kron:SCALE[:DEGREE] or uniform:SCALE[:DEGREE] (degree 16).
    graph: String,
    /// Where the graph's far memory lives.
    #[arg(long, value_enum, default_value = "file")]
    backend: BackendChoice,
    /// Kernel threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// userfaultfd handler threads.
    #[arg(long, default_value_t = 2)]
    fault_threads: usize,
    /// The host buffer as a share of the graph's bytes (SODA §V uses 1/3).
    #[arg(long, default_value_t = 1.0 / 3.0)]
    buffer_fraction: f64,
    /// Chunk size in KiB: the unit moved between the buffer and the store.
    #[arg(long, default_value_t = 64)]
    chunk_kib: usize,
    /// BFS and BC start here (default: the first vertex with edges).
    #[arg(long)]
    source: Option<Vertex>,
    /// Seed of generated graphs and of Radii's sampling.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Treat a loaded edge list as undirected.
    #[arg(long)]
    symmetrize: bool,
    /// The most vertices a loaded edge list may have (its largest id + 1);
    /// by default 16 per edge plus 2^20, so that sparse ids are noticed.
    #[arg(long)]
    max_vertices: Option<usize>,
    /// The dynamic cache (dpu-dynamic): on, off, or while it pays.
    #[arg(long, value_enum, default_value = "auto")]
    cache_mode: CacheModeChoice,
    /// The dynamic cache's size as a share of the edge bytes.
    #[arg(long, default_value_t = 0.05)]
    cache_fraction: f64,
    /// Chunks per dynamic cache entry (the paper: 1 MiB entries of 64 KiB
    /// chunks, 16); by default enough entries to hold several streams.
    #[arg(long)]
    cache_entry_chunks: Option<usize>,
    /// Cache entries fetched ahead of each requested one.
    #[arg(long, default_value_t = 1)]
    prefetch_depth: u64,
    /// Also run on local memory and check that the results agree.
    #[arg(long)]
    check: bool,
    /// Write one "vertex value" line per vertex here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write the run's figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum SodaCliError {
    #[error(transparent)]
    Generate(#[from] remora_graph::generate::GenerateError),
    #[error(transparent)]
    Load(#[from] remora_graph::load::LoadError),
    #[error(transparent)]
    Soda(#[from] remora_soda::SodaError),
    #[error("--buffer-fraction must be in (0, 1], --threads and --fault-threads from 1 to {MAX_THREADS}, and --chunk-kib a power of two from {MIN_CHUNK_KIB} to {MAX_CHUNK_KIB}")]
    Options,
    #[error("the graph has no vertices")]
    EmptyGraph,
    #[error("source {source_vertex} is not a vertex of a {vertex_count}-vertex graph")]
    Source {
        source_vertex: Vertex,
        vertex_count: usize,
    },
    #[error("{backend} disagrees with local memory: {mismatch}")]
    Mismatch {
        backend: &'static str,
        mismatch: remora_graph::apps::ResultMismatch,
    },
    #[error("{path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("work directory: {0}")]
    WorkDirectory(std::io::Error),
    #[error("the graph needs {needed_bytes} B of far memory, more than the memory node's {memory_bytes} B")]
    MemoryTooSmall {
        needed_bytes: u64,
        memory_bytes: u64,
    },
    #[error(transparent)]
    Output(#[from] crate::output::OutputError),
}

pub fn run(command: SodaCommand) -> Result<ExitCode, SodaCliError> {
    match command {
        SodaCommand::Run(args) => run_app(args),
    }
}

/// `kron:SCALE[:DEGREE]`, `uniform:SCALE[:DEGREE]` or a file.
pub fn graph_from(spec: &str, seed: u64, options: LoadOptions) -> Result<Graph, SodaCliError> {
    match GeneratorSpec::parse(spec, seed) {
        Some(generator) => Ok(generate(generator?)?),
        None => Ok(load(std::path::Path::new(spec), options)?),
    }
}

/// The source BFS and BC start from: `requested`, or the first vertex
/// with an out-edge (a source whose search goes somewhere), which must be
/// a vertex of `graph`.
pub fn source_of(graph: &Graph, requested: Option<Vertex>) -> Result<Vertex, SodaCliError> {
    if graph.vertex_count() == 0 {
        return Err(SodaCliError::EmptyGraph);
    }
    let source = requested.unwrap_or_else(|| graph.first_vertex_with_out_edges().unwrap_or(0));
    if source as usize >= graph.vertex_count() {
        return Err(SodaCliError::Source {
            source_vertex: source,
            vertex_count: graph.vertex_count(),
        });
    }
    Ok(source)
}

fn run_app(args: RunArgs) -> Result<ExitCode, SodaCliError> {
    // Nothing here stops cleanly: an interrupt ends the run at once.
    crate::interrupt::exit_at_first_interrupt();
    for path in [&args.out, &args.json] {
        crate::output::check_optional_file_path(path.as_deref())?;
    }
    let threads = 1..=MAX_THREADS;
    let options_valid = args.buffer_fraction > 0.0
        && args.buffer_fraction <= 1.0
        && threads.contains(&args.threads)
        && threads.contains(&args.fault_threads)
        && is_chunk_kib(args.chunk_kib);
    if !options_valid {
        return Err(SodaCliError::Options);
    }
    let started = Instant::now();
    let load = LoadOptions {
        symmetrize: args.symmetrize,
        max_vertex_count: args.max_vertices,
    };
    let graph = graph_from(&args.graph, args.seed, load)?;
    let source = source_of(&graph, args.source)?;
    println!(
        "graph: {} vertices, {} edges, {:.1} MiB, ready in {:.2} s",
        graph.vertex_count(),
        graph.edge_count(),
        footprint_bytes(&graph) as f64 / (1 << 20) as f64,
        started.elapsed().as_secs_f64()
    );
    let work = crate::interrupt::remove_on_interrupt(
        tempfile::tempdir().map_err(SodaCliError::WorkDirectory)?,
    );
    let options = RunOptions {
        threads: args.threads,
        fault_threads: args.fault_threads,
        buffer_fraction: args.buffer_fraction,
        chunk_bytes: args.chunk_kib << 10,
        work_directory: work.path().to_owned(),
        source,
        seed: args.seed,
        links: Default::default(),
        hosts: None,
        cache: CacheOptions {
            edge_fraction: args.cache_fraction,
            prefetch_depth: args.prefetch_depth,
            mode: args.cache_mode.into(),
            chunks_per_entry: args.cache_entry_chunks,
        },
    };
    let run = run_on(args.backend.into(), args.app, &graph, &options)?;
    print_run(&run);
    if args.check && run.backend != Backend::Local {
        let local = check_against_local(&run, &graph, &options)?;
        println!(
            "check: {} agrees with local memory ({:.3} s there)",
            run.backend.name(),
            local.seconds
        );
    }
    if let Some(path) = &args.out {
        run.result
            .write_vertex_values(path)
            .map_err(|source| SodaCliError::Write {
                path: path.clone(),
                source,
            })?;
    }
    if let Some(path) = &args.json {
        crate::output::write_json(path, &run_json(&run))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `run`'s application on all-local memory and compares; returns
/// the local run, or the mismatch as [`SodaCliError::Mismatch`].
pub fn check_against_local(
    run: &BackendRun,
    graph: &Graph,
    options: &RunOptions,
) -> Result<BackendRun, SodaCliError> {
    let local = run_on(Backend::Local, run.app, graph, options)?;
    run.result
        .compare(&local.result)
        .map_err(|mismatch| SodaCliError::Mismatch {
            backend: run.backend.name(),
            mismatch,
        })?;
    Ok(local)
}

pub fn print_run(run: &BackendRun) {
    println!(
        "{} on {}: {:.3} s; {}",
        run.app.name(),
        run.backend.name(),
        run.seconds,
        run.result.summary()
    );
    if let Some(far) = &run.far {
        println!(
            "far memory: buffer {:.1} MiB, {} faults ({} write), {:.1} MiB fetched, {:.1} MiB written back, {} evictions, fault p50 {:.1} µs p99 {:.1} µs, handler CPU {:.3} s, evictor CPU {:.3} s",
            run.buffer_bytes as f64 / (1 << 20) as f64,
            far.missing_faults,
            far.write_faults,
            far.fetched_bytes as f64 / (1 << 20) as f64,
            far.written_back_bytes as f64 / (1 << 20) as f64,
            far.evictions,
            far.fault_p50_nanos as f64 / 1e3,
            far.fault_p99_nanos as f64 / 1e3,
            far.handler_cpu_nanos as f64 / 1e9,
            far.evictor_cpu_nanos as f64 / 1e9,
        );
    }
    if let Some(rack) = &run.rack {
        println!(
            "rack: memory link {:.1} MiB on demand, {:.1} MiB background; fabric thread (emulated NICs, switch, DPU agents) CPU {:.3} s",
            rack.memory_on_demand_bytes() as f64 / (1 << 20) as f64,
            rack.memory_background_bytes() as f64 / (1 << 20) as f64,
            rack.emulation_cpu_seconds,
        );
        if let Some((counters, busy_seconds)) = rack.dpu {
            println!(
                "DPU: {} reads, {} writes forwarded, agents busy {busy_seconds:.3} s, dynamic hit rate {}",
                counters.read_requests,
                counters.write_requests,
                rack.hit_rate().map_or("-".into(), |rate| format!("{:.1}%", rate * 100.0)),
            );
        }
        if let Some((net, intra)) = rack.bandwidths {
            println!(
                "links: B_net {:.2} GB/s, B_intra {:.2} GB/s, caching pays above a hit rate of {:.2} (Eq. 3)",
                net / 1e9,
                intra / 1e9,
                net / intra
            );
        }
    }
}

pub fn run_json(run: &BackendRun) -> serde_json::Value {
    let far = run.far.as_ref().map(|far| {
        serde_json::json!({
            "missing_faults": far.missing_faults,
            "write_faults": far.write_faults,
            "fetched_bytes": far.fetched_bytes,
            "written_back_bytes": far.written_back_bytes,
            "evictions": far.evictions,
            "fault_p50_ns": far.fault_p50_nanos,
            "fault_p99_ns": far.fault_p99_nanos,
            "handler_cpu_ns": far.handler_cpu_nanos,
            "evictor_cpu_ns": far.evictor_cpu_nanos,
        })
    });
    serde_json::json!({
        "app": run.app.name(),
        "backend": run.backend.name(),
        "seconds": run.seconds,
        "summary": run.result.summary(),
        "buffer_bytes": run.buffer_bytes,
        "rack": run.rack.as_ref().map(rack_json),
        "far_memory": far,
    })
}

pub fn rack_json(rack: &RackReport) -> serde_json::Value {
    serde_json::json!({
        "emulation_cpu_seconds": rack.emulation_cpu_seconds,
        "memory_on_demand_bytes": rack.memory_on_demand_bytes(),
        "memory_background_bytes": rack.memory_background_bytes(),
        "intra_bytes": rack.traffic.dpu_read_bytes + rack.traffic.dpu_written_bytes,
        "dpu_busy_seconds": rack.dpu.map(|(_, busy)| busy),
        "dynamic_hit_rate": rack.hit_rate(),
        "dynamic_disabled": rack.dpu.map(|(counters, _)| counters.dynamic_disabled),
        "b_net_bytes_per_second": rack.bandwidths.map(|(net, _)| net),
        "b_intra_bytes_per_second": rack.bandwidths.map(|(_, intra)| intra),
    })
}
