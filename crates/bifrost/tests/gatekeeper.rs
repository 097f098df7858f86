//! The Gatekeeper in the switch, in the simulator: calls addressed to its
//! service address are routed by method, the RPC graph empties as replies
//! pass, unknown methods fail fast, and when the serving node fails its
//! calls are held until a replacement takes its methods over.

use remora_bifrost::gatekeeper::{Gatekeeper, GatekeeperConfig, NodeKind};
use remora_bifrost::rpc::agents::{ClientAgent, ServerAgent};
use remora_bifrost::rpc::scenario::Counter;
use remora_bifrost::rpc::{Callee, Caller, RpcError};
use remora_rack::scenario::{Rack, RackStage, SimulatedStage};
use remora_rack::topology::{standard_host, HostSpec, Role, Topology, COMPUTE_HOST, MEMORY_HOST};
use remora_switch::programs::overlay::Overlaid;
use remora_wire::bifrost::BIFROST_PORT;
use remora_wire::datagram::DatagramEnd;
use remora_wire::Ipv4Address;
use std::time::Duration;

const SERVICE: Ipv4Address = Ipv4Address::new(10, 0, 0, 200);
const SPARE_HOST: usize = 2;

/// The host 10.0.0.`last`, its MAC ending in `last`, on UDP `port`.
fn host_on(last: u8, port: u16) -> DatagramEnd {
    DatagramEnd {
        mac: remora_wire::MacAddress([2, 0, 0, 0, 0, last]),
        address: Ipv4Address::new(10, 0, 0, last),
        port,
    }
}

/// The frame of a UDP datagram carrying `payload` from `from` to `to`.
fn datagram_frame(from: DatagramEnd, to: DatagramEnd, payload: &[u8]) -> Vec<u8> {
    use remora_wire::datagram::{emit_datagram, DATAGRAM_HEADERS_LEN};
    let mut frame = vec![0u8; DATAGRAM_HEADERS_LEN + payload.len()];
    let length = emit_datagram(from, to, payload, &mut frame).unwrap();
    frame.truncate(length);
    frame
}

/// The frame of a Bifröst message with no body: `repr`'s header alone.
fn header_frame(
    repr: remora_wire::bifrost::BifrostRepr,
    from: DatagramEnd,
    to: DatagramEnd,
) -> Vec<u8> {
    let mut payload = vec![0u8; remora_wire::bifrost::HEADER_LEN];
    repr.emit(&mut payload).unwrap();
    datagram_frame(from, to, &payload)
}

/// A switch running a Gatekeeper over `hosts` (host `i` on switch port
/// `i`), which knows where `attached` of them are attached and is then
/// set up by `prepare`.
fn gatekeeper_switch(
    hosts: &[DatagramEnd],
    attached: &[usize],
    prepare: impl FnOnce(&mut Gatekeeper),
) -> remora_switch::Switch<Overlaid<Gatekeeper>> {
    use remora_switch::programs::l2l3::L2L3Forwarding;
    use remora_switch::{PortId, Switch, SwitchConfig};
    let addresses: Vec<_> = hosts.iter().map(|end| (end.mac, end.address)).collect();
    let forwarding = L2L3Forwarding::with_attached_hosts(control::ROUTER, &addresses).unwrap();
    let mut gatekeeper = Gatekeeper::new(GatekeeperConfig::new(SERVICE));
    for &index in attached {
        gatekeeper
            .register_host_port(hosts[index].address, PortId(index as u16))
            .unwrap();
    }
    prepare(&mut gatekeeper);
    Switch::new(
        SwitchConfig::new(hosts.len() as u16),
        Overlaid::new(forwarding, gatekeeper),
    )
}

fn topology() -> Topology {
    let mut topology = Topology::compute_and_memory();
    let (mac, address) = standard_host(SPARE_HOST);
    topology
        .add_host(HostSpec::new("spare", Role::Compute, mac, address))
        .unwrap();
    topology
}

/// A rack whose switch runs the Gatekeeper, with "increment" served by the
/// memory host, a spare server standing by, and a client calling `method`
/// at the service address.
fn start(
    seed: u64,
    method: &'static str,
    calls: u64,
    attempts: u32,
) -> (Topology, impl Rack<Program = Overlaid<Gatekeeper>>) {
    let topology = topology();
    let mut stage = SimulatedStage::new(seed, &topology, seed);
    for host in [MEMORY_HOST, SPARE_HOST] {
        stage.add_agent(
            host,
            Box::new(ServerAgent::new(Callee::new(Box::new(Counter(0))))),
        );
    }
    let service = DatagramEnd {
        mac: topology.switch_mac,
        address: SERVICE,
        port: BIFROST_PORT,
    };
    let caller = Caller::new(Duration::from_micros(50), attempts);
    stage.add_agent(
        COMPUTE_HOST,
        Box::new(ClientAgent::new(caller, service, method, 40000, calls, 8)),
    );
    let mut gatekeeper = Gatekeeper::new(GatekeeperConfig::new(SERVICE));
    for host in [MEMORY_HOST, SPARE_HOST] {
        gatekeeper
            .register_node(topology.host(host).address, NodeKind::Compute, 1 << 30)
            .unwrap();
    }
    gatekeeper
        .route("increment", topology.host(MEMORY_HOST).address)
        .unwrap();
    let rack = stage
        .start(Overlaid::new(topology.forwarding(), gatekeeper))
        .unwrap();
    (topology, rack)
}

fn outcomes(rack: &mut impl Rack) -> Vec<(u64, Result<Vec<u8>, RpcError>)> {
    rack.with_agent::<ClientAgent, _>(COMPUTE_HOST, 0, |client| client.outcomes.clone())
        .unwrap()
}

fn done(rack: &mut impl Rack) -> bool {
    rack.with_agent::<ClientAgent, _>(COMPUTE_HOST, 0, |client| client.is_done())
        .unwrap_or(false)
}

fn executed(rack: &mut impl Rack, host: usize) -> u64 {
    rack.with_agent::<ServerAgent, _>(host, 0, |server| server.callee.counters().executed)
        .unwrap()
}

#[test]
fn calls_to_the_service_address_are_routed_by_method_and_run_once() {
    let (_topology, mut rack) = start(1, "increment", 200, 1000);
    rack.run_until(&mut done, Duration::from_secs(5)).unwrap();
    let answers: Vec<u64> = outcomes(&mut rack)
        .into_iter()
        .map(|(_, outcome)| u64::from_be_bytes(outcome.unwrap()[..8].try_into().unwrap()))
        .collect();
    let mut sorted = answers.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (1..=200).collect::<Vec<_>>());
    assert_eq!(executed(&mut rack, MEMORY_HOST), 200);
    assert_eq!(executed(&mut rack, SPARE_HOST), 0);
    let (counters, in_flight) =
        rack.with_program(|program| (program.counters(), program.edges().count()));
    assert_eq!(counters.calls_routed, 200);
    assert_eq!(counters.replies, 200);
    assert_eq!(in_flight, 0, "the RPC graph empties as replies pass");
}

#[test]
fn a_method_no_node_serves_fails_fast_at_the_switch() {
    let (_topology, mut rack) = start(2, "missing", 3, 4);
    rack.run_until(&mut done, Duration::from_secs(5)).unwrap();
    for (_, outcome) in outcomes(&mut rack) {
        assert!(
            matches!(outcome, Err(RpcError::NoAnswer { .. })),
            "{outcome:?}"
        );
    }
    let counters = rack.with_program(|program| program.counters());
    assert_eq!(counters.unrouted, 3 * 4, "every attempt is refused");
    assert_eq!(executed(&mut rack, MEMORY_HOST), 0);
}

#[test]
fn a_failed_node_is_replaced_from_its_checkpoint_and_every_call_takes_effect_once() {
    use remora_base::Probability;
    use remora_bifrost::rpc::scenario::failover;
    use remora_sim::LinkFaults;
    let lossy = LinkFaults {
        loss: Probability::literal(0.05),
        duplicate: Probability::literal(0.02),
        ..LinkFaults::NONE
    };
    for seed in 0..12 {
        let faults = if seed % 2 == 0 {
            LinkFaults::NONE
        } else {
            lossy
        };
        let outcome = failover(
            seed,
            faults,
            3000,
            1000 + seed * 100,
            Duration::from_millis(1),
        )
        .unwrap_or_else(|error| panic!("seed {seed}: {error}"));
        assert!(outcome.held > 0, "seed {seed}: {outcome:?}");
        // The switch replayed what it held and what was in flight.
        assert!(outcome.replayed >= outcome.held, "seed {seed}: {outcome:?}");
        // Found by missed heartbeats: past the 1 ms timeout, within a
        // quarter of it more (how often the Gatekeeper looks) and a
        // heartbeat interval.
        assert!(
            outcome.detection_time > Duration::from_millis(1)
                && outcome.detection_time <= Duration::from_micros(1400),
            "seed {seed}: {outcome:?}"
        );
        assert!(
            outcome.executed_by_spare > outcome.checkpoint_covers,
            "seed {seed}: the spare served the rest"
        );
        assert!(
            outcome.in_flight_at_failure <= 8,
            "seed {seed}: at most the window is in flight"
        );
    }
}

