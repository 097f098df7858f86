//! The exactly-once scenario, written once: a client calls a counter
//! service on another host through the switch, over links with the given
//! faults, in the simulator. Each answer is the count after that call, so
//! a call run twice or never shows as a repeated or missing number.

use super::agents::{ClientAgent, ServerAgent};
use super::{callee_at, Callee, Caller, RpcError, Service};
use remora_rack::scenario::{Rack, RackStage, SimulatedStage};
use remora_rack::topology::{LinkSpec, Topology, COMPUTE_HOST, MEMORY_HOST};
use remora_rack::RackError;
use remora_sim::LinkFaults;
use remora_wire::bifrost::GlobalAddress;
use std::collections::BTreeSet;
use std::time::Duration;

/// Counts its calls.
pub struct Counter(pub u64);

impl Service for Counter {
    fn call(
        &mut self,
        method: &[u8],
        _pointer: GlobalAddress,
        _arguments: &[u8],
    ) -> Result<Vec<u8>, String> {
        if method != b"increment" {
            return Err(format!("no method {}", String::from_utf8_lossy(method)));
        }
        self.0 += 1;
        Ok(self.0.to_be_bytes().to_vec())
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
}

/// Runs `calls` calls, 8 at a time, and checks exactly-once.
pub fn exactly_once(
    seed: u64,
    faults: LinkFaults,
    calls: u64,
) -> Result<ExactlyOnce, ScenarioError> {
    let mut topology = Topology::compute_and_memory();
    for host in [COMPUTE_HOST, MEMORY_HOST] {
        topology.set_link(
            host,
            LinkSpec {
                faults,
                ..LinkSpec::CLEAN
            },
        );
    }
    let mut stage = SimulatedStage::new(seed, &topology, seed);
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
    rack.run_until(
        &mut |rack| {
            rack.with_agent::<ClientAgent, _>(COMPUTE_HOST, 0, |client| client.is_done())
                .unwrap_or(false)
        },
        Duration::from_secs(10),
    )?;
    let (answers, retransmissions) = rack
        .with_agent::<ClientAgent, _>(COMPUTE_HOST, 0, |client| {
            (
                client.outcomes.clone(),
                client.caller.counters().retransmissions,
            )
        })
        .ok_or(ScenarioError::MissingAgent("client"))?;
    let (executed, duplicates) = rack
        .with_agent::<ServerAgent, _>(MEMORY_HOST, 0, |server| {
            let counters = server.callee.counters();
            (counters.executed, counters.duplicates)
        })
        .ok_or(ScenarioError::MissingAgent("server"))?;
    let mut counts = BTreeSet::new();
    for (rpc_id, outcome) in answers {
        let bytes = outcome.map_err(|error| ScenarioError::CallFailed { rpc_id, error })?;
        let count = bytes
            .get(..8)
            .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")));
        counts.insert(count.ok_or(ScenarioError::WrongAnswers { calls })?);
    }
    if executed != calls {
        return Err(ScenarioError::NotExactlyOnce { calls, executed });
    }
    if counts != (1..=calls).collect() {
        return Err(ScenarioError::WrongAnswers { calls });
    }
    Ok(ExactlyOnce {
        calls,
        executed,
        retransmissions,
        duplicates,
    })
}
