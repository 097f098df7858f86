//! Plain UDP datagrams beside queue pairs: a port opened on one device
//! receives what another sends, through the L2/L3 switch too; what no
//! port was opened for, or what overflows an inbox, is dropped and counted.

mod common;

use common::deliver_all;
use remora_rnic::{RnicConfig, SoftRnic, Timestamp, Verbs, VerbsError};
use remora_wire::datagram::DatagramEnd;
use remora_wire::{Ipv4Address, MacAddress};

fn nic(last: u8) -> SoftRnic {
    SoftRnic::new(RnicConfig::new(
        MacAddress([2, 0, 10, 0, 0, last]),
        Ipv4Address::new(10, 0, 0, last),
        u64::from(last),
    ))
}

fn end(last: u8, port: u16) -> DatagramEnd {
    DatagramEnd {
        mac: MacAddress([2, 0, 10, 0, 0, last]),
        address: Ipv4Address::new(10, 0, 0, last),
        port,
    }
}

#[test]
fn a_datagram_reaches_the_port_it_was_sent_to() {
    let (mut a, mut b) = (nic(1), nic(2));
    let a_port = a.open_datagram_port(5000, 4).unwrap();
    let b_port = b.open_datagram_port(4792, 2).unwrap();
    a.send_datagram(a_port, end(2, 4792), b"ping").unwrap();
    assert_eq!(deliver_all(&mut a, &mut b, Timestamp::ZERO), 1);
    let mut into = [0u8; 64];
    let received = b.receive_datagram(b_port, &mut into).unwrap().unwrap();
    assert_eq!(
        (&into[..received.length], received.from),
        (&b"ping"[..], end(1, 5000))
    );
    assert_eq!(b.receive_datagram(b_port, &mut into).unwrap(), None);

    // Beyond the inbox's depth: dropped and counted, never queued.
    for _ in 0..3 {
        a.send_datagram(a_port, end(2, 4792), b"x").unwrap();
    }
    deliver_all(&mut a, &mut b, Timestamp::ZERO);
    assert_eq!(
        b.counters().drops_by_name().get("datagram_inbox_full"),
        Some(&1)
    );
    // To a port nobody opened, and to another device's address.
    a.send_datagram(a_port, end(2, 6000), b"x").unwrap();
    a.send_datagram(
        a_port,
        DatagramEnd {
            address: Ipv4Address::new(10, 0, 0, 9),
            ..end(2, 4792)
        },
        b"x",
    )
    .unwrap();
    deliver_all(&mut a, &mut b, Timestamp::ZERO);
    let drops = b.counters().drops_by_name();
    assert_eq!(drops.get("no_datagram_port"), Some(&1), "{drops:?}");
    assert_eq!(drops.get("not_for_this_device"), Some(&1), "{drops:?}");
}

#[test]
fn bad_datagram_arguments_are_typed_errors() {
    let mut a = nic(1);
    let port = a.open_datagram_port(5000, 1).unwrap();
    assert!(matches!(
        a.open_datagram_port(5000, 1),
        Err(VerbsError::DatagramPortTaken(5000))
    ));
    assert!(matches!(
        a.open_datagram_port(4791, 1),
        Err(VerbsError::DatagramPortTaken(4791))
    ));
    assert!(matches!(
        a.open_datagram_port(5001, 0),
        Err(VerbsError::InvalidQueueDepth { .. })
    ));
    assert!(matches!(
        a.send_datagram(port, end(2, 1), &[0; 5000]),
        Err(VerbsError::DatagramTooLarge { length: 5000, .. })
    ));
    let mut b = nic(2);
    let b_port = b.open_datagram_port(7, 1).unwrap();
    a.send_datagram(port, end(2, 7), &[1; 100]).unwrap();
    deliver_all(&mut a, &mut b, Timestamp::ZERO);
    let mut small = [0u8; 10];
    assert!(matches!(
        b.receive_datagram(b_port, &mut small),
        Err(VerbsError::DatagramTooLarge { .. })
    ));
    let mut large = [0u8; 100];
    assert_eq!(
        b.receive_datagram(b_port, &mut large)
            .unwrap()
            .unwrap()
            .length,
        100
    );
}
