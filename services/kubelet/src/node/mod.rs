//! The node as the API server sees it: registration, the Lease, and the status with its
//! conditions, pushed as `system:node:<name>` (so the Node authorizer and NodeRestriction
//! apply).
//!
//! - [`resources`] — capacity from the Slurm allocation or the machine.
//! - [`info`] — `status.nodeInfo`.
//! - [`conditions`] — Ready and the pressures, decided from figures by pure functions.
//! - [`probe`] — the runtime's and the net-forwarder's readiness.
//! - [`register`], [`status`], [`lease`] — the API objects and how they are written.

pub mod conditions;
pub mod info;
pub mod lease;
pub mod probe;
pub mod register;
pub mod resources;
pub mod status;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, NodeSystemInfo, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::{Patch, PatchParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use self::conditions::{Check, Probe};
pub use self::resources::{Machine, Resources, capacity};
use crate::cri::Cri;

/// How often the conditions are checked.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(10);
/// How often they are checked while the node is not Ready.
pub const NOT_READY_INTERVAL: Duration = Duration::from_secs(1);

/// The node's settings.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    /// The Node's name (the kubelet's identity is `system:node:<name>`).
    pub name: String,
    /// The address the API server reaches the kubelet at (`InternalIP`).
    pub internal_ip: IpAddr,
    /// The `Hostname` address and `kubernetes.io/hostname` label.
    pub hostname: String,
    /// The kubelet API's port (`status.daemonEndpoints.kubeletEndpoint.Port`).
    pub kubelet_port: u16,
    /// Pods the node takes at most.
    pub max_pods: u32,
    /// The value of the `node.hpk.io/role` label (`worker`, `controller`).
    pub role: String,
    /// A taint set when the Node is created (opt-in, as a connector's virtual node has).
    pub taint: Option<Taint>,
    /// The kubelet's state directory: its filesystem is the ephemeral storage and the one
    /// DiskPressure watches.
    pub root_dir: PathBuf,
    /// When set, the net-forwarder's health on this UNIX socket must be SERVING for Ready.
    pub net_forwarder_socket: Option<PathBuf>,
    /// DiskPressure when less than this share (percent) of `root_dir`'s filesystem is free.
    pub disk_pressure_percent: u8,
    /// The variables [`capacity`] reads (the Slurm allocation); `None` reads the process's
    /// environment.
    pub env: Option<HashMap<String, String>>,
    /// The capacity as given: a remote runtime's allocation (connector mode). `None` measures
    /// this machine and its allocation.
    pub capacity: Option<Resources>,
    /// The GPUs this node can give pods (CDI devices), over what [`capacity`] counts from the
    /// allocation; `None` keeps that count.
    pub gpus: Option<i64>,
}

/// What the pod side needs from the node.
#[derive(Clone, Debug)]
pub struct NodeState {
    /// What pods' requests are admitted against.
    pub allocatable: Resources,
    /// Whether the node is Ready.
    pub ready: bool,
    /// The Ready condition's message.
    pub message: String,
}

/// Why the node could not be registered or measured.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A system file or figure could not be read or parsed.
    #[error(transparent)]
    System(#[from] hpk_node_resources::Error),
    /// The API server refused the Node for a reason retrying does not cure.
    #[error("cannot register node {node}")]
    Register {
        /// The node's name.
        node: String,
        /// The API's answer.
        #[source]
        source: kube::Error,
    },
    /// Shut down before the Node was registered.
    #[error("shut down before node {node} was registered")]
    Cancelled {
        /// The node's name.
        node: String,
    },
}

/// Allocatable is the capacity, without a reservation: the allocation is the bubble's alone,
/// and the bubble's own services (this kubelet, the runtime, the net-forwarder) are small and
/// run inside the same Slurm allocation, whose limits hold them either way. A reservation
/// would only keep pods from CPUs and memory the user was granted for them.
pub fn allocatable(capacity: &Resources) -> Resources {
    capacity.clone()
}

