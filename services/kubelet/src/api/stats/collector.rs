//! [`Collector`]: one summary from three runtime calls (and `ImageFsInfo`), the node's `/proc`
//! and the container log directories. No process is spawned; the file reads run on tokio's
//! blocking pool.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_cri::v1 as cri;
use tracing::{debug, warn};

use super::assemble::{DirUsage, ImageFs, RuntimeView, assemble};
use super::node::{FsReading, NodeReadings, ticks_per_second};
use super::rate::CpuRates;
use super::summary::{PodReference, Summary, Timestamp};
use crate::cri::Cri;

/// Gathers the node's summary; cheap to clone, and clones share the CPU samples.
#[derive(Clone, Debug)]
pub struct Collector {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    node_name: String,
    root_dir: PathBuf,
    logs_dir: PathBuf,
    /// The node's start when `/proc/stat` has no `btime`.
    started: Timestamp,
    ticks_per_second: u64,
    rates: Mutex<CpuRates>,
}

impl Collector {
    /// A collector for node `node_name`: the node's `fs` is the filesystem of `root_dir` (the
    /// kubelet's root directory); container logs lie under `logs_dir` as
    /// `<namespace>_<pod>_<uid>/<container>/<n>.log`.
    pub fn new(
        node_name: impl Into<String>,
        root_dir: impl Into<PathBuf>,
        logs_dir: impl Into<PathBuf>,
    ) -> Self {
        let shared = Shared {
            node_name: node_name.into(),
            root_dir: root_dir.into(),
            logs_dir: logs_dir.into(),
            started: Timestamp::now(),
            ticks_per_second: ticks_per_second(),
            rates: Mutex::new(CpuRates::default()),
        };
        Self { shared: Arc::new(shared) }
    }

    /// The summary now: `ListPodSandboxStats`, `ListPodSandbox` and `ListContainers` once each
    /// (a failure is the error, with the runtime's code), `ImageFsInfo` when the runtime
    /// implements it, and the node's own figures.
    pub async fn summary(&self, cri: &Cri) -> Result<Summary, tonic::Status> {
        let runtime = ask_runtime(cri).await?;
        let shared = Arc::clone(&self.shared);
        tokio::task::spawn_blocking(move || shared.gather(runtime))
            .await
            .map_err(|e| tonic::Status::internal(format!("gathering the node's stats: {e}")))
    }
}

impl Shared {
    /// The blocking part: `/proc`, `statvfs`, log directories, then the assembly.
    fn gather(&self, mut runtime: RuntimeView) -> Summary {
        let mut node = NodeReadings::read(&self.root_dir, self.ticks_per_second);
        node.boot_time = node.boot_time.or(Some(self.started));
        if let Some(image_fs) = runtime.image_fs.as_mut() {
            image_fs.fs = image_fs_reading(&image_fs.usage);
        }
        let logs = |pod: &PodReference, container: &str| {
            container_log_dir(&self.logs_dir, pod, container).as_deref().and_then(dir_usage)
        };
        let mut rates = self.rates.lock().unwrap_or_else(PoisonError::into_inner);
        assemble(&self.node_name, &node, &runtime, logs, &mut rates)
    }
}

/// The runtime's answers, asked at once.
async fn ask_runtime(cri: &Cri) -> Result<RuntimeView, tonic::Status> {
    let (mut stats_client, mut sandbox_client, mut container_client) =
        (cri.runtime.clone(), cri.runtime.clone(), cri.runtime.clone());
    let mut images = cri.images.clone();
    let ready = cri::PodSandboxFilter {
        state: Some(cri::PodSandboxStateValue { state: cri::PodSandboxState::SandboxReady as i32 }),
        ..Default::default()
    };
    let running = cri::ContainerFilter {
        state: Some(cri::ContainerStateValue { state: cri::ContainerState::ContainerRunning as i32 }),
        ..Default::default()
    };
    let (stats, sandboxes, containers, image_fs) = tokio::join!(
        stats_client.list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest { filter: None }),
        sandbox_client.list_pod_sandbox(cri::ListPodSandboxRequest { filter: Some(ready) }),
        container_client.list_containers(cri::ListContainersRequest { filter: Some(running) }),
        images.image_fs_info(cri::ImageFsInfoRequest {}),
    );
    Ok(RuntimeView {
        sandbox_stats: stats.map_err(|s| failed("ListPodSandboxStats", &s))?.into_inner().stats,
        sandboxes: sandboxes.map_err(|s| failed("ListPodSandbox", &s))?.into_inner().items,
        containers: containers.map_err(|s| failed("ListContainers", &s))?.into_inner().containers,
        image_fs: image_filesystem(image_fs),
    })
}

