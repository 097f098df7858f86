//! The embedded rack spread over several fabric threads: the switch on one,
//! hosts dealt out over the others, each ring waking the thread that
//! consumes it. On this 2-core machine the threads take turns, so this
//! checks behaviour, not speed: every transfer completes and the bytes
//! arrive, across the switch and across a DPU's local link, on each
//! carrier that uses rings.

mod common;

use common::{connect, Connection};
use remora_rack::assembly::{EmbeddedCarrier, EmbeddedRack, FabricThreads, RackBuilder};
use remora_rack::endpoint::{lock, RACK_ACK_TIMEOUT};
use remora_rack::topology::{standard_host, HostSpec, Role, Topology};
use remora_rnic::*;
use std::time::{Duration, Instant};

const COMPUTE: usize = 0;
const MEMORY: usize = 1;
const DPU: usize = 2;
const REGION_BYTES: u64 = 1 << 20;
const MESSAGE_BYTES: u32 = 8 * 1024;
const ROUNDS: u64 = 50;

fn topology() -> Topology {
    let mut topology = Topology::compute_and_memory();
    let (mac, address) = standard_host(DPU);
    let mut dpu = HostSpec::new("dpu", Role::Offload, mac, address);
    dpu.attached_to = Some(COMPUTE);
    topology.add_host(dpu).unwrap();
    topology
}

impl Connection {
    /// Posts one request and waits for its completion.
    fn transfer(&self, rack: &EmbeddedRack, operation: SendOperation, local_offset: u64) {
        let element = self.local.slice(local_offset, MESSAGE_BYTES);
        let request = SendRequest::new(local_offset, operation, &[element]).unwrap();
        lock(rack.host(COMPUTE))
            .rnic
            .post_send(self.queue_pair, request)
            .unwrap();
        rack.kick();
        let limit = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(Instant::now() < limit, "no completion in 10 s");
            let completion = lock(rack.host(COMPUTE))
                .rnic
                .poll_completion(self.completion_queue)
                .unwrap();
            if let Some(completion) = completion {
                assert_eq!(completion.status, CompletionStatus::Success);
                return;
            }
            std::thread::yield_now();
        }
    }

    /// Writes a pattern to the peer, reads it back into another buffer,
    /// and compares.
    fn round_trip(&self, rack: &EmbeddedRack, round: u64) {
        let pattern: Vec<u8> = (0..MESSAGE_BYTES as u64)
            .map(|index| (index.wrapping_mul(31) ^ round) as u8)
            .collect();
        let remote_offset = (round * u64::from(MESSAGE_BYTES)) % (REGION_BYTES / 2);
        let write_from = 0;
        let read_into = u64::from(MESSAGE_BYTES);
        lock(rack.host(COMPUTE))
            .rnic
            .write_local(
                self.local.lkey,
                self.local.address.checked_add(write_from).unwrap(),
                &pattern,
            )
            .unwrap();
        let remote = self.remote.remote(remote_offset);
        let write = SendOperation::Write {
            remote,
            immediate: None,
        };
        self.transfer(rack, write, write_from);
        self.transfer(rack, SendOperation::Read { remote }, read_into);
        let mut read = vec![0u8; MESSAGE_BYTES as usize];
        lock(rack.host(COMPUTE))
            .rnic
            .read_local(
                self.local.lkey,
                self.local.address.checked_add(read_into).unwrap(),
                &mut read,
            )
            .unwrap();
        assert_eq!(read, pattern, "round {round}");
    }
}

