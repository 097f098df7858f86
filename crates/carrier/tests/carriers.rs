//! Every carrier moves frames bit for bit, refuses what it must, and the
//! wrappers do what they say.

use remora_carrier::wrappers::{
    CaptureDirection, Captured, Counted, Faulty, LinkShape, PcapSink, Shaped,
};
use remora_carrier::{
    CarrierError, DatagramPort, IdleStrategy, PacketSocketOptions, Port, Segment, SegmentPlan,
    Segmentation, SendStatus, WaitSource, Waiter, MAX_CARRIED_FRAME_BYTES,
};
use remora_sim::LinkFaults;
use remora_sim::Probability;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

fn frame(seed: u8, length: usize) -> Vec<u8> {
    (0..length)
        .map(|index| seed.wrapping_add(index as u8))
        .collect()
}

fn receive_all(port: &mut dyn Port, expected: usize, within: Duration) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    let started = Instant::now();
    while frames.len() < expected && started.elapsed() < within {
        port.receive(64, &mut |bytes| frames.push(bytes.to_vec()))
            .unwrap();
    }
    frames
}

fn exchange(left: &mut dyn Port, right: &mut dyn Port) {
    let sent: Vec<Vec<u8>> = [60, 1000, MAX_CARRIED_FRAME_BYTES]
        .iter()
        .enumerate()
        .map(|(index, length)| frame(index as u8, *length))
        .collect();
    for bytes in &sent {
        assert_eq!(left.send(bytes).unwrap(), SendStatus::Queued);
    }
    left.flush().unwrap();
    assert_eq!(receive_all(right, sent.len(), Duration::from_secs(5)), sent);
    right.send(&sent[0]).unwrap();
    right.flush().unwrap();
    assert_eq!(
        receive_all(left, 1, Duration::from_secs(5)),
        vec![sent[0].clone()]
    );
}

#[test]
fn in_process_rings_carry_frames_both_ways_bit_for_bit() {
    let segment = Segment::anonymous(&SegmentPlan::star(2, 8)).unwrap();
    let mut node = segment.spoke_port(1).unwrap();
    let mut hub = segment.hub_port(1).unwrap();
    exchange(&mut node, &mut hub);
}

#[test]
fn a_ring_end_is_handed_out_once_per_process() {
    let segment = Segment::anonymous(&SegmentPlan::star(1, 8)).unwrap();
    let _node = segment.spoke_port(1).unwrap();
    assert!(segment.spoke_port(1).is_err());
}

#[test]
fn a_shared_segment_cannot_be_shrunk_under_its_peers() {
    let segment = Segment::shared("remora-test", &SegmentPlan::star(1, 4)).unwrap();
    let file = std::fs::File::from(rustix::io::dup(segment.shared_fd().unwrap()).unwrap());
    assert!(
        file.set_len(16).is_err(),
        "the memfd is sealed against shrinking"
    );
}

#[test]
fn a_full_ring_drops_and_says_so_and_frames_stay_invisible_until_flushed() {
    let segment = Segment::anonymous(&SegmentPlan::star(1, 4)).unwrap();
    let mut node = segment.spoke_port(1).unwrap();
    let mut hub = segment.hub_port(1).unwrap();
    for index in 0..4 {
        assert_eq!(node.send(&frame(index, 64)).unwrap(), SendStatus::Queued);
    }
    assert!(!node.has_room());
    assert_eq!(node.send(&frame(9, 64)).unwrap(), SendStatus::DroppedNoRoom);
    assert!(!hub.has_frames(), "nothing is visible before the flush");
    node.flush().unwrap();
    assert_eq!(receive_all(&mut hub, 4, Duration::from_secs(1)).len(), 4);
    assert!(node.has_room(), "consumed slots are free again");
}

#[test]
fn an_oversized_frame_is_a_typed_error() {
    let segment = Segment::anonymous(&SegmentPlan::star(1, 4)).unwrap();
    let mut node = segment.spoke_port(1).unwrap();
    assert!(node.send(&vec![0; MAX_CARRIED_FRAME_BYTES + 1]).is_err());
}

