//! The ContainerConfig: what to run, with which environment, mounts, log, labels, resources
//! and security context.

use std::collections::HashMap;

use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ImageSpec, KeyValue, LinuxContainerConfig, LinuxContainerResources,
    Mount,
};
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::env::ResolvedEnv;
use super::expand::expand;
use super::{SpecError, security};
use crate::quantity;

/// The CFS period the kubelet gives every container, in microseconds.
const CPU_PERIOD: i64 = 100_000;
/// The smallest CFS quota the kernel takes, in microseconds.
const MIN_CPU_QUOTA: i64 = 1000;
/// The fewest CPU shares a container gets (also those of one with no CPU request).
const MIN_CPU_SHARES: i64 = 2;

/// The ContainerConfig for `container` of `pod`: `image` is the resolved reference (the one
/// the runtime pulled), `mounts` the volume mounts already made, `attempt` the container's
/// attempt (its log is `<name>/<attempt>.log` in the sandbox's log directory).
pub fn container_config(
    pod: &Pod,
    container: &Container,
    env: &ResolvedEnv,
    mounts: Vec<Mount>,
    image: &str,
    attempt: u32,
    restart_count: u32,
) -> Result<ContainerConfig, SpecError> {
    let vars = env.to_map();
    let lookup = |name: &str| vars.get(name).cloned();
    let expand_all =
        |list: &Option<Vec<String>>| list.iter().flatten().map(|s| expand(s, &lookup)).collect::<Vec<_>>();
    let meta = &pod.metadata;
    let mut labels = HashMap::new();
    labels.insert("io.kubernetes.container.name".to_owned(), container.name.clone());
    labels.insert("io.kubernetes.pod.name".to_owned(), meta.name.clone().unwrap_or_default());
    labels.insert("io.kubernetes.pod.namespace".to_owned(), meta.namespace.clone().unwrap_or_default());
    labels.insert("io.kubernetes.pod.uid".to_owned(), meta.uid.clone().unwrap_or_default());

    Ok(ContainerConfig {
        metadata: Some(ContainerMetadata { name: container.name.clone(), attempt }),
        image: Some(ImageSpec {
            image: image.to_owned(),
            user_specified_image: container.image.clone().unwrap_or_default(),
            ..ImageSpec::default()
        }),
        command: expand_all(&container.command),
        args: expand_all(&container.args),
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs: env
            .vars
            .iter()
            .map(|(key, value)| KeyValue { key: key.clone(), value: value.clone() })
            .collect(),
        mounts,
        labels,
        annotations: annotations(pod, container, restart_count),
        log_path: format!("{}/{attempt}.log", container.name),
        stdin: container.stdin.unwrap_or(false),
        stdin_once: container.stdin_once.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
        linux: Some(LinuxContainerConfig {
            resources: Some(resources(container)?),
            security_context: Some(security::container_security_context(pod, container)),
        }),
        ..ContainerConfig::default()
    })
}

/// What the kubelet records on a container to find its way back after a restart.
fn annotations(pod: &Pod, container: &Container, restart_count: u32) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut put = |key: &str, value: String| out.insert(format!("io.kubernetes.{key}"), value);
    put("container.restartCount", restart_count.to_string());
    put(
        "container.terminationMessagePath",
        container.termination_message_path.clone().unwrap_or_else(|| "/dev/termination-log".into()),
    );
    put(
        "container.terminationMessagePolicy",
        container.termination_message_policy.clone().unwrap_or_else(|| "File".into()),
    );
    if let Some(grace) = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds) {
        put("pod.terminationGracePeriod", grace.to_string());
    }
    if let Some(ports) = container.ports.as_ref().filter(|p| !p.is_empty())
        && let Ok(json) = serde_json::to_string(ports)
    {
        put("container.ports", json);
    }
    if let Some(pre_stop) = container.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref())
        && let Ok(json) = serde_json::to_string(pre_stop)
    {
        put("container.preStopHandler", json);
    }
    out
}

