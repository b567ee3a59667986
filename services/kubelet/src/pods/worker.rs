//! One pod's worker: a state machine driven by the pod's spec (from the watch), the runtime's
//! container events and the probes. Each wake-up runs `sync`, which takes the next step the
//! state allows, then reports the status if it changed.
//!
//! ```text
//! Admitting → PreparingVolumes → CreatingSandbox → Initializing (init containers in order)
//!           → Running (containers, restarts by restartPolicy with back-off) → Completed
//! any state → Terminating (preStop, SIGTERM, SIGKILL after the grace period) → Terminated
//! ```

use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::record::{ContainerRecord, State};
use super::status::Phase;
use super::{Adopted, Context, admission, key, lock};
use crate::events::Kind;
use crate::probes::{ProbeKind, ProbeReport};
use crate::volumes::PodVolumes;

/// How often configMap, secret, projected and downwardAPI volumes are re-read.
const VOLUME_REFRESH: Duration = Duration::from_secs(20);
/// Retry after a failed step that has no back-off of its own (volumes, a status update).
pub(super) const RETRY: Duration = Duration::from_secs(5);
/// The grace a pod gets when its API object vanished without one (a force delete).
pub(super) const VANISHED_GRACE: i64 = 2;

/// What the manager tells a worker.
#[derive(Debug)]
pub enum Msg {
    /// The pod's object changed.
    Update(Arc<Pod>),
    /// The pod's object is gone from the API.
    Deleted,
    /// The runtime reported a change to one of the pod's containers (or its event stream was
    /// re-established): read the containers' states again.
    Runtime,
}

/// Where the worker is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Checking the pod fits.
    Admitting,
    /// Setting up volumes.
    PreparingVolumes,
    /// Creating the sandbox.
    CreatingSandbox,
    /// Running init containers.
    Initializing,
    /// Running the containers.
    Running,
    /// Every container ended and none restarts.
    Completed,
    /// Stopping everything.
    Terminating,
    /// Done; the worker ends.
    Terminated,
}

/// The pod's sandbox.
pub(super) struct Sandbox {
    pub id: String,
    pub config: cri::PodSandboxConfig,
    pub ips: Vec<String>,
    pub ready: bool,
}

/// One pod's worker.
pub struct Worker {
    pub(super) ctx: Arc<Context>,
    pub(super) pod: Arc<Pod>,
    pub(super) uid: String,
    pub(super) key: String,
    pub(super) step: Step,
    pub(super) phase: Phase,
    pub(super) reason: Option<(String, String)>,
    pub(super) admitted: bool,
    pub(super) volumes: Option<PodVolumes>,
    pub(super) volumes_refreshed: Instant,
    pub(super) sandbox: Option<Sandbox>,
    pub(super) sandbox_attempt: u32,
    pub(super) sandbox_backoff: super::backoff::Backoff,
    pub(super) initialized: bool,
    pub(super) containers: Vec<ContainerRecord>,
    pub(super) probes: std::collections::HashMap<String, CancellationToken>,
    pub(super) probe_tx: mpsc::Sender<ProbeReport>,
    pub(super) start_time: Option<Timestamp>,
    pub(super) deleted: bool,
    pub(super) message: String,
    pub(super) wake: Option<Instant>,
    pub(super) reported: Option<serde_json::Value>,
    pub(super) last_conditions: Vec<k8s_openapi::api::core::v1::PodCondition>,
}

