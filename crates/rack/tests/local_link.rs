//! An offload host's local link: frames between a host and the DPU beside
//! it take the local link, never the switch, in the simulator and on the
//! embedded rack, and the local link is shaped on its own: at 1 Gb/s it
//! carries within 10% of 1 Gb/s while the hosts' uplinks stay unshaped.

mod common;

use common::{connect, Connection};
use remora_carrier::wrappers::LinkShape;
use remora_rack::assembly::{EmbeddedRack, RackBuilder};
use remora_rack::endpoint::{lock, RACK_ACK_TIMEOUT};
use remora_rack::scenario::{Rack, RackStage, SimulatedStage, SIMULATED_ACK_TIMEOUT};
use remora_rack::topology::{standard_host, HostSpec, LinkSpec, Role, Topology};
use remora_rnic::*;
use remora_sim::LinkFaults;
use std::time::{Duration, Instant};

const COMPUTE: usize = 0;
const MEMORY: usize = 1;
const DPU: usize = 2;
const MESSAGE_BYTES: u32 = 64 * 1024;
const REGION_BYTES: u64 = 4 << 20;
/// Writes in flight: 512 KiB, inside the local link's 1 MiB queue.
const IN_FLIGHT: u64 = 8;

/// A compute host, a memory host and a DPU beside the compute host, its
/// local link shaped as given.
fn topology(local: Option<LinkShape>) -> Topology {
    let mut topology = Topology::compute_and_memory();
    let (mac, address) = standard_host(DPU);
    let mut dpu = HostSpec::new("dpu", Role::Offload, mac, address);
    dpu.attached_to = Some(COMPUTE);
    topology.add_host(dpu).unwrap();
    topology.set_local_link(
        DPU,
        LinkSpec {
            shape: local,
            faults: LinkFaults::NONE,
        },
    );
    topology
}

impl Connection {
    fn write(&self, id: u64) -> (QueuePair, SendRequest) {
        let operation = SendOperation::Write {
            remote: self.remote.remote(0),
            immediate: None,
        };
        let request =
            SendRequest::new(id, operation, &[self.local.slice(0, MESSAGE_BYTES)]).unwrap();
        (self.queue_pair, request)
    }

    fn completions(&self, nic: &mut SoftRnic) -> u64 {
        let mut count = 0;
        while let Some(completion) = nic.poll_completion(self.completion_queue).unwrap() {
            assert_eq!(completion.status, CompletionStatus::Success);
            count += 1;
        }
        count
    }
}

#[test]
fn frames_between_a_host_and_its_dpu_never_cross_the_switch_in_the_simulator() {
    let topology = topology(None);
    let mut stage = SimulatedStage::new(1, &topology, 7);
    let connection = connect(
        &mut stage,
        (COMPUTE, DPU),
        REGION_BYTES,
        SIMULATED_ACK_TIMEOUT,
    );
    let mut rack = stage.start(topology.forwarding()).unwrap();
    for id in 0..4 {
        let (queue_pair, request) = connection.write(id);
        rack.with_nic(COMPUTE, |nic| nic.post_send(queue_pair, request))
            .unwrap();
    }
    let mut done = 0;
    rack.run_until(
        &mut |rack| {
            done += rack.with_nic(COMPUTE, |nic| connection.completions(nic));
            done == 4
        },
        Duration::from_millis(10),
    )
    .unwrap();
    let local = rack.simulation.link_counters(rack.local_links[0]);
    assert!(local[0].frames_delivered >= 4 * 16, "{local:?}");
    assert!(local[1].frames_delivered > 0, "acknowledgements came back");
    for host in [COMPUTE, DPU] {
        let uplink = rack.simulation.link_counters(rack.links[host]);
        assert_eq!(uplink[0].frames_offered, 0, "host {host}: {uplink:?}");
        assert_eq!(uplink[1].frames_offered, 0, "host {host}: {uplink:?}");
    }
}

fn start_embedded(topology: &Topology) -> (EmbeddedRack, Connection) {
    let mut stage = RackBuilder::new(topology)
        .thread_name("local-link")
        .build()
        .unwrap();
    let connection = connect(&mut stage, (COMPUTE, DPU), REGION_BYTES, RACK_ACK_TIMEOUT);
    let switch = stage.l2l3_switch();
    let (rack, _switch) = stage.start(switch).unwrap();
    (rack, connection)
}

#[test]
fn a_one_gigabit_local_link_carries_within_ten_percent_of_one_gigabit_past_the_switch() {
    let shape = LinkShape {
        bandwidth_bits_per_second: 1_000_000_000,
        propagation_delay: Duration::ZERO,
        queue_limit_bytes: 1 << 20,
    };
    let (mut rack, connection) = start_embedded(&topology(Some(shape)));
    let post = |rack: &EmbeddedRack, id| {
        let (queue_pair, request) = connection.write(id);
        lock(rack.host(COMPUTE))
            .rnic
            .post_send(queue_pair, request)
            .unwrap();
        rack.kick();
    };
    let (mut posted, mut done) = (0u64, 0u64);
    let (warm_up, measured) = (16, 320);
    let mut window_start: Option<(Instant, u64)> = None;
    let limit = Instant::now() + Duration::from_secs(30);
    while done < warm_up + measured {
        assert!(Instant::now() < limit, "{done} writes in 30 s");
        while posted < done + IN_FLIGHT {
            post(&rack, posted);
            posted += 1;
        }
        done += connection.completions(&mut lock(rack.host(COMPUTE)).rnic);
        if window_start.is_none() && done >= warm_up {
            window_start = Some((Instant::now(), done));
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    let (started, done_before) = window_start.unwrap();
    let payload_bits = (done - done_before) as f64 * f64::from(MESSAGE_BYTES) * 8.0;
    let bits_per_second = payload_bits / started.elapsed().as_secs_f64();
    rack.stop_and_join().unwrap();
    let report = rack.switch_report();
    for host in [COMPUTE, DPU] {
        assert_eq!(
            report.ports[host].frames_received, 0,
            "host {host}'s uplink carried the local traffic"
        );
    }
    assert_eq!(report.ports[MEMORY].frames_received, 0);
    // Payload, not wire bytes: the headers of a 4 KiB packet are about 1.5%.
    let error = (bits_per_second - 1e9).abs() / 1e9;
    eprintln!("local link shaped to 1 Gb/s carried {bits_per_second:.3e} bit/s of payload");
    assert!(error < 0.10, "{bits_per_second:.3e} bit/s");
}
