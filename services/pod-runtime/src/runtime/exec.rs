//! ExecSync: a command run to completion in a running container, output captured.
//!
//! `crun exec` runs through the container's crun (inside the sandbox's PID namespace), so the
//! command sees the pod's processes and crun's PIDs are the sandbox's. crun waits for the
//! command and exits with its status (128+N for a signal), which becomes the exit code.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_cri::v1 as cri;
use tokio::io::{AsyncRead, AsyncReadExt};
use tracing::{debug, warn};

use super::{Error, Result, Runtime};
use crate::engine::{self, ExecIn};

/// The most of each stream kept; the rest is read and dropped so the command never blocks.
const OUTPUT_CAP: usize = 16 * 1024 * 1024;

/// How long crun gets to exit once the command it waits for is killed.
const KILL_GRACE: Duration = Duration::from_secs(5);

/// What a command run by ExecSync produced.
#[derive(Debug)]
pub struct ExecOutput {
    /// Its stdout, at most 16 MiB.
    pub stdout: Vec<u8>,
    /// Its stderr, at most 16 MiB, plus a note if either stream was cut.
    pub stderr: Vec<u8>,
    /// Its exit code; 128+N when killed by signal N.
    pub exit_code: i32,
}

impl Runtime {
    /// Runs `cmd` in the running container `wanted`, without a tty, and returns its output
    /// and exit code; `timeout_seconds > 0` bounds it (the command is then killed).
    pub async fn exec_sync(
        &self,
        wanted: &str,
        cmd: Vec<String>,
        timeout_seconds: i64,
    ) -> Result<ExecOutput> {
        let id = self.resolve_container(wanted).await?;
        if cmd.is_empty() {
            return Err(Error::Invalid("ExecSync needs a command".into()));
        }
        let (pause_pid, init) = {
            let state = self.state.lock().await;
            let c = state
                .containers
                .get(&id)
                .ok_or_else(|| Error::NotFound { kind: "container", id: id.clone() })?;
            if c.state != cri::ContainerState::ContainerRunning {
                return Err(Error::FailedPrecondition(format!(
                    "container {id} is not running ({}): exec needs a running container",
                    c.state.as_str_name()
                )));
            }
            (c.pause_pid, c.sandbox_pid)
        };
        let not_running =
            || Error::FailedPrecondition(format!("container {id} is not running: its init has exited"));
        init.filter(|pid| sandbox_processes(pause_pid).iter().any(|p| p.sandbox_pid == *pid))
            .ok_or_else(not_running)?;
        // The pid file and crun's log live beside the container's bundle: crun must see them
        // from the mount namespace it runs in, which may not be ours.
        let scratch = tempfile::Builder::new()
            .prefix("exec-")
            .tempdir_in(self.container_dir(&id))
            .map_err(|e| Error::io("create", self.container_dir(&id), e))?;
        let (pid_file, log) = (scratch.path().join("pid"), scratch.path().join("crun.log"));
        let child = self
            .engine
            .exec(ExecIn {
                id: &id,
                dir: &self.container_dir(&id),
                pause_pid,
                cmd: &cmd,
                scratch: scratch.path(),
                pid_file: &pid_file,
                log: &log,
            })?
            .spawn()
            .map_err(|e| Error::io("run crun exec in", self.container_dir(&id), e))?;
        let mut running = Running { child, pause_pid, pid_file, finished: false };
        let (stdout, stderr) = (running.child.stdout.take(), running.child.stderr.take());
        let run = async { tokio::join!(running.child.wait(), read_capped(stdout), read_capped(stderr)) };
        let limit = u64::try_from(timeout_seconds).ok().filter(|s| *s > 0).map(Duration::from_secs);
        let finished = match limit {
            Some(limit) => tokio::time::timeout(limit, run).await.ok(),
            None => Some(run.await),
        };
        let Some((status, out, err)) = finished else {
            running.kill().await;
            warn!(container = %id, ?cmd, timeout_seconds, "exec timed out, killed");
            return Err(Error::Timeout(format!(
                "command {cmd:?} in container {id} did not finish within {timeout_seconds} s; it was killed"
            )));
        };
        running.finished = true;
        let status = status.map_err(|e| Error::io("wait for crun exec in", self.container_dir(&id), e))?;
        let code = exit_code(status);
        let output = interpret(&id, code, out, err, &std::fs::read_to_string(&log).unwrap_or_default())?;
        debug!(container = %id, ?cmd, exit_code = output.exit_code, "exec finished");
        Ok(output)
    }
}