#[test]
fn a_shared_segment_attached_by_descriptor_carries_frames_between_threads() {
    let segment = Segment::shared("remora-test", &SegmentPlan::star(1, 16)).unwrap();
    // What a child process does with its copy of the descriptor.
    let duplicate = rustix::io::dup(segment.shared_fd().unwrap()).unwrap();
    let attached = Segment::attach(duplicate).unwrap();
    let mut hub = segment.hub_port(1).unwrap();
    let node_thread = std::thread::spawn(move || {
        let mut node = attached.spoke_port(1).unwrap();
        let waiter = Waiter::new(&[node.wait_source()]).unwrap();
        // Echo 100 frames back, sleeping on the doorbell when idle.
        let mut echoed = 0;
        let mut idle_since = Instant::now();
        while echoed < 100 {
            let mut batch = Vec::new();
            node.receive(16, &mut |bytes| batch.push(bytes.to_vec()))
                .unwrap();
            if batch.is_empty() {
                IdleStrategy::DEFAULT.idle(&waiter, idle_since, None, &mut || node.has_frames());
                continue;
            }
            idle_since = Instant::now();
            for bytes in batch {
                node.send(&bytes).unwrap();
                echoed += 1;
            }
            node.flush().unwrap();
        }
    });
    for index in 0..100u8 {
        let bytes = frame(index, 100 + usize::from(index));
        hub.send(&bytes).unwrap();
        hub.flush().unwrap();
        assert_eq!(
            receive_all(&mut hub, 1, Duration::from_secs(5)),
            vec![bytes]
        );
        // Let the echo side fall asleep now and then, so the doorbell path runs.
        if index % 25 == 0 {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    node_thread.join().unwrap();
}

fn memfd(sealed: bool) -> rustix::fd::OwnedFd {
    let fd =
        rustix::fs::memfd_create("not-a-segment", rustix::fs::MemfdFlags::ALLOW_SEALING).unwrap();
    rustix::fs::ftruncate(&fd, 1 << 20).unwrap();
    if sealed {
        let seals = rustix::fs::SealFlags::SHRINK | rustix::fs::SealFlags::GROW;
        rustix::fs::fcntl_add_seals(&fd, seals).unwrap();
    }
    fd
}

#[test]
fn attaching_something_that_is_not_a_segment_is_refused() {
    let error = Segment::attach(memfd(true)).err().expect("refused");
    assert!(
        error.to_string().contains("not a Remora segment"),
        "{error}"
    );
}

/// A segment its maker can still shrink could turn the attacher's next
/// ring access into SIGBUS; the maker seals its own, and an attacher now
/// refuses one that is not sealed.
#[test]
fn a_segment_not_sealed_against_resizing_is_refused() {
    let error = Segment::attach(memfd(false)).err().expect("refused");
    assert!(error.to_string().contains("not sealed"), "{error}");
}

/// Found by the `segment_attach` fuzz target: a segment whose header says
/// it has no rings made `spoke_port` index past its bookkeeping.
#[test]
fn ports_on_rings_a_segment_does_not_have_are_refused() {
    let segment = Segment::shared("remora-test", &SegmentPlan::star(1, 4)).unwrap();
    let file = std::fs::File::from(rustix::io::dup(segment.shared_fd().unwrap()).unwrap());
    // The header's ring count (after magic, version and doorbell count).
    std::os::unix::fs::FileExt::write_all_at(&file, &0u32.to_le_bytes(), 16).unwrap();
    drop(segment);
    let attached = Segment::attach(file.into()).unwrap();
    assert!(attached.spoke_port(1).is_err());
    assert!(attached.hub_port(1).is_err());
    assert!(attached.spoke_port(0).is_err());
}

fn udp_pair() -> (DatagramPort, DatagramPort) {
    let left = UdpSocket::bind("127.0.0.1:0").unwrap();
    let right = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (left_address, right_address) = (left.local_addr().unwrap(), right.local_addr().unwrap());
    (
        DatagramPort::udp_on(left, right_address).unwrap(),
        DatagramPort::udp_on(right, left_address).unwrap(),
    )
}

#[test]
fn the_udp_tunnel_carries_one_frame_per_datagram_in_batches() {
    let (mut left, mut right) = udp_pair();
    exchange(&mut left, &mut right);
    for index in 0..100u8 {
        left.send(&frame(index, 200)).unwrap();
    }
    left.flush().unwrap();
    let received = receive_all(&mut right, 100, Duration::from_secs(5));
    assert_eq!(received.len(), 100);
    assert!(received
        .iter()
        .enumerate()
        .all(|(index, bytes)| *bytes == frame(index as u8, 200)));
}

/// Frame sizes that make runs of every shape: long equal runs (cut at the
/// batch), a run ending in a shorter frame, a longer frame starting a new
/// run, lone frames between runs.
fn mixed_sizes() -> Vec<usize> {
    let mut sizes = vec![1000; 40];
    sizes.extend([300, 4150, 4150, 4150, 64, 1000, 999, 999, 70, 4096, 4096]);
    sizes.extend(std::iter::repeat_n(64, 70));
    sizes
}

fn kernel_has_udp_segmentation() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut numbers = release
        .split(|character: char| !character.is_ascii_digit())
        .filter_map(|part| part.parse::<u32>().ok());
    let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    (major, minor) >= (4, 18)
}

#[test]
fn runs_of_equal_frames_leave_segmented_and_arrive_one_per_datagram() {
    for segmented in [true, false] {
        let (left, mut right) = udp_pair();
        let mut left = if segmented {
            left
        } else {
            left.without_segmentation()
        };
        let sizes = mixed_sizes();
        for (index, size) in sizes.iter().enumerate() {
            left.send(&frame(index as u8, *size)).unwrap();
        }
        left.flush().unwrap();
        let received = receive_all(&mut right, sizes.len(), Duration::from_secs(5));
        assert_eq!(received.len(), sizes.len(), "segmented: {segmented}");
        for (index, (bytes, size)) in received.iter().zip(&sizes).enumerate() {
            assert_eq!(
                *bytes,
                frame(index as u8, *size),
                "frame {index}, segmented: {segmented}"
            );
        }
        assert_eq!(left.drops().send_refused, 0);
        let expected = if segmented && kernel_has_udp_segmentation() {
            Segmentation::Offered
        } else {
            Segmentation::Off
        };
        assert_eq!(left.segmentation(), expected);
    }
}

/// An empty frame after a longer one joined its GSO run, where it makes
/// no segment: it vanished, counted sent. It leaves as a datagram of its
/// own.
#[test]
fn an_empty_frame_after_a_longer_one_still_arrives() {
    let (mut left, mut right) = udp_pair();
    left.send(&frame(1, 1000)).unwrap();
    left.send(&[]).unwrap();
    left.send(&frame(2, 1000)).unwrap();
    left.flush().unwrap();
    let received = receive_all(&mut right, 3, Duration::from_secs(5));
    assert_eq!(received, vec![frame(1, 1000), Vec::new(), frame(2, 1000)]);
}

#[test]
fn a_kick_wakes_a_waiter_blocked_on_sockets() {
    let (left, _right) = udp_pair();
    let waiter = Waiter::new(&[left.wait_source()]).unwrap();
    let kicker = waiter.kicker();
    let thread = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        kicker.kick();
    });
    let started = Instant::now();
    waiter.block(Duration::from_secs(10), &mut || false);
    assert!(started.elapsed() < Duration::from_secs(5));
    thread.join().unwrap();
}

