//! `remora bench bifrost`: the thesis's ping (§7) through Bifröst on the
//! embedded rack — a generated Thrift client on the compute node, RPC
//! datagrams through the L2/L3 switch (the Gatekeeper bypassed, the
//! thesis's measured setup), a generated processor on another host —
//! against the same Thrift service over TCP on loopback (TCP_NODELAY)
//! and a raw UDP ping-pong, in one run.

mod breakdown;

use super::report::Report;
use hdrhistogram::Histogram;
use remora_bifrost::arrays::{arrays_rack, Workload, INCREMENT};
use remora_bifrost::by_reference::pass_by_reference;
use remora_bifrost::dsm::rack::DsmRackConfig;
use remora_bifrost::dsm_service::DsmServiceRack;
use remora_bifrost::services::{
    ArraysByValueSyncClient, ArraysByValueSyncHandler, ArraysByValueSyncProcessor,
    ArraysSyncClient, EchoSyncClient, EchoSyncHandler, EchoSyncProcessor, PingSyncClient,
    PingSyncHandler, PingSyncProcessor, TArraysByValueSyncClient, TEchoSyncClient, TPingSyncClient,
};
use remora_bifrost::transport::{
    client_protocols, client_protocols_passing, Routing, ServiceRack, StageClock, ThriftService,
};
use std::io::{BufReader, BufWriter};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use thrift::protocol::{TBinaryInputProtocol, TBinaryOutputProtocol};
use thrift::server::TProcessor;

/// The thesis's ping request: 29 bytes of UDP/TCP payload.
const PING_BYTES: usize = 29;

