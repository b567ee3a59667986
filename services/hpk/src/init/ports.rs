//! The node's ports on the host (issue 25): a pod's `hostPort`, a Service's `nodePort` and a
//! LoadBalancer Service's port, reachable on the node's address from outside the cluster.
//!
//! The supervisor follows the Services of the cluster and the Pods bound to this node (as the
//! node, whose identity may read both), works out which host port goes where, asks the
//! launcher for each port it lacks ([`crate::host_ports`]: bound in the host's namespace,
//! handed over) and relays every connection with the bubble's bounds
//! ([`super::relay::Destination::App`]):
//!
//! - `hostPort` (`hostIP` unset or the node's address) → the pod's IP and `containerPort`
//!   (a hostNetwork pod: the bubble's loopback);
//! - `nodePort` of a NodePort or LoadBalancer Service → its cluster IP and port, where
//!   kube-proxy's rules take over;
//! - a LoadBalancer Service without a `loadBalancerClass` also on its `port` (K3s's ServiceLB
//!   does the same; the controller writes the node addresses into its status:
//!   [`super::service_lb`]).
//!
//! A port the launcher cannot bind (in use, below the unprivileged range) is retried every
//! [`RETRY`]; the pod or Service gets a Warning event `PortNotPublished` naming the port and
//! the reason, once. Where several bubbles of the cluster share the host (`hpk up`), only one
//! of them can hold a Service's port: the others retry quietly, and take over when it goes.
//! A port no longer wanted is closed at once; a changed target applies to new connections.
//! TCP and UDP ports are published (TCP and UDP are separate ports: the same number may go
//! to two owners), TCP connections through [`super::relay`], UDP datagrams through
//! [`super::udp_relay`]; an SCTP port's owner gets a Warning event.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Resource};
use tokio_util::sync::CancellationToken;

use super::relay::{self, Destination, Limits};
use super::udp_relay::{self, UdpLimits};
use crate::host_ports::{self, Protocol, Published};

/// How often a port that could not be published is tried again.
pub const RETRY: Duration = Duration::from_secs(10);
/// The most ports a node publishes.
pub const MAX_PORTS: usize = 1024;

/// Who asked for a host port.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Owner {
    /// A Service (its `nodePort`, or a LoadBalancer's `port`).
    Service { namespace: String, name: String },
    /// A pod (`hostPort`).
    Pod { namespace: String, name: String },
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owner::Service { namespace, name } => write!(f, "service {namespace}/{name}"),
            Owner::Pod { namespace, name } => write!(f, "pod {namespace}/{name}"),
        }
    }
}

/// A host port wanted: where its connections go, and for whom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    pub target: SocketAddr,
    pub owner: Owner,
}

/// A host port: its protocol and number.
pub type HostPort = (Protocol, u16);

/// What the Services and this node's Pods ask for.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Host port → where it goes.
    pub ports: BTreeMap<HostPort, Want>,
    /// What is asked for and not published, with why (SCTP, a port another owner has).
    pub refused: Vec<(Owner, u16, String)>,
}

impl Plan {
    fn want(&mut self, port: HostPort, want: Want) {
        let (protocol, number) = port;
        match self.ports.get(&port) {
            Some(held) if held.owner != want.owner => {
                let why = format!("host port {number}/{protocol} is already {}'s", held.owner);
                self.refused.push((want.owner, number, why));
            }
            Some(_) => {}
            None if self.ports.len() >= MAX_PORTS => {
                self.refused.push((
                    want.owner,
                    number,
                    format!("a node publishes at most {MAX_PORTS} ports"),
                ));
            }
            None => {
                self.ports.insert(port, want);
            }
        }
    }
}

