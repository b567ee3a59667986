//! The published TCP ports: each listening socket was bound in the host's namespace by the
//! launcher and inherited here; every connection it accepts is joined to the service listening
//! on the same port number on the bubble's loopback. The services keep their own TLS and
//! authentication end to end; this only copies bytes.
//!
//! Anyone on the cluster network can connect, so every connection is bounded before it costs
//! the service anything (review H2):
//!
//! - **per port** and **per source address**, a cap on connections held at once. Beyond it a
//!   connection is closed as soon as it is accepted;
//! - **first byte:** every published service is TLS, where the client speaks first. Until it
//!   has, nothing is opened upstream, and a client silent past [`Limits::first_byte`] is
//!   closed. A source may have [`Limits::per_source_waiting`] such connections; a newer one
//!   evicts its oldest, so a silent flood from an address cannot starve the clients that share
//!   it;
//! - **idle:** a connection that carries no byte either way for [`Limits::idle`] is closed
//!   (upstream's kubelet closes idle streaming connections after the same 4 hours), and TCP
//!   keep-alive finds peers that vanished long before that;
//! - refusals are logged at most once per port every [`REFUSAL_LOG_EVERY`], with a count.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::listener_owner::ListenerOwner;
use super::{InitArgs, inherited_fd};
use crate::error::{Error, Result};

/// How often, at most, refused connections are logged per port.
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// Descriptors kept back from the connection budget for everything else the supervisor does
/// (log files, service pipes, the runtime).
const RESERVED_FDS: u64 = 512;

/// The bounds on one published port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections held at once on the port.
    pub per_port: usize,
    /// Connections held at once from one address.
    pub per_source: usize,
    /// Connections from one address still waiting for their first byte.
    pub per_source_waiting: usize,
    /// How long a client has to send its first byte.
    pub first_byte: Duration,
    /// How long a connection may carry nothing either way.
    pub idle: Duration,
}

impl Limits {
    /// The bounds for `ports` published ports when the supervisor may hold `nofile` open
    /// descriptors: each relayed connection holds two (the client's and the upstream one).
    pub fn for_descriptors(nofile: u64, ports: usize) -> Self {
        let budget = nofile.saturating_sub(RESERVED_FDS) / (2 * ports.max(1) as u64);
        let per_port = usize::try_from(budget).unwrap_or(usize::MAX).clamp(16, 16_384);
        Self {
            per_port,
            per_source: (per_port / 4).clamp(8, 512),
            per_source_waiting: 64,
            first_byte: Duration::from_secs(10),
            idle: Duration::from_secs(4 * 3600),
        }
    }
}

/// Starts one relay task per published TCP port.
pub fn start(args: &InitArgs) -> Result<()> {
    let names = args.role.tcp_ports();
    // The loopback ports the relay targets are the host's numbers: keep the kernel from
    // handing them to a bind of port 0 in the bubble (the streaming server's, a client's), which
    // would take the service's port and have the relay expose that listener (review L5).
    let targets: Vec<u16> = names.iter().map(|n| args.port(n)).collect::<Result<_>>()?;
    if let Err(e) = reserve_ports(Path::new(RESERVED_PORTS), &targets) {
        tracing::warn!(error = %e, "the relayed ports are not reserved: a bind of port 0 in the bubble could take one");
    }
    let nofile = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft);
    let limits = Limits::for_descriptors(nofile, names.len());
    tracing::info!(?limits, nofile, "relay bounds");
    // A relayed port that a pod took explicitly is not exposed either: only a listener of the
    // bubble's own services gets connections (review L5).
    let owner = Arc::new(ListenerOwner::new(super::supervisor::service_pids));
    for name in names {
        let port = args.port(name)?;
        let fd = inherited_fd(name)?;
        let std_listener = crate::fds::claim_listener(fd)
            .map_err(|e| Error::Invalid(format!("the published {name} socket: {e}")))?;
        std_listener.set_nonblocking(true).map_err(|e| Error::io("configure", name, e))?;
        let listener = TcpListener::from_std(std_listener).map_err(|e| Error::io("register", name, e))?;
        let target = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let destination = Destination::Service { target, owner: owner.clone() };
        tokio::spawn(run(listener, destination, (*name).to_owned(), limits));
    }
    Ok(())
}