#[derive(Debug, thiserror::Error)]
pub enum BifrostBenchError {
    #[error(transparent)]
    Rack(#[from] remora_bifrost::transport::ServiceRackError),
    #[error("a ping failed: {0}")]
    Thrift(#[from] thrift::Error),
    #[error("loopback TCP: {0}")]
    Tcp(#[from] std::io::Error),
    #[error("{0}")]
    PingPong(String),
    #[error("the raw UDP ping-pong: {0}")]
    UdpPingPong(#[from] super::switch::SwitchBenchError),
    #[error(transparent)]
    Arrays(#[from] remora_bifrost::dsm_service::DsmServiceRackError),
    #[error("the DSM: {0}")]
    Dsm(#[from] remora_bifrost::dsm::client::DsmError),
    #[error("the simulator's {run}: {source}")]
    Simulator {
        run: &'static str,
        source: remora_bifrost::rpc::scenario::ScenarioError,
    },
}

struct Pong;

impl PingSyncHandler for Pong {
    fn handle_ping(&self) -> thrift::Result<()> {
        Ok(())
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 10_000_000_000, 3).expect("valid bounds")
}

fn time_pings(
    client: &mut dyn TPingSyncClient,
    duration: Duration,
) -> Result<Histogram<u64>, BifrostBenchError> {
    // A warm-up, then the measured calls.
    for _ in 0..100 {
        client.ping()?;
    }
    let mut latencies = histogram();
    let started = Instant::now();
    while started.elapsed() < duration {
        let begun = Instant::now();
        client.ping()?;
        latencies.saturating_record(begun.elapsed().as_nanos() as u64);
    }
    Ok(latencies)
}

/// Ping through Bifröst on the embedded rack.
fn bifrost_ping(duration: Duration, routing: Routing) -> Result<Histogram<u64>, BifrostBenchError> {
    let service = ThriftService::new(PingSyncProcessor::new(Pong));
    let ServiceRack { rack: _rack, path } =
        ServiceRack::start(Box::new(service), routing, &["ping"])?;
    let (input, output) = client_protocols(path);
    time_pings(&mut PingSyncClient::new(input, output), duration)
}

/// A generated processor served over TCP on loopback (Nagle off) until
/// the client hangs up; the client's protocols, its stream, and the
/// server thread.
fn thrift_over_tcp<P: TProcessor + Send + 'static>(
    processor: P,
) -> Result<TcpClient, BifrostBenchError> {
    thrift_over_tcp_with(processor, None, &breakdown::StreamClock::default())
}

/// [`thrift_over_tcp`], timed: the server records in `server_clock` each
/// call's time from its request's first bytes to its reply written, and
/// the client's stream notes in `client_clock` when it flushed and when
/// its reply's first bytes came.
fn thrift_over_tcp_with<P: TProcessor + Send + 'static>(
    processor: P,
    server_clock: Option<std::sync::Arc<StageClock>>,
    client_clock: &breakdown::StreamClock,
) -> Result<TcpClient, BifrostBenchError> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let server = std::thread::spawn(move || -> Result<(), thrift::Error> {
        let (stream, _) = listener.accept()?;
        stream.set_nodelay(true)?;
        let clock = breakdown::StreamClock::default();
        let (mut input, mut output) = timed_protocols(stream, &clock)?;
        // Until the client hangs up.
        loop {
            clock.expect_reply();
            if processor.process(&mut input, &mut output).is_err() {
                return Ok(());
            }
            if let (Some(server_clock), Some(arrived)) = (&server_clock, clock.first_read()) {
                server_clock.record(arrived.elapsed());
            }
        }
    });
    let stream = TcpStream::connect(address)?;
    stream.set_nodelay(true)?;
    let (input, output) = timed_protocols(stream.try_clone()?, client_clock)?;
    Ok(TcpClient {
        input,
        output,
        stream,
        server,
    })
}

/// Bytes a TCP end buffers before it writes: a whole message of the
/// largest size measured, so that each message leaves in one write at the
/// flush, as Thrift's buffered transport sends it, and marshalling and
/// sending do not overlap in the breakdown.
const TCP_BUFFER_BYTES: usize = 5 << 20;

/// Binary protocols over `stream`, both halves noting their times in
/// `clock`.
fn timed_protocols(
    stream: TcpStream,
    clock: &breakdown::StreamClock,
) -> std::io::Result<(TcpInput, TcpOutput)> {
    let reader = breakdown::TimedReader {
        inner: stream.try_clone()?,
        clock: clock.clone(),
    };
    let writer = breakdown::TimedWriter {
        inner: stream,
        clock: clock.clone(),
    };
    Ok((
        TBinaryInputProtocol::new(BufReader::new(reader), true),
        TBinaryOutputProtocol::new(BufWriter::with_capacity(TCP_BUFFER_BYTES, writer), true),
    ))
}

type TcpInput = TBinaryInputProtocol<BufReader<breakdown::TimedReader<TcpStream>>>;
type TcpOutput = TBinaryOutputProtocol<BufWriter<breakdown::TimedWriter<TcpStream>>>;

struct TcpClient {
    input: TcpInput,
    output: TcpOutput,
    stream: TcpStream,
    server: std::thread::JoinHandle<Result<(), thrift::Error>>,
}

impl TcpClient {
    fn hang_up(
        stream: TcpStream,
        server: std::thread::JoinHandle<Result<(), thrift::Error>>,
    ) -> Result<(), BifrostBenchError> {
        stream.shutdown(std::net::Shutdown::Both)?;
        let _ = server.join();
        Ok(())
    }
}

/// The same Thrift service over TCP on loopback, Nagle off.
fn thrift_tcp_ping(duration: Duration) -> Result<Histogram<u64>, BifrostBenchError> {
    let TcpClient {
        input,
        output,
        stream,
        server,
    } = thrift_over_tcp(PingSyncProcessor::new(Pong))?;
    let latencies = time_pings(&mut PingSyncClient::new(input, output), duration);
    TcpClient::hang_up(stream, server)?;
    latencies
}

/// Raw TCP request/response of `size` bytes between two threads on
/// loopback (Nagle off): the kernel's floor for the Thrift-over-TCP line.
fn tcp_pingpong(size: usize, duration: Duration) -> Result<Histogram<u64>, BifrostBenchError> {
    use std::io::{Read, Write};
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut stream, _) = listener.accept()?;
        stream.set_nodelay(true)?;
        let mut message = vec![0u8; size];
        // Until the client hangs up.
        while stream.read_exact(&mut message).is_ok() {
            stream.write_all(&message)?;
        }
        Ok(())
    });
    let mut stream = TcpStream::connect(address)?;
    stream.set_nodelay(true)?;
    let request = vec![0xa5u8; size];
    let mut reply = vec![0u8; size];
    let latencies = time_calls(duration, || {
        let begun = Instant::now();
        stream.write_all(&request)?;
        stream.read_exact(&mut reply)?;
        Ok(begun.elapsed())
    })?;
    stream.shutdown(std::net::Shutdown::Both)?;
    let _ = server.join();
    Ok(latencies)
}

/// A generated client's halves over one connected UDP socket: each
/// flushed Thrift message is one datagram, each reply one datagram.
struct UdpWriteHalf {
    socket: std::net::UdpSocket,
    outgoing: Vec<u8>,
}

struct UdpReadHalf {
    socket: std::net::UdpSocket,
    incoming: std::io::Cursor<Vec<u8>>,
}

/// The largest Thrift message over UDP here.
const MAX_UDP_MESSAGE: usize = 65_507;

impl std::io::Write for UdpWriteHalf {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.outgoing.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.socket.send(&self.outgoing)?;
        self.outgoing.clear();
        Ok(())
    }
}

