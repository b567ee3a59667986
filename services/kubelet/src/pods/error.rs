//! The pod worker's one error policy: a step that fails says why ([`Reason`], which is what
//! the container's waiting state or the pod's event shows), what went wrong, and when to try
//! again ([`Retry`]). `Worker::on_error` applies it — the log line, the event, the waiting
//! state, the back-off and the wake-up — so no step handles its own failure.

use std::fmt;
use std::time::Duration;

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
