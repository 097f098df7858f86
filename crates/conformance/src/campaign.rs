//! Many seeds of the scenario.

use crate::scenario::{run_seed, ScenarioConfig, SeedReport};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CampaignReport {
    pub seeds: u64,
    pub first_seed: u64,
    pub failures: Vec<SeedReport>,
    pub operations: u64,
    pub succeeded: u64,
    pub streams_gave_up: u64,
    pub seeds_with_crash: u64,
    /// Completions crashed hosts produced before their crash, checked.
    pub checked_before_crash: u64,
    /// Windows crashed hosts served as responders, checked as they were
    /// when the host died.
    pub windows_checked_before_crash: u64,
    pub seeds_with_partition: u64,
    pub frames: u64,
    pub retransmitted_packets: u64,
    pub retransmit_timeouts: u64,
    pub pipeline_frames_dropped: u64,
    pub atomics_serialized: u64,
    /// The faults the links applied, over every seed.
    pub link: remora_sim::LinkCounters,
}

/// Runs `count` seeds from `first_seed`, calling `progress` after each.
pub fn run_campaign(
    first_seed: u64,
    count: u64,
    config: &ScenarioConfig,
    mut progress: impl FnMut(&SeedReport),
) -> CampaignReport {
    let mut campaign = CampaignReport {
        seeds: count,
        first_seed,
        ..CampaignReport::default()
    };
    for seed in first_seed..first_seed.saturating_add(count) {
        let report = run_seed(seed, config);
        campaign.operations += report.operations as u64;
        campaign.succeeded += report.succeeded as u64;
        campaign.streams_gave_up += report.streams_gave_up as u64;
        campaign.seeds_with_crash += u64::from(report.crashed);
        campaign.checked_before_crash += report.checked_before_crash as u64;
        campaign.windows_checked_before_crash += report.windows_checked_before_crash as u64;
        campaign.seeds_with_partition += u64::from(report.partitioned);
        campaign.frames += report.frames;
        campaign.retransmitted_packets += report.retransmitted_packets;
        campaign.retransmit_timeouts += report.retransmit_timeouts;
        campaign.pipeline_frames_dropped += report.pipeline_frames_dropped;
        campaign.atomics_serialized += report.atomics_serialized;
        campaign.link.add(&report.link);
        progress(&report);
        if !report.passed() {
            campaign.failures.push(report);
        }
    }
    campaign
}
