//! Talking to a registry over the OCI distribution API (through `oci-client`), with every
//! manifest and blob checked against its digest and size here, whatever the client checked.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{DigestError, OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use sha2::{Digest as _, Sha256};
use tokio::io::AsyncWriteExt;
use tokio_stream::StreamExt;

use super::error::{Error, Result};
use super::reference::{Credentials, ImageRef, sha256_digest};

/// The manifest types we ask for: OCI and Docker v2, images and indexes.
const ACCEPTED: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
/// A registry that does not accept a connection within this is unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// A transfer that stalls this long is broken.
const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// A blob as a manifest describes it.
#[derive(Debug, Clone)]
pub(crate) struct Blob<'a> {
    /// `config` or `layer`, for messages.
    pub(crate) what: &'static str,
    pub(crate) digest: &'a str,
    pub(crate) size: u64,
}

/// A connection to the registry of one reference, with its credentials.
pub(crate) struct Remote {
    client: oci_client::Client,
    auth: RegistryAuth,
    image: oci_client::Reference,
    registry: String,
    shown: String,
}

impl Remote {
    /// A client for `image`'s registry; plain HTTP if the registry is in `insecure`.
    pub(crate) fn new(image: &ImageRef, auth: Option<&Credentials>, insecure: &[String]) -> Result<Self> {
        let registry = image.registry().to_owned();
        let auth = match auth {
            None => RegistryAuth::Anonymous,
            Some(Credentials::Basic { username, password }) => {
                RegistryAuth::Basic(username.clone(), password.clone())
            }
            Some(Credentials::RegistryToken(token)) => RegistryAuth::Bearer(token.clone()),
            Some(Credentials::IdentityToken(_)) => {
                return Err(Error::BadCredentials {
                    registry,
                    reason: "identity tokens (OAuth2 refresh tokens) are not supported yet; \
                             give a username and password or a registry token",
                });
            }
        };
        // `oci-client` compares against the resolved host (`index.docker.io` for Docker Hub).
        let protocol = ClientProtocol::HttpsExcept(insecure.to_vec());
        let config = ClientConfig {
            protocol,
            platform_resolver: None,
            connect_timeout: Some(CONNECT_TIMEOUT),
            read_timeout: Some(READ_TIMEOUT),
            ..ClientConfig::default()
        };
        let shown = image.to_string();
        let client = oci_client::Client::try_from(config).map_err(|e| Error::Registry {
            registry: registry.clone(),
            reference: shown.clone(),
            source: Arc::new(e),
        })?;
        Ok(Self { client, auth, image: image.to_oci(), registry, shown })
    }

    /// The manifest (or index) `digest`, or the one the reference names when `None`: its
    /// bytes and their digest, checked against the digest asked for.
    pub(crate) async fn manifest(&self, digest: Option<&str>) -> Result<(Vec<u8>, String)> {
        let reference = match digest {
            Some(d) => self.image.clone_with_digest(d.to_owned()),
            None => self.image.clone(),
        };
        let (bytes, _) = self
            .client
            .pull_manifest_raw(&reference, &self.auth, ACCEPTED)
            .await
            .map_err(|e| self.error(e, "manifest"))?;
        let actual = sha256_digest(&bytes);
        if let Some(expected) = reference.digest().filter(|d| *d != actual) {
            return Err(Error::DigestMismatch { what: "manifest", expected: expected.to_owned(), actual });
        }
        Ok((bytes.to_vec(), actual))
    }

    /// Downloads `blob` to `dest`, hashing as it goes. Refuses more bytes than the descriptor
    /// says as soon as they arrive. Returns the bytes written.
    pub(crate) async fn blob(&self, blob: &Blob<'_>, dest: &Path) -> Result<u64> {
        let mut stream = self
            .client
            .pull_blob_stream(&self.image, blob.digest)
            .await
            .map_err(|e| self.error(e, blob.what))?;
        let size_error = |actual| Error::SizeMismatch {
            what: blob.what,
            digest: blob.digest.to_owned(),
            expected: blob.size,
            actual,
        };
        if let Some(len) = stream.content_length.filter(|len| *len != blob.size) {
            return Err(size_error(len));
        }
        let mut file = tokio::fs::File::create(dest).await.map_err(Error::io("creating", dest))?;
        let mut hasher = Sha256::new();
        let mut got = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                // `oci-client` reports its own digest check as a stream error; ours below is
                // the one that counts, so only a transport error ends the download here.
                Err(e) if is_digest_error(&e) => break,
                Err(e) => {
                    return Err(Error::Unreachable { registry: self.registry.clone(), source: Arc::new(e) });
                }
            };
            got += chunk.len() as u64;
            if got > blob.size {
                return Err(size_error(got));
            }
            hasher.update(&chunk);
            file.write_all(&chunk).await.map_err(Error::io("writing", dest))?;
        }
        if got != blob.size {
            return Err(size_error(got));
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != blob.digest {
            return Err(Error::DigestMismatch { what: blob.what, expected: blob.digest.to_owned(), actual });
        }
        file.sync_all().await.map_err(Error::io("syncing", dest))?;
        Ok(got)
    }

    /// Sorts a client error into the variant a caller can act on.
    fn error(&self, e: OciDistributionError, what: &'static str) -> Error {
        let registry = self.registry.clone();
        let reference = self.shown.clone();
        let not_found = |detail: String| Error::NotFound { what, reference: reference.clone(), detail };
        let unauthorized = |detail: String| Error::Unauthorized {
            registry: registry.clone(),
            reference: reference.clone(),
            detail,
        };
        match &e {
            OciDistributionError::RequestError(r) if r.is_connect() || r.is_timeout() => {
                Error::Unreachable { registry, source: Arc::new(e) }
            }
            OciDistributionError::UnauthorizedError { .. }
            | OciDistributionError::AuthenticationFailure(_) => unauthorized(e.to_string()),
            OciDistributionError::RegistryError { envelope, .. } => {
                let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
                if codes.iter().any(|c| {
                    matches!(
                        c,
                        OciErrorCode::ManifestUnknown
                            | OciErrorCode::NameUnknown
                            | OciErrorCode::BlobUnknown
                            | OciErrorCode::NotFound
                    )
                }) {
                    not_found(envelope.to_string())
                } else if codes.iter().any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
                {
                    unauthorized(envelope.to_string())
                } else {
                    Error::Registry { registry, reference, source: Arc::new(e) }
                }
            }
            OciDistributionError::ServerError { code: 404, message, .. } => not_found(message.clone()),
            OciDistributionError::ServerError { code: 401 | 403, message, .. } => {
                unauthorized(message.clone())
            }
            OciDistributionError::ImageManifestNotFoundError(m) => not_found(m.clone()),
            OciDistributionError::DigestError(DigestError::VerificationError { expected, actual }) => {
                Error::DigestMismatch { what, expected: expected.clone(), actual: actual.clone() }
            }
            _ => Error::Registry { registry, reference, source: Arc::new(e) },
        }
    }
}

fn is_digest_error(e: &std::io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<DigestError>())
}
