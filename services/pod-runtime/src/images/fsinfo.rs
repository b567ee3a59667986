//! How much disk the store uses, measured like `du`: allocated blocks, inodes counted once.

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use super::error::{Error, Result};

/// The store's disk usage, as CRI's `FilesystemUsage` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsInfo {
    /// The directory measured (the store's root), CRI's `fs_id.mountpoint` as containerd
    /// reports its snapshotter root.
    pub mountpoint: PathBuf,
    /// When it was measured, nanoseconds since the Unix epoch.
    pub timestamp_ns: i64,
    /// Bytes allocated on disk (512-byte blocks), hard links counted once.
    pub used_bytes: u64,
    /// Inodes used, hard links counted once.
    pub inodes_used: u64,
}

/// Walks `root` without following symlinks. Blocking.
pub(crate) fn measure(root: &Path) -> Result<FsInfo> {
    let timestamp_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    let mut seen = HashSet::new();
    let mut used_bytes = 0;
    let mut pending = vec![root.to_owned()];
    while let Some(path) = pending.pop() {
        let meta = match fs::symlink_metadata(&path) {
            Ok(m) => m,
            // A pull or a collection may remove things while we walk.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io("measuring", &path)(e)),
        };
        if seen.insert((meta.dev(), meta.ino())) {
            used_bytes += meta.blocks() * 512;
        }
        if meta.file_type().is_dir() {
            let entries = match fs::read_dir(&path) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io("listing", &path)(e)),
            };
            for entry in entries {
                pending.push(entry.map_err(Error::io("listing", &path))?.path());
            }
        }
    }
    Ok(FsInfo { mountpoint: root.to_owned(), timestamp_ns, used_bytes, inodes_used: seen.len() as u64 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hard_links_count_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = measure(dir.path()).expect("measure");
        assert_eq!(empty.inodes_used, 1);
        fs::write(dir.path().join("a"), vec![1u8; 10_000]).expect("write");
        fs::hard_link(dir.path().join("a"), dir.path().join("b")).expect("link");
        std::os::unix::fs::symlink("/", dir.path().join("root")).expect("symlink");
        let info = measure(dir.path()).expect("measure");
        assert_eq!(info.inodes_used, 3, "dir, file (two names), symlink");
        assert!(info.used_bytes >= 10_000 && info.used_bytes < 100_000, "{}", info.used_bytes);
        assert!(info.timestamp_ns > 0);
    }
}
