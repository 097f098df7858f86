//! `remora bench switch`: the switch and the carriers.
//!
//! 1. Forwarding: frames through the L2/L3 program on in-process rings, one
//!    thread (one core) doing source, switch and sink; in the same round,
//!    the same frames moved ring to ring with no switch, as the limit.
//! 2. READ through the switch over the in-process, shared-memory (memfd)
//!    and UDP carriers, 64 B and 4 KiB: latency p50/p99 with one READ at a
//!    time, throughput with 16 outstanding. The application thread polls
//!    its own soft RNIC; a fabric thread runs the switch and the memory
//!    node. In the same round, a raw UDP ping-pong of the same sizes
//!    between two threads is the baseline.
//!
//! Rounds alternate every variant, and figures are medians over rounds.

use super::report::{median, size_label, Report};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use remora_carrier::{DatagramPort, Port, Segment, SegmentPlan, Waiter};
use remora_rack::assembly::{EmbeddedCarrier, EmbeddedRack, RackBuilder};
use remora_rack::endpoint::{rack_queue_pair, NodeEndpoint, Pump, RackClock, SwitchEndpoint};
use remora_rack::topology::{Topology, COMPUTE_HOST, MEMORY_HOST};
use remora_rnic::*;
use remora_switch::two_hosts;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SIZES: [u32; 2] = [64, 4096];
const THROUGHPUT_DEPTH: usize = 16;
const FORWARD_BATCH: usize = 32;
const RING_DEPTH: u32 = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carrier {
    InProcess,
    SharedMemory,
    Udp,
}

const CARRIERS: [Carrier; 3] = [Carrier::InProcess, Carrier::SharedMemory, Carrier::Udp];

impl Carrier {
    /// The rack builder's carrier of the same kind.
    fn embedded(self) -> EmbeddedCarrier {
        match self {
            Carrier::InProcess => EmbeddedCarrier::InProcess,
            Carrier::SharedMemory => EmbeddedCarrier::SharedMemory,
            Carrier::Udp => EmbeddedCarrier::Udp,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Carrier::InProcess => "inproc",
            Carrier::SharedMemory => "shm",
            Carrier::Udp => "udp",
        }
    }
}

struct Plan {
    rounds: usize,
    duration: Duration,
}