/// The plan for this node (`address`: the node's address, which `hostIP` may name). Pods
/// first (a hostPort is the node's own), then Services, each in name order.
pub fn plan(services: &[Arc<Service>], pods: &[Arc<Pod>], address: Ipv4Addr) -> Plan {
    let mut plan = Plan::default();
    let mut pods: Vec<&Pod> = pods.iter().map(AsRef::as_ref).collect();
    pods.sort_by_key(|p| (p.metadata.namespace.clone(), p.metadata.name.clone()));
    for pod in pods {
        pod_ports(pod, address, &mut plan);
    }
    let mut services: Vec<&Service> = services.iter().map(AsRef::as_ref).collect();
    services.sort_by_key(|s| (s.metadata.namespace.clone(), s.metadata.name.clone()));
    for service in services {
        service_ports(service, &mut plan);
    }
    plan
}

fn pod_ports(pod: &Pod, address: Ipv4Addr, plan: &mut Plan) {
    let (Some(spec), Some(status)) = (&pod.spec, &pod.status) else { return };
    if pod.metadata.deletion_timestamp.is_some()
        || matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"))
    {
        return;
    }
    let host_network = spec.host_network.unwrap_or(false);
    let ip = if host_network {
        Some(Ipv4Addr::LOCALHOST)
    } else {
        status.pod_ip.as_deref().and_then(|ip| ip.parse::<Ipv4Addr>().ok())
    };
    let Some(ip) = ip else { return };
    let owner = Owner::Pod {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
    };
    let sidecars =
        spec.init_containers.iter().flatten().filter(|c| c.restart_policy.as_deref() == Some("Always"));
    for container in spec.containers.iter().chain(sidecars) {
        for port in container.ports.iter().flatten() {
            let Some(host_port) = port.host_port.and_then(|p| u16::try_from(p).ok()).filter(|p| *p > 0)
            else {
                continue;
            };
            let for_us = port
                .host_ip
                .as_deref()
                .is_none_or(|h| h.is_empty() || h == "0.0.0.0" || h == address.to_string());
            if !for_us {
                continue;
            }
            let Some(protocol) = Protocol::from_kubernetes(port.protocol.as_deref()) else {
                let why = format!(
                    "{} host ports are not published (TCP and UDP only)",
                    port.protocol.as_deref().unwrap_or("")
                );
                plan.refused.push((owner.clone(), host_port, why));
                continue;
            };
            let Ok(container_port) = u16::try_from(port.container_port) else { continue };
            let target = SocketAddr::from((ip, container_port));
            plan.want((protocol, host_port), Want { target, owner: owner.clone() });
        }
    }
}

fn service_ports(service: &Service, plan: &mut Plan) {
    let Some(spec) = &service.spec else { return };
    let kind = spec.type_.as_deref().unwrap_or("ClusterIP");
    if kind != "NodePort" && kind != "LoadBalancer" {
        return;
    }
    let Some(cluster_ip) = spec.cluster_ip.as_deref().and_then(|ip| ip.parse::<Ipv4Addr>().ok()) else {
        return;
    };
    let owner = Owner::Service {
        namespace: service.metadata.namespace.clone().unwrap_or_default(),
        name: service.metadata.name.clone().unwrap_or_default(),
    };
    let balanced = kind == "LoadBalancer" && spec.load_balancer_class.is_none();
    for port in spec.ports.iter().flatten() {
        let Ok(service_port) = u16::try_from(port.port) else { continue };
        let node_port = port.node_port.and_then(|p| u16::try_from(p).ok()).filter(|p| *p > 0);
        let Some(protocol) = Protocol::from_kubernetes(port.protocol.as_deref()) else {
            for p in node_port.into_iter().chain(balanced.then_some(service_port)) {
                let why = format!(
                    "{} ports are not published on the host (TCP and UDP only)",
                    port.protocol.as_deref().unwrap_or("")
                );
                plan.refused.push((owner.clone(), p, why));
            }
            continue;
        };
        let target = SocketAddr::from((cluster_ip, service_port));
        if let Some(node_port) = node_port {
            plan.want((protocol, node_port), Want { target, owner: owner.clone() });
        }
        if balanced {
            plan.want((protocol, service_port), Want { target, owner: owner.clone() });
        }
    }
}

