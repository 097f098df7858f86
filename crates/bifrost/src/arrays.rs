//! The thesis's array services (§7.5) with their arrays in global memory:
//! `add_arrays` and `increment_array` take pointers and return a new
//! array, and only the pointers cross the RPC, passed by reference as
//! [`crate::by_reference`] says. [`arrays_rack`] puts the service on a
//! host of its own beside a client and three memory nodes.

use crate::bifrost as idl;
use crate::by_reference::{
    application_error, from_idl, read_argument, return_array, to_idl, Argument,
};
use crate::dsm::client::Dsm;
use crate::dsm::rack::DsmRackConfig;
use crate::dsm::GlobalPtr;
use crate::dsm_service::{DsmServiceRack, DsmServiceRackError};
use crate::services::TArraysSyncClient;
use crate::services::{ArraysSyncHandler, ArraysSyncProcessor};
use crate::transport::CallHandle;
use crate::transport::{Routing, StageClock, ThriftService};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

/// The array services' handler over the DSM. The DSM is set once the rack
/// that carries it has started.
pub struct DsmArrays {
    dsm: Arc<OnceLock<Dsm>>,
    /// Where each call's computation (its DSM reads, the arithmetic, the
    /// result written back) is timed, if anywhere.
    compute: Option<Arc<StageClock>>,
}

impl DsmArrays {
    pub fn new(dsm: Arc<OnceLock<Dsm>>) -> DsmArrays {
        DsmArrays { dsm, compute: None }
    }

    fn dsm(&self) -> Result<&Dsm, thrift::Error> {
        self.dsm
            .get()
            .ok_or_else(|| application_error("the service's DSM is not up yet".into()))
    }

    fn read(&self, argument: &Argument) -> Result<Vec<u8>, thrift::Error> {
        read_argument(self.dsm()?, argument)
    }

    /// Runs `work` on the call's arguments, then forgets what the DSM
    /// learnt of their allocation: access to a caller's pointer lasts one
    /// call (the lease ends with the reply), and the caller may free it.
    fn leased(
        &self,
        pointers: &[&idl::GlobalPtr],
        work: impl FnOnce(&[Argument]) -> thrift::Result<Vec<u8>>,
    ) -> thrift::Result<idl::GlobalPtr> {
        let started = Instant::now();
        let arguments = pointers
            .iter()
            .map(|pointer| from_idl(pointer))
            .collect::<Result<Vec<_>, _>>()?;
        let outcome = work(&arguments);
        if let Ok(dsm) = self.dsm() {
            for argument in &arguments {
                dsm.forget(argument.allocation);
            }
        }
        let returned = return_array(self.dsm()?, &outcome?);
        if let Some(clock) = &self.compute {
            clock.record(started.elapsed());
        }
        returned
    }
}

impl ArraysSyncHandler for DsmArrays {
    fn handle_increment_array(
        &self,
        array: idl::GlobalPtr,
        value: i8,
    ) -> thrift::Result<idl::GlobalPtr> {
        self.leased(&[&array], |arguments| {
            let mut data = self.read(&arguments[0])?;
            data.iter_mut()
                .for_each(|byte| *byte = byte.wrapping_add(value as u8));
            Ok(data)
        })
    }

    fn handle_add_arrays(
        &self,
        a: idl::GlobalPtr,
        b: idl::GlobalPtr,
    ) -> thrift::Result<idl::GlobalPtr> {
        self.leased(&[&a, &b], |arguments| {
            let (a, b) = (&arguments[0], &arguments[1]);
            if a.length != b.length {
                return Err(application_error(format!(
                    "lengths differ: a {}, b {}",
                    a.length, b.length
                )));
            }
            let mut total = self.read(a)?;
            let addend = self.read(b)?;
            total
                .iter_mut()
                .zip(&addend)
                .for_each(|(x, y)| *x = x.wrapping_add(*y));
            Ok(total)
        })
    }
}

/// The array services on a rack of their own (see [`DsmServiceRack`]),
/// with `workers` threads.
pub fn arrays_rack(
    config: DsmRackConfig,
    workers: usize,
    routing: Routing,
) -> Result<DsmServiceRack, DsmServiceRackError> {
    arrays_rack_timed(config, workers, routing, None)
}

