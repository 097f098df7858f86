//! TIGA's adaptive core allocator (§4.1, Eq. 1-4) and its SmartNIC-CPU
//! co-processing controller (§4.2), with no clock and no I/O: the
//! simulator hands each detection period's counters to
//! [`Controller::on_period`] and applies what it decides (the rack's NDP
//! engine forwards a fixed share instead, `forward_every`).

use serde::Serialize;

/// Why Eq. 4 could not be solved.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AllocationError {
    #[error("{cores} cores cannot give each of {agents} processing agents one")]
    TooFewCores { cores: usize, agents: usize },
    #[error("processing agent {agent} has capacity {capacity}: it must be positive and finite")]
    BadCapacity { agent: usize, capacity: f64 },
    #[error("the forwarding step is {0}: it must be in (0, 0.5], so that forwarding stops short of everything")]
    BadStep(f64),
    #[error("the mismatch tolerance is {0}: it must be in [0, 1)")]
    BadTolerance(f64),
}

/// Eq. 4: C_i = C_total / (P_i · Σ_k 1/P_k), where P_i is one core's
/// processing capacity in PA i (bytes per second of busy time), then
/// rounded to integers with at least one core each, summing to
/// `total_cores`. Rounding serves Eq. 2's goal, equal throughput: each
/// core past the first goes to the PA whose throughput C_i · P_i is then
/// lowest, the pipeline's bottleneck. (Rounding each share to its nearest
/// integer can starve the bottleneck: shares 6.7 and 1.3 round to 7:1,
/// where 6:2 serves more.)
pub fn proportional_allocation(
    capacities: &[f64],
    total_cores: usize,
) -> Result<Vec<usize>, AllocationError> {
    if total_cores < capacities.len() || capacities.is_empty() {
        return Err(AllocationError::TooFewCores {
            cores: total_cores,
            agents: capacities.len(),
        });
    }
    if let Some((agent, &capacity)) = capacities
        .iter()
        .enumerate()
        .find(|(_, capacity)| !(capacity.is_finite() && **capacity > 0.0))
    {
        return Err(AllocationError::BadCapacity { agent, capacity });
    }
    // Filling from one core each, one core at a time to the current
    // bottleneck, maximises the slowest PA's throughput among integer
    // splits (throughput grows linearly with cores), and lands within a
    // core of Eq. 4's real-valued shares.
    let mut cores = vec![1usize; capacities.len()];
    let throughput = |cores: usize, agent: usize| cores as f64 * capacities[agent];
    for _ in capacities.len()..total_cores {
        let bottleneck = (0..cores.len())
            .min_by(|&a, &b| {
                throughput(cores[a], a)
                    .total_cmp(&throughput(cores[b], b))
                    .then(a.cmp(&b))
            })
            .expect("at least one agent");
        cores[bottleneck] += 1;
    }
    debug_assert_eq!(cores.iter().sum::<usize>(), total_cores);
    debug_assert!(cores.iter().all(|&count| count >= 1));
    Ok(cores)
}

/// What the NIC measured over one detection period.
#[derive(Debug, Clone, PartialEq)]
pub struct PeriodCounters {
    /// Bytes of requests that reached the NIC's pipelines (dropped ones
    /// included: they are demand the NIC did not meet).
    pub inbound_bytes: u64,
    /// Bytes of requests the NIC finished.
    pub outbound_bytes: u64,
    /// Each PA's per-core capacity since the last reallocation (bytes per
    /// busy second), or `None` for a PA that has not worked since.
    pub capacities: Vec<Option<f64>>,
}

/// The controller's decision for one period.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeriodDecision {
    pub mismatch: bool,
    /// The new allocation, when it differs from the current one.
    pub reallocation: Option<Vec<usize>>,
    /// The share of requests forwarded to the CN from now on, in [0, 1].
    pub forwarding_ratio: f64,
}

