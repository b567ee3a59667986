//! RunPodSandbox, StopPodSandbox, RemovePodSandbox, PodSandboxStatus, ListPodSandbox.

use std::collections::HashMap;
use std::os::unix::fs::DirBuilderExt;
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;
use tokio::io::{AsyncBufReadExt, BufReader};
use tracing::{info, warn};

use super::{Error, Result, Runtime, Sandbox, labels_match, new_id, now_nanos, resolve};
use crate::engine::{SandboxSpec, Signal};

/// How long a new sandbox's pause may take to report readiness.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A remote kubelet's `log_directory` moved under `root`: its last component, which must be a
/// plain name; the directory is created 0700.
fn remote_log_directory(root: &std::path::Path, asked: &str) -> Result<String> {
    if asked.is_empty() {
        return Ok(String::new());
    }
    let name = std::path::Path::new(asked)
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| !n.starts_with('.'))
        .ok_or_else(|| Error::Invalid(format!("log_directory {asked:?} does not end in a plain name")))?;
    let dir = root.join(name);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| Error::io("create", &dir, e))?;
    Ok(dir.display().to_string())
}

impl Runtime {
    /// Starts a sandbox for `config` and returns its ID once hpk-pause reports it ready.
    pub async fn run_sandbox(self: &Arc<Self>, mut config: cri::PodSandboxConfig) -> Result<String> {
        let meta =
            config.metadata.clone().ok_or_else(|| Error::Invalid("sandbox config has no metadata".into()))?;
        if meta.name.is_empty() || meta.namespace.is_empty() {
            return Err(Error::Invalid("sandbox metadata needs a name and a namespace".into()));
        }
        if let Some(root) = &self.config.pod_logs_root {
            config.log_directory = remote_log_directory(root, &config.log_directory)?;
        }
        // No hostname asked for: the node's, as containerd and CRI-O do (the kubelet always
        // sets one, except for pods on the host's network).
        let hostname = if config.hostname.is_empty() { node_hostname() } else { config.hostname.clone() };
        if hostname.len() > 64 || hostname.contains('/') {
            return Err(Error::Invalid(format!("hostname {hostname:?} is not a valid host name")));
        }
        {
            let state = self.state.lock().await;
            let same = |s: &Sandbox| s.config.metadata.as_ref() == Some(&meta);
            if let Some(existing) = state.sandboxes.values().find(|s| same(s)) {
                return Err(Error::AlreadyExists(format!(
                    "sandbox {}/{} attempt {} already exists as {}",
                    meta.namespace, meta.name, meta.attempt, existing.id
                )));
            }
        }
        let id = new_id()?;
        match self.start_sandbox(&id, &config, &hostname).await {
            Ok(()) => {
                info!(sandbox = %id, pod = %format!("{}/{}", meta.namespace, meta.name), "sandbox ready");
                Ok(id)
            }
            Err(err) => {
                // Nothing half-created stays behind.
                if let Some(network) = &self.config.network {
                    let _ = network.detach(&id).await;
                }
                let _ = self.engine.delete_sandbox(&id);
                let _ = std::fs::remove_dir_all(self.sandbox_dir(&id));
                let _ = std::fs::remove_dir_all(self.events_dir(&id));
                Err(err)
            }
        }
    }

