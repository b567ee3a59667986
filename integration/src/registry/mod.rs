//! A local OCI registry and a client for it.
//!
//! [`Registry`] runs Debian's `docker-registry` (the CNCF distribution registry v2) with a
//! config and storage of its own in a temp dir, plain HTTP on one address, optionally inside a
//! network namespace. [`Client`] pushes and pulls images over the OCI distribution API and
//! checks every digest it is given.

mod client;
mod server;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

pub use client::{Client, PulledImage};
pub use server::{REGISTRY_BIN, Registry, find_registry};

use crate::image::{self, Digest};

/// Result of the registry and its client.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong running the registry or talking to it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // ---- the registry process ----
    /// The registry binary is not installed.
    #[error("{REGISTRY_BIN} not found on PATH; install Debian's docker-registry package")]
    NotInstalled,
    /// A file or directory of the registry's could not be created.
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
    /// No free port could be found.
    #[error("finding a free TCP port on {ip}: {source}")]
    PickPort {
        /// The address asked for.
        ip: IpAddr,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The registry exited before answering.
    #[error("registry for {addr} exited before it was ready ({status}); log tail:\n{log_tail}")]
    Exited {
        /// The address it was to listen on.
        addr: SocketAddr,
        /// How it exited.
        status: ExitStatus,
        /// The end of its log.
        log_tail: String,
    },
    /// The registry did not answer `GET /v2/` in time.
    #[error("registry on {addr} did not answer GET /v2/ within {waited:?}; log tail:\n{log_tail}")]
    NotReady {
        /// The address it listens on.
        addr: SocketAddr,
        /// How long we waited.
        waited: Duration,
        /// The end of its log.
        log_tail: String,
    },

    // ---- the distribution API ----
    /// A repository name the distribution API would not accept.
    #[error("repository name {name:?}: {reason}")]
    BadName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The HTTP client could not be built.
    #[error("building the HTTP client: {0}")]
    ClientBuild(#[source] reqwest::Error),
    /// A request failed before the registry answered it.
    #[error("{method} {url}: {source}")]
    Http {
        /// The request method.
        method: &'static str,
        /// The request URL.
        url: String,
        /// The underlying error.
        #[source]
        source: reqwest::Error,
    },
    /// The registry does not have what was asked for.
    #[error("{what} {reference} not found in repository {repo} ({url})")]
    NotFound {
        /// `manifest` or `blob`.
        what: &'static str,
        /// The repository.
        repo: String,
        /// The tag or digest asked for.
        reference: String,
        /// The request URL.
        url: String,
    },
    /// The registry refused a request.
    #[error("{method} {url}: registry answered {status}: {body}")]
    Refused {
        /// The request method.
        method: &'static str,
        /// The request URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The registry's error document, which names the reason (e.g. `DIGEST_INVALID`).
        body: String,
    },
    /// An answer lacked a header the protocol requires.
    #[error("{method} {url}: answer has no usable {header} header")]
    MissingHeader {
        /// The request method.
        method: &'static str,
        /// The request URL.
        url: String,
        /// The header.
        header: &'static str,
    },
    /// Content did not hash to the digest it was fetched or pushed by.
    #[error("{url}: {what} is {actual}, expected {expected}")]
    DigestMismatch {
        /// The request URL.
        url: String,
        /// What was compared: content, or a header.
        what: &'static str,
        /// The digest asked for or sent.
        expected: Digest,
        /// The digest found.
        actual: Digest,
    },
    /// A blob's size differs from its descriptor.
    #[error("{url}: blob is {actual} bytes, the manifest says {expected}")]
    SizeMismatch {
        /// The request URL.
        url: String,
        /// The size in the manifest.
        expected: u64,
        /// The size received.
        actual: u64,
    },
    /// A manifest is not an OCI image manifest.
    #[error("manifest from {url}: {reason}")]
    BadManifest {
        /// The request URL.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Building or checking image content failed.
    #[error(transparent)]
    Image(#[from] image::Error),
    /// Starting the process failed.
    #[error(transparent)]
    Harness(#[from] crate::Error),
}

/// An HTTP client that never goes through a proxy: the registry is always local.
fn http_client() -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(120))
        .build()
        .map_err(Error::ClientBuild)
}

/// The images the cluster tests and `scripts/demo.sh` run, pushed to one registry.
#[derive(Debug, Clone)]
pub struct TestImages {
    /// `hpk/shell:v1`: busybox with `sh` as its command.
    pub shell: String,
    /// `hpk/httpd:v1`: busybox httpd serving [`crate::image::HTTPD_INDEX`] on port 8080.
    pub httpd: String,
    /// `hpk/owners:v1`: busybox with files of several users ([`crate::image::owners_image`]).
    pub owners: String,
    /// `hpk/coredns:v1`: the static `coredns` binary `scripts/setup.sh` builds, when asked for.
    pub coredns: Option<String>,
    /// `hpk/metrics-server:v1`: the static `metrics-server` binary `scripts/setup.sh` builds,
    /// with CoreDNS's.
    pub metrics_server: Option<String>,
    /// `hpk/local-path-provisioner:v1`: the static `local-path-provisioner` binary
    /// `scripts/setup.sh` builds, with CoreDNS's (its helper pods run [`TestImages::shell`]).
    pub local_path_provisioner: Option<String>,
}

impl TestImages {
    /// Builds and pushes the shell, httpd and owners images, and with `addons` CoreDNS's,
    /// metrics-server's and the local-path provisioner's (the add-ons `hpk up` deploys).
    pub async fn push(registry: &Registry, addons: bool) -> crate::Result<Self> {
        let client = Client::new(&registry.url()).map_err(Box::new)?;
        let r = registry.host_port();
        client.push("hpk/shell", "v1", &image::shell_image()?).await.map_err(Box::new)?;
        client.push("hpk/httpd", "v1", &image::httpd_image()?).await.map_err(Box::new)?;
        client.push("hpk/owners", "v1", &image::owners_image()?).await.map_err(Box::new)?;
        let (coredns, metrics_server, local_path_provisioner) = if addons {
            let mut pushed = Vec::new();
            for (name, binary) in [
                ("coredns", crate::clusterdns::coredns_binary()?),
                ("metrics-server", crate::clusterdns::metrics_server_binary()?),
                ("local-path-provisioner", crate::clusterdns::local_path_provisioner_binary()?),
            ] {
                let repository = format!("hpk/{name}");
                client
                    .push(&repository, "v1", &image::static_binary_image_from(&binary)?)
                    .await
                    .map_err(Box::new)?;
                pushed.push(Some(format!("{r}/{repository}:v1")));
            }
            (pushed[0].take(), pushed[1].take(), pushed[2].take())
        } else {
            (None, None, None)
        };
        Ok(Self {
            shell: format!("{r}/hpk/shell:v1"),
            httpd: format!("{r}/hpk/httpd:v1"),
            owners: format!("{r}/hpk/owners:v1"),
            coredns,
            metrics_server,
            local_path_provisioner,
        })
    }
}
