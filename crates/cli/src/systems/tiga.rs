//! TIGA in the command line: the demo's step and `bench tiga`.

use super::system::{System, SystemStep};
use crate::bench::entry::Benchmark;
use crate::error::{InSystem, SystemError};
use crate::HistoryFile;
use remora_rack::RackConfig;
use remora_tiga::config::TigaSection;

pub struct Tiga;

impl System for Tiga {
    fn name(&self) -> &'static str {
        "tiga"
    }

    fn title(&self) -> &'static str {
        "TIGA"
    }

    fn check_section(&self, rack: &RackConfig) -> Result<(), SystemError> {
        TigaSection::from_rack(rack)
            .map(|_| ())
            .in_system(self.name())
    }

    fn rack_up(&self, rack: &RackConfig, failures: &mut Vec<String>) -> Option<serde_json::Value> {
        run_section(rack, failures)
    }

    fn demo_step(&self, _history: Option<&mut HistoryFile>) -> Result<SystemStep, SystemError> {
        tiga_step()
    }

    fn benchmark(&self) -> Option<&'static dyn Benchmark> {
        Some(&crate::bench::tiga::BENCH)
    }
}

/// TIGA: MVS through the SmartNIC's NDP engine on the embedded rack,
/// checked against the CN version, and one short virtual-time run of the
/// allocator on calibrated costs.
pub fn tiga_step() -> Result<SystemStep, SystemError> {
    use remora_tiga::apps::App;
    use remora_tiga::rack::{build_data, Mode, NdpRack};
    let mut step = SystemStep {
        variants: Vec::new(),
        failures: Vec::new(),
    };
    println!("\nTIGA's near-data processing on the embedded rack (a compute node, a data node's SmartNIC):");
    const RECORDS: u64 = 64;
    const SEED: u64 = 3;
    let (memory, locations) = build_data(SEED, &App::ALL, RECORDS, 1024).in_system("tiga")?;
    let rack = NdpRack::start(memory, &App::ALL, 8).in_system("tiga")?;
    let check = rack.check_records(App::Mvs, Mode::Ndp, &locations, SEED, 1024);
    step.failures.extend(check.failures);
    let (matched, on_nic, forwarded) = (check.matched, check.on_smartnic, check.forwarded);
    let (_, unacknowledged) = settled(&rack);
    step.failures.extend(unacknowledged);
    println!(
        "  {matched} of {RECORDS} MVS queries match the CN version: {on_nic} ran on the SmartNIC (CRC check, serialisation), {forwarded} were forwarded to the CN and acknowledged"
    );
    step.variants.push(serde_json::json!({
        "variant": "ndp on the rack", "queries": RECORDS, "matched": matched, "on_smartnic": on_nic, "forwarded": forwarded,
    }));
    allocation_run(&mut step)?;
    Ok(step)
}

/// Half a virtual second of MVS at 1.3 times the SoC's capacity: TIGA's
/// allocator against the even split, on costs calibrated here.
fn allocation_run(step: &mut SystemStep) -> Result<(), SystemError> {
    use remora_tiga::apps::App;
    use remora_tiga::calibration::{soc_stage_costs_ns, Calibration};
    use remora_tiga::config::SocConfig;
    use remora_tiga::simulation::{run, PayloadSchedule, Scheme, Workload};
    let calibration = Calibration::measure(5).in_system("tiga")?;
    let config = SocConfig::default();
    let per_request_ns: f64 = soc_stage_costs_ns(&calibration, App::Mvs, config.slowdown)
        .iter()
        .sum();
    let workload = Workload {
        apps: vec![App::Mvs],
        offered_per_second: 1.3 * config.soc_cores as f64 * 1e9 / per_request_ns,
        payload: PayloadSchedule::Fixed(1024),
        duration_ns: 500_000_000,
        measure_from_ns: 250_000_000,
        host_cpu_for_ipipe: false,
        seed: 1,
    };
    let tiga = run(Scheme::TigaWithoutCpu, &workload, &config, &calibration).in_system("tiga")?;
    let fair = run(Scheme::FairNic, &workload, &config, &calibration).in_system("tiga")?;
    let ratio = tiga.throughput_per_second / fair.throughput_per_second;
    println!(
        "  virtual time, 8 SoC cores at 1/{:.1} of this core: TIGA moved the split from {:?} to {:?} and serves {:.2} M/s, {ratio:.2}x FairNIC's even split",
        config.slowdown,
        fair.final_allocation,
        tiga.final_allocation,
        tiga.throughput_per_second / 1e6
    );
    if tiga.final_allocation == fair.final_allocation {
        step.failures
            .push("TIGA: the allocator never left the even split under overload".into());
    }
    step.variants.push(serde_json::json!({
        "variant": "virtual-time allocation", "allocation": tiga.final_allocation, "tiga_over_fairnic": ratio,
    }));
    Ok(())
}

