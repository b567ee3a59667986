//! httpGet probes: a small HTTP/1.1 client that connects to the pod itself (no proxy), sends
//! the probe's headers, follows redirects that stay on the same host (at most 10), and over
//! HTTPS accepts any certificate, as the kubelet's probe client does.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::net::TcpStream;

use crate::failure::ProbeFailure;
use crate::{HttpGet, connect_error, join_host_port};

/// The most of a response body read (the rest is left unread), as the kubelet reads.
const MAX_BODY: usize = 10 * 1024;
/// Redirects followed before giving up, as Go's client does.
const MAX_REDIRECTS: usize = 10;
/// The User-Agent the kubelet's probes send, unless the probe sets its own.
const USER_AGENT: &str = "kube-probe/1.35";

#[derive(Clone, Debug, PartialEq, Eq)]
struct Url {
    https: bool,
    host: String,
    port: u16,
    /// Path and query, starting with `/`.
    path: String,
}

impl std::fmt::Display for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", join_host_port(&self.host, self.port), self.path)
    }
}

impl Url {
    /// Where a `Location` header leads from here; `None` when it cannot be understood.
    fn join(&self, location: &str) -> Option<Url> {
        let absolute = |text: &str| -> Option<Url> {
            let uri: http::Uri = text.parse().ok()?;
            let https = match uri.scheme_str()? {
                "http" => false,
                "https" => true,
                _ => return None,
            };
            let host = uri.host()?.trim_start_matches('[').trim_end_matches(']').to_owned();
            let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
            let path = uri.path_and_query().map_or("/".to_owned(), |p| p.as_str().to_owned());
            Some(Url { https, host, port, path: if path.is_empty() { "/".into() } else { path } })
        };
        let scheme = location.split_once("://").map(|(scheme, _)| scheme);
        if scheme.is_some_and(|s| {
            !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        }) {
            return absolute(location);
        }
        if location.starts_with("//") {
            return absolute(&format!("{}:{location}", if self.https { "https" } else { "http" }));
        }
        let path = if location.starts_with('/') {
            location.to_owned()
        } else {
            let base = self.path.split(['?', '#']).next().unwrap_or("/");
            let dir = &base[..=base.rfind('/').unwrap_or(0)];
            format!("{dir}{location}")
        };
        Some(Url { path, ..self.clone() })
    }
}

struct Response {
    status: u16,
    location: Option<String>,
    /// The body's first [`MAX_BODY`] bytes.
    body: Bytes,
}

/// Runs the probe within `timeout` (redirects included): 200–399 passes. A redirect off the
/// probed host is not followed and passes with a warning naming its body, as upstream's
/// (`Probe terminated redirects, Response body: …`, the kubelet's ProbeWarning event).
pub(crate) async fn probe(request: HttpGet, timeout: Duration) -> Result<Option<String>, ProbeFailure> {
    let https = match request.scheme.to_ascii_uppercase().as_str() {
        "HTTP" => false,
        "HTTPS" => true,
        other => return Err(ProbeFailure::UnsupportedScheme(other.to_owned())),
    };
    let path = if request.path.starts_with('/') { request.path } else { format!("/{}", request.path) };
    let first = Url { https, host: request.host, port: request.port, path };
    let mut url = first.clone();
    let mut host_header =
        request.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("host")).map(|(_, v)| v.clone());
    let headers: Vec<_> =
        request.headers.into_iter().filter(|(k, _)| !k.eq_ignore_ascii_case("host")).collect();
    let deadline = tokio::time::Instant::now() + timeout;
    for redirects in 0..=MAX_REDIRECTS {
        let answer = tokio::time::timeout_at(deadline, get(&url, &headers, host_header.as_deref())).await;
        let response = match answer {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => return Err(ProbeFailure::Get { url: url.to_string(), cause: Box::new(e) }),
            Err(_) => return Err(ProbeFailure::GetTimeout { url: url.to_string() }),
        };
        let next = match response.location.as_deref() {
            Some(location) if (300..400).contains(&response.status) => {
                let relative = !location.contains("://") && !location.starts_with("//");
                url.join(location).map(|next| (next, relative))
            }
            _ => None,
        };
        let Some((next, relative)) = next else {
            return if (200..400).contains(&response.status) {
                Ok(None)
            } else {
                Err(ProbeFailure::HttpStatus(response.status))
            };
        };
        // A redirect off the probed host is not followed: the redirect itself is the answer.
        if next.host != first.host {
            let body = String::from_utf8_lossy(&response.body);
            return Ok(Some(format!("Probe terminated redirects, Response body: {body}")));
        }
        if redirects == MAX_REDIRECTS {
            break;
        }
        if !relative {
            host_header = None;
        }
        url = next;
    }
    Err(ProbeFailure::TooManyRedirects { url: url.to_string(), max: MAX_REDIRECTS })
}

