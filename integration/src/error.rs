use std::path::PathBuf;

/// What can go wrong while building or running the harness.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A command the harness runs failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it printed on stderr.
        stderr: String,
    },
    /// A process or file operation failed.
    #[error("{action} {what}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// To what.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A prerequisite of the machine (a tool, a user, a kernel feature, a built binary) is
    /// missing: the only error [`crate::skip_unless_available`] skips on.
    #[error("{what} not found: {hint}")]
    Missing {
        /// The missing thing.
        what: String,
        /// How to get it.
        hint: String,
    },
    /// Something the harness made or was told of is not there (a misuse of the harness, or
    /// a step that failed): never a reason to skip.
    #[error("{what} not found: {hint}")]
    NotFound {
        /// What was looked up.
        what: String,
        /// Why it may be missing.
        hint: String,
    },
    /// No free private subnet or name was found for a test network.
    #[error("no free test subnet under 10.250.0.0/16")]
    NoFreeSubnet,
    /// Something did not become ready in time.
    #[error("{what} not ready within {seconds} s: {detail}")]
    NotReady {
        /// What was awaited.
        what: String,
        /// The deadline.
        seconds: u64,
        /// The last observation, and where to look.
        detail: String,
    },
    /// A component exited before it was ready.
    #[error("{component} exited ({status}); log {log}:\n{tail}")]
    Exited {
        /// The component.
        component: String,
        /// Its exit status.
        status: String,
        /// Its log file.
        log: PathBuf,
        /// The end of its log.
        tail: String,
    },
    /// A command printed something the harness cannot read.
    #[error("`{command}` printed something unexpected: {output:?}")]
    Unexpected {
        /// The command line.
        command: String,
        /// What it printed.
        output: String,
    },
    /// Certificate generation failed.
    #[error("PKI: {0}")]
    Pki(#[from] rcgen::Error),
    /// A Kubernetes client call failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// An image could not be built.
    #[error("image: {0}")]
    Image(#[from] crate::image::Error),
    /// The registry refused or could not be reached.
    #[error("registry: {0}")]
    Registry(#[from] Box<crate::registry::Error>),
    /// A kubeconfig could not be built or loaded.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// What the harness shares with the `hpk` command (the PKI, the add-ons) failed.
    #[error("{0}")]
    Cluster(#[from] hpk_cluster::Error),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(action: &'static str, what: impl std::fmt::Display, source: std::io::Error) -> Self {
        Self::Io { action, what: what.to_string(), source }
    }
}