/// The rack file's `[tiga]` section on the embedded rack: every record of
/// its applications called through the memory node's SmartNIC (and
/// CPU-only if asked) from the compute node, each result checked against
/// the CN version, and every forwarded request acknowledged. Failures
/// join the rack's.
fn run_section(rack: &RackConfig, failures: &mut Vec<String>) -> Option<serde_json::Value> {
    use remora_tiga::rack::{build_data, Mode, NdpRack};
    let (section, hosts) = match TigaSection::from_rack(rack) {
        Ok(Some(found)) => found,
        Ok(None) => return None,
        Err(error) => {
            failures.push(error.to_string());
            return Some(serde_json::json!({ "error": error.to_string() }));
        }
    };
    let started = build_data(
        section.seed,
        &section.apps,
        section.records,
        section.record_bytes,
    )
    .map_err(|error| error.to_string())
    .and_then(|(memory, locations)| {
        NdpRack::start_on(&hosts, memory, &section.apps, section.forward_every)
            .map(|rack| (rack, locations))
            .map_err(|error| error.to_string())
    });
    let (ndp, locations) = match started {
        Ok(started) => started,
        Err(error) => {
            failures.push(format!("tiga: {error}"));
            return Some(serde_json::json!({ "error": error }));
        }
    };
    let modes: &[Mode] = match section.cpu_only {
        true => &[Mode::Ndp, Mode::CpuOnly],
        false => &[Mode::Ndp],
    };
    let mut runs = Vec::new();
    for &app in &section.apps {
        for &mode in modes {
            let check =
                ndp.check_records(app, mode, &locations, section.seed, section.record_bytes);
            println!(
                "tiga: {} {mode:?}: {} of {} results equal the CN version ({} on the SmartNIC, {} forwarded, {} CPU-only)",
                app.name(),
                check.matched,
                check.calls,
                check.on_smartnic,
                check.forwarded,
                check.cpu_only
            );
            runs.push(serde_json::json!({
                "app": app.name(), "mode": format!("{mode:?}"), "calls": check.calls,
                "matched": check.matched, "on_smartnic": check.on_smartnic,
                "forwarded": check.forwarded, "cpu_only": check.cpu_only,
            }));
            failures.extend(check.failures);
        }
    }
    let (counters, unacknowledged) = settled(&ndp);
    failures.extend(unacknowledged);
    // The NIC and switch emulation apart from the compute node's
    // application work and the SmartNIC's engine.
    let cpu = match ndp.stop() {
        Ok(cpu) => {
            println!(
                "tiga: CPU: NIC emulation {:.3} s, compute node's client {:.3} s, SmartNIC engine {:.3} s",
                cpu.nic_emulation.as_secs_f64(),
                cpu.client.as_secs_f64(),
                cpu.engine.as_secs_f64()
            );
            serde_json::json!({
                "nic_emulation_seconds": cpu.nic_emulation.as_secs_f64(),
                "client_seconds": cpu.client.as_secs_f64(),
                "engine_seconds": cpu.engine.as_secs_f64(),
            })
        }
        Err(error) => {
            failures.push(format!("tiga: stopping the rack: {error}"));
            serde_json::Value::Null
        }
    };
    Some(serde_json::json!({
        "runs": runs,
        "forwarded": counters.forwarded,
        "acknowledged": counters.acknowledged,
        "forwards_resent": counters.forwards_resent,
        "asked_again": counters.asked_again,
        "acknowledged_again": counters.acknowledged_again,
        "cpu": cpu,
    }))
}

/// The engine's counters once every forwarded request was acknowledged
/// (or 5 s passed), and a failure if one never was.
fn settled(
    rack: &remora_tiga::rack::NdpRack,
) -> (remora_tiga::rack::EngineCounters, Option<String>) {
    let (counters, unacknowledged) = rack.settled_counters(std::time::Duration::from_secs(5));
    let failure = (unacknowledged > 0 || counters.forwarded != counters.acknowledged).then(|| {
        format!(
            "TIGA: {} forwarded requests, {} acknowledged ({unacknowledged} still waiting; the engine gave up on the rest)",
            counters.forwarded, counters.acknowledged
        )
    });
    (counters, failure)
}
