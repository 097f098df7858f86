//! The simulator's own guarantees: one seed, one run; faults as configured;
//! crashes silence a node; the liveness phase is fault-free.

use remora_sim::*;
use std::time::Duration;

/// Sends `remaining` numbered frames, one per microsecond, and records what
/// it receives.
#[derive(Default)]
struct Pinger {
    remaining: u32,
    next_send: Option<Timestamp>,
    sent: u32,
    received: Vec<(Timestamp, Vec<u8>)>,
    frame_bytes: usize,
    interval: Duration,
    /// Keeps its frames to send across a crash, as a host keeps its NIC's
    /// state until it restarts: only the simulator keeps it silent then.
    keeps_state_across_crashes: bool,
    /// Timeouts handled, with their times.
    timeouts_handled: Vec<Timestamp>,
}

impl Pinger {
    fn sending(count: u32) -> Pinger {
        Pinger::burst(count, 1000, Duration::from_micros(1))
    }

    /// `count` frames of `frame_bytes`, `interval` apart (all at once for
    /// zero).
    fn burst(count: u32, frame_bytes: usize, interval: Duration) -> Pinger {
        Pinger {
            remaining: count,
            next_send: Some(Timestamp::ZERO),
            frame_bytes,
            interval,
            ..Pinger::default()
        }
    }
}

impl Node for Pinger {
    fn handle_frame(&mut self, now: Timestamp, _port: PortId, frame: &[u8]) {
        self.received.push((now, frame.to_vec()));
    }

    fn poll_transmit(&mut self, now: Timestamp, buffer: &mut [u8]) -> Option<(PortId, usize)> {
        if self.remaining == 0 || self.next_send? > now {
            return None;
        }
        self.remaining -= 1;
        self.sent += 1;
        let frame = &mut buffer[..self.frame_bytes];
        let numbered = frame.len().min(4);
        frame[..numbered].copy_from_slice(&self.sent.to_be_bytes()[..numbered]);
        frame[numbered..].fill(0xab);
        self.next_send = Some(now.saturating_add(self.interval));
        Some((PortId(0), self.frame_bytes))
    }

    fn poll_timeout(&self) -> Option<Timestamp> {
        (self.remaining > 0).then_some(self.next_send).flatten()
    }

    fn handle_timeout(&mut self, now: Timestamp) {
        self.timeouts_handled.push(now);
    }

    fn crash(&mut self, _now: Timestamp) {
        if !self.keeps_state_across_crashes {
            self.remaining = 0;
        }
    }

    fn restart(&mut self, _now: Timestamp) {}
}

fn pair(seed: u64, faults: LinkFaults, count: u32) -> (Simulation<Pinger>, NodeId, NodeId, LinkId) {
    let mut sim = Simulation::new(seed);
    let sender = sim.add_node(Pinger::sending(count));
    let receiver = sim.add_node(Pinger::default());
    let mut config = LinkConfig::rack();
    config.faults = faults;
    let link = sim.connect((sender, PortId(0)), (receiver, PortId(0)), config);
    (sim, sender, receiver, link)
}

fn noisy() -> LinkFaults {
    LinkFaults {
        loss: Probability::literal(0.1),
        duplicate: Probability::literal(0.05),
        reorder: Probability::literal(0.2),
        reorder_delay: Duration::from_micros(5),
        corrupt: Probability::literal(0.05),
    }
}

#[test]
fn one_seed_gives_one_run() {
    let run = |seed| {
        let (mut sim, _, receiver, _) = pair(seed, noisy(), 2000);
        sim.run_until(Timestamp::from_nanos(u64::MAX), 1_000_000);
        sim.node(receiver).received.clone()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7), run(8));
}

