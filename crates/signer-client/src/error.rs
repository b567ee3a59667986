use std::path::PathBuf;

/// Everything that can go wrong on a node's side: connecting, building the request, the
/// signer's answer, writing the files.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{action} {path}: {source}")]
    File {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Connecting failed.
    #[error(transparent)]
    Rpc(#[from] hpk_rpc::Error),
    /// A SAN is not a well-formed DNS name.
    #[error("SAN {value:?} is not a valid DNS name")]
    BadDnsName {
        /// The SAN as given.
        value: String,
    },
    /// A SAN is never issued (a wildcard).
    #[error("SAN {san} is not allowed: {reason}")]
    ForbiddenSan {
        /// The SAN.
        san: String,
        /// Why.
        reason: &'static str,
    },
    /// The node token cannot be sent as a header value.
    #[error("the node token is not a valid header value (it must be printable ASCII)")]
    TokenNotSendable,
    /// Generating the key or building the CSR failed.
    #[error("signing: {0}")]
    Signing(#[from] rcgen::Error),
    /// The signer answered with an error.
    #[error("signer refused: {}: {}", .0.code(), .0.message())]
    Refused(#[from] tonic::Status),
    /// The signer's answer is unusable.
    #[error("signer answer unusable: {0}")]
    BadResponse(String),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A failed file operation on `path`.
    pub fn file(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::File { action, path: path.into(), source }
    }
}