#[test]
fn one_endpoint_cannot_mix_rings_and_sockets() {
    let segment = Segment::anonymous(&SegmentPlan::star(1, 4)).unwrap();
    let node = segment.spoke_port(1).unwrap();
    let (left, _right) = udp_pair();
    let sources: Vec<WaitSource> = vec![node.wait_source(), left.wait_source()];
    assert!(Waiter::new(&sources).is_err());
}

#[test]
fn counters_count_frames_bytes_and_drops() {
    let segment = Segment::anonymous(&SegmentPlan::star(1, 2)).unwrap();
    let mut node = Counted::new(segment.spoke_port(1).unwrap());
    let mut hub = Counted::new(segment.hub_port(1).unwrap());
    let (node_counters, hub_counters) = (node.handle(), hub.handle());
    for index in 0..3 {
        node.send(&frame(index, 100)).unwrap();
    }
    node.flush().unwrap();
    receive_all(&mut hub, 2, Duration::from_secs(1));
    let sent = node_counters.snapshot();
    assert_eq!(
        (sent.frames_sent, sent.bytes_sent, sent.dropped_no_room),
        (2, 200, 1)
    );
    let received = hub_counters.snapshot();
    assert_eq!(
        (received.frames_received, received.bytes_received),
        (2, 200)
    );
}