/// Why the switch benchmark stopped.
#[derive(Debug, thiserror::Error)]
pub enum SwitchBenchError {
    #[error(transparent)]
    Carrier(#[from] remora_carrier::CarrierError),
    #[error(transparent)]
    Verbs(#[from] remora_rnic::VerbsError),
    #[error(transparent)]
    Rack(#[from] remora_rack::RackError),
    #[error("the compute host was not driven apart")]
    ComputeNotApart,
    #[error("a READ completed with {status:?}; requester counters {counters}")]
    ReadFailed {
        status: CompletionStatus,
        counters: String,
    },
    #[error("the fabric thread stopped: {0}")]
    FabricStopped(String),
    #[error("a READ took over 10 s")]
    ReadTimedOut,
    #[error("a {0}-byte READ through the switch returned the wrong bytes")]
    WrongBytes(u32),
    #[error("the switch dropped {0} frames on full queues; the rate would be wrong")]
    FramesLost(u64),
    #[error("the echo thread panicked")]
    EchoPanicked,
    #[error("READ {size} B over {carrier}: {error}")]
    Read {
        size: u32,
        carrier: &'static str,
        error: Box<SwitchBenchError>,
    },
}

/// In-process rings on each side of a switch for the one-thread
/// forwarding measurement: (source, switch port 0, switch port 1, sink).
/// Not a rack: one thread moves every frame, so nothing sleeps.
fn forwarding_ports() -> Result<[Box<dyn Port>; 4], SwitchBenchError> {
    let plan = SegmentPlan::star_one_waiter(2, RING_DEPTH);
    let segment = Segment::anonymous(&plan)?;
    let port = |result: Result<remora_carrier::RingPort, remora_carrier::CarrierError>| {
        result.map(|port| Box::new(port) as Box<dyn Port>)
    };
    Ok([
        port(segment.spoke_port(1))?,
        port(segment.hub_port(1))?,
        port(segment.hub_port(2))?,
        port(segment.spoke_port(2))?,
    ])
}

/// One measured READ setup: the application's endpoint (polled inline),
/// and a fabric thread running the switch and the memory node.
struct ReadRig {
    compute: NodeEndpoint,
    clock: RackClock,
    queue_pair: QueuePair,
    cq: CompletionQueue,
    local: MemoryRegion,
    remote: MemoryRegion,
    rack: EmbeddedRack,
}

impl ReadRig {
    fn new(carrier: Carrier) -> Result<ReadRig, SwitchBenchError> {
        let topology = Topology::compute_and_memory();
        // The application polls the compute host's NIC itself; a fabric
        // thread runs the switch and the memory host.
        let mut staged = RackBuilder::new(&topology)
            .carrier(carrier.embedded())
            .ring_depth(RING_DEPTH)
            .drive_apart(COMPUTE_HOST)
            .build()?;
        let mut sides = Vec::new();
        for host in [COMPUTE_HOST, MEMORY_HOST] {
            let rnic = staged.nic_mut(host);
            let pd = rnic.alloc_protection_domain()?;
            let region = rnic.register_memory(pd, 1 << 20, AccessFlags::ALL)?;
            let cq = rnic.create_completion_queue(1024)?;
            let prepared = rnic.create_queue_pair(&rack_queue_pair(pd, cq))?;
            sides.push((region, cq, prepared));
        }
        let (compute, memory) = staged.nic_pair_mut(COMPUTE_HOST, MEMORY_HOST);
        memory.write_local(sides[1].0.lkey, sides[1].0.address, &remote_pattern())?;
        let queue_pair = compute.handshake(sides[0].2, sides[1].2.endpoint)?;
        memory.handshake(sides[1].2, sides[0].2.endpoint)?;
        let compute = staged
            .take_apart(COMPUTE_HOST)
            .ok_or(SwitchBenchError::ComputeNotApart)?;
        let switch = staged.l2l3_switch();
        let (rack, _switch) = staged.start(switch)?;
        Ok(ReadRig {
            compute,
            clock: RackClock::new(),
            queue_pair,
            cq: sides[0].1,
            local: sides[0].0,
            remote: sides[1].0,
            rack,
        })
    }

    fn post_read(&mut self, size: u32, slot: u64) -> Result<(), SwitchBenchError> {
        let offset = slot * u64::from(size);
        let request = SendRequest::new(
            slot,
            SendOperation::Read {
                remote: self.remote.remote(offset),
            },
            &[self.local.slice(offset, size)],
        )?;
        Ok(self.compute.rnic.post_send(self.queue_pair, request)?)
    }

    /// Pumps the application's RNIC until a completion arrives.
    fn wait_completion(&mut self) -> Result<u64, SwitchBenchError> {
        let started = Instant::now();
        loop {
            if let Some(completion) = self.compute.rnic.poll_completion(self.cq)? {
                if completion.status != CompletionStatus::Success {
                    return Err(SwitchBenchError::ReadFailed {
                        status: completion.status,
                        counters: format!("{:?}", self.compute.rnic.counters()),
                    });
                }
                return Ok(completion.work_request_id);
            }
            self.compute.pump(&self.clock)?;
            if self.rack.is_finished() {
                let outcome = self.rack.stop_and_join();
                return Err(SwitchBenchError::FabricStopped(format!("{outcome:?}")));
            }
            if started.elapsed() > Duration::from_secs(10) {
                return Err(SwitchBenchError::ReadTimedOut);
            }
        }
    }

    fn latency(
        &mut self,
        size: u32,
        duration: Duration,
    ) -> Result<Histogram<u64>, SwitchBenchError> {
        let mut histogram =
            Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("valid bounds");
        let started = Instant::now();
        while started.elapsed() < duration {
            let begun = Instant::now();
            self.post_read(size, 0)?;
            self.wait_completion()?;
            histogram.saturating_record(begun.elapsed().as_nanos() as u64);
        }
        if std::env::var_os("REMORA_BENCH_DEBUG").is_some() {
            eprintln!("max {} us", histogram.max() / 1000);
        }
        Ok(histogram)
    }

    fn throughput(&mut self, size: u32, duration: Duration) -> Result<f64, SwitchBenchError> {
        for slot in 0..THROUGHPUT_DEPTH as u64 {
            self.post_read(size, slot)?;
        }
        let started = Instant::now();
        let mut completed = 0u64;
        while started.elapsed() < duration {
            let slot = self.wait_completion()?;
            completed += 1;
            self.post_read(size, slot)?;
        }
        let seconds = started.elapsed().as_secs_f64();
        for _ in 0..THROUGHPUT_DEPTH {
            self.wait_completion()?;
        }
        Ok(completed as f64 / seconds)
    }

    /// The last READ into slot 0 fetched the memory node's bytes.
    fn verify(&self, size: u32) -> Result<(), SwitchBenchError> {
        let mut bytes = vec![0u8; size as usize];
        self.compute
            .rnic
            .read_local(self.local.lkey, self.local.address, &mut bytes)?;
        if bytes != remote_pattern()[..size as usize] {
            return Err(SwitchBenchError::WrongBytes(size));
        }
        Ok(())
    }
}

fn remote_pattern() -> Vec<u8> {
    (0..(THROUGHPUT_DEPTH as u32 * 4096))
        .map(|index| (index.wrapping_mul(13) ^ (index >> 8)) as u8)
        .collect()
}

/// Frames per second from a source ring, through `middle`, to a sink ring,
/// all on this thread.
fn forward_rate(
    duration: Duration,
    middle: &mut dyn FnMut(&RackClock) -> Result<(), SwitchBenchError>,
    source: &mut dyn Port,
    sink: &mut dyn Port,
    frames: &[Vec<u8>],
) -> Result<f64, SwitchBenchError> {
    let clock = RackClock::new();
    let started = Instant::now();
    let mut delivered = 0u64;
    let mut next = 0;
    while started.elapsed() < duration {
        for _ in 0..FORWARD_BATCH {
            source.send(&frames[next % frames.len()])?;
            next += 1;
        }
        source.flush()?;
        middle(&clock)?;
        delivered += sink.receive(FORWARD_BATCH * 2, &mut |_| {})? as u64;
    }
    Ok(delivered as f64 / started.elapsed().as_secs_f64())
}

/// (switch frames/s, ring-to-ring frames/s), measured back to back.
fn forwarding(duration: Duration) -> Result<(f64, f64), SwitchBenchError> {
    let frames: Vec<Vec<u8>> = (0..64)
        .map(|sequence| two_hosts::send_frame(two_hosts::SMALL_PAYLOAD_BYTES, sequence))
        .collect();
    let [mut source, switch0, switch1, mut sink] = forwarding_ports()?;
    let mut switch = SwitchEndpoint::new(two_hosts::two_host_switch(), vec![switch0, switch1]);
    let through_switch = forward_rate(
        duration,
        &mut |clock| {
            switch.pump(clock)?;
            Ok(())
        },
        source.as_mut(),
        sink.as_mut(),
        &frames,
    )?;
    let lost = switch.switch.counters().dropped_queue_full;
    if lost > 0 {
        return Err(SwitchBenchError::FramesLost(lost));
    }
    let [mut source, mut ring_in, mut ring_out, mut sink] = forwarding_ports()?;
    let ring_to_ring = forward_rate(
        duration,
        &mut |_| {
            let mut failure = None;
            ring_in.receive(FORWARD_BATCH * 2, &mut |frame| {
                if let Err(error) = ring_out.send(frame) {
                    failure = Some(error);
                }
            })?;
            ring_out.flush()?;
            failure.map_or(Ok(()), |error| Err(error.into()))
        },
        source.as_mut(),
        sink.as_mut(),
        &frames,
    )?;
    Ok((through_switch, ring_to_ring))
}

/// How the ends of a UDP ping-pong wait for a datagram.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum PingPongWait {
    /// Both poll the socket without sleeping (as the READ rig's ends do).
    Poll,
    /// Both sleep in `poll(2)` until the kernel wakes them (as a progress
    /// thread that has stopped spinning does).
    Sleep,
}

/// Waits for `port` when `wait` says to sleep: at most `limit`.
fn sleep_for(waiter: &Option<Waiter>, limit: Duration) {
    if let Some(waiter) = waiter {
        waiter.block(limit, &mut || false);
    }
}

/// Round-trip time of a raw UDP ping-pong of `size`-byte datagrams between
/// two threads, both waiting as `wait` says.
pub(super) fn udp_pingpong(
    size: usize,
    duration: Duration,
    wait: PingPongWait,
) -> Result<Histogram<u64>, SwitchBenchError> {
    let (mut client, mut server) = DatagramPort::udp_pair(
        SocketAddr::from(([127, 0, 0, 11], 0)),
        SocketAddr::from(([127, 0, 0, 12], 0)),
    )?;
    let waiter_of = |port: &DatagramPort| -> Result<Option<Waiter>, SwitchBenchError> {
        Ok(match wait {
            PingPongWait::Poll => None,
            PingPongWait::Sleep => Some(Waiter::new(&[port.wait_source()])?),
        })
    };
    let (client_waiter, server_waiter) = (waiter_of(&client)?, waiter_of(&server)?);
    let stop = Arc::new(AtomicBool::new(false));
    let server_stop = Arc::clone(&stop);
    // Raised however this function ends: an error on the client's side
    // returned before the flag, and the echo thread spun on for the rest
    // of the process (a core of two, under every later benchmark).
    let _stop_on_return = RaiseOnDrop(Arc::clone(&stop));
    let echo = std::thread::spawn(move || -> Result<(), SwitchBenchError> {
        while !server_stop.load(Ordering::Relaxed) {
            let mut replies = Vec::new();
            server.receive(32, &mut |datagram| replies.push(datagram.to_vec()))?;
            if replies.is_empty() {
                sleep_for(&server_waiter, Duration::from_millis(10));
            }
            for reply in &replies {
                server.send(reply)?;
            }
            server.flush()?;
        }
        Ok(())
    });
    let datagram = vec![0xa5u8; size];
    let mut histogram =
        Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3).expect("valid bounds");
    let started = Instant::now();
    while started.elapsed() < duration {
        let begun = Instant::now();
        client.send(&datagram)?;
        client.flush()?;
        let mut answered = 0;
        while answered == 0 {
            answered = client.receive(1, &mut |_| {})?;
            if answered == 0 {
                sleep_for(&client_waiter, Duration::from_millis(10));
            }
            if begun.elapsed() > Duration::from_secs(1) {
                // A lost datagram on loopback: resend rather than hang.
                break;
            }
        }
        if answered > 0 {
            histogram.saturating_record(begun.elapsed().as_nanos() as u64);
        }
    }
    stop.store(true, Ordering::Relaxed);
    echo.join().map_err(|_| SwitchBenchError::EchoPanicked)??;
    Ok(histogram)
}

/// Raises its flag when dropped.
struct RaiseOnDrop(Arc<AtomicBool>);

impl Drop for RaiseOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Everything measured in one round, back to back.
#[derive(Default)]
struct Round {
    forward_fps: f64,
    ring_fps: f64,
    /// (carrier, size) → (p50 ns, p99 ns, READs/s).
    reads: Vec<(Carrier, u32, f64, f64, f64)>,
    /// size → (p50 ns, p99 ns).
    pingpong: Vec<(u32, f64, f64)>,
}

fn run_round(plan: &Plan, progress: &ProgressBar) -> Result<Round, SwitchBenchError> {
    let mut round = Round::default();
    let (forward, ring) = forwarding(plan.duration)?;
    round.forward_fps = forward;
    round.ring_fps = ring;
    progress.inc(1);
    for carrier in CARRIERS {
        let mut rig = ReadRig::new(carrier)?;
        for size in SIZES {
            let context = |error: SwitchBenchError| SwitchBenchError::Read {
                size,
                carrier: carrier.name(),
                error: Box::new(error),
            };
            let histogram = rig.latency(size, plan.duration).map_err(context)?;
            rig.verify(size).map_err(context)?;
            let reads_per_second = rig.throughput(size, plan.duration).map_err(context)?;
            round.reads.push((
                carrier,
                size,
                histogram.value_at_quantile(0.5) as f64,
                histogram.value_at_quantile(0.99) as f64,
                reads_per_second,
            ));
            progress.inc(1);
        }
    }
    for size in SIZES {
        let histogram = udp_pingpong(size as usize, plan.duration, PingPongWait::Poll)?;
        round.pingpong.push((
            size,
            histogram.value_at_quantile(0.5) as f64,
            histogram.value_at_quantile(0.99) as f64,
        ));
        progress.inc(1);
    }
    Ok(round)
}

/// What a READ's p50 is compared with.
enum Baseline {
    PingPong,
    Read(Carrier),
}

/// The median over rounds of (READ p50 over `carrier`) ÷ (the baseline's
/// p50), both at `size` and from the same round.
fn p50_ratio(rounds: &[Round], size: u32, carrier: Carrier, baseline: Baseline) -> f64 {
    median_of(rounds, |round| {
        let read = read_figure(round, carrier, size, |entry| entry.2);
        let base = match baseline {
            Baseline::PingPong => pingpong_figure(round, size, |entry| entry.1),
            Baseline::Read(other) => read_figure(round, other, size, |entry| entry.2),
        };
        read / base
    })
}

/// The lowest and highest round of a figure: how much the shared host moved it.
fn spread_of(rounds: &[Round], figure: impl Fn(&Round) -> f64) -> (f64, f64) {
    rounds
        .iter()
        .map(figure)
        .fold((f64::MAX, f64::MIN), |(low, high), value| {
            (low.min(value), high.max(value))
        })
}

fn median_of(rounds: &[Round], figure: impl Fn(&Round) -> f64) -> f64 {
    let mut values: Vec<f64> = rounds.iter().map(figure).collect();
    median(&mut values)
}

fn read_figure(
    round: &Round,
    carrier: Carrier,
    size: u32,
    pick: impl Fn(&(Carrier, u32, f64, f64, f64)) -> f64,
) -> f64 {
    round
        .reads
        .iter()
        .find(|entry| entry.0 == carrier && entry.1 == size)
        .map(pick)
        .expect("every round measures every variant")
}

fn pingpong_figure(round: &Round, size: u32, pick: impl Fn(&(u32, f64, f64)) -> f64) -> f64 {
    round
        .pingpong
        .iter()
        .find(|entry| entry.0 == size)
        .map(pick)
        .expect("every round measures every size")
}

pub fn run(quick: bool) -> Result<Report, SwitchBenchError> {
    let plan = if quick {
        Plan {
            rounds: 3,
            duration: Duration::from_millis(250),
        }
    } else {
        Plan {
            rounds: 7,
            duration: Duration::from_secs(1),
        }
    };
    let mut report = Report::new(
        "switch",
        serde_json::json!({
            "quick": quick,
            "rounds": plan.rounds,
            "seconds_per_measurement": plan.duration.as_secs_f64(),
            "sizes_bytes": SIZES,
            "throughput_reads_outstanding": THROUGHPUT_DEPTH,
            "forwarding": "64 distinct SEND-only frames of 88 B, batches of 32, source + L2/L3 switch + sink on one thread over in-process rings; ring_to_ring moves the same frames between the same rings with no pipeline",
            "reads": "application thread polls its own soft RNIC; one fabric thread runs the switch and the memory node and sleeps on a doorbell (rings) or in poll (UDP) when idle; the shm carrier maps a memfd segment (both ends in this process here; rack up --mode processes uses it across processes)",
            "pingpong": "raw UDP datagrams of the same sizes between two polling threads on loopback, through the same sendmmsg/recvmmsg port code",
        }),
    );
    let steps = (1 + CARRIERS.len() * SIZES.len() + SIZES.len()) * plan.rounds;
    let progress = ProgressBar::new(steps as u64);
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} measurements {msg}")
            .expect("static template"),
    );
    let mut rounds = Vec::with_capacity(plan.rounds);
    for _ in 0..plan.rounds {
        rounds.push(run_round(&plan, &progress)?);
    }
    progress.finish_and_clear();
    fill_report(&mut report, &rounds);
    Ok(report)
}

