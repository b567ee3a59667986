//! The downward API: what a pod may learn about itself (`fieldRef`, `resourceFieldRef`), for
//! env values and downwardAPI volumes alike, resolved when the container starts.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ObjectFieldSelector, Pod, ResourceFieldSelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::quantity::{self, InvalidQuantity};

/// What the node knows about a pod beyond its spec: its addresses and the node's allocatable
/// resources (the default for a limit the container does not set).
#[derive(Clone, Debug, Default)]
pub struct PodFacts {
    /// The node's name.
    pub node_name: String,
    /// The node's address (`status.hostIP`).
    pub host_ip: String,
    /// The pod's addresses, primary first (`status.podIP`, `status.podIPs`).
    pub pod_ips: Vec<String>,
    /// Node allocatable CPU, millicores.
    pub allocatable_millicpu: i64,
    /// Node allocatable memory, bytes.
    pub allocatable_memory: i64,
    /// Node allocatable ephemeral storage, bytes.
    pub allocatable_ephemeral_storage: i64,
}

/// A reference the downward API cannot resolve.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DownwardError {
    /// The field path is not one the downward API offers.
    #[error("unsupported fieldRef fieldPath {0:?}")]
    UnsupportedField(String),
    /// The resource is not one the downward API offers.
    #[error("unsupported resourceFieldRef resource {0:?}")]
    UnsupportedResource(String),
    /// `containerName` names no container of the pod.
    #[error("resourceFieldRef names container {0:?}, which the pod does not have")]
    NoSuchContainer(String),
    /// A quantity (divisor or the container's own) does not parse.
    #[error("resourceFieldRef: {0}")]
    Quantity(#[from] InvalidQuantity),
    /// A negative divisor (zero means 1).
    #[error("resourceFieldRef divisor {0:?} must be positive")]
    Divisor(String),
}

/// The value of `fieldRef` for `pod`.
pub fn field_value(
    pod: &Pod,
    selector: &ObjectFieldSelector,
    facts: &PodFacts,
) -> Result<String, DownwardError> {
    let meta = &pod.metadata;
    let path = selector.field_path.as_str();
    let keyed = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix("['"))
            .and_then(|rest| rest.strip_suffix("']"))
    };
    let empty = BTreeMap::new();
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "metadata.labels" => format_map(meta.labels.as_ref().unwrap_or(&empty)),
        "metadata.annotations" => format_map(meta.annotations.as_ref().unwrap_or(&empty)),
        "spec.nodeName" => {
            pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_else(|| facts.node_name.clone())
        }
        "spec.serviceAccountName" => {
            pod.spec.as_ref().and_then(|s| s.service_account_name.clone()).unwrap_or_else(|| "default".into())
        }
        "status.hostIP" | "status.hostIPs" => facts.host_ip.clone(),
        "status.podIP" => facts.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => facts.pod_ips.join(","),
        _ => {
            if let Some(key) = keyed("metadata.labels") {
                meta.labels.as_ref().and_then(|l| l.get(key).cloned()).unwrap_or_default()
            } else if let Some(key) = keyed("metadata.annotations") {
                meta.annotations.as_ref().and_then(|a| a.get(key).cloned()).unwrap_or_default()
            } else {
                return Err(DownwardError::UnsupportedField(path.to_owned()));
            }
        }
    })
}