/// crun's exit status as the command's exit code: crun exits with the command's code, or
/// 128+N if the command died of signal N; a signal to crun itself reads the same way.
pub(crate) fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(-1)
}

/// Tells crun's failures apart from the command's: crun writes its own errors to its log as
/// well as to stderr (a command's stderr never reaches the log).
///
/// crun 1.8.1 reports a command it cannot start from inside the container, after the fork, as
/// "executable file `X` not found in $PATH" or "open executable: Permission denied", exit 255.
/// A shell says 127 and 126 for these, and kubelet's exec probes treat them as a failing
/// command rather than a broken runtime, so they become those codes with crun's message in
/// stderr. Any other crun error (the container vanished, crun misconfigured) is an RPC error.
fn interpret(
    id: &str,
    code: i32,
    stdout: Captured,
    mut stderr: Captured,
    crun_log: &str,
) -> Result<ExecOutput> {
    let exit_code = exec_status(id, code, crun_log)?;
    for (name, cut) in [("stdout", stdout.dropped), ("stderr", stderr.dropped)] {
        if cut > 0 {
            let note =
                format!("\n[hpk-pod-runtime: {name} truncated at {OUTPUT_CAP} bytes, {cut} more dropped]\n");
            stderr.bytes.extend_from_slice(note.as_bytes());
        }
    }
    Ok(ExecOutput { stdout: stdout.bytes, stderr: stderr.bytes, exit_code })
}

impl Runtime {}

/// The command's exit code from crun's: its own, or a shell's 127/126 when crun could not
/// start it; any other failure of crun's (it wrote to its log) is an error.
pub(crate) fn exec_status(id: &str, code: i32, crun_log: &str) -> Result<i32> {
    let crun_log = crun_log.trim();
    if code == 0 || crun_log.is_empty() {
        Ok(code)
    } else if crun_log.contains("executable file `") && crun_log.contains("not found") {
        Ok(127)
    } else if crun_log.contains("open executable") {
        Ok(126)
    } else {
        Err(Error::Engine(engine::Error::Command {
            command: format!("crun exec {id}"),
            status: format!("exit status {code}"),
            stderr: crun_log.to_owned(),
        }))
    }
}

/// One stream's output: what was kept, and how many bytes past the cap were dropped.
#[derive(Debug, Default)]
struct Captured {
    bytes: Vec<u8>,
    dropped: u64,
}

/// Reads `stream` to its end, keeping the first [`OUTPUT_CAP`] bytes. A read error ends the
/// stream early; what was read is still returned.
async fn read_capped(stream: Option<impl AsyncRead + Unpin>) -> Captured {
    let mut captured = Captured::default();
    let Some(mut stream) = stream else { return captured };
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return captured,
            Ok(n) => {
                let keep = n.min(OUTPUT_CAP - captured.bytes.len());
                captured.bytes.extend_from_slice(&buf[..keep]);
                captured.dropped += (n - keep) as u64;
            }
        }
    }
}

/// A started `crun exec`. Dropped before it finished (the RPC cancelled by the client, or its
/// deadline passed in the server), it still kills the command: nothing outlives the request.
struct Running {
    child: tokio::process::Child,
    pause_pid: u32,
    pid_file: PathBuf,
    finished: bool,
}

