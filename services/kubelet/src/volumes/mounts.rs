//! A container's volumeMounts as CRI mounts: the source on the host, the subPath inside it
//! (checked not to leave the volume), read-only and mount propagation.

use std::collections::BTreeMap;
use std::fs::{self, DirBuilder, Permissions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, VolumeMount};

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

/// The real path of `sub_path` inside the volume at `base`, creating missing directories (0755)
/// on the way, as the kubelet does. Refuses absolute paths, `..`, and any symlink that leads
/// out of the volume.
pub fn resolve_sub_path(volume: &str, base: &Path, sub_path: &str) -> Result<PathBuf, VolumeError> {
    let bad = |reason| VolumeError::BadPath { volume: volume.to_owned(), path: sub_path.to_owned(), reason };
    let relative = Path::new(sub_path);
    if relative.is_absolute() {
        return Err(bad("must be relative, not absolute"));
    }
    if relative.components().any(|c| c == Component::ParentDir) {
        return Err(bad("must not contain '..'"));
    }
    let root = fs::canonicalize(base).map_err(VolumeError::io(volume, "resolve", base))?;
    let escape = |resolved: PathBuf| VolumeError::SubPathEscape {
        volume: volume.to_owned(),
        sub_path: sub_path.to_owned(),
        resolved,
    };
    let mut current = root.clone();
    for part in relative.components() {
        let Component::Normal(part) = part else { continue };
        let next = current.join(part);
        match fs::symlink_metadata(&next) {
            Ok(_) => {
                let real = fs::canonicalize(&next).map_err(VolumeError::io(volume, "resolve", &next))?;
                if !real.starts_with(&root) {
                    return Err(escape(real));
                }
                current = real;
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                DirBuilder::new()
                    .mode(0o755)
                    .create(&next)
                    .map_err(VolumeError::io(volume, "create", &next))?;
                fs::set_permissions(&next, Permissions::from_mode(0o755))
                    .map_err(VolumeError::io(volume, "chmod", &next))?;
                current = next;
            }
            Err(e) => return Err(VolumeError::io(volume, "inspect", &next)(e)),
        }
    }
    Ok(current)
}

#[cfg(test)]
mod tests {
    use super::*;

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