#[test]
fn faults_happen_at_their_configured_rates() {
    let (mut sim, _, receiver, link) = pair(1, noisy(), 20_000);
    let outcome = sim.run_until(Timestamp::from_nanos(u64::MAX), 10_000_000);
    assert!(outcome.quiesced);
    let [forward, _] = sim.link_counters(link);
    let rate = |count: u64| count as f64 / forward.frames_offered as f64;
    assert_eq!(forward.frames_offered, 20_000);
    assert!(
        (rate(forward.lost) - 0.1).abs() < 0.01,
        "loss {}",
        rate(forward.lost)
    );
    assert!((rate(forward.duplicated) - 0.045).abs() < 0.01);
    assert!((rate(forward.corrupted) - 0.045).abs() < 0.01);
    let received = &sim.node(receiver).received;
    assert_eq!(
        received.len() as u64,
        forward.frames_delivered + forward.duplicated
    );
    // Bits flipped in the 0xab body; a duplicate of a damaged frame is
    // delivered damaged too, hence up to twice the counted corruptions.
    let flipped_bits: Vec<u32> = received
        .iter()
        .map(|(_, frame)| {
            frame[4..]
                .iter()
                .map(|byte| (byte ^ 0xab).count_ones())
                .sum()
        })
        .filter(|bits| *bits > 0)
        .collect();
    assert!(!flipped_bits.is_empty());
    assert!(
        flipped_bits.iter().all(|bits| *bits == 1),
        "corruption flips exactly one bit"
    );
    assert!(flipped_bits.len() as u64 <= 2 * forward.corrupted);
    let reordered = received
        .windows(2)
        .filter(|pair| pair[0].1[..4] > pair[1].1[..4])
        .count();
    assert!(reordered > 0, "reordering lets later frames overtake");
}

#[test]
fn bandwidth_and_delay_set_arrival_times() {
    let (mut sim, _, receiver, _) = pair(3, LinkFaults::NONE, 1);
    sim.run_until(Timestamp::from_nanos(u64::MAX), 100);
    // 1000 bytes at 100 Gb/s is 80 ns on the wire, then 1 us of propagation.
    assert_eq!(
        sim.node(receiver).received[0].0,
        Timestamp::from_nanos(1080)
    );
}

#[test]
fn partitions_drop_and_heal() {
    let (mut sim, _, receiver, link) = pair(4, LinkFaults::NONE, 100);
    sim.schedule(Timestamp::from_nanos(10_500), Event::Partition(link));
    sim.schedule(Timestamp::from_nanos(20_500), Event::Heal(link));
    sim.run_until(Timestamp::from_nanos(u64::MAX), 100_000);
    // The ten frames sent while cut, and the one sent at 10 us that was on
    // the wire when the cut came.
    assert_eq!(sim.link_counters(link)[0].partition_drops, 11);
    assert_eq!(sim.node(receiver).received.len(), 89);
}

/// A partition let the frames already on the wire through: a link down
/// delivered what it carried when it went down.
#[test]
fn a_partition_loses_the_frames_on_the_wire_even_if_it_heals_first() {
    let (mut sim, _, receiver, link) = pair(4, LinkFaults::NONE, 100);
    // The frame sent at 10 us arrives at about 11.1 us.
    sim.schedule(Timestamp::from_nanos(10_500), Event::Partition(link));
    sim.schedule(Timestamp::from_nanos(10_600), Event::Heal(link));
    sim.run_until(Timestamp::from_nanos(u64::MAX), 100_000);
    let counters = sim.link_counters(link)[0];
    assert_eq!(counters.partition_drops, 1);
    assert_eq!(counters.frames_delivered, 99);
    assert_eq!(sim.node(receiver).received.len(), 99);
}

