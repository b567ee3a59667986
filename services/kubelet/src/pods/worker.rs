//! One pod's worker: it keeps the pod's [`PodState`], asks [`plan`] what to do whenever
//! something changes (the pod's spec from the watch, the runtime's container events, the
//! probes, a timer), carries the actions out, then reports the status if it changed. Failed
//! steps go through one policy (`Worker::on_error`, `error.rs`).
//!
//! ```text
//! Admitting → PreparingVolumes → CreatingSandbox → Initializing (init containers in order)
//!           → Running (containers, restarts by restartPolicy with back-off) → Completed
//! any state → Terminating (preStop, SIGTERM, SIGKILL after the grace period) → Terminated
//! ```

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::error::{Reason, Retry, StepError};
use super::plan::{self, Action, PodState};
use super::status::Phase;
use super::{Adopted, Context, admission, key, lock};
use crate::events::Kind;
use crate::probes::{ProbeKind, ProbeReport};
use crate::volumes::PodVolumes;

pub use super::plan::Step;

/// The most rounds of planning one wake-up takes (each round's steps make progress; this only
/// bounds a mistake).
const MAX_ROUNDS: usize = 16;

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
    /// The node turned Ready (`true`) or NotReady: the pod's Ready condition follows it.
    Node(bool),
    /// The eviction manager chose the pod; the message says why.
    Evict(String),
}

/// One pod's worker.
pub struct Worker {
    pub(super) ctx: Arc<Context>,
    pub(super) pod: Arc<Pod>,
    pub(super) uid: String,
    pub(super) key: String,
    /// What `plan` decides from.
    pub(super) state: PodState,
    pub(super) volumes: Option<PodVolumes>,
    pub(super) probes: std::collections::HashMap<String, CancellationToken>,
    pub(super) probe_tx: mpsc::Sender<ProbeReport>,
    pub(super) wake: Option<Instant>,
    pub(super) reported: Option<serde_json::Value>,
    pub(super) last_conditions: Vec<k8s_openapi::api::core::v1::PodCondition>,
    /// The containers' states are to be read from the runtime again (once, however many
    /// `Msg::Runtime` came).
    stale: bool,
}

/// What an executed action lets the worker do next in this wake-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Flow {
    /// Nothing changes (a timer was set).
    Idle,
    /// Containers were started or restarted: decide the phase on what they became.
    Settle,
    /// The state moved on: plan again.
    Replan,
    /// Wait for the next wake-up.
    Stop,
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
        if worker.state.step == Step::Terminated {
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
        if std::mem::take(&mut worker.stale) {
            worker.refresh().await;
        }
    }
    worker.stop_probes();
}

impl Worker {
    fn new(ctx: Arc<Context>, pod: Arc<Pod>, probe_tx: mpsc::Sender<ProbeReport>) -> Self {
        Self {
            key: key(&pod),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            state: PodState::new(&pod),
            ctx,
            pod,
            volumes: None,
            probes: std::collections::HashMap::new(),
            probe_tx,
            wake: None,
            reported: None,
            last_conditions: Vec::new(),
            stale: false,
        }
    }

    /// The spec of container `name` (an ephemeral one's as a container: the same fields but
    /// `targetContainerName`).
    pub(super) fn spec_of(&self, name: &str, init: bool) -> Option<Container> {
        let spec = self.pod.spec.as_ref()?;
        if init {
            return spec.init_containers.iter().flatten().find(|c| c.name == name).cloned();
        }
        if let Some(c) = spec.containers.iter().find(|c| c.name == name) {
            return Some(c.clone());
        }
        let ephemeral = spec.ephemeral_containers.iter().flatten().find(|c| c.name == name)?;
        let mut value = serde_json::to_value(ephemeral).ok()?;
        if let Some(fields) = value.as_object_mut() {
            fields.remove("targetContainerName");
        }
        serde_json::from_value(value).ok()
    }

    /// Wakes the worker at `at` at the latest.
    pub(super) fn wake_at(&mut self, at: Instant) {
        self.wake = Some(self.wake.map_or(at, |w| w.min(at)));
    }

