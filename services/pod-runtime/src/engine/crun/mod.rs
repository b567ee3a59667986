//! The crun engine: [`Crun`] invokes crun (create, start, state, kill, delete); [`CrunEngine`]
//! is the [`super::Engine`] built on it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Deserialize;

use super::error::run;
use super::{Error, Result};

mod engine;
mod mount_points;

pub use engine::CrunEngine;

/// crun with our global options: a private state directory and no cgroup manager.
#[derive(Clone, Debug)]
pub struct Crun {
    binary: PathBuf,
    state_root: PathBuf,
    prefix: Vec<OsString>,
    /// The sandbox's pause whose PID namespace crun runs in ([`Crun::in_pid_namespace`]).
    sandbox: Option<u32>,
    /// `binary` lies on a read-only mount, so crun need not copy itself before it runs.
    read_only_binary: bool,
}

/// What tells crun (as runc) that its binary is already safe from a container that would
/// overwrite it through `/proc/PID/exe` (CVE-2019-5736): with it set and the binary on a
/// read-only mount, crun skips copying itself into a sealed memfd and re-executing the copy.
const CLONED_BINARY_ENV: &str = "_LIBCONTAINER_CLONED_BINARY";

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
        Self {
            binary: PathBuf::from("crun"),
            state_root: state_root.to_owned(),
            prefix: Vec::new(),
            sandbox: None,
            read_only_binary: false,
        }
    }

    /// The same crun, run from a read-only mount, so that it need not copy itself before each
    /// run. crun guards against CVE-2019-5736 (a container overwriting the host's crun through
    /// `/proc/PID/exe`) by copying its binary into a sealed memfd and re-executing the copy: a
    /// second load of crun and its libraries on every call, about 1.4 ms of CPU (measured with
    /// `perf stat`: `crun list` 2.45 ms, 1.02 ms from a read-only mount). A read-only mount
    /// guards as well: the container cannot write the file, nor remount it (the mount is in
    /// this process's mount namespace, where containers hold no capability). So crun on PATH is
    /// used as it is where it already lies on a read-only mount, else bind-mounted read-only
    /// onto `dir/crun` in our own (private) mount namespace. Where neither can be done crun
    /// keeps copying itself, which is slower and as safe; an info line says so. Not with a
    /// prefix: crun then runs in another mount namespace.
    pub fn with_read_only_binary(mut self, dir: &Path) -> Self {
        if self.has_prefix() {
            return self;
        }
        let found = crate::engine::resolve_program("crun");
        if !found.is_absolute() {
            return self;
        }
        match bind_read_only(&found, dir) {
            Ok(binary) => {
                tracing::info!(crun = %binary.display(), "crun runs from a read-only mount");
                self.binary = binary;
                self.read_only_binary = true;
            }
            Err(e) => tracing::info!(
                crun = %found.display(),
                error = %e,
                "crun cannot run from a read-only mount here; it copies itself before each run"
            ),
        }
        self
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
    ///
    /// Without a prefix this takes no extra process: crun is started from a thread that has
    /// entered the sandbox's PID namespace (`setns` moves the thread's children, not the
    /// thread), and the child makes its own mount namespace and /proc before it executes crun
    /// ([`private_proc`]). Through a prefix, and for `crun exec` (started later, by tokio),
    /// `nsenter` and `unshare` do the same ([`Crun::sandbox_prefix`]).
    pub fn in_pid_namespace(&self, pause_pid: u32) -> Self {
        Self { sandbox: Some(pause_pid), ..self.clone() }
    }

    /// `nsenter --pid=/proc/PID/ns/pid -- unshare --mount --propagation slave --mount-proc --`:
    /// what runs crun in the sandbox's PID namespace with its /proc from a command line.
    fn sandbox_prefix(pause_pid: u32) -> [OsString; 9] {
        [
            "nsenter",
            &format!("--pid=/proc/{pause_pid}/ns/pid"),
            "--",
            "unshare",
            "--mount",
            "--propagation",
            "slave",
            "--mount-proc",
            "--",
        ]
        .map(OsString::from)
    }

    /// A command run through the prefix.
    pub fn prefixed(&self, program: impl Into<OsString>) -> Command {
        let mut all = self.prefix.clone();
        all.push(program.into());
        command(&all)
    }

    /// Runs `program args` through the prefix to completion.
    pub fn run_prefixed(&self, program: &str, args: &[&str]) -> Result<Vec<u8>> {
        run(self.prefixed(program).args(args))
    }

    /// crun with the global options, to be started through [`Crun::started`]: in a sandbox
    /// without a prefix, its child makes the private mount namespace and /proc itself.
    fn crun(&self) -> Command {
        if self.entered_sandbox().is_none() {
            return self.crun_through_prefix();
        }
        let mut cmd = Command::new(&self.binary);
        // SAFETY: `private_proc` makes only system calls (unshare, mount) on static,
        // NUL-terminated strings: no allocation, no lock, nothing that is unsafe in the child
        // of a multi-threaded process between fork and exec.
        #[allow(unsafe_code)]
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, private_proc);
        }
        self.global_options(&mut cmd);
        cmd
    }

    /// crun with the global options as one command line: the prefix, then for a sandbox
    /// `nsenter` and `unshare` ([`Crun::sandbox_prefix`]). Needs no particular thread to start.
    fn crun_through_prefix(&self) -> Command {
        let mut all = self.prefix.clone();
        if let Some(pause_pid) = self.sandbox {
            all.extend(Self::sandbox_prefix(pause_pid));
        }
        all.push(self.binary.clone().into_os_string());
        let mut cmd = command(&all);
        self.global_options(&mut cmd);
        cmd
    }

    fn global_options(&self, cmd: &mut Command) {
        cmd.arg("--root").arg(&self.state_root).arg("--cgroup-manager=disabled");
        if self.read_only_binary {
            cmd.env(CLONED_BINARY_ENV, "1");
        }
    }

    /// Whether a command from [`Crun::crun`] must be started on a thread in the sandbox's PID
    /// namespace.
    fn entered_sandbox(&self) -> Option<u32> {
        self.sandbox.filter(|_| !self.has_prefix())
    }

    /// Runs `start` (which starts and waits for a command from [`Crun::crun`]) where that
    /// command must start: on a thread that has joined the sandbox's PID namespace, or here.
    fn started<T>(&self, start: impl FnOnce() -> Result<T> + Send) -> Result<T>
    where
        T: Send,
    {
        let Some(pause_pid) = self.entered_sandbox() else {
            return start();
        };
        let path = format!("/proc/{pause_pid}/ns/pid");
        std::thread::scope(|scope| {
            let thread = std::thread::Builder::new()
                .name("crun-in-pod".to_owned())
                .spawn_scoped(scope, || {
                    let ns = std::fs::File::open(&path).map_err(|e| Error::io("open", &path, e))?;
                    nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWPID)
                        .map_err(|e| Error::io("enter the PID namespace", &path, e.into()))?;
                    start()
                })
                .map_err(|e| Error::io("start a thread to run crun in", &path, e))?;
            thread.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// Runs a command from [`Crun::crun`] to completion, where it must start.
    fn run_crun(&self, mut cmd: Command) -> Result<Vec<u8>> {
        self.started(move || run(&mut cmd))
    }

    /// Runs `crun GLOBAL-OPTIONS args` to completion, where it must start.
    fn run_crun_with(&self, args: &[&str]) -> Result<Vec<u8>> {
        let mut cmd = self.crun();
        cmd.args(args);
        self.run_crun(cmd)
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
        cmd.arg(id).stdin(stdio.stdin).stdout(stdio.stdout).stderr(stdio.stderr);
        let status =
            self.started(move || cmd.status().map_err(|e| Error::io("run crun create for", bundle, e)))?;
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
        let status =
            self.started(move || cmd.status().map_err(|e| Error::io("run crun run for", bundle, e)))?;
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
        self.run_crun_with(&["start", id]).map(drop)
    }

    /// `crun state`; `None` if crun does not know the container.
    pub fn state(&self, id: &str) -> Result<Option<ContainerState>> {
        match self.run_crun_with(&["state", id]) {
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
        self.run_crun_with(&["list", "--quiet"]).map(drop)
    }

    /// `crun kill ID SIGNAL`.
    pub fn kill(&self, id: &str, signal: &str) -> Result<()> {
        self.run_crun_with(&["kill", id, signal]).map(drop)
    }

    /// `crun delete [--force] ID`; a container crun does not know is already deleted.
    pub fn delete(&self, id: &str, force: bool) -> Result<()> {
        let mut cmd = self.crun();
        cmd.arg("delete");
        if force {
            cmd.arg("--force");
        }
        cmd.arg(id);
        match self.run_crun(cmd) {
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
        // Started later, by tokio, from any thread: nsenter and unshare enter the sandbox.
        let mut cmd = self.crun_through_prefix();
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

/// `all[0] all[1..]`.
fn command(all: &[OsString]) -> Command {
    let mut cmd = Command::new(&all[0]);
    cmd.args(&all[1..]);
    cmd
}

/// In the child, before crun executes: a mount namespace of its own in which the host's mounts
/// propagate in but none propagates out (rslave), with a /proc of the PID namespace the child
/// is in (the sandbox's) — what `unshare --mount --propagation slave --mount-proc` does.
fn private_proc() -> std::io::Result<()> {
    use nix::libc;
    // SAFETY: unshare takes flags only; on failure it changes nothing and returns -1.
    #[allow(unsafe_code)]
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mount = |source: &std::ffi::CStr, target: &std::ffi::CStr, fstype: Option<&std::ffi::CStr>, flags| {
        // SAFETY: every string is a NUL-terminated literal that outlives the call; data is null.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                fstype.map_or(std::ptr::null(), std::ffi::CStr::as_ptr),
                flags,
                std::ptr::null(),
            )
        };
        if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
    };
    mount(c"none", c"/", None, libc::MS_REC | libc::MS_SLAVE)?;
    mount(c"none", c"/proc", None, libc::MS_REC | libc::MS_PRIVATE)?;
    mount(c"proc", c"/proc", Some(c"proc"), libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC)
}

/// `binary` as it lies where it already is on a read-only mount, else bind-mounted read-only
/// onto `dir/crun` (in this process's mount namespace). Either way checked to be read-only, and
/// the bind checked to be `binary` itself (same device and inode); `dir/crun` is never followed
/// if it is a link.
fn bind_read_only(binary: &Path, dir: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

    use nix::mount::{MsFlags, mount};
    use rustix::fs::{StatVfsMountFlags as St, statvfs};
    /// The kernel's ST_RELATIME (as glibc names it; musl and so rustix's constants lack it).
    const ST_RELATIME: St = St::from_bits_retain(0x1000);
    let source = statvfs(binary)?.f_flag;
    if source.contains(St::RDONLY) {
        return Ok(binary.to_owned());
    }
    // A remount in a user namespace must keep the flags the source's mount locked (nosuid,
    // nodev, noexec, the atime ones): carry them all over.
    let mut keep = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    for (st, ms) in [
        (St::NOEXEC, MsFlags::MS_NOEXEC),
        (St::NOATIME, MsFlags::MS_NOATIME),
        (St::NODIRATIME, MsFlags::MS_NODIRATIME),
        (ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if source.contains(st) {
            keep |= ms;
        }
    }
    std::fs::create_dir_all(dir)?;
    let target = dir.join("crun");
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&target)
        .or_else(|e| match e.raw_os_error() {
            // Already bound read-only (a second engine in this namespace): checked below.
            Some(nix::libc::EROFS) => Ok(std::fs::File::open(&target)?),
            _ => Err(e),
        })?;
    mount(Some(binary), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>)?;
    mount(
        None::<&str>,
        &target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | keep,
        None::<&str>,
    )?;
    let (bound, original) = (std::fs::symlink_metadata(&target)?, std::fs::metadata(binary)?);
    if (bound.dev(), bound.ino()) != (original.dev(), original.ino()) {
        return Err(std::io::Error::other(format!(
            "{} is not {} after the bind",
            target.display(),
            binary.display()
        )));
    }
    if !statvfs(&target)?.f_flag.contains(St::RDONLY) {
        return Err(std::io::Error::other(format!(
            "{} is still writable after a read-only bind",
            target.display()
        )));
    }
    Ok(target)
}

#[cfg(test)]
mod read_only_tests;
