//! TIGA's NDP path on the embedded rack: real frames, the flow table, the
//! real stages on the SmartNIC, co-processing on the CN, and the CPU-only
//! baseline, all giving the same bytes as the CN version run locally.

use remora_tiga::apps::App;
use remora_tiga::rack::{build_data, Mode, NdpError, NdpRack, ServedBy};
use std::collections::BTreeMap;
use std::time::Duration;

const SEED: u64 = 5;

#[test]
fn the_smartnic_the_forwarded_path_and_cpu_only_give_the_cn_versions_bytes_exactly_once() {
    let (memory, locations) = build_data(SEED, &App::ALL, 6, 1024).unwrap();
    let rack = NdpRack::start(memory, &App::ALL, 4).unwrap();
    let mut served: BTreeMap<String, u64> = BTreeMap::new();
    for location in &locations {
        let payload = location.app.make_payload(SEED, location.id, 1024).unwrap();
        let expected = location.app.run_on_cpu(&payload).unwrap();
        let ndp = rack
            .call(location.app, location.address, location.length, Mode::Ndp)
            .unwrap();
        assert_eq!(ndp.result, expected, "{location:?} via {:?}", ndp.served_by);
        *served.entry(format!("{:?}", ndp.served_by)).or_default() += 1;
        let cpu_only = rack
            .call(
                location.app,
                location.address,
                location.length,
                Mode::CpuOnly,
            )
            .unwrap();
        assert_eq!(cpu_only.result, expected);
        assert_eq!(cpu_only.served_by, ServedBy::CpuOnly);
    }
    // One request in four went to the CN, the rest ran on the SmartNIC.
    assert_eq!(served["ComputeNodeForwarded"], 18 / 4);
    assert_eq!(served["SmartNic"], 18 - 18 / 4);
    let (counters, unacknowledged) = rack.settled_counters(Duration::from_secs(5));
    assert_eq!(unacknowledged, 0);
    assert_eq!(counters.requests, 18);
    assert_eq!(counters.forwarded, counters.acknowledged);
    assert_eq!(counters.results + counters.forwarded, counters.requests);
    assert_eq!(counters.fetches, 18);
    assert!(counters.dropped.is_empty(), "{:?}", counters.dropped);
    // Where the CPU went, apart: the emulation, the CN's client (its
    // versions of forwarded and CPU-only requests) and the engine.
    let cpu = rack.stop().unwrap();
    assert!(cpu.nic_emulation > Duration::ZERO, "{cpu:?}");
    assert!(cpu.client > Duration::ZERO, "{cpu:?}");
    assert!(cpu.engine > Duration::ZERO, "{cpu:?}");
}

#[test]
fn unregistered_apps_and_bad_ranges_get_typed_errors() {
    let (memory, locations) = build_data(SEED, &App::ALL, 12, 256).unwrap();
    let size = memory.len() as u64;
    let rack = NdpRack::start(memory, &[App::Mvs], 0).unwrap();
    let spark = locations
        .iter()
        .find(|location| location.app == App::Spark)
        .unwrap();
    assert_eq!(
        rack.call(App::Spark, spark.address, spark.length, Mode::Ndp),
        Err(NdpError::NotRegistered(App::Spark))
    );
    assert_eq!(
        rack.call(App::Mvs, size - 10, 100, Mode::Ndp),
        Err(NdpError::OutOfRange)
    );
    assert_eq!(
        rack.call(App::Mvs, u64::MAX, 100, Mode::CpuOnly),
        Err(NdpError::OutOfRange)
    );
    // A range that is not an MVS record fails the CRC on the SmartNIC.
    let mvs = locations[0];
    assert!(matches!(
        rack.call(App::Mvs, mvs.address + 1, mvs.length - 1, Mode::Ndp),
        Err(NdpError::StageFailed(_))
    ));
    assert_eq!(
        rack.call(App::Mvs, 0, 8000, Mode::Ndp),
        Err(NdpError::TooLarge)
    );
    let (counters, _) = rack.settled_counters(Duration::from_secs(1));
    assert_eq!(counters.refused["NotRegistered"], 1);
    assert_eq!(counters.refused["OutOfRange"], 2);
    // The flow table is one stage of the switch's pipeline API.
    let table = rack.engine.lock().unwrap().engine.flow_table_resources();
    assert_eq!((table.stage, table.entries), (0, 1));
}

/// The data node held every app's records whatever the rack served:
/// 100,000 records of 4 KiB were 1.2 GB for one app's 400 MB. Only the
/// apps asked for are built now.
#[test]
fn build_data_holds_only_the_apps_asked_for() {
    let (memory, locations) = build_data(SEED, &[App::Ipsec], 3, 256).unwrap();
    assert_eq!(locations.len(), 3);
    assert!(locations.iter().all(|location| location.app == App::Ipsec));
    let held: u64 = locations
        .iter()
        .map(|location| u64::from(location.length))
        .sum();
    assert_eq!(memory.len() as u64, held);
}

/// Lost datagrams were never sent again: each loss cost its call the 5 s
/// deadline, and a lost acknowledgement left its forward unacknowledged
/// for good. On a compute link that loses one frame in five each way,
/// every call gets the CN version's bytes, and every forward is
/// acknowledged.
#[test]
fn calls_over_a_lossy_link_all_succeed_and_every_forward_is_acknowledged() {
    use remora_base::Probability;
    use remora_rack::topology::{standard_host, HostSpec, Role, Topology, COMPUTE_HOST};
    use remora_rack::topology::{DEFAULT_SWITCH_MAC, MEMORY_HOST};
    let mut topology = Topology::new(DEFAULT_SWITCH_MAC);
    let (mac, address) = standard_host(COMPUTE_HOST);
    let mut compute = HostSpec::new("compute", Role::Compute, mac, address);
    compute.link.faults.loss = Probability::new(0.2).unwrap();
    topology.add_host(compute).unwrap();
    let (mac, address) = standard_host(MEMORY_HOST);
    topology
        .add_host(HostSpec::new("memory", Role::Memory, mac, address))
        .unwrap();
    let (memory, locations) = build_data(SEED, &[App::Mvs], 16, 512).unwrap();
    let rack = NdpRack::start_on(&topology, memory, &[App::Mvs], 2).unwrap();
    let started = std::time::Instant::now();
    for location in &locations {
        let payload = location.app.make_payload(SEED, location.id, 512).unwrap();
        let expected = location.app.run_on_cpu(&payload).unwrap();
        let answer = rack
            .call(location.app, location.address, location.length, Mode::Ndp)
            .unwrap_or_else(|error| panic!("{location:?}: {error}"));
        assert_eq!(answer.result, expected, "{location:?}");
    }
    let (counters, unacknowledged) = rack.settled_counters(Duration::from_secs(5));
    assert_eq!(unacknowledged, 0, "{counters:?}");
    assert!(counters.forwarded > 0, "{counters:?}");
    assert_eq!(counters.forwarded, counters.acknowledged, "{counters:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "losses cost a resend's wait, not a call's deadline: {:?}",
        started.elapsed()
    );
    rack.stop().unwrap();
}
