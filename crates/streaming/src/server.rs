//! [`StreamServer`]: the CRI streaming server. The runtime's `Exec`/`Attach`/`PortForward`
//! answers carry URLs to it; a client upgrades an HTTP/1.1 request on such a URL.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::backend::{AttachRequest, Backend, ExecRequest, PortForwardRequest};
use crate::error::{Error, Result};
use crate::protocol::{self, Endpoint, Protocol};
use crate::tokens::{Pending, TokenCache};

struct Context {
    tokens: TokenCache,
    backend: Arc<dyn Backend>,
    shutdown: CancellationToken,
}

/// The streaming server: hands out single-use URLs and serves them.
pub struct StreamServer {
    addr: SocketAddr,
    ctx: Arc<Context>,
}

impl std::fmt::Debug for StreamServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamServer").field("addr", &self.addr).finish_non_exhaustive()
    }
}

impl StreamServer {
    /// Listens on `addr` (the runtime uses 127.0.0.1:0) and serves until `shutdown` is
    /// cancelled; cancelling also ends the sessions in progress.
    pub async fn start(
        addr: SocketAddr,
        backend: Arc<dyn Backend>,
        shutdown: CancellationToken,
    ) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let ctx = Arc::new(Context { tokens: TokenCache::default(), backend, shutdown });
        tokio::spawn(accept_loop(listener, ctx.clone()));
        tracing::info!(%addr, "streaming server listening");
        Ok(Self { addr, ctx })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn url(&self, path: &str, req: Pending) -> Result<String> {
        let token = self.ctx.tokens.insert(req)?;
        Ok(format!("http://{}/{path}/{token}", self.addr))
    }

    /// Serves one connection accepted elsewhere: a session of the pod-runtime's mutual-TLS
    /// listener, over which a remote kubelet requests the path of a URL this server handed out
    /// (its tokens are the same). Returns at once; the connection is served on its own task.
    pub fn serve_connection<IO>(&self, io: IO)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        tokio::spawn(serve_connection(io, self.ctx.clone()));
    }

    /// The URL for a CRI `ExecResponse` (single use, valid for one minute).
    pub fn exec_url(&self, req: ExecRequest) -> Result<String> {
        check_streams(&req.container_id, req.tty, req.stdin, req.stdout, req.stderr)?;
        if req.cmd.is_empty() {
            return Err(Error::InvalidRequest("cmd must not be empty".into()));
        }
        self.url("exec", Pending::Exec(req))
    }

    /// The URL for a CRI `AttachResponse` (single use, valid for one minute).
    pub fn attach_url(&self, req: AttachRequest) -> Result<String> {
        check_streams(&req.container_id, req.tty, req.stdin, req.stdout, req.stderr)?;
        self.url("attach", Pending::Attach(req))
    }

    /// The URL for a CRI `PortForwardResponse` (single use, valid for one minute).
    pub fn port_forward_url(&self, req: PortForwardRequest) -> Result<String> {
        if req.sandbox_id.is_empty() {
            return Err(Error::InvalidRequest("missing required pod_sandbox_id".into()));
        }
        if let Some(p) = req.ports.iter().find(|p| !(1..=65535).contains(*p)) {
            return Err(Error::InvalidRequest(format!("port {p} is outside 1..=65535")));
        }
        self.url("portforward", Pending::PortForward(req))
    }
}

/// The kubelet's checks of CRI exec/attach requests.
fn check_streams(container_id: &str, tty: bool, stdin: bool, stdout: bool, stderr: bool) -> Result<()> {
    if container_id.is_empty() {
        return Err(Error::InvalidRequest("missing required container_id".into()));
    }
    if tty && stderr {
        return Err(Error::InvalidRequest("tty and stderr cannot both be true".into()));
    }
    if !stdin && !stdout && !stderr {
        return Err(Error::InvalidRequest("one of stdin, stdout, or stderr must be set".into()));
    }
    Ok(())
}