/// How TIGA's controller behaves: the allocator on or off (FairNIC is the
/// even split, never changed), co-processing on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ControllerMode {
    pub reallocate: bool,
    pub coprocess: bool,
}

/// Consecutive periods that trigger co-processing, and that count as
/// stable before it steps down (§4.2: three).
const STREAK: u32 = 3;

/// The allocator and the co-processing state machine.
#[derive(Debug, Clone)]
pub struct Controller {
    mode: ControllerMode,
    total_cores: usize,
    allocation: Vec<usize>,
    tolerance: f64,
    /// Forwarding in whole steps, so that repeated steps are exact.
    forwarding_steps: u32,
    max_forwarding_steps: u32,
    step: f64,
    mismatch_streak: u32,
    identical_streak: u32,
    stable_streak: u32,
    last_target: Option<Vec<usize>>,
}

/// A forwarding step the controller can take: positive, and at most half,
/// so that forwarding stops short of everything.
pub fn is_forwarding_step(step: f64) -> bool {
    step > 0.0 && step <= 0.5
}

/// A mismatch tolerance: a share of the inflow, from 0 up to (not) all.
pub fn is_mismatch_tolerance(tolerance: f64) -> bool {
    (0.0..1.0).contains(&tolerance)
}

impl Controller {
    /// Cores start split equally (§4.1), the remainder to the first PAs.
    pub fn new(
        mode: ControllerMode,
        agents: usize,
        total_cores: usize,
        step: f64,
        tolerance: f64,
    ) -> Result<Controller, AllocationError> {
        // Checked here too, for callers that drive the controller without
        // a `SocConfig` (a NaN step made the ratio read 1.0 at once; a NaN
        // tolerance never saw a mismatch).
        if !is_forwarding_step(step) {
            return Err(AllocationError::BadStep(step));
        }
        if !is_mismatch_tolerance(tolerance) {
            return Err(AllocationError::BadTolerance(tolerance));
        }
        let allocation = proportional_allocation(&vec![1.0; agents], total_cores)?;
        Ok(Controller {
            mode,
            total_cores,
            allocation,
            tolerance,
            forwarding_steps: 0,
            // Forwarding stops a step short of everything: at 100% the
            // SmartNIC sees no inflow, which reads as a match, so the
            // controller would step down and up again while the NIC idles,
            // and TIGA would be CPU-only with extra hops.
            max_forwarding_steps: ((1.0 / step).ceil() as u32).saturating_sub(1).max(1),
            step,
            mismatch_streak: 0,
            identical_streak: 0,
            stable_streak: 0,
            last_target: None,
        })
    }

    pub fn allocation(&self) -> &[usize] {
        &self.allocation
    }

    pub fn forwarding_ratio(&self) -> f64 {
        (self.forwarding_steps as f64 * self.step).min(1.0)
    }

    /// One detection period's decision.
    pub fn on_period(&mut self, counters: &PeriodCounters) -> PeriodDecision {
        let mismatch = (counters.outbound_bytes as f64)
            < counters.inbound_bytes as f64 * (1.0 - self.tolerance);
        let reallocation = if mismatch {
            self.on_mismatch(counters)
        } else {
            self.on_match()
        };
        PeriodDecision {
            mismatch,
            reallocation,
            forwarding_ratio: self.forwarding_ratio(),
        }
    }

    fn on_mismatch(&mut self, counters: &PeriodCounters) -> Option<Vec<usize>> {
        self.mismatch_streak += 1;
        self.stable_streak = 0;
        let target = self.target(counters);
        if let Some(target) = &target {
            if self.last_target.as_ref() == Some(target) {
                self.identical_streak += 1;
            } else {
                self.identical_streak = 1;
            }
        }
        self.last_target.clone_from(&target);
        if self.mode.coprocess {
            let triggered = self.mismatch_streak >= STREAK && self.identical_streak >= STREAK;
            // Once forwarding, every period still mismatched adds a step.
            if self.forwarding_steps > 0 || triggered {
                self.forwarding_steps = (self.forwarding_steps + 1).min(self.max_forwarding_steps);
            }
        }
        let target = target.filter(|target| *target != self.allocation)?;
        self.allocation.clone_from(&target);
        Some(target)
    }

