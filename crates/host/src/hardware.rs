//! A NIC's hardware costs in the simulator. The soft RNIC acts on a frame
//! the instant it arrives; a real RNIC does not: each verb costs pipeline
//! time, a port processes a bounded number of messages per second, a
//! responder's READ or atomic waits on a PCIe round trip to host memory,
//! what a frame brings for the host lands there by a PCIe write, and
//! atomics to one cache line are serialized. A [`HardwareProfile`]
//! states those costs; a [`NicPipeline`] charges them to the frames
//! between the simulator and the soft RNIC, in both directions, keeping
//! each direction's order (RC needs its frames in PSN order).
//!
//! The `ideal` profile charges nothing and is the default: every earlier
//! simulated figure stays as it was. The profiles' files
//! (`profiles/*.toml`) cite a published measurement for every value.

use remora_base::Timestamp;
use remora_wire::frame::RoceFrame;
use remora_wire::opcode::OpcodeFamily;
use serde::Deserialize;
use std::collections::BTreeMap;

/// The profiles compiled in, by name.
const PROFILES: [(&str, &str); 2] = [
    ("ideal", include_str!("../profiles/ideal.toml")),
    ("cx5", include_str!("../profiles/cx5.toml")),
];

/// Which NIC a simulated host has: a name for the compiled-in profiles
/// that configurations can copy around.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NicHardware {
    /// No NIC costs: the simulator as it always was.
    #[default]
    Ideal,
    /// A ConnectX-5 at 100 Gb/s, from published measurements.
    Cx5,
}

impl NicHardware {
    pub const ALL: [NicHardware; 2] = [NicHardware::Ideal, NicHardware::Cx5];

    pub fn name(self) -> &'static str {
        match self {
            NicHardware::Ideal => "ideal",
            NicHardware::Cx5 => "cx5",
        }
    }

    /// Its profile, checked; each compiled-in file is parsed once per
    /// process, not once per simulated host.
    pub fn profile(self) -> HardwareProfile {
        static PARSED: std::sync::OnceLock<Vec<HardwareProfile>> = std::sync::OnceLock::new();
        let parsed = PARSED.get_or_init(|| {
            NicHardware::ALL
                .iter()
                .map(|hardware| {
                    HardwareProfile::named(hardware.name())
                        .expect("compiled-in profiles are checked by tests")
                })
                .collect()
        });
        parsed[self as usize].clone()
    }
}

impl std::str::FromStr for NicHardware {
    type Err = ProfileError;

    fn from_str(name: &str) -> Result<NicHardware, ProfileError> {
        NicHardware::ALL
            .into_iter()
            .find(|hardware| hardware.name() == name)
            .ok_or_else(|| ProfileError::Unknown(name.into()))
    }
}

/// Frames a pipeline holds per direction; more are dropped, as a NIC
/// whose receive buffer is full drops them, and the RC transport
/// retransmits.
pub const MAX_FRAMES_HELD: usize = 8192;

/// Cache lines whose atomic serialization is remembered at once; an
/// older line's is forgotten (its atomics are long done).
const MAX_LINES_TRACKED: usize = 4096;

/// A value of a profile and the published measurement it comes from.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cited {
    pub value: f64,
    pub source: String,
}

/// One NIC's costs, each cited.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareProfile {
    pub name: String,
    pub description: String,
    /// Time a received frame spends in the NIC before the transport acts
    /// on it (ns).
    pub receive_pipeline_ns: Cited,
    /// Time a frame spends in the NIC between the transport and the wire
    /// (ns).
    pub transmit_pipeline_ns: Cited,
    /// Messages one port processes per second, each way (0: no limit).
    pub messages_per_second: Cited,
    /// A responder's READ or atomic reads host memory over PCIe first (ns).
    pub pcie_round_trip_ns: Cited,
    /// A DMA write into host memory: what a received frame carries for the
    /// host (a WRITE's or SEND's payload, a READ's answer, an atomic's old
    /// value, a completion) is visible to the host's CPU only this long
    /// after the NIC has it (ns).
    pub pcie_write_ns: Cited,
    /// Atomics to one cache line run one at a time, each holding the line
    /// this long (ns).
    pub atomic_same_line_ns: Cited,
    /// The unit atomics are serialized on (bytes).
    pub cache_line_bytes: Cited,
    /// READs and atomics a queue pair has outstanding, as initiator and
    /// as target (the device's max_qp_rd_atom).
    pub max_read_atomic: Cited,
    /// Published measurements the profile is validated against.
    #[serde(default, rename = "validation")]
    pub validations: Vec<Validation>,
}

