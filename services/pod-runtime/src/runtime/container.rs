//! CreateContainer, StartContainer, StopContainer, RemoveContainer, ContainerStatus,
//! ListContainers.

use std::collections::HashMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_cri::v1 as cri;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::watch;
use tracing::info;

use super::events::mark_exited;
use super::{Container, Error, Result, Runtime, join_inside, labels_match, new_id, now_nanos, resolve};
use crate::engine::{Created, Mount, NewContainer, Propagation, Security, Signal, Stdio3};
use crate::images::ImageRecord;

/// How long a log shim may take to open its FIFOs.
const SHIM_READY: Duration = Duration::from_secs(10);

/// What the kubelet asked of a container's standard streams.
#[derive(Clone, Copy, Debug)]
struct Streams {
    tty: bool,
    stdin: bool,
    stdin_once: bool,
}

/// A container's standard streams, and the shim holding their other ends.
struct Output {
    stdin: Stdio,
    stdout: Stdio,
    stderr: Stdio,
    /// The shim's console socket, when the container has a terminal.
    console: Option<PathBuf>,
    shim_pid: Option<u32>,
}

/// Largest environment plus arguments a container may get; past this, execve fails (E2BIG)
/// inside the container where nobody sees why, so it is refused up front.
const MAX_ARG_BYTES: usize = 1024 * 1024;

