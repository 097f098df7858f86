//! Bifröst in the command line: the demo's step and `bench bifrost`.

use super::system::{System, SystemStep};
use crate::bench::entry::Benchmark;
use crate::error::{InSystem, SystemError};
use crate::HistoryFile;
use remora_bifrost::rack_section::BifrostSection;
use remora_rack::RackConfig;
use remora_sim::Probability;

pub struct Bifrost;

impl System for Bifrost {
    fn name(&self) -> &'static str {
        "bifrost"
    }

    fn title(&self) -> &'static str {
        "Bifröst"
    }

    fn check_section(&self, rack: &RackConfig) -> Result<(), SystemError> {
        BifrostSection::from_rack(rack)
            .map(|_| ())
            .in_system(self.name())
    }

    fn rack_up(&self, rack: &RackConfig, failures: &mut Vec<String>) -> Option<serde_json::Value> {
        run_section(rack, failures)
    }

    fn demo_step(&self, _history: Option<&mut HistoryFile>) -> Result<SystemStep, SystemError> {
        bifrost_step()
    }

    fn benchmark(&self) -> Option<&'static dyn Benchmark> {
        Some(&crate::bench::bifrost::BENCH)
    }
}

/// Bifröst: the DSM over three memory nodes on the embedded rack (data
/// through every node, misuse refused), the RPC runtime's exactly-once
/// calls over lossy links in the simulator, a chain whose middle crashes,
/// the Gatekeeper's failover and a caller's crash, and the Gatekeeper's
/// ACL on the embedded rack.
pub fn bifrost_step() -> Result<SystemStep, SystemError> {
    use remora_bifrost::dsm::client::DsmError;
    use remora_bifrost::dsm::rack::{DsmRack, DsmRackConfig};
    use remora_bifrost::rpc::scenario::exactly_once;
    let mut step = SystemStep {
        variants: Vec::new(),
        failures: Vec::new(),
    };
    println!(
        "\nBifröst's global memory on the embedded rack (a compute node, three memory nodes):"
    );
    let rack = DsmRack::start(DsmRackConfig::default()).in_system("bifrost")?;
    let dsm = &rack.dsm;
    let mut round_trips = 0;
    for index in 0..dsm.node_count() as u8 {
        let data = vec![index + 1; 100_000];
        let ptr = dsm.alloc(data.len() as u64).in_system("bifrost")?;
        dsm.write(ptr, &data).in_system("bifrost")?;
        let mut back = vec![0u8; data.len()];
        dsm.read(ptr, &mut back).in_system("bifrost")?;
        if back == data {
            round_trips += 1;
        } else {
            step.failures
                .push(format!("DSM: node {} returned other bytes", ptr.node));
        }
        dsm.free(ptr).in_system("bifrost")?;
        if !matches!(dsm.free(ptr), Err(DsmError::DoubleFree(_))) {
            step.failures
                .push("DSM: a double free was not refused".into());
        }
    }
    println!("  100 kB written and read back on {round_trips} of 3 nodes; double frees refused");
    step.variants
        .push(serde_json::json!({ "variant": "dsm", "nodes_round_tripped": round_trips }));
    let faults = remora_sim::LinkFaults {
        loss: Probability::literal(0.1),
        duplicate: Probability::literal(0.05),
        ..remora_sim::LinkFaults::NONE
    };
    match exactly_once(7, faults, 300) {
        Ok(outcome) => {
            println!(
                "  RPC in the simulator, 10% loss and 5% duplication: {} calls ran exactly once ({} retransmissions, {} duplicates answered from the reply kept)",
                outcome.executed, outcome.retransmissions, outcome.duplicates
            );
            step.variants.push(serde_json::json!({
                "variant": "rpc exactly once",
                "calls": outcome.calls,
                "retransmissions": outcome.retransmissions,
                "duplicates": outcome.duplicates,
            }));
        }
        Err(error) => step.failures.push(format!("Bifröst RPC: {error}")),
    }
    let middle_crash = remora_bifrost::rpc::scenario::MiddleCrash {
        after_answers: 120,
        down_for: std::time::Duration::from_millis(1),
    };
    match remora_bifrost::rpc::scenario::chain(5, faults, 300, Some(middle_crash)) {
        Ok(outcome) => {
            println!(
                "  a chain A calls B calls C over the same links, B crashing after 120 answers and restarting 1 ms later with nothing kept: {} calls from A took effect once each at C ({} + {} resends on the two hops, {} + {} duplicates dropped)",
                outcome.calls,
                outcome.head_retransmissions,
                outcome.middle_retransmissions,
                outcome.duplicates_at_middle,
                outcome.duplicates_at_tail
            );
            step.variants.push(serde_json::json!({
                "variant": "chain of three services, the middle crashing",
                "calls": outcome.calls,
                "executed_at_tail": outcome.executed_at_tail,
            }));
        }
        Err(error) => step.failures.push(format!("Bifröst chain: {error}")),
    }
    match remora_bifrost::rpc::scenario::chain_replaced(6, faults, 300, 120) {
        Ok(outcome) => {
            println!(
                "  the same chain behind the Gatekeeper, B crashing for good after 120 answers: found by its missed heartbeats and replaced by a fresh relay on another host in its place; {} calls from A took effect once each at C (C answered {} duplicates from memory, the replacement's repeated nested calls among them)",
                outcome.calls, outcome.duplicates_at_tail
            );
            step.variants.push(serde_json::json!({
                "variant": "chain of three services, the middle replaced on another host",
                "calls": outcome.calls,
                "executed_at_tail": outcome.executed_at_tail,
                "duplicates_at_tail": outcome.duplicates_at_tail,
            }));
        }
        Err(error) => step
            .failures
            .push(format!("Bifröst chain replaced: {error}")),
    }
    match remora_bifrost::rpc::scenario::failover(
        11,
        faults,
        2000,
        800,
        std::time::Duration::from_millis(1),
    ) {
        Ok(outcome) => {
            println!(
                "  the Gatekeeper in the switch, the serving node crashed after 800 answers: found silent {:.0} us later by its missed heartbeats, {} calls held, a spare restored from its checkpoint of {} calls took over and the switch replayed {} calls to it; {} calls, each took effect once",
                outcome.detection_time.as_nanos() as f64 / 1e3,
                outcome.held,
                outcome.checkpoint_covers,
                outcome.replayed,
                outcome.calls
            );
            step.variants.push(serde_json::json!({
                "variant": "gatekeeper failover",
                "calls": outcome.calls,
                "held": outcome.held,
                "replayed": outcome.replayed,
                "detection_us": outcome.detection_time.as_nanos() as f64 / 1e3,
                "checkpoint_covers": outcome.checkpoint_covers,
            }));
        }
        Err(error) => step.failures.push(format!("Bifröst failover: {error}")),
    }
    match remora_bifrost::rpc::scenario::caller_crash(
        13,
        faults,
        400,
        150,
        std::time::Duration::from_micros(400),
    ) {
        Ok(outcome) => {
            println!(
                "  the head caller crashed after {} outcomes and came back from the checkpoint its calls carried ({} outcomes, {} calls unanswered, resent): {} calls, each ran once",
                outcome.delivered_at_crash,
                outcome.delivered_in_checkpoint,
                outcome.resent_after_restore,
                outcome.calls
            );
            step.variants.push(serde_json::json!({
                "variant": "head caller crash",
                "calls": outcome.calls,
                "executed": outcome.executed,
                "resent_after_restore": outcome.resent_after_restore,
            }));
        }
        Err(error) => step.failures.push(format!("Bifröst caller crash: {error}")),
    }
    acl_step(&mut step)?;
    Ok(step)
}

