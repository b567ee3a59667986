//! [`CrunEngine`]: sandboxes and containers as crun containers from OCI bundles, roots on
//! overlays of the image's layers.

use std::path::{Path, PathBuf};

use super::Crun;
use crate::engine::{
    ContainerSpec, ContainerState, Created, Engine, EngineKind, Error, ExecIn, NewContainer, Overlay, Result,
    Root, SandboxSpec, Signal,
};
use crate::images::ImageRecord;

/// The crun engine. Its [`Crun`] also runs mounts and `nsenter` through its prefix.
#[derive(Clone, Debug)]
pub struct CrunEngine {
    crun: Crun,
    /// Where the layers of mount points are kept ([`CrunEngine::with_mount_points`]).
    mount_points: Option<PathBuf>,
}

impl CrunEngine {
    /// An engine running `crun`.
    pub fn new(crun: Crun) -> Self {
        Self { crun, mount_points: None }
    }

    /// Puts a layer of the mount points each container is given below its image's layers,
    /// kept in `dir` (see `mount_points`), so that crun makes none in the writable layer.
    pub fn with_mount_points(mut self, dir: &Path) -> Self {
        super::mount_points::remove_unfinished(dir);
        self.mount_points = Some(dir.to_owned());
        self
    }

    /// crun for a container of the sandbox whose pause is `pause_pid`: inside its PID namespace
    /// while that pause lives (see [`Crun::in_pid_namespace`]), else plain — a container of a
    /// stopped sandbox can still be inspected and deleted.
    fn crun_for(&self, pause_pid: u32) -> Crun {
        let cmdline = std::fs::read(format!("/proc/{pause_pid}/cmdline")).unwrap_or_default();
        let alive = String::from_utf8_lossy(&cmdline).contains("hpk-pause");
        if alive { self.crun.in_pid_namespace(pause_pid) } else { self.crun.clone() }
    }

    /// Writes the OCI process an exec runs into `scratch`: the container's own (user, groups,
    /// capabilities, `no_new_privs`, environment, working directory), with `cmd` as its
    /// arguments, so an exec'd command has exactly the container's privileges.
    fn exec_process(dir: &Path, cmd: &[String], tty: bool, scratch: &Path) -> Result<PathBuf> {
        let config_path = dir.join("bundle/config.json");
        let text = std::fs::read(&config_path).map_err(|e| Error::io("read", &config_path, e))?;
        let config: serde_json::Value = serde_json::from_slice(&text)
            .map_err(|e| Error::io("parse", &config_path, std::io::Error::other(e.to_string())))?;
        let mut process = config.get("process").cloned().unwrap_or_default();
        process["args"] = serde_json::json!(cmd);
        process["terminal"] = serde_json::json!(tty);
        let path = scratch.join("process.json");
        let bytes = serde_json::to_vec(&process)
            .map_err(|e| Error::io("encode", &path, std::io::Error::other(e.to_string())))?;
        std::fs::write(&path, bytes).map_err(|e| Error::io("write", &path, e))?;
        Ok(path)
    }
}

