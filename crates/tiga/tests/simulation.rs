//! The virtual SoC's invariants and TIGA's behaviour, on fixed costs so
//! that the outcome does not depend on this machine's speed.

use remora_tiga::apps::App;
use remora_tiga::calibration::Calibration;
use remora_tiga::config::SocConfig;
use remora_tiga::simulation::{run, PayloadSchedule, RunError, RunReport, Scheme, Workload};

const MS: u64 = 1_000_000;

fn config() -> SocConfig {
    // A short period keeps the runs short; the costs are fixed.
    SocConfig {
        detection_period_ns: 10 * MS,
        sample_every: 97,
        ..SocConfig::default()
    }
}

/// The fixed calibration's SoC capacity for 1 KiB requests with a perfect
/// split and no overhead, requests per second.
fn ideal_capacity(config: &SocConfig) -> f64 {
    let stage_ns = |per_call: f64, per_byte: f64| (per_call + per_byte * 1024.0) * config.slowdown;
    config.soc_cores as f64 * 1e9 / (stage_ns(200.0, 0.05) + stage_ns(20.0, 0.7))
}

fn workload(app: App, offered_per_second: f64, duration_ms: u64) -> Workload {
    Workload {
        apps: vec![app],
        offered_per_second,
        payload: PayloadSchedule::Fixed(1024),
        duration_ns: duration_ms * MS,
        measure_from_ns: duration_ms * MS / 2,
        host_cpu_for_ipipe: false,
        seed: 42,
    }
}

fn run_scheme(scheme: Scheme, workload: &Workload) -> RunReport {
    run(scheme, workload, &config(), &Calibration::fixed_for_tests()).unwrap()
}

#[test]
fn every_request_is_done_once_or_refused_and_counted_in_every_scheme() {
    let config = config();
    let overload = workload(App::Mvs, 3.0 * ideal_capacity(&config), 200);
    for scheme in [
        Scheme::Tiga,
        Scheme::TigaWithoutCpu,
        Scheme::FairNic,
        Scheme::FloemFcfs,
        Scheme::FloemDrr,
        Scheme::IPipe,
        Scheme::CpuOnly,
    ] {
        // Every request offered is completed, refused or still in flight:
        // `run` checks that account itself and fails with an error, so the
        // unwrap in `run_scheme` is where this test's property is held.
        let report = run_scheme(scheme, &overload);
        assert!(report.completed > 0, "{scheme:?} completed nothing");
        // Three times what the SoC can take: something must be refused or
        // queued, or the overload never happened.
        assert!(
            report.rejected + report.in_flight_at_end > 0,
            "{scheme:?} took all of a 3x overload"
        );
        assert!(report.sampled_checks > 0, "{scheme:?} checked no sample");
    }
}

#[test]
fn tiga_moves_cores_to_the_dearer_stage_and_beats_the_even_split() {
    let config = config();
    let saturation = workload(App::Mvs, 1.5 * ideal_capacity(&config), 200);
    let tiga = run_scheme(Scheme::TigaWithoutCpu, &saturation);
    let fair = run_scheme(Scheme::FairNic, &saturation);
    // Stage two costs 2.9 times stage one at 1 KiB: Eq. 4 gives it 6 of 8.
    assert_eq!(tiga.final_allocation, vec![2, 6]);
    assert_eq!(fair.final_allocation, vec![4, 4]);
    assert!(
        tiga.throughput_per_second > 1.3 * fair.throughput_per_second,
        "TIGA {} against FairNIC {}",
        tiga.throughput_per_second,
        fair.throughput_per_second
    );
}

#[test]
fn under_overload_coprocessing_forwards_and_raises_throughput() {
    let config = config();
    let overload = workload(App::Ipsec, 4.0 * ideal_capacity(&config), 400);
    let with_cpu = run_scheme(Scheme::Tiga, &overload);
    let without = run_scheme(Scheme::TigaWithoutCpu, &overload);
    assert!(with_cpu.completed_on_cpu > 0);
    assert_eq!(without.completed_on_cpu, 0);
    let last = with_cpu.timeline.last().unwrap();
    assert!(last.forwarding_ratio > 0.0);
    assert!(with_cpu.throughput_per_second > 1.5 * without.throughput_per_second);
}

#[test]
fn ipipe_with_the_dn_host_migrates_its_slowest_actor_under_overload() {
    // At 1 KiB the slowest actor is the last stage; at 64 B the first.
    for (payload, slowest_stage) in [(1024, 1), (64, 0)] {
        ipipe_migrates(payload, slowest_stage);
    }
}