/// The Gatekeeper's ACL on the embedded rack: add_arrays by reference, the
/// inputs lent to the service for the call and the sum's control handed
/// back; a call that lends nothing, which the service refuses to read for;
/// and the service's host reading the caller's arrays outside any call,
/// which the switch refuses.
fn acl_step(step: &mut SystemStep) -> Result<(), SystemError> {
    use remora_bifrost::arrays::arrays_rack;
    use remora_bifrost::by_reference::{from_idl, pass_by_reference, to_idl};
    use remora_bifrost::dsm::rack::DsmRackConfig;
    use remora_bifrost::services::{ArraysSyncClient, TArraysSyncClient};
    use remora_bifrost::transport::{client_protocols_passing, Routing};
    let arrays =
        arrays_rack(DsmRackConfig::default(), 1, Routing::Gatekeeper).in_system("bifrost")?;
    let dsm = &arrays.dsm;
    let ((input, output), pointer) = client_protocols_passing(arrays.path.clone());
    let mut client = ArraysSyncClient::new(input, output);
    let (a, b) = (vec![40u8; 65_536], vec![2u8; 65_536]);
    let (inputs, arguments) = pass_by_reference(dsm, &[&a, &b]).in_system("bifrost")?;
    let unlent = client.add_arrays(to_idl(arguments[0]), to_idl(arguments[1]));
    if unlent.is_ok() {
        step.failures
            .push("ACL: a call that lent nothing still read the caller's arrays".into());
    }
    // The service's host going round the service: no call lends it the
    // arrays now, so the switch refuses its read (at the stat that learns
    // the size, its first step) in the memory node's name.
    let mut stolen = vec![0u8; 16];
    let service_dsm = arrays.service_dsm.get();
    let outside_a_call = service_dsm.map(|service| service.read(inputs, &mut stolen));
    if !matches!(outside_a_call, Some(Err(_))) {
        step.failures
            .push("ACL: the service's host read the caller's arrays outside a call".into());
    }
    pointer.pass(inputs.to_address());
    let sum = client
        .add_arrays(to_idl(arguments[0]), to_idl(arguments[1]))
        .in_system("bifrost")?;
    let sum = from_idl(&sum).in_system("bifrost")?.allocation;
    let mut back = vec![0u8; a.len()];
    dsm.read(sum, &mut back).in_system("bifrost")?;
    if back.iter().any(|&byte| byte != 42) {
        step.failures
            .push("ACL: add_arrays gave a wrong sum".into());
    }
    for ptr in [inputs, sum] {
        dsm.free(ptr).in_system("bifrost")?;
    }
    let counters = arrays.gatekeeper_counters().unwrap_or_default().memory;
    println!(
        "  the Gatekeeper's ACL (refuse by default): add_arrays of 64 KiB by reference through it, the inputs lent to the service for the call and the sum's control handed to the caller with the reply; a call that lent nothing was refused by the service, and its host's own read of the arrays outside a call by the switch ({} READs allowed, {} refused, {} NAKs sent in the memory node's name)",
        counters.reads_allowed, counters.refused(), counters.naks_sent
    );
    if counters.naks_sent == 0 {
        step.failures.push("ACL: the switch sent no NAK".into());
    }
    step.variants.push(serde_json::json!({
        "variant": "gatekeeper acl",
        "reads_allowed": counters.reads_allowed,
        "refused": counters.refused(),
        "naks_sent": counters.naks_sent,
    }));
    Ok(())
}