fn run(threads: usize, carrier: EmbeddedCarrier) {
    let topology = topology();
    let mut stage = RackBuilder::new(&topology)
        .thread_name("spread")
        .carrier(carrier)
        .fabric_threads(FabricThreads::Exactly(threads))
        .build()
        .unwrap();
    let to_memory = connect(
        &mut stage,
        (COMPUTE, MEMORY),
        REGION_BYTES,
        RACK_ACK_TIMEOUT,
    );
    let to_dpu = connect(&mut stage, (COMPUTE, DPU), REGION_BYTES, RACK_ACK_TIMEOUT);
    let switch = stage.l2l3_switch();
    let (mut rack, _switch) = stage.start(switch).unwrap();
    assert_eq!(rack.fabric().thread_count(), threads);
    for round in 0..ROUNDS {
        to_memory.round_trip(&rack, round);
        to_dpu.round_trip(&rack, round);
    }
    rack.stop_and_join().unwrap();
    let report = rack.switch_report();
    assert_eq!(
        report.ports[DPU].frames_received, 0,
        "the DPU's traffic took its local link"
    );
    assert!(report.ports[MEMORY].frames_received >= 2 * ROUNDS);
}

#[test]
fn one_fabric_thread_carries_every_transfer() {
    run(1, EmbeddedCarrier::InProcess);
}

#[test]
fn two_fabric_threads_carry_every_transfer() {
    run(2, EmbeddedCarrier::InProcess);
}

#[test]
fn three_fabric_threads_carry_every_transfer_over_shared_memory() {
    run(3, EmbeddedCarrier::SharedMemory);
}

#[test]
fn four_fabric_threads_for_three_hosts_are_four() {
    run(4, EmbeddedCarrier::InProcess);
}

#[test]
fn a_thread_count_is_at_least_one_and_at_most_one_per_host_and_the_switch() {
    assert_eq!(FabricThreads::Exactly(0).resolve(3), 1);
    assert_eq!(FabricThreads::Exactly(9).resolve(3), 4);
    assert!(FabricThreads::Auto.resolve(3) >= 1);
}

/// Frames queued in the switch behind a full ring: the ring's reader on
/// another fabric thread frees slots without ringing the switch, so the
/// switch must look again by itself. It named no deadline, and slept up to
/// its longest block (50 ms) with frames waiting.
#[test]
fn a_switch_holding_frames_for_a_full_ring_names_a_deadline() {
    use remora_carrier::{Port, Segment, SegmentPlan};
    use remora_rack::endpoint::{Pump, RackClock, SwitchEndpoint};
    use remora_switch::two_hosts;
    const DEPTH: u32 = 4;
    let segment = Segment::anonymous(&SegmentPlan::star_one_waiter(2, DEPTH)).unwrap();
    let mut source = segment.spoke_port(1).unwrap();
    let switch_ports: Vec<Box<dyn Port>> = vec![
        Box::new(segment.hub_port(1).unwrap()),
        Box::new(segment.hub_port(2).unwrap()),
    ];
    let mut switch = SwitchEndpoint::new(two_hosts::two_host_switch(), switch_ports);
    let clock = RackClock::new();
    assert_eq!(switch.deadline(&clock), None, "an idle switch has no timer");
    // Two rings' worth, a ring at a time: the sink never reads.
    for round in 0..2 {
        for sequence in round * DEPTH..(round + 1) * DEPTH {
            let frame = two_hosts::send_frame(two_hosts::SMALL_PAYLOAD_BYTES, sequence);
            source.send(&frame).unwrap();
        }
        source.flush().unwrap();
        switch.pump(&clock).unwrap();
    }
    assert!(switch.switch.queued_frames() > 0, "the sink's ring is full");
    let deadline = switch.deadline(&clock).expect("a deadline to look again");
    assert!(deadline <= Instant::now() + Duration::from_millis(1));
}

/// A pump whose first turn fails, and one that never has work.
/// How a test pump behaves.
#[derive(Clone, Copy, Debug)]
enum Behaviour {
    Healthy,
    Fails,
    Panics,
}

struct Failing(Behaviour);