impl Running {
    /// Kills the command and reaps crun, waiting at most [`KILL_GRACE`].
    async fn kill(&mut self) {
        self.kill_now();
        if tokio::time::timeout(KILL_GRACE, self.child.wait()).await.is_err() {
            warn!("crun exec did not exit after SIGKILL");
        }
    }

    /// SIGKILLs the command and everything in its session (crun makes the command a new
    /// session), then crun and the nsenter prefix (the process group they were started in).
    fn kill_now(&mut self) {
        self.finished = true;
        // crun writes the command's PID as the sandbox's PID namespace numbers it; signals
        // are sent from the host, so the process is looked up by that number there.
        let in_sandbox =
            std::fs::read_to_string(&self.pid_file).ok().and_then(|s| s.trim().parse::<i32>().ok());
        if let Some(pid) = in_sandbox {
            kill_session_of(self.pause_pid, pid);
        }
        if let Some(group) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(group),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // tokio's kill_on_drop then kills and reaps the nsenter prefix itself.
        if !self.finished {
            self.kill_now();
        }
    }
}

/// Kills a streamed exec's command, and its session, when the exec session is dropped before
/// the command ended (the client went away): nothing outlives the session.
pub(crate) struct SessionGuard {
    pause_pid: u32,
    pid_file: PathBuf,
    armed: bool,
}

impl SessionGuard {
    /// Guards the command whose sandbox PID crun writes to `pid_file`.
    pub(crate) fn new(pause_pid: u32, pid_file: PathBuf) -> Self {
        Self { pause_pid, pid_file, armed: true }
    }

    /// The command ended by itself: leave whatever it left behind alone.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let in_sandbox =
            std::fs::read_to_string(&self.pid_file).ok().and_then(|s| s.trim().parse::<i32>().ok());
        if let Some(pid) = in_sandbox {
            debug!(pid, "exec session dropped before its command ended; killing it");
            kill_session_of(self.pause_pid, pid);
        }
    }
}

/// A process in a sandbox's PID namespace, seen from the host.
pub(crate) struct SandboxProcess {
    pub(crate) host_pid: i32,
    pub(crate) sandbox_pid: i32,
    pub(crate) session: i32,
}

/// SIGKILLs the process numbered `pid` in the PID namespace of `pause_pid`, and every process
/// of that namespace in its session (what it started, unless they made their own). The
/// namespace check keeps a stale PID from ever reaching a process outside the sandbox.
fn kill_session_of(pause_pid: u32, pid: i32) {
    let processes = sandbox_processes(pause_pid);
    let Some(session) = processes.iter().find(|p| p.sandbox_pid == pid).map(|p| p.session) else {
        debug!(pid, "exec'd process already gone");
        return;
    };
    for p in processes.iter().filter(|p| p.session == session && p.sandbox_pid != 1) {
        debug!(host_pid = p.host_pid, sandbox_pid = p.sandbox_pid, "killing timed-out exec process");
        let _ =
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(p.host_pid), nix::sys::signal::Signal::SIGKILL);
    }
}