/// A frame and its duplicate both on the wire when a cut came were
/// counted as two frames lost and two fewer delivered: the counts no
/// longer added up (and the first frame of a direction underflowed).
/// The copy's loss takes back its count as a duplicate.
#[test]
fn a_cut_duplicate_is_counted_once_as_a_duplicate() {
    let faults = LinkFaults {
        duplicate: Probability::literal(1.0),
        reorder_delay: Duration::from_nanos(200),
        ..LinkFaults::NONE
    };
    let (mut sim, _, receiver, link) = pair(4, faults, 100);
    sim.schedule(Timestamp::from_nanos(10_500), Event::Partition(link));
    sim.schedule(Timestamp::from_nanos(10_600), Event::Heal(link));
    sim.run_until(Timestamp::from_nanos(u64::MAX), 100_000);
    let counters = sim.link_counters(link)[0];
    assert_eq!(counters.frames_offered, 100);
    assert_eq!(counters.partition_drops, 1, "{counters:?}");
    assert_eq!(
        counters.frames_offered,
        counters.frames_delivered + counters.partition_drops,
        "{counters:?}"
    );
    let received = sim.node(receiver).received.len() as u64;
    assert_eq!(
        received,
        counters.frames_delivered + counters.duplicated,
        "{counters:?}"
    );
}

/// Two nodes that both send `count` frames, one a microsecond.
fn two_senders(seed: u64, count: u32) -> (Simulation<Pinger>, [NodeId; 2], LinkId) {
    let mut sim = Simulation::new(seed);
    let left = sim.add_node(Pinger::sending(count));
    let right = sim.add_node(Pinger::sending(count));
    let link = sim.connect((left, PortId(0)), (right, PortId(0)), LinkConfig::rack());
    (sim, [left, right], link)
}

/// The partition test had one sender: a partition that cut one direction
/// only would have passed it.
#[test]
fn a_partition_cuts_both_directions() {
    let (mut sim, nodes, link) = two_senders(4, 100);
    sim.schedule(Timestamp::from_nanos(10_500), Event::Partition(link));
    sim.schedule(Timestamp::from_nanos(20_500), Event::Heal(link));
    sim.run_until(Timestamp::from_nanos(u64::MAX), 100_000);
    for direction in sim.link_counters(link) {
        assert_eq!(direction.partition_drops, 11);
    }
    for node in nodes {
        assert_eq!(sim.node(node).received.len(), 89);
    }
}

/// The crash test's crashed node silenced itself (its crash dropped what
/// it had to send), so deleting the simulator's guards left it passing;
/// and it sent nothing after its restart either. This node keeps its
/// frames and its timer across the crash, as a host keeps its NIC's state
/// until it restarts: the simulator alone keeps it silent and idle while
/// down, and it sends again once up.
#[test]
fn a_crashed_node_sends_nothing_until_it_restarts() {
    let (mut sim, [left, right], _) = two_senders(6, 100);
    sim.node_mut(right).keeps_state_across_crashes = true;
    let crash_at = Timestamp::from_nanos(30_500);
    let restart_at = Timestamp::from_nanos(60_500);
    sim.schedule(crash_at, Event::Crash(right));
    sim.schedule(restart_at, Event::Restart(right));
    sim.run_until(Timestamp::from_nanos(u64::MAX), 100_000);
    // What reached the left node from the crashed one: nothing sent while
    // it was down (a frame in flight at the crash lands a little after).
    let in_flight = Duration::from_micros(2);
    let arrivals: Vec<Timestamp> = sim.node(left).received.iter().map(|(at, _)| *at).collect();
    assert!(arrivals.iter().any(|&at| at < crash_at));
    assert!(
        !arrivals
            .iter()
            .any(|&at| at > crash_at.saturating_add(in_flight) && at < restart_at),
        "the crashed node sent while down"
    );
    assert!(
        arrivals.iter().any(|&at| at > restart_at),
        "the restarted node sent again"
    );
    let timeouts = &sim.node(right).timeouts_handled;
    assert!(
        !timeouts.iter().any(|&at| at > crash_at && at < restart_at),
        "a timeout was handled while the node was down"
    );
}

