//! A container's volumeMounts as CRI mounts: the source on the host, the subPath inside it
//! (checked not to leave the volume), read-only and mount propagation.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, VolumeMount};
use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, open, openat2};
use nix::sys::stat::{Mode, fchmod, mkdirat};

use super::VolumeError;

/// The CRI propagation for a volumeMount's `mountPropagation`.
pub fn propagation(container: &Container, mount: &VolumeMount) -> Result<cri::MountPropagation, VolumeError> {
    let refuse = |reason| VolumeError::Propagation {
        container: container.name.clone(),
        mount_path: mount.mount_path.clone(),
        value: mount.mount_propagation.clone().unwrap_or_default(),
        reason,
    };
    match mount.mount_propagation.as_deref().unwrap_or("None") {
        "None" | "" => Ok(cri::MountPropagation::PropagationPrivate),
        "HostToContainer" => Ok(cri::MountPropagation::PropagationHostToContainer),
        "Bidirectional" => {
            let privileged = container.security_context.as_ref().and_then(|s| s.privileged).unwrap_or(false);
            if privileged {
                Ok(cri::MountPropagation::PropagationBidirectional)
            } else {
                Err(refuse("is only allowed for privileged containers"))
            }
        }
        _ => Err(refuse("is not one of None, HostToContainer, Bidirectional")),
    }
}