impl std::io::Read for UdpReadHalf {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        if self.incoming.position() as usize >= self.incoming.get_ref().len() {
            let mut datagram = vec![0u8; MAX_UDP_MESSAGE];
            let length = self.socket.recv(&mut datagram)?;
            datagram.truncate(length);
            self.incoming = std::io::Cursor::new(datagram);
        }
        self.incoming.read(buffer)
    }
}

/// The Thrift ping over UDP on loopback: the generated processor answers
/// each datagram with one.
fn thrift_udp_ping(duration: Duration) -> Result<Histogram<u64>, BifrostBenchError> {
    use std::net::UdpSocket;
    use std::sync::atomic::{AtomicBool, Ordering};
    let server_socket = UdpSocket::bind("127.0.0.1:0")?;
    server_socket.set_read_timeout(Some(Duration::from_millis(50)))?;
    let address = server_socket.local_addr()?;
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let server_stop = std::sync::Arc::clone(&stop);
    let server = std::thread::spawn(move || -> Result<(), thrift::Error> {
        let processor = PingSyncProcessor::new(Pong);
        let mut datagram = vec![0u8; MAX_UDP_MESSAGE];
        while !server_stop.load(Ordering::Relaxed) {
            let Ok((length, from)) = server_socket.recv_from(&mut datagram) else {
                continue;
            };
            let mut input = TBinaryInputProtocol::new(&datagram[..length], true);
            let mut output = TBinaryOutputProtocol::new(Vec::new(), true);
            processor.process(&mut input, &mut output)?;
            server_socket.send_to(&output.transport, from)?;
        }
        Ok(())
    });
    let socket = UdpSocket::bind("127.0.0.1:0")?;
    socket.connect(address)?;
    let input = TBinaryInputProtocol::new(
        UdpReadHalf {
            socket: socket.try_clone()?,
            incoming: std::io::Cursor::new(Vec::new()),
        },
        true,
    );
    let output = TBinaryOutputProtocol::new(
        UdpWriteHalf {
            socket,
            outgoing: Vec::new(),
        },
        true,
    );
    let latencies = time_pings(&mut PingSyncClient::new(input, output), duration);
    stop.store(true, Ordering::Relaxed);
    let _ = server.join();
    latencies
}

/// The echo service's handler: the bytes back.
struct Echoed;

impl EchoSyncHandler for Echoed {
    fn handle_echo(&self, data: Vec<u8>) -> thrift::Result<Vec<u8>> {
        Ok(data)
    }
}

/// Echoes of `bytes` through `client`, each checked.
fn time_echoes(
    client: &mut dyn TEchoSyncClient,
    bytes: usize,
    duration: Duration,
) -> Result<Histogram<u64>, BifrostBenchError> {
    let data: Vec<u8> = (0..bytes).map(|index| (index % 241) as u8).collect();
    time_calls(duration, || {
        let begun = Instant::now();
        let back = client.echo(data.clone())?;
        let elapsed = begun.elapsed();
        if back != data {
            return Err(BifrostBenchError::PingPong(format!(
                "an echo of {bytes} bytes came back different"
            )));
        }
        Ok(elapsed)
    })
}

/// Echo at each size through Bifröst with the Gatekeeper on the embedded
/// rack, then (the rack stopped, as for ping, so its polling thread does
/// not share the cores) through the same generated service over Thrift
/// TCP: (bytes, Bifröst, Thrift TCP) latencies.
fn echo(sizes: &[usize], duration: Duration) -> EchoFigures {
    let mut through_bifrost = Vec::new();
    {
        let service = ThriftService::new(EchoSyncProcessor::new(Echoed));
        let ServiceRack { rack: _rack, path } =
            ServiceRack::start(Box::new(service), Routing::Gatekeeper, &["echo"])?;
        let (input, output) = client_protocols(path);
        let mut client = EchoSyncClient::new(input, output);
        for &bytes in sizes {
            through_bifrost.push(time_echoes(&mut client, bytes, duration)?);
        }
    }
    let TcpClient {
        input,
        output,
        stream,
        server,
    } = thrift_over_tcp(EchoSyncProcessor::new(Echoed))?;
    let mut client = EchoSyncClient::new(input, output);
    let mut figures = Vec::new();
    for (&bytes, bifrost) in sizes.iter().zip(through_bifrost) {
        figures.push((bytes, bifrost, time_echoes(&mut client, bytes, duration)?));
    }
    TcpClient::hang_up(stream, server)?;
    Ok(figures)
}

type EchoFigures = Result<Vec<(usize, Histogram<u64>, Histogram<u64>)>, BifrostBenchError>;

