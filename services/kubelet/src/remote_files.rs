//! Connector mode: the files a container's mounts take from the kubelet's pod directory
//! (volumes it wrote, `/etc/hosts`) are on this machine, the container on the runtime's. Each
//! such mount's tree is sent with `hpk.podruntime.v1.Remote/PutFiles` and the mount then names
//! the runtime's copy. Mounts of other paths (hostPath volumes, PersistentVolumes) name paths of
//! the runtime's machine already and are left as they are.
//!
//! The first copy of a (pod, path) wins, so every container of a pod shares one copy, and an
//! emptyDir stays shared and writable there. Later changes (a ConfigMap updated while the pod
//! runs) are not sent again.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use hpk_proto::podruntime::v1::{FileEntry, PutFilesRequest, file_entry};
use k8s_cri::v1 as cri;

use crate::cri::Remote;

/// The most a pod's one mount may carry (the runtime's message limit is 16 MiB).
const MAX_BYTES: u64 = 15 << 20;

/// Why a mount's files could not be sent to the remote runtime.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    /// A path that is not UTF-8 (the runtime's API carries strings).
    #[error("{}: not UTF-8", .0.display())]
    NotUtf8(PathBuf),
    /// A link whose target is not UTF-8.
    #[error("{}: link target not UTF-8", .0.display())]
    LinkNotUtf8(PathBuf),
    /// Reading the tree failed.
    #[error("{path}: {source}")]
    Read {
        /// What was read.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The reading task ended without an answer.
    #[error("reading {path}: {reason}")]
    Task {
        /// What was read.
        path: String,
        /// Why the task ended.
        reason: String,
    },
    /// The tree is larger than is sent.
    #[error("{} holds more than {} MiB, more than is sent to a remote runtime", .0.display(), MAX_BYTES >> 20)]
    TooLarge(PathBuf),
    /// A socket, device or pipe.
    #[error("{}: neither a file, a directory nor a link", .0.display())]
    Special(PathBuf),
    /// The runtime refused the files.
    #[error("sending {} to the remote runtime: {message}", .path.display())]
    Send {
        /// The local path.
        path: PathBuf,
        /// The runtime's message.
        message: String,
    },
}

/// `mounts` with every path under `pod_dir` replaced by the runtime's copy of it.
pub async fn ship(
    remote: &Remote,
    pod_uid: &str,
    pod_dir: &Path,
    mut mounts: Vec<cri::Mount>,
) -> Result<Vec<cri::Mount>, ShipError> {
    for mount in &mut mounts {
        let local = PathBuf::from(&mount.host_path);
        let Ok(relative) = local.strip_prefix(pod_dir) else { continue };
        let key = relative.to_str().ok_or_else(|| ShipError::NotUtf8(local.clone()))?.to_owned();
        let (directory, entries) = {
            let local = local.clone();
            tokio::task::spawn_blocking(move || read_tree(&local))
                .await
                .map_err(|e| ShipError::Task { path: mount.host_path.clone(), reason: e.to_string() })??
        };
        let request = PutFilesRequest { pod_uid: pod_uid.to_owned(), key, directory, entries };
        let answer = remote.api.clone().put_files(request).await.map_err(|status| ShipError::Send {
            path: local.clone(),
            message: status.message().to_owned(),
        })?;
        mount.host_path = answer.into_inner().path;
    }
    Ok(mounts)
}

/// The tree at `root` (followed if it is a link) as entries: whether it is a directory, and
/// its files, links and directories relative to it (one entry with an empty path for a file).
pub fn read_tree(root: &Path) -> Result<(bool, Vec<FileEntry>), ShipError> {
    let io = |path: &Path, source: std::io::Error| ShipError::Read { path: path.to_owned(), source };
    let meta = std::fs::metadata(root).map_err(|e| io(root, e))?;
    let mut total = 0u64;
    if !meta.is_dir() {
        let content = std::fs::read(root).map_err(|e| io(root, e))?;
        let entry = FileEntry {
            path: String::new(),
            kind: Some(file_entry::Kind::Content(content)),
            mode: meta.permissions().mode() & 0o7777,
        };
        return Ok((false, vec![entry]));
    }
    let mut entries = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(dir) = pending.pop() {
        let full = root.join(&dir);
        let mut names: Vec<_> = std::fs::read_dir(&full)
            .map_err(|e| io(&full, e))?
            .map(|entry| entry.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(|e| io(&full, e))?;
        names.sort();
        for name in names {
            let relative = dir.join(&name);
            let path = root.join(&relative);
            let text = relative.to_str().ok_or_else(|| ShipError::NotUtf8(path.clone()))?.to_owned();
            let meta = std::fs::symlink_metadata(&path).map_err(|e| io(&path, e))?;
            let mode = meta.permissions().mode() & 0o7777;
            let kind = if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).map_err(|e| io(&path, e))?;
                let target = target.to_str().ok_or_else(|| ShipError::LinkNotUtf8(path.clone()))?;
                file_entry::Kind::Symlink(target.to_owned())
            } else if meta.is_dir() {
                pending.push(relative.clone());
                file_entry::Kind::Dir(true)
            } else if meta.is_file() {
                total += meta.len();
                if total > MAX_BYTES {
                    return Err(ShipError::TooLarge(root.to_owned()));
                }
                file_entry::Kind::Content(std::fs::read(&path).map_err(|e| io(&path, e))?)
            } else {
                return Err(ShipError::Special(path));
            };
            entries.push(FileEntry { path: text, kind: Some(kind), mode });
        }
    }
    Ok((true, entries))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    #[test]
    fn a_volume_tree_is_read_with_its_links_and_modes() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path().join("volumes/kubernetes.io~configmap/cfg");
        std::fs::create_dir_all(root.join("..2026_12_01").join("sub")).expect("mkdir");
        std::fs::write(root.join("..2026_12_01/app.conf"), "x=1\n").expect("write");
        std::fs::set_permissions(root.join("..2026_12_01/app.conf"), std::fs::Permissions::from_mode(0o640))
            .expect("chmod");
        symlink("..2026_12_01", root.join("..data")).expect("link");
        symlink("..data/app.conf", root.join("app.conf")).expect("link");
        let (directory, entries) = read_tree(&root).expect("tree");
        assert!(directory);
        let summary: Vec<_> = entries
            .iter()
            .map(|e| match &e.kind {
                Some(file_entry::Kind::Content(c)) => format!("{} file {:o} {}", e.path, e.mode, c.len()),
                Some(file_entry::Kind::Symlink(t)) => format!("{} -> {t}", e.path),
                Some(file_entry::Kind::Dir(_)) => format!("{} dir", e.path),
                None => format!("{} ?", e.path),
            })
            .collect();
        assert_eq!(
            summary,
            [
                "..2026_12_01 dir",
                "..data -> ..2026_12_01",
                "app.conf -> ..data/app.conf",
                "..2026_12_01/app.conf file 640 4",
                "..2026_12_01/sub dir",
            ]
        );
    }

    #[test]
    fn a_file_is_one_entry_and_a_missing_path_is_named() {
        let dir = tempfile::tempdir().expect("tmp");
        let hosts = dir.path().join("etc-hosts");
        std::fs::write(&hosts, "127.0.0.1 localhost\n").expect("write");
        let (directory, entries) = read_tree(&hosts).expect("file");
        assert!(!directory);
        assert_eq!(entries.len(), 1);
        assert!(entries[0].path.is_empty());
        let err = read_tree(&dir.path().join("gone")).expect_err("missing").to_string();
        assert!(err.contains("gone"), "{err}");
    }
}