/// A published figure a simulated microbenchmark must come within 15% of.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Validation {
    /// Which simulated microbenchmark it checks (`read_latency_us`,
    /// `write_latency_us`, `read_rate_mops`, `write_rate_mops`,
    /// `same_address_atomic_rate_mops`).
    pub measure: String,
    pub value: f64,
    pub unit: String,
    pub source: String,
}

/// Why a profile was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error("no hardware profile named {0:?}: use ideal or cx5")]
    Unknown(String),
    #[error("hardware profile {name}: {error}")]
    Syntax {
        name: String,
        error: toml::de::Error,
    },
    #[error("hardware profile {name}: {field} is {value}: {rule}")]
    Invalid {
        name: String,
        field: &'static str,
        value: f64,
        rule: &'static str,
    },
    #[error("hardware profile {name}: no microbenchmark measures {measure:?}")]
    UnknownMeasure { name: String, measure: String },
    #[error("hardware profile {name}: {measure} is measured in {unit}, not {given}")]
    Unit {
        name: String,
        measure: String,
        given: String,
        unit: &'static str,
    },
}

impl HardwareProfile {
    /// The profile named `name`, checked.
    pub fn named(name: &str) -> Result<HardwareProfile, ProfileError> {
        let (_, text) = PROFILES
            .iter()
            .find(|(known, _)| *known == name)
            .ok_or_else(|| ProfileError::Unknown(name.into()))?;
        let profile: HardwareProfile =
            toml::from_str(text).map_err(|error| ProfileError::Syntax {
                name: name.into(),
                error,
            })?;
        profile.check()?;
        Ok(profile)
    }

    /// Today's simulator: no NIC costs.
    pub fn ideal() -> HardwareProfile {
        NicHardware::Ideal.profile()
    }

    /// Refuses values the pipeline cannot charge (a negative or absurd
    /// time, a cache line that is not a power of two, no READ/atomic
    /// slot). The compiled-in profiles are checked when parsed; a profile
    /// built in code is checked when a host takes it.
    pub fn check(&self) -> Result<(), ProfileError> {
        let invalid = |field, value, rule| ProfileError::Invalid {
            name: self.name.clone(),
            field,
            value,
            rule,
        };
        let times = [
            ("receive_pipeline_ns", &self.receive_pipeline_ns),
            ("transmit_pipeline_ns", &self.transmit_pipeline_ns),
            ("pcie_round_trip_ns", &self.pcie_round_trip_ns),
            ("pcie_write_ns", &self.pcie_write_ns),
            ("atomic_same_line_ns", &self.atomic_same_line_ns),
            ("messages_per_second", &self.messages_per_second),
        ];
        for (field, cited) in times {
            if !(0.0..=1e10).contains(&cited.value) {
                return Err(invalid(field, cited.value, "from 0 to 10^10"));
            }
        }
        // Whole numbers: 8.5 was checked as 8 and charged as 8.
        let line = self.cache_line_bytes.value;
        if !(line >= 8.0 && line.fract() == 0.0 && (line as u64).is_power_of_two()) {
            return Err(invalid(
                "cache_line_bytes",
                line,
                "a power of two, at least 8",
            ));
        }
        let slots = self.max_read_atomic.value;
        if !((1.0..=128.0).contains(&slots) && slots.fract() == 0.0) {
            return Err(invalid(
                "max_read_atomic",
                slots,
                "a whole number from 1 to 128",
            ));
        }
        // A published figure of 0 (or NaN) made its relative error NaN or
        // infinite, and the largest error, a fold with f64::max, skipped
        // the NaN: the check passed at 0 %.
        for validation in &self.validations {
            if !(validation.value.is_finite() && validation.value > 0.0) {
                return Err(invalid(
                    "validation",
                    validation.value,
                    "a published figure above 0",
                ));
            }
            // The unit is what the simulated figure is in: a figure given
            // in another (1910 ns for a latency in µs) was compared as if
            // it were in that one, and printed with the wrong unit.
            let unit = crate::validation::unit_of(&validation.measure).ok_or_else(|| {
                ProfileError::UnknownMeasure {
                    name: self.name.clone(),
                    measure: validation.measure.clone(),
                }
            })?;
            if validation.unit != unit {
                return Err(ProfileError::Unit {
                    name: self.name.clone(),
                    measure: validation.measure.clone(),
                    given: validation.unit.clone(),
                    unit,
                });
            }
        }
        Ok(())
    }

