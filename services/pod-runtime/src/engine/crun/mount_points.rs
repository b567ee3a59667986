//! The mount points every container gets, made once and shared, so that crun finds them in
//! the container's root instead of making them in its writable layer.
//!
//! crun mounts `/proc`, `/dev` and `/sys` in every container, and the runtime binds the pod's
//! `/etc/hosts`, `/etc/hostname` and `/etc/resolv.conf`. Where the image lacks one of these, crun
//! makes it before it mounts there, and overlayfs puts what it makes (and a copy of `/etc`) in
//! the container's writable layer: seven files and directories on the node's disk for every
//! container of an image without them, each a new inode that the disk's filesystem allocates
//! and later frees. A layer with only those mount points, below all of the image's layers,
//! gives every container the ones its image lacks:
//!
//! - where the image has the path (or a link, or anything else there), the image's shows, as
//!   the top-most layer that has a path wins in an overlay, and crun does what it did before;
//! - where an image layer hides it (a whiteout, an opaque directory), crun makes it, as before;
//! - where the image lacks it, the layer's shows: a directory (0755) or an empty file (0644)
//!   of the runtime's user, which is what crun would have made, and every one of them is a
//!   mount point, covered by its mount while the container runs.
//!
//! A layer holds only the mount points the container is given (the three files are bound only
//! where the sandbox has them), so a container never sees one it is not given. That makes a
//! layer for each combination, at most eight; each is made once, atomically (made under a
//! temporary name, then renamed), and never changed: mounted overlays use it.

use std::path::{Path, PathBuf};

use crate::engine::{Error, Result};

/// Directories crun mounts in every container (`ContainerSpec::write_bundle`).
const DIRECTORIES: &[&str] = &["proc", "dev", "sys"];
/// Files the runtime binds where the sandbox has them, as their destinations in the container.
const FILES: &[&str] = &["/etc/hosts", "/etc/hostname", "/etc/resolv.conf"];

/// The layer of mount points for a container whose binds go to `destinations`, in `base`
/// (made 0700 where missing); makes it where it is not there yet.
pub fn layer(base: &Path, destinations: &[&str]) -> Result<PathBuf> {
    let files: Vec<&str> = FILES.iter().copied().filter(|f| destinations.contains(f)).collect();
    // Named by which of the files it has: one bit each, in FILES' order.
    let bits = FILES.iter().enumerate().filter(|(_, f)| files.contains(f)).fold(0u8, |b, (i, _)| b | 1 << i);
    let name = format!("v1-{bits}");
    let path = base.join(&name);
    if path.is_dir() {
        return Ok(path);
    }
    make_private(base)?;
    let temporary = tempfile::Builder::new()
        .prefix(&format!(".{name}-"))
        .tempdir_in(base)
        .map_err(|e| Error::io("create a directory in", base, e))?;
    let made = temporary.path();
    // tempfile makes it 0700; the root of a layer shows nowhere, the image's root is above it.
    for dir in DIRECTORIES.iter().chain((!files.is_empty()).then_some(&"etc")) {
        make_dir(&made.join(dir))?;
    }
    for file in &files {
        let at = made.join(file.trim_start_matches('/'));
        std::fs::write(&at, b"").map_err(|e| Error::io("create", &at, e))?;
        set_mode(&at, 0o644)?;
    }
    let made = temporary.keep();
    match std::fs::rename(&made, &path) {
        Ok(()) => Ok(path),
        // Another container's start made it first: use that one.
        Err(_) if path.is_dir() => {
            let _ = std::fs::remove_dir_all(&made);
            Ok(path)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&made);
            Err(Error::io("rename into place", &path, e))
        }
    }
}

/// Removes the layers a runtime killed while it made them left under their temporary names;
/// call before any container starts.
pub fn remove_unfinished(base: &Path) {
    for entry in std::fs::read_dir(base).into_iter().flatten().flatten() {
        if entry.file_name().as_encoded_bytes().starts_with(b".")
            && let Err(e) = std::fs::remove_dir_all(entry.path())
        {
            tracing::warn!(error = %e, path = %entry.path().display(), "an unfinished layer of mount points stays");
        }
    }
}

