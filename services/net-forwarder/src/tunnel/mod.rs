//! The tunnel to the other nodes' bubbles: a TUN device in the bubble, a UDP socket in the
//! host's network namespace, and two relay threads between them.
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
//! Everything is authenticated per message; what fails is dropped and counted: chunks of no
//! known format as malformed, messages that fail authentication as auth drops, replays as
//! replays, messages whose chunks did not all arrive as incomplete.
//! Relay threads use blocking I/O and no locks but a read lock on the peer table per packet.

pub mod chunks;
pub mod keyfile;
pub mod routes;
pub mod udp;
pub mod wire;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use hpk_proto::netforwarder::v1 as pb;
use ring::rand::SecureRandom;
use tracing::{info, warn};

use crate::cidr::PodCidr;
use crate::peers::Peer;
use crate::tuntap::{Device, Kind, Options, VNET_HDR_LEN};
use crate::{Error, Result};
use chunks::{Cutter, MAX_MESSAGE, Reassembly};
use wire::{ClusterKey, HEADER_LEN, OVERHEAD, Opener, Refused, Sealer, SenderId, TAG_LEN};

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
    /// Messages dropped before all their chunks arrived.
    pub rx_dropped_incomplete: AtomicU64,
    /// Packets for an address no peer owns.
    pub tx_dropped_no_route: AtomicU64,
    /// Packets that could not be sent (socket errors, oversize).
    pub tx_dropped_error: AtomicU64,
    /// Packets that could not be written to the bubble.
    pub rx_dropped_error: AtomicU64,
    /// Peers refused: malformed endpoint annotations or pod CIDRs, overlaps, duplicates.
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

/// A routed peer and its counters.
#[derive(Clone, Debug)]
pub struct Route {
    /// The peer.
    pub peer: Peer,
    /// Its counters; kept while the peer stays in the table with the same CIDR.
    pub counters: Arc<PeerCounters>,
}

/// The running tunnel. The relay threads run until the process exits; the device and the
/// socket close with it.
pub struct Tunnel {
    _device: Device,
    endpoint: SocketAddrV4,
    own: PodCidr,
    routes: Arc<RwLock<Vec<Route>>>,
    counters: Arc<Counters>,
}

impl Tunnel {
    /// Creates the TUN device in the current network namespace (the bubble) and starts relaying
    /// between it and `socket` ([`routes::Routes::configure_device`] brings it up). `endpoint` is
    /// what the peers send to; `link_mtu` the MTU of the host link the datagrams take.
    pub fn start(
        socket: UdpSocket,
        endpoint: SocketAddrV4,
        key: ClusterKey,
        own: PodCidr,
        link_mtu: u32,
    ) -> Result<Self> {
        let cutter = Cutter::new(link_mtu).ok_or_else(|| {
            Error::Config(format!(
                "--tunnel-mtu {link_mtu}: a link MTU is {} to {}",
                chunks::MTU_RANGE.start(),
                chunks::MTU_RANGE.end()
            ))
        })?;
        let offloads = crate::inherit::udp_offloads(&socket);
        if !offloads.gso || !offloads.gro {
            warn!(
                gso = offloads.gso,
                gro = offloads.gro,
                "the kernel lacks UDP GSO or GRO; the tunnel sends or receives its datagrams one by one"
            );
        }
        let device = Device::create(DEVICE, Options { kind: Kind::Tun, vnet_hdr: true })?;
        let tx_device =
            device.file().try_clone().map_err(|e| Error::io("duplicate the TUN descriptor", e))?;
        let rx_device =
            device.file().try_clone().map_err(|e| Error::io("duplicate the TUN descriptor", e))?;
        let tunnel = Tunnel {
            _device: device,
            endpoint,
            own,
            routes: Arc::new(RwLock::new(Vec::new())),
            counters: Arc::new(Counters::default()),
        };
        let socket = Arc::new(socket);
        let id = SenderId { incarnation: now_nanos(), salt: random_u64()? };
        let tx = TxRelay {
            device: tx_device,
            sender: udp::Sender::new(socket.clone(), cutter, offloads.gso),
            sealer: Sealer::new(&key, id),
            routes: tunnel.routes.clone(),
            counters: tunnel.counters.clone(),
        };
        let rx = RxRelay {
            device: rx_device,
            receiver: udp::Receiver::new(socket),
            key,
            own,
            openers: Vec::new(),
            reassembly: Reassembly::new(),
            routes: tunnel.routes.clone(),
            counters: tunnel.counters.clone(),
        };
        spawn("tunnel-tx", move || tx.run())?;
        spawn("tunnel-rx", move || rx.run())?;
        info!(endpoint = %endpoint, device = DEVICE, link_mtu, gso = offloads.gso, gro = offloads.gro, "tunnel relaying");
        Ok(tunnel)
    }

    /// The endpoint the peers send to.
    pub fn endpoint(&self) -> SocketAddrV4 {
        self.endpoint
    }

    /// The node's own pod CIDR.
    pub fn own_cidr(&self) -> PodCidr {
        self.own
    }

    /// Replaces the peer table (already validated); a peer whose node and CIDR are unchanged
    /// keeps its counters.
    pub fn set_peers(&self, peers: &[Peer]) {
        let mut routes = self.routes.write().unwrap_or_else(|p| p.into_inner());
        let next: Vec<Route> = peers
            .iter()
            .map(|peer| {
                let counters = routes
                    .iter()
                    .find(|r| r.peer.node == peer.node && r.peer.pod_cidr == peer.pod_cidr)
                    .map(|r| r.counters.clone())
                    .unwrap_or_default();
                Route { peer: peer.clone(), counters }
            })
            .collect();
        for r in next.iter().filter(|n| !routes.iter().any(|o| o.peer == n.peer)) {
            info!(peer = %r.peer, "peer routed into the tunnel");
        }
        for r in routes.iter().filter(|o| !next.iter().any(|n| n.peer == o.peer)) {
            info!(peer = %r.peer, "peer removed from the tunnel");
        }
        *routes = next;
    }

