//! The control channel: a real exchange over a Unix socket, refusals, and a
//! client that connects and says nothing cannot hold the server forever.

use remora_carrier::{Segment, SegmentPlan};
use remora_rack::control::{self, ControlAddress, EndpointMessage, MemoryService, Reply, Request};
use remora_rack::endpoint::{rack_queue_pair, Driver, NodeEndpoint, Pump, RackClock};
use remora_rnic::{AccessFlags, RnicConfig, SoftRnic, Verbs};
use remora_wire::{Ipv4Address, MacAddress};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

struct Server {
    address: ControlAddress,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
    _directory: std::path::PathBuf,
}

/// A NIC config for host `last` (10.0.0.`last`), with room for
/// `max_queue_pairs` queue pairs.
fn nic_config(last: u8, max_queue_pairs: usize) -> RnicConfig {
    let mut config = RnicConfig::new(
        MacAddress([2, 0, 0, 0, 0, last]),
        Ipv4Address::new(10, 0, 0, last),
        u64::from(last) + 7,
    );
    config.max_queue_pairs = max_queue_pairs;
    config
}

/// `node` behind a driver (not started): the shared endpoint, the
/// driver's stop flag and the driver.
fn driven(node: NodeEndpoint) -> (Arc<Mutex<NodeEndpoint>>, Arc<AtomicBool>, Driver) {
    let endpoint = Arc::new(Mutex::new(node));
    let stop = Arc::new(AtomicBool::new(false));
    let driver = Driver::new(
        vec![endpoint.clone() as Arc<Mutex<dyn Pump>>],
        RackClock::new(),
        Arc::clone(&stop),
    )
    .unwrap();
    (endpoint, stop, driver)
}

fn memory_server(name: &str) -> Server {
    memory_server_with(name, nic_config(2, 1024))
}

