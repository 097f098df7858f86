//! The array services with their arrays in global memory: the client puts
//! the arrays in the DSM and passes pointers; the service, on a host of its
//! own, reads and writes the DSM on worker threads.

use remora_bifrost::arrays::{to_idl, ArraysRack};
use remora_bifrost::dsm::rack::DsmRackConfig;
use remora_bifrost::services::{ArraysSyncClient, TArraysSyncClient};
use remora_bifrost::transport::client_protocols;

#[test]
fn add_arrays_and_increment_array_work_on_global_memory() {
    let ArraysRack {
        rack: _rack,
        dsm,
        path,
    } = ArraysRack::start(DsmRackConfig::default(), 2).unwrap();
    let (input, output) = client_protocols(path);
    let mut client = ArraysSyncClient::new(input, output);
    for length in [1usize, 4096, 300_000] {
        let a: Vec<u8> = (0..length).map(|index| (index % 251) as u8).collect();
        let b: Vec<u8> = (0..length).map(|index| (index % 13) as u8 + 200).collect();
        let [pa, pb, ps] = [0, 1, 2].map(|node| dsm.alloc_on(node, length as u64).unwrap());
        dsm.write(pa, &a).unwrap();
        dsm.write(pb, &b).unwrap();
        client
            .add_arrays(to_idl(pa, length), to_idl(pb, length), to_idl(ps, length))
            .unwrap();
        let mut sum = vec![0u8; length];
        dsm.read(ps, &mut sum).unwrap();
        let expected: Vec<u8> = a.iter().zip(&b).map(|(x, y)| x.wrapping_add(*y)).collect();
        assert_eq!(sum, expected, "{length} bytes");
        client.increment_array(to_idl(ps, length)).unwrap();
        dsm.read(ps, &mut sum).unwrap();
        assert!(sum
            .iter()
            .zip(&expected)
            .all(|(now, before)| *now == before.wrapping_add(1)));
        for ptr in [pa, pb, ps] {
            dsm.free(ptr).unwrap();
        }
    }
}

#[test]
fn bad_pointers_come_back_as_errors_not_hangs() {
    let ArraysRack {
        rack: _rack,
        dsm,
        path,
    } = ArraysRack::start(DsmRackConfig::default(), 1).unwrap();
    let (input, output) = client_protocols(path);
    let mut client = ArraysSyncClient::new(input, output);
    let a = dsm.alloc(64).unwrap();
    // Lengths that differ, and a pointer past its allocation.
    assert!(client
        .add_arrays(to_idl(a, 64), to_idl(a, 32), to_idl(a, 64))
        .is_err());
    assert!(client.increment_array(to_idl(a, 1 << 20)).is_err());
    dsm.free(a).unwrap();
    // A freed pointer.
    assert!(client.increment_array(to_idl(a, 64)).is_err());
}
