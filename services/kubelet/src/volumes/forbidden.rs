//! Which host paths pods may mount. Where the kubelet is told the paths its bubble binds from
//! the host (`--allowed-host-path`), a hostPath must lie inside one of them: anything else is
//! the bubble's own image, never what a user means. And never HPK's own directories (`/hpk`, which holds the shared directory
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

/// Host files any pod may mount though no bind brings them, always read-only: the node's
/// hosts file, which upstream's pods mount to see the node's names (the bubble binds its own
/// read-only). Only the path as written, and only when it is no link.
pub const NODE_FILES: &[&str] = &[super::hosts::NODE_ETC_HOSTS];

/// Whether `path` is one of the [`NODE_FILES`].
pub fn node_file(path: &Path) -> bool {
    let written = lexical(path);
    NODE_FILES.iter().any(|file| written == Path::new(file))
}

/// The host paths hostPath volumes (and hostPath or local PersistentVolumes) may reach.
#[derive(Debug, Clone, Default)]
pub struct HostPaths {
    /// Directories no hostPath may reach: inside or above them (`--forbidden-host-path`).
    pub forbidden: Vec<PathBuf>,
    /// When not empty, a hostPath must lie inside one of these, its links resolved
    /// (`--allowed-host-path`: what the bubble binds from the host).
    pub allowed: Vec<PathBuf>,
    /// Directories no hostPath may lie inside, though one may contain them
    /// (`--hidden-host-path`: HPK's own directories inside a bound path, which the bubble sees
    /// covered by an empty read-only directory).
    pub hidden: Vec<PathBuf>,
}

/// Refuses `path` (a hostPath of volume `volume`) if it reaches a forbidden directory of
/// `paths`, or lies outside every allowed one.
pub fn check(volume: &str, path: &Path, paths: &HostPaths) -> Result<(), VolumeError> {
    let written = lexical(path);
    let resolved = resolve_existing(&written);
    // (directory, whether only lying inside it is refused)
    let reserved_dirs =
        paths.forbidden.iter().map(|dir| (dir, false)).chain(paths.hidden.iter().map(|dir| (dir, true)));
    for (dir, only_inside) in reserved_dirs {
        let dir_written = lexical(dir);
        let dir_resolved = resolve_existing(&dir_written);
        for candidate in [&written, &resolved] {
            for reserved in [&dir_written, &dir_resolved] {
                let relation = if candidate.starts_with(reserved) {
                    "lies inside"
                } else if !only_inside && reserved.starts_with(candidate) {
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
    if paths.allowed.is_empty() || (node_file(&written) && resolved == written) {
        return Ok(());
    }
    // Where the mount leads is what counts: a link inside a bound path may point out of it.
    let inside = paths.allowed.iter().any(|dir| {
        let dir_written = lexical(dir);
        resolved.starts_with(&dir_written) || resolved.starts_with(resolve_existing(&dir_written))
    });
    if inside {
        return Ok(());
    }
    Err(VolumeError::HostPathNotBound {
        volume: volume.to_owned(),
        path: path.to_owned(),
        resolved,
        allowed: paths.allowed.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "),
    })
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
        let paths = HostPaths { forbidden: forbidden.to_vec(), ..HostPaths::default() };
        check("v", path, &paths).err().map(|e| e.to_string())
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

    #[test]
    fn the_nodes_hosts_file_is_allowed_without_a_bind_and_nothing_beside_it() {
        let paths = HostPaths {
            forbidden: vec![PathBuf::from("/hpk")],
            allowed: vec![PathBuf::from("/home/alice")],
            hidden: Vec::new(),
        };
        for path in ["/etc/hosts", "/etc/../etc/hosts", "//etc/hosts"] {
            check("v", Path::new(path), &paths).unwrap_or_else(|e| panic!("{path}: {e}"));
            assert!(node_file(Path::new(path)), "{path}");
        }
        for path in ["/etc", "/etc/hosts.allow", "/etc/passwd", "/etc/hosts/x"] {
            assert!(check("v", Path::new(path), &paths).is_err(), "{path} allowed");
            assert!(!node_file(Path::new(path)), "{path}");
        }
    }

    #[test]
    fn with_bound_paths_only_what_lies_inside_one_is_allowed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let base = fs::canonicalize(tmp.path()).expect("canonical");
        let home = base.join("home/alice");
        let scratch = base.join("scratch");
        fs::create_dir_all(home.join("data")).expect("mkdir");
        fs::create_dir_all(&scratch).expect("mkdir");
        fs::create_dir_all(base.join("etc")).expect("mkdir");
        symlink(base.join("etc"), home.join("escape")).expect("link");
        symlink(&scratch, home.join("to-scratch")).expect("link");
        let paths = HostPaths {
            forbidden: vec![PathBuf::from("/hpk")],
            allowed: vec![home.clone(), scratch.clone(), PathBuf::from("/var/local/hpk")],
            hidden: vec![home.join(".hpk")],
        };
        let allowed = |path: &Path| check("v", path, &paths).map_err(|e| e.to_string());
        for path in [
            home.clone(),
            home.join("data"),
            home.join("data/not/yet"),
            scratch.join("run-1"),
            home.join("to-scratch/run-2"),
            PathBuf::from("/var/local/hpk/pv-1"),
        ] {
            allowed(&path).unwrap_or_else(|e| panic!("{} refused: {e}", path.display()));
        }
        for path in [
            base.join("etc"),
            home.join("escape"),
            home.join("escape/passwd"),
            home.join("data/../../bob"),
            base.join("home"),
            PathBuf::from("/etc/passwd"),
        ] {
            let err = allowed(&path).expect_err(&format!("{} allowed", path.display()));
            assert!(err.contains("lies outside the host paths this cluster binds"), "{err}");
            assert!(err.contains("--bind"), "the error names the option: {err}");
        }
        // HPK's own directory inside a bound path may not be mounted, though the bound path
        // holding it may (the bubble covers it).
        for path in [home.join(".hpk"), home.join(".hpk/hpk.kubeconfig"), home.join("to-scratch/../.hpk")] {
            let err = allowed(&path).expect_err(&format!("{} allowed", path.display()));
            assert!(err.contains("lies inside") && err.contains("keeps for HPK itself"), "{err}");
        }
        allowed(&home).expect("$HOME itself");
    }
}
