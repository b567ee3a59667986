//! The runtime core behind the CRI services: sandboxes and containers, their records on disk,
//! and the exits hpk-pause reports.

mod container;
mod error;
mod events;
mod exec;
mod images;
mod network;
mod record;
mod recover;
mod sandbox;
mod seccomp_default;
mod security;
#[cfg(test)]
mod sequence_tests;
mod stats;
mod stream;
mod sub_path;
mod unmapped;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_cri::v1 as cri;
use tokio::sync::{Mutex, watch};

pub use error::{Error, Result};
pub use network::PodNetwork;
pub use recover::Recovered;
pub use stream::Sessions;
pub use sub_path::SUB_PATH_ROOTS;
pub use unmapped::NOT_HONOURED_KEY;

use crate::engine::Engine;
use crate::idmap::IdMappings;
use crate::images::ImageStore;

/// Events a slow GetContainerEvents subscriber may fall behind by before it is told it lost
/// some (the kubelet then relists).
const EVENT_BACKLOG: usize = 1024;

/// How the runtime is set up.
#[derive(Clone, Debug)]
pub struct Config {
    /// What may grow with what containers write: their writable layers (`layers/ID`) (0700).
    pub root: PathBuf,
    /// What lasts only as long as the pods' processes and stays small: the sandboxes' and
    /// containers' directories (bundles, records, output FIFOs, the hosts/hostname/resolv.conf
    /// files, exec scratch), the events sockets and crun's state (0700). The root itself, or
    /// a tmpfs (the bubble's `/run`): a pod start then makes 11 of its 49 files and
    /// directories on the node's disk, the writable layer's.
    pub state: PathBuf,
    /// The hpk-pause binary bind-mounted into every sandbox.
    pub pause_binary: PathBuf,
    /// Seconds a sandbox's pause gives processes after SIGTERM.
    pub pause_grace_seconds: u32,
    /// The host's cgroup mode, for saying which limits are not enforced.
    pub cgroup_mode: crate::engine::CgroupMode,
    /// The program run as `PROGRAM log-shim …` for each container with a log (this binary).
    pub shim_binary: PathBuf,
    /// Where pods get their address; loopback only when `None`.
    pub network: Option<PodNetwork>,
    /// Where pods' logs go when the kubelet is on another machine (connector mode): its
    /// `log_directory` names a directory of its own filesystem, so the runtime keeps the last
    /// component under this directory instead, and creates it.
    pub pod_logs_root: Option<PathBuf>,
    /// Where CDI specs are read from (lowest precedence first), for containers' CDI devices.
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// Called with a pod's UID once its last sandbox is removed (what a remote kubelet stored
    /// for the pod goes then, see `crate::remote::files`).
    pub on_pod_removed: Option<PodRemoved>,
}

/// A hook called with a pod's UID once its last sandbox is removed; best effort.
#[derive(Clone)]
pub struct PodRemoved(pub Arc<dyn Fn(&str) + Send + Sync>);

impl std::fmt::Debug for PodRemoved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PodRemoved(..)")
    }
}

/// The directory under the runtime's root that holds files a remote kubelet stored for pods
/// (volumes' contents), which subPath mounts may come from.
pub const POD_FILES: &str = "pod-files";

/// A sandbox the runtime manages.
#[derive(Debug)]
pub struct Sandbox {
    pub(crate) id: String,
    pub(crate) config: cri::PodSandboxConfig,
    pub(crate) created_at: i64,
    pub(crate) ready: bool,
    pub(crate) pause_pid: u32,
    /// Exits reported by the pause that no container claimed yet, by PID in the sandbox.
    pub(crate) unclaimed_exits: HashMap<i32, i32>,
    /// Its address from the net-forwarder (none: loopback only, or the host's network).
    pub(crate) ip: Option<String>,
    /// Exec sessions waiting for the exit of their command, by PID in the sandbox.
    pub(crate) exit_waiters: HashMap<i32, tokio::sync::oneshot::Sender<i32>>,
}