#[test]
fn the_fault_injector_loses_corrupts_and_duplicates_as_configured() {
    let segment = Segment::anonymous(&SegmentPlan::star(3, 64)).unwrap();
    let send_through = |spoke: u32, faults: LinkFaults| {
        let mut node = Faulty::new(segment.spoke_port(spoke).unwrap(), faults, 7);
        let mut hub = segment.hub_port(spoke).unwrap();
        for index in 0..10 {
            node.send(&frame(index, 64)).unwrap();
        }
        node.flush().unwrap();
        (
            receive_all(&mut hub, 20, Duration::from_millis(200)),
            node.counters(),
        )
    };
    let (received, counters) = send_through(
        1,
        LinkFaults {
            loss: Probability::literal(1.0),
            ..LinkFaults::NONE
        },
    );
    assert!(received.is_empty());
    assert_eq!(counters.lost, 10);
    let (received, _) = send_through(
        2,
        LinkFaults {
            corrupt: Probability::literal(1.0),
            ..LinkFaults::NONE
        },
    );
    assert_eq!(received.len(), 10);
    for (index, bytes) in received.iter().enumerate() {
        let flipped: u32 = bytes
            .iter()
            .zip(frame(index as u8, 64))
            .map(|(a, b)| (a ^ b).count_ones())
            .sum();
        assert_eq!(flipped, 1, "exactly one bit flips");
    }
    let (received, _) = send_through(
        3,
        LinkFaults {
            duplicate: Probability::literal(1.0),
            ..LinkFaults::NONE
        },
    );
    assert_eq!(received.len(), 20);
    // A profile with a loss of 2 cannot be made at all: the probability
    // is refused where it is built, before any injector sees it.
    assert!(Probability::new(2.0).is_err());
}

