//! Exec, Attach and PortForward sessions behind the CRI streaming server (hpk-streaming).
//!
//! - **exec** without a tty runs `crun exec` in the foreground with the session's streams as
//!   pipes; its exit status is the command's. With a tty, `crun exec --tty --detach` hands the
//!   terminal's master over a console socket; the command, orphaned when crun exits, is
//!   reaped by the sandbox's hpk-pause, whose exit report ends the session. Resizes go to
//!   the master (`TIOCSWINSZ`), which signals the command's process group.
//! - **attach** connects to the container's shim (see [`crate::logshim`]), which sends the
//!   output as it is produced and takes stdin and terminal sizes, until the output ends; the
//!   container's exit code, once reported, is the session's.
//! - **port-forward** connects to the port on the sandbox's loopback from a thread that has
//!   entered the sandbox's network namespace (the socket keeps the namespace it was made in).

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use hpk_streaming::{AttachRequest, Backend, BoxFuture, BoxStream, ExecRequest, Io, TerminalSize};
use k8s_cri::v1 as cri;
use tokio::io::{AsyncRead, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use super::{Error, Result, Runtime};
use crate::engine::ExecIn;
use crate::logshim::frame;

/// How long crun gets to hand over a terminal.
const CONSOLE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a port-forward connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an attach waits, after the output ended, for the container's exit to be reported.
const EXIT_REPORT: Duration = Duration::from_secs(5);
/// How long output still arriving after an exec'd command exited is copied.
const DRAIN: Duration = Duration::from_secs(1);

/// The streaming server's view of the runtime.
#[derive(Debug, Clone)]
pub struct Sessions(pub Arc<Runtime>);

impl Backend for Sessions {
    fn exec(&self, req: ExecRequest, io: Io) -> BoxFuture<'_, std::result::Result<i32, String>> {
        Box::pin(async move { self.0.exec_session(req, io).await.map_err(|e| e.to_string()) })
    }

    fn attach(&self, req: AttachRequest, io: Io) -> BoxFuture<'_, std::result::Result<i32, String>> {
        Box::pin(async move { self.0.attach_session(req, io).await.map_err(|e| e.to_string()) })
    }

    fn port_forward(
        &self,
        sandbox_id: &str,
        port: u16,
    ) -> BoxFuture<'_, std::result::Result<BoxStream, String>> {
        let sandbox_id = sandbox_id.to_owned();
        Box::pin(async move {
            let stream = self.0.port_forward_connect(&sandbox_id, port).await.map_err(|e| e.to_string())?;
            Ok(Box::new(stream) as BoxStream)
        })
    }
}

impl Runtime {
    /// The running container `wanted`: its ID and its sandbox's pause, or why it cannot be
    /// streamed to.
    pub(crate) async fn running_container(&self, wanted: &str) -> Result<(String, String, u32)> {
        let id = self.resolve_container(wanted).await?;
        let state = self.state.lock().await;
        let c =
            state.containers.get(&id).ok_or_else(|| Error::NotFound { kind: "container", id: id.clone() })?;
        if c.state != cri::ContainerState::ContainerRunning {
            return Err(Error::FailedPrecondition(format!(
                "container {id} is not running ({})",
                c.state.as_str_name()
            )));
        }
        Ok((id, c.sandbox_id.clone(), c.pause_pid))
    }

    /// Checks an Exec request before its URL is handed out.
    pub async fn check_exec(&self, req: &cri::ExecRequest) -> Result<()> {
        if req.cmd.is_empty() {
            return Err(Error::Invalid("Exec needs a command".into()));
        }
        check_streams(req.tty, req.stdin, req.stdout, req.stderr)?;
        self.engine.check_tty(req.tty)?;
        self.running_container(&req.container_id).await.map(drop)
    }

    /// Checks an Attach request before its URL is handed out: stdin and a terminal only
    /// where the container was created with them.
    pub async fn check_attach(&self, req: &cri::AttachRequest) -> Result<()> {
        check_streams(req.tty, req.stdin, req.stdout, req.stderr)?;
        let (id, _, _) = self.running_container(&req.container_id).await?;
        let state = self.state.lock().await;
        let c =
            state.containers.get(&id).ok_or_else(|| Error::NotFound { kind: "container", id: id.clone() })?;
        if req.stdin && !c.config.stdin {
            return Err(Error::Invalid(format!("container {id} was not created with stdin")));
        }
        if req.tty && !c.config.tty {
            return Err(Error::Invalid(format!("container {id} has no terminal")));
        }
        Ok(())
    }

