//! Taking back, at start, what a previous run of the runtime left: sandboxes whose pause still
//! runs, their containers, and the exits that happened while nobody listened.
//!
//! For each sandbox with records whose hpk-pause is alive, the runtime listens again at the
//! sandbox's events socket and sends the pause SIGHUP; the pause reconnects with a ready line
//! that counts the exits it queued meanwhile, and sends them. Once they are applied, a
//! container still marked running whose init is no longer in the sandbox exited without a
//! report (one written to the dead runtime's socket is lost with it): it is marked exited with
//! code 255, reason `Unknown`, as containerd does for an exit it could not collect.
//!
//! A directory without records is a create that never finished: it is removed, with the crun
//! container and mounts it may have. So is a writable layer whose container is not taken back
//! (the state directory is a tmpfs that did not outlive its bubble, where the root did).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tracing::{info, warn};

use super::events::{mark_exited, parse_exit, parse_ready, sandbox_gone};
use super::exec::sandbox_processes;
use super::record::{self, CONFIG, STATE};
use super::{Container, Error, Result, Runtime, Sandbox};

/// How long a pause gets to reconnect and replay its queue after SIGHUP.
const RECONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What recovery found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Sandboxes whose pause runs, reconnected.
    pub running_sandboxes: usize,
    /// Sandboxes whose pause had exited.
    pub stopped_sandboxes: usize,
    /// Containers taken back, in any state.
    pub containers: usize,
    /// Exits reported while the runtime was down.
    pub exits_replayed: usize,
    /// Half-created sandboxes and containers removed.
    pub removed: usize,
}

impl Runtime {
    /// Loads the records under the state directory and reconnects to every live sandbox.
    /// Called once, before the CRI socket is served.
    pub async fn recover(self: &Arc<Self>) -> Result<Recovered> {
        let mut found = Recovered::default();
        let mut sandboxes = HashMap::new();
        for id in entries(&self.config.state.join("sandboxes"))? {
            let dir = self.sandbox_dir(&id);
            match load_sandbox(&id, &dir) {
                Ok(Some(sandbox)) => {
                    sandboxes.insert(id, sandbox);
                }
                outcome => {
                    if let Err(e) = outcome {
                        warn!(sandbox = %id, error = %e, "unreadable sandbox record; removing the sandbox");
                    }
                    let _ = self.engine.delete_sandbox(&id);
                    let _ = std::fs::remove_dir_all(&dir);
                    let _ = std::fs::remove_dir_all(self.events_dir(&id));
                    found.removed += 1;
                }
            }
        }
        let mut containers = HashMap::new();
        for id in entries(&self.config.state.join("containers"))? {
            let dir = self.container_dir(&id);
            let loaded = load_container(&id, &dir);
            let keep = matches!(&loaded, Ok(Some(c)) if sandboxes.contains_key(&c.sandbox_id));
            match loaded {
                Ok(Some(container)) if keep => {
                    containers.insert(id, container);
                }
                outcome => {
                    let pause_pid = match &outcome {
                        Ok(Some(c)) => c.pause_pid,
                        Ok(None) => 0,
                        Err(e) => {
                            warn!(container = %id, error = %e, "unreadable container record; removing it");
                            0
                        }
                    };
                    let _ = self.engine.delete_container(&id, &dir, pause_pid);
                    let _ = self.engine.unmount(&dir);
                    let _ = self.remove_container_files(&id, &dir);
                    found.removed += 1;
                }
            }
        }
        for id in entries(&self.config.root.join("layers"))? {
            if !containers.contains_key(&id) {
                let writable = self.writable_dir(&id);
                if let Err(e) = std::fs::remove_dir_all(&writable) {
                    warn!(container = %id, error = %e, "cannot remove a writable layer no container has");
                }
                found.removed += 1;
            }
        }
        found.containers = containers.len();
        let ids: Vec<(String, bool, u32)> =
            sandboxes.values().map(|s| (s.id.clone(), s.ready, s.pause_pid)).collect();
        {
            let mut state = self.state.lock().await;
            state.sandboxes.extend(sandboxes);
            state.containers.extend(containers);
        }
        for (id, ready, pause_pid) in ids {
            if ready && self.pause_alive(&id, pause_pid)? {
                match self.reconnect(&id, pause_pid).await {
                    Ok(replayed) => {
                        found.running_sandboxes += 1;
                        found.exits_replayed += replayed;
                        continue;
                    }
                    Err(e) => {
                        warn!(sandbox = %id, error = %e, "the sandbox's pause did not reconnect; marking it not ready");
                    }
                }
            }
            found.stopped_sandboxes += 1;
            sandbox_gone(self, &id, "the sandbox stopped while hpk-pod-runtime was down").await;
        }
        info!(?found, "recovered state");
        Ok(found)
    }