fn ipipe_migrates(payload: usize, slowest_stage: usize) {
    let config = config();
    let overload = Workload {
        host_cpu_for_ipipe: true,
        payload: PayloadSchedule::Fixed(payload),
        ..workload(App::Mvs, 3.0 * ideal_capacity(&config), 300)
    };
    let with_host = run_scheme(Scheme::IPipe, &overload);
    let alone = run_scheme(
        Scheme::IPipe,
        &Workload {
            host_cpu_for_ipipe: false,
            ..overload.clone()
        },
    );
    // Ranked at 1 KiB whatever the payload, iPipe moved the cheap last
    // stage at 64 B and left the bottleneck on the SoC.
    assert_eq!(
        with_host.migrated_stages,
        vec![slowest_stage],
        "{payload} B"
    );
    assert!(alone.migrated_stages.is_empty());

    assert!(
        with_host.throughput_per_second > alone.throughput_per_second,
        "{payload} B: with the host {} against alone {}",
        with_host.throughput_per_second,
        alone.throughput_per_second
    );
    // The DN host's CPU was busy, and is reported (it went uncounted, so
    // iPipe looked free of any host's CPU), apart from the CN's.
    assert!(
        with_host.dn_host_cores_busy > 0.1,
        "{payload} B: the DN host was busy {} cores",
        with_host.dn_host_cores_busy
    );
    assert!(with_host.dn_host_cores_busy <= config.cn_cores as f64 + 1e-9);
    assert_eq!(alone.dn_host_cores_busy, 0.0);
    assert_eq!(alone.completed_on_dn_host, 0);
    if slowest_stage == 1 {
        // The last stage runs on the host: its completions end there.
        assert!(with_host.completed_on_dn_host > 0);
    }
}

/// The SoC cores feeding a stage iPipe migrated to the DN host put items
/// in the host's queue without looking at its depth: with one host core
/// behind an overloaded pipeline the queue grew without bound. They now
/// wait for room, as for a stage's own queue.
#[test]
fn ipipe_feeds_a_migrated_stage_no_faster_than_the_host_takes_it() {
    let config = SocConfig {
        cn_cores: 1,
        ..config()
    };
    // At 1 KiB the last stage moves, at 64 B the first: items then enter
    // the host's queue straight from the network, where its peak went
    // unmeasured (0 beside a full queue).
    for payload in [1024, 64] {
        let overload = Workload {
            host_cpu_for_ipipe: true,
            payload: PayloadSchedule::Fixed(payload),
            ..workload(App::Mvs, 3.0 * ideal_capacity(&config), 300)
        };
        let report = run(
            Scheme::IPipe,
            &overload,
            &config,
            &Calibration::fixed_for_tests(),
        )
        .unwrap();
        assert_eq!(report.migrated_stages.len(), 1);
        let bound = config.cn_queue_depth + config.cn_cores;
        assert!(
            report.host_queue_peak > 0 && report.host_queue_peak <= bound,
            "{payload} B: the host's queue held {} against a bound of {bound}",
            report.host_queue_peak
        );
        assert!(report.completed > 0);
    }
}

#[test]
fn at_a_light_load_tiga_forwards_nothing_and_serves_everything() {
    let config = config();
    let light = workload(App::Spark, 0.3 * ideal_capacity(&config), 200);
    let report = run_scheme(Scheme::Tiga, &light);
    assert_eq!(report.completed_on_cpu, 0);
    assert_eq!(report.rejected, 0);
    assert!(report
        .timeline
        .iter()
        .all(|point| point.forwarding_ratio == 0.0));
}

#[test]
fn time_sharing_pays_context_switches_and_partitioning_does_not() {
    let config = config();
    let saturation = workload(App::Mvs, 1.5 * ideal_capacity(&config), 100);
    let floem = run_scheme(Scheme::FloemFcfs, &saturation);
    let fair = run_scheme(Scheme::FairNic, &saturation);
    assert!(floem.soc_context_switch_ns > 0.0);
    assert_eq!(fair.soc_context_switch_ns, 0.0);
}

#[test]
fn a_run_is_deterministic_for_a_seed() {
    let config = config();
    let load = workload(App::Mvs, 2.0 * ideal_capacity(&config), 100);
    let first = run_scheme(Scheme::Tiga, &load);
    let second = run_scheme(Scheme::Tiga, &load);
    assert_eq!(first.completed, second.completed);
    assert_eq!(first.latency_p99_ns, second.latency_p99_ns);
    assert_eq!(first.timeline, second.timeline);
    let other_seed = Workload { seed: 43, ..load };
    assert_ne!(run_scheme(Scheme::Tiga, &other_seed).offered, first.offered);
}

#[test]
fn after_a_payload_shift_tiga_gives_cores_to_the_stage_that_became_dearer_until_it_keeps_up() {
    let config = config();
    // 1 KiB favours stage two (dear per byte); 64 B favours stage one
    // (dear per call). One shift, half-way.
    let shifting = Workload {
        payload: PayloadSchedule::Alternating {
            sizes: vec![1024, 64],
            interval_ns: 200 * MS,
        },
        ..workload(App::Mvs, 1.5 * ideal_capacity(&config), 400)
    };
    let report = run_scheme(Scheme::TigaWithoutCpu, &shifting);
    let before = report
        .timeline
        .iter()
        .rfind(|point| point.time_s < 0.2)
        .unwrap();
    assert!(
        before.allocation[1] > before.allocation[0],
        "{:?}",
        before.allocation
    );
    // Stage one now needs more than its share of the old split, and gets
    // it; after that the pipeline keeps up.
    assert!(
        report.final_allocation[0] > before.allocation[0],
        "{:?}",
        report.final_allocation
    );
    let settled = &report.timeline[report.timeline.len() - 5..];
    assert!(settled.iter().all(|point| !point.mismatch), "{settled:?}");
}