fn memory_server_with(name: &str, config: RnicConfig) -> Server {
    let segment = Segment::anonymous(&SegmentPlan::star(1, 4)).unwrap();
    let mut node = NodeEndpoint::new(
        "memory",
        SoftRnic::new(config),
        Box::new(segment.spoke_port(1).unwrap()),
    );
    let pd = node.rnic.alloc_protection_domain().unwrap();
    let region = node
        .rnic
        .register_memory(pd, 4096, AccessFlags::ALL)
        .unwrap();
    let cq = node.rnic.create_completion_queue(16).unwrap();
    let service = MemoryService {
        builder: rack_queue_pair(pd, cq),
        region,
    };
    let (endpoint, stop, driver) = driven(node);
    let directory =
        std::env::temp_dir().join(format!("remora-control-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&directory).unwrap();
    let address = ControlAddress::Unix(directory.join("memory.sock"));
    let thread = control::serve(
        &address,
        endpoint,
        service,
        driver.kicker(),
        Arc::clone(&stop),
    )
    .unwrap();
    Server {
        address,
        stop,
        thread,
        _directory: directory,
    }
}

fn endpoint_message() -> EndpointMessage {
    EndpointMessage {
        qpn: 0x100,
        address: [10, 0, 0, 1],
        mac: [2, 0, 0, 0, 0, 1],
        initial_psn: 7,
    }
}

#[test]
fn a_client_gets_the_servers_queue_pair_and_region_and_a_bad_qpn_is_refused() {
    let server = memory_server("exchange");
    let never = AtomicBool::new(false);
    let request = Request::Connect {
        client: "c".into(),
        endpoint: endpoint_message(),
    };
    let reply =
        control::request(&server.address, &request, Duration::from_secs(5), &never).unwrap();
    let Reply::Connected { region, .. } = reply else {
        panic!("refused: {reply:?}")
    };
    assert_eq!(region.length_bytes, 4096);
    let bad = Request::Connect {
        client: "c".into(),
        endpoint: EndpointMessage {
            qpn: u32::MAX,
            ..endpoint_message()
        },
    };
    let reply = control::request(&server.address, &bad, Duration::from_secs(5), &never).unwrap();
    assert!(
        matches!(reply, Reply::Refused { ref reason } if reason.contains("out of range")),
        "{reply:?}"
    );
    // QPN 0 is a special queue pair; a 2^31 PSN does not fit 24 bits and
    // was once cut silently.
    for (endpoint, expected) in [
        (
            EndpointMessage {
                qpn: 0,
                ..endpoint_message()
            },
            "reserved",
        ),
        (
            EndpointMessage {
                initial_psn: 1 << 31,
                ..endpoint_message()
            },
            "does not fit 24 bits",
        ),
    ] {
        let request = Request::Connect {
            client: "c".into(),
            endpoint,
        };
        let reply =
            control::request(&server.address, &request, Duration::from_secs(5), &never).unwrap();
        assert!(
            matches!(reply, Reply::Refused { ref reason } if reason.contains(expected)),
            "{reply:?}"
        );
    }
    server.stop.store(true, Ordering::Relaxed);
    server.thread.join().unwrap();
}

#[test]
fn a_silent_client_cannot_hold_the_server_past_its_timeout() {
    let server = memory_server("silent");
    let ControlAddress::Unix(path) = &server.address else {
        unreachable!()
    };
    let _silent = std::os::unix::net::UnixStream::connect(path).unwrap();
    assert_stops_within_8_s(server, "a silent client");
}

/// Stops `server` and waits for its thread, joined on a thread of its
/// own, so a server a client holds for ever fails the test instead of
/// hanging it.
fn assert_stops_within_8_s(server: Server, with: &str) {
    std::thread::sleep(Duration::from_millis(50));
    server.stop.store(true, Ordering::Relaxed);
    let (sender, receiver) = std::sync::mpsc::channel();
    let thread = server.thread;
    std::thread::spawn(move || sender.send(thread.join()));
    receiver
        .recv_timeout(Duration::from_secs(8))
        .unwrap_or_else(|_| panic!("the server did not stop within 8 s with {with}"))
        .unwrap();
}

/// A client sending a byte every second kept each read within its 5 s
/// timeout, so the server (and the node's shutdown) was held until the
/// message limit, hours later. The whole request has one deadline now.
#[test]
fn a_dribbling_client_cannot_hold_the_server_past_its_timeout() {
    use std::io::Write;
    let server = memory_server("dribbling");
    let ControlAddress::Unix(path) = &server.address else {
        unreachable!()
    };
    let mut dribbling = std::os::unix::net::UnixStream::connect(path).unwrap();
    std::thread::spawn(move || {
        for _ in 0..30 {
            if dribbling.write_all(b" ").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });
    assert_stops_within_8_s(server, "a dribbling client");
}

/// A client that sent its request and hung up before the reply: the queue
/// pair made for it stayed, counted as served, and on a NIC with room for
/// one queue pair every later client was refused (found by reading).
#[test]
fn a_client_that_hangs_up_before_its_reply_leaves_no_queue_pair_behind() {
    use std::io::Write;
    let server = memory_server_with("hang-up", nic_config(2, 1));
    let ControlAddress::Unix(path) = &server.address else {
        unreachable!("the test server listens on a Unix socket")
    };
    let mut gone = std::os::unix::net::UnixStream::connect(path).unwrap();
    // Hung up for reading before the request goes: the server's reply
    // then fails whenever it is written.
    gone.shutdown(std::net::Shutdown::Read).unwrap();
    gone.write_all(&request_line("gone")).unwrap();
    drop(gone);
    // The server has read the request and tried to answer before it
    // serves the next client, one at a time.
    assert_the_next_client_connects(server);
}

/// A connection request from `client`, as one line on the wire.
fn request_line(client: &str) -> Vec<u8> {
    let request = Request::Connect {
        client: client.into(),
        endpoint: endpoint_message(),
    };
    let mut line = serde_json::to_vec(&request).unwrap();
    line.push(b'\n');
    line
}

/// The next client of `server` (whose NIC has room for one queue pair)
/// connects, so the one before left none behind; then stops `server`.
fn assert_the_next_client_connects(server: Server) {
    let never = AtomicBool::new(false);
    let request = Request::Connect {
        client: "next".into(),
        endpoint: endpoint_message(),
    };
    let reply =
        control::request(&server.address, &request, Duration::from_secs(5), &never).unwrap();
    assert!(matches!(reply, Reply::Connected { .. }), "{reply:?}");
    server.stop.store(true, Ordering::Relaxed);
    server.thread.join().unwrap();
}

/// A client that read its reply and hung up: the server's write had
/// succeeded (into the socket's buffer, or read), so the queue pair made
/// for it stayed, and on a NIC with room for one every later client was
/// refused. Without the client's confirmation it is destroyed.
#[test]
fn a_client_that_hangs_up_without_confirming_leaves_no_queue_pair_behind() {
    use std::io::{BufRead, Write};
    let server = memory_server_with("unconfirmed", nic_config(2, 1));
    let ControlAddress::Unix(path) = &server.address else {
        unreachable!("the test server listens on a Unix socket")
    };
    let mut gone = std::os::unix::net::UnixStream::connect(path).unwrap();
    gone.write_all(&request_line("gone")).unwrap();
    let mut reply = String::new();
    std::io::BufReader::new(&gone)
        .read_line(&mut reply)
        .unwrap();
    assert!(reply.contains("Connected"), "{reply}");
    drop(gone);
    assert_the_next_client_connects(server);
}

/// A client whose request failed (no server, a stop, a refusal) kept the
/// queue pair it had made for the connection: a client retrying used up
/// its NIC's queue pairs (found by reading).
#[test]
fn a_failed_connect_leaves_no_queue_pair_behind() {
    let segment = Segment::anonymous(&SegmentPlan::star(1, 4)).unwrap();
    let mut node = NodeEndpoint::new(
        "client",
        SoftRnic::new(nic_config(1, 1)),
        Box::new(segment.spoke_port(1).unwrap()),
    );
    let pd = node.rnic.alloc_protection_domain().unwrap();
    let cq = node.rnic.create_completion_queue(16).unwrap();
    let builder = rack_queue_pair(pd, cq);
    let (endpoint, _stop, driver) = driven(node);
    let nowhere = ControlAddress::Unix(std::env::temp_dir().join(format!(
        "remora-control-nowhere-{}.sock",
        std::process::id()
    )));
    for _ in 0..3 {
        let failed = control::connect_queue_pair(
            &endpoint,
            &driver.kicker(),
            "client",
            &builder,
            &nowhere,
            &AtomicBool::new(true),
        );
        assert!(failed.is_err());
    }
    assert!(endpoint
        .lock()
        .unwrap()
        .rnic
        .create_queue_pair(&builder)
        .is_ok());
}
