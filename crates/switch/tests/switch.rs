//! The switch runtime and the L2/L3 program: forwarding, routing, learning
//! by digest, flooding, ICRC recomputation, recirculation, mirroring, the
//! packet generator, and bad input.

use proptest::prelude::*;
use remora_base::Timestamp;
use remora_switch::generator::Template;
use remora_switch::programs::l2l3::{mac_to_u64, L2L3Forwarding, LEARN_DIGEST};
use remora_switch::{
    Egress, Emitted, Packet, PortId, Program, ResourceReport, Switch, SwitchConfig,
};
use remora_wire::frame::{emit_frame, FrameRepr, MAX_FRAME_LEN};
use remora_wire::{BthRepr, Ipv4Address, MacAddress, Opcode, Psn, Qpn, RoceFrame};
use std::time::Duration;

const SWITCH_MAC: MacAddress = MacAddress([0x02, 0x5e, 0, 0, 0, 0xfe]);

fn host_mac(index: u8) -> MacAddress {
    MacAddress([0x02, 0, 0, 0, 0, index])
}

fn host_ip(index: u8) -> Ipv4Address {
    Ipv4Address::new(10, 0, 0, index)
}

/// A SEND-only frame from host `from` to `destination_mac`/host `to`.
fn roce_frame(from: u8, to: u8, destination_mac: MacAddress, payload: &[u8]) -> Vec<u8> {
    let bth = BthRepr::new(Opcode::SendOnly, Qpn::new(0x123).unwrap(), Psn::new(7));
    let repr = FrameRepr::between(
        (host_mac(from), host_ip(from)),
        (destination_mac, host_ip(to)),
        49152,
        bth,
    );
    let mut buffer = vec![0u8; MAX_FRAME_LEN];
    let length = emit_frame(&repr, payload, &mut buffer).unwrap();
    buffer.truncate(length);
    buffer
}

fn rack_switch(ports: u16) -> Switch<L2L3Forwarding> {
    let mut program = L2L3Forwarding::new(SWITCH_MAC, 64);
    for port in 0..ports {
        let index = port as u8 + 1;
        program
            .add_attached_host(host_mac(index), host_ip(index), PortId(port))
            .unwrap();
    }
    Switch::new(SwitchConfig::new(ports), program)
}

fn drain(switch: &mut Switch<impl Program>) -> Vec<(PortId, Vec<u8>)> {
    let mut buffer = vec![0u8; MAX_FRAME_LEN];
    let mut out = Vec::new();
    while let Some((port, length)) = switch.poll_transmit(Timestamp::ZERO, &mut buffer) {
        out.push((port, buffer[..length].to_vec()));
    }
    out
}

#[test]
fn bridged_frames_leave_by_the_destination_hosts_port_unchanged() {
    let mut switch = rack_switch(4);
    let frame = roce_frame(1, 3, host_mac(3), b"hello");
    switch.handle_frame(Timestamp::ZERO, PortId(0), &frame);
    assert_eq!(drain(&mut switch), vec![(PortId(2), frame)]);
    assert_eq!(switch.counters().transmitted, 1);
}

#[test]
fn routed_frames_get_new_macs_and_ttl_and_still_verify() {
    let mut switch = rack_switch(4);
    let frame = roce_frame(1, 4, SWITCH_MAC, b"routed");
    switch.handle_frame(Timestamp::ZERO, PortId(0), &frame);
    let out = drain(&mut switch);
    assert_eq!(out.len(), 1);
    let (port, bytes) = &out[0];
    assert_eq!(*port, PortId(3));
    assert_eq!(&bytes[0..6], &host_mac(4).0);
    assert_eq!(&bytes[6..12], &SWITCH_MAC.0);
    assert_eq!(bytes[14 + 8], 63, "TTL decremented");
    // The IPv4 checksum and the ICRC both still verify.
    RoceFrame::new_checked(&bytes[..]).expect("the routed frame is a valid RoCEv2 frame");
}

/// Only the rack's pump ran the control plane: in the simulator a host no
/// table named was never learned, so frames to it were dropped, and
/// digests piled up to the queue's bound. Driven as a simulator node, the
/// switch learns as it does in a rack.
#[test]
fn a_simulated_switch_learns_as_a_racks_does() {
    use remora_sim::Node;
    let mut switch = rack_switch(2);
    Node::handle_frame(
        &mut switch,
        Timestamp::ZERO,
        PortId(1),
        &roce_frame(9, 1, host_mac(1), b"new host"),
    );
    assert!(switch.poll_digest().is_none(), "the control plane took it");
    drain(&mut switch);
    let back = roce_frame(1, 9, host_mac(9), b"back");
    Node::handle_frame(&mut switch, Timestamp::ZERO, PortId(0), &back);
    let mut buffer = vec![0u8; MAX_FRAME_LEN];
    let sent = Node::poll_transmit(&mut switch, Timestamp::ZERO, &mut buffer);
    assert_eq!(sent.map(|(port, _)| port), Some(PortId(1)));
}

#[test]
fn an_unknown_source_sends_a_learning_digest_the_control_plane_can_apply() {
    let mut switch = rack_switch(2);
    // Host 9 is not in the tables; it sends from port 1 to host 1.
    let frame = roce_frame(9, 1, host_mac(1), b"new host");
    switch.handle_frame(Timestamp::ZERO, PortId(1), &frame);
    let digest = switch.poll_digest().expect("a learning digest");
    assert_eq!(digest.kind, LEARN_DIGEST);
    switch.program_mut().learn(&digest).unwrap();
    assert!(switch.poll_digest().is_none());
    drain(&mut switch);
    // Now frames to host 9 reach port 1, and host 9 is no longer news.
    switch.handle_frame(
        Timestamp::ZERO,
        PortId(0),
        &roce_frame(1, 9, host_mac(9), b"back"),
    );
    assert_eq!(
        drain(&mut switch).first().map(|(port, _)| *port),
        Some(PortId(1))
    );
    switch.handle_frame(Timestamp::ZERO, PortId(1), &frame);
    assert!(switch.poll_digest().is_none());
}

