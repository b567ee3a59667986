//! Security contexts: the container's effective one (its own fields over the pod's), in CRI
//! form for the sandbox and the container, and the runAsNonRoot check.

use hpk_oci::{KUBELET_MASKED, KUBELET_READONLY};
use k8s_cri::v1::security_profile::ProfileType;
use k8s_cri::v1::{
    Capability, Int64Value, LinuxContainerSecurityContext, LinuxSandboxSecurityContext, NamespaceMode,
    NamespaceOption, SecurityProfile, SupplementalGroupsPolicy,
};
use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext, SeccompProfile, SecurityContext};

use super::{SpecError, pod_display};

fn pod_context(pod: &Pod) -> Option<&PodSecurityContext> {
    pod.spec.as_ref().and_then(|s| s.security_context.as_ref())
}

/// The container's security context with the pod's fields where the container sets none.
pub(super) fn effective(pod: &Pod, container: &Container) -> SecurityContext {
    let mut sc = container.security_context.clone().unwrap_or_default();
    if let Some(pod_sc) = pod_context(pod) {
        sc.run_as_user = sc.run_as_user.or(pod_sc.run_as_user);
        sc.run_as_group = sc.run_as_group.or(pod_sc.run_as_group);
        sc.run_as_non_root = sc.run_as_non_root.or(pod_sc.run_as_non_root);
        sc.seccomp_profile = sc.seccomp_profile.take().or_else(|| pod_sc.seccomp_profile.clone());
        sc.se_linux_options = sc.se_linux_options.take().or_else(|| pod_sc.se_linux_options.clone());
    }
    sc
}

/// The pod's namespaces: the host's where asked, a shared PID namespace with
/// `shareProcessNamespace`, else the container's own.
fn namespace_options(pod: &Pod) -> NamespaceOption {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    let host_pid = spec.and_then(|s| s.host_pid).unwrap_or(false);
    let host_ipc = spec.and_then(|s| s.host_ipc).unwrap_or(false);
    let share_pid = spec.and_then(|s| s.share_process_namespace).unwrap_or(false);
    let pid = match (host_pid, share_pid) {
        (true, _) => NamespaceMode::Node,
        (false, true) => NamespaceMode::Pod,
        (false, false) => NamespaceMode::Container,
    };
    NamespaceOption {
        network: if host_network { NamespaceMode::Node } else { NamespaceMode::Pod } as i32,
        pid: pid as i32,
        ipc: if host_ipc { NamespaceMode::Node } else { NamespaceMode::Pod } as i32,
        ..NamespaceOption::default()
    }
}

/// fsGroup, then the pod's supplementalGroups.
fn supplemental_groups(pod: &Pod) -> (Vec<i64>, i32) {
    let Some(sc) = pod_context(pod) else { return (Vec::new(), 0) };
    let groups = sc.fs_group.into_iter().chain(sc.supplemental_groups.iter().flatten().copied()).collect();
    let policy = match sc.supplemental_groups_policy.as_deref() {
        Some("Strict") => SupplementalGroupsPolicy::Strict,
        _ => SupplementalGroupsPolicy::Merge,
    };
    (groups, policy as i32)
}

/// The container's seccomp profile: what the pod names, and RuntimeDefault (the runtime's
/// copy of containerd's profile) when it names none, as upstream's kubelet does with
/// `--seccomp-default` (review M6). A pod that wants no filter says `Unconfined`.
fn seccomp(profile: Option<&SeccompProfile>) -> SecurityProfile {
    let (kind, localhost_ref) = match profile.map(|p| p.type_.as_str()) {
        None | Some("RuntimeDefault") => (ProfileType::RuntimeDefault, String::new()),
        Some("Localhost") => {
            (ProfileType::Localhost, profile.and_then(|p| p.localhost_profile.clone()).unwrap_or_default())
        }
        // Unconfined, and any type the API server would not have accepted.
        Some(_) => (ProfileType::Unconfined, String::new()),
    };
    SecurityProfile { profile_type: kind as i32, localhost_ref }
}