/// The array services on a topology's own hosts (as a rack file's
/// `[bifrost]` section asks), with `workers` threads.
pub fn arrays_rack_on(
    topology: &remora_rack::topology::Topology,
    hosts: crate::dsm_service::DsmServiceHosts<'_>,
    config: DsmRackConfig,
    routing: Routing,
    workers: usize,
) -> Result<DsmServiceRack, DsmServiceRackError> {
    let serving = crate::dsm_service::Serving {
        routing,
        methods: &ARRAY_METHODS,
        workers,
    };
    DsmServiceRack::start_on(topology, hosts, config, serving, |dsm| {
        Box::new(ThriftService::new(ArraysSyncProcessor::new(
            DsmArrays::new(dsm),
        )))
    })
}

/// The array services' methods, as the Gatekeeper routes them.
const ARRAY_METHODS: [&str; 2] = ["add_arrays", "increment_array"];

/// Where a timed service's calls spend their time: the whole processor
/// (unmarshalling, the handler, marshalling) and the handler's
/// computation.
#[derive(Debug, Clone, Default)]
pub struct ServerClocks {
    pub processor: Arc<StageClock>,
    pub compute: Arc<StageClock>,
}

/// [`arrays_rack`], with each call's time in the processor and in the
/// computation recorded in `clocks`.
pub fn arrays_rack_timed(
    config: DsmRackConfig,
    workers: usize,
    routing: Routing,
    clocks: Option<ServerClocks>,
) -> Result<DsmServiceRack, DsmServiceRackError> {
    DsmServiceRack::start(config, routing, &ARRAY_METHODS, workers, |dsm| {
        let handler = DsmArrays {
            dsm,
            compute: clocks.as_ref().map(|clocks| Arc::clone(&clocks.compute)),
        };
        let processor = ArraysSyncProcessor::new(handler);
        match &clocks {
            Some(clocks) => Box::new(ThriftService::timed(
                processor,
                Arc::clone(&clocks.processor),
            )),
            None => Box::new(ThriftService::new(processor)),
        }
    })
}

/// The thesis's two array workloads (§7.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// One array and a byte; the array with the byte added back.
    IncrementArray,
    /// Two arrays; their sum back.
    AddArrays,
}

/// What increment_array adds.
pub const INCREMENT: i8 = 7;

impl Workload {
    pub const ALL: [Workload; 2] = [Workload::IncrementArray, Workload::AddArrays];

    pub fn name(self) -> &'static str {
        match self {
            Workload::IncrementArray => "increment_array",
            Workload::AddArrays => "add_arrays",
        }
    }

    /// The workload's input arrays of `bytes` each.
    pub fn inputs(self, bytes: usize) -> Vec<Vec<u8>> {
        let a = (0..bytes).map(|index| (index % 251) as u8).collect();
        let b = (0..bytes).map(|index| (index % 13) as u8).collect();
        match self {
            Workload::IncrementArray => vec![a],
            Workload::AddArrays => vec![a, b],
        }
    }

    /// What the service must answer.
    pub fn expected(self, inputs: &[Vec<u8>]) -> Vec<u8> {
        match self {
            Workload::IncrementArray => inputs[0]
                .iter()
                .map(|byte| byte.wrapping_add(INCREMENT as u8))
                .collect(),
            Workload::AddArrays => inputs[0]
                .iter()
                .zip(&inputs[1])
                .map(|(x, y)| x.wrapping_add(*y))
                .collect(),
        }
    }

    /// One call by reference: the inputs' allocation passed in the header,
    /// a new array of the service's back. Returns that array.
    pub fn call<C: TArraysSyncClient>(
        self,
        client: &mut C,
        handle: &CallHandle,
        (inputs, arguments): &(GlobalPtr, Vec<Argument>),
    ) -> thrift::Result<Argument> {
        handle.pass(inputs.to_address());
        let returned = match self {
            Workload::IncrementArray => client.increment_array(to_idl(arguments[0]), INCREMENT)?,
            Workload::AddArrays => client.add_arrays(to_idl(arguments[0]), to_idl(arguments[1]))?,
        };
        from_idl(&returned)
    }
}
