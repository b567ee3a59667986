//! Kubernetes's atomic-writer layout for API-data volumes (configMap, secret, downwardAPI,
//! projected), so that a running container sees either the old or the new content, never a mix:
//!
//! ```text
//! ..2026_11_30_03_04_05.123456789/   the content, one directory per version
//! ..data -> ..2026_11_30_03_04_05.123456789
//! key -> ..data/key                  one symlink per top-level entry
//! ```
//!
//! An update writes a new version directory, points `..data_tmp` at it and renames that over
//! `..data` (one atomic rename(2)), then fixes the top-level links and removes the old version.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, DirBuilder, OpenOptions, Permissions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use tracing::debug;

use super::{VolumeError, ownership};

/// The link to the current version.
const DATA: &str = "..data";
/// The link renamed over [`DATA`].
const DATA_TMP: &str = "..data_tmp";

/// One file of a volume's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileData {
    /// The bytes.
    pub data: Vec<u8>,
    /// Permission bits (0o777 at most).
    pub mode: u32,
    /// The user that owns it; `None` leaves it to whoever writes (the node).
    pub owner: Option<u32>,
}

/// A volume's content: relative path → file.
pub type Payload = BTreeMap<String, FileData>;

/// Checks that `path` is a plain relative path inside the volume: not empty, not absolute, no
/// `..` element, not starting with `..` (reserved for the writer's own entries).
pub fn check_path(volume: &str, path: &str) -> Result<(), VolumeError> {
    let bad = |reason| Err(VolumeError::BadPath { volume: volume.to_owned(), path: path.to_owned(), reason });
    if path.is_empty() {
        return bad("is empty");
    }
    if path.len() > 4096 || path.split('/').any(|part| part.len() > 255) {
        return bad("is too long");
    }
    if Path::new(path).is_absolute() {
        return bad("must be relative, not absolute");
    }
    if Path::new(path).components().any(|c| c == Component::ParentDir) {
        return bad("must not contain '..'");
    }
    if path.starts_with("..") {
        return bad("must not start with '..'");
    }
    Ok(())
}

/// Writes `payload` into `dir` (created when missing) unless `dir` already holds exactly that.
/// With `group` (the pod's fsGroup) the new version is group-owned and group-readable before
/// it becomes visible. Returns whether the content changed.
pub fn write(volume: &str, dir: &Path, payload: &Payload, group: Option<u32>) -> Result<bool, VolumeError> {
    for path in payload.keys() {
        check_path(volume, path)?;
    }
    let with_group;
    let payload = match group {
        Some(_) => {
            with_group = payload
                .iter()
                .map(|(path, file)| {
                    (
                        path.clone(),
                        FileData { mode: file.mode | ownership::READ_ONLY_GROUP_BITS, ..file.clone() },
                    )
                })
                .collect::<Payload>();
            &with_group
        }
        None => payload,
    };
    make_dir(volume, dir)?;
    let old_version = fs::read_link(dir.join(DATA)).ok();
    if let Some(old) = &old_version
        && matches(&dir.join(old), payload)
    {
        return Ok(false);
    }
    let version = new_version_dir(volume, dir, group)?;
    if let Err(e) = fill(volume, &dir.join(&version), payload, group) {
        let _ = fs::remove_dir_all(dir.join(&version));
        return Err(e);
    }
    let tmp = dir.join(DATA_TMP);
    let _ = fs::remove_file(&tmp);
    symlink(&version, &tmp).map_err(VolumeError::io(volume, "create", &tmp))?;
    fs::rename(&tmp, dir.join(DATA)).map_err(VolumeError::io(volume, "rename", &tmp))?;
    link_top_level(volume, dir, payload, old_version.as_deref())?;
    if let Some(old) = old_version.filter(|old| *old != version) {
        fs::remove_dir_all(dir.join(&old)).map_err(VolumeError::io(volume, "remove", dir.join(&old)))?;
    }
    debug!(volume, dir = %dir.display(), version = %version.display(), "volume content written");
    Ok(true)
}

/// Creates `dir` with mode 0755 (and its parents) when it does not exist.
pub fn make_dir(volume: &str, dir: &Path) -> Result<(), VolumeError> {
    match DirBuilder::new().recursive(true).mode(0o755).create(dir) {
        Ok(()) => Ok(()),
        Err(e) => Err(VolumeError::io(volume, "create", dir)(e)),
    }
}

