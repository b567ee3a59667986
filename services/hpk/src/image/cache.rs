//! The image cache (`$HPK_STATE_DIR/images/`): one unpacked root filesystem per manifest,
//! shared by the bubbles of this machine.
//!
//! - An entry is trusted only with a stamp this user wrote: `<hex>/stamp`, a regular file of
//!   ours holding the manifest digest, written into the staging directory before it is renamed
//!   into place (review finding C1: a directory that merely exists proves nothing).
//! - Every launcher holds a shared lock on its entry's stamp while its bubble runs; an entry no
//!   one holds is removed when another image is unpacked (review finding L7: about 400 MB per
//!   release and node otherwise stayed in `/tmp` for ever).
//! - Staging directories (`.unpack-<pid>-…`, `.archive-<pid>-…`) of a launcher that is gone
//!   are swept.
//! - Renaming an entry into place, taking its lock, and collecting run under one exclusive lock
//!   of the cache (`.lock`), so an entry is never removed between its rename and its lock.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::fcntl::{Flock, FlockArg};

use crate::error::{Error, Result};

/// The file in an entry that says it is complete and ours.
const STAMP: &str = "stamp";

/// A held entry: its lock is released when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct Hold(#[allow(dead_code)] Arc<Flock<File>>);

/// The exclusive lock of the whole cache, for the steps that must not interleave.
pub(super) fn lock_cache(cache: &Path) -> Result<Flock<File>> {
    let path = cache.join(".lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| Error::io("open", path.display(), e))?;
    Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| Error::io("lock", path.display(), e.into()))
}

/// Whether `entry` is complete and this user's: a real directory of ours with a stamp of
/// ours naming `digest`, and a root filesystem directory of ours.
pub(super) fn trusted(entry: &Path, digest: &str) -> bool {
    let uid = nix::unistd::getuid().as_raw();
    let ours_as = |path: &Path, dir: bool| {
        std::fs::symlink_metadata(path)
            .is_ok_and(|m| m.uid() == uid && if dir { m.is_dir() } else { m.file_type().is_file() })
    };
    if !ours_as(entry, true) || !ours_as(&entry.join("rootfs"), true) || !ours_as(&entry.join(STAMP), false) {
        return false;
    }
    let mut text = String::new();
    let read = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(entry.join(STAMP))
        .and_then(|mut f| f.read_to_string(&mut text));
    read.is_ok() && text.trim() == digest
}

/// Writes the stamp of `digest` into the staging directory `staged` (mode 0600, created new).
pub(super) fn stamp(staged: &Path, digest: &str) -> Result<()> {
    use std::io::Write;
    let path = staged.join(STAMP);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| Error::io("create", path.display(), e))?;
    writeln!(file, "{digest}").map_err(|e| Error::io("write", path.display(), e))
}

/// A shared lock on `entry` for as long as the returned value lives.
pub(super) fn hold(entry: &Path) -> Result<Hold> {
    let path = entry.join(STAMP);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&path)
        .map_err(|e| Error::io("open", path.display(), e))?;
    let lock = Flock::lock(file, FlockArg::LockShared)
        .map_err(|(_, e)| Error::io("lock", path.display(), e.into()))?;
    Ok(Hold(Arc::new(lock)))
}

/// Removes every entry but `keep` that no launcher holds, and whatever is not an entry of ours
/// (a directory without a stamp); the caller holds the cache's lock. Returns what it removed.
pub(super) fn collect(cache: &Path, keep: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(cache) else { return Vec::new() };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == keep || name.starts_with('.') || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = entry.path();
        let stamp = File::open(path.join(STAMP));
        // A stamp someone holds is an entry in use; none at all is an entry never finished.
        let free = match stamp {
            Ok(file) => Flock::lock(file, FlockArg::LockExclusiveNonblock).ok(),
            Err(_) => None,
        };
        if free.is_some() || !path.join(STAMP).exists() {
            remove_tree(&path);
            removed.push(path);
        }
        drop(free);
    }
    removed
}

/// A fresh staging directory in `cache` named with `prefix`, this process's PID and a random
/// part (so a sweep can tell a live launcher's from a dead one's).
pub(super) fn staging_name(cache: &Path, prefix: &str) -> Result<PathBuf> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes)
        .map_err(|e| Error::io("generate", "a name", std::io::Error::other(e.to_string())))?;
    Ok(cache.join(format!("{prefix}{}-{}", std::process::id(), hex::encode(bytes))))
}

/// Removes the staging directories of launchers that are gone.
pub(super) fn sweep(cache: &Path) {
    let Ok(entries) = std::fs::read_dir(cache) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(".unpack-").or_else(|| name.strip_prefix(".archive-")) else {
            continue;
        };
        let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
        // Without a PID (an older launcher's name), only a stale one: older than an hour.
        let gone = match pid {
            Some(pid) => !Path::new(&format!("/proc/{pid}")).exists(),
            None => entry
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age.as_secs() > 3600)),
        };
        if gone {
            tracing::info!(dir = %entry.path().display(), "removing a dead launcher's staging directory");
            remove_tree(&entry.path());
        }
    }
}

/// Removes `path` and everything below it, first giving this user write access to each
/// directory (images and overlays have read-only ones).
pub fn remove_tree(path: &Path) {
    open_up(path);
    let _ = std::fs::remove_dir_all(path);
}

fn open_up(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(meta) = std::fs::symlink_metadata(dir) else { return };
    if !meta.is_dir() {
        return;
    }
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            open_up(&entry.path());
        }
    }
}
