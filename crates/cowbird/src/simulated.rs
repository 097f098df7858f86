//! Cowbird in the deterministic simulator: a compute node whose threads
//! issue mixed async reads and writes through the client library, the
//! switch, and a memory node running the Spot engine, over links that may
//! lose, duplicate and reorder frames.
//!
//! The engine is the Spot engine on the memory node or Cowbird-P4 in the
//! switch ([`Engine`]); the workload and its checks are
//! [`crate::history`]'s.

use crate::client::Client;
use crate::deploy::{deploy, deploy_p4, CowbirdSpec, SwitchPorts};
use crate::history::Histories;
pub use crate::history::{Engine, Workload};
use crate::p4::{CowbirdP4, P4Config, P4Stats};
use crate::spot::SpotStats;
use remora_host::Host;
use remora_rack::simulated::SimulatedRack;
use remora_rnic::{MemoryRegion, RnicConfig, Timestamp};
use remora_sim::PortId;
use remora_sim::{LinkConfig, LinkFaults, Probability};
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_switch::Program;
use remora_wire::{Ipv4Address, MacAddress};
use std::time::Duration;

const COMPUTE: u8 = 1;
const MEMORY: u8 = 2;
const TICK: Duration = Duration::from_micros(1);

pub fn mac(index: u8) -> MacAddress {
    MacAddress([0x02, 0, 0, 0, 0xc0, index])
}

pub fn ip(index: u8) -> Ipv4Address {
    Ipv4Address::new(10, 0, 1, index)
}

/// Where the two hosts sit on the wire, and the switch's router MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub compute: (MacAddress, Ipv4Address),
    pub memory: (MacAddress, Ipv4Address),
    pub router_mac: MacAddress,
}

impl Default for Placement {
    fn default() -> Placement {
        Placement {
            compute: (mac(COMPUTE), ip(COMPUTE)),
            memory: (mac(MEMORY), ip(MEMORY)),
            router_mac: MacAddress([0x02, 0x5e, 0, 0, 0, 0xfe]),
        }
    }
}

impl Placement {
    /// The switch's forwarding between the two hosts.
    pub fn forwarding(&self) -> L2L3Forwarding {
        L2L3Forwarding::with_attached_hosts(self.router_mac, &[self.compute, self.memory])
            .expect("two hosts fit the tables")
    }
}

/// The rack's forwarding between the two hosts.
pub fn forwarding() -> L2L3Forwarding {
    Placement::default().forwarding()
}

#[derive(Debug, Clone)]
pub struct Outcome {
    pub simulated: Duration,
    pub completed: u64,
    pub reads_checked: u64,
    /// The Spot engine's counters (zero under Cowbird-P4).
    pub engine: SpotStats,
    /// Cowbird-P4's counters, when it was the engine.
    pub switch_engine: Option<P4Stats>,
    pub retransmissions: u64,
}

/// The deployment a checked workload runs on.
pub fn spec(workload: &Workload) -> CowbirdSpec {
    CowbirdSpec {
        threads: workload.threads,
        sizes: workload.sizes,
        pool_regions: vec![workload.window_bytes * workload.threads as u64],
        spot: workload.spot,
        ack_timeout: Duration::from_micros(200),
        direct: None,
        rpc: None,
    }
}

const COMPUTE_HOST: usize = 0;
const MEMORY_HOST: usize = 1;

/// The tests' and the demo's fault profile: `loss` on every link, half
/// as much duplication, and 1% of frames reordered by up to 3 µs.
pub fn lossy(loss: Probability) -> LinkFaults {
    LinkFaults {
        loss,
        duplicate: loss.scaled(0.5),
        reorder: Probability::literal(0.01),
        reorder_delay: Duration::from_micros(3),
        ..LinkFaults::NONE
    }
}

/// Cowbird-P4's address on the wire.
pub fn p4_config() -> P4Config {
    P4Config::new(
        MacAddress([0x02, 0xc0, 0xb1, 0, 0, 0xfe]),
        Ipv4Address::new(10, 0, 1, 254),
    )
}