    /// An event about the pod or one of its containers.
    pub(super) fn event(&self, container: Option<(&str, bool)>, kind: Kind, reason: &str, note: String) {
        let field_path = container.map(|(name, init)| {
            let ephemeral = self.state.containers.iter().any(|c| c.name == name && c.ephemeral);
            let list = match (init, ephemeral) {
                (true, _) => "initContainers",
                (false, true) => "ephemeralContainers",
                (false, false) => "containers",
            };
            format!("spec.{list}{{{name}}}")
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
                self.state.add_ephemeral(&pod);
                self.pod = pod;
            }
            Msg::Deleted => self.state.deleted = true,
            Msg::Runtime => self.stale = true,
            // Said at once, before any runtime call: a runtime that stopped answering (the
            // link to a remote one is cut) makes the node NotReady, and calls to it wait for
            // their connection attempts, queued behind every other caller's.
            Msg::Node(false) => self.report().await,
            // Whatever happened while the runtime could not be asked.
            Msg::Node(true) => self.stale = true,
            Msg::Evict(message) => {
                if !self.state.phase.terminal() {
                    self.state.evicted.get_or_insert(message);
                }
            }
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
        condition_differs || status.phase.as_deref() != Some(self.state.phase.as_str())
    }

    /// Plans and carries out the pod's next steps until it must wait for something.
    async fn sync(&mut self) {
        self.wake = None;
        if self.state.admitted {
            // An adopted pod whose status never reached the API.
            self.state.start_now();
            if !self.state.phase.terminal()
                && !self.state.deleted
                && self.pod.metadata.deletion_timestamp.is_none()
            {
                self.resize().await;
            }
        }
        for _ in 0..MAX_ROUNDS {
            let actions = plan::plan(&self.pod, &self.state, Instant::now());
            let mut flow = Flow::Idle;
            for action in actions {
                flow = flow.max(self.step(action).await);
            }
            match flow {
                Flow::Replan => continue,
                Flow::Settle => {
                    // The phase follows what the containers just became, as one step.
                    let policy = plan::restart_policy(&self.pod);
                    if let Some(action) = plan::settle(&self.state, policy) {
                        self.step(action).await;
                    }
                    return;
                }
                Flow::Idle | Flow::Stop => return,
            }
        }
        tracing::warn!(pod = %self.key, "the pod's steps did not settle; trying again later");
        self.wake_at(Instant::now() + super::error::RETRY);
    }

    /// Carries out one action in its span, logging its outcome and latency.
    async fn step(&mut self, action: Action) -> Flow {
        if let Action::WakeAt(at) = action {
            self.wake_at(at);
            return Flow::Idle;
        }
        if let Action::Enter(step) = action {
            self.state.step = step;
            return Flow::Idle;
        }
        let span = tracing::info_span!("pod_step", pod = %self.key, action = ?action);
        let started = Instant::now();
        let result = self.execute(action).instrument(span.clone()).await;
        let took_ms = started.elapsed().as_millis();
        span.in_scope(|| match &result {
            Ok(flow) => tracing::debug!(outcome = ?flow, took_ms, "pod step done"),
            Err((_, error)) => {
                tracing::debug!(outcome = "failed", reason = %error.reason, took_ms, "pod step done")
            }
        });
        match result {
            Ok(flow) => flow,
            Err((container, error)) => {
                self.on_error(container, error);
                // The other containers went on; the phase follows them.
                // A sidecar that failed waits for its retry like any init container.
                container.map_or(Flow::Stop, |i| match self.after_container(i) {
                    Flow::Replan => Flow::Stop,
                    flow => flow,
                })
            }
        }
    }

    /// Carries out `action`; a failure names the container it concerns, if one.
    async fn execute(&mut self, action: Action) -> Result<Flow, (Option<usize>, StepError)> {
        let on = |i: usize| move |e: StepError| (Some(i), e);
        let pod_wide = |e: StepError| (None, e);
        match action {
            Action::Terminate { grace } => {
                self.terminate(grace).await.map_err(pod_wide)?;
                Ok(Flow::Stop)
            }
            Action::Complete { phase } => {
                if let Some(phase) = phase {
                    self.state.phase = phase;
                }
                self.state.step = Step::Completed;
                // Sidecars still run when the containers are done: they stop gracefully first.
                if self.state.containers.iter().any(|c| c.running()) {
                    self.stop_all(plan::termination_grace(&self.pod, false)).await;
                }
                self.stop_sandbox_of_completed_pod().await.map_err(pod_wide)?;
                Ok(Flow::Stop)
            }
            Action::DeadlineExceeded { grace } => {
                self.deadline_exceeded(grace).await.map_err(pod_wide)?;
                Ok(Flow::Stop)
            }
            Action::Evict { grace } => {
                self.evict(grace).await.map_err(pod_wide)?;
                Ok(Flow::Stop)
            }
            Action::Admit => Ok(if self.admit() { Flow::Replan } else { Flow::Stop }),
            Action::PrepareVolumes => {
                self.prepare_volumes().await.map_err(pod_wide)?;
                Ok(Flow::Replan)
            }
            Action::RefreshVolumes => {
                self.refresh_volumes().await;
                Ok(Flow::Replan)
            }
            Action::ReplaceSandbox => {
                self.replace_dead_sandbox().await.map_err(pod_wide)?;
                Ok(Flow::Replan)
            }
            Action::CreateSandbox => {
                self.create_sandbox().await.map_err(pod_wide)?;
                Ok(Flow::Replan)
            }
            Action::InitDone => {
                self.state.initialized = true;
                Ok(Flow::Replan)
            }
            Action::Start(i) => {
                self.start_container(i).await.map_err(on(i))?;
                Ok(self.after_container(i))
            }
            Action::Restart { index, reset_backoff } => {
                self.restart(index, reset_backoff);
                self.start_container(index).await.map_err(on(index))?;
                Ok(self.after_container(index))
            }
            Action::BackOff { index, delay } => {
                self.back_off(index, delay);
                Ok(self.after_container(index))
            }
            Action::Kill { index, probe, grace } => {
                self.kill(index, probe, grace).await;
                Ok(Flow::Replan)
            }
            Action::Running => {
                self.state.phase = Phase::Running;
                Ok(Flow::Idle)
            }
            Action::WakeAt(at) => {
                self.wake_at(at);
                Ok(Flow::Idle)
            }
            Action::Enter(step) => {
                self.state.step = step;
                Ok(Flow::Idle)
            }
        }
    }

    /// An init container runs alone: after one, wait. The containers settle the phase.
    /// A sidecar does not: the next init container may start once it has.
    fn after_container(&self, i: usize) -> Flow {
        match self.state.containers.get(i) {
            Some(c) if c.sidecar => Flow::Replan,
            Some(c) if c.init => Flow::Stop,
            _ => Flow::Settle,
        }
    }

    /// Admission: the pod's requests against what the node has left.
    /// An in-place resize (`kubectl patch --subresource resize`): when the spec's CPU or
    /// memory of a container differs from what it was given, the node's admission is asked
    /// again for the pod's new requests. If they fit, each container is given its new
    /// resources (status.containerStatuses[].resources) and the runtime is asked to apply them
    /// to the running ones (CRI UpdateContainerResources); where it cannot — no cgroup is
    /// delegated, so limits are not enforced — a Warning event `ResizeNotEnforced` says so with
    /// the runtime's reason. If they do not fit, nothing changes and `PodResizePending` says
    /// why (Infeasible: more than the node has; Deferred: not beside the other pods now); it
    /// is tried again on the next change or sync.
    async fn resize(&mut self) {
        let spec = self.pod.spec.clone().unwrap_or_default();
        let wanted: Vec<(String, k8s_openapi::api::core::v1::ResourceRequirements)> = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .map(|c| (c.name.clone(), plan::cpu_and_memory(c.resources.as_ref())))
            .collect();
        let changed: Vec<usize> = self
            .state
            .containers
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.ephemeral)
            .filter(|(_, r)| wanted.iter().any(|(n, w)| *n == r.name && r.resources.as_ref() != Some(w)))
            .map(|(i, _)| i)
            .collect();
        if changed.is_empty() {
            self.state.resize_pending = None;
            return;
        }
        let verdict = admission::requests(&self.pod)
            .map_err(|e| ("Infeasible".to_owned(), e.to_string()))
            .and_then(|req| {
                let alloc = self.allocatable();
                lock(&self.ctx.admitted).resize(&self.uid, req, alloc).map_err(|r| (r.reason, r.message))
            });
        if let Err(pending) = verdict {
            if self.state.resize_pending.as_ref() != Some(&pending) {
                tracing::info!(pod = %self.key, reason = %pending.0, message = %pending.1, "resize pending");
            }
            self.state.resize_pending = Some(pending);
            return;
        }
        self.state.resize_pending = None;
        let mut not_enforced = None;
        for i in changed {
            let name = self.state.containers[i].name.clone();
            let Some((_, want)) = wanted.iter().find(|(n, _)| *n == name) else { continue };
            self.state.containers[i].resources = Some(want.clone());
            let (Some(id), true) = (self.state.containers[i].id.clone(), self.state.containers[i].running())
            else {
                continue;
            };
            let Some(container) =
                spec.init_containers.iter().flatten().chain(&spec.containers).find(|c| c.name == name)
            else {
                continue;
            };
            let linux = crate::cri_config::linux_resources(container).ok();
            let applied = self
                .ctx
                .cri
                .runtime
                .clone()
                .update_container_resources(k8s_cri::v1::UpdateContainerResourcesRequest {
                    container_id: id,
                    linux,
                    ..Default::default()
                })
                .await;
            if let Err(e) = applied {
                not_enforced.get_or_insert_with(|| e.message().to_owned());
            }
        }
        tracing::info!(pod = %self.key, "resized");
        if let Some(why) = not_enforced {
            self.event(
                None,
                Kind::Warning,
                "ResizeNotEnforced",
                format!("the pod's new resources are recorded, but this node cannot apply them to its containers: {why}"),
            );
        }
    }

