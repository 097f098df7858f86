//! SODA in the command line: its `[soda]` section, the demo's step and
//! `bench soda`.

use super::system::{System, SystemStep};
use crate::bench::entry::Benchmark;
use crate::error::{InSystem, SystemError};
use crate::soda::{check_against_local, graph_from, print_run, run_json, source_of, SodaCliError};
use crate::HistoryFile;
use remora_rack::RackConfig;
use remora_soda::backend::{run_on, Backend, RunOptions};
use remora_soda::config::SodaSection;

pub struct Soda;

impl System for Soda {
    fn name(&self) -> &'static str {
        "soda"
    }

    fn title(&self) -> &'static str {
        "SODA"
    }

    fn check_section(&self, rack: &RackConfig) -> Result<(), SystemError> {
        SodaSection::from_rack(rack)
            .map(|_| ())
            .in_system(self.name())
    }

    fn rack_up(&self, rack: &RackConfig, failures: &mut Vec<String>) -> Option<serde_json::Value> {
        run_section(rack, failures)
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
    let mut step = SystemStep {
        variants: Vec::new(),
        failures: Vec::new(),
    };
    let graph = graph_from("kron:14:8", 1, Default::default()).in_system("soda")?;
    println!(
        "\nSODA: BFS on a Kronecker graph ({} vertices, {} edges) in far memory, host buffer a third of it:",
        graph.vertex_count(),
        graph.edge_count()
    );
    // On the interrupt module's list, so a second Ctrl-C (which exits at
    // once) removes it too.
    let work = crate::interrupt::remove_on_interrupt(
        tempfile::tempdir()
            .map_err(SodaCliError::WorkDirectory)
            .in_system("soda")?,
    );
    let options = RunOptions {
        chunk_bytes: 16 << 10,
        ..RunOptions::new(
            work.path().to_owned(),
            source_of(&graph, None).in_system("soda")?,
        )
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

/// The rack file's `[soda]` section on the embedded rack: its application
/// on its graph through its backend, on the rack's compute and memory
/// nodes and the DPU beside the compute node, over the links the file
/// sets; the result compared with all-local memory if the section asks.
/// Failures join the rack's.
fn run_section(rack: &RackConfig, failures: &mut Vec<String>) -> Option<serde_json::Value> {
    let (section, hosts) = match SodaSection::from_rack(rack) {
        Ok(Some(found)) => found,
        Ok(None) => return None,
        Err(error) => {
            failures.push(error.to_string());
            return Some(serde_json::json!({ "error": error.to_string() }));
        }
    };
    println!(
        "soda: {} on {} through {}",
        section.app.name(),
        section.graph,
        section.backend.name()
    );
    match run_checked(&section, hosts) {
        Ok(report) => Some(report),
        Err(error) => {
            failures.push(format!("soda: {error}"));
            Some(serde_json::json!({ "error": error.to_string() }))
        }
    }
}

/// Runs the section's application; a result that disagrees with local
/// memory is [`SodaCliError::Mismatch`].
fn run_checked(
    section: &SodaSection,
    hosts: remora_rack::topology::Topology,
) -> Result<serde_json::Value, SodaCliError> {
    let graph = graph_from(&section.graph, section.seed, Default::default())?;
    let memory_bytes = hosts.host(1).memory_bytes;
    let needed_bytes = remora_soda::backend::footprint_bytes(&graph);
    if needed_bytes > memory_bytes {
        return Err(SodaCliError::MemoryTooSmall {
            needed_bytes,
            memory_bytes,
        });
    }
    let work = crate::interrupt::remove_on_interrupt(
        tempfile::tempdir().map_err(SodaCliError::WorkDirectory)?,
    );
    let options = RunOptions {
        threads: section.threads,
        fault_threads: section.fault_threads,
        buffer_fraction: section.buffer_fraction,
        chunk_bytes: section.chunk_bytes,
        seed: section.seed,
        hosts: Some(hosts),
        ..RunOptions::new(work.path().to_owned(), source_of(&graph, None)?)
    };
    let run = run_on(section.backend, section.app, &graph, &options)?;
    print!("  ");
    print_run(&run);
    let mut report = run_json(&run);
    if section.check {
        check_against_local(&run, &graph, &options)?;
        println!("  {} agrees with local memory", run.backend.name());
        report["checked_against_local"] = serde_json::Value::Bool(true);
    }
    Ok(report)
}
