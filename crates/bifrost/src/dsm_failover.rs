//! A callee whose state lives in global memory, and its failover on the
//! embedded rack: the thesis's "the callee's DSM regions are snapshotted
//! with it" (§5.3).
//!
//! [`RegionCounter`] keeps a counter in a DSM region of its own and adds
//! one to it, in place, on every call. It waits on the DSM, so it runs on
//! a worker thread ([`crate::rpc::workers::WorkerPool`] of one), which
//! after each call takes its state: it snapshots the region under the
//! calls run so far, and the reply carries that version in its
//! checkpoint (b2). The control plane starts a replacement from the
//! Gatekeeper's kept checkpoint and the region's snapshot of the same
//! version ([`regions_of`]). A call that ran on the failed node after
//! that checkpoint (its reply lost with the node) leaves no trace in the
//! region, and runs once more on the replacement: once in all.
//!
//! The version matters: the newest snapshot can be newer than the kept
//! checkpoint, when the replies that carried the newer checkpoints never
//! reached the switch.
//!
//! The callee also commits a checkpoint as each call reaches its worker
//! (b1, [`Callee::committing_to`]): the replacement runs the calls the
//! kept checkpoint had received and not answered, and answers their
//! callers itself.

use crate::dsm::client::Dsm;
use crate::dsm::rack::{DsmRackConfig, DsmRackError, StagedDsm};
use crate::dsm::GlobalPtr;
use crate::gatekeeper::{Gatekeeper, GatekeeperConfig, GatekeeperError, NodeKind};
use crate::rpc::agents::{ClientAgent, ControlAgent, ServerAgent};
use crate::rpc::workers::WorkerPool;
use crate::rpc::{callee_at, Callee, Caller, Outcome, Service};
use crate::transport::{RACK_RESEND_AFTER, SERVICE_ADDRESS};
use remora_rack::endpoint::lock;
use remora_rack::topology::COMPUTE_HOST;
use remora_wire::bifrost::GlobalAddress;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a [`RegionCounter`] waits for its host's DSM to be set.
const DSM_WAIT: Duration = Duration::from_secs(2);

/// A counter in a DSM region of the service's own.
pub struct RegionCounter {
    dsm: Arc<OnceLock<Dsm>>,
    region: Option<GlobalPtr>,
    /// Calls run: the version of the next snapshot.
    executed: u64,
}

impl RegionCounter {
    pub fn new(dsm: Arc<OnceLock<Dsm>>) -> RegionCounter {
        RegionCounter {
            dsm,
            region: None,
            executed: 0,
        }
    }