#[test]
fn broadcast_floods_every_other_port_and_unknown_unicast_is_dropped() {
    let mut switch = rack_switch(3);
    let broadcast = roce_frame(1, 2, MacAddress([0xff; 6]), b"all");
    switch.handle_frame(Timestamp::ZERO, PortId(0), &broadcast);
    let ports: Vec<PortId> = drain(&mut switch)
        .into_iter()
        .map(|(port, _)| port)
        .collect();
    assert_eq!(ports, vec![PortId(1), PortId(2)]);
    switch.handle_frame(
        Timestamp::ZERO,
        PortId(0),
        &roce_frame(1, 2, host_mac(42), b"who"),
    );
    assert!(drain(&mut switch).is_empty());
    assert_eq!(switch.counters().dropped_by_program, 1);
}

#[test]
fn runts_and_unknown_ports_are_counted_never_forwarded() {
    let mut switch = rack_switch(2);
    switch.handle_frame(Timestamp::ZERO, PortId(0), &[1, 2, 3]);
    switch.handle_frame(
        Timestamp::ZERO,
        PortId(7),
        &roce_frame(1, 2, host_mac(2), b"x"),
    );
    assert!(drain(&mut switch).is_empty());
    let counters = switch.counters();
    assert_eq!(
        (counters.dropped_runt, counters.dropped_unknown_port),
        (1, 1)
    );
}

/// A program that exercises the runtime: rewrites the BTH destination QP
/// (so the ICRC must be recomputed), recirculates `passes` times, mirrors
/// to port 2 and forwards to port 1.
struct Rewriter {
    passes: u8,
    forever: bool,
}

impl Program for Rewriter {
    fn name(&self) -> &str {
        "rewriter"
    }

    fn ingress(&mut self, _now: Timestamp, packet: &mut Packet) {
        let roce = packet.headers.roce.expect("RoCE frame");
        if packet.recirculations < self.passes || self.forever {
            packet.recirculate = true;
            return;
        }
        packet.bytes[roce.bth_offset + 5..roce.bth_offset + 8].copy_from_slice(&[0, 0x04, 0x56]);
        packet.rewritten = true;
        packet.mirror = Some(PortId(2));
        packet.egress = Egress::Port(PortId(1));
    }

    fn resources(&self) -> ResourceReport {
        let mut report = ResourceReport::new("rewriter");
        report.max_recirculations_per_packet = self.passes;
        report.recomputes_icrc = true;
        report
    }
}

#[test]
fn a_rewriting_program_gets_its_icrc_recomputed_after_recirculating() {
    let mut switch = Switch::new(
        SwitchConfig::new(3),
        Rewriter {
            passes: 2,
            forever: false,
        },
    );
    switch.handle_frame(
        Timestamp::ZERO,
        PortId(0),
        &roce_frame(1, 2, host_mac(2), b"rewrite me"),
    );
    let out = drain(&mut switch);
    assert_eq!(
        out.iter().map(|(port, _)| *port).collect::<Vec<_>>(),
        vec![PortId(1), PortId(2)]
    );
    for (_, bytes) in &out {
        let frame = RoceFrame::new_checked(&bytes[..]).expect("ICRC recomputed");
        assert_eq!(frame.bth().destination_qp, Qpn::new(0x456).unwrap());
    }
    let counters = switch.counters();
    assert_eq!((counters.recirculated, counters.mirrored), (2, 1));
    let report = switch.resources();
    assert!(report
        .over_budget(remora_switch::resources::Budget::TOFINO1)
        .iter()
        .any(|problem| problem.contains("ICRC")));
}

#[test]
fn endless_recirculation_stops_at_the_limit() {
    let mut switch = Switch::new(
        SwitchConfig::new(3),
        Rewriter {
            passes: 0,
            forever: true,
        },
    );
    switch.handle_frame(
        Timestamp::ZERO,
        PortId(0),
        &roce_frame(1, 2, host_mac(2), b"loop"),
    );
    assert!(drain(&mut switch).is_empty());
    assert_eq!(switch.counters().dropped_recirculation_limit, 1);
    assert_eq!(
        switch.counters().recirculated,
        u64::from(SwitchConfig::new(3).max_recirculations)
    );
}

/// A queued frame longer than the buffer a caller polls with was copied
/// past the buffer: a panic. It is dropped and counted, and the frames
/// after it still leave.
#[test]
fn a_frame_past_the_callers_buffer_is_dropped_and_counted_not_a_panic() {
    let mut switch = rack_switch(4);
    let long = roce_frame(1, 3, host_mac(3), &[7; 1000]);
    let short = roce_frame(1, 3, host_mac(3), b"hello");
    switch.handle_frame(Timestamp::ZERO, PortId(0), &long);
    switch.handle_frame(Timestamp::ZERO, PortId(0), &short);
    let mut buffer = vec![0u8; 200];
    let sent = switch.poll_transmit(Timestamp::ZERO, &mut buffer);
    assert_eq!(sent, Some((PortId(2), short.len())));
    assert_eq!(&buffer[..short.len()], &short[..]);
    assert_eq!(switch.counters().dropped_too_large, 1);
    assert!(switch.check_frame_accounting().is_ok());
}

/// Learning past a full table was thrown away uncounted, though the
/// control plane's comment said counted: a host that could not be learned
/// was invisible. Each refusal is counted now.
/// A switch of `ports` ports whose tables hold `capacity` hosts, hosts 1
/// and 2 configured on ports 0 and 1.
fn two_host_switch(capacity: usize, ports: u16) -> Switch<L2L3Forwarding> {
    let mut program = L2L3Forwarding::new(SWITCH_MAC, capacity);
    for index in 1..=2 {
        program
            .add_attached_host(
                host_mac(index),
                host_ip(index),
                PortId(u16::from(index) - 1),
            )
            .unwrap();
    }
    Switch::new(SwitchConfig::new(ports), program)
}

