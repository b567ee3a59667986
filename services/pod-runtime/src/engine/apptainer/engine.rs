//! [`ApptainerEngine`]: a sandbox is an Apptainer instance of a root directory running
//! hpk-pause; a container is launched with nsenter into that instance's namespaces from the
//! image's SIF (see [`super::LAUNCHER`]).
//!
//! It keeps three files in a container's directory: `apptainer.pid` (the container's init, as
//! the sandbox numbers it, written by the launcher), `apptainer.start` (the FIFO the launcher
//! waits on; gone once started) and `apptainer.json` (how it runs, for exec).

use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use tracing::warn;

use super::{Apptainer, ContainerLaunch, Stop};
use crate::engine::{
    ContainerState, Created, Engine, EngineFuture, EngineKind, Error, ExecIn, NewContainer, Result, Root,
    SandboxSpec, Signal,
};
use crate::images::{Credentials, ImageRecord, ImageRef};

const PID_FILE: &str = "apptainer.pid";
const START_FIFO: &str = "apptainer.start";
const RECORD: &str = "apptainer.json";

/// How an Apptainer container runs, kept for exec.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Record {
    fakeroot: bool,
}

/// The Apptainer engine.
#[derive(Clone, Debug)]
pub struct ApptainerEngine {
    app: Apptainer,
    /// Seconds a sandbox's pause gives its processes after SIGTERM.
    pause_grace_seconds: u32,
}

impl ApptainerEngine {
    /// An engine running `app`, whose sandboxes give `pause_grace_seconds` after SIGTERM.
    pub fn new(app: Apptainer, pause_grace_seconds: u32) -> Self {
        Self { app, pause_grace_seconds }
    }

    /// The SIF of `image` in Apptainer's cache, if it has one there.
    fn sif_of(&self, image: &ImageRecord) -> Option<PathBuf> {
        image.repo_digests.iter().map(|d| self.app.sif_path(d)).find(|p| p.is_file())
    }

    /// Pulls `pinned` (`name@digest`) into Apptainer's cache unless its SIF is there.
    async fn pull_sif(&self, reference: &str, image: &ImageRecord, auth: Option<&Credentials>) -> Result<()> {
        let name = ImageRef::parse(reference).map_err(|e| Error::Unsupported(e.to_string()))?.name();
        let pinned = image
            .repo_digests
            .iter()
            .find(|d| d.strip_prefix(&name).is_some_and(|rest| rest.starts_with('@')))
            .ok_or_else(|| {
                Error::FailedPrecondition(format!("image {reference} has no digest for {name}"))
            })?;
        let sif = self.app.sif_path(pinned);
        if sif.is_file() {
            return Ok(());
        }
        let dir = self.app.images_dir();
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create", &dir, e))?;
        let scratch = tempfile::Builder::new()
            .prefix(".pull-")
            .tempdir_in(&dir)
            .map_err(|e| Error::io("create", &dir, e))?;
        let output = scratch.path().join("image.sif");
        let registry =
            ImageRef::parse(pinned).map_err(|e| Error::Unsupported(e.to_string()))?.registry().to_owned();
        let mut cmd = tokio::process::Command::from(self.app.pull(pinned, &registry, auth, &output)?);
        let out = cmd
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| Error::io("run apptainer pull into", &dir, e))?;
        if !out.status.success() {
            return Err(Error::Command {
                command: format!("apptainer pull docker://{pinned}"),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        std::fs::rename(&output, &sif).map_err(|e| Error::io("move the pulled image to", &sif, e))
    }
}

impl Engine for ApptainerEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Apptainer
    }

    fn ready(&self) -> Result<()> {
        crate::engine::run_command(&mut self.app.version()).map(drop)
    }