impl Runtime {
    /// Creates a container in a ready sandbox from a pulled image.
    pub async fn create_container(&self, sandbox_id: &str, config: cri::ContainerConfig) -> Result<String> {
        let sandbox_id = self.resolve_sandbox(sandbox_id).await?;
        let meta = config
            .metadata
            .clone()
            .ok_or_else(|| Error::Invalid("container config has no metadata".into()))?;
        if meta.name.is_empty() {
            return Err(Error::Invalid("container metadata needs a name".into()));
        }
        let (pause_pid, log_dir) = {
            let state = self.state.lock().await;
            let sandbox = state
                .sandboxes
                .get(&sandbox_id)
                .ok_or_else(|| Error::NotFound { kind: "sandbox", id: sandbox_id.clone() })?;
            if !sandbox.ready {
                return Err(Error::FailedPrecondition(format!("sandbox {sandbox_id} is not ready")));
            }
            let clash = state
                .containers
                .values()
                .find(|c| c.sandbox_id == sandbox_id && c.config.metadata.as_ref() == Some(&meta));
            if let Some(existing) = clash {
                return Err(Error::AlreadyExists(format!(
                    "container {} attempt {} already exists in sandbox {sandbox_id} as {}",
                    meta.name, meta.attempt, existing.id
                )));
            }
            (sandbox.pause_pid, sandbox.config.log_directory.clone())
        };
        let image_ref = config.image.as_ref().map(|i| i.image.clone()).unwrap_or_default();
        if image_ref.is_empty() {
            return Err(Error::Invalid("container config names no image".into()));
        }
        let image = self
            .images
            .status(&image_ref)
            .ok_or_else(|| Error::NotFound { kind: "image", id: image_ref.clone() })?;
        super::security::validate(&config)?;
        let security = super::security::security(&config)?;
        let own_pid_namespace = super::security::own_pid_namespace(&config)?;
        let process = process_of(&config, &image.config)?;
        let log_path = match (log_dir.is_empty(), config.log_path.is_empty()) {
            (false, false) => Some(join_inside(std::path::Path::new(&log_dir), &config.log_path)?),
            _ => None,
        };
        // Sources inside volumes are opened (not yet mounted) before anything is made, so a
        // subPath that leads through a link fails here.
        let held = super::sub_path::hold(&config, &self.pod_files())?;
        let mut mounts = mounts_of(&config, &held)?;
        // The pod's resolv.conf, hostname and hosts, where the kubelet mounts none of its own.
        let readonly_rootfs = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .is_some_and(|s| s.readonly_rootfs);
        for name in ["resolv.conf", "hostname", "hosts"] {
            let dest = format!("/etc/{name}");
            let file = self.sandbox_dir(&sandbox_id).join(name);
            if file.is_file() && !mounts.iter().any(|m| m.dest == dest) {
                mounts.push(Mount {
                    host: file,
                    dest,
                    readonly: readonly_rootfs,
                    propagation: Propagation::Private,
                });
            }
        }
        // CDI devices (a GPU the kubelet gave the container): their device nodes and files
        // bound in, their environment over the container's.
        let mut process = process;
        if !config.cdi_devices.is_empty() {
            let edits = cdi_edits(&self.config.cdi_spec_dirs, &config)?;
            apply_cdi(&edits, &mut mounts, &mut process.env);
        }
        let image_user = image.config.user.clone().unwrap_or_default();
        let process = Process { security, own_pid_namespace, image_user, ..process };
        self.engine.check_tty(config.tty)?;

        let id = new_id()?;
        let dir = self.container_dir(&id);
        if let Err(err) = super::sub_path::pin(&dir, held, &mut mounts) {
            let _ = self.remove_container_files(&id, &dir);
            return Err(err);
        }
        let layers = self.images.layers(&image);
        let streams = Streams { tty: config.tty, stdin: config.stdin, stdin_once: config.stdin_once };
        let attach = self.attach_socket(&sandbox_id, &id);
        let created = match self.start_output(&id, &dir, log_path.as_ref(), &attach, streams).await {
            Ok(output) => {
                let shim_pid = output.shim_pid;
                self.create_in(
                    &id,
                    &sandbox_id,
                    &dir,
                    layers,
                    &image,
                    pause_pid,
                    process,
                    mounts,
                    &config,
                    output,
                )
                .map(|created| (created, shim_pid))
            }
            Err(err) => Err(err),
        };
        let (Created { start_error, not_honoured }, shim_pid) = match created {
            Ok(created) => created,
            Err(err) => {
                let _ = self.engine.delete_container(&id, &dir, pause_pid);
                let _ = self.engine.unmount(&dir);
                let _ = self.remove_container_files(&id, &dir);
                return Err(err);
            }
        };
        let (exited, _) = watch::channel(false);
        let container = Container {
            id: id.clone(),
            dir,
            sandbox_id,
            config,
            image_ref,
            image_id: image.id.clone(),
            state: cri::ContainerState::ContainerCreated,
            created_at: now_nanos(),
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            log_path,
            pause_pid,
            sandbox_pid: None,
            exited,
            start_error,
            shim_pid,
            not_honoured,
        };
        if let Err(err) = container.save_all() {
            let _ = self.engine.delete_container(&id, &container.dir, pause_pid);
            let _ = self.engine.unmount(&container.dir);
            let _ = self.remove_container_files(&id, &container.dir);
            return Err(err);
        }
        let mut state = self.state.lock().await;
        state.containers.insert(id.clone(), container);
        self.emit(&state, &id, cri::ContainerEventType::ContainerCreatedEvent);
        drop(state);
        info!(container = %id, image = %image.id, "container created");
        Ok(id)
    }