    async fn start_sandbox(
        self: &Arc<Self>,
        id: &str,
        config: &cri::PodSandboxConfig,
        hostname: &str,
    ) -> Result<()> {
        let dir = self.sandbox_dir(id);
        let events_dir = self.events_dir(id);
        std::fs::create_dir_all(&events_dir).map_err(|e| Error::io("create", &events_dir, e))?;
        let socket = events_dir.join("events.sock");
        let listener =
            tokio::net::UnixListener::bind(&socket).map_err(|e| Error::io("listen on", &socket, e))?;
        let namespaces = super::security::pod_namespaces(config)?;
        let host_network = namespaces.host_network;
        write_pod_files(&dir, config, hostname, namespaces.host_network)?;
        let spec = SandboxSpec {
            id: id.to_owned(),
            hostname: hostname.to_owned(),
            pause_binary: self.config.pause_binary.clone(),
            events_dir,
            grace_seconds: self.config.pause_grace_seconds,
            host_network: namespaces.host_network,
            host_ipc: namespaces.host_ipc,
            sysctls: namespaces.sysctls,
        };
        self.engine.start_sandbox(&spec, &dir)?;
        let ready = async {
            let (stream, _) = listener.accept().await.map_err(|e| Error::io("accept on", &socket, e))?;
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            reader.read_line(&mut line).await.map_err(|e| Error::io("read", &socket, e))?;
            if !line.contains("\"ready\"") {
                return Err(Error::FailedPrecondition(format!("hpk-pause said {line:?} instead of ready")));
            }
            Ok(reader)
        };
        let stream = tokio::time::timeout(READY_TIMEOUT, ready).await.map_err(|_| {
            Error::Timeout(format!("hpk-pause of sandbox {id} not ready within {READY_TIMEOUT:?}"))
        })??;
        let pid = self.engine.sandbox_pid(id, &dir)?.ok_or_else(|| {
            Error::FailedPrecondition(format!("sandbox {id} has no pause process after start"))
        })?;
        // Containers talk over localhost whatever else the sandbox gets.
        self.engine.loopback_up(pid)?;
        // The pod's address from the net-forwarder, unless the pod uses the host's network.
        let ip = match &self.config.network {
            Some(network) if !host_network => Some(network.attach(id, &format!("/proc/{pid}/ns/net")).await?),
            _ => None,
        };
        let sandbox = Sandbox {
            id: id.to_owned(),
            config: config.clone(),
            created_at: now_nanos(),
            ready: true,
            pause_pid: pid,
            ip,
            unclaimed_exits: HashMap::new(),
            exit_waiters: HashMap::new(),
        };
        // Recorded once ready: a directory without records is a sandbox whose start a dead
        // runtime never finished, which recovery removes.
        sandbox.save_all(&dir)?;
        let mut state = self.state.lock().await;
        state.sandboxes.insert(id.to_owned(), sandbox);
        self.emit(&state, id, cri::ContainerEventType::ContainerCreatedEvent);
        self.emit(&state, id, cri::ContainerEventType::ContainerStartedEvent);
        drop(state);
        tokio::spawn(super::events::watch(Arc::clone(self), id.to_owned(), stream));
        Ok(())
    }

    /// Stops every container of the sandbox and the sandbox itself. Stopping an unknown or
    /// stopped sandbox succeeds: the kubelet retries.
    pub async fn stop_sandbox(&self, wanted: &str) -> Result<()> {
        let Ok(id) = self.resolve_sandbox(wanted).await else { return Ok(()) };
        let containers: Vec<String> = {
            let state = self.state.lock().await;
            state.containers.values().filter(|c| c.sandbox_id == id).map(|c| c.id.clone()).collect()
        };
        for container in containers {
            self.stop_container(&container, 0).await?;
        }
        if self.engine.sandbox_state(&id)?.is_some_and(|s| s.status == "running") {
            self.engine.kill_sandbox(&id, Signal::Term)?;
            let deadline = Duration::from_secs(u64::from(self.config.pause_grace_seconds) + 5);
            if !self.wait_stopped(&id, deadline).await? {
                warn!(sandbox = %id, "pause did not stop; killing it");
                self.engine.kill_sandbox(&id, Signal::Kill)?;
                self.wait_stopped(&id, Duration::from_secs(5)).await?;
            }
        }
        super::events::sandbox_gone(self, &id, "the sandbox stopped").await;
        // The address goes back once the pause (and so the namespace) is gone.
        if let Some(network) = &self.config.network {
            network.detach(&id).await?;
        }
        Ok(())
    }

