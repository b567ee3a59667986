//! The tunnel to the other nodes' bubbles: a multi-queue TUN device in the bubble, UDP sockets
//! in the host's network namespace, and relay threads between them: one sending thread per
//! queue, one receiving thread per socket.
//!
//! ```text
//!  pod ─veth─ bubble ──route: peer's pod CIDR dev hpk-tunnel──► TUN ─► [tx thread] seal ─► UDP ─► peer
//!  pod ◄veth─ bubble ◄── kernel forwards to the pod's /32 ◄── TUN ◄─ [rx thread] open ◄─ UDP ◄─ peer
//! ```
//!
//! The TUN device carries virtio-net headers with TSO and checksum offloads, so the kernel hands
//! the relay whole 64 KiB GSO packets. Each is sealed into one *message* ([`wire`]), which is cut
//! into *chunks* that each fit one datagram of the host link's MTU (`--tunnel-mtu`), so that
//! nothing is IP-fragmented ([`chunks`]). The chunks of a message go out with one `sendmsg` using
//! UDP GSO (two for the largest messages: one send carries at most 64 KiB), and come in coalesced
//! by UDP GRO; the receiver puts the message back together and opens it. Kernels without UDP
//! GSO or GRO get the same datagrams one system call each.
//!
//! Every node has its own key pair for the run ([`identity`]), and every pair of nodes its own
//! keys. Everything is authenticated per message, and the receiver accepts only what a current
//! peer sent from its endpoint, with a packet from its pod CIDR ([`senders`]). What fails is
//! dropped and counted: datagrams from an address that is no peer's endpoint, messages under a
//! key id no peer has, and packets whose source is outside the sender's pod CIDR as spoofed;
//! chunks of no known format as malformed; messages that fail authentication as auth drops;
//! replays as replays; messages whose chunks did not all arrive as incomplete.
//! Relay threads use blocking I/O and no locks but a read lock on the peer table per packet
//! (sending) and the receiver table's lock per batch of datagrams and twice per message
//! (receiving: the window's checks before and after opening, not the decryption).
//!
//! Queues: the kernel hands each flow's packets to one queue of the device; that queue's thread
//! puts its number, the *lane*, in the id of every message it sends ([`chunks::message_id`]),
//! and the receiving host's kernel steers each datagram to the socket of its lane
//! ([`crate::inherit::steer`]). So a flow's messages are received, opened and written by one
//! thread, in the order they were sent, and all the chunks of a message meet in one thread's
//! reassembly; different flows use the cores in parallel. The queues share one [`Sealer`]: its
//! counter is one atomic add per message, and messages of different queues may reach a peer
//! in another order than their counters, within its window.

pub mod chunks;
pub mod identity;
pub mod keyfile;
pub mod routes;
pub mod senders;
pub mod udp;
pub mod wire;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};

use hpk_proto::netforwarder::v1 as pb;
use tracing::{info, warn};

use crate::cidr::{CidrIndex, PodCidr};
use crate::peers::Peer;
use crate::tuntap::{Device, Kind, Options, VNET_HDR_LEN};
use crate::{Error, Result};
use chunks::{Cutter, MAX_MESSAGE, Reassembly};
use identity::{Identity, PairKeys, PublicKey};
use senders::Senders;
use wire::{HEADER_LEN, OVERHEAD, Refused, Sealer, TAG_LEN};

/// The TUN device's name in the bubble.
pub const DEVICE: &str = "hpk-tunnel";
/// The largest payload (virtio-net header + IP packet) of one message.
pub const MAX_PAYLOAD: usize = MAX_MESSAGE - OVERHEAD;

