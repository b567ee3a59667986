//! Host paths no pod may mount: HPK's own directories (`/hpk`, which holds the shared directory
//! `/hpk/shared` with the cluster's credentials, and `/var/lib/hpk`, the bubble's node directory
//! with its keys and every pod's files), any path inside them, and any parent of them (a
//! hostPath of `/` would expose them all). Review H5.
//!
//! Both the path as written and the path with its links resolved are compared, against both
//! forms of each forbidden directory, so a link cannot lead into one and a forbidden directory
//! that is itself a link is still found. A path that does not exist yet (`DirectoryOrCreate`)
//! is resolved as far as it exists.

use std::fs;
use std::path::{Component, Path, PathBuf};

use super::VolumeError;

/// The directories refused by default (`--forbidden-host-path`).
pub const DEFAULT_FORBIDDEN: &[&str] = &["/hpk", "/var/lib/hpk"];

/// Refuses `path` (a hostPath of volume `volume`) if it reaches a directory of `forbidden`.
pub fn check(volume: &str, path: &Path, forbidden: &[PathBuf]) -> Result<(), VolumeError> {
    let written = lexical(path);
    let resolved = resolve_existing(&written);
    for dir in forbidden {
        let dir_written = lexical(dir);
        let dir_resolved = resolve_existing(&dir_written);
        for candidate in [&written, &resolved] {
            for reserved in [&dir_written, &dir_resolved] {
                let relation = if candidate.starts_with(reserved) {
                    "lies inside"
                } else if reserved.starts_with(candidate) {
                    "contains"
                } else {
                    continue;
                };
                return Err(VolumeError::HostPathForbidden {
                    volume: volume.to_owned(),
                    path: path.to_owned(),
                    resolved: resolved.clone(),
                    relation,
                    forbidden: dir.clone(),
                });
            }
        }
    }
    Ok(())
}

/// `path` with `.` and `..` (never above `/`) and repeated slashes removed, without looking at
/// the filesystem.
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// `path` with its links resolved as far as it exists; the missing rest appended as written.
fn resolve_existing(path: &Path) -> PathBuf {
    let mut missing = Vec::new();
    let mut existing = path;
    loop {
        if let Ok(real) = fs::canonicalize(existing) {
            return missing.iter().rev().fold(real, |acc, part| acc.join(part));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name.to_owned());
                existing = parent;
            }
            _ => return path.to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn refused(path: &Path, forbidden: &[PathBuf]) -> Option<String> {
        check("v", path, forbidden).err().map(|e| e.to_string())
    }

    #[test]
    fn hpk_directories_their_children_and_their_parents_are_refused() {
        let defaults: Vec<PathBuf> = DEFAULT_FORBIDDEN.iter().map(PathBuf::from).collect();
        for (path, relation) in [
            ("/hpk", "lies inside"),
            ("/hpk/shared", "lies inside"),
            ("/hpk/shared/kubeconfig", "lies inside"),
            ("/var/lib/hpk", "lies inside"),
            ("/var/lib/hpk/node/new-dir", "lies inside"),
            ("/hpk/", "lies inside"),
            ("/tmp/../hpk/shared", "lies inside"),
            ("/", "contains"),
            ("/var", "contains"),
            ("/var/lib", "contains"),
        ] {
            let err = refused(Path::new(path), &defaults).unwrap_or_else(|| panic!("{path} allowed"));
            assert!(err.contains(relation), "{path}: {err}");
            assert!(err.contains("HPK"), "{path}: {err}");
        }
        for path in ["/data", "/var/lib/hpk-other", "/hpkx", "/var/log", "/scratch/hpk"] {
            assert_eq!(refused(Path::new(path), &defaults), None, "{path}");
        }
    }

    #[test]
    fn a_link_into_a_forbidden_directory_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = fs::canonicalize(tmp.path()).expect("canonical");
        let reserved = base.join("hpk");
        fs::create_dir_all(reserved.join("shared")).expect("mkdir");
        fs::create_dir(base.join("data")).expect("mkdir");
        symlink(reserved.join("shared"), base.join("data/innocent")).expect("link");
        symlink("../hpk", base.join("data/relative")).expect("link");
        let forbidden = [reserved.clone()];
        for path in [
            base.join("data/innocent"),
            base.join("data/innocent/kubeconfig"),
            base.join("data/relative/new"),
        ] {
            let err = refused(&path, &forbidden).unwrap_or_else(|| panic!("{} allowed", path.display()));
            assert!(err.contains("lies inside"), "{err}");
            assert!(
                err.contains(&reserved.join("shared").display().to_string()) || err.contains("relative"),
                "{err}"
            );
        }
        assert_eq!(refused(&base.join("data"), &forbidden), None, "an unrelated directory is fine");
        assert_eq!(refused(&base.join("data/new/dir"), &forbidden), None, "missing, unrelated");
        assert!(refused(&base, &forbidden).is_some_and(|e| e.contains("contains")), "a parent");

        // A forbidden directory that is itself a link is found by where it leads too.
        symlink(&reserved, base.join("hpk-link")).expect("link");
        let err = refused(&reserved.join("shared"), &[base.join("hpk-link")]).expect("through the link");
        assert!(err.contains("lies inside"), "{err}");
    }
}
