//! From the names in a request path to what the runtime has: the pod (as the kubelet last saw
//! it from the API), its ready sandbox, a container of it.

use std::sync::Arc;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;

use super::ApiError;
use crate::pods::{Context, lock};

/// The pod `namespace/name` bound to this node (and with `uid`, when the path gives one).
pub fn pod(ctx: &Context, namespace: &str, name: &str, uid: Option<&str>) -> Result<Arc<Pod>, ApiError> {
    lock(&ctx.pods)
        .values()
        .find(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.name.as_deref() == Some(name)
                && uid.is_none_or(|u| p.metadata.uid.as_deref() == Some(u))
        })
        .cloned()
        .ok_or_else(|| {
            ApiError::not_found(format!("pod {namespace}/{name} not found on node {}", ctx.node_name))
        })
}

/// Checks `container` is one of the pod's (regular, init or ephemeral).
pub fn check_container(pod: &Pod, container: &str) -> Result<(), ApiError> {
    let spec = pod.spec.as_ref();
    let known = spec.is_some_and(|s| {
        s.containers.iter().any(|c| c.name == container)
            || s.init_containers.iter().flatten().any(|c| c.name == container)
            || s.ephemeral_containers.iter().flatten().any(|c| c.name == container)
    });
    if known {
        Ok(())
    } else {
        Err(ApiError::not_found(format!(
            "container {container} is not valid for pod {}",
            pod.metadata.name.as_deref().unwrap_or_default()
        )))
    }
}

/// The pod's UID.
pub fn uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// The pod's containers named `name` the runtime has, newest attempt first.
pub async fn containers(ctx: &Context, pod_uid: &str, name: &str) -> Result<Vec<cri::Container>, ApiError> {
    let filter = cri::ContainerFilter {
        label_selector: [
            ("io.kubernetes.pod.uid".to_owned(), pod_uid.to_owned()),
            ("io.kubernetes.container.name".to_owned(), name.to_owned()),
        ]
        .into(),
        ..cri::ContainerFilter::default()
    };
    let mut runtime = ctx.cri.runtime.clone();
    let mut found = runtime
        .list_containers(cri::ListContainersRequest { filter: Some(filter) })
        .await
        .map_err(|e| ApiError::unavailable(format!("the runtime did not answer: {}", e.message())))?
        .into_inner()
        .containers;
    found.sort_by_key(|c| std::cmp::Reverse((c.metadata.as_ref().map_or(0, |m| m.attempt), c.created_at)));
    Ok(found)
}

/// The pod's running container `name`, for exec and attach.
pub async fn running_container(ctx: &Context, pod: &Pod, name: &str) -> Result<String, ApiError> {
    check_container(pod, name)?;
    let found = containers(ctx, &uid(pod), name).await?;
    found
        .iter()
        .find(|c| c.state() == cri::ContainerState::ContainerRunning)
        .map(|c| c.id.clone())
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "container {name} in pod {} is not running",
                pod.metadata.name.as_deref().unwrap_or_default()
            ))
        })
}

/// The pod's ready sandbox, for port-forward.
pub async fn ready_sandbox(ctx: &Context, pod: &Pod) -> Result<String, ApiError> {
    let filter = cri::PodSandboxFilter {
        label_selector: [("io.kubernetes.pod.uid".to_owned(), uid(pod))].into(),
        state: Some(cri::PodSandboxStateValue { state: cri::PodSandboxState::SandboxReady.into() }),
        ..cri::PodSandboxFilter::default()
    };
    let mut runtime = ctx.cri.runtime.clone();
    let mut found = runtime
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: Some(filter) })
        .await
        .map_err(|e| ApiError::unavailable(format!("the runtime did not answer: {}", e.message())))?
        .into_inner()
        .items;
    found.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    found.first().map(|s| s.id.clone()).ok_or_else(|| {
        ApiError::bad_request(format!(
            "pod {} has no running sandbox",
            pod.metadata.name.as_deref().unwrap_or_default()
        ))
    })
}
