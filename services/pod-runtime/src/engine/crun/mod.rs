//! The crun engine: [`Crun`] invokes crun (create, start, state, kill, delete); [`CrunEngine`]
//! is the [`super::Engine`] built on it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Deserialize;

use super::error::run;
use super::{Error, Result};

mod engine;

pub use engine::CrunEngine;

/// crun with our global options: a private state directory and no cgroup manager.
#[derive(Clone, Debug)]
pub struct Crun {
    binary: PathBuf,
    state_root: PathBuf,
    prefix: Vec<OsString>,
}

/// The file `crun create` writes its init's PID into, in the bundle.
const INIT_PID: &str = "init.pid";

/// A container's standard input, output and error.
#[derive(Debug)]
pub struct Stdio3 {
    /// Standard input.
    pub stdin: Stdio,
    /// Standard output.
    pub stdout: Stdio,
    /// Standard error.
    pub stderr: Stdio,
}

impl Stdio3 {
    /// All three on /dev/null.
    pub fn null() -> Self {
        Self { stdin: Stdio::null(), stdout: Stdio::null(), stderr: Stdio::null() }
    }
}

/// What `crun state` reports.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct ContainerState {
    /// `created`, `running`, `stopped`, or `paused`.
    pub status: String,
    /// Host PID of the container's init (0 once stopped).
    #[serde(default)]
    pub pid: u32,
}

impl Crun {
    /// crun from PATH keeping its state under `state_root`.
    pub fn new(state_root: &Path) -> Self {
        Self { binary: PathBuf::from("crun"), state_root: state_root.to_owned(), prefix: Vec::new() }
    }

    /// Runs crun (and mounts) through `prefix`, e.g. `nsenter --mount=/proc/N/ns/mnt --`, when
    /// the mount namespace prepared for containers is not our own (tests).
    pub fn with_prefix(mut self, prefix: impl IntoIterator<Item = impl Into<OsString>>) -> Self {
        self.prefix = prefix.into_iter().map(Into::into).collect();
        self
    }

    /// The same crun, run inside the PID namespace of `pause_pid` (a sandbox's hpk-pause), with
    /// a /proc of that namespace.
    ///
    /// A container's init is forked by crun; when crun exits, the kernel gives the orphan to
    /// the reaper of *crun's* PID namespace. Run from the host's namespace that is the host's
    /// init, and the exit status is lost; run from inside the sandbox it is hpk-pause, which
    /// reaps it and reports the status. crun records PIDs as it sees them, so it must also see
    /// the sandbox's /proc (a private mount namespace with procfs remounted): with the host's,
    /// a sandbox PID names an unrelated host process, whose start time crun would record and
    /// whose namespaces `crun exec` would join. In this view the pause is PID 1.
    pub fn in_pid_namespace(&self, pause_pid: u32) -> Self {
        let mut inner = self.clone();
        let pid_ns = format!("--pid=/proc/{pause_pid}/ns/pid");
        inner.prefix.extend(
            [
                "nsenter",
                pid_ns.as_str(),
                "--",
                "unshare",
                "--mount",
                "--propagation",
                "slave",
                "--mount-proc",
                "--",
            ]
            .map(OsString::from),
        );
        inner
    }

    /// A command run through the prefix.
    pub fn prefixed(&self, program: impl Into<OsString>) -> Command {
        let mut all = self.prefix.clone();
        all.push(program.into());
        let mut cmd = Command::new(&all[0]);
        cmd.args(&all[1..]);
        cmd
    }

    /// Runs `program args` through the prefix to completion.
    pub fn run_prefixed(&self, program: &str, args: &[&str]) -> Result<Vec<u8>> {
        run(self.prefixed(program).args(args))
    }

    fn crun(&self) -> Command {
        let mut cmd = self.prefixed(self.binary.clone());
        cmd.arg("--root").arg(&self.state_root).arg("--cgroup-manager=disabled");
        cmd
    }

    /// `crun create`: the container's standard streams are `stdio`, or, with `console`, a
    /// terminal whose master crun sends to that socket. crun's own messages go to
    /// `bundle/crun.log`, quoted in the error if creation fails.
    pub fn create(&self, id: &str, bundle: &Path, stdio: Stdio3, console: Option<&Path>) -> Result<()> {
        let log = bundle.join("crun.log");
        let mut cmd = self.crun();
        cmd.arg(format!("--log=file:{}", log.display()))
            .args(["create", "--pid-file"])
            .arg(bundle.join(INIT_PID))
            .arg("--bundle")
            .arg(bundle);
        if let Some(console) = console {
            cmd.arg("--console-socket").arg(console);
        }
        let status = cmd
            .arg(id)
            .stdin(stdio.stdin)
            .stdout(stdio.stdout)
            .stderr(stdio.stderr)
            .status()
            .map_err(|e| Error::io("run crun create for", bundle, e))?;
        if !status.success() {
            return Err(Error::Command {
                command: format!("crun create {id}"),
                status: status.to_string(),
                stderr: std::fs::read_to_string(&log).unwrap_or_default().trim().to_owned(),
            });
        }
        Ok(())
    }

    /// The PID of the init `crun create` made from `bundle`, as crun numbered it (in the PID
    /// namespace crun ran in), from the pid file; spares a `crun state` per start.
    pub fn created_pid(bundle: &Path) -> Option<u32> {
        std::fs::read_to_string(bundle.join(INIT_PID)).ok()?.trim().parse().ok().filter(|pid| *pid > 0)
    }