impl remora_rack::endpoint::Pump for Failing {
    fn pump(
        &mut self,
        _: &remora_rack::endpoint::RackClock,
    ) -> Result<bool, remora_rack::RackError> {
        match self.0 {
            Behaviour::Healthy => Ok(false),
            Behaviour::Fails => Err(remora_rack::RackError::Launch("a carrier broke".into())),
            Behaviour::Panics => panic!("an agent's invariant broke"),
        }
    }
    fn deadline(&self, _: &remora_rack::endpoint::RackClock) -> Option<Instant> {
        None
    }
    fn has_frames(&mut self) -> bool {
        false
    }
    fn wait_sources(&self) -> Vec<remora_carrier::WaitSource> {
        Vec::new()
    }
}

/// A fabric thread that failed left the rack's stop flag down (only its
/// owner's stop set it) and the fabric's other threads running: workloads
/// beside it waited out their own timeouts. Its end now raises the flag
/// and stops the rest of the fabric. So does one that panicked, which
/// unwound past the signal given after its driver returned.
#[test]
fn a_failed_fabric_thread_raises_the_racks_stop_flag_and_stops_the_fabric() {
    use remora_rack::endpoint::{Driver, FabricThread, RackClock};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    for failure in [Behaviour::Fails, Behaviour::Panics] {
        let driver_stop = Arc::new(AtomicBool::new(false));
        let driver = |behaviour| {
            let pump: Arc<Mutex<dyn remora_rack::endpoint::Pump>> =
                Arc::new(Mutex::new(Failing(behaviour)));
            Driver::new(vec![pump], RackClock::new(), Arc::clone(&driver_stop)).unwrap()
        };
        let rack_stop = Arc::new(AtomicBool::new(false));
        let fabric = FabricThread::start(
            "failing-fabric",
            vec![driver(Behaviour::Healthy), driver(failure)],
            Arc::clone(&driver_stop),
            false,
        )
        .unwrap()
        .stopping_rack(&rack_stop);
        let started = Instant::now();
        while !rack_stop.load(Ordering::Relaxed) {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{failure:?}: the stop flag stayed down"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            driver_stop.load(Ordering::Relaxed),
            "{failure:?}: the fabric's healthy thread was told to stop"
        );
        assert!(
            fabric.stop_and_join().is_err(),
            "{failure:?}: the failure is returned"
        );
    }
}

/// A ring port with the quirks of a wrapped carrier: one held frame (as
/// a shaping or fault delay line holds one) that leaves at the first
/// flush once it is due, and sends it may refuse for want of room after
/// saying it had some (as a fault line does when its held frames took the
/// last slot).
struct QuirkyPort {
    inner: remora_carrier::RingPort,
    due: Option<Instant>,
    refuses_sends: bool,
}