/// The processes in the PID namespace of `pause_pid` and in namespaces below it (a container
/// with a PID namespace of its own), from the host's /proc, with their PIDs in the sandbox's
/// namespace.
pub(crate) fn sandbox_processes(pause_pid: u32) -> Vec<SandboxProcess> {
    let Ok(ns) = std::fs::read_link(format!("/proc/{pause_pid}/ns/pid")) else { return Vec::new() };
    let Some(level) = ns_pids(Path::new(&format!("/proc/{pause_pid}"))).map(|p| p.len()) else {
        return Vec::new();
    };
    // The sandbox's own procfs, where its processes and those of namespaces below it appear
    // under their sandbox PIDs.
    let inner_proc = PathBuf::from(format!("/proc/{pause_pid}/root/proc"));
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| {
            let host_pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            let dir = entry.path();
            // NSpid lists the PID in each namespace from the host's down to the process's own.
            let pids = ns_pids(&dir)?;
            let sandbox_pid = *pids.get(level.checked_sub(1)?)?;
            let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
            let own_ns = std::fs::read_link(dir.join("ns/pid")).ok()?;
            if own_ns != ns {
                // Deeper, and the same process in the sandbox's view: the sandbox's procfs
                // shows, under that PID, a process of the same PID namespace that started at
                // the same tick. (PID and start tick alone can match a process of another
                // sandbox whose containers started in the same tick with the same numbers.)
                let inner = inner_proc.join(sandbox_pid.to_string());
                let inner_stat = std::fs::read_to_string(inner.join("stat")).ok()?;
                if pids.len() <= level
                    || std::fs::read_link(inner.join("ns/pid")).ok()? != own_ns
                    || start_time(&inner_stat)? != start_time(&stat)?
                {
                    return None;
                }
            }
            // After the command name (which may hold spaces and parentheses): state ppid pgrp
            // session ...
            let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            let session = fields.get(3)?.parse().ok()?;
            Some(SandboxProcess { host_pid, sandbox_pid, session })
        })
        .collect()
}

/// The `NSpid` line of `/proc/<pid>/status`.
fn ns_pids(dir: &Path) -> Option<Vec<i32>> {
    let status = std::fs::read_to_string(dir.join("status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    line.split_whitespace().map(|p| p.parse().ok()).collect()
}

/// Field 22 of a `/proc/<pid>/stat`: the start time in clock ticks since boot.
fn start_time(stat: &str) -> Option<u64> {
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(bytes: &[u8], dropped: u64) -> Captured {
        Captured { bytes: bytes.to_vec(), dropped }
    }

    #[test]
    fn a_missing_executable_is_exit_127_not_an_rpc_error() {
        let log = "executable file `nope` not found in $PATH: No such file or directory\n";
        let out = interpret("c", 255, captured(b"", 0), captured(log.as_bytes(), 0), log).expect("output");
        assert_eq!(out.exit_code, 127);
        assert_eq!(out.stderr, log.as_bytes());
        let denied = "open executable: Permission denied";
        let out = interpret("c", 255, captured(b"", 0), captured(b"", 0), denied).expect("output");
        assert_eq!(out.exit_code, 126);
    }

    #[test]
    fn the_command_s_own_codes_pass_and_crun_failures_are_errors() {
        let out = interpret("c", 255, captured(b"out", 0), captured(b"err", 0), "").expect("output");
        assert_eq!(
            (out.exit_code, out.stdout.as_slice(), out.stderr.as_slice()),
            (255, &b"out"[..], &b"err"[..])
        );
        let vanished = "error opening file `/x/c/status`: No such file or directory";
        assert!(matches!(
            interpret("c", 1, captured(b"", 0), captured(b"", 0), vanished),
            Err(Error::Engine(engine::Error::Command { .. }))
        ));
    }

    #[test]
    fn cut_output_is_noted_in_stderr() {
        let out = interpret("c", 0, captured(b"x", 10), captured(b"", 0), "").expect("output");
        assert!(String::from_utf8_lossy(&out.stderr).contains("stdout truncated"), "{:?}", out.stderr);
    }

    #[tokio::test]
    async fn output_past_the_cap_is_dropped_and_counted() {
        let data = vec![b'a'; OUTPUT_CAP + 100];
        let got = read_capped(Some(data.as_slice())).await;
        assert_eq!((got.bytes.len(), got.dropped), (OUTPUT_CAP, 100));
    }

    #[test]
    fn finds_this_process_in_its_own_pid_namespace() {
        let me = std::process::id();
        let processes = sandbox_processes(me);
        let mine = processes.iter().find(|p| p.host_pid == i32::try_from(me).expect("pid")).expect("listed");
        assert_eq!(mine.session, nix::unistd::getsid(None).expect("sid").as_raw());
    }
}