#[test]
fn control_plane_mistakes_are_typed_errors() {
    use remora_bifrost::gatekeeper::GatekeeperError;
    let mut gatekeeper = Gatekeeper::new(GatekeeperConfig {
        nodes: 1,
        ..GatekeeperConfig::new(SERVICE)
    });
    let node = Ipv4Address::new(10, 0, 0, 9);
    assert_eq!(
        gatekeeper.route("ping", node),
        Err(GatekeeperError::UnknownNode(node))
    );
    gatekeeper
        .register_node(node, NodeKind::Compute, 1)
        .unwrap();
    assert!(matches!(
        gatekeeper.register_node(Ipv4Address::new(10, 0, 0, 10), NodeKind::Memory, 1),
        Err(GatekeeperError::Table(_))
    ));
    assert_eq!(
        gatekeeper.route("a_method_name_too_long", node),
        Err(GatekeeperError::MethodTooLong(22))
    );
    assert_eq!(
        gatekeeper.recover(node, node),
        Err(GatekeeperError::NotFailed(node))
    );
    gatekeeper.mark_failed(node).unwrap();
    assert_eq!(
        gatekeeper.route("ping", node),
        Err(GatekeeperError::NodeFailed(node))
    );
}

/// The campaign `.ci/run`'s test suite holds: 200 seeds, each with its own
/// crash point and call count, over lossy and duplicating links.
#[test]
fn two_hundred_failover_seeds_keep_every_call_exactly_once() {
    use remora_base::Probability;
    use remora_bifrost::rpc::scenario::crash_campaign;
    use remora_sim::LinkFaults;
    let faults = LinkFaults {
        loss: Probability::literal(0.05),
        duplicate: Probability::literal(0.02),
        ..LinkFaults::NONE
    };
    let report = crash_campaign(1000, 200, faults, |_, _| {});
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(report.passed, 200);
}

/// The same crash campaign on simulated ConnectX-5 NICs (frames held in
/// the NIC's pipeline, DSM READs behind PCIe): every call still runs
/// exactly once through failover, a chain's crash and the caller's.
#[test]
fn failover_seeds_keep_every_call_exactly_once_on_connectx5_hardware() {
    use remora_base::Probability;
    use remora_bifrost::rpc::scenario::{crash_campaign, Network};
    use remora_host::hardware::NicHardware;
    use remora_sim::LinkFaults;
    let network = Network {
        faults: LinkFaults {
            loss: Probability::literal(0.05),
            duplicate: Probability::literal(0.02),
            ..LinkFaults::NONE
        },
        hardware: NicHardware::Cx5,
    };
    let report = crash_campaign(3000, 40, network, |_, _| {});
    assert!(report.violations.is_empty(), "{:?}", report.violations);
    assert_eq!(report.passed, 40);
}

/// The `bifrost_gatekeeper` fuzz target's seeds replay through its
/// harness: a routed call leaves the switch, a truncated one does not.
#[test]
fn gatekeeper_fuzz_seeds_replay() {
    use remora_bifrost::gatekeeper::any_datagram;
    let directory = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/seeds/bifrost_gatekeeper"
    );
    let mut left = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(directory).expect("the seed directory") {
        let path = entry.expect("a seed").path();
        let bytes = std::fs::read(&path).expect("a readable seed");
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        left.insert(name, any_datagram(&bytes));
    }
    assert_eq!(left.get("increment_call"), Some(&true), "{left:?}");
    assert_eq!(left.get("truncated_call"), Some(&false), "{left:?}");
    assert!(left.len() >= 4, "{left:?}");
}

/// The switch alone, frame by frame: nodes announce themselves with
/// heartbeats and one exports its method (the other's export of it is
/// refused); the first falls silent and the Gatekeeper finds it failed; a call
/// for its method is held (nothing leaves); after recovery the switch
/// itself sends the held call to the replacement, with no resend from the
/// caller.
#[test]
fn the_switch_detects_a_silent_node_holds_its_calls_and_replays_them_to_the_replacement() {
    use remora_base::Timestamp;
    use remora_switch::programs::l2l3::L2L3Forwarding;
    use remora_switch::{PortId, Switch, SwitchConfig};
    use remora_wire::bifrost::{
        BifrostRepr, CallType, ExportRepr, GlobalAddress, HeartbeatRepr, CONTROL_PORT, EXPORT_LEN,
        HEADER_LEN, HEARTBEAT_LEN,
    };
    use remora_wire::datagram::parse_datagram;
    use remora_wire::MacAddress;
    let router = MacAddress([2, 0, 0, 0, 0, 0xfe]);
    let end = |last: u8, port| DatagramEnd {
        mac: MacAddress([2, 0, 0, 0, 0, last]),
        address: Ipv4Address::new(10, 0, 0, last),
        port,
    };
    let (caller, node, spare) = (end(1, 40000), end(2, BIFROST_PORT), end(3, BIFROST_PORT));
    let hosts = [caller, node, spare].map(|end| (end.mac, end.address));
    let forwarding = L2L3Forwarding::with_attached_hosts(router, &hosts).unwrap();
    let gatekeeper = Gatekeeper::new(GatekeeperConfig {
        heartbeat_timeout: Some(Duration::from_millis(1)),
        ..GatekeeperConfig::new(SERVICE)
    });
    let mut switch = Switch::new(SwitchConfig::new(3), Overlaid::new(forwarding, gatekeeper));
    let to_gatekeeper = |port| DatagramEnd {
        mac: router,
        address: SERVICE,
        port,
    };
    let frame = datagram_frame;
    // A node's message on the control port.
    let to_control = |from: DatagramEnd, bytes: &[u8]| {
        let from = DatagramEnd {
            port: CONTROL_PORT,
            ..from
        };
        frame(from, to_gatekeeper(CONTROL_PORT), bytes)
    };
    let heartbeat = |from: DatagramEnd| {
        let mut bytes = [0u8; HEARTBEAT_LEN];
        HeartbeatRepr {
            kind: NodeKind::Compute,
            incarnation: 0,
            capacity_bytes: 1 << 30,
        }
        .emit(&mut bytes)
        .unwrap();
        to_control(from, &bytes)
    };
    let at = |micros: u64| Timestamp::ZERO.saturating_add(Duration::from_micros(micros));
    let mut buffer = vec![0u8; 4096];
    let mut drain = |switch: &mut Switch<Overlaid<Gatekeeper>>| {
        let mut left = Vec::new();
        while let Some((port, length)) = switch.poll_transmit(Timestamp::ZERO, &mut buffer) {
            left.push((
                port,
                parse_datagram(&buffer[..length])
                    .unwrap()
                    .0
                    .destination
                    .address,
            ));
        }
        left
    };
    // Both announce themselves; nothing leaves the switch for a heartbeat.
    switch.handle_frame(at(0), PortId(1), &heartbeat(node));
    switch.handle_frame(at(0), PortId(2), &heartbeat(spare));
    assert!(drain(&mut switch).is_empty());
    assert_eq!(switch.program().counters().nodes_announced, 2);
    let export = |from: DatagramEnd| {
        let mut bytes = [0u8; EXPORT_LEN];
        ExportRepr::new("increment")
            .unwrap()
            .emit(&mut bytes)
            .unwrap();
        to_control(from, &bytes)
    };
    switch.handle_frame(at(0), PortId(1), &export(node));
    switch.handle_frame(at(0), PortId(2), &export(spare));
    assert_eq!(switch.program().route_of("increment"), Some(node.address));
    let counters = switch.program().counters();
    assert_eq!((counters.exports, counters.exports_refused), (1, 1));
    // Only the spare goes on beating: past the timeout the node has failed.
    for micros in (100..=1600).step_by(100) {
        switch.handle_frame(at(micros), PortId(2), &heartbeat(spare));
    }
    assert_eq!(switch.program_mut().take_detected(), vec![node.address]);
    // A call for its method is held: nothing leaves.
    let call = |rpc_id: u64| {
        let mut call = [0u8; HEADER_LEN];
        BifrostRepr::new(CallType::Call, "increment", rpc_id, GlobalAddress::NULL)
            .unwrap()
            .emit(&mut call)
            .unwrap();
        frame(caller, to_gatekeeper(BIFROST_PORT), &call)
    };
    switch.handle_frame(at(1700), PortId(0), &call(7));
    assert!(drain(&mut switch).is_empty());
    assert_eq!(switch.program().held_calls(), 1);
    // Its caller resends it through a long recovery, more times than the
    // hold queue has places: the one call keeps one place (each resend
    // once took its own, and a new call then found the queue full).
    let places = GatekeeperConfig::new(SERVICE).held_calls;
    for _ in 0..places + 10 {
        switch.handle_frame(at(1700), PortId(0), &call(7));
    }
    switch.handle_frame(at(1700), PortId(0), &call(8));
    assert!(drain(&mut switch).is_empty());
    assert_eq!(switch.program().held_calls(), 2);
    let counters = switch.program().counters();
    assert_eq!(counters.held_dropped, 0);
    assert_eq!(counters.held_resends, places as u64 + 10);
    // Recovery: the switch sends the held calls to the spare by itself.
    switch
        .program_mut()
        .recover(node.address, spare.address)
        .unwrap();
    assert!(switch.poll_timeout().is_some_and(|due| due <= at(1800)));
    switch.handle_timeout(at(1800));
    assert_eq!(
        drain(&mut switch),
        vec![(PortId(2), spare.address), (PortId(2), spare.address)]
    );
    let counters = switch.program().counters();
    assert_eq!((counters.held, counters.replayed), (2, 2));
    switch.check_frame_accounting().unwrap();
}