    /// The container's standard streams, all held by its shim (see [`crate::logshim`]):
    /// FIFOs for stdout, stderr and (when asked for) stdin, or a terminal crun hands to the
    /// shim's console socket.
    async fn start_output(
        &self,
        id: &str,
        dir: &Path,
        log_path: Option<&PathBuf>,
        attach: &Path,
        streams: Streams,
    ) -> Result<Output> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
        if let Some(parent) = log_path.and_then(|p| p.parent()) {
            std::fs::create_dir_all(parent).map_err(|e| Error::io("create", parent, e))?;
        }
        let mkfifo = |name: &str| -> Result<PathBuf> {
            let fifo = dir.join(name);
            nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
                .map_err(|e| Error::io("create", &fifo, e.into()))?;
            Ok(fifo)
        };
        let shim_log = dir.join("shim.log");
        let shim_stderr = std::fs::File::create(&shim_log).map_err(|e| Error::io("create", &shim_log, e))?;
        let mut command = tokio::process::Command::new(&self.config.shim_binary);
        command.arg(crate::logshim::SUBCOMMAND).arg("--id").arg(id).arg("--attach").arg(attach);
        if let Some(log_path) = log_path {
            command.arg("--log").arg(log_path);
        }
        let (mut fifos, mut console) = (None, None);
        if streams.tty {
            // Beside the attach socket: a UNIX socket path has at most 107 bytes.
            let path = attach.with_extension("tty");
            command.arg("--console-socket").arg(&path);
            console = Some(path);
        } else {
            let (out, err) = (mkfifo("stdout.fifo")?, mkfifo("stderr.fifo")?);
            command.arg("--stdout").arg(&out).arg("--stderr").arg(&err);
            let stdin = if streams.stdin {
                let fifo = mkfifo("stdin.fifo")?;
                command.arg("--stdin").arg(&fifo);
                if streams.stdin_once {
                    command.arg("--stdin-once");
                }
                Some(fifo)
            } else {
                None
            };
            fifos = Some((out, err, stdin));
        }
        let mut shim = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(shim_stderr)
            // Its own process group: a signal to the runtime's group leaves the streams alone.
            .process_group(0)
            .spawn()
            .map_err(|e| Error::io("start the shim", &self.config.shim_binary, e))?;
        let shim_pid = shim.id();
        let ready = async {
            let mut line = String::new();
            if let Some(out) = shim.stdout.take() {
                BufReader::new(out)
                    .read_line(&mut line)
                    .await
                    .map_err(|e| Error::io("read", &shim_log, e))?;
            }
            Ok::<_, Error>(line)
        };
        match tokio::time::timeout(SHIM_READY, ready).await {
            Ok(Ok(line)) if line.trim() == "ready" => {}
            outcome => {
                let _ = shim.start_kill();
                let _ = shim.wait().await;
                let why = std::fs::read_to_string(&shim_log).unwrap_or_default();
                return Err(Error::FailedPrecondition(format!(
                    "the shim of container {id} did not start ({}): {}",
                    match outcome {
                        Ok(Ok(_)) => "it exited".to_owned(),
                        Ok(Err(e)) => e.to_string(),
                        Err(_) => format!("not ready within {SHIM_READY:?}"),
                    },
                    why.trim()
                )));
            }
        }
        // Reaped here while this runtime lives; after a restart the host's init reaps it.
        tokio::spawn(async move {
            let _ = shim.wait().await;
        });
        let Some((out, err, stdin)) = fifos else {
            // With a terminal crun gives the process the terminal for all three.
            return Ok(Output {
                stdin: Stdio::null(),
                stdout: Stdio::null(),
                stderr: Stdio::null(),
                console,
                shim_pid,
            });
        };
        // The shim holds the other end of each FIFO, so these neither block nor fail.
        let open = |fifo: &PathBuf, write: bool| -> Result<Stdio> {
            let file = std::fs::OpenOptions::new()
                .read(!write)
                .write(write)
                .custom_flags(nix::libc::O_NONBLOCK)
                .open(fifo)
                .map_err(|e| Error::io("open", fifo, e))?;
            let flags = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFL)
                .map_err(|e| Error::io("configure", fifo, e.into()))?;
            let mut flags = nix::fcntl::OFlag::from_bits_truncate(flags);
            flags.remove(nix::fcntl::OFlag::O_NONBLOCK);
            nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFL(flags))
                .map_err(|e| Error::io("configure", fifo, e.into()))?;
            Ok(Stdio::from(file))
        };
        Ok(Output {
            stdin: match &stdin {
                Some(fifo) => open(fifo, false)?,
                None => Stdio::null(),
            },
            stdout: open(&out, true)?,
            stderr: open(&err, true)?,
            console,
            shim_pid,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn create_in(
        &self,
        id: &str,
        sandbox_id: &str,
        dir: &Path,
        layers: Vec<PathBuf>,
        image: &ImageRecord,
        pause_pid: u32,
        process: Process,
        mounts: Vec<Mount>,
        config: &cri::ContainerConfig,
        output: Output,
    ) -> Result<Created> {
        let destinations: Vec<&str> = mounts.iter().map(|m| m.dest.as_str()).collect();
        let root = self.engine.prepare_root(dir, &self.writable_dir(id), layers, image, &destinations)?;
        // Names resolve in the image's own /etc/passwd and /etc/group, where the engine can read
        // them; else only numeric users do.
        let files = root.files.clone().unwrap_or_else(|| PathBuf::from("/nonexistent"));
        let user = super::security::resolve_user(config, &process.image_user, &files)?;
        let security = config.linux.as_ref().and_then(|l| l.security_context.as_ref());
        let fit_user = |user| super::unmapped::fit(user, config, self.ids.as_ref());
        Ok(self.engine.create_container(NewContainer {
            id,
            sandbox_id,
            dir,
            pause_pid,
            root,
            args: process.args,
            env: process.env,
            cwd: process.cwd,
            user,
            pod_user: security.is_some_and(|s| s.run_as_user.is_some()),
            fit_user: &fit_user,
            mounts,
            security: process.security,
            own_pid_namespace: process.own_pid_namespace,
            readonly_rootfs: security.is_some_and(|s| s.readonly_rootfs),
            stdio: Stdio3 { stdin: output.stdin, stdout: output.stdout, stderr: output.stderr },
            console: output.console,
        })?)
    }

    pub(crate) async fn resolve_container(&self, wanted: &str) -> Result<String> {
        let state = self.state.lock().await;
        resolve(state.containers.keys(), wanted, "container")
    }

    /// Starts a created container.
    pub async fn start_container(&self, wanted: &str) -> Result<()> {
        let id = self.resolve_container(wanted).await?;
        let pause_pid = {
            let mut state = self.state.lock().await;
            let c = state
                .containers
                .get_mut(&id)
                .ok_or_else(|| Error::NotFound { kind: "container", id: id.clone() })?;
            if c.state != cri::ContainerState::ContainerCreated {
                return Err(Error::FailedPrecondition(format!("container {id} is not in the created state")));
            }
            if let Some(message) = c.start_error.clone() {
                c.started_at = now_nanos();
                mark_exited(c, 127, &message);
                self.emit(&state, &id, cri::ContainerEventType::ContainerStartedEvent);
                self.emit(&state, &id, cri::ContainerEventType::ContainerStoppedEvent);
                info!(container = %id, %message, "container command not found; exited 127");
                return Ok(());
            }
            c.pause_pid
        };
        let sandbox_pid = self.engine.start_container(&id, &self.container_dir(&id), pause_pid)?;
        let mut state = self.state.lock().await;
        let super::State { sandboxes, containers } = &mut *state;
        let c =
            containers.get_mut(&id).ok_or_else(|| Error::NotFound { kind: "container", id: id.clone() })?;
        c.state = cri::ContainerState::ContainerRunning;
        c.started_at = now_nanos();
        c.sandbox_pid = sandbox_pid;
        c.save();
        let early = sandboxes
            .get_mut(&c.sandbox_id)
            .and_then(|s| sandbox_pid.and_then(|p| s.unclaimed_exits.remove(&p)));
        let shim = c.shim_pid;
        self.emit(&state, &id, cri::ContainerEventType::ContainerStartedEvent);
        info!(container = %id, ?sandbox_pid, "container started");
        if let Some(status) = early {
            // It ended before its start was recorded: recorded as exited once its output is
            // in the log, as any exit (`events::apply`).
            if let Some(shim) = shim {
                drop(state);
                super::events::wait_for_shim(shim, &id).await;
                state = self.state.lock().await;
            }
            if let Some(c) = state.containers.get_mut(&id).filter(|c| c.finished_at == 0) {
                mark_exited(c, status, "");
                self.emit(&state, &id, cri::ContainerEventType::ContainerStoppedEvent);
            }
        }
        Ok(())
    }

    /// Stops a running container: SIGTERM, then SIGKILL after `timeout` seconds.
    /// Stopping an unknown container succeeds, as the CRI asks (the kubelet retries).
    pub async fn stop_container(&self, wanted: &str, timeout: i64) -> Result<()> {
        let Ok(id) = self.resolve_container(wanted).await else { return Ok(()) };
        let (mut exited, pause_pid) = {
            let state = self.state.lock().await;
            let c = state
                .containers
                .get(&id)
                .ok_or_else(|| Error::NotFound { kind: "container", id: id.clone() })?;
            if c.state != cri::ContainerState::ContainerRunning {
                return Ok(());
            }
            (c.exited.subscribe(), c.pause_pid)
        };
        if timeout > 0 {
            let _ = self.engine.kill_container(&id, &self.container_dir(&id), pause_pid, Signal::Term);
            let grace = Duration::from_secs(u64::try_from(timeout).unwrap_or(0));
            if tokio::time::timeout(grace, exited.wait_for(|done| *done)).await.is_ok() {
                return Ok(());
            }
        }
        let _ = self.engine.kill_container(&id, &self.container_dir(&id), pause_pid, Signal::Kill);
        tokio::time::timeout(Duration::from_secs(10), exited.wait_for(|done| *done))
            .await
            .map_err(|_| Error::Timeout(format!("container {id} did not exit after SIGKILL")))?
            .map_err(|_| Error::FailedPrecondition(format!("container {id} was removed while stopping")))?;
        Ok(())
    }

    /// Removes a container (killing it if it runs) and its files. Unknown IDs succeed.
    pub async fn remove_container(&self, wanted: &str) -> Result<()> {
        let Ok(id) = self.resolve_container(wanted).await else { return Ok(()) };
        self.stop_container(&id, 0).await?;
        let (pause_pid, shim_pid) = {
            let state = self.state.lock().await;
            let c = state.containers.get(&id);
            (c.map(|c| c.pause_pid).unwrap_or(0), c.and_then(|c| c.shim_pid))
        };
        let dir = self.container_dir(&id);
        self.engine.delete_container(&id, &dir, pause_pid)?;
        // The shim ends by itself once every writer is gone; a process the container left
        // behind may still hold its stdout, and nothing reads that log any more.
        let shim = shim_pid.filter(|pid| crate::logshim::is_shim_of(*pid, &id));
        if let Some(pid) = shim.and_then(|pid| i32::try_from(pid).ok()) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        self.engine.unmount(&dir)?;
        self.remove_container_files(&id, &dir)?;
        let mut state = self.state.lock().await;
        self.emit(&state, &id, cri::ContainerEventType::ContainerDeletedEvent);
        state.containers.remove(&id);
        drop(state);
        info!(container = %id, "container removed");
        Ok(())
    }

    /// Reopens the container's log file at its path, after the kubelet rotated it away.
    pub async fn reopen_container_log(&self, wanted: &str) -> Result<()> {
        let id = self.resolve_container(wanted).await?;
        let state = self.state.lock().await;
        let c =
            state.containers.get(&id).ok_or_else(|| Error::NotFound { kind: "container", id: id.clone() })?;
        // CRI: for a container that is not running, either reopen or fail, and then never
        // create the file; failing is the simpler promise.
        if c.state != cri::ContainerState::ContainerRunning {
            return Err(Error::FailedPrecondition(format!("container {id} is not running")));
        }
        let Some(path) = &c.log_path else { return Ok(()) };
        // The file exists when this returns, as the kubelet expects; the shim switches to it
        // on the signal.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o640)
            .open(path)
            .map_err(|e| Error::io("reopen", path, e))?;
        let shim = c
            .shim_pid
            .filter(|pid| crate::logshim::is_shim_of(*pid, &id))
            .and_then(|pid| i32::try_from(pid).ok())
            .ok_or_else(|| {
                Error::FailedPrecondition(format!("container {id} has no log shim: its output has ended"))
            })?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(shim), nix::sys::signal::Signal::SIGUSR1)
            .map_err(|e| Error::io("signal the log shim of", &c.dir, e.into()))?;
        info!(container = %id, log = %path.display(), "container log reopened");
        Ok(())
    }

    /// The container's status.
    pub async fn container_status(&self, wanted: &str) -> Result<cri::ContainerStatus> {
        Ok(self.container_status_verbose(wanted).await?.0)
    }

    /// The container's status and the `info` of a verbose ContainerStatus.
    pub async fn container_status_verbose(
        &self,
        wanted: &str,
    ) -> Result<(cri::ContainerStatus, HashMap<String, String>)> {
        let id = self.resolve_container(wanted).await?;
        let state = self.state.lock().await;
        let c =
            state.containers.get(&id).ok_or_else(|| Error::NotFound { kind: "container", id: id.clone() })?;
        Ok((c.status(), c.info()))
    }

    /// Containers matching `filter`.
    pub async fn list_containers(&self, filter: Option<cri::ContainerFilter>) -> Vec<cri::Container> {
        let state = self.state.lock().await;
        let empty = HashMap::new();
        state
            .containers
            .values()
            .filter(|c| match &filter {
                None => true,
                Some(f) => {
                    (f.id.is_empty() || c.id.starts_with(&f.id))
                        && (f.pod_sandbox_id.is_empty() || c.sandbox_id.starts_with(&f.pod_sandbox_id))
                        && f.state.as_ref().is_none_or(|v| v.state == c.state as i32)
                        && labels_match(
                            &c.config.labels,
                            if f.label_selector.is_empty() { &empty } else { &f.label_selector },
                        )
                }
            })
            .map(|c| cri::Container {
                id: c.id.clone(),
                pod_sandbox_id: c.sandbox_id.clone(),
                metadata: c.config.metadata.clone(),
                image: c.config.image.clone(),
                image_ref: c.image_ref.clone(),
                image_id: c.image_id.clone(),
                state: c.state as i32,
                created_at: c.created_at,
                labels: c.config.labels.clone(),
                annotations: c.config.annotations.clone(),
            })
            .collect()
    }
}

