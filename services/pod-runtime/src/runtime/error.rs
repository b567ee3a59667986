use crate::engine;

/// What can go wrong serving CRI requests.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed (missing config, bad path, bad reference).
    #[error("{0}")]
    Invalid(String),
    /// A sandbox, container or image does not exist.
    #[error("{kind} {id:?} not found")]
    NotFound {
        /// What was looked for.
        kind: &'static str,
        /// Its ID or reference.
        id: String,
    },
    /// A sandbox or container with the same name exists.
    #[error("{0}")]
    AlreadyExists(String),
    /// The object is in a state that does not allow the operation.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] engine::Error),
    /// The image store failed.
    #[error(transparent)]
    Images(#[from] crate::images::Error),
    /// A file operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: std::path::PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Waiting for something took too long.
    #[error("{0}")]
    Timeout(String),
    /// Something the request needs cannot be reached (a port in a sandbox).
    #[error("{0}")]
    Unavailable(String),
}

/// Result with this module's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<std::path::PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self::Io { action, path: path.into(), source }
    }
}
