//! The thesis's array services (§7.5) with their arrays in global memory:
//! `add_arrays` and `increment_array` take pointers and return a new
//! array, and only the pointers cross the RPC, passed by reference as
//! [`crate::by_reference`] says. [`arrays_rack`] puts the service on a
//! host of its own beside a client and three memory nodes.

use crate::bifrost as idl;
use crate::by_reference::{application_error, from_idl, read_argument, return_array, Argument};
use crate::dsm::client::Dsm;
use crate::dsm::rack::DsmRackConfig;
use crate::dsm_service::{DsmServiceRack, DsmServiceRackError};
use crate::services::{ArraysSyncHandler, ArraysSyncProcessor};
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
    DsmServiceRack::start(
        config,
        routing,
        &["add_arrays", "increment_array"],
        workers,
        |dsm| {
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
        },
    )
}
