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

/// Connects over mutual TLS to `uri` (`https://host:port`): trusts only the CA in `ca_pem`,
/// presents the client certificate `cert_pem` with its key, checks that the server certificate
/// names `server_name` (the host of `uri` if `None`).
pub async fn mutual_tls(
    uri: &str,
    ca_pem: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
    server_name: Option<&str>,
) -> Result<Channel> {
    Ok(mutual_tls_endpoint(uri, ca_pem, cert_pem, key_pem, server_name)?.connect().await?)
}

/// [`mutual_tls`] that connects on first use and reconnects after a loss, instead of failing
/// now when the server is unreachable: for a long-lived client of a remote server. HTTP/2
/// keep-alive finds a silent link within 15 s.
pub fn mutual_tls_lazy(
    uri: &str,
    ca_pem: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
    server_name: Option<&str>,
) -> Result<Channel> {
    let endpoint = mutual_tls_endpoint(uri, ca_pem, cert_pem, key_pem, server_name)?
        .connect_timeout(std::time::Duration::from_secs(5))
        .http2_keep_alive_interval(std::time::Duration::from_secs(10))
        .keep_alive_timeout(std::time::Duration::from_secs(5))
        .keep_alive_while_idle(true);
    Ok(endpoint.connect_lazy())
}

fn mutual_tls_endpoint(
    uri: &str,
    ca_pem: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
    server_name: Option<&str>,
) -> Result<Endpoint> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .identity(tonic::transport::Identity::from_pem(cert_pem, key_pem));
    if let Some(name) = server_name {
        tls = tls.domain_name(name);
    }
    Ok(Endpoint::from_shared(uri.to_owned())
        .map_err(|e| Error::Endpoint { uri: uri.to_owned(), reason: e.to_string() })?
        .tcp_nodelay(true)
        .tls_config(tls)?)
}