impl remora_carrier::Port for QuirkyPort {
    fn receive(
        &mut self,
        max_frames: usize,
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, remora_carrier::CarrierError> {
        self.inner.receive(max_frames, sink)
    }
    fn send(
        &mut self,
        frame: &[u8],
    ) -> Result<remora_carrier::SendStatus, remora_carrier::CarrierError> {
        if self.refuses_sends {
            return Ok(remora_carrier::SendStatus::DroppedNoRoom);
        }
        self.inner.send(frame)
    }
    fn flush(&mut self) -> Result<(), remora_carrier::CarrierError> {
        if self.due.is_some_and(|due| due <= Instant::now()) {
            self.due = None;
        }
        self.inner.flush()
    }
    fn has_room(&mut self) -> bool {
        self.refuses_sends || self.inner.has_room()
    }
    fn has_frames(&mut self) -> bool {
        self.inner.has_frames()
    }
    fn wait_source(&self) -> remora_carrier::WaitSource {
        self.inner.wait_source()
    }
    fn next_due(&self) -> Option<Instant> {
        self.due
    }
}

/// A lone node (10.0.0.2) on a [`QuirkyPort`] with these quirks.
fn node_on_a_quirky_port(
    name: &str,
    due: Option<Instant>,
    refuses_sends: bool,
) -> remora_rack::endpoint::NodeEndpoint {
    use remora_carrier::{Segment, SegmentPlan};
    use remora_wire::{Ipv4Address, MacAddress};
    let segment = Segment::anonymous(&SegmentPlan::star(1, 4)).unwrap();
    let config = RnicConfig::new(
        MacAddress([2, 0, 0, 0, 0, 2]),
        Ipv4Address::new(10, 0, 0, 2),
        9,
    );
    let port = QuirkyPort {
        // The port keeps the segment's mapping.
        inner: segment.spoke_port(1).unwrap(),
        due,
        refuses_sends,
    };
    remora_rack::endpoint::NodeEndpoint::new(name, SoftRnic::new(config), Box::new(port))
}

/// A crashed host never flushed its ports, while its deadline still named
/// the frames they held: the deadline stayed in the past, and its fabric
/// thread spun at full speed until the host came back (found by reading).
/// Frames already on the wire leave now, as on a real link.
#[test]
fn a_crashed_host_lets_held_frames_leave_and_its_deadline_moves_on() {
    use remora_rack::endpoint::{Pump, RackClock};
    let due = Instant::now().checked_sub(Duration::from_millis(1));
    let mut node = node_on_a_quirky_port("crashed", due, false);
    let clock = RackClock::new();
    node.crash();
    node.pump(&clock).unwrap();
    // The held frame left: nothing is due any more.
    let deadline = node.deadline(&clock);
    assert!(deadline.is_none(), "a frame is still held: {deadline:?}");
}

/// A frame the node's carrier refused for want of room was lost without a
/// count, while its NIC counted it transmitted (found by reading).
#[test]
fn a_frame_a_carrier_refuses_for_want_of_room_is_counted() {
    use remora_rack::endpoint::{Pump, RackClock};
    let mut node = node_on_a_quirky_port("refused", None, true);
    post_one_send(&mut node);
    node.pump(&RackClock::new()).unwrap();
    assert_eq!(node.frames_dropped_no_room(), 1);
}

/// A frame the NIC sent up a cut uplink vanished with no count anywhere,
/// where the simulator counts it a partition drop.
#[test]
fn a_frame_sent_up_a_cut_uplink_is_counted() {
    use remora_rack::endpoint::{Pump, RackClock};
    let mut node = node_on_a_quirky_port("cut", None, false);
    node.set_partitioned(true);
    post_one_send(&mut node);
    node.pump(&RackClock::new()).unwrap();
    assert_eq!(node.frames_lost_to_partition(), 1);
    assert_eq!(node.frames_dropped_no_room(), 0);
}

/// Posts one SEND of 64 bytes on a queue pair of `node` connected to a
/// peer that is not there.
fn post_one_send(node: &mut remora_rack::endpoint::NodeEndpoint) {
    use remora_rack::endpoint::rack_queue_pair;
    use remora_wire::{Ipv4Address, MacAddress, Psn, Qpn};
    let pd = node.rnic.alloc_protection_domain().unwrap();
    let cq = node.rnic.create_completion_queue(8).unwrap();
    let region = node.rnic.register_memory(pd, 64, AccessFlags::ALL).unwrap();
    let prepared = node
        .rnic
        .create_queue_pair(&rack_queue_pair(pd, cq))
        .unwrap();
    let peer = QueuePairEndpoint {
        qpn: Qpn::new(0x200).unwrap(),
        address: Ipv4Address::new(10, 0, 0, 3),
        mac: MacAddress([2, 0, 0, 0, 0, 3]),
        initial_psn: Psn::new(1),
    };
    let queue_pair = node.rnic.handshake(prepared, peer).unwrap();
    let request = SendRequest::new(
        1,
        SendOperation::Send { immediate: None },
        &[region.slice(0, 64)],
    )
    .unwrap();
    node.rnic.post_send(queue_pair, request).unwrap();
}
