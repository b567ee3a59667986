//! `run`: load the allocations, reconcile them with the kernel, start the tunnel, then serve.

use std::net::SocketAddrV4;
use std::sync::Arc;
use std::time::Duration;

use hpk_proto::netforwarder::v1::net_forwarder_server::NetForwarderServer;
use hpk_rpc::{Listener, Services};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cidr::PodCidr;
use crate::config::ServeArgs;
use crate::ipam::Ipam;
use crate::link::Netlink;
use crate::nodes::NodeSync;
use crate::peers::{self, Peer};
use crate::service::{Context, Service};
use crate::tunnel::identity::Identity;
use crate::tunnel::routes::Routes;
use crate::tunnel::{Tunnel, keyfile};
use crate::{Error, Result};

/// Runs the net-forwarder until `shutdown` is cancelled. The state is loaded and reconciled
/// before the socket is bound, so nothing is served from a state that failed to load.
/// Attachments outlive the process: pods keep their network while it is restarted.
pub async fn run(args: ServeArgs, shutdown: CancellationToken) -> Result<()> {
    let nodes = match (&args.kubeconfig, &args.node_name) {
        (Some(kubeconfig), Some(node)) => Some(NodeSync::connect(kubeconfig, node).await?),
        _ => None,
    };
    let cidr = match (args.pod_cidr, &nodes) {
        (Some(cidr), _) => cidr,
        (None, Some(nodes)) => {
            info!(node = nodes.node(), "waiting for the Node's spec.podCIDR");
            nodes.pod_cidr(NODE_WAIT).await?
        }
        (None, None) => return Err(Error::Config("--pod-cidr or --kubeconfig is required".into())),
    };
    let ipam = Ipam::open(&args.state_dir, cidr)?;
    // Every flag checked (the key read, the tunnel's socket claimed) before the network
    // namespace is changed: a refused start leaves no address behind.
    let socket = open_tunnel_socket(&args)?;
    enable_forwarding();
    crate::bubble::ensure_address(cidr.bubble_address()).await?;
    let mut context = Context::new(ipam, Netlink::new()?.with_attach_mode(args.attach_mode), args.mtu);
    if let Some((tunnel, routes)) = start_tunnel(&args, cidr, socket).await? {
        if let Some(nodes) = nodes {
            nodes.publish_tunnel(tunnel.endpoint(), &tunnel.public_key(), NODE_WAIT).await?;
            follow_nodes(nodes, tunnel.clone(), routes, args.peers.clone(), shutdown.clone());
        }
        context = context.with_tunnel(tunnel);
    }
    let context = Arc::new(context);
    context.recover().await?;
    tokio::spawn(crate::ready::watch(
        context.tunnel().cloned(),
        context.readiness().clone(),
        shutdown.clone(),
    ));
    if let Some(addr) = args.metrics_address {
        crate::metrics::serve(addr, context.clone(), shutdown.clone()).await?;
    }
    let listener = Listener::unix(&args.socket)?;
    info!(socket = %args.socket.display(), pod_cidr = %cidr, mtu = args.mtu, "net-forwarder ready");
    let services = Services::new()
        .with_readiness(context.readiness().clone())
        .with(NetForwarderServer::new(Service(context)))
        .describe(hpk_proto::FILE_DESCRIPTOR_SET);
    hpk_rpc::serve(listener, services, shutdown).await?;
    Ok(())
}

/// How long to wait for the Node (registered by the kubelet) and its pod CIDR, and for the
/// endpoint to be published.
const NODE_WAIT: Duration = Duration::from_secs(120);

/// The tunnel, when a socket was handed over or asked for: the device, its routes, the peers.
async fn start_tunnel(
    args: &ServeArgs,
    cidr: PodCidr,
    opened: Option<TunnelSocket>,
) -> Result<Option<(Arc<Tunnel>, Routes)>> {
    let Some(TunnelSocket { identity, sockets, endpoint }) = opened else { return Ok(None) };
    let queues = queues(args);
    let tunnel = Arc::new(Tunnel::start(sockets, endpoint, identity, cidr, args.tunnel_mtu, queues)?);
    let routes = Routes::open().await?;
    routes.configure_device(args.mtu).await?;
    let refused = apply_peers(&tunnel, &routes, args.peers.clone()).await?;
    tunnel.refused_peers().fetch_add(refused as u64, std::sync::atomic::Ordering::Relaxed);
    Ok(Some((tunnel, routes)))
}

