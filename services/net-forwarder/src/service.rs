//! The NetForwarder gRPC service: validates requests, keeps IPAM and the kernel in step.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hpk_proto::netforwarder::v1 as pb;
use pb::net_forwarder_server::NetForwarder;
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::ipam::{Allocation, Ipam};
use crate::link::{AttachSpec, GATEWAY, Network, POD_INTERFACE, sandbox_interfaces};
use crate::netns::NetnsId;
use crate::tunnel::Tunnel;
use crate::{Error, Result};

/// Longest sandbox id accepted (CRI ids are 64 hex digits).
const MAX_SANDBOX_ID: usize = 128;

/// Shared state of the service: the allocations, behind one lock that also serializes changes
/// to the kernel's configuration, and the network it configures.
pub struct Context<N> {
    ipam: Mutex<Ipam>,
    network: N,
    mtu: u32,
    tunnel: Option<Arc<Tunnel>>,
    readiness: hpk_rpc::Readiness,
}

impl<N: Network> Context<N> {
    /// A context over loaded allocations.
    pub fn new(ipam: Ipam, network: N, mtu: u32) -> Self {
        Context { ipam: Mutex::new(ipam), network, mtu, tunnel: None, readiness: hpk_rpc::Readiness::new() }
    }

    /// The tunnel, when there is one.
    pub fn tunnel(&self) -> Option<&Arc<Tunnel>> {
        self.tunnel.as_ref()
    }

    /// Whether pod traffic can flow, as health and `Stats.not_ready` report it
    /// ([`crate::ready`] keeps it).
    pub fn readiness(&self) -> &hpk_rpc::Readiness {
        &self.readiness
    }

    /// Reports and routes the tunnel to other nodes too.
    pub fn with_tunnel(mut self, tunnel: Arc<Tunnel>) -> Self {
        self.tunnel = Some(tunnel);
        self
    }

    /// Counters of the attachments (or of one sandbox) and of the tunnel.
    pub async fn stats(&self, only: &str) -> Result<pb::StatsResponse> {
        let ipam = self.ipam.lock().await;
        if !only.is_empty() && ipam.get(only).is_none() {
            return Err(Error::NotFound(format!("sandbox {only} is not attached")));
        }
        let counters = crate::stats::read()?;
        let interfaces = ipam
            .list()
            .filter(|a| only.is_empty() || a.sandbox_id == only)
            .filter_map(|a| {
                let name = self.network.host_interface(&a.sandbox_id);
                let c =
                    self.network.relay_counters(&a.sandbox_id).or_else(|| counters.get(&name).copied())?;
                Some(pb::InterfaceStats {
                    sandbox_id: a.sandbox_id.clone(),
                    interface: name,
                    rx_bytes: c.rx_bytes,
                    rx_packets: c.rx_packets,
                    rx_dropped: c.rx_dropped,
                    rx_errors: c.rx_errors,
                    tx_bytes: c.tx_bytes,
                    tx_packets: c.tx_packets,
                    tx_dropped: c.tx_dropped,
                    tx_errors: c.tx_errors,
                })
            })
            .collect();
        Ok(pb::StatsResponse {
            interfaces,
            tunnel: self.tunnel.as_ref().map(|t| t.stats()),
            not_ready: self.readiness.reason().unwrap_or_default(),
        })
    }

    /// Everything the metrics show: the counters, how many sandboxes are attached, how many
    /// addresses are free.
    pub async fn snapshot(&self) -> Result<(pb::StatsResponse, usize, u32)> {
        let stats = self.stats("").await?;
        let ipam = self.ipam.lock().await;
        Ok((stats, ipam.list().count(), ipam.free()))
    }

    /// Attaches a sandbox; see the contract in netforwarder.proto.
    pub async fn attach(&self, sandbox_id: &str, netns_path: &str) -> Result<Allocation> {
        check_sandbox_id(sandbox_id)?;
        let path = check_netns_path(netns_path)?;
        let mut ipam = self.ipam.lock().await;
        if ipam.get(sandbox_id).is_some() {
            return Err(Error::AlreadyExists(sandbox_id.to_owned()));
        }
        let netns = open_netns(&path)?;
        self.network.check_netns(&netns).await?;
        let id = NetnsId::of(&netns).map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
        let alloc = ipam.allocate(sandbox_id, &path, id)?;
        let spec = AttachSpec { sandbox_id: sandbox_id.to_owned(), address: alloc.address, mtu: self.mtu };
        if let Err(e) = self.network.attach(&spec, &netns).await {
            if let Err(release) = ipam.release(sandbox_id) {
                warn!(sandbox = %sandbox_id, error = %release, "cannot free the address of a failed attach");
            }
            return Err(e);
        }
        info!(sandbox = %sandbox_id, address = %alloc.address, netns = %path.display(), "attached");
        Ok(alloc)
    }

    /// Detaches a sandbox: its interfaces and route go, its address is freed.
    pub async fn detach(&self, sandbox_id: &str) -> Result<()> {
        check_sandbox_id(sandbox_id)?;
        let mut ipam = self.ipam.lock().await;
        if ipam.get(sandbox_id).is_none() {
            return Err(Error::NotFound(format!("sandbox {sandbox_id} is not attached")));
        }
        self.network.detach(sandbox_id).await?;
        let alloc = ipam.release(sandbox_id)?;
        info!(sandbox = %sandbox_id, address = %alloc.address, "detached");
        Ok(())
    }

