//! The pod worker's decisions, pure: [`plan`] reads the pod's spec and what the worker knows of
//! its pod ([`PodState`]: the sandbox, each container's record with its back-offs, admission,
//! volumes) and says what to do next. It is level-triggered — the same state gives the same
//! actions, whatever woke the worker — and adoption-safe: a running sandbox or container,
//! whether this kubelet made it or a previous one did, is never made again. The worker
//! (`worker.rs`, `containers.rs`, `terminate.rs`) carries the actions out.

use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use super::backoff::{Backoff, RESET_AFTER};
use super::record::{ContainerRecord, State};
use super::status::Phase;
use crate::probes::ProbeKind;

#[cfg(test)]
mod tests;

/// How often configMap, secret, projected and downwardAPI volumes are re-read.
pub const VOLUME_REFRESH: Duration = Duration::from_secs(20);
/// The grace a pod gets when its API object vanished without one (a force delete).
pub const VANISHED_GRACE: i64 = 2;
/// The grace period when the pod names none.
const DEFAULT_GRACE: i64 = 30;

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
#[derive(Clone, Debug)]
pub struct Sandbox {
    /// The runtime's id.
    pub id: String,
    /// The config it was made with (containers are created against it).
    pub config: cri::PodSandboxConfig,
    /// Its addresses, primary first.
    pub ips: Vec<String>,
    /// Whether it runs.
    pub ready: bool,
}

/// What the worker knows of its pod between wake-ups: everything [`plan`] decides from but
/// the spec. Counters, back-offs and which init container is next live here (and in the
/// container records), not in the worker.
#[derive(Clone, Debug)]
pub struct PodState {
    /// Where the worker is.
    pub step: Step,
    /// The pod's phase.
    pub phase: Phase,
    /// The pod's reason and message when it failed as a whole (rejected at admission).
    pub reason: Option<(String, String)>,
    /// Whether admission took the pod's requests.
    pub admitted: bool,
    /// The API object is gone (deleted with grace 0 by someone else).
    pub deleted: bool,
    /// When the volumes were last read; `None` before they are set up.
    pub volumes_refreshed: Option<Instant>,
    /// The sandbox, once made or adopted.
    pub sandbox: Option<Sandbox>,
    /// The attempt the next sandbox gets.
    pub sandbox_attempt: u32,
    /// The sandbox's creation back-off.
    pub sandbox_backoff: Backoff,
    /// Whether the init containers have all completed (in this sandbox).
    pub initialized: bool,
    /// Init containers in order, then the containers.
    pub containers: Vec<ContainerRecord>,
    /// When the kubelet first took the pod on (status.startTime).
    pub start_time: Option<Timestamp>,
    /// The same moment on the monotonic clock, which `activeDeadlineSeconds` counts from.
    pub started: Option<Instant>,
    /// The pod was rejected at admission: it never had containers.
    pub rejected: bool,
    /// The last problem worth showing (diagnostics).
    pub message: String,
    /// The eviction manager chose the pod: why (the status message and event).
    pub evicted: Option<String>,
    /// A resize the node cannot give now: reason (Infeasible, Deferred) and message.
    pub resize_pending: Option<(String, String)>,
}