/// A fresh `..YYYY_MM_DD_HH_MM_SS.nnnnnnnnn` directory in `dir`, mode 0755 (group-owned by
/// `group`, setgid, when given).
fn new_version_dir(volume: &str, dir: &Path, group: Option<u32>) -> Result<PathBuf, VolumeError> {
    let now = time::OffsetDateTime::now_utc();
    let base = format!(
        "..{:04}_{:02}_{:02}_{:02}_{:02}_{:02}.{:09}",
        now.year(),
        u8::from(now.month()),
        now.day(),
        now.hour(),
        now.minute(),
        now.second(),
        now.nanosecond()
    );
    // Two writes within the clock's resolution would collide; a suffix keeps them apart.
    for attempt in 0..100u32 {
        let name = if attempt == 0 { base.clone() } else { format!("{base}_{attempt}") };
        let path = dir.join(&name);
        match DirBuilder::new().mode(0o755).create(&path) {
            Ok(()) => {
                group_dir(volume, &path, group)?;
                return Ok(PathBuf::from(name));
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(VolumeError::io(volume, "create", path)(e)),
        }
    }
    Err(VolumeError::io(volume, "create", dir.join(base))(ErrorKind::AlreadyExists.into()))
}

/// Writes every file of `payload` under `root`, creating subdirectories 0755, owned as
/// `payload` and `group` say.
fn fill(volume: &str, root: &Path, payload: &Payload, group: Option<u32>) -> Result<(), VolumeError> {
    for (path, file) in payload {
        let target = root.join(path);
        for parent in
            target.ancestors().skip(1).take_while(|p| *p != root).collect::<Vec<_>>().into_iter().rev()
        {
            if !parent.is_dir() {
                make_dir(volume, parent)?;
                group_dir(volume, parent, group)?;
            }
        }
        let mut out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&target)
            .map_err(VolumeError::io(volume, "create", &target))?;
        out.write_all(&file.data).map_err(VolumeError::io(volume, "write", &target))?;
        // The umask applied at open; the mode asked for is set explicitly, after the owner
        // (a chown clears setuid/setgid bits, and some file systems more).
        ownership::chown(volume, &target, file.owner, group)?;
        set_mode(volume, &target, file.mode & 0o777)?;
    }
    Ok(())
}

/// Sets a directory we made to 0755, or with `group` to group-owned, setgid 2755.
fn group_dir(volume: &str, path: &Path, group: Option<u32>) -> Result<(), VolumeError> {
    ownership::chown(volume, path, None, group)?;
    let bits = if group.is_some() { ownership::DIR_GROUP_BITS } else { 0 };
    set_mode(volume, path, 0o755 | bits)
}

fn set_mode(volume: &str, path: &Path, mode: u32) -> Result<(), VolumeError> {
    fs::set_permissions(path, Permissions::from_mode(mode)).map_err(VolumeError::io(volume, "chmod", path))
}

/// Whether the version directory `version` holds exactly `payload` (paths, bytes and modes).
fn matches(version: &Path, payload: &Payload) -> bool {
    let mut found = BTreeSet::new();
    if !collect_files(version, Path::new(""), &mut found) || found.len() != payload.len() {
        return false;
    }
    payload.iter().all(|(path, file)| {
        let full = version.join(path);
        let same_mode = fs::symlink_metadata(&full).is_ok_and(|m| {
            m.is_file()
                && m.permissions().mode() & 0o777 == file.mode & 0o777
                && file.owner.is_none_or(|uid| m.uid() == uid)
        });
        same_mode && found.contains(Path::new(path)) && fs::read(&full).is_ok_and(|d| d == file.data)
    })
}

/// Relative paths of the regular files under `dir`; false when something else is there.
fn collect_files(dir: &Path, prefix: &Path, out: &mut BTreeSet<PathBuf>) -> bool {
    let Ok(entries) = fs::read_dir(dir) else { return false };
    for entry in entries {
        let Ok(entry) = entry else { return false };
        let Ok(kind) = entry.file_type() else { return false };
        let rel = prefix.join(entry.file_name());
        if kind.is_dir() {
            if !collect_files(&entry.path(), &rel, out) {
                return false;
            }
        } else if kind.is_file() {
            out.insert(rel);
        } else {
            return false;
        }
    }
    true
}

/// The first path element of each entry.
fn top_level(payload: &Payload) -> BTreeSet<String> {
    payload
        .keys()
        .filter_map(|p| p.split('/').find(|s| !s.is_empty() && *s != "."))
        .map(str::to_owned)
        .collect()
}

/// Makes `name -> ..data/name` for every top-level entry of `payload` and removes the links of
/// entries the old version had and the new one has not.
fn link_top_level(
    volume: &str,
    dir: &Path,
    payload: &Payload,
    old: Option<&Path>,
) -> Result<(), VolumeError> {
    let wanted = top_level(payload);
    for name in &wanted {
        let link = dir.join(name);
        let target = Path::new(DATA).join(name);
        match fs::read_link(&link) {
            Ok(current) if current == target => continue,
            Ok(_) => fs::remove_file(&link).map_err(VolumeError::io(volume, "remove", &link))?,
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            // Something that is not a link sits where the entry goes: a leftover we replace.
            Err(_) => remove_any(volume, &link)?,
        }
        symlink(&target, &link).map_err(VolumeError::io(volume, "create", &link))?;
    }
    let Some(old) = old else { return Ok(()) };
    let mut previous = BTreeSet::new();
    let _ = collect_files(&dir.join(old), Path::new(""), &mut previous);
    for path in previous {
        let Some(first) = path.components().next() else { continue };
        let name = first.as_os_str().to_string_lossy().into_owned();
        let link = dir.join(&name);
        if !wanted.contains(&name) && fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()) {
            fs::remove_file(&link).map_err(VolumeError::io(volume, "remove", &link))?;
        }
    }
    Ok(())
}

fn remove_any(volume: &str, path: &Path) -> Result<(), VolumeError> {
    let meta = fs::symlink_metadata(path).map_err(VolumeError::io(volume, "inspect", path))?;
    let result = if meta.is_dir() { fs::remove_dir_all(path) } else { fs::remove_file(path) };
    result.map_err(VolumeError::io(volume, "remove", path))
}