fn all_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec.iter().flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
}

/// The sandbox's security context: the pod's user, group and groups, its namespaces, and
/// privileged when any container is.
pub(super) fn sandbox_security_context(pod: &Pod) -> LinuxSandboxSecurityContext {
    let sc = pod_context(pod);
    let (supplemental_groups, supplemental_groups_policy) = supplemental_groups(pod);
    LinuxSandboxSecurityContext {
        namespace_options: Some(namespace_options(pod)),
        run_as_user: sc.and_then(|s| s.run_as_user).map(|value| Int64Value { value }),
        run_as_group: sc.and_then(|s| s.run_as_group).map(|value| Int64Value { value }),
        supplemental_groups,
        supplemental_groups_policy,
        privileged: all_containers(pod)
            .any(|c| c.security_context.as_ref().and_then(|s| s.privileged).unwrap_or(false)),
        seccomp: Some(seccomp(sc.and_then(|s| s.seccomp_profile.as_ref()))),
        ..LinuxSandboxSecurityContext::default()
    }
}

/// The container's security context in CRI form. The image's user is the runtime's to apply
/// when neither the container nor the pod sets runAsUser.
pub(super) fn container_security_context(pod: &Pod, container: &Container) -> LinuxContainerSecurityContext {
    let sc = effective(pod, container);
    let (supplemental_groups, supplemental_groups_policy) = supplemental_groups(pod);
    let unmasked = sc.proc_mount.as_deref() == Some("Unmasked");
    let paths =
        |list: &[&str]| if unmasked { Vec::new() } else { list.iter().map(|p| (*p).to_owned()).collect() };
    LinuxContainerSecurityContext {
        capabilities: sc.capabilities.as_ref().map(|c| Capability {
            add_capabilities: c.add.clone().unwrap_or_default(),
            drop_capabilities: c.drop.clone().unwrap_or_default(),
            add_ambient_capabilities: Vec::new(),
        }),
        privileged: sc.privileged.unwrap_or(false),
        namespace_options: Some(namespace_options(pod)),
        run_as_user: sc.run_as_user.map(|value| Int64Value { value }),
        run_as_group: sc.run_as_group.map(|value| Int64Value { value }),
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        supplemental_groups,
        supplemental_groups_policy,
        // Only an explicit allowPrivilegeEscalation: false sets no_new_privs.
        no_new_privs: sc.allow_privilege_escalation == Some(false),
        masked_paths: paths(KUBELET_MASKED),
        readonly_paths: paths(KUBELET_READONLY),
        seccomp: Some(seccomp(sc.seccomp_profile.as_ref())),
        ..LinuxContainerSecurityContext::default()
    }
}