/// Host `from` sends to host 1 from `port` at `now`; the control plane
/// takes the learning digests, and the switch's output is discarded.
fn send_to_learn(switch: &mut Switch<L2L3Forwarding>, now: Timestamp, port: PortId, from: u8) {
    let frame = roce_frame(from, 1, host_mac(1), b"hello");
    switch.handle_frame(now, port, &frame);
    while let Some(digest) = switch.poll_digest() {
        switch.program_mut().control_plane(&digest);
    }
    drain(switch);
}

#[test]
fn learning_past_a_full_table_is_counted() {
    let mut switch = two_host_switch(2, 2);
    for stranger in 10..14 {
        send_to_learn(&mut switch, Timestamp::ZERO, PortId(1), stranger);
    }
    assert_eq!(switch.program().learning_refused(), 4);
}

#[test]
fn the_generator_fires_on_schedule_and_background_yields_to_traffic() {
    let mut switch = rack_switch(2);
    let probe = roce_frame(2, 1, host_mac(1), b"probe");
    let period = Duration::from_micros(10);
    switch
        .add_template(
            Template {
                bytes: probe.clone(),
                period,
                priority: 0,
            },
            Timestamp::from_nanos(5_000),
        )
        .unwrap();
    assert_eq!(switch.poll_timeout(), Some(Timestamp::from_nanos(5_000)));
    switch.handle_timeout(Timestamp::from_nanos(5_000));
    assert_eq!(switch.poll_timeout(), Some(Timestamp::from_nanos(15_000)));
    // Normal traffic to the same port arrives after the probe but leaves first.
    let data = roce_frame(2, 1, host_mac(1), b"data");
    switch.handle_frame(Timestamp::from_nanos(5_001), PortId(1), &data);
    let out = drain(&mut switch);
    assert_eq!(out, vec![(PortId(0), data), (PortId(0), probe)]);
    assert_eq!(switch.counters().generated, 1);
}

/// Takes its timer's packets whole (a timer pass that sends nothing) and
/// drops every other.
struct TimerOnly;

impl Program for TimerOnly {
    fn name(&self) -> &str {
        "timer-only"
    }

    fn ingress(&mut self, _now: Timestamp, packet: &mut Packet) {
        packet.egress = match packet.ingress_port == remora_switch::packet::GENERATOR_PORT {
            true => Egress::Consumed,
            false => Egress::Drop,
        };
    }

    fn resources(&self) -> ResourceReport {
        ResourceReport::new("timer-only")
    }
}

/// A packet a program takes whole (a timer pass, Cowbird-P4's idle probes
/// and the answers to the queue pairs it plays) was counted a program
/// drop, so such traffic swamped the drops of real frames. It is counted
/// apart; a frame the program drops is still a drop.
#[test]
fn packets_a_program_consumes_are_not_counted_as_drops() {
    let mut switch = Switch::new(SwitchConfig::new(2), TimerOnly);
    let template = Template {
        bytes: roce_frame(2, 1, host_mac(1), b"tick"),
        period: Duration::from_micros(10),
        priority: 1,
    };
    switch.add_template(template, Timestamp::ZERO).unwrap();
    switch.handle_timeout(Timestamp::ZERO);
    switch.handle_frame(
        Timestamp::ZERO,
        PortId(0),
        &roce_frame(1, 2, host_mac(2), b"frame"),
    );
    let counters = switch.counters();
    assert_eq!(
        (counters.consumed_by_program, counters.dropped_by_program),
        (1, 1)
    );
    assert_eq!(counters.dropped(), 1);
    switch.check_frame_accounting().unwrap();
}

/// A late timeout (a rack's pump comes when it comes) scheduled the next
/// packet a period after it, so every late call moved the schedule later
/// and the rate fell. The schedule keeps its grid; a template far behind
/// still fires once, not in a burst.
#[test]
fn late_timeouts_keep_the_generators_schedule() {
    let mut switch = rack_switch(2);
    let template = Template {
        bytes: roce_frame(2, 1, host_mac(1), b"probe"),
        period: Duration::from_micros(10),
        priority: 1,
    };
    switch.add_template(template, Timestamp::ZERO).unwrap();
    switch.handle_timeout(Timestamp::ZERO);
    switch.handle_timeout(Timestamp::from_nanos(13_000));
    assert_eq!(switch.poll_timeout(), Some(Timestamp::from_nanos(20_000)));
    switch.handle_timeout(Timestamp::from_nanos(95_000));
    assert_eq!(switch.poll_timeout(), Some(Timestamp::from_nanos(100_000)));
    assert_eq!(switch.counters().generated, 3);
}

