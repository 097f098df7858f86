//! A Bifröst service whose methods use global memory, on a rack of its
//! own: the client (compute host 0) with its DSM and calling path, three
//! (or more) memory nodes, and the service host with its DSM and worker
//! threads (each with its own instance of the service, which gets the
//! host's DSM once the rack has started). Through the Gatekeeper, calls go
//! to its service address and are routed by method, and its ACL judges
//! every DSM access; bypassing it, calls go to the service host and the
//! switch only forwards.

use crate::dsm::client::Dsm;
use crate::dsm::rack::{DsmRack, DsmRackConfig, DsmRackError, StagedDsm};
use crate::gatekeeper::{
    Gatekeeper, GatekeeperConfig, GatekeeperCounters, GatekeeperError, NodeKind,
};
use crate::rpc::agents::{CallingAgent, ServerAgent};
use crate::rpc::workers::WorkerPool;
use crate::rpc::{callee_at, Callee, Caller, Service};
use crate::transport::{RackPath, Routing, RACK_RESEND_AFTER, SERVICE_ADDRESS};
use remora_rack::endpoint::{lock, Shared, SwitchEndpoint};
use remora_rack::topology::Topology;
use remora_switch::programs::overlay::Overlaid;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The client's UDP port for its calls.
const CLIENT_PORT: u16 = 40000;
/// How long the client waits for an outcome.
const CALL_DEADLINE: Duration = Duration::from_secs(10);

/// How a [`DsmServiceRack`] serves: routed by the Gatekeeper or not, the
/// methods it routes, and the worker threads.
#[derive(Debug, Clone, Copy)]
pub struct Serving<'a> {
    pub routing: Routing,
    pub methods: &'a [&'a str],
    pub workers: usize,
}

/// Which of a topology's hosts a [`DsmServiceRack`] uses.
#[derive(Debug, Clone, Copy)]
pub struct DsmServiceHosts<'a> {
    pub client: usize,
    pub service: usize,
    pub memory: &'a [usize],
}

pub struct DsmServiceRack {
    pub rack: remora_rack::assembly::EmbeddedRack,
    /// The client's DSM, where it puts arguments before calling.
    pub dsm: Dsm,
    pub path: RackPath,
    /// The switch, when it runs the Gatekeeper.
    pub gatekeeper: Option<Shared<SwitchEndpoint<Overlaid<Gatekeeper>>>>,
    /// The service host's DSM, which its services read and write through
    /// (for showing what the switch lets that host do outside a call).
    pub service_dsm: Arc<OnceLock<Dsm>>,
}

#[derive(Debug, thiserror::Error)]
pub enum DsmServiceRackError {
    #[error(transparent)]
    Dsm(#[from] DsmRackError),
    #[error("starting the service's workers: {0}")]
    Workers(#[from] std::io::Error),
    #[error("the Gatekeeper's tables: {0}")]
    Gatekeeper(#[from] GatekeeperError),
}

impl DsmServiceRack {
    /// Starts the rack, serving `methods` with `workers` instances made by
    /// `service` (each given the service host's DSM, set once the rack
    /// runs): a client at host 0, `config.memory_nodes` memory nodes, and
    /// the service's host after them.
    pub fn start(
        config: DsmRackConfig,
        routing: Routing,
        methods: &[&str],
        workers: usize,
        service: impl Fn(Arc<OnceLock<Dsm>>) -> Box<dyn Service>,
    ) -> Result<DsmServiceRack, DsmServiceRackError> {
        let staged = StagedDsm::new(config, 1)?;
        let service_host = StagedDsm::extra_client_host(&config, 0);
        let serving = Serving {
            routing,
            methods,
            workers,
        };
        DsmServiceRack::start_staged(staged, service_host, serving, service)
    }

    /// [`DsmServiceRack::start`] on a topology's own hosts: the client,
    /// the service's host and the memory nodes.
    pub fn start_on(
        topology: &Topology,
        hosts: DsmServiceHosts<'_>,
        config: DsmRackConfig,
        serving: Serving<'_>,
        service: impl Fn(Arc<OnceLock<Dsm>>) -> Box<dyn Service>,
    ) -> Result<DsmServiceRack, DsmServiceRackError> {
        let clients = [hosts.client, hosts.service];
        let staged = StagedDsm::on(topology, &clients, hosts.memory, config)?;
        DsmServiceRack::start_staged(staged, hosts.service, serving, service)
    }

    fn start_staged(
        mut staged: StagedDsm,
        service_host: usize,
        serving: Serving<'_>,
        service: impl Fn(Arc<OnceLock<Dsm>>) -> Box<dyn Service>,
    ) -> Result<DsmServiceRack, DsmServiceRackError> {
        let Serving {
            routing,
            methods,
            workers,
        } = serving;
        let client_host = staged.client_host(0);
        let service_dsm = Arc::new(OnceLock::new());
        let instances: Vec<Box<dyn Service>> = (0..workers.max(1))
            .map(|_| service(Arc::clone(&service_dsm)))
            .collect();
        let server = ServerAgent::new(Callee::new(Box::new(WorkerPool::new(instances)?)));
        staged
            .staged
            .add_agent(service_host, Arc::new(Mutex::new(server)));
        let topology = staged.staged.topology().clone();
        let service_address = topology.host(service_host).address;
        let callee = match routing {
            Routing::Gatekeeper => callee_at(topology.switch_mac, SERVICE_ADDRESS),
            Routing::Bypass => callee_at(topology.switch_mac, service_address),
        };
        let (requests, taken) = std::sync::mpsc::sync_channel(64);
        let caller = Caller::new(RACK_RESEND_AFTER, 50);
        let calling = CallingAgent::new(caller, callee, CLIENT_PORT, taken);
        staged
            .staged
            .add_agent(client_host, Arc::new(Mutex::new(calling)));
        let (rack, extra, gatekeeper) = match routing {
            Routing::Gatekeeper => {
                let mut gatekeeper = Gatekeeper::new(GatekeeperConfig::new(SERVICE_ADDRESS));
                gatekeeper.register_node(service_address, NodeKind::Compute, 0)?;
                for method in methods {
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
        let DsmRack { rack, dsm, .. } = rack;
        let path = RackPath::new(requests, rack.fabric().kicker(), CALL_DEADLINE);
        Ok(DsmServiceRack {
            rack,
            dsm,
            path,
            gatekeeper,
            service_dsm,
        })
    }

    /// The Gatekeeper's counters, when the switch runs it.
    pub fn gatekeeper_counters(&self) -> Option<GatekeeperCounters> {
        self.gatekeeper
            .as_ref()
            .map(|switch| lock(switch).switch.program().counters())
    }
}