/// A container the runtime manages.
#[derive(Debug)]
pub struct Container {
    pub(crate) id: String,
    /// Its directory: bundle, root filesystem layers, output FIFOs, records.
    pub(crate) dir: PathBuf,
    pub(crate) sandbox_id: String,
    pub(crate) config: cri::ContainerConfig,
    pub(crate) image_ref: String,
    pub(crate) image_id: String,
    pub(crate) state: cri::ContainerState,
    pub(crate) created_at: i64,
    pub(crate) started_at: i64,
    pub(crate) finished_at: i64,
    pub(crate) exit_code: i32,
    pub(crate) reason: String,
    pub(crate) log_path: Option<PathBuf>,
    /// The sandbox's hpk-pause (host PID): crun runs in its PID namespace for this container.
    pub(crate) pause_pid: u32,
    /// PID of the container's init inside the sandbox's PID namespace.
    pub(crate) sandbox_pid: Option<i32>,
    /// Changes to `Exited` when the pause reports the exit.
    pub(crate) exited: watch::Sender<bool>,
    /// Why the container cannot start (its command is not in the image): it then "starts" and
    /// exits 127 at once, as a shell would, with the reason in its log.
    pub(crate) start_error: Option<String>,
    /// The log shim copying its output into `log_path` (see [`crate::logshim`]).
    pub(crate) shim_pid: Option<u32>,
    /// What of its user and groups this bubble cannot give, in words (see `unmapped.rs`).
    pub(crate) not_honoured: Option<String>,
}

/// Sandboxes and containers, one lock: operations are short, and the heavy parts (crun, mounts,
/// pulls) run without holding it where they can.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) sandboxes: HashMap<String, Sandbox>,
    pub(crate) containers: HashMap<String, Container>,
}

/// The runtime: engine, image store and state.
#[derive(Debug)]
pub struct Runtime {
    pub(crate) config: Config,
    /// The engine running sandboxes and containers.
    pub(crate) engine: Arc<dyn Engine>,
    pub(crate) images: ImageStore,
    pub(crate) state: Mutex<State>,
    /// Container and sandbox lifecycle events for GetContainerEvents subscribers.
    pub(crate) events: tokio::sync::broadcast::Sender<cri::ContainerEventResponse>,
    /// The previous CPU sample of each container and sandbox, for usage rates.
    pub(crate) cpu_samples: stats::CpuSamples,
    /// The streaming server whose URLs Exec, Attach and PortForward return.
    pub(crate) streaming: std::sync::OnceLock<hpk_streaming::StreamServer>,
    /// The user and group IDs of this bubble; `None` when they could not be read (every ID
    /// is then taken as mapped, as before).
    pub(crate) ids: Option<IdMappings>,
}

impl Runtime {
    /// A runtime over `images`, keeping its files under `config.root` and `config.state`,
    /// running pods with `engine`.
    pub fn new(config: Config, engine: Arc<dyn Engine>, images: ImageStore) -> Result<Arc<Self>> {
        let dirs = [
            (&config.root, "layers"),
            (&config.state, "containers"),
            (&config.state, "sandboxes"),
            (&config.state, "crun"),
            (&config.state, "ev"),
        ];
        for (base, dir) in dirs {
            let path = base.join(dir);
            std::fs::create_dir_all(&path).map_err(|e| Error::io("create", &path, e))?;
        }
        let (events, _) = tokio::sync::broadcast::channel(EVENT_BACKLOG);
        let ids = IdMappings::read()
            .inspect_err(|e| tracing::warn!(error = %e, "ID mappings unknown; every ID is taken as mapped"))
            .ok();
        Ok(Arc::new(Self {
            config,
            engine,
            images,
            state: Mutex::new(State::default()),
            events,
            cpu_samples: Default::default(),
            streaming: std::sync::OnceLock::new(),
            ids,
        }))
    }

    /// Serves Exec, Attach and PortForward sessions on `addr` (loopback: the clients are
    /// crictl and the kubelet on this host) until `shutdown`.
    pub async fn start_streaming(
        self: &Arc<Self>,
        addr: std::net::SocketAddr,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Result<std::net::SocketAddr> {
        let backend = Arc::new(Sessions(Arc::clone(self)));
        let server = hpk_streaming::StreamServer::start(addr, backend, shutdown)
            .await
            .map_err(|e| Error::io("listen for streaming on", addr.to_string(), e))?;
        let local = server.local_addr();
        self.streaming
            .set(server)
            .map_err(|_| Error::FailedPrecondition("the streaming server is already running".into()))?;
        Ok(local)
    }

    pub(crate) fn streaming(&self) -> Result<&hpk_streaming::StreamServer> {
        self.streaming
            .get()
            .ok_or_else(|| Error::FailedPrecondition("the streaming server is not running".into()))
    }

    /// The host's cgroup mode.
    pub fn cgroup_mode(&self) -> crate::engine::CgroupMode {
        self.config.cgroup_mode
    }

    /// This bubble's user and group IDs, when they could be read.
    pub fn id_mappings(&self) -> Option<&IdMappings> {
        self.ids.as_ref()
    }

    /// The image store.
    pub fn images(&self) -> &ImageStore {
        &self.images
    }

    /// The directory of a sandbox's events socket, kept short: a UNIX socket path has at most
    /// 107 bytes, and a sandbox directory holds a 64-digit ID.
    pub(crate) fn events_dir(&self, id: &str) -> PathBuf {
        self.config.state.join("ev").join(&id[..id.len().min(16)])
    }

    /// The attach socket of a container's shim, beside its sandbox's events socket (short:
    /// see [`Self::events_dir`]).
    pub(crate) fn attach_socket(&self, sandbox_id: &str, id: &str) -> PathBuf {
        self.events_dir(sandbox_id).join(format!("{}.att", &id[..id.len().min(12)]))
    }

    pub(crate) fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.config.state.join("sandboxes").join(id)
    }