#[test]
fn the_l2l3_resource_report_counts_its_tables() {
    let switch = rack_switch(4);
    let report = switch.resources();
    assert_eq!(report.stages_used(), 2);
    assert_eq!(report.table_entries(), 12);
    assert!(!report.recomputes_icrc);
    assert!(report
        .over_budget(remora_switch::resources::Budget::TOFINO1)
        .is_empty());
    assert!(report.to_string().contains("mac_table"));
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic_the_switch(bytes in proptest::collection::vec(any::<u8>(), 0..300), port in 0u16..4) {
        let mut switch = rack_switch(3);
        switch.handle_frame(Timestamp::ZERO, PortId(port), &bytes);
        drain(&mut switch);
    }

    /// Random bytes carry IPv4's ethertype once in 65,536 tries, so they
    /// almost never reach the IPv4, UDP and RoCE parsing, and never the
    /// deparser (L2/L3 rewrites nothing). A RoCE frame with random header
    /// and total lengths and a random tail reaches both, through
    /// forwarding and through a program that rewrites one byte.
    #[test]
    fn roce_frames_with_random_lengths_never_panic_the_switch(
        tail in proptest::collection::vec(any::<u8>(), 0..200),
        // Mostly a frame that parses, so a rewrite reaches the deparser.
        lengths in proptest::option::weighted(0.25, (0u8..16, any::<u16>())),
        // The bytes that place the ICRC (IPv4 version and header length,
        // total length, protocol, UDP port), or any byte.
        at in prop_oneof![
            proptest::sample::select(vec![14usize, 16, 17, 23, 36, 37]),
            0usize..400,
        ],
        value in any::<u8>(),
    ) {
        let mut frame = roce_frame(1, 2, host_mac(2), b"0123456789");
        if let Some((header_words, total_len)) = lengths {
            frame[14] = 0x40 | header_words;
            frame[16..18].copy_from_slice(&total_len.to_be_bytes());
        }
        frame.extend_from_slice(&tail);
        let mut forwarding = rack_switch(3);
        forwarding.handle_frame(Timestamp::ZERO, PortId(0), &frame);
        drain(&mut forwarding);
        let poke = PokeByte { at: at % frame.len(), value };
        let mut rewriting = Switch::new(SwitchConfig::new(3), poke);
        rewriting.handle_frame(Timestamp::ZERO, PortId(0), &frame);
        drain(&mut rewriting);
        prop_assert_eq!(rewriting.check_frame_accounting(), Ok(()));
    }

    /// Whatever arrives, in any order and any mix of ports, every frame
    /// is accounted for: in = out + dropped + queued.
    #[test]
    fn every_frame_is_accounted_for(
        frames in proptest::collection::vec((0u16..5, 1u8..4, 0u8..5, any::<bool>()), 1..40),
        refuse_every in 1usize..4,
    ) {
        let mut switch = rack_switch(3);
        let mut offered = 0usize;
        for (port, source, destination, drain_now) in frames {
            // Known hosts, unknown ones (flooded or dropped), broadcast.
            let mac = match destination {
                0 => MacAddress([0xff; 6]),
                4 => MacAddress([2, 0, 0, 0, 0, 0x77]),
                known => host_mac(known),
            };
            let frame = roce_frame(source, destination.clamp(1, 3), mac, b"payload");
            // The carrier takes some frames, refuses others and loses a
            // few (a failed port), so frames queue, leave and are lost.
            switch.handle_frame_with(Timestamp::ZERO, PortId(port), &frame, &mut |_, _| {
                offered += 1;
                match offered {
                    _ if offered.is_multiple_of(7) => Emitted::Lost,
                    _ if offered.is_multiple_of(refuse_every) => Emitted::Sent,
                    _ => Emitted::Refused,
                }
            });
            prop_assert_eq!(switch.check_frame_accounting(), Ok(()));
            if drain_now {
                drain(&mut switch);
                prop_assert_eq!(switch.check_frame_accounting(), Ok(()));
            }
        }
        prop_assert!(switch.counters().received > 0);
    }

    #[test]
    fn mutated_roce_frames_never_panic_the_switch(flips in proptest::collection::vec((0usize..80, any::<u8>()), 1..6)) {
        let mut frame = roce_frame(1, 2, SWITCH_MAC, b"0123456789");
        for (at, value) in flips {
            let at = at % frame.len();
            frame[at] = value;
        }
        let mut switch = rack_switch(3);
        switch.handle_frame(Timestamp::ZERO, PortId(0), &frame);
        drain(&mut switch);
    }
}

#[test]
fn cut_through_hands_frames_to_the_carrier_and_queues_what_it_refuses_in_order() {
    let mut switch = rack_switch(3);
    let first = roce_frame(1, 3, host_mac(3), b"first");
    let second = roce_frame(1, 3, host_mac(3), b"second");
    let third = roce_frame(1, 3, host_mac(3), b"third");
    let mut emitted = Vec::new();
    switch.handle_frame_with(Timestamp::ZERO, PortId(0), &first, &mut |port, bytes| {
        emitted.push((port, bytes.to_vec()));
        Emitted::Sent
    });
    assert_eq!(emitted, vec![(PortId(2), first)]);
    // A full carrier: the frame waits in the queue...
    switch.handle_frame_with(Timestamp::ZERO, PortId(0), &second, &mut |_, _| {
        Emitted::Refused
    });
    // ...and a later frame to the same port may not overtake it.
    switch.handle_frame_with(Timestamp::ZERO, PortId(0), &third, &mut |_, _| {
        panic!("must queue behind")
    });
    assert_eq!(
        drain(&mut switch),
        vec![(PortId(2), second), (PortId(2), third)]
    );
    assert_eq!(switch.counters().transmitted, 3);
}

/// Sends every frame to port 0; those from port 1 in the background
/// class, as a program picks a packet's queue.
struct BackgroundFromPortOne;

impl Program for BackgroundFromPortOne {
    fn name(&self) -> &str {
        "background-from-port-one"
    }

    fn ingress(&mut self, _now: Timestamp, packet: &mut Packet) {
        packet.background = packet.ingress_port == PortId(1);
        packet.egress = Egress::Port(PortId(0));
    }

    fn resources(&self) -> ResourceReport {
        ResourceReport::new("background-from-port-one")
    }
}

