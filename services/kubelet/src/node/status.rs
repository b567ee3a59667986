//! The node's status as the kubelet pushes it, and when it pushes it.
//!
//! The push is a strategic-merge PATCH of `nodes/<name>/status`, not server-side apply:
//! conditions merge by type and capacity by key, so what others write there (a CNI's
//! NetworkUnavailable, a device plugin's resources) stays, and there is no field-ownership
//! conflict with the node lifecycle controller, which rewrites our conditions to Unknown with
//! a plain update when the lease lapses (under apply every push after that would need `force`).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::NodeConfig;
use super::conditions::Check;
use super::resources::{GPU_RESOURCE, Resources, ToQuantities};

/// Pushed at least this often even when nothing changed: five minutes, as upstream's kubelet
/// (`nodeStatusReportFrequency`); the Lease says the node is alive in between. Every push
/// reaches every watcher of all Nodes, each node's net-forwarder among them, so a cluster of N
/// nodes makes N²/REFRESH watch events a second (docs/scale.md).
pub const REFRESH: Duration = Duration::from_secs(300);

/// What the last successful push said, to tell whether the next one is due.
#[derive(Clone, Debug)]
pub struct Pushed {
    /// The conditions, without timestamps.
    pub checks: Vec<Check>,
    /// The facts and versions.
    pub info: NodeSystemInfo,
    /// When.
    pub at: Instant,
}

/// A push is due when nothing was pushed yet, anything changed, [`REFRESH`] has passed, or
/// the Node as the API has it (`current`) does not show a condition as this kubelet last
/// pushed it: the node lifecycle controller sets them to Unknown when the Lease lapses, and a
/// kubelet back from a stall must not leave its node NotReady until the next refresh.
pub fn due(
    last: Option<&Pushed>,
    checks: &[Check],
    info: &NodeSystemInfo,
    current: &Node,
    now: Instant,
) -> bool {
    match last {
        None => true,
        Some(p) => {
            p.checks != checks
                || p.info != *info
                || now.duration_since(p.at) >= REFRESH
                || !shows(current, checks)
        }
    }
}

/// Whether `node`'s status carries each check's condition with its status.
fn shows(node: &Node, checks: &[Check]) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    checks.iter().all(|check| {
        let status = if check.status { "True" } else { "False" };
        conditions.iter().any(|c| c.type_ == check.kind && c.status == status)
    })
}

/// What the status is made of, besides the checks.
pub struct Facts<'a> {
    /// The node's configuration.
    pub config: &'a NodeConfig,
    /// `status.capacity`.
    pub capacity: &'a Resources,
    /// `status.allocatable`.
    pub allocatable: &'a Resources,
    /// `status.nodeInfo`.
    pub info: &'a NodeSystemInfo,
}