    /// What the node gives pods now, as admission counts it.
    fn allocatable(&self) -> admission::Allocatable {
        let node = self.ctx.node.borrow();
        admission::Allocatable {
            millicpu: node.allocatable.millicpu,
            memory: node.allocatable.memory,
            gpus: node.allocatable.gpus,
            pods: node.allocatable.pods,
        }
    }

    fn admit(&mut self) -> bool {
        self.state.step = Step::Admitting;
        let verdict = admission::check_pod(&self.pod, &self.ctx.allowed_unsafe_sysctls)
            .map_err(|r| (r.reason, r.message))
            .and_then(|()| {
                admission::requests(&self.pod)
                    .map_err(|e| ("UnexpectedAdmissionError".to_owned(), format!("Pod was rejected: {e}")))
            })
            .and_then(|req| {
                let alloc = self.allocatable();
                lock(&self.ctx.admitted)
                    .admit_with_ports(&self.uid, req, admission::host_ports(&self.pod), alloc)
                    .map_err(|r| (r.reason, r.message))
            });
        match verdict {
            Ok(()) => {
                self.state.admitted = true;
                self.state.start_now();
                true
            }
            Err((reason, message)) => {
                tracing::warn!(pod = %self.key, %reason, %message, "pod rejected");
                self.event(None, Kind::Warning, &reason, message.clone());
                self.state.phase = Phase::Failed;
                self.state.step = Step::Completed;
                self.state.message.clone_from(&message);
                self.state.reason = Some((reason, message));
                self.state.rejected = true;
                false
            }
        }
    }

