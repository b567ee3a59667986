//! A recording fake [`Engine`] for unit tests of the runtime's sequences: it runs nothing, says
//! what it was asked in order, fails the call a test names, and plays the sandbox's hpk-pause
//! on its events socket (ready at start; an exit for each container it kills; gone at kill).

use std::collections::HashMap;
use std::io::Write as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use crate::engine::{
    ContainerState, Created, Engine, EngineKind, Error, ExecIn, NewContainer, Result, Root, SandboxSpec,
    Signal,
};
use crate::images::ImageRecord;

/// A sandbox as the fake keeps it.
#[derive(Debug)]
struct FakeSandbox {
    /// The pause's side of the events channel; `None` once it "exited".
    pause: Option<UnixStream>,
}

/// A container as the fake keeps it.
#[derive(Debug)]
struct FakeContainer {
    sandbox_id: String,
    /// Its init's PID in the sandbox, once started; `None` once it exited.
    pid: Option<i32>,
}

#[derive(Debug, Default)]
struct Inner {
    calls: Vec<String>,
    fail: Option<&'static str>,
    sandboxes: HashMap<String, FakeSandbox>,
    containers: HashMap<String, FakeContainer>,
    /// Container directories with a root prepared and not yet unmounted.
    roots: Vec<PathBuf>,
    /// Channels of pauses that died unseen (see [`FakeEngine::pause_dies_unseen`]), held open
    /// so that no runtime notices.
    unseen: Vec<UnixStream>,
    next_pid: i32,
}

/// The fake engine. Its sandboxes' pause is this process.
#[derive(Debug, Default)]
pub(crate) struct FakeEngine {
    inner: Mutex<Inner>,
}

impl FakeEngine {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the call `name` (with `id`), failing it if a test asked for that.
    fn call(&self, name: &'static str, id: &str) -> Result<()> {
        let mut inner = self.inner();
        inner.calls.push(format!("{name} {id}"));
        if inner.fail == Some(name) {
            return Err(Error::Command {
                command: name.into(),
                status: "exit status 1".into(),
                stderr: "fake".into(),
            });
        }
        Ok(())
    }

    /// Makes every later call named `name` fail.
    pub(crate) fn fail(&self, name: &'static str) {
        self.inner().fail = Some(name);
    }

    /// No call fails any more.
    pub(crate) fn pass(&self) {
        self.inner().fail = None;
    }

    /// The sandbox's pause is gone, while the runtime that started it was down: the engine
    /// says it stopped, and no runtime sees its channel close.
    pub(crate) fn pause_dies_unseen(&self, id: &str) {
        let mut inner = self.inner();
        let pause = inner.sandboxes.get_mut(id).and_then(|s| s.pause.take());
        inner.unseen.extend(pause);
    }

    /// The calls so far, names only, in order.
    pub(crate) fn calls(&self) -> Vec<String> {
        self.inner().calls.iter().map(|c| c.split(' ').next().unwrap_or_default().to_owned()).collect()
    }

    /// What the engine still holds: sandboxes, containers and mounted roots.
    pub(crate) fn held(&self) -> (usize, usize, usize) {
        let inner = self.inner();
        (inner.sandboxes.len(), inner.containers.len(), inner.roots.len())
    }

    /// The running container `id`'s init exits with `code`, as its pause reports it.
    pub(crate) fn exit(&self, id: &str, code: i32) {
        let mut inner = self.inner();
        let Inner { containers, sandboxes, .. } = &mut *inner;
        let Some(container) = containers.get_mut(id) else { return };
        let (Some(pid), Some(sandbox)) = (container.pid.take(), sandboxes.get_mut(&container.sandbox_id))
        else {
            return;
        };
        if let Some(pause) = sandbox.pause.as_mut() {
            let line = format!("{{\"pid\":{pid},\"host_pid\":null,\"exit_code\":{code},\"signal\":null}}\n");
            let _ = pause.write_all(line.as_bytes());
        }
    }
}

