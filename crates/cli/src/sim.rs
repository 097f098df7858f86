//! `remora sim`: simulation campaigns.

use crate::error::SimError;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use remora_conformance::{run_campaign, FaultProfile, ScenarioConfig};
use remora_host::hardware::NicHardware;
use remora_sim::Probability;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum SimCommand {
    /// Two soft RNICs exchange random mixes of every RC operation under
    /// loss, duplication, reordering, corruption, partitions, crashes and
    /// access violations; each seed is checked against a plain model.
    Fabric(FabricArgs),
    /// Bifröst under crashes: per seed, a client calls a counter service
    /// through the Gatekeeper and the serving node crashes at the seed's
    /// point (the Gatekeeper finds it by its missed heartbeats, holds its
    /// calls and replays them to a spare started from the node's last
    /// checkpoint); a chain A calls B calls C whose middle crashes and
    /// restarts in place (even seeds) or is replaced on another host that
    /// takes its place (odd seeds); and the head caller crashes and comes
    /// back from
    /// the checkpoint its calls carried. Every call must take effect
    /// exactly once (the answers are exactly the counts 1..=calls); on odd
    /// seeds every third call shares its callee's fate instead, and those
    /// in flight at the crash must fail with it, each once. Each
    /// seed also audits the ACL: random allocs, calls, replies, frees,
    /// READs and WRITEs through the Gatekeeper, every verdict checked
    /// against a plain model, every refusal answered by one NAK.
    Bifrost(BifrostArgs),
    /// The far-memory KV store under a compute-host crash: per seed, one
    /// session runs random reads, upserts, deletes and read-modify-writes
    /// (each checked against a map) on a log kept in the memory host's
    /// region, checkpointing every 24 operations, until the compute host
    /// loses its power at the seed's instant (mid-operation, mid-flush or
    /// mid-checkpoint). The host crashes and restarts with a fresh NIC, and
    /// a new store recovers from far memory: it must hold the last
    /// acknowledged checkpoint (or the one being taken, if its record
    /// landed), every key exactly as the map stood then, and work on
    /// through a further checkpoint.
    Kv(KvArgs),
}

#[derive(Args)]
pub struct KvArgs {
    /// How many seeds to run (at least one).
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..))]
    seeds: u64,
    /// Run this one seed only (to replay a failure).
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// First seed of the campaign.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Probability a frame is lost on either link.
    #[arg(long, value_parser = probability, default_value = "0.01")]
    loss: Probability,
    /// Probability a frame is delivered twice.
    #[arg(long, value_parser = probability, default_value = "0.01")]
    duplicate: Probability,
    /// The simulated NICs' hardware profile: ideal (no NIC costs) or cx5
    /// (a ConnectX-5's pipeline, message rate, PCIe and atomic costs).
    #[arg(long, default_value = "ideal")]
    hardware: NicHardware,
    /// Write `{seeds, passed, violations, ...}` as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args)]