    /// Whether commands run through a prefix (another mount namespace, tests).
    pub fn has_prefix(&self) -> bool {
        !self.prefix.is_empty()
    }

    /// `crun run --detach`: create and start in one process (a sandbox's pause, which needs no
    /// step between the two). Standard streams closed; crun's messages go to `bundle/crun.log`,
    /// quoted in the error if it fails.
    pub fn run_detached(&self, id: &str, bundle: &Path) -> Result<()> {
        let log = bundle.join("crun.log");
        let mut cmd = self.crun();
        cmd.arg(format!("--log=file:{}", log.display()))
            .args(["run", "--detach", "--pid-file"])
            .arg(bundle.join(INIT_PID))
            .arg("--bundle")
            .arg(bundle)
            .arg(id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let status = cmd.status().map_err(|e| Error::io("run crun run for", bundle, e))?;
        if !status.success() {
            return Err(Error::Command {
                command: format!("crun run --detach {id}"),
                status: status.to_string(),
                stderr: std::fs::read_to_string(&log).unwrap_or_default().trim().to_owned(),
            });
        }
        Ok(())
    }

    /// `crun start`.
    pub fn start(&self, id: &str) -> Result<()> {
        run(self.crun().args(["start", id])).map(drop)
    }

    /// `crun state`; `None` if crun does not know the container.
    pub fn state(&self, id: &str) -> Result<Option<ContainerState>> {
        match run(self.crun().args(["state", id])) {
            Ok(out) => serde_json::from_slice(&out).map(Some).map_err(|e| Error::Parse(e.to_string())),
            // A container being deleted loses its status file before its directory.
            Err(Error::Command { stderr, .. })
                if stderr.contains("does not exist") || stderr.contains("No such file or directory") =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// `crun list`: crun runs and reads its state root (the runtime's readiness check).
    pub fn list(&self) -> Result<()> {
        run(self.crun().args(["list", "--quiet"])).map(drop)
    }

    /// `crun kill ID SIGNAL`.
    pub fn kill(&self, id: &str, signal: &str) -> Result<()> {
        run(self.crun().args(["kill", id, signal])).map(drop)
    }

    /// `crun delete [--force] ID`; a container crun does not know is already deleted.
    pub fn delete(&self, id: &str, force: bool) -> Result<()> {
        let mut cmd = self.crun();
        cmd.arg("delete");
        if force {
            cmd.arg("--force");
        }
        match run(cmd.arg(id)) {
            Err(Error::Command { stderr, .. }) if stderr.contains("does not exist") => Ok(()),
            // `--force` signals first, and fails ("open pidfd: …") when the recorded PID is
            // gone: a container in a pod's PID namespace is recorded by its PID there, which
            // names nothing once the sandbox has stopped. Stopped, it needs no force.
            Err(Error::Command { stderr, .. }) if force && stderr.contains("pidfd") => self.delete(id, false),
            other => other.map(drop),
        }
    }
}

/// `crun exec`, kept apart from the synchronous calls above: it runs as long as the command,
/// so the runtime drives it with tokio and never blocks a worker thread on it.
impl Crun {
    /// `crun exec --process PROCESS --pid-file PID_FILE ID`, not yet started: `process` is the
    /// OCI process (the container's, with the command's arguments), no tty, stdin from
    /// /dev/null, stdout and stderr piped. crun's own messages also go to `log`, which tells
    /// them apart from the command's stderr. The process leads a new process group (so a
    /// timeout can kill the prefix and crun together) and is killed if dropped.
    pub fn exec(&self, id: &str, process: &Path, pid_file: &Path, log: &Path) -> tokio::process::Command {
        let mut cmd = self.exec_command(id, process, pid_file, log, &[]);
        cmd.stdout(Stdio::piped());
        cmd
    }

    /// `crun exec --detach --console-socket CONSOLE --process PROCESS --pid-file PID_FILE ID`
    /// (`process` has `terminal: true`):
    /// crun sends the terminal's master over `console` and exits once the command runs.
    pub fn exec_detached_tty(
        &self,
        id: &str,
        process: &Path,
        pid_file: &Path,
        log: &Path,
        console: &Path,
    ) -> tokio::process::Command {
        let mut cmd = self.exec_command(
            id,
            process,
            pid_file,
            log,
            &[OsString::from("--detach"), OsString::from("--console-socket"), console.as_os_str().to_owned()],
        );
        cmd.stdout(Stdio::null());
        cmd
    }

    /// `crun exec [OPTIONS] --process PROCESS --pid-file PID_FILE ID`: stdin from /dev/null,
    /// stderr piped, crun's messages also in `log`; a new process group, killed if dropped.
    fn exec_command(
        &self,
        id: &str,
        process: &Path,
        pid_file: &Path,
        log: &Path,
        options: &[OsString],
    ) -> tokio::process::Command {
        let mut cmd = self.crun();
        cmd.arg(format!("--log=file:{}", log.display()))
            .arg("exec")
            .args(options)
            .arg("--process")
            .arg(process)
            .arg("--pid-file")
            .arg(pid_file)
            .arg(id)
            .stdin(Stdio::null())
            .stderr(Stdio::piped());
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.process_group(0).kill_on_drop(true);
        cmd
    }
}