/// The tunnel's key pair, its socket and the endpoint other nodes send to.
struct TunnelSocket {
    identity: Identity,
    sockets: Vec<std::net::UdpSocket>,
    endpoint: SocketAddrV4,
}

/// The tunnel's queues: `--tunnel-queues`, else one per CPU of the process's.
fn queues(args: &ServeArgs) -> usize {
    args.tunnel_queues.map(|q| q as usize).unwrap_or_else(crate::tunnel::default_queues)
}

/// Reads the key and claims (or binds) the tunnel's socket, when a tunnel is asked for; changes
/// nothing in the network namespace.
fn open_tunnel_socket(args: &ServeArgs) -> Result<Option<TunnelSocket>> {
    if args.tunnel_fd.is_empty() && args.tunnel_listen.is_none() {
        if !args.peers.is_empty() {
            return Err(Error::Config("--peer needs a tunnel (--tunnel-fd or --tunnel-listen)".into()));
        }
        return Ok(None);
    }
    // A new key pair per run unless a static set-up names one: nothing secret on disk.
    let identity = match &args.tunnel_private_key_file {
        Some(path) => keyfile::load(path)?,
        None => Identity::generate()?,
    };
    let (sockets, local) = match (args.tunnel_fd.as_slice(), args.tunnel_listen) {
        ([], Some(addr)) => {
            let sockets = crate::inherit::bind_group(addr, queues(args))?;
            let local = match sockets[0].local_addr() {
                Ok(std::net::SocketAddr::V4(local)) => local,
                _ => {
                    return Err(Error::Config(format!(
                        "the tunnel socket bound to {addr} has no IPv4 address"
                    )));
                }
            };
            (sockets, local)
        }
        ([], None) => return Ok(None),
        (fds, _) => crate::inherit::claim_all(fds)?,
    };
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
    Ok(Some(TunnelSocket { identity, sockets, endpoint }))
}

/// Routes the other nodes as the Kubernetes API shows them (plus the static `--peer`s), for as
/// long as the process runs. A failure to program a route is logged and retried at the next
/// change; the watch itself retries with back-off.
fn follow_nodes(
    nodes: NodeSync,
    tunnel: Arc<Tunnel>,
    routes: Routes,
    fixed: Vec<Peer>,
    shutdown: CancellationToken,
) {
    let (tx, mut rx) = watch::channel(Vec::new());
    let refused = tunnel.refused_peers();
    let own = tunnel.own_cidr();
    let stop = shutdown.clone();
    tokio::spawn(async move { nodes.watch_peers(own, tx, refused, stop).await });
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                changed = rx.changed() => if changed.is_err() { return },
            }
            let mut peers = fixed.clone();
            peers.extend(rx.borrow_and_update().iter().cloned());
            if let Err(e) = apply_peers(&tunnel, &routes, peers).await {
                warn!(error = %e, "cannot route the other nodes");
            }
        }
    });
}

/// Validates a peer list against this node, then routes it: the table first, then the kernel.
pub async fn apply_peers(tunnel: &Tunnel, routes: &Routes, peers: Vec<Peer>) -> Result<usize> {
    let own = tunnel.own_cidr();
    let (good, refused) = peers::validate(own, peers);
    for (peer, why) in &refused {
        warn!(peer = %peer, reason = %why, "peer not routed");
    }
    // The tunnel may refuse some more (keys it cannot agree with); only what it took is routed.
    let taken = tunnel.set_peers(&good);
    routes.sync(&taken, own.bubble_address()).await?;
    Ok(refused.len())
}

/// Pod-to-pod traffic is routed through the bubble; without forwarding only pod ↔ bubble works.
fn enable_forwarding() {
    if let Err(e) = std::fs::write("/proc/sys/net/ipv4/ip_forward", "1") {
        warn!(error = %e, "cannot enable IPv4 forwarding: pods will reach the bubble but not each other");
    }
}
