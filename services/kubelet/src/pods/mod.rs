//! The pods bound to this node: one worker per pod, created from a watch of
//! `spec.nodeName=<node>`, fed the runtime's container events, and re-adopting what the
//! runtime still runs after a restart (`manager.rs`). A worker (`worker.rs`) asks the pure
//! `plan.rs` what to do and carries it out over the [`CriClient`](crate::cri::CriClient)
//! (`sandbox.rs`, `containers.rs`, `terminate.rs`); failed steps go through one policy
//! (`error.rs`).

pub mod admission;
pub mod backoff;
mod containers;
pub mod error;
pub mod manager;
pub mod plan;
pub mod pull;
pub mod record;
mod report;
mod sandbox;
pub mod status;
mod terminate;
pub mod termination;
pub mod worker;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use hpk_proto::kubelet::v1 as diag;
use tokio::sync::watch;

use crate::cri::Cri;
use crate::cri_config::DnsSettings;
use crate::events::Events;
use crate::node::NodeState;
use crate::objects::ApiObjects;

/// What every pod worker shares.
pub struct Context {
    /// The API as the node.
    pub client: kube::Client,
    /// The runtime, for what is not the worker's (streaming, stats, events, remote files).
    pub cri: Cri,
    /// The runtime as the pod workers, their probes and the manager call it.
    pub runtime: std::sync::Arc<dyn crate::cri::CriClient>,
    /// ConfigMaps, Secrets, tokens … as the node.
    pub objects: ApiObjects,
    /// Events to the API.
    pub events: Events,
    /// The node's name.
    pub node_name: String,
    /// The node's address (status.hostIP).
    pub host_ip: String,
    /// `<root>/pods/<uid>`: each pod's volumes and /etc/hosts.
    pub pods_dir: PathBuf,
    /// Where containers' logs go.
    pub logs_dir: PathBuf,
    /// DNS for pods.
    pub dns: DnsSettings,
    /// The node's state (allocatable, readiness).
    pub node: watch::Receiver<NodeState>,
    /// Requests of the admitted pods.
    pub admitted: Mutex<admission::Admitted>,
    /// Each pod's summary, for the diagnostics service, by UID.
    pub summaries: Mutex<BTreeMap<String, diag::PodSummary>>,
    /// The pods bound to this node as the watch last gave them, by UID (the kubelet API's
    /// `/pods` and its lookups by name).
    pub pods: Mutex<BTreeMap<String, std::sync::Arc<k8s_openapi::api::core::v1::Pod>>>,
    /// The user and group IDs of this kubelet's bubble (`None`: unknown, every ID is taken as
    /// mapped). The runtime's too, unless it is remote (connector mode).
    pub ids: Option<crate::idmap::IdMappings>,
    /// The host paths hostPath volumes may reach (`--forbidden-host-path`,
    /// `--allowed-host-path`).
    pub host_paths: crate::volumes::HostPaths,
    /// The node's GPUs (CDI devices) and which containers hold them.
    pub gpus: crate::gpus::Gpus,
    /// The sysctls beyond the safe set pods may set (`--allowed-unsafe-sysctls`).
    pub allowed_unsafe_sysctls: Vec<String>,
}

impl Context {
    /// A pod's directory.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.pods_dir.join(uid)
    }
}

/// Locks a mutex, recovering the data if a holder panicked (nothing here leaves it torn).
pub fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The `namespace/name` of a pod, for logs.
pub fn key(pod: &k8s_openapi::api::core::v1::Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// Runtime objects of one pod found at start: what a previous kubelet left running.
#[derive(Clone, Debug, Default)]
pub struct Adopted {
    /// Its sandboxes, newest first.
    pub sandboxes: Vec<k8s_cri::v1::PodSandbox>,
    /// Its containers.
    pub containers: Vec<k8s_cri::v1::Container>,
}