/// CPU shares from the request (the limit when only that is set), CFS quota from the limit,
/// memory limit from the limit, as the kubelet computes them.
pub fn resources(container: &Container) -> Result<LinuxContainerResources, SpecError> {
    let get = |limits: bool, name: &str| -> Option<&Quantity> {
        let r = container.resources.as_ref()?;
        if limits { r.limits.as_ref()?.get(name) } else { r.requests.as_ref()?.get(name) }
    };
    let parse = |limits: bool, name: &str, cpu: bool| -> Result<i64, SpecError> {
        let Some(q) = get(limits, name) else { return Ok(0) };
        let value = if cpu { quantity::millicores(q) } else { quantity::units(q) };
        value.map_err(|source| SpecError::Quantity {
            container: container.name.clone(),
            resource: format!("{}.{name}", if limits { "limits" } else { "requests" }),
            source,
        })
    };
    let cpu_limit = parse(true, "cpu", true)?;
    let cpu_request = match parse(false, "cpu", true)? {
        0 => cpu_limit,
        request => request,
    };
    let cpu_shares = (cpu_request.saturating_mul(1024) / 1000).max(MIN_CPU_SHARES);
    let cpu_quota = match cpu_limit.saturating_mul(CPU_PERIOD) / 1000 {
        0 => 0,
        quota => quota.max(MIN_CPU_QUOTA),
    };
    Ok(LinuxContainerResources {
        cpu_period: CPU_PERIOD,
        cpu_quota,
        cpu_shares,
        memory_limit_in_bytes: parse(true, "memory", false)?,
        ..LinuxContainerResources::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri_config::fixtures::pod;
    use serde_json::json;

    fn build(container: serde_json::Value, pod_extra: serde_json::Value) -> ContainerConfig {
        let mut spec = pod_extra;
        spec["containers"] = json!([container]);
        let p = pod(spec);
        let c = p.spec.as_ref().expect("spec").containers[0].clone();
        let env = ResolvedEnv {
            vars: vec![("WHO".into(), "world".into()), ("PORT".into(), "8080".into())],
            ..ResolvedEnv::default()
        };
        let mounts =
            vec![Mount { container_path: "/data".into(), host_path: "/v/data".into(), ..Mount::default() }];
        container_config(&p, &c, &env, mounts, "registry.local/app@sha256:abc", 1, 4).expect("config")
    }

    fn security(
        container: serde_json::Value,
        pod_sc: serde_json::Value,
    ) -> k8s_cri::v1::LinuxContainerSecurityContext {
        build(container, json!({"securityContext": pod_sc}))
            .linux
            .and_then(|l| l.security_context)
            .expect("security context")
    }

    #[test]
    fn identity_command_env_and_log() {
        let c = build(
            json!({"name": "app", "image": "app:1", "command": ["/bin/serve", "--port=$(PORT)"],
                   "args": ["hello $(WHO)", "$$(WHO)", "$(NOPE)"], "workingDir": "/srv", "stdin": true, "tty": true,
                   "terminationMessagePath": "/tmp/msg"}),
            json!({"terminationGracePeriodSeconds": 45}),
        );
        assert_eq!(c.metadata.as_ref().map(|m| (m.name.as_str(), m.attempt)), Some(("app", 1)));
        let image = c.image.as_ref().expect("image");
        assert_eq!(
            (image.image.as_str(), image.user_specified_image.as_str()),
            ("registry.local/app@sha256:abc", "app:1")
        );
        assert_eq!(c.command, ["/bin/serve", "--port=8080"]);
        assert_eq!(c.args, ["hello world", "$(WHO)", "$(NOPE)"]);
        assert_eq!(c.working_dir, "/srv");
        assert_eq!(
            c.envs.iter().map(|kv| (kv.key.as_str(), kv.value.as_str())).collect::<Vec<_>>(),
            [("WHO", "world"), ("PORT", "8080")]
        );
        assert_eq!(c.mounts.len(), 1);
        assert_eq!(c.log_path, "app/1.log");
        assert!(c.stdin && c.tty && !c.stdin_once);
        assert_eq!(c.labels["io.kubernetes.container.name"], "app");
        assert_eq!(c.labels["io.kubernetes.pod.uid"], "uid-1");
        assert_eq!(c.annotations["io.kubernetes.container.restartCount"], "4");
        assert_eq!(c.annotations["io.kubernetes.container.terminationMessagePath"], "/tmp/msg");
        assert_eq!(c.annotations["io.kubernetes.pod.terminationGracePeriod"], "45");
    }

    fn resources(r: serde_json::Value) -> LinuxContainerResources {
        build(json!({"name": "c", "image": "i", "resources": r}), json!({}))
            .linux
            .and_then(|l| l.resources)
            .expect("resources")
    }

    #[test]
    fn resources_follow_the_kubelet_arithmetic() {
        let r = resources(json!({"limits": {"cpu": "500m", "memory": "64Mi"}, "requests": {"cpu": "250m"}}));
        assert_eq!(
            (r.cpu_quota, r.cpu_period, r.cpu_shares, r.memory_limit_in_bytes),
            (50_000, 100_000, 256, 67_108_864)
        );
        let r = resources(json!({"limits": {"cpu": "2"}}));
        assert_eq!((r.cpu_quota, r.cpu_shares), (200_000, 2048), "the request defaults to the limit");
        let r = resources(json!({}));
        assert_eq!((r.cpu_quota, r.cpu_shares, r.memory_limit_in_bytes), (0, 2, 0), "best effort");
        let r = resources(json!({"limits": {"cpu": "1m"}, "requests": {"cpu": "1m"}}));
        assert_eq!((r.cpu_quota, r.cpu_shares), (1000, 2), "kernel minimums");
        let p = pod(
            json!({"containers": [{"name": "c", "image": "i", "resources": {"limits": {"memory": "lots"}}}]}),
        );
        let c = p.spec.as_ref().expect("spec").containers[0].clone();
        let err =
            container_config(&p, &c, &ResolvedEnv::default(), vec![], "i", 0, 0).expect_err("bad quantity");
        assert_eq!(err.to_string(), r#"container c: limits.memory: invalid quantity "lots""#);
    }

    #[test]
    fn the_container_security_context_overrides_the_pod_one() {
        let sc = security(
            json!({"name": "c", "image": "i", "securityContext": {"runAsUser": 1001, "readOnlyRootFilesystem": true,
                   "allowPrivilegeEscalation": false, "capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}}}),
            json!({"runAsUser": 1000, "runAsGroup": 3000, "supplementalGroups": [5], "fsGroup": 7}),
        );
        assert_eq!(sc.run_as_user.map(|v| v.value), Some(1001), "container over pod");
        assert_eq!(sc.run_as_group.map(|v| v.value), Some(3000), "the pod's where the container sets none");
        assert!(sc.readonly_rootfs && sc.no_new_privs && !sc.privileged);
        let caps = sc.capabilities.expect("capabilities");
        assert_eq!(
            (caps.add_capabilities, caps.drop_capabilities),
            (vec!["NET_ADMIN".to_owned()], vec!["ALL".to_owned()])
        );
        assert_eq!(sc.supplemental_groups, [7, 5]);
        assert!(sc.masked_paths.contains(&"/proc/kcore".to_owned()));
        assert!(sc.run_as_username.is_empty(), "the image's user is the runtime's to apply");
    }

    #[test]
    fn defaults_leave_the_user_to_the_image_and_privilege_escalation_allowed() {
        let sc = security(json!({"name": "c", "image": "i"}), json!({}));
        assert_eq!(sc.run_as_user, None);
        assert!(!sc.no_new_privs && !sc.readonly_rootfs && sc.capabilities.is_none());
        let sc = security(
            json!({"name": "c", "image": "i", "securityContext": {"privileged": true, "procMount": "Unmasked"}}),
            json!({}),
        );
        assert!(sc.privileged && sc.masked_paths.is_empty());
    }
}