#[test]
fn three_apps_share_the_cores() {
    let config = config();
    let together = Workload {
        apps: App::ALL.to_vec(),
        ..workload(App::Mvs, 1.5 * ideal_capacity(&config), 100)
    };
    let report = run_scheme(Scheme::TigaWithoutCpu, &together);
    assert_eq!(report.final_allocation.len(), 6);
    assert_eq!(report.final_allocation.iter().sum::<usize>(), 8);
    // Every stage keeps a core, the SmartNIC serves the requests, and
    // splitting by the stages' costs serves more than FairNIC's even
    // split (about 25% more here).
    assert!(
        report.final_allocation.iter().all(|&cores| cores >= 1),
        "{:?}",
        report.final_allocation
    );
    assert!(report.completed > 0 && report.completed_on_nic == report.completed);
    let fair = run_scheme(Scheme::FairNic, &together);
    assert!(
        report.throughput_per_second > fair.throughput_per_second,
        "TIGA {} against FairNIC {}",
        report.throughput_per_second,
        fair.throughput_per_second
    );
}

#[test]
fn bad_workloads_get_typed_errors() {
    let calibration = Calibration::fixed_for_tests();
    let mut bad = workload(App::Mvs, 1000.0, 10);
    bad.payload = PayloadSchedule::Fixed(8);
    assert!(matches!(
        run(Scheme::Tiga, &bad, &config(), &calibration),
        Err(RunError::PayloadSize(8))
    ));
    let bad = Workload {
        apps: Vec::new(),
        ..workload(App::Mvs, 1000.0, 10)
    };
    assert!(matches!(
        run(Scheme::Tiga, &bad, &config(), &calibration),
        Err(RunError::NoApps)
    ));
    let bad = workload(App::Mvs, -1.0, 10);
    assert!(matches!(
        run(Scheme::Tiga, &bad, &config(), &calibration),
        Err(RunError::BadLoad(_))
    ));
    let bad = Workload {
        measure_from_ns: 20 * MS,
        ..workload(App::Mvs, 1000.0, 10)
    };
    assert!(matches!(
        run(Scheme::Tiga, &bad, &config(), &calibration),
        Err(RunError::BadWindow { .. })
    ));
    let too_few = SocConfig {
        soc_cores: 4,
        ..config()
    };
    let together = Workload {
        apps: App::ALL.to_vec(),
        ..workload(App::Mvs, 1000.0, 10)
    };
    assert!(matches!(
        run(Scheme::Tiga, &together, &too_few, &calibration),
        Err(RunError::Allocation(_))
    ));
}

/// A detection period of 1 ns over a second asked for 10^9 detections,
/// each keeping a timeline point: an hour's run and gigabytes. Refused.
#[test]
fn a_run_with_too_many_detection_periods_is_refused() {
    let config = SocConfig {
        detection_period_ns: 1,
        detection_ns: Some(0.0),
        ..config()
    };
    let light = workload(App::Spark, 0.3 * ideal_capacity(&config), 200);
    let refused = run(
        Scheme::Tiga,
        &light,
        &config,
        &Calibration::fixed_for_tests(),
    );
    assert!(
        matches!(refused, Err(RunError::TooManyDetections(_))),
        "{refused:?}"
    );
}

/// A CPU-only fetch and a forwarded request take their data out of the
/// DN's memory over its DMA, as the rack's engine reads it before it
/// sends: the simulation skipped the DMA on both, so a slow DMA did not
/// slow CPU-only at all. At 1 MB/s and 1 KiB a request, it serves at
/// most about a thousand requests a second.
#[test]
fn a_cpu_only_fetch_takes_its_data_over_the_dn_dma() {
    let slow_dma = SocConfig {
        dma_bytes_per_second: 1e6,
        cn_cores: 8,
        ..config()
    };
    let load = workload(App::Mvs, 20_000.0, 200);
    let report = run(
        Scheme::CpuOnly,
        &load,
        &slow_dma,
        &Calibration::fixed_for_tests(),
    )
    .unwrap();
    let dma_bound = 1e6 / 1024.0;
    assert!(
        report.throughput_per_second <= 1.1 * dma_bound,
        "CPU-only served {}/s past the DMA's {dma_bound:.0}/s",
        report.throughput_per_second
    );
    assert!(report.throughput_per_second > 0.5 * dma_bound);
}
