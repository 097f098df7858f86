//! Calibration: what each stage's real code costs on this machine, per call
//! and per byte, and what a context switch and a detection cost here.
//!
//! Each cost is the median of repeated timed executions at several payload
//! sizes, joined by straight lines between them ([`CostCurve`]): exact at
//! every size measured, the default payload among them. (A least-squares
//! line did not fit Spark's spatial join, whose work grows with the square
//! of the payload: its intercept came out negative, was clamped to 0, and
//! the line charged 1.5 to 2.5 times the 1 KiB median measured beside it.)
//! The virtual SoC then charges these costs times the slowdown factor; the
//! CN charges them as measured. The whole calibration goes into the
//! benchmark's JSON, and a run is deterministic for a seed and a
//! calibration.

use crate::allocator::proportional_allocation;
use crate::apps::{App, Stage, DEFAULT_PAYLOAD_BYTES, MAX_PAYLOAD_BYTES, MIN_PAYLOAD_BYTES};
use serde::{Deserialize, Serialize};
use std::hint::black_box;
use std::time::Instant;

/// Payload sizes the stages are timed at.
const SIZES_BYTES: [usize; 3] = [256, 1024, 4096];

/// Points a cost curve from a file may have: the measured ones are
/// [`SIZES_BYTES`], and each lookup scans them.
const MAX_CURVE_POINTS: usize = 64;

/// A cost in host nanoseconds against the payload's bytes: the median
/// measured at each size, joined by straight lines. Below the smallest
/// size it is the smallest size's cost (never free); past the largest it
/// follows the last segment, or stays flat where that segment falls (a
/// stage never gets cheaper as its payload grows).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostCurve {
    /// (payload bytes, median ns), sizes rising.
    pub medians_ns: Vec<(usize, f64)>,
}

impl CostCurve {
    pub fn at(&self, bytes: u64) -> f64 {
        let points = &self.medians_ns;
        let Some(&(first_bytes, first_ns)) = points.first() else {
            return 0.0;
        };
        let x = bytes as f64;
        if points.len() == 1 || x <= first_bytes as f64 {
            return first_ns;
        }
        // The segment holding `x`, or the last one past the end.
        let segment = points
            .windows(2)
            .position(|pair| x <= pair[1].0 as f64)
            .unwrap_or(points.len() - 2);
        let ((x0, y0), (x1, y1)) = (points[segment], points[segment + 1]);
        let slope = (y1 - y0) / (x1 as f64 - x0 as f64);
        if x >= x1 as f64 {
            // Exactly the median at a measured size, not a rounding of it.
            return y1 + slope.max(0.0) * (x - x1 as f64);
        }
        y0 + slope * (x - x0 as f64)
    }

    /// The same curve with every cost times `factor` (a SoC core's slowdown).
    pub fn scaled(&self, factor: f64) -> CostCurve {
        CostCurve {
            medians_ns: self
                .medians_ns
                .iter()
                .map(|&(bytes, ns)| (bytes, ns * factor))
                .collect(),
        }
    }

    /// `per_call_ns + per_byte_ns · bytes` over every payload allowed: a
    /// cost that does not depend on this machine, for tests and examples.
    pub fn line(per_call_ns: f64, per_byte_ns: f64) -> CostCurve {
        let point = |bytes: usize| (bytes, per_call_ns + per_byte_ns * bytes as f64);
        CostCurve {
            medians_ns: vec![point(MIN_PAYLOAD_BYTES), point(MAX_PAYLOAD_BYTES)],
        }
    }
}

/// One stage's measured cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageCalibration {
    pub stage: Stage,
    /// What a host core pays (the CN, and the DN host for iPipe).
    pub cost: CostCurve,
    /// What the portable code costs: what the SoC runs, before the
    /// slowdown ([`Stage::run_portable`]).
    pub portable_cost: CostCurve,
}

/// One application's measured costs: its NIC stages and its CN version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppCalibration {
    pub app: App,
    pub stages: Vec<StageCalibration>,
    pub cpu_version: CostCurve,
}

/// Everything measured, and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    pub apps: Vec<AppCalibration>,
    /// One context switch on this machine, in ns (lmbench `lat_ctx`'s
    /// method: two threads on one core passing a byte through pipes,
    /// minus the same pipe traffic within one thread, per switch).
    pub context_switch_ns: f64,
    /// Whether both threads of the context-switch measurement ran pinned
    /// to one core. Unpinned (a container may refuse it), it measured a
    /// wake-up across cores instead. None in a file that predates this.
    #[serde(default)]
    pub context_switch_pinned: Option<bool>,
    /// One detection: the allocator's real code (counters to Eq. 4) for
    /// eight PAs, in ns.
    pub detection_ns: f64,
    /// Timed executions per median.
    pub repetitions: usize,
}

