//! `remora bench tiga`: TIGA's figures in virtual time, on virtual SoC and
//! CN cores charged the calibrated cost of the real stage code.
//!
//! - Fig. 2: a time-shared SoC's compute time against its context-switch
//!   time, per request.
//! - Fig. 3: time-sharing (Floem FCFS) against a uniform partition
//!   (FairNIC).
//! - Fig. 5: detection and reallocation overhead against the detection
//!   period, for two intervals between payload-size changes.
//! - Fig. 6: each scheme's maximum sustainable throughput with the
//!   SmartNIC alone (offered above every scheme's capacity, completions
//!   counted once allocation has settled), each app alone (the targets)
//!   and the three together.
//! - Fig. 7: 10 M requests/s offered: TIGA, TIGA without CPU, CPU-only,
//!   and iPipe with the DN's host CPU.
//! - Fig. 8: the CN's CPU against throughput, TIGA and CPU-only.
//! - The allocation and forwarding ratio over a payload-size shift.

use super::report::{measured_ratio, minimum_keeping_unmeasured, size_label, Report};
use indicatif::{ProgressBar, ProgressStyle};
use remora_tiga::apps::{App, DEFAULT_PAYLOAD_BYTES};
use remora_tiga::calibration::{soc_stage_costs_ns, Calibration, CostCurve};
use remora_tiga::config::{ConfigError, SocConfig};
use remora_tiga::simulation::{self, PayloadSchedule, RunReport, Scheme, Workload};
use std::path::Path;

const SECOND_NS: u64 = 1_000_000_000;
/// Fig. 7's offered load (§5.3).
const OVERLOAD_PER_SECOND: f64 = 10e6;
/// The payload after a shift: four times the work per request, more of it
/// per byte, so the best split moves and the SoC is overloaded.
const SHIFTED_PAYLOAD_BYTES: usize = 4096;
/// Saturation runs offer this much more than the best split could serve.
const SATURATION_FACTOR: f64 = 1.3;
/// Fig. 6's schemes, SmartNIC alone.
const FIG6_SCHEMES: [Scheme; 5] = [
    Scheme::TigaWithoutCpu,
    Scheme::FairNic,
    Scheme::FloemFcfs,
    Scheme::FloemDrr,
    Scheme::IPipe,
];