/// The head caller fails and comes back from the checkpoint its calls
/// carried (a1, a2), kept by the Gatekeeper: before it sent anything, with
/// calls unanswered (f1), and at points after replies it took (f2); over
/// clean and lossy links. Every call takes effect once and the client
/// delivers each outcome once.
#[test]
fn a_caller_restarted_from_its_checkpoint_keeps_every_call_exactly_once() {
    use remora_base::Probability;
    use remora_bifrost::rpc::scenario::caller_crash;
    use remora_sim::LinkFaults;
    let lossy = LinkFaults {
        loss: Probability::literal(0.05),
        duplicate: Probability::literal(0.02),
        ..LinkFaults::NONE
    };
    // Before it sent anything: no checkpoint, it starts afresh.
    let fresh = caller_crash(1, LinkFaults::NONE, 200, 0, Duration::from_micros(300)).unwrap();
    assert_eq!(fresh.delivered_in_checkpoint, 0, "{fresh:?}");
    let mut resent = 0;
    let mut forgot_delivered = 0;
    for seed in 0..16 {
        let faults = if seed % 2 == 0 {
            LinkFaults::NONE
        } else {
            lossy
        };
        let outcome = caller_crash(
            seed,
            faults,
            600,
            50 + seed * 31,
            Duration::from_micros(100 + 50 * seed),
        )
        .unwrap_or_else(|error| panic!("seed {seed}: {error}"));
        assert_eq!(outcome.executed, 600, "seed {seed}: {outcome:?}");
        assert!(outcome.caller_checkpoints > 0, "seed {seed}: {outcome:?}");
        assert!(
            outcome.delivered_in_checkpoint <= outcome.delivered_at_crash,
            "seed {seed}: {outcome:?}"
        );
        resent += outcome.resent_after_restore;
        forgot_delivered += outcome.delivered_at_crash - outcome.delivered_in_checkpoint;
    }
    // The seeds reached f1 (calls unanswered at the crash, resent) and f2
    // (outcomes taken after the last checkpoint, taken again).
    assert!(
        resent > 0 && forgot_delivered > 0,
        "{resent} {forgot_delivered}"
    );
}

/// A call whose reply never passes (its caller gave up) leaves the RPC
/// graph once its lease is over, so callers that give up cannot fill it;
/// a resend does not renew the lease.
#[test]
fn a_call_never_answered_expires_from_the_graph() {
    use remora_base::Timestamp;
    use remora_switch::programs::l2l3::L2L3Forwarding;
    use remora_switch::{PortId, Switch, SwitchConfig};
    use remora_wire::bifrost::{BifrostRepr, CallType, GlobalAddress, HEADER_LEN};
    use remora_wire::datagram::{emit_datagram, DATAGRAM_HEADERS_LEN};
    use remora_wire::MacAddress;
    let router = MacAddress([2, 0, 0, 0, 0, 0xfe]);
    let caller = DatagramEnd {
        mac: MacAddress([2, 0, 0, 0, 0, 1]),
        address: Ipv4Address::new(10, 0, 0, 1),
        port: 40000,
    };
    let node = Ipv4Address::new(10, 0, 0, 2);
    let hosts = [
        (caller.mac, caller.address),
        (MacAddress([2, 0, 0, 0, 0, 2]), node),
    ];
    let forwarding = L2L3Forwarding::with_attached_hosts(router, &hosts).unwrap();
    let mut gatekeeper = Gatekeeper::new(GatekeeperConfig {
        call_lease: Duration::from_millis(10),
        ..GatekeeperConfig::new(SERVICE)
    });
    gatekeeper
        .register_node(node, NodeKind::Compute, 1)
        .unwrap();
    gatekeeper.route("increment", node).unwrap();
    let mut switch = Switch::new(SwitchConfig::new(2), Overlaid::new(forwarding, gatekeeper));
    let mut call = [0u8; HEADER_LEN];
    BifrostRepr::new(CallType::Call, "increment", 7, GlobalAddress::NULL)
        .unwrap()
        .emit(&mut call)
        .unwrap();
    let to = DatagramEnd {
        mac: router,
        address: SERVICE,
        port: BIFROST_PORT,
    };
    let mut frame = vec![0u8; DATAGRAM_HEADERS_LEN + HEADER_LEN];
    let length = emit_datagram(caller, to, &call, &mut frame).unwrap();
    let at = |millis: u64| Timestamp::ZERO.saturating_add(Duration::from_millis(millis));
    switch.handle_frame(at(1), PortId(0), &frame[..length]);
    // A resend at 8 ms keeps the lease from 1 ms...
    switch.handle_frame(at(8), PortId(0), &frame[..length]);
    assert_eq!(switch.program().edges().count(), 1);
    assert!(switch.program().edges().all(|edge| edge.since == at(1)));
    // ...so at 14 ms, past 1 + 10 but before a renewed 8 + 10, the edge
    // has expired, and the resend enters anew.
    switch.handle_frame(at(14), PortId(0), &frame[..length]);
    assert_eq!(switch.program().counters().calls_expired, 1);
    assert_eq!(switch.program().edges().count(), 1);
    assert!(switch.program().edges().all(|edge| edge.since == at(14)));
}

/// Calls that share their callee's fate fail with it, answered by the
/// Gatekeeper at the failure, and are never replayed; the rest recover
/// and take effect once.
#[test]
fn calls_that_share_fate_fail_with_their_callee_and_the_rest_recover() {
    use remora_bifrost::rpc::scenario::failover_with;
    let faults = remora_sim::LinkFaults::NONE;
    let mut shared = 0;
    for seed in 0..6 {
        let outcome = failover_with(seed, faults, (600, 300), Duration::from_millis(1), Some(2))
            .unwrap_or_else(|error| panic!("seed {seed}: {error}"));
        shared += outcome.shared_fate;
        assert!(
            outcome.shared_fate <= outcome.in_flight_at_failure as u64 + outcome.held,
            "seed {seed}: {outcome:?}"
        );
    }
    assert!(shared > 0, "some call shared a failed node's fate");
}

/// The middle of a chain A calls B calls C fails for good and a fresh
/// relay on another host takes its place: the Gatekeeper replays the
/// head's calls to it, and its nested calls leave under the middle's
/// address, so the tail answers those it ran before from memory. Every
/// call from the head takes effect once at the tail.
#[test]
fn a_middle_service_replaced_on_another_host_keeps_every_call_exactly_once() {
    use remora_bifrost::rpc::scenario::chain_replaced;
    let faults = remora_sim::LinkFaults {
        loss: remora_sim::Probability::literal(0.05),
        duplicate: remora_sim::Probability::literal(0.02),
        ..remora_sim::LinkFaults::NONE
    };
    let mut answered_from_memory = 0;
    for seed in 0..10 {
        let outcome = chain_replaced(seed, faults, 400, 50 + seed * 30)
            .unwrap_or_else(|error| panic!("seed {seed}: {error}"));
        assert_eq!(outcome.executed_at_tail, 400, "seed {seed}");
        answered_from_memory += outcome.duplicates_at_tail;
    }
    assert!(
        answered_from_memory > 0,
        "the tail answered some replayed nested call from memory"
    );
}

