//! Why one probe attempt failed, by cause. Each says itself in the words the kubelet's
//! Unhealthy events use (Go's net/http and gRPC phrasing), which is what users search for.

use std::time::Duration;

/// Why a probe attempt failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProbeFailure {
    /// The probe names no handler.
    #[error("the probe has no handler (exec, httpGet, tcpSocket or grpc)")]
    NoHandler,
    /// The probe names several handlers.
    #[error("the probe has more than one handler; exactly one of exec, httpGet, tcpSocket, grpc")]
    ManyHandlers,
    /// A port outside 1–65535.
    #[error("invalid port number: {0}")]
    InvalidPort(i32),
    /// A named port the container does not declare.
    #[error("port {name:?} not found in container {container:?}")]
    PortNotFound {
        /// The port's name.
        name: String,
        /// The container.
        container: String,
    },
    /// No host given and the pod has no address yet.
    #[error("the pod has no IP address yet")]
    NoPodIp,
    /// An exec probe without a command.
    #[error("the exec probe has no command")]
    NoCommand,
    /// The command exited non-zero.
    #[error("command {command:?} exited with {code}{}", colon(.output))]
    Exited {
        /// The command, space-joined.
        command: String,
        /// Its exit code.
        code: i32,
        /// Its output (stdout then stderr, capped), trimmed.
        output: String,
    },
    /// The command ran out of time.
    #[error("command {command:?} timed out")]
    ExecTimedOut {
        /// The command, space-joined.
        command: String,
    },
    /// The runtime could not run the command.
    #[error("command {command:?} could not run: {message}")]
    ExecFailed {
        /// The command, space-joined.
        command: String,
        /// The runtime's message.
        message: String,
    },
    /// A TCP connection failed.
    #[error("dial tcp {addr}: {cause}")]
    Dial {
        /// `host:port`.
        addr: String,
        /// Why, in Go's words (`connect: connection refused`).
        cause: String,
    },
    /// A TCP connection did not complete in time.
    #[error("dial tcp {addr}: i/o timeout")]
    DialTimeout {
        /// `host:port`.
        addr: String,
    },
    /// An httpGet scheme other than HTTP or HTTPS.
    #[error("unsupported scheme {0:?}")]
    UnsupportedScheme(String),
    /// A GET failed.
    #[error("Get {url:?}: {cause}")]
    Get {
        /// The URL.
        url: String,
        /// Why.
        cause: Box<ProbeFailure>,
    },
    /// A GET found no answer in time.
    #[error("Get {url:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)")]
    GetTimeout {
        /// The URL.
        url: String,
    },
    /// The answer's status is not 200–399.
    #[error("HTTP probe failed with statuscode: {0}")]
    HttpStatus(u16),
    /// Too many redirects on the same host.
    #[error("Get {url:?}: stopped after {max} redirects")]
    TooManyRedirects {
        /// The last URL.
        url: String,
        /// The limit.
        max: usize,
    },
    /// The HTTP exchange failed (handshake, request, answer).
    #[error("{0}")]
    Http(String),
    /// The TLS handshake failed.
    #[error("tls: {0}")]
    Tls(String),
    /// The host is no TLS server name.
    #[error("tls: server name {host:?}: {reason}")]
    TlsServerName {
        /// The host.
        host: String,
        /// Why not.
        reason: String,
    },
    /// A gRPC address that is no URI.
    #[error("invalid address {addr:?}: {reason}")]
    GrpcAddress {
        /// `host:port`.
        addr: String,
        /// Why not.
        reason: String,
    },
    /// The gRPC connection failed or took too long.
    #[error("timeout: failed to connect service {addr:?} within {timeout:?}: {cause}")]
    GrpcConnect {
        /// `host:port`.
        addr: String,
        /// The probe's timeout.
        timeout: Duration,
        /// Why.
        cause: String,
    },
    /// The server has no health service.
    #[error("this server does not implement the grpc health protocol (grpc.health.v1.Health): {0}")]
    GrpcUnimplemented(String),
    /// The health RPC took too long.
    #[error("timeout: health rpc did not complete within {0:?}")]
    GrpcTimeout(Duration),
    /// The health RPC failed.
    #[error("error: health rpc probe failed: {0}")]
    GrpcFailed(String),
    /// The service answered other than SERVING.
    #[error("service unhealthy (responded with {0:?})")]
    GrpcUnhealthy(&'static str),
    /// The remote runtime ran the probe (connector mode) and it failed: its words.
    #[error("{0}")]
    Remote(String),
    /// The remote runtime did not run the probe (connector mode): the link's error.
    #[error("the remote runtime did not run the probe: {0}")]
    RemoteUnavailable(String),
}

/// `": output"`, or nothing for no output.
fn colon(output: &str) -> String {
    if output.is_empty() { String::new() } else { format!(": {output}") }
}
