//! `remora soda`: run one graph application on one backend.

use clap::{Args, Subcommand, ValueEnum};
use remora_graph::apps::App;
use remora_graph::generate::{generate, GeneratorSpec, GraphKind};
use remora_graph::load::{load, LoadOptions};
use remora_graph::{Graph, Vertex};
use remora_soda::backend::{footprint_bytes, run_on, Backend, BackendRun, RunOptions};
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
enum BackendChoice {
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
    /// Through the DPU with aggregation and asynchronous forwarding.
    DpuOpt,
}

impl From<BackendChoice> for Backend {
    fn from(choice: BackendChoice) -> Backend {
        match choice {
            BackendChoice::Local => Backend::Local,
            BackendChoice::InProcess => Backend::InProcess,
            BackendChoice::File => Backend::File,
            BackendChoice::Memserver => Backend::MemServer,
            BackendChoice::DpuBase => Backend::DpuBase,
            BackendChoice::DpuOpt => Backend::DpuOptimized,
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
    #[error("graph {0:?}: expected a file or kron:SCALE[:DEGREE] / uniform:SCALE[:DEGREE]")]
    GraphSpec(String),
    #[error(transparent)]
    Generate(#[from] remora_graph::generate::GenerateError),
    #[error(transparent)]
    Load(#[from] remora_graph::load::LoadError),
    #[error(transparent)]
    Soda(#[from] remora_soda::SodaError),
    #[error("--buffer-fraction must be in (0, 1], --threads and --chunk-kib at least 1")]
    Options,
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
}

pub fn run(command: SodaCommand) -> Result<ExitCode, String> {
    match command {
        SodaCommand::Run(args) => run_app(args).map_err(|error| error.to_string()),
    }
}

/// `kron:SCALE[:DEGREE]`, `uniform:SCALE[:DEGREE]` or a file.
pub fn graph_from(spec: &str, seed: u64, symmetrize: bool) -> Result<Graph, SodaCliError> {
    let generated = |kind: GraphKind, rest: &str| -> Result<Graph, SodaCliError> {
        let mut parts = rest.split(':');
        let number = |text: Option<&str>, default: u32| match text {
            None => Ok(default),
            Some(text) => text
                .parse()
                .map_err(|_| SodaCliError::GraphSpec(spec.into())),
        };
        let scale = number(parts.next(), 0)?;
        let degree = number(parts.next(), 16)?;
        Ok(generate(GeneratorSpec {
            kind,
            scale,
            degree,
            seed,
        })?)
    };
    if let Some(rest) = spec.strip_prefix("kron:") {
        return generated(GraphKind::Kronecker, rest);
    }
    if let Some(rest) = spec.strip_prefix("uniform:") {
        return generated(GraphKind::Uniform, rest);
    }
    Ok(load(
        std::path::Path::new(spec),
        LoadOptions { symmetrize },
    )?)
}

/// The first vertex with an out-edge: a source whose search goes somewhere.
pub fn default_source(graph: &Graph) -> Vertex {
    (0..graph.vertex_count() as Vertex)
        .find(|&vertex| graph.out_degree(vertex) > 0)
        .unwrap_or(0)
}

fn run_app(args: RunArgs) -> Result<ExitCode, SodaCliError> {
    let options_valid = args.buffer_fraction > 0.0
        && args.buffer_fraction <= 1.0
        && args.threads >= 1
        && args.chunk_kib >= 1;
    if !options_valid {
        return Err(SodaCliError::Options);
    }
    let started = Instant::now();
    let graph = graph_from(&args.graph, args.seed, args.symmetrize)?;
    let source = args.source.unwrap_or_else(|| default_source(&graph));
    if source as usize >= graph.vertex_count() {
        return Err(SodaCliError::Source {
            source_vertex: source,
            vertex_count: graph.vertex_count(),
        });
    }
    println!(
        "graph: {} vertices, {} edges, {:.1} MiB, ready in {:.2} s",
        graph.vertex_count(),
        graph.edge_count(),
        footprint_bytes(&graph) as f64 / (1 << 20) as f64,
        started.elapsed().as_secs_f64()
    );
    let work = tempfile::tempdir().map_err(SodaCliError::WorkDirectory)?;
    let options = RunOptions {
        threads: args.threads,
        fault_threads: args.fault_threads,
        buffer_fraction: args.buffer_fraction,
        chunk_bytes: args.chunk_kib << 10,
        work_directory: work.path().to_owned(),
        source,
        seed: args.seed,
        links: Default::default(),
    };
    let run = run_on(args.backend.into(), args.app, &graph, &options)?;
    print_run(&run);
    if args.check && run.backend != Backend::Local {
        let local = run_on(Backend::Local, args.app, &graph, &options)?;
        run.result
            .compare(&local.result)
            .map_err(|mismatch| SodaCliError::Mismatch {
                backend: run.backend.name(),
                mismatch,
            })?;
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
        crate::write_json(path, &run_json(&run)).map_err(|message| SodaCliError::Write {
            path: path.clone(),
            source: std::io::Error::other(message),
        })?;
    }
    Ok(ExitCode::SUCCESS)
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
    if let Some(seconds) = run.emulation_cpu_seconds {
        println!("rack: fabric thread (emulated NICs and switch) CPU {seconds:.3} s");
    }
}

fn run_json(run: &BackendRun) -> serde_json::Value {
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
        "emulation_cpu_seconds": run.emulation_cpu_seconds,
        "far_memory": far,
    })
}