    /// Checks a PortForward request before its URL is handed out.
    pub async fn check_port_forward(&self, req: &cri::PortForwardRequest) -> Result<()> {
        if let Some(bad) = req.port.iter().find(|p| !(1..=65535).contains(*p)) {
            return Err(Error::Invalid(format!("port {bad} is not a valid TCP port")));
        }
        self.ready_sandbox(&req.pod_sandbox_id).await.map(drop)
    }

    async fn ready_sandbox(&self, wanted: &str) -> Result<u32> {
        let id = self.resolve_sandbox(wanted).await?;
        let state = self.state.lock().await;
        let s =
            state.sandboxes.get(&id).ok_or_else(|| Error::NotFound { kind: "sandbox", id: id.clone() })?;
        if !s.ready {
            return Err(Error::FailedPrecondition(format!("sandbox {id} is not ready")));
        }
        Ok(s.pause_pid)
    }

    async fn exec_session(&self, req: ExecRequest, io: Io) -> Result<i32> {
        let (id, sandbox_id, pause_pid) = self.running_container(&req.container_id).await?;
        let scratch = tempfile::Builder::new()
            .prefix("exec-")
            .tempdir_in(self.container_dir(&id))
            .map_err(|e| Error::io("create", self.container_dir(&id), e))?;
        // Dropped with this future (the client went away): the command is killed.
        let guard = super::exec::SessionGuard::new(pause_pid, scratch.path().join("pid"));
        let code = if req.tty {
            self.exec_tty(&id, &sandbox_id, pause_pid, &req.cmd, scratch.path(), io).await
        } else {
            self.exec_pipes(&id, pause_pid, &req.cmd, scratch.path(), io).await
        };
        guard.disarm();
        code
    }

