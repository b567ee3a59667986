//! Opening channels to HPK gRPC servers.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::{Error, Result};

/// Connects to a server on a UNIX socket.
pub async fn unix(path: &Path) -> Result<Channel> {
    let path: PathBuf = path.to_owned();
    // The URI is required by the API but never resolved: the connector below ignores it.
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
        }))
        .await?;
    Ok(channel)
}

/// Connects over TLS to `uri` (`https://host:port`), trusting only the CA in `ca_pem` and
/// checking that the server certificate names `server_name` (the host of `uri` if `None`).
pub async fn tls(uri: &str, ca_pem: &[u8], server_name: Option<&str>) -> Result<Channel> {
    let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem));
    if let Some(name) = server_name {
        tls = tls.domain_name(name);
    }
    let endpoint = Endpoint::from_shared(uri.to_owned())
        .map_err(|e| Error::Endpoint { uri: uri.to_owned(), reason: e.to_string() })?
        .tls_config(tls)?;
    Ok(endpoint.connect().await?)
}
