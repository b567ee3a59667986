//! Exec, attach and port-forward: the kubelet asks the runtime (CRI `Exec`/`Attach`/
//! `PortForward`) for a single-use URL on its streaming server and proxies the client's
//! upgrade request there, then copies bytes both ways. SPDY/3.1 and WebSocket sessions pass
//! through unchanged, as with the upstream kubelet's streaming proxy; the runtime's server
//! negotiates the subprotocol and answers bad upgrades itself.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

use super::{ApiError, Body, full};

/// How long connecting to the runtime's streaming server and its answer may take.
const BACKEND_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a refusal's body passed back to the client.
const REFUSAL_MAX: usize = 64 * 1024;

/// Request headers not passed to the runtime: credentials stay with the kubelet.
const DROPPED: [header::HeaderName; 3] = [header::AUTHORIZATION, header::HOST, header::PROXY_AUTHORIZATION];

/// Refuses a streaming request that is not an upgrade, before the runtime is asked for a URL
/// (each one holds a single-use token there for a minute).
pub fn require_upgrade(req: &Request<Incoming>) -> Result<(), ApiError> {
    if req.headers().contains_key(header::UPGRADE) {
        Ok(())
    } else {
        Err(ApiError::bad_request("Upgrade request required"))
    }
}

/// Proxies upgrade request `req` to `url` (`http://127.0.0.1:PORT/...` from the runtime);
/// `session` counts the session as open until its bytes stop flowing. With `remote` (connector
/// mode) the URL's path is requested over a mutual-TLS session to the remote runtime's port
/// instead: its streaming server takes its sessions there, and its loopback address means
/// nothing here.
pub async fn upgrade(
    mut req: Request<Incoming>,
    url: &str,
    remote: Option<&crate::cri::StreamLink>,
    session: super::metrics::Session,
) -> Result<Response<Body>, ApiError> {
    require_upgrade(&req)?;
    let target: http::Uri =
        url.parse().map_err(|e| ApiError::internal(format!("the runtime's streaming URL {url:?}: {e}")))?;
    let authority = target
        .authority()
        .filter(|_| target.scheme_str() == Some("http"))
        .ok_or_else(|| {
            ApiError::internal(format!("the runtime's streaming URL {url:?} is not http://HOST:PORT"))
        })?
        .clone();
    let mut sender = match remote {
        Some(link) => {
            let stream = tokio::time::timeout(BACKEND_TIMEOUT, link.connect())
                .await
                .map_err(|_| ApiError::unavailable("the remote runtime did not accept in time"))?
                .map_err(|e| {
                    ApiError::unavailable(format!("the remote runtime at {}: {e}", link.authority))
                })?;
            handshake(stream).await?
        }
        None => {
            let stream =
                tokio::time::timeout(BACKEND_TIMEOUT, tokio::net::TcpStream::connect(authority.as_str()))
                    .await
                    .map_err(|_| {
                        ApiError::unavailable("the runtime's streaming server did not accept in time")
                    })?
                    .map_err(|e| ApiError::unavailable(format!("the runtime's streaming server: {e}")))?;
            handshake(stream).await?
        }
    };
    let mut outgoing = Request::builder()
        .method(req.method().clone())
        .uri(target.path_and_query().map_or("/", http::uri::PathAndQuery::as_str))
        .body(Empty::<Bytes>::new())
        .map_err(|e| ApiError::internal(e.to_string()))?;
    for (name, value) in req.headers() {
        if !DROPPED.contains(name) {
            outgoing.headers_mut().append(name.clone(), value.clone());
        }
    }
    outgoing.headers_mut().insert(
        header::HOST,
        HeaderValue::from_str(authority.as_str()).map_err(|e| ApiError::internal(e.to_string()))?,
    );
    let client_side = hyper::upgrade::on(&mut req);
    let mut answer = tokio::time::timeout(BACKEND_TIMEOUT, sender.send_request(outgoing))
        .await
        .map_err(|_| ApiError::unavailable("the runtime's streaming server did not answer in time"))?
        .map_err(|e| ApiError::unavailable(format!("the runtime's streaming server: {e}")))?;

    if answer.status() != StatusCode::SWITCHING_PROTOCOLS {
        // A refusal (no common subprotocol, bad upgrade): passed on as it is.
        let status = answer.status();
        let headers = answer.headers().clone();
        let body = Limited::new(answer.into_body(), REFUSAL_MAX)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let mut response = Response::new(full(body));
        *response.status_mut() = status;
        for name in
            [header::CONTENT_TYPE, header::HeaderName::from_static("x-accepted-stream-protocol-versions")]
        {
            if let Some(v) = headers.get(&name) {
                response.headers_mut().insert(name, v.clone());
            }
        }
        return Ok(response);
    }

    let backend_side = hyper::upgrade::on(&mut answer);
    let mut response = Response::new(full(Bytes::new()));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *response.headers_mut() = answer.headers().clone();
    tokio::spawn(async move {
        let _session = session;
        let (client, backend) = match tokio::join!(client_side, backend_side) {
            (Ok(c), Ok(b)) => (c, b),
            (Err(e), _) | (_, Err(e)) => {
                tracing::debug!(error = %e, "stream upgrade failed");
                return;
            }
        };
        let (mut client, mut backend) = (TokioIo::new(client), TokioIo::new(backend));
        // Ends when either side closes: the other connection is dropped with it, so a client
        // that goes away ends its session on the runtime too.
        // 64 KiB buffers (tokio's default is 8 KiB): fewer TLS records and wake-ups per byte
        // of a port-forward or a large exec output.
        let copied =
            tokio::io::copy_bidirectional_with_sizes(&mut client, &mut backend, 64 << 10, 64 << 10).await;
        tracing::debug!(?copied, "stream session ended");
    });
    Ok(response)
}

/// An HTTP/1.1 client connection on `stream`, driven on its own task with upgrades.
async fn handshake<S>(stream: S) -> Result<hyper::client::conn::http1::SendRequest<Empty<Bytes>>, ApiError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ApiError::unavailable(format!("the runtime's streaming server: {e}")))?;
    tokio::spawn(async move {
        if let Err(error) = connection.with_upgrades().await {
            tracing::debug!(%error, "streaming backend connection ended");
        }
    });
    Ok(sender)
}