impl PodState {
    /// The state of a pod this worker has just been given: its containers not yet created,
    /// restart counts, phase and start time as the API last showed them.
    pub fn new(pod: &Pod) -> Self {
        let spec = pod.spec.clone().unwrap_or_default();
        let record = |c: &k8s_openapi::api::core::v1::Container, init| {
            let mut record = ContainerRecord::new(&c.name, c.image.as_deref().unwrap_or(""), init);
            record.sidecar = init && c.restart_policy.as_deref() == Some("Always");
            record.resources = Some(cpu_and_memory(c.resources.as_ref()));
            record
        };
        let mut containers: Vec<ContainerRecord> =
            spec.init_containers.iter().flatten().map(|c| record(c, true)).collect();
        containers.extend(spec.containers.iter().map(|c| record(c, false)));
        // Restart counts survive a kubelet restart through the API's view.
        if let Some(s) = pod.status.as_ref() {
            for cs in s.init_container_statuses.iter().flatten().chain(s.container_statuses.iter().flatten())
            {
                if let Some(r) = containers.iter_mut().find(|r| r.name == cs.name) {
                    r.restart_count = u32::try_from(cs.restart_count).unwrap_or(0);
                    // What a resize gave it, if the spec has moved on (kubelet restart).
                    if cs.resources.is_some() {
                        r.resources.clone_from(&cs.resources);
                    }
                }
            }
        }
        let phase = match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Succeeded") => Phase::Succeeded,
            Some("Failed") => Phase::Failed,
            _ => Phase::Pending,
        };
        let start_time = pod.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| t.0);
        // A pod the API shows started (a kubelet restart) keeps its age.
        let started = start_time.map(|t| {
            let age = std::time::Duration::try_from(Timestamp::now().duration_since(t)).unwrap_or_default();
            Instant::now().checked_sub(age).unwrap_or_else(Instant::now)
        });
        let mut state = Self {
            step: if phase.terminal() { Step::Completed } else { Step::Admitting },
            phase,
            reason: None,
            admitted: false,
            deleted: false,
            volumes_refreshed: None,
            sandbox: None,
            sandbox_attempt: 0,
            sandbox_backoff: Backoff::default(),
            initialized: spec.init_containers.as_ref().is_none_or(Vec::is_empty),
            containers,
            start_time,
            started,
            rejected: false,
            message: String::new(),
            evicted: None,
            resize_pending: None,
        };
        state.add_ephemeral(pod);
        state
    }

    /// Records the ephemeral containers of `pod` (added by `kubectl debug` while it runs) that
    /// are not yet known; they wait to be started.
    pub fn add_ephemeral(&mut self, pod: &Pod) {
        for c in pod.spec.iter().flat_map(|s| s.ephemeral_containers.iter().flatten()) {
            if !self.containers.iter().any(|r| r.name == c.name) {
                let mut record = ContainerRecord::new(&c.name, c.image.as_deref().unwrap_or(""), false);
                record.ephemeral = true;
                self.containers.push(record);
            }
        }
    }

    /// The kubelet takes the pod on now, unless it did before.
    pub fn start_now(&mut self) {
        if self.start_time.is_none() {
            self.start_time = Some(Timestamp::now());
            self.started = Some(Instant::now());
        }
    }
}

/// One thing for the worker to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Stop everything within `grace` seconds, remove the sandbox and volumes, delete the pod.
    Terminate {
        /// The grace period, seconds.
        grace: i64,
    },
    /// The pod is done: stop its sandbox (its containers stay, for logs), release its
    /// requests, and set its phase when given.
    Complete {
        /// The final phase, when this decides it.
        phase: Option<Phase>,
    },
    /// Check the pod fits the node.
    Admit,
    /// Set the volumes up.
    PrepareVolumes,
    /// Re-read the volumes' sources.
    RefreshVolumes,
    /// Remove a sandbox that stopped underneath the pod, so that a new one is made.
    ReplaceSandbox,
    /// Make the sandbox.
    CreateSandbox,
    /// The pod ran past its `activeDeadlineSeconds`: it fails (DeadlineExceeded), its
    /// containers stopped within `grace`.
    DeadlineExceeded {
        /// The grace period, seconds.
        grace: i64,
    },
    /// The eviction manager chose the pod (the node runs short of memory or disk): it fails
    /// (Evicted), its containers stopped within `grace`.
    Evict {
        /// The grace period, seconds.
        grace: i64,
    },
    /// The worker is at this step now.
    Enter(Step),
    /// Every init container completed.
    InitDone,
    /// Create and start container `i` (its first, or a new one after a back-off wait).
    Start(usize),
    /// Container `i` ended and restarts now; its back-off starts afresh first when it ran long
    /// enough.
    Restart {
        /// The container.
        index: usize,
        /// Forget earlier failures first.
        reset_backoff: bool,
    },
    /// Container `i` ended and must wait `delay` before it restarts (CrashLoopBackOff).
    BackOff {
        /// The container.
        index: usize,
        /// The wait.
        delay: Duration,
    },
    /// Container `i` failed its liveness or startup probe: stop it within `grace`, the restart
    /// policy decides the rest.
    Kill {
        /// The container.
        index: usize,
        /// The probe that failed.
        probe: ProbeKind,
        /// The grace period, seconds.
        grace: i64,
    },
    /// The pod runs (a container runs, ran or restarts).
    Running,
    /// Nothing to do before `at` (a back-off ends, the volumes are due).
    WakeAt(Instant),
}

