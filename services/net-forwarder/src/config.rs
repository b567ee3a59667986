//! Command-line and environment configuration.

use std::path::PathBuf;

use crate::cidr::PodCidr;
use crate::link::AttachMode;

/// Smallest MTU accepted: IPv4's minimum for a link.
pub const MIN_MTU: u32 = 576;
/// Largest MTU accepted: a veth's maximum.
pub const MAX_MTU: u32 = 65535;

/// `hpk-net-forwarder serve`: the node's pod network.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// UNIX socket to serve the NetForwarder API on; its directory is made 0700.
    #[arg(long, env = "HPK_NET_FORWARDER_SOCKET")]
    pub socket: PathBuf,
    /// Directory holding the address allocations (allocations.json); created 0700.
    #[arg(long, env = "HPK_NET_FORWARDER_STATE_DIR")]
    pub state_dir: PathBuf,
    /// The node's pod CIDR, e.g. 10.244.1.0/24 (the Node's spec.podCIDR). Its first host address
    /// is reserved for the bubble; pods get the others but the broadcast address.
    #[arg(long, env = "HPK_POD_CIDR")]
    pub pod_cidr: PodCidr,
    /// MTU of both ends of every pod's veth pair.
    #[arg(long, env = "HPK_POD_MTU", default_value_t = 1500,
          value_parser = clap::value_parser!(u32).range(MIN_MTU as i64..=MAX_MTU as i64))]
    pub mtu: u32,
    /// How pods are attached: `veth` (a kernel veth pair, fastest), `tap` (a TAP in the pod and
    /// one in the bubble with a relay in this process between them, for hosts that refuse a veth
    /// into the pod), or `auto` (veth, and tap once the kernel refuses a veth).
    #[arg(long, env = "HPK_ATTACH_MODE", value_enum, default_value_t = AttachMode::Auto)]
    pub attach_mode: AttachMode,
}