/// Counters of the whole tunnel; see `TunnelStats` in netforwarder.proto.
#[derive(Default, Debug)]
pub struct Counters {
    /// Packets sent to peers.
    pub tx_packets: AtomicU64,
    /// Their bytes (IP packets, before the tunnel's overhead).
    pub tx_bytes: AtomicU64,
    /// Packets received from peers and written to the bubble.
    pub rx_packets: AtomicU64,
    /// Their bytes.
    pub rx_bytes: AtomicU64,
    /// Messages that failed authentication.
    pub rx_dropped_auth: AtomicU64,
    /// Authentic messages refused as replays.
    pub rx_dropped_replay: AtomicU64,
    /// Datagrams of no known format, or messages carrying no packet for this node.
    pub rx_dropped_malformed: AtomicU64,
    /// Datagrams from an address that is no peer's endpoint, messages under a key id that is
    /// not the peer's at that address, packets from outside the sender's pod CIDR.
    pub rx_dropped_spoofed: AtomicU64,
    /// Messages in reassembly after the last batch of datagrams (a gauge).
    pub rx_reassembling: AtomicU64,
    /// Messages dropped before all their chunks arrived.
    pub rx_dropped_incomplete: AtomicU64,
    /// Packets for an address no peer owns.
    pub tx_dropped_no_route: AtomicU64,
    /// Packets that could not be sent (socket errors, oversize).
    pub tx_dropped_error: AtomicU64,
    /// Packets that could not be written to the bubble.
    pub rx_dropped_error: AtomicU64,
    /// Peers refused: malformed endpoint or key annotations or pod CIDRs, overlaps, duplicates.
    pub peers_refused: Arc<AtomicU64>,
}

/// Counters of one peer.
#[derive(Default, Debug)]
pub struct PeerCounters {
    /// Packets sent to it.
    pub tx_packets: AtomicU64,
    /// Their bytes.
    pub tx_bytes: AtomicU64,
    /// Packets received from it.
    pub rx_packets: AtomicU64,
    /// Their bytes.
    pub rx_bytes: AtomicU64,
}

/// A routed peer, its keys and its counters.
#[derive(Clone)]
pub struct Route {
    /// The peer.
    pub peer: Peer,
    /// Its counters; kept while the peer stays in the table with the same CIDR.
    pub counters: Arc<PeerCounters>,
    /// The keys this node shares with it; kept while its public key is unchanged.
    keys: Arc<PairKeys>,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route").field("peer", &self.peer).field("counters", &self.counters).finish()
    }
}

/// The running tunnel. The relay threads run until the process exits; the device and the
/// sockets close with it.
pub struct Tunnel {
    _devices: Vec<Device>,
    endpoint: SocketAddrV4,
    own: PodCidr,
    identity: Identity,
    routes: Arc<RwLock<RouteTable>>,
    senders: Arc<Mutex<Senders>>,
    counters: Arc<Counters>,
    queues: usize,
}

/// The peers, and the index that finds a packet's peer by its destination.
#[derive(Default)]
struct RouteTable {
    routes: Vec<Route>,
    index: CidrIndex,
}

impl RouteTable {
    fn new(routes: Vec<Route>) -> Self {
        let index = CidrIndex::new(routes.iter().map(|r| &r.peer.pod_cidr));
        Self { routes, index }
    }

    /// The peer whose pod CIDR holds `dst`.
    fn find(&self, dst: Ipv4Addr) -> Option<&Route> {
        self.index.find(dst).map(|i| &self.routes[i])
    }
}

/// The queues a tunnel uses when none are asked for: one per CPU this process may run on (a
/// Slurm step's allocation, a cgroup's quota), at most [`chunks::LANES`].
pub fn default_queues() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, chunks::LANES)
}