/// Runs the worker of `pod` until the pod is gone; `adopted` is what a previous kubelet left.
pub async fn run(
    ctx: Arc<Context>,
    pod: Arc<Pod>,
    adopted: Option<Adopted>,
    mut rx: mpsc::UnboundedReceiver<Msg>,
) {
    let (probe_tx, mut probe_rx) = mpsc::channel(64);
    let mut worker = Worker::new(ctx, pod, probe_tx);
    if let Some(adopted) = adopted {
        worker.adopt(adopted).await;
    }
    loop {
        worker.sync().await;
        worker.report().await;
        if worker.step == Step::Terminated {
            break;
        }
        let wake = worker.wake;
        let sleep = async move {
            match wake {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            msg = rx.recv() => match msg {
                Some(msg) => worker.on_message(msg).await,
                // The manager stopped (the kubelet shuts down): leave the pod running.
                None => break,
            },
            Some(report) = probe_rx.recv() => worker.on_probe(report).await,
            () = sleep => {}
        }
        // Take whatever else is queued before syncing again.
        while let Ok(msg) = rx.try_recv() {
            worker.on_message(msg).await;
        }
    }
    worker.stop_probes();
}

impl Worker {
    fn new(ctx: Arc<Context>, pod: Arc<Pod>, probe_tx: mpsc::Sender<ProbeReport>) -> Self {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let mut containers: Vec<ContainerRecord> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| ContainerRecord::new(&c.name, c.image.as_deref().unwrap_or(""), true))
            .collect();
        containers.extend(
            spec.containers
                .iter()
                .map(|c| ContainerRecord::new(&c.name, c.image.as_deref().unwrap_or(""), false)),
        );
        // Restart counts survive a kubelet restart through the API's view.
        if let Some(s) = pod.status.as_ref() {
            for cs in s.init_container_statuses.iter().flatten().chain(s.container_statuses.iter().flatten())
            {
                if let Some(r) = containers.iter_mut().find(|r| r.name == cs.name) {
                    r.restart_count = u32::try_from(cs.restart_count).unwrap_or(0);
                }
            }
        }
        let initialized = spec.init_containers.as_ref().is_none_or(Vec::is_empty);
        let phase = match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Succeeded") => Phase::Succeeded,
            Some("Failed") => Phase::Failed,
            _ => Phase::Pending,
        };
        let start_time = pod.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| t.0);
        Self {
            key: key(&pod),
            uid,
            ctx,
            pod,
            step: if phase.terminal() { Step::Completed } else { Step::Admitting },
            phase,
            reason: None,
            admitted: false,
            volumes: None,
            volumes_refreshed: Instant::now(),
            sandbox: None,
            sandbox_attempt: 0,
            sandbox_backoff: super::backoff::Backoff::default(),
            initialized,
            containers,
            probes: std::collections::HashMap::new(),
            probe_tx,
            start_time,
            deleted: false,
            message: String::new(),
            wake: None,
            reported: None,
            last_conditions: Vec::new(),
        }
    }

    /// The spec of container `name`.
    pub(super) fn spec_of(&self, name: &str, init: bool) -> Option<Container> {
        let spec = self.pod.spec.as_ref()?;
        if init {
            spec.init_containers.iter().flatten().find(|c| c.name == name).cloned()
        } else {
            spec.containers.iter().find(|c| c.name == name).cloned()
        }
    }

    /// The pod's restartPolicy.
    fn restart_policy(&self) -> &str {
        self.pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()).unwrap_or("Always")
    }

    /// Wakes the worker at `at` at the latest.
    pub(super) fn wake_at(&mut self, at: Instant) {
        self.wake = Some(self.wake.map_or(at, |w| w.min(at)));
    }

    /// An event about the pod or one of its containers.
    pub(super) fn event(&self, container: Option<(&str, bool)>, kind: Kind, reason: &str, note: String) {
        let field_path = container.map(|(name, init)| {
            format!("spec.{}{{{name}}}", if init { "initContainers" } else { "containers" })
        });
        self.ctx.events.publish(&self.pod, field_path, kind, reason, note);
    }

    async fn on_message(&mut self, msg: Msg) {
        match msg {
            Msg::Update(pod) => {
                if self.status_drifted(&pod) {
                    // Someone else wrote the pod's status (the node lifecycle controller marks
                    // pods NotReady while the node is Unknown): say again what is true.
                    self.reported = None;
                }
                self.pod = pod;
            }
            Msg::Deleted => self.deleted = true,
            Msg::Runtime => self.refresh().await,
        }
    }

    /// Whether the API's status of `pod` disagrees with what this worker last pushed: a
    /// condition it owns or the phase.
    fn status_drifted(&self, pod: &Pod) -> bool {
        if self.last_conditions.is_empty() {
            return false;
        }
        let Some(status) = pod.status.as_ref() else { return true };
        let theirs = status.conditions.as_deref().unwrap_or_default();
        let condition_differs = self.last_conditions.iter().any(|ours| {
            theirs.iter().find(|c| c.type_ == ours.type_).is_none_or(|c| c.status != ours.status)
        });
        condition_differs || status.phase.as_deref() != Some(self.phase.as_str())
    }

    /// Takes the next steps the pod's state allows.
    async fn sync(&mut self) {
        self.wake = None;
        if self.deleted || self.pod.metadata.deletion_timestamp.is_some() {
            self.terminate().await;
            return;
        }
        if self.phase.terminal() {
            self.step = Step::Completed;
            self.stop_sandbox_of_completed_pod().await;
            return;
        }
        if !self.admitted && !self.admit() {
            return;
        }
        if self.start_time.is_none() {
            self.start_time = Some(Timestamp::now());
        }
        if !self.prepare_volumes().await || !self.ensure_sandbox().await {
            return;
        }
        if !self.initialized {
            self.step = Step::Initializing;
            if !self.run_init_containers().await {
                return;
            }
            self.initialized = true;
        }
        self.step = Step::Running;
        self.run_containers().await;
    }

    /// Admission: the pod's requests against what the node has left.
    fn admit(&mut self) -> bool {
        self.step = Step::Admitting;
        let verdict = admission::requests(&self.pod)
            .map_err(|e| ("UnexpectedAdmissionError".to_owned(), format!("Pod was rejected: {e}")))
            .and_then(|req| {
                let node = self.ctx.node.borrow().clone();
                let alloc = admission::Allocatable {
                    millicpu: node.allocatable.millicpu,
                    memory: node.allocatable.memory,
                    gpus: node.allocatable.gpus,
                    pods: node.allocatable.pods,
                };
                lock(&self.ctx.admitted).admit(&self.uid, req, alloc)
            });
        match verdict {
            Ok(()) => {
                self.admitted = true;
                true
            }
            Err((reason, message)) => {
                tracing::warn!(pod = %self.key, %reason, %message, "pod rejected");
                self.event(None, Kind::Warning, &reason, message.clone());
                self.phase = Phase::Failed;
                self.step = Step::Completed;
                self.message.clone_from(&message);
                self.reason = Some((reason, message));
                false
            }
        }
    }

    /// Sets up the volumes once, and re-reads their sources every [`VOLUME_REFRESH`].
    async fn prepare_volumes(&mut self) -> bool {
        let ctx = self.volume_context();
        if let Some(volumes) = self.volumes.as_mut() {
            if self.volumes_refreshed.elapsed() >= VOLUME_REFRESH {
                self.volumes_refreshed = Instant::now();
                if let Err(error) = volumes.refresh(&self.pod, &ctx, &self.ctx.objects).await {
                    tracing::warn!(pod = %self.key, %error, "volume refresh failed");
                }
            }
            self.wake_at(self.volumes_refreshed + VOLUME_REFRESH);
            return true;
        }
        self.step = Step::PreparingVolumes;
        let dir = self.ctx.pod_dir(&self.uid);
        match PodVolumes::prepare(&self.pod, &dir, &ctx, &self.ctx.objects).await {
            Ok(volumes) => {
                for limit in volumes.unenforced() {
                    self.event(None, Kind::Normal, "LimitNotEnforced", limit);
                }
                self.volumes = Some(volumes);
                self.volumes_refreshed = Instant::now();
                self.wake_at(self.volumes_refreshed + VOLUME_REFRESH);
                true
            }
            Err(error) => {
                let message = crate::node::error_chain(&error);
                tracing::warn!(pod = %self.key, %message, "volumes not ready");
                self.event(None, Kind::Warning, "FailedMount", message.clone());
                self.message = message;
                self.wake_at(Instant::now() + RETRY);
                false
            }
        }
    }

    pub(super) fn volume_context(&self) -> crate::volumes::VolumeContext {
        crate::volumes::VolumeContext {
            facts: self.facts(),
            ids: self.ctx.ids.clone(),
            forbidden_host_paths: self.ctx.forbidden_host_paths.clone(),
        }
    }

    /// What the downward API tells about this pod.
    pub(super) fn facts(&self) -> crate::downward::PodFacts {
        let node = self.ctx.node.borrow();
        crate::downward::PodFacts {
            node_name: self.ctx.node_name.clone(),
            host_ip: self.ctx.host_ip.clone(),
            pod_ips: self.sandbox.as_ref().map(|s| s.ips.clone()).unwrap_or_default(),
            allocatable_millicpu: node.allocatable.millicpu,
            allocatable_memory: node.allocatable.memory,
            allocatable_ephemeral_storage: node.allocatable.ephemeral_storage,
        }
    }

    /// Runs init containers in order; true once every one has completed.
    async fn run_init_containers(&mut self) -> bool {
        let now = Instant::now();
        for i in 0..self.containers.len() {
            if !self.containers[i].init {
                continue;
            }
            match self.containers[i].state.clone() {
                State::Terminated(exit) if exit.exit_code == 0 => continue,
                State::Running { .. } => return false,
                State::Terminated(_) if self.restart_policy() == "Never" => {
                    self.phase = Phase::Failed;
                    self.step = Step::Completed;
                    self.stop_sandbox_of_completed_pod().await;
                    return false;
                }
                State::Terminated(_) => {
                    self.restart_after_backoff(i, now).await;
                    return false;
                }
                State::Waiting { .. } => {
                    self.start_when_due(i, now).await;
                    return false;
                }
            }
        }
        true
    }

    /// Starts, keeps or restarts each container by the restart policy; decides the phase.
    async fn run_containers(&mut self) {
        let now = Instant::now();
        let policy = self.restart_policy().to_owned();
        for i in 0..self.containers.len() {
            if self.containers[i].init {
                continue;
            }
            match self.containers[i].state.clone() {
                State::Running { .. } => {}
                State::Waiting { .. } => self.start_when_due(i, now).await,
                State::Terminated(exit) => {
                    let restart = match policy.as_str() {
                        "Never" => false,
                        "OnFailure" => exit.exit_code != 0,
                        _ => true,
                    };
                    if restart {
                        self.restart_after_backoff(i, now).await;
                    }
                }
            }
        }
        let mains: Vec<&ContainerRecord> = self.containers.iter().filter(|c| !c.init).collect();
        let done = mains.iter().all(|c| {
            c.exit().is_some_and(|e| match policy.as_str() {
                "Never" => true,
                "OnFailure" => e.exit_code == 0,
                _ => false,
            })
        });
        if done && !mains.is_empty() {
            let failed = mains.iter().any(|c| c.exit().is_some_and(|e| e.exit_code != 0));
            self.phase = if failed { Phase::Failed } else { Phase::Succeeded };
            self.step = Step::Completed;
            self.stop_sandbox_of_completed_pod().await;
        } else if mains.iter().any(|c| c.running() || c.exit().is_some() || c.restart_count > 0) {
            self.phase = Phase::Running;
        }
    }

    pub(super) fn namespace(&self) -> &str {
        self.pod.metadata.namespace.as_deref().unwrap_or("default")
    }

    pub(super) fn name(&self) -> &str {
        self.pod.metadata.name.as_deref().unwrap_or("")
    }

    /// A probe's report: events for failures, readiness, restarts on liveness failure.
    async fn on_probe(&mut self, report: ProbeReport) {
        match report {
            ProbeReport::Failed { container, message, .. } => {
                let init = self.containers.iter().any(|c| c.name == container && c.init);
                if self.containers.iter().any(|c| c.name == container && c.running()) {
                    self.event(Some((&container, init)), Kind::Warning, "Unhealthy", message);
                }
            }
            ProbeReport::Changed { container, kind, healthy } => {
                let Some(i) = self.containers.iter().position(|c| c.name == container && c.running()) else {
                    return;
                };
                match kind {
                    ProbeKind::Readiness => self.containers[i].ready = healthy,
                    ProbeKind::Startup if healthy => {
                        self.containers[i].started = true;
                        self.start_probes(i, false);
                    }
                    ProbeKind::Startup | ProbeKind::Liveness => {
                        let what = if kind == ProbeKind::Startup { "startup" } else { "liveness" };
                        let init = self.containers[i].init;
                        self.event(
                            Some((&container, init)),
                            Kind::Normal,
                            "Killing",
                            format!("Container {container} failed {what} probe, will be restarted"),
                        );
                        let grace = self
                            .pod
                            .spec
                            .as_ref()
                            .and_then(|s| s.termination_grace_period_seconds)
                            .unwrap_or(30);
                        self.stop_container(i, grace).await;
                        self.refresh().await;
                    }
                }
            }
        }
    }
}
