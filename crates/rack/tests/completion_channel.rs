//! A channel's completion channel: a thread that sleeps on it is woken by
//! the NIC's side when a completion arrives, not by its timeout, as a
//! thread blocked in `ibv_get_cq_event` is woken by the NIC.

use remora_rack::assembly::{RackBuilder, StagedRack};
use remora_rack::channel::{connect_channels, ChannelPool};
use remora_rack::endpoint::rack_queue_pair;
use remora_rack::topology::Topology;
use remora_rnic::*;
use std::time::{Duration, Instant};

const COMPUTE: usize = 0;
const MEMORY: usize = 1;
const CHUNK_BYTES: usize = 64 << 10;

/// A staged rack with one channel from the compute node to the memory
/// node, and a chunk of the memory node's memory it may read.
fn one_channel_rack(name: &str) -> (StagedRack, ChannelPool, MemoryRegion) {
    let topology = Topology::compute_and_memory();
    let mut staged = RackBuilder::new(&topology)
        .thread_name(name)
        .build()
        .unwrap();
    let memory = staged.nic_mut(MEMORY);
    let domain = memory.alloc_protection_domain().unwrap();
    let completions = memory.create_completion_queue(8).unwrap();
    let remote = memory
        .register_memory(domain, CHUNK_BYTES as u64, AccessFlags::ALL)
        .unwrap();
    let pool = connect_channels::<()>(&mut staged, COMPUTE, MEMORY, 1, CHUNK_BYTES, || {
        rack_queue_pair(domain, completions)
    })
    .unwrap();
    (staged, pool, remote)
}

#[test]
fn a_thread_asleep_on_its_completion_channel_wakes_when_the_read_completes() {
    let (staged, pool, remote) = one_channel_rack("completion-channel");
    let switch = staged.l2l3_switch();
    let (rack, _switch) = staged.start(switch).unwrap();
    let kicker = rack.fabric().kicker();
    pool.with(|channel| {
        for round in 0..20 {
            let operation = SendOperation::Read {
                remote: remote.remote(0),
            };
            let local = channel.region.slice(0, CHUNK_BYTES as u32);
            let request = SendRequest::new(round, operation, &[local]).unwrap();
            channel
                .queues
                .post_send(channel.queue_pair, request)
                .unwrap();
            kicker.kick();
            let started = Instant::now();
            // Without the NIC's ring this sleeps its whole minute.
            channel
                .queues
                .sleep_until_completion(Duration::from_secs(60));
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "round {round}: woken after {:?}",
                started.elapsed()
            );
            let completion_queue = channel.queues.completion_queue();
            let completion = channel
                .queues
                .poll_completion(completion_queue)
                .unwrap()
                .expect("the completion that woke the thread");
            assert_eq!(completion.status, CompletionStatus::Success);
            assert_eq!(completion.work_request_id, round);
        }
    });
    let mut rack = rack;
    rack.stop_and_join().unwrap();
}

/// A borrower that panics still returns its channel: the pool's one
/// channel was lost with it, and the next borrower waited for ever.
#[test]
fn a_channel_comes_back_to_its_pool_when_its_borrower_panics() {
    let (_staged, pool, _remote) = one_channel_rack("channel-unwind");
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        pool.with(|_| panic!("a borrower's bug"))
    }));
    assert!(panicked.is_err());
    // On a thread of its own, so that a lost channel fails the test
    // rather than hanging it.
    let pool = std::sync::Arc::new(pool);
    let (sender, receiver) = std::sync::mpsc::channel();
    let borrower = std::sync::Arc::clone(&pool);
    std::thread::spawn(move || sender.send(borrower.with(|_| "borrowed again")));
    assert_eq!(
        receiver.recv_timeout(Duration::from_secs(10)),
        Ok("borrowed again"),
        "the channel never came back"
    );
}

/// A request that timed out may still complete later, and its completion
/// could pass for the next request's: the channel is retired instead of
/// being lent out again as good.
#[test]
fn a_channel_whose_request_timed_out_is_retired() {
    use remora_rack::channel::ChannelError;
    let (staged, pool, remote) = one_channel_rack("channel-retired");
    let switch = staged.l2l3_switch();
    let (rack, _switch) = staged.start(switch).unwrap();
    let kicker = rack.fabric().kicker();
    // No fabric: nothing the channel posts is ever carried.
    rack.fabric().stop();
    pool.with(|channel| {
        let read = |channel: &mut remora_rack::channel::Channel| {
            channel.one_sided(&kicker, remote.remote(0), 64, true)
        };
        assert!(matches!(read(channel), Err(ChannelError::TimedOut { .. })));
        assert!(matches!(read(channel), Err(ChannelError::Retired)));
    });
}