pub struct BifrostArgs {
    /// How many seeds to run (at least one).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    seeds: u64,
    /// Run this one seed only (to replay a failure).
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// First seed of the campaign.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Probability a frame is lost on any link.
    #[arg(long, value_parser = probability, default_value = "0.05")]
    loss: Probability,
    /// Probability a frame is delivered twice.
    #[arg(long, value_parser = probability, default_value = "0.02")]
    duplicate: Probability,
    /// The simulated NICs' hardware profile: ideal (no NIC costs) or cx5
    /// (a ConnectX-5's pipeline, message rate, PCIe and atomic costs).
    #[arg(long, default_value = "ideal")]
    hardware: NicHardware,
    /// Write `{seeds, passed, violations, ...}` as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args)]
pub struct FabricArgs {
    /// How many seeds to run (at least one).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    seeds: u64,
    /// Run this one seed only (to replay a failure).
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// First seed of the campaign.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Scenario config in TOML (the fields of ScenarioConfig); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Probability a frame is lost.
    #[arg(long, value_parser = probability)]
    loss: Option<Probability>,
    /// Probability a frame is delivered twice.
    #[arg(long, value_parser = probability)]
    duplicate: Option<Probability>,
    /// Probability a frame is delayed so later frames overtake it.
    #[arg(long, value_parser = probability)]
    reorder: Option<Probability>,
    /// Probability one bit of a frame flips.
    #[arg(long, value_parser = probability)]
    corrupt: Option<Probability>,
    /// Probability the link is cut for part of the safety phase.
    #[arg(long, value_parser = probability)]
    partition: Option<Probability>,
    /// Probability a node crashes and restarts empty.
    #[arg(long, value_parser = probability)]
    crash: Option<Probability>,
    /// Probability a stream ends with a remote access violation.
    #[arg(long, value_parser = probability)]
    violation: Option<Probability>,
    /// The simulated NICs' hardware profile: ideal (no NIC costs) or cx5
    /// (a ConnectX-5's pipeline, message rate, PCIe and atomic costs).
    #[arg(long)]
    hardware: Option<NicHardware>,
    /// Where operation lengths cluster: fixed (256, 1024 and 4096 bytes,
    /// the stream every regression seed was found with) or stream-mtu
    /// (one, two and four of each stream's own MTU).
    #[arg(long)]
    length_boundaries: Option<remora_conformance::workload::LengthBoundaries>,
    /// Write the campaign report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// A flag's probability, refused at parse time when outside [0, 1].
fn probability(text: &str) -> Result<Probability, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    Probability::new(value).map_err(|error| error.to_string())
}

impl FabricArgs {
    fn scenario(&self) -> Result<ScenarioConfig, SimError> {
        let mut config = match &self.config {
            Some(path) => {
                let text =
                    std::fs::read_to_string(path).map_err(|source| SimError::ReadConfig {
                        path: path.clone(),
                        source,
                    })?;
                toml::from_str(&text).map_err(|error: toml::de::Error| SimError::ParseConfig {
                    path: path.clone(),
                    position: remora_base::at_position(&text, error.span(), error.message()),
                })?
            }
            None => ScenarioConfig::new(FaultProfile::lossy(Probability::literal(0.01))),
        };
        let faults = &mut config.faults;
        for (flag, field) in [
            (self.loss, &mut faults.loss),
            (self.duplicate, &mut faults.duplicate),
            (self.reorder, &mut faults.reorder),
            (self.corrupt, &mut faults.corrupt),
            (self.partition, &mut faults.partition),
            (self.crash, &mut faults.crash),
            (self.violation, &mut faults.violation),
        ] {
            if let Some(value) = flag {
                *field = value;
            }
        }
        if let Some(hardware) = self.hardware {
            config.hardware = hardware;
        }
        if let Some(boundaries) = self.length_boundaries {
            config.length_boundaries = boundaries;
        }
        config.validate()?;
        Ok(config)
    }