async fn accept_loop(listener: TcpListener, ctx: Arc<Context>) {
    loop {
        let accepted = tokio::select! {
            _ = ctx.shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(serve_connection(stream, ctx.clone()));
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting a streaming connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
    tracing::info!("streaming server stopped");
}

async fn serve_connection<IO>(stream: IO, ctx: Arc<Context>)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let svc_ctx = ctx.clone();
    let svc = service_fn(move |req| handle(svc_ctx.clone(), req));
    let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).with_upgrades();
    tokio::select! {
        r = conn => if let Err(e) = r { tracing::debug!(error = %e, "streaming http connection failed") },
        _ = ctx.shutdown.cancelled() => {}
    }
}

fn text(status: StatusCode, msg: &str) -> Response<Full<Bytes>> {
    let mut res = Response::new(Full::new(Bytes::from(format!("{msg}\n"))));
    *res.status_mut() = status;
    res
}

fn route(path: &str) -> Option<(Endpoint, &str)> {
    let rest = path.strip_prefix('/')?;
    let (kind, token) = rest.split_once('/')?;
    let endpoint = match kind {
        "exec" => Endpoint::Exec,
        "attach" => Endpoint::Attach,
        "portforward" => Endpoint::PortForward,
        _ => return None,
    };
    (!token.is_empty() && !token.contains('/')).then_some((endpoint, token))
}

async fn handle(ctx: Arc<Context>, mut req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let Some((endpoint, token)) = route(req.uri().path()) else {
        return Ok(text(StatusCode::NOT_FOUND, "404 page not found"));
    };
    let token = token.to_string();
    if req.method() != Method::GET && req.method() != Method::POST {
        return Ok(text(StatusCode::METHOD_NOT_ALLOWED, "only GET and POST are allowed"));
    }
    if !ctx.tokens.contains(&token, endpoint) {
        return Ok(text(StatusCode::NOT_FOUND, "404 page not found"));
    }
    // The token is spent only by a successful upgrade, so a client that falls back from one
    // transport to the other can retry the same URL.
    let negotiated = match protocol::negotiate(req.headers(), endpoint) {
        Ok(n) => n,
        Err(rejection) => return Ok(rejection.into_response().map(|b| Full::new(Bytes::from(b)))),
    };
    let Some(pending) = ctx.tokens.consume(&token, endpoint) else {
        return Ok(text(StatusCode::NOT_FOUND, "404 page not found"));
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let session_ctx = ctx.clone();
    let protocol = negotiated.protocol;
    tokio::spawn(async move {
        let upgraded = match on_upgrade.await {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(error = %e, "upgrade failed");
                return;
            }
        };
        let io = TokioIo::new(upgraded);
        tokio::select! {
            r = serve(io, protocol, pending, session_ctx.backend.clone()) => {
                if let Err(e) = r { tracing::warn!(protocol = protocol.name(), error = %e, "streaming session failed") }
            }
            _ = session_ctx.shutdown.cancelled() => {}
        }
    });
    Ok(negotiated.switching_protocols().map(|()| Full::new(Bytes::new())))
}

async fn serve<IO>(io: IO, protocol: Protocol, pending: Pending, backend: Arc<dyn Backend>) -> Result<()>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    match pending {
        Pending::Exec(req) => {
            tracing::info!(container = %req.container_id, protocol = protocol.name(), "exec session started");
            protocol::serve_exec(io, protocol, req, backend).await
        }
        Pending::Attach(req) => {
            tracing::info!(container = %req.container_id, protocol = protocol.name(), "attach session started");
            protocol::serve_attach(io, protocol, req, backend).await
        }
        Pending::PortForward(req) => {
            tracing::info!(sandbox = %req.sandbox_id, protocol = protocol.name(), "port-forward session started");
            protocol::serve_port_forward(io, protocol, req, backend).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route("/exec/abc"), Some((Endpoint::Exec, "abc")));
        assert_eq!(route("/portforward/x"), Some((Endpoint::PortForward, "x")));
        assert_eq!(route("/exec/"), None);
        assert_eq!(route("/exec/a/b"), None);
        assert_eq!(route("/other/a"), None);
    }

    #[test]
    fn exec_requests_are_checked_like_the_kubelet() {
        assert!(check_streams("", false, true, false, false).is_err());
        assert!(check_streams("c", true, false, true, true).is_err());
        assert!(check_streams("c", false, false, false, false).is_err());
        assert!(check_streams("c", true, true, true, false).is_ok());
    }
}