impl Container {
    /// What a verbose ContainerStatus adds: the note on a user this bubble cannot give.
    pub(crate) fn info(&self) -> HashMap<String, String> {
        self.not_honoured.iter().map(|n| (super::NOT_HONOURED_KEY.to_owned(), n.clone())).collect()
    }

    /// Its CRI status.
    pub(crate) fn status(&self) -> cri::ContainerStatus {
        let c = self;
        cri::ContainerStatus {
            id: c.id.clone(),
            metadata: c.config.metadata.clone(),
            state: c.state as i32,
            created_at: c.created_at,
            started_at: c.started_at,
            finished_at: c.finished_at,
            exit_code: c.exit_code,
            image: c.config.image.clone(),
            image_ref: c.image_ref.clone(),
            image_id: c.image_id.clone(),
            reason: c.reason.clone(),
            labels: c.config.labels.clone(),
            annotations: c.config.annotations.clone(),
            mounts: c.config.mounts.clone(),
            log_path: c.log_path.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            ..Default::default()
        }
    }
}

/// What runs: arguments, environment, directory, the image's user and the privileges.
pub(crate) struct Process {
    args: Vec<String>,
    env: Vec<String>,
    cwd: String,
    /// The image's `User`, resolved once the root filesystem is mounted.
    image_user: String,
    security: Security,
    own_pid_namespace: bool,
}