/// The bubble's network namespace's reserved local ports.
const RESERVED_PORTS: &str = "/proc/sys/net/ipv4/ip_local_reserved_ports";

/// Adds `ports` to the reserved local ports (`sysctl` file `file`, per network namespace):
/// the kernel gives none of them to a bind of port 0, nor to an outgoing connection; an
/// explicit bind still gets it.
pub fn reserve_ports(file: &Path, ports: &[u16]) -> Result<()> {
    let current = std::fs::read_to_string(file).map_err(|e| Error::io("read", file.display(), e))?;
    let mut all: Vec<String> =
        current.trim().split(',').filter(|p| !p.is_empty()).map(str::to_owned).collect();
    all.extend(ports.iter().map(u16::to_string));
    std::fs::write(file, all.join(",")).map_err(|e| Error::io("write", file.display(), e))?;
    tracing::info!(?ports, "the relayed ports are reserved in the bubble");
    Ok(())
}

/// Where a port's connections go.
#[derive(Clone)]
pub enum Destination {
    /// One of the bubble's own services on its loopback: every such service is TLS, so the
    /// first-byte bound applies, and a connection is joined only to a listener of the
    /// bubble's services (review L5).
    Service { target: SocketAddr, owner: Arc<ListenerOwner> },
    /// A pod's or a Service's port (hostPort, NodePort, LoadBalancer: `init::host_ports`): the
    /// current target, which may change while the port stays published. Joined at once (the
    /// application may speak first), with the same caps and idle bound.
    App(tokio::sync::watch::Receiver<SocketAddr>),
}

