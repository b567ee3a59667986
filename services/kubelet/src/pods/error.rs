//! The pod worker's one error policy: a step that fails says why ([`Reason`], which is what
//! the container's waiting state or the pod's event shows), what went wrong, and when to try
//! again ([`Retry`]). `Worker::on_error` applies it — the log line, the event, the waiting
//! state, the back-off and the wake-up — so no step handles its own failure.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use super::worker::Worker;
use crate::events::Kind;

/// Retry a step with no back-off of its own after this long (volumes, sandbox removal,
/// status updates).
pub const RETRY: Duration = Duration::from_secs(5);
/// Retry a container whose image or configuration was wrong after this long.
pub const RETRY_CONTAINER: Duration = Duration::from_secs(10);

/// Why a step failed, as Kubernetes names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The volumes could not be set up.
    FailedMount,
    /// The sandbox could not be made.
    FailedCreatePodSandBox,
    /// A sandbox could not be stopped or removed.
    SandboxNotRemoved,
    /// The image reference is not one.
    InvalidImageName,
    /// The image is absent and the policy forbids pulling it.
    ErrImageNeverPull,
    /// Pulling the image failed.
    ErrImagePull,
    /// The container's configuration could not be made (env, mounts, runAsNonRoot).
    CreateContainerConfigError,
    /// The runtime refused to create the container.
    CreateContainerError,
    /// The runtime refused to start the container.
    RunContainerError,
    /// The postStart hook failed; the container was stopped.
    FailedPostStartHook,
    /// The pod object could not be deleted at the end.
    FinalDeleteFailed,
}

impl Reason {
    /// The name Kubernetes shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailedMount => "FailedMount",
            Self::FailedCreatePodSandBox => "FailedCreatePodSandBox",
            Self::SandboxNotRemoved => "SandboxNotRemoved",
            Self::InvalidImageName => "InvalidImageName",
            Self::ErrImageNeverPull => "ErrImageNeverPull",
            Self::ErrImagePull => "ErrImagePull",
            Self::CreateContainerConfigError => "CreateContainerConfigError",
            Self::CreateContainerError => "CreateContainerError",
            Self::RunContainerError => "RunContainerError",
            Self::FailedPostStartHook => "FailedPostStartHook",
            Self::FinalDeleteFailed => "FinalDeleteFailed",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When a failed step is tried again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// After this long.
    After(Duration),
    /// After the step's own back-off (the sandbox's, the image's or the container's restart
    /// back-off, by the reason), which the failure advances.
    BackOff,
    /// When something changes (the runtime's next event about the container).
    OnChange,
}

/// A failed step of a pod's worker.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {message}")]
pub struct StepError {
    /// Why.
    pub reason: Reason,
    /// What went wrong, for a person.
    pub message: String,
    /// When to try again.
    pub retry: Retry,
}

impl StepError {
    /// A failure of `reason`, tried again as `retry` says.
    pub fn new(reason: Reason, message: impl Into<String>, retry: Retry) -> Self {
        Self { reason, message: message.into(), retry }
    }
}

impl Worker {
    /// The error policy: what a failed step shows (log, event, the container's waiting state,
    /// the pod's message) and when it is tried again.
    pub(super) fn on_error(&mut self, container: Option<usize>, error: StepError) {
        let StepError { reason, message, retry } = error;
        let now = Instant::now();
        let name = container.and_then(|i| self.state.containers.get(i)).map(|c| (c.name.clone(), c.init));
        let who = name.as_ref().map(|(n, init)| (n.as_str(), *init));
        tracing::warn!(pod = %self.key, container = ?who.map(|w| w.0), %reason, %message, "pod step failed");
        match (reason, container) {
            (Reason::FailedMount | Reason::FailedCreatePodSandBox, _) => {
                self.event(None, Kind::Warning, reason.as_str(), message.clone());
                self.state.message = message;
            }
            (Reason::SandboxNotRemoved | Reason::FinalDeleteFailed, _) => {}
            (Reason::ErrImagePull, Some(i)) => self.image_pull_failed(i, &message),
            (Reason::InvalidImageName | Reason::ErrImageNeverPull, Some(i)) => {
                self.state.containers[i].wait(reason.as_str(), message);
                self.event(who, Kind::Warning, "Failed", format!("Error: {reason}"));
            }
            (Reason::CreateContainerConfigError | Reason::CreateContainerError, Some(i)) => {
                self.state.containers[i].wait(reason.as_str(), message.clone());
                self.event(who, Kind::Warning, "Failed", format!("Error: {message}"));
                if reason == Reason::CreateContainerConfigError {
                    self.state.message = message;
                }
            }
            (Reason::RunContainerError, Some(i)) => {
                self.event(who, Kind::Warning, "Failed", format!("Error: {message}"));
                if self.state.containers[i].exit().is_none() {
                    self.state.containers[i].wait(reason.as_str(), message);
                }
            }
            (Reason::FailedPostStartHook, _) => self.event(who, Kind::Warning, reason.as_str(), message),
            (_, None) => self.state.message = message,
        }
        match retry {
            Retry::After(delay) => self.wake_at(now + delay),
            Retry::OnChange => {}
            Retry::BackOff => {
                let backoff = match (reason, container) {
                    (Reason::FailedCreatePodSandBox, _) => Some(&mut self.state.sandbox_backoff),
                    (Reason::ErrImagePull, Some(i)) => Some(&mut self.state.containers[i].pull_backoff),
                    (_, Some(i)) => Some(&mut self.state.containers[i].restart_backoff),
                    (_, None) => None,
                };
                let until = backoff.and_then(|b| {
                    b.fail(now);
                    b.until()
                });
                self.wake_at(until.unwrap_or(now + RETRY));
            }
        }
    }

    /// ErrImagePull the first time, ImagePullBackOff while its back-off lasts.
    fn image_pull_failed(&mut self, i: usize, message: &str) {
        let (name, init) = (self.state.containers[i].name.clone(), self.state.containers[i].init);
        let who = Some((name.as_str(), init));
        let image = self.state.containers[i].image.clone();
        let first = self.state.containers[i].pull_backoff.delay().is_zero();
        let (reason, shown) = if first {
            ("ErrImagePull", message.to_owned())
        } else {
            ("ImagePullBackOff", format!("Back-off pulling image {image:?}: {message}"))
        };
        self.state.containers[i].wait(reason, shown);
        self.event(who, Kind::Warning, "Failed", format!("Failed to pull image {image:?}: {message}"));
        if !first {
            self.event(who, Kind::Normal, "BackOff", format!("Back-off pulling image {image:?}"));
        }
    }
}