    /// Whether the profile charges nothing (the frames then skip the
    /// pipeline entirely).
    pub fn is_free(&self) -> bool {
        [
            &self.receive_pipeline_ns,
            &self.transmit_pipeline_ns,
            &self.pcie_round_trip_ns,
            &self.pcie_write_ns,
            &self.atomic_same_line_ns,
            &self.messages_per_second,
        ]
        .iter()
        .all(|cited| cited.value == 0.0)
    }

    fn nanoseconds(cited: &Cited) -> u64 {
        cited.value.round() as u64
    }

    /// Time one message holds a port's pipeline, the inverse of its rate,
    /// in picoseconds: whole nanoseconds made ConnectX-5's 103.56 M
    /// messages a second (9.66 ns) into 100 M.
    fn message_interval_ps(&self) -> u64 {
        match self.messages_per_second.value {
            rate if rate > 0.0 => (1e12 / rate).round() as u64,
            _ => 0,
        }
    }
}

/// Which frames a direction keeps in order among themselves: a received
/// frame's destination queue pair (RC needs each queue pair's frames in
/// PSN order; a real NIC runs different queue pairs' work side by side),
/// or one flow for everything the NIC sends (the wire's order).
type Flow = u32;

/// The flow of frames that are not RoCE, and of the transmit direction.
const ONE_FLOW: Flow = u32::MAX;

/// One direction of a NIC's pipeline: each flow's frames leave in the
/// order they came, each no earlier than its own costs allow; a frame
/// waiting on its costs holds back only its own flow.
#[derive(Debug, Default)]
struct Direction {
    /// Frames by release time, then by arrival.
    held: BTreeMap<(u64, u64), Vec<u8>>,
    /// Frames admitted so far: the arrival order among equal releases.
    admitted: u64,
    /// When the port can start its next message, in picoseconds.
    port_free_at_ps: u64,
    /// When each flow's last frame leaves: none of the flow's leaves
    /// before it (order).
    last_release: BTreeMap<Flow, u64>,
    dropped: u64,
}

impl Direction {
    /// Admits a frame that arrived at `now` and whose own costs end
    /// `cost_ns` after the port takes it, returning when it is ready; a
    /// full pipeline drops it.
    fn admit(&mut self, now: u64, interval_ps: u64, cost_ns: u64) -> Option<u64> {
        if self.held.len() >= MAX_FRAMES_HELD {
            self.dropped += 1;
            return None;
        }
        self.forget_flows_done(now);
        let start_ps = now.saturating_mul(1000).max(self.port_free_at_ps);
        self.port_free_at_ps = start_ps.saturating_add(interval_ps);
        Some(start_ps.div_ceil(1000).saturating_add(cost_ns))
    }

    /// Forgets the flows whose last frame has left by `now`: a frame
    /// admitted now is ready no earlier, so they hold nothing back. Only
    /// flows with a frame still held remain (at most `MAX_FRAMES_HELD`),
    /// so pruning at twice that is amortized over as many admissions.
    fn forget_flows_done(&mut self, now: u64) {
        if self.last_release.len() >= 2 * MAX_FRAMES_HELD {
            self.last_release.retain(|_, release| *release > now);
        }
        debug_assert!(self.last_release.len() < 2 * MAX_FRAMES_HELD);
    }

    /// The earliest a frame of `flow` ready at `ready` can leave: a
    /// flow's frames leave in the order they came.
    fn in_order(&self, flow: Flow, ready: u64) -> u64 {
        ready.max(self.last_release.get(&flow).copied().unwrap_or(0))
    }

    fn hold(&mut self, flow: Flow, ready: u64, frame: &[u8]) {
        let release = self.in_order(flow, ready);
        self.last_release.insert(flow, release);
        self.admitted += 1;
        self.held.insert((release, self.admitted), frame.to_vec());
    }

    fn next_release(&self) -> Option<Timestamp> {
        let ((release, _), _) = self.held.first_key_value()?;
        Some(Timestamp::from_nanos(*release))
    }