/// A port published now.
struct Held {
    owner: Owner,
    target: tokio::sync::watch::Sender<SocketAddr>,
    stop: CancellationToken,
}

/// Follows the Services and this node's Pods for ever, keeping the host ports as they ask.
pub async fn run(client: kube::Client, node: String, address: Ipv4Addr, launcher: host_ports::Client) {
    let launcher = Arc::new(std::sync::Mutex::new(launcher));
    let (services, services_writer) = reflector::store::<Service>();
    let (pods, pods_writer) = reflector::store::<Pod>();
    let changed = Arc::new(tokio::sync::Notify::new());
    let follow = |stream: futures_util::stream::BoxStream<'static, ()>| {
        let changed = changed.clone();
        tokio::spawn(async move {
            let mut stream = stream;
            while stream.next().await.is_some() {
                changed.notify_one();
            }
        })
    };
    let service_api: Api<Service> = Api::all(client.clone());
    follow(
        reflector::reflector(services_writer, watcher(service_api, watcher::Config::default()))
            .default_backoff()
            .map(|_| ())
            .boxed(),
    );
    let pod_api: Api<Pod> = Api::all(client.clone());
    let mine = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    follow(reflector::reflector(pods_writer, watcher(pod_api, mine)).default_backoff().map(|_| ()).boxed());
    let recorder =
        Recorder::new(client, Reporter { controller: "hpk-host-ports".into(), instance: Some(node.clone()) });
    let nofile = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft);
    let limits = Limits::for_descriptors(nofile, 16);
    // A UDP flow holds one socket; a TCP connection two.
    let udp_limits = UdpLimits::for_descriptors(limits.per_port * 2);
    let mut held: BTreeMap<HostPort, Held> = BTreeMap::new();
    // A port that failed: when, and the reasons already told (owner, port).
    let mut failed: HashMap<HostPort, Instant> = HashMap::new();
    let mut told: BTreeSet<(Owner, u16, String)> = BTreeSet::new();
    loop {
        tokio::select! {
            () = changed.notified() => tokio::time::sleep(Duration::from_millis(200)).await,
            () = tokio::time::sleep(RETRY) => {}
        }
        if services.state().is_empty() && pods.state().is_empty() {
            // Not listed yet: publishing nothing now would close what a restart should keep.
            continue;
        }
        let plan = plan(&services.state(), &pods.state(), address);
        // Gone or moved to another owner: closed.
        held.retain(|&(protocol, port), h| {
            let keep = plan.ports.get(&(protocol, port)).is_some_and(|w| w.owner == h.owner);
            if !keep {
                h.stop.cancel();
                tracing::info!(port, %protocol, owner = %h.owner, "host port closed");
            }
            keep
        });
        failed.retain(|port, _| plan.ports.contains_key(port));
        for (&(protocol, port), want) in &plan.ports {
            let key = (protocol, port);
            if let Some(h) = held.get(&key) {
                h.target.send_if_modified(|t| std::mem::replace(t, want.target) != want.target);
                continue;
            }
            if failed.get(&key).is_some_and(|at| at.elapsed() < RETRY) {
                continue;
            }
            let launcher = launcher.clone();
            let answer = tokio::task::spawn_blocking(move || {
                launcher.lock().unwrap_or_else(std::sync::PoisonError::into_inner).publish(protocol, port)
            })
            .await
            .unwrap_or_else(|e| Err(e.to_string()));
            match answer.and_then(relayed) {
                Ok(socket) => {
                    failed.remove(&key);
                    let (tx, rx) = tokio::sync::watch::channel(want.target);
                    let stop = CancellationToken::new();
                    let name = format!("host port {port}/{protocol}");
                    let stopped = stop.clone();
                    tokio::spawn(async move {
                        match socket {
                            Relayed::Tcp(listener) => tokio::select! {
                                () = stopped.cancelled() => {}
                                () = relay::run(listener, Destination::App(rx), name, limits) => {}
                            },
                            Relayed::Udp(socket) => tokio::select! {
                                () = stopped.cancelled() => {}
                                () = udp_relay::run(socket, rx, name, udp_limits) => {}
                            },
                        }
                    });
                    tracing::info!(port, %protocol, owner = %want.owner, target = %want.target, "host port published");
                    held.insert(key, Held { owner: want.owner.clone(), target: tx, stop });
                    told.retain(|(o, p, _)| !(o == &want.owner && *p == port));
                }
                Err(why) => {
                    failed.insert(key, Instant::now());
                    // Bubbles sharing the host: one of them holds a Service's port.
                    let sibling = matches!(want.owner, Owner::Service { .. })
                        && why.contains("in use")
                        && shares_host(&node, address);
                    if sibling {
                        tracing::debug!(port, %protocol, owner = %want.owner, "host port held by another bubble of this host");
                    } else {
                        let why =
                            format!("host port {port}/{protocol} on {address} could not be published: {why}");
                        tell(&recorder, &mut told, &services, &pods, &want.owner, port, why).await;
                    }
                }
            }
        }
        for (owner, port, why) in &plan.refused {
            tell(&recorder, &mut told, &services, &pods, owner, *port, why.clone()).await;
        }
    }
}