    async fn exec_pipes(
        &self,
        id: &str,
        pause_pid: u32,
        cmd: &[String],
        scratch: &Path,
        io: Io,
    ) -> Result<i32> {
        let (pid_file, log) = (scratch.join("pid"), scratch.join("crun.log"));
        let dir = self.container_dir(id);
        let exec = ExecIn { id, dir: &dir, pause_pid, cmd, scratch, pid_file: &pid_file, log: &log };
        let mut command = self.engine.exec(exec)?;
        command.stdin(if io.stdin.is_some() { Stdio::piped() } else { Stdio::null() }).kill_on_drop(true);
        let mut child =
            command.spawn().map_err(|e| Error::io("run crun exec in", self.container_dir(id), e))?;
        let stdin = match (io.stdin, child.stdin.take()) {
            (Some(mut from), Some(mut to)) => Some(tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from, &mut to).await;
                let _ = to.shutdown().await;
            })),
            _ => None,
        };
        let out = copy_out(child.stdout.take(), io.stdout);
        let err = copy_out(child.stderr.take(), io.stderr);
        let (status, _, _) = tokio::join!(child.wait(), out, err);
        if let Some(stdin) = stdin {
            stdin.abort();
        }
        let status = status.map_err(|e| Error::io("wait for crun exec in", self.container_dir(id), e))?;
        let code = super::exec::exit_code(status);
        let crun_log = std::fs::read_to_string(&log).unwrap_or_default();
        super::exec::exec_status(id, code, &crun_log)
    }

    async fn exec_tty(
        &self,
        id: &str,
        sandbox_id: &str,
        pause_pid: u32,
        cmd: &[String],
        scratch: &Path,
        io: Io,
    ) -> Result<i32> {
        let (pid_file, log) = (scratch.join("pid"), scratch.join("crun.log"));
        // A UNIX socket path has at most 107 bytes: the console socket lives in a short
        // directory beside the events sockets, not under the container's.
        let short = self.config.state.join("ev");
        let console_dir = tempfile::Builder::new()
            .prefix("tty")
            .tempdir_in(&short)
            .map_err(|e| Error::io("create", &short, e))?;
        let console = console_dir.path().join("c.sock");
        let listener = std::os::unix::net::UnixListener::bind(&console)
            .map_err(|e| Error::io("listen on", &console, e))?;
        // crun connects once and sends the terminal's master (the shim takes terminals the same way).
        let receive = tokio::task::spawn_blocking(move || {
            listener.accept().and_then(|(conn, _)| crate::logshim::receive_fd(&conn))
        });
        let dir = self.container_dir(id);
        let exec = ExecIn { id, dir: &dir, pause_pid, cmd, scratch, pid_file: &pid_file, log: &log };
        let status = self
            .engine
            .exec_tty(exec, &console)?
            .status()
            .await
            .map_err(|e| Error::io("run crun exec in", self.container_dir(id), e))?;
        if !status.success() {
            receive.abort();
            let crun_log = std::fs::read_to_string(&log).unwrap_or_default();
            let code = super::exec::exit_code(status);
            // crun could not start the command (not found, not executable): a shell's code.
            return super::exec::exec_status(id, code, &crun_log);
        }
        let master = tokio::time::timeout(CONSOLE_TIMEOUT, receive)
            .await
            .map_err(|_| Error::Timeout(format!("crun handed over no terminal within {CONSOLE_TIMEOUT:?}")))?
            .map_err(|e| Error::io("receive", &console, std::io::Error::other(e.to_string())))?
            .map_err(|e| Error::io("receive the terminal from", &console, e))?;
        let pid: i32 =
            std::fs::read_to_string(&pid_file).ok().and_then(|s| s.trim().parse().ok()).ok_or_else(|| {
                Error::FailedPrecondition(format!("crun exec left no PID in {}", pid_file.display()))
            })?;
        let exited = self.exit_of(sandbox_id, pid).await;
        debug!(container = %id, pid, "tty exec started");
        let master = std::fs::File::from(master);
        let reader = master.try_clone().map_err(|e| Error::io("duplicate", &console, e))?;
        let writer = master.try_clone().map_err(|e| Error::io("duplicate", &console, e))?;
        if let Some(resize) = io.resize {
            tokio::spawn(apply_resizes(master, resize));
        }
        let stdin = io.stdin.map(|mut from| {
            tokio::spawn(async move {
                let mut to = tokio::fs::File::from_std(writer);
                let _ = tokio::io::copy(&mut from, &mut to).await;
            })
        });
        let output = tokio::spawn(copy_out(Some(tokio::fs::File::from_std(reader)), io.stdout));
        let code = exited.await.unwrap_or(255);
        // What the command wrote just before it exited is still in the terminal.
        let _ = tokio::time::timeout(DRAIN, output).await;
        if let Some(stdin) = stdin {
            stdin.abort();
        }
        Ok(code)
    }

    /// Resolves to the exit status of process `pid` of the sandbox, as its pause reports it.
    async fn exit_of(&self, sandbox_id: &str, pid: i32) -> oneshot::Receiver<i32> {
        let (tx, rx) = oneshot::channel();
        let mut state = self.state.lock().await;
        match state.sandboxes.get_mut(sandbox_id) {
            Some(sandbox) => match sandbox.unclaimed_exits.remove(&pid) {
                Some(status) => {
                    let _ = tx.send(status);
                }
                None => {
                    sandbox.exit_waiters.insert(pid, tx);
                }
            },
            None => drop(tx),
        }
        rx
    }

    async fn attach_session(&self, req: AttachRequest, io: Io) -> Result<i32> {
        let (id, sandbox_id, _) = self.running_container(&req.container_id).await?;
        let mut exited = {
            let state = self.state.lock().await;
            let c = state
                .containers
                .get(&id)
                .ok_or_else(|| Error::NotFound { kind: "container", id: id.clone() })?;
            c.exited.subscribe()
        };
        let socket = self.attach_socket(&sandbox_id, &id);
        let conn = tokio::net::UnixStream::connect(&socket).await.map_err(|e| {
            Error::FailedPrecondition(format!(
                "container {id}'s streams cannot be attached to ({e}): its output has ended"
            ))
        })?;
        let (mut from_shim, mut to_shim) = conn.into_split();
        // Client to shim: stdin, its end, terminal sizes. Writes are serialised by a channel.
        let (frames, mut outgoing) = mpsc::channel::<Vec<u8>>(16);
        let writer = tokio::spawn(async move {
            while let Some(frame) = outgoing.recv().await {
                if to_shim.write_all(&frame).await.is_err() {
                    return;
                }
            }
        });
        let mut feeders = Vec::new();
        if let Some(mut stdin) = io.stdin {
            let frames = frames.clone();
            feeders.push(tokio::spawn(async move {
                let mut buf = vec![0u8; 32 * 1024];
                loop {
                    match tokio::io::AsyncReadExt::read(&mut stdin, &mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if frames.send(frame::encode(frame::STDIN, &buf[..n])).await.is_err() {
                                return;
                            }
                        }
                    }
                }
                let _ = frames.send(frame::encode(frame::STDIN_EOF, &[])).await;
            }));
        }
        if let Some(mut resize) = io.resize {
            let frames = frames.clone();
            feeders.push(tokio::spawn(async move {
                while let Some(size) = resize.recv().await {
                    let mut payload = size.width.to_be_bytes().to_vec();
                    payload.extend_from_slice(&size.height.to_be_bytes());
                    if frames.send(frame::encode(frame::RESIZE, &payload)).await.is_err() {
                        return;
                    }
                }
            }));
        }
        drop(frames);
        // Shim to client: output until the container's output ends.
        let (mut stdout, mut stderr) = (io.stdout, io.stderr);
        let mut inbound = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        'read: loop {
            let n = match tokio::io::AsyncReadExt::read(&mut from_shim, &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            inbound.extend_from_slice(&buf[..n]);
            while let Some((kind, payload)) =
                frame::decode(&mut inbound, 2 * 1024 * 1024).map_err(Error::FailedPrecondition)?
            {
                let target = if kind == frame::STDERR { stderr.as_mut() } else { stdout.as_mut() };
                if let Some(target) = target
                    && target.write_all(&payload).await.is_err()
                {
                    // The client left.
                    break 'read;
                }
            }
        }
        for feeder in feeders {
            feeder.abort();
        }
        writer.abort();
        // The output ended with the container (or the client left); its status follows.
        let _ = tokio::time::timeout(EXIT_REPORT, exited.wait_for(|e| *e)).await;
        let state = self.state.lock().await;
        let c = state.containers.get(&id);
        Ok(c.filter(|c| c.state == cri::ContainerState::ContainerExited).map(|c| c.exit_code).unwrap_or(0))
    }

    async fn port_forward_connect(&self, sandbox_id: &str, port: u16) -> Result<tokio::net::TcpStream> {
        let pause_pid = self.ready_sandbox(sandbox_id).await?;
        let ns_path = format!("/proc/{pause_pid}/ns/net");
        let (tx, rx) = oneshot::channel();
        // A thread of its own: entering a network namespace changes the calling thread only,
        // and this thread ends right after.
        std::thread::Builder::new()
            .name("port-forward".into())
            .spawn(move || {
                let _ = tx.send(connect_in(&ns_path, port));
            })
            .map_err(|e| Error::io("start a thread for", "port-forward", e))?;
        let stream = rx
            .await
            .map_err(|_| Error::FailedPrecondition("the port-forward thread ended without an answer".into()))?
            .map_err(|e| {
                Error::Unavailable(format!("connecting to port {port} in sandbox {sandbox_id}: {e}"))
            })?;
        stream.set_nonblocking(true).map_err(|e| Error::io("configure", "port-forward socket", e))?;
        tokio::net::TcpStream::from_std(stream).map_err(|e| Error::io("register", "port-forward socket", e))
    }
}

