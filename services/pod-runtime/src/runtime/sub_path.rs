//! Which of a container's mounts are pinned before crun sees them (see
//! [`crate::engine::sub_path`]), where their staging points live, and their removal.
//!
//! A mount is pinned when its source lies inside a tree a container may change:
//! - the kubelet names the volume of each subPath mount in the container annotation
//!   [`SUB_PATH_ROOTS`], a JSON object from the mount's container path to the real path of its
//!   volume (`{"/data": "/…/pods/<uid>/volumes/cache"}`); the mount's host path must lie
//!   inside that volume, and the rest of it is resolved beneath it without following links (the
//!   kubelet has resolved the links it allows already, so a link found now is a swap);
//! - a source under this runtime's `pod-files/<pod uid>/` (connector mode: the copies a remote
//!   kubelet stored, nested by key, so an emptyDir's copy holds its subPath copies) is resolved
//!   beneath `pod-files/<pod uid>`.
//!
//! Staging points are `<container dir>/sub-paths/<n>`, `n` the mount's index in the config:
//! only the runtime writes there. They are unmounted and removed with the container, and by
//! recovery when a container is dropped.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use k8s_cri::v1 as cri;
use tracing::warn;

use super::{Error, Result};
use crate::engine::sub_path::{Beneath, open_beneath, unpin};
use crate::engine::{self, Mount};

/// The container annotation that names the volume of each subPath mount (see the module doc).
pub const SUB_PATH_ROOTS: &str = "hpk.io/sub-path-roots";

/// The directory of a container's staging points.
const STAGING: &str = "sub-paths";

/// A mount's source, opened beneath its volume and held until it is pinned.
#[derive(Debug)]
pub(crate) struct Held {
    /// The mount's index in the container config.
    index: usize,
    source: Beneath,
}

impl Held {
    /// The mount's index in the container config.
    pub(crate) fn index(&self) -> usize {
        self.index
    }
}

/// Opens, beneath their volumes, the sources of the mounts of `config` that are pinned
/// (`pod_files`: this runtime's directory of remote pods' files). Nothing is mounted yet; a
/// missing directory of a subPath is made, as the kubelet makes it. Fails with the first
/// source that cannot be opened.
pub(crate) fn hold(config: &cri::ContainerConfig, pod_files: &Path) -> Result<Vec<Held>> {
    let roots = roots_of(config)?;
    let mut held = Vec::new();
    for (index, mount) in config.mounts.iter().enumerate() {
        let host = Path::new(&mount.host_path);
        let split = match roots.get(&mount.container_path) {
            Some(root) => Some(split(host, Path::new(root), &mount.container_path)?),
            None => under_pod_files(host, pod_files),
        };
        let Some((root, relative)) = split else { continue };
        let source = open_beneath(&root, &relative)?;
        held.push(Held { index, source });
    }
    Ok(held)
}

/// Pins each held source onto its staging point and makes its mount (`mounts[index]`) name
/// that point. On error, whatever was pinned is released again.
pub(crate) fn pin(dir: &Path, held: Vec<Held>, mounts: &mut [Mount]) -> Result<()> {
    if held.is_empty() {
        return Ok(());
    }
    let staging = dir.join(STAGING);
    let pinned = (|| {
        std::fs::create_dir_all(&staging).map_err(|e| Error::io("create", &staging, e))?;
        for Held { index, source } in held {
            let point = staging.join(index.to_string());
            source.pin(&point)?;
            if let Some(mount) = mounts.get_mut(index) {
                mount.host = point;
            }
        }
        Ok(())
    })();
    if pinned.is_err() {
        let _ = release(dir);
    }
    pinned
}

/// Unmounts and removes the staging points of the container whose directory is `dir`; none
/// is fine. An error leaves the rest in place, so the directory must not be removed then.
pub(crate) fn release(dir: &Path) -> Result<()> {
    let staging = dir.join(STAGING);
    let entries = match std::fs::read_dir(&staging) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("list", &staging, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("list", &staging, e))?;
        unpin(&entry.path())?;
    }
    std::fs::remove_dir(&staging).map_err(|e| Error::io("remove", &staging, e))
}

/// Removes a container's directory once its staging points are gone; if they cannot be
/// released, the directory stays (removing it would reach into the volumes) and that is logged.
pub(crate) fn remove_container_dir(dir: &Path) -> Result<()> {
    if let Err(e) = release(dir) {
        warn!(dir = %dir.display(), error = %e, "subPath mounts not released; the container's directory stays");
        return Err(e);
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io("remove", dir, e)),
        _ => Ok(()),
    }
}

/// The annotation's map from container path to volume.
fn roots_of(config: &cri::ContainerConfig) -> Result<HashMap<String, String>> {
    let Some(text) = config.annotations.get(SUB_PATH_ROOTS) else { return Ok(HashMap::new()) };
    let roots: HashMap<String, String> = serde_json::from_str(text).map_err(|e| {
        Error::Invalid(format!("annotation {SUB_PATH_ROOTS}: not a JSON object of paths: {e}"))
    })?;
    for (dest, root) in &roots {
        if !config.mounts.iter().any(|m| &m.container_path == dest) {
            return Err(Error::Invalid(format!(
                "annotation {SUB_PATH_ROOTS} names {dest:?}, which is no mount of the container"
            )));
        }
        if !Path::new(root).is_absolute() {
            return Err(Error::Invalid(format!(
                "annotation {SUB_PATH_ROOTS}: the volume of {dest:?} must be an absolute path, not {root:?}"
            )));
        }
    }
    Ok(roots)
}

