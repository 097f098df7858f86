//! The Gatekeeper's ACL on the DSM, on an embedded rack: three memory
//! nodes, a client that allocates, and a service host. Access is refused
//! by default, with the switch's NAK; the refused side gets a typed error
//! and a working channel; memory is unchanged; a CALL lends its pointer to
//! the callee, to read, until the REPLY.

use remora_bifrost::dsm::client::{Dsm, DsmError};
use remora_bifrost::dsm::rack::{DsmRack, DsmRackConfig, StagedDsm};
use remora_bifrost::dsm::GlobalPtr;
use remora_bifrost::gatekeeper::{Gatekeeper, GatekeeperConfig, GatekeeperCounters, NodeKind};
use remora_bifrost::rpc::agents::{CallRequest, CallingAgent, ServerAgent};
use remora_bifrost::rpc::workers::WorkerPool;
use remora_bifrost::rpc::Outcome;
use remora_bifrost::rpc::{callee_at, Callee, Caller, Service};
use remora_bifrost::transport::SERVICE_ADDRESS;
use remora_rack::endpoint::{lock, Shared, SwitchEndpoint};
use remora_rack::topology::COMPUTE_HOST;
use remora_switch::programs::overlay::Overlaid;
use remora_wire::bifrost::GlobalAddress;
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Reads the pointer it is lent and sums its bytes; then tries to write
/// it, which the lease must refuse. Answers the sum and whether the write
/// was refused.
struct SumService {
    dsm: Arc<OnceLock<Dsm>>,
}

impl Service for SumService {
    fn call(&mut self, _method: &[u8], pointer: GlobalAddress, _arguments: &[u8]) -> Outcome {
        let dsm = self.dsm.get().ok_or("no DSM yet")?;
        let ptr = GlobalPtr::from_address(&pointer).ok_or("no pointer")?;
        let size = dsm.stat(ptr).map_err(|error| error.to_string())?;
        let mut data = vec![0u8; size as usize];
        dsm.read(ptr, &mut data)
            .map_err(|error| error.to_string())?;
        let sum: u64 = data.iter().map(|&byte| u64::from(byte)).sum();
        let write_refused = matches!(
            dsm.write(ptr, &[0xee; 8]),
            Err(DsmError::AccessRefused { .. })
        );
        let mut answer = sum.to_be_bytes().to_vec();
        answer.push(u8::from(write_refused));
        Ok(answer.into())
    }
}

struct GuardedRack {
    rack: DsmRack,
    /// The service host's DSM.
    service: Arc<OnceLock<Dsm>>,
    switch: Shared<SwitchEndpoint<Overlaid<Gatekeeper>>>,
    calls: SyncSender<CallRequest>,
}

impl GuardedRack {
    fn counters(&self) -> GatekeeperCounters {
        lock(&self.switch).switch.program().counters()
    }

    fn service(&self) -> &Dsm {
        self.service.get().expect("set at start")
    }

    fn call(&self, ptr: GlobalPtr) -> (u64, bool) {
        let (reply, outcome) = sync_channel(1);
        self.calls
            .send(CallRequest {
                method: "sum".into(),
                pointer: ptr.to_address(),
                arguments: Vec::new(),
                reply,
            })
            .expect("the calling agent runs");
        let answer = outcome
            .recv_timeout(Duration::from_secs(10))
            .expect("an outcome")
            .expect("the call succeeds");
        let sum = u64::from_be_bytes(answer[..8].try_into().unwrap());
        (sum, answer[8] == 1)
    }
}

fn start() -> GuardedRack {
    let config = DsmRackConfig::default();
    let mut staged = StagedDsm::new(config, 1).expect("a DSM rack stages");
    let service_host = StagedDsm::extra_client_host(&config, 0);
    let service_dsm = Arc::new(OnceLock::new());
    let service = SumService {
        dsm: Arc::clone(&service_dsm),
    };
    let pool = WorkerPool::new(vec![Box::new(service)]).expect("a worker starts");
    let server = ServerAgent::new(Callee::new(Box::new(pool)));
    staged
        .staged
        .add_agent(service_host, Arc::new(Mutex::new(server)));
    let topology = staged.staged.topology().clone();
    let (calls, taken) = sync_channel(8);
    let callee = callee_at(topology.switch_mac, SERVICE_ADDRESS);
    let calling = CallingAgent::new(
        Caller::new(Duration::from_millis(20), 50),
        callee,
        40000,
        taken,
    );
    staged
        .staged
        .add_agent(COMPUTE_HOST, Arc::new(Mutex::new(calling)));
    let mut gatekeeper = Gatekeeper::new(GatekeeperConfig::new(SERVICE_ADDRESS));
    let service_address = topology.host(service_host).address;
    gatekeeper
        .register_node(service_address, NodeKind::Compute, 0)
        .unwrap();
    gatekeeper.route("sum", service_address).unwrap();
    let (rack, extra, switch) = staged.start_guarded(gatekeeper).expect("the rack starts");
    let _ = service_dsm.set(extra.into_iter().next().expect("the service's DSM"));
    GuardedRack {
        rack,
        service: service_dsm,
        switch,
        calls,
    }
}

fn refused(outcome: Result<impl std::fmt::Debug, DsmError>) -> bool {
    matches!(outcome, Err(DsmError::AccessRefused { .. }))
}

