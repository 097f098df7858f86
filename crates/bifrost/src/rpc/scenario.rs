//! Exactly-once scenarios: a client calls a counter service on another
//! host through the switch, over links with the given faults, in the
//! simulator. Each answer is the count after that call, so a call that
//! took effect twice or never shows as a repeated or missing number.
//! [`exactly_once`] has plain forwarding; [`failover`] has the Gatekeeper,
//! and the serving node crashes half-way and a spare takes over from its
//! checkpoint.

use super::agents::{ClientAgent, ControlAgent, ServerAgent};
use super::{callee_at, Callee, Caller, RpcError, Service};
use crate::rpc::Outcome;
use remora_rack::scenario::{Rack, RackStage, SimulatedStage};
use remora_rack::topology::{Topology, COMPUTE_HOST, MEMORY_HOST};
use remora_rack::RackError;
use remora_wire::bifrost::GlobalAddress;
use std::collections::BTreeSet;
use std::time::Duration;

/// Counts its calls.
pub struct Counter(pub u64);

impl Service for Counter {
    fn call(&mut self, method: &[u8], _pointer: GlobalAddress, _arguments: &[u8]) -> Outcome {
        if method != b"increment" {
            return Err(format!("no method {}", String::from_utf8_lossy(method)).into());
        }
        self.0 += 1;
        Ok(self.0.to_be_bytes().to_vec().into())
    }

    fn save_state(&self) -> Option<Vec<u8>> {
        Some(self.0.to_be_bytes().to_vec())
    }