/// `host` as (volume, path inside it); `host` must lie inside `root`.
fn split(host: &Path, root: &Path, dest: &str) -> Result<(PathBuf, PathBuf)> {
    let relative = host.strip_prefix(root).map_err(|_| {
        Error::Invalid(format!(
            "mount {dest:?}: source {} is not inside its volume {} ({SUB_PATH_ROOTS})",
            host.display(),
            root.display()
        ))
    })?;
    if relative.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(
            engine::Error::PathEscapes { path: host.display().to_string(), base: root.to_owned() }.into()
        );
    }
    Ok((root.to_owned(), relative.to_owned()))
}

/// `host` as (`pod_files/<uid>`, the rest) when it lies below a pod's stored files.
fn under_pod_files(host: &Path, pod_files: &Path) -> Option<(PathBuf, PathBuf)> {
    let rest = host.strip_prefix(pod_files).ok()?;
    let mut parts = rest.components();
    let Some(Component::Normal(uid)) = parts.next() else { return None };
    let relative = parts.as_path();
    (!relative.as_os_str().is_empty()).then(|| (pod_files.join(uid), relative.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(mounts: &[(&str, &str)], roots: Option<&str>) -> cri::ContainerConfig {
        cri::ContainerConfig {
            mounts: mounts
                .iter()
                .map(|(dest, host)| cri::Mount {
                    container_path: (*dest).to_owned(),
                    host_path: (*host).to_owned(),
                    ..Default::default()
                })
                .collect(),
            annotations: roots.map(|r| (SUB_PATH_ROOTS.to_owned(), r.to_owned())).into_iter().collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_annotation_and_pod_files_say_which_mounts_are_held() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let vol = tmp.path().join("vol");
        std::fs::create_dir_all(vol.join("d/x")).expect("mkdir");
        let pod_files = tmp.path().join("pod-files");
        std::fs::create_dir_all(pod_files.join("uid1/volumes/cache/sub")).expect("mkdir");
        let sub = vol.join("d/x");
        let stored = pod_files.join("uid1/volumes/cache/sub");
        let roots = serde_json::json!({"/data": vol}).to_string();
        let plain = tmp.path().display().to_string();
        let c = config(
            &[
                ("/data", sub.to_str().expect("utf-8")),
                ("/plain", &plain),
                ("/remote", stored.to_str().expect("utf-8")),
            ],
            Some(&roots),
        );
        let held = hold(&c, &pod_files).expect("held");
        let indices: Vec<usize> = held.iter().map(|h| h.index).collect();
        assert_eq!(indices, [0, 2], "the subPath mount and the stored copy, not the plain mount");
        assert!(held.iter().all(|h| h.source.is_dir()));
    }

    #[test]
    fn bad_annotations_are_refused_with_what_is_wrong() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let pod_files = tmp.path().join("pod-files");
        let cases = [
            (config(&[("/data", "/vol/x")], Some("not json")), "not a JSON object"),
            (config(&[("/data", "/vol/x")], Some(r#"{"/other": "/vol"}"#)), "no mount of the container"),
            (config(&[("/data", "/vol/x")], Some(r#"{"/data": "vol"}"#)), "must be an absolute path"),
            (config(&[("/data", "/elsewhere/x")], Some(r#"{"/data": "/vol"}"#)), "is not inside its volume"),
            (config(&[("/data", "/vol/a/../../etc")], Some(r#"{"/data": "/vol"}"#)), "escapes"),
        ];
        for (c, expected) in cases {
            let err = hold(&c, &pod_files).expect_err(expected);
            assert!(err.to_string().contains(expected), "{expected}: {err}");
            assert!(matches!(tonic::Status::from(err).code(), tonic::Code::InvalidArgument));
        }
    }

    #[test]
    fn a_swapped_link_is_refused_before_anything_is_mounted() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let vol = tmp.path().join("vol");
        std::fs::create_dir(&vol).expect("mkdir");
        std::os::unix::fs::symlink("/", vol.join("d")).expect("link");
        let roots = serde_json::json!({"/data": vol}).to_string();
        let c = config(&[("/data", vol.join("d/etc").to_str().expect("utf-8"))], Some(&roots));
        let err = hold(&c, &tmp.path().join("pod-files")).expect_err("link");
        assert!(err.to_string().contains("\"d\" is a symbolic link"), "{err}");
        assert_eq!(tonic::Status::from(err).code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn releasing_nothing_is_fine_and_a_dir_without_mounts_goes() {
        // The runtime always holds CAP_SYS_ADMIN over its mount namespace (it mounts overlays);
        // without it, unmounting even a point that is no mount says EPERM, not EINVAL.
        if !nix::unistd::geteuid().is_root() {
            hpk_test_support::skip("unmounting needs CAP_SYS_ADMIN");
            return;
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("ctr");
        std::fs::create_dir_all(dir.join(STAGING).join("0")).expect("mkdir");
        std::fs::write(dir.join(STAGING).join("1"), "").expect("file point");
        remove_container_dir(&dir).expect("removed");
        assert!(!dir.exists());
        release(&dir).expect("nothing to release");
    }

    #[test]
    fn a_staging_point_with_content_is_never_removed_through() {
        // What an unmount that did not happen would look like: the volume's files under it.
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("ctr");
        std::fs::create_dir_all(dir.join(STAGING).join("0")).expect("mkdir");
        std::fs::write(dir.join(STAGING).join("0/precious"), "keep").expect("write");
        assert!(remove_container_dir(&dir).is_err());
        assert_eq!(std::fs::read_to_string(dir.join(STAGING).join("0/precious")).expect("kept"), "keep");
    }
}
