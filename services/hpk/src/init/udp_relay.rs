//! A published UDP port (a pod's UDP `hostPort`, a UDP Service's `nodePort`): the socket was
//! bound on the node's address by the launcher; each datagram it receives goes on to the
//! target from a socket of its own per client (a flow), and what the target sends back on that
//! socket returns to the client from the published port, so a client sees its answers come
//! from the address it asked. This is what conntrack does for upstream's host ports.
//!
//! Anyone who reaches the node can send, so every flow is bounded before it costs anything:
//!
//! - at most [`UdpLimits::flows`] flows at once on the port and [`UdpLimits::per_source`]
//!   from one address; a datagram that would open one more is dropped (logged at most every
//!   [`super::relay::REFUSAL_LOG_EVERY`], with a count, as the TCP relay logs refusals);
//! - a flow that carries nothing either way for [`UdpLimits::idle`] ends and frees its socket
//!   (conntrack keeps an answered UDP flow 120 s);
//! - a datagram is at most 64 KiB, one buffer per flow.
//!
//! A changed target applies to new flows. When the port closes (its future is dropped), every
//! flow ends with it: nothing holds the host socket after.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::net::UdpSocket;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::relay::{Refusal, RefusalLog};

/// The largest datagram (UDP's own bound).
const MAX_DATAGRAM: usize = 65_536;

/// The bounds on one published UDP port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpLimits {
    /// Flows (clients) at once on the port: each holds one socket.
    pub flows: usize,
    /// Flows at once from one address.
    pub per_source: usize,
    /// How long a flow may carry nothing either way.
    pub idle: Duration,
}

impl UdpLimits {
    /// The bounds for a port whose relay may hold `descriptors` sockets.
    pub fn for_descriptors(descriptors: usize) -> Self {
        let flows = descriptors.clamp(16, 4096);
        Self { flows, per_source: (flows / 4).clamp(4, 256), idle: Duration::from_secs(120) }
    }
}

/// One client's flow: its socket towards the target, and when it last carried a datagram
/// (milliseconds since the port opened).
struct Flow {
    upstream: Arc<UdpSocket>,
    last: Arc<AtomicU64>,
}

/// Relays `socket` (the published port) to the target `target` names, for ever.
pub async fn run(socket: UdpSocket, target: watch::Receiver<SocketAddr>, name: String, limits: UdpLimits) {
    let socket = Arc::new(socket);
    let opened = Instant::now();
    let now_ms = move || u64::try_from(opened.elapsed().as_millis()).unwrap_or(u64::MAX);
    let mut flows: HashMap<SocketAddr, Flow> = HashMap::new();
    // Each flow's task returns its client when it ends; dropping the set ends them all.
    let mut tasks: JoinSet<SocketAddr> = JoinSet::new();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut dropped = RefusalLog::new("datagrams dropped: over the port's or the source's cap on flows");
    loop {
        tokio::select! {
            received = socket.recv_from(&mut buf) => {
                let (n, client) = match received {
                    Ok(r) => r,
                    Err(e) => {
                        // An ICMP error from an earlier answer, or a lack of buffers: go on.
                        tracing::debug!(port = %name, error = %e, "receive failed");
                        continue;
                    }
                };
                if !flows.contains_key(&client) {
                    if flows.len() >= limits.flows {
                        dropped.note(&name, client, Refusal::Port);
                        continue;
                    }
                    if flows.keys().filter(|c| c.ip() == client.ip()).count() >= limits.per_source {
                        dropped.note(&name, client, Refusal::Source);
                        continue;
                    }
                    let to = *target.borrow();
                    let upstream = match open(to).await {
                        Ok(u) => Arc::new(u),
                        Err(e) => {
                            tracing::warn!(port = %name, target = %to, error = %e, "could not open a flow");
                            continue;
                        }
                    };
                    let last = Arc::new(AtomicU64::new(now_ms()));
                    tasks.spawn(answers(upstream.clone(), socket.clone(), client, last.clone(), limits.idle, now_ms));
                    flows.insert(client, Flow { upstream, last });
                }
                if let Some(flow) = flows.get(&client) {
                    flow.last.store(now_ms(), Ordering::Relaxed);
                    // A target that refuses (ICMP unreachable) shows on a later send: dropped,
                    // as the network would.
                    let _ = flow.upstream.send(&buf[..n]).await;
                }
            }
            Some(ended) = tasks.join_next(), if !tasks.is_empty() => {
                if let Ok(client) = ended {
                    flows.remove(&client);
                }
            }
        }
    }
}