    fn on_match(&mut self) -> Option<Vec<usize>> {
        self.mismatch_streak = 0;
        self.identical_streak = 0;
        self.stable_streak += 1;
        if self.mode.coprocess && self.stable_streak >= STREAK && self.forwarding_steps > 0 {
            self.forwarding_steps -= 1;
        }
        None
    }

    /// Eq. 4 over the measured capacities, when the allocator is on and
    /// every PA has worked since the last reallocation.
    fn target(&self, counters: &PeriodCounters) -> Option<Vec<usize>> {
        if !self.mode.reallocate {
            return None;
        }
        let capacities: Option<Vec<f64>> = counters.capacities.iter().copied().collect();
        proportional_allocation(&capacities?, self.total_cores).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The controller took any step and tolerance: a NaN step read as
    /// forwarding everything before any mismatch, a step of 2 forwarded
    /// everything, and a NaN tolerance never saw a mismatch.
    #[test]
    fn a_controller_with_a_bad_step_or_tolerance_is_refused() {
        let mode = ControllerMode {
            reallocate: true,
            coprocess: true,
        };
        for step in [f64::NAN, 0.0, 2.0, -0.1] {
            assert!(matches!(
                Controller::new(mode, 2, 8, step, 0.02),
                Err(AllocationError::BadStep(_))
            ));
        }
        for tolerance in [f64::NAN, -0.1, 1.0] {
            assert!(matches!(
                Controller::new(mode, 2, 8, 0.1, tolerance),
                Err(AllocationError::BadTolerance(_))
            ));
        }
        assert!(Controller::new(mode, 2, 8, 0.1, 0.02).is_ok());
    }

    #[test]
    fn equation_four_balances_throughput() {
        // One stage is three times as fast per core: it gets a quarter.
        assert_eq!(proportional_allocation(&[3.0, 1.0], 8).unwrap(), vec![2, 6]);
        assert_eq!(proportional_allocation(&[1.0, 1.0], 8).unwrap(), vec![4, 4]);
        // A very fast stage still keeps one core.
        assert_eq!(
            proportional_allocation(&[1000.0, 1.0], 8).unwrap(),
            vec![1, 7]
        );
    }

    #[test]
    fn bad_inputs_get_typed_errors() {
        assert_eq!(
            proportional_allocation(&[1.0, 1.0, 1.0], 2),
            Err(AllocationError::TooFewCores {
                cores: 2,
                agents: 3
            })
        );
        assert!(matches!(
            proportional_allocation(&[1.0, f64::NAN], 8),
            Err(AllocationError::BadCapacity { agent: 1, .. })
        ));
    }

    proptest! {
        #[test]
        fn allocations_sum_to_the_total_with_one_core_each(
            capacities in proptest::collection::vec(0.001f64..1e9, 1..8),
            extra in 0usize..24,
        ) {
            let total = capacities.len() + extra;
            let cores = proportional_allocation(&capacities, total).unwrap();
            prop_assert_eq!(cores.iter().sum::<usize>(), total);
            prop_assert!(cores.iter().all(|&count| count >= 1));
            // No single move of a core raises the bottleneck's throughput:
            // the rounding is the best integer split one step away.
            let bottleneck = |cores: &[usize]| {
                cores.iter().zip(&capacities).map(|(&c, p)| c as f64 * p).fold(f64::INFINITY, f64::min)
            };
            let best = bottleneck(&cores);
            for from in 0..cores.len() {
                for to in 0..cores.len() {
                    if from != to && cores[from] > 1 {
                        let mut moved = cores.clone();
                        moved[from] -= 1;
                        moved[to] += 1;
                        prop_assert!(bottleneck(&moved) <= best * (1.0 + 1e-9), "{:?} -> {:?} beaten by {:?}", capacities, cores, moved);
                    }
                }
            }
        }
    }

    fn counters(inbound: u64, outbound: u64, capacities: &[f64]) -> PeriodCounters {
        PeriodCounters {
            inbound_bytes: inbound,
            outbound_bytes: outbound,
            capacities: capacities.iter().map(|&c| Some(c)).collect(),
        }
    }

    const TIGA: ControllerMode = ControllerMode {
        reallocate: true,
        coprocess: true,
    };

    #[test]
    fn a_mismatch_reallocates_and_a_match_does_not() {
        let mut controller = Controller::new(TIGA, 2, 8, 0.1, 0.02).unwrap();
        assert_eq!(controller.allocation(), &[4, 4]);
        let decision = controller.on_period(&counters(100, 100, &[7.0, 1.0]));
        assert_eq!(
            decision,
            PeriodDecision {
                mismatch: false,
                reallocation: None,
                forwarding_ratio: 0.0
            }
        );
        let decision = controller.on_period(&counters(100, 50, &[7.0, 1.0]));
        assert_eq!(decision.reallocation, Some(vec![1, 7]));
    }

    #[test]
    fn coprocessing_starts_after_three_identical_mismatches_and_steps_back_when_stable() {
        let mut controller = Controller::new(TIGA, 2, 8, 0.1, 0.02).unwrap();
        let overloaded = counters(100, 50, &[7.0, 1.0]);
        for _ in 0..2 {
            assert_eq!(controller.on_period(&overloaded).forwarding_ratio, 0.0);
        }
        // Third mismatch, third identical target: forward one in ten.
        assert!((controller.on_period(&overloaded).forwarding_ratio - 0.1).abs() < 1e-9);
        // Still mismatched: one more step each period.
        assert!((controller.on_period(&overloaded).forwarding_ratio - 0.2).abs() < 1e-9);
        let matched = counters(100, 100, &[7.0, 1.0]);
        assert!((controller.on_period(&matched).forwarding_ratio - 0.2).abs() < 1e-9);
        assert!((controller.on_period(&matched).forwarding_ratio - 0.2).abs() < 1e-9);
        // Three stable periods: step down, and on while stable.
        assert!((controller.on_period(&matched).forwarding_ratio - 0.1).abs() < 1e-9);
        assert!(controller.on_period(&matched).forwarding_ratio.abs() < 1e-9);
        assert!(controller.on_period(&matched).forwarding_ratio.abs() < 1e-9);
    }

    #[test]
    fn without_coprocessing_or_reallocation_the_controller_only_watches() {
        let fair = ControllerMode {
            reallocate: false,
            coprocess: false,
        };
        let mut controller = Controller::new(fair, 2, 8, 0.1, 0.02).unwrap();
        for _ in 0..10 {
            let decision = controller.on_period(&counters(100, 10, &[7.0, 1.0]));
            assert!(decision.mismatch && decision.reallocation.is_none());
            assert_eq!(decision.forwarding_ratio, 0.0);
        }
        assert_eq!(controller.allocation(), &[4, 4]);
    }

    #[test]
    fn forwarding_never_passes_everything() {
        // However long the SmartNIC stays overloaded, forwarding stops a
        // step short of everything: 9 steps of 10%, 3 of 30% (90%), 2 of
        // 40% (80%).
        for (step, ceiling) in [(0.1, 0.9), (0.3, 0.9), (0.4, 0.8), (0.5, 0.5)] {
            let mut controller = Controller::new(TIGA, 2, 8, step, 0.02).unwrap();
            let mut highest: f64 = 0.0;
            for _ in 0..40 {
                let decision = controller.on_period(&counters(100, 1, &[1.0, 1.0]));
                highest = highest.max(decision.forwarding_ratio);
            }
            assert!((highest - ceiling).abs() < 1e-9, "step {step}: {highest}");
        }
    }
}
