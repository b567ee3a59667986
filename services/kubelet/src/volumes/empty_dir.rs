//! emptyDir volumes: a directory that lives as long as the pod, on disk or (`medium: Memory`) on
//! a tmpfs. Like the kubelet's, the directory is mode 0777 so that containers running as any
//! user can write to it.

use std::fs::{self, DirBuilder, Permissions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

use k8s_openapi::api::core::v1::EmptyDirVolumeSource;
use nix::errno::Errno;
use nix::mount::MsFlags;
use tracing::{info, warn};

use super::atomic::make_dir;
use super::{VolumeError, ownership};
use crate::quantity;

/// Creates the emptyDir `volume` at `dir`, group-owned by `group` (the pod's fsGroup) when
/// given; appends to `unenforced` what it cannot enforce.
pub fn prepare(
    volume: &str,
    source: &EmptyDirVolumeSource,
    dir: &Path,
    group: Option<u32>,
    unenforced: &mut Vec<String>,
) -> Result<(), VolumeError> {
    let size = match &source.size_limit {
        Some(limit) => Some(
            quantity::units(limit)
                .map_err(|source| VolumeError::SizeLimit { volume: volume.to_owned(), source })?,
        )
        .filter(|bytes| *bytes > 0),
        None => None,
    };
    let limit_text = source.size_limit.as_ref().map(|q| q.0.clone());
    let medium = source.medium.as_deref().unwrap_or_default();
    if !matches!(medium, "" | "Memory") {
        return Err(VolumeError::Unsupported {
            volume: volume.to_owned(),
            kind: format!("emptyDir medium {medium}"),
        });
    }
    if let Some(parent) = dir.parent() {
        make_dir(volume, parent)?;
    }
    match DirBuilder::new().mode(0o777).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {}
        Err(e) => return Err(VolumeError::io(volume, "create", dir)(e)),
    }
    set_world_writable(volume, dir, group)?;
    if medium == "Memory" {
        if is_mount_point(dir) {
            return Ok(());
        }
        match mount_tmpfs(dir, size) {
            Ok(()) => {
                info!(volume, dir = %dir.display(), size, "emptyDir tmpfs mounted");
                set_world_writable(volume, dir, group)?;
            }
            Err(Errno::EPERM) => {
                warn!(volume, dir = %dir.display(), "no permission to mount tmpfs; emptyDir medium Memory is a directory on disk");
                unenforced.push(format!(
                    "emptyDir {volume:?}: medium Memory is a directory on disk (mounting tmpfs was not permitted){}",
                    limit_text.map(|l| format!("; sizeLimit {l} is not enforced")).unwrap_or_default()
                ));
            }
            Err(source) => {
                return Err(VolumeError::Tmpfs { volume: volume.to_owned(), path: dir.to_owned(), source });
            }
        }
    } else if let Some(limit) = limit_text {
        unenforced.push(format!("emptyDir {volume:?}: sizeLimit {limit} is not enforced on disk"));
    }
    Ok(())
}

/// 0777, and with `group` group-owned and setgid so that what containers create there
/// belongs to the group too. Only the top directory: what is below was made by the pod.
fn set_world_writable(volume: &str, dir: &Path, group: Option<u32>) -> Result<(), VolumeError> {
    ownership::chown(volume, dir, None, group)?;
    let mode = if group.is_some() { 0o2777 } else { 0o777 };
    fs::set_permissions(dir, Permissions::from_mode(mode)).map_err(VolumeError::io(volume, "chmod", dir))
}

/// Whether `dir` is on another file system than its parent (our tmpfs is).
pub fn is_mount_point(dir: &Path) -> bool {
    let (Ok(own), Some(Ok(parent))) = (fs::symlink_metadata(dir), dir.parent().map(fs::symlink_metadata))
    else {
        return false;
    };
    own.is_dir() && own.dev() != parent.dev()
}

/// Mounts a tmpfs on `dir`, `size` bytes at most when given.
fn mount_tmpfs(dir: &Path, size: Option<i64>) -> Result<(), Errno> {
    let mut options = String::from("mode=0777");
    if let Some(size) = size {
        options.push_str(&format!(",size={size}"));
    }
    nix::mount::mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options.as_str()),
    )
}