/// Found by review: a UDP datagram to or from Bifröst's port, or to the
/// control port, cut short inside its UDP header made the Gatekeeper
/// slice past the frame's end (a panic). Each is now left to forwarding.
#[test]
fn a_datagram_cut_inside_its_udp_header_never_panics_the_gatekeeper() {
    use remora_base::Timestamp;
    use remora_bifrost::gatekeeper::GatekeeperConfig;
    use remora_switch::programs::l2l3::L2L3Forwarding;
    use remora_switch::{PortId, Switch, SwitchConfig};
    use remora_wire::bifrost::CONTROL_PORT;
    use remora_wire::datagram::{emit_datagram, DATAGRAM_HEADERS_LEN};
    use remora_wire::ipv4::Ipv4Packet;
    use remora_wire::MacAddress;
    let router = MacAddress([2, 0, 0, 0, 0, 0xfe]);
    let caller = DatagramEnd {
        mac: MacAddress([2, 0, 0, 0, 0, 1]),
        address: Ipv4Address::new(10, 0, 0, 1),
        port: 40000,
    };
    let hosts = [(caller.mac, caller.address)];
    let forwarding = L2L3Forwarding::with_attached_hosts(router, &hosts).unwrap();
    let gatekeeper = Gatekeeper::new(GatekeeperConfig::new(SERVICE));
    let mut switch = Switch::new(SwitchConfig::new(1), Overlaid::new(forwarding, gatekeeper));
    for port in [BIFROST_PORT, CONTROL_PORT] {
        let to = DatagramEnd {
            mac: router,
            address: SERVICE,
            port,
        };
        let mut frame = vec![0u8; DATAGRAM_HEADERS_LEN + 16];
        let length = emit_datagram(caller, to, &[0u8; 16], &mut frame).unwrap();
        frame.truncate(length);
        for kept in 0..8usize {
            let mut cut = frame[..14 + 20 + kept].to_vec();
            let total = (20 + kept) as u16;
            cut[16..18].copy_from_slice(&total.to_be_bytes());
            Ipv4Packet::new_unchecked(&mut cut[14..]).fill_checksum();
            switch.handle_frame(Timestamp::ZERO, PortId(0), &cut);
            let mut buffer = vec![0u8; 4096];
            while switch.poll_transmit(Timestamp::ZERO, &mut buffer).is_some() {}
        }
    }
    switch
        .check_frame_accounting()
        .expect("every frame accounted for");
}

/// Three hosts on ports 0 to 2 (the first two with their ports given to
/// the Gatekeeper) and what they send its control port.
mod control {
    use super::*;
    use remora_base::Timestamp;
    use remora_switch::programs::l2l3::L2L3Forwarding;
    use remora_switch::{PortId, Switch, SwitchConfig};
    use remora_wire::bifrost::{emit_commit, HeartbeatRepr, CONTROL_PORT, HEARTBEAT_LEN};
    use remora_wire::MacAddress;

    pub const ROUTER: MacAddress = MacAddress([2, 0, 0, 0, 0, 0xfe]);

    /// The host on switch port `last - 1`.
    pub fn end(last: u8) -> DatagramEnd {
        DatagramEnd {
            mac: MacAddress([2, 0, 0, 0, 0, last]),
            address: Ipv4Address::new(10, 0, 0, last),
            port: CONTROL_PORT,
        }
    }

    pub type ControlSwitch = Switch<Overlaid<Gatekeeper>>;

    pub fn switch() -> ControlSwitch {
        let hosts = [end(1), end(2), end(3)].map(|end| (end.mac, end.address));
        let forwarding = L2L3Forwarding::with_attached_hosts(ROUTER, &hosts).unwrap();
        let mut gatekeeper = Gatekeeper::new(GatekeeperConfig::new(SERVICE));
        for (last, port) in [(1, 0), (2, 1)] {
            gatekeeper
                .register_host_port(end(last).address, PortId(port))
                .unwrap();
        }
        Switch::new(SwitchConfig::new(3), Overlaid::new(forwarding, gatekeeper))
    }

    /// `bytes` from `from`, arriving on switch port `port`.
    pub fn send(switch: &mut ControlSwitch, port: u16, from: DatagramEnd, bytes: &[u8]) {
        send_at(switch, Timestamp::ZERO, port, from, bytes);
    }

    /// [`send`] at `now`.
    pub fn send_at(
        switch: &mut ControlSwitch,
        now: Timestamp,
        port: u16,
        from: DatagramEnd,
        bytes: &[u8],
    ) {
        let to = DatagramEnd {
            mac: ROUTER,
            address: SERVICE,
            port: CONTROL_PORT,
        };
        switch.handle_frame(now, PortId(port), &datagram_frame(from, to, bytes));
    }

    pub fn heartbeat() -> [u8; HEARTBEAT_LEN] {
        heartbeat_of(0)
    }

    /// A heartbeat of a node's `incarnation`th boot.
    pub fn heartbeat_of(incarnation: u32) -> [u8; HEARTBEAT_LEN] {
        let mut heartbeat = [0u8; HEARTBEAT_LEN];
        HeartbeatRepr {
            kind: NodeKind::Compute,
            incarnation,
            capacity_bytes: 1 << 30,
        }
        .emit(&mut heartbeat)
        .unwrap();
        heartbeat
    }

    /// A checkpoint of `sequence` (it opens with it), as a commit.
    pub fn commit(sequence: u64, text: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let checkpoint = [&sequence.to_be_bytes()[..], text].concat();
        (emit_commit(&checkpoint), checkpoint)
    }
}

/// A commit on the control port keeps a checkpoint in a node's name. Any
/// host could send one with the node's address, and any unknown sender
/// filled the table sized for the nodes; now a commit must come in where
/// its node is attached, from a node that announced itself.
#[test]
fn a_commit_in_another_nodes_name_or_from_a_stranger_is_not_kept() {
    let (node, stranger) = (control::end(1), control::end(3));
    let mut switch = control::switch();
    control::send(&mut switch, 0, node, &control::heartbeat());
    // The other node's port, with the node's address: dropped, counted.
    control::send(&mut switch, 1, node, &control::commit(1, b"forged").0);
    assert_eq!(switch.program().checkpoint_of(node.address), None);
    assert_eq!(switch.program().counters().memory.spoofed, 1);
    // A sender that never announced itself keeps nothing.
    control::send(&mut switch, 2, stranger, &control::commit(1, b"mine").0);
    assert_eq!(switch.program().checkpoint_of(stranger.address), None);
    // The node itself, where it is attached.
    let (commit, real) = control::commit(1, b"real");
    control::send(&mut switch, 0, node, &commit);
    assert_eq!(
        switch.program().checkpoint_of(node.address),
        Some(&real[..])
    );
}

/// A node that restarted faster than the heartbeat timeout went unseen: it
/// kept its routes with its state gone (a counter answered from 1 again).
/// A heartbeat with a new incarnation is a failure, detected at once.
#[test]
fn a_node_back_with_a_new_incarnation_has_failed() {
    let node = control::end(1);
    let mut switch = control::switch();
    control::send(&mut switch, 0, node, &control::heartbeat_of(0));
    control::send(&mut switch, 0, node, &control::heartbeat_of(0));
    assert!(switch.program_mut().take_detected().is_empty());
    control::send(&mut switch, 0, node, &control::heartbeat_of(1));
    assert_eq!(switch.program_mut().take_detected(), vec![node.address]);
    assert_eq!(
        switch.program().node(node.address).map(|info| info.status),
        Some(remora_bifrost::gatekeeper::NodeStatus::Failed)
    );
    assert_eq!(switch.program().counters().failures_detected, 1);
}

/// A node replaced after a failure and later back at its address (a new
/// boot) had its fresh checkpoints (sequence 1 on) refused as older than
/// its earlier life's, kept for good; and every recovery left an entry
/// that filled the replacements table. The earlier life's checkpoint goes
/// with its recovery, and a node that announces itself starts afresh.
#[test]
fn a_node_back_at_a_replaced_address_starts_afresh() {
    let (node, spare) = (control::end(1), control::end(2));
    let mut switch = control::switch();
    control::send(&mut switch, 0, node, &control::heartbeat());
    control::send(&mut switch, 1, spare, &control::heartbeat());
    control::send(&mut switch, 0, node, &control::commit(9, b"earlier life").0);
    let gatekeeper = switch.program_mut();
    assert!(gatekeeper.checkpoint_of(node.address).is_some());
    gatekeeper.mark_failed(node.address).unwrap();
    gatekeeper.recover(node.address, spare.address).unwrap();
    assert_eq!(gatekeeper.checkpoint_of(node.address), None);
    // Back at its address, it boots afresh (a new incarnation: the old
    // one is fenced) and checkpoints from 1.
    control::send(&mut switch, 0, node, &control::heartbeat_of(1));
    let (commit, fresh) = control::commit(1, b"new life");
    control::send(&mut switch, 0, node, &commit);
    assert_eq!(
        switch.program().checkpoint_of(node.address),
        Some(&fresh[..])
    );
}

/// A Gatekeeper switch with a node serving "increment" on port 0, a
/// spare on port 1 and a caller on port 2, and the service's address.
struct FailoverSwitch {
    switch: remora_switch::Switch<Overlaid<Gatekeeper>>,
    failed: DatagramEnd,
    spare: DatagramEnd,
    caller: DatagramEnd,
    service: DatagramEnd,
}