/// A published socket, ready for the runtime.
enum Relayed {
    Tcp(tokio::net::TcpListener),
    Udp(tokio::net::UdpSocket),
}

fn relayed(published: Published) -> std::result::Result<Relayed, String> {
    match published {
        Published::Tcp(l) => {
            l.set_nonblocking(true).map_err(|e| e.to_string())?;
            tokio::net::TcpListener::from_std(l).map(Relayed::Tcp).map_err(|e| e.to_string())
        }
        Published::Udp(s) => {
            s.set_nonblocking(true).map_err(|e| e.to_string())?;
            tokio::net::UdpSocket::from_std(s).map(Relayed::Udp).map_err(|e| e.to_string())
        }
    }
}

/// A Warning event `PortNotPublished` on the owner, once per owner, port and reason.
async fn tell(
    recorder: &Recorder,
    told: &mut BTreeSet<(Owner, u16, String)>,
    services: &reflector::Store<Service>,
    pods: &reflector::Store<Pod>,
    owner: &Owner,
    port: u16,
    why: String,
) {
    if !told.insert((owner.clone(), port, why.clone())) {
        return;
    }
    tracing::warn!(%owner, port, "{why}");
    let reference = match owner {
        Owner::Service { namespace, name } => {
            services.get(&reflector::ObjectRef::new(name).within(namespace)).map(|s| s.object_ref(&()))
        }
        Owner::Pod { namespace, name } => {
            pods.get(&reflector::ObjectRef::new(name).within(namespace)).map(|p| p.object_ref(&()))
        }
    };
    let Some(reference) = reference else { return };
    let event = Event {
        type_: EventType::Warning,
        reason: "PortNotPublished".into(),
        note: Some(why),
        action: "Publish".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        tracing::warn!(error = %e, "could not record an event");
    }
}

/// Whether another node of this cluster runs on this host's address (`hpk up`): the bubbles'
/// records in the shared directory say.
fn shares_host(node: &str, address: Ipv4Addr) -> bool {
    let dir = std::path::Path::new(crate::bubble::spec::SHARED_DIR).join("nodes");
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    entries.flatten().any(|e| {
        std::fs::read_to_string(e.path())
            .ok()
            .and_then(|text| serde_json::from_str::<crate::cluster::NodeRecord>(&text).ok())
            .is_some_and(|r| r.node != node && r.address == address)
    })
}

#[cfg(test)]
#[path = "ports_tests.rs"]
mod tests;