#[test]
fn the_pcap_writer_records_the_exact_bytes() {
    let directory = std::env::temp_dir().join(format!("remora-capture-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let path = directory.join("port.pcap");
    let segment = Segment::anonymous(&SegmentPlan::star(1, 8)).unwrap();
    let sink = PcapSink::create(&path).unwrap();
    let mut node = Captured::new(
        segment.spoke_port(1).unwrap(),
        sink.clone(),
        CaptureDirection::Both,
    );
    let mut hub = segment.hub_port(1).unwrap();
    node.send(&frame(1, 80)).unwrap();
    node.flush().unwrap();
    hub.send(&frame(2, 90)).unwrap();
    hub.flush().unwrap();
    receive_all(&mut node, 1, Duration::from_secs(1));
    sink.flush().unwrap();
    let mut reader = pcap_file::pcap::PcapReader::new(std::fs::File::open(&path).unwrap()).unwrap();
    let mut recorded = Vec::new();
    while let Some(packet) = reader.next_packet() {
        recorded.push(packet.unwrap().data.into_owned());
    }
    assert_eq!(recorded, vec![frame(1, 80), frame(2, 90)]);
    std::fs::remove_dir_all(&directory).unwrap();
}

/// Runs `body` on a thread inside a fresh network namespace holding a veth
/// pair `port0`/`port1`, then removes the namespace. Skips (returns None) without
/// root or iproute2.
fn in_veth_namespace<T: Send + 'static>(body: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let name = format!("remora-carrier-test-{}", std::process::id());
    let ip = |arguments: &[&str]| {
        std::process::Command::new("ip")
            .args(arguments)
            .output()
            .map(|output| output.status.success())
            .unwrap_or(false)
    };
    if !rustix::process::geteuid().is_root() || !ip(&["netns", "add", &name]) {
        eprintln!("skipping: needs root and iproute2");
        return None;
    }
    let configured = ip(&[
        "-n", &name, "link", "add", "name", "port0", "type", "veth", "peer", "name", "port1",
    ]) && ip(&["-n", &name, "link", "set", "dev", "port0", "up"])
        && ip(&["-n", &name, "link", "set", "dev", "port1", "up"]);
    let path = format!("/var/run/netns/{name}");
    let result = configured.then(|| {
        std::thread::spawn(move || {
            let namespace = std::fs::File::open(&path).unwrap();
            rustix::thread::move_into_link_name_space(
                std::os::fd::AsFd::as_fd(&namespace),
                Some(rustix::thread::LinkNameSpaceType::Network),
            )
            .unwrap();
            body()
        })
        .join()
    });
    ip(&["netns", "del", &name]);
    Some(
        result
            .expect("veth setup failed")
            .expect("namespace thread panicked"),
    )
}

/// A promiscuous AF_PACKET port on `interface`.
fn packet_port(interface: &str) -> DatagramPort {
    let options = PacketSocketOptions {
        interface: interface.into(),
        promiscuous: true,
    };
    DatagramPort::packet(&options).unwrap()
}

#[test]
fn af_packet_carries_frames_across_a_veth_pair() {
    let outcome = in_veth_namespace(|| {
        let mut a = packet_port("port0");
        let mut b = packet_port("port1");
        // A frame with its own Ethernet header: dst, src, a local ethertype.
        let mut bytes = vec![0x02, 0, 0, 0, 0, 0xb, 0x02, 0, 0, 0, 0, 0xa, 0x88, 0xb5];
        bytes.extend(frame(3, 200));
        // Veths start dropping until the link is fully up; retry briefly.
        let started = Instant::now();
        let mut received = Vec::new();
        while received.is_empty() && started.elapsed() < Duration::from_secs(5) {
            a.send(&bytes).unwrap();
            a.flush().unwrap();
            std::thread::sleep(Duration::from_millis(10));
            b.receive(64, &mut |frame| {
                if frame[12..14] == [0x88, 0xb5] {
                    received.push(frame.to_vec())
                }
            })
            .unwrap();
        }
        (bytes, received)
    });
    if let Some((bytes, received)) = outcome {
        assert!(!received.is_empty(), "no frame crossed the veth");
        assert_eq!(received[0], bytes);
    }
}

/// A 4 KiB RoCE frame on a veth at the default 1500-byte MTU: the kernel
/// refuses it with EMSGSIZE, which ended the port (a switch port never
/// came back). It is now one dropped frame, counted, and the port sends on.
#[test]
fn af_packet_drops_an_over_mtu_frame_and_sends_on() {
    let outcome = in_veth_namespace(|| {
        let mut port = packet_port("port0");
        let mut large = vec![0x02, 0, 0, 0, 0, 0xb, 0x02, 0, 0, 0, 0, 0xa, 0x88, 0xb5];
        large.extend(frame(4, 4200));
        let mut small = large[..14].to_vec();
        small.extend(frame(5, 200));
        port.send(&large).unwrap();
        let over_mtu = port.flush();
        port.send(&small).unwrap();
        let after = port.flush();
        (over_mtu.is_ok(), after.is_ok(), port.drops().send_refused)
    });
    if let Some((over_mtu, after, refused)) = outcome {
        assert!(over_mtu, "the over-MTU frame failed the port");
        assert!(after, "the port sends on");
        assert_eq!(refused, 1);
    }
}

/// Sends a frame from `from` until `to` receives it (a veth drops while
/// its link comes up), for up to 5 s; whether it arrived.
fn crosses(from: &mut DatagramPort, to: &mut DatagramPort, bytes: &[u8]) -> bool {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        from.send(bytes).unwrap();
        from.flush().unwrap();
        std::thread::sleep(Duration::from_millis(10));
        let mut arrived = false;
        to.receive(64, &mut |frame| arrived |= frame == bytes)
            .unwrap();
        if arrived {
            return true;
        }
    }
    false
}

fn run(command: &[&str]) {
    let status = std::process::Command::new(command[0])
        .args(&command[1..])
        .status()
        .unwrap();
    assert!(status.success(), "{command:?}");
}

