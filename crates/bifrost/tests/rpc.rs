//! The RPC runtime in the simulator, over lossy, duplicating and
//! reordering links: every call runs exactly once and every caller gets
//! exactly one answer per call.

use remora_base::Probability;
use remora_bifrost::rpc::agents::{ClientAgent, ServerAgent};
use remora_bifrost::rpc::{callee_at, Callee, Caller, Service};
use remora_rack::scenario::{Rack, RackStage, SimulatedStage};
use remora_rack::topology::{LinkSpec, Topology, COMPUTE_HOST, MEMORY_HOST};
use remora_sim::LinkFaults;
use remora_wire::bifrost::GlobalAddress;
use std::collections::BTreeSet;
use std::time::Duration;

/// Counts its calls: each answer is the count after that call, so a call
/// run twice shows as a missing or repeated number.
struct Counter(u64);

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

fn run(seed: u64, faults: LinkFaults, calls: u64) -> (Vec<u64>, u64, u64, u64) {
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
    let server = ServerAgent::new(Callee::new(Box::new(Counter(0))));
    stage.add_agent(MEMORY_HOST, Box::new(server));
    let callee = callee_at(topology.switch_mac, topology.host(MEMORY_HOST).address);
    let caller = Caller::new(Duration::from_micros(50), 1000);
    let client = ClientAgent::new(caller, callee, "increment", 40000, calls, 8);
    stage.add_agent(COMPUTE_HOST, Box::new(client));
    let mut rack = stage
        .start(topology.forwarding())
        .expect("the simulated rack starts");
    rack.run_until(
        &mut |rack| {
            rack.with_agent::<ClientAgent, _>(COMPUTE_HOST, 0, |client| client.is_done())
                .unwrap_or(false)
        },
        Duration::from_secs(10),
    )
    .expect("every call is answered");
    let answers: Vec<u64> = rack
        .with_agent::<ClientAgent, _>(COMPUTE_HOST, 0, |client| {
            client
                .outcomes
                .iter()
                .map(|(_, outcome)| {
                    let bytes = outcome.as_ref().expect("no call fails");
                    u64::from_be_bytes(bytes[..8].try_into().expect("a count"))
                })
                .collect()
        })
        .expect("the client agent");
    let retransmissions = rack
        .with_agent::<ClientAgent, _>(COMPUTE_HOST, 0, |client| {
            client.caller.counters().retransmissions
        })
        .expect("the client agent");
    let (executed, duplicates) = rack
        .with_agent::<ServerAgent, _>(MEMORY_HOST, 0, |server| {
            let counters = server.callee.counters();
            (counters.executed, counters.duplicates)
        })
        .expect("the server agent");
    (answers, retransmissions, executed, duplicates)
}

#[test]
fn every_call_runs_exactly_once_over_clean_links() {
    let (answers, _, executed, _) = run(1, LinkFaults::NONE, 200);
    assert_eq!(executed, 200);
    assert_eq!(
        answers.iter().copied().collect::<BTreeSet<u64>>(),
        (1..=200).collect()
    );
}

#[test]
fn every_call_runs_exactly_once_over_lossy_links() {
    let faults = LinkFaults {
        loss: Probability::literal(0.1),
        duplicate: Probability::literal(0.05),
        reorder: Probability::literal(0.05),
        reorder_delay: Duration::from_micros(5),
        ..LinkFaults::NONE
    };
    let mut duplicates_dropped = 0;
    for seed in 0..20 {
        let (answers, retransmissions, executed, duplicates) = run(seed, faults, 200);
        duplicates_dropped += duplicates;
        assert_eq!(executed, 200, "seed {seed}: a call ran twice or never");
        assert_eq!(answers.len(), 200, "seed {seed}: one answer per call");
        let distinct: BTreeSet<u64> = answers.iter().copied().collect();
        assert_eq!(distinct, (1..=200).collect(), "seed {seed}");
        assert!(
            retransmissions > 0,
            "seed {seed}: 10% loss must cost retransmissions"
        );
    }
    // The callee saw duplicates (retransmissions and duplicated frames)
    // and ran none of them.
    assert!(duplicates_dropped > 0);
}