    /// The peer table.
    pub fn routes(&self) -> Vec<Route> {
        self.routes.read().unwrap_or_else(|p| p.into_inner()).clone()
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

fn now_nanos() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

fn random_u64() -> Result<u64> {
    let mut b = [0; 8];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| Error::Config("the system's random number generator failed".into()))?;
    Ok(u64::from_be_bytes(b))
}

/// The IPv4 destination of a packet that follows a virtio-net header.
fn ipv4_field(payload: &[u8], offset: usize) -> Option<Ipv4Addr> {
    let ip = payload.get(VNET_HDR_LEN..)?;
    if ip.len() < 20 || ip[0] >> 4 != 4 {
        return None;
    }
    let b = ip.get(offset..offset + 4)?;
    Some(Ipv4Addr::new(b[0], b[1], b[2], b[3]))
}

const SRC: usize = 12;
const DST: usize = 16;

/// Pods → peers.
struct TxRelay {
    device: std::fs::File,
    sender: udp::Sender,
    sealer: Sealer,
    routes: Arc<RwLock<Vec<Route>>>,
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
            let (endpoint, peer) = {
                let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
                match routes.iter().find(|r| r.peer.pod_cidr.contains(dst)) {
                    Some(r) => (r.peer.endpoint, r.counters.clone()),
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
            let len = match self.sealer.seal(&mut buf, n) {
                Ok(len) => len,
                Err(e) => {
                    warn!(error = %e, "cannot seal a packet");
                    self.counters.tx_dropped_error.fetch_add(1, Relaxed);
                    continue;
                }
            };
            // The message's id: its counter's low 32 bits.
            let id = self.sealer.counter() as u32;
            match self.sender.send(&buf[..len], id, endpoint) {
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
    key: ClusterKey,
    own: PodCidr,
    /// One per remote address heard from; authentic senders only, so bounded by the cluster.
    openers: Vec<(SocketAddr, Opener)>,
    reassembly: Reassembly,
    routes: Arc<RwLock<Vec<Route>>>,
    counters: Arc<Counters>,
}

impl RxRelay {
    fn run(mut self) {
        // Room for the largest datagram, or the most GRO coalesces into one receive.
        let mut buf = vec![0u8; 65_536];
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
            for datagram in buf[..got.len].chunks(got.segment) {
                self.chunk(got.from, datagram);
            }
            let incomplete = self.reassembly.take_evicted();
            if incomplete > 0 {
                self.counters.rx_dropped_incomplete.fetch_add(incomplete, Relaxed);
            }
        }
    }

    /// One datagram: a chunk, maybe the one that completes its message.
    fn chunk(&mut self, from: SocketAddr, datagram: &[u8]) {
        let trusted = self.openers.iter().any(|(a, _)| *a == from);
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

    /// One whole message: opened, checked and written to the bubble.
    fn message(&mut self, from: SocketAddr, message: &mut [u8]) {
        let range = match self.open(from, message) {
            Ok(range) => range,
            Err(Refused::Malformed) => {
                self.counters.rx_dropped_malformed.fetch_add(1, Relaxed);
                return;
            }
            Err(Refused::Auth) => {
                self.counters.rx_dropped_auth.fetch_add(1, Relaxed);
                return;
            }
            Err(Refused::Replay) => {
                self.counters.rx_dropped_replay.fetch_add(1, Relaxed);
                return;
            }
        };
        let payload = &message[range];
        // An authentic packet must still be for a pod of this node.
        let (Some(src), Some(dst)) = (ipv4_field(payload, SRC), ipv4_field(payload, DST)) else {
            self.counters.rx_dropped_malformed.fetch_add(1, Relaxed);
            return;
        };
        if !self.own.contains(dst) {
            self.counters.rx_dropped_malformed.fetch_add(1, Relaxed);
            return;
        }
        let ip_bytes = (payload.len() - VNET_HDR_LEN) as u64;
        // A TUN write takes the whole packet or fails; it is never partial.
        match self.device.write_all(payload) {
            Ok(()) => {
                self.counters.rx_packets.fetch_add(1, Relaxed);
                self.counters.rx_bytes.fetch_add(ip_bytes, Relaxed);
                let routes = self.routes.read().unwrap_or_else(|p| p.into_inner());
                if let Some(r) = routes.iter().find(|r| r.peer.pod_cidr.contains(src)) {
                    r.counters.rx_packets.fetch_add(1, Relaxed);
                    r.counters.rx_bytes.fetch_add(ip_bytes, Relaxed);
                }
            }
            Err(_) => {
                self.counters.rx_dropped_error.fetch_add(1, Relaxed);
            }
        }
    }

    fn open(
        &mut self,
        from: SocketAddr,
        datagram: &mut [u8],
    ) -> std::result::Result<std::ops::Range<usize>, Refused> {
        if let Some((_, opener)) = self.openers.iter_mut().find(|(a, _)| *a == from) {
            return opener.open(datagram);
        }
        // A new address gets state only once a datagram from it is authentic.
        let mut opener = Opener::new(self.key.clone());
        let range = opener.open(datagram)?;
        self.openers.push((from, opener));
        Ok(range)
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