/// Kubernetes semantics: `command` replaces the image's entrypoint (and drops its cmd), `args`
/// replaces its cmd; environment entries override the image's by name.
fn process_of(config: &cri::ContainerConfig, image: &crate::images::ImageConfig) -> Result<Process> {
    let mut args = if config.command.is_empty() { image.entrypoint.clone() } else { config.command.clone() };
    if !config.args.is_empty() {
        args.extend(config.args.iter().cloned());
    } else if config.command.is_empty() {
        args.extend(image.cmd.iter().cloned());
    }
    if args.is_empty() {
        return Err(Error::Invalid(
            "no command: neither the container config nor the image gives one".into(),
        ));
    }
    let mut env: Vec<String> = image.env.clone();
    for kv in &config.envs {
        if kv.key.is_empty() || kv.key.contains('=') {
            return Err(Error::Invalid(format!("environment variable name {:?} is invalid", kv.key)));
        }
        let prefix = format!("{}=", kv.key);
        env.retain(|e| !e.starts_with(&prefix));
        env.push(format!("{}={}", kv.key, kv.value));
    }
    let size: usize = env.iter().chain(args.iter()).map(|s| s.len() + 1).sum();
    if size > MAX_ARG_BYTES {
        return Err(Error::Invalid(format!(
            "environment and arguments take {size} bytes; at most {MAX_ARG_BYTES} can be passed to a process"
        )));
    }
    let cwd = if !config.working_dir.is_empty() {
        config.working_dir.clone()
    } else if image.working_dir.as_deref().is_some_and(|d| !d.is_empty()) {
        image.working_dir.clone().unwrap_or_default()
    } else {
        "/".into()
    };
    Ok(Process {
        args,
        env,
        cwd,
        image_user: String::new(),
        security: Security::default(),
        own_pid_namespace: false,
    })
}

