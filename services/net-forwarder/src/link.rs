//! The kernel side of an attachment: a veth pair from the bubble into a pod's network
//! namespace, over rtnetlink.
//!
//! Pod side: `eth0` with the pod's address as a /32, `lo` up, a link route to the gateway and a
//! default route via it. Bubble side: the gateway address (the same link-local /32 on every
//! bubble-side veth, so the bubble answers the pods' ARP for it without proxy ARP) and a /32
//! route to the pod. Netlink sockets talk to the namespace they were opened in, so the pod side
//! is configured from a short-lived thread that first enters the pod's namespace; the async
//! runtime's own threads never change namespace.
//!
//! Where the kernel refuses a veth into the pod, the attachment is a pair of TAPs and a relay
//! instead ([`crate::tap`]), chosen by [`AttachMode`]; both ends are configured the same way.

use std::fs::File;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::TryStreamExt;
use nix::sched::CloneFlags;
use rtnetlink::packet_route::link::{LinkAttribute, LinkMessage};
use rtnetlink::packet_route::route::RouteScope;
use rtnetlink::{Handle, LinkUnspec, LinkVeth, RouteMessageBuilder};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::stats::Counters;
use crate::tap::{TAP_PREFIX, Taps, tap_interface};
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

/// Every bubble-side interface name a sandbox may own (its veth, its TAP).
pub fn sandbox_interfaces(sandbox_id: &str) -> [String; 2] {
    [host_interface(sandbox_id), tap_interface(sandbox_id)]
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

/// How new attachments join a pod to the bubble.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum AttachMode {
    /// A kernel veth pair: the fastest, no relay.
    Veth,
    /// A TAP in the pod and one in the bubble, with a relay in the net-forwarder between them.
    Tap,
    /// veth, and TAP once the kernel refuses a veth into the pod (EPERM, EOPNOTSUPP).
    #[default]
    Auto,
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
    /// At start, for a live allocation: makes its attachment work again, given the names of the
    /// net-forwarder's interfaces present in the bubble.
    fn restore(
        &self,
        spec: &AttachSpec,
        netns: &File,
        present: &[String],
    ) -> impl Future<Output = Result<()>> + Send {
        async move {
            if present.contains(&host_interface(&spec.sandbox_id)) {
                return Ok(());
            }
            warn!(sandbox = %spec.sandbox_id, "veth missing: re-creating it");
            self.attach(spec, netns).await
        }
    }
    /// The bubble-side interface of an attached sandbox.
    fn host_interface(&self, sandbox_id: &str) -> String {
        host_interface(sandbox_id)
    }
    /// Counters kept by a relay, for attachments that have one (the kernel's counters of the
    /// bubble-side interface are used otherwise).
    fn relay_counters(&self, _sandbox_id: &str) -> Option<Counters> {
        None
    }
}

/// [`Network`] through rtnetlink, in the namespace the process runs in (the bubble).
pub struct Netlink {
    handle: Handle,
    mode: AttachMode,
    taps: Taps,
    /// Auto mode: the kernel refused a veth into a pod, so TAPs are used from then on.
    veth_refused: AtomicBool,
    /// Auto mode: the choice has been logged.
    mode_logged: AtomicBool,
}

/// Why a veth attach failed: the kernel refuses veth into the pod at all, or something else.
enum VethError {
    Refused(Error),
    Failed(Error),
}

impl Netlink {
    /// Opens a netlink connection in the current network namespace; must run inside a tokio
    /// runtime, which drives the connection.
    pub fn new() -> Result<Self> {
        let (connection, handle, _) =
            rtnetlink::new_connection().map_err(|e| Error::io("open a netlink socket", e))?;
        tokio::spawn(connection);
        Ok(Netlink {
            handle,
            mode: AttachMode::default(),
            taps: Taps::default(),
            veth_refused: AtomicBool::new(false),
            mode_logged: AtomicBool::new(false),
        })
    }

    /// Sets how new attachments are made (existing ones are restored as they are).
    pub fn with_attach_mode(mut self, mode: AttachMode) -> Self {
        self.mode = mode;
        self
    }

    pub(crate) async fn index_of(handle: &Handle, name: &str) -> Result<Option<u32>> {
        let mut links = handle.link().get().match_name(name.to_owned()).execute();
        match links.try_next().await {
            Ok(link) => Ok(link.map(|l| l.header.index)),
            Err(e) if is_errno(&e, nix::errno::Errno::ENODEV) => Ok(None),
            Err(e) => Err(Error::netlink(format!("look up {name}"), e)),
        }
    }