impl Engine for CrunEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Crun
    }

    fn ready(&self) -> Result<()> {
        self.crun.list()
    }

    fn start_sandbox(&self, spec: &SandboxSpec, dir: &Path) -> Result<()> {
        let bundle = dir.join("bundle");
        spec.write_bundle(&bundle)?;
        self.crun.run_detached(&spec.id, &bundle)
    }

    fn sandbox_pid(&self, _id: &str, dir: &Path) -> Result<Option<u32>> {
        Ok(Crun::created_pid(&dir.join("bundle")))
    }

    fn sandbox_state(&self, id: &str) -> Result<Option<ContainerState>> {
        self.crun.state(id)
    }

    fn kill_sandbox(&self, id: &str, signal: Signal) -> Result<()> {
        self.crun.kill(id, signal.name())
    }

    fn delete_sandbox(&self, id: &str) -> Result<()> {
        self.crun.delete(id, true)
    }

    fn loopback_up(&self, pid: u32) -> Result<()> {
        let netns = format!("/proc/{pid}/ns/net");
        match crate::engine::loopback::up(&netns) {
            Ok(()) => Ok(()),
            // Where this process may not enter the namespace, the tools may.
            Err(e) => {
                tracing::debug!(error = %e, "loopback up in-process failed; running ip");
                self.crun
                    .run_prefixed("nsenter", &[&format!("--net={netns}"), "ip", "link", "set", "lo", "up"])
                    .map(drop)
            }
        }
    }

    fn check_tty(&self, _tty: bool) -> Result<()> {
        Ok(())
    }

    fn prepare_root(
        &self,
        dir: &Path,
        writable: &Path,
        mut layers: Vec<PathBuf>,
        _image: &ImageRecord,
        destinations: &[&str],
    ) -> Result<Root> {
        // Below the image's layers: the mount points the image lacks, so that crun need not
        // make them in the writable layer (see mount_points).
        if let Some(base) = &self.mount_points {
            match super::mount_points::layer(base, destinations) {
                Ok(points) => layers.push(points),
                Err(e) => {
                    tracing::warn!(error = %e, "no layer of mount points; crun makes the missing ones in the container's writable layer")
                }
            }
        }
        let overlay = Overlay::new(dir, writable, layers)?;
        overlay.mount(&self.crun)?;
        Ok(Root { image: overlay.target.clone(), files: Some(overlay.target) })
    }

    fn create_container(&self, new: NewContainer<'_>) -> Result<Created> {
        let asked = new.user.clone();
        let (user, not_honoured) = (new.fit_user)(new.user);
        if let Some(note) = &not_honoured {
            tracing::warn!(
                container = new.id,
                uid = asked.uid,
                gid = asked.gid,
                groups = ?asked.additional_gids,
                runs_as = %format!("{}:{}", user.uid, user.gid),
                %note,
                "container user not honoured"
            );
        }
        let spec = ContainerSpec {
            id: new.id.to_owned(),
            rootfs: new.root.image,
            args: new.args,
            env: new.env,
            cwd: new.cwd,
            uid: user.uid,
            gid: user.gid,
            additional_gids: user.additional_gids,
            mounts: new.mounts,
            security: new.security,
            own_pid_namespace: new.own_pid_namespace,
            readonly_rootfs: new.readonly_rootfs,
            terminal: new.console.is_some(),
        };
        let bundle = new.dir.join("bundle");
        spec.write_bundle(&bundle)?;
        let created = |start_error| Created { start_error, not_honoured: not_honoured.clone() };
        let outcome = self.crun_for(new.pause_pid).create(new.id, &bundle, new.stdio, new.console.as_deref());
        // The container's mount namespace has its root now (or there is no container): ours
        // need not keep it.
        if let Err(e) = Overlay::detach_in(new.dir, &self.crun) {
            tracing::warn!(container = new.id, error = %e, "the container's root stays mounted in the runtime's namespace");
        }
        match outcome {
            Ok(()) => Ok(created(None)),
            // crun checks the command at create (its init has already written the reason to the
            // container's stderr, so it is in the log). Kubernetes users expect what a shell
            // gives: the container starts and exits 127, not a failed create.
            Err(Error::Command { stderr, .. })
                if stderr.contains("executable file") && stderr.contains("not found") =>
            {
                Ok(created(Some(stderr.lines().last().unwrap_or(&stderr).to_owned())))
            }
            Err(e) => Err(e),
        }
    }

    fn start_container(&self, id: &str, dir: &Path, pause_pid: u32) -> Result<Option<i32>> {
        let crun = self.crun_for(pause_pid);
        // The init exists (waiting for start) since create: learn its PID in the sandbox now
        // (crun ran in the sandbox's PID namespace), so an exit reported right after start is
        // matched to it.
        let sandbox_pid = Crun::created_pid(&dir.join("bundle")).and_then(|pid| i32::try_from(pid).ok());
        crun.start(id)?;
        Ok(sandbox_pid)
    }

    fn kill_container(&self, id: &str, _dir: &Path, pause_pid: u32, signal: Signal) -> Result<()> {
        self.crun_for(pause_pid).kill(id, signal.name())
    }

    fn delete_container(&self, id: &str, _dir: &Path, pause_pid: u32) -> Result<()> {
        self.crun_for(pause_pid).delete(id, true)
    }

    fn unmount(&self, dir: &Path) -> Result<()> {
        Overlay::unmount_in(dir, &self.crun)
    }

    fn exec(&self, exec: ExecIn<'_>) -> Result<tokio::process::Command> {
        let process = Self::exec_process(exec.dir, exec.cmd, false, exec.scratch)?;
        Ok(self.crun_for(exec.pause_pid).exec(exec.id, &process, exec.pid_file, exec.log))
    }

    fn exec_tty(&self, exec: ExecIn<'_>, console: &Path) -> Result<tokio::process::Command> {
        let process = Self::exec_process(exec.dir, exec.cmd, true, exec.scratch)?;
        Ok(self.crun_for(exec.pause_pid).exec_detached_tty(
            exec.id,
            &process,
            exec.pid_file,
            exec.log,
            console,
        ))
    }
}