/// The engine's mounts for `config`; the sources of `held` mounts were opened already (and
/// are pinned later), the others must exist.
/// What the container's CDI devices bring, from the specs in `dirs`; a device no spec
/// describes, or a device node or file missing here, is an error that names it. Hooks are not
/// run (logged as such).
fn cdi_edits(dirs: &[PathBuf], config: &cri::ContainerConfig) -> Result<hpk_cdi::ContainerEdits> {
    let (registry, errors) = hpk_cdi::Registry::load(dirs);
    for error in &errors {
        tracing::warn!(%error, "a CDI spec left out");
    }
    let names: Vec<String> = config.cdi_devices.iter().map(|d| d.name.clone()).collect();
    let resolved = registry.resolve(&names).map_err(|e| Error::Invalid(e.to_string()))?;
    for left_out in &resolved.not_applied {
        tracing::warn!(devices = ?names, "CDI: not applied: {left_out}");
    }
    let edits = resolved.edits;
    let sources = edits
        .device_nodes
        .iter()
        .map(|n| (n.source(), n.path.as_str()))
        .chain(edits.mounts.iter().map(|m| (m.host_path.as_str(), m.container_path.as_str())));
    for (source, dest) in sources {
        if !std::path::Path::new(source).exists() {
            return Err(Error::Invalid(format!(
                "CDI devices {names:?}: {source} (for {dest}) does not exist on this node"
            )));
        }
    }
    Ok(edits)
}