fn failover_switch() -> FailoverSwitch {
    let (failed, spare, caller) = (
        host_on(1, BIFROST_PORT),
        host_on(2, BIFROST_PORT),
        host_on(3, 40000),
    );
    let switch = gatekeeper_switch(&[failed, spare, caller], &[0, 1, 2], |gatekeeper| {
        for node in [failed, spare] {
            gatekeeper
                .register_node(node.address, NodeKind::Compute, 0)
                .unwrap();
        }
        gatekeeper.route("increment", failed.address).unwrap();
    });
    let service = DatagramEnd {
        mac: control::ROUTER,
        address: SERVICE,
        port: BIFROST_PORT,
    };
    FailoverSwitch {
        switch,
        failed,
        spare,
        caller,
        service,
    }
}

/// A node marked failed went on being heard: its late reply answered the
/// caller (and ended the call's edge, so its replacement never ran it)
/// and kept its checkpoint over the one the replacement starts from, and
/// after recovery its replies passed as the replacement's. Everything it
/// sends is dropped from the mark on (the paper's fate sharing), until a
/// new boot announces itself.
#[test]
fn a_node_marked_failed_is_fenced() {
    use remora_base::Timestamp;
    use remora_switch::PortId;
    use remora_wire::bifrost::{BifrostRepr, CallType, GlobalAddress};
    let FailoverSwitch {
        mut switch,
        failed,
        spare,
        caller,
        service,
    } = failover_switch();
    let call = BifrostRepr::new(CallType::Call, "increment", 7, GlobalAddress::NULL).unwrap();
    let frame = header_frame(call, caller, service);
    let now = Timestamp::ZERO;
    switch.handle_frame(now, PortId(2), &frame);
    let mut buffer = vec![0u8; 4096];
    while switch.poll_transmit(now, &mut buffer).is_some() {}
    assert_eq!(switch.program().counters().calls_routed, 1);
    // Its boot, incarnation 0, heard before it fails.
    control::send(&mut switch, 0, control::end(1), &control::heartbeat_of(0));
    switch.program_mut().mark_failed(failed.address).unwrap();
    // Its late reply to call 7, with a checkpoint.
    let reply = BifrostRepr::new(CallType::Reply, "", 7, GlobalAddress::NULL).unwrap();
    let checkpoint = [&2u64.to_be_bytes()[..], b"late"].concat();
    let late = checkpointed_datagram(reply, &checkpoint, failed, caller);
    switch.handle_frame(now, PortId(0), &late);
    let mut forwarded = 0;
    while switch.poll_transmit(now, &mut buffer).is_some() {
        forwarded += 1;
    }
    assert_eq!(forwarded, 0, "the late reply reached the caller");
    assert_eq!(switch.program().counters().replies, 0);
    assert_eq!(switch.program().checkpoint_of(failed.address), None);
    // Recovered onto the spare: the failed node's reply is still not the
    // spare's.
    switch
        .program_mut()
        .recover(failed.address, spare.address)
        .unwrap();
    while switch.poll_transmit(now, &mut buffer).is_some() {}
    switch.handle_frame(now, PortId(0), &late);
    assert_eq!(switch.program().counters().replies, 0);
    assert_eq!(switch.program().counters().fenced, 2);
    // A heartbeat of the failed life does not lift the fence; a new boot's
    // does.
    control::send(&mut switch, 0, control::end(1), &control::heartbeat_of(0));
    assert!(switch.program().node(failed.address).is_none());
    control::send(&mut switch, 0, control::end(1), &control::heartbeat_of(1));
    assert!(switch.program().node(failed.address).is_some());
}

/// What a Gatekeeper switch sends at `now` until it is idle, its timer
/// fired each round (packet-outs leave then): each frame's egress port and
/// Bifröst call type. Bounded by `MAX_DRAIN_ROUNDS`.
fn sent_until_idle(
    switch: &mut remora_switch::Switch<Overlaid<Gatekeeper>>,
    now: remora_base::Timestamp,
) -> Vec<(remora_switch::PortId, remora_wire::bifrost::CallType)> {
    const MAX_DRAIN_ROUNDS: usize = 1_000;
    let mut buffer = vec![0u8; 4096];
    let mut sent = Vec::new();
    for _ in 0..MAX_DRAIN_ROUNDS {
        switch.handle_timeout(now);
        let before = sent.len();
        while let Some((port, length)) = switch.poll_transmit(now, &mut buffer) {
            let payload = &buffer[remora_wire::datagram::DATAGRAM_HEADERS_LEN..length];
            let header = remora_wire::bifrost::BifrostHeader::new_checked(payload).unwrap();
            sent.push((port, header.call_type()));
        }
        if sent.len() == before {
            break;
        }
    }
    sent
}

/// The egress ports of [`sent_until_idle`].
fn ports_sent(
    switch: &mut remora_switch::Switch<Overlaid<Gatekeeper>>,
    now: remora_base::Timestamp,
) -> Vec<remora_switch::PortId> {
    sent_until_idle(switch, now)
        .into_iter()
        .map(|(port, _)| port)
        .collect()
}

/// A call held for a failed node has no callee that may answer it until
/// its replacement takes it, and one answered failed with its callee runs
/// nowhere. The forged-reply check looked only at the graph, so a reply to
/// either from any host passed: the caller took it as the outcome, and
/// then the replacement ran the held call.
#[test]
fn a_reply_to_a_held_or_failed_call_is_forged() {
    use remora_base::Timestamp;
    use remora_switch::PortId;
    use remora_wire::bifrost::{BifrostRepr, CallType, GlobalAddress};
    let FailoverSwitch {
        mut switch,
        failed,
        spare,
        caller,
        service,
    } = failover_switch();
    let now = Timestamp::ZERO;
    let sent_to =
        |switch: &mut remora_switch::Switch<Overlaid<Gatekeeper>>| ports_sent(switch, now);
    let mut shared = BifrostRepr::new(CallType::Call, "increment", 5, GlobalAddress::NULL).unwrap();
    shared.flags |= remora_bifrost::rpc::SHARE_FATE_FLAG;
    switch.handle_frame(now, PortId(2), &header_frame(shared, caller, service));
    assert_eq!(sent_to(&mut switch), [PortId(0)]);
    switch.program_mut().mark_failed(failed.address).unwrap();
    assert_eq!(
        sent_to(&mut switch),
        [PortId(2)],
        "the Gatekeeper's answer passes"
    );
    let held = BifrostRepr::new(CallType::Call, "increment", 7, GlobalAddress::NULL).unwrap();
    switch.handle_frame(now, PortId(2), &header_frame(held, caller, service));
    assert_eq!(sent_to(&mut switch), []);
    assert_eq!(switch.program().counters().held, 1);
    // The spare answers both before it has either.
    for rpc_id in [5, 7] {
        let forged = BifrostRepr::new(CallType::Reply, "", rpc_id, GlobalAddress::NULL).unwrap();
        switch.handle_frame(now, PortId(1), &header_frame(forged, spare, caller));
        assert_eq!(
            sent_to(&mut switch),
            [],
            "call {rpc_id}'s forged reply passed"
        );
    }
    assert_eq!(switch.program().counters().forged_replies, 2);
    // Recovered, the spare runs the held call, and its reply passes.
    switch
        .program_mut()
        .recover(failed.address, spare.address)
        .unwrap();
    assert_eq!(sent_to(&mut switch), [PortId(1)]);
    let reply = BifrostRepr::new(CallType::Reply, "", 7, GlobalAddress::NULL).unwrap();
    switch.handle_frame(now, PortId(1), &header_frame(reply, spare, caller));
    assert_eq!(sent_to(&mut switch), [PortId(2)]);
    assert_eq!(switch.program().counters().replies, 1);
}

/// The forged-reply check that held calls brought in dropped a late reply
/// from the callee of a call whose lease had run out, when a resend of the
/// call was held (its route had moved to a node that then failed): the
/// pointer it returned stayed with the callee, and the held resend would
/// run again. The callee's late reply is the call's outcome, and passes.
#[test]
fn a_late_reply_to_an_expired_call_passes_though_its_resend_is_held() {
    use remora_base::Timestamp;
    use remora_switch::PortId;
    use remora_wire::bifrost::{BifrostRepr, CallType, GlobalAddress};
    let FailoverSwitch {
        mut switch,
        failed: first,
        spare: second,
        caller,
        service,
    } = failover_switch();
    let sent_to = ports_sent;
    let call = BifrostRepr::new(CallType::Call, "increment", 7, GlobalAddress::NULL).unwrap();
    let call = header_frame(call, caller, service);
    switch.handle_frame(Timestamp::ZERO, PortId(2), &call);
    assert_eq!(sent_to(&mut switch, Timestamp::ZERO), [PortId(0)]);
    // Past the lease, the call expires (on whatever packet passes).
    let later = Timestamp::ZERO.saturating_add(std::time::Duration::from_secs(11));
    let other = BifrostRepr::new(CallType::Call, "increment", 8, GlobalAddress::NULL).unwrap();
    switch.handle_frame(later, PortId(2), &header_frame(other, caller, service));
    let _ = sent_to(&mut switch, later);
    assert_eq!(switch.program().counters().calls_expired, 1);
    // The route moves to the second node, which fails; the resend is held.
    let gatekeeper = switch.program_mut();
    gatekeeper.route("increment", second.address).unwrap();
    gatekeeper.mark_failed(second.address).unwrap();
    switch.handle_frame(later, PortId(2), &call);
    assert_eq!(switch.program().counters().held, 1);
    let _ = sent_to(&mut switch, later);
    // The first callee's late reply reaches the caller.
    let reply = BifrostRepr::new(CallType::Reply, "", 7, GlobalAddress::NULL).unwrap();
    switch.handle_frame(later, PortId(0), &header_frame(reply, first, caller));
    assert_eq!(sent_to(&mut switch, later), [PortId(2)]);
    let counters = switch.program().counters();
    assert_eq!((counters.late_replies, counters.forged_replies), (1, 0));
}