    fn take_due(&mut self, now: Timestamp) -> Option<Vec<u8>> {
        if self.next_release()? > now {
            return None;
        }
        self.held.pop_first().map(|(_, frame)| frame)
    }
}

/// What a pipeline has counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PipelineCounters {
    pub received_dropped: u64,
    pub transmitted_dropped: u64,
    /// Atomics that waited for their cache line.
    pub atomics_serialized: u64,
}

/// The costs of one NIC's hardware, charged to its frames.
#[derive(Debug)]
pub struct NicPipeline {
    profile: HardwareProfile,
    receive: Direction,
    transmit: Direction,
    /// When each recently used cache line is free for the next atomic.
    line_free_at: BTreeMap<u64, u64>,
    atomics_serialized: u64,
}

impl NicPipeline {
    pub fn new(profile: HardwareProfile) -> NicPipeline {
        NicPipeline {
            profile,
            receive: Direction::default(),
            transmit: Direction::default(),
            line_free_at: BTreeMap::new(),
            atomics_serialized: 0,
        }
    }

    pub fn profile(&self) -> &HardwareProfile {
        &self.profile
    }

    /// A frame from the wire, at `now`. A responder's READ request or
    /// atomic also waits for a PCIe round trip, and an atomic for its
    /// cache line; what the other frames carry lands by a PCIe write.
    pub fn handle_received(&mut self, now: Timestamp, frame: &[u8]) {
        let now = now.as_nanos();
        let interval = self.profile.message_interval_ps();
        let mut cost = HardwareProfile::nanoseconds(&self.profile.receive_pipeline_ns);
        let parsed = RoceFrame::new_checked(frame).ok();
        let family = parsed.map(|parsed| parsed.opcode().family());
        cost += match family {
            Some(OpcodeFamily::RdmaReadRequest | OpcodeFamily::Atomic) => {
                HardwareProfile::nanoseconds(&self.profile.pcie_round_trip_ns)
            }
            // The soft RNIC places what the frame carries and answers it
            // in one step, so this also holds back a WRITE's or SEND's
            // ACK, which a real responder sends without waiting for its
            // posted write: an over-charge of one PCIe write per ACK.
            Some(
                OpcodeFamily::Send
                | OpcodeFamily::RdmaWrite
                | OpcodeFamily::RdmaReadResponse
                | OpcodeFamily::Acknowledge
                | OpcodeFamily::AtomicAcknowledge,
            ) => HardwareProfile::nanoseconds(&self.profile.pcie_write_ns),
            Some(OpcodeFamily::CongestionNotification) | None => 0,
        };
        let Some(mut ready) = self.receive.admit(now, interval, cost) else {
            return;
        };
        let flow = parsed.map_or(ONE_FLOW, |parsed| parsed.bth().destination_qp.value());
        if let Some(atomic) = parsed.and_then(|parsed| parsed.atomic_eth()) {
            // The line is taken from when the atomic runs, which is no
            // earlier than its queue pair's frames before it leave: booked
            // from its own readiness, the line was free again while the
            // atomic still waited behind them, and the next atomic on it
            // ran too soon.
            let runs_at = self.receive.in_order(flow, ready);
            ready = self.serialize_atomic(atomic.virtual_address.0, runs_at);
        }
        self.receive.hold(flow, ready, frame);
    }

    /// Delays an atomic ready at `ready` until its cache line is free, and
    /// holds the line for the profile's time.
    fn serialize_atomic(&mut self, address: u64, ready: u64) -> u64 {
        let line = address / self.profile.cache_line_bytes.value as u64;
        let hold = HardwareProfile::nanoseconds(&self.profile.atomic_same_line_ns);
        let free_at = self.line_free_at.get(&line).copied().unwrap_or(0);
        if free_at > ready {
            self.atomics_serialized += 1;
        }
        let start = ready.max(free_at);
        if self.line_free_at.len() >= MAX_LINES_TRACKED && !self.line_free_at.contains_key(&line) {
            // Forget the line freed longest ago; nothing waits on it.
            let oldest = self
                .line_free_at
                .iter()
                .min_by_key(|(_, free)| **free)
                .map(|(line, _)| *line);
            if let Some(oldest) = oldest {
                self.line_free_at.remove(&oldest);
            }
        }
        self.line_free_at.insert(line, start.saturating_add(hold));
        start
    }