/// Accepts on `listener` for ever, relaying each admitted connection to its destination.
pub async fn run(listener: TcpListener, destination: Destination, name: String, limits: Limits) {
    let gate = Arc::new(Gate::new(limits));
    let squatted = Arc::new(hpk_rpc::log_limit::LogLimit::default());
    let mut refusals = RefusalLog::new("connections closed on arrival: over the port's or the source's cap");
    loop {
        match listener.accept().await {
            Ok((client, peer)) => match gate.admit(peer.ip()) {
                Ok(ticket) => {
                    let upstream = Upstream { destination: destination.clone(), squatted: squatted.clone() };
                    tokio::spawn(relay(client, upstream, name.clone(), peer, ticket, limits));
                }
                Err(refusal) => {
                    drop(client);
                    refusals.note(&name, peer, refusal);
                }
            },
            Err(e) => {
                // EMFILE and the like: back off briefly instead of spinning.
                tracing::warn!(port = %name, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Why a connection was closed on arrival.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The port holds [`Limits::per_port`] connections.
    Port,
    /// The source holds [`Limits::per_source`] connections.
    Source,
}

/// The connections held on one port, by source.
struct Gate {
    limits: Limits,
    state: Mutex<GateState>,
}

#[derive(Default)]
struct GateState {
    total: usize,
    next: u64,
    sources: HashMap<IpAddr, Source>,
}

#[derive(Default)]
struct Source {
    open: usize,
    /// Connections that have not sent their first byte, oldest first.
    waiting: VecDeque<(u64, CancellationToken)>,
}

impl Gate {
    fn new(limits: Limits) -> Self {
        Self { limits, state: Mutex::new(GateState::default()) }
    }

    /// Admits a connection from `ip`, evicting that source's oldest silent connection if it
    /// has too many; refuses one over the port's or the source's cap.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> std::result::Result<Ticket, Refusal> {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.total >= self.limits.per_port {
            return Err(Refusal::Port);
        }
        let id = state.next;
        state.next += 1;
        let source = state.sources.entry(ip).or_default();
        if source.open >= self.limits.per_source {
            return Err(Refusal::Source);
        }
        source.open += 1;
        let evict = CancellationToken::new();
        source.waiting.push_back((id, evict.clone()));
        if source.waiting.len() > self.limits.per_source_waiting
            && let Some((_, oldest)) = source.waiting.pop_front()
        {
            oldest.cancel();
        }
        state.total += 1;
        Ok(Ticket { gate: self.clone(), ip, id, evict })
    }

    fn spoke(&self, ip: IpAddr, id: u64) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(source) = state.sources.get_mut(&ip) {
            source.waiting.retain(|(i, _)| *i != id);
        }
    }

    fn release(&self, ip: IpAddr, id: u64) {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        state.total -= 1;
        if let Some(source) = state.sources.get_mut(&ip) {
            source.open -= 1;
            source.waiting.retain(|(i, _)| *i != id);
            if source.open == 0 {
                state.sources.remove(&ip);
            }
        }
    }
}

/// One admitted connection's place; given back when dropped.
struct Ticket {
    gate: Arc<Gate>,
    ip: IpAddr,
    id: u64,
    evict: CancellationToken,
}

impl Ticket {
    /// The client has spoken: it no longer counts as waiting, and cannot be evicted.
    fn spoke(&self) {
        self.gate.spoke(self.ip, self.id);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.gate.release(self.ip, self.id);
    }
}

/// Counts refusals and logs them, saying `what` was refused, at most once per
/// [`REFUSAL_LOG_EVERY`] (TCP connections here, UDP flows in `udp_relay`).
pub(super) struct RefusalLog {
    what: &'static str,
    last: Option<Instant>,
    port: u64,
    source: u64,
}

impl RefusalLog {
    pub(super) fn new(what: &'static str) -> Self {
        Self { what, last: None, port: 0, source: 0 }
    }

    pub(super) fn note(&mut self, name: &str, peer: SocketAddr, refusal: Refusal) {
        match refusal {
            Refusal::Port => self.port += 1,
            Refusal::Source => self.source += 1,
        }
        if self.last.is_none_or(|t| t.elapsed() >= REFUSAL_LOG_EVERY) {
            tracing::warn!(
                port = %name,
                last_peer = %peer,
                port_full = self.port,
                source_full = self.source,
                "{}",
                self.what
            );
            self.last = Some(Instant::now());
            (self.port, self.source) = (0, 0);
        }
    }
}

/// Where a relayed connection goes, and the check of who listens there.
struct Upstream {
    destination: Destination,
    /// Refusals of a squatted port, logged a few every 10 s.
    squatted: Arc<hpk_rpc::log_limit::LogLimit>,
}

impl Upstream {
    /// Whether the client must speak first.
    fn client_first(&self) -> bool {
        matches!(self.destination, Destination::Service { .. })
    }

    /// Connects. For a service: checks that the listener is the bubble's service's,
    /// connects, and checks again: a listener that takes the port between the two would have
    /// to be bound after the service's closed, and the second check sees it.
    async fn connect(&self, name: &str, peer: SocketAddr) -> Option<TcpStream> {
        let target = match &self.destination {
            Destination::Service { target, .. } => {
                self.check(name, peer).await?;
                *target
            }
            Destination::App(current) => *current.borrow(),
        };
        let stream = match tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(target)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!(port = %name, %peer, error = %e, "service not listening yet: connection closed");
                return None;
            }
            Err(_) => return None,
        };
        if self.client_first() {
            self.check(name, peer).await?;
        }
        Some(stream)
    }

    /// Whether only the bubble's services listen on the target port; logs why not.
    async fn check(&self, name: &str, peer: SocketAddr) -> Option<()> {
        let Destination::Service { target, owner } = &self.destination else { return Some(()) };
        let (owner, port) = (owner.clone(), target.port());
        let verdict = tokio::task::spawn_blocking(move || owner.check(port))
            .await
            .unwrap_or_else(|e| Err(format!("the check failed: {e}")));
        match verdict {
            Ok(()) => Some(()),
            Err(why) => {
                if let Some(dropped) = self.squatted.admit() {
                    tracing::warn!(port = %name, %peer, dropped, "{why}: connection closed, not relayed");
                }
                None
            }
        }
    }
}

