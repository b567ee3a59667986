//! The crate's error type and its mapping to gRPC status codes and exit codes.

use std::path::PathBuf;

/// Everything that can go wrong in the net-forwarder.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request or flag is malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// The sandbox or namespace asked about does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The sandbox is already attached.
    #[error("sandbox {0} is already attached")]
    AlreadyExists(String),
    /// Every address of the pod CIDR is allocated.
    #[error("pod CIDR {cidr} is exhausted: all {capacity} pod addresses are allocated")]
    Exhausted {
        /// The node's pod CIDR.
        cidr: String,
        /// How many pod addresses it holds.
        capacity: u32,
    },
    /// The configuration contradicts itself or the recorded state.
    #[error("{0}")]
    Config(String),
    /// Reading or writing the state directory failed.
    #[error("{action} {path}: {source}")]
    State {
        /// What was being done.
        action: &'static str,
        /// The file involved.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The state file cannot be parsed.
    #[error("state file {path} is corrupt: {source}")]
    CorruptState {
        /// The file.
        path: PathBuf,
        /// The parse error.
        #[source]
        source: serde_json::Error,
    },
    /// A netlink request failed.
    #[error("netlink: {action}: {source}")]
    Netlink {
        /// What was being done.
        action: String,
        /// The kernel's answer.
        #[source]
        source: rtnetlink::Error,
    },
    /// A system call or file operation outside the state directory failed.
    #[error("{action}: {source}")]
    Io {
        /// What was being done.
        action: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A kubeconfig file cannot be read or does not describe a usable cluster and user.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// A Kubernetes API request failed.
    #[error("{action}: {}", kube_reason(.source))]
    Kube {
        /// What was being done.
        action: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// Something this node depends on (the API server, its Node object) was not there in time.
    #[error("{0}")]
    Unavailable(String),
    /// Serving gRPC failed.
    #[error(transparent)]
    Rpc(#[from] hpk_rpc::Error),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn netlink(action: impl Into<String>, source: rtnetlink::Error) -> Self {
        Error::Netlink { action: action.into(), source }
    }

    pub(crate) fn io(action: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { action: action.into(), source }
    }

    pub(crate) fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        Error::Kube { action: action.into(), source }
    }

    /// The process exit code for this error when it ends `serve` (see ARCHITECTURE.md).
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::InvalidArgument(_)
            | Error::Config(_)
            | Error::CorruptState { .. }
            | Error::State { .. }
            | Error::Kubeconfig { .. } => 78,
            Error::Kube { .. } | Error::Unavailable(_) => 69,
            _ => 1,
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        let msg = e.to_string();
        match e {
            Error::InvalidArgument(_) => tonic::Status::invalid_argument(msg),
            Error::NotFound(_) => tonic::Status::not_found(msg),
            Error::AlreadyExists(_) => tonic::Status::already_exists(msg),
            Error::Exhausted { .. } => tonic::Status::resource_exhausted(msg),
            Error::Config(_) => tonic::Status::failed_precondition(msg),
            Error::Kube { source: kube::Error::Api(status), .. } if status.code == 403 => {
                tonic::Status::permission_denied(msg)
            }
            Error::Kube { .. } | Error::Unavailable(_) => tonic::Status::unavailable(msg),
            _ => tonic::Status::internal(msg),
        }
    }
}

/// The API server's own message for a refused request (kube's `Display` repeats it as `Debug`).
fn kube_reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("{} ({} {})", status.message, status.code, status.reason),
        other => other.to_string(),
    }
}