/// The strategic-merge patch body for `nodes/<name>/status`. `current` is the Node as the API
/// has it: its conditions carry the transition times forward, and a GPU count it still shows
/// but this allocation has none of is removed.
pub fn patch(facts: &Facts<'_>, checks: &[Check], current: Option<&Node>, now: &Time) -> serde_json::Value {
    let current_status = current.and_then(|n| n.status.as_ref());
    let previous = current_status.and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    let conditions: Vec<NodeCondition> =
        checks.iter().map(|c| c.to_condition(previous.iter().find(|p| p.type_ == c.kind), now)).collect();
    let status = NodeStatus {
        conditions: Some(conditions),
        addresses: Some(vec![
            NodeAddress { type_: "InternalIP".into(), address: facts.config.internal_ip.to_string() },
            NodeAddress { type_: "Hostname".into(), address: facts.config.hostname.clone() },
        ]),
        capacity: Some(facts.capacity.to_quantities()),
        allocatable: Some(facts.allocatable.to_quantities()),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint { port: i32::from(facts.config.kubelet_port) }),
        }),
        node_info: Some(facts.info.clone()),
        ..Default::default()
    };
    let mut status = serde_json::to_value(status).unwrap_or_default();
    let shows_gpus =
        current_status.and_then(|s| s.capacity.as_ref()).is_some_and(|c| c.contains_key(GPU_RESOURCE));
    if shows_gpus && facts.capacity.gpus == 0 {
        for list in ["capacity", "allocatable"] {
            if let Some(map) = status.get_mut(list).and_then(|m| m.as_object_mut()) {
                map.insert(GPU_RESOURCE.to_owned(), serde_json::Value::Null);
            }
        }
    }
    serde_json::json!({ "status": status })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;
    use crate::node::conditions::{self, Probe};

    fn config() -> NodeConfig {
        NodeConfig {
            name: "node1".into(),
            internal_ip: "10.0.0.5".parse().unwrap(),
            hostname: "host1".into(),
            kubelet_port: 10250,
            max_pods: 110,
            role: "worker".into(),
            taint: None,
            root_dir: PathBuf::from("/"),
            net_forwarder_socket: None,
            disk_pressure_percent: 10,
            env: None,
            capacity: None,
            gpus: None,
        }
    }

    fn resources(gpus: i64) -> Resources {
        Resources { millicpu: 2000, memory: 1 << 30, ephemeral_storage: 1 << 30, gpus, pods: 110 }
    }

    fn time(s: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap())
    }

    fn checks(ready: bool) -> Vec<Check> {
        let probe = if ready { Probe::Ready } else { Probe::NotReady("down".into()) };
        vec![conditions::ready(&probe, None), conditions::memory(Ok(1 << 30))]
    }

    #[test]
    fn the_patch_carries_everything_the_node_reports() {
        let (config, r, info) = (config(), resources(2), NodeSystemInfo::default());
        let facts = Facts { config: &config, capacity: &r, allocatable: &r, info: &info };
        let body = patch(&facts, &checks(true), None, &time(100));
        let s = &body["status"];
        assert_eq!(s["conditions"][0]["type"], "Ready");
        assert_eq!(s["conditions"][0]["status"], "True");
        assert_eq!(s["addresses"][0]["address"], "10.0.0.5");
        assert_eq!(s["addresses"][1]["type"], "Hostname");
        assert_eq!(s["capacity"]["nvidia.com/gpu"], "2");
        assert_eq!(s["daemonEndpoints"]["kubeletEndpoint"]["Port"], 10250);
    }

    #[test]
    fn gpus_gone_from_the_allocation_are_removed() {
        let (config, r, info) = (config(), resources(0), NodeSystemInfo::default());
        let facts = Facts { config: &config, capacity: &r, allocatable: &r, info: &info };
        let mut capacity = BTreeMap::new();
        capacity.insert(GPU_RESOURCE.to_owned(), Quantity("4".into()));
        let node = Node {
            status: Some(NodeStatus { capacity: Some(capacity), ..Default::default() }),
            ..Default::default()
        };
        let body = patch(&facts, &checks(true), Some(&node), &time(100));
        assert!(body["status"]["capacity"]["nvidia.com/gpu"].is_null());
        assert!(body["status"]["capacity"].as_object().unwrap().contains_key(GPU_RESOURCE));
        let fresh = patch(&facts, &checks(true), None, &time(100));
        assert!(!fresh["status"]["capacity"].as_object().unwrap().contains_key(GPU_RESOURCE));
    }

    #[test]
    fn transition_times_come_from_the_node_as_the_api_has_it() {
        let (config, r, info) = (config(), resources(0), NodeSystemInfo::default());
        let facts = Facts { config: &config, capacity: &r, allocatable: &r, info: &info };
        let earlier = checks(true)[0].to_condition(None, &time(50));
        let node = Node {
            status: Some(NodeStatus { conditions: Some(vec![earlier]), ..Default::default() }),
            ..Default::default()
        };
        let body = patch(&facts, &checks(true), Some(&node), &time(100));
        let ready = &body["status"]["conditions"][0];
        assert_eq!(ready["lastTransitionTime"], serde_json::to_value(time(50)).unwrap());
        assert_eq!(ready["lastHeartbeatTime"], serde_json::to_value(time(100)).unwrap());
    }

    /// The Node as the API has it after pushing `checks` at `at`.
    fn pushed_node(checks: &[Check], at: i64) -> Node {
        let conditions = checks.iter().map(|c| c.to_condition(None, &time(at))).collect();
        Node {
            status: Some(NodeStatus { conditions: Some(conditions), ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn a_push_is_due_on_change_after_five_minutes_or_when_the_api_shows_otherwise() {
        let info = NodeSystemInfo::default();
        let start = Instant::now();
        let shown = pushed_node(&checks(true), 0);
        assert!(due(None, &checks(true), &info, &Node::default(), start));
        let last = Pushed { checks: checks(true), info: info.clone(), at: start };
        let later = start + Duration::from_secs(10);
        assert!(!due(Some(&last), &checks(true), &info, &shown, later));
        assert!(!due(Some(&last), &checks(true), &info, &shown, start + Duration::from_secs(299)));
        assert!(due(Some(&last), &checks(false), &info, &shown, later));
        let other = NodeSystemInfo { container_runtime_version: "x".into(), ..info.clone() };
        assert!(due(Some(&last), &checks(true), &other, &shown, later));
        assert!(due(Some(&last), &checks(true), &info, &shown, start + REFRESH));
        assert_eq!(REFRESH, Duration::from_secs(300), "upstream's nodeStatusReportFrequency");

        // The lifecycle controller's Unknown (the Lease lapsed while the kubelet stalled).
        let mut unknown = shown.clone();
        for c in unknown.status.as_mut().unwrap().conditions.as_mut().unwrap() {
            c.status = "Unknown".into();
        }
        assert!(due(Some(&last), &checks(true), &info, &unknown, later));
        // A condition removed by someone else.
        let mut missing = shown.clone();
        missing.status.as_mut().unwrap().conditions.as_mut().unwrap().pop();
        assert!(due(Some(&last), &checks(true), &info, &missing, later));
    }
}