/// A program chooses a packet's class: a background frame cuts through
/// to an idle port (nothing waits there for it to yield to), and behind
/// a backed-up port it waits for the normal frames, those that come
/// after it too.
#[test]
fn a_program_picks_the_background_class_which_yields_only_to_waiting_frames() {
    let mut switch = Switch::new(SwitchConfig::new(3), BackgroundFromPortOne);
    let frame = |payload: &[u8]| roce_frame(1, 2, host_mac(2), payload);
    let mut emitted = Vec::new();
    switch.handle_frame_with(
        Timestamp::ZERO,
        PortId(1),
        &frame(b"idle"),
        &mut |port, bytes| {
            emitted.push((port, bytes.to_vec()));
            Emitted::Sent
        },
    );
    assert_eq!(emitted, vec![(PortId(0), frame(b"idle"))]);
    let mut refuse = |_: PortId, _: &[u8]| Emitted::Refused;
    switch.handle_frame_with(Timestamp::ZERO, PortId(2), &frame(b"normal 1"), &mut refuse);
    switch.handle_frame_with(
        Timestamp::ZERO,
        PortId(1),
        &frame(b"background"),
        &mut refuse,
    );
    switch.handle_frame_with(Timestamp::ZERO, PortId(2), &frame(b"normal 2"), &mut refuse);
    let order: Vec<Vec<u8>> = drain(&mut switch)
        .into_iter()
        .map(|(_, bytes)| bytes)
        .collect();
    assert_eq!(
        order,
        vec![frame(b"normal 1"), frame(b"normal 2"), frame(b"background")]
    );
    switch.check_frame_accounting().unwrap();
}

/// A full queue's background frame that yields its place to a normal one
/// is the newest: the oldest went, from the middle of a background flow's
/// run (Cowbird-P4's queue pairs), and its receiver refused the rest.
#[test]
fn the_newest_background_frame_yields_its_place() {
    let mut config = SwitchConfig::new(3);
    config.egress_queue_frames = 2;
    let mut switch = Switch::new(config, BackgroundFromPortOne);
    let frame = |payload: &[u8]| roce_frame(1, 2, host_mac(2), payload);
    let mut refuse = |_: PortId, _: &[u8]| Emitted::Refused;
    switch.handle_frame_with(Timestamp::ZERO, PortId(1), &frame(b"first"), &mut refuse);
    switch.handle_frame_with(Timestamp::ZERO, PortId(1), &frame(b"second"), &mut refuse);
    switch.handle_frame_with(Timestamp::ZERO, PortId(2), &frame(b"normal"), &mut refuse);
    let order: Vec<Vec<u8>> = drain(&mut switch)
        .into_iter()
        .map(|(_, bytes)| bytes)
        .collect();
    assert_eq!(order, vec![frame(b"normal"), frame(b"first")]);
    assert_eq!(switch.counters().dropped_queue_full, 1);
    switch.check_frame_accounting().unwrap();
}

/// Sends every frame to port 7.
struct ToPortSeven;

impl Program for ToPortSeven {
    fn name(&self) -> &str {
        "to-port-seven"
    }

    fn ingress(&mut self, _now: Timestamp, packet: &mut Packet) {
        packet.egress = Egress::Port(PortId(7));
    }

    fn resources(&self) -> ResourceReport {
        ResourceReport::new("to-port-seven")
    }
}

/// A frame a program sent to a port the switch does not have was counted
/// as one the program gave no egress.
#[test]
fn egress_to_a_port_the_switch_lacks_is_counted_as_such() {
    let mut switch = Switch::new(SwitchConfig::new(3), ToPortSeven);
    switch.handle_frame(
        Timestamp::ZERO,
        PortId(0),
        &roce_frame(1, 2, host_mac(2), b"nowhere"),
    );
    assert!(drain(&mut switch).is_empty());
    let counters = switch.counters();
    assert_eq!(
        (
            counters.dropped_unknown_egress_port,
            counters.dropped_no_egress
        ),
        (1, 0)
    );
    switch.check_frame_accounting().unwrap();
}

/// A carrier that said it had room and then dropped the frame for room
/// had it counted transmitted by the per-port drain. A refusal keeps it at
/// the head of its queue; a loss counts it lost.
#[test]
fn the_per_port_drain_keeps_a_refused_frame_and_counts_a_lost_one() {
    let mut switch = rack_switch(3);
    let first = roce_frame(1, 3, host_mac(3), b"first");
    let second = roce_frame(1, 3, host_mac(3), b"second");
    switch.handle_frame(Timestamp::ZERO, PortId(0), &first);
    switch.handle_frame(Timestamp::ZERO, PortId(0), &second);
    assert!(!switch.poll_transmit_port(PortId(2), &mut |_| Emitted::Refused));
    assert_eq!(switch.queued_frames(), 2);
    assert_eq!(switch.counters().transmitted, 0);
    let mut sent = Vec::new();
    assert!(switch.poll_transmit_port(PortId(2), &mut |bytes| {
        sent.push(bytes.to_vec());
        Emitted::Sent
    }));
    assert_eq!(sent, vec![first]);
    assert!(switch.poll_transmit_port(PortId(2), &mut |_| Emitted::Lost));
    assert_eq!(switch.counters().transmitted, 1);
    assert_eq!(switch.counters().dropped_port_failed, 1);
    assert!(!switch.poll_transmit_port(PortId(2), &mut |_| Emitted::Sent));
    switch.check_frame_accounting().unwrap();
}

#[test]
fn normal_frames_take_the_place_of_background_ones_in_a_full_queue() {
    let mut config = SwitchConfig::new(2);
    config.egress_queue_frames = 2;
    let mut program = L2L3Forwarding::new(SWITCH_MAC, 8);
    program.add_host(host_mac(1), PortId(0)).unwrap();
    program.add_host(host_mac(2), PortId(1)).unwrap();
    let mut switch = Switch::new(config, program);
    let probe = roce_frame(1, 2, host_mac(2), b"probe");
    switch
        .add_template(
            Template {
                bytes: probe.clone(),
                period: Duration::from_micros(1),
                priority: 0,
            },
            Timestamp::ZERO,
        )
        .unwrap();
    for tick in 0..2 {
        switch.handle_timeout(Timestamp::from_nanos(tick * 1_000));
    }
    // The queue to port 1 is full of probes; data still gets in.
    let data = roce_frame(1, 2, host_mac(2), b"data");
    switch.handle_frame(Timestamp::from_nanos(5_000), PortId(0), &data);
    assert_eq!(
        drain(&mut switch),
        vec![(PortId(1), data), (PortId(1), probe)]
    );
    assert_eq!(
        switch.counters().dropped_queue_full,
        1,
        "one probe gave its place up"
    );
}

