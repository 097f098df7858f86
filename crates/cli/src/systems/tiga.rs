//! TIGA in the command line: the demo's step and `bench tiga`.

use super::system::refuse_section;
use super::system::{System, SystemStep};
use crate::bench::entry::Benchmark;
use crate::error::{InSystem, SystemError};
use crate::HistoryFile;
use remora_rack::RackConfig;

pub struct Tiga;

impl System for Tiga {
    fn name(&self) -> &'static str {
        "tiga"
    }

    fn title(&self) -> &'static str {
        "TIGA"
    }

    fn check_section(&self, rack: &RackConfig) -> Result<(), SystemError> {
        refuse_section(
            rack,
            self.name(),
            "TIGA's virtual hardware is set with `remora bench tiga --config FILE` (see examples/tiga.toml)",
        )
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
    use remora_tiga::rack::{build_data, Mode, NdpRack, ServedBy};
    let mut step = SystemStep {
        variants: Vec::new(),
        failures: Vec::new(),
    };
    println!("\nTIGA's near-data processing on the embedded rack (a compute node, a data node's SmartNIC):");
    const RECORDS: u64 = 64;
    const SEED: u64 = 3;
    let (memory, locations) = build_data(SEED, RECORDS, 1024).in_system("tiga")?;
    let rack = NdpRack::start(memory, &App::ALL, 8).in_system("tiga")?;
    let (mut on_nic, mut forwarded, mut matched) = (0u64, 0u64, 0u64);
    for location in locations.iter().filter(|location| location.app == App::Mvs) {
        let payload = App::Mvs
            .make_payload(SEED, location.id, 1024)
            .in_system("tiga")?;
        let expected = App::Mvs.run_on_cpu(&payload);
        match rack.call(App::Mvs, location.address, location.length, Mode::Ndp) {
            Ok(completion) => {
                match completion.served_by {
                    ServedBy::SmartNic => on_nic += 1,
                    _ => forwarded += 1,
                }
                if Ok(&completion.result) == expected.as_ref() {
                    matched += 1;
                } else {
                    step.failures.push(format!(
                        "TIGA: MVS record {} differs from the CN version",
                        location.id
                    ));
                }
            }
            Err(error) => step
                .failures
                .push(format!("TIGA: MVS record {}: {error}", location.id)),
        }
    }
    let (counters, unacknowledged) = rack.settled_counters(std::time::Duration::from_secs(5));
    if unacknowledged > 0 || counters.forwarded != counters.acknowledged {
        step.failures.push(format!(
            "TIGA: {unacknowledged} forwarded requests never acknowledged"
        ));
    }
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