/// A socket of the bubble's namespace connected to `target`.
async fn open(target: SocketAddr) -> std::io::Result<UdpSocket> {
    let any = match target.ip() {
        IpAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        IpAddr::V6(_) => SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0)),
    };
    let socket = UdpSocket::bind(any).await?;
    socket.connect(target).await?;
    Ok(socket)
}

/// One flow's answers: what the target sends back goes to `client` from the published port,
/// until the flow has been idle `idle` either way. Returns the client.
async fn answers(
    upstream: Arc<UdpSocket>,
    published: Arc<UdpSocket>,
    client: SocketAddr,
    last: Arc<AtomicU64>,
    idle: Duration,
    now_ms: impl Fn() -> u64,
) -> SocketAddr {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let quiet = Duration::from_millis(now_ms().saturating_sub(last.load(Ordering::Relaxed)));
        let Some(left) = idle.checked_sub(quiet).filter(|d| !d.is_zero()) else { return client };
        match tokio::time::timeout(left, upstream.recv(&mut buf)).await {
            Err(_) => {}
            Ok(Ok(n)) => {
                last.store(now_ms(), Ordering::Relaxed);
                let _ = published.send_to(&buf[..n], client).await;
            }
            // ECONNREFUSED: nothing listens at the target (yet); the client may try again.
            Ok(Err(_)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A UDP server on loopback that answers each datagram with `tag` and what it got.
    async fn echo(tag: &'static str) -> SocketAddr {
        let server = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        let at = server.local_addr().expect("addr");
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            while let Ok((n, from)) = server.recv_from(&mut buf).await {
                let answer = [tag.as_bytes(), b":", &buf[..n]].concat();
                let _ = server.send_to(&answer, from).await;
            }
        });
        at
    }

    async fn published(
        target: SocketAddr,
        limits: UdpLimits,
    ) -> (SocketAddr, watch::Sender<SocketAddr>, tokio::task::JoinHandle<()>) {
        let socket = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        let at = socket.local_addr().expect("addr");
        let (tx, rx) = watch::channel(target);
        let task = tokio::spawn(run(socket, rx, "test".into(), limits));
        (at, tx, task)
    }

    async fn ask(client: &UdpSocket, port: SocketAddr, what: &str) -> Option<(String, SocketAddr)> {
        client.send_to(what.as_bytes(), port).await.expect("send");
        let mut buf = [0u8; 1024];
        match tokio::time::timeout(Duration::from_millis(500), client.recv_from(&mut buf)).await {
            Ok(Ok((n, from))) => Some((String::from_utf8_lossy(&buf[..n]).into_owned(), from)),
            _ => None,
        }
    }

    fn limits(flows: usize, per_source: usize, idle_ms: u64) -> UdpLimits {
        UdpLimits { flows, per_source, idle: Duration::from_millis(idle_ms) }
    }

    #[tokio::test]
    async fn each_client_gets_its_own_answers_from_the_published_port() {
        let (port, _target, _task) = published(echo("a").await, limits(8, 8, 10_000)).await;
        let one = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        let two = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        assert_eq!(ask(&one, port, "1").await, Some(("a:1".into(), port)));
        assert_eq!(ask(&two, port, "2").await, Some(("a:2".into(), port)));
        assert_eq!(ask(&one, port, "3").await, Some(("a:3".into(), port)));
    }

    #[tokio::test]
    async fn flows_over_the_caps_are_dropped_and_an_idle_flow_frees_its_place() {
        let (port, _target, _task) = published(echo("a").await, limits(2, 1, 300)).await;
        let one = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        let two = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        assert!(ask(&one, port, "1").await.is_some());
        // Same source address (127.0.0.1), a second flow: over the per-source cap.
        assert_eq!(ask(&two, port, "2").await, None);
        // The first flow ends once idle; then the other client has a place.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(ask(&two, port, "2").await, Some(("a:2".into(), port)));
    }

    #[tokio::test]
    async fn a_new_target_applies_to_new_flows_and_closing_frees_the_port() {
        let (port, target, task) = published(echo("a").await, limits(8, 8, 10_000)).await;
        let one = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        assert_eq!(ask(&one, port, "1").await, Some(("a:1".into(), port)));
        target.send(echo("b").await).expect("target");
        let two = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        assert_eq!(ask(&two, port, "2").await, Some(("b:2".into(), port)));
        assert_eq!(ask(&one, port, "3").await, Some(("a:3".into(), port)));
        task.abort();
        let _ = task.await;
        // No flow keeps the published socket: its port can be bound again (the flows' tasks
        // end as the runtime gets to them).
        let deadline = Instant::now() + Duration::from_secs(5);
        while let Err(e) = UdpSocket::bind(port).await {
            assert!(Instant::now() < deadline, "the port is still held once closed: {e}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
