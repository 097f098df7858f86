//! `remora bench bifrost`: the thesis's ping (§7) through Bifröst on the
//! embedded rack — a generated Thrift client on the compute node, RPC
//! datagrams through the L2/L3 switch (the Gatekeeper bypassed, the
//! thesis's measured setup), a generated processor on another host —
//! against the same Thrift service over TCP on loopback (TCP_NODELAY)
//! and a raw UDP ping-pong, in one run.

use super::{Host, Report};
use hdrhistogram::Histogram;
use remora_bifrost::services::{
    PingSyncClient, PingSyncHandler, PingSyncProcessor, TPingSyncClient,
};
use remora_bifrost::transport::{client_protocols, ServiceRack, ThriftService};
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
    Rack(#[from] remora_rack::RackError),
    #[error("a ping failed: {0}")]
    Thrift(#[from] thrift::Error),
    #[error("loopback TCP: {0}")]
    Tcp(#[from] std::io::Error),
    #[error("{0}")]
    PingPong(String),
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
fn bifrost_ping(duration: Duration) -> Result<Histogram<u64>, BifrostBenchError> {
    let service = ThriftService::new(PingSyncProcessor::new(Pong));
    let ServiceRack { rack: _rack, path } = ServiceRack::start(Box::new(service))?;
    let (input, output) = client_protocols(path);
    time_pings(&mut PingSyncClient::new(input, output), duration)
}

/// The same Thrift service over TCP on loopback, Nagle off.
fn thrift_tcp_ping(duration: Duration) -> Result<Histogram<u64>, BifrostBenchError> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let server = std::thread::spawn(move || -> Result<(), thrift::Error> {
        let (stream, _) = listener.accept()?;
        stream.set_nodelay(true)?;
        let mut input = TBinaryInputProtocol::new(BufReader::new(stream.try_clone()?), true);
        let mut output = TBinaryOutputProtocol::new(BufWriter::new(stream), true);
        let processor = PingSyncProcessor::new(Pong);
        // Until the client hangs up.
        while processor.process(&mut input, &mut output).is_ok() {}
        Ok(())
    });
    let stream = TcpStream::connect(address)?;
    stream.set_nodelay(true)?;
    let input = TBinaryInputProtocol::new(BufReader::new(stream.try_clone()?), true);
    let output = TBinaryOutputProtocol::new(BufWriter::new(stream.try_clone()?), true);
    let latencies = time_pings(&mut PingSyncClient::new(input, output), duration);
    stream.shutdown(std::net::Shutdown::Both)?;
    let _ = server.join();
    latencies
}

fn micros(nanos: u64) -> f64 {
    nanos as f64 / 1e3
}

pub fn run(quick: bool) -> Result<Report, String> {
    run_checked(quick).map_err(|error| error.to_string())
}

fn run_checked(quick: bool) -> Result<Report, BifrostBenchError> {
    let duration = Duration::from_secs(if quick { 1 } else { 5 });
    let mut report = Report {
        bench: "bifrost".into(),
        config: serde_json::json!({
            "quick": quick,
            "seconds_per_variant": duration.as_secs(),
            "bifrost": "embedded rack, in-process rings, L2/L3 switch; generated Thrift Ping client and processor",
            "thrift_tcp": "the same generated code over TCP on loopback with TCP_NODELAY",
            "not_built": "the Gatekeeper (so no gatekeeper_ping_overhead), add_arrays by reference (so no add_arrays_1mib_vs_thrift_tcp), Thrift over UDP, raw TCP",
        }),
        host: Host::probe(),
        results: Vec::new(),
        ratios: serde_json::Map::new(),
        series: serde_json::Map::new(),
    };
    let bifrost = bifrost_ping(duration)?;
    let thrift_tcp = thrift_tcp_ping(duration)?;
    let udp =
        super::switch::udp_pingpong(PING_BYTES, duration).map_err(BifrostBenchError::PingPong)?;
    println!(
        "{:<34} {:>10} {:>10} {:>10} {:>8}",
        "ping", "mean us", "p50 us", "p99 us", "calls"
    );
    for (variant, latencies) in [
        ("bifrost (gatekeeper bypassed)", &bifrost),
        ("thrift over tcp", &thrift_tcp),
        ("raw udp ping-pong", &udp),
    ] {
        let (mean, p50, p99) = (
            latencies.mean() / 1e3,
            micros(latencies.value_at_quantile(0.5)),
            micros(latencies.value_at_quantile(0.99)),
        );
        println!(
            "{variant:<34} {mean:>10.1} {p50:>10.1} {p99:>10.1} {:>8}",
            latencies.len()
        );
        report.add(variant, "ping_mean", mean, "us");
        report.add(variant, "ping_p50", p50, "us");
        report.add(variant, "ping_p99", p99, "us");
    }
    let ratio = |a: &Histogram<u64>, b: &Histogram<u64>| {
        a.value_at_quantile(0.5) as f64 / b.value_at_quantile(0.5) as f64
    };
    let named = [
        (
            "ping_p50_vs_thrift_tcp",
            ratio(&bifrost, &thrift_tcp),
            "<= 1.0",
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
    ];
    println!("\nratios:");
    for (name, value, target) in named {
        println!("  {name:<30} {value:>7.3}   {target}");
        report.ratios.insert(name.into(), serde_json::json!(value));
    }
    Ok(report)
}