/// A call that shared its callee's fate was answered failed when the
/// callee failed; a resend of it that crossed the failure was routed to
/// the replacement and ran there, after its caller was told it failed. It
/// is answered failed again now, and reaches no node.
#[test]
fn a_resend_of_a_call_that_failed_with_its_callee_is_answered_failed_again() {
    use remora_base::Timestamp;
    use remora_switch::PortId;
    use remora_wire::bifrost::{BifrostHeader, BifrostRepr, CallType, GlobalAddress};
    let FailoverSwitch {
        mut switch,
        failed,
        spare,
        caller,
        service,
    } = failover_switch();
    let mut call = BifrostRepr::new(CallType::Call, "increment", 7, GlobalAddress::NULL).unwrap();
    call.flags |= remora_bifrost::rpc::SHARE_FATE_FLAG;
    let frame = header_frame(call, caller, service);
    let now = Timestamp::ZERO;
    let mut buffer = vec![0u8; 4096];
    // Each frame the switch sends, by egress port, with its Bifröst call type.
    let mut sent = |switch: &mut remora_switch::Switch<Overlaid<Gatekeeper>>| {
        let mut out = Vec::new();
        while let Some((port, length)) = switch.poll_transmit(now, &mut buffer) {
            let payload = &buffer[remora_wire::datagram::DATAGRAM_HEADERS_LEN..length];
            let header = BifrostHeader::new_checked(payload).unwrap();
            out.push((port, header.call_type()));
        }
        out
    };
    switch.handle_frame(now, PortId(2), &frame);
    assert_eq!(sent(&mut switch), [(PortId(0), CallType::Call)]);
    // A call sent to the broadcast MAC: the Gatekeeper learnt the switch's
    // MAC from each call's destination, and addressed its answers from it
    // (the forwarding drops a frame from a group MAC).
    let broadcast = DatagramEnd {
        mac: remora_wire::MacAddress([0xff; 6]),
        ..service
    };
    let stray = BifrostRepr::new(CallType::Call, "increment", 9, GlobalAddress::NULL).unwrap();
    switch.handle_frame(now, PortId(2), &header_frame(stray, caller, broadcast));
    let _ = sent(&mut switch);
    switch.program_mut().mark_failed(failed.address).unwrap();
    // The Gatekeeper's answer goes into the pipeline as a packet-out.
    switch.handle_timeout(now);
    assert_eq!(
        sent(&mut switch),
        [(PortId(2), CallType::Exception)],
        "the caller is told its call failed with the callee"
    );
    // A second call that shares the fate, first seen while the node is
    // down: answered failed at once.
    let mut later = BifrostRepr::new(CallType::Call, "increment", 8, GlobalAddress::NULL).unwrap();
    later.flags |= remora_bifrost::rpc::SHARE_FATE_FLAG;
    let later = header_frame(later, caller, service);
    switch.handle_frame(now, PortId(2), &later);
    assert_eq!(sent(&mut switch), [(PortId(2), CallType::Exception)]);
    switch
        .program_mut()
        .recover(failed.address, spare.address)
        .unwrap();
    // The held and in-flight calls replayed to the spare (the stray one
    // flooded, to the broadcast MAC it was sent to).
    for _ in 0..4 {
        switch.handle_timeout(now);
    }
    let _ = sent(&mut switch);
    for resent in [&frame, &later] {
        switch.handle_frame(now, PortId(2), resent);
        assert_eq!(
            sent(&mut switch),
            [(PortId(2), CallType::Exception)],
            "the resend is answered failed again, not run on the spare"
        );
    }
    assert_eq!(switch.program().counters().failed_resends_answered, 2);
}

/// Many calls that shared one callee's fate were answered failed together
/// when it failed, and the Gatekeeper kept each in a hashed register cell,
/// one call a cell: calls that hashed to the same cell overwrote one
/// another (200 calls from 20 callers in 4,096 cells), and the resend
/// of an overwritten one ran on the replacement after its caller was told
/// it had failed. Each is kept under its own key now.
#[test]
fn calls_failed_together_with_their_callee_are_each_answered_failed_again() {
    use remora_base::Timestamp;
    use remora_switch::PortId;
    use remora_wire::bifrost::{BifrostRepr, CallType, GlobalAddress};
    const CALLS: u64 = 200;
    let FailoverSwitch {
        mut switch,
        failed,
        spare,
        caller,
        service,
    } = failover_switch();
    let now = Timestamp::ZERO;
    let drain =
        |switch: &mut remora_switch::Switch<Overlaid<Gatekeeper>>| sent_until_idle(switch, now);
    // Twenty callers (the caller's ports) of ten calls each, as a busy
    // node sees them: sequential ids from one caller alone spread evenly
    // over a Fibonacci hash, but callers' ids together do not.
    let frames: Vec<Vec<u8>> = (0..CALLS)
        .map(|index| {
            let rpc_id = 1 + index % 10;
            let mut call =
                BifrostRepr::new(CallType::Call, "increment", rpc_id, GlobalAddress::NULL).unwrap();
            call.flags |= remora_bifrost::rpc::SHARE_FATE_FLAG;
            let from = DatagramEnd {
                port: caller.port + (index / 10) as u16,
                ..caller
            };
            header_frame(call, from, service)
        })
        .collect();
    for frame in &frames {
        switch.handle_frame(now, PortId(2), frame);
    }
    assert_eq!(drain(&mut switch).len(), CALLS as usize);
    switch.program_mut().mark_failed(failed.address).unwrap();
    let answers = drain(&mut switch);
    assert_eq!(
        answers,
        vec![(PortId(2), CallType::Exception); CALLS as usize]
    );
    switch
        .program_mut()
        .recover(failed.address, spare.address)
        .unwrap();
    let _ = drain(&mut switch);
    for frame in &frames {
        switch.handle_frame(now, PortId(2), frame);
    }
    let resent = drain(&mut switch);
    let ran_on_spare = resent.iter().filter(|(port, _)| *port == PortId(1)).count();
    assert_eq!(ran_on_spare, 0, "no resend runs on the spare");
    let answered_failed = resent
        .iter()
        .filter(|sent| **sent == (PortId(2), CallType::Exception))
        .count();
    assert_eq!(answered_failed, CALLS as usize);
    let counters = switch.program().counters();
    assert_eq!(counters.failed_resends_answered, CALLS);
    assert_eq!(counters.failed_with_callee_forgotten_early, 0);
}

/// A node found silent by the heartbeat timeout lost its `heard` entry
/// before it was marked failed, so its fence kept no incarnation and the
/// failed life's own next heartbeat lifted it (a node only slow, or cut
/// off, came back with its late replies passing). A heartbeat in its name
/// from another port lifted a fence too.
#[test]
fn a_fence_set_by_the_heartbeat_timeout_holds_against_the_failed_life() {
    use remora_base::Timestamp;
    use remora_bifrost::gatekeeper::NodeStatus;
    use remora_switch::programs::l2l3::L2L3Forwarding;
    use remora_switch::{PortId, Switch, SwitchConfig};
    let (node, other) = (control::end(1), control::end(2));
    let hosts = [node, other].map(|end| (end.mac, end.address));
    let forwarding = L2L3Forwarding::with_attached_hosts(control::ROUTER, &hosts).unwrap();
    let mut config = GatekeeperConfig::new(SERVICE);
    let timeout = Duration::from_millis(10);
    config.heartbeat_timeout = Some(timeout);
    let mut gatekeeper = Gatekeeper::new(config);
    for (end, port) in [(node, 0), (other, 1)] {
        gatekeeper
            .register_host_port(end.address, PortId(port))
            .unwrap();
    }
    let mut switch = Switch::new(SwitchConfig::new(2), Overlaid::new(forwarding, gatekeeper));
    let send = |switch: &mut control::ControlSwitch, at_ms: u64, port: u16, from, beat| {
        let now = Timestamp::from_nanos(at_ms * 1_000_000);
        control::send_at(switch, now, port, from, &control::heartbeat_of(beat));
    };
    send(&mut switch, 0, 0, node, 0);
    send(&mut switch, 0, 1, other, 0);
    // The other node's heartbeats, past the timeout, find the node
    // silent.
    for at_ms in (5..=30).step_by(5) {
        send(&mut switch, at_ms, 1, other, 0);
    }
    let status = |switch: &control::ControlSwitch| {
        switch.program().node(node.address).map(|info| info.status)
    };
    assert_eq!(status(&switch), Some(NodeStatus::Failed));
    // The failed life's heartbeat, and one in its name from the other
    // port, are fenced out.
    send(&mut switch, 31, 0, node, 0);
    send(&mut switch, 31, 1, node, 5);
    assert_eq!(switch.program().counters().fenced, 2);
    assert_eq!(status(&switch), Some(NodeStatus::Failed));
    // A new boot, where it is attached, is heard.
    send(&mut switch, 32, 0, node, 1);
    assert_eq!(switch.program().counters().fenced, 2);
}