/// Binds `edits`' device nodes (read-write; a rootless engine cannot make device nodes, and a
/// bind keeps the host's permission checks) and files (read-only where the spec says so) over
/// any mount of the same destination, and sets their environment over `env`'s.
fn apply_cdi(edits: &hpk_cdi::ContainerEdits, mounts: &mut Vec<Mount>, env: &mut Vec<String>) {
    let binds =
        edits.device_nodes.iter().map(|n| (n.source(), n.path.as_str(), false)).chain(
            edits.mounts.iter().map(|m| (m.host_path.as_str(), m.container_path.as_str(), m.readonly())),
        );
    for (source, dest, readonly) in binds {
        mounts.retain(|m| m.dest != dest);
        mounts.push(Mount {
            host: PathBuf::from(source),
            dest: dest.to_owned(),
            readonly,
            propagation: Propagation::Private,
        });
    }
    for entry in &edits.env {
        let key = entry.split_once('=').map_or(entry.as_str(), |(k, _)| k);
        env.retain(|e| e.split_once('=').map_or(e.as_str(), |(k, _)| k) != key);
        env.push(entry.clone());
    }
}

fn mounts_of(config: &cri::ContainerConfig, held: &[super::sub_path::Held]) -> Result<Vec<Mount>> {
    config
        .mounts
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let dest = std::path::Path::new(&m.container_path);
            let escapes = dest.components().any(|c| matches!(c, std::path::Component::ParentDir));
            if !dest.is_absolute() || escapes {
                return Err(Error::Invalid(format!(
                    "mount path {:?} must be absolute without '..'",
                    m.container_path
                )));
            }
            let host = PathBuf::from(&m.host_path);
            if !held.iter().any(|h| h.index() == i) && !host.exists() {
                return Err(Error::Invalid(format!("mount source {} does not exist", host.display())));
            }
            let propagation = match cri::MountPropagation::try_from(m.propagation) {
                Ok(cri::MountPropagation::PropagationHostToContainer) => Propagation::HostToContainer,
                Ok(cri::MountPropagation::PropagationBidirectional) => Propagation::Bidirectional,
                _ => Propagation::Private,
            };
            Ok(Mount { host, dest: m.container_path.clone(), readonly: m.readonly, propagation })
        })
        .collect()
}