impl Engine for FakeEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Crun
    }

    fn ready(&self) -> Result<()> {
        self.call("ready", "")
    }

    fn start_sandbox(&self, spec: &SandboxSpec, _dir: &Path) -> Result<()> {
        self.call("start_sandbox", &spec.id)?;
        let socket = spec.events_dir.join("events.sock");
        let mut pause = UnixStream::connect(&socket).map_err(|e| Error::io("connect to", &socket, e))?;
        pause
            .write_all(b"{\"ready\":true,\"pid\":1,\"queued\":0}\n")
            .map_err(|e| Error::io("write to", &socket, e))?;
        self.inner().sandboxes.insert(spec.id.clone(), FakeSandbox { pause: Some(pause) });
        Ok(())
    }

    fn sandbox_pid(&self, id: &str, _dir: &Path) -> Result<Option<u32>> {
        self.call("sandbox_pid", id)?;
        Ok(self.inner().sandboxes.contains_key(id).then(std::process::id))
    }

    fn sandbox_state(&self, id: &str) -> Result<Option<ContainerState>> {
        self.call("sandbox_state", id)?;
        Ok(self.inner().sandboxes.get(id).map(|s| ContainerState {
            status: if s.pause.is_some() { "running" } else { "stopped" }.into(),
            pid: std::process::id(),
        }))
    }

    fn kill_sandbox(&self, id: &str, signal: Signal) -> Result<()> {
        self.call(if signal == Signal::Kill { "kill_sandbox_kill" } else { "kill_sandbox" }, id)?;
        if let Some(sandbox) = self.inner().sandboxes.get_mut(id) {
            sandbox.pause = None;
        }
        Ok(())
    }

    fn delete_sandbox(&self, id: &str) -> Result<()> {
        self.call("delete_sandbox", id)?;
        self.inner().sandboxes.remove(id);
        Ok(())
    }

    fn loopback_up(&self, pid: u32) -> Result<()> {
        self.call("loopback_up", &pid.to_string())
    }

    fn check_tty(&self, _tty: bool) -> Result<()> {
        Ok(())
    }

    fn prepare_root(
        &self,
        dir: &Path,
        writable: &Path,
        _layers: Vec<PathBuf>,
        _image: &ImageRecord,
        _destinations: &[&str],
    ) -> Result<Root> {
        self.call("prepare_root", &dir.display().to_string())?;
        let rootfs = dir.join("rootfs");
        // As the overlay's: the root in the container's directory, its writable layer apart.
        for d in [rootfs.clone(), writable.join("upper"), writable.join("work")] {
            std::fs::create_dir_all(&d).map_err(|e| Error::io("create", &d, e))?;
        }
        self.inner().roots.push(dir.to_owned());
        Ok(Root { image: rootfs.clone(), files: Some(rootfs) })
    }

    fn create_container(&self, new: NewContainer<'_>) -> Result<Created> {
        self.call("create_container", new.id)?;
        let (_, not_honoured) = (new.fit_user)(new.user);
        let container = FakeContainer { sandbox_id: new.sandbox_id.to_owned(), pid: None };
        self.inner().containers.insert(new.id.to_owned(), container);
        Ok(Created { start_error: None, not_honoured })
    }

    fn start_container(&self, id: &str, _dir: &Path, _pause_pid: u32) -> Result<Option<i32>> {
        self.call("start_container", id)?;
        let mut inner = self.inner();
        // PID 1 is the pause.
        inner.next_pid = inner.next_pid.max(1) + 1;
        let pid = inner.next_pid;
        let container = inner
            .containers
            .get_mut(id)
            .ok_or_else(|| Error::FailedPrecondition(format!("no container {id}")))?;
        container.pid = Some(pid);
        Ok(Some(pid))
    }

    fn kill_container(&self, id: &str, _dir: &Path, _pause_pid: u32, signal: Signal) -> Result<()> {
        self.call(if signal == Signal::Kill { "kill_container_kill" } else { "kill_container" }, id)?;
        self.exit(id, 128 + if signal == Signal::Kill { 9 } else { 15 });
        Ok(())
    }

    fn delete_container(&self, id: &str, _dir: &Path, _pause_pid: u32) -> Result<()> {
        self.call("delete_container", id)?;
        self.inner().containers.remove(id);
        Ok(())
    }

    fn unmount(&self, dir: &Path) -> Result<()> {
        self.call("unmount", &dir.display().to_string())?;
        self.inner().roots.retain(|d| d != dir);
        Ok(())
    }

    fn exec(&self, exec: ExecIn<'_>) -> Result<tokio::process::Command> {
        self.call("exec", exec.id)?;
        let mut cmd = tokio::process::Command::new("true");
        cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        Ok(cmd)
    }

    fn exec_tty(&self, exec: ExecIn<'_>, _console: &Path) -> Result<tokio::process::Command> {
        self.call("exec_tty", exec.id)?;
        Err(Error::Unsupported("the fake engine has no terminals".into()))
    }
}
