//! The thesis's array services (§7.5) with their arrays in global memory:
//! `add_arrays` and `increment_array` take pointers and return a new
//! array, and only the pointers cross the RPC. The caller's library puts
//! a call's arrays in one allocation ([`pass_by_reference`]) whose pointer
//! the call's header carries, so the Gatekeeper lends all of them to the
//! callee at once; the service reads them, writes the result into an
//! allocation of its own and returns it, and the reply hands its control
//! to the caller. [`ArraysRack`] puts the service on a host of its own
//! beside a client and three memory nodes.

use crate::bifrost as idl;
use crate::dsm::client::{Dsm, DsmError};
use crate::dsm::rack::{DsmRackConfig, DsmRackError, StagedDsm};
use crate::dsm::GlobalPtr;
use crate::gatekeeper::{Gatekeeper, GatekeeperConfig, NodeKind};
use crate::rpc::agents::{CallingAgent, ServerAgent};
use crate::rpc::workers::WorkerPool;
use crate::rpc::{Callee, Caller, Service};
use crate::services::{ArraysSyncHandler, ArraysSyncProcessor};
use crate::transport::{
    return_pointer, RackPath, Routing, ThriftService, RACK_RESEND_AFTER, SERVICE_ADDRESS,
};
use remora_rack::endpoint::{lock, Shared, SwitchEndpoint};
use remora_switch::programs::overlay::Overlaid;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// An argument passed by reference, as the DSM names it: its allocation,
/// where it starts inside it, and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Argument {
    pub allocation: GlobalPtr,
    pub at: u64,
    pub length: usize,
}

/// A Thrift pointer as the DSM names it.
pub fn from_idl(pointer: &idl::GlobalPtr) -> Result<Argument, thrift::Error> {
    let length = usize::try_from(pointer.length)
        .map_err(|_| application_error(format!("negative length {}", pointer.length)))?;
    let offset = u64::try_from(pointer.offset)
        .map_err(|_| application_error(format!("negative offset {}", pointer.offset)))?;
    let at = u64::try_from(pointer.at)
        .map_err(|_| application_error(format!("negative position {}", pointer.at)))?;
    let allocation = GlobalPtr {
        node: pointer.node as u8,
        generation: pointer.generation as u8,
        offset,
    };
    Ok(Argument {
        allocation,
        at,
        length,
    })
}

/// An argument as the Thrift services pass it.
pub fn to_idl(argument: Argument) -> idl::GlobalPtr {
    idl::GlobalPtr::new(
        argument.allocation.node as i8,
        argument.allocation.generation as i8,
        argument.allocation.offset as i64,
        argument.length as i64,
        argument.at as i64,
    )
}

/// A whole allocation of `length` bytes as one argument.
pub fn whole(allocation: GlobalPtr, length: usize) -> Argument {
    Argument {
        allocation,
        at: 0,
        length,
    }
}

