//! What the streaming server asks of the container runtime: the [`Backend`] trait and the
//! requests and I/O it is handed.

use std::future::Future;
use std::pin::Pin;

use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

/// A boxed future, as returned by [`Backend`] methods.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
/// The reading end a backend gets for a session's stdin.
pub type BoxReader = Box<dyn AsyncRead + Send + Unpin>;
/// The writing end a backend gets for a session's stdout or stderr.
pub type BoxWriter = Box<dyn AsyncWrite + Send + Unpin>;
/// A bidirectional byte stream (a forwarded connection).
pub type BoxStream = Box<dyn AsyncStream>;

/// A byte stream that can be read and written: what [`Backend::port_forward`] returns.
pub trait AsyncStream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> AsyncStream for T {}

/// Run a command in a running container (CRI `Exec`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// The container to run the command in.
    pub container_id: String,
    /// The command and its arguments.
    pub cmd: Vec<String>,
    /// Allocate a terminal (stderr is then merged into stdout).
    pub tty: bool,
    /// Stream the client's stdin to the command.
    pub stdin: bool,
    /// Stream the command's stdout to the client.
    pub stdout: bool,
    /// Stream the command's stderr to the client.
    pub stderr: bool,
}

/// Attach to a running container's main process (CRI `Attach`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachRequest {
    /// The container to attach to.
    pub container_id: String,
    /// The container has a terminal.
    pub tty: bool,
    /// Stream the client's stdin to the container.
    pub stdin: bool,
    /// Stream the container's stdout to the client.
    pub stdout: bool,
    /// Stream the container's stderr to the client.
    pub stderr: bool,
}

/// Forward connections to ports of a pod sandbox (CRI `PortForward`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortForwardRequest {
    /// The sandbox whose network namespace the ports live in.
    pub sandbox_id: String,
    /// The ports the client asked for. Informational only, as upstream: over SPDY the client
    /// names the port of each stream pair and any port is forwarded.
    pub ports: Vec<i32>,
}

/// A terminal size sent by the client on the resize stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct TerminalSize {
    /// Columns.
    #[serde(rename = "Width")]
    pub width: u16,
    /// Rows.
    #[serde(rename = "Height")]
    pub height: u16,
}

/// What a backend gets for one exec/attach session; absent streams are `None`.
///
/// Writes to `stdout`/`stderr` are sent to the client at once (one frame per write), so a
/// backend need not flush. Dropping a writer (or shutting it down) ends that stream for the
/// client. `stdin` reads return EOF when the client closes its stdin.
pub struct Io {
    /// The client's stdin, when requested.
    pub stdin: Option<BoxReader>,
    /// The client's stdout (with tty: the terminal's output), when requested.
    pub stdout: Option<BoxWriter>,
    /// The client's stderr, when requested and not a tty.
    pub stderr: Option<BoxWriter>,
    /// Terminal size changes, when a tty was requested and the protocol carries them.
    pub resize: Option<mpsc::Receiver<TerminalSize>>,
}

impl std::fmt::Debug for Io {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Io")
            .field("stdin", &self.stdin.is_some())
            .field("stdout", &self.stdout.is_some())
            .field("stderr", &self.stderr.is_some())
            .field("resize", &self.resize.is_some())
            .finish()
    }
}

/// The container runtime behind the streaming server.
///
/// `exec` and `attach` end with an exit code (0 = success; a code in 1..=255 is reported to
/// the client as `NonZeroExitCode`, which `kubectl`/`crictl` turn into their own exit code) or
/// an error message that the client prints.
pub trait Backend: Send + Sync + 'static {
    /// Runs `req.cmd` in the container with the session's streams.
    fn exec(&self, req: ExecRequest, io: Io) -> BoxFuture<'_, Result<i32, String>>;
    /// Attaches the session's streams to the container's main process.
    fn attach(&self, req: AttachRequest, io: Io) -> BoxFuture<'_, Result<i32, String>>;
    /// A bidirectional byte stream to `port` on the sandbox's loopback.
    fn port_forward(&self, sandbox_id: &str, port: u16) -> BoxFuture<'_, Result<BoxStream, String>>;
}