/// A stand-in that failed in turn, replaced in place by another: the
/// mapping followed one step, so the second stand-in's calls left under
/// the first stand-in's address (the callee took them for a new caller's
/// and ran them again), and replies to the failed node's address went to
/// the dead first stand-in. The second takes the same name.
#[test]
fn a_second_failover_keeps_the_stand_in_name() {
    use remora_base::Timestamp;
    use remora_switch::PortId;
    use remora_wire::bifrost::{BifrostRepr, CallType, GlobalAddress};
    use remora_wire::datagram::parse_datagram;
    let (failed, first, second, tail, other) = (
        host_on(1, BIFROST_PORT),
        host_on(2, BIFROST_PORT),
        host_on(3, BIFROST_PORT),
        host_on(4, BIFROST_PORT),
        host_on(5, BIFROST_PORT),
    );
    let hosts = [failed, first, second, tail, other];
    let mut switch = gatekeeper_switch(&hosts, &[0, 1, 2, 3, 4], |gatekeeper| {
        for node in hosts {
            gatekeeper
                .register_node(node.address, NodeKind::Compute, 0)
                .unwrap();
        }
        gatekeeper.mark_failed(failed.address).unwrap();
        gatekeeper
            .recover_in_place_of(failed.address, first.address)
            .unwrap();
        gatekeeper.mark_failed(first.address).unwrap();
        gatekeeper
            .recover_in_place_of(first.address, second.address)
            .unwrap();
        // A stand-in takes no second failed node's place.
        gatekeeper.mark_failed(other.address).unwrap();
        assert_eq!(
            gatekeeper.recover_in_place_of(other.address, second.address),
            Err(remora_bifrost::gatekeeper::GatekeeperError::AlreadyStandingIn(second.address))
        );
    });
    // Sent to the router, as hosts send (routed by address).
    let datagram = |call_type, from: DatagramEnd, to: DatagramEnd| {
        let to = DatagramEnd {
            mac: control::ROUTER,
            ..to
        };
        let repr = BifrostRepr::new(call_type, "next", 5, GlobalAddress::NULL).unwrap();
        header_frame(repr, from, to)
    };
    let now = Timestamp::ZERO;
    let mut buffer = vec![0u8; 4096];
    // The second stand-in's call to a node leaves under the failed name.
    let call = datagram(CallType::Call, second, tail);
    switch.handle_frame(now, PortId(2), &call);
    let (port, length) = switch.poll_transmit(now, &mut buffer).expect("the call");
    let (repr, _) = parse_datagram(&buffer[..length]).unwrap();
    assert_eq!((port, repr.source.address), (PortId(3), failed.address));
    // A reply to the failed name reaches the second stand-in.
    let reply = datagram(CallType::Reply, tail, failed);
    switch.handle_frame(now, PortId(3), &reply);
    let (port, _) = switch.poll_transmit(now, &mut buffer).expect("the reply");
    assert_eq!(port, PortId(2));
}

/// A host on a Gatekeeper switch of caller-checkpoint tests: 10.0.0.`last`.
fn checkpoint_host(last: u8, port: u16) -> DatagramEnd {
    DatagramEnd {
        mac: remora_wire::MacAddress([2, 0, 0, 0, 0, last]),
        address: Ipv4Address::new(10, 0, 0, last),
        port,
    }
}

/// A Gatekeeper switch with `hosts` on ports 0.., "increment" served by
/// `server` (one of them), and room for `nodes` callers' checkpoints; and
/// the service's address.
fn caller_checkpoint_switch(
    hosts: &[DatagramEnd],
    server: DatagramEnd,
    nodes: usize,
) -> (remora_switch::Switch<Overlaid<Gatekeeper>>, DatagramEnd) {
    use remora_switch::programs::l2l3::L2L3Forwarding;
    use remora_switch::{Switch, SwitchConfig};
    let router = remora_wire::MacAddress([2, 0, 0, 0, 0, 0xfe]);
    let addresses: Vec<_> = hosts.iter().map(|end| (end.mac, end.address)).collect();
    let forwarding = L2L3Forwarding::with_attached_hosts(router, &addresses).unwrap();
    let mut config = GatekeeperConfig::new(SERVICE);
    config.nodes = nodes;
    let mut gatekeeper = Gatekeeper::new(config);
    gatekeeper
        .register_node(server.address, NodeKind::Compute, 0)
        .unwrap();
    gatekeeper.route("increment", server.address).unwrap();
    let ports = SwitchConfig::new(hosts.len() as u16);
    let service = DatagramEnd {
        mac: router,
        address: SERVICE,
        port: BIFROST_PORT,
    };
    (
        Switch::new(ports, Overlaid::new(forwarding, gatekeeper)),
        service,
    )
}

/// A call of "increment" from `from` carrying a caller's checkpoint of
/// sequence 1.
fn checkpointed_call(from: DatagramEnd, service: DatagramEnd, rpc_id: u64) -> Vec<u8> {
    use remora_wire::bifrost::{BifrostRepr, CallType, GlobalAddress};
    let repr = BifrostRepr::new(CallType::Call, "increment", rpc_id, GlobalAddress::NULL).unwrap();
    checkpointed_datagram(repr, &1u64.to_be_bytes(), from, service)
}

/// A quiet host's one call, then a busy host's calls from `busy_ports`,
/// each carrying a caller's checkpoint, through a switch with room for
/// `nodes` callers' checkpoints; the switch, the quiet host and the busy.
fn quiet_then_busy_callers(
    nodes: usize,
    busy_ports: impl IntoIterator<Item = u16>,
) -> (
    remora_switch::Switch<Overlaid<Gatekeeper>>,
    DatagramEnd,
    DatagramEnd,
) {
    use remora_base::Timestamp;
    use remora_switch::PortId;
    let (quiet, server, busy) = (
        checkpoint_host(1, 40000),
        checkpoint_host(2, BIFROST_PORT),
        checkpoint_host(3, 40000),
    );
    let (mut switch, service) = caller_checkpoint_switch(&[quiet, server, busy], server, nodes);
    let quiet_call = checkpointed_call(quiet, service, 1);
    switch.handle_frame(Timestamp::ZERO, PortId(0), &quiet_call);
    for (index, port) in busy_ports.into_iter().enumerate() {
        let from = DatagramEnd { port, ..busy };
        let call = checkpointed_call(from, service, index as u64 + 1);
        switch.handle_frame(Timestamp::ZERO, PortId(2), &call);
    }
    (switch, quiet, busy)
}

/// Whether the Gatekeeper keeps a checkpoint of the caller at `end`.
fn keeps_checkpoint_of(
    switch: &remora_switch::Switch<Overlaid<Gatekeeper>>,
    end: DatagramEnd,
) -> bool {
    switch
        .program()
        .caller_checkpoint_of((end.address, end.port))
        .is_some()
}

/// A full caller-checkpoint table made room by the least recently renewed
/// caller of all, so one host calling from many ports (each a caller of
/// its own) evicted every other host's checkpoint, a live caller's too,
/// whose restart then found none. The host with the most callers kept
/// makes room now, its least recently renewed first.
#[test]
fn a_host_calling_from_many_ports_evicts_only_its_own_caller_checkpoints() {
    // The quiet host calls once, first: the least recently renewed of all.
    let (switch, quiet, busy) = quiet_then_busy_callers(3, 40000u16..40010);
    assert!(
        keeps_checkpoint_of(&switch, quiet),
        "the quiet host's checkpoint was evicted"
    );
    let busy_kept: Vec<u16> = (40000u16..40010)
        .filter(|&port| keeps_checkpoint_of(&switch, DatagramEnd { port, ..busy }))
        .collect();
    assert_eq!(busy_kept, [40008, 40009], "the busy host's newest");
    assert_eq!(switch.program().counters().caller_checkpoints_evicted, 8);
}

