//! The image store's error type.

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Result of the image store.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A cause from a library, shared so that [`Error`] stays cloneable.
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in the image store.
///
/// Cloneable (causes behind `Arc`) because concurrent pulls of one reference share one result,
/// and each caller gets the same precise variant.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// An image reference or ID that does not parse.
    #[error("image reference {reference:?}: {reason}")]
    BadReference {
        /// The string given.
        reference: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Credentials the store cannot use.
    #[error("credentials for {registry}: {reason}")]
    BadCredentials {
        /// The registry they were given for.
        registry: String,
        /// What is wrong with them.
        reason: &'static str,
    },
    /// The registry does not have the image, or one of its blobs.
    #[error("{what} {reference} not found: {detail}")]
    NotFound {
        /// `image`, `manifest` or `blob`.
        what: &'static str,
        /// The reference or digest asked for.
        reference: String,
        /// What the registry said.
        detail: String,
    },
    /// The registry could not be reached, or the connection broke.
    #[error("registry {registry} unreachable: {source}")]
    Unreachable {
        /// The registry's host and port.
        registry: String,
        /// The transport's error.
        #[source]
        source: Cause,
    },
    /// The registry refused the credentials, or wants some.
    #[error("registry {registry} refused access to {reference}: {detail}")]
    Unauthorized {
        /// The registry's host and port.
        registry: String,
        /// The reference asked for.
        reference: String,
        /// What the registry said.
        detail: String,
    },
    /// The registry failed or answered outside the distribution API.
    #[error("registry {registry}, {reference}: {source}")]
    Registry {
        /// The registry's host and port.
        registry: String,
        /// The reference asked for.
        reference: String,
        /// The client's error.
        #[source]
        source: Cause,
    },
    /// Content does not hash to the digest it was named by.
    #[error("{what} {expected}: content hashes to {actual}")]
    DigestMismatch {
        /// What was checked: `manifest`, `config`, `layer`, `layer diff ID`.
        what: &'static str,
        /// The digest it was named by.
        expected: String,
        /// The digest of what arrived.
        actual: String,
    },
    /// A blob is not as long as its descriptor says.
    #[error("{what} {digest}: {actual} bytes arrived, the descriptor says {expected}")]
    SizeMismatch {
        /// `config` or `layer`.
        what: &'static str,
        /// The blob's digest.
        digest: String,
        /// The size in the descriptor.
        expected: u64,
        /// The bytes received (so far, when there were too many).
        actual: u64,
    },
    /// A manifest, index or config the store cannot use.
    #[error("{what} {digest}: {reason}")]
    BadManifest {
        /// `manifest`, `image index` or `config`.
        what: &'static str,
        /// Its digest.
        digest: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An image index lists no image for this machine's platform.
    #[error(
        "image index {digest} of {reference} has no linux/{} image (it has: {available})",
        hpk_oci::platform::architecture()
    )]
    NoPlatform {
        /// The reference pulled.
        reference: String,
        /// The index's digest.
        digest: String,
        /// The platforms it lists.
        available: String,
    },
    /// A layer in a format the store cannot unpack.
    #[error("layer {digest}: media type {media_type} is not supported (only tar and gzip'd tar)")]
    UnsupportedLayer {
        /// The layer blob's digest.
        digest: String,
        /// Its media type.
        media_type: String,
    },
    /// A layer entry that would land outside the layer or write through a link.
    #[error("layer {layer}: entry {path:?}: {reason}")]
    UnsafePath {
        /// The layer's diff ID.
        layer: String,
        /// The entry's path (or link target) as the tar stores it.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Reading a layer or writing one of its entries failed.
    #[error("layer {layer}: {action} {path:?}: {source}")]
    Unpack {
        /// The layer's diff ID.
        layer: String,
        /// What was being done.
        action: &'static str,
        /// The entry, or empty for the archive itself.
        path: String,
        /// The underlying error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// A whiteout needs `mknod` of a 0/0 character device, and this process may not.
    #[error(
        "layer {layer}: whiteout {path:?} needs a 0/0 character device, and mknod was refused \
         ({source}); run the runtime as root or in a user namespace"
    )]
    WhiteoutNotPermitted {
        /// The layer's diff ID.
        layer: String,
        /// The whiteout's path in the layer.
        path: String,
        /// The error of `mknod`.
        #[source]
        source: nix::errno::Errno,
    },
    /// A file operation of the store failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The index of images cannot be read or written.
    #[error("image index {path}: {source}")]
    Index {
        /// The index file.
        path: PathBuf,
        /// The JSON error.
        #[source]
        source: Arc<serde_json::Error>,
    },
    /// Another process has the store open.
    #[error("image store {path} is in use by another process")]
    Locked {
        /// The store's root.
        path: PathBuf,
    },
    /// A blocking task of the store did not finish.
    #[error("{what}: {reason}")]
    Task {
        /// What the task was doing.
        what: &'static str,
        /// Why it did not finish (a panic or a runtime shutting down).
        reason: String,
    },
}

impl Error {
    /// An [`Error::Io`] maker for `map_err`.
    pub(crate) fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Self + 'a {
        move |source| Self::Io { action, path: path.to_owned(), source: Arc::new(source) }
    }

    /// An [`Error::Unpack`] maker for `map_err`.
    pub(crate) fn unpack<'a>(
        layer: &'a str,
        action: &'static str,
        path: &'a str,
    ) -> impl FnOnce(std::io::Error) -> Self + 'a {
        move |source| Self::Unpack {
            layer: layer.to_owned(),
            action,
            path: path.to_owned(),
            source: Arc::new(source),
        }
    }

    /// The error of a blocking task that panicked or was cancelled.
    pub(crate) fn task(what: &'static str, err: tokio::task::JoinError) -> Self {
        Self::Task { what, reason: err.to_string() }
    }
}