async fn relay(
    client: TcpStream,
    upstream: Upstream,
    name: String,
    peer: SocketAddr,
    ticket: Ticket,
    limits: Limits,
) {
    let mut probe = [0u8; 1];
    if !upstream.client_first() {
        ticket.spoke();
    } else {
        tokio::select! {
            () = ticket.evict.cancelled() => {
                tracing::debug!(port = %name, %peer, "closed a silent connection: its source opened newer ones");
                return;
            }
            spoke = tokio::time::timeout(limits.first_byte, client.peek(&mut probe)) => match spoke {
                Ok(Ok(n)) if n > 0 => ticket.spoke(),
                Ok(_) => return,
                Err(_) => {
                    tracing::debug!(port = %name, %peer, "closed a connection that sent nothing in time");
                    return;
                }
            },
        }
    }
    let Some(upstream) = upstream.connect(&name, peer).await else { return };
    for s in [&client, &upstream] {
        let _ = s.set_nodelay(true);
        keepalive(s);
    }
    if copy_until_idle(client, upstream, limits.idle).await {
        tracing::debug!(port = %name, %peer, "closed a connection idle for {:?}", limits.idle);
    }
    drop(ticket);
}

/// TCP keep-alive: a peer that vanished without a FIN is found within about two minutes.
fn keepalive(stream: &TcpStream) {
    use nix::sys::socket::{setsockopt, sockopt};
    let _ = setsockopt(stream, sockopt::KeepAlive, &true);
    let _ = setsockopt(stream, sockopt::TcpKeepIdle, &60);
    let _ = setsockopt(stream, sockopt::TcpKeepInterval, &15);
    let _ = setsockopt(stream, sockopt::TcpKeepCount, &4);
}

/// Copies both ways until both directions end, either fails (a reset, or a peer keep-alive
/// found gone) or nothing moves for `idle`; true if it ended for idleness. A direction that
/// ends cleanly half-closes the other side, and the other direction goes on.
async fn copy_until_idle(mut a: TcpStream, mut b: TcpStream, idle: Duration) -> bool {
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let touch =
        || last.store(u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX), Ordering::Relaxed);
    let (mut ar, mut aw) = a.split();
    let (mut br, mut bw) = b.split();
    let both = async {
        let a_to_b = pump(&mut ar, &mut bw, &touch);
        let b_to_a = pump(&mut br, &mut aw, &touch);
        tokio::pin!(a_to_b, b_to_a);
        let (mut a_done, mut b_done) = (false, false);
        while !(a_done && b_done) {
            tokio::select! {
                ended = &mut a_to_b, if !a_done => {
                    if ended.is_err() { return; }
                    a_done = true;
                }
                ended = &mut b_to_a, if !b_done => {
                    if ended.is_err() { return; }
                    b_done = true;
                }
            }
        }
    };
    let watchdog = async {
        loop {
            let since = start + Duration::from_millis(last.load(Ordering::Relaxed));
            let deadline = since + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline.into()).await;
        }
    };
    tokio::select! {
        () = both => false,
        () = watchdog => true,
    }
}