    /// Sets the volumes up.
    async fn prepare_volumes(&mut self) -> Result<(), StepError> {
        self.state.step = Step::PreparingVolumes;
        let ctx = self.volume_context();
        let dir = self.ctx.pod_dir(&self.uid);
        let volumes =
            PodVolumes::prepare(&self.pod, &dir, &ctx, &self.ctx.objects).await.map_err(|error| {
                StepError::new(
                    Reason::FailedMount,
                    crate::node::error_chain(&error),
                    Retry::After(super::error::RETRY),
                )
            })?;
        for limit in volumes.unenforced() {
            self.event(None, Kind::Normal, "LimitNotEnforced", limit);
        }
        self.volumes = Some(volumes);
        self.state.volumes_refreshed = Some(Instant::now());
        Ok(())
    }

    /// Re-reads the volumes' sources (a failure keeps what they hold and is tried next time).
    async fn refresh_volumes(&mut self) {
        self.state.volumes_refreshed = Some(Instant::now());
        let ctx = self.volume_context();
        if let Some(volumes) = self.volumes.as_mut()
            && let Err(error) = volumes.refresh(&self.pod, &ctx, &self.ctx.objects).await
        {
            tracing::warn!(pod = %self.key, %error, "volume refresh failed");
        }
    }

    pub(super) fn volume_context(&self) -> crate::volumes::VolumeContext {
        crate::volumes::VolumeContext {
            facts: self.facts(),
            ids: self.ctx.ids.clone(),
            host_paths: self.ctx.host_paths.clone(),
        }
    }