/// Tied for the most callers kept, the newcomer's host made room with the
/// least recently renewed caller of all, another host's: a host with one
/// caller more to add evicted its neighbour rather than its own.
#[test]
fn on_a_tie_the_newcomers_host_makes_room_with_its_own_caller() {
    let (switch, quiet, busy) = quiet_then_busy_callers(2, [40000u16, 40001]);
    assert!(
        keeps_checkpoint_of(&switch, quiet),
        "the other host's caller was evicted"
    );
    assert!(keeps_checkpoint_of(
        &switch,
        DatagramEnd {
            port: 40001,
            ..busy
        }
    ));
    assert!(!keeps_checkpoint_of(&switch, busy));
}

/// Callers' checkpoints are kept per (address, port), in a table sized for
/// the nodes. Callers that came and went (a restarted one may call from a
/// new port) filled it, and every new caller's checkpoint was refused for
/// good. A full table now makes room by the least recently renewed.
#[test]
fn a_full_caller_checkpoint_table_makes_room_by_the_oldest_caller() {
    use remora_base::Timestamp;
    use remora_switch::PortId;
    let (caller, server) = (checkpoint_host(1, 40000), checkpoint_host(2, BIFROST_PORT));
    let (mut switch, service) = caller_checkpoint_switch(&[caller, server], server, 2);
    for (rpc_id, port) in [40000u16, 40001, 40002].into_iter().enumerate() {
        let from = DatagramEnd { port, ..caller };
        let call = checkpointed_call(from, service, rpc_id as u64 + 1);
        switch.handle_frame(Timestamp::ZERO, PortId(0), &call);
    }
    let gatekeeper = switch.program();
    let kept = |port| {
        gatekeeper
            .caller_checkpoint_of((caller.address, port))
            .is_some()
    };
    assert!(!kept(40000), "the least recently renewed made room");
    assert!(kept(40001) && kept(40002));
    let counters = gatekeeper.counters();
    assert_eq!(counters.caller_checkpoints_evicted, 1);
    assert_eq!(counters.checkpoints_refused, 0);
}

/// A reply carries its callee's checkpoint (b2). The Gatekeeper kept one
/// from any sender: a "reply" to no call, in a node's name, from another
/// port, set the checkpoint that node's failover restores; one from a
/// host that never announced itself took a place in the table sized for
/// the nodes. Now a reply's checkpoint is kept as a commit's is.
#[test]
fn a_reply_checkpoint_in_another_nodes_name_or_from_a_stranger_is_not_kept() {
    use remora_base::Timestamp;
    use remora_switch::PortId;
    use remora_wire::bifrost::{BifrostRepr, CallType, GlobalAddress};
    let (node, other, stranger) = (
        host_on(1, BIFROST_PORT),
        host_on(2, BIFROST_PORT),
        host_on(3, BIFROST_PORT),
    );
    let caller = host_on(4, 40000);
    let mut switch =
        gatekeeper_switch(&[node, other, stranger, caller], &[0, 1, 3], |gatekeeper| {
            gatekeeper
                .register_node(node.address, NodeKind::Compute, 0)
                .unwrap();
        });
    // A reply from `from` to the caller, to a call never made, carrying a
    // checkpoint of sequence 1 with `text`.
    let reply = |from: DatagramEnd, text: &[u8]| {
        let repr = BifrostRepr::new(CallType::Reply, "", 99, GlobalAddress::NULL).unwrap();
        let checkpoint = [&1u64.to_be_bytes()[..], text].concat();
        (
            checkpointed_datagram(repr, &checkpoint, from, caller),
            checkpoint,
        )
    };
    let now = Timestamp::ZERO;
    let (forged, _) = reply(node, b"forged");
    switch.handle_frame(now, PortId(1), &forged);
    assert_eq!(switch.program().checkpoint_of(node.address), None);
    assert_eq!(switch.program().counters().memory.spoofed, 1);
    let (strangers, _) = reply(stranger, b"mine");
    switch.handle_frame(now, PortId(2), &strangers);
    assert_eq!(switch.program().checkpoint_of(stranger.address), None);
    let (real, checkpoint) = reply(node, b"real");
    switch.handle_frame(now, PortId(0), &real);
    assert_eq!(
        switch.program().checkpoint_of(node.address),
        Some(&checkpoint[..])
    );
}

/// A node replaced in place by a stand-in: the stand-in's replies leave
/// readdressed to the failed node, and their checkpoints were keyed under
/// that address, which recovery had removed: all refused (counted
/// malformed), so a second failure had nothing to restore. They are kept
/// as the stand-in's own.
#[test]
fn a_stand_ins_reply_checkpoints_are_kept_as_its_own() {
    use remora_base::Timestamp;
    use remora_switch::PortId;
    use remora_wire::bifrost::{BifrostRepr, CallType, GlobalAddress};
    let (failed, stand_in, caller) = (
        host_on(1, BIFROST_PORT),
        host_on(2, BIFROST_PORT),
        host_on(4, 40000),
    );
    let mut switch = gatekeeper_switch(&[failed, stand_in, caller], &[0, 1, 2], |gatekeeper| {
        for node in [failed, stand_in] {
            gatekeeper
                .register_node(node.address, NodeKind::Compute, 0)
                .unwrap();
        }
        gatekeeper.mark_failed(failed.address).unwrap();
        gatekeeper
            .recover_in_place_of(failed.address, stand_in.address)
            .unwrap();
    });
    let repr = BifrostRepr::new(CallType::Reply, "", 99, GlobalAddress::NULL).unwrap();
    let checkpoint = [&1u64.to_be_bytes()[..], b"stand-in"].concat();
    let frame = checkpointed_datagram(repr, &checkpoint, stand_in, caller);
    switch.handle_frame(Timestamp::ZERO, PortId(1), &frame);
    assert_eq!(
        switch.program().checkpoint_of(stand_in.address),
        Some(&checkpoint[..])
    );
    assert_eq!(switch.program().counters().malformed, 0);
}

/// Calls and replies carried no check of where they came in: a host could
/// send a call in another host's name (the Gatekeeper lent the sender that
/// host's pointer for the call's lease) or a reply in a callee's name
/// (which handed the callee's allocation over). Both are dropped where
/// they come in on another host's port, and counted spoofed.
#[test]
fn a_call_or_reply_in_another_hosts_name_is_dropped() {
    use remora_base::Timestamp;
    use remora_switch::PortId;
    use remora_wire::bifrost::{BifrostRepr, CallType, GlobalAddress};
    let (node, victim, attacker) = (
        host_on(1, BIFROST_PORT),
        host_on(2, 40000),
        host_on(3, 40000),
    );
    let mut switch = gatekeeper_switch(&[node, victim, attacker], &[0, 1, 2], |gatekeeper| {
        gatekeeper
            .register_node(node.address, NodeKind::Compute, 0)
            .unwrap();
        gatekeeper.route("steal", node.address).unwrap();
    });
    let router = control::ROUTER;
    let datagram = header_frame;
    let service = DatagramEnd {
        mac: router,
        address: SERVICE,
        port: BIFROST_PORT,
    };
    let pointer = GlobalAddress::NULL;
    let call = BifrostRepr::new(CallType::Call, "steal", 7, pointer).unwrap();
    let now = Timestamp::ZERO;
    // The victim's address, on the attacker's port.
    switch.handle_frame(now, PortId(2), &datagram(call, victim, service));
    assert_eq!(switch.program().counters().calls_routed, 0);
    assert_eq!(switch.program().counters().memory.spoofed, 1);
    // A reply in the node's name, on the attacker's port.
    let reply = BifrostRepr::new(CallType::Reply, "", 7, pointer).unwrap();
    switch.handle_frame(now, PortId(2), &datagram(reply, node, victim));
    assert_eq!(switch.program().counters().replies, 0);
    assert_eq!(switch.program().counters().memory.spoofed, 2);
    // The victim's own call, on its port, is routed.
    switch.handle_frame(now, PortId(1), &datagram(call, victim, service));
    assert_eq!(switch.program().counters().calls_routed, 1);
}

/// The frame of `repr` from `from` to `to`, flagged as carrying
/// `checkpoint` after an empty body.
fn checkpointed_datagram(
    mut repr: remora_wire::bifrost::BifrostRepr,
    checkpoint: &[u8],
    from: DatagramEnd,
    to: DatagramEnd,
) -> Vec<u8> {
    use remora_bifrost::rpc::checkpoint::{join_reply, CHECKPOINT_FLAG};
    use remora_wire::bifrost::HEADER_LEN;
    repr.flags |= CHECKPOINT_FLAG;
    let body = join_reply(b"", checkpoint);
    let mut payload = vec![0u8; HEADER_LEN + body.len()];
    repr.emit(&mut payload).unwrap();
    payload[HEADER_LEN..].copy_from_slice(&body);
    datagram_frame(from, to, &payload)
}