    fn restore_state(&mut self, state: &[u8]) -> Result<(), String> {
        let count: [u8; 8] = state
            .try_into()
            .map_err(|_| format!("a count of {} bytes", state.len()))?;
        self.0 = u64::from_be_bytes(count);
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExactlyOnce {
    pub calls: u64,
    /// Times the service ran.
    pub executed: u64,
    pub retransmissions: u64,
    /// Duplicates the callee answered without running them.
    pub duplicates: u64,
    /// Virtual time from the rack's start to the last answer.
    pub elapsed: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    #[error(transparent)]
    Rack(#[from] RackError),
    #[error("call {rpc_id} failed: {error}")]
    CallFailed { rpc_id: u64, error: RpcError },
    #[error("the service ran {executed} times for {calls} calls")]
    NotExactlyOnce { calls: u64, executed: u64 },
    #[error("the answers are not the counts 1..={calls}: a call ran twice or never")]
    WrongAnswers { calls: u64 },
    #[error("the {0} agent is missing")]
    MissingAgent(&'static str),
    #[error("the Gatekeeper: {0}")]
    Gatekeeper(#[from] crate::gatekeeper::GatekeeperError),
    #[error(transparent)]
    Topology(#[from] remora_rack::topology::TopologyError),
    #[error("the failed node left no checkpoint")]
    NoCheckpoint,
    #[error("restoring the spare: {0}")]
    Restore(#[from] super::checkpoint::CheckpointError),
    #[error("the spare's count is {count} after {calls} calls")]
    WrongFinalCount { calls: u64, count: u64 },
    #[error("an export: {0}")]
    Export(#[from] remora_wire::bifrost::ExportError),
    #[error("the Gatekeeper found {detected:?} failed, not the crashed node alone")]
    WrongDetection {
        detected: Vec<remora_wire::Ipv4Address>,
    },
    #[error("call {rpc_id} failed with its callee but was to be recovered")]
    UnsharedFate { rpc_id: u64 },
    #[error("the ACL audit: {0}")]
    Acl(#[from] crate::gatekeeper::audit::AclViolation),
}

pub use remora_rack::scenario::{Network, Violation};

/// The simulator's stage for `topology` on `network`.
fn stage_on(seed: u64, topology: &Topology, network: Network) -> SimulatedStage {
    SimulatedStage::on_network(seed, topology, network)
}

/// Runs `calls` calls, 8 at a time, and checks exactly-once.
pub fn exactly_once(
    seed: u64,
    network: impl Into<Network>,
    calls: u64,
) -> Result<ExactlyOnce, ScenarioError> {
    let network: Network = network.into();
    let topology = Topology::compute_and_memory();
    let mut stage = stage_on(seed, &topology, network);
    stage.add_agent(
        MEMORY_HOST,
        Box::new(ServerAgent::new(Callee::new(Box::new(Counter(0))))),
    );
    let callee = callee_at(topology.switch_mac, topology.host(MEMORY_HOST).address);
    let caller = Caller::new(Duration::from_micros(50), 1000);
    stage.add_agent(
        COMPUTE_HOST,
        Box::new(ClientAgent::new(
            caller,
            callee,
            "increment",
            40000,
            calls,
            8,
        )),
    );
    let mut rack = stage.start(topology.forwarding())?;
    let started = rack.now();
    let (answers, retransmissions) = run_client_to_the_end(&mut rack)?;
    let elapsed = rack.now().saturating_duration_since(started);
    let (executed, duplicates) = rack
        .with_agent::<ServerAgent, _>(MEMORY_HOST, 0, |server| {
            let counters = server.callee.counters();
            (counters.executed, counters.duplicates)
        })
        .ok_or(ScenarioError::MissingAgent("server"))?;
    check_counts(answers, calls)?;
    if executed != calls {
        return Err(ScenarioError::NotExactlyOnce { calls, executed });
    }
    Ok(ExactlyOnce {
        calls,
        executed,
        retransmissions,
        duplicates,
        elapsed,
    })
}

/// The head client's answers so far.
fn answered(rack: &mut impl Rack) -> u64 {
    rack.with_agent::<ClientAgent, _>(COMPUTE_HOST, 0, |client| client.outcomes.len() as u64)
        .unwrap_or(0)
}

/// A client's answers: each call's RPC id and outcome.
pub(crate) type Answers = Vec<(u64, Result<Vec<u8>, RpcError>)>;

/// Runs until the head client (on the compute host) has every answer;
/// its answers and how often it resent.
fn run_client_to_the_end(rack: &mut impl Rack) -> Result<(Answers, u64), ScenarioError> {
    rack.run_until(
        &mut |rack| {
            rack.with_agent::<ClientAgent, _>(COMPUTE_HOST, 0, |client| client.is_done())
                .unwrap_or(false)
        },
        Duration::from_secs(10),
    )?;
    rack.with_agent::<ClientAgent, _>(COMPUTE_HOST, 0, |client| {
        (
            client.outcomes.clone(),
            client.caller.counters().retransmissions,
        )
    })
    .ok_or(ScenarioError::MissingAgent("client"))
}

/// Each answer is a distinct count, and together they are 1..=calls.
pub(crate) fn check_counts(answers: Answers, calls: u64) -> Result<(), ScenarioError> {
    let counts = check_distinct_counts(answers, calls)?;
    if counts != (1..=calls).collect() {
        return Err(ScenarioError::WrongAnswers { calls });
    }
    Ok(())
}

/// Each answer is a count no other answer has (no call took effect twice
/// as its caller saw it); returns them.
fn check_distinct_counts(answers: Answers, calls: u64) -> Result<BTreeSet<u64>, ScenarioError> {
    let mut counts = BTreeSet::new();
    for (rpc_id, outcome) in answers {
        let bytes = outcome.map_err(|error| ScenarioError::CallFailed { rpc_id, error })?;
        let count = bytes
            .get(..8)
            .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")));
        if !counts.insert(count.ok_or(ScenarioError::WrongAnswers { calls })?) {
            return Err(ScenarioError::WrongAnswers { calls });
        }
    }
    Ok(counts)
}

/// Takes the calls that failed with their callee out of `answers`: each
/// must be one that shares its callee's fate (the client's `index`-th
/// call has RPC id `index + 1`). Returns the rest and how many failed.
fn split_shared_fate(
    answers: Answers,
    share_fate_every: Option<u64>,
) -> Result<(Answers, u64), ScenarioError> {
    let mut rest = Vec::with_capacity(answers.len());
    let mut failed = 0;
    for (rpc_id, outcome) in answers {
        match outcome {
            Err(RpcError::SharedFate(_)) => {
                if !super::agents::shares_fate(rpc_id - 1, share_fate_every) {
                    return Err(ScenarioError::UnsharedFate { rpc_id });
                }
                failed += 1;
            }
            outcome => rest.push((rpc_id, outcome)),
        }
    }
    Ok((rest, failed))
}

/// The Gatekeeper's service address in [`failover`].
pub const SERVICE_ADDRESS: remora_wire::Ipv4Address = remora_wire::Ipv4Address::new(10, 0, 0, 200);
/// The spare server's host in [`failover`].
pub const SPARE_HOST: usize = 2;

/// What [`failover`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failover {
    pub calls: u64,
    /// Calls run by the serving node before it crashed, and by the spare
    /// (counting from the checkpoint it started from).
    pub executed_before: u64,
    pub executed_by_spare: u64,
    /// Calls in flight to the node when it failed.
    pub in_flight_at_failure: usize,
    /// Calls the Gatekeeper held while no node served them.
    pub held: u64,
    /// Held and in-flight calls the switch replayed to the replacement.
    pub replayed: u64,
    /// The checkpoint's sequence: the calls it covers.
    pub checkpoint_covers: u64,
    /// From the crash to the Gatekeeper finding the node silent past its
    /// heartbeat timeout (virtual time).
    pub detection_time: Duration,
    /// From that detection to the first answer the replacement gave: the
    /// replacement's start ([`REPLACEMENT_START`]), the routes moved and
    /// the switch's replay (virtual time).
    pub recovery_time: Duration,
    /// Calls that shared the failed node's fate and were answered with
    /// its failure (none unless some calls share fate).
    pub shared_fate: u64,
}

/// How often [`failover`]'s nodes send heartbeats.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_micros(100);
/// How long [`failover`]'s control plane takes, once the node is found
/// failed, to start the spare from its checkpoint; the Gatekeeper holds
/// the node's calls meanwhile. A modelling choice: the thesis gives no
/// figure.
pub const REPLACEMENT_START: Duration = Duration::from_micros(500);

/// `calls` calls to the Gatekeeper's service address, 8 at a time. The
/// serving node and a spare announce themselves with heartbeats; the
/// control plane routes the method to the first. After `crash_after`
/// answers the serving node crashes; the Gatekeeper finds it silent past
/// `heartbeat_timeout` and holds its calls; the control plane starts the
/// spare from the node's last checkpoint and moves the routes to it, and
/// the switch replays the held calls and those in flight to the node.
/// Checks that every call took effect exactly once.
pub fn failover(
    seed: u64,
    network: impl Into<Network>,
    calls: u64,
    crash_after: u64,
    heartbeat_timeout: Duration,
) -> Result<Failover, ScenarioError> {
    let network: Network = network.into();
    failover_with(seed, network, (calls, crash_after), heartbeat_timeout, None)
}

/// [`failover`], with every `share_fate_every`-th call sharing its
/// callee's fate: those in flight when the node fails are answered with
/// the failure ([`RpcError::SharedFate`]) and never replayed; the rest
/// are recovered. Checks that every call got one outcome, that only calls
/// that share fate failed, that the answers are distinct counts, and that
/// the final count is the successful calls plus at most one for each call
/// that failed with the node (it may have run before the failure).
pub fn failover_with(
    seed: u64,
    network: impl Into<Network>,
    (calls, crash_after): (u64, u64),
    heartbeat_timeout: Duration,
    share_fate_every: Option<u64>,
) -> Result<Failover, ScenarioError> {
    let network: Network = network.into();
    use crate::gatekeeper::{Gatekeeper, GatekeeperConfig, NodeKind};
    use remora_rack::topology::{standard_host, HostSpec, Role};
    use remora_switch::programs::overlay::Overlaid;
    let mut topology = Topology::compute_and_memory();
    let (mac, address) = standard_host(SPARE_HOST);
    topology.add_host(HostSpec::new("spare", Role::Compute, mac, address))?;
    let mut stage = stage_on(seed, &topology, network);
    let service = remora_wire::datagram::DatagramEnd {
        mac: topology.switch_mac,
        address: SERVICE_ADDRESS,
        port: remora_wire::bifrost::BIFROST_PORT,
    };
    for host in [MEMORY_HOST, SPARE_HOST] {
        let server = ServerAgent::new(Callee::with_checkpoints(Box::new(Counter(0))));
        stage.add_agent(host, Box::new(server));
        let control = ControlAgent::new(service, NodeKind::Compute, 1 << 30, HEARTBEAT_INTERVAL);
        // The serving node exports the method; the spare stands by.
        let control = match host {
            MEMORY_HOST => control.export("increment")?,
            _ => control,
        };
        stage.add_agent(host, Box::new(control));
    }
    let caller = Caller::new(Duration::from_micros(50), 100_000);
    let client = ClientAgent::new(caller, service, "increment", 40000, calls, 8);
    let client = match share_fate_every {
        Some(every) => client.share_fate_every(every),
        None => client,
    };
    stage.add_agent(COMPUTE_HOST, Box::new(client));
    let (node, spare) = (
        topology.host(MEMORY_HOST).address,
        topology.host(SPARE_HOST).address,
    );
    let gatekeeper = Gatekeeper::new(GatekeeperConfig {
        heartbeat_timeout: Some(heartbeat_timeout),
        ..GatekeeperConfig::new(SERVICE_ADDRESS)
    });
    let mut rack = stage.start(Overlaid::new(topology.forwarding(), gatekeeper))?;
    // The nodes announce themselves and the serving one exports its method.
    rack.run_until(
        &mut |rack| {
            rack.with_program(|program| {
                program.node(spare).is_some() && program.route_of("increment") == Some(node)
            })
        },
        Duration::from_secs(1),
    )?;
    rack.run_until(
        &mut |rack| answered(rack) >= crash_after,
        Duration::from_secs(10),
    )?;
    rack.crash(MEMORY_HOST);
    let failed_at = rack.simulation.now();
    let in_flight_at_failure =
        rack.with_program(|program| program.edges().filter(|edge| edge.callee == node).count());
    wait_for_detection(&mut rack, node)?;
    let detected_at = rack.simulation.now();
    rack.run_for(REPLACEMENT_START)?;
    let checkpoint = rack
        .with_program(|program| program.checkpoint_of(node).map(<[u8]>::to_vec))
        .ok_or(ScenarioError::NoCheckpoint)?;
    rack.with_agent::<ServerAgent, _>(SPARE_HOST, 0, |server| server.callee.restore(&checkpoint))
        .ok_or(ScenarioError::MissingAgent("spare"))??;
    let checkpoint_covers = super::checkpoint::Checkpoint::decode(&checkpoint)?.executed;
    rack.with_program(|program| program.recover(node, spare))?;
    let (answers, _) = run_client_to_the_end(&mut rack)?;
    let (answers, shared_fate) = split_shared_fate(answers, share_fate_every)?;
    let successes = answers.len() as u64;
    if share_fate_every.is_none() {
        check_counts(answers, calls)?;
    } else {
        check_distinct_counts(answers, calls)?;
    }
    // The first answer after the routes moved: the replacement served.
    let first_answer_after = rack
        .with_agent::<ClientAgent, _>(COMPUTE_HOST, 0, |client| {
            client
                .answered_at
                .iter()
                .copied()
                .find(|&at| at >= detected_at)
        })
        .flatten()
        .unwrap_or(detected_at);
    let recovery_time = first_answer_after.saturating_duration_since(detected_at);
    let detection_time = detected_at.saturating_duration_since(failed_at);
    let executed = |rack: &mut SimulatedRackOf, host| {
        rack.with_agent::<ServerAgent, _>(host, 0, |server| server.callee.counters().executed)
            .ok_or(ScenarioError::MissingAgent("server"))
    };
    let executed_before = executed(&mut rack, MEMORY_HOST)?;
    let executed_by_spare = executed(&mut rack, SPARE_HOST)?;
    let count = rack
        .with_agent::<ServerAgent, _>(SPARE_HOST, 0, |server| {
            server.callee.checkpoint().map(|c| c.state)
        })
        .flatten()
        .and_then(|state| state.try_into().ok().map(u64::from_be_bytes))
        .ok_or(ScenarioError::MissingAgent("spare"))?;
    // Each call that failed with the node may have run before it failed.
    if count < successes || count > successes + shared_fate {
        return Err(ScenarioError::WrongFinalCount { calls, count });
    }
    let counters = rack.with_program(|program| program.counters());
    Ok(Failover {
        shared_fate,
        calls,
        executed_before,
        executed_by_spare,
        in_flight_at_failure,
        held: counters.held,
        replayed: counters.replayed,
        checkpoint_covers,
        detection_time,
        recovery_time,
    })
}

/// Runs until the Gatekeeper has found `node` failed by its missed
/// heartbeats; any other node found failed is an error.
fn wait_for_detection(
    rack: &mut SimulatedRackOf,
    node: remora_wire::Ipv4Address,
) -> Result<(), ScenarioError> {
    let mut detected = Vec::new();
    rack.run_until(
        &mut |rack| {
            detected.extend(rack.with_program(|program| program.take_detected()));
            detected.contains(&node)
        },
        Duration::from_secs(1),
    )?;
    if detected != [node] {
        return Err(ScenarioError::WrongDetection { detected });
    }
    Ok(())
}

/// The resends of the relay at `host` and the duplicates its callee
/// dropped.
fn relay_counters(rack: &mut impl Rack, host: usize) -> Result<(u64, u64), ScenarioError> {
    rack.with_agent::<super::chain::RelayAgent, _>(host, 0, |relay| {
        (
            relay.caller.counters().retransmissions,
            relay.callee.counters().duplicates,
        )
    })
    .ok_or(ScenarioError::MissingAgent("middle"))
}

/// Checks that a chain's tail ran each of `calls` calls once; returns the
/// calls it ran and the duplicates it dropped.
fn tail_ran_each_once(rack: &mut impl Rack, calls: u64) -> Result<(u64, u64), ScenarioError> {
    let (executed, duplicates) = rack
        .with_agent::<ServerAgent, _>(TAIL_HOST, 0, |server| {
            let counters = server.callee.counters();
            (counters.executed, counters.duplicates)
        })
        .ok_or(ScenarioError::MissingAgent("tail"))?;
    if executed != calls {
        return Err(ScenarioError::NotExactlyOnce { calls, executed });
    }
    Ok((executed, duplicates))
}

/// The spare middle's host in [`chain_replaced`].
pub const SPARE_MIDDLE_HOST: usize = 3;
/// The chain head's port: the one caller its relays serve.
const HEAD_PORT: u16 = 40000;

/// A chain's middle: serves the head (on the compute host) and calls the
/// tail's `increment`.
fn chain_relay(
    topology: &Topology,
    tail: remora_wire::datagram::DatagramEnd,
) -> super::chain::RelayAgent {
    let upstream = super::chain::Upstream {
        address: topology.host(COMPUTE_HOST).address,
        port: HEAD_PORT,
    };
    super::chain::RelayAgent::new(
        upstream,
        Duration::from_micros(50),
        100_000,
        tail,
        "increment",
        40001,
    )
}

/// A chain A calls B calls C whose middle is replaced on another host:
/// the head (compute host) calls the Gatekeeper's service address, which
/// routes "relay" to the middle (memory host); the middle calls the tail
/// (host 2) directly. After `crash_after` answers the middle crashes for
/// good; the Gatekeeper finds it by its missed heartbeats and holds its
/// calls; the control plane starts a fresh relay on the spare (host 3),
/// with nothing kept, in the middle's place
/// ([`crate::gatekeeper::Gatekeeper::recover_in_place_of`]): the switch
/// replays the calls that were in flight and held, and the spare's nested
/// calls leave under the middle's address, so the tail answers those it
/// ran before from memory. Checks that every call from the head took
/// effect once at the tail.
pub fn chain_replaced(
    seed: u64,
    network: impl Into<Network>,
    calls: u64,
    crash_after: u64,
) -> Result<Chain, ScenarioError> {
    let network: Network = network.into();
    use crate::gatekeeper::{Gatekeeper, GatekeeperConfig, NodeKind};
    use remora_rack::topology::{standard_host, HostSpec, Role};
    use remora_switch::programs::overlay::Overlaid;
    let mut topology = Topology::compute_and_memory();
    for (host, name) in [(TAIL_HOST, "tail"), (SPARE_MIDDLE_HOST, "spare")] {
        let (mac, address) = standard_host(host);
        topology.add_host(HostSpec::new(name, Role::Compute, mac, address))?;
    }
    let mut stage = stage_on(seed, &topology, network);
    stage.add_agent(
        TAIL_HOST,
        Box::new(ServerAgent::new(Callee::new(Box::new(Counter(0))))),
    );
    let service = callee_at(topology.switch_mac, SERVICE_ADDRESS);
    let tail = callee_at(topology.switch_mac, topology.host(TAIL_HOST).address);
    for host in [MEMORY_HOST, SPARE_MIDDLE_HOST] {
        stage.add_agent(host, Box::new(chain_relay(&topology, tail)));
        let control = ControlAgent::new(service, NodeKind::Compute, 1 << 30, HEARTBEAT_INTERVAL);
        let control = match host {
            MEMORY_HOST => control.export("relay")?,
            _ => control,
        };
        stage.add_agent(host, Box::new(control));
    }
    let caller = Caller::new(Duration::from_micros(200), 100_000);
    let head = ClientAgent::new(caller, service, "relay", HEAD_PORT, calls, 8);
    stage.add_agent(COMPUTE_HOST, Box::new(head));
    let (middle, spare) = (
        topology.host(MEMORY_HOST).address,
        topology.host(SPARE_MIDDLE_HOST).address,
    );
    let gatekeeper = Gatekeeper::new(GatekeeperConfig {
        heartbeat_timeout: Some(Duration::from_millis(1)),
        ..GatekeeperConfig::new(SERVICE_ADDRESS)
    });
    let mut rack = stage.start(Overlaid::new(topology.forwarding(), gatekeeper))?;
    rack.run_until(
        &mut |rack| answered(rack) >= crash_after,
        Duration::from_secs(10),
    )?;
    rack.crash(MEMORY_HOST);
    wait_for_detection(&mut rack, middle)?;
    rack.run_for(REPLACEMENT_START)?;
    rack.with_program(|program| program.recover_in_place_of(middle, spare))?;
    let (answers, head_retransmissions) = run_client_to_the_end(&mut rack)?;
    check_counts(answers, calls)?;
    let (before, after) = (
        relay_counters(&mut rack, MEMORY_HOST)?,
        relay_counters(&mut rack, SPARE_MIDDLE_HOST)?,
    );
    let (executed_at_tail, duplicates_at_tail) = tail_ran_each_once(&mut rack, calls)?;
    Ok(Chain {
        calls,
        executed_at_tail,
        head_retransmissions,
        middle_retransmissions: before.0 + after.0,
        duplicates_at_middle: before.1 + after.1,
        duplicates_at_tail,
    })
}

/// What [`caller_crash`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerCrash {
    pub calls: u64,
    /// Outcomes the client had delivered when it crashed, and what its
    /// restored checkpoint said it had delivered (a2: the rest it takes
    /// again from the callee's memory).
    pub delivered_at_crash: u64,
    pub delivered_in_checkpoint: u64,
    /// Calls the checkpoint had unanswered (a1): resent under their ids.
    pub resent_after_restore: u64,
    /// Calls the callee ran: each once.
    pub executed: u64,
    /// Duplicates the callee answered from memory.
    pub duplicates: u64,
    /// Checkpoints the Gatekeeper took off the caller's calls.
    pub caller_checkpoints: u64,
}

/// The head caller fails (f1: with calls unanswered; f2: after replies
/// it took and before its next call committed them; or before a call it
/// meant to send left): `calls` calls to the Gatekeeper's service
/// address, 8 at a time, each carrying the caller's checkpoint. After
/// `crash_after` outcomes the compute host crashes, losing the caller's
/// memory; it stays down `down_for` (replies to it are lost), restarts,
/// and the control plane restores the client from the checkpoint the
/// Gatekeeper kept. Checks that every call took effect exactly once and
/// the client delivered each outcome once.
pub fn caller_crash(
    seed: u64,
    network: impl Into<Network>,
    calls: u64,
    crash_after: u64,
    down_for: Duration,
) -> Result<CallerCrash, ScenarioError> {
    let network: Network = network.into();
    use crate::gatekeeper::{Gatekeeper, GatekeeperConfig, NodeKind};
    use remora_switch::programs::overlay::Overlaid;
    let topology = Topology::compute_and_memory();
    let mut stage = stage_on(seed, &topology, network);
    let server = ServerAgent::new(Callee::new(Box::new(Counter(0))));
    stage.add_agent(MEMORY_HOST, Box::new(server));
    let service = remora_wire::datagram::DatagramEnd {
        mac: topology.switch_mac,
        address: SERVICE_ADDRESS,
        port: remora_wire::bifrost::BIFROST_PORT,
    };
    const CLIENT_PORT: u16 = 40000;
    let caller = Caller::new(Duration::from_micros(50), 100_000);
    let client = ClientAgent::new(caller, service, "increment", CLIENT_PORT, calls, 8);
    stage.add_agent(COMPUTE_HOST, Box::new(client.with_checkpoints()));
    let node = topology.host(MEMORY_HOST).address;
    let client_end = (topology.host(COMPUTE_HOST).address, CLIENT_PORT);
    let mut gatekeeper = Gatekeeper::new(GatekeeperConfig::new(SERVICE_ADDRESS));
    gatekeeper.register_node(node, NodeKind::Compute, 1 << 30)?;
    gatekeeper.route("increment", node)?;
    let mut rack = stage.start(Overlaid::new(topology.forwarding(), gatekeeper))?;
    rack.run_until(
        &mut |rack| answered(rack) >= crash_after,
        Duration::from_secs(10),
    )?;
    let delivered_at_crash = answered(&mut rack);
    rack.crash(COMPUTE_HOST);
    rack.run_for(down_for)?;
    rack.restart(COMPUTE_HOST)?;
    let checkpoint =
        rack.with_program(|program| program.caller_checkpoint_of(client_end).map(<[u8]>::to_vec));
    let now = rack.simulation.now();
    let restored = rack
        .with_agent::<ClientAgent, _>(COMPUTE_HOST, 0, |client| {
            client.restore(now, checkpoint.as_deref())
        })
        .ok_or(ScenarioError::MissingAgent("client"))??;
    let (answers, _) = run_client_to_the_end(&mut rack)?;
    check_counts(answers, calls)?;
    let counters = rack
        .with_agent::<ServerAgent, _>(MEMORY_HOST, 0, |server| server.callee.counters())
        .ok_or(ScenarioError::MissingAgent("server"))?;
    if counters.executed != calls {
        return Err(ScenarioError::NotExactlyOnce {
            calls,
            executed: counters.executed,
        });
    }
    Ok(CallerCrash {
        calls,
        delivered_at_crash,
        delivered_in_checkpoint: restored.delivered,
        resent_after_restore: restored.unanswered.len() as u64,
        executed: counters.executed,
        duplicates: counters.duplicates,
        caller_checkpoints: rack.with_program(|program| program.counters().caller_checkpoints),
    })
}

type SimulatedRackOf = remora_rack::simulated::SimulatedRack<
    remora_switch::programs::overlay::Overlaid<crate::gatekeeper::Gatekeeper>,
>;

/// One seed's plan in a [`failover_campaign`]: how many calls, and after
/// how many answers the serving node crashes (between a tenth and nine
/// tenths of the way), drawn from the seed.
pub fn failover_plan(seed: u64) -> (u64, u64) {
    // SplitMix64's finaliser: a well-spread function of the seed.
    let mut mixed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
    mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    mixed ^= mixed >> 31;
    let calls = 500 + mixed % 1500;
    let crash_after = calls / 10 + (mixed >> 20) % (calls * 8 / 10);
    (calls, crash_after)
}

/// What a campaign of [`failover`] seeds found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CampaignReport {
    pub first_seed: u64,
    pub seeds: u64,
    pub passed: u64,
    pub calls: u64,
    pub held: u64,
    /// Calls that shared a failed callee's fate (odd seeds: every third
    /// call) and were answered with the failure, never replayed.
    pub shared_fate: u64,
    /// Calls the switch replayed to replacements.
    pub replayed: u64,
    /// The median and the longest recovery of the failovers, from the
    /// Gatekeeper's detection (a 1 ms heartbeat timeout) to the
    /// replacement's first answer (virtual µs).
    pub recovery_p50_us: f64,
    pub recovery_max_us: f64,
    /// READs and WRITEs the ACL audits sent through the Gatekeeper, and
    /// how many it let through (each verdict checked against the model).
    pub acl_accesses: u64,
    pub acl_allowed: u64,
    /// Requests the audits sent under another client's address or on
    /// another's connection: none passed.
    pub acl_spoofed: u64,
    /// Replies the audits forged and resends naming another pointer: none
    /// changed a rule.
    pub acl_forged: u64,
    pub violations: Vec<Violation>,
}

/// Random events each seed's ACL audit sends through the Gatekeeper.
pub const ACL_EVENTS_PER_SEED: usize = 400;

/// Runs, for `count` seeds from `first_seed` over links with `faults`,
/// each with its own plan: [`failover_with`] (the serving node crashes; a
/// spare takes over from its checkpoint through the Gatekeeper; on odd
/// seeds every third call shares the node's fate), a chain whose middle
/// crashes ([`chain`], restarting in place, on even seeds;
/// [`chain_replaced`], replaced on another host, on odd ones), and [`caller_crash`]
/// (the head caller crashes and comes back from its checkpoint), and an
/// audit of the ACL on random DSM traffic
/// ([`crate::gatekeeper::audit::acl_audit`]). `each` hears whether each
/// seed passed.
pub fn crash_campaign(
    first_seed: u64,
    count: u64,
    network: impl Into<Network>,
    mut each: impl FnMut(u64, bool),
) -> CampaignReport {
    let network: Network = network.into();
    let mut report = CampaignReport {
        first_seed,
        seeds: count,
        ..CampaignReport::default()
    };
    let mut recoveries = Vec::new();
    for seed in first_seed..first_seed.saturating_add(count) {
        let (calls, crash_after) = failover_plan(seed);
        let middle_crash = MiddleCrash {
            after_answers: crash_after / 2,
            down_for: Duration::from_millis(1 + seed % 3),
        };
        let caller_down = Duration::from_micros(100 + 100 * (seed % 5));
        // Odd seeds have every third call share its callee's fate.
        let share_fate_every = (seed % 2 == 1).then_some(3);
        let timeout = Duration::from_millis(1);
        let outcome = failover_with(
            seed,
            network,
            (calls, crash_after),
            timeout,
            share_fate_every,
        )
        .and_then(|failover| {
            // Even seeds restart the middle in place; odd ones replace it
            // on another host.
            let chain = if seed % 2 == 0 {
                chain(seed, network, calls / 2, Some(middle_crash))
            } else {
                chain_replaced(seed, network, calls / 2, crash_after / 2)
            };
            chain.map(|chain| (failover, chain))
        })
        .and_then(|(failover, chain)| {
            caller_crash(seed, network, calls / 2, crash_after / 2, caller_down)
                .map(|caller| (failover, chain, caller))
        })
        .and_then(|runs| {
            crate::gatekeeper::audit::acl_audit(seed, ACL_EVENTS_PER_SEED)
                .map(|audit| (runs, audit))
                .map_err(ScenarioError::from)
        });
        each(seed, outcome.is_ok());
        match outcome {
            Ok(((failover, chain, caller), audit)) => {
                report.acl_accesses += audit.accesses;
                report.acl_allowed += audit.allowed;
                report.acl_spoofed += audit.spoofed;
                report.acl_forged += audit.forged;
                recoveries.push(failover.recovery_time.as_nanos() as f64 / 1e3);
                report.passed += 1;
                report.calls += failover.calls + chain.calls + caller.calls;
                report.held += failover.held;
                report.shared_fate += failover.shared_fate;
                report.replayed += failover.replayed;
            }
            Err(error) => report.violations.push(Violation {
                seed,
                error: error.to_string(),
            }),
        }
    }
    recoveries.sort_by(f64::total_cmp);
    report.recovery_p50_us = recoveries.get(recoveries.len() / 2).copied().unwrap_or(0.0);
    report.recovery_max_us = recoveries.last().copied().unwrap_or(0.0);
    report
}

/// What [`chain`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain {
    pub calls: u64,
    /// Calls the tail service ran: one per call from the head.
    pub executed_at_tail: u64,
    /// Resends at each hop, and duplicates each callee dropped.
    pub head_retransmissions: u64,
    pub middle_retransmissions: u64,
    pub duplicates_at_middle: u64,
    pub duplicates_at_tail: u64,
}

/// The tail's host in [`chain`].
pub const TAIL_HOST: usize = 2;

/// When the middle of a [`chain`] crashes, and for how long it is down
/// before it restarts in place with nothing kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MiddleCrash {
    pub after_answers: u64,
    pub down_for: Duration,
}

/// A chain of three services, A calls B calls C, in the simulator over
/// links with `faults`: the head (compute host) makes `calls` calls to the
/// middle (memory host), each of which makes one nested call to the tail,
/// a counter (host 2); with `crash`, the middle crashes and restarts. Checks
/// that every call took effect exactly once at the tail: the answers are
/// exactly the counts 1..=calls.
pub fn chain(
    seed: u64,
    network: impl Into<Network>,
    calls: u64,
    crash: Option<MiddleCrash>,
) -> Result<Chain, ScenarioError> {
    let network: Network = network.into();
    use remora_rack::topology::{standard_host, HostSpec, Role};
    let mut topology = Topology::compute_and_memory();
    let (mac, address) = standard_host(TAIL_HOST);
    topology.add_host(HostSpec::new("tail", Role::Compute, mac, address))?;
    let mut stage = stage_on(seed, &topology, network);
    stage.add_agent(
        TAIL_HOST,
        Box::new(ServerAgent::new(Callee::new(Box::new(Counter(0))))),
    );
    let tail = callee_at(topology.switch_mac, topology.host(TAIL_HOST).address);
    stage.add_agent(MEMORY_HOST, Box::new(chain_relay(&topology, tail)));
    let middle = callee_at(topology.switch_mac, topology.host(MEMORY_HOST).address);
    let head = ClientAgent::new(
        Caller::new(Duration::from_micros(200), 100_000),
        middle,
        "relay",
        HEAD_PORT,
        calls,
        8,
    );
    stage.add_agent(COMPUTE_HOST, Box::new(head));
    let mut rack = stage.start(topology.forwarding())?;
    if let Some(crash) = crash {
        rack.run_until(
            &mut |rack| answered(rack) >= crash.after_answers,
            Duration::from_secs(10),
        )?;
        rack.crash(MEMORY_HOST);
        rack.run_for(crash.down_for)?;
        rack.restart(MEMORY_HOST)?;
    }
    let (answers, head_retransmissions) = run_client_to_the_end(&mut rack)?;
    check_counts(answers, calls)?;
    let (middle_retransmissions, duplicates_at_middle) = relay_counters(&mut rack, MEMORY_HOST)?;
    let (executed_at_tail, duplicates_at_tail) = tail_ran_each_once(&mut rack, calls)?;
    Ok(Chain {
        calls,
        executed_at_tail,
        head_retransmissions,
        middle_retransmissions,
        duplicates_at_middle,
        duplicates_at_tail,
    })
}