    /// What the downward API tells about this pod.
    pub(super) fn facts(&self) -> crate::downward::PodFacts {
        let node = self.ctx.node.borrow();
        crate::downward::PodFacts {
            node_name: self.ctx.node_name.clone(),
            host_ip: self.ctx.host_ip.clone(),
            pod_ips: self.state.sandbox.as_ref().map(|s| s.ips.clone()).unwrap_or_default(),
            allocatable_millicpu: node.allocatable.millicpu,
            allocatable_memory: node.allocatable.memory,
            allocatable_ephemeral_storage: node.allocatable.ephemeral_storage,
        }
    }

    pub(super) fn namespace(&self) -> &str {
        self.pod.metadata.namespace.as_deref().unwrap_or("default")
    }

    pub(super) fn name(&self) -> &str {
        self.pod.metadata.name.as_deref().unwrap_or("")
    }

    /// A probe's report: events for failures, readiness; a liveness or startup failure is
    /// recorded for `plan`, which kills the container.
    async fn on_probe(&mut self, report: ProbeReport) {
        match report {
            ProbeReport::Failed { container, message, .. } => {
                self.probe_event(&container, "Unhealthy", message)
            }
            ProbeReport::Warned { container, message, .. } => {
                self.probe_event(&container, "ProbeWarning", message);
            }
            ProbeReport::Changed { container, kind, healthy } => {
                let Some(i) = self.state.containers.iter().position(|c| c.name == container && c.running())
                else {
                    return;
                };
                match kind {
                    ProbeKind::Readiness => self.state.containers[i].ready = healthy,
                    ProbeKind::Startup if healthy => {
                        self.state.containers[i].started = true;
                        self.start_probes(i, false);
                    }
                    ProbeKind::Startup | ProbeKind::Liveness => {
                        self.state.containers[i].failed_probe = Some(kind)
                    }
                }
            }
        }
    }

    /// A Warning event `reason` about a probe of `container`, while it runs.
    fn probe_event(&self, container: &str, reason: &str, message: String) {
        let containers = &self.state.containers;
        let init = containers.iter().any(|c| c.name == container && c.init);
        if containers.iter().any(|c| c.name == container && c.running()) {
            self.event(Some((container, init)), Kind::Warning, reason, message);
        }
    }

    /// Kills container `i` after its `probe` failed; the restart policy decides what follows.
    async fn kill(&mut self, i: usize, probe: ProbeKind, grace: i64) {
        let (name, init) = (self.state.containers[i].name.clone(), self.state.containers[i].init);
        self.state.containers[i].failed_probe = None;
        let what = if probe == ProbeKind::Startup { "startup" } else { "liveness" };
        self.event(
            Some((&name, init)),
            Kind::Normal,
            "Killing",
            format!("Container {name} failed {what} probe, will be restarted"),
        );
        self.stop_container(i, grace).await;
        self.refresh().await;
    }
}

#[cfg(test)]
mod tests;