impl Tunnel {
    /// Creates the TUN device in the current network namespace (the bubble) and starts relaying
    /// between it and `sockets` ([`routes::Routes::configure_device`] brings it up): one socket,
    /// or a reuse-port group of them bound to `endpoint`'s port
    /// ([`crate::inherit::bind_group`]). `endpoint` is what the peers send to; `identity` this
    /// run's key pair; `link_mtu` the MTU of the host link the datagrams take; `queues` (1 to
    /// [`chunks::LANES`]) the device's queues, each with a thread that reads and sends what
    /// the kernel puts on it. Each socket has a thread that receives, and the kernel steers
    /// every datagram to the socket its sender's lane names ([`crate::inherit::steer`]).
    pub fn start(
        sockets: Vec<UdpSocket>,
        endpoint: SocketAddrV4,
        identity: Identity,
        own: PodCidr,
        link_mtu: u32,
        queues: usize,
    ) -> Result<Self> {
        let cutter = Cutter::new(link_mtu).ok_or_else(|| {
            Error::Config(format!(
                "--tunnel-mtu {link_mtu}: a link MTU is {} to {}",
                chunks::MTU_RANGE.start(),
                chunks::MTU_RANGE.end()
            ))
        })?;
        if !(1..=chunks::LANES).contains(&queues) {
            return Err(Error::Config(format!(
                "--tunnel-queues {queues}: a tunnel has 1 to {} queues",
                chunks::LANES
            )));
        }
        if sockets.is_empty() || sockets.len() > chunks::LANES {
            return Err(Error::Config(format!(
                "a tunnel has 1 to {} sockets, not {}",
                chunks::LANES,
                sockets.len()
            )));
        }
        let offloads = crate::inherit::udp_offloads(&sockets[0]);
        for s in &sockets[1..] {
            crate::inherit::udp_offloads(s);
        }
        if !offloads.gso || !offloads.gro {
            warn!(
                gso = offloads.gso,
                gro = offloads.gro,
                "the kernel lacks UDP GSO or GRO; the tunnel sends or receives its datagrams one by one"
            );
        }
        if let Err(e) = crate::inherit::steer(&sockets) {
            // The kernel then spreads datagrams by their addresses: a peer's all reach one socket.
            warn!(error = %e, "the tunnel's receiving sockets cannot be steered by lane; one thread receives each peer's traffic");
        }
        let options = Options { kind: Kind::Tun, vnet_hdr: true, multi_queue: queues > 1 };
        let devices = (0..queues).map(|_| Device::create(DEVICE, options)).collect::<Result<Vec<_>>>()?;
        let duplicate =
            |d: &Device| d.file().try_clone().map_err(|e| Error::io("duplicate the TUN descriptor", e));
        let tunnel = Tunnel {
            _devices: Vec::new(),
            endpoint,
            own,
            routes: Arc::new(RwLock::new(RouteTable::default())),
            senders: Arc::new(Mutex::new(Senders::new())),
            counters: Arc::new(Counters::default()),
            identity,
            queues,
        };
        let sockets: Vec<Arc<UdpSocket>> = sockets.into_iter().map(Arc::new).collect();
        let sealer = Arc::new(Sealer::new(tunnel.identity.public().key_id(), now_nanos()));
        let mut relays: Vec<(String, Box<dyn FnOnce() + Send>)> = Vec::new();
        for (lane, device) in devices.iter().enumerate() {
            let tx = TxRelay {
                device: duplicate(device)?,
                sender: udp::Sender::new(sockets[lane % sockets.len()].clone(), cutter, offloads.gso),
                lane,
                sealer: sealer.clone(),
                routes: tunnel.routes.clone(),
                counters: tunnel.counters.clone(),
            };
            relays.push((format!("tunnel-tx-{lane}"), Box::new(move || tx.run())));
        }
        for (i, socket) in sockets.iter().enumerate() {
            let rx = RxRelay {
                device: duplicate(&devices[i % devices.len()])?,
                receiver: udp::Receiver::new(socket.clone()),
                own,
                senders: tunnel.senders.clone(),
                reassembly: Reassembly::new(),
                counters: tunnel.counters.clone(),
            };
            relays.push((format!("tunnel-rx-{i}"), Box::new(move || rx.run())));
        }
        for (name, relay) in relays {
            spawn(&name, relay)?;
        }
        let tunnel = Tunnel { _devices: devices, ..tunnel };
        info!(endpoint = %endpoint, public_key = %tunnel.identity.public(), device = DEVICE, link_mtu, queues, sockets = sockets.len(), gso = offloads.gso, gro = offloads.gro, "tunnel relaying");
        Ok(tunnel)
    }

    /// The device's queues (and sending threads).
    pub fn queues(&self) -> usize {
        self.queues
    }

    /// The endpoint the peers send to.
    pub fn endpoint(&self) -> SocketAddrV4 {
        self.endpoint
    }

    /// The node's own pod CIDR.
    pub fn own_cidr(&self) -> PodCidr {
        self.own
    }

    /// This run's public key, to publish.
    pub fn public_key(&self) -> PublicKey {
        self.identity.public()
    }

