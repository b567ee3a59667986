//! The kernel side of an attachment: a veth pair from the bubble into a pod's network
//! namespace, over rtnetlink.
//!
//! Pod side: `eth0` with the pod's address as a /32, `lo` up, a link route to the gateway and a
//! default route via it. Bubble side: the gateway address (the same link-local /32 on every
//! bubble-side veth, so the bubble answers the pods' ARP for it without proxy ARP) and a /32
//! route to the pod. Netlink sockets talk to the namespace they were opened in, so the pod side
//! is configured from a short-lived thread that first enters the pod's namespace; the async
//! runtime's own threads never change namespace.

use std::fs::File;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;

use futures_util::TryStreamExt;
use nix::sched::CloneFlags;
use rtnetlink::packet_route::link::{LinkAttribute, LinkMessage};
use rtnetlink::packet_route::route::RouteScope;
use rtnetlink::{Handle, LinkUnspec, LinkVeth, RouteMessageBuilder};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// The pods' default gateway: link-local, on every bubble-side veth.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The interface name inside the pod.
pub const POD_INTERFACE: &str = "eth0";
/// Prefix of bubble-side veth names; anything with it is the net-forwarder's.
pub const HOST_PREFIX: &str = "hpkv";
/// Prefix of a pod-side veth before it moves into the pod and is renamed.
const PEER_PREFIX: &str = "hpkp";

/// The bubble-side interface name of a sandbox: the prefix and 11 hex digits of its id's
/// SHA-256 (15 characters, the kernel's limit).
pub fn host_interface(sandbox_id: &str) -> String {
    format!("{HOST_PREFIX}{}", &hex::encode(Sha256::digest(sandbox_id))[..11])
}

fn peer_interface(sandbox_id: &str) -> String {
    format!("{PEER_PREFIX}{}", &hex::encode(Sha256::digest(sandbox_id))[..11])
}

/// What to create for one sandbox.
#[derive(Clone, Debug)]
pub struct AttachSpec {
    /// The sandbox id.
    pub sandbox_id: String,
    /// The pod's address (a /32).
    pub address: Ipv4Addr,
    /// MTU of both ends.
    pub mtu: u32,
}

/// The operations on the kernel's network configuration the service needs; a trait so the
/// service logic can be exercised without privileges.
pub trait Network: Send + Sync + 'static {
    /// Fails unless `netns` is a network namespace this process may enter.
    fn check_netns(&self, netns: &File) -> impl Future<Output = Result<()>> + Send;
    /// Creates the veth pair and configures both ends; on failure leaves nothing behind.
    fn attach(&self, spec: &AttachSpec, netns: &File) -> impl Future<Output = Result<()>> + Send;
    /// Removes a sandbox's veth pair (and with it its route); no error if it is already gone.
    fn detach(&self, sandbox_id: &str) -> impl Future<Output = Result<()>> + Send;
    /// Names of the net-forwarder's interfaces in the bubble.
    fn interfaces(&self) -> impl Future<Output = Result<Vec<String>>> + Send;
    /// Removes an interface by name; no error if it is already gone.
    fn remove_interface(&self, name: &str) -> impl Future<Output = Result<()>> + Send;
}

/// [`Network`] through rtnetlink, in the namespace the process runs in (the bubble).
pub struct Netlink {
    handle: Handle,
}

impl Netlink {
    /// Opens a netlink connection in the current network namespace; must run inside a tokio
    /// runtime, which drives the connection.
    pub fn new() -> Result<Self> {
        let (connection, handle, _) =
            rtnetlink::new_connection().map_err(|e| Error::io("open a netlink socket", e))?;
        tokio::spawn(connection);
        Ok(Netlink { handle })
    }

    async fn index_of(handle: &Handle, name: &str) -> Result<Option<u32>> {
        let mut links = handle.link().get().match_name(name.to_owned()).execute();
        match links.try_next().await {
            Ok(link) => Ok(link.map(|l| l.header.index)),
            Err(e) if is_errno(&e, nix::errno::Errno::ENODEV) => Ok(None),
            Err(e) => Err(Error::netlink(format!("look up {name}"), e)),
        }
    }

    async fn create(&self, spec: &AttachSpec, netns: &File) -> Result<()> {
        let host = host_interface(&spec.sandbox_id);
        let peer = peer_interface(&spec.sandbox_id);
        let h = &self.handle;
        h.link()
            .add(LinkVeth::new(&host, &peer).mtu(spec.mtu).build())
            .execute()
            .await
            .map_err(|e| Error::netlink(format!("create veth pair {host}/{peer}"), e))?;
        let peer_index = Self::index_of(h, &peer).await?.ok_or_else(|| missing(&peer))?;
        h.link()
            .set(LinkUnspec::new_with_index(peer_index).setns_by_fd(netns.as_raw_fd()).build())
            .execute()
            .await
            .map_err(|e| Error::netlink(format!("move {peer} into the pod's namespace"), e))?;
        let pod = (peer.clone(), spec.address, spec.mtu);
        in_netns(netns, move |handle| configure_pod(handle, pod)).await?;

        let index = Self::index_of(h, &host).await?.ok_or_else(|| missing(&host))?;
        h.address()
            .add(index, IpAddr::V4(GATEWAY), 32)
            .execute()
            .await
            .map_err(|e| Error::netlink(format!("add {GATEWAY}/32 to {host}"), e))?;
        h.link()
            .set(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
            .map_err(|e| Error::netlink(format!("set {host} up"), e))?;
        let route = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(spec.address, 32)
            .output_interface(index)
            .scope(RouteScope::Link)
            .build();
        h.route()
            .add(route)
            .replace()
            .execute()
            .await
            .map_err(|e| Error::netlink(format!("add route {}/32 dev {host}", spec.address), e))
    }
}

impl Network for Netlink {
    async fn check_netns(&self, netns: &File) -> Result<()> {
        in_netns(netns, |_| async { Ok(()) }).await
    }