/// One GET on a fresh connection.
async fn get(
    url: &Url,
    headers: &[(String, String)],
    host_header: Option<&str>,
) -> Result<Response, ProbeFailure> {
    let addr = join_host_port(&url.host, url.port);
    let tcp = TcpStream::connect((url.host.as_str(), url.port))
        .await
        .map_err(|e| ProbeFailure::Dial { addr: addr.clone(), cause: connect_error(&e) })?;
    let host = host_header.map_or_else(|| addr.clone(), str::to_owned);
    if url.https {
        let tls = tls_connect(tcp, &url.host).await?;
        send(TokioIo::new(tls), &url.path, &host, headers).await
    } else {
        send(TokioIo::new(tcp), &url.path, &host, headers).await
    }
}

/// Aborts the connection's task when the request is done (or abandoned at the timeout).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn send<T>(
    io: T,
    path: &str,
    host: &str,
    headers: &[(String, String)],
) -> Result<Response, ProbeFailure>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(io).await.map_err(|e| ProbeFailure::Http(e.to_string()))?;
    let _connection = AbortOnDrop(tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "probe connection ended");
        }
    }));
    let has = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
    let mut builder = http::Request::get(path).header(http::header::HOST, host);
    if !has("user-agent") {
        builder = builder.header(http::header::USER_AGENT, USER_AGENT);
    }
    if !has("accept") {
        builder = builder.header(http::header::ACCEPT, "*/*");
    }
    for (name, value) in headers {
        builder = builder.header(name.as_str(), value.as_str());
    }
    let request = builder
        .body(Empty::<Bytes>::new())
        .map_err(|e| ProbeFailure::Http(format!("invalid request: {e}")))?;
    let response = sender.send_request(request).await.map_err(|e| ProbeFailure::Http(e.to_string()))?;
    let status = response.status().as_u16();
    let location =
        response.headers().get(http::header::LOCATION).and_then(|v| v.to_str().ok()).map(str::to_owned);
    // Read (some of) the body so the server sees its answer taken; only a redirect's is shown.
    let body = Limited::new(response.into_body(), MAX_BODY)
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
        .unwrap_or_default();
    Ok(Response { status, location, body })
}

async fn tls_connect(
    tcp: TcpStream,
    host: &str,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, ProbeFailure> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| ProbeFailure::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    let name = ServerName::try_from(host.to_owned())
        .map_err(|e| ProbeFailure::TlsServerName { host: host.to_owned(), reason: e.to_string() })?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| ProbeFailure::Tls(e.to_string()))
}

/// Accepts any server certificate (the kubelet's HTTPS probes skip verification: a pod's
/// certificate is rarely issued for its IP), while still checking the handshake signatures.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(path: &str) -> Url {
        Url { https: false, host: "10.0.0.5".into(), port: 8080, path: path.into() }
    }

    #[test]
    fn locations_resolve_against_the_current_url() {
        let here = url("/app/health?x=1");
        assert_eq!(here.join("/other"), Some(url("/other")));
        assert_eq!(here.join("ready"), Some(url("/app/ready")));
        assert_eq!(
            here.join("https://example.com/z"),
            Some(Url { https: true, host: "example.com".into(), port: 443, path: "/z".into() })
        );
        assert_eq!(
            here.join("//10.0.0.5:9090"),
            Some(Url { https: false, host: "10.0.0.5".into(), port: 9090, path: "/".into() })
        );
        assert_eq!(here.join("http://[fd00::1]:81/q").map(|u| u.host), Some("fd00::1".to_owned()));
        assert_eq!(here.join("ftp://x/"), None);
        assert_eq!(url("/a b").to_string(), "http://10.0.0.5:8080/a b");
        let v6 = Url { https: true, host: "fd00::1".into(), port: 443, path: "/".into() };
        assert_eq!(v6.to_string(), "https://[fd00::1]:443/");
    }
}