/// What the caller's library does before a call: one allocation holding
/// every array, in order, and an argument for each. The call passes the
/// allocation's pointer in its header ([`crate::transport::PointerSlot`]).
pub fn pass_by_reference(
    dsm: &Dsm,
    arrays: &[&[u8]],
) -> Result<(GlobalPtr, Vec<Argument>), DsmError> {
    let total: usize = arrays.iter().map(|array| array.len()).sum();
    let allocation = dsm.alloc(total.max(1) as u64)?;
    let mut arguments = Vec::with_capacity(arrays.len());
    let mut at = 0u64;
    for array in arrays {
        dsm.write_at(allocation, at, array)?;
        arguments.push(Argument {
            allocation,
            at,
            length: array.len(),
        });
        at += array.len() as u64;
    }
    Ok((allocation, arguments))
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

    fn read(&self, argument: &Argument) -> Result<Vec<u8>, thrift::Error> {
        let mut data = vec![0u8; argument.length];
        self.dsm()?
            .read_at(argument.allocation, argument.at, &mut data)
            .map_err(dsm_error)?;
        Ok(data)
    }

    /// Runs `work` on the call's arguments, then forgets what the DSM
    /// learnt of their allocation: access to a caller's pointer lasts one
    /// call (the lease ends with the reply), and the caller may free it.
    fn leased(
        &self,
        pointers: &[&idl::GlobalPtr],
        work: impl FnOnce(&[Argument]) -> thrift::Result<Vec<u8>>,
    ) -> thrift::Result<idl::GlobalPtr> {
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
        self.give_back(&outcome?)
    }

    /// The result in an allocation of the service's, returned: its
    /// control passes to the caller with the reply.
    fn give_back(&self, result: &[u8]) -> thrift::Result<idl::GlobalPtr> {
        let dsm = self.dsm()?;
        let allocation = dsm.alloc(result.len().max(1) as u64).map_err(dsm_error)?;
        dsm.write(allocation, result).map_err(dsm_error)?;
        // The caller controls it from the reply on: the service forgets it.
        dsm.forget(allocation);
        return_pointer(allocation.to_address(None));
        Ok(to_idl(whole(allocation, result.len())))
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

/// A rack serving the array services from a host of its own: the client
/// (compute host 0) with its DSM and calling path, three memory nodes,
/// and the service host with its DSM and `workers` threads. Through the
/// Gatekeeper, calls go to its service address and are routed by method,
/// and its ACL judges every DSM access.
pub struct ArraysRack {
    pub rack: remora_rack::assembly::EmbeddedRack,
    /// The client's DSM, where it puts arrays before calling.
    pub dsm: Dsm,
    pub path: RackPath,
    /// The switch, when it runs the Gatekeeper.
    pub gatekeeper: Option<Shared<SwitchEndpoint<Overlaid<Gatekeeper>>>>,
}

impl ArraysRack {
    /// The Gatekeeper's counters, when the switch runs it.
    pub fn gatekeeper_counters(&self) -> Option<crate::gatekeeper::GatekeeperCounters> {
        self.gatekeeper
            .as_ref()
            .map(|switch| lock(switch).switch.program().counters())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ArraysRackError {
    #[error(transparent)]
    Dsm(#[from] DsmRackError),
    #[error("starting the service's workers: {0}")]
    Workers(#[from] std::io::Error),
    #[error("the Gatekeeper's tables: {0}")]
    Gatekeeper(#[from] crate::gatekeeper::GatekeeperError),
}

impl ArraysRack {
    /// Through the Gatekeeper (its ACL on) or bypassing it (plain
    /// forwarding, no ACL: the thesis's measured setup).
    pub fn start(
        config: DsmRackConfig,
        workers: usize,
        routing: Routing,
    ) -> Result<ArraysRack, ArraysRackError> {
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
        let service_address = topology.host(service_host).address;
        let callee = match routing {
            Routing::Gatekeeper => crate::rpc::callee_at(topology.switch_mac, SERVICE_ADDRESS),
            Routing::Bypass => crate::rpc::callee_at(topology.switch_mac, service_address),
        };
        let (requests, taken) = std::sync::mpsc::sync_channel(64);
        let calling = CallingAgent::new(Caller::new(RACK_RESEND_AFTER, 50), callee, 40000, taken);
        staged.staged.add_agent(
            remora_rack::topology::COMPUTE_HOST,
            Arc::new(Mutex::new(calling)),
        );
        let (rack, extra, gatekeeper) = match routing {
            Routing::Gatekeeper => {
                let mut gatekeeper = Gatekeeper::new(GatekeeperConfig::new(SERVICE_ADDRESS));
                gatekeeper.register_node(service_address, NodeKind::Compute, 0)?;
                for method in ["add_arrays", "increment_array"] {
                    gatekeeper.route(method, service_address)?;
                }
                let (rack, extra, switch) = staged.start_guarded(gatekeeper)?;
                (rack, extra, Some(switch))
            }
            Routing::Bypass => {
                let (rack, extra) = staged.start()?;
                (rack, extra, None)
            }
        };
        let service = extra
            .into_iter()
            .next()
            .expect("the service host is a client");
        let _ = service_dsm.set(service);
        let crate::dsm::rack::DsmRack { rack, dsm, .. } = rack;
        let path = RackPath::new(requests, rack.fabric().kicker(), Duration::from_secs(10));
        Ok(ArraysRack {
            rack,
            dsm,
            path,
            gatekeeper,
        })
    }
}