    /// At start: frees what vanished while the net-forwarder was down, restores the attachments
    /// of live sandboxes (a lost veth re-created, TAPs re-opened and their relay restarted), and
    /// removes interfaces no allocation owns.
    pub async fn recover(&self) -> Result<()> {
        let mut ipam = self.ipam.lock().await;
        for gone in ipam.reclaim_vanished()? {
            self.network.detach(&gone.sandbox_id).await?;
            info!(sandbox = %gone.sandbox_id, address = %gone.address, "reclaimed: its namespace is gone");
        }
        let present = self.network.interfaces().await?;
        let live: Vec<Allocation> = ipam.list().cloned().collect();
        for alloc in &live {
            let spec =
                AttachSpec { sandbox_id: alloc.sandbox_id.clone(), address: alloc.address, mtu: self.mtu };
            let result = match open_netns(&alloc.netns_path) {
                Ok(netns) => self.network.restore(&spec, &netns, &present).await,
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                warn!(sandbox = %alloc.sandbox_id, error = %e, "cannot re-attach: freeing its address");
                if let Err(e) = self.network.detach(&alloc.sandbox_id).await {
                    warn!(sandbox = %alloc.sandbox_id, error = %e, "cannot remove what is left of it");
                }
                ipam.release(&alloc.sandbox_id)?;
            }
        }
        let owned: Vec<String> = ipam.list().flat_map(|a| sandbox_interfaces(&a.sandbox_id)).collect();
        for name in present.iter().filter(|n| !owned.contains(n)) {
            info!(interface = %name, "removing an interface no allocation owns");
            self.network.remove_interface(name).await?;
        }
        Ok(())
    }

    fn to_proto(&self, a: &Allocation) -> pb::Attachment {
        pb::Attachment {
            sandbox_id: a.sandbox_id.clone(),
            netns_path: a.netns_path.display().to_string(),
            address: format!("{}/32", a.address),
            gateway: GATEWAY.to_string(),
            mtu: self.mtu,
            pod_interface: POD_INTERFACE.to_owned(),
            host_interface: self.network.host_interface(&a.sandbox_id),
        }
    }
}

fn check_sandbox_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= MAX_SANDBOX_ID
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "sandbox id {id:?} must be 1 to {MAX_SANDBOX_ID} characters of A-Z a-z 0-9 - _ ."
        )))
    }
}

fn check_netns_path(path: &str) -> Result<PathBuf> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(Error::InvalidArgument(format!("netns path {path:?} must be absolute")));
    }
    Ok(p.to_owned())
}

fn open_netns(path: &Path) -> Result<File> {
    File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            Error::NotFound(format!("network namespace {} does not exist", path.display()))
        }
        _ => Error::InvalidArgument(format!("cannot open network namespace {}: {e}", path.display())),
    })
}

/// The tonic service over a shared [`Context`].
pub struct Service<N>(pub Arc<Context<N>>);

#[tonic::async_trait]
impl<N: Network> NetForwarder for Service<N> {
    async fn attach(&self, req: Request<pb::AttachRequest>) -> Result<Response<pb::AttachResponse>, Status> {
        let req = req.into_inner();
        let alloc = self.0.attach(&req.sandbox_id, &req.netns_path).await?;
        Ok(Response::new(pb::AttachResponse { attachment: Some(self.0.to_proto(&alloc)) }))
    }

    async fn detach(&self, req: Request<pb::DetachRequest>) -> Result<Response<pb::DetachResponse>, Status> {
        self.0.detach(&req.into_inner().sandbox_id).await?;
        Ok(Response::new(pb::DetachResponse {}))
    }

    async fn list(&self, _: Request<pb::ListRequest>) -> Result<Response<pb::ListResponse>, Status> {
        let ipam = self.0.ipam.lock().await;
        Ok(Response::new(pb::ListResponse {
            attachments: ipam.list().map(|a| self.0.to_proto(a)).collect(),
            pod_cidr: ipam.cidr().to_string(),
            free_addresses: ipam.free(),
        }))
    }

    async fn routes(&self, _: Request<pb::RoutesRequest>) -> Result<Response<pb::RoutesResponse>, Status> {
        let ipam = self.0.ipam.lock().await;
        let mut routes: Vec<pb::Route> = ipam
            .list()
            .map(|a| pb::Route {
                destination: format!("{}/32", a.address),
                interface: self.0.network.host_interface(&a.sandbox_id),
                sandbox_id: a.sandbox_id.clone(),
                ..Default::default()
            })
            .collect();
        if let Some(tunnel) = &self.0.tunnel {
            routes.extend(tunnel.routes().into_iter().map(|r| pb::Route {
                destination: r.peer.pod_cidr.to_string(),
                interface: crate::tunnel::DEVICE.to_owned(),
                node: r.peer.node,
                endpoint: r.peer.endpoint.to_string(),
                ..Default::default()
            }));
        }
        Ok(Response::new(pb::RoutesResponse { routes }))
    }

    async fn stats(&self, req: Request<pb::StatsRequest>) -> Result<Response<pb::StatsResponse>, Status> {
        Ok(Response::new(self.0.stats(&req.into_inner().sandbox_id).await?))
    }
}
