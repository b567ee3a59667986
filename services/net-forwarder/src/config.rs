//! Command-line and environment configuration.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;

use crate::cidr::PodCidr;
use crate::link::AttachMode;
use crate::peers::Peer;

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
    /// The node's pod CIDR, e.g. 10.244.1.0/24; by default the Node's spec.podCIDR (needs
    /// --kubeconfig). Its first host address is the bubble's own; pods get the others but the
    /// broadcast address.
    #[arg(long, env = "HPK_POD_CIDR", required_unless_present = "kubeconfig")]
    pub pod_cidr: Option<PodCidr>,
    /// MTU of both ends of every pod's veth pair.
    #[arg(long, env = "HPK_POD_MTU", default_value_t = 1500,
          value_parser = clap::value_parser!(u32).range(MIN_MTU as i64..=MAX_MTU as i64))]
    pub mtu: u32,
    /// The tunnel's UDP sockets, inherited from `hpk-net-forwarder tunnel-socket`, which bound
    /// them in the host's network namespace before the bubble was entered: one descriptor, or
    /// the comma-separated descriptors of a reuse-port group in the order they joined it (one
    /// receiving thread each).
    #[arg(long, env = "HPK_TUNNEL_FD", conflicts_with = "tunnel_listen", value_delimiter = ',')]
    pub tunnel_fd: Vec<i32>,
    /// Queues of the tunnel's TUN device, each with a thread that seals and sends what the
    /// kernel puts on it (one flow stays on one queue); 1 to 16. By default one per CPU this
    /// process may use (the allocation's), at most 16. With --tunnel-listen, as many sockets
    /// are bound, one receiving thread each.
    #[arg(long, env = "HPK_TUNNEL_QUEUES",
          value_parser = clap::value_parser!(u32).range(1..=crate::tunnel::chunks::LANES as i64))]
    pub tunnel_queues: Option<u32>,
    /// Bind the tunnel's UDP socket here, in the net-forwarder's own namespace (for a
    /// net-forwarder that runs without a bubble).
    #[arg(long, env = "HPK_TUNNEL_LISTEN")]
    pub tunnel_listen: Option<SocketAddrV4>,
    /// The tunnel's X25519 private key, for static set-ups whose `--peer` flags name this
    /// node's public key: 64 hexadecimal digits in a file of mode 0600 owned by this user
    /// (`tunnel-private-key`). Without it each run makes a new key pair in memory and publishes
    /// the public key on its Node, which is what a cluster does.
    #[arg(long, env = "HPK_TUNNEL_PRIVATE_KEY_FILE")]
    pub tunnel_private_key_file: Option<PathBuf>,
    /// The host address the other nodes send to, when the socket is bound to 0.0.0.0.
    #[arg(long, env = "HPK_TUNNEL_ADVERTISE")]
    pub tunnel_advertise: Option<Ipv4Addr>,
    /// MTU of the host link the tunnel's datagrams take: each datagram is cut to fit it, so
    /// that none is IP-fragmented. Above the link's real MTU the kernel refuses UDP GSO sends
    /// (the tunnel then falls back to one send per datagram, and the IP layer fragments them).
    #[arg(long, env = "HPK_TUNNEL_MTU", default_value_t = 1500,
          value_parser = clap::value_parser!(u32).range(MIN_MTU as i64..=MAX_MTU as i64))]
    pub tunnel_mtu: u32,
    /// A static peer, NAME=CIDR@ADDRESS:PORT/PUBLIC-KEY (repeatable; the key is 64 lowercase
    /// hexadecimal digits, see `tunnel-public-key`); the Kubernetes API adds the others.
    #[arg(long = "peer", value_parser = parse_peer)]
    pub peers: Vec<Peer>,
    /// Serve Prometheus metrics over HTTP on this loopback address (inside the bubble, its own
    /// loopback), e.g. 127.0.0.1:9560.
    #[arg(long, env = "HPK_METRICS_ADDRESS")]
    pub metrics_address: Option<SocketAddr>,
    /// Kubeconfig of the node's identity: the pod CIDR from the Node, the tunnel endpoint
    /// published on it, the other nodes' routes watched.
    #[arg(long, env = "HPK_KUBECONFIG", requires = "node_name")]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name in Kubernetes.
    #[arg(long, env = "HPK_NODE_NAME")]
    pub node_name: Option<String>,
    /// How pods are attached: `veth` (a kernel veth pair, fastest), `tap` (a TAP in the pod and
    /// one in the bubble with a relay in this process between them, for hosts that refuse a veth
    /// into the pod), or `auto` (veth, and tap once the kernel refuses a veth).
    #[arg(long, env = "HPK_ATTACH_MODE", value_enum, default_value_t = AttachMode::Auto)]
    pub attach_mode: AttachMode,
}

fn parse_peer(text: &str) -> Result<Peer, String> {
    crate::peers::parse_flag(text).map_err(|e| e.to_string())
}