    /// Whether the sandbox's pause still runs as the same process.
    fn pause_alive(&self, id: &str, pause_pid: u32) -> Result<bool> {
        let running =
            self.engine.sandbox_state(id)?.is_some_and(|s| s.status == "running" && s.pid == pause_pid);
        let cmdline = std::fs::read(format!("/proc/{pause_pid}/cmdline")).unwrap_or_default();
        Ok(running && String::from_utf8_lossy(&cmdline).contains("hpk-pause"))
    }

    /// Listens at the sandbox's events socket again, has the pause reconnect, applies the exits
    /// it queued, reconciles the rest with `/proc`, and watches the channel from then on.
    /// Returns how many exits the pause replayed.
    async fn reconnect(self: &Arc<Self>, id: &str, pause_pid: u32) -> Result<usize> {
        let events_dir = self.events_dir(id);
        std::fs::create_dir_all(&events_dir).map_err(|e| Error::io("create", &events_dir, e))?;
        let socket = events_dir.join("events.sock");
        match std::fs::remove_file(&socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io("remove", &socket, e));
            }
            _ => {}
        }
        let listener = UnixListener::bind(&socket).map_err(|e| Error::io("listen on", &socket, e))?;
        let pid = i32::try_from(pause_pid)
            .map_err(|_| Error::Invalid(format!("pause PID {pause_pid} is out of range")))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGHUP)
            .map_err(|e| Error::io("signal the pause of", &events_dir, e.into()))?;
        let replay = async {
            let (stream, _) = listener.accept().await.map_err(|e| Error::io("accept on", &socket, e))?;
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            reader.read_line(&mut line).await.map_err(|e| Error::io("read", &socket, e))?;
            let queued = parse_ready(&line).ok_or_else(|| {
                Error::FailedPrecondition(format!("hpk-pause said {line:?} instead of ready"))
            })?;
            let mut exits = Vec::with_capacity(queued);
            for _ in 0..queued {
                line.clear();
                if reader.read_line(&mut line).await.map_err(|e| Error::io("read", &socket, e))? == 0 {
                    break;
                }
                exits.extend(parse_exit(&line));
            }
            Ok::<(BufReader<UnixStream>, Vec<_>), Error>((reader, exits))
        };
        let (reader, exits) = tokio::time::timeout(RECONNECT_TIMEOUT, replay).await.map_err(|_| {
            Error::Timeout(format!(
                "hpk-pause of sandbox {id} did not reconnect within {RECONNECT_TIMEOUT:?}"
            ))
        })??;
        let replayed = exits.len();
        for exit in exits {
            super::events::apply(self, id, exit).await;
        }
        self.reconcile(id, pause_pid).await;
        tokio::spawn(super::events::watch(Arc::clone(self), id.to_owned(), reader));
        info!(sandbox = %id, replayed, "sandbox reconnected");
        Ok(replayed)
    }

    /// Marks exited, with an unknown status, running containers whose init is gone.
    async fn reconcile(&self, id: &str, pause_pid: u32) {
        let alive: Vec<i32> = sandbox_processes(pause_pid).iter().map(|p| p.sandbox_pid).collect();
        let mut state = self.state.lock().await;
        let mut lost = Vec::new();
        for c in state.containers.values_mut().filter(|c| c.sandbox_id == id) {
            let gone = c.sandbox_pid.is_none_or(|pid| !alive.contains(&pid));
            if c.state == cri::ContainerState::ContainerRunning && gone {
                mark_exited(c, 255, "");
                c.reason = "Unknown: exited while hpk-pod-runtime was down; its status was lost".into();
                c.save();
                lost.push(c.id.clone());
            }
        }
        for cid in lost {
            warn!(container = %cid, "container exited while the runtime was down; status lost");
            self.emit(&state, &cid, cri::ContainerEventType::ContainerStoppedEvent);
        }
    }
}

/// The names in `dir` (IDs), skipping dot files.
fn entries(dir: &std::path::Path) -> Result<Vec<String>> {
    let read = std::fs::read_dir(dir).map_err(|e| Error::io("read", dir, e))?;
    Ok(read
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| !name.starts_with('.'))
        .collect())
}

fn load_sandbox(id: &str, dir: &std::path::Path) -> Result<Option<Sandbox>> {
    let config: Option<cri::PodSandboxConfig> = record::read(dir, CONFIG)?;
    let state: Option<record::SandboxState> = record::read(dir, STATE)?;
    Ok(config.zip(state).map(|(config, s)| Sandbox {
        id: id.to_owned(),
        config,
        created_at: s.created_at,
        ready: s.ready,
        pause_pid: s.pause_pid,
        ip: s.ip,
        unclaimed_exits: HashMap::new(),
        exit_waiters: HashMap::new(),
    }))
}

fn load_container(id: &str, dir: &std::path::Path) -> Result<Option<Container>> {
    let config: Option<cri::ContainerConfig> = record::read(dir, CONFIG)?;
    let state: Option<record::ContainerState> = record::read(dir, STATE)?;
    Ok(config.zip(state).map(|(config, s)| Container::from_records(id, dir, config, s)))
}