/// Floods on its second pass, or cuts the frame to nothing.
struct Recirculator {
    cut: bool,
}

impl Program for Recirculator {
    fn name(&self) -> &str {
        "recirculator"
    }

    fn ingress(&mut self, _now: Timestamp, packet: &mut Packet) {
        if packet.recirculations == 0 {
            packet.recirculate = true;
            if self.cut {
                packet.bytes.truncate(3);
            }
            return;
        }
        packet.egress = Egress::Flood;
    }

    fn resources(&self) -> ResourceReport {
        ResourceReport::new("recirculator")
    }
}

#[test]
fn a_recirculated_flood_skips_the_port_the_frame_first_came_in_on() {
    let mut switch = Switch::new(SwitchConfig::new(3), Recirculator { cut: false });
    switch.handle_frame(
        Timestamp::ZERO,
        PortId(1),
        &roce_frame(1, 2, host_mac(2), b"again"),
    );
    let ports: Vec<PortId> = drain(&mut switch)
        .into_iter()
        .map(|(port, _)| port)
        .collect();
    assert_eq!(ports, vec![PortId(0), PortId(2)]);
}

#[test]
fn a_program_that_cuts_a_frame_below_its_headers_gets_it_dropped_not_a_panic() {
    let mut switch = Switch::new(SwitchConfig::new(3), Recirculator { cut: true });
    switch.handle_frame(
        Timestamp::ZERO,
        PortId(1),
        &roce_frame(1, 2, host_mac(2), b"cut"),
    );
    assert!(drain(&mut switch).is_empty());
    let counters = switch.counters();
    assert_eq!(
        (counters.dropped_broken_by_program, counters.dropped_runt),
        (1, 0)
    );
}

/// A program that cuts a RoCE frame short and marks it rewritten.
struct ShortenAndRewrite;

impl Program for ShortenAndRewrite {
    fn name(&self) -> &str {
        "shorten"
    }

    fn ingress(&mut self, _now: Timestamp, packet: &mut Packet) {
        let length = packet.bytes.len();
        packet.bytes.truncate(length - 8);
        packet.rewritten = true;
        packet.egress = Egress::Port(PortId(1));
    }

    fn resources(&self) -> ResourceReport {
        ResourceReport::new("shorten")
    }
}

/// The deparser wrote the ICRC at the offsets of the pass's parse: a
/// program that shortened the frame made it write past the end (a panic).
/// The frame is parsed afresh, and one no longer whole is dropped.
#[test]
fn a_rewritten_frame_whose_length_changed_is_dropped_not_a_panic() {
    let mut switch = Switch::new(SwitchConfig::new(3), ShortenAndRewrite);
    switch.handle_frame(
        Timestamp::ZERO,
        PortId(0),
        &roce_frame(1, 2, host_mac(2), b"a payload long enough"),
    );
    assert!(drain(&mut switch).is_empty());
    let counters = switch.counters();
    assert_eq!(
        (counters.dropped_broken_by_program, counters.dropped_runt),
        (1, 0)
    );
    assert!(switch.check_frame_accounting().is_ok());
}

/// A program that writes one byte of the frame and marks it rewritten.
struct PokeByte {
    at: usize,
    value: u8,
}

impl Program for PokeByte {
    fn name(&self) -> &str {
        "poke"
    }

    fn ingress(&mut self, _now: Timestamp, packet: &mut Packet) {
        packet.bytes[self.at] = self.value;
        packet.rewritten = true;
        packet.egress = Egress::Port(PortId(1));
    }

    fn resources(&self) -> ResourceReport {
        ResourceReport::new("poke")
    }
}

/// The deparser kept the pass's offsets whenever the frame's and the IPv4
/// total length were unchanged. A program that rewrote the IPv4 header
/// length moved the BTH past the old ICRC offset, and the ICRC's layout
/// check panicked (the fabric thread, in a rack); one that rewrote the
/// UDP port away from RoCE's got four "ICRC" bytes written over the end
/// of a plain datagram. Either is parsed afresh now: a header length
/// past the frame is no RoCE frame, and is dropped.
#[test]
fn a_rewritten_header_length_or_udp_port_is_parsed_afresh() {
    // IHL 15: a 60-byte IPv4 header, which puts the BTH past the ICRC.
    let mut switch = Switch::new(
        SwitchConfig::new(3),
        PokeByte {
            at: 14,
            value: 0x4f,
        },
    );
    switch.handle_frame(
        Timestamp::ZERO,
        PortId(0),
        &roce_frame(1, 2, host_mac(2), b"x"),
    );
    assert!(drain(&mut switch).is_empty());
    let counters = switch.counters();
    assert_eq!(
        (counters.dropped_broken_by_program, counters.dropped_runt),
        (1, 0)
    );
    // The UDP destination port's low byte: no longer 4791.
    let frame = roce_frame(1, 2, host_mac(2), b"a datagram now");
    let mut switch = Switch::new(
        SwitchConfig::new(3),
        PokeByte {
            at: 14 + 20 + 3,
            value: 0,
        },
    );
    switch.handle_frame(Timestamp::ZERO, PortId(0), &frame);
    let sent = drain(&mut switch);
    assert_eq!(sent.len(), 1);
    let tail = frame.len() - 4;
    assert_eq!(
        sent[0].1[tail..],
        frame[tail..],
        "the last four bytes were left alone"
    );
    assert!(switch.check_frame_accounting().is_ok());
}