/// The by-value baseline's handler; with a clock, each call's
/// computation is timed.
#[derive(Default)]
struct ArraysByValue {
    compute: Option<std::sync::Arc<StageClock>>,
}

impl ArraysByValue {
    fn timed<T>(&self, work: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let result = work();
        if let Some(clock) = &self.compute {
            clock.record(started.elapsed());
        }
        result
    }
}

impl ArraysByValueSyncHandler for ArraysByValue {
    fn handle_increment_array(&self, mut array: Vec<u8>, value: i8) -> thrift::Result<Vec<u8>> {
        self.timed(|| {
            array
                .iter_mut()
                .for_each(|byte| *byte = byte.wrapping_add(value as u8));
            Ok(array)
        })
    }

    fn handle_add_arrays(&self, mut a: Vec<u8>, b: Vec<u8>) -> thrift::Result<Vec<u8>> {
        self.timed(|| {
            a.iter_mut()
                .zip(&b)
                .for_each(|(x, y)| *x = x.wrapping_add(*y));
            Ok(a)
        })
    }
}

/// One workload's latencies at one size, in ns.
struct ArraysFigure {
    bytes: usize,
    /// Through the Gatekeeper, its ACL on.
    by_reference: Histogram<u64>,
    writing_inputs: Histogram<u64>,
    /// By reference, the Gatekeeper bypassed (plain forwarding, no ACL).
    bypassed: Histogram<u64>,
    thrift_tcp: Histogram<u64>,
}

/// Calls of one variant at one size, for `duration` and at least five,
/// after one to warm up; each call returns its own timed region.
fn time_calls(
    duration: Duration,
    mut call: impl FnMut() -> Result<Duration, BifrostBenchError>,
) -> Result<Histogram<u64>, BifrostBenchError> {
    call()?;
    let mut latencies = histogram();
    let started = Instant::now();
    while started.elapsed() < duration || latencies.len() < 5 {
        latencies.saturating_record(call()?.as_nanos() as u64);
    }
    Ok(latencies)
}

/// The array workloads at each size: Bifröst by reference (inputs already
/// in global memory) through the Gatekeeper and bypassing it, Bifröst
/// writing its inputs inside the timed region, and the same service by
/// value through Thrift over TCP.
fn arrays_workload(
    workload: Workload,
    sizes: &[usize],
    duration: Duration,
) -> Result<Vec<ArraysFigure>, BifrostBenchError> {
    let guarded = by_reference(workload, Routing::Gatekeeper, sizes, duration)?;
    let bypassed = by_reference(workload, Routing::Bypass, sizes, duration)?;
    let by_value = by_value(workload, sizes, duration)?;
    Ok(sizes
        .iter()
        .zip(guarded.into_iter().zip(bypassed).zip(by_value))
        .map(
            |(&bytes, (((by_reference, writing_inputs), (bypassed, _)), thrift_tcp))| {
                ArraysFigure {
                    bytes,
                    by_reference,
                    writing_inputs,
                    bypassed,
                    thrift_tcp,
                }
            },
        )
        .collect())
}

/// The DSM's largest single transfer in the array benchmarks.
const ARRAYS_CHUNK_BYTES: usize = 1 << 20;

/// One size's latencies by reference: inputs already in global memory,
/// and written inside the timed call.
type ByReference = (Histogram<u64>, Histogram<u64>);

/// Bifröst's calls of `workload` at each size, by reference: with the
/// inputs in global memory before the call, and written inside it.
/// Through the Gatekeeper, its ACL lends the inputs to the service for the
/// call and hands it the result's control with the reply; the result is
/// freed after each timed call.
fn by_reference(
    workload: Workload,
    routing: Routing,
    sizes: &[usize],
    duration: Duration,
) -> Result<Vec<ByReference>, BifrostBenchError> {
    let config = DsmRackConfig {
        pool_bytes: 32 << 20,
        // One work request moves up to 1 MiB (RDMA allows 2 GiB): an
        // array of the sizes measured is one READ or WRITE, not sixteen
        // each waited for.
        chunk_bytes: ARRAYS_CHUNK_BYTES,
        ..DsmRackConfig::default()
    };
    let DsmServiceRack {
        rack: _rack,
        dsm,
        path,
        ..
    } = arrays_rack(config, 2, routing)?;
    let ((input, output), pointer) = client_protocols_passing(path);
    let mut bifrost = ArraysSyncClient::new(input, output);
    let mut figures = Vec::new();
    for &bytes in sizes {
        let inputs = workload.inputs(bytes);
        let slices: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let passed = pass_by_reference(&dsm, &slices)?;
        let mut result = vec![0u8; bytes];
        let returned = workload.call(&mut bifrost, &pointer, &passed)?;
        dsm.read(returned.allocation, &mut result)?;
        dsm.free(returned.allocation)?;
        if result != workload.expected(&inputs) {
            return Err(BifrostBenchError::PingPong(format!(
                "{} of {bytes} B gave a wrong answer",
                workload.name()
            )));
        }
        let timed = time_calls(duration, || {
            let begun = Instant::now();
            let returned = workload.call(&mut bifrost, &pointer, &passed)?;
            let elapsed = begun.elapsed();
            dsm.free(returned.allocation)?;
            Ok(elapsed)
        })?;
        let writing_inputs = time_calls(duration, || {
            let begun = Instant::now();
            for (argument, input) in passed.1.iter().zip(&inputs) {
                dsm.write_at(argument.allocation, argument.at, input)?;
            }
            let returned = workload.call(&mut bifrost, &pointer, &passed)?;
            let elapsed = begun.elapsed();
            dsm.free(returned.allocation)?;
            Ok(elapsed)
        })?;
        dsm.free(passed.0)?;
        figures.push((timed, writing_inputs));
    }
    Ok(figures)
}