    /// Replaces the peer table (already validated) and the receiver's senders with it, and
    /// returns the peers taken: those with whom no keys can be agreed (a low-order key, or this
    /// node's own) are refused, logged and counted. A peer whose node and CIDR are unchanged
    /// keeps its counters; one whose public key is unchanged keeps its keys and its window.
    pub fn set_peers(&self, peers: &[Peer]) -> Vec<Peer> {
        let mut table = self.routes.write().unwrap_or_else(|p| p.into_inner());
        let routes = &table.routes;
        let mut next = Vec::with_capacity(peers.len());
        for peer in peers {
            let known = routes.iter().find(|r| r.peer.public_key == peer.public_key).map(|r| r.keys.clone());
            let keys =
                match known.map(Ok).unwrap_or_else(|| self.identity.pair(&peer.public_key).map(Arc::new)) {
                    Ok(keys) => keys,
                    Err(e) => {
                        warn!(peer = %peer, error = %e, "peer not routed");
                        self.counters.peers_refused.fetch_add(1, Relaxed);
                        continue;
                    }
                };
            let counters = routes
                .iter()
                .find(|r| r.peer.node == peer.node && r.peer.pod_cidr == peer.pod_cidr)
                .map(|r| r.counters.clone())
                .unwrap_or_default();
            next.push(Route { peer: peer.clone(), counters, keys });
        }
        for r in next.iter().filter(|n| !routes.iter().any(|o| o.peer == n.peer)) {
            info!(peer = %r.peer, "peer routed into the tunnel");
        }
        for r in routes.iter().filter(|o| !next.iter().any(|n| n.peer == o.peer)) {
            info!(peer = %r.peer, "peer removed from the tunnel");
        }
        self.senders.lock().unwrap_or_else(|p| p.into_inner()).replace(&next);
        let taken = next.iter().map(|r| r.peer.clone()).collect();
        *table = RouteTable::new(next);
        taken
    }

    /// The peer table.
    pub fn routes(&self) -> Vec<Route> {
        self.routes.read().unwrap_or_else(|p| p.into_inner()).routes.clone()
    }

    /// The counter of refused peers, for whoever reads the peers.
    pub fn refused_peers(&self) -> Arc<AtomicU64> {
        self.counters.peers_refused.clone()
    }