/// Registers the Node, pushes its first status at once, and returns the node state's channel
/// with the task that keeps the Lease and the status until `shutdown`.
///
/// Registration is retried while the API server is unreachable or overloaded; an answer that
/// retrying does not change (403, 422) is an error.
pub async fn start(
    client: kube::Client,
    cri: Cri,
    config: NodeConfig,
    shutdown: CancellationToken,
) -> Result<(watch::Receiver<NodeState>, tokio::task::JoinHandle<()>), NodeError> {
    let machine = Machine::read(&config.root_dir)?;
    let capacity = match (&config.capacity, &config.env) {
        (Some(given), _) => given.clone(),
        (None, Some(vars)) => capacity(&|k| vars.get(k).cloned(), &machine, config.max_pods),
        (None, None) => capacity(&|k| std::env::var(k).ok(), &machine, config.max_pods),
    };
    let capacity = match config.gpus {
        Some(gpus) => {
            if capacity.gpus > gpus {
                tracing::warn!(
                    allocation = capacity.gpus,
                    described = gpus,
                    "the allocation has GPUs that no CDI spec describes: only the described ones are offered"
                );
            }
            Resources { gpus, ..capacity }
        }
        None => capacity,
    };
    let allocatable = allocatable(&capacity);
    info!(node = %config.name, ?capacity, "node capacity");
    let nodes: Api<Node> = Api::all(client.clone());
    let node = register_until_done(&nodes, &config, &shutdown).await?;
    let (uid_tx, uid_rx) = watch::channel(node.metadata.uid.clone());
    let initial =
        NodeState { allocatable: allocatable.clone(), ready: false, message: "not checked yet".into() };
    let (state_tx, state_rx) = watch::channel(initial);
    let mut looper = Loop {
        nodes,
        cri,
        config,
        capacity,
        allocatable,
        runtime_version: None,
        last: None,
        retry: lease::Backoff::new(),
        uid_tx,
        state_tx,
    };
    let mut wait = looper.round().await;
    let lease = tokio::spawn(lease::run(client, looper.config.name.clone(), uid_rx, shutdown.clone()));
    let task = tokio::spawn(async move {
        loop {
            // A round waiting on an unresponsive API server must not hold up shutdown.
            let next = async {
                tokio::time::sleep(wait).await;
                looper.round().await
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                next = next => wait = next,
            }
        }
        let _ = lease.await;
        info!(node = %looper.config.name, "node loop stopped");
    });
    Ok((state_rx, task))
}

