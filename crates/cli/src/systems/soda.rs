//! SODA in the command line: the demo's step and `bench soda`.

use super::system::refuse_section;
use super::system::{System, SystemStep};
use crate::bench::entry::Benchmark;
use crate::error::{InSystem, SystemError};
use crate::HistoryFile;
use remora_rack::RackConfig;

pub struct Soda;

impl System for Soda {
    fn name(&self) -> &'static str {
        "soda"
    }

    fn title(&self) -> &'static str {
        "SODA"
    }

    fn check_section(&self, rack: &RackConfig) -> Result<(), SystemError> {
        refuse_section(
            rack,
            self.name(),
            "SODA runs through `remora soda run` and `remora bench soda`",
        )
    }

    fn demo_step(&self, _history: Option<&mut HistoryFile>) -> Result<SystemStep, SystemError> {
        soda_step()
    }

    fn benchmark(&self) -> Option<&'static dyn Benchmark> {
        Some(&crate::bench::soda::BENCH)
    }
}

/// SODA: BFS on a small Kronecker graph whose arrays live in far-memory
/// objects (userfaultfd, a host buffer of a third of the graph), checked
/// against all-local memory.
pub fn soda_step() -> Result<SystemStep, SystemError> {
    use remora_graph::apps::App;
    use remora_soda::backend::{run_on, Backend, RunOptions};
    let mut step = SystemStep {
        variants: Vec::new(),
        failures: Vec::new(),
    };
    let graph = crate::soda::graph_from("kron:14:8", 1, Default::default()).in_system("soda")?;
    println!(
        "\nSODA: BFS on a Kronecker graph ({} vertices, {} edges) in far memory, host buffer a third of it:",
        graph.vertex_count(),
        graph.edge_count()
    );
    let work = tempfile::tempdir()
        .map_err(crate::soda::SodaCliError::WorkDirectory)
        .in_system("soda")?;
    let options = RunOptions {
        chunk_bytes: 16 << 10,
        ..RunOptions::new(work.path().to_owned(), crate::soda::default_source(&graph))
    };
    let run = |backend| run_on(backend, App::Bfs, &graph, &options).in_system("soda");
    let local = run(Backend::Local)?;
    for backend in [
        Backend::InProcess,
        Backend::File,
        Backend::MemServer,
        Backend::Dpu(remora_soda::backend::DpuVariant::Static),
    ] {
        let far = run(backend)?;
        let agrees = far.result.compare(&local.result);
        let stats = far.far.clone().unwrap_or_default();
        println!(
            "  {:<10} {:.3} s, {} faults, {} evictions, depths equal to local memory: {}",
            backend.name(),
            far.seconds,
            stats.missing_faults,
            stats.evictions,
            if agrees.is_ok() { "yes" } else { "NO" }
        );
        if let Err(mismatch) = agrees {
            step.failures
                .push(format!("SODA BFS on {}: {mismatch}", backend.name()));
        }
        step.variants.push(serde_json::json!({
            "variant": format!("bfs, {}", backend.name()),
            "seconds": far.seconds,
            "faults": stats.missing_faults,
            "evictions": stats.evictions,
        }));
    }
    Ok(step)
}