/// What to do next for `pod` in `state` at `now`, in order.
pub fn plan(pod: &Pod, state: &PodState, now: Instant) -> Vec<Action> {
    if state.deleted || pod.metadata.deletion_timestamp.is_some() {
        return vec![Action::Terminate { grace: termination_grace(pod, state.deleted) }];
    }
    if state.phase.terminal() {
        return vec![Action::Complete { phase: None }];
    }
    if !state.admitted {
        return vec![Action::Admit];
    }
    if state.evicted.is_some() {
        return vec![Action::Evict { grace: EVICTION_GRACE }];
    }
    let mut actions = Vec::new();
    if let Some(deadline) = active_deadline(pod, state) {
        if now >= deadline {
            return vec![Action::DeadlineExceeded { grace: termination_grace(pod, false) }];
        }
        actions.push(Action::WakeAt(deadline));
    }
    match state.volumes_refreshed {
        None => return vec![Action::PrepareVolumes],
        Some(at) if now >= at + VOLUME_REFRESH => return vec![Action::RefreshVolumes],
        Some(at) => actions.push(Action::WakeAt(at + VOLUME_REFRESH)),
    }
    match &state.sandbox {
        Some(sandbox) if sandbox.ready => {}
        Some(_) => {
            actions.push(Action::ReplaceSandbox);
            return actions;
        }
        None if state.sandbox_backoff.waiting(now) => {
            actions.extend(state.sandbox_backoff.until().map(Action::WakeAt));
            return actions;
        }
        None => {
            actions.push(Action::CreateSandbox);
            return actions;
        }
    }
    // Ephemeral containers start as soon as the sandbox runs, during initialization too; once
    // ended they stay so.
    for (index, c) in state.containers.iter().enumerate().filter(|(_, c)| c.ephemeral) {
        if matches!(c.state, State::Waiting { .. }) && c.id.is_none() {
            actions.extend(start_when_due(index, c, now));
        }
    }
    let policy = restart_policy(pod);
    if !state.initialized {
        actions.push(Action::Enter(Step::Initializing));
        let grace = termination_grace(pod, false);
        actions.extend(next_init(pod, state, policy, now, grace));
        return actions;
    }
    actions.push(Action::Enter(Step::Running));
    // Once every container is done, the sidecars are not restarted: the pod completes, and
    // they are stopped with it.
    let settled = settle(state, policy);
    if let Some(complete @ Action::Complete { .. }) = settled {
        actions.push(complete);
        return actions;
    }
    let grace = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(DEFAULT_GRACE);
    for (index, c) in state.containers.iter().enumerate().filter(|(_, c)| c.regular() || c.sidecar) {
        let policy = if c.sidecar { RestartPolicy::Always } else { policy };
        match &c.state {
            State::Running { .. } => {
                if let Some(probe) = c.failed_probe {
                    actions.push(Action::Kill { index, probe, grace: probe_grace(pod, c, probe, grace) });
                }
            }
            State::Waiting { .. } => actions.extend(start_when_due(index, c, now)),
            State::Terminated(exit) if policy.restarts(exit.exit_code) => {
                actions.push(restart_after_backoff(index, c, now));
            }
            State::Terminated(_) => {}
        }
    }
    actions.extend(settled);
    actions
}

