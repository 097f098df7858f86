//! The thesis's array services (§7) with their arrays in global memory:
//! `add_arrays` and `increment_array` take pointers, and the service reads
//! and writes the DSM itself, on worker threads, while only the pointers
//! cross the RPC. [`ArraysRack`] puts the service on a host of its own
//! beside a client and three memory nodes.

use crate::bifrost as idl;
use crate::dsm::client::{Dsm, DsmError};
use crate::dsm::rack::{DsmRackConfig, DsmRackError, StagedDsm};
use crate::dsm::GlobalPtr;
use crate::rpc::agents::{CallingAgent, ServerAgent};
use crate::rpc::workers::WorkerPool;
use crate::rpc::{Callee, Caller, Service};
use crate::services::{ArraysSyncHandler, ArraysSyncProcessor};
use crate::transport::{RackPath, ThriftService, RACK_RESEND_AFTER};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// A Thrift pointer as the DSM names it, with its length.
pub fn from_idl(pointer: &idl::GlobalPtr) -> Result<(GlobalPtr, usize), thrift::Error> {
    let length = usize::try_from(pointer.length)
        .map_err(|_| application_error(format!("negative length {}", pointer.length)))?;
    let offset = u64::try_from(pointer.offset)
        .map_err(|_| application_error(format!("negative offset {}", pointer.offset)))?;
    let ptr = GlobalPtr {
        node: pointer.node as u8,
        generation: pointer.generation as u8,
        offset,
    };
    Ok((ptr, length))
}

/// A DSM pointer and length as the Thrift services pass them.
pub fn to_idl(ptr: GlobalPtr, length: usize) -> idl::GlobalPtr {
    idl::GlobalPtr::new(
        ptr.node as i8,
        ptr.generation as i8,
        ptr.offset as i64,
        length as i64,
    )
}

fn application_error(message: String) -> thrift::Error {
    thrift::Error::Application(thrift::ApplicationError::new(
        thrift::ApplicationErrorKind::Unknown,
        message,
    ))
}

fn dsm_error(error: DsmError) -> thrift::Error {
    application_error(error.to_string())
}

/// The array services' handler over the DSM. The DSM is set once the rack
/// that carries it has started.
pub struct DsmArrays {
    dsm: Arc<OnceLock<Dsm>>,
}

impl DsmArrays {
    pub fn new(dsm: Arc<OnceLock<Dsm>>) -> DsmArrays {
        DsmArrays { dsm }
    }

    fn dsm(&self) -> Result<&Dsm, thrift::Error> {
        self.dsm
            .get()
            .ok_or_else(|| application_error("the service's DSM is not up yet".into()))
    }

    fn read(&self, pointer: &idl::GlobalPtr) -> Result<Vec<u8>, thrift::Error> {
        let (ptr, length) = from_idl(pointer)?;
        let mut data = vec![0u8; length];
        self.dsm()?.read(ptr, &mut data).map_err(dsm_error)?;
        Ok(data)
    }
    /// Runs `work` with the call's pointers, then forgets what the DSM
    /// learnt of them: access to a caller's pointer lasts one call (the
    /// lease ends with the reply), and the caller may free them after.
    fn leased<T>(
        &self,
        pointers: &[&idl::GlobalPtr],
        work: impl FnOnce() -> thrift::Result<T>,
    ) -> thrift::Result<T> {
        let outcome = work();
        if let Ok(dsm) = self.dsm() {
            for pointer in pointers {
                if let Ok((ptr, _)) = from_idl(pointer) {
                    dsm.forget(ptr);
                }
            }
        }
        outcome
    }

    fn increment(&self, array: &idl::GlobalPtr) -> thrift::Result<()> {
        let mut data = self.read(array)?;
        data.iter_mut()
            .for_each(|byte| *byte = byte.wrapping_add(1));
        let (ptr, _) = from_idl(array)?;
        self.dsm()?.write(ptr, &data).map_err(dsm_error)
    }

    fn add(
        &self,
        a: &idl::GlobalPtr,
        b: &idl::GlobalPtr,
        sum: &idl::GlobalPtr,
    ) -> thrift::Result<()> {
        if a.length != b.length || a.length != sum.length {
            return Err(application_error(format!(
                "lengths differ: a {}, b {}, sum {}",
                a.length, b.length, sum.length
            )));
        }
        let mut total = self.read(a)?;
        let addend = self.read(b)?;
        total
            .iter_mut()
            .zip(&addend)
            .for_each(|(x, y)| *x = x.wrapping_add(*y));
        let (ptr, _) = from_idl(sum)?;
        self.dsm()?.write(ptr, &total).map_err(dsm_error)
    }
}

impl ArraysSyncHandler for DsmArrays {
    fn handle_increment_array(&self, array: idl::GlobalPtr) -> thrift::Result<()> {
        self.leased(&[&array], || self.increment(&array))
    }

    fn handle_add_arrays(
        &self,
        a: idl::GlobalPtr,
        b: idl::GlobalPtr,
        sum: idl::GlobalPtr,
    ) -> thrift::Result<()> {
        self.leased(&[&a, &b, &sum], || self.add(&a, &b, &sum))
    }
}

/// A rack serving the array services from a host of its own: the client
/// (compute host 0) with its DSM and calling path, three memory nodes,
/// and the service host with its DSM and `workers` threads.
pub struct ArraysRack {
    pub rack: remora_rack::assembly::EmbeddedRack,
    /// The client's DSM, where it puts arrays before calling.
    pub dsm: Dsm,
    pub path: RackPath,
}

#[derive(Debug, thiserror::Error)]
pub enum ArraysRackError {
    #[error(transparent)]
    Dsm(#[from] DsmRackError),
    #[error("starting the service's workers: {0}")]
    Workers(#[from] std::io::Error),
}

impl ArraysRack {
    pub fn start(config: DsmRackConfig, workers: usize) -> Result<ArraysRack, ArraysRackError> {
        let mut staged = StagedDsm::new(config, 1)?;
        let service_host = StagedDsm::extra_client_host(&config, 0);
        let service_dsm = Arc::new(OnceLock::new());
        let services: Vec<Box<dyn Service>> = (0..workers.max(1))
            .map(|_| {
                let handler = DsmArrays::new(Arc::clone(&service_dsm));
                Box::new(ThriftService::new(ArraysSyncProcessor::new(handler))) as Box<dyn Service>
            })
            .collect();
        let server = ServerAgent::new(Callee::new(Box::new(WorkerPool::new(services)?)));
        staged
            .staged
            .add_agent(service_host, Arc::new(Mutex::new(server)));
        let topology = staged.staged.topology().clone();
        let callee =
            crate::rpc::callee_at(topology.switch_mac, topology.host(service_host).address);
        let (requests, taken) = std::sync::mpsc::sync_channel(64);
        let calling = CallingAgent::new(Caller::new(RACK_RESEND_AFTER, 50), callee, 40000, taken);
        staged.staged.add_agent(
            remora_rack::topology::COMPUTE_HOST,
            Arc::new(Mutex::new(calling)),
        );
        let (rack, extra) = staged.start()?;
        let service = extra
            .into_iter()
            .next()
            .expect("the service host is a client");
        let _ = service_dsm.set(service);
        let crate::dsm::rack::DsmRack { rack, dsm, .. } = rack;
        let path = RackPath::new(requests, rack.fabric().kicker(), Duration::from_secs(10));
        Ok(ArraysRack { rack, dsm, path })
    }
}
