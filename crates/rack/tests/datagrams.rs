//! Plain UDP datagrams (Bifröst's RPC port) cross the rack's L2/L3 switch
//! between two hosts' devices, as RoCEv2 frames do.

use remora_base::PortId;
use remora_rack::topology::{standard_host, Topology, COMPUTE_HOST, MEMORY_HOST};
use remora_rnic::{RnicConfig, SoftRnic, Timestamp, Verbs};
use remora_switch::{Switch, SwitchConfig};
use remora_wire::bifrost::BIFROST_PORT;
use remora_wire::datagram::DatagramEnd;
use remora_wire::frame::MAX_FRAME_LEN;

#[test]
fn a_datagram_crosses_the_switch_to_the_host_it_names() {
    let topology = Topology::compute_and_memory();
    let mut switch = Switch::new(SwitchConfig::new(2), topology.forwarding());
    let nic = |index: usize| {
        let (mac, address) = standard_host(index);
        SoftRnic::new(RnicConfig::new(mac, address, index as u64))
    };
    let (mut compute, mut memory) = (nic(COMPUTE_HOST), nic(MEMORY_HOST));
    let from = compute.open_datagram_port(40000, 8).unwrap();
    let to = memory.open_datagram_port(BIFROST_PORT, 8).unwrap();
    let (_, address) = standard_host(MEMORY_HOST);
    // Addressed as a routed packet is: to the switch's router MAC.
    let destination = DatagramEnd {
        mac: topology.switch_mac,
        address,
        port: BIFROST_PORT,
    };
    compute.send_datagram(from, destination, b"call").unwrap();

    let now = Timestamp::ZERO;
    let mut buffer = vec![0u8; MAX_FRAME_LEN];
    let length = compute
        .poll_transmit(now, &mut buffer)
        .expect("the datagram leaves");
    switch.handle_frame(now, topology.port(COMPUTE_HOST), &buffer[..length]);
    let (port, length) = switch
        .poll_transmit(now, &mut buffer)
        .expect("the switch forwards it");
    assert_eq!(port, PortId(MEMORY_HOST as u16));
    memory.handle_frame(now, &buffer[..length]);
    let mut into = [0u8; 16];
    let received = memory
        .receive_datagram(to, &mut into)
        .unwrap()
        .expect("delivered");
    assert_eq!(&into[..received.length], b"call");
    assert_eq!(received.from.address, standard_host(COMPUTE_HOST).1);
}
