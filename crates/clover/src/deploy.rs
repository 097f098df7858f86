//! Putting a Clover store on two soft RNICs: the memory node's region,
//! the metadata server beside it, one queue pair per client on the compute
//! node, the keys loaded, and (optionally) the resolver told about the
//! clients and the hottest keys. The simulator tests, the benchmark and
//! the demo all deploy through here.

use crate::layout::NextPointer;
use crate::metadata::{MetadataConfig, MetadataServer, RegionPlan, RnicRegion};
use crate::pool::{
    ClientPool, CloverError, PoolConfig, PoolWiring, Request, CLIENT_BUFFER_BYTES,
    MAX_VERBS_IN_FLIGHT,
};
use crate::resolver::ResolverError;
use crate::resolver::{CloverResolver, Resolver, WatchedRegion};
use remora_rnic::{AccessFlags, MemoryRegion, QueuePairBuilder, SoftRnic, Verbs};
use remora_switch::programs::l2l3::L2L3Forwarding;
use remora_wire::Qpn;
use remora_workloads::history::{value_with_id, LOADED_ID};
use remora_workloads::ycsb::{Generator, Operation};
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub struct StoreSpec {
    pub key_count: u64,
    pub value_bytes: usize,
    pub region_bytes: u64,
    pub clients: usize,
    pub metadata: MetadataConfig,
    pub pool: PoolConfig,
    /// The queue pairs' ACK timeout (the rack's, or a simulated one).
    pub ack_timeout: Duration,
}

pub struct Deployment {
    pub pool: ClientPool,
    pub metadata: MetadataServer,
    pub memory_region: MemoryRegion,
    /// (compute-side, memory-side) queue pair numbers, by client.
    pub queue_pairs: Vec<(Qpn, Qpn)>,
    /// Each key's first version.
    pub first_versions: Vec<NextPointer>,
}

