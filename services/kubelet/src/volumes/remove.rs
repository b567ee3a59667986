//! Removing a pod's volumes: unmount the emptyDir tmpfs we mounted, refuse to delete through any
//! other mount, then delete the directory tree without following symlinks (a container may have
//! planted one pointing anywhere on the host). hostPath and PersistentVolume sources are never
//! under the pod's directory, so they are never touched.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::MntFlags;
use tracing::info;

use super::VolumeError;

/// A mount point and its file-system type, from `/proc/self/mountinfo`.
struct MountPoint {
    path: PathBuf,
    fs_type: String,
}

/// Removes everything under (and including) `pod_dir`.
pub fn remove(pod_dir: &Path) -> Result<(), VolumeError> {
    let meta = match fs::symlink_metadata(pod_dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(VolumeError::io("", "inspect", pod_dir)(e)),
    };
    if !meta.is_dir() {
        // Never a directory we made; remove the entry itself, whatever it points to.
        return fs::remove_file(pod_dir).map_err(VolumeError::io("", "remove", pod_dir));
    }
    let root = fs::canonicalize(pod_dir).map_err(VolumeError::io("", "resolve", pod_dir))?;
    let mut mounts = mounts_under(&root)?;
    // Deepest first, so that nothing is unmounted from under another mount.
    mounts.sort_by_key(|m| std::cmp::Reverse(m.path.components().count()));
    let volumes = root.join("volumes");
    for mount in mounts {
        let ours = mount.fs_type == "tmpfs" && mount.path.parent() == Some(volumes.as_path());
        if !ours {
            return Err(VolumeError::StillMounted { path: pod_dir.to_owned(), mount_point: mount.path });
        }
        match nix::mount::umount2(&mount.path, MntFlags::MNT_DETACH) {
            // EINVAL: no longer a mount point (a stacked mount already went with the first).
            Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => {
                info!(path = %mount.path.display(), "emptyDir tmpfs unmounted");
            }
            Err(errno) => {
                let volume =
                    mount.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                return Err(VolumeError::Tmpfs { volume, path: mount.path, source: errno });
            }
        }
    }
    // std's remove_dir_all opens each directory relative to its parent with O_NOFOLLOW, so a
    // symlink swapped in while it runs is removed, not followed.
    fs::remove_dir_all(pod_dir).map_err(VolumeError::io("", "remove", pod_dir))
}

/// The mount points strictly under `root`.
fn mounts_under(root: &Path) -> Result<Vec<MountPoint>, VolumeError> {
    let table = "/proc/self/mountinfo";
    let text = fs::read_to_string(table).map_err(VolumeError::io("", "read", table))?;
    Ok(parse_mountinfo(&text).into_iter().filter(|m| m.path.starts_with(root) && m.path != root).collect())
}

/// The mount points of a mountinfo table: field 5 is the mount point, the field after ` - ` is
/// the file-system type.
fn parse_mountinfo(text: &str) -> Vec<MountPoint> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let path = left.split(' ').nth(4)?;
            let fs_type = right.split(' ').next()?;
            Some(MountPoint { path: PathBuf::from(unescape(path)), fs_type: fs_type.to_owned() })
        })
        .collect()
}

/// Undoes the kernel's octal escapes (`\040` for a space) in a mountinfo path.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(digits)) => {
                out.push(digits.iter().fold(0u8, |acc, d| acc.wrapping_mul(8).wrapping_add(d - b'0')));
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_give_path_and_type() {
        let table = "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - tmpfs tmpfs rw\n\
                     37 35 98:0 / /var/lib rw shared:2 - ext4 /dev/sda1 rw\n";
        let mounts = parse_mountinfo(table);
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[0].path, Path::new("/mnt/with space"));
        assert_eq!(mounts[0].fs_type, "tmpfs");
        assert_eq!(mounts[1].fs_type, "ext4");
    }
}
