//! The errors of making a cluster's files.

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or system call failed.
    #[error("{action} {what}: {source}")]
    Io {
        /// What was being done ("create", "write", …).
        action: &'static str,
        /// On what.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// An input has a value we cannot use.
    #[error("{0}")]
    Invalid(String),
    /// The certificates could not be made.
    #[error("certificates: {0}")]
    Certificate(#[from] rcgen::Error),
}

impl Error {
    /// An [`Error::Io`].
    pub fn io(action: &'static str, what: impl std::fmt::Display, source: std::io::Error) -> Self {
        Self::Io { action, what: what.to_string(), source }
    }
}