/// The runtime's error with the call named, its code kept.
fn failed(call: &str, status: &tonic::Status) -> tonic::Status {
    tonic::Status::new(status.code(), format!("the pod-runtime's {call} failed: {}", status.message()))
}

/// The first image filesystem; none when the runtime does not implement `ImageFsInfo` or fails.
fn image_filesystem(
    answer: Result<tonic::Response<cri::ImageFsInfoResponse>, tonic::Status>,
) -> Option<ImageFs> {
    match answer {
        Ok(answer) => {
            answer.into_inner().image_filesystems.into_iter().next().map(|usage| ImageFs { usage, fs: None })
        }
        Err(status) if status.code() == tonic::Code::Unimplemented => None,
        Err(status) => {
            warn!(code = ?status.code(), error = status.message(), "ImageFsInfo failed: the summary has no imageFs");
            None
        }
    }
}

/// `statvfs` of the image filesystem's mount point, when this process can see it.
fn image_fs_reading(usage: &cri::FilesystemUsage) -> Option<FsReading> {
    let mountpoint = usage.fs_id.as_ref().map(|id| id.mountpoint.as_str()).filter(|m| !m.is_empty())?;
    FsReading::of(Path::new(mountpoint))
        .inspect_err(|error| debug!(mountpoint, %error, "statvfs of the image filesystem"))
        .ok()
}

/// `<logs_dir>/<namespace>_<pod>_<uid>/<container>`; `None` when a name could lead out of it.
pub fn container_log_dir(logs_dir: &Path, pod: &PodReference, container: &str) -> Option<PathBuf> {
    let parts = [pod.namespace.as_str(), pod.name.as_str(), pod.uid.as_str(), container];
    if parts.iter().any(|p| p.is_empty() || p.contains('/')) || matches!(container, "." | "..") {
        return None;
    }
    Some(logs_dir.join(format!("{}_{}_{}", pod.namespace, pod.name, pod.uid)).join(container))
}

/// Bytes allocated (as `du` counts them) and inodes under `dir`, links not followed; `None`
/// when `dir` is not a directory.
pub fn dir_usage(dir: &Path) -> Option<DirUsage> {
    use std::os::unix::fs::MetadataExt;
    let top = std::fs::symlink_metadata(dir).ok().filter(|m| m.is_dir())?;
    let mut usage = DirUsage { bytes: top.blocks().saturating_mul(512), inodes: 1 };
    let mut pending = vec![dir.to_owned()];
    while let Some(path) = pending.pop() {
        // A file removed meanwhile (log rotation) is simply not counted.
        let Ok(entries) = std::fs::read_dir(&path) else { continue };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            usage.bytes = usage.bytes.saturating_add(meta.blocks().saturating_mul(512));
            usage.inodes += 1;
            if meta.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    Some(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> PodReference {
        PodReference { name: "web".to_owned(), namespace: "default".to_owned(), uid: "uid-1".to_owned() }
    }

    #[test]
    fn log_dirs_are_namespace_pod_uid_then_container() {
        let dir = container_log_dir(Path::new("/var/log/pods"), &pod(), "app");
        assert_eq!(dir, Some(PathBuf::from("/var/log/pods/default_web_uid-1/app")));
        assert_eq!(container_log_dir(Path::new("/l"), &pod(), ".."), None);
        assert_eq!(container_log_dir(Path::new("/l"), &pod(), "a/b"), None);
        let mut empty_uid = pod();
        empty_uid.uid.clear();
        assert_eq!(container_log_dir(Path::new("/l"), &empty_uid, "app"), None);
    }

    #[test]
    fn dir_usage_counts_files_and_directories_below() {
        let root = tempfile::tempdir().expect("temp dir");
        let dir = root.path().join("app");
        std::fs::create_dir_all(dir.join("rotated")).expect("mkdir");
        // Incompressible bytes, so the blocks the filesystem gives match the length.
        let mut state = 0x2545_f491_u32;
        let noise: Vec<u8> = (0..65_536)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                state.to_le_bytes()[0]
            })
            .collect();
        std::fs::write(dir.join("0.log"), &noise).expect("write");
        std::fs::write(dir.join("rotated/1.log"), b"x").expect("write");
        std::os::unix::fs::symlink("/etc", dir.join("link")).expect("symlink");
        let usage = dir_usage(&dir).expect("a directory");
        // app, rotated, 0.log, 1.log and the link itself (not followed).
        assert_eq!(usage.inodes, 5);
        assert!(usage.bytes >= 65_536, "{usage:?}");
        assert!(usage.bytes < 1 << 20, "the link was followed: {usage:?}");
        assert_eq!(dir_usage(&root.path().join("missing")), None);
        assert_eq!(dir_usage(&dir.join("0.log")), None);
    }
}
