//! What the kubelet knows of each of a pod's containers: the runtime's current container, its
//! state as Kubernetes reports it, the previous termination, restarts, probes and back-offs.

use k8s_cri::v1 as cri;
use k8s_openapi::jiff::Timestamp;

use super::backoff::Backoff;

/// How a container ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exit {
    /// Its exit code (137 for SIGKILL, …).
    pub exit_code: i32,
    /// Completed, Error, OOMKilled, ContainerCannotRun…
    pub reason: String,
    /// Details, when the runtime gave any.
    pub message: String,
    /// When it started, if it did.
    pub started_at: Option<Timestamp>,
    /// When it ended.
    pub finished_at: Option<Timestamp>,
    /// The runtime's id of the container that ended.
    pub container_id: String,
}

/// A container's state as Kubernetes shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Not running: ContainerCreating, PodInitializing, ErrImagePull, ImagePullBackOff,
    /// CrashLoopBackOff, CreateContainerConfigError, CreateContainerError…
    Waiting {
        /// The reason.
        reason: String,
        /// What went wrong, for a person.
        message: String,
    },
    /// Running since.
    Running {
        /// When it started.
        started_at: Timestamp,
    },
    /// Ended.
    Terminated(Exit),
}

/// One container of a pod (init or main).
#[derive(Clone, Debug)]
pub struct ContainerRecord {
    /// Its name in the spec.
    pub name: String,
    /// The resources it was given (its spec's at admission, a resize's since): what
    /// `status.containerStatuses[].resources` shows.
    pub resources: Option<k8s_openapi::api::core::v1::ResourceRequirements>,
    /// An init container.
    pub init: bool,
    /// An init container with `restartPolicy: Always` (a native sidecar): it runs beside the
    /// containers, restarts whenever it ends, and stops after them.
    pub sidecar: bool,
    /// An ephemeral container (`kubectl debug`): started once, never restarted, no part of
    /// the pod's readiness or phase.
    pub ephemeral: bool,
    /// The image as the spec names it.
    pub image: String,
    /// The image's id once pulled (`sha256:…` or repo digest).
    pub image_id: String,
    /// The runtime's current container, if one exists.
    pub id: Option<String>,
    /// The CRI attempt of the current container (0 for the first).
    pub attempt: u32,
    /// The container before the current one, kept for its logs.
    pub previous_id: Option<String>,
    /// Restarts so far.
    pub restart_count: u32,
    /// Current state.
    pub state: State,
    /// The previous termination.
    pub last: Option<Exit>,
    /// Readiness (false until a readiness probe succeeds, true while running without one).
    pub ready: bool,
    /// Whether the startup probe passed (true without one).
    pub started: bool,
    /// Restart back-off.
    pub restart_backoff: Backoff,
    /// Image-pull back-off.
    pub pull_backoff: Backoff,
    /// The liveness or startup probe that failed while it runs: the worker kills it.
    pub failed_probe: Option<crate::probes::ProbeKind>,
}

impl ContainerRecord {
    /// A container not yet created.
    pub fn new(name: &str, image: &str, init: bool) -> Self {
        Self {
            name: name.to_owned(),
            resources: None,
            init,
            sidecar: false,
            ephemeral: false,
            image: image.to_owned(),
            image_id: String::new(),
            id: None,
            attempt: 0,
            previous_id: None,
            restart_count: 0,
            state: State::Waiting {
                reason: if init { "PodInitializing" } else { "ContainerCreating" }.into(),
                message: String::new(),
            },
            last: None,
            ready: false,
            started: false,
            restart_backoff: Backoff::default(),
            pull_backoff: Backoff::default(),
            failed_probe: None,
        }
    }

    /// A regular container of the pod: neither init nor ephemeral.
    pub fn regular(&self) -> bool {
        !self.init && !self.ephemeral
    }

    /// The attempt the next container gets: 0 for the first, then one more than any before.
    pub fn next_attempt(&self) -> u32 {
        if self.id.is_some() { self.attempt.max(self.restart_count) + 1 } else { self.restart_count }
    }

    /// Records `id` (attempt `attempt`) as the current container; a restart counts when it
    /// replaces one. Returns the container now two generations old, for removal.
    pub fn replace_container(&mut self, id: &str, attempt: u32) -> Option<String> {
        let older = match self.id.replace(id.to_owned()) {
            Some(previous) => {
                self.restart_count = attempt;
                self.previous_id.replace(previous)
            }
            None => None,
        };
        self.attempt = attempt;
        older
    }

    /// Whether Kubernetes shows it ready: running, its startup probe passed (a container is
    /// never ready before it started), and its readiness probe, if any, passing.
    pub fn is_ready(&self) -> bool {
        self.ready && self.started && self.running()
    }

    /// Whether it runs now.
    pub fn running(&self) -> bool {
        matches!(self.state, State::Running { .. })
    }

    /// Its exit, if it ended.
    pub fn exit(&self) -> Option<&Exit> {
        match &self.state {
            State::Terminated(exit) => Some(exit),
            _ => None,
        }
    }

    /// Sets a waiting reason (keeps the runtime container, if any, for status).
    pub fn wait(&mut self, reason: &str, message: impl Into<String>) {
        self.state = State::Waiting { reason: reason.to_owned(), message: message.into() };
        self.ready = false;
    }

    /// Applies the runtime's view of the current container.
    pub fn apply(&mut self, status: &cri::ContainerStatus) {
        let at =
            |nanos: i64| (nanos > 0).then(|| Timestamp::from_nanosecond(i128::from(nanos)).ok()).flatten();
        match cri::ContainerState::try_from(status.state) {
            Ok(cri::ContainerState::ContainerRunning) if !self.running() => {
                self.state =
                    State::Running { started_at: at(status.started_at).unwrap_or_else(Timestamp::now) };
            }
            Ok(cri::ContainerState::ContainerExited) => {
                // The runtime says "Error: <details>" where it has details.
                let (reason, detail) = match status.reason.split_once(": ") {
                    Some((r, d)) => (r.to_owned(), d.to_owned()),
                    None => (status.reason.clone(), String::new()),
                };
                let reason = if reason.is_empty() {
                    if status.exit_code == 0 { "Completed".into() } else { "Error".into() }
                } else {
                    reason
                };
                let message = if status.message.is_empty() { detail } else { status.message.clone() };
                self.state = State::Terminated(Exit {
                    exit_code: status.exit_code,
                    reason,
                    message,
                    started_at: at(status.started_at),
                    finished_at: at(status.finished_at),
                    container_id: status.id.clone(),
                });
                self.ready = false;
            }
            _ => {}
        }
        if !status.image_ref.is_empty() {
            self.image_id = status.image_ref.clone();
        }
    }
}