/// The same service by value through Thrift over TCP, at each size. The
/// client takes its arguments by value: they are copied outside the timed
/// region, as the by-reference arrays were written.
fn by_value(
    workload: Workload,
    sizes: &[usize],
    duration: Duration,
) -> Result<Vec<Histogram<u64>>, BifrostBenchError> {
    let TcpClient {
        input,
        output,
        stream,
        server,
    } = thrift_over_tcp(ArraysByValueSyncProcessor::new(ArraysByValue::default()))?;
    let mut thrift = ArraysByValueSyncClient::new(input, output);
    let mut figures = Vec::new();
    for &bytes in sizes {
        let inputs = workload.inputs(bytes);
        let expected = workload.expected(&inputs);
        let mut checked = false;
        figures.push(time_calls(duration, || {
            let mut copies = inputs.clone();
            let begun = Instant::now();
            let answer = match workload {
                Workload::IncrementArray => thrift.increment_array(copies.remove(0), INCREMENT)?,
                Workload::AddArrays => {
                    let a = copies.remove(0);
                    thrift.add_arrays(a, copies.remove(0))?
                }
            };
            let elapsed = begun.elapsed();
            if !checked && answer != expected {
                return Err(BifrostBenchError::PingPong(
                    "a wrong answer over TCP".into(),
                ));
            }
            checked = true;
            Ok(elapsed)
        })?);
    }
    drop(thrift);
    TcpClient::hang_up(stream, server)?;
    Ok(figures)
}

/// Prints and records one workload's figures; returns, at 1 MiB if
/// measured, the by-reference p50 over Thrift's and over the bypass's.
fn report_arrays(
    report: &mut Report,
    workload: Workload,
    figures: &[ArraysFigure],
) -> Option<(f64, f64)> {
    let name = workload.name();
    println!(
        "\n{:<16} {:>20} {:>20} {:>20} {:>20}",
        name, "by reference p50 us", "+ writing inputs", "gatekeeper bypassed", "thrift tcp p50 us"
    );
    let mut crossover = None;
    for figure in figures {
        let label = super::report::size_label(figure.bytes as u32);
        let [reference, writing, bypassed, tcp] = [
            &figure.by_reference,
            &figure.writing_inputs,
            &figure.bypassed,
            &figure.thrift_tcp,
        ]
        .map(|latencies| micros(latencies.value_at_quantile(0.5)));
        println!("{label:<16} {reference:>20.1} {writing:>20.1} {bypassed:>20.1} {tcp:>20.1}");
        for (variant, latencies) in [
            ("bifrost by reference", &figure.by_reference),
            ("bifrost writing inputs", &figure.writing_inputs),
            (
                "bifrost by reference, gatekeeper bypassed",
                &figure.bypassed,
            ),
            ("thrift over tcp by value", &figure.thrift_tcp),
        ] {
            let variant = format!("{name} {label} {variant}");
            record_latencies(report, &variant, "", latencies);
        }
        if crossover.is_none() && reference <= tcp {
            crossover = Some(figure.bytes);
        }
    }
    let crossover_text = crossover
        .map_or("none: by reference never caught up".to_string(), |bytes| {
            super::report::size_label(bytes as u32)
        });
    println!("crossover (by reference no slower than by value): {crossover_text}");
    report.add(
        name,
        "crossover_bytes",
        crossover.map_or(f64::NAN, |bytes| bytes as f64),
        "bytes",
    );
    figures
        .iter()
        .find(|figure| figure.bytes == 1 << 20)
        .map(|figure| {
            let p50 = |latencies: &Histogram<u64>| latencies.value_at_quantile(0.5) as f64;
            (
                p50(&figure.by_reference) / p50(&figure.thrift_tcp),
                p50(&figure.by_reference) / p50(&figure.bypassed),
            )
        })
}