/// The pod's restartPolicy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartPolicy {
    /// Always restart.
    Always,
    /// Restart what failed.
    OnFailure,
    /// Never restart.
    Never,
}

impl RestartPolicy {
    /// Whether a container that exited with `code` restarts.
    pub fn restarts(self, code: i32) -> bool {
        match self {
            Self::Always => true,
            Self::OnFailure => code != 0,
            Self::Never => false,
        }
    }
}

/// The pod's restartPolicy (Always when unset or unknown, as the API defaults it).
pub fn restart_policy(pod: &Pod) -> RestartPolicy {
    match pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()) {
        Some("Never") => RestartPolicy::Never,
        Some("OnFailure") => RestartPolicy::OnFailure,
        _ => RestartPolicy::Always,
    }
}

/// When the pod's `activeDeadlineSeconds` (which may change while it runs) runs out, counted
/// from when the kubelet took it on.
pub fn active_deadline(pod: &Pod, state: &PodState) -> Option<Instant> {
    let seconds = pod.spec.as_ref()?.active_deadline_seconds?;
    Some(state.started? + Duration::from_secs(u64::try_from(seconds).unwrap_or(0)))
}

/// The CPU and memory of a container's resources (what a resize changes, and what its status
/// shows, as upstream's).
pub fn cpu_and_memory(
    r: Option<&k8s_openapi::api::core::v1::ResourceRequirements>,
) -> k8s_openapi::api::core::v1::ResourceRequirements {
    let keep = |m: &Option<
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    >| {
        m.as_ref()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| *k == "cpu" || *k == "memory")
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<std::collections::BTreeMap<_, _>>()
            })
            .filter(|m| !m.is_empty())
    };
    k8s_openapi::api::core::v1::ResourceRequirements {
        limits: r.and_then(|r| keep(&r.limits)),
        requests: r.and_then(|r| keep(&r.requests)),
        ..Default::default()
    }
}

/// The grace period of an evicted pod: a hard threshold was crossed, so, as upstream's, the
/// pod is not given its own grace period (one second, preStop hooks not run).
pub const EVICTION_GRACE: i64 = 1;

/// The grace period of a terminating pod: the deletion's, else the spec's, else 30 s; a pod
/// whose object vanished gets [`VANISHED_GRACE`].
pub fn termination_grace(pod: &Pod, vanished: bool) -> i64 {
    if vanished {
        return VANISHED_GRACE;
    }
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
        .unwrap_or(DEFAULT_GRACE)
        .max(0)
}

/// The grace period of a container its failed liveness or startup `probe` kills: the probe's
/// own `terminationGracePeriodSeconds` where it sets one, else the pod's `pod_grace`.
fn probe_grace(pod: &Pod, c: &ContainerRecord, probe: ProbeKind, pod_grace: i64) -> i64 {
    let spec = pod.spec.as_ref();
    let container = if c.init {
        spec.and_then(|s| s.init_containers.as_ref()).and_then(|l| l.iter().find(|x| x.name == c.name))
    } else {
        spec.and_then(|s| s.containers.iter().find(|x| x.name == c.name))
    };
    let probe = container.and_then(|x| match probe {
        ProbeKind::Liveness => x.liveness_probe.as_ref(),
        ProbeKind::Startup => x.startup_probe.as_ref(),
        ProbeKind::Readiness => None,
    });
    probe.and_then(|p| p.termination_grace_period_seconds).map_or(pod_grace, |g| g.max(0))
}

