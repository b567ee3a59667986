use std::path::PathBuf;

/// Errors from setting up a listener or a channel.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A filesystem operation on a socket path or its directory failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The directory for a UNIX socket is open to other users.
    #[error("socket directory {path} has mode {mode:04o}; it must be 0700 and owned by uid {uid}")]
    InsecureSocketDir {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// The uid it must belong to.
        uid: u32,
    },
    /// Another server already answers on the socket path.
    #[error("another server is already listening on {0}")]
    SocketInUse(PathBuf),
    /// A TCP address could not be bound.
    #[error("bind {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A server address could not be used as a gRPC endpoint.
    #[error("invalid endpoint {uri}: {reason}")]
    Endpoint {
        /// The address given.
        uri: String,
        /// Why it is unusable.
        reason: String,
    },
    /// Server reflection could not be built from the registered descriptors.
    #[error("gRPC reflection: {0}")]
    Reflection(String),
    /// The gRPC transport failed.
    #[error("gRPC transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// A TLS configuration could not be built.
    #[error(transparent)]
    Tls(#[from] crate::mtls::TlsError),
    /// Draining in-flight requests took longer than the deadline.
    #[error("in-flight requests did not finish within {0:?} of shutdown")]
    DrainTimeout(std::time::Duration),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { action, path: path.into(), source }
    }
}