/// Prints the Fig. 7.8 breakdowns and records each stage's mean, and the
/// whole figure as a series.
fn report_breakdowns(report: &mut Report, breakdowns: &[breakdown::Breakdown]) {
    println!("\nlatency breakdown, 16 KiB arrays (Fig. 7.8), mean us per call:");
    let labels: Vec<String> = breakdowns
        .iter()
        .map(|figure| format!("{} {}", figure.workload.name(), figure.system))
        .collect();
    print!("{:<38}", "stage");
    for label in &labels {
        print!(" {label:>30}");
    }
    println!();
    for (index, stage) in breakdown::STAGES.iter().enumerate() {
        print!("{stage:<38}");
        for (figure, label) in breakdowns.iter().zip(&labels) {
            let micros = figure.stages_us[index];
            print!(" {micros:>30.1}");
            report.add(&format!("breakdown {label}"), stage, micros, "us");
        }
        println!();
    }
    print!("{:<38}", "total");
    for figure in breakdowns {
        print!(" {:>30.1}", figure.stages_us.iter().sum::<f64>());
    }
    println!();
    let mut series = serde_json::Map::new();
    for (figure, label) in breakdowns.iter().zip(labels) {
        report.add(
            &format!("breakdown {label}"),
            "calls",
            figure.calls as f64,
            "calls",
        );
        let stages: serde_json::Map<String, serde_json::Value> = breakdown::STAGES
            .iter()
            .zip(figure.stages_us)
            .map(|(stage, micros)| ((*stage).to_string(), serde_json::json!(micros)))
            .collect();
        series.insert(label, serde_json::Value::Object(stages));
    }
    report.series.insert(
        "fig7_8_breakdown_us".into(),
        serde_json::Value::Object(series),
    );
}

/// Adds a variant's mean, p50 and p99 in µs (metrics `{prefix}mean` and so
/// on) to the report; returns them.
fn record_latencies(
    report: &mut Report,
    variant: &str,
    prefix: &str,
    latencies: &Histogram<u64>,
) -> [f64; 3] {
    let figures = [
        latencies.mean() / 1e3,
        micros(latencies.value_at_quantile(0.5)),
        micros(latencies.value_at_quantile(0.99)),
    ];
    for (metric, value) in ["mean", "p50", "p99"].iter().zip(figures) {
        report.add(variant, &format!("{prefix}{metric}"), value, "us");
    }
    figures
}

fn micros(nanos: u64) -> f64 {
    nanos as f64 / 1e3
}