/// An interface taken down and up again: AF_PACKET sends failed with
/// ENETDOWN while it was down (and one receive reported it after), which
/// ended the port for good, so a switch port never came back. Each is a
/// lost frame now, and the port carries frames again once the link is up.
#[test]
fn af_packet_port_survives_its_interface_going_down_and_up() {
    let outcome = in_veth_namespace(|| {
        let mut a = packet_port("port0");
        let mut b = packet_port("port1");
        let mut bytes = vec![0x02, 0, 0, 0, 0, 0xb, 0x02, 0, 0, 0, 0, 0xa, 0x88, 0xb5];
        bytes.extend(frame(6, 200));
        let before = crosses(&mut a, &mut b, &bytes);
        run(&["ip", "link", "set", "dev", "port0", "down"]);
        a.send(&bytes).unwrap();
        let while_down = a.flush();
        let received_while_down = a.receive(64, &mut |_| {});
        run(&["ip", "link", "set", "dev", "port0", "up"]);
        let after = crosses(&mut a, &mut b, &bytes);
        let refused = a.drops().send_refused;
        (
            before,
            while_down.is_ok(),
            received_while_down.is_ok(),
            after,
            refused,
        )
    });
    if let Some((before, while_down, received_while_down, after, refused)) = outcome {
        assert!(before, "no frame crossed before the link went down");
        assert!(while_down, "a send while the link was down failed the port");
        assert!(
            received_while_down,
            "a receive after the link went down failed the port"
        );
        assert!(after, "no frame crossed after the link came back");
        assert!(refused >= 1, "the frame sent while down was not counted");
    }
}

/// A send that fails the port (here a runt frame, which AF_PACKET refuses
/// with EINVAL) dropped the frames queued behind it without counting them.
#[test]
fn a_send_that_fails_the_port_counts_the_frames_queued_behind_it() {
    let outcome = in_veth_namespace(|| {
        let mut port = packet_port("port0");
        let mut good = vec![0x02, 0, 0, 0, 0, 0xb, 0x02, 0, 0, 0, 0, 0xa, 0x88, 0xb5];
        good.extend(frame(7, 100));
        port.send(&good).unwrap();
        port.send(&good[..5]).unwrap();
        port.send(&good).unwrap();
        port.send(&good).unwrap();
        let flushed = port.flush();
        (flushed.is_err(), port.drops().send_refused)
    });
    if let Some((failed, refused)) = outcome {
        assert!(failed, "the runt frame did not fail the send");
        assert_eq!(refused, 3, "the runt and the two frames behind it");
    }
}

/// A port refused because its receive end was taken kept its send end
/// taken: a later port on that send end was refused as "in use", though no
/// port held it.
#[test]
fn a_refused_port_takes_no_ring_end() {
    let segment = Segment::anonymous(&SegmentPlan::star(2, 8)).unwrap();
    let _first = segment.port(0, 1).unwrap();
    assert!(
        segment.port(2, 1).is_err(),
        "ring 1's consumer end is taken"
    );
    segment
        .port(2, 3)
        .expect("ring 2's producer end is free: the refused port took nothing");
}

/// A frame longer than any carrier takes was held in a delay line and
/// refused when it left: the refusal failed the send (or flush) of a
/// later, valid frame. The wrappers refuse it on entry now.
#[test]
fn an_oversized_frame_is_refused_on_entry_to_a_delay_line_and_costs_no_other_frame() {
    let segment = Segment::anonymous(&SegmentPlan::star(2, 8)).unwrap();
    let shape = LinkShape {
        bandwidth_bits_per_second: 1_000_000_000,
        propagation_delay: Duration::from_millis(5),
        queue_limit_bytes: 1 << 20,
    };
    let reordered = LinkFaults {
        reorder: Probability::literal(1.0),
        reorder_delay: Duration::from_millis(5),
        ..LinkFaults::NONE
    };
    let mut shaped = Shaped::new(segment.spoke_port(1).unwrap(), shape);
    let mut faulty = Faulty::new(segment.spoke_port(2).unwrap(), reordered, 3);
    let oversized = frame(1, MAX_CARRIED_FRAME_BYTES + 1);
    let ports: [&mut dyn Port; 2] = [&mut shaped, &mut faulty];
    for (index, port) in ports.into_iter().enumerate() {
        let refused = port.send(&oversized);
        assert!(
            matches!(refused, Err(CarrierError::FrameTooLarge { .. })),
            "port {index}: {refused:?}"
        );
        port.send(&frame(2, 64)).unwrap();
        std::thread::sleep(Duration::from_millis(10));
        port.flush().unwrap();
        let mut hub = segment.hub_port(index as u32 + 1).unwrap();
        assert_eq!(
            receive_all(&mut hub, 1, Duration::from_secs(1)),
            vec![frame(2, 64)],
            "port {index}"
        );
    }
}