/// Sets the store up on `compute` and `memory`.
pub fn deploy(
    spec: StoreSpec,
    compute: &mut SoftRnic,
    memory: &mut SoftRnic,
) -> Result<Deployment, CloverError> {
    let plan = RegionPlan::new(spec.key_count, spec.region_bytes)?;
    let memory_pd = memory.alloc_protection_domain()?;
    let memory_region = memory.register_memory(memory_pd, spec.region_bytes, AccessFlags::ALL)?;
    let memory_cq = memory.create_completion_queue(64)?;
    let compute_pd = compute.alloc_protection_domain()?;
    let local = compute.register_memory(
        compute_pd,
        spec.clients as u64 * CLIENT_BUFFER_BYTES,
        AccessFlags::ALL,
    )?;
    let completion_queue =
        compute.create_completion_queue(spec.clients.max(1) * MAX_VERBS_IN_FLIGHT)?;
    let mut compute_builder = QueuePairBuilder::new(compute_pd, completion_queue, completion_queue);
    compute_builder.timeout = spec.ack_timeout;
    compute_builder.send_queue_depth = MAX_VERBS_IN_FLIGHT;
    let mut memory_builder = QueuePairBuilder::new(memory_pd, memory_cq, memory_cq);
    memory_builder.timeout = spec.ack_timeout;
    let mut queue_pairs = Vec::with_capacity(spec.clients);
    let mut handles = Vec::with_capacity(spec.clients);
    for _ in 0..spec.clients {
        let near = compute.create_queue_pair(&compute_builder)?;
        let far = memory.create_queue_pair(&memory_builder)?;
        handles.push(compute.handshake(near, far.endpoint)?);
        memory.handshake(far, near.endpoint)?;
        queue_pairs.push((near.qpn, far.qpn));
    }
    let mut metadata = MetadataServer::new(plan, spec.metadata)?;
    let mut region = RnicRegion {
        rnic: memory,
        region: memory_region,
    };
    let first_versions = (0..spec.key_count)
        .map(|key| {
            metadata.load(
                key,
                &value_with_id(LOADED_ID, spec.value_bytes),
                &mut region,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let pool = ClientPool::new(
        spec.pool,
        plan,
        spec.value_bytes,
        PoolWiring {
            queue_pairs: handles,
            completion_queue,
            local,
            remote: memory_region.remote(0),
        },
    )?;
    Ok(Deployment {
        pool,
        metadata,
        memory_region,
        queue_pairs,
        first_versions,
    })
}

impl Deployment {
    /// The resolver for this store, caching `cached_keys`.
    pub fn resolver(
        &self,
        forwarding: L2L3Forwarding,
        compute: &SoftRnic,
        memory: &SoftRnic,
        cached_keys: &[u64],
    ) -> Result<CloverResolver, ResolverError> {
        let plan = self.metadata.plan();
        let port_to = |rnic: &SoftRnic| {
            let address = rnic.config().address;
            forwarding
                .port_to(address)
                .ok_or(ResolverError::Unrouted(address))
        };
        let compute_port = port_to(compute)?;
        let memory_port = port_to(memory)?;
        let mut resolver = Resolver::with_forwarding(
            forwarding,
            WatchedRegion {
                memory_address: memory.config().address,
                memory_port,
                base: self.memory_region.address,
                rkey: self.memory_region.rkey,
                slab_start: plan.slab_start(),
                region_bytes: plan.region_bytes,
            },
            cached_keys.len().max(1),
            self.queue_pairs.len().max(1),
        );
        for (near, far) in &self.queue_pairs {
            resolver.add_client(
                (memory.config().address, *far),
                (compute.config().address, *near),
                compute_port,
            )?;
        }
        for &key in cached_keys {
            let first = usize::try_from(key)
                .ok()
                .and_then(|index| self.first_versions.get(index))
                .ok_or(ResolverError::UnknownKey {
                    key,
                    key_count: self.first_versions.len(),
                })?;
            resolver.cache_key(key, *first)?;
        }
        Ok(resolver)
    }
}

/// Keeps every idle client busy with the workload's next operation while
/// `remaining` lasts. Reads and updates only (Clover's workloads); other
/// YCSB operations count as updates. Every written value carries a unique
/// id: (client + 1) << 32 | sequence.
pub struct Feeder {
    pub generator: Generator,
    pub remaining: u64,
    pub value_bytes: usize,
    sequence: u64,
}

impl Feeder {
    pub fn new(generator: Generator, operations: u64, value_bytes: usize) -> Feeder {
        Feeder {
            generator,
            remaining: operations,
            value_bytes,
            sequence: 0,
        }
    }

    pub fn feed(&mut self, pool: &mut ClientPool) -> Result<(), CloverError> {
        for client in 0..pool.client_count() {
            if self.remaining == 0 {
                return Ok(());
            }
            if !pool.is_idle(client) {
                continue;
            }
            self.remaining -= 1;
            self.sequence += 1;
            let request = match self.generator.next_operation()? {
                Operation::Read { key } => Request::Get { key },
                Operation::Update { key }
                | Operation::Insert { key }
                | Operation::ReadModifyWrite { key }
                | Operation::Scan { key, .. } => Request::Put {
                    key,
                    value: value_with_id(
                        (client as u64 + 1) << 32 | self.sequence,
                        self.value_bytes,
                    ),
                },
            };
            pool.submit(client, request)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::{Run, SwitchChoice};
    use remora_rnic::back_to_back::BackToBack;
    use remora_rnic::Timestamp;
    use remora_wire::MacAddress;

    /// The deadline was checked after a poll's completions had advanced
    /// the operations and posted their next verbs, and never for one that
    /// finished in that poll: a client descheduled past its deadline read
    /// through a pointer the collector may have reused since, and its
    /// request finished as if nothing happened. A completion past the
    /// deadline fails the poll before anything moves.
    #[test]
    fn a_completion_past_the_deadline_fails_before_anything_moves() {
        let run = Run::new(SwitchChoice::Plain);
        let spec = run.store(Duration::from_millis(1));
        let deadline = spec.pool.operation_deadline;
        let mut rig = BackToBack::new(3);
        let mut deployment = deploy(spec, &mut rig.left, &mut rig.right).unwrap();
        let pool = &mut deployment.pool;
        pool.submit(0, Request::Get { key: 1 }).unwrap();
        assert!(pool.poll(Timestamp::ZERO, &mut rig.left).unwrap());
        rig.run(1_000);
        let late = Timestamp::ZERO.saturating_add(deadline + Duration::from_micros(1));
        assert!(matches!(
            pool.poll(late, &mut rig.left),
            Err(CloverError::Deadline { client: 0, .. })
        ));
        let mut frame = vec![0u8; remora_wire::frame::MAX_FRAME_LEN];
        assert_eq!(
            rig.left.poll_transmit(late, &mut frame),
            None,
            "no verb posted after the deadline"
        );
        assert!(pool.take_finished().is_empty(), "nothing finished late");
    }

    /// A deployment on a back-to-back pair whose client 0 wrote key 1:
    /// the write returned, its shortcut WRITE is posted and not yet sent.
    fn a_write_returned() -> (BackToBack, Deployment, Duration) {
        let run = Run::new(SwitchChoice::Plain);
        let spec = run.store(Duration::from_millis(1));
        let deadline = spec.pool.operation_deadline;
        let mut rig = BackToBack::new(5);
        let mut deployment = deploy(spec, &mut rig.left, &mut rig.right).unwrap();
        let value = vec![7; run.value_bytes];
        let pool = &mut deployment.pool;
        pool.submit(0, Request::Put { key: 1, value }).unwrap();
        // Slots from the metadata server, then the entry WRITE and the
        // CAS, a round trip each.
        for _ in 0..8 {
            pool.poll(Timestamp::ZERO, &mut rig.left).unwrap();
            if !pool.take_finished().is_empty() {
                return (rig, deployment, deadline);
            }
            let mut region = RnicRegion {
                rnic: &mut rig.right,
                region: deployment.memory_region,
            };
            pool.answer_metadata(Timestamp::ZERO, &mut deployment.metadata, &mut region)
                .unwrap();
            rig.run(1_000);
        }
        panic!("the write never returned");
    }

    /// A write returns at its CAS, and its client takes requests again,
    /// but the run is not over (`all_idle`) until the shortcut WRITE it
    /// sent in the background has landed.
    #[test]
    fn a_run_waits_for_the_shortcut_write_its_last_write_sent() {
        let (mut rig, mut deployment, _) = a_write_returned();
        let pool = &mut deployment.pool;
        assert!(pool.is_idle(0), "the client is free for a request");
        assert!(!pool.all_idle(), "the shortcut WRITE is on its way");
        rig.run(1_000);
        pool.poll(Timestamp::ZERO, &mut rig.left).unwrap();
        assert!(pool.all_idle());
    }

    /// The collector's grace relies on a shortcut WRITE landing within
    /// the operation deadline of its write's start, as the write's own
    /// verbs must: one still unanswered past it fails the poll, though
    /// its write returned and its client is idle.
    #[test]
    fn a_shortcut_write_unanswered_past_the_deadline_fails_the_poll() {
        let (mut rig, mut deployment, deadline) = a_write_returned();
        let late = Timestamp::ZERO.saturating_add(deadline + Duration::from_micros(1));
        assert!(matches!(
            deployment.pool.poll(late, &mut rig.left),
            Err(CloverError::Deadline { client: 0, .. })
        ));
    }

    /// A late shortcut chains two operations: a writer's shortcut naming
    /// a slot lands up to a deadline after the slot's retirement, a
    /// reader reads it until the next collection moves it, and READs the
    /// slot up to a deadline later. At half the grace each, that reached
    /// past the slot's release (41 ms against a 40 ms grace). Every run's
    /// deadlines fit, and a run that collects no more often than its
    /// grace is refused.
    #[test]
    fn two_deadlines_and_a_collection_period_fit_in_the_grace() {
        let default = Run::new(SwitchChoice::Plain);
        let mut lossy_reuse = default;
        lossy_reuse.grace = Duration::from_millis(4);
        lossy_reuse.garbage_every = Some(Duration::from_micros(200));
        let mut bench = default;
        bench.garbage_every = Some(Duration::from_millis(20));
        for run in [default, lossy_reuse, bench] {
            let spec = run.store(Duration::from_millis(1));
            let deadline = spec.pool.operation_deadline;
            let period = run.garbage_every.unwrap();
            assert!(deadline > Duration::ZERO);
            assert!(2 * deadline + period <= spec.metadata.grace, "{run:?}");
            assert!(spec.pool.cache_lifetime + deadline <= spec.metadata.grace);
        }
        let mut rare = default;
        rare.garbage_every = Some(rare.grace);
        let mut rig = BackToBack::new(3);
        let deployment = deploy(
            rare.store(Duration::from_millis(1)),
            &mut rig.left,
            &mut rig.right,
        )
        .unwrap();
        assert!(matches!(
            crate::harness::Application::new(deployment, &rare, 1),
            Err(crate::harness::HarnessError::GraceTooShort { .. })
        ));
    }

    /// A cached key past the store's keys indexed past its first versions
    /// (a panic), and a key cached twice shared a cell with the next
    /// (lost writes): both are typed errors.
    #[test]
    fn a_resolver_caching_an_unknown_or_repeated_key_is_refused() {
        let run = Run::new(SwitchChoice::Resolver { cached_keys: 2 });
        let mut rig = BackToBack::new(1);
        let store = run.store(Duration::from_millis(1));
        let deployment = deploy(store, &mut rig.left, &mut rig.right).unwrap();
        let hosts: Vec<_> = [&rig.left, &rig.right]
            .iter()
            .map(|rnic| (rnic.config().mac, rnic.config().address))
            .collect();
        let forwarding = || {
            L2L3Forwarding::with_attached_hosts(MacAddress([2, 0, 0, 0, 0, 0xfe]), &hosts).unwrap()
        };
        let resolver = |keys: &[u64]| {
            deployment
                .resolver(forwarding(), &rig.left, &rig.right, keys)
                .map(drop)
        };
        // A switch with no route to the hosts cannot tell their ports.
        let unrouted = L2L3Forwarding::new(MacAddress([2, 0, 0, 0, 0, 0xfe]), 4);
        assert_eq!(
            deployment
                .resolver(unrouted, &rig.left, &rig.right, &[3])
                .map(drop),
            Err(ResolverError::Unrouted(rig.left.config().address))
        );
        let key_count = deployment.first_versions.len();
        assert_eq!(
            resolver(&[key_count as u64]),
            Err(ResolverError::UnknownKey {
                key: key_count as u64,
                key_count
            })
        );
        assert_eq!(resolver(&[3, 3]), Err(ResolverError::KeyCachedTwice(3)));
        assert_eq!(resolver(&[3, 4]), Ok(()));
    }
}