fn run_checked(quick: bool) -> Result<Report, BifrostBenchError> {
    let duration = Duration::from_secs(if quick { 1 } else { 5 });
    let mut report = Report::new(
        "bifrost",
        serde_json::json!({
            "quick": quick,
            "seconds_per_variant": duration.as_secs(),
            "bifrost": "embedded rack, in-process rings, L2/L3 switch; generated Thrift Ping client and processor",
            "thrift_tcp": "the same generated code over TCP on loopback with TCP_NODELAY",
            "arrays": "increment_array and add_arrays (the thesis's §7.5): the generated Arrays client on the compute node passes its arrays by reference, in one allocation whose pointer the call's header carries, through the Gatekeeper with its ACL on (the call lends the allocation to the service, to read); the service, on a host of its own with two worker threads, reads them by one-sided RDMA, writes the result into an allocation of its own and returns it (the reply hands its control to the caller, which frees it after the timed call); the inputs are in global memory before the timed call (and, in the second variant, written inside it); the baseline passes the arrays by value through the generated ArraysByValue client over loopback TCP",
            "gatekeeper": "the switch runs the Gatekeeper overlay: calls go to its service address and are routed by method, tracked in the RPC graph, and digested; the bypass runs plain L2/L3 forwarding to the host's own address",
            "thrift_udp": "the same generated code, one Thrift message per UDP datagram on loopback",
            "caveat": "the TCP and Thrift-over-UDP ends block in the kernel (as Thrift's servers do) while Bifröst's fabric thread and the raw UDP ping-pong poll: on this 2-core VM a blocking wake-up costs tens of microseconds, which raw TCP's own p50 shows",
            "breakdown": "Fig. 7.8: 16 KiB arrays, Bifröst by reference through the Gatekeeper against Thrift by value over TCP; client stages timed per call, server stages as the server's means over the same calls; Bifröst's network includes its RPC runtime, the switch and the worker pool's hand-over",
        }),
    );
    let bifrost = bifrost_ping(duration, Routing::Bypass)?;
    let gatekeeper = bifrost_ping(duration, Routing::Gatekeeper)?;
    let thrift_tcp = thrift_tcp_ping(duration)?;
    let thrift_udp = thrift_udp_ping(duration)?;
    let tcp = tcp_pingpong(PING_BYTES, duration)?;
    let udp = super::switch::udp_pingpong(PING_BYTES, duration, super::switch::PingPongWait::Poll)?;
    println!(
        "{:<34} {:>10} {:>10} {:>10} {:>8}",
        "ping", "mean us", "p50 us", "p99 us", "calls"
    );
    for (variant, latencies) in [
        ("bifrost (gatekeeper bypassed)", &bifrost),
        ("bifrost through the gatekeeper", &gatekeeper),
        ("thrift over tcp", &thrift_tcp),
        ("thrift over udp", &thrift_udp),
        ("raw udp ping-pong", &udp),
        ("raw tcp ping-pong", &tcp),
    ] {
        let [mean, p50, p99] = record_latencies(&mut report, variant, "ping_", latencies);
        println!(
            "{variant:<34} {mean:>10.1} {p50:>10.1} {p99:>10.1} {:>8}",
            latencies.len()
        );
    }
    let ratio = |a: &Histogram<u64>, b: &Histogram<u64>| {
        a.value_at_quantile(0.5) as f64 / b.value_at_quantile(0.5) as f64
    };
    let named = [
        (
            "ping_p50_vs_thrift_tcp",
            ratio(&gatekeeper, &thrift_tcp),
            "<= 1.0 (Gatekeeper on)",
        ),
        (
            "gatekeeper_ping_overhead",
            ratio(&gatekeeper, &bifrost),
            "<= 1.2",
        ),
        (
            "bypass_ping_p50_vs_thrift_tcp",
            ratio(&bifrost, &thrift_tcp),
            "(reported)",
        ),
        (
            "bifrost_vs_udp_ping_p50",
            ratio(&bifrost, &udp),
            "(reported; the thesis: 3.78)",
        ),
        (
            "thrift_tcp_vs_udp_ping_p50",
            ratio(&thrift_tcp, &udp),
            "(reported)",
        ),
        (
            "thrift_tcp_vs_tcp_ping_p50",
            ratio(&thrift_tcp, &tcp),
            "(reported; the thesis: 3.09)",
        ),
        (
            "thrift_udp_vs_udp_ping_p50",
            ratio(&thrift_udp, &udp),
            "(reported)",
        ),
    ];
    let echo_sizes: &[usize] = if quick {
        &[64, 1024]
    } else {
        &[64, 1024, 2048]
    };
    let echo_duration = Duration::from_millis(if quick { 300 } else { 1500 });
    println!(
        "\n{:<10} {:>14} {:>14} {:>14} {:>14}",
        "echo", "bifrost p50 us", "p99 us", "thrift tcp p50", "p99 us"
    );
    for (bytes, bifrost, tcp) in echo(echo_sizes, echo_duration)? {
        let label = super::report::size_label(bytes as u32);
        let mut record = |variant: &str, latencies: &Histogram<u64>| {
            record_latencies(
                &mut report,
                &format!("echo_{label}_{variant}"),
                "",
                latencies,
            )
        };
        let [_, bifrost_p50, bifrost_p99] = record("gatekeeper", &bifrost);
        let [_, tcp_p50, tcp_p99] = record("thrift_tcp", &tcp);
        println!(
            "{label:<10} {bifrost_p50:>14.1} {bifrost_p99:>14.1} {tcp_p50:>14.1} {tcp_p99:>14.1}"
        );
        report.ratios.insert(
            format!("echo_{label}_p50_vs_thrift_tcp"),
            serde_json::json!(bifrost_p50 / tcp_p50),
        );
    }
    let sizes: &[usize] = if quick {
        &[1024, 64 << 10, 1 << 20]
    } else {
        &[1, 1024, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20]
    };
    let arrays_duration = Duration::from_millis(if quick { 300 } else { 1500 });
    let mut named: Vec<(&str, f64, &str)> = named.into_iter().collect();
    for workload in [Workload::IncrementArray, Workload::AddArrays] {
        let figures = arrays_workload(workload, sizes, arrays_duration)?;
        let Some((vs_thrift, vs_bypass)) = report_arrays(&mut report, workload, &figures) else {
            continue;
        };
        let (name, target, overhead) = match workload {
            Workload::AddArrays => (
                "add_arrays_1mib_vs_thrift_tcp",
                "<= 1.0",
                "gatekeeper_add_arrays_1mib_overhead",
            ),
            Workload::IncrementArray => (
                "increment_array_1mib_vs_thrift_tcp",
                "(reported)",
                "gatekeeper_increment_array_1mib_overhead",
            ),
        };
        named.push((name, vs_thrift, target));
        named.push((overhead, vs_bypass, "(reported: the ACL's cost)"));
    }
    let calls = if quick { 100 } else { 500 };
    report_breakdowns(&mut report, &breakdown::breakdowns(calls)?);
    simulator_runs(quick, &mut report)?;
    println!("\nratios:");
    for (name, value, target) in named {
        println!("  {name:<30} {value:>7.3}   {target}");
        report.ratios.insert(name.into(), serde_json::json!(value));
    }
    Ok(report)
}