    /// Creates the pair and moves the peer into the pod: the steps the kernel may refuse.
    async fn create_pair(&self, spec: &AttachSpec, netns: &File) -> Result<(), VethError> {
        let host = host_interface(&spec.sandbox_id);
        let peer = peer_interface(&spec.sandbox_id);
        let h = &self.handle;
        h.link()
            .add(LinkVeth::new(&host, &peer).mtu(spec.mtu).build())
            .execute()
            .await
            .map_err(|e| refused_or_failed(format!("create veth pair {host}/{peer}"), e))?;
        let peer_index = Self::index_of(h, &peer).await.map_err(VethError::Failed)?;
        let peer_index = peer_index.ok_or_else(|| VethError::Failed(missing(&peer)))?;
        h.link()
            .set(LinkUnspec::new_with_index(peer_index).setns_by_fd(netns.as_raw_fd()).build())
            .execute()
            .await
            .map_err(|e| refused_or_failed(format!("move {peer} into the pod's namespace"), e))?;
        Ok(())
    }

    async fn create(&self, spec: &AttachSpec, netns: &File) -> Result<(), VethError> {
        self.create_pair(spec, netns).await?;
        let pod = (peer_interface(&spec.sandbox_id), spec.address, spec.mtu);
        in_netns(netns, move |handle| configure_pod(handle, pod)).await.map_err(VethError::Failed)?;
        configure_host(&self.handle, &host_interface(&spec.sandbox_id), spec.address, spec.mtu)
            .await
            .map_err(VethError::Failed)
    }

    async fn attach_veth(&self, spec: &AttachSpec, netns: &File) -> Result<(), VethError> {
        let result = self.create(spec, netns).await;
        if result.is_err() {
            // Deleting one end deletes the pair, wherever the peer is by now.
            for name in [host_interface(&spec.sandbox_id), peer_interface(&spec.sandbox_id)] {
                if let Err(e) = self.remove_interface(&name).await {
                    warn!(interface = %name, error = %e, "cleanup after a failed attach");
                }
            }
        }
        result
    }

    async fn attach_auto(&self, spec: &AttachSpec, netns: &File) -> Result<()> {
        if self.veth_refused.load(Ordering::Relaxed) {
            return self.taps.attach(&self.handle, spec, netns).await;
        }
        match self.attach_veth(spec, netns).await {
            Ok(()) => {
                if !self.mode_logged.swap(true, Ordering::Relaxed) {
                    info!("attach mode auto: veth pairs into the pods work, using them");
                }
                Ok(())
            }
            Err(VethError::Failed(e)) => Err(e),
            Err(VethError::Refused(e)) => {
                if !self.veth_refused.swap(true, Ordering::Relaxed) {
                    warn!(error = %e, "attach mode auto: the kernel refuses a veth into the pod; \
                                       using a TAP and a relay (slower) from now on");
                }
                self.taps.attach(&self.handle, spec, netns).await
            }
        }
    }
}

impl VethError {
    fn into_inner(self) -> Error {
        match self {
            VethError::Refused(e) | VethError::Failed(e) => e,
        }
    }
}

fn refused_or_failed(action: String, e: rtnetlink::Error) -> VethError {
    use nix::errno::Errno;
    if [Errno::EPERM, Errno::EOPNOTSUPP].iter().any(|&errno| is_errno(&e, errno)) {
        VethError::Refused(Error::netlink(action, e))
    } else {
        VethError::Failed(Error::netlink(action, e))
    }
}

/// Bubble side of an attachment, veth or TAP: MTU, the gateway address, up, and the /32 route
/// to the pod. Idempotent, so a restart can apply it to an interface that has it already.
pub(crate) async fn configure_host(h: &Handle, name: &str, address: Ipv4Addr, mtu: u32) -> Result<()> {
    let index = Netlink::index_of(h, name).await?.ok_or_else(|| missing(name))?;
    h.link()
        .set(LinkUnspec::new_with_index(index).mtu(mtu).build())
        .execute()
        .await
        .map_err(|e| Error::netlink(format!("set the MTU of {name}"), e))?;
    add_address(h, index, GATEWAY, name).await?;
    set_up(h, index, name).await?;
    let route = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(address, 32)
        .output_interface(index)
        .scope(RouteScope::Link)
        .build();
    h.route()
        .add(route)
        .replace()
        .execute()
        .await
        .map_err(|e| Error::netlink(format!("add route {address}/32 dev {name}"), e))
}

impl Network for Netlink {
    async fn check_netns(&self, netns: &File) -> Result<()> {
        in_netns(netns, |_| async { Ok(()) }).await
    }

    async fn attach(&self, spec: &AttachSpec, netns: &File) -> Result<()> {
        match self.mode {
            AttachMode::Veth => self.attach_veth(spec, netns).await.map_err(VethError::into_inner),
            AttachMode::Tap => self.taps.attach(&self.handle, spec, netns).await,
            AttachMode::Auto => self.attach_auto(spec, netns).await,
        }
    }

