//! The kubelet's errors at start (everything after start is retried, never fatal).

/// Why the kubelet could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag or file is wrong.
    #[error("configuration: {0}")]
    Config(String),
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig {path}: {reason}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The runtime did not answer.
    #[error("the pod-runtime at {socket} is unavailable: {reason}")]
    Runtime {
        /// Its socket.
        socket: String,
        /// What failed.
        reason: String,
    },
    /// Registering the node failed.
    #[error("registering the node: {0}")]
    Node(String),
    /// The cert-signer issued no serving certificate for the kubelet API.
    #[error("serving certificate: {0}")]
    Signer(String),
    /// A flag's value is wrong.
    #[error("configuration: {0}")]
    Flag(#[from] crate::config::FlagError),
    /// The kubelet API's certificate, key or client CA is unusable.
    #[error("configuration: {0}")]
    Tls(#[from] crate::api::tls::TlsError),
    /// The cert-signer's certificate is unusable.
    #[error("serving certificate: {0}")]
    SignedCert(#[source] crate::api::tls::TlsError),
    /// Serving the diagnostics socket failed.
    #[error(transparent)]
    Rpc(#[from] hpk_rpc::Error),
}

impl Error {
    /// The process exit code: 78 for configuration (EX_CONFIG), 69 when a peer is unavailable
    /// (EX_UNAVAILABLE), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Config(_) | Self::Kubeconfig { .. } | Self::Flag(_) | Self::Tls(_) => 78,
            Self::Runtime { .. } | Self::Node(_) | Self::Signer(_) | Self::SignedCert(_) => 69,
            Self::Rpc(_) => 1,
        }
    }
}

/// The kubelet's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
