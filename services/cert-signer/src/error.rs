use std::path::PathBuf;

use hpk_signer_client::Error as ClientError;

use crate::Profile;

/// Everything that can go wrong in the signer and in `hpk-cert-signer request`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // ---- start-up and files ----
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
    /// A secret file is readable or writable by group or others.
    #[error(
        "{path} has mode {mode:04o}: secrets must not be accessible to group or others; run `chmod 600 {path}`"
    )]
    InsecureSecret {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A key or token lies under the shared directory, where every node (and backup) can see it.
    #[error(
        "{path} is a secret (a key or a token) and lies under the shared directory {shared}; keep secrets on node-local storage (for example $TMPDIR or the job's local scratch), never on the shared filesystem"
    )]
    KeyOnSharedFilesystem {
        /// The key file.
        path: PathBuf,
        /// The shared directory it lies under.
        shared: PathBuf,
    },
    /// A CA certificate or key is unusable.
    #[error("CA {path}: {reason}")]
    BadCa {
        /// The certificate or key file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The token file is empty or not text.
    #[error("token file {path}: {reason}")]
    BadToken {
        /// The token file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The configuration is inconsistent.
    #[error("configuration: {0}")]
    Config(String),
    /// Serving or connecting failed.
    #[error(transparent)]
    Rpc(#[from] hpk_rpc::Error),

    // ---- request authentication ----
    /// The request had no usable bearer token.
    #[error("missing node token: send `authorization: Bearer <token>`")]
    MissingToken,
    /// The bearer token is not the token of the node the request names.
    #[error("node token rejected: it is not the token of the node the request names")]
    WrongToken,

    // ---- malformed requests (InvalidArgument) ----
    /// The node name is not a DNS-1123 subdomain.
    #[error("node name {name:?} is not a DNS-1123 subdomain: {reason}")]
    BadNodeName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The CSR could not be decoded.
    #[error("CSR is not a PEM-encoded PKCS#10 request: {0}")]
    BadCsr(String),
    /// The CSR's signature does not verify with its own public key.
    #[error("CSR signature does not verify with the CSR's public key")]
    BadCsrSignature,
    /// The CSR's key type or size is not accepted.
    #[error("CSR key not accepted: {0} (use ECDSA P-256/P-384, Ed25519 or RSA of at least 2048 bits)")]
    UnsupportedKey(String),
    /// A SAN is not a well-formed DNS name.
    #[error("SAN {value:?} is not a valid DNS name")]
    BadDnsName {
        /// The SAN as requested.
        value: String,
    },

    // ---- policy refusals (PermissionDenied) ----
    /// The subject is not the node's identity.
    #[error("CSR subject must be exactly CN=system:node:{node}, O=system:nodes; it is {found}")]
    SubjectMismatch {
        /// The node the request is for.
        node: String,
        /// The subject the CSR carries.
        found: String,
    },
    /// A SAN is not allowed.
    #[error("SAN {san} is not allowed: {reason}")]
    ForbiddenSan {
        /// The SAN.
        san: String,
        /// Why.
        reason: &'static str,
    },
    /// Too many SANs.
    #[error("CSR asks for {count} SANs; at most {max} are allowed")]
    TooManySans {
        /// How many were asked for.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The CSR asks for a CA certificate.
    #[error(
        "CSR asks for a CA certificate (basicConstraints CA:TRUE or keyCertSign/cRLSign); node certificates are never CAs"
    )]
    CaRequested,
    /// The CSR asks for a key usage the profile does not grant.
    #[error("{profile} certificates are issued for {allowed} only; CSR asks for {usage}")]
    UsageNotAllowed {
        /// The profile of the request.
        profile: Profile,
        /// What the profile grants.
        allowed: &'static str,
        /// The usage asked for.
        usage: String,
    },
    /// The CSR requests an extension the signer does not issue.
    #[error("CSR requests extension {oid}, which the signer does not issue")]
    ExtensionNotAllowed {
        /// The extension's OID.
        oid: String,
    },

    /// The node already has a certificate (`profile`: one it has), and the request presents
    /// only the token (review H3: a leaked token must not yield another node's identity).
    #[error(
        "node {node} already has a {profile} certificate: any further request for it must present the node's current client certificate (system:node:{node}); the token alone enrols a node once"
    )]
    AlreadyEnrolled {
        /// The node.
        node: String,
        /// The profile asked for.
        profile: Profile,
    },
    /// The caller's certificate names another node.
    #[error(
        "the client certificate is node {caller}'s; it obtains certificates for {caller} only, not for {node}"
    )]
    OtherNode {
        /// The node the certificate names.
        caller: String,
        /// The node asked for.
        node: String,
    },

    // ---- signing ----
    /// The CA can no longer issue (expired).
    #[error("the {profile} CA expired; no certificate can be issued")]
    CaExpired {
        /// The profile whose CA expired.
        profile: Profile,
    },
    /// The system random number generator failed.
    #[error("random number generator: {0}")]
    Random(String),
    /// Building or signing a certificate failed.
    #[error("signing: {0}")]
    Signing(#[from] rcgen::Error),

    // ---- client side ----
    /// What the node's side (`hpk-signer-client`) hit that the variants above do not cover:
    /// the signer's refusal, an unusable answer, a token that cannot be sent.
    #[error(transparent)]
    Client(ClientError),
}