#[derive(Debug, thiserror::Error)]
pub enum TigaBenchError {
    #[error("calibration: {0}")]
    Calibration(#[from] remora_tiga::calibration::CalibrationError),
    #[error("{scheme} on {apps}: {error}")]
    Run {
        scheme: &'static str,
        apps: String,
        error: simulation::RunError,
    },
    #[error("reading {path}: {error}")]
    ConfigFile { path: String, error: String },
    #[error("settings: {0}")]
    Config(#[from] ConfigError),
    #[error("progress bar: {0}")]
    Progress(String),
    #[error("reading the calibration in {path}: {error}")]
    CalibrationFile { path: String, error: String },
    #[error("splitting the SoC cores: {0}")]
    Allocation(#[from] remora_tiga::allocator::AllocationError),
}

/// The calibration of an earlier run, from its `--json` report (under
/// `config.calibration`) or a file holding the calibration alone, so that
/// a run can be replayed exactly: runs are deterministic for a seed and a
/// calibration.
fn load_calibration(path: &Path) -> Result<Calibration, TigaBenchError> {
    let failed = |error: String| TigaBenchError::CalibrationFile {
        path: path.display().to_string(),
        error,
    };
    let text = std::fs::read_to_string(path).map_err(|error| failed(error.to_string()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|error| failed(error.to_string()))?;
    let calibration = match value.pointer("/config/calibration") {
        Some(inner) => inner.clone(),
        None => value,
    };
    let calibration: Calibration =
        serde_json::from_value(calibration).map_err(|error| failed(error.to_string()))?;
    calibration
        .check()
        .map_err(|error| failed(error.to_string()))?;
    Ok(calibration)
}

/// Virtual durations: settling needs detection periods (0.1 s each),
/// co-processing up to three plus nine more.
struct Durations {
    saturation_ns: u64,
    overload_ns: u64,
}

impl Durations {
    fn new(quick: bool) -> Durations {
        if quick {
            Durations {
                saturation_ns: SECOND_NS,
                overload_ns: 5 * SECOND_NS / 2,
            }
        } else {
            Durations {
                saturation_ns: 3 * SECOND_NS,
                overload_ns: 5 * SECOND_NS,
            }
        }
    }
}

struct Bench {
    calibration: Calibration,
    config: SocConfig,
    seed: u64,
    durations: Durations,
    progress: ProgressBar,
    report: Report,
}

fn load_config(path: Option<&Path>) -> Result<SocConfig, TigaBenchError> {
    let Some(path) = path else {
        return Ok(SocConfig::default());
    };
    let failed = |error: String| TigaBenchError::ConfigFile {
        path: path.display().to_string(),
        error,
    };
    let text = std::fs::read_to_string(path).map_err(|error| failed(error.to_string()))?;
    let config: SocConfig = toml::from_str(&text).map_err(|error: toml::de::Error| {
        failed(remora_base::at_position(
            &text,
            error.span(),
            error.message(),
        ))
    })?;
    config.validate()?;
    Ok(config)
}

fn apps_label(apps: &[App]) -> String {
    apps.iter()
        .map(|app| app.name())
        .collect::<Vec<_>>()
        .join("+")
}

impl Bench {
    fn workload(&self, apps: &[App], offered_per_second: f64, duration_ns: u64) -> Workload {
        Workload {
            apps: apps.to_vec(),
            offered_per_second,
            payload: PayloadSchedule::Fixed(DEFAULT_PAYLOAD_BYTES),
            duration_ns,
            measure_from_ns: duration_ns / 2,
            host_cpu_for_ipipe: false,
            seed: self.seed,
        }
    }

    fn simulate(
        &self,
        scheme: Scheme,
        workload: &Workload,
        config: &SocConfig,
    ) -> Result<RunReport, TigaBenchError> {
        let report =
            simulation::run(scheme, workload, config, &self.calibration).map_err(|error| {
                TigaBenchError::Run {
                    scheme: scheme.name(),
                    apps: apps_label(&workload.apps),
                    error,
                }
            })?;
        self.progress.inc(1);
        Ok(report)
    }

    /// Requests per second the SoC serves with the best real-valued split
    /// and no overhead: the fluid bound.
    fn fluid_capacity(&self, apps: &[App], config: &SocConfig) -> f64 {
        let per_request_ns: f64 = apps
            .iter()
            .map(|&app| {
                soc_stage_costs_ns(&self.calibration, app, config.slowdown)
                    .iter()
                    .sum::<f64>()
            })
            .sum::<f64>()
            / apps.len() as f64;
        config.soc_cores as f64 * 1e9 / per_request_ns
    }

    /// The best integer split's throughput over the even split's: the most
    /// any allocator can gain over FairNIC. With several apps, each stage
    /// serves an equal share of the requests, which cancels in the ratio.
    /// The best split is the allocator's own rounding (each core to the
    /// bottleneck), which maximises the slowest stage.
    fn partition_bound(&self, apps: &[App], config: &SocConfig) -> Result<f64, TigaBenchError> {
        let costs: Vec<f64> = apps
            .iter()
            .flat_map(|&app| soc_stage_costs_ns(&self.calibration, app, config.slowdown))
            .collect();
        let throughput = |split: &[usize]| {
            split
                .iter()
                .zip(&costs)
                .map(|(&cores, cost)| cores as f64 / cost)
                .fold(f64::INFINITY, f64::min)
        };
        let split = |capacities: Vec<f64>| {
            remora_tiga::allocator::proportional_allocation(&capacities, config.soc_cores)
        };
        let even = split(vec![1.0; costs.len()])?;
        let best = split(costs.iter().map(|cost| 1.0 / cost).collect())?;
        Ok(throughput(&best) / throughput(&even))
    }

    fn record(&mut self, variant: &str, run: &RunReport) {
        let report = &mut self.report;
        report.add(
            variant,
            "throughput",
            run.throughput_per_second / 1e6,
            "Mrequests/s",
        );
        report.add(
            variant,
            "latency_p50",
            run.latency_p50_ns as f64 / 1e3,
            "us",
        );
        report.add(
            variant,
            "latency_p99",
            run.latency_p99_ns as f64 / 1e3,
            "us",
        );
        report.add(variant, "cn_cpu_cores", run.cn_cores_busy, "cores");
        // iPipe's migrated actors run on the DN host: its own CPU, apart
        // from the CN's and the SoC's.
        report.add(
            variant,
            "dn_host_cpu_cores",
            run.dn_host_cores_busy,
            "cores",
        );
        report.add(variant, "rejected", run.rejected as f64, "requests");
        report.add(
            variant,
            "sampled_checks",
            run.sampled_checks as f64,
            "requests",
        );
    }
}

fn run_checked(
    quick: bool,
    config_path: Option<&Path>,
    calibration_path: Option<&Path>,
    seed: u64,
) -> Result<Report, TigaBenchError> {
    let config = load_config(config_path)?;
    let calibration = match calibration_path {
        Some(path) => {
            println!("replaying the calibration in {}", path.display());
            load_calibration(path)?
        }
        None => {
            println!("calibrating the stages' real code on this machine...");
            Calibration::measure(if quick { 11 } else { 31 })?
        }
    };
    let progress = ProgressBar::new(planned_runs(quick));
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} virtual-time runs {msg}")
            .map_err(|error| TigaBenchError::Progress(error.to_string()))?,
    );
    let report = Report::new(
        "tiga",
        serde_json::json!({
            "quick": quick,
            "seed": seed,
            "soc": config,
            "calibration": calibration,
            "virtual_hardware": "SoC and CN cores are virtual: each stage's real code was timed on this machine (calibration), charged times the slowdown on a SoC core and as measured on a CN core, in virtual time; one request in sample_every runs the real code on both paths and is compared",
            "departures": "the paper's SoC is 8 RISC-V cores at 250 MHz on an FPGA with a hardware RMT dispatcher; here the slowdown is the clock ratio, context switches are this machine's (lmbench lat_ctx method) times the slowdown, a detection is the allocator's real code times the slowdown, a core move is two context switches; the SoC runs portable code (no carry-less multiply for the CRC; SHA-256 portable on every core, as the paper's Xeon Gold 5117 has no SHA extensions) but AES keeps AES-NI, which flatters the SoC; the top-K grid spatial join and SHA-256/AES-128-CTR are Remora's choices",
        }),
    );
    let mut bench = Bench {
        calibration,
        config,
        seed,
        durations: Durations::new(quick),
        progress,
        report,
    };
    check_planned_settings(&bench.config, &bench.calibration, quick)?;
    print_calibration(&bench);
    fig6_and_fig2_fig3(&mut bench)?;
    fig7_and_fig8(&mut bench, quick)?;
    fig5(&mut bench, quick)?;
    payload_shift(&mut bench)?;
    if !quick {
        sweeps(&mut bench)?;
        saving_sweep(&mut bench)?;
    }
    bench.progress.finish_and_clear();
    print_ratios(&bench.report);
    Ok(bench.report)
}

fn planned_runs(quick: bool) -> u64 {
    let fig6 = 4 * (FIG6_SCHEMES.len() as u64 + 5);
    let fig7 = 3 * 4;
    let fig8 = 3 * 2 * if quick { 2 } else { 4 };
    let fig5 = if quick { 2 * 2 } else { 4 * 2 };
    let sweeps = if quick { 0 } else { 3 * 3 * 4 + 3 * 3 };
    fig6 + fig7 + fig8 + fig5 + 1 + sweeps
}

fn print_calibration(bench: &Bench) {
    println!(
        "\ncalibration (this machine, median of {} timed batches; SoC = x{:.1}):",
        bench.calibration.repetitions, bench.config.slowdown
    );
    // Each cost is its medians joined by lines; the figures run at 1 KiB.
    let medians = |curve: &CostCurve| {
        let each: Vec<String> = curve
            .medians_ns
            .iter()
            .map(|(bytes, ns)| format!("{ns:.0} ns at {}", size_label(*bytes as u32)))
            .collect();
        each.join(", ")
    };
    for app in &bench.calibration.apps {
        for stage in &app.stages {
            let portable_ns = stage.portable_cost.at(DEFAULT_PAYLOAD_BYTES as u64);
            println!(
                "  {:<6} {:<15} {}; portable {:>8.0} ns at 1KiB, {:>9.0} ns on a SoC core",
                app.app.name(),
                stage.stage.name(),
                medians(&stage.cost),
                portable_ns,
                portable_ns * bench.config.slowdown
            );
        }
        println!(
            "  {:<6} {:<15} {} on a CN core",
            app.app.name(),
            "cn_version",
            medians(&app.cpu_version),
        );
    }
    let pinned = match bench.calibration.context_switch_pinned {
        Some(true) => "",
        Some(false) => " (unpinned: a wake-up across cores, not a switch)",
        None => " (pinning not recorded)",
    };
    println!(
        "  context switch {:.0} ns here{pinned}, detection {:.0} ns here\n",
        bench.calibration.context_switch_ns, bench.calibration.detection_ns
    );
}

/// Fig. 6's application sets: each app alone, then the three together.
fn fig6_app_sets() -> Vec<Vec<App>> {
    let mut sets: Vec<Vec<App>> = App::ALL.iter().map(|&app| vec![app]).collect();
    sets.push(App::ALL.to_vec());
    sets
}

/// Every setting the benchmark will run with, checked before the first
/// run: settings that passed on their own could still stop the benchmark
/// at Fig. 5 or a sweep (a detection past a shorter period, too few cores
/// for the three apps together), after minutes, with every figure lost.
fn check_planned_settings(
    base: &SocConfig,
    calibration: &Calibration,
    quick: bool,
) -> Result<(), TigaBenchError> {
    let mut planned: Vec<SocConfig> = vec![base.clone()];
    planned.extend(
        fig5_periods_s(quick)
            .iter()
            .map(|&period| fig5_config(base, period)),
    );
    if !quick {
        planned.extend(
            sweep_variants(base, calibration)
                .into_iter()
                .map(|(_, config)| config),
        );
        planned.extend(
            SAVING_SWEEP_SLOWDOWNS
                .iter()
                .map(|&slowdown| saving_sweep_config(base, slowdown)),
        );
    }
    let most_stages = fig6_app_sets()
        .iter()
        .map(|apps| apps.iter().map(|app| app.stages().len()).sum::<usize>())
        .max()
        .unwrap_or(0);
    for config in &planned {
        config.validate()?;
        simulation::check_detection(config, calibration)?;
        // A core for each stage of the three apps together, as the
        // allocator's even split asks.
        remora_tiga::allocator::proportional_allocation(&vec![1.0; most_stages], config.soc_cores)?;
    }
    Ok(())
}

fn fig6_and_fig2_fig3(bench: &mut Bench) -> Result<(), TigaBenchError> {
    let config = bench.config.clone();
    let configurations = fig6_app_sets();
    println!("Fig. 6: maximum sustainable throughput, SmartNIC alone (Mrequests/s)");
    println!(
        "  {:<16} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>12}",
        "apps", "tiga", "fairnic", "floem", "floem_drr", "ipipe", "bound", "tiga/bound"
    );
    for apps in configurations {
        let label = apps_label(&apps);
        let offered = SATURATION_FACTOR * bench.fluid_capacity(&apps, &config);
        let workload = bench.workload(&apps, offered, bench.durations.saturation_ns);
        let mut throughput = Vec::new();
        let mut runs = Vec::new();
        for scheme in FIG6_SCHEMES {
            let run = bench.simulate(scheme, &workload, &config)?;
            bench.record(&format!("fig6/{label}/{}", scheme.name()), &run);
            throughput.push(run.throughput_per_second);
            runs.push(run);
        }
        let bound = bench.partition_bound(&apps, &config)?;
        let tiga_over_fair = throughput[0] / throughput[1];
        bench.progress.suspend(|| {
            println!(
                "  {:<16} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>7} {:>12}",
                label,
                throughput[0] / 1e6,
                throughput[1] / 1e6,
                throughput[2] / 1e6,
                throughput[3] / 1e6,
                throughput[4] / 1e6,
                format!("{bound:.2}"),
                format!("{:.2}", tiga_over_fair / bound),
            );
        });
        bench.report.add(
            &format!("fig6/{label}"),
            "best_split_over_even_bound",
            bound,
            "ratio",
        );
        bench.report.add(
            &format!("fig6/{label}"),
            "tiga_allocation",
            runs[0].final_allocation[0] as f64,
            "cores on stage 1",
        );
        // Floem's better dispatcher is the baseline: FCFS or DRR, whichever
        // served more in this configuration.
        let floem = throughput[2].max(throughput[3]);
        let prefix = if apps.len() == 1 {
            label.as_str()
        } else {
            "together"
        };
        let ratios = &mut bench.report.ratios;
        for (baseline, value) in [
            ("fairnic", throughput[1]),
            ("floem", floem),
            ("ipipe", throughput[4]),
        ] {
            ratios.insert(
                format!("{prefix}_vs_{baseline}"),
                measured_ratio(throughput[0], value).into(),
            );
        }
        fig2_fig3_from(bench, &label, &runs);
        match moderate_load(&throughput) {
            Some(offered) => moderate_latency(bench, &apps, offered, &config)?,
            None => bench.progress.suspend(|| {
                println!("  {label}: a scheme served nothing, so no load is moderate for all: no latency runs")
            }),
        }
    }
    Ok(())
}

/// Half the throughput of the weakest scheme, the load every scheme
/// sustains; `None` when one served nothing (offering 0 was a typed error
/// that stopped the whole bench, every figure lost).
fn moderate_load(throughput: &[f64]) -> Option<f64> {
    let lowest = throughput.iter().copied().fold(f64::INFINITY, f64::min);
    (lowest.is_finite() && lowest > 0.0).then_some(0.5 * lowest)
}

/// p50 and p99 latency of every scheme at half the load the weakest one
/// sustains, so that no queue is full: latency under overload is the
/// queues' depth over the service rate.
fn moderate_latency(
    bench: &mut Bench,
    apps: &[App],
    offered: f64,
    config: &SocConfig,
) -> Result<(), TigaBenchError> {
    let label = apps_label(apps);
    let workload = bench.workload(apps, offered, bench.durations.saturation_ns);
    let mut line = format!("  {label:<16} at {:.3} M/s, p50/p99 us:", offered / 1e6);
    for scheme in [
        Scheme::Tiga,
        Scheme::FairNic,
        Scheme::FloemFcfs,
        Scheme::IPipe,
        Scheme::CpuOnly,
    ] {
        let run = bench.simulate(scheme, &workload, config)?;
        let variant = format!("moderate/{label}/{}", scheme.name());
        bench.report.add(
            &variant,
            "latency_p50",
            run.latency_p50_ns as f64 / 1e3,
            "us",
        );
        bench.report.add(
            &variant,
            "latency_p99",
            run.latency_p99_ns as f64 / 1e3,
            "us",
        );
        bench.report.add(
            &variant,
            "throughput",
            run.throughput_per_second / 1e6,
            "Mrequests/s",
        );
        line.push_str(&format!(
            " {} {:.1}/{:.1}",
            scheme.name(),
            run.latency_p50_ns as f64 / 1e3,
            run.latency_p99_ns as f64 / 1e3
        ));
    }
    bench.progress.suspend(|| println!("{line}"));
    Ok(())
}

/// Figs. 2 and 3 read off the Fig. 6 runs: the time-shared FCFS run's split
/// of busy time, and time-sharing against the uniform partition.
fn fig2_fig3_from(bench: &mut Bench, label: &str, runs: &[RunReport]) {
    let floem = &runs[2];
    let busy = floem.soc_compute_ns + floem.soc_context_switch_ns;
    if busy > 0.0 {
        let share = floem.soc_compute_ns / busy;
        bench.report.add(
            &format!("fig2/{label}"),
            "compute_share_of_busy_time",
            share,
            "ratio",
        );
        let completed =
            floem.throughput_per_second * (bench.durations.saturation_ns / 2) as f64 / 1e9;
        if completed > 0.0 {
            bench.report.add(
                &format!("fig2/{label}"),
                "compute_per_request",
                floem.soc_compute_ns / completed / 1e3,
                "us",
            );
            bench.report.add(
                &format!("fig2/{label}"),
                "context_switch_per_request",
                floem.soc_context_switch_ns / completed / 1e3,
                "us",
            );
        }
    }
    let partition_over_time_sharing = runs[1].throughput_per_second / floem.throughput_per_second;
    bench.report.add(
        &format!("fig3/{label}"),
        "uniform_partition_over_time_sharing",
        partition_over_time_sharing,
        "ratio",
    );
}

fn fig7_and_fig8(bench: &mut Bench, quick: bool) -> Result<(), TigaBenchError> {
    let config = bench.config.clone();
    let duration = bench.durations.overload_ns;
    println!(
        "\nFig. 7: {:.0} M requests/s offered (Mrequests/s served)",
        OVERLOAD_PER_SECOND / 1e6
    );
    println!(
        "  {:<8} {:>9} {:>16} {:>9} {:>14} {:>10}",
        "app", "tiga", "tiga_without_cpu", "cpu_only", "ipipe+host", "tiga/nocpu"
    );
    let mut coprocessing_min = f64::INFINITY;
    let mut saving_min = f64::INFINITY;
    for app in App::ALL {
        let mut workload = bench.workload(&[app], OVERLOAD_PER_SECOND, duration);
        workload.measure_from_ns = duration * 3 / 5;
        let tiga = bench.simulate(Scheme::Tiga, &workload, &config)?;
        let without = bench.simulate(Scheme::TigaWithoutCpu, &workload, &config)?;
        let cpu_only = bench.simulate(Scheme::CpuOnly, &workload, &config)?;
        let ipipe = bench.simulate(
            Scheme::IPipe,
            &Workload {
                host_cpu_for_ipipe: true,
                ..workload.clone()
            },
            &config,
        )?;
        for (scheme, run) in [
            ("tiga", &tiga),
            ("tiga_without_cpu", &without),
            ("cpu_only", &cpu_only),
            ("ipipe_with_host", &ipipe),
        ] {
            bench.record(&format!("fig7/{}/{scheme}", app.name()), run);
        }
        let ratio = measured_ratio(tiga.throughput_per_second, without.throughput_per_second);
        coprocessing_min = minimum_keeping_unmeasured(coprocessing_min, ratio);
        bench.progress.suspend(|| {
            println!(
                "  {:<8} {:>9.3} {:>16.3} {:>9.3} {:>14.3} {:>10.2}",
                app.name(),
                tiga.throughput_per_second / 1e6,
                without.throughput_per_second / 1e6,
                cpu_only.throughput_per_second / 1e6,
                ipipe.throughput_per_second / 1e6,
                ratio
            );
        });
        bench.report.series.insert(
            format!("fig7/{}/tiga_timeline", app.name()),
            serde_json::to_value(&tiga.timeline).unwrap_or_default(),
        );
        let saving = fig8(bench, app, &cpu_only, quick)?;
        saving_min = minimum_keeping_unmeasured(saving_min, saving);
    }
    let ratios = &mut bench.report.ratios;
    ratios.insert(
        "coprocessing_vs_nocpu_overload_min".into(),
        coprocessing_min.into(),
    );
    ratios.insert("cn_cpu_saving_vs_cpu_only_min".into(), saving_min.into());
    Ok(())
}

/// Fig. 8: the CN's busy cores against throughput, TIGA and CPU-only, at
/// fractions of CPU-only's maximum throughput (its throughput under Fig.
/// 7's overload). Returns the saving at that maximum.
fn fig8(
    bench: &mut Bench,
    app: App,
    cpu_only_overload: &RunReport,
    quick: bool,
) -> Result<f64, TigaBenchError> {
    let config = bench.config.clone();
    let maximum = cpu_only_overload.throughput_per_second;
    let fractions: &[f64] = if quick {
        &[0.5, 1.0]
    } else {
        &[0.25, 0.5, 0.75, 1.0]
    };
    let duration = bench.durations.overload_ns;
    let mut points = Vec::new();
    let mut saving_at_maximum = 0.0;
    for &fraction in fractions {
        let mut workload = bench.workload(&[app], maximum * fraction, duration);
        workload.measure_from_ns = duration * 3 / 5;
        let tiga = bench.simulate(Scheme::Tiga, &workload, &config)?;
        let cpu_only = bench.simulate(Scheme::CpuOnly, &workload, &config)?;
        let saving = cn_cpu_saving(&tiga, &cpu_only);
        points.push(serde_json::json!({
            "offered_per_second": maximum * fraction,
            "tiga_throughput_per_second": tiga.throughput_per_second,
            "tiga_cn_cores": tiga.cn_cores_busy,
            "cpu_only_throughput_per_second": cpu_only.throughput_per_second,
            "cpu_only_cn_cores": cpu_only.cn_cores_busy,
            "saving": saving,
        }));
        bench.report.add(
            &format!("fig8/{}/{:.0}%", app.name(), fraction * 100.0),
            "cn_cpu_saving",
            saving,
            "ratio",
        );
        if fraction == 1.0 {
            saving_at_maximum = saving;
            bench.progress.suspend(|| {
                println!(
                    "           Fig. 8 at CPU-only's maximum {:.3} M/s: CN cores busy TIGA {:.2} ({:.3} M/s served), CPU-only {:.2}: saving {:.0}%",
                    maximum / 1e6,
                    tiga.cn_cores_busy,
                    tiga.throughput_per_second / 1e6,
                    cpu_only.cn_cores_busy,
                    saving * 100.0
                );
            });
        }
    }
    bench
        .report
        .series
        .insert(format!("fig8/{}", app.name()), points.into());
    Ok(saving_at_maximum)
}

/// Fig. 5's detection periods, in seconds.
fn fig5_periods_s(quick: bool) -> &'static [f64] {
    if quick {
        &[0.01, 0.1]
    } else {
        &[0.01, 0.05, 0.1, 0.5]
    }
}

/// The settings Fig. 5 runs with at a detection period of `period_s`.
fn fig5_config(base: &SocConfig, period_s: f64) -> SocConfig {
    SocConfig {
        detection_period_ns: (period_s * 1e9) as u64,
        ..base.clone()
    }
}

/// Fig. 5: detection and reallocation overhead (SoC core time on them,
/// per second per core) against the detection period, with the payload
/// alternating between 1 KiB and 4 KiB at two intervals.
fn fig5(bench: &mut Bench, quick: bool) -> Result<(), TigaBenchError> {
    let periods_s = fig5_periods_s(quick);
    let intervals_s = [0.2, 1.0];
    let duration = if quick { 2 * SECOND_NS } else { 4 * SECOND_NS };
    println!("\nFig. 5: overhead (s per s per core) against the detection period");
    for interval in intervals_s {
        let mut points = Vec::new();
        for &period in periods_s {
            let config = fig5_config(&bench.config, period);
            let offered = SATURATION_FACTOR * bench.fluid_capacity(&[App::Mvs], &config);
            let mut workload = bench.workload(&[App::Mvs], offered, duration);
            workload.payload = PayloadSchedule::Alternating {
                sizes: vec![DEFAULT_PAYLOAD_BYTES, SHIFTED_PAYLOAD_BYTES],
                interval_ns: (interval * 1e9) as u64,
            };
            workload.measure_from_ns = 0;
            let run = bench.simulate(Scheme::TigaWithoutCpu, &workload, &config)?;
            let overhead = run.soc_overhead_ns / run.soc_core_ns;
            bench.report.add(
                &format!("fig5/change_every_{interval}s/period_{period}s"),
                "overhead",
                overhead,
                "s/s",
            );
            bench.report.add(
                &format!("fig5/change_every_{interval}s/period_{period}s"),
                "throughput",
                run.throughput_per_second / 1e6,
                "Mrequests/s",
            );
            points.push(serde_json::json!({"period_s": period, "overhead_s_per_s": overhead, "throughput_per_second": run.throughput_per_second}));
            bench.progress.suspend(|| {
                println!(
                    "  load changes every {interval:>4} s, period {period:>5} s: overhead {overhead:.2e} s/s, {:.3} M/s",
                    run.throughput_per_second / 1e6
                );
            });
        }
        bench
            .report
            .series
            .insert(format!("fig5/change_every_{interval}s"), points.into());
    }
    Ok(())
}

/// The allocation and forwarding ratio over time, MVS at 1.5 times the
/// SoC's capacity with the payload shifting from 1 KiB to 4 KiB half-way.
fn payload_shift(bench: &mut Bench) -> Result<(), TigaBenchError> {
    let config = bench.config.clone();
    let duration = bench.durations.overload_ns;
    let offered = 1.5 * bench.fluid_capacity(&[App::Mvs], &config);
    let mut workload = bench.workload(&[App::Mvs], offered, duration);
    workload.payload = PayloadSchedule::Alternating {
        sizes: vec![DEFAULT_PAYLOAD_BYTES, SHIFTED_PAYLOAD_BYTES],
        interval_ns: duration / 2,
    };
    let run = bench.simulate(Scheme::Tiga, &workload, &config)?;
    bench.record("shift/mvs/tiga", &run);
    bench.report.series.insert(
        "payload_shift/mvs/tiga".into(),
        serde_json::to_value(&run.timeline).unwrap_or_default(),
    );
    let changes = run
        .timeline
        .windows(2)
        .filter(|two| two[0].allocation != two[1].allocation)
        .count();
    bench.progress.suspend(|| {
        println!(
            "\npayload shift 1 KiB -> 4 KiB at {:.1} s: {} reallocations, final split {:?}, forwarding {:.0}% at the end",
            duration as f64 / 2e9,
            changes,
            run.final_allocation,
            run.timeline.last().map_or(0.0, |point| point.forwarding_ratio * 100.0)
        );
    });
    Ok(())
}

/// The settings the sweeps run with, by name: the slowdown, the context
/// switch and the detection, each scaled about the base.
fn sweep_variants(base: &SocConfig, calibration: &Calibration) -> Vec<(String, SocConfig)> {
    let context_switch = base
        .context_switch_ns
        .unwrap_or(calibration.context_switch_ns * base.slowdown);
    let detection = simulation::detection_ns(base, calibration);
    [4.0, 8.8, 16.0]
        .iter()
        .map(|&slowdown| {
            (
                format!("slowdown_{slowdown}"),
                SocConfig {
                    slowdown,
                    ..base.clone()
                },
            )
        })
        .chain([0.25, 1.0, 4.0].iter().map(|&factor| {
            (
                format!("context_switch_x{factor}"),
                SocConfig {
                    context_switch_ns: Some(context_switch * factor),
                    ..base.clone()
                },
            )
        }))
        .chain(
            [1.0, 100.0, 10_000.0]
                .iter()
                .map(|&factor| {
                    (
                        format!("detection_x{factor}"),
                        SocConfig {
                            detection_ns: Some(detection * factor),
                            ..base.clone()
                        },
                    )
                })
                // A detection as long as its period stalls every core for
                // good: such a point (10^4 times a slow machine's
                // detection) is left out of the sweep, not run to an error.
                .filter(|(_, config)| simulation::check_detection(config, calibration).is_ok()),
        )
        .collect()
}

/// The slowdowns of the CPU-saving sweep.
const SAVING_SWEEP_SLOWDOWNS: [f64; 3] = [2.0, 4.0, 8.8];

/// The settings the CPU-saving sweep runs with at `slowdown`.
fn saving_sweep_config(base: &SocConfig, slowdown: f64) -> SocConfig {
    SocConfig {
        slowdown,
        ..base.clone()
    }
}

/// Full run: MVS's Fig. 6 ratios under other slowdowns, context-switch
/// costs and detection costs, each against its default.
fn sweeps(bench: &mut Bench) -> Result<(), TigaBenchError> {
    let variants = sweep_variants(&bench.config, &bench.calibration);
    println!("\nsweeps (MVS, SmartNIC alone): tiga over fairnic / floem / ipipe");
    for (name, config) in variants {
        let offered = SATURATION_FACTOR * bench.fluid_capacity(&[App::Mvs], &config);
        let workload = bench.workload(&[App::Mvs], offered, bench.durations.saturation_ns);
        let mut throughput = Vec::new();
        for scheme in [
            Scheme::TigaWithoutCpu,
            Scheme::FairNic,
            Scheme::FloemFcfs,
            Scheme::IPipe,
        ] {
            throughput.push(
                bench
                    .simulate(scheme, &workload, &config)?
                    .throughput_per_second,
            );
        }
        let [tiga, fair, floem, ipipe] =
            [throughput[0], throughput[1], throughput[2], throughput[3]];
        for (against, value) in [
            ("fairnic", tiga / fair),
            ("floem", tiga / floem),
            ("ipipe", tiga / ipipe),
        ] {
            bench.report.add(
                &format!("sweep/{name}"),
                &format!("mvs_vs_{against}"),
                value,
                "ratio",
            );
        }
        bench.progress.suspend(|| {
            println!(
                "  {name:<24} {:>6.2} {:>6.2} {:>6.2}",
                tiga / fair,
                tiga / floem,
                tiga / ipipe
            );
        });
    }
    Ok(())
}

/// Full run: the CN CPU saving at CPU-only's maximum (IPSec, the app
/// with the least) under other slowdowns: what it would take to meet it.
fn saving_sweep(bench: &mut Bench) -> Result<(), TigaBenchError> {
    println!("\nsweep: IPSec's CN CPU saving at CPU-only's maximum, by slowdown");
    let duration = bench.durations.overload_ns;
    for slowdown in SAVING_SWEEP_SLOWDOWNS {
        let config = saving_sweep_config(&bench.config, slowdown);
        let mut overload = bench.workload(&[App::Ipsec], OVERLOAD_PER_SECOND, duration);
        overload.measure_from_ns = duration * 3 / 5;
        let maximum = bench
            .simulate(Scheme::CpuOnly, &overload, &config)?
            .throughput_per_second;
        let at_maximum = Workload {
            offered_per_second: maximum,
            ..overload
        };
        let tiga = bench.simulate(Scheme::Tiga, &at_maximum, &config)?;
        let cpu_only = bench.simulate(Scheme::CpuOnly, &at_maximum, &config)?;
        let saving = cn_cpu_saving(&tiga, &cpu_only);
        bench.report.add(
            &format!("sweep/slowdown_{slowdown}"),
            "ipsec_cn_cpu_saving",
            saving,
            "ratio",
        );
        bench
            .progress
            .suspend(|| println!("  slowdown {slowdown:>4}: saving {:.0}%", saving * 100.0));
    }
    Ok(())
}

fn print_ratios(report: &Report) {
    let targets = [
        ("mvs_vs_fairnic", 1.6),
        ("mvs_vs_floem", 1.44),
        ("mvs_vs_ipipe", 1.21),
        ("coprocessing_vs_nocpu_overload_min", 1.6),
        ("cn_cpu_saving_vs_cpu_only_min", 0.22),
    ];
    println!("\nratios:");
    for (name, value) in &report.ratios {
        let value = value.as_f64().unwrap_or(f64::NAN);
        match targets.iter().find(|(target, _)| target == name) {
            Some((_, target)) => {
                let verdict = if value >= *target { "meets" } else { "MISSES" };
                println!("  {name:<38} {value:>8.3}  (target >= {target}: {verdict})");
            }
            None => println!("  {name:<38} {value:>8.3}"),
        }
    }
}

#[derive(clap::Args)]
pub struct TigaArgs {
    #[command(flatten)]
    pub common: super::entry::CommonArgs,
    /// A TOML file of virtual-hardware settings (any of soc_cores,
    /// cn_cores, slowdown, context_switch_ns, core_move_ns, detection_ns,
    /// detection_period_ns, queue_depth, dma_bytes_per_second, ...; see
    /// examples/tiga.toml).
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// The seed of the arrival streams.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Replay the stage costs of an earlier run (its --json report, or a
    /// calibration alone) instead of measuring them: with the same seed
    /// and settings, the run's figures come out the same.
    #[arg(long)]
    pub calibration: Option<std::path::PathBuf>,
}

impl super::entry::BenchArgs for TigaArgs {
    fn common(&self) -> &super::entry::CommonArgs {
        &self.common
    }
}

/// `remora bench tiga`.
pub static BENCH: super::entry::Entry<TigaArgs, TigaBenchError> = super::entry::Entry {
    name: "tiga",
    about: "TIGA in virtual time on virtual SoC and CN cores.\n\nCalibrated from the real stage code: MVS, Spark-style analysis and IPSec under TIGA, FairNIC, Floem (FCFS, DRR), iPipe and CPU-only; the paper's Figs. 2, 3, 5, 6, 7 and 8, latency, and the allocation and forwarding ratio over a payload shift.",
    run: |args| {
        run_checked(
            args.common.quick,
            args.config.as_deref(),
            args.calibration.as_deref(),
            args.seed,
        )
    },
};

/// TIGA's saving of compute-node CPU over CPU-only: one minus the ratio of
/// CN CPU per request served, so that a scheme that served less (dropped
/// at a full queue) is not credited with the CPU it saved by not serving;
/// at equal throughput it is the ratio of busy cores. Not a number when
/// either served nothing: a run that served nothing on no CPU saved
/// nothing (it read as a saving of 100%).
fn cn_cpu_saving(tiga: &RunReport, cpu_only: &RunReport) -> f64 {
    let load = |run: &RunReport| CnLoad {
        served_per_second: run.throughput_per_second,
        cores_busy: run.cn_cores_busy,
    };
    load(tiga).saving_over(load(cpu_only))
}

/// What a run served, and the compute node's cores it kept busy.
#[derive(Debug, Clone, Copy)]
struct CnLoad {
    served_per_second: f64,
    cores_busy: f64,
}

impl CnLoad {
    fn cores_per_request(self) -> f64 {
        match self.served_per_second > 0.0 {
            true => self.cores_busy / self.served_per_second,
            false => f64::NAN,
        }
    }