/// runAsNonRoot as the kubelet checks it before creating a container: with an effective
/// runAsNonRoot, refuse runAsUser 0, and with no runAsUser, an image that runs as root (uid 0,
/// user `root`, or no user at all) or as a user given by name. `image_uid` and
/// `image_username` are the image's user as ImageStatus reports it.
pub fn verify_run_as_non_root(
    pod: &Pod,
    container: &Container,
    image_uid: Option<i64>,
    image_username: &str,
) -> Result<(), SpecError> {
    let sc = effective(pod, container);
    if sc.run_as_non_root != Some(true) {
        return Ok(());
    }
    let who = || (pod_display(pod), container.name.clone());
    match (sc.run_as_user, image_uid, image_username) {
        (Some(0), _, _) => {
            let (pod, container) = who();
            Err(SpecError::RunAsUserRoot { pod, container })
        }
        (Some(_), _, _) => Ok(()),
        (None, Some(0), _) | (None, None, "" | "root") => {
            let (pod, container) = who();
            Err(SpecError::ImageRunsAsRoot { pod, container })
        }
        (None, Some(_), _) => Ok(()),
        (None, None, user) => {
            let (pod, container) = who();
            Err(SpecError::NonNumericUser { user: user.to_owned(), pod, container })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri_config::fixtures::pod;
    use serde_json::json;

    fn check(
        container_sc: serde_json::Value,
        pod_sc: serde_json::Value,
        uid: Option<i64>,
        user: &str,
    ) -> Option<String> {
        let p = pod(
            json!({"securityContext": pod_sc, "containers": [{"name": "c", "image": "i", "securityContext": container_sc}]}),
        );
        let c = p.spec.as_ref().expect("spec").containers[0].clone();
        verify_run_as_non_root(&p, &c, uid, user).err().map(|e| e.to_string())
    }

    #[test]
    fn seccomp_is_runtime_default_unless_the_pod_says_otherwise() {
        let kind = |container_sc: serde_json::Value, pod_sc: serde_json::Value| {
            let p = pod(
                json!({"securityContext": pod_sc, "containers": [{"name": "c", "image": "i", "securityContext": container_sc}]}),
            );
            let c = &p.spec.as_ref().expect("spec").containers[0];
            let ctr = container_security_context(&p, c).seccomp.expect("a profile");
            let sandbox = sandbox_security_context(&p).seccomp.expect("a profile");
            (
                ProfileType::try_from(ctr.profile_type).expect("type"),
                ctr.localhost_ref,
                ProfileType::try_from(sandbox.profile_type).expect("type"),
            )
        };
        let unconfined = json!({"seccompProfile": {"type": "Unconfined"}});
        assert_eq!(
            kind(json!({}), json!({})),
            (ProfileType::RuntimeDefault, String::new(), ProfileType::RuntimeDefault)
        );
        assert_eq!(
            kind(json!({}), unconfined.clone()),
            (ProfileType::Unconfined, String::new(), ProfileType::Unconfined)
        );
        assert_eq!(kind(unconfined, json!({})).0, ProfileType::Unconfined, "the container's own choice");
        assert_eq!(
            kind(json!({}), json!({"seccompProfile": {"type": "RuntimeDefault"}})).0,
            ProfileType::RuntimeDefault
        );
        let local = json!({"seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}});
        let (kind, path, _) = kind(local, json!({}));
        assert_eq!((kind, path.as_str()), (ProfileType::Localhost, "p.json"));
    }

    #[test]
    fn without_run_as_non_root_anything_goes() {
        assert_eq!(check(json!({}), json!({}), Some(0), ""), None);
        assert_eq!(check(json!({"runAsNonRoot": false}), json!({"runAsNonRoot": true}), Some(0), ""), None);
    }

    #[test]
    fn run_as_user_zero_breaks_the_policy() {
        let err =
            check(json!({"runAsUser": 0}), json!({"runAsNonRoot": true}), Some(1000), "").expect("root");
        assert_eq!(
            err,
            r#"container's runAsUser breaks non-root policy (pod: "web_default(uid-1)", container: c)"#
        );
        assert_eq!(
            check(json!({"runAsUser": 1000}), json!({"runAsNonRoot": true}), Some(0), ""),
            None,
            "runAsUser wins over the image"
        );
    }

    #[test]
    fn without_run_as_user_the_image_user_decides() {
        let non_root = json!({"runAsNonRoot": true});
        for (uid, user) in [(Some(0), ""), (None, ""), (None, "root")] {
            let err = check(non_root.clone(), json!({}), uid, user).expect("root image");
            assert!(
                err.starts_with("container has runAsNonRoot and image will run as root"),
                "{uid:?} {user}: {err}"
            );
        }
        assert_eq!(check(non_root.clone(), json!({}), Some(65534), ""), None);
        let err = check(non_root, json!({}), None, "nginx").expect("by name");
        assert!(err.starts_with("container has runAsNonRoot and image has non-numeric user (nginx), cannot verify user is non-root"), "{err}");
        assert_eq!(
            check(json!({}), json!({"runAsNonRoot": true, "runAsUser": 1}), None, "nginx"),
            None,
            "the pod's runAsUser counts"
        );
    }
}