/// Posts a READ of the memory node's chunk into `local`, and sleeps at
/// most `timeout` for its completion.
fn read_and_wait(
    channel: &mut remora_rack::channel::Channel,
    remote: &MemoryRegion,
    local: ScatterGatherElement,
    timeout: Duration,
) -> Result<Option<WorkCompletion>, VerbsError> {
    let operation = SendOperation::Read {
        remote: remote.remote(0),
    };
    let request = SendRequest::new(7, operation, &[local]).unwrap();
    channel.queues.post_send(channel.queue_pair, request)?;
    channel.queues.sleep_until_completion(timeout);
    let completion_queue = channel.queues.completion_queue();
    channel.queues.poll_completion(completion_queue)
}

/// A work request the NIC refused when it took it from an application's
/// queue (here, naming a local key that does not exist) was an error for
/// the whole fabric thread: every host and the switch stopped, and the
/// application, told its post went in, waited out its timeout. It is now
/// that request's failed completion, and the rack runs on.
#[test]
fn a_request_the_nic_refuses_fails_alone_and_the_rack_runs_on() {
    let (staged, pool, remote) = one_channel_rack("refused-request");
    let switch = staged.l2l3_switch();
    let (mut rack, _switch) = staged.start(switch).unwrap();
    pool.with(|channel| {
        let unknown_key = ScatterGatherElement {
            address: channel.region.address,
            length_bytes: 64,
            lkey: Lkey(channel.region.lkey.0 ^ 0x5a5a_0000),
        };
        let refused = read_and_wait(channel, &remote, unknown_key, Duration::from_secs(10))
            .unwrap()
            .expect("the refused request completes");
        assert_eq!(refused.status, CompletionStatus::LocalProtectionError);
        assert_eq!(refused.work_request_id, 7);
        let good = channel.region.slice(0, 64);
        let completion = read_and_wait(channel, &remote, good, Duration::from_secs(10))
            .unwrap()
            .expect("the rack still serves the next READ");
        assert_eq!(completion.status, CompletionStatus::Success);
    });
    rack.stop_and_join().unwrap();
}

/// A host restarted with applications attached kept their queues, and
/// the next pump polled a completion queue the fresh NIC did not have:
/// the error ended the fabric thread. The applications now see their
/// device gone, and the rack runs on.
#[test]
fn a_restart_under_attached_applications_leaves_the_rack_running() {
    let (staged, pool, remote) = one_channel_rack("restart-attached");
    let switch = staged.l2l3_switch();
    let (mut rack, _switch) = staged.start(switch).unwrap();
    rack.crash(COMPUTE);
    rack.restart(COMPUTE).unwrap();
    pool.with(|channel| {
        let local = channel.region.slice(0, 64);
        let started = Instant::now();
        let gone = read_and_wait(channel, &remote, local, Duration::from_secs(10));
        assert!(matches!(gone, Err(VerbsError::DeviceGone)), "{gone:?}");
        assert!(started.elapsed() < Duration::from_secs(5));
    });
    assert!(
        !rack.is_finished(),
        "the fabric thread outlived the restart"
    );
    rack.stop_and_join().unwrap();
}

/// A pool of no channels was made, and its first borrower waited for ever
/// for a channel no one would give back (found by reading).
#[test]
fn a_pool_of_no_channels_is_refused() {
    let topology = Topology::compute_and_memory();
    let mut staged = RackBuilder::new(&topology)
        .thread_name("no-channels")
        .build()
        .unwrap();
    let memory = staged.nic_mut(MEMORY);
    let domain = memory.alloc_protection_domain().unwrap();
    let completions = memory.create_completion_queue(8).unwrap();
    let refused = connect_channels::<()>(&mut staged, COMPUTE, MEMORY, 0, CHUNK_BYTES, || {
        rack_queue_pair(domain, completions)
    });
    assert!(
        matches!(refused, Err(remora_rack::RackError::Config(_))),
        "{:?}",
        refused.err()
    );
}