fn fill_report(report: &mut Report, rounds: &[Round]) {
    let forward = median_of(rounds, |round| round.forward_fps);
    let ring = median_of(rounds, |round| round.ring_fps);
    let forward_vs_ring = median_of(rounds, |round| round.forward_fps / round.ring_fps);
    println!(
        "forwarding (one core, in-process rings, medians of {} rounds)",
        rounds.len()
    );
    println!("  L2/L3 switch   {:>8.2} M frames/s", forward / 1e6);
    println!(
        "  ring to ring   {:>8.2} M frames/s   switch/ring {forward_vs_ring:.2}",
        ring / 1e6
    );
    report.add("l2l3_forward", "frames_per_second", forward, "frames/s");
    report.add("ring_to_ring", "frames_per_second", ring, "frames/s");
    println!("\nREAD through the switch              p50 µs    p99 µs   READs/s (16 outstanding)");
    for carrier in CARRIERS {
        for size in SIZES {
            let p50 = median_of(rounds, |round| {
                read_figure(round, carrier, size, |entry| entry.2)
            });
            let p99 = median_of(rounds, |round| {
                read_figure(round, carrier, size, |entry| entry.3)
            });
            let rate = median_of(rounds, |round| {
                read_figure(round, carrier, size, |entry| entry.4)
            });
            let variant = format!("read_{}_{}", carrier.name(), size_label(size));
            println!(
                "  {variant:<32} {:>8.2} {:>9.2} {rate:>10.0}",
                p50 / 1e3,
                p99 / 1e3
            );
            report.add(&variant, "latency_p50", p50 / 1e3, "us");
            report.add(&variant, "latency_p99", p99 / 1e3, "us");
            report.add(&variant, "throughput", rate, "reads/s");
        }
    }
    for size in SIZES {
        let p50 = median_of(rounds, |round| {
            pingpong_figure(round, size, |entry| entry.1)
        });
        let p99 = median_of(rounds, |round| {
            pingpong_figure(round, size, |entry| entry.2)
        });
        let variant = format!("udp_pingpong_{}", size_label(size));
        println!("  {variant:<32} {:>8.2} {:>9.2}", p50 / 1e3, p99 / 1e3);
        report.add(&variant, "latency_p50", p50 / 1e3, "us");
        report.add(&variant, "latency_p99", p99 / 1e3, "us");
    }
    // Ratios are taken within each round, then the median over rounds.
    let [small, large] = SIZES;
    let udp_vs_pingpong = p50_ratio(rounds, small, Carrier::Udp, Baseline::PingPong);
    let shm_vs_udp = p50_ratio(
        rounds,
        small,
        Carrier::SharedMemory,
        Baseline::Read(Carrier::Udp),
    );
    let udp_vs_pingpong_large = p50_ratio(rounds, large, Carrier::Udp, Baseline::PingPong);
    let shm_vs_udp_large = p50_ratio(
        rounds,
        large,
        Carrier::SharedMemory,
        Baseline::Read(Carrier::Udp),
    );
    let spreads = [
        (
            "forward_vs_ring",
            spread_of(rounds, |round| round.forward_fps / round.ring_fps),
        ),
        (
            "udp_read_p50_vs_udp_pingpong",
            spread_of(rounds, |round| {
                p50_ratio(
                    std::slice::from_ref(round),
                    small,
                    Carrier::Udp,
                    Baseline::PingPong,
                )
            }),
        ),
        (
            "shm_read_p50_vs_udp_read_p50",
            spread_of(rounds, |round| {
                p50_ratio(
                    std::slice::from_ref(round),
                    small,
                    Carrier::SharedMemory,
                    Baseline::Read(Carrier::Udp),
                )
            }),
        ),
    ];
    for (name, (lowest, highest)) in spreads {
        report.add(name, "lowest_round", lowest, "ratio");
        report.add(name, "highest_round", highest, "ratio");
    }
    println!("\nratios (64 B; 4 KiB in brackets; rounds lowest..highest)");
    let range = |index: usize| format!("{:.2}..{:.2}", spreads[index].1 .0, spreads[index].1 .1);
    println!(
        "  forward_vs_ring                 {forward_vs_ring:.2} ({})   target >= 0.5",
        range(0)
    );
    println!(
        "  forward_mfps                    {:.2}   target >= 2",
        forward / 1e6
    );
    println!("  udp_read_p50_vs_udp_pingpong    {udp_vs_pingpong:.2} ({}) [{udp_vs_pingpong_large:.2}]   target <= 2", range(1));
    println!("  shm_read_p50_vs_udp_read_p50    {shm_vs_udp:.2} ({}) [{shm_vs_udp_large:.2}]   target <= 0.33", range(2));
    let ratios = &mut report.ratios;
    ratios.insert("forward_vs_ring".into(), forward_vs_ring.into());
    ratios.insert("forward_mfps".into(), (forward / 1e6).into());
    ratios.insert(
        "udp_read_p50_vs_udp_pingpong".into(),
        udp_vs_pingpong.into(),
    );
    ratios.insert("shm_read_p50_vs_udp_read_p50".into(), shm_vs_udp.into());
    ratios.insert(
        "udp_read_p50_vs_udp_pingpong_4k".into(),
        udp_vs_pingpong_large.into(),
    );
    ratios.insert(
        "shm_read_p50_vs_udp_read_p50_4k".into(),
        shm_vs_udp_large.into(),
    );
}

/// `remora bench switch`.
pub static BENCH: super::entry::Entry<super::entry::CommonArgs, SwitchBenchError> = super::entry::Entry {
    name: "switch",
    about: "The switch and the carriers.\n\nL2/L3 forwarding rate against ring-to-ring, and READ latency and throughput through the switch over in-process, shared-memory and UDP carriers against a raw UDP ping-pong.",
    run: |args| run(args.quick),
};
