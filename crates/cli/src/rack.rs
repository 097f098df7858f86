//! `remora rack up` and `remora node`.

use crate::error::RackCommandError;
use crate::interrupt::{interrupted, stop_flag, INTERRUPTED_EXIT};
use crate::output::OutputError;
use clap::{Args, Subcommand, ValueEnum};
use remora_rack::launch::{self, NodeCarrier};
use remora_rack::report::NodeReport;
use remora_rack::{CarrierKind, LaunchOptions, Mode, RackConfig};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum RackCommand {
    /// Bring a rack up from its TOML file, run every compute node's checked
    /// workload against every memory node through the switch, then shut it
    /// down and report. Ctrl-C stops it cleanly. A `[cowbird]` section also
    /// runs Cowbird's checked read/write histories through the engine it
    /// names (spot or p4) on the first compute and memory nodes, in
    /// embedded mode.
    Up(UpArgs),
    /// Run only the switch of a rack spanning hosts: port i is a UDP tunnel
    /// on [switch] tunnel_host:(tunnel_base_port + i) to node i's `tunnel`
    /// address. Each host runs `remora node FILE --name NAME --udp ...`.
    /// Runs until Ctrl-C, then prints the switch's counters.
    Switch(SwitchArgs),
}

#[derive(Args)]
pub struct SwitchArgs {
    /// The rack file.
    rack: PathBuf,
    /// Write every frame the switch receives to this pcap file.
    #[arg(long)]
    capture: Option<PathBuf>,
    /// Also write the switch's report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum ModeArg {
    /// One process: a fabric thread for the switch and every RNIC, a thread
    /// per compute workload.
    Embedded,
    /// One process per node (the switch stays in this one).
    Processes,
    /// One network namespace per node, veths to an AF_PACKET switch (root).
    Netns,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum CarrierArg {
    /// Lock-free rings in a memfd the node processes inherit.
    Shm,
    /// A UDP tunnel per node, node i on 127.0.0.(10+i).
    Udp,
}

#[derive(Args)]
pub struct UpArgs {
    /// The rack file (see examples/).
    rack: PathBuf,
    /// How the rack runs: on threads of this process, a process per node,
    /// or a network namespace per node.
    #[arg(long, value_enum, default_value = "embedded")]
    mode: ModeArg,
    /// The carrier between node processes and the switch (processes mode).
    #[arg(long, value_enum, default_value = "shm")]
    carrier: CarrierArg,
    /// Write every frame the switch receives to this pcap file.
    #[arg(long)]
    capture: Option<PathBuf>,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Runs one node of a rack: what `rack up` starts in processes and netns
/// modes, and what each host runs in a rack spanning hosts.
#[derive(Args)]
pub struct NodeArgs {
    /// The rack file.
    rack: PathBuf,
    /// Which node of the rack this is.
    #[arg(long)]
    name: String,
    /// Directory for control sockets.
    #[arg(long)]
    run_dir: PathBuf,
    /// Write the node's report as JSON here when it stops.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Inherited shared-memory segment descriptor.
    #[arg(long, group = "carrier")]
    shm_fd: Option<i32>,
    /// Inherited bound UDP socket descriptor (needs --udp-peer).
    #[arg(long, group = "carrier", requires = "udp_peer")]
    udp_fd: Option<i32>,
    /// Bind a UDP tunnel here (needs --udp-peer), for racks across hosts.
    #[arg(long, group = "carrier", requires = "udp_peer")]
    udp_bind: Option<SocketAddr>,
    /// The switch port's UDP address.
    #[arg(long)]
    udp_peer: Option<SocketAddr>,
    /// AF_PACKET on this interface.
    #[arg(long, group = "carrier")]
    packet_interface: Option<String>,
    /// The UDP tunnel addresses the rack file gives this node and its
    /// switch port (racks across hosts).
    #[arg(long, group = "carrier")]
    udp: bool,
}

pub fn run(command: RackCommand) -> Result<ExitCode, RackCommandError> {
    let args = match command {
        RackCommand::Up(args) => args,
        RackCommand::Switch(args) => return run_switch(args),
    };
    let rack = RackConfig::load(&args.rack)?;
    crate::systems::check_sections(&rack, &args.rack)?;
    crate::output::check_optional_file_path(args.json.as_deref())?;
    let options = LaunchOptions {
        mode: match args.mode {
            ModeArg::Embedded => Mode::Embedded,
            ModeArg::Processes => Mode::Processes,
            ModeArg::Netns => Mode::Netns,
        },
        carrier: match args.carrier {
            CarrierArg::Shm => CarrierKind::Shm,
            CarrierArg::Udp => CarrierKind::Udp,
        },
        capture: args.capture.clone(),
        executable: std::env::current_exe().map_err(RackCommandError::Executable)?,
    };
    // A second Ctrl-C ends the process without destructors: the
    // namespaces of netns mode would outlive it.
    crate::interrupt::at_forced_exit(launch::remove_live_namespaces);
    let report = launch::rack_up(&rack, &options, stop_flag())?;
    print!("{report}");
    if let Some(path) = &args.capture {
        println!("capture: {}", path.display());
    }
    let mut failures = report.failures();
    // Each system's section runs on the embedded rack after the workload.
    let mut systems = serde_json::Map::new();
    for system in crate::systems::SYSTEMS {
        if !rack.systems.contains_key(system.name()) {
            continue;
        }
        if interrupted() {
            // The report so far is still written: returned here, the
            // rack's report (already made) never reached --json.
            eprintln!(
                "interrupted: [{}] and the sections after it not run",
                system.name()
            );
            break;
        }
        if options.mode != Mode::Embedded {
            eprintln!("[{}] runs in embedded mode only: skipped", system.name());
            continue;
        }
        if let Some(outcome) = system.rack_up(&rack, &mut failures) {
            systems.insert(system.name().into(), outcome);
        }
    }
    if let Some(path) = &args.json {
        if systems.is_empty() {
            crate::output::write_json(path, &report)?;
        } else {
            let mut document = serde_json::json!({ "rack": report });
            document.as_object_mut().expect("an object").extend(systems);
            crate::output::write_json(path, &document)?;
        }
    }
    for failure in &failures {
        eprintln!("failed: {failure}");
    }
    if interrupted() {
        return Ok(ExitCode::from(INTERRUPTED_EXIT));
    }
    if failures.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        Ok(ExitCode::FAILURE)
    }
}

fn run_switch(args: SwitchArgs) -> Result<ExitCode, RackCommandError> {
    let rack = RackConfig::load(&args.rack)?;
    crate::output::check_optional_file_path(args.json.as_deref())?;
    // Each node's tunnel, before saying the switch is up: a rack file
    // without tunnel addresses is refused first.
    for node in &rack.nodes {
        rack.switch_tunnel(node)?;
        rack.node_tunnel(node)?;
    }
    println!("switch for rack {} up; Ctrl-C stops it", rack.name);
    let report = launch::run_switch(&rack, args.capture.as_deref(), stop_flag())?;
    println!(
        "{}",
        serde_json::to_string_pretty(&report.counters).map_err(OutputError::from)?
    );
    if let Some(path) = &args.json {
        crate::output::write_json(path, &report)?;
    }
    // A port out of service cut its node off: said, and the exit fails
    // (only the JSON said it, and the exit was 0).
    let failed: Vec<String> = report
        .failed_ports
        .iter()
        .enumerate()
        .filter_map(|(port, reason)| Some(format!("switch port {port}: {}", reason.as_ref()?)))
        .collect();
    if failed.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    for failure in failed {
        eprintln!("failed: {failure}");
    }
    Ok(ExitCode::FAILURE)
}

/// Takes ownership of a descriptor the launcher passed down, after checking
/// that it is open and is not one of the standard streams.
fn inherited(fd: i32) -> Result<std::os::fd::OwnedFd, RackCommandError> {
    if fd <= 2 {
        return Err(RackCommandError::StandardStream(fd));
    }
    // SAFETY: only borrowed for the check; F_GETFD fails on a closed fd.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    rustix::io::fcntl_getfd(borrowed)
        .map_err(|source| RackCommandError::DescriptorClosed { fd, source })?;
    // SAFETY: the descriptor is open, and by the launcher's contract this
    // process owns it and nothing else here refers to it.
    Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// Runs one node of a rack. A node that cannot start still writes its
/// report, naming itself and the reason, so that the launcher's report
/// says why (it said only "exited without a report").
pub fn run_node(args: NodeArgs) -> Result<ExitCode, RackCommandError> {
    let rack = RackConfig::load(&args.rack)?;
    let (report, exit) = match start_node(&rack, &args) {
        Ok(report) => {
            let exit = match report.error {
                None => ExitCode::SUCCESS,
                Some(_) => ExitCode::FAILURE,
            };
            (report, exit)
        }
        // An error, not a failed check: exit 2, as every command's error,
        // and named after the node below, which main's would not be.
        Err(error) => {
            let report = NodeReport {
                name: args.name.clone(),
                role: rack
                    .node(&args.name)
                    .map(|node| node.role.name().into())
                    .unwrap_or_default(),
                error: Some(error.to_string()),
                ..NodeReport::default()
            };
            (report, ExitCode::from(2))
        }
    };
    if let Some(path) = &args.report {
        crate::output::write_json(path, &report)?;
    }
    if let Some(error) = &report.error {
        eprintln!("node {}: {error}", report.name);
    }
    Ok(exit)
}

fn start_node(rack: &RackConfig, args: &NodeArgs) -> Result<NodeReport, RackCommandError> {
    let carrier = match (
        args.shm_fd,
        args.udp_fd,
        args.udp_bind,
        args.udp_peer,
        args.packet_interface.clone(),
    ) {
        (Some(fd), ..) => NodeCarrier::Shm { fd: inherited(fd)? },
        (_, Some(fd), _, Some(peer), _) => NodeCarrier::Udp {
            fd: inherited(fd)?,
            peer,
        },
        (_, _, Some(local), Some(peer), _) => NodeCarrier::UdpBind { local, peer },
        (.., Some(interface)) => NodeCarrier::Packet { interface },
        _ if args.udp => NodeCarrier::UdpFromRack,
        _ => return Err(RackCommandError::NoCarrier),
    };
    Ok(launch::run_node(
        rack,
        &args.name,
        carrier,
        &args.run_dir,
        stop_flag(),
    )?)
}