    pub(crate) fn container_dir(&self, id: &str) -> PathBuf {
        self.config.state.join("containers").join(id)
    }

    /// Where a container's writable layer (overlayfs' `upper` and `work`) is kept.
    pub(crate) fn writable_dir(&self, id: &str) -> PathBuf {
        self.config.root.join("layers").join(id)
    }

    /// Removes a container's directory (see [`sub_path::remove_container_dir`]), then its
    /// writable layer; call once the container is deleted and its root unmounted.
    pub(crate) fn remove_container_files(&self, id: &str, dir: &Path) -> Result<()> {
        sub_path::remove_container_dir(dir)?;
        let writable = self.writable_dir(id);
        match std::fs::remove_dir_all(&writable) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io("remove", &writable, e)),
            _ => Ok(()),
        }
    }

    /// Where a remote kubelet's files for its pods are stored (connector mode).
    pub(crate) fn pod_files(&self) -> PathBuf {
        self.config.root.join(POD_FILES)
    }
}

/// Nanoseconds since the Unix epoch, as CRI timestamps are.
pub(crate) fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// A fresh 64-hex-digit ID, as containerd and CRI-O make them.
pub(crate) fn new_id() -> Result<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::io("read", "random source", std::io::Error::other(e.to_string())))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Finds the one ID in `ids` equal to `wanted` or starting with it (crictl passes prefixes).
pub(crate) fn resolve<'a>(
    ids: impl Iterator<Item = &'a String>,
    wanted: &str,
    kind: &'static str,
) -> Result<String> {
    if wanted.is_empty() {
        return Err(Error::Invalid(format!("{kind} ID is empty")));
    }
    let matches: Vec<&String> = ids.filter(|id| id.starts_with(wanted)).collect();
    match matches.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(Error::NotFound { kind, id: wanted.to_owned() }),
        _ => matches
            .iter()
            .find(|id| id.as_str() == wanted)
            .map(|id| (*id).clone())
            .ok_or_else(|| Error::Invalid(format!("{kind} ID prefix {wanted:?} is ambiguous"))),
    }
}

/// Joins `relative` under `base`, refusing anything that would leave it.
pub(crate) fn join_inside(base: &Path, relative: &str) -> Result<PathBuf> {
    let rel = Path::new(relative);
    let escapes = rel.is_absolute()
        || rel
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir | std::path::Component::Prefix(_)));
    if escapes || relative.is_empty() {
        return Err(Error::Invalid(format!("path {relative:?} must stay inside {}", base.display())));
    }
    Ok(base.join(rel))
}

/// Labels match when every selector pair is present.
pub(crate) fn labels_match(labels: &HashMap<String, String>, selector: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_resolve_to_one_id() {
        let ids = ["abc123".to_owned(), "abd456".to_owned()];
        assert_eq!(resolve(ids.iter(), "abc", "container").expect("one"), "abc123");
        assert!(matches!(resolve(ids.iter(), "ab", "container"), Err(Error::Invalid(_))));
        assert!(matches!(resolve(ids.iter(), "zz", "container"), Err(Error::NotFound { .. })));
    }

    #[test]
    fn paths_cannot_leave_their_base() {
        let base = Path::new("/var/log/pods/x");
        assert_eq!(join_inside(base, "c/0.log").expect("inside"), base.join("c/0.log"));
        for bad in ["../x.log", "c/../../x", "/etc/passwd", ""] {
            assert!(join_inside(base, bad).is_err(), "{bad}");
        }
    }
}
