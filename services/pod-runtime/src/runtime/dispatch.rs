//! Each engine-specific step of the runtime, done the crun way (exactly as before there was a
//! choice) or the Apptainer way (see [`crate::engine::apptainer`]). The rest of the runtime —
//! records, events from hpk-pause, shims, streaming — is the same for both.
//!
//! Apptainer keeps three files in a container's directory: `apptainer.pid` (the container's
//! init, as the sandbox numbers it, written by the launcher), `apptainer.start` (the FIFO the
//! launcher waits on; gone once started) and `apptainer.json` (how it runs, for exec).

use std::ffi::OsString;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use tracing::warn;

use super::{Error, Result, Runtime};
use crate::engine::apptainer::{self, ContainerLaunch, Stop};
use crate::engine::{Apptainer, ContainerState, Crun, Engine, Overlay, SandboxSpec};
use crate::images::{Credentials, ImageRecord, ImageRef};

const PID_FILE: &str = "apptainer.pid";
const START_FIFO: &str = "apptainer.start";
const RECORD: &str = "apptainer.json";

/// How an Apptainer container runs, kept for exec.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Record {
    fakeroot: bool,
}

impl Runtime {
    /// The Apptainer engine, when that is the runtime's engine.
    pub(crate) fn apptainer(&self) -> Option<&Apptainer> {
        match &self.config.engine {
            Engine::Apptainer(app) => Some(app),
            Engine::Crun => None,
        }
    }

    /// Whether the engine works (CRI `RuntimeReady`): the runtime's directory takes a file,
    /// and crun (`crun list` over its state) or Apptainer (`apptainer --version`) runs.
    /// `Err` says why not. Runs processes: call it off the async threads.
    pub fn engine_ready(&self) -> std::result::Result<(), String> {
        let probe = self.config.root.join(".ready-probe");
        std::fs::write(&probe, b"").map_err(|e| {
            format!("the runtime's directory {} takes no file: {e}", self.config.root.display())
        })?;
        let _ = std::fs::remove_file(&probe);
        match self.apptainer() {
            None => self.crun.list().map_err(|e| format!("crun does not run: {e}")),
            Some(app) => crate::engine::run_command(&mut app.version())
                .map(drop)
                .map_err(|e| format!("apptainer does not run: {e}")),
        }
    }