    /// The counters.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The counters as the API reports them.
    pub fn stats(&self) -> pb::TunnelStats {
        let c = &self.counters;
        pb::TunnelStats {
            endpoint: self.endpoint.to_string(),
            tx_packets: c.tx_packets.load(Relaxed),
            tx_bytes: c.tx_bytes.load(Relaxed),
            rx_packets: c.rx_packets.load(Relaxed),
            rx_bytes: c.rx_bytes.load(Relaxed),
            rx_dropped_auth: c.rx_dropped_auth.load(Relaxed),
            rx_dropped_replay: c.rx_dropped_replay.load(Relaxed),
            rx_dropped_malformed: c.rx_dropped_malformed.load(Relaxed),
            rx_dropped_spoofed: c.rx_dropped_spoofed.load(Relaxed),
            rx_senders: self.senders.lock().unwrap_or_else(|p| p.into_inner()).len() as u64,
            rx_reassembling: c.rx_reassembling.load(Relaxed),
            public_key: self.identity.public().to_string(),
            rx_dropped_incomplete: c.rx_dropped_incomplete.load(Relaxed),
            tx_dropped_no_route: c.tx_dropped_no_route.load(Relaxed),
            tx_dropped_error: c.tx_dropped_error.load(Relaxed),
            rx_dropped_error: c.rx_dropped_error.load(Relaxed),
            peers_refused: c.peers_refused.load(Relaxed),
            peers: self
                .routes()
                .iter()
                .map(|r| pb::PeerStats {
                    node: r.peer.node.clone(),
                    pod_cidr: r.peer.pod_cidr.to_string(),
                    endpoint: r.peer.endpoint.to_string(),
                    public_key: r.peer.public_key.to_string(),
                    tx_packets: r.counters.tx_packets.load(Relaxed),
                    tx_bytes: r.counters.tx_bytes.load(Relaxed),
                    rx_packets: r.counters.rx_packets.load(Relaxed),
                    rx_bytes: r.counters.rx_bytes.load(Relaxed),
                })
                .collect(),
        }
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(drop)
        .map_err(|e| Error::io(format!("start the {name} thread"), e))
}

/// Nanoseconds since the UNIX epoch: where a run's message counter starts ([`Sealer::new`]).
fn now_nanos() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    since.map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// The IPv4 address at `offset` (see [`SRC`], [`DST`]) of a packet that follows a virtio-net
/// header.
fn ipv4_field(payload: &[u8], offset: usize) -> Option<Ipv4Addr> {
    let ip = payload.get(VNET_HDR_LEN..)?;
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return None;
    }
    let b = ip.get(offset..offset + 4)?;
    Some(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
}

/// Offset of the source address in an IPv4 header.
const SRC: usize = 12;
/// Offset of the destination address.
const DST: usize = 16;

/// Pods → peers.
struct TxRelay {
    device: std::fs::File,
    sender: udp::Sender,
    /// This queue's number, which its messages' ids carry ([`chunks::message_id`]).
    lane: usize,
    /// Shared by the queues: one counter per run.
    sealer: Arc<Sealer>,
    routes: Arc<RwLock<RouteTable>>,
    counters: Arc<Counters>,
}

impl TxRelay {
    fn run(mut self) {
        // Room for the header before and the tag after the largest packet the device delivers.
        let mut buf = vec![0u8; HEADER_LEN + 65_536 + VNET_HDR_LEN + TAG_LEN];
        let mut warned_oversize = false;
        loop {
            let read_end = buf.len() - TAG_LEN;
            let n = match self.device.read(&mut buf[HEADER_LEN..read_end]) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    warn!(error = %e, "the tunnel device failed; the tunnel stops sending");
                    return;
                }
            };
            let payload = &buf[HEADER_LEN..HEADER_LEN + n];
            let Some(dst) = ipv4_field(payload, DST) else {
                // Not IPv4 (the kernel's IPv6 router solicitations, for one): nothing to route.
                self.counters.tx_dropped_no_route.fetch_add(1, Relaxed);
                continue;
            };
            let (endpoint, peer, keys) = {
                let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
                match routes.find(dst) {
                    Some(r) => (r.peer.endpoint, r.counters.clone(), r.keys.clone()),
                    None => {
                        self.counters.tx_dropped_no_route.fetch_add(1, Relaxed);
                        continue;
                    }
                }
            };
            if n > MAX_PAYLOAD {
                self.counters.tx_dropped_error.fetch_add(1, Relaxed);
                if !std::mem::replace(&mut warned_oversize, true) {
                    warn!(bytes = n, max = MAX_PAYLOAD, "a packet too large for one message was dropped");
                }
                continue;
            }
            let ip_bytes = (n - VNET_HDR_LEN) as u64;
            let sealed = match self.sealer.seal(&keys.seal, &mut buf, n) {
                Ok(sealed) => sealed,
                Err(e) => {
                    warn!(error = %e, "cannot seal a packet");
                    self.counters.tx_dropped_error.fetch_add(1, Relaxed);
                    continue;
                }
            };
            let id = chunks::message_id(sealed.counter, self.lane);
            match self.sender.send(&buf[..sealed.len], id, endpoint) {
                Ok(_) => {
                    self.counters.tx_packets.fetch_add(1, Relaxed);
                    self.counters.tx_bytes.fetch_add(ip_bytes, Relaxed);
                    peer.tx_packets.fetch_add(1, Relaxed);
                    peer.tx_bytes.fetch_add(ip_bytes, Relaxed);
                }
                Err(_) => {
                    self.counters.tx_dropped_error.fetch_add(1, Relaxed);
                }
            }
        }
    }
}

/// Peers → pods.
struct RxRelay {
    device: std::fs::File,
    receiver: udp::Receiver,
    own: PodCidr,
    /// The current peers, replaced by [`Tunnel::set_peers`]: the only senders with state.
    senders: Arc<Mutex<Senders>>,
    reassembly: Reassembly,
    counters: Arc<Counters>,
}