/// Ethernet may pad a short frame past its IPv4 packet. The ICRC was
/// taken to be the frame's last four bytes: a rewritten padded frame got
/// its ICRC computed over the wrong bytes and written two bytes late.
#[test]
fn a_padded_roce_frame_gets_its_icrc_where_its_packet_ends() {
    let mut switch = Switch::new(
        SwitchConfig::new(3),
        Rewriter {
            passes: 0,
            forever: false,
        },
    );
    let mut padded = roce_frame(1, 2, host_mac(2), b"");
    padded.extend_from_slice(&[0, 0]);
    switch.handle_frame(Timestamp::ZERO, PortId(0), &padded);
    let out = drain(&mut switch);
    assert_eq!(out.len(), 2, "forwarded and mirrored");
    for (_, bytes) in &out {
        let frame = RoceFrame::new_checked(&bytes[..]).expect("the ICRC where the packet ends");
        assert_eq!(frame.bth().destination_qp, Qpn::new(0x456).unwrap());
    }
}

/// A learned host that moved to another port was never learned again: its
/// source MAC was known, so no digest went out, and frames to it went on
/// leaving by the old port for good.
#[test]
fn a_learned_host_that_moves_is_learned_again_on_its_new_port() {
    let mut switch = rack_switch(3);
    let from_port = |switch: &mut Switch<L2L3Forwarding>, port: u16| {
        switch.handle_frame(
            Timestamp::ZERO,
            PortId(port),
            &roce_frame(9, 1, host_mac(1), b"hello"),
        );
        drain(switch);
        switch.poll_digest()
    };
    let to_host_9 = |switch: &mut Switch<L2L3Forwarding>| {
        let frame = roce_frame(1, 9, host_mac(9), b"back");
        switch.handle_frame(Timestamp::ZERO, PortId(0), &frame);
        drain(switch).first().map(|(port, _)| *port)
    };
    let digest = from_port(&mut switch, 1).expect("a new host is news");
    switch.program_mut().learn(&digest).unwrap();
    assert_eq!(to_host_9(&mut switch), Some(PortId(1)));
    assert!(from_port(&mut switch, 1).is_none(), "nothing new on port 1");
    let moved = from_port(&mut switch, 2).expect("a host on a new port is news");
    switch.program_mut().learn(&moved).unwrap();
    assert_eq!(to_host_9(&mut switch), Some(PortId(2)));
    assert!(from_port(&mut switch, 2).is_none(), "learned on port 2 now");
}

/// A configured host stays on its port: a frame carrying its MAC from
/// another port (a spoof) is not news, and a digest naming it moves
/// nothing.
#[test]
fn a_configured_host_does_not_move_with_a_frame_from_elsewhere() {
    let mut switch = rack_switch(3);
    let spoof = roce_frame(2, 1, host_mac(1), b"not host 2");
    switch.handle_frame(Timestamp::ZERO, PortId(2), &spoof);
    drain(&mut switch);
    assert!(
        switch.poll_digest().is_none(),
        "a configured host is not news"
    );
    let digest = remora_switch::program::Digest {
        kind: LEARN_DIGEST,
        values: [mac_to_u64(host_mac(2)), 2, 0, 0],
    };
    switch.program_mut().learn(&digest).unwrap();
    let frame = roce_frame(1, 2, host_mac(2), b"to host 2");
    switch.handle_frame(Timestamp::ZERO, PortId(0), &frame);
    assert_eq!(drain(&mut switch), vec![(PortId(1), frame)]);
}

/// A group address is never a frame's source. One was learned (a spoof,
/// a flipped bit): every later broadcast went to its one port.
#[test]
fn a_group_source_address_is_dropped_and_never_learned() {
    let mut switch = rack_switch(3);
    let mut spoof = roce_frame(3, 1, host_mac(1), b"spoof");
    spoof[6..12].copy_from_slice(&[0xff; 6]);
    switch.handle_frame(Timestamp::ZERO, PortId(2), &spoof);
    assert!(switch.poll_digest().is_none(), "nothing to learn");
    assert!(drain(&mut switch).is_empty());
    let digest = remora_switch::program::Digest {
        kind: LEARN_DIGEST,
        values: [0xffff_ffff_ffff, 2, 0, 0],
    };
    switch.program_mut().learn(&digest).unwrap();
    let broadcast = roce_frame(1, 2, MacAddress([0xff; 6]), b"all");
    switch.handle_frame(Timestamp::ZERO, PortId(0), &broadcast);
    let ports: Vec<PortId> = drain(&mut switch)
        .into_iter()
        .map(|(port, _)| port)
        .collect();
    assert_eq!(ports, vec![PortId(1), PortId(2)], "broadcasts still flood");
}

/// Clearing the queues (a switch that lost its power) dropped frames
/// uncounted: the accounting no longer balanced, and a debug switch
/// panicked at its next frame.
#[test]
fn frames_cleared_from_the_queues_are_counted() {
    let mut switch = rack_switch(2);
    switch.handle_frame(
        Timestamp::ZERO,
        PortId(0),
        &roce_frame(1, 2, host_mac(2), b"queued"),
    );
    assert_eq!(switch.queued_frames(), 1);
    switch.clear_queues();
    assert_eq!(switch.counters().dropped_cleared, 1);
    assert!(switch.check_frame_accounting().is_ok());
    switch.handle_frame(
        Timestamp::ZERO,
        PortId(0),
        &roce_frame(1, 2, host_mac(2), b"next"),
    );
}