    async fn detach(&self, sandbox_id: &str) -> Result<()> {
        self.taps.detach(sandbox_id).await;
        for name in sandbox_interfaces(sandbox_id) {
            self.remove_interface(&name).await?;
        }
        Ok(())
    }

    async fn restore(&self, spec: &AttachSpec, netns: &File, present: &[String]) -> Result<()> {
        let id = &spec.sandbox_id;
        if present.contains(&host_interface(id)) {
            return Ok(());
        }
        if present.contains(&tap_interface(id)) {
            info!(sandbox = %id, "re-opening the TAPs and restarting the relay");
            return self.taps.attach(&self.handle, spec, netns).await;
        }
        warn!(sandbox = %id, "interface missing: re-creating it");
        self.attach(spec, netns).await
    }

    fn host_interface(&self, sandbox_id: &str) -> String {
        if self.taps.contains(sandbox_id) { tap_interface(sandbox_id) } else { host_interface(sandbox_id) }
    }

    fn relay_counters(&self, sandbox_id: &str) -> Option<Counters> {
        self.taps.counters(sandbox_id)
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
        Ok(links.iter().filter_map(link_name).filter(|n| is_ours(n)).collect())
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
/// Idempotent, so a restart can apply it to a pod's TAP that has it already.
pub(crate) async fn configure_pod(h: Handle, (peer, address, mtu): (String, Ipv4Addr, u32)) -> Result<()> {
    let index = Netlink::index_of(&h, &peer).await?.ok_or_else(|| missing(&peer))?;
    let lo = Netlink::index_of(&h, "lo").await?.ok_or_else(|| missing("lo"))?;
    set_up(&h, lo, "lo in the pod").await?;
    let mut eth0 = LinkUnspec::new_with_index(index).mtu(mtu);
    if peer != POD_INTERFACE {
        eth0 = eth0.name(POD_INTERFACE.to_owned());
    }
    h.link()
        .set(eth0.build())
        .execute()
        .await
        .map_err(|e| Error::netlink(format!("rename {peer} to {POD_INTERFACE} in the pod"), e))?;
    add_address(&h, index, address, "eth0 in the pod").await?;
    set_up(&h, index, "eth0 in the pod").await?;
    let to_gateway = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(GATEWAY, 32)
        .output_interface(index)
        .scope(RouteScope::Link)
        .build();
    h.route()
        .add(to_gateway)
        .replace()
        .execute()
        .await
        .map_err(|e| Error::netlink("add the gateway route in the pod", e))?;
    let default = RouteMessageBuilder::<Ipv4Addr>::new().gateway(GATEWAY).output_interface(index).build();
    h.route()
        .add(default)
        .replace()
        .execute()
        .await
        .map_err(|e| Error::netlink("add the default route in the pod", e))
}

/// Runs `f` with a netlink handle opened inside the namespace `netns`, on a thread of its own
/// (entering a network namespace is per thread) with a single-threaded runtime.
pub(crate) async fn in_netns<F, Fut>(netns: &File, f: F) -> Result<()>
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

/// Adds `address/32` to the interface `index` (`name` for messages); one it has already is fine,
/// so configuring twice (at a restart) is harmless.
pub(crate) async fn add_address(h: &Handle, index: u32, address: Ipv4Addr, name: &str) -> Result<()> {
    match h.address().add(index, IpAddr::V4(address), 32).execute().await {
        Err(e) if !is_errno(&e, nix::errno::Errno::EEXIST) => {
            Err(Error::netlink(format!("add {address}/32 to {name}"), e))
        }
        _ => Ok(()),
    }
}

/// Sets the interface `index` (`name` for messages) up.
pub(crate) async fn set_up(h: &Handle, index: u32, name: &str) -> Result<()> {
    h.link()
        .set(LinkUnspec::new_with_index(index).up().build())
        .execute()
        .await
        .map_err(|e| Error::netlink(format!("set {name} up"), e))
}

/// A per-sandbox interface name: one of the prefixes and 11 hex digits (so `hpk-tunnel`, the
/// tunnel's device, is not one).
fn is_ours(name: &str) -> bool {
    [HOST_PREFIX, PEER_PREFIX, TAP_PREFIX].iter().any(|p| {
        name.strip_prefix(p)
            .is_some_and(|rest| rest.len() == 11 && rest.bytes().all(|b| b.is_ascii_hexdigit()))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_per_sandbox_names_are_ours() {
        assert!(
            is_ours(&host_interface("s")) && is_ours(&peer_interface("s")) && is_ours(&tap_interface("s"))
        );
        for other in ["hpk-tunnel", "hpktun0", "hpkv", "hpkvxxxxxxxxxxx", "eth0", "lo", "tap0"] {
            assert!(!is_ours(other), "{other}");
        }
    }
}