/// Why calibration failed.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    #[error("a stage failed on its own calibration payload: {0}")]
    Stage(#[from] crate::apps::StageError),
    #[error("payload: {0}")]
    Payload(#[from] crate::apps::PayloadSizeError),
    #[error("measuring a context switch: {0}")]
    ContextSwitch(std::io::Error),
    #[error("the calibration has no {0}: it must cover every app")]
    MissingApp(&'static str),
    #[error("the calibration of {app} has no {stage:?} stage")]
    MissingStage { app: &'static str, stage: Stage },
    #[error("the calibration of {app} lists stages {listed:?}; the app's are {wanted:?}, once each and in that order")]
    StagesOutOfOrder {
        app: &'static str,
        listed: Vec<Stage>,
        wanted: Vec<Stage>,
    },
    #[error(
        "the calibration's {what} is {value}: costs must be finite, above 0 at every size, and at most 1 s for the largest payload, at 1 to 64 payload sizes that rise"
    )]
    BadCost { what: String, value: String },
}

impl CostCurve {
    /// Points at rising sizes, each cost finite and positive: a stage free
    /// at any size would give its agent unbounded capacity there (a file
    /// with one free point passed, and splitting the cores panicked).
    fn is_usable(&self) -> bool {
        let points = &self.medians_ns;
        let rising = points.windows(2).all(|pair| pair[0].0 < pair[1].0);
        let costs = || points.iter().map(|&(_, ns)| ns);
        // At most a fixed cost's bound at every point and past the last
        // (a curve may fall, so the largest payload's cost bounds nothing
        // else), so that a stage's time, slowed down, stays far from
        // overflowing virtual time.
        let limit = crate::config::MAX_FIXED_COST_NS;
        (1..=MAX_CURVE_POINTS).contains(&points.len())
            && rising
            && costs().all(|ns| ns.is_finite() && ns > 0.0 && ns <= limit)
            && self.at(MAX_PAYLOAD_BYTES as u64) <= limit
    }
}

impl Calibration {
    /// Checks a calibration read from a file (a measured one is complete by
    /// construction): every app and stage present, every cost usable.
    pub fn check(&self) -> Result<(), CalibrationError> {
        let bad = |what: String, value: String| CalibrationError::BadCost { what, value };
        // Bounded as a configuration's fixed costs are: a file's 10^19
        // overflowed virtual time at the first detection.
        let limit = crate::config::MAX_FIXED_COST_NS;
        for (what, value) in [
            ("context_switch_ns", self.context_switch_ns),
            ("detection_ns", self.detection_ns),
        ] {
            if !(value.is_finite() && (0.0..=limit).contains(&value)) {
                return Err(bad(what.into(), value.to_string()));
            }
        }
        for app in App::ALL {
            let calibration = self
                .apps
                .iter()
                .find(|calibration| calibration.app == app)
                .ok_or(CalibrationError::MissingApp(app.name()))?;
            if !calibration.cpu_version.is_usable() {
                let what = format!("{} CPU version's cost", app.name());
                return Err(bad(what, format!("{:?}", calibration.cpu_version)));
            }
            // The runs build one processing stage per listed stage, in
            // list order: a repeated or reordered list would charge the
            // wrong costs (or run a stage twice).
            let listed: Vec<Stage> = calibration
                .stages
                .iter()
                .map(|measured| measured.stage)
                .collect();
            let all_present = app.stages().iter().all(|stage| listed.contains(stage));
            if all_present && listed != app.stages() {
                return Err(CalibrationError::StagesOutOfOrder {
                    app: app.name(),
                    listed,
                    wanted: app.stages().to_vec(),
                });
            }
            for &stage in app.stages() {
                let measured = calibration
                    .stages
                    .iter()
                    .find(|measured| measured.stage == stage)
                    .ok_or(CalibrationError::MissingStage {
                        app: app.name(),
                        stage,
                    })?;
                for cost in [&measured.cost, &measured.portable_cost] {
                    if !cost.is_usable() {
                        let what = format!("{} {stage:?} cost", app.name());
                        return Err(bad(what, format!("{cost:?}")));
                    }
                }
            }
        }
        Ok(())
    }

    pub fn app(&self, app: App) -> &AppCalibration {
        self.apps
            .iter()
            .find(|calibration| calibration.app == app)
            .expect("calibration covers every app")
    }

    /// Measures everything. `repetitions` timed batches per median (odd
    /// numbers make the median one sample).
    pub fn measure(repetitions: usize) -> Result<Calibration, CalibrationError> {
        let repetitions = repetitions.max(3);
        let apps = App::ALL
            .into_iter()
            .map(|app| calibrate_app(app, repetitions))
            .collect::<Result<Vec<_>, _>>()?;
        let (context_switch_ns, pinned) =
            context_switch_ns(repetitions).map_err(CalibrationError::ContextSwitch)?;
        Ok(Calibration {
            apps,
            context_switch_ns,
            context_switch_pinned: Some(pinned),
            detection_ns: detection_ns(repetitions),
            repetitions,
        })
    }

    /// Fixed costs for tests that must not depend on this machine's speed:
    /// stage one dear per call, stage two dear per byte, so that the best
    /// split moves with the payload size (2:6 at 1 KiB, 6:2 at 64 B).
    pub fn fixed_for_tests() -> Calibration {
        let stage = |stage, per_call_ns, per_byte_ns| StageCalibration {
            stage,
            cost: CostCurve::line(per_call_ns, per_byte_ns),
            portable_cost: CostCurve::line(per_call_ns, per_byte_ns),
        };
        let apps = App::ALL
            .into_iter()
            .map(|app| {
                let [first, second] = [app.stages()[0], app.stages()[1]];
                AppCalibration {
                    app,
                    stages: vec![stage(first, 200.0, 0.05), stage(second, 20.0, 0.7)],
                    cpu_version: CostCurve::line(220.0, 0.75),
                }
            })
            .collect();
        Calibration {
            apps,
            context_switch_ns: 1_500.0,
            context_switch_pinned: None,
            detection_ns: 200.0,
            repetitions: 0,
        }
    }
}

/// The most calls a timed batch makes.
const MAX_BATCH_CALLS: usize = 10_000;
/// Calls timed one by one to size the batches.
const SIZING_CALLS: usize = 5;

/// The median ns of `work` over `repetitions` timed batches, each batch long
/// enough (at least ~20 µs, or [`MAX_BATCH_CALLS`] calls) for the clock's
/// own cost and resolution not to matter.
fn median_ns(repetitions: usize, mut work: impl FnMut()) -> f64 {
    // Sized from the quickest of a few timed calls, after one untimed:
    // sized from one call's time, a call preempted on this shared machine
    // left batches of one call, and every sample timed the clock along
    // with the work.
    work();
    let once_ns = (0..SIZING_CALLS)
        .map(|_| batch_ns(1, &mut work).max(1))
        .min()
        .unwrap_or(1) as f64;
    let mut batch = ((20_000.0 / once_ns).ceil() as usize).clamp(1, MAX_BATCH_CALLS);
    // The estimate counts the clock's own cost in each timed call, so a
    // cheap call's batch came out far shorter than 20 µs: doubled until a
    // batch takes that long (a preempted batch only stops this early).
    while batch < MAX_BATCH_CALLS && batch_ns(batch, &mut work) < 20_000 {
        batch = (batch * 2).min(MAX_BATCH_CALLS);
    }
    let mut samples: Vec<f64> = (0..repetitions)
        .map(|_| batch_ns(batch, &mut work) as f64 / batch as f64)
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// How long `calls` calls of `work` take, in ns.
fn batch_ns(calls: usize, work: &mut impl FnMut()) -> u128 {
    let started = Instant::now();
    for _ in 0..calls {
        work();
    }
    started.elapsed().as_nanos()
}

fn calibrate_app(app: App, repetitions: usize) -> Result<AppCalibration, CalibrationError> {
    let mut stages: Vec<StageCalibration> = app
        .stages()
        .iter()
        .map(|&stage| StageCalibration {
            stage,
            cost: CostCurve {
                medians_ns: Vec::new(),
            },
            portable_cost: CostCurve {
                medians_ns: Vec::new(),
            },
        })
        .collect();
    let mut cpu_points = Vec::new();
    for bytes in SIZES_BYTES {
        let payload = app.make_payload(1, 1, bytes)?;
        // Each stage is timed on the input it really gets: the previous
        // stage's output.
        let mut input = payload.clone();
        for calibration in stages.iter_mut() {
            let mut output = Vec::with_capacity(input.len() + 64);
            calibration.stage.run(&input, &mut output)?;
            let median = median_ns(repetitions, || {
                output.clear();
                let _ = black_box(calibration.stage.run(black_box(&input), &mut output));
            });
            calibration.cost.medians_ns.push((bytes, median));
            let portable = median_ns(repetitions, || {
                output.clear();
                let _ = black_box(
                    calibration
                        .stage
                        .run_portable(black_box(&input), &mut output),
                );
            });
            calibration.portable_cost.medians_ns.push((bytes, portable));
            output.clear();
            calibration.stage.run(&input, &mut output)?;
            input = output;
        }
        app.run_on_cpu(&payload)?;
        cpu_points.push((
            bytes,
            median_ns(repetitions, || {
                let _ = black_box(app.run_on_cpu(black_box(&payload)));
            }),
        ));
    }
    Ok(AppCalibration {
        app,
        stages,
        cpu_version: CostCurve {
            medians_ns: cpu_points,
        },
    })
}

/// lmbench's `lat_ctx` method: a token passed around two threads pinned to
/// one core through two pipes, per switch, less the pipe traffic alone;
/// and whether both threads were pinned.
fn context_switch_ns(repetitions: usize) -> std::io::Result<(f64, bool)> {
    use std::io::{Read, Write};
    const ROUND_TRIPS: usize = 2_000;
    let (mut to_partner_read, mut to_partner_write) = std::io::pipe()?;
    let (mut from_partner_read, mut from_partner_write) = std::io::pipe()?;
    let partner = std::thread::spawn(move || -> std::io::Result<bool> {
        let pinned = OneCore::pin();
        let mut token = [0u8; 1];
        loop {
            if to_partner_read.read(&mut token)? == 0 {
                return Ok(pinned.pinned);
            }
            from_partner_write.write_all(&token)?;
        }
    });
    let pinned = OneCore::pin();
    let mut token = [0u8; 1];
    let mut samples = Vec::with_capacity(repetitions);
    for _ in 0..repetitions.min(9) {
        let started = Instant::now();
        for _ in 0..ROUND_TRIPS {
            to_partner_write.write_all(&token)?;
            from_partner_read.read_exact(&mut token)?;
        }
        samples.push(started.elapsed().as_nanos() as f64 / ROUND_TRIPS as f64);
    }
    drop(to_partner_write);
    let partner_pinned = partner
        .join()
        .map_err(|_| std::io::Error::other("partner thread panicked"))??;
    let both_pinned = pinned.pinned && partner_pinned;
    drop(pinned);
    // The same two writes and two reads per round trip, in one thread.
    let (mut alone_read, mut alone_write) = std::io::pipe()?;
    let pipe_only = median_ns(repetitions, || {
        let _ = alone_write.write_all(&token);
        let _ = alone_read.read_exact(&mut token);
    });
    samples.sort_by(f64::total_cmp);
    let round_trip = samples[samples.len() / 2];
    // Two switches per round trip.
    Ok((((round_trip - 2.0 * pipe_only) / 2.0).max(0.0), both_pinned))
}

/// The calling thread pinned to the first CPU it may run on, until
/// dropped: then it may run where it could before. (Freed to CPUs 0 to n
/// instead, a thread under `taskset` or a cpuset was moved out of it, and
/// so was every thread it started after; pinned to CPU 0 always, one
/// outside its set failed to pin.)
struct OneCore {
    before: Option<rustix::thread::CpuSet>,
    /// Whether the system let the thread be pinned.
    pinned: bool,
}

impl OneCore {
    fn pin() -> OneCore {
        let before = rustix::thread::sched_getaffinity(None).ok();
        let first = before
            .as_ref()
            .and_then(|set| (0..rustix::thread::CpuSet::MAX_CPU).find(|&cpu| set.is_set(cpu)));
        let mut one = rustix::thread::CpuSet::new();
        one.set(first.unwrap_or(0));
        // Pinning is best effort: a container may refuse it, and the
        // measurement is then two cores' wake-up, which the calibration
        // says (`context_switch_pinned`).
        let pinned = rustix::thread::sched_setaffinity(None, &one).is_ok();
        OneCore { before, pinned }
    }
}

impl Drop for OneCore {
    fn drop(&mut self) {
        if let Some(before) = &self.before {
            let _ = rustix::thread::sched_setaffinity(None, before);
        }
    }
}

/// The allocator's real code for eight PAs.
fn detection_ns(repetitions: usize) -> f64 {
    let capacities = [3.1e9, 0.7e9, 1.3e9, 2.2e9, 0.4e9, 5.0e9, 0.9e9, 1.7e9];
    median_ns(repetitions, || {
        let _ = black_box(proportional_allocation(black_box(&capacities), 16));
    })
}

/// The default payload's SoC cost of each stage of `app`, in ns.
pub fn soc_stage_costs_ns(calibration: &Calibration, app: App, slowdown: f64) -> Vec<f64> {
    calibration
        .app(app)
        .stages
        .iter()
        .map(|stage| stage.portable_cost.at(DEFAULT_PAYLOAD_BYTES as u64) * slowdown)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The context-switch measurement freed its thread to CPUs 0 to n
    /// afterwards, whatever set it ran in (a `taskset`, a cpuset): it
    /// gives the thread back the set it had.
    #[test]
    fn measuring_a_context_switch_gives_the_thread_its_cpus_back() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cpus < 2 {
            return;
        }
        std::thread::spawn(|| {
            let mut only_second = rustix::thread::CpuSet::new();
            only_second.set(1);
            rustix::thread::sched_setaffinity(None, &only_second).unwrap();
            let (_, pinned) = context_switch_ns(3).unwrap();
            assert!(pinned, "both threads pinned to the first CPU of the set");
            let after = rustix::thread::sched_getaffinity(None).unwrap();
            assert!(
                after.is_set(1) && !after.is_set(0),
                "the thread's set came back"
            );
        })
        .join()
        .unwrap();
    }

    /// A calibration file's costs were bounded only below: a detection of
    /// 10^19 ns overflowed virtual time at the first detection.
    #[test]
    fn a_calibration_with_a_cost_past_a_second_is_refused() {
        let mut huge = Calibration::fixed_for_tests();
        huge.detection_ns = 1e19;
        assert!(matches!(
            huge.check(),
            Err(CalibrationError::BadCost { .. })
        ));
        let mut slow_stage = Calibration::fixed_for_tests();
        slow_stage.apps[0].stages[0].portable_cost = CostCurve::line(0.0, 1e16);
        assert!(matches!(
            slow_stage.check(),
            Err(CalibrationError::BadCost { .. })
        ));
        assert!(Calibration::fixed_for_tests().check().is_ok());
    }

    /// Each measured size costs its median, sizes between cost what the
    /// straight line between their neighbours says, smaller ones the
    /// smallest's, and larger ones follow the last segment unless it falls.
    #[test]
    fn a_curve_is_its_medians_joined_by_lines() {
        // A cost that grows with the square of the payload, as Spark's
        // spatial join does: a least-squares line missed 1 KiB by 2.4x.
        let square = CostCurve {
            medians_ns: vec![(256, 64.0), (1024, 1024.0), (4096, 16384.0)],
        };
        assert_eq!(square.at(256), 64.0);
        assert_eq!(square.at(1024), 1024.0);
        assert_eq!(square.at(4096), 16384.0);
        assert_eq!(square.at(640), 544.0);
        assert_eq!(square.at(64), 64.0, "below the smallest: its cost");
        assert_eq!(square.at(8192), 16384.0 + 5.0 * 4096.0);
        let falling = CostCurve {
            medians_ns: vec![(256, 100.0), (4096, 90.0)],
        };
        assert_eq!(falling.at(1 << 16), 90.0, "flat past a falling end");
        assert_eq!(CostCurve::line(36.0, 0.25).at(1024), 292.0);
        assert_eq!(square.scaled(2.0).at(640), 1088.0);
    }

    /// The spatial join's (and every stage's) cost at the default payload
    /// is the median measured there, not a line's guess.
    #[test]
    fn every_stage_cost_at_the_default_payload_is_its_measured_median() {
        let calibration = Calibration::measure(3).unwrap();
        let default = DEFAULT_PAYLOAD_BYTES;
        for app in &calibration.apps {
            for stage in &app.stages {
                for curve in [&stage.cost, &stage.portable_cost] {
                    let measured = curve.medians_ns.iter().find(|(bytes, _)| *bytes == default);
                    assert_eq!(measured.map(|&(_, ns)| ns), Some(curve.at(default as u64)));
                }
            }
        }
    }

    #[test]
    fn a_curve_from_a_file_with_unsorted_or_too_many_points_is_refused() {
        let mut unsorted = Calibration::fixed_for_tests();
        unsorted.apps[0].stages[0].cost.medians_ns.reverse();
        assert!(matches!(
            unsorted.check(),
            Err(CalibrationError::BadCost { .. })
        ));
        // Cheap at the largest payload, 1e300 ns at the smallest: a
        // 64-byte request's time overflowed virtual time.
        let mut falling = Calibration::fixed_for_tests();
        falling.apps[0].stages[0].portable_cost = CostCurve {
            medians_ns: vec![(64, 1e300), (65536, 1.0)],
        };
        assert!(matches!(
            falling.check(),
            Err(CalibrationError::BadCost { .. })
        ));
        let mut crowded = Calibration::fixed_for_tests();
        crowded.apps[0].cpu_version.medians_ns = (1..=65).map(|bytes| (bytes, 10.0)).collect();
        assert!(matches!(
            crowded.check(),
            Err(CalibrationError::BadCost { .. })
        ));
    }

    #[test]
    fn a_quick_measurement_covers_every_stage_with_positive_costs() {
        let calibration = Calibration::measure(3).unwrap();
        for app in App::ALL {
            let measured = calibration.app(app);
            assert_eq!(measured.stages.len(), app.stages().len());
            for stage in &measured.stages {
                assert!(stage.cost.at(1024) > 0.0, "{stage:?}");
            }
            assert!(measured.cpu_version.at(1024) > 0.0);
        }
        // Measured, a switch costs something: at 0 (the measurement's
        // floor) the time-sharing baselines would pay nothing.
        assert!(calibration.context_switch_ns > 0.0);
        assert!(calibration.detection_ns > 0.0);
        calibration.check().unwrap();
    }

    /// A calibration file with a stage listed twice ran that stage as a
    /// third processing stage; one with its stages swapped charged each
    /// the other's cost. Both are refused.
    #[test]
    fn a_calibration_file_with_repeated_or_reordered_stages_is_refused() {
        let good = Calibration::fixed_for_tests();
        good.check().unwrap();
        let mut repeated = good.clone();
        let first = repeated.apps[0].stages[0].clone();
        repeated.apps[0].stages.push(first);
        assert!(matches!(
            repeated.check(),
            Err(CalibrationError::StagesOutOfOrder { .. })
        ));
        let mut reordered = good.clone();
        reordered.apps[0].stages.reverse();
        assert!(matches!(
            reordered.check(),
            Err(CalibrationError::StagesOutOfOrder { .. })
        ));
    }

    /// A first call slowed (preempted, or cold) sized every batch at one
    /// call, and each sample timed the clock with the work: a call of a
    /// nanosecond measured tens. Here the untimed call and the first timed
    /// one are slow.
    #[test]
    fn a_slow_first_call_does_not_leave_the_clock_in_every_sample() {
        // What timing one call costs on this machine: the clock's reads.
        let clock_ns = (0..100)
            .map(|_| {
                let started = Instant::now();
                std::hint::black_box(started.elapsed().as_nanos())
            })
            .min()
            .unwrap() as f64;
        let mut calls = 0u64;
        let median = median_ns(9, || {
            calls += 1;
            if calls <= 2 {
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            std::hint::black_box(calls);
        });
        assert!(
            median < (clock_ns / 4.0).max(2.0),
            "a near-free call measured {median} ns, the clock costing {clock_ns} ns"
        );
    }

    /// A calibration file missing an app panicked the benchmark, and one
    /// with a free stage gave its agent infinite capacity (another panic).
    #[test]
    fn a_calibration_file_missing_an_app_or_with_a_free_stage_is_refused() {
        let measured = Calibration::measure(3).unwrap();
        let mut missing = measured.clone();
        missing
            .apps
            .retain(|calibration| calibration.app != App::Spark);
        assert!(matches!(
            missing.check(),
            Err(CalibrationError::MissingApp("spark"))
        ));
        let mut free = measured.clone();
        free.apps[0].stages[0].cost = CostCurve::line(0.0, 0.0);
        assert!(matches!(
            free.check(),
            Err(CalibrationError::BadCost { .. })
        ));
        // Free at its smallest size only: it passed, and splitting the
        // cores for the bound on a partition panicked on 1 / 0.
        let mut free_when_small = measured.clone();
        free_when_small.apps[0].stages[0].cost = CostCurve {
            medians_ns: vec![(MIN_PAYLOAD_BYTES, 0.0), (MAX_PAYLOAD_BYTES, 5.0)],
        };
        assert!(matches!(
            free_when_small.check(),
            Err(CalibrationError::BadCost { .. })
        ));
        let mut without_stage = measured;
        without_stage.apps[0].stages.pop();
        assert!(matches!(
            without_stage.check(),
            Err(CalibrationError::MissingStage { .. })
        ));
    }
}