    /// The host's DSM, waiting for the rack to set it (the service runs
    /// on a worker thread of its own, so it may wait).
    fn dsm(&self) -> Result<&Dsm, String> {
        let started = Instant::now();
        loop {
            if let Some(dsm) = self.dsm.get() {
                return Ok(dsm);
            }
            if started.elapsed() > DSM_WAIT {
                return Err("the service's DSM never came up".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The region, allocated (and zeroed) on the first call.
    fn region(&mut self) -> Result<GlobalPtr, String> {
        if let Some(region) = self.region {
            return Ok(region);
        }
        let dsm = self.dsm()?;
        let region = dsm.alloc(8).map_err(|error| error.to_string())?;
        let zeroed = dsm.write(region, &0u64.to_be_bytes());
        crate::by_reference::freed_on_error(dsm, region, zeroed)
            .map_err(|error| error.to_string())?;
        self.region = Some(region);
        Ok(region)
    }
}

/// A [`RegionCounter`]'s checkpoint state: its region and the calls run.
const STATE_BYTES: usize = 1 + 1 + 8 + 8;

fn encode_state(region: GlobalPtr, executed: u64) -> Vec<u8> {
    let mut state = Vec::with_capacity(STATE_BYTES);
    state.push(region.node);
    state.push(region.generation);
    state.extend_from_slice(&region.offset.to_be_bytes());
    state.extend_from_slice(&executed.to_be_bytes());
    state
}

fn decode_state(state: &[u8]) -> Result<(GlobalPtr, u64), String> {
    if state.len() != STATE_BYTES {
        return Err(format!(
            "a region counter's state is {STATE_BYTES} bytes, not {}",
            state.len()
        ));
    }
    let word = |at: usize| u64::from_be_bytes(state[at..at + 8].try_into().expect("8 bytes"));
    let region = GlobalPtr {
        node: state[0],
        generation: state[1],
        offset: word(2),
    };
    Ok((region, word(10)))
}

/// The regions a [`RegionCounter`]'s checkpoint state names, and the
/// version of their snapshots that goes with it: what the control plane
/// restores before the replacement takes over.
pub fn regions_of(state: &[u8]) -> Result<(Vec<GlobalPtr>, u64), String> {
    let (region, version) = decode_state(state)?;
    Ok((vec![region], version))
}

impl Service for RegionCounter {
    fn call(&mut self, _method: &[u8], _pointer: GlobalAddress, _arguments: &[u8]) -> Outcome {
        let region = self.region()?;
        let dsm = self.dsm()?;
        let mut value = [0u8; 8];
        dsm.read(region, &mut value)
            .map_err(|error| error.to_string())?;
        let next = u64::from_be_bytes(value) + 1;
        dsm.write(region, &next.to_be_bytes())
            .map_err(|error| error.to_string())?;
        self.executed += 1;
        Ok(next.to_be_bytes().to_vec().into())
    }

    /// Snapshots the region under the calls run, and names both.
    fn save_state(&self) -> Option<Vec<u8>> {
        let region = self.region?;
        let dsm = self.dsm.get()?;
        dsm.snapshot_version(region, self.executed).ok()?;
        Some(encode_state(region, self.executed))
    }

    /// Takes up the checkpoint's region and count; the control plane put
    /// the region's snapshot of the same version back before
    /// ([`regions_of`]).
    fn restore_state(&mut self, state: &[u8]) -> Result<(), String> {
        let (region, executed) = decode_state(state)?;
        self.region = Some(region);
        self.executed = executed;
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RegionFailoverError {
    #[error(transparent)]
    Dsm(#[from] DsmRackError),
    #[error("the Gatekeeper: {0}")]
    Gatekeeper(#[from] GatekeeperError),
    #[error("an export: {0}")]
    Export(#[from] remora_wire::bifrost::ExportError),
    #[error("{0} did not happen within {1:?}")]
    TimedOut(&'static str, Duration),
    #[error("the failed node left no checkpoint")]
    NoCheckpoint,
    #[error("restoring the spare: {0}")]
    Restore(#[from] crate::rpc::checkpoint::CheckpointError),
    #[error(transparent)]
    Answers(#[from] crate::rpc::scenario::ScenarioError),
    #[error("the region holds {value} after {calls} calls")]
    WrongRegion { calls: u64, value: u64 },
    #[error("an agent is missing")]
    MissingAgent,
    #[error("the region: {0}")]
    Region(#[from] crate::dsm::client::DsmError),
    #[error("the checkpoint's state: {0}")]
    State(String),
    #[error("starting the service's worker: {0}")]
    Worker(#[from] std::io::Error),
}

/// What [`region_failover`] saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionFailover {
    pub calls: u64,
    /// The region's count when the node failed (its worker may have run
    /// calls whose answers never left), and the version of the checkpoint
    /// the replacement started from: the calls between ran twice on the
    /// hosts and count once in the region.
    pub region_at_failure: u64,
    pub checkpoint_version: u64,
    pub replayed: u64,
    /// b1 commits the Gatekeeper took (each call as it reached the
    /// service's worker), and the calls the kept checkpoint had received
    /// and not answered, which the replacement ran itself.
    pub commits: u64,
    pub received_in_checkpoint: u64,
}

const SERVICE_HOST_INDEX: usize = 0;
const SPARE_HOST_INDEX: usize = 1;

/// `calls` calls of "add" from the compute node, 8 at a time, through the
/// Gatekeeper to a [`RegionCounter`] on a host of its own; a spare stands
/// by. After `crash_after` answers the service's host crashes; the
/// Gatekeeper finds it by its missed heartbeats; the control plane hands
/// its memory rights to the spare, restores the spare from the kept
/// checkpoint (the region's snapshot of that version put back) and moves
/// its routes, and the switch replays the calls. Checks that the answers
/// are exactly 1..=calls and the region ends at `calls`.
pub fn region_failover(
    calls: u64,
    crash_after: u64,
) -> Result<RegionFailover, RegionFailoverError> {
    let mut rack = RegionRack::start(calls)?;
    rack.wait_for_answers("the answers before the crash", crash_after)?;
    let [node, spare] = rack.hosts.map(|host| rack.address(host));
    rack.dsm_rack.rack.crash(rack.hosts[0]);
    wait_for("the Gatekeeper's detection", Duration::from_secs(5), || {
        lock(&rack.switch)
            .switch
            .program_mut()
            .take_detected()
            .contains(&node)
    })?;
    let start = rack.start_spare(node, spare)?;
    lock(&rack.switch)
        .switch
        .program_mut()
        .recover(node, spare)?;
    rack.dsm_rack.rack.kick();
    rack.wait_for_answers("every answer", calls)?;
    crate::rpc::scenario::check_counts(rack.outcomes()?, calls)?;
    let value = rack.spare_region_count()?;
    if value != calls {
        return Err(RegionFailoverError::WrongRegion { calls, value });
    }
    let counters = lock(&rack.switch).switch.program().counters();
    Ok(RegionFailover {
        calls,
        region_at_failure: start.region_at_failure,
        checkpoint_version: start.checkpoint_version,
        replayed: counters.replayed,
        commits: counters.commits,
        received_in_checkpoint: start.received_in_checkpoint,
    })
}

/// [`region_failover`]'s rack, running.
struct RegionRack {
    dsm_rack: crate::dsm::rack::DsmRack,
    switch: remora_rack::endpoint::Shared<
        remora_rack::endpoint::SwitchEndpoint<
            remora_switch::programs::overlay::Overlaid<Gatekeeper>,
        >,
    >,
    /// The service's host and the spare's.
    hosts: [usize; 2],
    /// Their DSMs, set once the rack runs.
    dsms: [Arc<OnceLock<Dsm>>; 2],
    calls: u64,
}

/// What the spare started from.
struct SpareStart {
    region_at_failure: u64,
    checkpoint_version: u64,
    received_in_checkpoint: u64,
}

impl RegionRack {
    /// The service's host and the spare, each a [`RegionCounter`] on a
    /// worker with heartbeats to the Gatekeeper (the first exports "add"),
    /// and a client making `calls` calls, 8 at a time.
    fn start(calls: u64) -> Result<RegionRack, RegionFailoverError> {
        let config = DsmRackConfig::default();
        let mut staged = StagedDsm::new(config, 2)?;
        let hosts = [
            StagedDsm::extra_client_host(&config, SERVICE_HOST_INDEX),
            StagedDsm::extra_client_host(&config, SPARE_HOST_INDEX),
        ];
        let topology = staged.staged.topology().clone();
        let service = callee_at(topology.switch_mac, SERVICE_ADDRESS);
        let dsms: [Arc<OnceLock<Dsm>>; 2] = [Arc::default(), Arc::default()];
        for (index, &host) in hosts.iter().enumerate() {
            let counter = RegionCounter::new(Arc::clone(&dsms[index]));
            let worker = WorkerPool::new(vec![Box::new(counter)])?;
            let callee = Callee::with_checkpoints(Box::new(worker)).committing_to(service);
            staged
                .staged
                .add_agent(host, Arc::new(Mutex::new(ServerAgent::new(callee))));
            let control =
                ControlAgent::new(service, NodeKind::Compute, 1 << 20, HEARTBEAT_INTERVAL);
            let control = if index == SERVICE_HOST_INDEX {
                control.export("add")?
            } else {
                control
            };
            staged.staged.add_agent(host, Arc::new(Mutex::new(control)));
        }
        let caller = Caller::new(RACK_RESEND_AFTER, 10_000);
        let client = ClientAgent::new(caller, service, "add", 40000, calls, 8);
        staged
            .staged
            .add_agent(COMPUTE_HOST, Arc::new(Mutex::new(client)));
        let gatekeeper = Gatekeeper::new(GatekeeperConfig {
            heartbeat_timeout: Some(HEARTBEAT_TIMEOUT),
            ..GatekeeperConfig::new(SERVICE_ADDRESS)
        });
        let (dsm_rack, extra, switch) = staged.start_guarded(gatekeeper)?;
        for (slot, dsm) in dsms.iter().zip(extra) {
            let _ = slot.set(dsm);
        }
        Ok(RegionRack {
            dsm_rack,
            switch,
            hosts,
            dsms,
            calls,
        })
    }

    fn address(&self, host: usize) -> remora_wire::Ipv4Address {
        self.dsm_rack.rack.topology().host(host).address
    }

    fn spare_dsm(&self) -> Result<&Dsm, RegionFailoverError> {
        self.dsms[1].get().ok_or(RegionFailoverError::MissingAgent)
    }

    /// Runs `f` on the client agent.
    fn with_client<R>(&self, f: impl FnOnce(&ClientAgent) -> R) -> Option<R> {
        let agent = self.dsm_rack.rack.agent(COMPUTE_HOST, 0)?;
        let mut guard = agent.lock().expect("agent lock");
        guard
            .as_any_mut()
            .downcast_mut::<ClientAgent>()
            .map(|client| f(client))
    }

    fn wait_for_answers(&self, what: &'static str, count: u64) -> Result<(), RegionFailoverError> {
        let limit = Duration::from_secs(20 + self.calls / 10);
        wait_for(what, limit, || {
            self.with_client(|client| client.outcomes.len() as u64 >= count)
                .unwrap_or(false)
        })
    }

    fn outcomes(&self) -> Result<crate::rpc::scenario::Answers, RegionFailoverError> {
        self.with_client(|client| client.outcomes.clone())
            .ok_or(RegionFailoverError::MissingAgent)
    }

    /// The control plane's part: the failed node's rights to the spare,
    /// its regions' snapshots of the kept checkpoint's version put back,
    /// then the spare restored from that checkpoint.
    fn start_spare(
        &mut self,
        node: remora_wire::Ipv4Address,
        spare: remora_wire::Ipv4Address,
    ) -> Result<SpareStart, RegionFailoverError> {
        let checkpoint = {
            let mut endpoint = lock(&self.switch);
            let program = endpoint.switch.program_mut();
            program.hand_over_memory(node, spare);
            program
                .checkpoint_of(node)
                .map(<[u8]>::to_vec)
                .ok_or(RegionFailoverError::NoCheckpoint)?
        };
        let decoded = crate::rpc::checkpoint::Checkpoint::decode(&checkpoint)?;
        let (regions, version) = regions_of(&decoded.state).map_err(RegionFailoverError::State)?;
        let mut count = [0u8; 8];
        self.spare_dsm()?.read(regions[0], &mut count)?;
        for region in regions {
            self.spare_dsm()?.restore_version(region, version)?;
        }
        with_server(&self.dsm_rack.rack, self.hosts[1], |server| {
            server.callee.restore(&checkpoint)
        })??;
        Ok(SpareStart {
            region_at_failure: u64::from_be_bytes(count),
            checkpoint_version: decoded.executed,
            received_in_checkpoint: decoded
                .received
                .values()
                .map(|calls| calls.len() as u64)
                .sum(),
        })
    }

    /// The count in the spare's region now.
    fn spare_region_count(&self) -> Result<u64, RegionFailoverError> {
        let region = with_server(&self.dsm_rack.rack, self.hosts[1], |server| {
            server
                .callee
                .checkpoint()
                .and_then(|checkpoint| decode_state(&checkpoint.state).ok())
        })?
        .ok_or(RegionFailoverError::NoCheckpoint)?
        .0;
        let mut value = [0u8; 8];
        self.spare_dsm()?.read(region, &mut value)?;
        Ok(u64::from_be_bytes(value))
    }
}

/// How often the nodes send heartbeats, and how long a silence fails a
/// node: generous, since a descheduled thread on a shared 2-core machine
/// is not a failed node.
const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(2);
const HEARTBEAT_TIMEOUT: Duration = Duration::from_millis(100);

fn wait_for(
    what: &'static str,
    limit: Duration,
    mut done: impl FnMut() -> bool,
) -> Result<(), RegionFailoverError> {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > limit {
            return Err(RegionFailoverError::TimedOut(what, limit));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

fn with_server<R>(
    rack: &remora_rack::assembly::EmbeddedRack,
    host: usize,
    f: impl FnOnce(&mut ServerAgent) -> R,
) -> Result<R, RegionFailoverError> {
    let agent = rack
        .agent(host, 0)
        .ok_or(RegionFailoverError::MissingAgent)?;
    let mut guard = agent.lock().expect("agent lock");
    let server = guard
        .as_any_mut()
        .downcast_mut::<ServerAgent>()
        .ok_or(RegionFailoverError::MissingAgent)?;
    Ok(f(server))
}