/// Runs the workload on one seed; errors say what went wrong.
pub fn run(seed: u64, workload: &Workload) -> Result<Outcome, String> {
    let text = |error: &dyn std::fmt::Display| format!("seed {seed}: {error}");
    let mut compute = Host::new("compute", RnicConfig::new(mac(COMPUTE), ip(COMPUTE), seed));
    let mut memory = Host::new(
        "memory",
        RnicConfig::new(mac(MEMORY), ip(MEMORY), seed ^ 0xc0b),
    );
    let mut link = LinkConfig::rack();
    link.faults = workload.faults;
    let spec = spec(workload);
    match workload.engine {
        Engine::Spot => {
            let mut deployment =
                deploy(spec, compute.nic_mut(), memory.nic_mut()).map_err(|e| text(&e))?;
            let mut rack = SimulatedRack::new(seed, forwarding(), vec![compute, memory], link);
            let mut engine = deployment.engine;
            let mut outcome = drive(
                seed,
                workload,
                &mut rack,
                &mut deployment.clients,
                deployment.pool[0],
                |now, rack| {
                    engine
                        .turn(now, rack.rnic(MEMORY_HOST))
                        .map(|_| ())
                        .map_err(|error| error.to_string())
                },
            )
            .map_err(|e| text(&e))?;
            outcome.engine = engine.stats();
            Ok(outcome)
        }
        Engine::P4 => {
            let mut program = CowbirdP4::new(workload.p4, forwarding());
            let ports = SwitchPorts {
                compute: PortId(COMPUTE_HOST as u16),
                memory: PortId(MEMORY_HOST as u16),
            };
            let mut deployment = deploy_p4(
                &spec,
                compute.nic_mut(),
                memory.nic_mut(),
                &mut program,
                ports,
            )
            .map_err(|e| text(&e))?;
            let template = program.probe_template();
            let mut rack = SimulatedRack::new(seed, program, vec![compute, memory], link);
            rack.switch_mut()
                .add_template(template, Timestamp::ZERO)
                .map_err(|e| text(&e))?;
            let outcome = drive(
                seed,
                workload,
                &mut rack,
                &mut deployment.clients,
                deployment.pool[0],
                |_, rack| match (0..spec.threads)
                    .find_map(|index| rack.program().failure(index).map(str::to_string))
                {
                    Some(failure) => Err(failure),
                    None => Ok(()),
                },
            );
            let mut outcome = outcome.map_err(|error| {
                let program = rack.program();
                let states: Vec<String> = (0..spec.threads)
                    .filter_map(|index| program.describe(index))
                    .collect();
                text(&format!(
                    "{error}; {:?}; {}",
                    program.stats(),
                    states.join("; ")
                ))
            })?;
            outcome.switch_engine = Some(rack.program().stats());
            Ok(outcome)
        }
    }
}

/// The application loop: threads issue, poll and check; `turn` gives the
/// engine its turn each tick; the simulation moves the rack.
fn drive<P: Program>(
    seed: u64,
    workload: &Workload,
    rack: &mut SimulatedRack<P>,
    clients: &mut [Client],
    pool: MemoryRegion,
    mut turn: impl FnMut(Timestamp, &mut SimulatedRack<P>) -> Result<(), String>,
) -> Result<Outcome, String> {
    let mut histories = Histories::new(seed, workload, clients)?;
    let total = histories.total();
    let limit = Timestamp::from_nanos(total * 20_000_000 + 1_000_000_000);
    let mut now = Timestamp::ZERO;
    while !histories.is_done() {
        now = now.max(rack.simulation.now());
        if now >= limit {
            return Err(format!(
                "{} of {total} requests completed before the time limit",
                histories.completed
            ));
        }
        histories.step(workload, clients)?;
        turn(now, rack)?;
        now = now.saturating_add(TICK);
        rack.simulation.run_until(now, 1_000_000);
    }
    histories.check_pool(pool, rack.rnic(MEMORY_HOST), workload)?;
    let retransmissions = rack.rnic(MEMORY_HOST).counters().packets_retransmitted;
    Ok(Outcome {
        simulated: now.saturating_duration_since(Timestamp::ZERO),
        completed: histories.completed,
        reads_checked: histories.reads_checked,
        engine: SpotStats::default(),
        switch_engine: None,
        retransmissions,
    })
}