    fn start_sandbox(&self, spec: &SandboxSpec, dir: &Path) -> Result<()> {
        let root = dir.join("root");
        self.app.write_sandbox_root(&root)?;
        let mut cmd = self.app.instance_start(spec, &root)?;
        // To a file, not a pipe: the instance outlives the command and could hold a pipe open.
        let log = dir.join("instance-start.log");
        let out = std::fs::File::create(&log).map_err(|e| Error::io("create", &log, e))?;
        let err = out.try_clone().map_err(|e| Error::io("open", &log, e))?;
        let status = cmd
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err)
            .status()
            .map_err(|e| Error::io("run apptainer instance start for", dir, e))?;
        if !status.success() {
            return Err(Error::Command {
                command: format!("apptainer instance start {}", Apptainer::instance_name(&spec.id)?),
                status: status.to_string(),
                stderr: std::fs::read_to_string(&log).unwrap_or_default().trim().to_owned(),
            });
        }
        Ok(())
    }

    fn sandbox_pid(&self, id: &str, _dir: &Path) -> Result<Option<u32>> {
        Ok(self.sandbox_state(id)?.map(|s| s.pid).filter(|pid| *pid > 0))
    }

    fn sandbox_state(&self, id: &str) -> Result<Option<ContainerState>> {
        self.app.sandbox_state(id)
    }

    fn kill_sandbox(&self, id: &str, signal: Signal) -> Result<()> {
        let how = match signal {
            Signal::Kill => Stop::Kill,
            Signal::Term => Stop::Term { timeout: self.pause_grace_seconds + 5 },
        };
        crate::engine::run_command(&mut self.app.instance_stop(id, how)?).map(drop)
    }

    fn delete_sandbox(&self, id: &str) -> Result<()> {
        if self.app.sandbox_state(id)?.is_some() {
            crate::engine::run_command(&mut self.app.instance_stop(id, Stop::Kill)?)?;
        }
        Ok(())
    }

    fn loopback_up(&self, pid: u32) -> Result<()> {
        crate::engine::run_command(&mut self.app.loopback_up(pid)).map(drop)
    }

    fn check_tty(&self, tty: bool) -> Result<()> {
        if tty {
            return Err(no_terminals());
        }
        Ok(())
    }

    fn prepare_root(
        &self,
        _dir: &Path,
        _writable: &Path,
        _layers: Vec<PathBuf>,
        image: &ImageRecord,
        _destinations: &[&str],
    ) -> Result<Root> {
        let sif = self.sif_of(image).ok_or_else(|| Error::NotFound {
            kind: "image (as an Apptainer SIF; pull it again)",
            id: image.repo_tags.first().cloned().unwrap_or_else(|| image.id.clone()),
        })?;
        // Only numeric users resolve: names need the image's /etc/passwd, inside the SIF.
        Ok(Root { image: sif, files: None })
    }

    /// Launches the container, waiting for start. It runs as root of a user namespace
    /// (`--fakeroot`) or as the runtime's own user; Apptainer binds know no propagation.
    fn create_container(&self, new: NewContainer<'_>) -> Result<Created> {
        let own = nix::unistd::getuid().as_raw();
        let uid = new.user.uid;
        if uid != 0 && uid != own {
            if new.pod_user {
                return Err(Error::Unsupported(format!(
                    "runAsUser {uid}: the apptainer engine runs a container as root of a user namespace \
                     (--fakeroot) or as the runtime's own user ({own}), not as another user"
                )));
            }
            warn!(uid, own, "image user cannot be mapped by apptainer; running as the runtime's user");
        }
        let launch = ContainerLaunch {
            image: new.root.image,
            args: new.args,
            env: new.env,
            cwd: new.cwd,
            fakeroot: uid == 0,
            mounts: new.mounts.into_iter().map(|m| (m.host, m.dest, m.readonly)).collect(),
            readonly_rootfs: new.readonly_rootfs,
            start_fifo: new.dir.join(START_FIFO),
            pid_file: new.dir.join(PID_FILE),
        };
        nix::unistd::mkfifo(&launch.start_fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .map_err(|e| Error::io("create", &launch.start_fifo, e.into()))?;
        write_record(new.dir, &Record { fakeroot: launch.fakeroot })?;
        let status = self
            .app
            .launch(new.pause_pid, &launch)?
            .stdin(new.stdio.stdin)
            .stdout(new.stdio.stdout)
            .stderr(new.stdio.stderr)
            .status()
            .map_err(|e| Error::io("run the apptainer launcher for", new.dir, e))?;
        if !status.success() || read_pid(&launch.pid_file).is_none() {
            return Err(Error::FailedPrecondition(format!(
                "launching the container with nsenter and apptainer failed ({status}); \
                 the reason is in the container's log"
            )));
        }
        Ok(Created::default())
    }

    fn start_container(&self, _id: &str, dir: &Path, _pause_pid: u32) -> Result<Option<i32>> {
        let pid = read_pid(&dir.join(PID_FILE));
        let fifo = dir.join(START_FIFO);
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(&fifo)
            .and_then(|mut f| f.write_all(b"start\n"));
        match opened {
            Ok(()) => {}
            // No reader: the launcher is gone (killed); its exit, reported by the pause, is
            // matched to the PID as for any early exit.
            Err(e) if e.raw_os_error() == Some(nix::libc::ENXIO) => {}
            Err(e) => return Err(Error::io("start the container through", &fifo, e)),
        }
        std::fs::remove_file(&fifo).map_err(|e| Error::io("remove", &fifo, e))?;
        Ok(pid)
    }

    fn kill_container(&self, _id: &str, dir: &Path, pause_pid: u32, signal: Signal) -> Result<()> {
        // SIGTERM to apptainer's master, which forwards it to the container; SIGKILL cannot be
        // forwarded, so it goes to every process of the container's tree.
        let Some(init) = read_pid(&dir.join(PID_FILE)) else { return Ok(()) };
        let all = super::scan();
        let Some(host) = super::host_pid_in(&all, pause_pid, init) else { return Ok(()) };
        let (targets, signal) = match signal {
            Signal::Kill => (super::process_tree(&all, host), nix::sys::signal::SIGKILL),
            Signal::Term => (vec![host], nix::sys::signal::SIGTERM),
        };
        for pid in targets.into_iter().filter_map(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        }
        Ok(())
    }

    /// A container that was never started has its waiting launcher killed.
    fn delete_container(&self, id: &str, dir: &Path, pause_pid: u32) -> Result<()> {
        if dir.join(START_FIFO).exists() {
            self.kill_container(id, dir, pause_pid, Signal::Kill)?;
        }
        Ok(())
    }

    /// Apptainer mounts nothing in the container's directory.
    fn unmount(&self, _dir: &Path) -> Result<()> {
        Ok(())
    }

    fn exec(&self, exec: ExecIn<'_>) -> Result<tokio::process::Command> {
        let not_running =
            || Error::FailedPrecondition(format!("container {} has no running process", exec.id));
        let init = read_pid(&exec.dir.join(PID_FILE)).ok_or_else(not_running)?;
        let all = super::scan();
        let master = super::host_pid_in(&all, exec.pause_pid, init).ok_or_else(not_running)?;
        let target = super::container_process(&all, master).ok_or_else(not_running)?;
        let record = read_record(exec.dir)?.ok_or_else(not_running)?;
        let environ = std::fs::read(format!("/proc/{target}/environ"))
            .map_err(|e| Error::io("read the environment of", PathBuf::from(format!("/proc/{target}")), e))?;
        Ok(self.app.exec(target, record.fakeroot, &parse_environ(&environ), exec.cmd))
    }

    fn exec_tty(&self, _exec: ExecIn<'_>, _console: &Path) -> Result<tokio::process::Command> {
        Err(no_terminals())
    }

    fn check_pull(&self, auth: Option<&Credentials>) -> Result<()> {
        if matches!(auth, Some(Credentials::RegistryToken(_) | Credentials::IdentityToken(_))) {
            // Refused before anything is downloaded.
            self.app.pull("", "", auth, Path::new(""))?;
        }
        Ok(())
    }

    fn pulled<'a>(
        &'a self,
        reference: &'a str,
        image: &'a ImageRecord,
        auth: Option<&'a Credentials>,
    ) -> EngineFuture<'a, ()> {
        Box::pin(self.pull_sif(reference, image, auth))
    }

    fn has_image(&self, image: &ImageRecord) -> bool {
        self.sif_of(image).is_some()
    }

    fn image_removed(&self, image: &ImageRecord) -> Result<()> {
        for digest in &image.repo_digests {
            let sif = self.app.sif_path(digest);
            match std::fs::remove_file(&sif) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::io("remove", &sif, e));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

fn no_terminals() -> Error {
    Error::Unsupported("the apptainer engine does not provide terminals (tty) yet".into())
}

/// Writes `apptainer.json` into `dir`, whole or not at all.
fn write_record(dir: &Path, record: &Record) -> Result<()> {
    let path = dir.join(RECORD);
    let tmp = dir.join(format!(".{RECORD}.tmp"));
    let bytes = serde_json::to_vec(record)
        .map_err(|e| Error::io("encode", &path, std::io::Error::other(e.to_string())))?;
    std::fs::write(&tmp, bytes).map_err(|e| Error::io("write", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| Error::io("rename into", &path, e))
}

/// Reads `apptainer.json` from `dir`; `None` when it does not exist.
fn read_record(dir: &Path) -> Result<Option<Record>> {
    let path = dir.join(RECORD);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::io("parse", &path, std::io::Error::other(e.to_string()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("read", &path, e)),
    }
}

/// The PID in a PID file, if it holds one.
fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `/proc/N/environ`: NUL-separated `KEY=value` entries.
fn parse_environ(bytes: &[u8]) -> Vec<(OsString, OsString)> {
    use std::os::unix::ffi::OsStrExt;
    bytes
        .split(|b| *b == 0)
        .filter(|e| !e.is_empty())
        .filter_map(|e| {
            let eq = e.iter().position(|b| *b == b'=')?;
            Some((
                std::ffi::OsStr::from_bytes(&e[..eq]).to_owned(),
                std::ffi::OsStr::from_bytes(&e[eq + 1..]).to_owned(),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environ_splits_at_the_first_equals_and_keeps_newlines() {
        let env = parse_environ(b"A=1\0B=x=y\nz\0\0NOEQ\0");
        assert_eq!(
            env,
            vec![("A".into(), "1".into()), ("B".into(), "x=y\nz".into())] as Vec<(OsString, OsString)>
        );
    }
}
