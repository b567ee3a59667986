//! A security context the bubble cannot honour: a runAsUser, runAsGroup, fsGroup or
//! supplementalGroups ID outside the bubble's user namespace. The pod-runtime then runs the
//! container as the bubble's root (see its `runtime/unmapped.rs`) and the volumes stay the
//! bubble user's; the kubelet says so on the pod. It is not a failure.

use k8s_openapi::api::core::v1::{Container, Pod};

use super::security::effective;
use crate::idmap::IdMappings;

/// The Warning event's reason.
pub const NOT_HONOURED_REASON: &str = "SecurityContextNotHonoured";

/// The IDs `container` of `pod` asks for that `ids` does not map, in one message naming
/// each; `None` when all are mapped. `image_uid` is the image's user from ImageStatus, which
/// counts when neither the container nor the pod sets runAsUser.
pub fn not_honoured(
    pod: &Pod,
    container: &Container,
    image_uid: Option<i64>,
    ids: &IdMappings,
    node: &str,
) -> Option<String> {
    let sc = effective(pod, container);
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let unmapped_uid = |id: i64| u32::try_from(id).is_ok_and(|id| !ids.uid_mapped(id));
    let unmapped_gid = |id: &i64| u32::try_from(*id).is_ok_and(|id| !ids.gid_mapped(id));
    let mut items = Vec::new();
    let user = match sc.run_as_user {
        Some(uid) => unmapped_uid(uid).then(|| format!("runAsUser {uid}")),
        None => image_uid.filter(|uid| unmapped_uid(*uid)).map(|uid| format!("the image's user {uid}")),
    };
    items.extend(user.clone());
    let group = sc.run_as_group.filter(unmapped_gid).map(|gid| format!("runAsGroup {gid}"));
    items.extend(group.clone());
    items.extend(pod_sc.and_then(|s| s.fs_group).filter(unmapped_gid).map(|gid| format!("fsGroup {gid}")));
    let groups: Vec<String> = pod_sc
        .and_then(|s| s.supplemental_groups.as_ref())
        .into_iter()
        .flatten()
        .filter(|g| unmapped_gid(g))
        .map(i64::to_string)
        .collect();
    if !groups.is_empty() {
        items.push(format!("supplementalGroups {}", groups.join(", ")));
    }
    if items.is_empty() {
        return None;
    }
    let why = if ids.is_one_id() {
        "its bubble maps one ID (the job's user)".to_owned()
    } else {
        format!("its bubble maps only user IDs {} and group IDs {}", ids.uids, ids.gids)
    };
    let runs = match (user, group) {
        (Some(_), _) => "the container runs as root of the bubble",
        (None, Some(_)) => "the container runs with the bubble's root group",
        (None, None) => "the container runs without those groups",
    };
    let verb = if items.len() == 1 { "is" } else { "are" };
    Some(format!("{} {verb} not honoured on node {node}: {why}; {runs}", join(&items)))
}

/// `a`, `a and b`, `a, b and c`.
fn join(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri_config::fixtures::pod;
    use serde_json::json;

    const ONE: (&str, &str) = ("0 1000 1\n", "0 1000 1\n");
    const SEVERAL: (&str, &str) = ("0 1000 1\n1 100000 65536\n", "0 1000 1\n1 100000 65536\n");

    fn decide(spec: serde_json::Value, image_uid: Option<i64>, maps: (&str, &str)) -> Option<String> {
        let p = pod(spec);
        let c = p.spec.as_ref().expect("spec").containers[0].clone();
        let ids = IdMappings::from_text(maps.0, maps.1).expect("maps");
        not_honoured(&p, &c, image_uid, &ids, "node2")
    }

    #[test]
    fn one_id_names_each_id_that_is_not_honoured() {
        let spec = json!({"containers": [{"name": "c", "securityContext": {"runAsUser": 1000}}]});
        assert_eq!(
            decide(spec, Some(0), ONE).as_deref(),
            Some(
                "runAsUser 1000 is not honoured on node node2: its bubble maps one ID (the job's user); \
                 the container runs as root of the bubble"
            )
        );
        let spec = json!({
            "securityContext": {"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000, "supplementalGroups": [0, 4000, 5000]},
            "containers": [{"name": "c"}]});
        let message = decide(spec, None, ONE).expect("not honoured");
        assert!(
            message.starts_with(
                "runAsUser 1000, runAsGroup 3000, fsGroup 2000 and supplementalGroups 4000, 5000 are not honoured on node node2"
            ),
            "{message}"
        );
    }

    #[test]
    fn the_image_user_counts_without_run_as_user() {
        let spec = json!({"containers": [{"name": "c"}]});
        let message = decide(spec.clone(), Some(101), ONE).expect("nginx's user");
        assert!(message.starts_with("the image's user 101 is not honoured"), "{message}");
        assert_eq!(decide(spec.clone(), Some(0), ONE), None, "a root image is fine");
        assert_eq!(decide(spec, None, ONE), None, "an image user by name is the runtime's to resolve");
    }

    #[test]
    fn mapped_ids_give_no_event() {
        let spec = json!({
            "securityContext": {"runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000, "supplementalGroups": [4000]},
            "containers": [{"name": "c", "securityContext": {"runAsUser": 65534}}]});
        assert_eq!(decide(spec, Some(50000), SEVERAL), None);
        let root =
            json!({"securityContext": {"runAsUser": 0, "runAsGroup": 0}, "containers": [{"name": "c"}]});
        assert_eq!(decide(root, Some(1000), ONE), None, "runAsUser 0 wins over the image and is mapped");
    }

    #[test]
    fn several_ids_name_the_range_and_what_is_lost() {
        let spec = json!({"securityContext": {"fsGroup": 100000}, "containers": [{"name": "c",
            "securityContext": {"runAsUser": 1000}}]});
        assert_eq!(
            decide(spec, None, SEVERAL).as_deref(),
            Some(
                "fsGroup 100000 is not honoured on node node2: its bubble maps only user IDs 0, 1-65536 \
                 and group IDs 0, 1-65536; the container runs without those groups"
            )
        );
    }
}