    /// The engine's name: `crun` or `apptainer`.
    pub fn engine_name(&self) -> &'static str {
        self.config.engine.kind().name()
    }

    /// Starts the sandbox's hpk-pause: a crun container from a bundle in `dir`, or an
    /// Apptainer instance of a root directory in `dir`.
    pub(crate) fn engine_start_sandbox(&self, spec: &SandboxSpec, dir: &Path) -> Result<()> {
        let Some(app) = self.apptainer() else {
            let bundle = dir.join("bundle");
            spec.write_bundle(&bundle)?;
            self.crun.create(&spec.id, &bundle, crate::engine::Stdio3::null(), None)?;
            return Ok(self.crun.start(&spec.id)?);
        };
        let root = dir.join("root");
        app.write_sandbox_root(&root)?;
        let mut cmd = app.instance_start(spec, &root)?;
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
            return Err(crate::engine::Error::Command {
                command: format!("apptainer instance start {}", Apptainer::instance_name(&spec.id)?),
                status: status.to_string(),
                stderr: std::fs::read_to_string(&log).unwrap_or_default().trim().to_owned(),
            }
            .into());
        }
        Ok(())
    }

    /// The host PID of a sandbox's pause right after it started.
    pub(crate) fn engine_sandbox_pid(&self, id: &str, dir: &Path) -> Result<Option<u32>> {
        match self.apptainer() {
            None => Ok(Crun::created_pid(&dir.join("bundle"))),
            Some(_) => Ok(self.engine_sandbox_state(id)?.map(|s| s.pid).filter(|pid| *pid > 0)),
        }
    }

    /// The sandbox's state (`running` with the pause's host PID); `None` if the engine does
    /// not know it.
    pub(crate) fn engine_sandbox_state(&self, id: &str) -> Result<Option<ContainerState>> {
        match self.apptainer() {
            None => Ok(self.crun.state(id)?),
            Some(app) => Ok(app.sandbox_state(id)?),
        }
    }

    /// Signals the sandbox's pause: `TERM` (which the pause forwards, with its grace period)
    /// or `KILL`.
    pub(crate) fn engine_kill_sandbox(&self, id: &str, signal: &str) -> Result<()> {
        let Some(app) = self.apptainer() else { return Ok(self.crun.kill(id, signal)?) };
        let how = if signal == "KILL" {
            Stop::Kill
        } else {
            Stop::Term { timeout: self.config.pause_grace_seconds + 5 }
        };
        crate::engine::run_command(&mut app.instance_stop(id, how)?)?;
        Ok(())
    }

    /// Removes what the engine keeps of the sandbox (killing it if it still runs).
    pub(crate) fn engine_delete_sandbox(&self, id: &str) -> Result<()> {
        let Some(app) = self.apptainer() else { return Ok(self.crun.delete(id, true)?) };
        if app.sandbox_state(id)?.is_some() {
            crate::engine::run_command(&mut app.instance_stop(id, Stop::Kill)?)?;
        }
        Ok(())
    }

    /// Brings up the loopback interface of the sandbox whose pause is `pid`.
    pub(crate) fn engine_loopback_up(&self, pid: u32) -> Result<()> {
        match self.apptainer() {
            None => {
                self.crun.run_prefixed(
                    "nsenter",
                    &[&format!("--net=/proc/{pid}/ns/net"), "ip", "link", "set", "lo", "up"],
                )?;
            }
            Some(app) => {
                crate::engine::run_command(&mut app.loopback_up(pid))?;
            }
        }
        Ok(())
    }

    /// Launches an Apptainer container, waiting for start (see [`apptainer::LAUNCHER`]).
    /// `uid` is what the container should run as; `pod_uid` whether the pod asked for it.
    pub(crate) fn apptainer_create(
        &self,
        dir: &Path,
        pause_pid: u32,
        mut launch: ContainerLaunch,
        uid: u32,
        pod_uid: bool,
        stdio: crate::engine::Stdio3,
    ) -> Result<()> {
        let app = self
            .apptainer()
            .ok_or_else(|| Error::FailedPrecondition("the runtime's engine is not apptainer".into()))?;
        let own = nix::unistd::getuid().as_raw();
        launch.fakeroot = uid == 0;
        if uid != 0 && uid != own {
            if pod_uid {
                return Err(crate::engine::Error::Unsupported(format!(
                    "runAsUser {uid}: the apptainer engine runs a container as root of a user namespace \
                     (--fakeroot) or as the runtime's own user ({own}), not as another user"
                ))
                .into());
            }
            warn!(uid, own, "image user cannot be mapped by apptainer; running as the runtime's user");
        }
        launch.start_fifo = dir.join(START_FIFO);
        launch.pid_file = dir.join(PID_FILE);
        nix::unistd::mkfifo(&launch.start_fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .map_err(|e| Error::io("create", &launch.start_fifo, e.into()))?;
        super::record::write(dir, RECORD, &Record { fakeroot: launch.fakeroot })?;
        let status = app
            .launch(pause_pid, &launch)?
            .stdin(stdio.stdin)
            .stdout(stdio.stdout)
            .stderr(stdio.stderr)
            .status()
            .map_err(|e| Error::io("run the apptainer launcher for", dir, e))?;
        if !status.success() || read_pid(&launch.pid_file).is_none() {
            return Err(Error::FailedPrecondition(format!(
                "launching the container with nsenter and apptainer failed ({status}); \
                 the reason is in the container's log"
            )));
        }
        Ok(())
    }

    /// Starts a created container; returns its init's PID in the sandbox.
    pub(crate) fn engine_start_container(&self, id: &str, pause_pid: u32) -> Result<Option<i32>> {
        if self.apptainer().is_none() {
            let crun = self.crun_for(pause_pid);
            // The init exists (waiting for start) since create: learn its PID in the sandbox
            // now (crun ran in the sandbox's PID namespace), so an exit reported right after
            // start is matched to it.
            let sandbox_pid = Crun::created_pid(&self.container_dir(id).join("bundle"))
                .and_then(|pid| i32::try_from(pid).ok());
            crun.start(id)?;
            return Ok(sandbox_pid);
        }
        let dir = self.container_dir(id);
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

    /// Signals a container's init (`TERM`), or kills its whole process tree (`KILL`).
    pub(crate) fn engine_kill_container(&self, id: &str, pause_pid: u32, signal: &str) -> Result<()> {
        if self.apptainer().is_none() {
            return Ok(self.crun_for(pause_pid).kill(id, signal)?);
        }
        // SIGTERM to apptainer's master, which forwards it to the container; SIGKILL cannot be
        // forwarded, so it goes to every process of the container's tree.
        let Some(init) = read_pid(&self.container_dir(id).join(PID_FILE)) else { return Ok(()) };
        let all = apptainer::scan();
        let Some(host) = apptainer::host_pid_in(&all, pause_pid, init) else { return Ok(()) };
        let targets = if signal == "KILL" { apptainer::process_tree(&all, host) } else { vec![host] };
        let signal = if signal == "KILL" { nix::sys::signal::SIGKILL } else { nix::sys::signal::SIGTERM };
        for pid in targets.into_iter().filter_map(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        }
        Ok(())
    }

    /// Removes what the engine keeps of a container; an Apptainer container that was never
    /// started has its waiting launcher killed.
    pub(crate) fn engine_delete_container(&self, id: &str, pause_pid: u32) -> Result<()> {
        if self.apptainer().is_none() {
            return Ok(self.crun_for(pause_pid).delete(id, true)?);
        }
        if self.container_dir(id).join(START_FIFO).exists() {
            self.engine_kill_container(id, pause_pid, "KILL")?;
        }
        Ok(())
    }

    /// Unmounts a container's root filesystem (crun's overlay; Apptainer mounts nothing here).
    pub(crate) fn engine_unmount(&self, dir: &Path) -> Result<()> {
        if self.apptainer().is_none() {
            Overlay::new(dir, vec![])?.unmount(&self.crun)?;
        }
        Ok(())
    }

    /// A command run in the running container `id`, without a tty (see
    /// [`crate::engine::Crun::exec`] and [`Apptainer::exec`]).
    pub(crate) fn engine_exec(
        &self,
        id: &str,
        pause_pid: u32,
        cmd: &[String],
        scratch: &Path,
        pid_file: &Path,
        log: &Path,
    ) -> Result<tokio::process::Command> {
        let Some(app) = self.apptainer() else {
            let process = self.exec_process(id, cmd, false, scratch)?;
            return Ok(self.crun_for(pause_pid).exec(id, &process, pid_file, log));
        };
        let dir = self.container_dir(id);
        let not_running = || Error::FailedPrecondition(format!("container {id} has no running process"));
        let init = read_pid(&dir.join(PID_FILE)).ok_or_else(not_running)?;
        let all = apptainer::scan();
        let master = apptainer::host_pid_in(&all, pause_pid, init).ok_or_else(not_running)?;
        let target = apptainer::container_process(&all, master).ok_or_else(not_running)?;
        let record: Record = super::record::read(&dir, RECORD)?.ok_or_else(not_running)?;
        let environ = std::fs::read(format!("/proc/{target}/environ"))
            .map_err(|e| Error::io("read the environment of", PathBuf::from(format!("/proc/{target}")), e))?;
        Ok(app.exec(target, record.fakeroot, &parse_environ(&environ), cmd))
    }

    /// Refuses a terminal where the engine cannot give one.
    pub(crate) fn engine_check_tty(&self, tty: bool) -> Result<()> {
        if tty && self.apptainer().is_some() {
            return Err(crate::engine::Error::Unsupported(
                "the apptainer engine does not provide terminals (tty) yet".into(),
            )
            .into());
        }
        Ok(())
    }

    /// Pulls an image into the store and, with Apptainer, its SIF into Apptainer's cache.
    pub async fn pull_image(&self, reference: &str, auth: Option<Credentials>) -> Result<ImageRecord> {
        let Some(app) = self.apptainer() else { return Ok(self.images.pull(reference, auth).await?) };
        if matches!(auth, Some(Credentials::RegistryToken(_) | Credentials::IdentityToken(_))) {
            // Refused before anything is downloaded.
            app.pull("", "", auth.as_ref(), Path::new(""))?;
        }
        let record = self.images.pull(reference, auth.clone()).await?;
        let name = ImageRef::parse(reference)?.name();
        let pinned = record
            .repo_digests
            .iter()
            .find(|d| d.strip_prefix(&name).is_some_and(|rest| rest.starts_with('@')))
            .ok_or_else(|| {
                Error::FailedPrecondition(format!("image {reference} has no digest for {name}"))
            })?;
        let sif = app.sif_path(pinned);
        if sif.is_file() {
            return Ok(record);
        }
        let dir = app.images_dir();
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create", &dir, e))?;
        let scratch = tempfile::Builder::new()
            .prefix(".pull-")
            .tempdir_in(&dir)
            .map_err(|e| Error::io("create", &dir, e))?;
        let output = scratch.path().join("image.sif");
        let registry = ImageRef::parse(pinned)?.registry().to_owned();
        let mut cmd = tokio::process::Command::from(app.pull(pinned, &registry, auth.as_ref(), &output)?);
        let out = cmd
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| Error::io("run apptainer pull into", &dir, e))?;
        if !out.status.success() {
            return Err(crate::engine::Error::Command {
                command: format!("apptainer pull docker://{pinned}"),
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            }
            .into());
        }
        std::fs::rename(&output, &sif).map_err(|e| Error::io("move the pulled image to", &sif, e))?;
        Ok(record)
    }

    /// The SIF of `image` in Apptainer's cache, if it has one there.
    pub(crate) fn sif_of(&self, image: &ImageRecord) -> Option<PathBuf> {
        let app = self.apptainer()?;
        image.repo_digests.iter().map(|d| app.sif_path(d)).find(|p| p.is_file())
    }

    /// The image `wanted` names, if present for this engine (with Apptainer: with its SIF).
    pub fn image_status(&self, wanted: &str) -> Option<ImageRecord> {
        let image = self.images.status(wanted)?;
        (self.apptainer().is_none() || self.sif_of(&image).is_some()).then_some(image)
    }

    /// The images present for this engine.
    pub fn list_images(&self) -> Vec<ImageRecord> {
        let images = self.images.list();
        if self.apptainer().is_none() {
            return images;
        }
        images.into_iter().filter(|i| self.sif_of(i).is_some()).collect()
    }

    /// Removes an image, and with Apptainer its SIFs once the store has no record of it.
    pub async fn remove_image(&self, wanted: &str) -> Result<()> {
        let before = self.images.status(wanted);
        self.images.remove(wanted).await?;
        if let (Some(app), Some(image)) = (self.apptainer(), before)
            && self.images.status(&image.id).is_none()
        {
            for digest in &image.repo_digests {
                let sif = app.sif_path(digest);
                match std::fs::remove_file(&sif) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(Error::io("remove", &sif, e));
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

/// What a container's launch needs from its CRI config, for [`Runtime::apptainer_create`].
pub(crate) fn launch_of(
    image: PathBuf,
    args: Vec<String>,
    env: Vec<String>,
    cwd: String,
    mounts: Vec<(PathBuf, String, bool)>,
    config: &cri::ContainerConfig,
) -> ContainerLaunch {
    let security = config.linux.as_ref().and_then(|l| l.security_context.as_ref());
    ContainerLaunch {
        image,
        args,
        env,
        cwd,
        fakeroot: false,
        mounts,
        readonly_rootfs: security.is_some_and(|s| s.readonly_rootfs),
        start_fifo: PathBuf::new(),
        pid_file: PathBuf::new(),
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
