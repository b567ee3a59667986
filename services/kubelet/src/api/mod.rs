//! The kubelet API on `--kubelet-port` (10250): HTTPS with the serving certificate from the
//! cert-signer, each request authenticated and authorized ([`auth`]), then routed
//! ([`routes`]): container logs (`hpk_cri_logs`), exec/attach/port-forward proxied to the runtime's
//! streaming server ([`proxy`]), `/stats/summary` and `/metrics/resource` ([`stats`]), the
//! kubelet's own `/metrics` ([`metrics`]), `/pods`, `/healthz`.

pub mod auth;
mod lookup;
pub mod metrics;
pub mod proxy;
pub mod routes;
mod start;
pub mod stats;
pub mod tls;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hpk_rpc::log_limit::LogLimit;
use http::{Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

pub use routes::KubeletApi;
pub use start::{Prepared, prepare};

/// A response body: whole, or streamed (followed logs).
pub type Body = UnsyncBoxBody<Bytes, std::io::Error>;

/// How long a client gets to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client gets to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

/// A whole body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|never: Infallible| match never {}).boxed_unsync()
}

/// A refusal: the status and a message for the client (text/plain, as the kubelet answers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for the user.
    pub message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }

    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// 503.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// The response.
    pub fn response(&self) -> Response<Body> {
        let mut body = self.message.clone();
        body.push('\n');
        let mut response = Response::new(full(body));
        *response.status_mut() = self.status;
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain; charset=utf-8"));
        response
    }
}

/// Who is on the other end of a connection, as far as TLS tells.
#[derive(Clone, Debug)]
pub enum Peer {
    /// No client certificate.
    Anonymous,
    /// A certificate the client CA signed: user and groups.
    Certificate(auth::User),
    /// A verified certificate whose subject could not be read.
    Unreadable(String),
}

/// Accepts connections on `listener` until `shutdown`; each is served on a task of its own.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    api: Arc<KubeletApi>,
    shutdown: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(tls);
    // Any client can fail a handshake at will: a few lines every 10 s, then a count (review M6).
    let refused = Arc::new(LogLimit::default());
    let timed_out = Arc::new(LogLimit::default());
    loop {
        let (tcp, remote) = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(error) => {
                    // Out of descriptors and the like: wait a moment rather than spin.
                    tracing::warn!(%error, "kubelet API: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (acceptor, api, shutdown) = (acceptor.clone(), api.clone(), shutdown.clone());
        let (refused, timed_out) = (refused.clone(), timed_out.clone());
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    if let Some(dropped) = refused.admit() {
                        if let Some(summary) = refused.summary(dropped) {
                            tracing::info!(dropped, "kubelet API: {summary}");
                        }
                        tracing::info!(%remote, %error, "kubelet API: TLS handshake refused");
                    }
                    return;
                }
                Err(_) => {
                    if let Some(dropped) = timed_out.admit() {
                        if let Some(summary) = timed_out.summary(dropped) {
                            tracing::info!(dropped, "kubelet API: {summary}");
                        }
                        tracing::info!(%remote, "kubelet API: TLS handshake timed out");
                    }
                    return;
                }
            };
            let peer = match tls.get_ref().1.peer_certificates().and_then(|c| c.first()) {
                None => Peer::Anonymous,
                Some(der) => match tls::certificate_user(der) {
                    Ok((name, groups)) => Peer::Certificate(auth::User::from_certificate(name, groups)),
                    Err(e) => Peer::Unreadable(e.to_string()),
                },
            };
            let service = hyper::service::service_fn(move |req| {
                let (api, peer) = (api.clone(), peer.clone());
                async move { Ok::<_, Infallible>(api.handle(&peer, req).await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(tls), service)
                .with_upgrades();
            tokio::select! {
                () = shutdown.cancelled() => {}
                served = connection => if let Err(error) = served {
                    tracing::debug!(%remote, %error, "kubelet API connection ended");
                }
            }
        });
    }
}