    /// Whether the transmit side takes another frame: a sender feeds it
    /// only then, so a burst past it waits in the soft RNIC's queues
    /// instead of being dropped inside the sending NIC.
    pub fn has_transmit_room(&self) -> bool {
        self.transmit.held.len() < MAX_FRAMES_HELD
    }

    /// A frame the soft RNIC sent, at `now`.
    pub fn handle_transmitted(&mut self, now: Timestamp, frame: &[u8]) {
        let interval = self.profile.message_interval_ps();
        let cost = HardwareProfile::nanoseconds(&self.profile.transmit_pipeline_ns);
        if let Some(ready) = self.transmit.admit(now.as_nanos(), interval, cost) {
            self.transmit.hold(ONE_FLOW, ready, frame);
        }
    }

    /// The next received frame whose time has come, for the soft RNIC.
    pub fn poll_received(&mut self, now: Timestamp) -> Option<Vec<u8>> {
        self.receive.take_due(now)
    }

    /// The next sent frame whose time has come, for the wire.
    pub fn poll_transmit(&mut self, now: Timestamp) -> Option<Vec<u8>> {
        self.transmit.take_due(now)
    }

    /// When a held frame is next due.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        [self.receive.next_release(), self.transmit.next_release()]
            .into_iter()
            .flatten()
            .min()
    }

    /// A crash loses what the NIC held; its counters stay (replacing the
    /// directions wiped their drop counts).
    pub fn clear(&mut self) {
        for direction in [&mut self.receive, &mut self.transmit] {
            *direction = Direction {
                dropped: direction.dropped,
                ..Direction::default()
            };
        }
        self.line_free_at.clear();
    }

    pub fn counters(&self) -> PipelineCounters {
        PipelineCounters {
            received_dropped: self.receive.dropped,
            transmitted_dropped: self.transmit.dropped,
            atomics_serialized: self.atomics_serialized,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A published figure of 0 gave a NaN relative error, which the
    /// largest-error fold skipped: the validation passed at 0 %.
    #[test]
    fn a_published_figure_of_zero_is_refused() {
        let mut profile = NicHardware::Cx5.profile();
        profile.validations[0].value = 0.0;
        assert!(matches!(
            profile.check(),
            Err(ProfileError::Invalid {
                field: "validation",
                ..
            })
        ));
    }

    #[test]
    fn every_profile_parses_and_cites_every_value() {
        for hardware in NicHardware::ALL {
            let profile = hardware.profile();
            assert_eq!(profile.name, hardware.name());
            let values = [
                &profile.receive_pipeline_ns,
                &profile.transmit_pipeline_ns,
                &profile.messages_per_second,
                &profile.pcie_round_trip_ns,
                &profile.pcie_write_ns,
                &profile.atomic_same_line_ns,
                &profile.cache_line_bytes,
                &profile.max_read_atomic,
            ];
            for value in values {
                assert!(
                    !value.source.trim().is_empty(),
                    "{}: {value:?}",
                    profile.name
                );
            }
            for validation in &profile.validations {
                assert!(!validation.source.trim().is_empty(), "{validation:?}");
            }
        }
        assert!(HardwareProfile::ideal().is_free());
        assert!(!NicHardware::Cx5.profile().is_free());
        assert!(matches!(
            "bluefield".parse::<NicHardware>(),
            Err(ProfileError::Unknown(_))
        ));
    }

    #[test]
    fn frames_leave_in_order_after_their_costs_and_a_full_pipeline_drops() {
        let mut profile = HardwareProfile::ideal();
        profile.receive_pipeline_ns.value = 100.0;
        profile.transmit_pipeline_ns.value = 50.0;
        profile.messages_per_second.value = 1e8; // One per 10 ns.
        let mut pipeline = NicPipeline::new(profile);
        let at = Timestamp::from_nanos;
        pipeline.handle_received(at(0), b"first");
        pipeline.handle_received(at(0), b"second");
        assert_eq!(pipeline.poll_timeout(), Some(at(100)));
        assert_eq!(pipeline.poll_received(at(99)), None);
        assert_eq!(
            pipeline.poll_received(at(100)).as_deref(),
            Some(&b"first"[..])
        );
        // The port took the second 10 ns after the first.
        assert_eq!(pipeline.poll_timeout(), Some(at(110)));
        assert_eq!(
            pipeline.poll_received(at(110)).as_deref(),
            Some(&b"second"[..])
        );
        pipeline.handle_transmitted(at(200), b"out");
        assert_eq!(
            pipeline.poll_transmit(at(250)).as_deref(),
            Some(&b"out"[..])
        );
        for _ in 0..=MAX_FRAMES_HELD {
            pipeline.handle_received(at(300), b"x");
        }
        assert_eq!(pipeline.counters().received_dropped, 1);
        // A crash loses the frames held, not the count of those dropped.
        pipeline.clear();
        assert_eq!(pipeline.poll_timeout(), None);
        assert_eq!(pipeline.counters().received_dropped, 1);
    }

    /// A frame of `opcode` with its headers filled in by `extend` and
    /// `payload` after them.
    fn frame_of(
        opcode: remora_wire::Opcode,
        payload: &[u8],
        extend: impl FnOnce(&mut remora_wire::frame::FrameRepr),
    ) -> Vec<u8> {
        use remora_wire::frame::{emit_frame, FrameRepr, MAX_FRAME_LEN};
        use remora_wire::{BthRepr, Ipv4Address, MacAddress, Psn, Qpn};
        let end = |last: u8| {
            (
                MacAddress([2, 0, 0, 0, 0, last]),
                Ipv4Address::new(10, 0, 0, last),
            )
        };
        let bth = BthRepr::new(opcode, Qpn::new(0x100).unwrap(), Psn::new(1));
        let mut repr = FrameRepr::between(end(1), end(2), 0xc000, bth);
        extend(&mut repr);
        let mut frame = vec![0u8; MAX_FRAME_LEN];
        let length =
            emit_frame(&repr.with_payload_len(payload.len()), payload, &mut frame).unwrap();
        frame.truncate(length);
        frame
    }

    /// A COMPARE_SWAP frame on `address`.
    fn compare_swap(address: u64) -> Vec<u8> {
        use remora_wire::{AtomicEthRepr, Opcode, Rkey, VirtAddr};
        frame_of(Opcode::CompareSwap, &[], |repr| {
            repr.extension.atomic_eth = Some(AtomicEthRepr {
                virtual_address: VirtAddr(address),
                rkey: Rkey(7),
                swap_or_add: 1,
                compare: 0,
            });
        })
    }

    /// When a frame received at time 0 reaches the soft RNIC.
    fn released_at(pipeline: &mut NicPipeline, frame: &[u8]) -> u64 {
        pipeline.handle_received(Timestamp::ZERO, frame);
        let due = pipeline.poll_timeout().expect("the frame is held");
        assert!(pipeline.poll_received(due).is_some());
        due.as_nanos()
    }

    /// What a frame carries for the host lands by a posted PCIe write; a
    /// READ request or atomic first reads host memory (a round trip); a
    /// frame that is not RoCE costs only the pipeline.
    #[test]
    fn each_received_frame_pays_the_pcie_crossing_its_work_needs() {
        use remora_wire::{Opcode, RethRepr, Rkey, VirtAddr};
        let mut profile = HardwareProfile::ideal();
        profile.receive_pipeline_ns.value = 100.0;
        profile.pcie_round_trip_ns.value = 500.0;
        profile.pcie_write_ns.value = 250.0;
        let reth = |repr: &mut remora_wire::frame::FrameRepr| {
            repr.extension.reth = Some(RethRepr {
                virtual_address: VirtAddr(0x1000),
                rkey: Rkey(7),
                dma_length: 8,
            });
        };
        let write = frame_of(Opcode::RdmaWriteOnly, &[1; 8], reth);
        let read = frame_of(Opcode::RdmaReadRequest, &[], reth);
        let mut pipeline = NicPipeline::new(profile.clone());
        assert_eq!(released_at(&mut pipeline, &write), 350);
        let mut pipeline = NicPipeline::new(profile.clone());
        assert_eq!(released_at(&mut pipeline, &read), 600);
        let mut pipeline = NicPipeline::new(profile.clone());
        assert_eq!(released_at(&mut pipeline, &compare_swap(0x1000)), 600);
        let mut pipeline = NicPipeline::new(profile);
        assert_eq!(released_at(&mut pipeline, b"not a RoCE frame"), 100);
    }

    /// Two atomics on one word, then two on another, back to back: the
    /// third was booked on its word from its own readiness, though it left
    /// only behind the second (in order), so the fourth ran 20 ns after it
    /// instead of an atomic's 341.
    #[test]
    fn an_atomic_holds_its_line_from_when_it_runs_behind_the_frames_before() {
        let mut pipeline = NicPipeline::new(NicHardware::Cx5.profile());
        let (x, y) = (0x1000, 0x2000);
        for (at, address) in [(0, x), (10, x), (20, y), (30, y)] {
            pipeline.handle_received(Timestamp::from_nanos(at), &compare_swap(address));
        }
        let mut released = Vec::new();
        // Bounded: four frames, each due within a few microseconds.
        for now in 0..10_000 {
            let now = Timestamp::from_nanos(now);
            while pipeline.poll_received(now).is_some() {
                released.push(now.as_nanos());
            }
        }
        assert_eq!(released.len(), 4);
        let hold = NicHardware::Cx5.profile().atomic_same_line_ns.value as u64;
        assert!(released[1] - released[0] >= hold, "{released:?}");
        assert!(released[3] - released[2] >= hold, "{released:?}");
    }

    /// Two COMPARE_SWAPs on one word, then a WRITE on another queue pair
    /// and one on the first: the second atomic waits for the word, and
    /// the first queue pair's WRITE behind it, but the other queue pair's
    /// WRITE did too when one order held every frame (a real NIC runs
    /// queue pairs side by side; RC orders only each queue pair's frames).
    #[test]
    fn an_atomic_waiting_for_its_word_holds_back_only_its_own_queue_pair() {
        use remora_wire::{Opcode, Qpn, RethRepr, Rkey, VirtAddr};
        let write_to = |qp: u32| {
            frame_of(Opcode::RdmaWriteOnly, &[1; 8], |repr| {
                repr.bth.destination_qp = Qpn::new(qp).unwrap();
                repr.extension.reth = Some(RethRepr {
                    virtual_address: VirtAddr(0x9000),
                    rkey: Rkey(7),
                    dma_length: 8,
                });
            })
        };
        let profile = NicHardware::Cx5.profile();
        let hold = profile.atomic_same_line_ns.value as u64;
        let mut pipeline = NicPipeline::new(profile);
        let frames = [
            ("first atomic", compare_swap(0x1000)),
            ("second atomic", compare_swap(0x1000)),
            ("other queue pair's write", write_to(0x200)),
            ("same queue pair's write", write_to(0x100)),
        ];
        for (_, frame) in &frames {
            pipeline.handle_received(Timestamp::ZERO, frame);
        }
        let mut released = std::collections::HashMap::new();
        // Bounded: four frames, each due within a few microseconds.
        for now in 0..10_000 {
            while let Some(frame) = pipeline.poll_received(Timestamp::from_nanos(now)) {
                // The two atomics are the same bytes: the first to leave
                // is the first that came.
                let (name, _) = frames
                    .iter()
                    .find(|(name, sent)| *sent == frame && !released.contains_key(name))
                    .unwrap();
                released.insert(*name, now);
            }
        }
        assert!(released["second atomic"] >= released["first atomic"] + hold);
        assert!(released["same queue pair's write"] >= released["second atomic"]);
        assert!(
            released["other queue pair's write"] < released["first atomic"] + hold,
            "{released:?}"
        );
    }

    /// ConnectX-5's 103.56 M messages a second are 9.656 ns apart; in
    /// whole nanoseconds they were 10 apart, 100 M a second.
    #[test]
    fn the_message_rate_keeps_its_fraction_of_a_nanosecond() {
        let mut profile = HardwareProfile::ideal();
        profile.messages_per_second.value = 103_564_855.0;
        let mut pipeline = NicPipeline::new(profile);
        for _ in 0..1000 {
            pipeline.handle_transmitted(Timestamp::ZERO, b"x");
        }
        let mut last = 0;
        // Bounded: 1000 frames within 10 µs.
        for now in 0..10_000 {
            while pipeline.poll_transmit(Timestamp::from_nanos(now)).is_some() {
                last = now;
            }
        }
        // The 1000th starts 999 intervals in: 9646 ns, not 9990.
        assert!((9_640..=9_650).contains(&last), "{last}");
    }
}