#[test]
fn a_reordered_frame_is_held_says_when_it_falls_due_and_leaves_at_a_flush_after() {
    let segment = Segment::anonymous(&SegmentPlan::star(1, 8)).unwrap();
    let faults = LinkFaults {
        reorder: Probability::literal(1.0),
        reorder_delay: Duration::from_millis(20),
        ..LinkFaults::NONE
    };
    let mut node = Faulty::new(segment.spoke_port(1).unwrap(), faults, 3);
    let mut hub = segment.hub_port(1).unwrap();
    let sent = Instant::now();
    node.send(&frame(1, 64)).unwrap();
    node.flush().unwrap();
    let due = node.next_due().expect("a held frame has a due time");
    assert!(due <= sent + Duration::from_millis(20));
    std::thread::sleep(due.saturating_duration_since(Instant::now()));
    node.flush().unwrap();
    assert_eq!(
        receive_all(&mut hub, 1, Duration::from_secs(1)),
        vec![frame(1, 64)]
    );
    assert!(node.next_due().is_none());
}

/// A port that hands its consumer frames where they lie in its own
/// buffer, as a ring hands them where they lie in a shared segment.
struct InPlace {
    buffer: Vec<u8>,
}

impl Port for InPlace {
    fn receive(
        &mut self,
        _max_frames: usize,
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<usize, remora_carrier::CarrierError> {
        sink(&self.buffer);
        Ok(1)
    }

    fn send(&mut self, _frame: &[u8]) -> Result<SendStatus, remora_carrier::CarrierError> {
        Ok(SendStatus::Queued)
    }

    fn flush(&mut self) -> Result<(), remora_carrier::CarrierError> {
        Ok(())
    }

    fn has_room(&mut self) -> bool {
        true
    }

    fn has_frames(&mut self) -> bool {
        true
    }

    fn wait_source(&self) -> WaitSource {
        WaitSource::Fd(0)
    }
}

/// A ring hands its consumer the frame where it lies, in memory a sibling
/// process can write; `Copied` hands a private copy instead, so a frame
/// rewritten while it is parsed cannot make two reads of one field
/// disagree. The same bytes, never the place they lay.
#[test]
fn a_copied_port_hands_over_private_copies_of_the_same_bytes() {
    use remora_carrier::wrappers::Copied;
    let frame: Vec<u8> = (0..64).collect();
    let in_place = InPlace {
        buffer: frame.clone(),
    };
    // Moving the port does not move its buffer's bytes.
    let shared_at = in_place.buffer.as_ptr() as usize;
    let mut port = Copied::new(in_place);
    let mut seen = Vec::new();
    let mut seen_at = 0usize;
    port.receive(1, &mut |bytes| {
        seen_at = bytes.as_ptr() as usize;
        seen = bytes.to_vec();
    })
    .unwrap();
    assert_eq!(seen, frame);
    assert_ne!(seen_at, shared_at);
}

/// A capture whose disk filled failed the port it watched: the switch then
/// took its ports out of service one by one. The capture now stops, says
/// why, and the port carries on.
#[test]
fn a_full_disk_stops_the_capture_not_the_port() {
    let sink = PcapSink::create(std::path::Path::new("/dev/full")).unwrap();
    let segment = Segment::anonymous(&SegmentPlan::star(1, 64)).unwrap();
    let mut node = Captured::new(
        segment.spoke_port(1).unwrap(),
        sink.clone(),
        CaptureDirection::Both,
    );
    let mut hub = segment.hub_port(1).unwrap();
    let mut carried = 0;
    // 40 frames of 1000 bytes: past the capture's 8 KiB buffer.
    for round in 0..4 {
        for sequence in 0..10 {
            node.send(&frame(round * 10 + sequence, 1000)).unwrap();
        }
        node.flush().unwrap();
        carried += hub.receive(64, &mut |_| {}).unwrap();
    }
    assert_eq!(carried, 40, "the port carried every frame");
    assert!(sink.failure().is_some(), "the capture says it stopped");
}

/// What a link's wrappers and its socket lose reaches the top of the
/// stack, whatever wraps it: boxed as `dyn Port`, a shaped, faulted and
/// counted UDP port once hid every drop below it (the kernel's refusals,
/// the fault line's losses), and the rack reported none (found by
/// reading).
#[test]
fn drops_below_a_stack_of_wrappers_are_reported_at_its_top() {
    let (client, server) = DatagramPort::udp_pair(
        "127.0.0.1:0".parse().unwrap(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .unwrap();
    // Nobody listens any more: the kernel refuses what follows.
    drop(server);
    let mut losing = LinkFaults::NONE;
    losing.loss = Probability::literal(0.5);
    let mut port: Box<dyn Port> = Box::new(Faulty::new(Counted::new(client), losing, 7));
    let started = Instant::now();
    let both_seen =
        |drops: remora_carrier::PortDrops| drops.refused_by_kernel > 0 && drops.lost_to_faults > 0;
    while !both_seen(port.drops()) && started.elapsed() < Duration::from_secs(5) {
        let _ = port.send(&frame(1, 64));
        let _ = port.flush();
        std::thread::sleep(Duration::from_millis(1));
    }
    let drops = port.drops();
    assert!(drops.refused_by_kernel > 0, "{drops:?}");
    assert!(drops.lost_to_faults > 0, "{drops:?}");
    assert_eq!(
        drops.total(),
        drops.refused_by_kernel + drops.lost_to_faults,
        "{drops:?}"
    );
}

/// Two processes given one capture file (a verbs program's two ends, both
/// with `REMORA_VERBS_PCAP` set alike) each truncated it and wrote at its
/// own offsets: the file interleaved two streams' bytes, and tshark found
/// it malformed. The first opener writes the header; the other appends
/// whole records. (Two sinks of one process hold two open files, as two
/// processes do.) A capture opened after both closed starts afresh.
#[test]
fn two_writers_of_one_capture_file_leave_every_record_whole() {
    let directory =
        std::env::temp_dir().join(format!("remora-shared-capture-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let path = directory.join("shared.pcap");
    std::fs::write(&path, b"left from an earlier run").unwrap();
    let first = PcapSink::create(&path).unwrap();
    let second = PcapSink::create(&path).unwrap();
    let mut written = Vec::new();
    for sequence in 0..300u64 {
        let sink = if sequence % 3 == 0 { &second } else { &first };
        let frame = frame(sequence as u8, 60 + (sequence as usize * 37) % 1400);
        sink.write_now(&frame).unwrap();
        written.push(frame);
        if sequence % 50 == 49 {
            second.flush().unwrap();
        }
    }
    drop(first);
    drop(second);
    let read = |path: &std::path::Path| {
        let file = std::fs::File::open(path).unwrap();
        let mut reader = pcap_file::pcap::PcapReader::new(file).unwrap();
        let mut recorded = Vec::new();
        while let Some(packet) = reader.next_packet() {
            recorded.push(packet.unwrap().data.into_owned());
        }
        recorded
    };
    let mut recorded = read(&path);
    assert_eq!(recorded.len(), written.len());
    recorded.sort();
    written.sort();
    assert_eq!(recorded, written, "every record whole, each once");
    let fresh = PcapSink::create(&path).unwrap();
    fresh.write_now(&frame(1, 80)).unwrap();
    drop(fresh);
    assert_eq!(read(&path), vec![frame(1, 80)]);
    // The second opener's records out first: the header, kept in the
    // first's buffer, came after them.
    let first = PcapSink::create(&path).unwrap();
    let second = PcapSink::create(&path).unwrap();
    second.write_now(&frame(2, 90)).unwrap();
    second.flush().unwrap();
    first.write_now(&frame(3, 70)).unwrap();
    drop((first, second));
    assert_eq!(read(&path), vec![frame(2, 90), frame(3, 70)]);
    std::fs::remove_dir_all(&directory).unwrap();
}