#[cfg(test)]
mod cdi_tests {
    use super::*;

    fn with_devices(names: &[&str]) -> cri::ContainerConfig {
        cri::ContainerConfig {
            cdi_devices: names.iter().map(|n| cri::CdiDevice { name: (*n).to_owned() }).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_containers_cdi_devices_become_binds_and_environment() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (dev, lib) = (tmp.path().join("nvidia1"), tmp.path().join("libnvidia-ml.so.1"));
        std::fs::write(&dev, "").expect("write");
        std::fs::write(&lib, "").expect("write");
        let spec = format!(
            r#"{{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu",
                "containerEdits":{{"env":["NVIDIA_DRIVER_CAPABILITIES=compute,utility"],
                  "mounts":[{{"hostPath":"{lib}","containerPath":"/usr/lib/libnvidia-ml.so.1","options":["ro","bind"]}}]}},
                "devices":[{{"name":"1","containerEdits":{{"deviceNodes":[{{"path":"/dev/nvidia1","hostPath":"{dev}"}}]}}}},
                           {{"name":"2","containerEdits":{{"deviceNodes":[{{"path":"/dev/nvidia2","hostPath":"/nonexistent/nvidia2"}}]}}}}]}}"#,
            lib = lib.display(),
            dev = dev.display()
        );
        let dirs = vec![tmp.path().join("cdi")];
        std::fs::create_dir(&dirs[0]).expect("mkdir");
        std::fs::write(dirs[0].join("gpu.json"), spec).expect("write");

        let edits = cdi_edits(&dirs, &with_devices(&["nvidia.com/gpu=1"])).expect("edits");
        let mut mounts = vec![Mount {
            host: PathBuf::from("/elsewhere"),
            dest: "/dev/nvidia1".into(),
            readonly: true,
            propagation: Propagation::Private,
        }];
        let mut env = vec!["PATH=/bin".to_owned(), "NVIDIA_DRIVER_CAPABILITIES=all".to_owned()];
        apply_cdi(&edits, &mut mounts, &mut env);
        let got: Vec<(&Path, &str, bool)> =
            mounts.iter().map(|m| (m.host.as_path(), m.dest.as_str(), m.readonly)).collect();
        assert_eq!(
            got,
            [(dev.as_path(), "/dev/nvidia1", false), (lib.as_path(), "/usr/lib/libnvidia-ml.so.1", true)],
            "the device read-write over the mount it replaces, the library read-only"
        );
        assert_eq!(env, ["PATH=/bin", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]);

        let err = cdi_edits(&dirs, &with_devices(&["nvidia.com/gpu=7"])).expect_err("unknown").to_string();
        assert!(err.contains("nvidia.com/gpu=7") && err.contains("not described"), "{err}");
        let err = cdi_edits(&dirs, &with_devices(&["nvidia.com/gpu=2"])).expect_err("missing").to_string();
        assert!(err.contains("/nonexistent/nvidia2") && err.contains("does not exist on this node"), "{err}");
        let err = cdi_edits(&dirs, &with_devices(&["gpu"])).expect_err("malformed").to_string();
        assert!(err.contains("no CDI device name"), "{err}");
    }
}