    async fn attach(&self, spec: &AttachSpec, netns: &File) -> Result<()> {
        let result = self.create(spec, netns).await;
        if result.is_err() {
            // Deleting one end deletes the pair, wherever the peer is by now.
            for name in [host_interface(&spec.sandbox_id), peer_interface(&spec.sandbox_id)] {
                if let Err(e) = self.remove_interface(&name).await {
                    tracing::warn!(interface = %name, error = %e, "cleanup after a failed attach");
                }
            }
        }
        result
    }

    async fn detach(&self, sandbox_id: &str) -> Result<()> {
        self.remove_interface(&host_interface(sandbox_id)).await
    }

    async fn interfaces(&self) -> Result<Vec<String>> {
        let links: Vec<LinkMessage> = self
            .handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|e| Error::netlink("list interfaces", e))?;
        Ok(links
            .iter()
            .filter_map(link_name)
            .filter(|n| n.starts_with(HOST_PREFIX) || n.starts_with(PEER_PREFIX))
            .collect())
    }

    async fn remove_interface(&self, name: &str) -> Result<()> {
        let Some(index) = Self::index_of(&self.handle, name).await? else { return Ok(()) };
        match self.handle.link().del(index).execute().await {
            Err(e) if !is_errno(&e, nix::errno::Errno::ENODEV) => {
                Err(Error::netlink(format!("delete {name}"), e))
            }
            _ => Ok(()),
        }
    }
}

/// Inside the pod: rename the peer to eth0, set MTU, bring it and lo up, address and routes.
async fn configure_pod(h: Handle, (peer, address, mtu): (String, Ipv4Addr, u32)) -> Result<()> {
    let index = Netlink::index_of(&h, &peer).await?.ok_or_else(|| missing(&peer))?;
    let lo = Netlink::index_of(&h, "lo").await?.ok_or_else(|| missing("lo"))?;
    h.link()
        .set(LinkUnspec::new_with_index(lo).up().build())
        .execute()
        .await
        .map_err(|e| Error::netlink("set lo up in the pod", e))?;
    h.link()
        .set(LinkUnspec::new_with_index(index).name(POD_INTERFACE.to_owned()).mtu(mtu).build())
        .execute()
        .await
        .map_err(|e| Error::netlink(format!("rename {peer} to {POD_INTERFACE} in the pod"), e))?;
    h.address()
        .add(index, IpAddr::V4(address), 32)
        .execute()
        .await
        .map_err(|e| Error::netlink(format!("add {address}/32 in the pod"), e))?;
    h.link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .map_err(|e| Error::netlink("set eth0 up in the pod", e))?;
    let to_gateway = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(GATEWAY, 32)
        .output_interface(index)
        .scope(RouteScope::Link)
        .build();
    h.route()
        .add(to_gateway)
        .execute()
        .await
        .map_err(|e| Error::netlink("add the gateway route in the pod", e))?;
    let default = RouteMessageBuilder::<Ipv4Addr>::new().gateway(GATEWAY).output_interface(index).build();
    h.route().add(default).execute().await.map_err(|e| Error::netlink("add the default route in the pod", e))
}

/// Runs `f` with a netlink handle opened inside the namespace `netns`, on a thread of its own
/// (entering a network namespace is per thread) with a single-threaded runtime.
async fn in_netns<F, Fut>(netns: &File, f: F) -> Result<()>
where
    F: FnOnce(Handle) -> Fut + Send + 'static,
    Fut: Future<Output = Result<()>>,
{
    let netns = netns.try_clone().map_err(|e| Error::io("duplicate the namespace fd", e))?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let thread = std::thread::Builder::new().name("netns".into()).spawn(move || {
        let _ = tx.send(run_in(netns, f));
    });
    thread.map_err(|e| Error::io("start a thread for the pod's namespace", e))?;
    rx.await.map_err(|_| Error::Config("the thread in the pod's namespace panicked".into()))?
}

fn run_in<F, Fut>(netns: File, f: F) -> Result<()>
where
    F: FnOnce(Handle) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    nix::sched::setns(&netns, CloneFlags::CLONE_NEWNET).map_err(|e| {
        Error::InvalidArgument(format!("cannot enter the namespace (is it a network namespace?): {e}"))
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("start a runtime in the pod's namespace", e))?;
    runtime.block_on(async {
        let (connection, handle, _) =
            rtnetlink::new_connection().map_err(|e| Error::io("open a netlink socket in the pod", e))?;
        let driver = tokio::spawn(connection);
        let result = f(handle).await;
        driver.abort();
        result
    })
}

fn link_name(link: &LinkMessage) -> Option<String> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(name) => Some(name.clone()),
        _ => None,
    })
}

fn is_errno(e: &rtnetlink::Error, errno: nix::errno::Errno) -> bool {
    matches!(e, rtnetlink::Error::NetlinkError(m) if m.to_io().raw_os_error() == Some(errno as i32))
}

fn missing(name: &str) -> Error {
    Error::Config(format!("interface {name} vanished while it was being configured"))
}
