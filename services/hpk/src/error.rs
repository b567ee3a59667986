//! One error type for the command, the launcher and the supervisor. Every variant says what
//! failed and, where the user can act, how to fix it.

use std::path::PathBuf;

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or system call failed.
    #[error("{action} {what}: {source}")]
    Io {
        /// What was being done ("create", "bind", …).
        action: &'static str,
        /// On what.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The machine lacks something the bubbles need; `fix` says how to get it.
    #[error("{what}\n  fix: {fix}")]
    Prerequisite {
        /// What is missing or refused.
        what: String,
        /// How to fix it.
        fix: String,
    },
    /// A flag or file has a value we cannot use.
    #[error("{0}")]
    Invalid(String),
    /// The image is missing, unreadable or corrupt.
    #[error("image {path}: {reason}")]
    Image {
        /// The image's path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Something did not become ready within its bound.
    #[error("{what} not ready after {seconds} s: {detail}")]
    NotReady {
        /// What was waited for.
        what: String,
        /// The bound.
        seconds: u64,
        /// The last observation.
        detail: String,
    },
    /// A process we started failed.
    #[error("{what} failed: {detail}")]
    Failed {
        /// Which process or step.
        what: String,
        /// Its exit status and log tail.
        detail: String,
    },
    /// An image registry could not be reached, or refused what was asked.
    #[error("registry {registry}: {detail}")]
    Registry {
        /// The registry (`host[:port]`).
        registry: String,
        /// What happened, and what was or was not changed there.
        detail: String,
    },
    /// The certificates could not be made.
    #[error("certificates: {0}")]
    Certificate(#[from] rcgen::Error),
    /// The Kubernetes API answered with an error.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl From<hpk_cluster::Error> for Error {
    fn from(e: hpk_cluster::Error) -> Self {
        match e {
            hpk_cluster::Error::Io { action, what, source } => Self::Io { action, what, source },
            hpk_cluster::Error::Invalid(why) => Self::Invalid(why),
            hpk_cluster::Error::Certificate(e) => Self::Certificate(e),
        }
    }
}

impl Error {
    /// An [`Error::Io`].
    pub fn io(action: &'static str, what: impl std::fmt::Display, source: std::io::Error) -> Self {
        Self::Io { action, what: what.to_string(), source }
    }

    /// The process exit code: 78 (configuration) for bad input and missing prerequisites, 69
    /// (unavailable) when a component did not come up, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Prerequisite { .. } | Self::Invalid(_) | Self::Image { .. } => 78,
            Self::NotReady { .. } | Self::Failed { .. } | Self::Registry { .. } => 69,
            _ => 1,
        }
    }
}