/// The init containers run one at a time, in order: the first that has not completed decides.
/// A sidecar (`restartPolicy: Always`) counts as done once it runs and its startup probe, if
/// any, has passed; it restarts whenever it ends, whatever the pod's policy, and a failed
/// liveness or startup probe kills it (within `grace`) meanwhile.
fn next_init(pod: &Pod, state: &PodState, policy: RestartPolicy, now: Instant, grace: i64) -> Vec<Action> {
    let mut actions = Vec::new();
    for (index, c) in state.containers.iter().enumerate().filter(|(_, c)| c.init) {
        match &c.state {
            State::Running { .. } if c.sidecar => {
                if let Some(probe) = c.failed_probe {
                    actions.push(Action::Kill { index, probe, grace: probe_grace(pod, c, probe, grace) });
                }
                if !c.started {
                    return actions;
                }
            }
            State::Running { .. } => return actions,
            State::Terminated(exit) if !c.sidecar && exit.exit_code == 0 => {}
            // A failed init container under Never fails the pod.
            State::Terminated(_) if !c.sidecar && policy == RestartPolicy::Never => {
                return vec![Action::Complete { phase: Some(Phase::Failed) }];
            }
            State::Terminated(_) => {
                actions.push(restart_after_backoff(index, c, now));
                return actions;
            }
            State::Waiting { .. } => {
                actions.extend(start_when_due(index, c, now));
                return actions;
            }
        }
    }
    actions.push(Action::InitDone);
    actions
}

/// Start container `i` unless its restart or image back-off says wait.
fn start_when_due(index: usize, c: &ContainerRecord, now: Instant) -> Option<Action> {
    if c.restart_backoff.waiting(now) || c.pull_backoff.waiting(now) {
        return [c.restart_backoff.until(), c.pull_backoff.until()]
            .into_iter()
            .flatten()
            .filter(|t| *t > now)
            .min()
            .map(Action::WakeAt);
    }
    Some(Action::Start(index))
}

/// An ended container restarts at once the first time, then after its back-off; one that ran
/// for [`RESET_AFTER`] starts its back-off afresh.
fn restart_after_backoff(index: usize, c: &ContainerRecord, now: Instant) -> Action {
    let ran_long = c.exit().is_some_and(|exit| {
        exit.started_at
            .zip(exit.finished_at)
            .is_some_and(|(s, f)| f.duration_since(s).unsigned_abs() >= RESET_AFTER)
    });
    if !ran_long && c.restart_backoff.waiting(now) {
        return Action::BackOff { index, delay: c.restart_backoff.delay() };
    }
    Action::Restart { index, reset_backoff: ran_long }
}

/// The pod's phase from its containers: done when each has ended and none restarts
/// (Succeeded, or Failed when one failed); Running once one runs, ran or restarted.
pub fn settle(state: &PodState, policy: RestartPolicy) -> Option<Action> {
    let mains: Vec<&ContainerRecord> = state.containers.iter().filter(|c| c.regular()).collect();
    let done = !mains.is_empty()
        && mains.iter().all(|c| {
            c.exit().is_some_and(|e| match policy {
                RestartPolicy::Never => true,
                RestartPolicy::OnFailure => e.exit_code == 0,
                RestartPolicy::Always => false,
            })
        });
    if done {
        let failed = mains.iter().any(|c| c.exit().is_some_and(|e| e.exit_code != 0));
        return Some(Action::Complete { phase: Some(if failed { Phase::Failed } else { Phase::Succeeded }) });
    }
    mains.iter().any(|c| c.running() || c.exit().is_some() || c.restart_count > 0).then_some(Action::Running)
}

/// Whether a pod adopted from a previous kubelet is past its init containers: each completed
/// (a sidecar: runs), or a container of the pod already exists (the runtime may have dropped
/// the init ones).
pub fn adopted_initialized(containers: &[ContainerRecord]) -> bool {
    let inits_done = containers
        .iter()
        .filter(|c| c.init)
        .all(|c| if c.sidecar { c.running() } else { c.exit().is_some_and(|e| e.exit_code == 0) });
    inits_done || containers.iter().any(|c| c.regular() && c.id.is_some())
}
