//! The latency breakdown of the thesis's Fig. 7.8 (§7.6): 16 KiB arrays,
//! increment_array and add_arrays, Bifröst by reference through the
//! Gatekeeper against Thrift by value over TCP, each call cut into the
//! thesis's stages and the means reported side by side.
//!
//! Where each stage's time is taken:
//! - pre-processing: the client puts the inputs where the call finds them
//!   (Bifröst writes them into global memory; Thrift copies them);
//! - client marshalling: from the call to its message handed on (the
//!   transport's flush);
//! - network: from then to the reply's arrival, less the server's time
//!   (for Bifröst this includes the RPC runtime, the switch and the worker
//!   pool's hand-over);
//! - server marshalling and unmarshalling: the server's time less the
//!   handler's (Bifröst: the processor's time; Thrift: from the request's
//!   first bytes to the reply written);
//! - server computation: the handler (Bifröst's reads the inputs from
//!   global memory and writes its result there);
//! - client unmarshalling: from the reply's arrival to the call returning;
//! - post-processing: the client takes the result (Bifröst reads it from
//!   global memory and frees it; Thrift copies it).
//!
//! Client stages are timed per call; server stages are means recorded by
//! the server over the same calls.

use super::{thrift_over_tcp_with, ArraysByValue, BifrostBenchError};
use remora_bifrost::arrays::{arrays_rack_timed, ServerClocks};
use remora_bifrost::arrays::{Workload, INCREMENT};
use remora_bifrost::by_reference::{from_idl, pass_by_reference, to_idl};
use remora_bifrost::dsm::rack::DsmRackConfig;
use remora_bifrost::dsm_service::DsmServiceRack;
use remora_bifrost::services::{
    ArraysByValueSyncClient, ArraysByValueSyncProcessor, ArraysSyncClient,
    TArraysByValueSyncClient, TArraysSyncClient,
};
use remora_bifrost::transport::{client_protocols_passing, Routing, StageClock};
use std::cell::Cell;
use std::io::{Read, Write};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The thesis's array size for Fig. 7.8.
pub const BREAKDOWN_BYTES: usize = 16 << 10;

/// The stages, in the order a call passes them.
pub const STAGES: [&str; 7] = [
    "pre-processing",
    "client marshalling",
    "network",
    "server marshalling and unmarshalling",
    "server computation",
    "client unmarshalling",
    "post-processing",
];

/// One system's mean time per stage for one workload, in µs.
#[derive(Debug, Clone)]
pub struct Breakdown {
    pub system: &'static str,
    pub workload: Workload,
    pub stages_us: [f64; 7],
    pub calls: u64,
}

/// Client-side sums over the calls, per stage.
#[derive(Default)]
struct ClientStages {
    pre: Duration,
    marshal: Duration,
    round_trip: Duration,
    unmarshal: Duration,
    post: Duration,
    calls: u64,
}

impl ClientStages {
    fn add(&mut self, instants: [Instant; 6]) {
        let [began, prepared, flushed, answered, returned, taken] = instants;
        self.pre += prepared - began;
        self.marshal += flushed.saturating_duration_since(prepared);
        self.round_trip += answered.saturating_duration_since(flushed);
        self.unmarshal += returned.saturating_duration_since(answered);
        self.post += taken - returned;
        self.calls += 1;
    }

    /// The means, with the server's mean time and its handler's.
    fn breakdown(
        &self,
        system: &'static str,
        workload: Workload,
        server: &ServerClocks,
    ) -> Breakdown {
        let calls = self.calls.max(1) as f64;
        let mean = |total: Duration| total.as_nanos() as f64 / calls / 1e3;
        let micros = |clock: &StageClock| clock.mean().0.as_nanos() as f64 / 1e3;
        let (server_us, compute_us) = (micros(&server.processor), micros(&server.compute));
        Breakdown {
            system,
            workload,
            stages_us: [
                mean(self.pre),
                mean(self.marshal),
                (mean(self.round_trip) - server_us).max(0.0),
                (server_us - compute_us).max(0.0),
                compute_us,
                mean(self.unmarshal),
                mean(self.post),
            ],
            calls: self.calls,
        }
    }
}

/// Both systems on both workloads, `calls` calls each (after one to warm
/// up).
pub fn breakdowns(calls: u64) -> Result<Vec<Breakdown>, BifrostBenchError> {
    let mut all = Vec::new();
    for workload in [Workload::IncrementArray, Workload::AddArrays] {
        all.push(bifrost(workload, calls)?);
        all.push(thrift_tcp(workload, calls)?);
    }
    Ok(all)
}

