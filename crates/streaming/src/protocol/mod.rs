//! The streaming protocols on an already-upgraded connection, for servers that do their own
//! HTTP (the kubelet's HTTPS API will): [`negotiate`] a request, answer with
//! [`Negotiated::switching_protocols`], then hand the upgraded connection to [`serve_exec`],
//! [`serve_attach`] or [`serve_port_forward`].

mod negotiate;
mod portforward;
mod spdy_command;
mod tunnel;
mod websocket_command;

use std::future::Future;
use std::sync::Arc;

pub use negotiate::{
    ACCEPTED_STREAM_PROTOCOL_VERSIONS, Endpoint, Negotiated, Protocol, Rejection, SPDY_PORT_FORWARD,
    SPDY_REMOTE_COMMAND, STREAM_PROTOCOL_VERSION, WEBSOCKET_PORT_FORWARD, WEBSOCKET_REMOTE_COMMAND,
    negotiate,
};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::backend::{AttachRequest, Backend, ExecRequest, Io, PortForwardRequest};
use crate::error::{Error, Result};

/// How long the client has to open its streams after the upgrade (upstream's default).
pub const STREAM_CREATION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Which streams an exec/attach session carries.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamOpts {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// Serves one exec session on an upgraded connection until the command ends.
pub async fn serve_exec<IO>(
    io: IO,
    protocol: Protocol,
    req: ExecRequest,
    backend: Arc<dyn Backend>,
) -> Result<()>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let opts =
        StreamOpts { stdin: req.stdin, stdout: req.stdout, stderr: req.stderr && !req.tty, tty: req.tty };
    let run = move |io: Io| async move { backend.exec(req, io).await };
    remote_command(io, protocol, opts, "error executing command in container", run).await
}

/// Serves one attach session on an upgraded connection until the backend returns.
pub async fn serve_attach<IO>(
    io: IO,
    protocol: Protocol,
    req: AttachRequest,
    backend: Arc<dyn Backend>,
) -> Result<()>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let opts =
        StreamOpts { stdin: req.stdin, stdout: req.stdout, stderr: req.stderr && !req.tty, tty: req.tty };
    let run = move |io: Io| async move { backend.attach(req, io).await };
    remote_command(io, protocol, opts, "error attaching to container", run).await
}

/// Serves one port-forward session on an upgraded connection until the client hangs up.
pub async fn serve_port_forward<IO>(
    io: IO,
    protocol: Protocol,
    req: PortForwardRequest,
    backend: Arc<dyn Backend>,
) -> Result<()>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    match protocol {
        Protocol::SpdyPortForward => portforward::serve(io, req, backend).await,
        Protocol::WebSocketSpdyTunnel => {
            portforward::serve(tunnel::spdy_over_websocket(io).await, req, backend).await
        }
        other => Err(Error::InvalidRequest(format!("{} does not carry port-forward", other.name()))),
    }
}

async fn remote_command<IO, F, Fut>(
    io: IO,
    protocol: Protocol,
    opts: StreamOpts,
    verb: &'static str,
    run: F,
) -> Result<()>
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    F: FnOnce(Io) -> Fut + Send,
    Fut: Future<Output = std::result::Result<i32, String>> + Send,
{
    match protocol {
        Protocol::SpdyRemoteCommand(version) => spdy_command::serve(io, version, opts, verb, run).await,
        Protocol::WebSocketChannel(version) => websocket_command::serve(io, version, opts, verb, run).await,
        other => Err(Error::InvalidRequest(format!("{} does not carry exec/attach", other.name()))),
    }
}
