//! hpk-oci: what a host must be like for OCI containers, shared by the bubble launcher (`hpk
//! bubble`) and the pod runtime, so that neither links the other.
//!
//! - [`CgroupMode`] and [`limits_not_enforced`]: how the host mounts cgroups, and which limits
//!   that leaves unenforced (reported, never pretended).
//! - [`enter_private_mount_namespace`] and [`MountNamespace`]: the private mount namespace
//!   containers are made in, with a hybrid host's v2 hierarchy hidden.
//! - [`DEFAULT_CAPS`], [`ALL_CAPS`], [`DEFAULT_MASKED`], [`DEFAULT_READONLY`]: the capability
//!   and path lists of an OCI spec; [`KUBELET_MASKED`], [`KUBELET_READONLY`]: the path lists the
//!   kubelet sends over CRI.
//! - [`platform`]: architecture names as Go, OCI and Kubernetes spell them, and which entry of
//!   a multi-platform image index runs on this machine.

mod caps;
mod cgroups;
mod mountns;
mod paths;
pub mod platform;

pub use caps::{ALL_CAPS, DEFAULT_CAPS};
pub use cgroups::{CgroupMode, limits_not_enforced};
pub use mountns::{MountNamespace, enter_private_mount_namespace};
pub use paths::{DEFAULT_MASKED, DEFAULT_READONLY, KUBELET_MASKED, KUBELET_READONLY};

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong setting up the host side.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call or file operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// On what.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A helper command failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// Its stderr.
        stderr: String,
    },
    /// Something did not become ready in time.
    #[error("{0}")]
    NotReady(&'static str),
}

impl Error {
    /// An [`Error::Io`].
    pub fn io(action: &'static str, path: impl std::fmt::Display, source: std::io::Error) -> Self {
        Self::Io { action, path: path.to_string(), source }
    }
}