/// Copies `from` to `to` until `from` ends, then ends `to`'s writing side.
async fn pump(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    touch: &impl Fn(),
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        touch();
        to.write_all(&buf[..n]).await?;
        touch();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review L5: in a network namespace of its own (this test thread's), with four ephemeral
    /// ports of which the relay's two are reserved, binds of port 0 get the other two only.
    #[test]
    fn reserved_relay_ports_are_never_handed_to_a_bind_of_port_0() {
        if !nix::unistd::geteuid().is_root() {
            hpk_test_support::skip("a network namespace of the test's own needs root");
            return;
        }
        let thread = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("a network namespace");
            // /proc/sys/net is the namespace of the thread that opens it: this one's.
            let base = Path::new("/proc/sys/net/ipv4");
            std::fs::write(base.join("ip_local_port_range"), "40000 40003").expect("port range");
            reserve_ports(&base.join("ip_local_reserved_ports"), &[40001, 40002]).expect("reserve");
            let reserved = std::fs::read_to_string(base.join("ip_local_reserved_ports")).expect("read");
            assert_eq!(reserved.trim(), "40001-40002");
            let mut held = Vec::new();
            while let Ok(socket) = std::net::TcpListener::bind("0.0.0.0:0") {
                held.push(socket);
                assert!(held.len() <= 4, "more binds than ephemeral ports");
            }
            let mut ports: Vec<u16> = held.iter().map(|s| s.local_addr().expect("addr").port()).collect();
            ports.sort_unstable();
            ports
        });
        assert_eq!(thread.join().expect("the thread"), [40000, 40003]);
    }

    /// The test process plays the services.
    fn owner() -> Arc<ListenerOwner> {
        Arc::new(ListenerOwner::new(|| vec![std::process::id()]))
    }

    fn limits() -> Limits {
        Limits {
            per_port: 6,
            per_source: 4,
            per_source_waiting: 2,
            first_byte: Duration::from_millis(400),
            idle: Duration::from_millis(600),
        }
    }

    /// An echo service on loopback and a relay in front of it; returns the relay's address.
    async fn relay_to_echo(limits: Limits) -> SocketAddr {
        let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
        let target = echo.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = conn.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        let front = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = front.local_addr().expect("addr");
        tokio::spawn(run(front, Destination::Service { target, owner: owner() }, "test".into(), limits));
        addr
    }

    /// True if the relay closed `conn` within `within` (it reads end of stream or a reset).
    async fn closed_within(conn: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 64];
        matches!(tokio::time::timeout(within, conn.read(&mut buf)).await, Ok(Ok(0) | Err(_)))
    }

    async fn echo_works(addr: SocketAddr) -> bool {
        let Ok(mut conn) = TcpStream::connect(addr).await else { return false };
        if conn.write_all(b"ping").await.is_err() {
            return false;
        }
        let mut buf = [0u8; 4];
        matches!(tokio::time::timeout(Duration::from_secs(2), conn.read_exact(&mut buf)).await, Ok(Ok(_)))
            && &buf == b"ping"
    }

    /// Review L5: a relayed port taken by a process that is not a service (a pod's) gets
    /// nothing relayed: the client's connection is closed and the squatter reads no byte.
    #[tokio::test]
    async fn a_port_a_pod_took_is_not_relayed() {
        let (squatter, port) = super::super::listener_owner::tests::squatter();
        let front = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = front.local_addr().expect("addr");
        let target = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        // No process is a service here: the squatter's listener is nobody's.
        let no_service = Arc::new(ListenerOwner::new(Vec::new));
        tokio::spawn(run(front, Destination::Service { target, owner: no_service }, "test".into(), limits()));
        let mut conn = TcpStream::connect(addr).await.expect("connect");
        conn.write_all(b"secret").await.expect("write");
        let closed = closed_within(&mut conn, Duration::from_secs(5)).await;
        // The squatter never accepted: bytes the relay sent would sit in the receive queue of a
        // connection to its port (a FIN counts 1 there); the squatter is a dual-stack IPv6
        // socket, so its connections are in the IPv6 table.
        let queued = ["/proc/net/tcp", "/proc/net/tcp6"]
            .map(|table| std::fs::read_to_string(table).expect("tcp table"))
            .concat();
        drop(squatter);
        assert!(closed, "the relay kept a connection to a squatted port");
        let hex_port = format!(":{port:04X} ");
        let carried: Vec<&str> = queued
            .lines()
            .filter(|l| {
                l.split_whitespace().nth(1).is_some_and(|local| format!("{local} ").ends_with(&hex_port))
            })
            .filter(|l| l.split_whitespace().nth(3) != Some("0A"))
            .filter(|l| {
                let rx = l.split_whitespace().nth(4).and_then(|q| q.split_once(':')).map(|(_, rx)| rx);
                rx.and_then(|rx| u32::from_str_radix(rx, 16).ok()).is_some_and(|n| n >= 6)
            })
            .collect();
        assert!(carried.is_empty(), "bytes reached the squatter: {carried:?}");
    }

    #[tokio::test]
    async fn bytes_flow_both_ways_and_half_close_is_kept() {
        let addr = relay_to_echo(limits()).await;
        let mut conn = TcpStream::connect(addr).await.expect("connect");
        conn.write_all(b"hello").await.expect("write");
        conn.shutdown().await.expect("half close");
        let mut back = Vec::new();
        conn.read_to_end(&mut back).await.expect("read");
        assert_eq!(back, b"hello");
    }

    #[tokio::test]
    async fn a_client_that_resets_ends_its_upstream_connection_too() {
        // A service that holds every connection open and says nothing.
        let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let target = silent.local_addr().expect("addr");
        let (closed_tx, mut closed_rx) = tokio::sync::mpsc::channel::<()>(1);
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = silent.accept().await {
                let closed_tx = closed_tx.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while matches!(conn.read(&mut buf).await, Ok(n) if n > 0) {}
                    let _ = closed_tx.send(()).await;
                });
            }
        });
        let front = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = front.local_addr().expect("addr");
        tokio::spawn(run(
            front,
            Destination::Service { target, owner: owner() },
            "test".into(),
            Limits { idle: Duration::from_secs(30), ..limits() },
        ));
        let mut client = TcpStream::connect(addr).await.expect("connect");
        client.write_all(b"x").await.expect("write");
        tokio::time::sleep(Duration::from_millis(100)).await;
        // A reset, as a vanished peer's keep-alive ends in.
        let linger = libc::linger { l_onoff: 1, l_linger: 0 };
        nix::sys::socket::setsockopt(&client, nix::sys::socket::sockopt::Linger, &linger).expect("linger");
        drop(client);
        assert!(
            tokio::time::timeout(Duration::from_secs(2), closed_rx.recv()).await.is_ok(),
            "the upstream connection outlived its client (the idle timeout is 30 s)"
        );
    }

    #[tokio::test]
    async fn a_silent_client_is_closed_after_the_first_byte_timeout() {
        let addr = relay_to_echo(limits()).await;
        let mut silent = TcpStream::connect(addr).await.expect("connect");
        assert!(!closed_within(&mut silent, Duration::from_millis(200)).await, "closed too early");
        assert!(closed_within(&mut silent, Duration::from_secs(2)).await, "a silent client was kept");
    }

    #[tokio::test]
    async fn an_idle_connection_is_closed_and_a_busy_one_kept() {
        let addr = relay_to_echo(limits()).await;
        let mut busy = TcpStream::connect(addr).await.expect("connect");
        let mut idle = TcpStream::connect(addr).await.expect("connect");
        idle.write_all(b"x").await.expect("write");
        let mut one = [0u8; 1];
        idle.read_exact(&mut one).await.expect("echo");
        // The busy one talks every 200 ms for 1.2 s, twice the idle timeout.
        for _ in 0..6 {
            busy.write_all(b"y").await.expect("busy write");
            busy.read_exact(&mut one).await.expect("busy echo");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(closed_within(&mut idle, Duration::from_millis(100)).await, "the idle connection was kept");
        busy.write_all(b"z").await.expect("busy write");
        busy.read_exact(&mut one).await.expect("the busy connection was closed");
    }

    #[tokio::test]
    async fn a_silent_flood_from_one_source_evicts_only_its_own_oldest() {
        let addr = relay_to_echo(Limits { first_byte: Duration::from_secs(30), ..limits() }).await;
        let mut silent = Vec::new();
        for _ in 0..3 {
            silent.push(TcpStream::connect(addr).await.expect("connect"));
        }
        // Two may wait at once: the first of three was evicted, the others are still open.
        assert!(closed_within(&mut silent[0], Duration::from_secs(2)).await, "the oldest was kept");
        assert!(!closed_within(&mut silent[1], Duration::from_millis(200)).await);
        assert!(!closed_within(&mut silent[2], Duration::from_millis(200)).await);
        // A client from the same address that speaks still gets through.
        assert!(echo_works(addr).await, "a client behind the silent flood was refused");
    }

    #[tokio::test]
    async fn connections_over_the_source_cap_are_closed_on_arrival() {
        let addr = relay_to_echo(limits()).await;
        let mut held = Vec::new();
        for _ in 0..4 {
            let mut c = TcpStream::connect(addr).await.expect("connect");
            c.write_all(b"a").await.expect("write");
            let mut one = [0u8; 1];
            c.read_exact(&mut one).await.expect("echo");
            held.push(c);
        }
        let mut over = TcpStream::connect(addr).await.expect("the kernel accepts");
        assert!(closed_within(&mut over, Duration::from_secs(2)).await, "a fifth connection was kept");
        drop(held.pop());
        // The place freed is given to the next one.
        assert!(
            tokio::time::timeout(Duration::from_secs(2), async {
                while !echo_works(addr).await {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await
            .is_ok(),
            "a freed place was not given back"
        );
    }

    #[test]
    fn the_port_cap_counts_every_source_and_places_come_back() {
        let gate = Arc::new(Gate::new(limits()));
        let ip = |n: u8| IpAddr::V4(Ipv4Addr::new(10, 0, 0, n));
        let mut tickets: Vec<Ticket> = (1..=3)
            .flat_map(|n| [gate.admit(ip(n)), gate.admit(ip(n))])
            .map(|t| t.expect("admitted"))
            .collect();
        assert_eq!(gate.admit(ip(9)).err(), Some(Refusal::Port));
        tickets.truncate(5);
        assert!(gate.admit(ip(9)).is_ok());
        drop(tickets);
        let state = gate.state.lock().expect("lock");
        assert_eq!(
            (state.total, state.sources.len()),
            (0, 0),
            "the table keeps nothing for gone connections"
        );
    }

    #[test]
    fn bounds_follow_the_descriptors_the_supervisor_may_hold() {
        let small = Limits::for_descriptors(1024, 3);
        assert_eq!(small.per_port, 85);
        assert!(small.per_port * 3 * 2 + 512 <= 1024);
        let large = Limits::for_descriptors(1 << 20, 3);
        assert_eq!((large.per_port, large.per_source), (16_384, 512));
        assert_eq!(Limits::for_descriptors(100, 1).per_port, 16, "never below a usable floor");
    }

    /// An application's port (hostPort, NodePort): a server that speaks first is joined at
    /// once (no first-byte wait), and a changed target applies to the next connection.
    #[tokio::test]
    async fn an_application_port_joins_at_once_and_follows_its_target() {
        async fn greeter(greeting: &'static [u8]) -> SocketAddr {
            let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = l.local_addr().expect("addr");
            tokio::spawn(async move {
                while let Ok((mut conn, _)) = l.accept().await {
                    let _ = conn.write_all(greeting).await;
                }
            });
            addr
        }
        let (first, second) = (greeter(b"one\n").await, greeter(b"two\n").await);
        let (tx, rx) = tokio::sync::watch::channel(first);
        let front = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = front.local_addr().expect("addr");
        // first_byte is 400 ms: a greeting read well within it, the client silent, shows the
        // relay did not wait for the client.
        tokio::spawn(run(front, Destination::App(rx), "app".into(), limits()));
        let read_greeting = || async move {
            let mut conn = TcpStream::connect(addr).await.expect("connect");
            let mut buf = [0u8; 4];
            tokio::time::timeout(Duration::from_millis(300), conn.read_exact(&mut buf))
                .await
                .expect("the greeting came before any client byte")
                .expect("read");
            buf
        };
        assert_eq!(&read_greeting().await, b"one\n");
        tx.send(second).expect("retarget");
        assert_eq!(&read_greeting().await, b"two\n");
    }

    /// An application's port keeps the caps: over the source's cap, closed on arrival.
    #[tokio::test]
    async fn an_application_port_keeps_the_source_cap() {
        let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
        let target = echo.local_addr().expect("addr");
        let (_tx, rx) = tokio::sync::watch::channel(target);
        let front = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = front.local_addr().expect("addr");
        tokio::spawn(run(front, Destination::App(rx), "app".into(), limits()));
        let mut held = Vec::new();
        for _ in 0..limits().per_source {
            held.push(TcpStream::connect(addr).await.expect("connect"));
        }
        // Let the relay admit them (each opens its upstream at once).
        for _ in 0..limits().per_source {
            let _ = tokio::time::timeout(Duration::from_secs(2), echo.accept()).await.expect("upstream");
        }
        let mut over = TcpStream::connect(addr).await.expect("connect");
        assert!(closed_within(&mut over, Duration::from_secs(2)).await, "a connection over the cap was kept");
    }
}
