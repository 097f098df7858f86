//! The array services with their arrays in global memory, through the
//! Gatekeeper with its ACL on: the client's library puts a call's arrays
//! in one allocation and passes its pointer in the call's header; the
//! service, on a host of its own, reads them under the call's lease and
//! returns a new array of its own, whose control the reply hands to the
//! client.

use remora_bifrost::arrays::arrays_rack;
use remora_bifrost::by_reference::{from_idl, pass_by_reference, to_idl, whole};
use remora_bifrost::dsm::rack::DsmRackConfig;
use remora_bifrost::dsm_service::DsmServiceRack;
use remora_bifrost::services::{ArraysSyncClient, TArraysSyncClient};
use remora_bifrost::transport::{client_protocols_passing, Routing};

#[test]
fn add_arrays_and_increment_array_work_on_global_memory() {
    let DsmServiceRack {
        rack: _rack,
        dsm,
        path,
        ..
    } = arrays_rack(DsmRackConfig::default(), 2, Routing::Gatekeeper).unwrap();
    let ((input, output), pointer) = client_protocols_passing(path);
    let mut client = ArraysSyncClient::new(input, output);
    for length in [1usize, 4096, 300_000] {
        let a: Vec<u8> = (0..length).map(|index| (index % 251) as u8).collect();
        let b: Vec<u8> = (0..length).map(|index| (index % 13) as u8 + 200).collect();
        let (inputs, arguments) = pass_by_reference(&dsm, &[&a, &b]).unwrap();
        pointer.pass(inputs.to_address());
        let returned = client
            .add_arrays(to_idl(arguments[0]), to_idl(arguments[1]))
            .unwrap();
        let sum_pointer = from_idl(&returned).unwrap();
        assert_eq!(sum_pointer.length, length);
        let mut sum = vec![0u8; length];
        dsm.read(sum_pointer.allocation, &mut sum).unwrap();
        let expected: Vec<u8> = a.iter().zip(&b).map(|(x, y)| x.wrapping_add(*y)).collect();
        assert_eq!(sum, expected, "{length} bytes");
        // The client controls the returned array: it passes it on.
        pointer.pass(sum_pointer.allocation.to_address());
        let incremented = client
            .increment_array(to_idl(whole(sum_pointer.allocation, length)), 3)
            .unwrap();
        let incremented = from_idl(&incremented).unwrap().allocation;
        let mut back = vec![0u8; length];
        dsm.read(incremented, &mut back).unwrap();
        assert!(back
            .iter()
            .zip(&expected)
            .all(|(now, before)| *now == before.wrapping_add(3)));
        for ptr in [inputs, sum_pointer.allocation, incremented] {
            dsm.free(ptr).expect("the client controls every array");
        }
    }
}

/// A call that lends nothing: the service refuses to read for it, and
/// its host's own read of the caller's arrays, outside any call, is
/// refused at the switch with a NAK in the memory node's name (at its
/// first step, the stat that learns the allocation's size; READs the ACL
/// refuses are `tests/acl.rs`'s).
#[test]
fn a_call_that_passes_no_pointer_lends_nothing_and_the_service_is_refused() {
    let DsmServiceRack {
        rack: _rack,
        dsm,
        path,
        gatekeeper,
        service_dsm,
    } = arrays_rack(DsmRackConfig::default(), 1, Routing::Gatekeeper).unwrap();
    let ((input, output), pointer) = client_protocols_passing(path);
    let mut client = ArraysSyncClient::new(input, output);
    let (inputs, arguments) = pass_by_reference(&dsm, &[&[1; 64], &[2; 64]]).unwrap();
    let refused = client
        .add_arrays(to_idl(arguments[0]), to_idl(arguments[1]))
        .expect_err("no lease: the service's read is refused");
    assert!(format!("{refused:?}").contains("refused"), "{refused:?}");
    let service_dsm = service_dsm.get().expect("the service's DSM is up");
    let mut stolen = [0u8; 16];
    assert!(service_dsm.read(inputs, &mut stolen).is_err());
    let switch = remora_rack::endpoint::lock(gatekeeper.as_ref().expect("the Gatekeeper runs"));
    let memory = switch.switch.program().overlay().counters().memory;
    assert!(memory.refused() > 0 && memory.naks_sent > 0, "{memory:?}");
    drop(switch);
    // Passed, the same call works.
    pointer.pass(inputs.to_address());
    let sum = client
        .add_arrays(to_idl(arguments[0]), to_idl(arguments[1]))
        .unwrap();
    let mut back = vec![0u8; 64];
    dsm.read(from_idl(&sum).unwrap().allocation, &mut back)
        .unwrap();
    assert_eq!(back, vec![3; 64]);
}

/// The Gatekeeper lends the callee the one allocation a call's header
/// carries, but its ACL keys on the callee's address: a service that read
/// whatever its arguments named read, for any caller, memory that other
/// calls had lent it at the time. The service refuses an argument outside
/// the lent allocation without reading it.
#[test]
fn an_argument_outside_the_lent_allocation_is_refused_unread() {
    let DsmServiceRack {
        rack: _rack,
        dsm,
        path,
        gatekeeper,
        ..
    } = arrays_rack(DsmRackConfig::default(), 1, Routing::Gatekeeper).unwrap();
    let gatekeeper = gatekeeper.expect("the Gatekeeper runs");
    let reads_refused = || {
        let switch = remora_rack::endpoint::lock(&gatekeeper);
        switch
            .switch
            .program()
            .overlay()
            .counters()
            .memory
            .reads_refused
    };
    let ((input, output), pointer) = client_protocols_passing(path);
    let mut client = ArraysSyncClient::new(input, output);
    let (lent, _) = pass_by_reference(&dsm, &[&[1; 64]]).unwrap();
    let (other, named) = pass_by_reference(&dsm, &[&[9; 64]]).unwrap();
    let before = reads_refused();
    pointer.pass(lent.to_address());
    let refused = client
        .increment_array(to_idl(named[0]), 1)
        .expect_err("an argument the call did not lend");
    assert!(
        format!("{refused:?}").contains("not the one the call lent"),
        "{refused:?}"
    );
    assert_eq!(reads_refused(), before, "the service never tried the read");
    for allocation in [lent, other] {
        dsm.free(allocation).unwrap();
    }
}

#[test]
fn bad_pointers_come_back_as_errors_not_hangs() {
    let DsmServiceRack {
        rack: _rack,
        dsm,
        path,
        ..
    } = arrays_rack(DsmRackConfig::default(), 1, Routing::Gatekeeper).unwrap();
    let ((input, output), pointer) = client_protocols_passing(path);
    let mut client = ArraysSyncClient::new(input, output);
    let (inputs, arguments) = pass_by_reference(&dsm, &[&[0u8; 64][..], &[0u8; 32][..]]).unwrap();
    // Lengths that differ.
    pointer.pass(inputs.to_address());
    assert!(client
        .add_arrays(to_idl(arguments[0]), to_idl(arguments[1]))
        .is_err());
    // A pointer past its allocation.
    pointer.pass(inputs.to_address());
    assert!(client
        .increment_array(to_idl(whole(inputs, 1 << 20)), 1)
        .is_err());
    dsm.free(inputs).unwrap();
    // A freed pointer.
    pointer.pass(inputs.to_address());
    assert!(client
        .increment_array(to_idl(whole(inputs, 64)), 1)
        .is_err());
}
