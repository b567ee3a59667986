//! The errors of `hpk-pause`'s setup: once it supervises, nothing but a broken signalfd is fatal.

use std::path::PathBuf;

use nix::errno::Errno;

/// What can stop `hpk-pause` from starting or supervising.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call needed for signal handling or reaping failed.
    #[error("{action}: {source}")]
    Sys {
        /// What was being done.
        action: &'static str,
        /// The errno.
        #[source]
        source: Errno,
    },
    /// Listing our children in `/proc` failed.
    #[error("read {path}: {source}")]
    Proc {
        /// The file.
        path: &'static str,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The events channel given by the runtime could not be opened at start.
    #[error("open events channel {path}: {source}")]
    Events {
        /// The socket or FIFO path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The trailing command could not be started.
    #[error("start command {command:?}: {source}")]
    Spawn {
        /// The program.
        command: String,
        /// The errno of posix_spawn (EINVAL for an argument with a NUL byte).
        #[source]
        source: Errno,
    },
}

/// The result type of [`crate::pause`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps an errno with what was being done, for `map_err`.
    pub(crate) fn sys(action: &'static str) -> impl FnOnce(Errno) -> Self {
        move |source| Self::Sys { action, source }
    }
}
