//! What a rack run reports, as JSON and as a table.

use remora_carrier::wrappers::PortCounters;
use remora_carrier::PortDrops;
use remora_rnic::RnicCounters;
use remora_switch::{ResourceReport, SwitchCounters};
use serde::{Deserialize, Serialize};

/// The soft RNIC's counters that matter to an operator.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RnicSummary {
    pub frames_received: u64,
    pub frames_transmitted: u64,
    pub bytes_received: u64,
    pub bytes_transmitted: u64,
    pub packets_retransmitted: u64,
    pub retransmit_timeouts: u64,
    pub naks_received: u64,
    pub frames_dropped: u64,
    /// `frames_dropped` by reason (`icrc_mismatch`, `wrong_peer`, ...).
    pub drops: std::collections::BTreeMap<String, u64>,
}

impl From<&RnicCounters> for RnicSummary {
    fn from(counters: &RnicCounters) -> Self {
        RnicSummary {
            frames_received: counters.frames_received,
            frames_transmitted: counters.frames_transmitted,
            bytes_received: counters.bytes_received,
            bytes_transmitted: counters.bytes_transmitted,
            packets_retransmitted: counters.packets_retransmitted,
            retransmit_timeouts: counters.retransmit_timeouts,
            naks_received: counters.sequence_naks_received
                + counters.receiver_not_ready_naks_received
                + counters.error_naks_received,
            frames_dropped: counters.drops_total(),
            drops: counters
                .drops_by_name()
                .into_iter()
                .map(|(name, count)| (name.to_string(), count))
                .collect(),
        }
    }
}

/// What a compute node's workload did and measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkloadReport {
    pub targets: Vec<String>,
    pub operations: u64,
    pub writes: u64,
    pub reads: u64,
    pub sends: u64,
    pub atomics: u64,
    /// READs and atomics whose result matched the model.
    pub checked_results: u64,
    pub payload_bytes: u64,
    pub elapsed_seconds: f64,
    pub operations_per_second: f64,
    pub latency_p50_us: f64,
    pub latency_p99_us: f64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    pub name: String,
    pub role: String,
    pub rnic: RnicSummary,
    /// Frames the node's carriers refused for want of room.
    #[serde(default)]
    pub frames_dropped_no_room: u64,
    /// What the node's carriers and link wrappers lost, by where.
    #[serde(default)]
    pub carrier_drops: PortDrops,
    pub workload: Option<WorkloadReport>,
    /// Set if the node failed; the rack run fails with it.
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SwitchReport {
    pub counters: SwitchCounters,
    pub ports: Vec<PortCounters>,
    /// What each port's carrier and link wrappers lost, by where (the
    /// kernel's refusals, shaping queues, link faults).
    pub port_drops: Vec<PortDrops>,
    /// Frames a carrier refused (too large for it).
    pub frames_refused_by_carriers: u64,
    /// Frames that arrived on, or were bound for, a port out of service.
    pub frames_discarded_at_failed_ports: u64,
    /// Ports taken out of service, with the reason (null while healthy).
    pub failed_ports: Vec<Option<String>>,
    pub resources: ResourceReport,
}

#[derive(Debug, Clone, Serialize)]
pub struct RackReport {
    pub rack: String,
    pub mode: String,
    pub carrier: String,
    /// Threads that pumped the switch and the nodes it drove.
    pub fabric_threads: usize,
    pub nodes: Vec<NodeReport>,
    pub switch: SwitchReport,
    /// What the rack could not honour exactly (shaping finer or faster
    /// than a real-time rack keeps).
    pub notes: Vec<String>,
}

impl RackReport {
    pub fn failures(&self) -> Vec<String> {
        let nodes = self.nodes.iter().filter_map(|node| {
            node.error
                .as_ref()
                .map(|error| format!("{}: {error}", node.name))
        });
        let ports = self.switch.failed_ports.iter().enumerate();
        let ports = ports.filter_map(|(port, error)| {
            error
                .as_ref()
                .map(|error| format!("switch port {port}: {error}"))
        });
        nodes.chain(ports).collect()
    }
}

impl std::fmt::Display for RackReport {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            formatter,
            "rack {} ({} mode, {} carrier, {} fabric thread{})",
            self.rack,
            self.mode,
            self.carrier,
            self.fabric_threads,
            if self.fabric_threads == 1 { "" } else { "s" }
        )?;
        for node in &self.nodes {
            let rnic = &node.rnic;
            write!(
                formatter,
                "  {:<12} {:<8} frames tx {:>7} rx {:>7}, retransmitted {:>5}, dropped {:>4}",
                node.name,
                node.role,
                rnic.frames_transmitted,
                rnic.frames_received,
                rnic.packets_retransmitted,
                rnic.frames_dropped
            )?;
            if let Some(workload) = &node.workload {
                write!(
                    formatter,
                    " | {} ops ({} checked) at {:.0} ops/s, p50 {:.1} µs, p99 {:.1} µs",
                    workload.operations,
                    workload.checked_results,
                    workload.operations_per_second,
                    workload.latency_p50_us,
                    workload.latency_p99_us
                )?;
            }
            if !rnic.drops.is_empty() {
                let reasons: Vec<String> = rnic
                    .drops
                    .iter()
                    .map(|(reason, count)| format!("{reason} {count}"))
                    .collect();
                write!(formatter, " (drops: {})", reasons.join(", "))?;
            }
            if let Some(error) = &node.error {
                write!(formatter, " | FAILED: {error}")?;
            }
            writeln!(formatter)?;
        }
        for note in &self.notes {
            writeln!(formatter, "  note: {note}")?;
        }
        let counters = &self.switch.counters;
        // The total counts every reason (it once left some out); the
        // reasons a rack meets are listed, the rest are in the JSON.
        writeln!(formatter, "  switch       received {}, transmitted {}, consumed by the program {}, dropped {} (queue {}, program {}, broken by the program {}, no egress {}, unknown egress port {}, failed port {})", counters.received, counters.transmitted,
            counters.consumed_by_program, counters.dropped(), counters.dropped_queue_full, counters.dropped_by_program, counters.dropped_broken_by_program, counters.dropped_no_egress, counters.dropped_unknown_egress_port, counters.dropped_port_failed)?;
        write!(formatter, "{}", self.switch.resources)
    }
}