/// `$(VAR)` references in `text` replaced by their values in `env`, as Kubernetes expands them:
/// `$$` is a literal `$`, a reference to an unknown variable stays as written.
pub fn expand(text: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(close) = after.strip_prefix('(').and_then(|inner| inner.find(')')) {
            let name = &after[1..=close];
            match env.get(name) {
                Some(value) => out.push_str(value),
                None => out.push_str(&rest[at..at + close + 3]),
            }
            rest = &after[close + 2..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The container annotation that tells the runtime, for each subPath mount (by container path),
/// the real path of its volume. The runtime opens the rest of the mount's host path beneath it
/// without following links and mounts what it opened (hpk-pod-runtime's `sub_path` modules), so
/// a container that swaps a directory for a link after this check gains nothing (review H4).
pub const SUB_PATH_ROOTS: &str = "hpk.io/sub-path-roots";

/// A resolved subPath: the volume's real path, and the real path of the subPath inside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubPath {
    /// The volume, canonical.
    pub root: PathBuf,
    /// Where the subPath leads, canonical, inside `root`.
    pub path: PathBuf,
}

/// The real path of `sub_path` inside the volume at `base`, creating missing directories (0755)
/// on the way, as the kubelet does. Refuses absolute paths, `..`, and any symlink that leads
/// out of the volume (or is absolute). Each prefix is opened beneath the volume with
/// `openat2(RESOLVE_BENEATH)`, and directories are made with `mkdirat` in the directory that
/// open gave, so nothing is created outside the volume even while a container swaps links in.
pub fn resolve_sub_path(volume: &str, base: &Path, sub_path: &str) -> Result<SubPath, VolumeError> {
    let bad = |reason| VolumeError::BadPath { volume: volume.to_owned(), path: sub_path.to_owned(), reason };
    let relative = Path::new(sub_path);
    if relative.is_absolute() {
        return Err(bad("must be relative, not absolute"));
    }
    if relative.components().any(|c| c == Component::ParentDir) {
        return Err(bad("must not contain '..'"));
    }
    let root = fs::canonicalize(base).map_err(VolumeError::io(volume, "resolve", base))?;
    let root_fd = open(&root, OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(|e| VolumeError::io(volume, "open", &root)(e.into()))?;
    let parts: Vec<&OsStr> = relative
        .components()
        .filter_map(|c| match c {
            Component::Normal(part) => Some(part),
            _ => None,
        })
        .collect();
    let mut current = None;
    for i in 0..parts.len() {
        let prefix: PathBuf = parts[..=i].iter().collect();
        let opened = match beneath(&root_fd, &prefix) {
            Err(Errno::ENOENT) => make_dir(current.as_ref().unwrap_or(&root_fd), parts[i])
                .map_err(|e| VolumeError::io(volume, "create", root.join(&prefix))(e.into()))?
                .map_or_else(|| beneath(&root_fd, &prefix), Ok),
            other => other,
        };
        current = Some(opened.map_err(|e| refusal(volume, sub_path, &root, &prefix, e))?);
    }
    let Some(fd) = current else { return Ok(SubPath { path: root.clone(), root }) };
    // The kernel's name of what was opened: the path with every link resolved.
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let path = fs::read_link(&link).map_err(VolumeError::io(volume, "resolve", root.join(relative)))?;
    if !path.starts_with(&root) {
        return Err(VolumeError::SubPathEscape {
            volume: volume.to_owned(),
            sub_path: sub_path.to_owned(),
            resolved: path,
        });
    }
    Ok(SubPath { root, path })
}

/// `path` opened (`O_PATH`) beneath the directory `root`, links followed while they stay there.
fn beneath(root: &OwnedFd, path: &Path) -> Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    openat2(root, path, how)
}

/// Makes directory `name` in `parent` (0755 whatever the umask) and opens it; `None` when
/// something is there already (made meanwhile, or a dangling link).
fn make_dir(parent: &OwnedFd, name: &OsStr) -> Result<Option<OwnedFd>, Errno> {
    match mkdirat(parent, name, Mode::from_bits_truncate(0o755)) {
        Ok(()) => {}
        Err(Errno::EEXIST) => return Ok(None),
        Err(e) => return Err(e),
    }
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
    let fd = openat2(parent, name, how)?;
    fchmod(&fd, Mode::from_bits_truncate(0o755))?;
    Ok(Some(fd))
}

/// The error for a prefix of a subPath that could not be opened beneath its volume.
fn refusal(volume: &str, sub_path: &str, root: &Path, prefix: &Path, errno: Errno) -> VolumeError {
    let at = root.join(prefix);
    if errno != Errno::EXDEV {
        return VolumeError::io(volume, "resolve", at)(errno.into());
    }
    // Where it leads, for the message only.
    match fs::canonicalize(&at) {
        Ok(inside) if inside.starts_with(root) => VolumeError::BadPath {
            volume: volume.to_owned(),
            path: sub_path.to_owned(),
            reason: "goes through an absolute symbolic link (links inside a volume must be relative)",
        },
        resolved => VolumeError::SubPathEscape {
            volume: volume.to_owned(),
            sub_path: sub_path.to_owned(),
            resolved: resolved.unwrap_or(at),
        },
    }
}

/// The value of [`SUB_PATH_ROOTS`] for `roots` (container path → volume), `None` when empty.
pub fn sub_path_annotation(roots: &BTreeMap<String, PathBuf>) -> Option<String> {
    if roots.is_empty() {
        return None;
    }
    let map: serde_json::Map<String, serde_json::Value> =
        roots.iter().map(|(dest, root)| (dest.clone(), root.display().to_string().into())).collect();
    Some(serde_json::Value::Object(map).to_string())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{PermissionsExt, symlink};

    use super::*;

    fn volume() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().expect("tempdir");
        let root = fs::canonicalize(tmp.path()).expect("canonical").join("vol");
        fs::create_dir(&root).expect("mkdir");
        (tmp, root)
    }

    #[test]
    fn sub_paths_resolve_to_real_paths_and_missing_directories_are_made() {
        let (_tmp, root) = volume();
        fs::create_dir_all(root.join("..2026_12_01")).expect("mkdir");
        fs::write(root.join("..2026_12_01/app.conf"), "x").expect("write");
        symlink("..2026_12_01", root.join("..data")).expect("link");
        symlink("..data/app.conf", root.join("app.conf")).expect("link");
        // A configMap key through its relative links: the real file, inside the volume.
        let conf = resolve_sub_path("v", &root, "app.conf").expect("conf");
        assert_eq!(conf, SubPath { root: root.clone(), path: root.join("..2026_12_01/app.conf") });

        let made = resolve_sub_path("v", &root, "logs/web-0/x").expect("made");
        assert_eq!(made.path, root.join("logs/web-0/x"));
        for dir in ["logs", "logs/web-0", "logs/web-0/x"] {
            let meta = fs::symlink_metadata(root.join(dir)).expect("made");
            assert!(meta.is_dir(), "{dir}");
            assert_eq!(meta.permissions().mode() & 0o777, 0o755, "{dir}");
        }
        // Through a relative link to a directory, missing parts are made where it leads.
        symlink("logs", root.join("l")).expect("link");
        let through = resolve_sub_path("v", &root, "l/new").expect("through");
        assert_eq!(through.path, root.join("logs/new"));
        assert!(root.join("logs/new").is_dir());
    }

    #[test]
    fn sub_paths_that_leave_the_volume_are_refused_and_make_nothing_there() {
        let (tmp, root) = volume();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).expect("mkdir");
        symlink(&outside, root.join("out")).expect("link");
        symlink("../outside", root.join("up")).expect("link");
        symlink("/", root.join("slash")).expect("link");
        fs::create_dir(root.join("sub")).expect("mkdir");
        symlink(root.join("sub"), root.join("absolute-inside")).expect("link");
        for path in ["out/new", "up/new", "up", "slash/etc"] {
            let err = resolve_sub_path("v", &root, path).expect_err(path);
            assert!(matches!(err, VolumeError::SubPathEscape { .. }), "{path}: {err}");
            assert!(err.to_string().contains("outside the volume"), "{path}: {err}");
        }
        let err = resolve_sub_path("v", &root, "out/new").expect_err("out");
        assert!(err.to_string().contains(&outside.display().to_string()), "names where it leads: {err}");
        let err = resolve_sub_path("v", &root, "absolute-inside/x").expect_err("absolute");
        assert!(err.to_string().contains("absolute symbolic link"), "{err}");
        assert_eq!(fs::read_dir(&outside).expect("read").count(), 0, "nothing made outside");
        assert!(!root.join("sub/x").exists());
    }

    #[test]
    fn the_annotation_maps_container_paths_to_volumes() {
        assert_eq!(sub_path_annotation(&BTreeMap::new()), None);
        let roots = BTreeMap::from([("/data".to_owned(), PathBuf::from("/pods/u/volumes/cache"))]);
        let value = sub_path_annotation(&roots).expect("annotation");
        let parsed: BTreeMap<String, String> = serde_json::from_str(&value).expect("JSON object");
        assert_eq!(parsed["/data"], "/pods/u/volumes/cache");
    }

    #[test]
    fn expansion_follows_kubernetes_rules() {
        let env: BTreeMap<String, String> =
            [("POD".to_owned(), "web-0".to_owned()), ("NS".to_owned(), "prod".to_owned())].into();
        assert_eq!(expand("logs/$(NS)/$(POD)", &env), "logs/prod/web-0");
        assert_eq!(expand("$(MISSING)/x", &env), "$(MISSING)/x");
        assert_eq!(expand("$$(POD)", &env), "$(POD)");
        assert_eq!(expand("cost$5", &env), "cost$5");
        assert_eq!(expand("open$(POD", &env), "open$(POD");
        assert_eq!(expand("end$", &env), "end$");
    }
}