fn bifrost(workload: Workload, calls: u64) -> Result<Breakdown, BifrostBenchError> {
    let clocks = ServerClocks::default();
    let config = DsmRackConfig::default();
    let DsmServiceRack {
        rack: _rack,
        dsm,
        path,
        ..
    } = arrays_rack_timed(config, 2, Routing::Gatekeeper, Some(clocks.clone()))?;
    let ((input, output), handle) = client_protocols_passing(path);
    let mut client = ArraysSyncClient::new(input, output);
    let inputs = workload.inputs(BREAKDOWN_BYTES);
    let slices: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    let (allocation, arguments) = pass_by_reference(&dsm, &slices)?;
    let mut stages = ClientStages::default();
    let mut result = vec![0u8; BREAKDOWN_BYTES];
    for call in 0..=calls {
        if call == 1 {
            // The first call warmed up: count from here.
            clocks.processor.reset();
            clocks.compute.reset();
            stages = ClientStages::default();
        }
        let began = Instant::now();
        for (argument, input) in arguments.iter().zip(&inputs) {
            dsm.write_at(argument.allocation, argument.at, input)?;
        }
        let prepared = Instant::now();
        handle.pass(allocation.to_address());
        let returned = match workload {
            Workload::IncrementArray => client.increment_array(to_idl(arguments[0]), INCREMENT)?,
            Workload::AddArrays => client.add_arrays(to_idl(arguments[0]), to_idl(arguments[1]))?,
        };
        let returned_at = Instant::now();
        let sum = from_idl(&returned)?.allocation;
        dsm.read(sum, &mut result)?;
        dsm.free(sum)?;
        let taken = Instant::now();
        let timing = handle
            .last_timing()
            .ok_or_else(|| BifrostBenchError::PingPong("the transport timed no call".into()))?;
        stages.add([
            began,
            prepared,
            timing.flushed_at,
            timing.answered_at,
            returned_at,
            taken,
        ]);
    }
    dsm.free(allocation)?;
    if result != workload.expected(&inputs) {
        return Err(BifrostBenchError::PingPong(format!(
            "{} gave a wrong answer in the breakdown",
            workload.name()
        )));
    }
    Ok(stages.breakdown("bifrost", workload, &clocks))
}

/// A stream that notes when its writer last flushed and when a read
/// first returned data since the last `expect_reply`.
#[derive(Clone, Default)]
pub struct StreamClock {
    flushed_at: Rc<Cell<Option<Instant>>>,
    first_read_at: Rc<Cell<Option<Instant>>>,
}

impl StreamClock {
    /// Forgets the last reply's arrival: the next read that returns data
    /// is the next reply's (or request's, on a server).
    pub fn expect_reply(&self) {
        self.first_read_at.set(None);
    }

    pub fn first_read(&self) -> Option<Instant> {
        self.first_read_at.get()
    }
}

pub struct TimedWriter<W> {
    pub inner: W,
    pub clock: StreamClock,
}

impl<W: Write> Write for TimedWriter<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.inner.write(bytes)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()?;
        self.clock.flushed_at.set(Some(Instant::now()));
        Ok(())
    }
}

pub struct TimedReader<R> {
    pub inner: R,
    pub clock: StreamClock,
}

impl<R: Read> Read for TimedReader<R> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        let read = self.inner.read(buffer)?;
        if read > 0 && self.clock.first_read_at.get().is_none() {
            self.clock.first_read_at.set(Some(Instant::now()));
        }
        Ok(read)
    }
}

fn thrift_tcp(workload: Workload, calls: u64) -> Result<Breakdown, BifrostBenchError> {
    let clocks = ServerClocks::default();
    let handler = ArraysByValue {
        compute: Some(Arc::clone(&clocks.compute)),
    };
    let processor = ArraysByValueSyncProcessor::new(handler);
    let client_clock = StreamClock::default();
    let tcp = thrift_over_tcp_with(
        processor,
        Some(Arc::clone(&clocks.processor)),
        &client_clock,
    )?;
    let mut client = ArraysByValueSyncClient::new(tcp.input, tcp.output);
    let inputs = workload.inputs(BREAKDOWN_BYTES);
    let mut stages = ClientStages::default();
    let mut answer = Vec::new();
    for call in 0..=calls {
        if call == 1 {
            clocks.processor.reset();
            clocks.compute.reset();
            stages = ClientStages::default();
        }
        let began = Instant::now();
        let mut copies = inputs.clone();
        let prepared = Instant::now();
        client_clock.expect_reply();
        let reply = match workload {
            Workload::IncrementArray => client.increment_array(copies.remove(0), INCREMENT)?,
            Workload::AddArrays => {
                let a = copies.remove(0);
                client.add_arrays(a, copies.remove(0))?
            }
        };
        let returned = Instant::now();
        answer.clear();
        answer.extend_from_slice(&reply);
        let taken = Instant::now();
        let (Some(flushed), Some(answered)) = (
            client_clock.flushed_at.get(),
            client_clock.first_read_at.get(),
        ) else {
            return Err(BifrostBenchError::PingPong(
                "the TCP client's stream timed nothing".into(),
            ));
        };
        stages.add([began, prepared, flushed, answered, returned, taken]);
    }
    drop(client);
    super::TcpClient::hang_up(tcp.stream, tcp.server)?;
    if answer != workload.expected(&inputs) {
        return Err(BifrostBenchError::PingPong(format!(
            "{} gave a wrong answer over TCP in the breakdown",
            workload.name()
        )));
    }
    Ok(stages.breakdown("thrift over tcp", workload, &clocks))
}