/// `key="value"` lines, sorted by key, values escaped as Go's `%q` would for common text.
fn format_map(map: &BTreeMap<String, String>) -> String {
    map.iter()
        .map(|(k, v)| format!("{k}={}", serde_json::Value::String(v.clone())))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value of `resourceFieldRef` for `container` (or the container it names) of `pod`: the
/// container's limit or request divided by the divisor, rounded up; a limit the container does
/// not set is the node's allocatable.
pub fn resource_value(
    pod: &Pod,
    container: Option<&Container>,
    selector: &ResourceFieldSelector,
    facts: &PodFacts,
) -> Result<String, DownwardError> {
    let container = match selector.container_name.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()))
            .find(|c| c.name == name)
            .ok_or_else(|| DownwardError::NoSuchContainer(name.to_owned()))?,
        None => container.ok_or_else(|| DownwardError::NoSuchContainer(String::new()))?,
    };
    let resources = container.resources.as_ref();
    let get = |limits: bool, name: &str| -> Option<&Quantity> {
        let map = if limits {
            resources.and_then(|r| r.limits.as_ref())
        } else {
            resources.and_then(|r| r.requests.as_ref())
        };
        map.and_then(|m| m.get(name))
    };
    let divisor = selector.divisor.clone().unwrap_or_else(|| Quantity("1".into()));
    let resource = selector.resource.as_str();
    let (is_cpu, limits, name) = match resource {
        "limits.cpu" => (true, true, "cpu"),
        "requests.cpu" => (true, false, "cpu"),
        "limits.memory" => (false, true, "memory"),
        "requests.memory" => (false, false, "memory"),
        "limits.ephemeral-storage" => (false, true, "ephemeral-storage"),
        "requests.ephemeral-storage" => (false, false, "ephemeral-storage"),
        other => return Err(DownwardError::UnsupportedResource(other.to_owned())),
    };
    let allocatable = match name {
        "cpu" => facts.allocatable_millicpu,
        "memory" => facts.allocatable_memory,
        _ => facts.allocatable_ephemeral_storage,
    };
    // A request defaults to the limit when only the limit is set (as the API server defaults
    // it), and to 0 when neither is.
    let own = if limits { get(true, name) } else { get(false, name).or_else(|| get(true, name)) };
    let value = match own {
        Some(q) if is_cpu => quantity::millicores(q)?,
        Some(q) => quantity::units(q)?,
        None if limits => allocatable,
        None => 0,
    };
    let mut divisor_value = if is_cpu { quantity::millicores(&divisor)? } else { quantity::units(&divisor)? };
    // A zero divisor is what the API server stores when none was given ("0"): it means 1.
    if divisor_value == 0 {
        divisor_value = if is_cpu { 1000 } else { 1 };
    }
    if divisor_value < 0 {
        return Err(DownwardError::Divisor(divisor.0));
    }
    // CPU rounds up to at least 1 core-unit of the divisor, as the kubelet does.
    let mut out = value.div_euclid(divisor_value) + i64::from(value.rem_euclid(divisor_value) != 0);
    if is_cpu && out == 0 && value > 0 {
        out = 1;
    }
    Ok(out.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "u-1",
                         "labels": {"app": "web", "tier": "front"}, "annotations": {"a": "x\"y"}},
            "spec": {"nodeName": "node1", "containers": [
                {"name": "main", "image": "i", "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}},
                {"name": "side", "image": "i"}
            ]}
        }))
        .expect("pod")
    }

    fn facts() -> PodFacts {
        PodFacts {
            node_name: "node1".into(),
            host_ip: "10.0.0.5".into(),
            pod_ips: vec!["10.244.1.7".into()],
            allocatable_millicpu: 4000,
            allocatable_memory: 8 << 30,
            allocatable_ephemeral_storage: 100 << 30,
        }
    }

    fn field(path: &str) -> Result<String, DownwardError> {
        field_value(&pod(), &ObjectFieldSelector { field_path: path.into(), api_version: None }, &facts())
    }

    fn resource(container: &str, resource: &str, divisor: Option<&str>) -> Result<String, DownwardError> {
        let pod = pod();
        let c = pod.spec.as_ref().expect("spec").containers.iter().find(|c| c.name == container).cloned();
        let sel = ResourceFieldSelector {
            container_name: None,
            resource: resource.into(),
            divisor: divisor.map(|d| Quantity(d.into())),
        };
        resource_value(&pod, c.as_ref(), &sel, &facts())
    }

    #[test]
    fn fields_resolve_to_what_the_pod_is() {
        assert_eq!(field("metadata.name").as_deref(), Ok("web"));
        assert_eq!(field("metadata.uid").as_deref(), Ok("u-1"));
        assert_eq!(field("status.podIP").as_deref(), Ok("10.244.1.7"));
        assert_eq!(field("status.hostIP").as_deref(), Ok("10.0.0.5"));
        assert_eq!(field("metadata.labels['tier']").as_deref(), Ok("front"));
        assert_eq!(field("metadata.labels").as_deref(), Ok("app=\"web\"\ntier=\"front\""));
        assert_eq!(field("metadata.annotations").as_deref(), Ok("a=\"x\\\"y\""));
        assert_eq!(field("spec.serviceAccountName").as_deref(), Ok("default"));
        assert_eq!(field("spec.hostname"), Err(DownwardError::UnsupportedField("spec.hostname".into())));
    }

    #[test]
    fn resources_use_limits_then_node_allocatable() {
        assert_eq!(resource("main", "limits.cpu", None).as_deref(), Ok("1"), "500m rounds up to 1 core");
        assert_eq!(resource("main", "limits.cpu", Some("1m")).as_deref(), Ok("500"));
        assert_eq!(resource("main", "limits.memory", Some("1Mi")).as_deref(), Ok("64"));
        assert_eq!(resource("main", "requests.memory", Some("1Mi")).as_deref(), Ok("64"), "request = limit");
        assert_eq!(resource("side", "limits.cpu", None).as_deref(), Ok("4"), "node allocatable");
        assert_eq!(resource("side", "requests.cpu", None).as_deref(), Ok("0"));
        assert!(matches!(resource("main", "limits.gpu", None), Err(DownwardError::UnsupportedResource(_))));
        assert_eq!(resource("main", "limits.cpu", Some("0")).as_deref(), Ok("1"), "a zero divisor is 1");
        assert_eq!(resource("main", "limits.memory", Some("0")).as_deref(), Ok("67108864"));
        assert!(matches!(resource("main", "limits.cpu", Some("-1")), Err(DownwardError::Divisor(_))));
    }
}
