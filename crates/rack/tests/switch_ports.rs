//! A switch port taken out of service (a corrupt ring from a broken peer
//! process, a socket error) stays out of the way: it neither keeps the
//! switch's thread awake nor holds frames bound for it.

use remora_carrier::{CarrierError, Port, Segment, SegmentPlan, SendStatus, WaitSource};
use remora_rack::endpoint::{Pump, RackClock, SwitchEndpoint};
use remora_switch::two_hosts;

/// A peer's ring gone corrupt: every receive fails, it always says frames
/// wait, and it never has room.
struct CorruptRing(Segment);

impl Port for CorruptRing {
    fn receive(&mut self, _: usize, _: &mut dyn FnMut(&[u8])) -> Result<usize, CarrierError> {
        Err(CarrierError::Segment("the tail ran past the head".into()))
    }
    fn send(&mut self, _: &[u8]) -> Result<SendStatus, CarrierError> {
        Ok(SendStatus::DroppedNoRoom)
    }
    fn flush(&mut self) -> Result<(), CarrierError> {
        Ok(())
    }
    fn has_room(&mut self) -> bool {
        false
    }
    fn has_frames(&mut self) -> bool {
        true
    }
    fn wait_source(&self) -> WaitSource {
        self.0.hub_port(2).unwrap().wait_source()
    }
}

/// A port out of service still said it held frames, so the fabric thread
/// never slept, and frames bound for it waited in its egress queue for
/// ever, so the switch retried every 50 µs. Now neither.
#[test]
fn a_failed_port_neither_wakes_the_switch_nor_holds_its_frames() {
    let segment = Segment::anonymous(&SegmentPlan::star_one_waiter(2, 64)).unwrap();
    let mut source = segment.spoke_port(1).unwrap();
    let ports: Vec<Box<dyn Port>> = vec![
        Box::new(segment.hub_port(1).unwrap()),
        Box::new(CorruptRing(
            Segment::anonymous(&SegmentPlan::star(2, 8)).unwrap(),
        )),
    ];
    let mut switch = SwitchEndpoint::new(two_hosts::two_host_switch(), ports);
    let clock = RackClock::new();
    // The port fails at the first pump; frames for it come after.
    switch.pump(&clock).unwrap();
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
    switch.pump(&clock).unwrap();
    assert!(
        !switch.has_frames(),
        "the failed port keeps the thread awake"
    );
    assert_eq!(switch.switch.queued_frames(), 0);
    assert_eq!(switch.health().frames_discarded, 8);
    assert_eq!(switch.deadline(&clock), None, "nothing to retry");
}