    /// The flags that reproduce `seed` under this configuration.
    fn replay_command(&self, seed: u64, config: &ScenarioConfig) -> String {
        let faults = &config.faults;
        let mut command = format!(
            "remora sim fabric --seed {seed} --loss {} --duplicate {} --reorder {} --corrupt {} --partition {} --crash {} --violation {}",
            faults.loss, faults.duplicate, faults.reorder, faults.corrupt, faults.partition, faults.crash, faults.violation
        );
        command += &format!(
            " --hardware {} --length-boundaries {}",
            config.hardware.name(),
            config.length_boundaries.name()
        );
        if let Some(path) = &self.config {
            command += &format!(" --config {}", path.display());
        }
        command
    }
}

pub fn run(command: SimCommand) -> Result<ExitCode, SimError> {
    match command {
        SimCommand::Fabric(args) => run_fabric(args),
        SimCommand::Bifrost(args) => run_bifrost(args),
        SimCommand::Kv(args) => run_kv(args),
    }
}

/// One seed (`--seed`, to replay a failure) or a campaign's range: its
/// first seed and count. A campaign runs `first..first + count`, so a
/// range that passes `u64::MAX` is refused (it ran nothing and passed).
fn seed_range(seed: Option<u64>, first_seed: u64, seeds: u64) -> Result<(u64, u64), SimError> {
    let (first, count) = match seed {
        Some(seed) => (seed, 1),
        None => (first_seed, seeds),
    };
    match first.checked_add(count) {
        Some(_) if count > 0 => Ok((first, count)),
        _ => Err(SimError::Seeds { first, count }),
    }
}

/// Links that lose and duplicate frames, between NICs of `hardware`.
fn lossy_network(
    loss: Probability,
    duplicate: Probability,
    hardware: NicHardware,
) -> remora_rack::scenario::Network {
    remora_rack::scenario::Network {
        faults: remora_sim::LinkFaults {
            loss,
            duplicate,
            ..remora_sim::LinkFaults::NONE
        },
        hardware,
    }
}

/// Runs `campaign` with a progress bar that its per-seed callback moves.
fn with_seed_progress<R>(count: u64, campaign: impl FnOnce(&mut dyn FnMut(u64, bool)) -> R) -> R {
    let progress = seed_progress(count);
    let mut failed = 0u64;
    let report = campaign(&mut |_, passed| {
        failed += u64::from(!passed);
        progress.set_message(format!("{failed} failed"));
        progress.inc(1);
    });
    progress.finish_and_clear();
    report
}

/// Writes the report if asked; fails the command if a seed failed.
fn finish_campaign(
    json: Option<&std::path::Path>,
    report: &impl serde::Serialize,
    passed: bool,
) -> Result<ExitCode, SimError> {
    if let Some(path) = json {
        crate::output::write_json(path, report)?;
    }
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn seed_progress(count: u64) -> ProgressBar {
    let progress = ProgressBar::new(count);
    progress.set_style(
        ProgressStyle::with_template(
            "{bar:40} {pos}/{len} seeds, {msg} [{elapsed_precise}, eta {eta}]",
        )
        .expect("static template"),
    );
    progress
}

fn run_bifrost(args: BifrostArgs) -> Result<ExitCode, SimError> {
    crate::output::check_optional_file_path(args.json.as_deref())?;
    use remora_bifrost::rpc::scenario::{crash_campaign, failover_plan};
    let network = lossy_network(args.loss, args.duplicate, args.hardware);
    let (first_seed, count) = seed_range(args.seed, args.first_seed, args.seeds)?;
    let report = with_seed_progress(count, |each| {
        crash_campaign(first_seed, count, network, each)
    });
    println!(
        "bifrost crash campaign (failover, a chain's middle, the head caller): seeds {}..{} loss {} duplicate {} hardware {}",
        first_seed,
        first_seed + count,
        args.loss,
        args.duplicate,
        args.hardware.name()
    );
    println!(
        "  seeds passed         {:>10} of {}",
        report.passed, report.seeds
    );
    println!("  calls, each once     {:>10}", report.calls);
    println!(
        "  calls held by the Gatekeeper while the node was down {:>10}, replayed by the switch {}",
        report.held, report.replayed
    );
    println!(
        "  recovery, the Gatekeeper's detection (1 ms heartbeat timeout) to the spare's first answer: p50 {:.0} us, max {:.0} us (virtual)",
        report.recovery_p50_us, report.recovery_max_us
    );
    println!(
        "  calls that shared the failed node's fate (odd seeds, every third call), answered with its failure: {}",
        report.shared_fate
    );
    println!(
        "  ACL audit: {} READs and WRITEs through the Gatekeeper, {} allowed, each verdict as the model says; {} spoofed requests, none passed; {} forged replies and swapped resends, none took a right",
        report.acl_accesses, report.acl_allowed, report.acl_spoofed, report.acl_forged
    );
    for violation in &report.violations {
        let (calls, crash_after) = failover_plan(violation.seed);
        println!(
            "\nseed {} FAILED ({calls} calls, crash after {crash_after}): {}",
            violation.seed, violation.error
        );
        println!(
            "  replay: remora sim bifrost --seed {} --loss {} --duplicate {} --hardware {}",
            violation.seed,
            args.loss,
            args.duplicate,
            args.hardware.name()
        );
    }
    finish_campaign(args.json.as_deref(), &report, report.violations.is_empty())
}

fn run_kv(args: KvArgs) -> Result<ExitCode, SimError> {
    crate::output::check_optional_file_path(args.json.as_deref())?;
    use remora_kv::scenario::{compute_crash_campaign, CrashPlan};
    let network = lossy_network(args.loss, args.duplicate, args.hardware);
    let (first_seed, count) = seed_range(args.seed, args.first_seed, args.seeds)?;
    let report = with_seed_progress(count, |each| {
        compute_crash_campaign(first_seed, count, network, CrashPlan::DEFAULT, each)
    });
    let flags = format!(
        "--loss {} --duplicate {} --hardware {}",
        args.loss,
        args.duplicate,
        args.hardware.name()
    );
    println!(
        "kv compute-host crash campaign: seeds {}..{} {flags}",
        first_seed,
        first_seed + count
    );
    println!(
        "  seeds passed        {:>10} of {}",
        report.passed, report.seeds
    );
    println!(
        "  operations checked  {:>10} before the crashes, {} on the recovered stores",
        report.operations_before, report.operations_after
    );
    println!(
        "  keys read back      {:>10} after recovery, each as its checkpoint held it",
        report.keys_checked
    );
    println!(
        "  crashes mid-checkpoint {:>7}; of those, {} recovered the checkpoint being taken",
        report.crashed_mid_checkpoint, report.recovered_unacknowledged
    );
    println!(
        "  crash instants (virtual, from the start): p50 {:.0} us, latest {:.0} us; {} packets retransmitted",
        report.crash_at_p50_us, report.crash_at_max_us, report.retransmissions
    );
    for violation in &report.violations {
        println!("\nseed {} FAILED: {}", violation.seed, violation.error);
        println!("  replay: remora sim kv --seed {} {flags}", violation.seed);
    }
    finish_campaign(args.json.as_deref(), &report, report.violations.is_empty())
}

fn run_fabric(args: FabricArgs) -> Result<ExitCode, SimError> {
    crate::output::check_optional_file_path(args.json.as_deref())?;
    let config = args.scenario()?;
    let (first_seed, count) = seed_range(args.seed, args.first_seed, args.seeds)?;
    let progress = seed_progress(count);
    let mut failed = 0;
    let report = run_campaign(first_seed, count, &config, |seed| {
        failed += u64::from(!seed.passed());
        progress.set_message(format!("{failed} failed"));
        progress.inc(1);
    });
    progress.finish_and_clear();
    print_summary(&report, &config);
    for failure in &report.failures {
        println!("\nseed {} FAILED:", failure.seed);
        for message in &failure.failures {
            println!("  {message}");
        }
        println!("  replay: {}", args.replay_command(failure.seed, &config));
    }
    if let Some(path) = &args.json {
        let document = serde_json::json!({ "config": config, "report": report });
        crate::output::write_json(path, &document)?;
    }
    Ok(if report.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_summary(report: &remora_conformance::CampaignReport, config: &ScenarioConfig) {
    let faults = &config.faults;
    println!(
        "fabric campaign: seeds {}..{} loss {} duplicate {} reorder {} corrupt {} partition {} crash {} violation {}",
        report.first_seed,
        report.first_seed + report.seeds,
        faults.loss,
        faults.duplicate,
        faults.reorder,
        faults.corrupt,
        faults.partition,
        faults.crash,
        faults.violation
    );
    println!(
        "  seeds passed         {:>10} of {}",
        report.seeds - report.failures.len() as u64,
        report.seeds
    );
    println!("  operations           {:>10}", report.operations);
    println!("  succeeded            {:>10}", report.succeeded);
    println!(
        "  streams that gave up {:>10}  (retry limit reached under faults: legal)",
        report.streams_gave_up
    );
    println!(
        "  seeds with a crash   {:>10}  ({} completions and {} responder windows from before the crash checked)",
        report.seeds_with_crash, report.checked_before_crash, report.windows_checked_before_crash
    );
    println!("  seeds with partition {:>10}", report.seeds_with_partition);
    println!("  frames               {:>10}", report.frames);
    println!(
        "  retransmitted        {:>10}",
        report.retransmitted_packets
    );
    println!("  retransmit timeouts  {:>10}", report.retransmit_timeouts);
    let link = &report.link;
    println!(
        "  link faults          {:>10} lost, {} duplicated, {} reordered, {} corrupted, {} cut by partitions",
        link.lost, link.duplicated, link.reordered, link.corrupted, link.partition_drops
    );
    if config.hardware != NicHardware::Ideal {
        println!(
            "  NIC pipeline drops   {:>10}  (a full pipeline; RC retransmits)",
            report.pipeline_frames_dropped
        );
        println!(
            "  atomics serialized   {:>10}  (waited for their word)",
            report.atomics_serialized
        );
    }
}