async fn register_until_done(
    nodes: &Api<Node>,
    config: &NodeConfig,
    shutdown: &CancellationToken,
) -> Result<Node, NodeError> {
    let mut backoff = lease::Backoff::new();
    loop {
        match register::register(nodes, config).await {
            Ok(node) => return Ok(node),
            Err(e) if !transient(&e) => {
                return Err(NodeError::Register { node: config.name.clone(), source: e });
            }
            Err(e) => {
                let delay = backoff.next_delay();
                warn!(node = %config.name, error = %e, retry_ms = delay.as_millis() as u64, "registration failed");
                tokio::select! {
                    () = shutdown.cancelled() => return Err(NodeError::Cancelled { node: config.name.clone() }),
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Whether retrying may help: no answer, or an answer saying "later" (conflict, throttling,
/// server trouble).
fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(status) => matches!(status.code, 409 | 429) || status.code >= 500,
        _ => true,
    }
}

/// An error with its causes, `outer: inner: root`, for a condition's message.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.ends_with(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text
}

/// The status loop's state.
struct Loop {
    nodes: Api<Node>,
    cri: Cri,
    config: NodeConfig,
    capacity: Resources,
    allocatable: Resources,
    runtime_version: Option<String>,
    last: Option<status::Pushed>,
    /// Rounds come sooner while pushes fail, so that a first Ready is not a period late.
    retry: lease::Backoff,
    uid_tx: watch::Sender<Option<String>>,
    state_tx: watch::Sender<NodeState>,
}

impl Loop {
    /// One round: check, publish the node state, read the Node (registering it again if it
    /// was deleted), push the status when due. Returns the time to the next round.
    async fn round(&mut self) -> Duration {
        if self.runtime_version.is_none() || !self.state_tx.borrow().ready {
            // Asked again while not ready: a runtime that comes back may be a new version.
            if let Some(version) = probe::runtime_version(&self.cri).await {
                self.runtime_version = Some(version);
            }
        }
        let checks = self.check().await;
        self.publish(&checks[0]);
        let info = info::read(self.runtime_version.as_deref());
        let pushed = match self.current().await {
            Some(current) if status::due(self.last.as_ref(), &checks, &info, &current, Instant::now()) => {
                self.push(&current, checks, info).await
            }
            Some(_) => true,
            None => false,
        };
        if pushed && !self.state_tx.borrow().ready {
            // Not Ready: look again soon, so Ready follows within a second of its cause
            // (a net-forwarder that starts after the kubelet, a runtime back from a restart).
            self.retry.reset();
            NOT_READY_INTERVAL
        } else if pushed {
            self.retry.reset();
            CHECK_INTERVAL
        } else {
            self.retry.next_delay().min(CHECK_INTERVAL)
        }
    }

    async fn check(&self) -> Vec<Check> {
        let forwarder = async {
            match &self.config.net_forwarder_socket {
                Some(socket) => Some(probe::forwarder(socket).await),
                None => None,
            }
        };
        let (runtime, forwarder): (Probe, Option<Probe>) = tokio::join!(probe::runtime(&self.cri), forwarder);
        vec![
            conditions::ready(&runtime, forwarder.as_ref()),
            conditions::memory(conditions::memory_available()),
            conditions::disk(
                conditions::filesystem(&self.config.root_dir),
                self.config.disk_pressure_percent,
            ),
            conditions::pid(conditions::pids()),
        ]
    }

    fn publish(&self, ready: &Check) {
        self.state_tx.send_if_modified(|state| {
            let changed = state.ready != ready.status || state.message != ready.message;
            if changed {
                if ready.status {
                    info!(node = %self.config.name, "node ready");
                } else {
                    warn!(node = %self.config.name, why = %ready.message, "node not ready");
                }
                state.ready = ready.status;
                state.message = ready.message.clone();
            }
            changed
        });
    }

    /// The Node as the API has it; registered again (and pushed to at once) when it is gone.
    /// Read every round, not only when a push is due: a deleted Node is noticed within a
    /// round, and transition times start from what the API shows (the lifecycle controller's
    /// Unknown included), not from what this kubelet last wrote.
    async fn current(&mut self) -> Option<Node> {
        let name = &self.config.name;
        let node = match self.nodes.get_opt(name).await {
            Ok(Some(node)) => node,
            Ok(None) => {
                warn!(node = %name, "node deleted while running; registering it again");
                self.last = None;
                match register::register(&self.nodes, &self.config).await {
                    Ok(node) => node,
                    Err(e) => {
                        warn!(node = %name, error = %e, "registration failed");
                        return None;
                    }
                }
            }
            Err(e) => {
                warn!(node = %name, error = %e, "cannot read the node");
                return None;
            }
        };
        self.uid_tx.send_if_modified(|uid| {
            let changed = *uid != node.metadata.uid;
            uid.clone_from(&node.metadata.uid);
            changed
        });
        Some(node)
    }

    /// Patches the status onto `current`; says whether that worked.
    async fn push(&mut self, current: &Node, checks: Vec<Check>, info: NodeSystemInfo) -> bool {
        let name = self.config.name.clone();
        let facts = status::Facts {
            config: &self.config,
            capacity: &self.capacity,
            allocatable: &self.allocatable,
            info: &info,
        };
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let body = status::patch(&facts, &checks, Some(current), &now);
        match self.nodes.patch_status(&name, &PatchParams::default(), &Patch::Strategic(body)).await {
            Ok(_) => {
                self.last = Some(status::Pushed { checks, info, at: Instant::now() });
                true
            }
            Err(e) => {
                warn!(node = %name, error = %e, "status update failed");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_chain_reads_outer_to_root() {
        let e = NodeError::from(hpk_node_resources::Error::Read {
            what: "file",
            path: "/proc/x".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
        assert_eq!(error_chain(&e), "cannot read file from /proc/x: entity not found");
    }

    #[test]
    fn only_answers_that_may_change_are_retried() {
        let api = |code| {
            kube::Error::Api(Box::new(kube::core::Status { code, ..kube::core::Status::failure("x", "y") }))
        };
        assert!(transient(&api(500)) && transient(&api(429)) && transient(&api(409)));
        assert!(!transient(&api(403)) && !transient(&api(422)));
    }
}