    async fn wait_stopped(&self, id: &str, within: Duration) -> Result<bool> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.engine.sandbox_state(id)?.is_none_or(|s| s.status != "running") {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops and removes the sandbox, its containers and its files. Unknown IDs succeed.
    pub async fn remove_sandbox(&self, wanted: &str) -> Result<()> {
        let Ok(id) = self.resolve_sandbox(wanted).await else { return Ok(()) };
        self.stop_sandbox(&id).await?;
        let containers: Vec<String> = {
            let state = self.state.lock().await;
            state.containers.values().filter(|c| c.sandbox_id == id).map(|c| c.id.clone()).collect()
        };
        for container in containers {
            self.remove_container(&container).await?;
        }
        self.engine.delete_sandbox(&id)?;
        for dir in [self.sandbox_dir(&id), self.events_dir(&id)] {
            std::fs::remove_dir_all(&dir)
                .or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
                .map_err(|e| Error::io("remove", &dir, e))?;
        }
        let mut state = self.state.lock().await;
        self.emit(&state, &id, cri::ContainerEventType::ContainerDeletedEvent);
        let removed = state.sandboxes.remove(&id);
        let last_of_pod = removed.and_then(|s| s.config.metadata).map(|m| m.uid).filter(|uid| {
            !state.sandboxes.values().any(|s| s.config.metadata.as_ref().is_some_and(|m| &m.uid == uid))
        });
        drop(state);
        info!(sandbox = %id, "sandbox removed");
        if let (Some(uid), Some(hook)) = (last_of_pod, &self.config.on_pod_removed) {
            (hook.0)(&uid);
        }
        Ok(())
    }

    pub(crate) async fn resolve_sandbox(&self, wanted: &str) -> Result<String> {
        let state = self.state.lock().await;
        resolve(state.sandboxes.keys(), wanted, "sandbox")
    }

    /// The sandbox's status.
    pub async fn sandbox_status(&self, wanted: &str) -> Result<cri::PodSandboxStatus> {
        let id = self.resolve_sandbox(wanted).await?;
        let state = self.state.lock().await;
        let s =
            state.sandboxes.get(&id).ok_or_else(|| Error::NotFound { kind: "sandbox", id: id.clone() })?;
        Ok(s.status())
    }

    /// Sandboxes matching `filter`.
    pub async fn list_sandboxes(&self, filter: Option<cri::PodSandboxFilter>) -> Vec<cri::PodSandbox> {
        let state = self.state.lock().await;
        let empty = HashMap::new();
        state
            .sandboxes
            .values()
            .filter(|s| match &filter {
                None => true,
                Some(f) => {
                    (f.id.is_empty() || s.id.starts_with(&f.id))
                        && f.state.as_ref().is_none_or(|v| v.state == sandbox_state(s) as i32)
                        && labels_match(
                            &s.config.labels,
                            if f.label_selector.is_empty() { &empty } else { &f.label_selector },
                        )
                }
            })
            .map(|s| cri::PodSandbox {
                id: s.id.clone(),
                metadata: s.config.metadata.clone(),
                state: sandbox_state(s) as i32,
                created_at: s.created_at,
                labels: s.config.labels.clone(),
                annotations: s.config.annotations.clone(),
                runtime_handler: String::new(),
            })
            .collect()
    }
}

impl Sandbox {
    /// Its CRI status.
    pub(crate) fn status(&self) -> cri::PodSandboxStatus {
        let s = self;
        cri::PodSandboxStatus {
            id: s.id.clone(),
            metadata: s.config.metadata.clone(),
            state: sandbox_state(s) as i32,
            created_at: s.created_at,
            network: Some(cri::PodSandboxNetworkStatus {
                ip: s.ip.clone().unwrap_or_default(),
                ..Default::default()
            }),
            linux: None,
            labels: s.config.labels.clone(),
            annotations: s.config.annotations.clone(),
            runtime_handler: String::new(),
        }
    }

    /// Saves its state record into `dir`; a failure is logged (see [`Container::save`]).
    pub(crate) fn save(&self, dir: &std::path::Path) {
        if let Err(e) = super::record::write(dir, super::record::STATE, &self.state_record()) {
            warn!(sandbox = %self.id, error = %e, "saving the sandbox's record failed");
        }
    }
}

fn sandbox_state(s: &Sandbox) -> cri::PodSandboxState {
    if s.ready { cri::PodSandboxState::SandboxReady } else { cri::PodSandboxState::SandboxNotready }
}

/// This machine's hostname (the bubble's, inside one).
fn node_hostname() -> String {
    nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "localhost".into())
}

/// Files every container of the pod gets unless the kubelet mounts its own: `resolv.conf`
/// from the DNS config (the host's when none is given), `hostname`, and `hosts` (localhost
/// and the pod's name; the host's with hostNetwork).
fn write_pod_files(
    dir: &std::path::Path,
    config: &cri::PodSandboxConfig,
    hostname: &str,
    host_network: bool,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
    let resolv = match &config.dns_config {
        Some(dns) if !(dns.servers.is_empty() && dns.searches.is_empty() && dns.options.is_empty()) => {
            let mut text = String::new();
            for server in &dns.servers {
                text.push_str(&format!("nameserver {server}\n"));
            }
            if !dns.searches.is_empty() {
                text.push_str(&format!("search {}\n", dns.searches.join(" ")));
            }
            if !dns.options.is_empty() {
                text.push_str(&format!("options {}\n", dns.options.join(" ")));
            }
            text
        }
        _ => std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
    };
    let hosts = if host_network {
        std::fs::read_to_string("/etc/hosts").unwrap_or_default()
    } else {
        format!("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n")
    };
    for (name, text) in [("resolv.conf", resolv), ("hostname", format!("{hostname}\n")), ("hosts", hosts)] {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| Error::io("write", &path, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod remote_log_tests {
    use super::remote_log_directory;

    #[test]
    fn a_remote_kubelets_log_directory_moves_under_the_runtimes_root() {
        let root = tempfile::tempdir().expect("tmp");
        let dir = remote_log_directory(root.path(), "/var/lib/hpk-kubelet/pod-logs/default_web_uid-1")
            .expect("moved");
        assert_eq!(dir, root.path().join("default_web_uid-1").display().to_string());
        assert!(std::path::Path::new(&dir).is_dir());
        assert_eq!(remote_log_directory(root.path(), "").expect("none"), "");
        for bad in ["/", "/var/log/..", "/x/.hidden"] {
            assert!(remote_log_directory(root.path(), bad).is_err(), "{bad}");
        }
    }
}