impl RxRelay {
    fn run(mut self) {
        // Room for the largest datagram, or the most GRO coalesces into one receive.
        let mut buf = vec![0u8; 65_536];
        let table = self.senders.clone();
        loop {
            let got = match self.receiver.recv(&mut buf) {
                Ok(got) => got,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    // ICMP errors of earlier sends surface here (ECONNREFUSED); keep serving.
                    tracing::debug!(error = %e, "tunnel socket receive error");
                    continue;
                }
            };
            // GRO hands over up to 64 KiB from one sender at once: its address is looked up
            // once per batch, and the table is not held while the chunks are put together.
            let trusted = table.lock().unwrap_or_else(|p| p.into_inner()).at(got.from);
            let Some(trusted) = trusted else {
                let datagrams = got.len.div_ceil(got.segment) as u64;
                self.counters.rx_dropped_spoofed.fetch_add(datagrams, Relaxed);
                continue;
            };
            for datagram in buf[..got.len].chunks(got.segment) {
                self.chunk(got.from, trusted, datagram);
            }
            let incomplete = self.reassembly.take_evicted();
            if incomplete > 0 {
                self.counters.rx_dropped_incomplete.fetch_add(incomplete, Relaxed);
            }
            self.counters.rx_reassembling.store(self.reassembly.in_progress() as u64, Relaxed);
        }
    }

    /// One datagram from a peer's endpoint: a chunk, maybe the one that completes its message.
    fn chunk(&mut self, from: SocketAddr, trusted: bool, datagram: &[u8]) {
        let message = chunks::parse(datagram).and_then(|c| self.reassembly.add(from, trusted, &c));
        match message {
            Ok(Some(mut message)) => {
                self.message(from, &mut message);
                self.reassembly.recycle(message);
            }
            Ok(None) => {}
            Err(_) => {
                self.counters.rx_dropped_malformed.fetch_add(1, Relaxed);
            }
        }
    }

    /// One whole message: checked, opened and written to the bubble. The receiver table is
    /// held for the checks before and the window after, not while the message is decrypted:
    /// the receiving threads share it.
    fn message(&mut self, from: SocketAddr, message: &mut [u8]) {
        let lock = || self.senders.lock().unwrap_or_else(|p| p.into_inner());
        // Each guard is dropped at the end of its statement, before the next lock.
        let opening = lock().begin(from, message);
        let opened = opening.and_then(|opening| {
            let range = opening.open(message, self.own)?;
            let finished = lock().finish(&opening);
            finished.map(|()| (range, opening.counters))
        });
        let (range, peer) = match opened {
            Ok(opened) => opened,
            Err(refused) => {
                let counter = match refused {
                    Refused::Malformed => &self.counters.rx_dropped_malformed,
                    Refused::Auth => &self.counters.rx_dropped_auth,
                    Refused::Replay => &self.counters.rx_dropped_replay,
                    Refused::Spoofed => &self.counters.rx_dropped_spoofed,
                };
                counter.fetch_add(1, Relaxed);
                return;
            }
        };
        let payload = &message[range];
        let ip_bytes = (payload.len() - VNET_HDR_LEN) as u64;
        // A TUN write takes the whole packet or fails; it is never partial.
        match self.device.write_all(payload) {
            Ok(()) => {
                self.counters.rx_packets.fetch_add(1, Relaxed);
                self.counters.rx_bytes.fetch_add(ip_bytes, Relaxed);
                peer.rx_packets.fetch_add(1, Relaxed);
                peer.rx_bytes.fetch_add(ip_bytes, Relaxed);
            }
            Err(_) => {
                self.counters.rx_dropped_error.fetch_add(1, Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
        let mut p = vec![0u8; VNET_HDR_LEN + 20];
        p[VNET_HDR_LEN] = 0x45;
        p[VNET_HDR_LEN + SRC..VNET_HDR_LEN + SRC + 4].copy_from_slice(&src);
        p[VNET_HDR_LEN + DST..VNET_HDR_LEN + DST + 4].copy_from_slice(&dst);
        p
    }

    #[test]
    fn reads_addresses_after_the_vnet_header() {
        let p = packet([10, 244, 1, 2], [10, 244, 2, 3]);
        assert_eq!(ipv4_field(&p, SRC), Some(Ipv4Addr::new(10, 244, 1, 2)));
        assert_eq!(ipv4_field(&p, DST), Some(Ipv4Addr::new(10, 244, 2, 3)));
        let mut v6 = p.clone();
        v6[VNET_HDR_LEN] = 0x60;
        assert_eq!(ipv4_field(&v6, DST), None);
        assert_eq!(ipv4_field(&p[..VNET_HDR_LEN + 19], DST), None);
        assert_eq!(ipv4_field(&[], DST), None);
    }

    #[test]
    fn the_largest_packet_fits_one_message() {
        // An IP packet is at most 65535 bytes; the device hands it over behind its vnet header.
        assert_eq!(MAX_PAYLOAD, VNET_HDR_LEN + 65_535);
        assert_eq!(MAX_PAYLOAD + OVERHEAD, MAX_MESSAGE);
    }
}
