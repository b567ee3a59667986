//! `run`: load the allocations, reconcile them with the kernel, then serve.

use std::sync::Arc;

use hpk_proto::netforwarder::v1::net_forwarder_server::NetForwarderServer;
use hpk_rpc::{Listener, Services};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::Result;
use crate::config::ServeArgs;
use crate::ipam::Ipam;
use crate::link::Netlink;
use crate::service::{Context, Service};

/// Runs the net-forwarder until `shutdown` is cancelled. The state is loaded and reconciled
/// before the socket is bound, so nothing is served from a state that failed to load.
/// Attachments outlive the process: pods keep their network while it is restarted.
pub async fn run(args: ServeArgs, shutdown: CancellationToken) -> Result<()> {
    let ipam = Ipam::open(&args.state_dir, args.pod_cidr)?;
    enable_forwarding();
    let context = Arc::new(Context::new(ipam, Netlink::new()?.with_attach_mode(args.attach_mode), args.mtu));
    context.recover().await?;
    let listener = Listener::unix(&args.socket)?;
    info!(socket = %args.socket.display(), pod_cidr = %args.pod_cidr, mtu = args.mtu, "net-forwarder ready");
    let services = Services::new()
        .with(NetForwarderServer::new(Service(context)))
        .describe(hpk_proto::FILE_DESCRIPTOR_SET);
    hpk_rpc::serve(listener, services, shutdown).await?;
    Ok(())
}

/// Pod-to-pod traffic is routed through the bubble; without forwarding only pod ↔ bubble works.
fn enable_forwarding() {
    if let Err(e) = std::fs::write("/proc/sys/net/ipv4/ip_forward", "1") {
        warn!(error = %e, "cannot enable IPv4 forwarding: pods will reach the bubble but not each other");
    }
}