/// A template's period changed without moving its next packet: a ramp
/// from a second to 10 µs waited up to a second for the first fast
/// probe. An unknown template was accepted without a word.
#[test]
fn a_shorter_period_brings_the_next_probe_forward() {
    let mut switch = rack_switch(2);
    let probe = roce_frame(2, 1, host_mac(1), b"probe");
    let id = switch
        .add_template(
            Template {
                bytes: probe,
                period: Duration::from_secs(1),
                priority: 0,
            },
            Timestamp::ZERO,
        )
        .unwrap();
    switch.handle_timeout(Timestamp::ZERO);
    assert_eq!(
        switch.poll_timeout(),
        Some(Timestamp::from_nanos(1_000_000_000))
    );
    switch
        .set_template_period(id, Duration::from_micros(10))
        .unwrap();
    assert_eq!(switch.poll_timeout(), Some(Timestamp::from_nanos(10_000)));
    assert!(matches!(
        switch.set_template_period(
            remora_switch::generator::TemplateId(9),
            Duration::from_micros(1)
        ),
        Err(remora_switch::generator::GeneratorError::UnknownTemplate(9))
    ));
}

mod range_table {
    use proptest::prelude::*;
    use remora_switch::table::{RangeTable, TableError, TableShape};
    use std::collections::BTreeMap;

    fn table(capacity: usize) -> RangeTable<u32> {
        RangeTable::new(TableShape {
            name: "ranges",
            stage: 0,
            key_bits: 64,
            action_data_bits: 32,
            capacity,
        })
    }

    #[test]
    fn overlapping_and_empty_ranges_are_refused_and_a_full_table_says_so() {
        let mut ranges = table(2);
        ranges.insert(100, 200, 1).expect("room");
        for (start, end) in [(150, 160), (50, 101), (199, 300), (0, 1000), (300, 300)] {
            assert!(
                matches!(
                    ranges.insert(start, end, 9),
                    Err(TableError::RangeOverlaps { .. })
                ),
                "{start}..{end}"
            );
        }
        ranges
            .insert(200, 300, 2)
            .expect("adjacent ranges do not overlap");
        assert!(matches!(
            ranges.insert(400, 500, 3),
            Err(TableError::Full { capacity: 2, .. })
        ));
    }

    proptest! {
        /// A span matches the one entry that holds all of it, and nothing
        /// when it crosses an entry's end or falls between entries: the
        /// same answers as a scan of every entry.
        #[test]
        fn a_span_matches_the_entry_that_holds_it_as_a_scan_says(
            entries in proptest::collection::vec((0u64..1000, 1u64..100), 0..20),
            spans in proptest::collection::vec((0u64..1200, 0u64..150), 1..40),
        ) {
            let mut ranges = table(64);
            let mut kept = BTreeMap::new();
            for (index, (start, length)) in entries.into_iter().enumerate() {
                if ranges.insert(start, start + length, index as u32).is_ok() {
                    kept.insert(start, (start + length, index as u32));
                }
            }
            for (start, length) in spans {
                let scanned = kept.iter().find(|(&entry_start, &(end, _))| {
                    entry_start <= start && start < end && start + length <= end
                });
                let expected = scanned.map(|(&entry_start, &(_, value))| (entry_start, value));
                let found = ranges.lookup_span(start, length).map(|(at, value)| (at, *value));
                prop_assert_eq!(found, expected);
            }
        }
    }
}

/// Learned hosts never aged: hosts that came and went filled the tables,
/// and every new host after them was refused for good. One unseen for the
/// idle timeout makes room for a new host now; one that keeps sending
/// stays, and so do the hosts the control plane configured.
#[test]
fn a_learned_host_unseen_for_the_idle_timeout_makes_room() {
    let mut switch = two_host_switch(4, 3);
    let at = |seconds| Timestamp::ZERO.saturating_add(std::time::Duration::from_secs(seconds));
    let send = |switch: &mut Switch<L2L3Forwarding>, seconds, from: u8| {
        send_to_learn(switch, at(seconds), PortId(2), from);
    };
    send(&mut switch, 0, 10);
    send(&mut switch, 0, 11);
    send(&mut switch, 200, 11);
    send(&mut switch, 250, 12);
    assert_eq!(
        switch.program().learning_refused(),
        1,
        "the tables are full"
    );
    send(&mut switch, 400, 12);
    let program = switch.program();
    assert_eq!(program.learned_aged_out(), 1, "host 10, unseen for 400 s");
    assert_eq!(program.learning_refused(), 1, "host 12 is learned");
    // Frames to host 12 and host 11 reach their port; host 10's are dropped.
    for (to, expected) in [(12, Some(PortId(2))), (11, Some(PortId(2))), (10, None)] {
        let frame = roce_frame(1, to, host_mac(to), b"back");
        switch.handle_frame(at(400), PortId(0), &frame);
        let sent = drain(&mut switch).first().map(|(port, _)| *port);
        assert_eq!(sent, expected, "to host {to}");
    }
    // The configured hosts stayed.
    let frame = roce_frame(2, 1, host_mac(1), b"configured");
    switch.handle_frame(at(400), PortId(1), &frame);
    assert_eq!(
        drain(&mut switch).first().map(|(port, _)| *port),
        Some(PortId(0))
    );
}

/// Aged whenever idle, a learned host that only answers (an RDMA
/// responder) was forgotten after 300 s of quiet, and frames to it were
/// dropped (unknown unicast is not flooded here), so it never answered
/// and was never learned again. With room in the tables it stays.
#[test]
fn a_quiet_learned_host_stays_reachable_while_the_tables_have_room() {
    let mut switch = two_host_switch(64, 3);
    send_to_learn(&mut switch, Timestamp::ZERO, PortId(2), 10);
    let much_later = Timestamp::ZERO.saturating_add(std::time::Duration::from_secs(3_600));
    let to_quiet = roce_frame(1, 10, host_mac(10), b"a request");
    switch.handle_frame(much_later, PortId(0), &to_quiet);
    assert_eq!(
        drain(&mut switch).first().map(|(port, _)| *port),
        Some(PortId(2))
    );
    assert_eq!(switch.program().learned_aged_out(), 0);
}
