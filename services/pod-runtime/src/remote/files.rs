//! The files a kubelet on another machine stores for its pods, under
//! `<runtime root>/pod-files/<pod uid>/<key>`: written whole into a staging path beside the
//! target and renamed into place, the first put of a key winning. Blocking: call from
//! `spawn_blocking`.

use std::collections::BTreeMap;
use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hpk_proto::podruntime::v1::PutFilesRequest;
use tracing::{info, warn};

use super::validate::{self, DEFAULT_DIR_MODE, Entry, Kind, Root};
use super::{Error, Result};

pub use crate::runtime::POD_FILES;

/// Bytes of the staging name taken from the key's last component, for a reader of the
/// directory; the rest is random, and the whole stays far below a file name's 255 bytes.
const STAGING_NAME_HINT: usize = 64;

/// Stores what `request` carries under `pod_files` and answers its path. Everything is
/// checked first (nothing is written for a bad request); if the key is already stored, that
/// copy stays and its path is the answer. `max_content` bounds the files' total size.
pub fn put(pod_files: &Path, request: &PutFilesRequest, max_content: usize) -> Result<PathBuf> {
    let plan = validate::plan(request, max_content)?;
    let uid_dir = pod_files.join(plan.uid);
    let target = uid_dir.join(plan.key);
    private_dir(pod_files)?;
    private_dir(&uid_dir)?;
    // Before looking at the target: its parents must be ours, not links.
    let parent = key_parent(&uid_dir, plan.key)?;
    if exists(&target)? {
        return Ok(target);
    }
    let staging = parent.join(staging_name(plan.key)?);
    let placed = write_root(&staging, &plan.root).and_then(|()| place(&staging, &target));
    match placed {
        Ok(true) => {
            info!(pod = plan.uid, key = plan.key, path = %target.display(), "pod files stored");
            Ok(target)
        }
        Ok(false) => {
            // Another put of the same key got there first: its copy is the one.
            remove_quietly(&staging);
            Ok(target)
        }
        Err(error) => {
            remove_quietly(&staging);
            Err(error)
        }
    }
}

/// Removes everything stored for pod `uid`; nothing stored is fine. Links inside are removed,
/// never followed.
pub fn remove_pod(pod_files: &Path, uid: &str) -> Result<()> {
    validate::check_uid(uid)?;
    let dir = pod_files.join(uid);
    let mut removed = fs::remove_dir_all(&dir);
    if matches!(&removed, Err(e) if e.kind() == io::ErrorKind::PermissionDenied) {
        // A tree with read-only directories, without the privilege to ignore their modes.
        removed = make_writable(&dir).and_then(|()| fs::remove_dir_all(&dir));
    }
    match removed {
        Ok(()) => {
            info!(pod = uid, "pod files removed");
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io("remove", &dir, e)),
    }
}

/// The runtime's hook removing a pod's files under `pod_files` once its last sandbox is gone.
/// Best effort: the sandbox is removed either way.
pub fn remove_on_pod_removed(pod_files: PathBuf) -> crate::runtime::PodRemoved {
    crate::runtime::PodRemoved(std::sync::Arc::new(move |uid: &str| {
        match remove_pod(&pod_files, uid) {
            // A UID that is not one cannot have files stored.
            Ok(()) | Err(Error::Invalid(_)) => {}
            Err(error) => warn!(pod = uid, %error, "cannot remove the pod's files"),
        }
    }))
}

/// `.<start of the key's last component>.staging-<random>`.
fn staging_name(key: &str) -> Result<String> {
    let last = key.rsplit('/').next().unwrap_or(key);
    let mut end = last.len().min(STAGING_NAME_HINT);
    while !last.is_char_boundary(end) {
        end -= 1;
    }
    let mut random = [0u8; 8];
    getrandom::fill(&mut random)
        .map_err(|e| Error::io("read", "random source", io::Error::other(e.to_string())))?;
    Ok(format!(".{}.staging-{}", &last[..end], hex::encode(random)))
}

/// Creates `path` as a 0700 directory unless it is one already (not a link to one).
fn private_dir(path: &Path) -> Result<()> {
    match DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let meta = fs::symlink_metadata(path).map_err(|e| Error::io("inspect", path, e))?;
            if meta.is_dir() {
                Ok(())
            } else {
                Err(Error::io("use as a directory", path, io::Error::other("it is a file or a link")))
            }
        }
        Err(e) => Err(Error::io("create", path, e)),
    }
}