    fn saving_over(self, baseline: CnLoad) -> f64 {
        let baseline = baseline.cores_per_request();
        match baseline > 0.0 {
            true => 1.0 - self.cores_per_request() / baseline,
            false => f64::NAN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scheme that served nothing made the moderate load 0, whose run
    /// was a typed error that stopped the whole bench.
    #[test]
    fn no_moderate_load_when_a_scheme_served_nothing() {
        assert_eq!(moderate_load(&[4.0, 2.0, 8.0]), Some(1.0));
        assert_eq!(moderate_load(&[4.0, 0.0, 8.0]), None);
        assert_eq!(moderate_load(&[]), None);
    }

    fn run(served_per_second: f64, cores_busy: f64) -> CnLoad {
        CnLoad {
            served_per_second,
            cores_busy,
        }
    }

    /// Settings that passed on their own stopped the benchmark at Fig. 5
    /// or a sweep, after minutes of runs: a detection of 20 ms is past
    /// Fig. 5's 10 ms period, and four cores cannot run the three apps'
    /// six stages together. Both are refused before the first run.
    #[test]
    fn settings_a_later_figure_cannot_run_are_refused_before_the_first_run() {
        let calibration = Calibration::fixed_for_tests();
        let slow_detection = SocConfig {
            detection_ns: Some(2e7),
            ..SocConfig::default()
        };
        slow_detection.validate().unwrap();
        assert!(matches!(
            check_planned_settings(&slow_detection, &calibration, true),
            Err(TigaBenchError::Config(ConfigError::DetectionPastPeriod { period_ns, .. }))
                if period_ns == 10_000_000
        ));
        let few_cores = SocConfig {
            soc_cores: 4,
            ..SocConfig::default()
        };
        few_cores.validate().unwrap();
        assert!(matches!(
            check_planned_settings(&few_cores, &calibration, true),
            Err(TigaBenchError::Allocation(
                remora_tiga::allocator::AllocationError::TooFewCores {
                    cores: 4,
                    agents: 6
                }
            ))
        ));
        for quick in [true, false] {
            check_planned_settings(&SocConfig::default(), &calibration, quick).unwrap();
        }
    }

    #[test]
    fn a_scheme_that_served_nothing_saved_nothing() {
        let cpu_only = run(1e6, 2.0);
        assert!((run(1e6, 1.0).saving_over(cpu_only) - 0.5).abs() < 1e-12);
        // Half the requests served on a quarter of the cores: half the CPU
        // per request.
        assert!((run(5e5, 0.5).saving_over(cpu_only) - 0.5).abs() < 1e-12);
        assert!(run(0.0, 0.0).saving_over(cpu_only).is_nan());
        assert!(run(1e6, 1.0).saving_over(run(0.0, 0.0)).is_nan());
    }
}
