//! Who may read a volume's files: `spec.securityContext.fsGroup` makes the pod's volumes
//! (emptyDir, configMap, secret, downwardAPI, projected) group-owned by that group and group
//! readable (writable for emptyDir), with setgid directories so that new files inherit the
//! group, as the kubelet's SetVolumeOwnership does. A projected token is also owned by the
//! user all the pod's containers run as, when they agree on one.
//!
//! A bubble that maps one ID has no such group or user: chown to it fails (EINVAL). The
//! fsGroup is then not enforced, and said so (`not_enforced`, shown as an event): the files
//! stay the bubble user's, who is root in the containers (the runtime runs them as root when
//! their own user is not mapped either), so they can still read and write them.

use std::io::ErrorKind;
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use tracing::warn;

use super::{VolumeContext, VolumeError};

/// Added to the mode of files in read-only volumes when the pod has an fsGroup.
pub const READ_ONLY_GROUP_BITS: u32 = 0o440;
/// Added to the mode of directories when the pod has an fsGroup: setgid and traversable.
pub const DIR_GROUP_BITS: u32 = 0o2110;

/// The pod's `fsGroup`.
pub fn fs_group(pod: &Pod) -> Option<u32> {
    let group = pod.spec.as_ref()?.security_context.as_ref()?.fs_group?;
    u32::try_from(group).ok()
}

/// The user every container of the pod (init containers included) runs as, when they all set
/// the same one (directly or through the pod's securityContext).
pub fn fs_user(pod: &Pod) -> Option<u32> {
    let spec = pod.spec.as_ref()?;
    let pod_user = spec.security_context.as_ref().and_then(|s| s.run_as_user);
    let mut users = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(|c| c.security_context.as_ref().and_then(|s| s.run_as_user).or(pod_user));
    let first = users.next()??;
    if users.all(|u| u == Some(first)) { u32::try_from(first).ok() } else { None }
}

/// The pod's `fsGroup` where the bubble maps it: the group volumes are given.
pub fn fs_group_in(pod: &Pod, ctx: &VolumeContext) -> Option<u32> {
    fs_group(pod).filter(|gid| ctx.ids.as_ref().is_none_or(|ids| ids.gid_mapped(*gid)))
}

/// [`fs_user`] where the bubble maps it: the owner of projected tokens.
pub fn fs_user_in(pod: &Pod, ctx: &VolumeContext) -> Option<u32> {
    fs_user(pod).filter(|uid| ctx.ids.as_ref().is_none_or(|ids| ids.uid_mapped(*uid)))
}

/// The pod's fsGroup when the bubble does not map it, in words.
pub fn not_enforced(pod: &Pod, ctx: &VolumeContext) -> Option<String> {
    let (gid, ids) = (fs_group(pod)?, ctx.ids.as_ref()?);
    if ids.gid_mapped(gid) {
        return None;
    }
    let why = if ids.is_one_id() {
        "this bubble maps one ID (the job's user)".to_owned()
    } else {
        format!("this bubble maps only group IDs {}", ids.gids)
    };
    Some(format!(
        "fsGroup {gid} is not enforced: {why}; the pod's volumes stay owned by the bubble's user, root in its containers"
    ))
}

/// Changes the owner of `path` (not following a symlink). Without the privilege to do so (a
/// rootless node), or for an ID the bubble does not map (EINVAL), it warns and goes on: the
/// content is there, only its owner is not.
pub fn chown(volume: &str, path: &Path, user: Option<u32>, group: Option<u32>) -> Result<(), VolumeError> {
    if user.is_none() && group.is_none() {
        return Ok(());
    }
    match std::os::unix::fs::lchown(path, user, group) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::PermissionDenied => {
            warn!(volume, path = %path.display(), ?user, ?group, "no permission to change the owner; left as is");
            Ok(())
        }
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            warn!(volume, path = %path.display(), ?user, ?group, "owner not mapped in this bubble; left as is");
            Ok(())
        }
        Err(e) => Err(VolumeError::io(volume, "change the owner of", path)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(security: serde_json::Value, containers: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"securityContext": security, "containers": containers},
        }))
        .expect("pod")
    }

    #[test]
    fn fs_user_is_the_user_all_containers_share() {
        let both = serde_json::json!([{"name": "a"}, {"name": "b"}]);
        assert_eq!(fs_user(&pod(serde_json::json!({"runAsUser": 1000}), both.clone())), Some(1000));
        assert_eq!(fs_user(&pod(serde_json::json!({}), both)), None, "nobody says");
        let mixed = serde_json::json!([{"name": "a"}, {"name": "b", "securityContext": {"runAsUser": 7}}]);
        assert_eq!(fs_user(&pod(serde_json::json!({"runAsUser": 1000}), mixed)), None, "they differ");
        let agree = serde_json::json!([{"name": "a", "securityContext": {"runAsUser": 7}},
                                       {"name": "b", "securityContext": {"runAsUser": 7}}]);
        assert_eq!(fs_user(&pod(serde_json::json!({}), agree)), Some(7));
        assert_eq!(fs_group(&pod(serde_json::json!({"fsGroup": 2000}), serde_json::json!([]))), Some(2000));
    }

    fn bubble(map: &str) -> VolumeContext {
        let ids = crate::idmap::IdMappings::from_text(map, map).expect("maps");
        VolumeContext { ids: Some(ids), ..Default::default() }
    }

    #[test]
    fn an_unmapped_fs_group_is_not_applied_and_said_so() {
        let p =
            pod(serde_json::json!({"fsGroup": 2000, "runAsUser": 1000}), serde_json::json!([{"name": "a"}]));
        let one = bubble("0 1000 1");
        assert_eq!((fs_group_in(&p, &one), fs_user_in(&p, &one)), (None, None));
        assert_eq!(
            not_enforced(&p, &one).as_deref(),
            Some(
                "fsGroup 2000 is not enforced: this bubble maps one ID (the job's user); the pod's volumes \
                 stay owned by the bubble's user, root in its containers"
            )
        );
        let several = bubble("0 1000 1\n1 100000 65536");
        assert_eq!((fs_group_in(&p, &several), fs_user_in(&p, &several)), (Some(2000), Some(1000)));
        assert_eq!(not_enforced(&p, &several), None);
        let unknown = VolumeContext::default();
        assert_eq!((fs_group_in(&p, &unknown), not_enforced(&p, &unknown)), (Some(2000), None));
    }
}