/// Bifröst in the simulator (virtual time), on ideal and on ConnectX-5
/// NICs side by side (issue 20): recovery after a crash, and the rate of
/// calls 8 at a time on clean links. The ideal variants keep the names
/// they had before hardware profiles.
fn simulator_runs(quick: bool, report: &mut Report) -> Result<(), BifrostBenchError> {
    use remora_bifrost::rpc::scenario::{exactly_once, failover, REPLACEMENT_START};
    use remora_host::hardware::NicHardware;
    use remora_rack::scenario::Network;
    use std::collections::BTreeMap;
    let micros = |duration: Duration| duration.as_nanos() as f64 / 1e3;
    // The simulated stage answers `now` in steps of 100 µs: runs of
    // 10 ms and more keep that under 1%.
    let calls = if quick { 20_000 } else { 50_000 };
    let mut call_rates = BTreeMap::new();
    for hardware in NicHardware::ALL {
        let network = Network {
            faults: remora_sim::LinkFaults::NONE,
            hardware,
        };
        // The serving node falls silent, the Gatekeeper finds it failed by
        // its missed heartbeats and holds its calls, the control plane
        // starts a spare from its checkpoint, and the switch replays the
        // held calls.
        let recovered =
            failover(1, network, 2000, 1000, Duration::from_millis(1)).map_err(|source| {
                BifrostBenchError::Simulator {
                    run: "failover",
                    source,
                }
            })?;
        let (detection_us, recovery_us) = (
            micros(recovered.detection_time),
            micros(recovered.recovery_time),
        );
        println!(
            "\nrecovery after the serving node crashes (simulator, {} NICs, 1 ms heartbeat timeout): detected {detection_us:.0} us after the crash; {recovery_us:.0} us from detection to the replayed reply ({:.0} us of it the spare's start); {} calls held, {} replayed by the switch",
            hardware.name(),
            micros(REPLACEMENT_START),
            recovered.held,
            recovered.replayed
        );
        let variant = match hardware {
            NicHardware::Ideal => "failover (simulator, heartbeat timeout 1 ms)".to_string(),
            other => format!(
                "failover (simulator, heartbeat timeout 1 ms, {} NICs)",
                other.name()
            ),
        };
        report.add(&variant, "detection_time", detection_us, "us");
        report.add(&variant, "recovery_time", recovery_us, "us");
        report.add(
            &variant,
            "replayed_calls",
            recovered.replayed as f64,
            "calls",
        );
        let run =
            exactly_once(1, network, calls).map_err(|source| BifrostBenchError::Simulator {
                run: "calls",
                source,
            })?;
        let rate = run.calls as f64 / run.elapsed.as_secs_f64();
        println!(
            "  {calls} calls, 8 outstanding, exactly once: {rate:.0} calls/s of simulated time",
        );
        let variant = format!("calls (simulator, 8 outstanding, {} NICs)", hardware.name());
        report.add(&variant, "calls_per_second", rate, "calls/s");
        call_rates.insert(hardware.name(), rate);
    }
    report.ratios.insert(
        "simulated_call_rate_cx5_vs_ideal".into(),
        serde_json::json!(call_rates["cx5"] / call_rates["ideal"]),
    );
    Ok(())
}

/// `remora bench bifrost`.
pub static BENCH: super::entry::Entry<super::entry::CommonArgs, BifrostBenchError> = super::entry::Entry {
    name: "bifrost",
    about: "Bifröst: exactly-once RPC against Thrift over TCP.\n\nThe thesis's ping through a generated Thrift client and processor over Bifröst on the embedded rack, through the Gatekeeper in the switch and bypassing it, against the same Thrift service over loopback TCP and UDP and raw UDP and TCP request/response; echo at 64 B to 2 KiB through the Gatekeeper against Thrift over TCP; increment_array and add_arrays by reference (arrays in global memory, the Gatekeeper's ACL on) against by value over Thrift TCP, with the crossover size; in the simulator, recovery time after a crash and the rate of calls, on ideal and ConnectX-5 NICs side by side; mean, p50 and p99.",
    run: |args| run_checked(args.quick),
};