/// The client's errors that have a variant of their own here become it (same message, same
/// code); the rest stay the client's ([`Error::Client`]).
impl From<ClientError> for Error {
    fn from(err: ClientError) -> Self {
        match err {
            ClientError::File { action, path, source } => Self::File { action, path, source },
            ClientError::Rpc(e) => Self::Rpc(e),
            ClientError::BadDnsName { value } => Self::BadDnsName { value },
            ClientError::ForbiddenSan { san, reason } => Self::ForbiddenSan { san, reason },
            ClientError::Signing(e) => Self::Signing(e),
            other @ (ClientError::TokenNotSendable
            | ClientError::Refused(_)
            | ClientError::BadResponse(_)) => Self::Client(other),
        }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn file(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::File { action, path: path.into(), source }
    }
}

impl Error {
    /// Process exit code for this error: 78 (EX_CONFIG) when the configuration or a file it
    /// names is at fault, 69 (EX_UNAVAILABLE) when the signer refused or could not be reached,
    /// 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::File { .. }
            | Error::InsecureSecret { .. }
            | Error::KeyOnSharedFilesystem { .. }
            | Error::BadCa { .. }
            | Error::BadToken { .. }
            | Error::Config(_)
            | Error::BadNodeName { .. }
            | Error::BadDnsName { .. }
            | Error::ForbiddenSan { .. } => 78,
            Error::Client(ClientError::Refused(_)) | Error::Rpc(_) => 69,
            _ => 1,
        }
    }
}

impl From<Error> for tonic::Status {
    fn from(err: Error) -> Self {
        use tonic::Code;
        let code = match &err {
            Error::MissingToken | Error::WrongToken => Code::Unauthenticated,
            Error::BadNodeName { .. }
            | Error::BadCsr(_)
            | Error::BadCsrSignature
            | Error::UnsupportedKey(_)
            | Error::BadDnsName { .. } => Code::InvalidArgument,
            Error::SubjectMismatch { .. }
            | Error::ForbiddenSan { .. }
            | Error::TooManySans { .. }
            | Error::CaRequested
            | Error::UsageNotAllowed { .. }
            | Error::ExtensionNotAllowed { .. }
            | Error::AlreadyEnrolled { .. }
            | Error::OtherNode { .. } => Code::PermissionDenied,
            Error::CaExpired { .. } => Code::FailedPrecondition,
            Error::Client(ClientError::Refused(status)) => status.code(),
            Error::File { .. }
            | Error::InsecureSecret { .. }
            | Error::KeyOnSharedFilesystem { .. }
            | Error::BadCa { .. }
            | Error::BadToken { .. }
            | Error::Config(_)
            | Error::Rpc(_)
            | Error::Signing(_)
            | Error::Random(_)
            | Error::Client(_) => Code::Internal,
        };
        tonic::Status::new(code, err.to_string())
    }
}