/// Creates the key's parent directories below the pod's (0700), refusing any that is not a
/// real directory: a link there, left by a container in a writable tree stored under a
/// shorter key, would lead the write (or the answered path) out of the pod's directory.
fn key_parent(uid_dir: &Path, key: &str) -> Result<PathBuf> {
    let mut dir = uid_dir.to_owned();
    for component in validate::ancestors(key).last().into_iter().flat_map(|parent| parent.split('/')) {
        dir.push(component);
        private_dir(&dir)?;
    }
    Ok(dir)
}

fn exists(path: &Path) -> Result<bool> {
    match fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(Error::io("inspect", path, e)),
    }
}

/// Writes the file or the tree at `staging`.
fn write_root(staging: &Path, root: &Root<'_>) -> Result<()> {
    match root {
        Root::File { content, mode } => write_file(staging, content, *mode),
        Root::Dir(entries) => write_tree(staging, entries),
    }
}

fn write_file(path: &Path, content: &[u8], mode: u32) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Error::io("create", path, e))?;
    file.write_all(content).map_err(|e| Error::io("write", path, e))?;
    // Set after writing and explicitly: the umask must not change what was asked for.
    file.set_permissions(fs::Permissions::from_mode(mode)).map_err(|e| Error::io("chmod", path, e))
}

/// Creates the tree with its directories private (0700), then gives every directory its mode,
/// deepest first, so a read-only directory never stops its own filling.
fn write_tree(staging: &Path, entries: &[Entry<'_>]) -> Result<()> {
    let create_dir = |path: &Path| {
        DirBuilder::new().recursive(true).mode(0o700).create(path).map_err(|e| Error::io("create", path, e))
    };
    create_dir(staging)?;
    // Every directory of the tree and its final mode; the root is "".
    let mut dirs = BTreeMap::from([(String::new(), DEFAULT_DIR_MODE)]);
    for entry in entries {
        let path = staging.join(entry.path);
        for parent in validate::ancestors(entry.path) {
            if !dirs.contains_key(parent) {
                dirs.insert(parent.to_owned(), DEFAULT_DIR_MODE);
                create_dir(&staging.join(parent))?;
            }
        }
        match entry.kind {
            Kind::File(content) => write_file(&path, content, entry.mode)?,
            Kind::Symlink(target) => {
                std::os::unix::fs::symlink(target, &path)
                    .map_err(|e| Error::io("create a symlink", &path, e))?;
            }
            Kind::Dir => {
                create_dir(&path)?;
                dirs.insert(entry.path.to_owned(), entry.mode);
            }
        }
    }
    // In reverse order what is below a directory comes before it.
    for (dir, mode) in dirs.iter().rev() {
        let path = if dir.is_empty() { staging.to_owned() } else { staging.join(dir) };
        fs::set_permissions(&path, fs::Permissions::from_mode(*mode))
            .map_err(|e| Error::io("chmod", &path, e))?;
    }
    Ok(())
}

/// Renames `staging` to `target` unless `target` exists; false when it did.
fn place(staging: &Path, target: &Path) -> Result<bool> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    match renameat_with(CWD, staging, CWD, target, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::EXIST) => Ok(false),
        // A filesystem without RENAME_NOREPLACE: check, then rename; a racing put of the same
        // key between the two is the only way to lose (and then over an equal copy).
        Err(rustix::io::Errno::INVAL) => {
            if exists(target)? {
                return Ok(false);
            }
            match fs::rename(staging, target) {
                Ok(()) => Ok(true),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::DirectoryNotEmpty | io::ErrorKind::AlreadyExists
                    ) =>
                {
                    Ok(false)
                }
                Err(e) => Err(Error::io("rename into place", target, e)),
            }
        }
        Err(e) => Err(Error::io("rename into place", target, e.into())),
    }
}

/// Removes a staging copy, logging what cannot be removed.
fn remove_quietly(staging: &Path) {
    let removed = match fs::symlink_metadata(staging) {
        Ok(meta) if meta.is_dir() => make_writable(staging).and_then(|()| fs::remove_dir_all(staging)),
        Ok(_) => fs::remove_file(staging),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    if let Err(error) = removed {
        warn!(path = %staging.display(), %error, "cannot remove a staging copy of pod files");
    }
}

/// Gives the directories of a tree their owner's write and search bits back, so a tree with
/// read-only directories can be removed.
fn make_writable(dir: &Path) -> io::Result<()> {
    if !fs::symlink_metadata(dir)?.is_dir() {
        return Ok(()); // a link is removed, never followed
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            make_writable(&entry.path())?;
        }
    }
    Ok(())
}