#[test]
fn a_crashed_node_neither_sends_nor_receives_and_the_liveness_phase_is_clean() {
    let (mut sim, _, receiver, link) = pair(5, noisy(), 100);
    sim.schedule(Timestamp::from_nanos(30_500), Event::Crash(receiver));
    sim.run_until(Timestamp::from_nanos(50_000), 100_000);
    assert!(sim.is_crashed(receiver));
    assert!(sim.dropped_at_crashed_nodes() > 0);
    sim.stop_faults();
    assert!(
        !sim.is_crashed(receiver),
        "stopping faults restarts crashed nodes"
    );
    let lost_before = sim.link_counters(link)[0].lost;
    let outcome = sim.run_until(Timestamp::from_nanos(u64::MAX), 100_000);
    assert!(outcome.quiesced);
    assert_eq!(
        sim.link_counters(link)[0].lost,
        lost_before,
        "no faults in the liveness phase"
    );
}

/// A 62-byte frame takes 4.96 ns at 100 Gb/s; timed in whole nanoseconds,
/// each took 4, and small frames got a fifth more bandwidth than the link
/// has.
#[test]
fn back_to_back_small_frames_take_their_exact_share_of_the_wire() {
    let mut sim = Simulation::new(1);
    let sender = sim.add_node(Pinger::burst(1000, 62, Duration::ZERO));
    let receiver = sim.add_node(Pinger::default());
    let config = LinkConfig {
        bandwidth_bits_per_second: 100_000_000_000,
        propagation_delay: Duration::ZERO,
        queue_limit_bytes: 1 << 20,
        faults: LinkFaults::NONE,
    };
    sim.connect((sender, PortId(0)), (receiver, PortId(0)), config);
    sim.run_until(Timestamp::from_nanos(1_000_000), 1_000_000);
    let received = &sim.node(receiver).received;
    assert_eq!(received.len(), 1000);
    let last = received.last().unwrap().0.as_nanos();
    assert!(
        (4_959..=4_961).contains(&last),
        "the last arrived at {last} ns"
    );
}

/// An empty frame on a corrupting link: the bit to flip was drawn from
/// its first byte, which it does not have, and the simulator panicked.
#[test]
fn an_empty_frame_on_a_corrupting_link_arrives_untouched() {
    let mut sim = Simulation::new(3);
    let sender = sim.add_node(Pinger::burst(10, 0, Duration::from_micros(1)));
    let receiver = sim.add_node(Pinger::default());
    let mut config = LinkConfig::rack();
    config.faults = LinkFaults {
        corrupt: Probability::literal(1.0),
        ..LinkFaults::NONE
    };
    sim.connect((sender, PortId(0)), (receiver, PortId(0)), config);
    sim.run_until(Timestamp::from_nanos(1_000_000), 1_000_000);
    let received = &sim.node(receiver).received;
    assert_eq!(received.len(), 10);
    assert!(received.iter().all(|(_, frame)| frame.is_empty()));
}

/// A duplicate landed at the same instant as its original, so no copy
/// ever came after the receiver had moved on to later frames.
#[test]
fn a_duplicate_can_land_after_later_frames() {
    let faults = LinkFaults {
        duplicate: Probability::ONE,
        reorder_delay: Duration::from_micros(5),
        ..LinkFaults::NONE
    };
    let (mut sim, _, receiver, _) = pair(8, faults, 100);
    sim.run_until(Timestamp::from_nanos(u64::MAX), 100_000);
    let numbers: Vec<u32> = sim
        .node(receiver)
        .received
        .iter()
        .map(|(_, frame)| u32::from_be_bytes(frame[..4].try_into().unwrap()))
        .collect();
    assert_eq!(numbers.len(), 200, "every frame twice");
    let late_copies = numbers
        .iter()
        .enumerate()
        .filter(|(at, number)| numbers[..*at].iter().any(|earlier| earlier > number))
        .count();
    assert!(
        late_copies > 50,
        "{late_copies} of 100 copies came after a later frame"
    );
}