#[test]
fn access_is_refused_by_default_with_a_nak_and_memory_stays_unchanged() {
    let rack = start();
    let owner = &rack.rack.dsm;
    let other = rack.service();
    let ptr = owner.alloc(100_000).expect("alloc");
    let data: Vec<u8> = (0..100_000u32).map(|byte| byte as u8).collect();
    owner.write(ptr, &data).expect("the owner writes");

    // Another node asks the size (which it needs before any read or
    // write), snapshots and frees: each refused at the switch, fast.
    let started = std::time::Instant::now();
    let mut into = vec![0u8; 64];
    assert!(refused(other.stat(ptr)), "stat without a lease");
    assert!(refused(other.read(ptr, &mut into)));
    assert!(refused(other.free(ptr)));
    assert!(refused(other.snapshot(ptr)));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refusals fail fast, not after the NIC's retries: {:?}",
        started.elapsed()
    );

    // Memory is unchanged, and the refused node's channels work on.
    let mut back = vec![0u8; data.len()];
    owner.read(ptr, &mut back).expect("the owner reads");
    assert_eq!(back, data);
    let own = other.alloc(4096).expect("the refused node allocates");
    other.write(own, &[7; 4096]).expect("and writes its own");
    let mut seen = vec![0u8; 4096];
    other.read(own, &mut seen).expect("and reads it");
    assert_eq!(seen, vec![7; 4096]);

    let counters = rack.counters().memory;
    assert!(counters.messages_refused >= 3, "{counters:?}");
    assert!(counters.naks_sent >= 3, "{counters:?}");
    assert_eq!(counters.unknown_connections, 0, "{counters:?}");
    assert!(counters.allocations >= 2, "{counters:?}");

    // Freed, the pointer has no rules left: its owner's access is refused
    // too (or caught before it leaves, as use after free).
    owner.free(ptr).expect("the owner frees");
    assert!(owner.read(ptr, &mut into).is_err());
}

#[test]
fn a_write_the_acl_refuses_never_reaches_memory_even_across_packets() {
    let rack = start();
    let owner = &rack.rack.dsm;
    let other = rack.service();
    let ptr = owner.alloc(65_536).expect("alloc");
    owner.write(ptr, &[1; 65_536]).expect("the owner writes");
    // The other node learns the size under a call's lease, then tries
    // to write after the reply.
    let (sum, write_refused) = rack.call(ptr);
    assert_eq!(sum, 65_536, "the callee read what it was lent");
    assert!(write_refused, "a lease is read-only");
    let refusals_before = rack.counters().memory.writes_refused;
    // The lease ended with the reply: the callee knows the size now, so
    // its multi-packet WRITE goes out, and the switch refuses it.
    assert!(refused(other.write(ptr, &[9; 65_536])));
    assert!(rack.counters().memory.writes_refused > refusals_before);
    let mut back = vec![0u8; 65_536];
    owner.read(ptr, &mut back).expect("the owner reads");
    assert!(back.iter().all(|&byte| byte == 1), "memory unchanged");
}

#[test]
fn a_call_lends_its_pointer_to_the_callee_until_the_reply() {
    let rack = start();
    let owner = &rack.rack.dsm;
    let other = rack.service();
    let ptr = owner.alloc(1024).expect("alloc");
    owner.write(ptr, &[3; 1024]).expect("write");
    let mut into = vec![0u8; 16];
    assert!(refused(other.stat(ptr)), "no lease before the call");
    for round in 0..3 {
        let (sum, write_refused) = rack.call(ptr);
        assert_eq!(sum, 3 * 1024, "round {round}");
        assert!(write_refused, "round {round}: the lease is read-only");
        // After the reply the callee's lease is gone, and the caller has
        // its control back.
        assert!(refused(other.read(ptr, &mut into)), "round {round}");
        owner
            .write(ptr, &[3; 1024])
            .expect("the caller writes again");
    }
    let counters = rack.counters();
    assert_eq!(counters.leases_refused, 0, "{counters:?}");
    assert!(counters.memory.reads_allowed > 0, "{counters:?}");
}

/// The `bifrost_acl` fuzz target's seeds replay through its harness: a
/// READ of the client's own memory reaches the node; one with a wrong key
/// or past the end does not.
#[test]
fn acl_fuzz_seeds_replay() {
    use remora_bifrost::gatekeeper::audit::any_memory_frame;
    let directory = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/seeds/bifrost_acl");
    let mut reached = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(directory).expect("the seed directory") {
        let path = entry.expect("a seed").path();
        let bytes = std::fs::read(&path).expect("a readable seed");
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        reached.insert(name, any_memory_frame(&bytes));
    }
    assert_eq!(reached.get("read_own"), Some(&true), "{reached:?}");
    assert_eq!(reached.get("read_wrong_key"), Some(&false), "{reached:?}");
    assert_eq!(reached.get("write_past_end"), Some(&false), "{reached:?}");
    assert_eq!(reached.get("truncated_bth"), Some(&false), "{reached:?}");
    // Found by the fuzzer: a stat whose offset aliased another node's
    // key (see the ACL's `an_offset_past_56_bits_names_no_rules_of_another_node`).
    assert_eq!(
        reached.get("stat_offset_past_56_bits"),
        Some(&false),
        "{reached:?}"
    );
    assert_eq!(reached.len(), 6, "{reached:?}");
}

/// Found by CI (stop 33): `remora bench bifrost` died with "the Gatekeeper
/// refused free on memory node 0". A caller's resend timer fired while
/// the reply to its by-reference call was on its way; the resend passed
/// the switch after the reply, found no call in the graph, and lent the
/// pointer to the callee again, taking the caller's control away until
/// the callee's answer from its replies passed. The caller's free, sent
/// in that window, was refused. Seed 0 of the ACL audit resends an
/// answered call and then frees: it failed at event 36 before the fix.
#[test]
fn a_resend_after_its_reply_leaves_the_caller_in_control() {
    use remora_bifrost::gatekeeper::audit::acl_audit;
    let audit = acl_audit(0, 400).unwrap_or_else(|violation| panic!("{violation}"));
    assert!(audit.late_resends > 0, "{audit:?}");
}