/// CRI's rules for the streams of an exec or attach.
fn check_streams(tty: bool, stdin: bool, stdout: bool, stderr: bool) -> Result<()> {
    if !(stdin || stdout || stderr) {
        return Err(Error::Invalid("one of stdin, stdout, or stderr must be set".into()));
    }
    if tty && stderr {
        return Err(Error::Invalid("tty and stderr cannot both be true".into()));
    }
    Ok(())
}

/// Copies `from` into `to` until `from` ends (a terminal's EIO counts as the end) or `to`
/// goes away.
async fn copy_out(from: Option<impl AsyncRead + Unpin>, to: Option<hpk_streaming::BoxWriter>) {
    let Some(mut from) = from else { return };
    let mut buf = vec![0u8; 32 * 1024];
    let mut to = to;
    loop {
        let n = match tokio::io::AsyncReadExt::read(&mut from, &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(out) = to.as_mut()
            && out.write_all(&buf[..n]).await.is_err()
        {
            // The client left: keep draining so the command never blocks on output.
            to = None;
        }
    }
    if let Some(mut out) = to {
        let _ = out.shutdown().await;
    }
}

async fn apply_resizes(master: std::fs::File, mut resize: mpsc::Receiver<TerminalSize>) {
    while let Some(size) = resize.recv().await {
        let winsize =
            rustix::termios::Winsize { ws_row: size.height, ws_col: size.width, ws_xpixel: 0, ws_ypixel: 0 };
        if let Err(e) = rustix::termios::tcsetwinsize(&master, winsize) {
            warn!(error = %e, "resizing the terminal failed");
        }
    }
}

/// Connects to `127.0.0.1:port` (then `[::1]:port`) in the network namespace at `ns_path`.
fn connect_in(ns_path: &str, port: u16) -> std::io::Result<std::net::TcpStream> {
    let ns = std::fs::File::open(ns_path)?;
    nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
    let v4 = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    match std::net::TcpStream::connect_timeout(&v4, CONNECT_TIMEOUT) {
        Ok(stream) => Ok(stream),
        Err(e) => {
            let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
            std::net::TcpStream::connect_timeout(&v6, CONNECT_TIMEOUT).map_err(|_| e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_follow_cri_rules() {
        assert!(check_streams(false, false, false, false).is_err());
        assert!(check_streams(true, true, true, true).is_err());
        assert!(check_streams(true, true, true, false).is_ok());
        assert!(check_streams(false, false, true, true).is_ok());
    }
}