fn make_private(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(Error::io("create", dir, e)),
    }
}

fn make_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir(dir).map_err(|e| Error::io("create", dir, e))?;
    set_mode(dir, 0o755)
}

/// Sets the mode exactly, whatever the umask took off.
fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::io("chmod", path, e))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn listing(dir: &Path) -> Vec<(String, bool, u32)> {
        let mut out = Vec::new();
        for entry in walk(dir) {
            let meta = std::fs::symlink_metadata(&entry).unwrap();
            let rel = entry.strip_prefix(dir).unwrap().display().to_string();
            out.push((rel, meta.is_dir(), meta.permissions().mode() & 0o7777));
        }
        out.sort();
        out
    }

    fn walk(dir: &Path) -> Vec<PathBuf> {
        let mut all = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            all.push(entry.path());
            if entry.file_type().unwrap().is_dir() {
                all.extend(walk(&entry.path()));
            }
        }
        all
    }

    #[test]
    fn a_layer_has_the_mount_points_a_container_is_given_and_no_others() {
        let base = tempfile::tempdir().unwrap();
        let points = base.path().join("mount-points");
        let all = layer(&points, &["/etc/hosts", "/data", "/etc/resolv.conf", "/etc/hostname"]).unwrap();
        assert_eq!(
            listing(&all),
            [
                ("dev".into(), true, 0o755),
                ("etc".into(), true, 0o755),
                ("etc/hostname".into(), false, 0o644),
                ("etc/hosts".into(), false, 0o644),
                ("etc/resolv.conf".into(), false, 0o644),
                ("proc".into(), true, 0o755),
                ("sys".into(), true, 0o755),
            ]
        );
        for f in ["etc/hosts", "etc/hostname", "etc/resolv.conf"] {
            assert_eq!(std::fs::metadata(all.join(f)).unwrap().len(), 0, "{f} is empty");
        }
        assert_eq!(std::fs::metadata(&points).unwrap().permissions().mode() & 0o777, 0o700);

        // Only hosts: no other file of /etc shows where the container is not given it.
        let hosts = layer(&points, &["/etc/hosts"]).unwrap();
        assert_ne!(hosts, all);
        let names: Vec<String> = listing(&hosts).into_iter().map(|(n, _, _)| n).collect();
        assert_eq!(names, ["dev", "etc", "etc/hosts", "proc", "sys"]);

        // None of the files: not even /etc.
        let none = layer(&points, &["/data"]).unwrap();
        let names: Vec<String> = listing(&none).into_iter().map(|(n, _, _)| n).collect();
        assert_eq!(names, ["dev", "proc", "sys"]);

        // Asked again, the same layer, untouched; nothing made on the way is left.
        let modified = std::fs::metadata(&all).unwrap().modified().unwrap();
        assert_eq!(layer(&points, &["/etc/resolv.conf", "/etc/hostname", "/etc/hosts"]).unwrap(), all);
        assert_eq!(std::fs::metadata(&all).unwrap().modified().unwrap(), modified);
        let mut layers: Vec<String> = std::fs::read_dir(&points)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        layers.sort();
        assert_eq!(layers, ["v1-0", "v1-1", "v1-7"]);
    }

    #[test]
    fn what_a_killed_runtime_left_unfinished_is_removed_and_the_layers_stay() {
        let base = tempfile::tempdir().unwrap();
        let done = layer(base.path(), &["/etc/hosts"]).unwrap();
        let unfinished = base.path().join(".v1-1-abcdef");
        std::fs::create_dir_all(unfinished.join("proc")).unwrap();
        remove_unfinished(base.path());
        assert!(!unfinished.exists());
        assert!(done.join("etc/hosts").is_file());
        // A base not made yet is nothing to clean.
        remove_unfinished(&base.path().join("missing"));
    }

    #[test]
    fn a_base_that_cannot_be_made_is_an_error_that_names_it() {
        let base = tempfile::tempdir().unwrap();
        let file = base.path().join("file");
        std::fs::write(&file, b"").unwrap();
        let e = layer(&file.join("mount-points"), &[]).unwrap_err().to_string();
        assert!(e.contains("mount-points"), "{e}");
    }
}
