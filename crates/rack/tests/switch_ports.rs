//! A switch port taken out of service (a corrupt ring from a broken peer
//! process, a socket error) stays out of the way: it neither keeps the
//! switch's thread awake nor holds frames bound for it.

use remora_carrier::{CarrierError, Port, Segment, SegmentPlan, SendStatus, WaitSource};
use remora_rack::endpoint::{Pump, RackClock, SwitchEndpoint};
use remora_switch::programs::L2L3Forwarding;
use remora_switch::two_hosts;

/// A peer's ring gone corrupt: every receive fails and it always says
/// frames wait. With no `room`, it never has any; with room, it takes
/// every frame (into a ring nobody reads).
struct CorruptRing {
    segment: Segment,
    room: bool,
    /// When a frame it holds (in a delay line) falls due, if one does.
    due: Option<std::time::Instant>,
}

impl Port for CorruptRing {
    fn receive(&mut self, _: usize, _: &mut dyn FnMut(&[u8])) -> Result<usize, CarrierError> {
        Err(CarrierError::Segment("the tail ran past the head".into()))
    }
    fn send(&mut self, _: &[u8]) -> Result<SendStatus, CarrierError> {
        Ok(match self.room {
            true => SendStatus::Queued,
            false => SendStatus::DroppedNoRoom,
        })
    }
    fn flush(&mut self) -> Result<(), CarrierError> {
        Ok(())
    }
    fn has_room(&mut self) -> bool {
        self.room
    }
    fn has_frames(&mut self) -> bool {
        true
    }
    fn wait_source(&self) -> WaitSource {
        self.segment.hub_port(2).unwrap().wait_source()
    }
    fn next_due(&self) -> Option<std::time::Instant> {
        self.due
    }
}

/// A switch whose second port is a corrupt ring (with or without room),
/// and the first host's end of the first port.
fn switch_with_a_corrupt_port(room: bool) -> (SwitchEndpoint<L2L3Forwarding>, Segment) {
    switch_with_a_corrupt_port_holding(room, None)
}

fn switch_with_a_corrupt_port_holding(
    room: bool,
    due: Option<std::time::Instant>,
) -> (SwitchEndpoint<L2L3Forwarding>, Segment) {
    let segment = Segment::anonymous(&SegmentPlan::star_one_waiter(2, 64)).unwrap();
    let ports: Vec<Box<dyn Port>> = vec![
        Box::new(segment.hub_port(1).unwrap()),
        Box::new(CorruptRing {
            segment: Segment::anonymous(&SegmentPlan::star(2, 8)).unwrap(),
            room,
            due,
        }),
    ];
    let switch = SwitchEndpoint::new(two_hosts::two_host_switch(), ports);
    (switch, segment)
}

/// A switch whose second port failed at its first pump, pumped again
/// with eight frames for that port from the first.
fn eight_frames_for_a_failed_port(room: bool, clock: &RackClock) -> SwitchEndpoint<L2L3Forwarding> {
    let (mut switch, segment) = switch_with_a_corrupt_port(room);
    let mut source = segment.spoke_port(1).unwrap();
    switch.pump(clock).unwrap();
    assert!(switch.health().failed[1].is_some());
    for sequence in 0..8 {
        source
            .send(&two_hosts::send_frame(
                two_hosts::SMALL_PAYLOAD_BYTES,
                sequence,
            ))
            .unwrap();
    }
    source.flush().unwrap();
    switch.pump(clock).unwrap();
    switch
}

/// A port out of service still said it held frames, so the fabric thread
/// never slept, and frames bound for it waited in its egress queue for
/// ever, so the switch retried every 50 µs. Now neither.
#[test]
fn a_failed_port_neither_wakes_the_switch_nor_holds_its_frames() {
    let clock = RackClock::new();
    let mut switch = eight_frames_for_a_failed_port(false, &clock);
    assert!(
        !switch.has_frames(),
        "the failed port keeps the thread awake"
    );
    assert_eq!(switch.switch.queued_frames(), 0);
    assert_eq!(switch.health().frames_discarded, 8);
    assert_eq!(switch.deadline(&clock), None, "nothing to retry");
    // Emptied from the queue, they were counted as transmitted.
    let counters = switch.switch.counters();
    assert_eq!((counters.transmitted, counters.dropped_port_failed), (0, 8));
    assert!(switch.switch.check_frame_accounting().is_ok());
}

/// A port out of service whose carrier still had room: frames bound for it
/// went cut-through into its carrier, uncounted (and taken for sent),
/// though the report says such frames are discarded and counted.
#[test]
fn frames_cut_through_to_a_failed_port_are_discarded_and_counted() {
    let clock = RackClock::new();
    let switch = eight_frames_for_a_failed_port(true, &clock);
    assert_eq!(switch.health().frames_discarded, 8);
    // The switch counted them as transmitted: a failed port that seemed
    // to carry every frame sent to it.
    let counters = switch.switch.counters();
    assert_eq!((counters.transmitted, counters.dropped_port_failed), (0, 8));
    assert!(switch.switch.check_frame_accounting().is_ok());
}

/// A failed port whose delay line held a frame: it is never flushed, so
/// the frame's due time stayed in the past, the switch's deadline with it,
/// and its thread never slept.
#[test]
fn a_failed_ports_held_frames_do_not_keep_the_switch_awake() {
    let past = std::time::Instant::now();
    let (mut switch, _segment) = switch_with_a_corrupt_port_holding(false, Some(past));
    let clock = RackClock::new();
    switch.pump(&clock).unwrap();
    assert!(switch.health().failed[1].is_some());
    assert_eq!(switch.deadline(&clock), None, "a failed port's held frame");
}
