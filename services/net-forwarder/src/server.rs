//! `run`: load the allocations, reconcile them with the kernel, start the tunnel, then serve.

use std::net::SocketAddrV4;
use std::sync::Arc;

use hpk_proto::netforwarder::v1::net_forwarder_server::NetForwarderServer;
use hpk_rpc::{Listener, Services};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cidr::PodCidr;
use crate::config::ServeArgs;
use crate::ipam::Ipam;
use crate::link::Netlink;
use crate::peers::{self, Peer};
use crate::service::{Context, Service};
use crate::tunnel::routes::Routes;
use crate::tunnel::{Tunnel, keyfile};
use crate::{Error, Result};

/// Runs the net-forwarder until `shutdown` is cancelled. The state is loaded and reconciled
/// before the socket is bound, so nothing is served from a state that failed to load.
/// Attachments outlive the process: pods keep their network while it is restarted.
pub async fn run(args: ServeArgs, shutdown: CancellationToken) -> Result<()> {
    let cidr = pod_cidr(&args)?;
    let ipam = Ipam::open(&args.state_dir, cidr)?;
    enable_forwarding();
    let mut context = Context::new(ipam, Netlink::new()?, args.mtu);
    if let Some(tunnel) = start_tunnel(&args, cidr).await? {
        context = context.with_tunnel(tunnel);
    }
    let context = Arc::new(context);
    context.recover().await?;
    if let Some(addr) = args.metrics_address {
        crate::metrics::serve(addr, context.clone(), shutdown.clone()).await?;
    }
    let listener = Listener::unix(&args.socket)?;
    info!(socket = %args.socket.display(), pod_cidr = %cidr, mtu = args.mtu, "net-forwarder ready");
    let services = Services::new()
        .with(NetForwarderServer::new(Service(context)))
        .describe(hpk_proto::FILE_DESCRIPTOR_SET);
    hpk_rpc::serve(listener, services, shutdown).await?;
    Ok(())
}

fn pod_cidr(args: &ServeArgs) -> Result<PodCidr> {
    args.pod_cidr.ok_or_else(|| Error::Config("--pod-cidr is required".into()))
}

/// The tunnel, when a socket was handed over or asked for: the device, its routes, the peers.
async fn start_tunnel(args: &ServeArgs, cidr: PodCidr) -> Result<Option<Arc<Tunnel>>> {
    let (socket, local) = match (args.tunnel_fd, args.tunnel_listen) {
        (Some(fd), _) => crate::inherit::claim(fd)?,
        (None, Some(addr)) => crate::inherit::bind(addr)?,
        (None, None) => {
            if !args.peers.is_empty() {
                return Err(Error::Config("--peer needs a tunnel (--tunnel-fd or --tunnel-listen)".into()));
            }
            return Ok(None);
        }
    };
    let key_file = args
        .tunnel_key_file
        .as_ref()
        .ok_or_else(|| Error::Config("the tunnel needs the cluster's key: --tunnel-key-file".into()))?;
    let key = keyfile::load(key_file)?;
    let endpoint = match (local.ip().is_unspecified(), args.tunnel_advertise) {
        (_, Some(ip)) => SocketAddrV4::new(ip, local.port()),
        (false, None) => local,
        (true, None) => {
            return Err(Error::Config(format!(
                "the tunnel socket is bound to {local}: say which host address the other nodes send to \
                 (--tunnel-advertise)"
            )));
        }
    };
    let tunnel = Arc::new(Tunnel::start(socket, endpoint, key, cidr)?);
    let routes = Routes::open().await?;
    routes.configure_device(args.mtu).await?;
    routes.ensure_bubble_address(cidr.bubble_address()).await?;
    apply_peers(&tunnel, &routes, args.peers.clone()).await?;
    Ok(Some(tunnel))
}

/// Validates a peer list against this node, then routes it: the table first, then the kernel.
pub async fn apply_peers(tunnel: &Tunnel, routes: &Routes, peers: Vec<Peer>) -> Result<usize> {
    let own = tunnel.own_cidr();
    let (good, refused) = peers::validate(own, peers);
    for (peer, why) in &refused {
        warn!(peer = %peer, reason = %why, "peer not routed");
    }
    tunnel.set_peers(&good);
    routes.sync(&good, own.bubble_address()).await?;
    Ok(refused.len())
}

/// Pod-to-pod traffic is routed through the bubble; without forwarding only pod ↔ bubble works.
fn enable_forwarding() {
    if let Err(e) = std::fs::write("/proc/sys/net/ipv4/ip_forward", "1") {
        warn!(error = %e, "cannot enable IPv4 forwarding: pods will reach the bubble but not each other");
    }
}