/// The rack file's `[bifrost]` section on the embedded rack: the array
/// services on the rack's own hosts, every call by reference and its
/// answer checked. Failures join the rack's.
fn run_section(rack: &RackConfig, failures: &mut Vec<String>) -> Option<serde_json::Value> {
    let (section, hosts) = match BifrostSection::from_rack(rack) {
        Ok(Some(found)) => found,
        Ok(None) => return None,
        Err(error) => {
            failures.push(error.to_string());
            return Some(serde_json::json!({ "error": error.to_string() }));
        }
    };
    let (runs, counters) = match remora_bifrost::rack_section::run_section(&section, &hosts) {
        Ok(ran) => ran,
        Err(error) => {
            failures.push(format!("bifrost: {error}"));
            return Some(serde_json::json!({ "error": error.to_string() }));
        }
    };
    for run in &runs {
        println!(
            "bifrost: {} of {} B by reference, {:?}: {} of {} answers right, p50 {:.1} us, p99 {:.1} us",
            run.workload, section.array_bytes, section.routing, run.matched, run.calls, run.p50_us, run.p99_us
        );
        if run.matched != run.calls {
            failures.push(format!(
                "bifrost: {} gave {} wrong answers",
                run.workload,
                run.calls - run.matched
            ));
        }
    }
    let gatekeeper = counters.map(|counters| {
        println!(
            "bifrost: the Gatekeeper routed {} calls; its ACL allowed {} READs and {} WRITEs and refused {}",
            counters.calls_routed,
            counters.memory.reads_allowed,
            counters.memory.writes_allowed,
            counters.memory.refused()
        );
        serde_json::json!({
            "calls_routed": counters.calls_routed,
            "resends_routed": counters.resends_routed,
            "reads_allowed": counters.memory.reads_allowed,
            "writes_allowed": counters.memory.writes_allowed,
            "refused": counters.memory.refused(),
            "naks_sent": counters.memory.naks_sent,
        })
    });
    Some(serde_json::json!({
        "array_bytes": section.array_bytes,
        "routing": format!("{:?}", section.routing),
        "runs": runs,
        "gatekeeper": gatekeeper,
    }))
}
